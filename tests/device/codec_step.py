"""The codec's streaming step on this GPU: its norm's operations against the CPU's and against MLX's CUDA row-sum
order, the blocks' convolution-and-norm kernel (:mod:`engine.kernels.conv_norm`) against its operations, and the step
with fast numerics' parts against exact mode's.

Run on the device (never in CI; the CPU runs the operations): ``python3 tests/device/codec_step.py [FRAMES]``.

1. The decoder blocks' layer norm, step by step, on this GPU against the CPU (bf16, 441 × 384 random inputs):
   which steps' bits differ, and which form of a bf16 ``rsqrt`` this GPU's MLX takes; then, at each decoder
   stage's full-size shape (9 × 1,536, 63 × 768, 441 × 384), the GPU's ``mx.sum`` of the norm's two rows
   (the values, their squared deviations) against MLX's CUDA order as the kernel takes it
   (:func:`engine.kernels.conv_norm.mlx_row_sum_plan`, emulated here with bf16 adds) and against a float32 sum
   rounded once: how many rows differ.
2. At the same shapes, each of the kernel's variants on the admission sample (bit for bit or not), then with the
   first that matches, random inputs: how many values differ from the operations' on this GPU, in how many
   positions, and its time per call.
3. A full-size random 4-bit model's codec, teacher-forced: the same random codes through the compiled step
   in exact mode and with fast mode's parts (the kernel admitted, if any, and the dequantization's,
   :mod:`engine.kernels.code_sum`): which variant was admitted, the waveform's SNR over FRAMES frames, each step's
   primitives and kernels (``parley bench --counters``' census of one step) and time per frame, alternating
   in this process.
"""

from __future__ import annotations

import math
import sys
import time

import mlx.core as mx
import numpy as np
from fast_kernels import per_call_us  # a sibling script (run as tests/device/codec_step.py)

from engine.counters import GraphCensus, named_weights
from engine.kernels.admission import gpu_kernel_backend
from engine.kernels.conv_norm import VARIANTS, ConvNorm, RowSumPlan, conv_norm_ops, conv_norm_samples, mlx_row_sum_plan
from engine.loading.random_checkpoint import random_voicechat

FRAMES = int(sys.argv[1]) if len(sys.argv) > 1 else 100
EPS = 1e-6
SHAPES = ((9, 1536), (63, 768), (441, 384))  # each decoder stage's positions and channels for one frame


def differences(got: mx.array, want: mx.array) -> tuple[int, int, float]:
    """(values that differ, positions (rows) with a difference, the largest absolute difference)."""
    a, b = np.asarray(got.astype(mx.float32)), np.asarray(want.astype(mx.float32))
    differ = a != b
    return int(differ.sum()), int(differ.any(axis=-1).sum()), float(np.abs(a - b).max())


def steps_against_cpu() -> None:
    """The norm's operations step by step on this GPU against the CPU's, on the random inputs of the largest
    shape: which step's bits differ (the kernel follows the GPU's)."""
    positions, channels = SHAPES[-1]
    rows, history, weight, bias, _, _ = random_inputs(positions, channels)

    def steps() -> dict[str, mx.array]:
        padded = mx.concatenate([history, rows], axis=1)
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


def random_inputs(positions: int, channels: int) -> tuple[mx.array, ...]:
    """A block's inputs at full size: one stream's rows (1, T, C), history, convolution weight and bias, norm weight
    and bias (bf16)."""
    keys = mx.random.split(mx.random.key(positions), 6)
    return (
        mx.random.normal((1, positions, channels), key=keys[0]).astype(mx.bfloat16),
        mx.random.normal((1, 6, channels), key=keys[1]).astype(mx.bfloat16),
        (0.3 * mx.random.normal((channels, 7, 1), key=keys[2])).astype(mx.bfloat16),
        (0.1 * mx.random.normal((channels,), key=keys[3])).astype(mx.bfloat16),
        (1 + 0.1 * mx.random.normal((channels,), key=keys[4])).astype(mx.bfloat16),
        (0.1 * mx.random.normal((channels,), key=keys[5])).astype(mx.bfloat16),
    )


