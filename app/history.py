"""Conversation history: every conversation kept on disk, listed, replayed, exported, pruned by size.

Each conversation is one folder under the history folder (``data_dir()/history`` by default,
:func:`default_history_dir`), named by its start time so that names sort by age::

    20261130-231500-3f9a1c/
        conversation.json   manifest: format, start, duration, first words, model and numerics (entries kept
                            before these were recorded lack them), transcript, files and their sizes
        user.wav            what the model heard, 16 kHz mono 16-bit
        assistant.wav       what it said, 22.05 kHz mono 16-bit
        transcript.md       the same transcript, for people
        profile.json        the profile log (engine/profile_log.py's schema), when there is one

API (no Qt; the UI calls it from a worker thread if a save could take long: a 10-minute conversation
is about 46 MB of WAV)
    ``ConversationHistory(folder, *, max_bytes=DEFAULT_MAX_BYTES, enabled=True)``
        ``enabled`` is the "keep conversations" setting: while it is off, ``save`` writes nothing.
    ``save(record: ConversationRecord) -> HistoryEntry | None``
        Writes one conversation atomically, then prunes the oldest entries beyond ``max_bytes`` (never
        the one just saved). ``None`` when saving is off or the conversation is empty.
    ``entries() -> HistoryListing``
        Every readable entry, newest first (``HistoryEntry``: id, start, duration, first words, size, model and
        numerics where recorded),
        and the damaged ones, each with the reason (also logged as a warning).
    ``load(entry_id) -> LoadedConversation``
        Transcript, both sides' audio (float32) and the profile, for replay.
    ``export(entry_id, folder) -> list[Path]``
        Copies the entry's files into a new folder inside ``folder`` and returns their paths.
    ``delete(entry_id)`` / ``prune() -> list[str]`` / ``total_bytes() -> int``
    Errors are ``HistoryError`` (an ``OSError``) with a plain-words message naming the path.

Atomicity: an entry is written into a hidden ``.partial-…`` folder, each file flushed to disk, then
the folder is renamed into place (one atomic rename on the same file system). A save that fails or is
interrupted leaves no visible entry; the listing never shows a partial folder, and the next save or
``prune()`` removes those older than ``STALE_PARTIAL_S``.

Damage: an entry whose manifest is missing, truncated, not of this format or holds a field of the wrong
type, a file name that is not a plain name, or whose WAV files are missing or not the size the manifest
recorded, is reported in ``HistoryListing.damaged`` with the reason and skipped; the others stay
readable, whatever one entry holds. A damaged entry is left as it is on disk (the user can delete it);
it still counts towards the size cap and is pruned by age. A manifest without ``first_words`` takes
them from its transcript.

Permissions: the recordings and transcripts are private. The history folder and every entry are 0700,
every file 0600, whatever the umask (``app.files.make_private``); opening the history tightens what an
older version left wider. History → Export writes its copy privately too.

Thread safety: one lock serialises ``save``, ``delete``, ``prune`` and ``export``; ``entries`` and
``load`` read without it (an entry appears or disappears by one rename, never half-way).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np

from app.files import PRIVATE_DIR_MODE, make_private, make_private_folder

log = logging.getLogger(__name__)

FORMAT: Final = "parley-conversation/1"
MANIFEST: Final = "conversation.json"
USER_WAV: Final = "user.wav"
ASSISTANT_WAV: Final = "assistant.wav"
TRANSCRIPT_MD: Final = "transcript.md"
PROFILE_JSON: Final = "profile.json"
DEFAULT_MAX_BYTES: Final = 2 * 1024**3
"""2 GiB: about 45 ten-minute conversations (46 MB each), or hundreds of ordinary ones."""
STALE_PARTIAL_S: Final = 3600.0
"""A partial folder this old belongs to a save that was interrupted (a save takes seconds at most)."""
FIRST_WORDS_CHARS: Final = 80
DIR_MODE: Final = PRIVATE_DIR_MODE

_ENTRY_NAME = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
_PARTIAL_PREFIX = ".partial-"


class HistoryError(OSError):
    """A history entry could not be written, read or exported; the message says which and why."""


def default_history_dir() -> Path:
    """``~/.local/share/Parley/history``, ``~/Library/Application Support/Parley/history``."""
    from app.paths import data_dir

    return data_dir() / "history"


@dataclass(frozen=True)
class TranscriptLine:
    """One turn of the transcript: who, when (seconds from the conversation's start), what."""

    role: str  # "user" | "assistant" | "tool call"
    seconds: float
    text: str


@dataclass(frozen=True)
class ConversationRecord:
    """One finished (or interrupted) conversation, as the controller hands it over for saving."""

    started: datetime  # timezone-aware; naive values are taken as UTC
    transcript: Sequence[TranscriptLine]
    user_audio: np.ndarray  # float32 mono at user_rate: what the model heard
    assistant_audio: np.ndarray  # float32 mono at assistant_rate: what it said
    profile: Mapping[str, Any] | None = None  # the profile log (engine/profile_log.py), JSON-serialisable
    user_rate: int = 16_000
    assistant_rate: int = 22_050
    model: str | None = None  # how the window named the model ("tiny4 · 4-bit", "Demo")
    numerics: str | None = None  # "exact" or "fast"

    @property
    def empty(self) -> bool:
        return not len(self.user_audio) and not len(self.assistant_audio) and not self.transcript


@dataclass(frozen=True)
class HistoryEntry:
    """One listed conversation."""

    id: str
    path: Path
    started: datetime
    duration_s: float
    first_words: str
    size_bytes: int
    has_profile: bool
    model: str | None = None  # None: not recorded (kept before Parley recorded it)
    numerics: str | None = None


@dataclass(frozen=True)
class DamagedEntry:
    id: str
    path: Path
    reason: str


@dataclass(frozen=True)
class HistoryListing:
    entries: list[HistoryEntry] = field(default_factory=list)  # newest first
    damaged: list[DamagedEntry] = field(default_factory=list)


@dataclass(frozen=True)
class LoadedConversation:
    entry: HistoryEntry
    transcript: list[TranscriptLine]
    user_audio: np.ndarray
    user_rate: int
    assistant_audio: np.ndarray
    assistant_rate: int
    profile: dict[str, Any] | None


class ConversationHistory:
    """The history folder (see the module docstring)."""

    def __init__(self, folder: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, enabled: bool = True) -> None:
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)
        self.enabled = enabled
        self._lock = threading.Lock()
        self._tighten_permissions()

    # ------------------------------------------------------------------ writing

    def save(self, record: ConversationRecord) -> HistoryEntry | None:
        """Keep ``record``; returns its entry, or ``None`` when saving is off or there is nothing to keep.

        Raises:
            HistoryError: the folder or a file could not be written (nothing is left behind).
        """
        if not self.enabled or record.empty:
            return None
        started = record.started if record.started.tzinfo else record.started.replace(tzinfo=UTC)
        with self._lock:
            self._make_folder()
            self._remove_stale_partials()
            entry_id = f"{started.astimezone(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
            final = self.folder / entry_id
            try:
                partial = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL_PREFIX}{entry_id}-", dir=self.folder))
            except OSError as error:
                raise HistoryError(f"Could not write the conversation to {self.folder}: {_reason(error)}") from error
            try:
                self._write_entry(partial, entry_id, started, record)
                os.chmod(partial, DIR_MODE)
                os.rename(partial, final)  # the commit: the entry appears whole or not at all
                _fsync_folder(self.folder)
            except BaseException as error:
                shutil.rmtree(partial, ignore_errors=True)
                if isinstance(error, OSError):
                    raise HistoryError(f"Could not save the conversation in {final}: {_reason(error)}") from error
                raise
            entry = self._read_entry(final)
            self._prune(keep=entry_id)
        return entry

    def _write_entry(self, folder: Path, entry_id: str, started: datetime, record: ConversationRecord) -> None:
        import soundfile

        files: dict[str, int] = {}
        for name, samples, rate in (
            (USER_WAV, record.user_audio, record.user_rate),
            (ASSISTANT_WAV, record.assistant_audio, record.assistant_rate),
        ):
            path = folder / name
            clipped = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1)), -1.0, 1.0)
            soundfile.write(str(path), clipped, int(rate), subtype="PCM_16", format="WAV")
            files[name] = _finish_file(path)
        transcript = list(record.transcript)
        _write_text(folder / TRANSCRIPT_MD, _markdown(transcript, started))
        files[TRANSCRIPT_MD] = (folder / TRANSCRIPT_MD).stat().st_size
        if record.profile is not None:
            _write_text(folder / PROFILE_JSON, json.dumps(record.profile, indent=1, sort_keys=True) + "\n")
            files[PROFILE_JSON] = (folder / PROFILE_JSON).stat().st_size
        duration = max(
            len(record.user_audio) / record.user_rate,
            len(record.assistant_audio) / record.assistant_rate,
            max((line.seconds for line in transcript), default=0.0),
        )
        manifest = {
            "format": FORMAT,
            "id": entry_id,
            "started": started.isoformat(),
            "duration_s": round(duration, 3),
            "first_words": _first_words(transcript),
            **{key: value for key, value in (("model", record.model), ("numerics", record.numerics)) if value},
            "transcript": [{"role": line.role, "seconds": line.seconds, "text": line.text} for line in transcript],
            "audio": {"user_rate": int(record.user_rate), "assistant_rate": int(record.assistant_rate)},
            "files": files,
        }
        _write_text(folder / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")  # last

    def _make_folder(self) -> None:
        try:
            make_private_folder(self.folder)
        except OSError as error:
            raise HistoryError(f"Could not create the history folder {self.folder}: {_reason(error)}") from error

    def _tighten_permissions(self) -> None:
        """Make the folder, every entry and every file in them private (earlier versions followed the umask)."""
        if not self.folder.is_dir():
            return
        try:
            make_private(self.folder)
            for entry in self.folder.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    make_private(entry)
                    for file in entry.iterdir():
                        make_private(file)
        except OSError as error:  # not ours to change (another owner, read-only volume): say so, go on
            log.warning("Could not make the history in %s private: %s", self.folder, _reason(error))

    # ------------------------------------------------------------------ reading

    def entries(self) -> HistoryListing:
        """Every entry, newest first, and the damaged ones with their reasons (each logged as a warning)."""
        listing = HistoryListing()
        for path in sorted(self._entry_folders(), key=lambda p: p.name, reverse=True):
            try:
                listing.entries.append(self._read_entry(path))
            except HistoryError as error:
                log.warning("Skipped a damaged history entry: %s", error)
                listing.damaged.append(DamagedEntry(path.name, path, str(error)))
            except Exception as error:  # a shape no check foresaw: still only this entry is affected
                log.exception("Skipped a history entry that could not be read: %s", path)
                listing.damaged.append(DamagedEntry(path.name, path, f"{path}: unreadable ({error!r})"))
        return listing

    def load(self, entry_id: str) -> LoadedConversation:
        """Everything in one entry, for replay.

        Raises:
            HistoryError: the entry does not exist or is damaged.
        """
        import soundfile

        path = self._path(entry_id)
        entry = self._read_entry(path)
        manifest = _read_manifest(path)
        try:
            user, user_rate = soundfile.read(str(path / USER_WAV), dtype="float32")
            assistant, assistant_rate = soundfile.read(str(path / ASSISTANT_WAV), dtype="float32")
        except (soundfile.LibsndfileError, RuntimeError) as error:
            raise HistoryError(f"{path}: its audio cannot be read ({error})") from error
        profile = None
        if entry.has_profile:
            try:
                profile = json.loads((path / PROFILE_JSON).read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError) as error:
                raise HistoryError(f"{path / PROFILE_JSON}: damaged ({_reason(error)})") from error
        transcript = _transcript_lines(manifest)
        return LoadedConversation(entry, transcript, user, int(user_rate), assistant, int(assistant_rate), profile)

    def total_bytes(self) -> int:
        """Bytes in every entry, damaged ones included."""
        return sum(_folder_bytes(path) for path in self._entry_folders())

    # ------------------------------------------------------------------ export, delete, prune

    def export(self, entry_id: str, folder: Path) -> list[Path]:
        """Copy one entry's files into a new folder ``Parley conversation <local start time>`` inside ``folder``.

        Raises:
            HistoryError: the entry is damaged, or the copy could not be written (nothing is left behind).
        """
        source = self._path(entry_id)
        entry = self._read_entry(source)
        with self._lock:
            target = conversation_folder(Path(folder), entry.started)
            try:
                Path(folder).mkdir(parents=True, exist_ok=True)
                partial = Path(tempfile.mkdtemp(prefix=_PARTIAL_PREFIX, dir=folder))
            except OSError as error:
                raise HistoryError(f"Could not export to {folder}: {_reason(error)}") from error
            try:
                names = [n for n in (USER_WAV, ASSISTANT_WAV, TRANSCRIPT_MD, PROFILE_JSON) if (source / n).exists()]
                for name in names:
                    shutil.copyfile(source / name, partial / name)
                    _finish_file(partial / name)
                os.chmod(partial, DIR_MODE)
                os.rename(partial, target)
            except BaseException as error:
                shutil.rmtree(partial, ignore_errors=True)
                if isinstance(error, OSError):
                    raise HistoryError(f"Could not export the conversation to {target}: {_reason(error)}") from error
                raise
        return [target / name for name in names]

    def delete(self, entry_id: str) -> None:
        """Remove one entry (damaged or not)."""
        path = self._path(entry_id)
        with self._lock:
            _remove_entry(path)

    def prune(self) -> list[str]:
        """Remove the oldest entries until the history fits ``max_bytes``; returns the removed ids."""
        with self._lock:
            self._remove_stale_partials()
            return self._prune(keep=None)

    def _prune(self, keep: str | None) -> list[str]:
        folders = sorted(self._entry_folders(), key=lambda p: p.name)  # oldest first: names are start times
        sizes = {path.name: _folder_bytes(path) for path in folders}
        total = sum(sizes.values())
        removed: list[str] = []
        for path in folders:
            if total <= self.max_bytes:
                break
            if path.name == keep:
                continue
            _remove_entry(path)
            total -= sizes[path.name]
            removed.append(path.name)
        if removed:
            log.info("History over %d bytes: removed the %d oldest conversations", self.max_bytes, len(removed))
        return removed

    # ------------------------------------------------------------------ plumbing

    def _entry_folders(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return [path for path in self.folder.iterdir() if path.is_dir() and _ENTRY_NAME.match(path.name)]

    def _path(self, entry_id: str) -> Path:
        if not _ENTRY_NAME.match(entry_id):  # never let an id reach outside the history folder
            raise HistoryError(f"{entry_id!r} is not a history entry")
        path = self.folder / entry_id
        if not path.is_dir():
            raise HistoryError(f"{path}: no such history entry")
        return path

    def _read_entry(self, path: Path) -> HistoryEntry:
        manifest = _read_manifest(path)
        files: dict[str, int] = manifest["files"]
        for name in (USER_WAV, ASSISTANT_WAV):
            if name not in files:
                raise HistoryError(f"{path}: the manifest lists no {name}")
        for name, size in files.items():
            file = path / name
            if not file.is_file():
                raise HistoryError(f"{file}: missing")
            if file.stat().st_size != size:
                raise HistoryError(f"{file}: {file.stat().st_size} bytes, {size} were written (truncated or changed)")
        first_words = manifest.get("first_words")
        if not isinstance(first_words, str):  # missing or of another type: the transcript has them
            first_words = _first_words(_transcript_lines(manifest))
        return HistoryEntry(
            id=path.name,
            path=path,
            started=datetime.fromisoformat(manifest["started"]),
            duration_s=float(manifest["duration_s"]),
            first_words=first_words,
            size_bytes=_folder_bytes(path),
            has_profile=PROFILE_JSON in files,
            model=_optional_text(manifest, "model"),
            numerics=_optional_text(manifest, "numerics"),
        )

    def _remove_stale_partials(self) -> None:
        now = time.time()
        for path in self.folder.glob(f"{_PARTIAL_PREFIX}*"):
            try:
                if now - path.stat().st_mtime > STALE_PARTIAL_S:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:  # removed meanwhile
                continue


def conversation_folder(parent: Path, started: datetime) -> Path:
    """A new folder for one conversation's files: ``Parley conversation <local start time>`` in ``parent``,
    numbered when that name is taken (History → Export and File → Save Conversation… both use it)."""
    base = f"Parley conversation {started.astimezone():%Y-%m-%d %H.%M.%S}"
    target = parent / base
    number = 2
    while target.exists():
        target = parent / f"{base} ({number})"
        number += 1
    return target


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest with every field the history reads type-checked; raises ``HistoryError`` saying which is wrong."""
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise HistoryError(f"{manifest_path}: missing") from error
    except RecursionError:
        raise HistoryError(f"{manifest_path}: damaged (nested too deeply)") from None
    except (OSError, ValueError) as error:  # ValueError: truncated or not JSON, not UTF-8, a number too long
        raise HistoryError(f"{manifest_path}: damaged ({_reason(error)})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise HistoryError(f"{manifest_path}: not a Parley conversation of this version")
    problem = _manifest_problem(manifest)
    if problem:
        raise HistoryError(f"{manifest_path}: incomplete ({problem})")
    return manifest


def _optional_text(manifest: Mapping[str, Any], key: str) -> str | None:
    """A manifest field that older entries lack (or hold damaged): None then, and the entry still lists."""
    value = manifest.get(key)
    return value if isinstance(value, str) and value else None


def _manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a parsed manifest, or ``None``."""
    started = manifest.get("started")
    if not isinstance(started, str):
        return "started is missing or not text"
    try:
        datetime.fromisoformat(started)
    except ValueError:
        return f"started is not a date ({started[:40]!r})"
    if not _is_seconds(manifest.get("duration_s")):
        return "duration_s is missing or not a number of seconds"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "files is missing or not an object"
    for name, size in files.items():
        if name in ("", ".", "..") or any(char in name for char in "/\\\0"):
            return f"files names {name[:40]!r}, which is not a file name in the entry"
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return f"the size of {name} is not a byte count"
    transcript = manifest.get("transcript")
    if not isinstance(transcript, list):
        return "transcript is missing or not a list"
    for number, line in enumerate(transcript, 1):
        if not (
            isinstance(line, dict)
            and isinstance(line.get("role"), str)
            and isinstance(line.get("text"), str)
            and _is_seconds(line.get("seconds"))
        ):
            return f"transcript line {number} is not a role, a time and a text"
    return None


def _is_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e9


def _transcript_lines(manifest: dict[str, Any]) -> list[TranscriptLine]:
    """The transcript of a manifest :func:`_read_manifest` checked."""
    return [TranscriptLine(line["role"], float(line["seconds"]), line["text"]) for line in manifest["transcript"]]


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as stream:
        stream.write(text)
    _finish_file(path)


def _finish_file(path: Path) -> int:
    """Flush ``path`` to disk and make it private; returns its size."""
    with open(path, "rb+") as stream:
        os.fsync(stream.fileno())
    make_private(path)
    return path.stat().st_size


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _remove_entry(path: Path) -> None:
    # Rename first, so that a removal interrupted half-way leaves a partial folder, never a damaged entry.
    doomed = path.with_name(f"{_PARTIAL_PREFIX}removed-{path.name}")
    try:
        os.rename(path, doomed)
    except OSError as error:
        raise HistoryError(f"Could not remove {path}: {_reason(error)}") from error
    shutil.rmtree(doomed, ignore_errors=True)


def _folder_bytes(path: Path) -> int:
    total = 0
    for file in path.iterdir():
        try:
            total += file.stat().st_size
        except OSError:
            continue
    return total


def _first_words(transcript: Sequence[TranscriptLine]) -> str:
    """The user's first words (else the assistant's), cut at a word boundary."""
    spoken = [line for line in transcript if line.role == "user" and line.text.strip()]
    spoken = spoken or [line for line in transcript if line.text.strip()]
    if not spoken:
        return ""
    text = " ".join(spoken[0].text.split())
    if len(text) <= FIRST_WORDS_CHARS:
        return text
    cut = text[:FIRST_WORDS_CHARS].rsplit(" ", 1)[0]
    return f"{cut}…"


def _markdown(transcript: Sequence[TranscriptLine], started: datetime) -> str:
    lines = [f"# Parley conversation, {started.astimezone():%Y-%m-%d %H:%M}", ""]
    for line in sorted(transcript, key=lambda line: line.seconds):
        minutes, seconds = divmod(line.seconds, 60)
        lines += [f"**[{int(minutes):02d}:{seconds:05.2f}] {line.role}:** {line.text.strip()}", ""]
    return "\n".join(lines)


def _reason(error: BaseException) -> str:
    return (error.strerror if isinstance(error, OSError) else None) or str(error)
