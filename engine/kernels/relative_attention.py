"""The encoder's relative-position attention for one query row, as one kernel (fast numerics).

:class:`RelativeDecodeAttention` scores every key of the encoder's short window with ``(q+u)·k + (q+v)·p``,
softmaxes online and mixes the values, one block per head; its window form also writes the next frame's key
and value window. Its fallbacks are :func:`engine.networks.encoder.attend_relative` and
:func:`engine.networks.encoder.attend_relative_window`.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .admission import custom_kernel, kernel_constants
from .warp_merge import warps_merged_cuda, warps_merged_metal

# One query row over a key window, relative positions: ``@COUNT@`` keys, key/value j read by ``@KEY@`` /
# ``@VALUE@`` and passed on by ``@KEEP_KEY@`` / ``@KEEP_VALUE@`` (the window form writes the window out).
_RELATIVE_CUDA_TEMPLATE = (
    """
    constexpr int PER_LANE = (HD + 31) / 32;
    constexpr int WIDTH = H * HD;
    __shared__ float warp_max[WARPS];
    __shared__ float warp_sum[WARPS];
    __shared__ float warp_acc[WARPS * HD];
    const int head = blockIdx.x;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int count = @COUNT@;
    float content_query[PER_LANE];
    float position_query[PER_LANE];
    float acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        const int column = head * HD + d;
        content_query[i] = d < HD ? query[column] + static_cast<float>(bias_u[column]) : 0.0f;
        position_query[i] = d < HD ? query[column] + static_cast<float>(bias_v[column]) : 0.0f;
        acc[i] = 0.0f;
    }
    // Read once: a one-float array lives where MLX's CUDA allocator puts arrays of 8 bytes or less, in unified
    // memory on the host, and the loop's stores (the window form's) would have it read again every key.
    const float score_scale = scale[0];
    float running_max = -__int_as_float(0x7f800000);  // -infinity
    float running_sum = 0.0f;
    for (int j = warp; j < count; j += WARPS) {
        float score = 0.0f;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = lane + 32 * i;
            const size_t at = static_cast<size_t>(j) * WIDTH + head * HD + d;
            if (d < HD) {
                const float key = @KEY@;
                score += content_query[i] * key + position_query[i] * positions[at];
                @KEEP_KEY@
            }
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            score += __shfl_xor_sync(0xffffffff, score, offset);
        }
        score *= score_scale;
        const float new_max = fmaxf(running_max, score);
        const float rescale = expf(running_max - new_max);
        const float weight = expf(score - new_max);
        running_sum = running_sum * rescale + weight;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = lane + 32 * i;
            const size_t at = static_cast<size_t>(j) * WIDTH + head * HD + d;
            if (d < HD) {
                const float value = @VALUE@;
                acc[i] = acc[i] * rescale + weight * value;
                @KEEP_VALUE@
            }
        }
        running_max = new_max;
    }
"""
    + warps_merged_cuda("HD")
    + """        out[head * HD + d] = mixed / total;
    }
"""
)

_RELATIVE_METAL_TEMPLATE = (
    """
    constexpr int PER_LANE = (HD + 31) / 32;
    constexpr int WIDTH = H * HD;
    threadgroup float warp_max[WARPS];
    threadgroup float warp_sum[WARPS];
    threadgroup float warp_acc[WARPS * HD];
    const int head = int(threadgroup_position_in_grid.x);
    const uint local = thread_position_in_threadgroup.x;
    const uint warp = simdgroup_index_in_threadgroup;
    const uint lane = thread_index_in_simdgroup;
    const int count = @COUNT@;
    float content_query[PER_LANE];
    float position_query[PER_LANE];
    float acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = int(lane) + 32 * i;
        const int column = head * HD + d;
        content_query[i] = d < HD ? query[column] + static_cast<float>(bias_u[column]) : 0.0f;
        position_query[i] = d < HD ? query[column] + static_cast<float>(bias_v[column]) : 0.0f;
        acc[i] = 0.0f;
    }
    const float score_scale = scale[0];
    float running_max = -INFINITY;
    float running_sum = 0.0f;
    for (int j = int(warp); j < count; j += WARPS) {
        float score = 0.0f;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = int(lane) + 32 * i;
            const uint at = uint(j) * WIDTH + uint(head * HD + d);
            if (d < HD) {
                const float key = @KEY@;
                score += content_query[i] * key + position_query[i] * positions[at];
                @KEEP_KEY@
            }
        }
        score = metal::simd_sum(score) * score_scale;
        const float new_max = metal::max(running_max, score);
        const float rescale = metal::exp(running_max - new_max);
        const float weight = metal::exp(score - new_max);
        running_sum = running_sum * rescale + weight;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = int(lane) + 32 * i;
            const uint at = uint(j) * WIDTH + uint(head * HD + d);
            if (d < HD) {
                const float value = @VALUE@;
                acc[i] = acc[i] * rescale + weight * value;
                @KEEP_VALUE@
            }
        }
        running_max = new_max;
    }
