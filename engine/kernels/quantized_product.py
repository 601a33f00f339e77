"""One float32 row through an affine-quantized projection, as one CUDA kernel (fast numerics).

The LLM's projections are stored at 4 or 8 bits (MLX's affine layout: ``uint32`` words packing
``32 / bits`` values, lowest bits first, and a scale ``s`` and bias ``b`` per group of
``group_size`` inputs, so a weight is ``s·q + b``). A streaming frame multiplies one row by each
of them: 122 products reading 5.55 GB at 4 bits, most of the LLM's time. On the H200 MLX's CUDA
kernel for that product reads about 0.3-0.45 TB/s (``python3 tests/device/fast_kernels.py quantized``).
Here a warp computes :data:`COLUMNS` output columns, reading each 16-byte chunk of the float32 input row
once for all of them (the inputs are eight times the bytes of 4-bit weights: read once per column, as a
first version of this kernel did, they held it to 0.13 TB/s), and warps share the columns of a short row,
each lane reading whole chunks (:meth:`QuantizedRowShape.layout`). A lane issues every load of a pass before
using the first, so a pass costs one memory latency: on the H200 this layout read 0.73-1.32 TB/s at 4 bits
where the one before it, whose lanes waited on each column's load in turn and shared rows unevenly, read
0.60-0.91 (same process, interleaved; the LLM's projections 5-31 % faster per call at 4 bits, up to 21 % at 8).

Three changes since keep every output bit (``tests/device/quantized_ab.py``, in git history, against the build
before, all roles, 4 and 8 bits: every row equal): a warp reads its 32 chunks of the row together and stages them in
shared memory (read chunk by chunk, each of a lane's 16-byte reads touched its own 128-byte line: eight
times the cache traffic of the weights); a value is dequantized by one AND into a subnormal float (the
MLP's up projection compiled to 1,640 instructions, 1,144 without the subtractions, 1,368 with the
staging); and a pass's weight loads are issued before its inputs are staged and before any prologue. On
the H200 (2026-12-03, best of three alternating rounds, µs a call at 4 bits): the Mamba mixer's out
projection with its group norm 77.4 → 52.4, its in projection 50.9 → 45.4, the MLP's up 42.5 → 37.3 and
down 44.7 → 39.0; at 8 bits in 56.9 → 51.8, down 42.7 → 44.8 (noise). The build measured scaled the inputs
by 2^(100 − BITS·k), so that one of 2^28 or more overflowed; the scale is now 2^(64 − BITS·k) — the same
arithmetic by the same argument, any float32 input below 2^64 — and on the H200 its outputs equal the
2^(100 − BITS·k) build's bit for bit in every role at 4 and 8 bits (``quantized_ab.py``, later that day).

Inside one of the LLM's residual blocks the last projection also adds the block's input (epilogue
``"residual"``) and the MLP's up projection squares its ReLU (``"relu2"``): a frame runs no separate add per
block and no activation between the MLP's products, about 80 primitives fewer, and those kernels take no
longer than the plain one. The Mamba mixer's output projection also finishes the mixer's gated group norm
(prologue ``"group_norm"``): the fused step (:class:`engine.kernels.fused_step.FusedStep`) sums the squares of its
readout per block as it writes it, so each block of this kernel adds a few hundred partial sums per group instead
of reading the whole row, and scales its chunks of the row as it reads them (six primitives fewer per
Mamba block: the norm and the views around it). The blocks' own pre-norms stay MLX's kernel: folded in by
normalizing the whole row into shared memory in every block, they made the products 26-55 µs slower per
call on the H200, more than the primitives they saved (``tests/device/fused_rows_ab.py``, in git history). What
does pay is the other end: in the LLM's chained step (:meth:`engine.networks.llm.NemotronH._step`, chained) each
block's last projection has the epilogue ``"residual_norm"``, and the last of its blocks to finish (a ticket counter)
reads the whole output row back from L2 into registers and writes it through the next block's RMS norm —
one block doing what MLX's norm kernel did, with no serial prologue in the kernels that read it. On the
H200 (2026-12-04) the three shapes cost 3-7 µs more a call than the plain residual (Mamba out 63.1 → 66.2,
MLP down 37.9 → 44.8 µs; a first version that read the row twice, value by value, cost 10-18 µs), and the
frame took 56 primitives fewer, 1,102 → 1,046 (``tests/device/fold_ab.py chained``: 13.52-13.74 ms p50 chained
against 13.73-14.09 unchained, alternating rounds in one process, the same outputs).

Arithmetic: per group, ``s · Σ x·q + b · Σ x`` in float32 (the form MLX's kernels use), summed over
the groups in another order; the norm as ``w · (x · rsqrt(Σ/n + eps))`` with its sum in another order:
relative L2 about 1e-7 from :func:`quantized_row_ops` — MLX's own norm, ``quantized_matmul`` and the add
or squared ReLU — which is the fallback and the reference the kernel is admitted against.

CUDA only: on Apple silicon MLX's Metal kernel for a quantized row already reads near the memory's
bandwidth, so Metal keeps it (the fallback) rather than risk a slower kernel of ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .admission import custom_kernel, kernel_constants, kernel_tickets

Epilogue = Literal["none", "residual", "relu2", "residual_norm"]
EPILOGUES: tuple[Epilogue, ...] = ("none", "residual", "relu2", "residual_norm")
Prologue = Literal["none", "group_norm"]
PROLOGUES: tuple[Prologue, ...] = ("none", "group_norm")

# Output columns a warp computes, reading each chunk of the input row once for all of them.
COLUMNS = 8
# Bytes of packed weights a lane reads at a time.
CHUNK_BYTES = 16
# Most warps sharing one row's columns in a block: on the H200, 16 warps in one pass ran slower than 8 in two
# (fewer blocks fit a multiprocessor at once).
MAX_WARPS = 8
# The inputs are scaled by 2^(INPUT_SHIFT − bits·k) to meet their weights dequantized as subnormals (see the kernel):
# a float32 input overflows from 2^(128 − INPUT_SHIFT), and partial sums keep float32's rounding down to
# 2^(23 − INPUT_SHIFT). 64 puts both far from any activation.
INPUT_SHIFT = 64


@dataclass(frozen=True)
class RowRole:
    """What a projection's kernel computes around its product, by the projection's place in a block.

    ``epilogue`` ``"residual"`` writes ``base + y`` and ``"relu2"`` ``max(y, 0)²``. ``prologue``
    ``"group_norm"`` takes the row before its norm (:func:`grouped_rms_norm`, ``norm_groups`` slices, eps
    ``norm_eps``) with the sums of its squares over ``norm_partials`` equal runs, which the kernel that
    wrote the row summed as it went (:class:`engine.kernels.fused_step.FusedStep`). ``"residual_norm"`` writes
    ``base + y`` and also that row through the next block's RMS norm (eps ``next_eps``): the block's output
    and the next block's input in one launch."""

    epilogue: Epilogue = "none"
    prologue: Prologue = "none"
    norm_groups: int = 1
    norm_partials: int = 0
    norm_eps: float = 0.0
    next_eps: float = 0.0


