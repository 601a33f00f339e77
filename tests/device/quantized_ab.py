"""This build's quantized one-row kernel against another build's, on this GPU: bit for bit, and time.

Run on the device (never in CI), with the other build's module beside this one::

    git show REV:engine/quantized_product.py > tests/device/quantized_product_before.py   # here, untracked
    python3 tests/device/quantized_ab.py tests/device/quantized_product_before.py          # there

For the LLM's projections at 4 bits and two at 8, in every role they run in (plain, residual, squared
ReLU, group-norm prologue): whether the kernels' outputs are equal bit for bit on random rows, each one's
relative L2 to MLX's operations, and GPU time per call queued over distinct weights (more than the 50 MB L2
cache holds), the other build and this build's :data:`LAYOUTS` (columns a warp multiplies together, tiles of
them it computes in turn) in alternating rounds in this one process.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from types import ModuleType

import mlx.core as mx

from engine.numerics import gpu_kernel_backend, relative_l2
from engine.quantized_product import (
    COLUMNS,
    TILES,
    QuantizedRowProduct,
    QuantizedRowShape,
    RowRole,
    quantized_row_ops,
    quantized_row_samples,
)
from tests.device.kernel_layouts import queued_us

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
# (columns, tiles) of this build's kernel to time; the first is its default.
LAYOUTS = ((COLUMNS, TILES), (8, 1), (4, 2), (4, 4), (8, 2), (2, 4))


def load_before(path: str) -> ModuleType:
    """The other build's module, inside the engine package (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location("engine.quantized_product_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    backend = gpu_kernel_backend()
    if backend is None:
        raise SystemExit("no GPU kernels on this device")
    before = load_before(sys.argv[1])
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
        kernels = {
            "before": before.QuantizedRowProduct(backend, before.QuantizedRowShape(width, outputs, bits, 64, role=role))
        }
        for columns, tiles in dict.fromkeys(LAYOUTS):
            layout = QuantizedRowShape(width, outputs, bits, 64, role=role, columns=columns, tiles=tiles)
            kernels[f"{columns}x{tiles}"] = QuantizedRowProduct(backend, layout)
        fallback = functools.partial(quantized_row_ops, group_size=64, bits=bits, role=role)
        reference = [kernels["before"](*sample) for sample in samples]
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(ROUNDS):
            for name, kernel in kernels.items():
                times[name].append(queued_us(kernel, samples, calls=4 * copies))
        nbytes = sum(array.nbytes for array in first[1:4])
        line = [f"{bits}-bit {width}->{outputs} {role.prologue}/{role.epilogue}:"]
        for name, kernel in kernels.items():
            pairs = zip(samples, reference, strict=True)
            equal = sum(mx.array_equal(kernel(*sample), want).item() for sample, want in pairs)
            error = relative_l2(kernel(*first), fallback(*first))
            best = min(times[name])
            took = ", ".join(f"{t:.1f}" for t in times[name])
            rate = nbytes / best / 1e3
            line.append(f"{name} {equal}/{len(samples)} equal, {error:.2e} to MLX, us {took} ({rate:.0f} GB/s);")
        print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