"""
    + warps_merged_metal("HD")
    + """        out[uint(head * HD) + local] = mixed / total;
    }
"""
)


def _relative_source(template: str, window: bool) -> str:
    """The relative attention kernel over given keys and values, or (``window``) over a window made of the
    cached ``key_history``/``value_history`` rows from row ``DROP`` on and the newest ``new_key``/``new_value``
    row, which it also writes out as ``next_keys``/``next_values`` (the next frame's cache)."""
    if not window:
        parts = {"@COUNT@": "keys_shape[0]", "@KEY@": "keys[at]", "@VALUE@": "values[at]"}
        parts.update({"@KEEP_KEY@": "", "@KEEP_VALUE@": ""})
    else:
        newest = "j == count - 1 ? new_{0}[at - static_cast<size_t>(j) * WIDTH] : {0}_history[at + DROP * WIDTH]"
        parts = {
            "@COUNT@": "key_history_shape[0] - DROP + 1",
            "@KEY@": newest.format("key"),
            "@VALUE@": newest.format("value"),
            "@KEEP_KEY@": "next_keys[at] = key;",
            "@KEEP_VALUE@": "next_values[at] = value;",
        }
    for placeholder, text in parts.items():
        template = template.replace(placeholder, text)
    return template


_RELATIVE_CUDA = _relative_source(_RELATIVE_CUDA_TEMPLATE, window=False)
_RELATIVE_METAL = _relative_source(_RELATIVE_METAL_TEMPLATE, window=False)
_RELATIVE_WINDOW_CUDA = _relative_source(_RELATIVE_CUDA_TEMPLATE, window=True)
_RELATIVE_WINDOW_METAL = _relative_source(_RELATIVE_METAL_TEMPLATE, window=True)

_RELATIVE_INPUTS = ["query", "keys", "values", "positions", "bias_u", "bias_v", "scale"]
_RELATIVE_WINDOW_INPUTS = [
    "query",
    "key_history",
    "new_key",
    "value_history",
    "new_value",
    "positions",
    "bias_u",
    "bias_v",
    "scale",
]
# Warps per head for the encoder's short key window (at most 71 keys): on the H200 a window took 19.5 µs a call
# at 16 against 36.5 at 4, and 32 gained under a microsecond more with twice the threads (docs/numerics.md, "Encoder").
RELATIVE_WARPS = 16


class RelativeDecodeAttention:
    """One query row of the encoder's relative-position attention as one kernel, on CUDA or Metal (float32
    rows; the biases float32 or bf16). Each head's block scores every key with ``(q+u)·k + (q+v)·p`` (the
    content and position terms summed together, then scaled), softmaxes online and mixes the values.

    Inputs as :func:`engine.networks.encoder.attend_relative`, its fallback: one query row (1, H·hd), key and value
    rows (T, H·hd), the projected relative-position rows (2T−1, H·hd) of which row j belongs to key j for
    the newest query (the relative shift leaves a single query's scores in place), the biases (H, hd)."""

    def __init__(self, backend: str, heads: int, head_dim: int, warps: int = RELATIVE_WARPS) -> None:
        if head_dim > 32 * warps:
            raise ValueError(f"head size {head_dim} exceeds the kernel's {32 * warps} threads per head")
        self.heads, self.head_dim, self.warps = heads, head_dim, warps
        self._scales: dict[float, mx.array] = {}
        self._kernel = custom_kernel(
            backend,
            "parley_relative_attention",
            _RELATIVE_INPUTS,
            ["out"],
            cuda=_RELATIVE_CUDA,
            metal=_RELATIVE_METAL,
        )
        self._window_kernel = custom_kernel(
            backend,
            "parley_relative_attention_window",
            _RELATIVE_WINDOW_INPUTS,
            ["out", "next_keys", "next_values"],
            cuda=_RELATIVE_WINDOW_CUDA,
            metal=_RELATIVE_WINDOW_METAL,
        )

    def __call__(
        self,
        query: mx.array,
        keys: mx.array,
        values: mx.array,
        positions: mx.array,
        bias_u: mx.array,
        bias_v: mx.array,
        scale: float,
    ) -> mx.array:
        threads = 32 * self.warps
        (out,) = self._kernel(
            inputs=[query, keys, values, positions, bias_u, bias_v, self._scale(scale)],
            template=[("H", self.heads), ("HD", self.head_dim), ("WARPS", self.warps), ("BT", bias_u.dtype)],
            grid=(self.heads * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[(1, self.heads * self.head_dim)],
            output_dtypes=[mx.float32],
        )
        return out

    def window(
        self,
        query: mx.array,
        key_history: mx.array,
        new_key: mx.array,
        value_history: mx.array,
        new_value: mx.array,
        positions: mx.array,
        bias_u: mx.array,
        bias_v: mx.array,
        scale: float,
        drop: int,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:func:`engine.networks.encoder.attend_relative_window`'s result: the attention over the cached rows from
        ``drop`` on and the newest row, and that window of keys and values (written as they are read)."""
        threads = 32 * self.warps
        count = key_history.shape[0] - drop + 1
        width = self.heads * self.head_dim
        inputs = [query, key_history, new_key, value_history, new_value, positions, bias_u, bias_v]
        out, next_keys, next_values = self._window_kernel(
            inputs=[*inputs, self._scale(scale)],
            template=[
                ("H", self.heads),
                ("HD", self.head_dim),
                ("WARPS", self.warps),
                ("BT", bias_u.dtype),
                ("DROP", drop),
            ],
            grid=(self.heads * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[(1, width), (count, width), (count, width)],
            output_dtypes=[mx.float32] * 3,
        )
        return out, next_keys, next_values

    def _scale(self, scale: float) -> mx.array:
        if scale not in self._scales:
            self._scales[scale] = kernel_constants(scale)
        return self._scales[scale]


def relative_window_samples(heads: int, head_dim: int, bias_dtype: mx.Dtype = mx.float32) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the window kernel: a full window (71 cached rows, the oldest dropped) and a
    filling one (8 cached rows, none dropped), each with the newest row apart."""
    samples: list[tuple[Any, ...]] = []
    for query, keys, values, positions, bias_u, bias_v, scale in relative_attention_samples(
        heads, head_dim, bias_dtype
    ):
        drop = 1 if keys.shape[0] == 71 else 0
        extra = mx.random.normal((drop, keys.shape[1]), key=mx.random.key(7))
        key_history = mx.concatenate([extra, keys[:-1]]) if drop else keys[:-1]
        value_history = mx.concatenate([-extra, values[:-1]]) if drop else values[:-1]
        samples.append(
            (query, key_history, keys[-1:], value_history, values[-1:], positions, bias_u, bias_v, scale, drop)
        )
    return samples


def relative_attention_samples(heads: int, head_dim: int, bias_dtype: mx.Dtype = mx.float32) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the kernel: a full window of 71 keys and a filling one of 9 (the biases in
    ``bias_dtype``, as the model stores them)."""
    width = heads * head_dim
    samples: list[tuple[Any, ...]] = []
    for count in (71, 9):
        keys = mx.random.split(mx.random.key(97 + count), 6)
        samples.append(
            (
                mx.random.normal((1, width), key=keys[0]),
                mx.random.normal((count, width), key=keys[1]),
                mx.random.normal((count, width), key=keys[2]),
                mx.random.normal((2 * count - 1, width), key=keys[3]),
                (0.1 * mx.random.normal((heads, head_dim), key=keys[4])).astype(bias_dtype),
                (0.1 * mx.random.normal((heads, head_dim), key=keys[5])).astype(bias_dtype),
                head_dim**-0.5,
            )
        )
    return samples
