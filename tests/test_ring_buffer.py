"""RingBuffer: wrap-around, overflow/underrun counting, and one writer + one reader thread."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from app.ring_buffer import RingBuffer


def ramp(start: int, stop: int) -> np.ndarray:
    return np.arange(start, stop, dtype=np.float32)


def test_reads_return_what_was_written_across_the_wrap() -> None:
    ring = RingBuffer(8)
    ring.write(ramp(0, 5))
    np.testing.assert_array_equal(ring.read(3), ramp(0, 3))
    ring.write(ramp(5, 11))  # positions 5..7 then 0..2: wraps
    assert ring.available == 8
    np.testing.assert_array_equal(ring.read(8), ramp(3, 11))
    assert ring.available == 0
    assert (ring.overflows, ring.underruns) == (0, 0)


def test_read_into_wraps_and_fills_a_view() -> None:
    ring = RingBuffer(4)
    ring.write(ramp(0, 3))
    assert ring.read(2) is not None
    ring.write(ramp(3, 6))
    out = np.full((4, 2), -1.0, dtype=np.float32)
    assert ring.read_into(out[:, 0]) == 4  # a strided column, as PortAudio hands over
    np.testing.assert_array_equal(out[:, 0], ramp(2, 6))
    np.testing.assert_array_equal(out[:, 1], np.full(4, -1.0))


def test_overflow_drops_the_oldest_and_counts_once_per_write() -> None:
    ring = RingBuffer(8)
    ring.write(ramp(0, 6))
    assert ring.write(ramp(6, 11)) == 5
    assert ring.overflows == 1
    assert ring.dropped == 3  # samples, for the lost-audio seconds
    assert ring.available == 8
    np.testing.assert_array_equal(ring.read(8), ramp(3, 11))


def test_write_larger_than_capacity_keeps_the_newest() -> None:
    ring = RingBuffer(4)
    ring.write(ramp(0, 2))
    assert ring.write(ramp(2, 12)) == 4
    assert ring.overflows == 1
    assert ring.dropped == 12 - 4  # everything written but the 4 kept
    np.testing.assert_array_equal(ring.read(4), ramp(8, 12))


def test_read_into_short_zero_fills_and_counts_an_underrun() -> None:
    ring = RingBuffer(8)
    ring.write(ramp(1, 4))
    out = np.full(5, 9.0, dtype=np.float32)
    assert ring.read_into(out) == 3
    np.testing.assert_array_equal(out, [1, 2, 3, 0, 0])
    assert ring.underruns == 1
    assert ring.read_into(out) == 0
    np.testing.assert_array_equal(out, np.zeros(5))
    assert ring.underruns == 2


def test_read_of_more_than_available_returns_none_and_consumes_nothing() -> None:
    ring = RingBuffer(8)
    ring.write(ramp(0, 3))
    assert ring.read(4) is None
    assert ring.available == 3
    assert ring.underruns == 0
    assert ring.read(0) is not None and ring.available == 3


def test_write_zeros_wraps_and_counts_overflow() -> None:
    ring = RingBuffer(4)
    ring.write(ramp(1, 4))
    ring.write_zeros(3)
    assert ring.overflows == 1
    assert ring.dropped == 2
    np.testing.assert_array_equal(ring.read(4), [3, 0, 0, 0])


def test_clear_empties_but_keeps_counters() -> None:
    ring = RingBuffer(2)
    ring.write(ramp(0, 3))  # one sample too many: dropped and counted
    ring.clear()
    assert ring.available == 0
    assert ring.overflows == 1
    ring.write(ramp(7, 9))
    np.testing.assert_array_equal(ring.read(2), [7, 8])


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RingBuffer(0)
    ring = RingBuffer(4)
    with pytest.raises(ValueError, match="1-D"):
        ring.write(np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="count"):
        ring.read(-1)


@pytest.fixture
def fast_thread_switching() -> Iterator[None]:
    """Make the interpreter switch threads every 10 µs so the two sides interleave constantly."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(previous)


def _run_writer_and_reader(
    ring: RingBuffer, total: int, *, write: tuple[int, int], read: tuple[int, int], writer_waits: bool
) -> np.ndarray:
    """Stream ramp(0, total) through ``ring`` in blocks of write/read sizes; return everything the reader got.

    Blocks of thousands of samples, like audio callbacks': NumPy releases the GIL while it
    copies them, so the two threads really run at the same time.
    """
    assert total < 2**24, "float32 counts exactly only up to 2**24"
    rng = np.random.default_rng(1234)
    done = threading.Event()

    def writer() -> None:
        position = 0
        try:
            while position < total:
                block = ramp(position, min(position + int(rng.integers(*write)), total))
                while writer_waits and ring.capacity - ring.available < len(block):
                    time.sleep(0.0001)
                ring.write(block)
                position += len(block)
                time.sleep(0)  # let the reader in, like the gap between two audio callbacks
        finally:
            done.set()

    def reader() -> list[np.ndarray]:
        received = []
        sizes = itertools.cycle(range(*read, 7))
        while not (done.is_set() and ring.available == 0):
            count = min(next(sizes), ring.available)
            if count == 0:
                time.sleep(0.0001)
                continue
            block = ring.read(count)
            assert block is not None, "a single reader must find what `available` promised"
            received.append(block)
        return received

    with ThreadPoolExecutor(max_workers=2) as pool:
        written, read_blocks = pool.submit(writer), pool.submit(reader)
        written.result(timeout=30)  # re-raises anything that went wrong in the thread
        received = read_blocks.result(timeout=30)
    assert len(received) > 100, "the reader and writer did not interleave"
    return np.concatenate(received)


@pytest.mark.usefixtures("fast_thread_switching")
def test_concurrent_writer_and_reader_lose_and_reorder_nothing() -> None:
    ring = RingBuffer(16_384)
    total = 4_000_000
    received = _run_writer_and_reader(ring, total, write=(1, 8_000), read=(1, 8_000), writer_waits=True)
    np.testing.assert_array_equal(received, ramp(0, total))
    assert ring.overflows == 0


@pytest.mark.parametrize("round_", range(3))
@pytest.mark.usefixtures("fast_thread_switching")
def test_concurrent_overflow_only_drops_whole_oldest_runs(round_: int) -> None:
    ring = RingBuffer(16_384)
    received = _run_writer_and_reader(ring, 16_000_000, write=(8_000, 16_000), read=(2_000, 4_000), writer_waits=False)
    # Whatever arrives is written data, in order, without duplicates or torn blocks:
    # a strictly increasing run of the ramp, with gaps only where the writer overflowed.
    steps = np.diff(received)
    assert np.all(steps >= 1), "a sample was read twice or out of order"
    assert ring.overflows >= 1
    assert np.count_nonzero(steps > 1) <= ring.overflows, "samples went missing without an overflow"