@dataclass(frozen=True)
class QuantizedRowShape:
    """One row of ``width`` inputs through an ``outputs × width`` projection quantized to ``bits`` in
    groups of ``group_size``, in its :class:`RowRole`."""

    width: int
    outputs: int
    bits: int
    group_size: int
    role: RowRole = RowRole()
    columns: int = COLUMNS  # output columns a warp computes (the device scripts try others)
    max_warps: int = MAX_WARPS

    def __post_init__(self) -> None:
        role = self.role
        if role.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, not {role.epilogue!r}")
        if role.prologue not in PROLOGUES:
            raise ValueError(f"prologue must be one of {PROLOGUES}, not {role.prologue!r}")
        if self.bits not in (4, 8):
            raise ValueError(f"the quantized row kernel reads 4 or 8 bits, not {self.bits}")
        if self.group_size % self.chunk_values or self.width % self.group_size:
            raise ValueError(
                f"groups of {self.group_size} must hold whole {self.chunk_values}-value chunks and tile {self.width}"
            )
        if role.prologue == "group_norm" and (
            self.width % (role.norm_groups * self.chunk_values)
            or role.norm_partials % role.norm_groups
            or role.norm_partials < role.norm_groups
        ):
            raise ValueError(
                f"{role.norm_groups} norm groups must hold whole {self.chunk_values}-value chunks of {self.width}"
                f" and whole runs of {role.norm_partials} partial sums"
            )

    @property
    def chunk_values(self) -> int:
        """Values in one 16-byte read (a chunk lies within one group)."""
        return CHUNK_BYTES * 8 // self.bits

    @property
    def chunks(self) -> int:
        return self.width // self.chunk_values

    def layout(self) -> tuple[int, int]:
        """``(split, sets)``: warps sharing one set of :attr:`columns` columns, each lane reading whole chunks
        of the row, and sets per block.

        A lane issues all its loads at once and waits out one memory latency per pass over the row, so
        the fewest passes that keep at least 85 % of the lanes busy win, with at most :attr:`max_warps`
        warps to a row (a pass with lanes left idle at its end wastes their share of the memory's
        parallelism); a short row's block holds several sets of columns."""
        for passes in (1, 2, 3, 4, 8, 16):
            split = -(-self.chunks // (32 * passes))
            if split <= self.max_warps and self.chunks / (32 * split * passes) >= 0.85:
                break
        split = min(split, self.max_warps)
        return split, max(1, self.max_warps // split)


def grouped_rms_norm(x: mx.array, weight: mx.array, *, groups: int, eps: float) -> mx.array:
    """``weight · x / rms`` with each of ``groups`` equal slices of ``x`` normed apart (MLX's RMS norm kernel):
    the Mamba mixer's norm (:class:`engine.networks.llm.GroupedGatedRMSNorm`), and the fallback of the prologue that
    finishes it from partial sums."""
    grouped = mx.unflatten(x, axis=-1, shape=(groups, -1))
    return weight * mx.fast.rms_norm(grouped, weight=None, eps=eps).flatten(-2)


def quantized_row_ops(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    base: mx.array | None = None,
    squares: mx.array | None = None,
    norm_weight: mx.array | None = None,
    norm_params: mx.array | None = None,
    next_weight: mx.array | None = None,
    *,
    group_size: int,
    bits: int,
    role: RowRole = RowRole(),
) -> mx.array | tuple[mx.array, mx.array]:
    """The reference's operations (the kernel's fallback): the ``role``'s prologue (the norm itself, from the row:
    the partial sums are the kernel's shortcut), ``x @ dequantize(weight).T``, then its epilogue (``base +``
    it, or ``relu2``) — as a block of :mod:`engine.networks.llm` computes them. ``"residual_norm"`` returns the sum and
    the next block's norm of it (weight ``next_weight``), as the next block computes it."""
    if role.prologue == "group_norm":
        assert norm_weight is not None
        x = grouped_rms_norm(x, norm_weight, groups=role.norm_groups, eps=role.norm_eps)
    y = mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=group_size, bits=bits)
    if role.epilogue == "residual_norm":
        assert base is not None and next_weight is not None
        total = base + y
        return total, mx.fast.rms_norm(total, next_weight, role.next_eps)
    if role.epilogue == "residual":
        assert base is not None
        return base + y
    return nn.relu2(y) if role.epilogue == "relu2" else y


_CUDA = """
    constexpr int PER_WORD = 32 / BITS;
    constexpr int PER_HALF = 16 / BITS;  // values in 16 bits
    constexpr int PER_CHUNK = 4 * PER_WORD;  // values in one 16-byte read, all in one group
    constexpr int QUARTERS = PER_CHUNK / 4;  // float4s of inputs a chunk multiplies
    constexpr int CHUNKS = K / PER_CHUNK;
    constexpr int GROUPS = K / GROUP;
    constexpr int LANES = SPLIT * 32;  // lanes sharing one set of COLUMNS columns, a chunk each per pass
    constexpr int PASSES = (CHUNKS + LANES - 1) / LANES;
    constexpr unsigned int MASK = (1u << BITS) - 1u;
    __shared__ float partial[SETS * SPLIT][COLUMNS];
    // Each warp's inputs for a pass: its lanes' chunks of the row, a float4 at a time in swizzled slots.
    __shared__ float4 staged[SETS * SPLIT][32 * QUARTERS];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int set = warp / SPLIT;
    const int first_column = (blockIdx.x * SETS + set) * COLUMNS;
    const int reader = (warp % SPLIT) * 32 + lane;
    const uint4* packed = reinterpret_cast<const uint4*>(weight);
    // An array may start anywhere in its buffer: 16-byte reads only from a 16-byte boundary.
    const bool aligned = reinterpret_cast<unsigned long long>(x) % 16 == 0;
    const bool weights_aligned = reinterpret_cast<unsigned long long>(weight) % 16 == 0;
    float acc[COLUMNS];
#pragma unroll
    for (int r = 0; r < COLUMNS; ++r) acc[r] = 0.0f;
    const float unscale = __int_as_float((127 + 149 - SHIFT) << 23);  // undoes the products' 2^(SHIFT − 149)
    uint4 chunk[COLUMNS];
    float scale[COLUMNS];
    float bias[COLUMNS];
    // A pass's weight loads, all issued before the first is used (one memory latency per pass), before the
    // inputs are staged and, for the first pass, before any prologue. Lanes past the row's end and columns
    // past N read the last chunk and column again (never used, never written).
    const auto load = [&](int c) {
        c = min(c, CHUNKS - 1);
        const int group = c * PER_CHUNK / GROUP;
#pragma unroll
        for (int r = 0; r < COLUMNS; ++r) {
            const int column = min(first_column + r, N - 1);
            const size_t at_chunk = static_cast<size_t>(column) * CHUNKS + c;
            if (weights_aligned) {
                chunk[r] = packed[at_chunk];
            } else {
                chunk[r] = make_uint4(weight[4 * at_chunk], weight[4 * at_chunk + 1], weight[4 * at_chunk + 2],
                                      weight[4 * at_chunk + 3]);
            }
            const size_t at = static_cast<size_t>(column) * GROUPS + group;
            scale[r] = static_cast<float>(scales[at]);
            bias[r] = static_cast<float>(biases[at]);
        }
    };
    // The slot of a chunk's quarter: eight neighbouring lanes reading one quarter of their chunks each, or
    // writing one run of 128 bytes, meet eight different banks.
    const auto slot = [](int chunk_in_warp, int quarter) {
        return chunk_in_warp * QUARTERS + (quarter ^ ((chunk_in_warp / (8 / QUARTERS)) % QUARTERS));
    };
    load(reader);
    @SETUP@
#pragma unroll
    for (int pass = 0; pass < PASSES; ++pass) {
        const int c = reader + pass * LANES;
        if (pass > 0) load(c);
        // The warp's 32 chunks of inputs, read together (each lane's own 16 bytes of every 512) and staged:
        // read chunk by chunk, each of a lane's reads would touch a different 128-byte line.
        const int warp_first = (c - lane) * PER_CHUNK;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < QUARTERS; ++i) {
            const int f = i * 32 + lane;
            const int at = warp_first + 4 * f;
            float4 four = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (at < K) {
                four = aligned ? *reinterpret_cast<const float4*>(x + at)
                               : make_float4(x[at], x[at + 1], x[at + 2], x[at + 3]);
                @INPUTS@
            }
            staged[warp][slot(f / QUARTERS, f % QUARTERS)] = four;
        }
        __syncwarp();
        if (c < CHUNKS) {
            // A value's bits in place in its half word, v = q·2^(BITS·k) < 2^16, read as a float are the subnormal
            // v·2^-149: one AND dequantizes it, exactly (no conversion or subtraction; an FMA takes subnormals at
            // full rate and, written as PTX without .ftz, keeps them whatever flags the kernel is built with).
            // The inputs are scaled by 2^(SHIFT − BITS·k) to match (INPUT_SHIFT, 64), so every product is
            // x·q·2^(SHIFT − 149), exact; while the partial sums stay normal floats (above 2^(23 − SHIFT); no
            // input reaches the 2^(128 − SHIFT) that would overflow), summing the scaled products rounds exactly
            // as summing x·q would, and the column's scale undoes the power of two. Below 2^(23 − SHIFT) a sum
            // keeps an absolute precision of 2^-SHIFT.
            float dot[COLUMNS];
#pragma unroll
            for (int r = 0; r < COLUMNS; ++r) dot[r] = 0.0f;
            float total = 0.0f;
            // A quarter of the chunk's inputs at a time, used for every column of the set (each column still
            // sums its products in the chunk's order).
#pragma unroll
            for (int v = 0; v < QUARTERS; ++v) {
                const float4 four = staged[warp][slot(lane, v)];
                float inputs[4] = {four.x, four.y, four.z, four.w};
#pragma unroll
                for (int t = 0; t < 4; ++t) total += inputs[t];
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    inputs[t] *= __int_as_float((127 + SHIFT - BITS * ((4 * v + t) % PER_HALF)) << 23);
                }
#pragma unroll
                for (int r = 0; r < COLUMNS; ++r) {
                    const unsigned int words[4] = {chunk[r].x, chunk[r].y, chunk[r].z, chunk[r].w};
#pragma unroll
                    for (int t = 0; t < 4; ++t) {
                        const int e = 4 * v + t;
                        const unsigned int word = words[e / PER_WORD];
                        const unsigned int half = (e % PER_WORD) / PER_HALF ? word >> 16 : word;
                        const float q = __uint_as_float(half & (MASK << (BITS * (e % PER_HALF))));
                        asm("fma.rn.f32 %0, %1, %2, %0;" : "+f"(dot[r]) : "f"(inputs[t]), "f"(q));
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < COLUMNS; ++r) acc[r] += (scale[r] * unscale) * dot[r] + bias[r] * total;
        }
    }
#pragma unroll
    for (int r = 0; r < COLUMNS; ++r) {
        for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffff, acc[r], offset);
        if (lane == 0) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (warp % SPLIT == 0 && lane < COLUMNS && first_column + lane < N) {
        float sum = 0.0f;
        for (int k = 0; k < SPLIT; ++k) sum += partial[warp + k][lane];
        @EPILOGUE@
        y[first_column + lane] = sum;
    }
    @AFTER@
"""

_RESIDUAL_CUDA = "sum = base[first_column + lane] + sum;"
_CUDA_EPILOGUES: dict[Epilogue, str] = {
    "none": "",
    "residual": _RESIDUAL_CUDA,
    "relu2": "sum = fmaxf(sum, 0.0f);\n        sum = sum * sum;",
    "residual_norm": _RESIDUAL_CUDA,  # then the last block's norm (_CUDA_NORM_AFTER)
}
# After every column is written, "residual_norm"'s last block to finish (a ticket each block takes once its
# columns are visible to all) reads the whole row back from L2, each thread its strided share into registers at
# once (with the next norm's weights: one memory latency, not one per value), sums the squares in a fixed order
# (each thread's share, then the warps' in turn) and writes the row through the next block's RMS norm, then puts
# the ticket counter back to zero for the next launch: the norm MLX would launch as a kernel of its own.
_CUDA_NORM_AFTER = """__threadfence();  // this block's columns, visible to every block before its ticket is taken
    __shared__ bool last_block;
    __shared__ float warp_squares[SETS * SPLIT];
    __syncthreads();
    if (threadIdx.x == 0) last_block = atomicAdd(const_cast<int*>(tickets), 1) == BLOCKS - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    constexpr int THREADS = SETS * SPLIT * 32;
    constexpr int PER_THREAD = (N + THREADS - 1) / THREADS;
    float row[PER_THREAD];
    float gain[PER_THREAD];
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int i = threadIdx.x + k * THREADS;
        row[k] = i < N ? __ldcg(y + i) : 0.0f;
        gain[k] = i < N ? static_cast<float>(next_weight[i]) : 0.0f;
    }
    float row_squares = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) row_squares += row[k] * row[k];
    for (int offset = 16; offset > 0; offset /= 2) {
        row_squares += __shfl_xor_sync(0xffffffff, row_squares, offset);
    }
    if (lane == 0) warp_squares[warp] = row_squares;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < SETS * SPLIT; ++w) total += warp_squares[w];
    const float factor = rsqrtf(total / N + NEXT_EPS);
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int i = threadIdx.x + k * THREADS;
        if (i < N) normed[i] = gain[k] * (row[k] * factor);
    }
    if (threadIdx.x == 0) const_cast<int*>(tickets)[0] = 0;"""
# The group norm's factors, once per block from the partial sums (each group's summed in one fixed order, so
# every block gets the same bits), then applied to the row's values as a warp stages them.
_CUDA_PROLOGUES: dict[Prologue, tuple[str, str]] = {
    "none": ("", ""),
    "group_norm": (
        """constexpr int NORM_WIDTH = K / NORM_GROUPS;
    constexpr int PER_GROUP = PARTIALS / NORM_GROUPS;
    __shared__ float norm_factor[NORM_GROUPS];
    for (int g = warp; g < NORM_GROUPS; g += SETS * SPLIT) {
        float sum = 0.0f;
        for (int i = lane; i < PER_GROUP; i += 32) sum += squares[g * PER_GROUP + i];
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
        if (lane == 0) norm_factor[g] = rsqrtf(sum / NORM_WIDTH + norm_params[0]);
    }
    __syncthreads();""",
        """const float factor = norm_factor[at / NORM_WIDTH];
                four.x = static_cast<float>(norm_weight[at]) * (four.x * factor);
                four.y = static_cast<float>(norm_weight[at + 1]) * (four.y * factor);
                four.z = static_cast<float>(norm_weight[at + 2]) * (four.z * factor);
                four.w = static_cast<float>(norm_weight[at + 3]) * (four.w * factor);""",
    ),
}
# The inputs each part reads besides the row and the quantized weight.
EPILOGUE_INPUTS: dict[Epilogue, tuple[str, ...]] = {
    "none": (),
    "residual": ("base",),
    "relu2": (),
    "residual_norm": ("base", "next_weight", "tickets"),
}
PROLOGUE_INPUTS: dict[Prologue, tuple[str, ...]] = {
    "none": (),
    "group_norm": ("squares", "norm_weight", "norm_params"),
}


def cuda_source(shape: QuantizedRowShape) -> str:
    """The kernel body for ``shape``'s role."""
    role = shape.role
    setup, inputs = _CUDA_PROLOGUES[role.prologue]
    body = _CUDA.replace("@SETUP@", setup).replace("@INPUTS@", inputs)
    after = ""
    if role.epilogue == "residual_norm":
        # eps as an exact float32 literal in the source (an input array of it would be read over PCIe: its 4 bytes
        # would live in MLX's host-side pool).
        eps = float(np.float32(role.next_eps)).hex()
        after = f"constexpr float NEXT_EPS = {eps}f;\n    " + _CUDA_NORM_AFTER
    return body.replace("@EPILOGUE@", _CUDA_EPILOGUES[role.epilogue]).replace("@AFTER@", after)


class QuantizedRowProduct:
    """:func:`quantized_row_ops` for one row and one :class:`QuantizedRowShape`, as a CUDA kernel (float32 out)."""

    def __init__(self, backend: str, shape: QuantizedRowShape) -> None:
        if backend != "cuda":
            raise ValueError("MLX's own kernel serves quantized rows on Metal")
        self.shape = shape
        self.split, self.sets = shape.layout()
        role = shape.role
        self._inputs = [
            "x",
            "weight",
            "scales",
            "biases",
            *EPILOGUE_INPUTS[role.epilogue],
            *PROLOGUE_INPUTS[role.prologue],
        ]
        parts = "".join(f"_{part}" for part in (role.prologue, role.epilogue) if part != "none")
        normed = role.epilogue == "residual_norm"
        self._kernel_outputs = ["y", "normed"] if normed else ["y"]
        self._kernel = custom_kernel(
            backend,
            f"parley_quantized_row_{shape.bits}bit{parts}",
            self._inputs,
            self._kernel_outputs,
            cuda=cuda_source(shape),
            metal="",
        )
        # The last block's ticket counter (zeros, left as found), for a "residual_norm" launch. Launches of one
        # kernel never overlap: each reads the row the one before wrote.
        self._tickets = kernel_tickets() if normed else None

    def __call__(
        self,
        x: mx.array,
        weight: mx.array,
        scales: mx.array,
        biases: mx.array,
        base: mx.array | None = None,
        squares: mx.array | None = None,
        norm_weight: mx.array | None = None,
        norm_params: mx.array | None = None,
        next_weight: mx.array | None = None,
    ) -> mx.array | tuple[mx.array, mx.array]:
        """``x`` holds one row of ``width`` in any shape ``(1, …, 1, width)``; the result keeps its shape
        (``base``, for a residual epilogue, holds one row of ``outputs``); ``"residual_norm"`` returns the
        sum and its norm."""
        shape = self.shape
        named = {
            "x": x,
            "weight": weight,
            "scales": scales,
            "biases": biases,
            "base": base,
            "squares": squares,
            "norm_weight": norm_weight,
            "norm_params": norm_params,
            "next_weight": next_weight,
            "tickets": self._tickets,
        }
        warps = self.split * self.sets
        blocks = -(-shape.outputs // (shape.columns * self.sets))
        outputs = self._kernel(
            inputs=[named[name] for name in self._inputs],
            template=[
                ("K", shape.width),
                ("N", shape.outputs),
                ("BITS", shape.bits),
                ("GROUP", shape.group_size),
                ("COLUMNS", shape.columns),
                ("SPLIT", self.split),
                ("SETS", self.sets),
                ("NORM_GROUPS", shape.role.norm_groups),
                ("PARTIALS", shape.role.norm_partials),
                ("SHIFT", INPUT_SHIFT),
                ("BLOCKS", blocks),
            ],
            grid=(blocks * warps * 32, 1, 1),
            threadgroup=(warps * 32, 1, 1),
            output_shapes=[(*x.shape[:-1], shape.outputs)] * len(self._kernel_outputs),
            output_dtypes=[mx.float32] * len(self._kernel_outputs),
        )
        return (outputs[0], outputs[1]) if len(outputs) == 2 else outputs[0]


def quantized_row_samples(
    shape: QuantizedRowShape,
    scale_dtype: mx.Dtype,
    norm_dtype: mx.Dtype = mx.float32,
    next_dtype: mx.Dtype = mx.float32,
) -> tuple[Any, ...]:
    """Inputs for admission, in :class:`QuantizedRowProduct`'s call order: a float32 row and a random weight
    quantized as the checkpoint stores it, then what the role reads besides (None where it reads nothing):
    a residual's base, a group norm's partial sums of squares (of the row itself), weight and eps, and the
    next block's norm weight (in ``next_dtype``)."""
    keys = mx.random.split(mx.random.key(67), 5)
    x = mx.random.normal((1, shape.width), key=keys[0])
    dense = mx.random.normal((shape.outputs, shape.width), key=keys[1]) / math.sqrt(shape.width)
    weight, scales, biases = mx.quantize(dense.astype(mx.bfloat16), shape.group_size, shape.bits)
    role = shape.role
    residual = role.epilogue in ("residual", "residual_norm")
    base = mx.random.normal((1, shape.outputs), key=keys[2]) if residual else None
    norm: tuple[mx.array | None, ...] = (None, None, None)
    if role.prologue == "group_norm":
        squares = mx.sum(mx.square(x).reshape(role.norm_partials, -1), axis=1)
        norm_weight = (1.0 + 0.1 * mx.random.normal((shape.width,), key=keys[3])).astype(norm_dtype)
        norm = (squares, norm_weight, kernel_constants(role.norm_eps))
    next_weight = None
    if role.epilogue == "residual_norm":
        next_weight = (1.0 + 0.1 * mx.random.normal((shape.outputs,), key=keys[4])).astype(next_dtype)
    return (x, weight, scales.astype(scale_dtype), biases.astype(scale_dtype), base, *norm, next_weight)
