"""Relative-position self-attention as the cache-aware FastConformer runs it: the sinusoidal position table, the
``chunked_limited`` mask of the offline pass, and Transformer-XL attention with learnt content and position biases
(its operations for any number of query rows; :mod:`.fast` holds the kernels for the stream's newest one).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from ...jit import materialize
from ...loading.config import EncoderConfig
from ..fused import Stacked, stack_projections
from ..linear import Linear

Attend = Callable[..., mx.array]

# Additive mask value for attention the chunked_limited context forbids.
_BLOCKED = -1e30


# --------------------------------------------------------------------------- positional table


@functools.lru_cache(maxsize=2)  # the configured size, plus at most one grown table
def _relative_position_table(d_model: int, max_len: int) -> mx.array:
    """Sinusoids for relative positions ``max_len-1 .. -(max_len-1)``: ``(2·max_len-1, d_model)`` float32.

    Even channels hold ``sin(r·w_i)``, odd channels ``cos(r·w_i)`` with
    ``w_i = exp(-2i·ln(10000)/d_model)``. Built once per shape at full size, like the
    reference, so each value comes from the same elementwise kernel call.
    """
    offsets = mx.expand_dims(mx.arange(max_len - 1, -max_len, -1, dtype=mx.int32), axis=1).astype(mx.float32)
    rates = mx.exp(mx.arange(0, d_model, 2, dtype=mx.float32) * -(math.log(10000.0) / d_model))
    angles = offsets * rates
    table = mx.stack([mx.sin(angles), mx.cos(angles)], axis=-1).reshape(2 * max_len - 1, d_model)
    # Evaluated now, op by op as the reference builds it: a compiled stream then reads it as a constant.
    mx.eval(table)
    return table


def relative_positions(config: EncoderConfig, length: int, dtype: mx.Dtype) -> mx.array:
    """Position rows for a key window of ``length`` frames: ``(2·length-1, d_model)``.

    Row r holds the relative offset ``length-1-r``. Tables longer than ``pos_emb_max_len``
    are built on demand (``length + 1``), as the reference grows its table.
    """
    max_len = config.pos_emb_max_len if length <= config.pos_emb_max_len else length + 1
    table = _relative_position_table(config.d_model, max_len)
    centre = table.shape[0] // 2
    return table[centre - (length - 1) : centre + length].astype(dtype)


def chunked_limited_mask(length: int, left_context: int, right_context: int, dtype: mx.Dtype) -> mx.array:
    """Additive ``(1, 1, T, T)`` mask: chunks of ``right+1`` frames, each seeing itself and ``left // chunk`` before."""
    chunk = right_context + 1
    chunks_back = left_context // chunk if left_context >= 0 else 10**8
    chunk_of = mx.arange(length, dtype=mx.int32) // chunk
    distance = mx.expand_dims(chunk_of, 1) - mx.expand_dims(chunk_of, 0)
    visible = (distance >= 0) & (distance <= chunks_back)
    mask = mx.where(visible, 0.0, _BLOCKED).astype(mx.float32)
    return mask[None, None].astype(dtype)


class RelativePositionAttention(nn.Module):
    """Transformer-XL style multi-head attention with learnt content (u) and position (v) biases.

    ``score(i, j) = [(q_i + u)·k_j + (q_i + v)·p(i - j)] / sqrt(head_dim)``; the
    position term is computed against all relative offsets and aligned by the
    pad-reshape "relative shift", then passed to SDPA as an additive mask.
    """

    def __init__(self, heads: int, d_model: int, bias: bool) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by {heads} heads")
        self.heads = heads
        self.head_dim = d_model // heads
        self.scale = self.head_dim**-0.5
        self.linear_q = Linear(d_model, d_model, bias=bias)
        self.linear_k = Linear(d_model, d_model, bias=bias)
        self.linear_v = Linear(d_model, d_model, bias=bias)
        self.linear_out = Linear(d_model, d_model, bias=bias)
        self.linear_pos = Linear(d_model, d_model, bias=False)
        self.pos_bias_u = mx.zeros((heads, self.head_dim))
        self.pos_bias_v = mx.zeros((heads, self.head_dim))
        self.stacked: Stacked | None = None  # k and v (same input) in one product, after fuse_projections()

    def fuse_projections(self) -> int:
        self.stacked = stack_projections(self, ("linear_k", "linear_v"))
        return int(self.stacked is not None)

    def __call__(
        self,
        queries: mx.array,
        keys: mx.array,
        positions: mx.array,
        mask: mx.array | None = None,
        *,
        projected: bool = False,
        attend: Attend | None = None,
    ) -> mx.array:
        """``queries`` (B, Tq, d) attend to ``keys`` (B, Tk, d); ``positions`` holds 2·Tk-1 offset rows.

        Rows (Tq, d) and (Tk, d) are a batch of one, and give rows back. With ``projected``,
        ``positions`` is already ``linear_pos(positions)`` (it depends only on the key length,
        so a stream can reuse it frame after frame). ``attend``: fast numerics' attention of one float32 query
        row (:attr:`engine.networks.perception.fast.EncoderFast.attention`), in place of :func:`attend_relative`.
        """
        q = self.linear_q(queries)
        if self.stacked is not None:
            k, v = self.stacked(keys)
        else:
            k, v = self.linear_k(keys), self.linear_v(keys)
        p = positions if projected else self.linear_pos(positions)
        one_row = q.ndim == 2 and q.shape[0] == 1 and mask is None  # the stream's newest frame
        if attend is not None and one_row and q.dtype == k.dtype == v.dtype == p.dtype == mx.float32:
            return self.linear_out(attend(q, k, v, p, self.pos_bias_u, self.pos_bias_v, self.scale))
        return self.linear_out(attend_relative(q, k, v, p, self.pos_bias_u, self.pos_bias_v, self.scale, mask))


