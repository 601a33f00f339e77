"""The codec's streaming step on this GPU: its norm's operations against the CPU's, and the step with fast
numerics' part (the dequantization's kernel, :mod:`engine.code_sum`) against exact mode's.

Run on the device (never in CI): ``python3 tests/device/codec_step.py [FRAMES]``.

1. The decoder blocks' layer norm, step by step, on this GPU against the CPU (bf16, 441 × 384 random inputs):
   which steps' bits differ, and which form of a bf16 ``rsqrt`` this GPU's MLX takes. (A one-kernel block
   must reproduce them to keep exact mode's bits; the norm's bf16 row sums on CUDA are the obstacle.)
2. A full-size random 4-bit model's codec, teacher-forced: the same random codes through the compiled step
   in exact mode and with fast mode's part: the waveform's SNR over FRAMES frames, each step's primitives and
   kernels (``parley bench --counters``' census of one step) and time per frame, alternating in this process.
"""

from __future__ import annotations

import math
import sys
import time

import mlx.core as mx
import numpy as np

from engine.counters import GraphCensus, named_weights
from engine.numerics import gpu_kernel_backend
from engine.random_checkpoint import random_voicechat

FRAMES = int(sys.argv[1]) if len(sys.argv) > 1 else 100
EPS = 1e-6


def differences(got: mx.array, want: mx.array) -> tuple[int, int, float]:
    """(values that differ, positions (rows) with a difference, the largest absolute difference)."""
    a, b = np.asarray(got.astype(mx.float32)), np.asarray(want.astype(mx.float32))
    differ = a != b
    return int(differ.sum()), int(differ.any(axis=-1).sum()), float(np.abs(a - b).max())


def steps_against_cpu() -> None:
    """The norm's operations step by step on this GPU against the CPU's, on the random inputs of the largest
    shape: which step's bits differ (a one-kernel block must follow the GPU's)."""
    positions, channels = 441, 384
    keys = mx.random.split(mx.random.key(positions), 6)
    rows = mx.random.normal((positions, channels), key=keys[0]).astype(mx.bfloat16)
    history = mx.random.normal((1, 6, channels), key=keys[1]).astype(mx.bfloat16)
    weight = (0.3 * mx.random.normal((channels, 7, 1), key=keys[2])).astype(mx.bfloat16)
    bias = (0.1 * mx.random.normal((channels,), key=keys[3])).astype(mx.bfloat16)

    def steps() -> dict[str, mx.array]:
        padded = mx.concatenate([history, mx.expand_dims(rows, 0)], axis=1)
        hidden = mx.conv1d(padded, weight, 1, 0, 1, channels) + bias
        total = mx.sum(hidden, axis=-1, keepdims=True)
        mean = mx.mean(hidden, axis=-1, keepdims=True)
        deviation = hidden - mean
        variance = mx.mean(mx.square(deviation), axis=-1, keepdims=True)
        shifted = variance + EPS
        return {"conv + bias": hidden, "sum": total, "mean": mean, "variance": variance, "rsqrt": mx.rsqrt(shifted)}

    gpu = steps()
    mx.eval(gpu)
    with mx.stream(mx.cpu):
        cpu = steps()
        mx.eval(cpu)
    report = []
    for name in gpu:
        differ, _, largest = differences(gpu[name], cpu[name])
        report.append(f"{name} {differ} differ (largest {largest:.3g})")
    # The rsqrt of the same bf16 values on both devices, against its candidate forms.
    values = mx.random.uniform(1e-3, 10.0, (4096,)).astype(mx.bfloat16)
    on_gpu = np.asarray(mx.rsqrt(values).astype(mx.float32))
    x = np.asarray(values.astype(mx.float32)).astype(np.float64)

    def bf16(a: np.ndarray) -> np.ndarray:
        return np.asarray(mx.array(a.astype(np.float32)).astype(mx.bfloat16).astype(mx.float32))

    forms = {"float": bf16(1 / np.sqrt(x)), "divide_sqrt": bf16(1 / bf16(np.sqrt(x)))}
    report.append(
        "bf16 rsqrt on the GPU against forms: "
        + ", ".join(f"{name} {int((on_gpu != form).sum())} of 4096 differ" for name, form in forms.items())
    )
    print("norm steps, GPU against CPU operations: " + "; ".join(report))


def stream(codec, codes: list[mx.array]) -> tuple[np.ndarray, float]:  # type: ignore[no-untyped-def]
    cache = codec.make_cache()
    pieces, took = [], 0.0
    for frame in codes:
        began = time.perf_counter()
        samples = codec.decode_step(frame, cache)
        mx.eval(samples, cache.arrays())
        took += time.perf_counter() - began
        pieces.append(np.asarray(samples, dtype=np.float64))
    return np.concatenate(pieces, axis=1), 1000 * took / len(codes)


def census(codec, frame: mx.array) -> str:  # type: ignore[no-untyped-def]
    """Primitives / kernels of one streaming step as the codec is now set up (its compiled program's graph,
    counted as ``parley bench --counters`` counts a stage)."""
    cache = codec.make_cache()
    mx.eval(cache.arrays())
    counter = GraphCensus(named_weights(codec))
    counter.begin_frame(0)
    samples = codec.decode_step(frame, cache)
    counter.count("codec", [samples, *cache.arrays()])
    counted = counter.end_frame().stages["codec"]
    mx.eval(samples, cache.arrays())
    return f"{counted.primitives} / {counted.kernels}"


def teacher_forced() -> None:
    voicechat = random_voicechat("full", quantize=4, seed=0, numerics="fast")
    codec = voicechat.model.tts_model.audio_codec
    code_sum = codec.prvq.fast_sum
    print(f"codec part: {code_sum!r}; fast changes {voicechat.fast_changes}")
    rng = np.random.default_rng(0)
    config = codec.config
    codes = [
        mx.array(rng.integers(0, config.codebook_size, (1, config.num_quantizers, 1)).astype(np.int32))
        for _ in range(FRAMES)
    ]
    for name, summed in (("exact", None), ("fast", code_sum)):
        codec.prvq.fast_sum = summed
        print(f"codec step, {name}: primitives / kernels {census(codec, codes[0])}")
    times: dict[str, list[float]] = {"exact": [], "fast": []}
    waves: dict[str, np.ndarray] = {}
    for _ in range(3):
        for name, summed in (("exact", None), ("fast", code_sum)):
            codec.prvq.fast_sum = summed
            waves[name], per_frame = stream(codec, codes)
            times[name].append(per_frame)
    noise = float(np.sum((waves["fast"] - waves["exact"]) ** 2))
    signal = float(np.sum(waves["exact"] ** 2))
    snr = math.inf if noise == 0 else 10 * math.log10(signal / noise)
    print(
        f"codec, full size, {FRAMES} frames teacher-forced: waveform SNR {snr:.1f} dB (max abs difference "
        f"{np.abs(waves['fast'] - waves['exact']).max():.3g}, rms {math.sqrt(signal / waves['exact'].size):.3g})"
    )
    print(
        "codec step ms per frame (with its sync), alternating rounds: exact "
        + ", ".join(f"{t:.2f}" for t in times["exact"])
        + "; fast "
        + ", ".join(f"{t:.2f}" for t in times["fast"])
    )


def main() -> None:
    backend = gpu_kernel_backend()
    if backend is None:
        print("no GPU kernels here")
        return
    steps_against_cpu()
    teacher_forced()


if __name__ == "__main__":
    main()
