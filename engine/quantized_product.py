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

Arithmetic: per group, ``s · Σ x·q + b · Σ x`` in float32 (the form MLX's kernels use), summed over
the groups in another order: relative L2 about 1e-7 from :func:`quantized_row_ops`, MLX's own
``quantized_matmul``, which is the fallback and the reference the kernel is admitted against.

CUDA only: on Apple silicon MLX's Metal kernel for a quantized row already reads near the memory's
bandwidth, so Metal keeps it (the fallback) rather than risk a slower kernel of ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from .llm import group_rms_norm
from .numerics import custom_kernel

Prologue = Literal["none", "rms_norm", "group_rms_norm"]
PROLOGUES: tuple[Prologue, ...] = ("none", "rms_norm", "group_rms_norm")
Epilogue = Literal["none", "residual", "relu2"]
EPILOGUES: tuple[Epilogue, ...] = ("none", "residual", "relu2")

# Warps per block; a warp computes COLUMNS output columns (over a slice of the row, see split), reading
# each chunk of the input row once for all of them.
WARPS = 8
# Warps per block of a kernel that normalizes its row first: every block repeats the norm (the row and the
# norm's scale read again, a barrier), so fewer, larger blocks share it — with eight warps it cost as much as
# the product of a short row (tests/device/fast_kernels.py quantized, on the H200).
NORMING_WARPS = 32
COLUMNS = 8
# Bytes of packed weights a lane reads at a time.
CHUNK_BYTES = 16
# Static shared memory a block may use (CUDA's limit without opting in): the normed row must fit.
CUDA_SHARED_BYTES = 48 * 1024


@dataclass(frozen=True)
class QuantizedRowShape:
    """One row of ``width`` inputs through an ``outputs × width`` projection quantized to ``bits`` in
    groups of ``group_size``. ``prologue`` ``"rms_norm"`` normalizes the row first (``rms_norm(x) · s``, a
    block's norm), ``"group_rms_norm"`` each of its ``norm_groups`` slices (a Mamba mixer's gated norm);
    ``epilogue`` ``"residual"`` writes ``base + y`` and ``"relu2"`` writes ``max(y, 0)²``."""

    width: int
    outputs: int
    bits: int
    group_size: int
    prologue: Prologue = "none"
    epilogue: Epilogue = "none"
    norm_groups: int = 1

    def __post_init__(self) -> None:
        if self.prologue not in PROLOGUES or self.epilogue not in EPILOGUES:
            raise ValueError(f"prologue must be one of {PROLOGUES} and epilogue one of {EPILOGUES}")
        grouped = self.prologue == "group_rms_norm"
        if (self.norm_groups != 1 and not grouped) or not 1 <= self.norm_groups <= COLUMNS:
            raise ValueError(f"{self.norm_groups} norm groups: 1 unless a group norm, and at most {COLUMNS}")
        if self.width % self.norm_groups:
            raise ValueError(f"{self.norm_groups} norm groups do not tile {self.width}")
        if self.prologue != "none" and self.width * 4 + 1024 > CUDA_SHARED_BYTES:
            raise ValueError(f"a normed row of {self.width} does not fit in a block's shared memory")
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
    norm_scale: mx.array | None = None,
    base: mx.array | None = None,
    *,
    group_size: int,
    bits: int,
    eps: float = 1e-5,
    prologue: Prologue = "none",
    epilogue: Epilogue = "none",
    norm_groups: int = 1,
) -> mx.array:
    """The reference's operations (the kernel's fallback): the ``prologue``'s norm by ``norm_scale``, then
    ``x @ dequantize(weight).T``, then the ``epilogue`` (``base +`` it, or ``relu2``) — as a block of
    :mod:`engine.llm` computes them."""
    if prologue == "rms_norm":
        assert norm_scale is not None
        x = mx.fast.rms_norm(x, norm_scale, eps)
    elif prologue == "group_rms_norm":
        assert norm_scale is not None
        x = group_rms_norm(x, norm_scale, norm_groups, eps)
    y = mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=group_size, bits=bits)
    if epilogue == "residual":
        assert base is not None
        return base + y
    return nn.relu2(y) if epilogue == "relu2" else y


