"""One float32 row through an affine-quantized projection, as one CUDA kernel (fast numerics).

The LLM's projections are stored at 4 or 8 bits (MLX's affine layout: ``uint32`` words packing
``32 / bits`` values, lowest bits first, and a scale ``s`` and bias ``b`` per group of
``group_size`` inputs, so a weight is ``s·q + b``). A streaming frame multiplies one row by each
of them: 122 products reading 5.55 GB at 4 bits, most of the LLM's time. On the H200 MLX's CUDA
kernel for that product read about 0.4 TB/s within a frame (``language.llm`` 13.4 ms of
``parley bench --sub-stages``); this kernel gives each output column a warp whose lanes read 16
bytes of packed weights at a time, the whole weight streaming through many warps at once.

Arithmetic: per group, ``s · Σ x·q + b · Σ x`` in float32 (the form MLX's kernels use), summed over
the groups in another order: relative L2 about 1e-7 from :func:`quantized_row_ops`, MLX's own
``quantized_matmul``, which is the fallback and the reference the kernel is admitted against.

CUDA only: on Apple silicon MLX's Metal kernel for a quantized row already reads near the memory's
bandwidth, so Metal keeps it (the fallback) rather than risk a slower kernel of ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .numerics import custom_kernel

# Warps per block, each computing one output column.
WARPS = 8
# Bytes of packed weights a lane reads at a time.
CHUNK_BYTES = 16


@dataclass(frozen=True)
class QuantizedRowShape:
    """One row of ``width`` inputs through an ``outputs × width`` projection quantized to ``bits`` in
    groups of ``group_size``."""

    width: int
    outputs: int
    bits: int
    group_size: int

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"the quantized row kernel reads 4 or 8 bits, not {self.bits}")
        if self.group_size % self.chunk_values or self.width % self.group_size:
            raise ValueError(
                f"groups of {self.group_size} must hold whole {self.chunk_values}-value chunks and tile {self.width}"
            )

    @property
    def chunk_values(self) -> int:
        """Values in one 16-byte read (a chunk lies within one group)."""
        return CHUNK_BYTES * 8 // self.bits


def quantized_row_ops(
    x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, *, group_size: int, bits: int
) -> mx.array:
    """The reference's operation (the kernel's fallback): ``x @ dequantize(weight).T``."""
    return mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=group_size, bits=bits)


_CUDA = """
    constexpr int PER_WORD = 32 / BITS;
    constexpr int PER_CHUNK = 4 * PER_WORD;
    constexpr int CHUNKS = K / PER_CHUNK;
    constexpr int GROUPS = K / GROUP;
    constexpr unsigned int MASK = (1u << BITS) - 1u;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int column = blockIdx.x * WARPS + warp;
    if (column >= N) return;
    const uint4* packed = reinterpret_cast<const uint4*>(weight) + static_cast<size_t>(column) * CHUNKS;
    const size_t group_row = static_cast<size_t>(column) * GROUPS;
    float acc = 0.0f;
#pragma unroll 2
    for (int c = lane; c < CHUNKS; c += 32) {
        const uint4 chunk = packed[c];
        const unsigned int words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
        const int first = c * PER_CHUNK;
        float dot = 0.0f;
        float total = 0.0f;
        for (int j = 0; j < 4; ++j) {
            for (int e = 0; e < PER_WORD; ++e) {
                const float value = static_cast<float>(x[first + j * PER_WORD + e]);
                dot += value * static_cast<float>((words[j] >> (e * BITS)) & MASK);
                total += value;
            }
        }
        const size_t group = group_row + first / GROUP;
        acc += static_cast<float>(scales[group]) * dot + static_cast<float>(biases[group]) * total;
    }
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffff, acc, offset);
    if (lane == 0) y[column] = acc;
"""


class QuantizedRowProduct:
    """:func:`quantized_row_ops` for one row and one :class:`QuantizedRowShape`, as a CUDA kernel (float32 out)."""

    def __init__(self, backend: str, shape: QuantizedRowShape) -> None:
        if backend != "cuda":
            raise ValueError("MLX's own kernel serves quantized rows on Metal")
        self.shape = shape
        self._kernel = custom_kernel(
            backend,
            f"parley_quantized_row_{shape.bits}bit",
            ["x", "weight", "scales", "biases"],
            ["y"],
            cuda=_CUDA,
            metal="",
        )

    def __call__(self, x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
        shape = self.shape
        blocks = -(-shape.outputs // WARPS)
        (y,) = self._kernel(
            inputs=[x, weight, scales, biases],
            template=[
                ("K", shape.width),
                ("N", shape.outputs),
                ("BITS", shape.bits),
                ("GROUP", shape.group_size),
                ("WARPS", WARPS),
            ],
            grid=(blocks * WARPS * 32, 1, 1),
            threadgroup=(WARPS * 32, 1, 1),
            output_shapes=[(1, shape.outputs)],
            output_dtypes=[mx.float32],
        )
        return y


def quantized_row_samples(shape: QuantizedRowShape, scale_dtype: mx.Dtype) -> tuple[Any, ...]:
    """A float32 row and a random weight quantized as the checkpoint stores it, for admission."""
    keys = mx.random.split(mx.random.key(67), 2)
    x = mx.random.normal((1, shape.width), key=keys[0])
    dense = mx.random.normal((shape.outputs, shape.width), key=keys[1]) / math.sqrt(shape.width)
    weight, scales, biases = mx.quantize(dense.astype(mx.bfloat16), shape.group_size, shape.bits)
    return (x, weight, scales.astype(scale_dtype), biases.astype(scale_dtype))
