"""User settings: one frozen dataclass, stored as JSON in the platform's user config folder.

Loading never fails, whatever the file holds: a missing file gives the defaults; a file that
cannot be read or parsed (not UTF-8, not JSON, numbers too long to read, nesting too deep) is
moved aside (``settings.json.corrupt``, or ``settings.json.corrupt-<time>`` when that name is
taken: a kept file is never overwritten), the defaults are used and a warning naming both files
is logged and returned so the window shows it in a banner. Unknown keys are ignored and missing
keys take their defaults, so files written by older and newer versions both load. A value of the
wrong type or outside its allowed set (a 400-digit volume, a list where text belongs) falls back
to its default on its own, with a warning, and keeps the rest of the file; a copy of the file as
it was is kept aside the same way, since the next save writes the repaired values.

Saving writes a temporary file in the same folder and renames it over the old one, so
a crash or a full disk never leaves a half-written file behind; the file is private (0600).

``Settings`` is immutable, so one instance can be read from any thread; changes make a
new instance (``dataclasses.replace`` or :meth:`Settings.with_changes`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

from .download_layout import DOWNLOAD_LAYOUTS
from .files import aside_path, move_aside, write_private_text_file
from .paths import config_dir
from .variants import MODEL_VARIANTS, variant

log = logging.getLogger(__name__)

SETTINGS_FILENAME: Final = "settings.json"
SCHEMA_VERSION: Final = 2  # 2: checkpoints keyed by variant (1 had checkpoint_4bit / checkpoint_8bit)

TALK_MODES: Final = ("hold", "toggle")
THEMES: Final = ("system", "light", "dark")
NUMERICS_MODES: Final = ("exact", "fast")  # engine.numerics.NUMERICS, named here without importing MLX
CONFIGURABLE_VARIANTS: Final = tuple(v.key for v in MODEL_VARIANTS)
DEFAULT_VOLUME: Final = 0.8

# The prompt NVIDIA's reference client uses (mlx-audio DEFAULT_SYSTEM_PROMPT); the model was tuned with it.
DEFAULT_SYSTEM_PROMPT: Final = (
    "You are an AI voice assistant developed by NVIDIA. Your name is NVIDIA Voice Chat. Answer in a spoken, "
    "conversational style rather than a written one. Do not repeat the same sentence over and over again. "
    "Start the conversation by greeting the user."
)

IDLE_PAUSE_MIN_S: Final = 5.0
IDLE_PAUSE_MAX_S: Final = 600.0
DEFAULT_GLOBAL_TALK_KEY: Final = "F8"  # a key that types nothing, so holding it in another app is harmless
HISTORY_LIMIT_MIN_GB: Final = 0.1
HISTORY_LIMIT_MAX_GB: Final = 10_000.0
DEFAULT_HISTORY_LIMIT_GB: Final = 2.0  # app.history.DEFAULT_MAX_BYTES: about 45 ten-minute conversations


@dataclass(frozen=True)
class Settings:
    """Everything the user can configure. ``None`` device names mean the system default device."""

    checkpoints: dict[str, Path] = field(default_factory=dict)  # variant key ("4bit", "8bit", "bf16") -> folder
    active_variant: str | None = None  # the variant to load at start; None: none chosen yet (the demo)
    input_device: str | None = None
    output_device: str | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    talk_key: str = "Space"  # a single key in Qt's portable key-sequence text ("Space", "F5", "Ctrl+Space")
    talk_mode: str = "hold"  # one of TALK_MODES
    idle_pause: bool = True
    idle_pause_delay_s: float = 30.0
    ducking: bool = True  # lower the assistant's playback while the talk key is held
    overlay: bool = True  # show the live frame-time overlay
    theme: str = "system"  # one of THEMES
    window_geometry: str | None = None  # opaque (base64 of Qt's saveGeometry), owned by the window
    volume: float = DEFAULT_VOLUME  # the assistant's playback level, 0..1 (before the output limiter)
    muted: bool = False
    hands_free: bool = False  # open microphone with echo cancellation; the talk key opens and closes it
    global_talk_key_enabled: bool = False  # also listen for a talk key while other apps are in front
    global_talk_key: str = DEFAULT_GLOBAL_TALK_KEY  # an app.hotkey key spec ("F8", "ctrl+space", "right alt")
    keep_in_tray: bool = False  # closing the window leaves Parley running in the menu bar / tray
    history: bool = True  # keep every conversation in the history folder
    history_limit_gb: float = DEFAULT_HISTORY_LIMIT_GB  # the oldest conversations go beyond this
    numerics: str = "exact"  # one of NUMERICS_MODES
    keep_up: bool = False  # fast mode only: spend less per frame while frames fall behind (app.keep_up)
    download_layout: str = DOWNLOAD_LAYOUTS[0]  # where a new download goes: the Hugging Face cache, or "parley"

    def __post_init__(self) -> None:
        for name, allowed in (
            ("talk_mode", TALK_MODES),
            ("theme", THEMES),
            ("numerics", NUMERICS_MODES),
            ("download_layout", DOWNLOAD_LAYOUTS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        if self.active_variant is not None and self.active_variant not in CONFIGURABLE_VARIANTS:
            raise ValueError(
                f"active_variant must be one of {', '.join(CONFIGURABLE_VARIANTS)} or null; got {self.active_variant!r}"
            )
        unknown = sorted(set(self.checkpoints) - set(CONFIGURABLE_VARIANTS))
        if unknown:
            raise ValueError(f"checkpoints has unknown variants {unknown}; use {', '.join(CONFIGURABLE_VARIANTS)}")
        if not 0.0 <= self.volume <= 1.0:
            raise ValueError(f"volume must be between 0 and 1; got {self.volume!r}")
        if not IDLE_PAUSE_MIN_S <= self.idle_pause_delay_s <= IDLE_PAUSE_MAX_S:
            raise ValueError(
                f"idle_pause_delay_s must be between {IDLE_PAUSE_MIN_S:g} and {IDLE_PAUSE_MAX_S:g} s; "
                f"got {self.idle_pause_delay_s!r}"
            )
        if not self.talk_key.strip():
            raise ValueError("talk_key must name a key; got an empty string")
        if not self.global_talk_key.strip():
            raise ValueError("global_talk_key must name a key; got an empty string")
        if not HISTORY_LIMIT_MIN_GB <= self.history_limit_gb <= HISTORY_LIMIT_MAX_GB:
            raise ValueError(
                f"history_limit_gb must be between {HISTORY_LIMIT_MIN_GB:g} and {HISTORY_LIMIT_MAX_GB:g}; "
                f"got {self.history_limit_gb!r}"
            )

    @property
    def history_max_bytes(self) -> int:
        """The history's size cap in bytes."""
        return round(self.history_limit_gb * 1024**3)

    @property
    def active_checkpoint(self) -> Path | None:
        """The checkpoint folder of the active variant, if one is chosen and configured."""
        return None if self.active_variant is None else self.checkpoint_for(self.active_variant)

    def checkpoint_for(self, key: str) -> Path | None:
        """The configured folder for the variant stored as ``key`` ("4bit", "8bit", "bf16")."""
        if variant(key).demo:
            raise ValueError("the demo checkpoint has no configurable folder")
        return self.checkpoints.get(key)

    def with_checkpoint(self, key: str, folder: Path | None) -> Settings:
        """A copy with the folder of variant ``key`` set (or removed, with None)."""
        checkpoints = {k: v for k, v in self.checkpoints.items() if k != key}
        if folder is not None:
            checkpoints[key] = Path(folder)
        return self.with_changes(checkpoints=checkpoints)

    def with_changes(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (validated like a new instance)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form: paths as strings, everything else as is."""
        data: dict[str, Any] = {"version": SCHEMA_VERSION}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name == "checkpoints":
                value = {key: str(value[key]) for key in CONFIGURABLE_VARIANTS if key in value}
            data[item.name] = str(value) if isinstance(value, Path) else value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> tuple[Settings, list[str]]:
        """Build settings from a loaded JSON object.

        Returns the settings and one message per value that was invalid and replaced by
        its default. Unknown keys are ignored; missing keys take their defaults.
        """
        defaults = cls()
        values: dict[str, Any] = {}
        problems: list[str] = []
        data = _migrate(data)
        for item in dataclasses.fields(cls):
            if item.name not in data:
                continue
            default = getattr(defaults, item.name)
            try:
                values[item.name] = _coerce(item.name, data[item.name])
                dataclasses.replace(defaults, **{item.name: values[item.name]})  # validate this field alone
            except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: a number too large for a float
                values.pop(item.name, None)
                problems.append(f"{item.name}: {exc}; using the default ({default!r})")
        return cls(**values), problems


class SettingsLoad(NamedTuple):
    """What :func:`load_settings` found: the settings and, if something was wrong, a warning for the user."""

    settings: Settings
    warning: str | None


def settings_dir() -> Path:
    """The per-user config folder (``~/.config/Parley``, ``~/Library/Application Support/Parley``)."""
    return config_dir()


def default_settings_path() -> Path:
    return settings_dir() / SETTINGS_FILENAME


def load_settings(path: Path | None = None) -> SettingsLoad:
    """Read the settings file (default: :func:`default_settings_path`), falling back to defaults.

    A file that cannot be read or parsed is renamed to ``<name>.corrupt`` (replacing an
    older one) so the next save does not destroy it; the warning says where it went.
    """
    path = default_settings_path() if path is None else path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return SettingsLoad(Settings(), None)
    except (OSError, UnicodeDecodeError) as exc:
        return SettingsLoad(Settings(), _set_aside(path, f"could not be read ({exc})"))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return SettingsLoad(Settings(), _set_aside(path, f"is not valid JSON ({exc})"))
    except RecursionError:
        return SettingsLoad(Settings(), _set_aside(path, "is nested too deeply to read"))
    except ValueError as exc:  # e.g. an integer of more digits than Python converts (4,300)
        return SettingsLoad(Settings(), _set_aside(path, f"cannot be read ({exc})"))
    if not isinstance(data, dict):
        return SettingsLoad(Settings(), _set_aside(path, f"holds a JSON {type(data).__name__}, not an object"))
    try:
        settings, problems = Settings.from_dict(data)
    except Exception as exc:  # a shape no field check foresaw: loading still must not fail
        log.exception("Unexpected content in %s", path)
        return SettingsLoad(Settings(), _set_aside(path, f"holds something unexpected ({type(exc).__name__})"))
    if not problems:
        return SettingsLoad(settings, None)
    kept = _keep_copy(path)
    warning = f"Some settings in {path} were invalid and were reset: " + "; ".join(problems) + f". {kept}"
    log.warning(warning)
    return SettingsLoad(settings, warning)


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write ``settings`` atomically (temporary file + rename); returns the path written.

    Raises ``OSError`` (with the path in the message) when the folder cannot be written.
    """
    path = default_settings_path() if path is None else path
    text = json.dumps(settings.to_dict(), indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_private_text_file(path, text)


def _migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Read version 1 files: ``checkpoint_4bit`` / ``checkpoint_8bit`` become ``checkpoints``."""
    old = {key: data[f"checkpoint_{key}"] for key in ("4bit", "8bit") if f"checkpoint_{key}" in data}
    if not old or "checkpoints" in data:
        return data
    migrated = {key: value for key, value in data.items() if not key.startswith("checkpoint_")}
    migrated["checkpoints"] = {key: value for key, value in old.items() if value not in (None, "")}
    if not isinstance(migrated.get("active_variant"), str) or not migrated["checkpoints"].get(
        migrated["active_variant"]
    ):
        migrated.pop("active_variant", None)  # version 1 said "4bit" even with no folder configured
    return migrated


def _coerce(name: str, value: Any) -> Any:
    """Turn a JSON value into the field's Python type, or raise ``TypeError``."""
    if name == "checkpoints":
        if not isinstance(value, dict):
            raise TypeError(f"expected an object of folder paths, got {type(value).__name__}")
        folders = {}
        for key, folder in value.items():
            if not isinstance(folder, str) or not folder:
                raise TypeError(f"expected a folder path for {key!r}, got {type(folder).__name__}")
            folders[key] = Path(_text(folder))
        return folders
    if name in ("input_device", "output_device", "window_geometry", "active_variant"):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"expected text or null, got {type(value).__name__}")
        return None if value is None else _text(value)
    if name in (
        "idle_pause",
        "ducking",
        "overlay",
        "muted",
        "hands_free",
        "global_talk_key_enabled",
        "keep_in_tray",
        "history",
        "keep_up",
    ):
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {type(value).__name__}")
        return value
    if name in ("idle_pause_delay_s", "volume", "history_limit_gb"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        return float(value)
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return _text(value)


def _text(value: str) -> str:
    if "\0" in value:  # no file name, device or key name holds one; the system calls would refuse it
        raise ValueError("the text holds a NUL character")
    return value


def _set_aside(path: Path, problem: str) -> str:
    """Move a bad settings file aside (:func:`app.files.move_aside`); returns the warning for the user."""
    moved, kept = move_aside(path)
    if moved is None:
        kept += " and will be overwritten on the next save"
    warning = f"The settings file {path} {problem}; the defaults are in use and {kept}."
    log.warning(warning)
    return warning


def _keep_copy(path: Path) -> str:
    """Copy a settings file with invalid values aside before the next save replaces it; says where, for the user."""
    aside = aside_path(path)
    try:
        shutil.copyfile(path, aside)
    except OSError as exc:
        return f"The file could not be copied aside ({exc})."
    return f"The file as it was is kept as {aside}."