_CUDA = """
    constexpr int PER_WORD = 32 / BITS;
    constexpr int PER_CHUNK = 4 * PER_WORD;  // values in one 16-byte read, all in one group
    constexpr int PIECES = PER_CHUNK / 4;  // float4s of input per chunk
    constexpr int CHUNKS = K / PER_CHUNK;
    constexpr int GROUPS = K / GROUP;
    constexpr int COLUMN_SETS = WARPS / SPLIT;  // sets of COLUMNS columns per block; SPLIT warps share each
    constexpr int PER_SLICE = (CHUNKS + SPLIT - 1) / SPLIT;
    constexpr unsigned int MASK = (1u << BITS) - 1u;
    __shared__ float partial[WARPS][COLUMNS];
    @NORMED_MEMORY@
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int set = warp % COLUMN_SETS;
    const int slice = warp / COLUMN_SETS;
    const int first_column = (blockIdx.x * COLUMN_SETS + set) * COLUMNS;
    const uint4* packed = reinterpret_cast<const uint4*>(weight);
    // An array may start anywhere in its buffer: 16-byte reads only from a 16-byte boundary.
    const bool aligned = reinterpret_cast<unsigned long long>(x) % 16 == 0;
    const bool weights_aligned = reinterpret_cast<unsigned long long>(weight) % 16 == 0;
    @PROLOGUE@
    float acc[COLUMNS];
    for (int r = 0; r < COLUMNS; ++r) acc[r] = 0.0f;
    const int end = min(CHUNKS, (slice + 1) * PER_SLICE);
    for (int c = slice * PER_SLICE + lane; c < end; c += 32) {
        // The chunk's inputs, read once and used for every column of the set.
        const int first = c * PER_CHUNK;
        float inputs[PER_CHUNK];
        @INPUTS@
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

# The chunk's inputs straight from the row (float4 reads where aligned).
_CUDA_ROW_INPUTS = """
        if (aligned) {
            const float4* source = reinterpret_cast<const float4*>(x + first);
            for (int v = 0; v < PIECES; ++v) {
                const float4 four = source[v];
                inputs[4 * v] = four.x;
                inputs[4 * v + 1] = four.y;
                inputs[4 * v + 2] = four.z;
                inputs[4 * v + 3] = four.w;
            }
        } else {
            for (int e = 0; e < PER_CHUNK; ++e) inputs[e] = x[first + e];
        }
"""

# The block normalizes the row (each of its NORM_GROUPS slices) into shared memory once. A lane reads a whole
# chunk (PER_CHUNK floats, up to 128 bytes) as float4s: stored in order, the lanes of a quarter warp would meet
# in the same banks, so each chunk's float4s are stored rotated by the chunk's index.
_CUDA_NORM = """
    {
        constexpr int NORM_WIDTH = K / NORM_GROUPS;
        for (int g = 0; g < NORM_GROUPS; ++g) {
            float squares = 0.0f;
            for (int i = g * NORM_WIDTH + threadIdx.x; i < (g + 1) * NORM_WIDTH; i += WARPS * 32) {
                const float v = x[i];
                squares += v * v;
            }
            for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffff, squares, offset);
            if (lane == 0) partial[warp][g] = squares;
        }
        __syncthreads();
        if (threadIdx.x < NORM_GROUPS) {
            float total = 0.0f;
            for (int w = 0; w < WARPS; ++w) total += partial[w][threadIdx.x];
            inverses[threadIdx.x] = rsqrtf(total / NORM_WIDTH + params[0]);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < K; i += WARPS * 32) {
            const int chunk = i / PER_CHUNK;
            const int piece = ((i % PER_CHUNK) / 4 + chunk) % PIECES;
            const float inverse = inverses[i / NORM_WIDTH];
            normed[(chunk * PIECES + piece) * 4 + i % 4] = static_cast<float>(norm_scale[i]) * (x[i] * inverse);
        }
        __syncthreads();
    }
"""

_CUDA_NORMED_INPUTS = """
        {
            const float4* source = reinterpret_cast<const float4*>(normed) + c * PIECES;
            for (int v = 0; v < PIECES; ++v) {
                const float4 four = source[(v + c) % PIECES];
                inputs[4 * v] = four.x;
                inputs[4 * v + 1] = four.y;
                inputs[4 * v + 2] = four.z;
                inputs[4 * v + 3] = four.w;
            }
        }
