"""The speaker's writer side: :class:`PlaybackQueue` takes the engine's 22.05 kHz audio to the device's rate.

One engine thread queues (``AudioIO.play``); the output callback reads ``ring``. ``lock`` guards the
resampler and the ring's identity, so a reopen at a new rate swaps them safely.
"""

from __future__ import annotations

import threading

import numpy as np
import soxr

from app.ring_buffer import RingBuffer

from .output import AUDIBLE_PEAK


class PlaybackQueue:
    """22.05 kHz -> resampler -> device-rate ring, with the live stream's catch-up after an underrun."""

    def __init__(self, ring_s: float, engine_rate: int, prefill_s: float) -> None:
        self._ring_s = ring_s
        self._engine_rate = engine_rate
        self._prefill_s = prefill_s
        self.lock = threading.Lock()
        self.rate = engine_rate  # the device's rate once a stream opens
        self.ring = RingBuffer(round(ring_s * engine_rate))
        self._resampler = soxr.ResampleStream(engine_rate, engine_rate, 1, dtype="float32")
        # Counters of rings replaced after a sample-rate change.
        self._retired_overflows = 0
        self._retired_underruns = 0
        self.skipped_s = 0.0  # live silence skipped to win back an underrun's delay

    @property
    def overflows(self) -> int:
        return self._retired_overflows + self.ring.overflows

    @property
    def underruns(self) -> int:
        return self._retired_underruns + self.ring.underruns

    @property
    def backlog_s(self) -> float:
        return self.ring.available / self.rate

    def queue(self, data: np.ndarray, *, live: bool) -> None:
        """Queue ``data`` (finite float32 at the engine's rate); a live frame with nothing audible in it is skipped
        while more than the jitter buffer and this frame are queued (``skipped_s``)."""
        duration_s = data.shape[0] / self._engine_rate
        with self.lock:
            late = live and self.ring.available / self.rate >= self._prefill_s + duration_s
            if late and np.abs(data).max(initial=0.0) <= AUDIBLE_PEAK:
                self.skipped_s += duration_s
                return
            self.ring.write(self._resampler.resample_chunk(data))

    def clear(self) -> None:
        with self.lock:
            self.ring.clear()
            self._resampler.clear()

    def adopt_rate(self, rate: int) -> RingBuffer:
        """Prepare the ring and resampler for a device at ``rate``, converting audio still queued."""
        with self.lock:
            if rate != self.rate:
                queued = self.ring.read(self.ring.available)
                assert queued is not None  # the reader (output callback) is stopped
                tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
                old = np.concatenate((queued, tail))
                self._retired_overflows += self.ring.overflows
                self._retired_underruns += self.ring.underruns
                self.ring = RingBuffer(round(self._ring_s * rate))
                self.ring.write(soxr.resample(old, self.rate, rate).astype(np.float32))
                self._resampler = soxr.ResampleStream(self._engine_rate, rate, 1, dtype="float32")
                self.rate = rate
            return self.ring