def bf16_round(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (to nearest, ties to even; finite values) and widened back."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def mlx_order_sum(rows: np.ndarray, plan: RowSumPlan) -> np.ndarray:
    """Each row's sum (bf16 values as float32) in MLX's CUDA ``row_reduce_simple`` order with bf16 adds (a float32
    add of two bf16 values rounded to bf16 is the bf16 add): each lane its reads in turn, pass by pass (past the
    row, zeros), then the butterfly over each warp and, with several warps, over their totals."""
    count, channels = rows.shape
    span = (plan.full + int(plan.tail)) * plan.threads * plan.reads
    padded = np.zeros((count, span), dtype=np.float32)
    padded[:, :channels] = rows
    lanes = padded.reshape(count, plan.full + int(plan.tail), plan.threads, plan.reads)
    accumulators = np.zeros((count, plan.threads), dtype=np.float32)
    for step in range(lanes.shape[1]):
        for read in range(plan.reads):
            accumulators = bf16_round(accumulators + lanes[:, step, :, read])

    def butterfly(values: np.ndarray) -> np.ndarray:  # (count, warps, 32) -> each lane's total
        for offset in (16, 8, 4, 2, 1):
            values = bf16_round(values + values[..., np.arange(32) ^ offset])
        return values

    totals = butterfly(accumulators.reshape(count, plan.warps, 32))[..., 0]
    if plan.warps > 1:
        across = np.zeros((count, 1, 32), dtype=np.float32)
        across[:, 0, : plan.warps] = totals
        totals = butterfly(across)[..., 0]
    return totals.reshape(count)


def sums_against_mlx_order() -> None:
    """The GPU's ``mx.sum`` of the norm's two rows at each stage's shape against MLX's CUDA order as the kernel
    takes it, and against a float32 sum rounded once: rows that differ (MLX's order: 0 on a CUDA GPU whose MLX
    sums as the kernel's first variant does)."""
    report = []
    for positions, channels in SHAPES:
        rows, history, weight, bias, _, _ = random_inputs(positions, channels)
        padded = mx.concatenate([history, rows], axis=1)
        hidden = mx.conv1d(padded, weight, 1, 0, 1, channels) + bias
        mean = mx.mean(hidden, axis=-1, keepdims=True)
        squares = mx.square(hidden - mean)
        plan = mlx_row_sum_plan(channels, mx.bfloat16)
        for name, values in (("values", hidden), ("squares", squares)):
            on_gpu = mx.sum(values, axis=-1)
            mx.eval(on_gpu)
            flat = np.asarray(values.astype(mx.float32)).reshape(positions, channels)
            got = np.asarray(on_gpu.astype(mx.float32)).reshape(positions)
            emulated = mlx_order_sum(flat, plan)
            once = bf16_round(flat.sum(axis=-1, dtype=np.float32))
            report.append(
                f"{positions} x {channels} {name}: {int((got != emulated).sum())} rows differ from MLX's CUDA order "
                f"({plan.warps} warp(s), {plan.reads} reads a lane), {int((got != once).sum())} from a float32 sum"
            )
    print("norm sums, GPU mx.sum against emulations: " + "; ".join(report))


def kernel_against_operations(backend: str) -> None:
    """Every variant on the admission samples; the first equal on all three shapes also on random inputs."""
    chosen = None
    for variant in VARIANTS:
        kernel = ConvNorm(backend, EPS, mx.bfloat16, variant)
        equal: list[bool | str] = []
        for positions, channels in SHAPES:
            sample = conv_norm_samples(positions, channels, 7, mx.bfloat16)
            got, want = kernel(*sample), conv_norm_ops(*sample, eps=EPS)
            if all(mx.array_equal(a, b).item() for a, b in zip(got, want, strict=True)):
                equal.append(True)
            else:
                differ, rows, largest = differences(got[0], want[0])
                equal.append(f"no ({differ} values in {rows} positions, largest {largest:.3g})")
        print(f"conv-norm, {variant.label}: admission samples equal: {equal}")
        if chosen is None and all(flag is True for flag in equal):
            chosen = kernel
    if chosen is None:
        print("conv-norm: no variant gives the operations' bits")
        return
    for positions, channels in SHAPES:
        inputs = random_inputs(positions, channels)
        got, want = chosen(*inputs), conv_norm_ops(*inputs, eps=EPS)
        differ, rows, largest = differences(got[0], want[0])
        history_equal = mx.array_equal(got[1], want[1]).item()
        print(
            f"conv-norm {positions} x {channels} ({chosen.variant.label}), random inputs: {differ} of "
            f"{positions * channels} values differ, in {rows} of {positions} positions (largest {largest:.3g}), "
            f"history equal {history_equal}; {per_call_us(chosen, inputs):.1f} µs per call (with its sync)"
        )


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
    blocks = codec.decoder.blocks
    part, code_sum = blocks[0].fast_conv_norm, codec.prvq.fast_sum
    admitted = part.variant.label if isinstance(part, ConvNorm) else "none (the operations)"
    print(f"codec parts: {part!r}, {code_sum!r}; conv-norm variant admitted: {admitted}")
    print(f"fast changes {voicechat.fast_changes}")
    rng = np.random.default_rng(0)
    config = codec.config
    codes = [
        mx.array(rng.integers(0, config.codebook_size, (1, config.num_quantizers, 1)).astype(np.int32))
        for _ in range(FRAMES)
    ]
    modes = (("exact", None, None), ("fast", part, code_sum))
    for name, use, summed in modes:
        for block in blocks:
            block.fast_conv_norm = use
        codec.prvq.fast_sum = summed
        print(f"codec step, {name}: primitives / kernels {census(codec, codes[0])}")
    times: dict[str, list[float]] = {"exact": [], "fast": []}
    waves: dict[str, np.ndarray] = {}
    for _ in range(3):
        for name, use, summed in modes:
            for block in blocks:
                block.fast_conv_norm = use
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
    if backend == "cuda":
        sums_against_mlx_order()
    kernel_against_operations(backend)
    teacher_forced()


if __name__ == "__main__":
    main()
