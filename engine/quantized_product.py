"""One float32 row through an affine-quantized projection, as one CUDA kernel (fast numerics).

The LLM's projections are stored at 4 or 8 bits (MLX's affine layout: ``uint32`` words packing
``32 / bits`` values, lowest bits first, and a scale ``s`` and bias ``b`` per group of
``group_size`` inputs, so a weight is ``s·q + b``). A streaming frame multiplies one row by each
of them: 122 products reading 5.55 GB at 4 bits, most of the LLM's time. On the H200 MLX's CUDA
kernel for that product reads about 0.3-0.45 TB/s (``python3 tests/device/fast_kernels.py quantized``).
Here a warp computes :data:`COLUMNS` output columns, reading each 16-byte chunk of the float32 input row
once for all of them (the inputs are eight times the bytes of 4-bit weights: read once per column, as a
first version of this kernel did, they held it to 0.13 TB/s), and warps share the columns of a short row,
each summing a slice of it, so that the whole weight streams through many warps at once.

Inside one of the LLM's residual blocks the last projection also adds the block's input (epilogue
``"residual"``) and the MLP's up projection squares its ReLU (``"relu2"``): a frame runs no separate add per
block and no activation between the MLP's products, about 80 primitives fewer, and those kernels take no
longer than the plain one. The blocks' norms stay MLX's own kernel: folded into the products (each block
normalizing the row into shared memory first), they made the products 26-55 µs slower per call on the H200,
more than the primitives they saved (``tests/device/fused_rows_ab.py``).

Arithmetic: per group, ``s · Σ x·q + b · Σ x`` in float32 (the form MLX's kernels use), summed over
the groups in another order: relative L2 about 1e-7 from :func:`quantized_row_ops` — MLX's own
``quantized_matmul`` and the add or squared ReLU — which is the fallback and the reference the kernel
is admitted against.

CUDA only: on Apple silicon MLX's Metal kernel for a quantized row already reads near the memory's
bandwidth, so Metal keeps it (the fallback) rather than risk a slower kernel of ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from .numerics import custom_kernel

Epilogue = Literal["none", "residual", "relu2"]
EPILOGUES: tuple[Epilogue, ...] = ("none", "residual", "relu2")

# Warps per block; a warp computes COLUMNS output columns (over a slice of the row, see split), reading
# each chunk of the input row once for all of them.
WARPS = 8
COLUMNS = 8
# Bytes of packed weights a lane reads at a time.
CHUNK_BYTES = 16


@dataclass(frozen=True)
class QuantizedRowShape:
    """One row of ``width`` inputs through an ``outputs × width`` projection quantized to ``bits`` in
    groups of ``group_size``; ``epilogue`` ``"residual"`` writes ``base + y`` and ``"relu2"``
    ``max(y, 0)²``."""

    width: int
    outputs: int
    bits: int
    group_size: int
    epilogue: Epilogue = "none"

    def __post_init__(self) -> None:
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, not {self.epilogue!r}")
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
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    base: mx.array | None = None,
    *,
    group_size: int,
    bits: int,
    epilogue: Epilogue = "none",
) -> mx.array:
    """The reference's operations (the kernel's fallback): ``x @ dequantize(weight).T``, then the
    ``epilogue`` (``base +`` it, or ``relu2``) — as a block of :mod:`engine.llm` computes them."""
    y = mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=group_size, bits=bits)
    if epilogue == "residual":
        assert base is not None
        return base + y
    return nn.relu2(y) if epilogue == "relu2" else y


_CUDA = """
    constexpr int PER_WORD = 32 / BITS;
    constexpr int PER_CHUNK = 4 * PER_WORD;  // values in one 16-byte read, all in one group
    constexpr int CHUNKS = K / PER_CHUNK;
    constexpr int GROUPS = K / GROUP;
    constexpr int COLUMN_SETS = WARPS / SPLIT;  // sets of COLUMNS columns per block; SPLIT warps share each
    constexpr int PER_SLICE = (CHUNKS + SPLIT - 1) / SPLIT;
    constexpr unsigned int MASK = (1u << BITS) - 1u;
    __shared__ float partial[WARPS][COLUMNS];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int set = warp % COLUMN_SETS;
    const int slice = warp / COLUMN_SETS;
    const int first_column = (blockIdx.x * COLUMN_SETS + set) * COLUMNS;
    const uint4* packed = reinterpret_cast<const uint4*>(weight);
    // An array may start anywhere in its buffer: 16-byte reads only from a 16-byte boundary.
    const bool aligned = reinterpret_cast<unsigned long long>(x) % 16 == 0;
    const bool weights_aligned = reinterpret_cast<unsigned long long>(weight) % 16 == 0;
    float acc[COLUMNS];
    for (int r = 0; r < COLUMNS; ++r) acc[r] = 0.0f;
    const int end = min(CHUNKS, (slice + 1) * PER_SLICE);
    for (int c = slice * PER_SLICE + lane; c < end; c += 32) {
        // The chunk's inputs, read once and used for every column of the set.
        const int first = c * PER_CHUNK;
        float inputs[PER_CHUNK];
        if (aligned) {
            const float4* source = reinterpret_cast<const float4*>(x + first);
            for (int v = 0; v < PER_CHUNK / 4; ++v) {
                const float4 four = source[v];
                inputs[4 * v] = four.x;
                inputs[4 * v + 1] = four.y;
                inputs[4 * v + 2] = four.z;
                inputs[4 * v + 3] = four.w;
            }
        } else {
            for (int e = 0; e < PER_CHUNK; ++e) inputs[e] = x[first + e];
        }
        float total = 0.0f;
        for (int e = 0; e < PER_CHUNK; ++e) total += inputs[e];
        const int group = first / GROUP;
        for (int r = 0; r < COLUMNS; ++r) {
            const int column = first_column + r;
            if (column >= N) break;
            const size_t at_chunk = static_cast<size_t>(column) * CHUNKS + c;
            unsigned int words[4];
            if (weights_aligned) {
                const uint4 chunk = packed[at_chunk];
                words[0] = chunk.x;
                words[1] = chunk.y;
                words[2] = chunk.z;
                words[3] = chunk.w;
            } else {
                for (int j = 0; j < 4; ++j) words[j] = weight[4 * at_chunk + j];
            }
            float dot = 0.0f;
            for (int j = 0; j < 4; ++j) {
                for (int e = 0; e < PER_WORD; ++e) {
                    dot += inputs[j * PER_WORD + e] * static_cast<float>((words[j] >> (e * BITS)) & MASK);
                }
            }
            const size_t at = static_cast<size_t>(column) * GROUPS + group;
            acc[r] += static_cast<float>(scales[at]) * dot + static_cast<float>(biases[at]) * total;
        }
    }
    for (int r = 0; r < COLUMNS; ++r) {
        for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffff, acc[r], offset);
        if (lane == 0) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (slice == 0 && lane < COLUMNS && first_column + lane < N) {
        float sum = 0.0f;
        for (int k = 0; k < SPLIT; ++k) sum += partial[set + k * COLUMN_SETS][lane];
        @EPILOGUE@
        y[first_column + lane] = sum;
    }
