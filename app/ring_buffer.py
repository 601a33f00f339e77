"""A preallocated float32 ring buffer between an audio callback and another thread.

Concurrency contract: one writer thread and one reader thread may use a ``RingBuffer``
at the same time. Every method takes the internal lock only for the bookkeeping and the
copy itself, never while waiting, so a PortAudio callback on either side never blocks
for longer than one ``memcpy``. The counters are plain integers that any thread may read.

It decouples PortAudio's block sizes (whatever the device asks for) from the engine's
80 ms frames: the callback writes or reads whatever it gets, the other side takes
exactly what it needs.
"""

from __future__ import annotations

import threading

import numpy as np


class RingBuffer:
    """Fixed-capacity FIFO of float32 samples that drops the oldest data when full.

    Args:
        capacity: the most samples it holds; allocated once, up front.

    ``overflows`` counts writes that had to drop old samples and ``dropped`` the samples
    they dropped; ``underruns`` counts ``read_into`` calls that found fewer samples than
    asked for.
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be a positive number of samples, got {capacity}")
        self._buffer = np.zeros(capacity, dtype=np.float32)
        self._capacity = capacity
        # Monotonic totals; the difference is the fill level and each modulo capacity a position.
        self._written = 0
        self._read = 0
        self._lock = threading.Lock()
        self.overflows = 0
        self.dropped = 0
        self.underruns = 0

    @property
    def capacity(self) -> int:
        """The most samples the ring holds."""
        return self._capacity

    @property
    def available(self) -> int:
        """Samples written and not yet read."""
        with self._lock:
            return self._written - self._read

    def write(self, samples: np.ndarray) -> int:
        """Append ``samples`` (1-D, converted to float32); returns how many were stored.

        When they do not fit, the oldest samples make room and ``overflows`` grows by one.
        A write larger than the whole ring keeps only its newest ``capacity`` samples.
        """
        data = np.asarray(samples, dtype=np.float32)
        if data.ndim != 1:
            raise ValueError(f"expected 1-D samples, got shape {data.shape}")
        truncated = len(data) - self._capacity
        if truncated > 0:
            data = data[-self._capacity :]
        with self._lock:
            if self._make_room(len(data)) or truncated > 0:
                self.overflows += 1
                self.dropped += max(0, truncated)
            self._copy_in(data)
        return len(data)

    def write_zeros(self, count: int) -> int:
        """Append ``count`` zero samples (silence) without allocating; returns how many were stored."""
        truncated = count - self._capacity
        count = min(max(count, 0), self._capacity)
        with self._lock:
            if self._make_room(count) or truncated > 0:
                self.overflows += 1
                self.dropped += max(0, truncated)
            start = self._written % self._capacity
            first = min(count, self._capacity - start)
            self._buffer[start : start + first] = 0.0
            self._buffer[: count - first] = 0.0
            self._written += count
        return count

    def read(self, count: int) -> np.ndarray | None:
        """Remove and return exactly ``count`` samples, or ``None`` (consuming nothing) if fewer are there."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        out = np.empty(count, dtype=np.float32)
        with self._lock:
            if self._written - self._read < count:
                return None
            self._copy_out(out)
        return out

    def read_into(self, out: np.ndarray) -> int:
        """Fill ``out`` (1-D float32, may be a view) from the ring; returns the samples read.

        When the ring holds fewer than ``len(out)`` samples, the rest of ``out`` is
        zero-filled and ``underruns`` grows by one.
        """
        with self._lock:
            count = min(len(out), self._written - self._read)
            self._copy_out(out[:count])
            if count < len(out):
                self.underruns += 1
        out[count:] = 0.0
        return count

    def clear(self) -> None:
        """Drop everything buffered; the counters are kept."""
        with self._lock:
            self._read = self._written

    def _make_room(self, count: int) -> bool:
        """Drop the oldest samples so ``count`` more fit; returns whether any were dropped."""
        excess = self._written - self._read + count - self._capacity
        if excess > 0:
            self._read += excess
            self.dropped += excess
        return excess > 0

    def _copy_in(self, data: np.ndarray) -> None:
        start = self._written % self._capacity
        first = min(len(data), self._capacity - start)
        self._buffer[start : start + first] = data[:first]
        self._buffer[: len(data) - first] = data[first:]
        self._written += len(data)

    def _copy_out(self, out: np.ndarray) -> None:
        start = self._read % self._capacity
        first = min(len(out), self._capacity - start)
        out[:first] = self._buffer[start : start + first]
        out[first:] = self._buffer[: len(out) - first]
        self._read += len(out)
