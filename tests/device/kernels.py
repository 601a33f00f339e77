"""Fast numerics' custom kernels against their fallbacks on this GPU, and what they cost (never in CI).

Run from the repository root on a GPU machine: ``python3 tests/device/kernels.py``. For each shape a
frame uses, it prints the bf16 product kernel's relative L2 difference from its fallback and the time
per call of the kernel, of MLX's product on a float32 copy made once (exact mode's precast weights),
and of the fallback (a float32 copy per call).
"""

from __future__ import annotations

import time

import mlx.core as mx

from engine.linear import Bf16Product, bf16_product_ops
from engine.numerics import gpu_kernel_backend, relative_l2

# (rows, depth, columns): encoder feed-forward in and out, its attention projections for one frame and for
# the 71-key window, the TTS backbone's q and MLP, the MoG head at batch 2, an odd depth (the fallback).
SHAPES = [(1, 1024, 4096), (1, 4096, 1024), (1, 1024, 1024), (71, 1024, 1024), (2, 1152, 1152), (2, 1152, 6912)]


def per_call_us(function: object, *inputs: mx.array, calls: int = 200) -> float:
    for _ in range(10):
        mx.eval(function(*inputs))  # type: ignore[operator]
    started = time.perf_counter()
    for _ in range(calls):
        mx.eval(function(*inputs))  # type: ignore[operator]
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    backend = gpu_kernel_backend()
    if backend is None:
        raise SystemExit("no GPU kernel backend here")
    kernel = Bf16Product(backend)
    print(
        f"bf16 product on {backend}: rows x depth -> columns | rel L2 vs fallback | us per call: kernel, "
        "float32 copy made once, copy per call | weight GB/s (kernel)"
    )
    for rows, depth, columns in SHAPES:
        keys = mx.random.split(mx.random.key(rows + depth + columns), 2)
        x = mx.random.normal((rows, depth), key=keys[0])
        weight = (0.05 * mx.random.normal((columns, depth), key=keys[1])).astype(mx.bfloat16)
        widened = weight.astype(mx.float32)
        mx.eval(x, weight, widened)
        error = relative_l2(kernel(x, weight), bf16_product_ops(x, weight))
        ours = per_call_us(kernel, x, weight)
        precast = per_call_us(lambda a, w: a @ w.T, x, widened)
        per_call = per_call_us(bf16_product_ops, x, weight)
        rate = weight.nbytes / (ours * 1e-6) / 1e9
        print(
            f"{rows:3} x {depth:5} -> {columns:5} | {error:.2e} | {ours:7.1f} {precast:7.1f} {per_call:7.1f} | "
            f"{rate:6.0f}"
        )


if __name__ == "__main__":
    main()
