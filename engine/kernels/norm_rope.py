"""The TTS backbone's query and key heads for one position, as one kernel (fast numerics).

:class:`NormRope` RMS-normalizes each query and key head with its Gemma scale and rotates it by RoPE, one warp
per (row, head); :func:`norm_rope_ops` is its operations fallback. The single-position attention's heads form
(:meth:`engine.kernels.decode_attention.DecodeAttention.attend_heads`) runs the same lines for one head
(:data:`ONE_HEAD_CUDA`), so that both compute the same bits.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .admission import custom_kernel, kernel_constants

# One head's Gemma RMS norm and RoPE by one warp (``source`` its D values, ``is_query`` which scale), the normed
# values staged in @NORMED@[d] and the rotated ones written to @TARGET@[d]: the heads kernel's lines, which the
# attention that makes its own heads (``_HEADS`` in :mod:`.decode_attention_source`) runs too, so that both compute
# the same bits.
ONE_HEAD_CUDA = """    float head_values[PER_LANE];
    float squares = 0.0f;
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        head_values[i] = d < D ? source[d] : 0.0f;
        squares += head_values[i] * head_values[i];
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        squares += __shfl_xor_sync(0xffffffff, squares, offset);
    }
    const float normalizer = rsqrtf(squares / D + params[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        if (d < D) {
            const float gain = static_cast<float>(is_query ? q_scale[d] : k_scale[d]);
            @NORMED@[d] = gain * (head_values[i] * normalizer);
        }
    }
    __syncwarp();
    const float at = static_cast<float>(at_position[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        if (d < D) {
            const int pair = d < HALF ? d : d - HALF;
            const float inv_freq = exp2f(-(static_cast<float>(pair) / static_cast<float>(HALF)) * params[1]);
            const float theta = at * inv_freq;
            const float cosine = cosf(theta);
            const float sine = sinf(theta);
            const float x1 = @NORMED@[pair];
            const float x2 = @NORMED@[pair + HALF];
            @TARGET@[d] = d < HALF ? x1 * cosine - x2 * sine : x1 * sine + x2 * cosine;
        }
    }
"""

_NORM_ROPE_CUDA = """
    constexpr int PER_LANE = (D + 31) / 32;
    constexpr int HALF = D / 2;
    __shared__ float normed[NORM_WARPS][D];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int head_row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;  // one warp per (row, head)
    if (head_row >= q_rows_shape[0] * (HQ + HKV)) return;
    const int row = head_row / (HQ + HKV);
    const int head = head_row % (HQ + HKV);
    const bool is_query = head < HQ;
    const float* source = is_query ? q_rows + (static_cast<size_t>(row) * HQ + head) * D
                                   : k_rows + (static_cast<size_t>(row) * HKV + head - HQ) * D;
    float* target = is_query ? queries + (static_cast<size_t>(row) * HQ + head) * D
                             : keys + (static_cast<size_t>(row) * HKV + head - HQ) * D;
""" + ONE_HEAD_CUDA.replace("@NORMED@", "normed[warp]").replace("@TARGET@", "target")

_NORM_ROPE_METAL = """
    constexpr int PER_LANE = (D + 31) / 32;
    constexpr int HALF = D / 2;
    threadgroup float normed[NORM_WARPS][D];
    const uint warp = simdgroup_index_in_threadgroup;
    const uint lane = thread_index_in_simdgroup;
    const int head_row = int(thread_position_in_grid.x / 32);  // one simdgroup per (row, head)
    if (head_row >= q_rows_shape[0] * (HQ + HKV)) return;
    const int row = head_row / (HQ + HKV);
    const int head = head_row % (HQ + HKV);
    const bool is_query = head < HQ;
    const uint source = is_query ? uint(row * HQ + head) * D : uint(row * HKV + head - HQ) * D;
    float values[PER_LANE];
    float squares = 0.0f;
    for (int i = 0; i < PER_LANE; ++i) {
        const uint d = lane + 32 * i;
        values[i] = d < D ? (is_query ? q_rows[source + d] : k_rows[source + d]) : 0.0f;
        squares += values[i] * values[i];
    }
    squares = metal::simd_sum(squares);
    const float normalizer = metal::rsqrt(squares / D + params[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const uint d = lane + 32 * i;
        if (d < D) {
            const float scale = static_cast<float>(is_query ? q_scale[d] : k_scale[d]);
            normed[warp][d] = scale * (values[i] * normalizer);
        }
    }
    metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup);
    const float position = static_cast<float>(at_position[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const uint d = lane + 32 * i;
        if (d < D) {
            const uint pair = d < HALF ? d : d - HALF;
            const float inv_freq = metal::exp2(-(static_cast<float>(pair) / static_cast<float>(HALF)) * params[1]);
            const float theta = position * inv_freq;
            const float cosine = metal::precise::cos(theta);
            const float sine = metal::precise::sin(theta);
            const float x1 = normed[warp][pair];
            const float x2 = normed[warp][pair + HALF];
            const float rotated = d < HALF ? x1 * cosine - x2 * sine : x1 * sine + x2 * cosine;
            if (is_query) {
                queries[source + d] = rotated;
            } else {
                keys[source + d] = rotated;
            }
        }
    }
"""

_NORM_ROPE_INPUTS = ["q_rows", "k_rows", "q_scale", "k_scale", "at_position", "params"]
# Warps per block of the norm-and-rotate kernel (one per head).
NORM_WARPS = 4


def norm_rope_ops(
    q_rows: mx.array,
    k_rows: mx.array,
    q_scale: mx.array,
    k_scale: mx.array,
    offset: mx.array,
    *,
    query_heads: int,
    kv_heads: int,
    eps: float,
    base: float,
) -> tuple[mx.array, mx.array]:
    """The TTS attention's query and key heads for one position, as the reference computes them: rows
    (B, H·D) split into heads (B, H, 1, D), RMS-normalized with the scales ``q_scale``/``k_scale`` (the
    Gemma norms' ``1 + w``) and rotated by RoPE at ``offset`` (a scalar int32 array). The kernel's fallback."""
    batch = q_rows.shape[0]
    queries = q_rows.reshape(batch, -1, query_heads, q_scale.shape[0]).transpose(0, 2, 1, 3)
    keys = k_rows.reshape(batch, -1, kv_heads, k_scale.shape[0]).transpose(0, 2, 1, 3)
    queries = mx.fast.rms_norm(queries, q_scale, eps)
    keys = mx.fast.rms_norm(keys, k_scale, eps)
    dims = q_scale.shape[0]
    return (
        mx.fast.rope(queries, dims, traditional=False, base=base, scale=1.0, offset=offset),
        mx.fast.rope(keys, dims, traditional=False, base=base, scale=1.0, offset=offset),
    )


class NormRope:
    """The query and key heads of one TTS attention step as one kernel, on CUDA or Metal (float32 rows).

    One warp per (row, head) sums the squares, scales, and rotates each pair ``(i, i + D/2)`` by the
    angle ``offset · 2^(−i/(D/2)·log2 base)`` — MLX's own RoPE formula, so the angles match its kernel's.
    """

    def __init__(self, backend: str, query_heads: int, kv_heads: int, head_dim: int, eps: float, base: float) -> None:
        import numpy as np

        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head size, not {head_dim}")
        self.query_heads, self.kv_heads, self.head_dim = query_heads, kv_heads, head_dim
        # eps and log2(base): MLX passes log2(base) to its RoPE kernel as a float32 computed from a float32 base.
        # :meth:`DecodeAttention.attend_heads` reads the same parameters.
        self.params = kernel_constants(eps, float(np.log2(np.float32(base))))
        self._kernel = custom_kernel(
            backend,
            "parley_norm_rope",
            _NORM_ROPE_INPUTS,
            ["queries", "keys"],
            cuda=_NORM_ROPE_CUDA,
            metal=_NORM_ROPE_METAL,
        )

    def __call__(
        self, q_rows: mx.array, k_rows: mx.array, q_scale: mx.array, k_scale: mx.array, offset: mx.array
    ) -> tuple[mx.array, mx.array]:
        batch = q_rows.shape[0]
        warps = batch * (self.query_heads + self.kv_heads)
        queries, keys = self._kernel(
            inputs=[q_rows, k_rows, q_scale, k_scale, offset, self.params],
            template=[
                ("HQ", self.query_heads),
                ("HKV", self.kv_heads),
                ("D", self.head_dim),
                ("NORM_WARPS", NORM_WARPS),
                ("ST", q_scale.dtype),
            ],
            grid=(-(-warps // NORM_WARPS) * NORM_WARPS * 32, 1, 1),
            threadgroup=(NORM_WARPS * 32, 1, 1),
            output_shapes=[(batch, self.query_heads, 1, self.head_dim), (batch, self.kv_heads, 1, self.head_dim)],
            output_dtypes=[mx.float32, mx.float32],
        )
        return queries, keys


def norm_rope_samples(query_heads: int, kv_heads: int, head_dim: int, scale_dtype: mx.Dtype) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the kernel: two rows at an early and a late position."""
    keys = mx.random.split(mx.random.key(55), 4)
    q_rows = mx.random.normal((2, query_heads * head_dim), key=keys[0])
    k_rows = mx.random.normal((2, kv_heads * head_dim), key=keys[1])
    q_scale = (1.0 + 0.1 * mx.random.normal((head_dim,), key=keys[2])).astype(scale_dtype)
    k_scale = (1.0 + 0.1 * mx.random.normal((head_dim,), key=keys[3])).astype(scale_dtype)
    return [(q_rows, k_rows, q_scale, k_scale, mx.array(position)) for position in (3, 1500)]
