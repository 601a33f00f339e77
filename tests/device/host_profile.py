"""Where a fast frame's host time goes, on the device: cProfile over steady frames of one model.

    python3 tests/device/host_profile.py [structure|full] [fast|exact] [frames]

The structure model (the full size's layers and head sizes, almost no arithmetic) leaves the host's share: each
Python function's own time, and the time spent in ``mx.eval`` (MLX dispatching the primitives, plus what the
device has not finished). Frames 80 on (every encoder cache full) are profiled.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import mlx.core as mx

from app.bench import bench_input, question_audio
from engine.loading.random_checkpoint import random_weights
from engine.loading.tokenizer import TextTokenizer
from engine.model import assemble_voicechat
from engine.session import Session, warm_up
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE


def main() -> None:
    size = sys.argv[1] if len(sys.argv) > 1 else "structure"
    numerics = sys.argv[2] if len(sys.argv) > 2 else "fast"
    profiled = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    _, config, weights, quantized, raw_tokenizer, nbytes = random_weights(size, quantize=4, seed=0)
    voicechat = assemble_voicechat(
        config, weights, quantized, TextTokenizer(raw_tokenizer, "random"), name=size, nbytes=nbytes, numerics=numerics
    )
    mx.eval(voicechat.model.parameters())
    warm_up(voicechat, speech=question_audio())
    session = Session(voicechat, seed=0)
    samples = bench_input(80 + profiled)
    step = INPUT_FRAME_SAMPLES
    frames = [samples[start : start + step] for start in range(0, samples.shape[0], step)]
    for frame in frames[:80]:
        session.push(frame, INPUT_SAMPLE_RATE)
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    for frame in frames[80:]:
        session.push(frame, INPUT_SAMPLE_RATE)
    profile.disable()
    per_frame = (time.perf_counter() - began) * 1000.0 / len(frames[80:])
    print(f"{size} {numerics}: {per_frame:.2f} ms a frame under the profiler, {len(frames[80:])} frames")
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
