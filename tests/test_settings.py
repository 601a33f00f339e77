"""Settings: JSON round trip, defaults, corrupt and unreadable files, unknown and invalid keys."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from app.settings import (
    DEFAULT_SYSTEM_PROMPT,
    Settings,
    default_settings_path,
    load_settings,
    save_settings,
)

CUSTOM = Settings(
    checkpoints={
        "4bit": Path("/models/VoiceChat-4bit"),
        "8bit": Path("/models/Voice Chat 8bit — ünïcode"),
        "bf16": Path("/models/VoiceChat-bf16"),
    },
    active_variant="8bit",
    input_device="USB Microphone",
    output_device=None,
    system_prompt='Be brief.\nLine two with "quotes".',
    talk_key="F5",
    talk_mode="toggle",
    idle_pause=False,
    idle_pause_delay_s=12.5,
    ducking=False,
    overlay=False,
    theme="dark",
    window_geometry="AdnQywADAAAAAAA=",
    volume=0.35,
    muted=True,
    hands_free=True,
    global_talk_key_enabled=True,
    global_talk_key="Ctrl+Alt+Space",
    keep_in_tray=True,
    history=False,
    history_limit_gb=0.5,
    numerics="fast",
)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    path = save_settings(CUSTOM, tmp_path / "settings.json")
    loaded, warning = load_settings(path)
    assert warning is None
    assert loaded == CUSTOM
    # Saving what was loaded writes the same bytes again.
    first = path.read_bytes()
    save_settings(loaded, path)
    assert path.read_bytes() == first


def test_missing_file_gives_defaults_without_warning(tmp_path: Path) -> None:
    loaded, warning = load_settings(tmp_path / "absent.json")
    assert warning is None
    assert loaded == Settings()
    assert loaded.talk_key == "Space" and loaded.talk_mode == "hold"
    assert loaded.idle_pause is True and loaded.theme == "system"
    assert loaded.system_prompt == DEFAULT_SYSTEM_PROMPT
    assert loaded.active_checkpoint is None


def test_missing_keys_take_defaults(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"talk_mode": "toggle", "checkpoints": {"4bit": "/m/4"}}), encoding="utf-8")
    loaded, warning = load_settings(path)
    assert warning is None
    assert loaded == Settings(talk_mode="toggle", checkpoints={"4bit": Path("/m/4")})
    assert loaded.active_checkpoint is None, "a folder alone is not a choice of variant"
    assert loaded.volume == 0.8 and loaded.muted is False


def test_version_1_files_are_migrated_to_the_variant_table(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    old = {"version": 1, "checkpoint_4bit": "/m/4", "checkpoint_8bit": None, "active_variant": "4bit"}
    path.write_text(json.dumps(old), encoding="utf-8")
    loaded, warning = load_settings(path)
    assert warning is None
    assert loaded == Settings(checkpoints={"4bit": Path("/m/4")}, active_variant="4bit")
    # Version 1 stored "4bit" even without any folder: that was no choice, so the demo runs, as before.
    path.write_text(json.dumps({"version": 1, "checkpoint_4bit": None, "active_variant": "4bit"}), encoding="utf-8")
    assert load_settings(path) == (Settings(), None)
    save_settings(load_settings(path).settings, path)
    assert json.loads(path.read_text())["version"] == 2


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"version": 99, "theme": "light", "future_feature": {"x": 1}}), encoding="utf-8")
    loaded, warning = load_settings(path)
    assert warning is None
    assert loaded == Settings(theme="light")


@pytest.mark.parametrize(
    "content",
    [b"{ not json", b"[1, 2, 3]", b"\xff\xfe\x00garbage"],
    ids=["invalid-json", "not-an-object", "not-utf8"],
)
def test_corrupt_file_falls_back_and_is_kept_aside(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "settings.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        loaded, warning = load_settings(path)
    assert loaded == Settings()
    assert warning is not None and str(path) in warning and "defaults" in warning
    aside = tmp_path / "settings.json.corrupt"
    assert aside.read_bytes() == content, "the corrupt file must be kept, byte for byte"
    assert not path.exists()
    assert any("settings.json" in record.getMessage() for record in caplog.records)
    # The next save does not touch the kept copy.
    save_settings(Settings(theme="dark"), path)
    assert aside.read_bytes() == content
    assert load_settings(path) == (Settings(theme="dark"), None)


def test_invalid_values_are_reset_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    data = {
        "theme": "purple",
        "talk_mode": "toggle",
        "idle_pause": "yes",
        "idle_pause_delay_s": -3,
        "checkpoints": {"8bit": 42},
        "input_device": "Mic",
        "volume": 3,
        "active_variant": "16bit",
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded, warning = load_settings(path)
    assert loaded == Settings(talk_mode="toggle", input_device="Mic")
    assert warning is not None
    for key in ("theme", "idle_pause", "idle_pause_delay_s", "checkpoints", "volume", "active_variant"):
        assert key in warning
    assert path.exists(), "a file with a few bad values is not set aside"


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_settings(Settings(theme="light"), tmp_path / "nested" / "settings.json")
    original = path.read_bytes()

    def fail_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail_replace)  # the atomic save's rename (engine.files.write_atomic)
    with pytest.raises(OSError, match="No space left"):
        save_settings(Settings(theme="dark"), path)
    assert path.read_bytes() == original, "a failed save must leave the previous file intact"
    assert sorted(p.name for p in path.parent.iterdir()) == ["settings.json"]


def test_validation_messages_name_the_field() -> None:
    with pytest.raises(ValueError, match="active_variant"):
        Settings(active_variant="16bit")
    with pytest.raises(ValueError, match="talk_key"):
        Settings(talk_key="  ")
    with pytest.raises(ValueError, match="idle_pause_delay_s"):
        Settings(idle_pause_delay_s=0.0)
    with pytest.raises(ValueError, match="variant"):
        Settings().checkpoint_for("2bit")
    with pytest.raises(ValueError, match="demo"):
        Settings().checkpoint_for("demo")
    with pytest.raises(ValueError, match="volume"):
        Settings(volume=1.5)
    with pytest.raises(ValueError, match="unknown variants"):
        Settings(checkpoints={"demo": Path("/x")})


def test_with_changes_and_checkpoint_lookup() -> None:
    changed = CUSTOM.with_changes(active_variant="4bit")
    assert changed.active_checkpoint == Path("/models/VoiceChat-4bit")
    assert CUSTOM.active_checkpoint == CUSTOM.checkpoint_for("8bit")
    assert changed.theme == CUSTOM.theme
    assert CUSTOM.with_checkpoint("8bit", None).checkpoint_for("8bit") is None
    assert CUSTOM.with_checkpoint("bf16", Path("/b")).checkpoint_for("bf16") == Path("/b")
    assert CUSTOM.checkpoints["bf16"] == Path("/models/VoiceChat-bf16"), "with_checkpoint makes a copy"


def test_default_path_is_in_the_user_config_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_settings_path() == tmp_path / "Parley" / "settings.json"
    save_settings(Settings(overlay=False))
    assert load_settings().settings == Settings(overlay=False)


def test_the_new_settings_default_to_push_to_talk_kept_history_and_exact_numerics(tmp_path: Path) -> None:
    defaults = Settings()
    assert not defaults.hands_free and not defaults.global_talk_key_enabled and not defaults.keep_in_tray
    assert defaults.global_talk_key == "F8" and defaults.history and defaults.numerics == "exact"
    assert defaults.history_max_bytes == 2 * 1024**3


def test_invalid_new_values_fall_back_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    bad = {"numerics": "turbo", "history_limit_gb": 0, "hands_free": "yes", "global_talk_key": " ", "history": False}
    path.write_text(json.dumps(bad), encoding="utf-8")
    loaded, warning = load_settings(path)
    assert loaded == Settings(history=False)
    assert warning is not None
    for name in ("numerics", "history_limit_gb", "hands_free", "global_talk_key"):
        assert name in warning


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"volume": 0.5, "theme": ' + b"9" * 5000 + b"}", "cannot be read (Exceeds the limit"),
        (b'{"theme": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"theme": "dark"', "is not valid JSON"),
        (b"null", "holds a JSON NoneType"),
    ],
    ids=["5000-digit-number", "nested-100000-deep", "truncated", "null"],
)
def test_unreadable_content_never_stops_loading_and_the_file_is_kept_aside(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "settings.json"
    (tmp_path / "settings.json.corrupt").write_bytes(b"an older damaged file")  # must survive too
    path.write_bytes(content)

    loaded, warning = load_settings(path)

    assert loaded == Settings()
    assert warning is not None and str(path) in warning and problem in warning
    (kept,) = tmp_path.glob("settings.json.corrupt-*")
    assert kept.read_bytes() == content and str(kept) in warning
    assert (tmp_path / "settings.json.corrupt").read_bytes() == b"an older damaged file"
    assert not path.exists()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"volume": 10**400}, "volume"),
        ({"history_limit_gb": -(10**300)}, "history_limit_gb"),
        ({"idle_pause_delay_s": [1, 2]}, "idle_pause_delay_s"),
        ({"checkpoints": {"4bit": "/models/a\0b"}}, "checkpoints"),
        ({"checkpoints": ["/models/4bit"]}, "checkpoints"),
        ({"talk_key": {"key": "F5"}}, "talk_key"),
        ({"input_device": "Mic\0"}, "input_device"),
        ({"active_variant": ["4bit"]}, "active_variant"),
        ({"checkpoint_4bit": {"deep": [1]}, "active_variant": "4bit"}, "checkpoints"),
    ],
    ids=[
        "400-digit",
        "huge-negative",
        "list",
        "nul-path",
        "list-of-paths",
        "object",
        "nul-device",
        "list-variant",
        "v1",
    ],
)
def test_hostile_values_fall_back_one_by_one_and_a_copy_is_kept(
    tmp_path: Path, data: dict[str, object], field: str
) -> None:
    path = tmp_path / "settings.json"
    text = json.dumps({**data, "theme": "dark", "talk_mode": "toggle"})
    path.write_text(text, encoding="utf-8")

    loaded, warning = load_settings(path)

    assert loaded.theme == "dark" and loaded.talk_mode == "toggle", "the good values are kept"
    assert getattr(loaded, field) == getattr(Settings(), field)
    assert warning is not None and str(path) in warning and f"{field}:" in warning
    kept = tmp_path / "settings.json.corrupt"
    assert kept.read_text(encoding="utf-8") == text and str(kept) in warning
    assert path.read_text(encoding="utf-8") == text, "the file itself stays until the next save"


def test_a_damaged_file_that_cannot_be_moved_aside_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings and tools.json share app.files.move_aside: where the move fails, the warning says the file was not
    kept (and, for the settings, that the next save replaces it) instead of claiming it was."""
    path = tmp_path / "settings.json"
    path.write_bytes(b"{not json")

    def refuse(src: str, dst: str) -> None:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    loaded, warning = load_settings(path)
    assert loaded == Settings()
    assert warning is not None
    assert "could not be moved aside ([Errno 13] Permission denied) and will be overwritten on the next save" in warning
    assert path.read_bytes() == b"{not json" and not list(tmp_path.glob("*.corrupt*"))
