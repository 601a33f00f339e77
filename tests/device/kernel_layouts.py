"""Layouts of two bandwidth-bound kernels on this GPU, side by side in one process: admitted or not, and
GPU time per call queued as a frame queues them, with the bandwidth each reaches.

Run on the device (never in CI): ``python3 tests/device/kernel_layouts.py``.

- The TTS backbone's single-position attention (16 heads of 72, two rows) over 200, 2,000 and 7,500
  cached positions, with 1 to 16 keys a warp reads at once (``keys_per_step``) and 256 to 1,024 keys a
  block (``keys_per_block``), each call over its own layer's buffers, as the backbone's 28 layers run (a
  ten-minute conversation reads 7,500). ``python3 tests/device/kernel_layouts.py attention``: this only.
- The LLM's 4-bit quantized one-row products with 4, 8 or 16 columns a warp and at most 4, 8 or 16
  warps a block, over distinct weights (more than the GPU's 50 MB L2 cache holds). ``… quantized``: this only.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from engine.decode_attention import DecodeAttention, decode_attention_ops, decode_attention_sample
from engine.numerics import admit_kernel, gpu_kernel_backend, relative_l2
from engine.quantized_product import QuantizedRowProduct, QuantizedRowShape, quantized_row_ops, quantized_row_samples

LAYERS = 28
# (keys a warp reads at once, keys a block takes) for the attention.
ATTENTION_LAYOUTS = ((1, 256), (4, 256), (8, 256), (4, 512), (8, 512), (8, 1024), (16, 1024))


def queued_us(function: Callable[..., Any], samples: Sequence[tuple[Any, ...]], calls: int = 112) -> float:
    """Microseconds per call, ``calls`` calls cycling over ``samples`` queued and evaluated together."""
    for _ in range(2):
        mx.eval([function(*samples[i % len(samples)]) for i in range(len(samples))])
    started = time.perf_counter()
    mx.eval([function(*samples[i % len(samples)]) for i in range(calls)])
    return (time.perf_counter() - started) / calls * 1e6


def attention_steps(backend: str) -> None:
    for capacity, count in ((256, 200), (2048, 2000), (7680, 7500)):
        first = decode_attention_sample(16, 16, 72, capacity, count)
        samples = [first]
        for layer in range(1, LAYERS):
            keys = mx.random.split(mx.random.key(layer), 2)
            keys_, values_ = (mx.random.normal(first[1].shape, key=key) for key in keys)
            samples.append((first[0], keys_, values_, *first[3:]))
        mx.eval(samples)
        nbytes = 2 * first[1][..., :count, :].nbytes
        line = [f"attention over {count}:"]
        for step, per_block in ATTENTION_LAYOUTS:
            kernel = DecodeAttention(backend, 16, 16, 72, keys_per_step=step, keys_per_block=per_block)
            admitted = admit_kernel("attention", kernel, decode_attention_ops, first)
            error = relative_l2(kernel(*first), decode_attention_ops(*first))
            took = queued_us(kernel, samples)
            line.append(
                f"step {step} {'ok' if admitted else 'NOT ADMITTED'} {error:.1e} {took:.1f} us "
                f"({nbytes / took / 1e3:.0f} GB/s);"
            )
        line.append(f"operations {queued_us(decode_attention_ops, samples):.1f} us")
        print(" ".join(line), flush=True)


def quantized_layouts(backend: str) -> None:
    shapes = ((4480, 22656), (10240, 4480), (4480, 15680), (15680, 4480))
    layouts = ((8, 8), (4, 8), (4, 16), (8, 4), (8, 16), (16, 8))
    for width, outputs in shapes:
        base = QuantizedRowShape(width, outputs, 4, 64)
        first = quantized_row_samples(base, mx.bfloat16)
        copies = max(2, 400_000_000 // (width * outputs // 2))
        samples = [first]
        for _ in range(1, copies):
            _, weight, scales, biases, *_ = quantized_row_samples(base, mx.bfloat16)
            samples.append((first[0], weight, scales, biases, *first[4:]))
        mx.eval(samples)
        fallback = functools.partial(quantized_row_ops, group_size=64, bits=4)
        nbytes = sum(array.nbytes for array in first[1:4])
        line = [f"quantized 4-bit {width}->{outputs}:"]
        for columns, max_warps in layouts:
            shape = QuantizedRowShape(width, outputs, 4, 64, columns=columns, max_warps=max_warps)
            kernel = QuantizedRowProduct(backend, shape)
            admitted = admit_kernel("quantized row", kernel, fallback, first)
            took = queued_us(kernel, samples, calls=4 * copies)
            line.append(
                f"{columns}x{max_warps} (split {kernel.split}, sets {kernel.sets}) "
                f"{'ok' if admitted else 'NOT ADMITTED'} {took:.1f} us ({nbytes / took / 1e3:.0f} GB/s);"
            )
        line.append(f"MLX {queued_us(fallback, samples, calls=4 * copies):.1f} us")
        print(" ".join(line), flush=True)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    backend = gpu_kernel_backend()
    if backend is None:
        raise SystemExit("no GPU kernels on this device")
    if sys.argv[1:] != ["quantized"]:
        attention_steps(backend)
    if sys.argv[1:] != ["attention"]:
        quantized_layouts(backend)


if __name__ == "__main__":
    main()
