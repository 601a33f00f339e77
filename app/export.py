"""Saving a conversation (both sides as WAV plus a transcript) and exporting its profile log.

Every file is written to a temporary name in the target folder and renamed into place,
so a full disk or a read-only folder raises an ``ExportError`` naming the path and
leaves neither a partial file nor a changed recording behind: the user can pick
another folder and try again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.events import AssistantTextDelta, FrameTiming, ToolCall, UserTranscriptDelta

from .audio_files import write_wav

FRAME_S = 0.08


class ExportError(OSError):
    """A file could not be written; the message names it and says why."""


class ConversationRecording:
    """Both sides of the current conversation, as the model heard and spoke them (thread-safe)."""

    def __init__(self, input_rate: int = 16_000, output_rate: int = 22_050) -> None:
        self.input_rate = input_rate
        self.output_rate = output_rate
        self._lock = threading.Lock()
        self._input: list[np.ndarray] = []
        self._output: list[np.ndarray] = []

    def add_input(self, frame: np.ndarray) -> None:
        with self._lock:
            self._input.append(np.asarray(frame, dtype=np.float32).copy())

    def add_output(self, samples: np.ndarray) -> None:
        with self._lock:
            self._output.append(np.asarray(samples, dtype=np.float32).copy())

    def clear(self) -> None:
        with self._lock:
            self._input.clear()
            self._output.clear()

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            user = np.concatenate(self._input) if self._input else np.zeros(0, np.float32)
            assistant = np.concatenate(self._output) if self._output else np.zeros(0, np.float32)
        return user, assistant


@dataclass
class TranscriptEntry:
    role: str  # "user" | "assistant" | "tool call"
    frame_index: int
    text: str

    @property
    def seconds(self) -> float:
        return self.frame_index * FRAME_S


@dataclass
class Transcript:
    """Turns built from the streamed deltas: consecutive deltas of one role form one entry."""

    entries: list[TranscriptEntry] = field(default_factory=list)

    def add(self, event: Any) -> None:
        if isinstance(event, UserTranscriptDelta):
            self._append("user", event.frame_index, event.delta)
        elif isinstance(event, AssistantTextDelta):
            self._append("assistant", event.frame_index, event.delta)
        elif isinstance(event, ToolCall):
            text = f"{event.name}({event.arguments})" if event.error is None else f"{event.raw!r} — {event.error}"
            self.entries.append(TranscriptEntry("tool call", event.frame_index, text))

    def _append(self, role: str, frame_index: int, delta: str) -> None:
        if self.entries and self.entries[-1].role == role:
            self.entries[-1].text += delta
        else:
            self.entries.append(TranscriptEntry(role, frame_index, delta))

    def clear(self) -> None:
        self.entries.clear()

    def to_markdown(self, title: str = "Parley conversation") -> str:
        lines = [f"# {title}", ""]
        for entry in self.entries:
            minutes, seconds = divmod(entry.seconds, 60)
            lines.append(f"**[{int(minutes):02d}:{seconds:05.2f}] {entry.role}:** {entry.text.strip()}")
            lines.append("")
        return "\n".join(lines)


def _write_text(path: Path, text: str) -> Path:
    from engine.files import write_atomic

    return write_atomic(path, text)


def _guarded(path: Path, action: Any) -> Path:
    try:
        return action()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ExportError(f"Could not write {path}: {reason}") from exc


def save_conversation(folder: Path, recording: ConversationRecording, transcript: Transcript) -> list[Path]:
    """Write ``user.wav`` (16 kHz, what the model heard), ``assistant.wav`` (22.05 kHz) and ``transcript.md``."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"Could not create {folder}: {exc.strerror or exc}") from exc
    user, assistant = recording.snapshot()
    return [
        _guarded(folder / "user.wav", lambda: write_wav(folder / "user.wav", user, recording.input_rate)),
        _guarded(
            folder / "assistant.wav", lambda: write_wav(folder / "assistant.wav", assistant, recording.output_rate)
        ),
        _guarded(folder / "transcript.md", lambda: _write_text(folder / "transcript.md", transcript.to_markdown())),
    ]


def export_profile(
    path: Path, timings: Sequence[FrameTiming], *, checkpoint: dict[str, Any], settings: dict[str, Any]
) -> list[Path]:
    """Write the session profile log as ``<stem>.json``, ``<stem>.csv`` and ``<stem>.trace.json``."""
    from engine.profile_log import build_profile_log, write_profile_log

    path = Path(path)
    stem = path.name.removesuffix(".trace.json").removesuffix(".json").removesuffix(".csv")
    log = build_profile_log(list(timings), checkpoint=checkpoint, settings=settings)
    targets = {
        "json": path.with_name(f"{stem}.json"),
        "csv": path.with_name(f"{stem}.csv"),
        "trace": path.with_name(f"{stem}.trace.json"),
    }
    return [
        _guarded(target, lambda target=target, fmt=fmt: write_profile_log(log, target, fmt))
        for fmt, target in targets.items()
    ]
