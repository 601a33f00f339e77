"""Saving a conversation (both sides as WAV plus a transcript, in a folder of its own) and exporting the
session's profile log.

Save Conversation makes one folder per conversation, named and filled as History → Export makes one
(``app.history.conversation_folder``). Every file is written to a temporary name and renamed into place,
so a full disk or a read-only folder raises an ``ExportError`` naming the path and leaves neither a
partial file nor a changed recording behind: the user can pick another folder and try again. Every file is
private to the user (0600, ``app.files.make_private``): it holds their voice or what they said. Nothing to
write is a ``NothingToExport`` error, never an empty file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from engine.events import AssistantTextDelta, FrameTiming, ToolCall, UserTranscriptDelta
from engine.timeline import FRAME_SECONDS, INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

from .audio.output import TruePeakLimiter
from .audio_files import write_wav
from .files import PRIVATE_DIR_MODE, make_private, write_text_file
from .history import conversation_folder
from .messages import FrameStats, TimerDone, ToolActivity, ToolResponseTiming, ToolTurnHeard


class ExportError(OSError):
    """A file could not be written; the message names it and says why."""


class NothingToExport(Exception):
    """There is nothing to write yet; the message says why, for the user."""


class ConversationRecording:
    """Both sides of the current conversation, as the model heard and as it played them (thread-safe).

    The assistant's side goes through the speaker's limiter (``app.audio.output``), so what is kept is what
    was heard at full volume: never above -6 dBFS, never clipped.
    """

    def __init__(self, input_rate: int = INPUT_SAMPLE_RATE, output_rate: int = OUTPUT_SAMPLE_RATE) -> None:
        self.input_rate = input_rate
        self.output_rate = output_rate
        self._lock = threading.Lock()
        self._input: list[np.ndarray] = []
        self._output: list[np.ndarray] = []
        self._limiter = TruePeakLimiter(output_rate)

    def add_input(self, frame: np.ndarray) -> None:
        with self._lock:
            self._input.append(np.asarray(frame, dtype=np.float32).copy())

    def add_output(self, samples: np.ndarray) -> None:
        block = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float32), posinf=0.0, neginf=0.0), -1.0, 1.0)
        with self._lock:
            self._limiter.process(block)  # as AudioIO.play() and its output callback do
            self._output.append(block)

    def clear(self) -> None:
        with self._lock:
            self._input.clear()
            self._output.clear()
            self._limiter = TruePeakLimiter(self.output_rate)

    @property
    def empty(self) -> bool:
        with self._lock:
            return not self._input and not self._output

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            user = np.concatenate(self._input) if self._input else np.zeros(0, np.float32)
            assistant = np.concatenate(self._output) if self._output else np.zeros(0, np.float32)
        return user, assistant


@dataclass
class TranscriptEntry:
    role: str  # "user" | "assistant" | "tool call" | "tool result" | "tool response" | "timer"
    frame_index: int
    text: str

    @property
    def seconds(self) -> float:
        return self.frame_index * FRAME_SECONDS


@dataclass
class Transcript:
    """Turns built from the streamed deltas: consecutive deltas of one role form one entry.

    Holds one conversation (the controller clears it when the next begins); text is kept as
    the model produced it, special markers included, since exports keep them.
    """

    entries: list[TranscriptEntry] = field(default_factory=list)

    def add(self, event: Any) -> None:
        if isinstance(event, UserTranscriptDelta):
            self._append("user", event.frame_index, event.delta)
        elif isinstance(event, AssistantTextDelta):
            self._append("assistant", event.frame_index, event.delta)
        elif isinstance(event, ToolCall):
            text = f"{event.name}({event.arguments})" if event.error is None else f"{event.raw!r} — {event.error}"
            self.entries.append(TranscriptEntry("tool call", event.frame_index, text))
        elif isinstance(event, ToolActivity):
            self.entries.append(TranscriptEntry("tool result", event.frame_index, describe_activity(event)))
        elif isinstance(event, ToolResponseTiming):
            text = (
                f"{event.calls} result{'s' if event.calls != 1 else ''} given to the model: "
                f"{event.positions} positions in {event.inject_s:.2f} s; "
                f"the tool turn took {event.turn_s:.2f} s; {event.replayed_frames} frames of the user replayed"
            )
            self.entries.append(TranscriptEntry("tool response", event.frame_index, text))
        elif isinstance(event, ToolTurnHeard):
            text = f"the assistant's first sound came {event.seconds:.2f} s after the call"
            self.entries.append(TranscriptEntry("tool response", event.frame_index, text))
        elif isinstance(event, TimerDone):
            self.entries.append(TranscriptEntry("timer", event.frame_index or 0, describe_timer(event)))

    def _append(self, role: str, frame_index: int, delta: str) -> None:
        if self.entries and self.entries[-1].role == role:
            self.entries[-1].text += delta
        else:
            self.entries.append(TranscriptEntry(role, frame_index, delta))

    def clear(self) -> None:
        self.entries.clear()

    def to_markdown(self, title: str = "Parley conversation") -> str:
        """One line per entry, in time order (an entry's time is its first delta's frame)."""
        lines = [f"# {title}", ""]
        for entry in sorted(self.entries, key=lambda entry: entry.frame_index):
            minutes, seconds = divmod(entry.seconds, 60)
            lines.append(f"**[{int(minutes):02d}:{seconds:05.2f}] {entry.role}:** {entry.text.strip()}")
            lines.append("")
        return "\n".join(lines)


def describe_activity(activity: ToolActivity) -> str:
    """One tool call in words: what, the decision (and how long the user took), the outcome, the time."""
    import json

    called = activity.tool or "(no tool named)"
    arguments = json.dumps(activity.arguments, ensure_ascii=False) if activity.arguments is not None else activity.raw
    waited = f" after {activity.consent_s:.1f} s" if activity.consent_s >= 0.05 else ""
    outcome = "ok" if activity.ok else "failed"
    ran = f" in {activity.run_s:.2f} s" if activity.run_s else ""
    return f"{called} {arguments} — {activity.decision}{waited}; {outcome}{ran} at {activity.at}: {activity.content}"


def describe_timer(timer: TimerDone) -> str:
    from .tools.builtin import describe_duration

    return f"Timer done: {timer.label} ({describe_duration(timer.seconds)})"


@dataclass
class ConversationProfile:
    """One conversation's frame timings and turn delays, as the session profile keeps them."""

    number: int
    started: datetime
    variant: str
    checkpoint: dict[str, Any]  # VoiceChat.describe(): its numerics included
    timings: list[FrameTiming] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    last_stats: FrameStats | None = None  # its latest, whose audio counters cover the whole conversation
    model: str = ""  # how the window names the model ("tiny4 · 4-bit", "Demo")
    settings: dict[str, Any] = field(default_factory=dict)  # the settings in force when it started
    clock_s: float = field(default_factory=time.monotonic)  # its start on the session clock
    tool_calls: list[ToolActivity] = field(default_factory=list)  # every call answered, in order
    tool_responses: list[ToolResponseTiming] = field(default_factory=list)  # every response injected
    tool_turns_heard: list[ToolTurnHeard] = field(default_factory=list)  # each turn, call to first sound after it

    @property
    def numerics(self) -> str:
        return str(self.checkpoint.get("numerics", "exact"))