"""

_CUDA_EPILOGUES: dict[Epilogue, str] = {
    "none": "",
    "residual": "sum = base[first_column + lane] + sum;",
    "relu2": "sum = fmaxf(sum, 0.0f);\n        sum = sum * sum;",
}
# The inputs each part reads besides the row and the quantized weight, in call order.
PROLOGUE_INPUTS: dict[Prologue, tuple[str, ...]] = {
    "none": (),
    "rms_norm": ("norm_scale", "params"),
    "group_rms_norm": ("norm_scale", "params"),
}
EPILOGUE_INPUTS: dict[Epilogue, tuple[str, ...]] = {"none": (), "residual": ("base",), "relu2": ()}


def cuda_source(shape: QuantizedRowShape) -> str:
    """The kernel body for ``shape``'s prologue and epilogue."""
    normed = shape.prologue != "none"
    memory = "__shared__ __align__(16) float normed[K];\n    __shared__ float inverses[NORM_GROUPS];"
    return (
        _CUDA.replace("@NORMED_MEMORY@", memory if normed else "")
        .replace("@PROLOGUE@", _CUDA_NORM if normed else "")
        .replace("@INPUTS@", _CUDA_NORMED_INPUTS if normed else _CUDA_ROW_INPUTS)
        .replace("@EPILOGUE@", _CUDA_EPILOGUES[shape.epilogue])
    )


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
        self.warps = WARPS if shape.prologue == "none" else NORMING_WARPS
        self._inputs = ["x", "weight", "scales", "biases", *PROLOGUE_INPUTS[shape.prologue]]
        self._inputs += EPILOGUE_INPUTS[shape.epilogue]
        parts = "".join(f"_{part}" for part in (shape.prologue, shape.epilogue) if part != "none")
        self._kernel = custom_kernel(
            backend,
            f"parley_quantized_row_{shape.bits}bit{parts}",
            self._inputs,
            ["y"],
            cuda=cuda_source(shape),
            metal="",
        )
        self._params: dict[float, mx.array] = {}

    def __call__(
        self,
        x: mx.array,
        weight: mx.array,
        scales: mx.array,
        biases: mx.array,
        norm_scale: mx.array | None = None,
        base: mx.array | None = None,
        *,
        eps: float = 1e-5,
    ) -> mx.array:
        """``x`` holds one row of ``width`` in any shape ``(1, …, 1, width)``; the result keeps its shape
        (``base``, for a residual epilogue, holds one row of ``outputs``)."""
        shape = self.shape
        if eps not in self._params:
            self._params[eps] = mx.array([eps], dtype=mx.float32)
        named = {"x": x, "weight": weight, "scales": scales, "biases": biases, "norm_scale": norm_scale}
        named.update({"base": base, "params": self._params[eps]})
        warps = self.warps
        per_block = COLUMNS * warps // self.split
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
                ("WARPS", warps),
                ("NORM_GROUPS", shape.norm_groups),
            ],
            grid=(blocks * warps * 32, 1, 1),
            threadgroup=(warps * 32, 1, 1),
            output_shapes=[(*x.shape[:-1], shape.outputs)],
            output_dtypes=[mx.float32],
        )
        return y


def quantized_row_samples(
    shape: QuantizedRowShape, scale_dtype: mx.Dtype, norm_dtype: mx.Dtype = mx.float32
) -> tuple[Any, ...]:
    """A float32 row and a random weight quantized as the checkpoint stores it (then the norm's scale and the
    residual's base where the shape reads them), for admission."""
    keys = mx.random.split(mx.random.key(67), 4)
    x = 3.0 * mx.random.normal((1, shape.width), key=keys[0])
    dense = mx.random.normal((shape.outputs, shape.width), key=keys[1]) / math.sqrt(shape.width)
    weight, scales, biases = mx.quantize(dense.astype(mx.bfloat16), shape.group_size, shape.bits)
    norm_scale = None
    if shape.prologue != "none":
        norm_scale = (1.0 + 0.1 * mx.random.normal((shape.width,), key=keys[2])).astype(norm_dtype)
    base = mx.random.normal((1, shape.outputs), key=keys[3]) if shape.epilogue == "residual" else None
    return (x, weight, scales.astype(scale_dtype), biases.astype(scale_dtype), norm_scale, base)
