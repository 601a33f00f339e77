"""A history replay through the speaker: :class:`Replayer`, its own ring at the speaker's rate, fed by a thread.

The output callback mixes the ring into the speaker after the audibility check (a replay is not the
assistant speaking) and before the volume and the limiter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import soxr

from app.ring_buffer import RingBuffer

REPLAY_AHEAD_S: Final = 1.0  # a replay keeps this much queued ahead of the speaker


@dataclass(eq=False)
class _Replay:
    """One history replay in progress."""

    samples: np.ndarray
    rate: int
    fed_s: float = 0.0  # seconds handed to the replay ring so far
    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.rate


class Replayer:
    """Plays one replay at a time into ``ring``, read by the speaker's callback.

    Args:
        speaker_rate: the speaker stream's rate now (it changes when the device does).
    """

    def __init__(self, speaker_rate: Callable[[], int]) -> None:
        self._speaker_rate = speaker_rate
        self.ring: RingBuffer | None = None  # made by the first replay; the callback reads it
        self._replay: _Replay | None = None

    def start(self, samples: np.ndarray, rate: int) -> float:
        """Play ``samples`` (mono, at ``rate``), replacing a replay in progress; returns its seconds."""
        self.stop()
        data = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1)), -1.0, 1.0)
        replay = _Replay(data, int(rate))
        self._replay = replay
        replay.thread = threading.Thread(target=self._feed, args=(replay,), name="parley-replay", daemon=True)
        replay.thread.start()
        return replay.duration_s

    def stop(self) -> None:
        """Stop a replay now (what is queued is dropped)."""
        replay, self._replay = self._replay, None
        if replay is not None:
            replay.stop.set()
        ring = self.ring
        if ring is not None:
            ring.clear()

    @property
    def position(self) -> tuple[float, float] | None:
        """``(seconds played, seconds in all)`` of the replay in progress, or None when none plays."""
        replay = self._replay
        if replay is None:
            return None
        ring = self.ring
        queued = ring.available / self._speaker_rate() if ring is not None else 0.0
        played = max(0.0, replay.fed_s - queued)
        if replay.done.is_set() and queued == 0.0:
            if self._replay is replay:
                self._replay = None
            return None
        return played, replay.duration_s

    def _feed(self, replay: _Replay) -> None:
        """The feeder thread: resample once, then keep ``REPLAY_AHEAD_S`` queued until the end."""
        rate = self._speaker_rate()
        data = replay.samples if replay.rate == rate else soxr.resample(replay.samples, replay.rate, rate)
        data = np.asarray(data, dtype=np.float32)
        ring = self.ring
        if ring is None or ring.capacity < round(2 * REPLAY_AHEAD_S * rate):
            ring = self.ring = RingBuffer(round(2 * REPLAY_AHEAD_S * rate))
        ring.clear()
        position = 0
        while position < len(data) and not replay.stop.is_set():
            room = round(REPLAY_AHEAD_S * rate) - ring.available
            if room > 0:
                chunk = data[position : position + room]
                ring.write(chunk)
                position += len(chunk)
                replay.fed_s = position / rate
            replay.stop.wait(0.05)
        replay.done.set()
