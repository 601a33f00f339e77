"""One quantized row kernel launched a few times, for a profiler on the device (never in CI).

``ncu --kernel-name regex:parley_quantized --launch-skip 3 --launch-count 1 --section …
python3 tests/device/profile_quantized.py WIDTH OUTPUTS BITS``: this build's default layout, plain role.
"""

from __future__ import annotations

import sys

import mlx.core as mx

from engine.kernels.admission import gpu_kernel_backend
from engine.kernels.quantized_product import QuantizedRowProduct, QuantizedRowShape, quantized_row_samples


def main() -> None:
    width, outputs, bits = (int(value) for value in sys.argv[1:4])
    backend = gpu_kernel_backend()
    if backend is None:
        raise SystemExit("no GPU kernels on this device")
    shape = QuantizedRowShape(width, outputs, bits, 64)
    sample = quantized_row_samples(shape, mx.bfloat16)
    mx.eval(sample)
    kernel = QuantizedRowProduct(backend, shape)
    for _ in range(6):
        mx.eval(kernel(*sample))


if __name__ == "__main__":
    main()
