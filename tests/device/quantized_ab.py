"""This build's quantized one-row kernel against another build's, on this GPU: bit for bit, and time.

Run on the device (never in CI), with the other build's module beside this one::

    git show REV:engine/kernels/quantized_product.py > tests/device/quantized_product_before.py   # here, untracked
    python3 tests/device/quantized_ab.py tests/device/quantized_product_before.py          # there

For the LLM's projections at 4 bits and two at 8, in every role they run in (plain, residual, squared
ReLU, group-norm prologue): whether the two kernels' outputs are equal bit for bit on random rows, each
one's relative L2 to MLX's operations, and GPU time per call queued over distinct weights (more than the
50 MB L2 cache holds), the two builds in alternating rounds in this one process.
"""

from __future__ import annotations

import functools
import sys

import mlx.core as mx
from kernel_layouts import load_before, queued_us  # a sibling script (run as tests/device/quantized_ab.py)

from engine.kernels.admission import gpu_kernel_backend, relative_l2
from engine.kernels.quantized_product import (
    QuantizedRowProduct,
    QuantizedRowShape,
    RowRole,
    quantized_row_ops,
    quantized_row_samples,
)

# (width, outputs, bits, role): the Mamba mixer's in and out, the MLP's up and down, as the LLM runs them.
CASES = (
    (4480, 22656, 4, RowRole()),
    (10240, 4480, 4, RowRole(prologue="group_norm", norm_groups=8, norm_partials=640, norm_eps=1e-5)),
    (10240, 4480, 4, RowRole(epilogue="residual")),
    (4480, 15680, 4, RowRole(epilogue="relu2")),
    (15680, 4480, 4, RowRole(epilogue="residual")),
    (4480, 22656, 8, RowRole()),
    (15680, 4480, 8, RowRole(epilogue="residual")),
)
ROUNDS = 3


def main() -> None:
    backend = gpu_kernel_backend()
    if backend is None:
        raise SystemExit("no GPU kernels on this device")
    before = load_before(sys.argv[1], "engine.quantized_product_before")
    for width, outputs, bits, role in CASES:
        shape = QuantizedRowShape(width, outputs, bits, 64, role=role)
        first = quantized_row_samples(shape, mx.bfloat16)
        copies = max(2, 400_000_000 // (width * outputs * bits // 8))
        samples = [first]
        for copy in range(1, copies):
            x = mx.random.normal(first[0].shape, key=mx.random.key(copy))
            _, weight, scales, biases, *rest = quantized_row_samples(shape, mx.bfloat16)
            samples.append((x, weight, scales, biases, *rest))
        mx.eval(samples)
        this = QuantizedRowProduct(backend, shape)
        other = before.QuantizedRowProduct(backend, before.QuantizedRowShape(width, outputs, bits, 64, role=role))
        fallback = functools.partial(quantized_row_ops, group_size=64, bits=bits, role=role)
        differ = sum(not mx.array_equal(this(*sample), other(*sample)).item() for sample in samples)
        errors = [relative_l2(kernel(*first), fallback(*first)) for kernel in (this, other)]
        times: dict[str, list[float]] = {"this": [], "before": []}
        for _ in range(ROUNDS):
            times["before"].append(queued_us(other, samples, calls=4 * copies))
            times["this"].append(queued_us(this, samples, calls=4 * copies))
        nbytes = sum(array.nbytes for array in first[1:4])
        best = {name: min(values) for name, values in times.items()}
        print(
            f"{bits}-bit {width}->{outputs} {role.prologue}/{role.epilogue}: {len(samples) - differ}/{len(samples)}"
            f" rows equal bit for bit; relative L2 to MLX {errors[0]:.2e} (before {errors[1]:.2e}); us a call"
            f" this {', '.join(f'{t:.1f}' for t in times['this'])}, before"
            f" {', '.join(f'{t:.1f}' for t in times['before'])} (best {nbytes / best['this'] / 1e3:.0f} against"
            f" {nbytes / best['before'] / 1e3:.0f} GB/s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
