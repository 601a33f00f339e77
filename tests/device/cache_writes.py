"""Whether the TTS backbone's cache writes happen in place on this GPU, in an aged conversation.

Run on the device (never in CI): ``python3 tests/device/cache_writes.py``. An aged frame's backbone took
7 ms more on the H200 than a fresh one, of which its attention kernel explains about 2 (28 layers at
~85 µs over 7,500 positions, ``tests/device/kernel_layouts.py``); a cache write that copied its buffer
instead of writing in place would read and write 3.96 GB a frame at full size. This prints, per case,
how far the peak memory rose above what was in use before one write (or one frame): about a buffer's
size (or 56 buffers') when the writes copy, nothing when they happen in place.

1. one buffer of a full-size layer's shape written by ``mx.slice_update``, plain and compiled;
2. the structure model (the backbone's 28 layers and heads of 72 at small width) aged by 7,300 frames,
   frame by frame, with the traced step and op by op.
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from app.bench import age_conversation, bench_input
from engine.loading.random_checkpoint import random_voicechat
from engine.session import Session


def rise_mb(step: object) -> float:
    """Megabytes the peak rose above the memory in use while ``step()`` ran and was evaluated."""
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    step()  # type: ignore[operator]
    mx.synchronize()
    return (mx.get_peak_memory() - before) / 1e6


def single_buffer() -> None:
    holder = {"buffer": mx.zeros((2, 16, 7680, 72), dtype=mx.float32)}
    row = mx.ones((2, 16, 1, 72), dtype=mx.float32)
    at = mx.array([5], dtype=mx.int32)
    program = mx.compile(lambda buffer, row, at: mx.slice_update(buffer, row, at, axes=(2,)))
    mx.eval(holder["buffer"])
    writes = (("plain", lambda b: mx.slice_update(b, row, at, axes=(2,))), ("compiled", lambda b: program(b, row, at)))
    for name, write in writes:

        def step(write: object = write) -> None:
            written = write(holder.pop("buffer"))  # type: ignore[operator]
            holder["buffer"] = written
            mx.eval(written)

        rises = [rise_mb(step) for _ in range(4)]
        print(f"one {holder['buffer'].nbytes / 1e6:.1f} MB buffer, {name} write: peak rose {rises} MB", flush=True)


def aged_frames(traced: bool) -> None:
    voicechat = random_voicechat("structure", numerics="fast")
    backbone = voicechat.model.tts_model.tts_model.backbone
    backbone.trace_rows = traced
    session = Session(voicechat, seed=0)
    samples = bench_input(40)
    frames = [samples[start : start + 1280] for start in range(0, samples.size, 1280)]
    session.push(frames[0])
    age_conversation(session, 7300)
    for frame in frames[1:5]:
        session.push(frame)
    rises, times = [], []
    for frame in frames[5:]:
        started = time.perf_counter()
        rises.append(rise_mb(lambda frame=frame: session.push(frame)))
        times.append((time.perf_counter() - started) * 1e3)
    buffers = sum(cache.keys.nbytes + cache.values.nbytes for cache in session.caches.tts.layers) / 1e6
    print(
        f"structure model aged 7300, {'traced step' if traced else 'op by op'}: peak rose median "
        f"{np.median(rises):.1f} MB a frame (max {max(rises):.1f}; the 56 buffers hold {buffers:.0f} MB), "
        f"frame p50 {np.median(times):.2f} ms",
        flush=True,
    )


def main() -> None:
    single_buffer()
    aged_frames(traced=True)
    aged_frames(traced=False)


if __name__ == "__main__":
    main()