@dataclass
class SessionProfile:
    """Every conversation since launch (one thread: the controller's)."""

    conversations: list[ConversationProfile] = field(default_factory=list)

    def begin(
        self,
        number: int,
        variant: str,
        checkpoint: dict[str, Any],
        *,
        model: str = "",
        settings: dict[str, Any] | None = None,
    ) -> ConversationProfile:
        conversation = ConversationProfile(
            number, datetime.now(UTC), variant, dict(checkpoint), model=model, settings=dict(settings or {})
        )
        self.conversations.append(conversation)
        return conversation

    @property
    def current(self) -> ConversationProfile | None:
        return self.conversations[-1] if self.conversations else None

    @property
    def frame_count(self) -> int:
        return sum(len(c.timings) for c in self.conversations)


def conversation_log(conversation: ConversationProfile) -> Any:
    """``conversation`` as ``engine.profile_log`` takes it (a copy: the controller keeps adding to the original)."""
    from engine import AUDIO_COUNTERS, ConversationLog

    stats = conversation.last_stats
    return ConversationLog(
        conversation.number,
        conversation.started,
        conversation.variant,
        dict(conversation.checkpoint),
        list(conversation.timings),
        list(conversation.latencies_s),
        None if stats is None else {key: getattr(stats, key) for key in AUDIO_COUNTERS},
        settings=dict(conversation.settings),
        clock_s=conversation.clock_s,
    )


