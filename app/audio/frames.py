"""The microphone's reader side: :class:`FrameReader` turns the device-rate ring into engine frames.

The input callback writes the ring (and ``captured`` / ``adc_anchor``); one engine thread takes whole
16 kHz frames out through soxr, each with the time its first sample was captured (for the echo
canceller). ``lock`` guards the resampler and the ring's identity, so a reopen at a new rate swaps
them safely.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import soxr

from app.ring_buffer import RingBuffer


class FrameReader:
    """Device-rate ring -> resampler -> exact ``frame_samples`` frames at ``engine_rate``."""

    def __init__(self, ring_s: float, engine_rate: int, frame_samples: int) -> None:
        self._ring_s = ring_s
        self._engine_rate = engine_rate
        self._frame_samples = frame_samples
        self.lock = threading.Lock()
        self.rate = engine_rate  # the device's rate once a stream opens
        self.ring = RingBuffer(round(ring_s * engine_rate))
        self._resampler = soxr.ResampleStream(engine_rate, engine_rate, 1, dtype="float32")
        self._pending = np.zeros(0, dtype=np.float32)
        self.ready = threading.Event()  # set by the callback after each write
        # Where each frame was captured: device samples entered into the ring since it was last cleared, the
        # latest input block's (sample number, ADC time), and engine-rate samples resampled.
        self.captured = 0
        self.adc_anchor: tuple[int, float] | None = None
        self._resampled = 0
        self._dropped_at_clear = 0
        # Counters of rings replaced after a sample-rate change.
        self._retired_lost_s = 0.0
        self._retired_overflows = 0

    @property
    def overflows(self) -> int:
        """Blocks that pushed out unread audio."""
        return self._retired_overflows + self.ring.overflows

    @property
    def lost_s(self) -> float:
        """Seconds of captured audio dropped unread."""
        return self._retired_lost_s + self.ring.dropped / self.rate

    @property
    def backlog_frames(self) -> int:
        """Whole frames waiting."""
        in_ring = self.ring.available * self._engine_rate / self.rate
        return int((in_ring + len(self._pending)) // self._frame_samples)

    def clear_locked(self) -> None:
        """Drop everything not yet read (caller holds ``lock``)."""
        self.ring.clear()
        self._resampler.clear()
        self._pending = np.zeros(0, dtype=np.float32)
        self.captured = self._resampled = 0
        self.adc_anchor = None
        self._dropped_at_clear = self.ring.dropped

    def take_frame(self) -> tuple[np.ndarray, float | None] | None:
        """Resample just enough from the ring for one frame, with its ADC time (caller holds ``lock``)."""
        frame_samples = self._frame_samples
        while len(self._pending) < frame_samples:
            available = self.ring.available
            if available == 0:
                return None
            missing = frame_samples - len(self._pending)
            # Pull only what this frame needs (plus a little for the resampler's delay), so a
            # slow engine leaves the backlog in the bounded ring instead of growing it here.
            wanted = min(available, math.ceil(missing * self.rate / self._engine_rate) + 64)
            chunk = self.ring.read(wanted)
            if chunk is None:  # only the writer could have removed samples: a full ring dropped them
                continue
            resampled = self._resampler.resample_chunk(chunk)
            self._resampled += len(resampled)
            self._pending = np.concatenate((self._pending, resampled))
        adc_time = self._frame_adc_time()
        frame, self._pending = self._pending[:frame_samples].copy(), self._pending[frame_samples:]
        return frame, adc_time

    def _frame_adc_time(self) -> float | None:
        """When the next pending frame's first sample was captured (``time.monotonic()``), or None if unknown.

        Counted in device samples from the latest input block's ADC time: the sample count is exact while
        nothing is dropped (dropped samples are added back), and the echo canceller re-anchors on a jump.
        """
        anchor = self.adc_anchor
        if anchor is None:
            return None
        first = (self._resampled - len(self._pending)) * self.rate / self._engine_rate
        first += self.ring.dropped - self._dropped_at_clear
        index, adc_time = anchor
        return adc_time + (first - index) / self.rate

    def adopt_rate(self, rate: int) -> RingBuffer:
        """Prepare the ring and resampler for a device at ``rate``, keeping audio already captured."""
        with self.lock:
            if rate != self.rate:
                rest = self.ring.read(self.ring.available)
                assert rest is not None  # no writer while the stream is closed
                self._pending = np.concatenate((self._pending, self._resampler.resample_chunk(rest, last=True)))
                self._retired_overflows += self.ring.overflows
                self._retired_lost_s += self.ring.dropped / self.rate
                self.ring = RingBuffer(round(self._ring_s * rate))
                self._resampler = soxr.ResampleStream(rate, self._engine_rate, 1, dtype="float32")
                self.rate = rate
            return self.ring
