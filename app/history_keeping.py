"""Keeping each conversation once: in the history, written on a saver thread, unless it was saved by hand.

Qt-free. ``ConversationKeeper`` is the controller's collaborator for the history side: it hands a finished
conversation to ``HistorySaver`` (its own thread; a long conversation is tens of MB), folds the saver's reports
back in (``NotKept`` / ``HistorySaved``, in the controller's queue order) and says whether ending the current
conversation now would lose it. ``HistoryReplay`` plays a saved conversation, mixed into one track by ``replay_mix``,
through the speaker and says where it is.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from engine.timeline import OUTPUT_SAMPLE_RATE

from .audio_port import AudioStreams
from .export import ConversationProfile, ConversationRecording, Transcript, conversation_log
from .history import ConversationHistory, ConversationRecord, HistoryError, LoadedConversation, TranscriptLine
from .messages import Failure, HistorySaved, ReplayProgress

log = logging.getLogger(__name__)

REPLAY_REPORT_S = 0.25  # a replay's position is reported this often


@dataclass(frozen=True)
class NotKept:
    """Internal: saving conversation ``serial`` to the history failed."""

    serial: int


class ConversationKeeper:
    """Whether the current conversation is kept, and keeping it: the history side of the controller.

    Runs on the controller's thread; only the saver's thread posts (through ``post``).
    """

    def __init__(self, history: ConversationHistory, post: Callable[[object], None]) -> None:
        self.history = history
        self._saver = HistorySaver(history, post)
        self.kept = False  # the current conversation was saved (to the history, or by hand)
        self._serial = 0  # counts conversations seen here, to match a failed save to its conversation
        self._failing = False  # the last save to the history failed (until one succeeds)

    def observe(self, message: object) -> bool:
        """Fold in the saver's reports; returns whether ``message`` was the keeper's alone."""
        if isinstance(message, NotKept):
            # Until a save works again the history cannot be relied on: the window asks before dropping anything.
            self._failing = True
            if message.serial == self._serial:
                self.kept = False  # still the current conversation: Save Conversation… can keep it
            return True
        if isinstance(message, HistorySaved):
            self._failing = False
        return False

    def conversation_began(self) -> None:
        self._serial += 1

    def at_risk(self, recording: ConversationRecording, transcript: Transcript) -> bool:
        """Whether ending the conversation now would lose it: not saved by hand, and the history will not keep
        it (saving is off, or saving it failed)."""
        if self.kept or (recording.empty and not transcript.entries):
            return False
        return not self.history.enabled or self._failing

    def keep(
        self, recording: ConversationRecording, transcript: Transcript, current: ConversationProfile | None
    ) -> None:
        """Hand the current conversation to the saver thread, once (when saving is on and there is something)."""
        if self.kept or not self.history.enabled or (recording.empty and not transcript.entries):
            return
        user, assistant = recording.snapshot()
        record = ConversationRecord(
            started=current.started if current is not None else now(),
            transcript=[TranscriptLine(e.role, e.seconds, e.text) for e in transcript.entries],
            user_audio=user,
            assistant_audio=assistant,
            user_rate=recording.input_rate,
            assistant_rate=recording.output_rate,
            model=current.model if current is not None else None,
            numerics=current.numerics if current is not None else None,
        )
        profile = conversation_log(current) if current is not None and current.timings else None
        self._saver.save(record, profile, self._serial)
        self.kept = True

    def set_limits(self, enabled: bool, max_bytes: int, *, lowered: bool) -> None:
        self.history.enabled, self.history.max_bytes = enabled, max_bytes
        if lowered:
            self._saver.prune()

    def close(self, timeout: float) -> None:
        self._saver.close(timeout)


class HistorySaver:
    """Writes conversations to the history on its own thread (a long one is tens of MB), in order.

    The controller calls ``save`` / ``prune`` / ``close`` on its thread; results come back through ``post``
    (``HistorySaved``, ``NotKept`` or ``Failure``).
    """

    def __init__(self, history: ConversationHistory, post: Callable[[object], None]) -> None:
        self._history = history
        self._post = post
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def save(self, record: ConversationRecord, profile: Any, serial: int) -> None:
        """Keep ``record`` with the profile of ``profile`` (an ``engine.profile_log.ConversationLog``, or None)."""
        self._submit(lambda: self._save(record, profile, serial))

    def prune(self) -> None:
        self._submit(self._prune)

    def close(self, timeout: float) -> None:
        """Finish what is queued (for at most ``timeout`` seconds) and stop."""
        thread = self._thread
        if thread is None:
            return
        self._jobs.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.error("The history is still being written after %.0f s; quitting without waiting", timeout)
        self._thread = None

    def _submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="parley-history", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # a failed save is reported; the saver keeps going
                log.exception("History job failed")
                self._post(Failure(f"Could not keep the conversation in the history: {exc}"))

    def _save(self, record: ConversationRecord, profile: Any, serial: int) -> None:
        if profile is not None:
            from engine import build_session_profile_log

            record = replace(record, profile=build_session_profile_log([profile]))
        try:
            entry = self._history.save(record)
        except HistoryError as exc:
            log.warning("Could not keep the conversation: %s", exc)
            self._post(NotKept(serial))
            self._post(
                Failure(
                    f"Could not keep the conversation in the history: {exc} Until saving works again, New "
                    "Conversation and Quit ask before dropping a conversation (File → Save Conversation… keeps it)."
                )
            )
            return
        if entry is None:
            return
        log.info("Kept the conversation in %s (%.1f s, %d bytes)", entry.path, entry.duration_s, entry.size_bytes)
        self._post(HistorySaved(entry.id, entry.path))

    def _prune(self) -> None:
        removed = self._history.prune()
        if removed:
            log.info("History limit lowered: removed the %d oldest conversations", len(removed))


def replay_mix(loaded: LoadedConversation, rate: int) -> np.ndarray:
    """Both sides of a saved conversation as one track at ``rate``: they share a timeline from its start."""
    import soxr

    def at_rate(samples: np.ndarray, source: int) -> np.ndarray:
        data = np.asarray(samples, dtype=np.float32).reshape(-1)
        return data if source == rate or not len(data) else np.asarray(soxr.resample(data, source, rate), np.float32)

    user = at_rate(loaded.user_audio, loaded.user_rate)
    assistant = at_rate(loaded.assistant_audio, loaded.assistant_rate)
    mixed = np.zeros(max(len(user), len(assistant)), dtype=np.float32)
    mixed[: len(user)] += user
    mixed[: len(assistant)] += assistant
    return np.clip(mixed, -1.0, 1.0)


def now() -> datetime:
    return datetime.now(UTC)


class HistoryReplay:
    """One past conversation at a time played through the speaker (``streams()``: the open audio streams, or None),
    its position reported every :data:`REPLAY_REPORT_S` while it plays."""

    def __init__(
        self, history: ConversationHistory, streams: Callable[[], AudioStreams | None], post: Callable[[object], None]
    ) -> None:
        self._history, self._streams, self._post = history, streams, post
        self.entry_id: str | None = None  # what plays now
        self._next_report = 0.0

    def start(self, entry_id: str) -> float:
        """Play ``entry_id``; returns its length in s (HistoryError: damaged or gone; RuntimeError: no speaker)."""
        streams = self._streams()
        if streams is None or streams.paused:
            raise RuntimeError("There is no speaker to play on. Connect one, or check the sound settings.")
        loaded = self._history.load(entry_id)
        duration = streams.start_replay(replay_mix(loaded, OUTPUT_SAMPLE_RATE), OUTPUT_SAMPLE_RATE)
        self.entry_id, self._next_report = entry_id, 0.0
        log.info("Replaying history entry %s (%.1f s)", entry_id, duration)
        return duration

    def stop(self) -> None:
        streams = self._streams()
        if streams is not None:
            streams.stop_replay()
        if self.entry_id is not None:
            self.entry_id = None
            self._post(ReplayProgress(None))

    def progress_due(self, now: float) -> ReplayProgress | None:
        """Where the replay is, when a report is due at ``now`` (monotonic s); None otherwise. A replay that ended
        reports ``ReplayProgress(None)`` once."""
        if self.entry_id is None or now < self._next_report:
            return None
        self._next_report = now + REPLAY_REPORT_S
        streams = self._streams()
        position = streams.replay_position if streams is not None else None
        if position is None:
            self.entry_id = None
            return ReplayProgress(None)
        return ReplayProgress(self.entry_id, *position)