def _guarded(path: Path, action: Callable[[], Path]) -> Path:
    try:
        return make_private(action())
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ExportError(f"Could not write {path}: {reason}") from exc


def save_conversation(
    parent: Path,
    recording: ConversationRecording,
    transcript: Transcript,
    *,
    started: datetime,
    profile: dict[str, Any] | None = None,
) -> list[Path]:
    """Write the conversation into a new folder in ``parent`` named as History → Export names one
    (``Parley conversation <local start time>``): ``user.wav`` (16 kHz, what the model heard), ``assistant.wav``
    (22.05 kHz), ``transcript.md`` and, when given, ``profile.json``. The folder appears whole or not at all.

    Raises:
        NothingToExport: the conversation has no audio and no text yet.
        ExportError: a file could not be written (nothing is left behind).
    """
    from engine import to_json

    if recording.empty and not transcript.entries:
        raise NothingToExport("Nothing to save yet: this conversation has no audio or text. Talk first, then save.")
    parent = Path(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=parent))
    except OSError as exc:
        raise ExportError(f"Could not create a folder in {parent}: {exc.strerror or exc}") from exc
    user, assistant = recording.snapshot()
    writers: dict[str, Callable[[Path], Path]] = {
        "user.wav": lambda path: write_wav(path, user, recording.input_rate),
        "assistant.wav": lambda path: write_wav(path, assistant, recording.output_rate),
        "transcript.md": lambda path: write_text_file(path, transcript.to_markdown()),
    }
    if profile is not None:
        writers["profile.json"] = lambda path: write_text_file(path, to_json(profile))
    target = conversation_folder(parent, started)
    try:
        for name, write in writers.items():
            _guarded(target / name, lambda name=name, write=write: write(partial / name))  # type: ignore[misc]
        try:
            os.chmod(partial, PRIVATE_DIR_MODE)
            os.rename(partial, target)
        except OSError as exc:
            raise ExportError(f"Could not create {target}: {exc.strerror or exc}") from exc
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return [target / name for name in writers]


def tool_log(conversations: list[ConversationProfile]) -> dict[str, Any] | None:
    """Every tool call and injected response of ``conversations`` (None: there were none)."""
    if not any(c.tool_calls or c.tool_responses for c in conversations):
        return None
    return {
        "format": "parley-tool-log/1",
        "conversations": [
            {
                "conversation": c.number,
                "started": c.started.isoformat(),
                "calls": [activity.to_dict() for activity in c.tool_calls],
                "responses": [
                    {
                        "frame_index": r.frame_index,
                        "calls": r.calls,
                        "positions": r.positions,
                        "inject_s": round(r.inject_s, 4),
                        "turn_s": round(r.turn_s, 4),
                        "replayed_frames": r.replayed_frames,
                    }
                    for r in c.tool_responses
                ],
                "first_sound_after_call_s": [round(h.seconds, 4) for h in c.tool_turns_heard],
            }
            for c in conversations
            if c.tool_calls or c.tool_responses
        ],
    }


def export_profile(path: Path, profile: SessionProfile) -> list[Path]:
    """Write every conversation's frame log as ``<stem>.json``, ``<stem>.csv`` and ``<stem>.trace.json``, and
    when the model called tools, every call, decision, result and time as ``<stem>.tools.json``.

    Raises:
        NothingToExport: no frame has run since launch.
        ExportError: a file could not be written.
    """
    from engine import build_session_profile_log, write_profile_log

    conversations = [c for c in profile.conversations if c.timings]
    if not conversations:
        raise NothingToExport(
            "Nothing to export yet: no conversation has run since Parley started. Talk first, then export."
        )
    path = Path(path)
    stem = path.name.removesuffix(".trace.json").removesuffix(".json").removesuffix(".csv")
    log = build_session_profile_log([conversation_log(c) for c in conversations])
    targets = {
        "json": path.with_name(f"{stem}.json"),
        "csv": path.with_name(f"{stem}.csv"),
        "trace": path.with_name(f"{stem}.trace.json"),
    }
    paths = [
        _guarded(target, lambda target=target, fmt=fmt: write_profile_log(log, target, fmt))  # type: ignore[misc]
        for fmt, target in targets.items()
    ]
    tools = tool_log(conversations)
    if tools is not None:
        import json

        target = path.with_name(f"{stem}.tools.json")
        text = json.dumps(tools, indent=2, ensure_ascii=False) + "\n"
        paths.append(_guarded(target, lambda: write_text_file(target, text)))
    return paths