def attention_window(cached: int, left_context: int) -> tuple[int, int]:
    """For fast numerics' key cache of ``cached`` rows (the window the previous frame attended to): how many of
    its oldest rows the newest frame lets go (one, once the window is full at ``left_context + 1`` rows) and how
    many keys the newest frame attends to."""
    drop = int(cached > left_context)
    return drop, cached - drop + 1


def attend_relative_window(
    q: mx.array,
    key_history: mx.array,
    new_key: mx.array,
    value_history: mx.array,
    new_value: mx.array,
    p: mx.array,
    bias_u: mx.array,
    bias_v: mx.array,
    scale: float,
    drop: int,
) -> tuple[mx.array, mx.array, mx.array]:
    """One query row's :func:`attend_relative` over the window of the cached key and value rows from row
    ``drop`` on and the newest row; returns the mixed values and that window (the next frame's cache)."""
    keys = mx.concatenate([key_history[drop:] if drop else key_history, new_key])
    values = mx.concatenate([value_history[drop:] if drop else value_history, new_value])
    return attend_relative(q, keys, values, p, bias_u, bias_v, scale), keys, values


def _relative_shift(scores: mx.array) -> mx.array:
    """Re-index ``(B, H, Tq, P)`` scores from absolute offset columns to key columns."""
    batch, heads, queries, offsets = scores.shape
    shifted = mx.pad(scores, [(0, 0), (0, 0), (0, 0), (1, 0)])
    shifted = shifted.reshape(batch, heads, offsets + 1, queries)[:, :, 1:, :]
    return shifted.reshape(batch, heads, queries, offsets)


def attend_relative(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    p: mx.array,
    bias_u: mx.array,
    bias_v: mx.array,
    scale: float,
    mask: mx.array | None = None,
) -> mx.array:
    """Relative-position attention after the projections: ``q`` (B, Tq, d) over ``k``/``v`` (B, Tk, d) with
    the projected position rows ``p`` (2·Tk-1, d) and the biases (H, hd); rows (Tq, d) and (Tk, d) are a batch
    of one and give rows back. Returns the heads' mixed values merged (before the output projection)."""
    heads, head_dim = bias_u.shape
    rows = q.ndim == 2
    batch = 1 if rows else q.shape[0]
    query_len, key_len = q.shape[-2], k.shape[-2]

    q = q.reshape(batch, query_len, heads, head_dim)
    q_content = (q + bias_u).transpose(0, 2, 1, 3)
    q_position = (q + bias_v).transpose(0, 2, 1, 3)
    k = k.reshape(batch, key_len, heads, head_dim).transpose(0, 2, 1, 3)
    v = v.reshape(batch, key_len, heads, head_dim).transpose(0, 2, 1, 3)
    p = p.reshape(1, -1, heads, head_dim).transpose(0, 2, 1, 3)

    position_scores = _relative_shift(mx.matmul(q_position, p.swapaxes(-2, -1)))
    # Stored before SDPA adds it to the content scores (its fallback does, outside the fused kernel).
    position_scores = materialize(position_scores[:, :, :, :key_len] * scale)
    if mask is not None:
        position_scores = position_scores + mask
    attended = mx.fast.scaled_dot_product_attention(q_content, k, v, scale=scale, mask=position_scores)
    merged = attended.transpose(0, 2, 1, 3)
    return merged.reshape(query_len, -1) if rows else merged.reshape(batch, query_len, -1)