"""

_CUDA_EPILOGUES: dict[Epilogue, str] = {
    "none": "",
    "residual": "sum = base[first_column + lane] + sum;",
    "relu2": "sum = fmaxf(sum, 0.0f);\n        sum = sum * sum;",
}
# The inputs each epilogue reads besides the row and the quantized weight.
EPILOGUE_INPUTS: dict[Epilogue, tuple[str, ...]] = {"none": (), "residual": ("base",), "relu2": ()}


def cuda_source(shape: QuantizedRowShape) -> str:
    """The kernel body for ``shape``'s epilogue."""
    return _CUDA.replace("@EPILOGUE@", _CUDA_EPILOGUES[shape.epilogue])


class QuantizedRowProduct:
    """:func:`quantized_row_ops` for one row and one :class:`QuantizedRowShape`, as a CUDA kernel (float32 out)."""

    def __init__(self, backend: str, shape: QuantizedRowShape) -> None:
        if backend != "cuda":
            raise ValueError("MLX's own kernel serves quantized rows on Metal")
        self.shape = shape
        chunks = shape.width // shape.chunk_values
        # Warps sharing a set of columns, each summing a slice of the row: enough that every lane of a
        # slice has a chunk to read, and the short rows still spread over many warps.
        self.split = next(count for count in (8, 4, 2, 1) if count == 1 or chunks // count >= 32)
        self._inputs = ["x", "weight", "scales", "biases", *EPILOGUE_INPUTS[shape.epilogue]]
        epilogue = "" if shape.epilogue == "none" else f"_{shape.epilogue}"
        self._kernel = custom_kernel(
            backend,
            f"parley_quantized_row_{shape.bits}bit{epilogue}",
            self._inputs,
            ["y"],
            cuda=cuda_source(shape),
            metal="",
        )

    def __call__(
        self, x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, base: mx.array | None = None
    ) -> mx.array:
        """``x`` holds one row of ``width`` in any shape ``(1, …, 1, width)``; the result keeps its shape
        (``base``, for a residual epilogue, holds one row of ``outputs``)."""
        shape = self.shape
        named = {"x": x, "weight": weight, "scales": scales, "biases": biases, "base": base}
        per_block = COLUMNS * WARPS // self.split
        blocks = -(-shape.outputs // per_block)
        (y,) = self._kernel(
            inputs=[named[name] for name in self._inputs],
            template=[
                ("K", shape.width),
                ("N", shape.outputs),
                ("BITS", shape.bits),
                ("GROUP", shape.group_size),
                ("COLUMNS", COLUMNS),
                ("SPLIT", self.split),
                ("WARPS", WARPS),
            ],
            grid=(blocks * WARPS * 32, 1, 1),
            threadgroup=(WARPS * 32, 1, 1),
            output_shapes=[(*x.shape[:-1], shape.outputs)],
            output_dtypes=[mx.float32],
        )
        return y


def quantized_row_samples(shape: QuantizedRowShape, scale_dtype: mx.Dtype) -> tuple[Any, ...]:
    """A float32 row and a random weight quantized as the checkpoint stores it (then a residual's base where
    the shape adds one), for admission."""
    keys = mx.random.split(mx.random.key(67), 3)
    x = mx.random.normal((1, shape.width), key=keys[0])
    dense = mx.random.normal((shape.outputs, shape.width), key=keys[1]) / math.sqrt(shape.width)
    weight, scales, biases = mx.quantize(dense.astype(mx.bfloat16), shape.group_size, shape.bits)
    base = mx.random.normal((1, shape.outputs), key=keys[2]) if shape.epilogue == "residual" else None
    return (x, weight, scales.astype(scale_dtype), biases.astype(scale_dtype), base)
