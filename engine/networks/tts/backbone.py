"""EAR-TTS's Gemma-3 backbone: one guided position (two rows) a step over per-layer attention caches.

Fast numerics' forms (row products, the attention kernels, the traced step) are chosen by
:meth:`engine.networks.tts.EarTTS.use_numerics` (:mod:`.fast`) and kept in the layers' slots.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ...jit import compile_enabled, jit
from ...kernels.decode_attention import DecodeAttention, decode_attention_ops
from ...kernels.norm_rope import NormRope, norm_rope_ops
from ...kernels.row_chain import ChainBook, Link, RowCall, RowSequence, find_runs
from ...kernels.row_product import RowProductShape
from ...loading.config import TTSConfig
from ...ops.cache import AttentionMask, PositionLayout, causal_mask, stored
from ..fused import Stacked, stack_projections
from ..linear import Linear
from .state import LayerCache
from .subword import GeluGatedMLP

# Rows of a guided backbone step: the text-conditioned one, then the one conditioned on ``null_emb``.
GUIDED_ROWS = 2

# --------------------------------------------------------------------------- Gemma-3 backbone


class GemmaRMSNorm(nn.Module):
    """Gemma RMSNorm with ``1 + w`` formed in the weight dtype (bf16-rounded), as the reference backbone does."""

    def __init__(self, dims: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


@dataclass(frozen=True, eq=False)
class AttentionParts:
    """A backbone attention's fast numerics parts: one position's attention over the cache buffer as one kernel
    (``attention``), and the query and key heads normed and rotated as one kernel (``heads``), or their fallbacks
    (engine.kernels.decode_attention); where the attention kernel writes the cache it may also norm and rotate the
    heads itself (``heads_in_attention``: CUDA, DecodeAttention.attend_heads, admitted per RoPE base), and the traced
    step then launches no heads. ``cache_dtype``: what the layer's cache stores keys and values in (None: the
    reference's, the keys' own float32), which EarTTS.make_cache gives the caches it makes."""

    attention: Callable[..., mx.array]
    heads: Callable[..., tuple[mx.array, mx.array]] | None = None
    heads_in_attention: bool = False
    cache_dtype: mx.Dtype | None = None


class BackboneAttention(nn.Module):
    """Causal self-attention with q/k norms and RoPE (local or global base)."""

    def __init__(self, config: TTSConfig, is_global: bool) -> None:
        super().__init__()
        width, head_dim = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.scale = config.query_pre_attn_scalar**-0.5
        self.q_proj = Linear(width, self.num_heads * head_dim, bias=False)
        self.k_proj = Linear(width, self.num_kv_heads * head_dim, bias=False)
        self.v_proj = Linear(width, self.num_kv_heads * head_dim, bias=False)
        self.o_proj = Linear(self.num_heads * head_dim, width, bias=False)
        self.q_norm = GemmaRMSNorm(head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(head_dim, config.rms_norm_eps)
        base = config.rope_global_base_freq if is_global else config.rope_local_base_freq
        self.rope = nn.RoPE(head_dim, traditional=False, base=base)
        self.stacked: Stacked | None = None  # q, k and v in one product, after fuse_projections()
        # Fast numerics' parts (AttentionParts, given by engine.networks.tts.fast), or None: exact mode.
        self.fast: AttentionParts | None = None

    def fuse_projections(self) -> int:
        self.stacked = stack_projections(self, ("q_proj", "k_proj", "v_proj"))
        return int(self.stacked is not None)

    def _heads(self, x: mx.array, heads: int) -> mx.array:
        """(B, L, heads·D), or (B, heads·D) for one position, → (B, heads, L, D)."""
        return x.reshape(x.shape[0], -1, heads, self.head_dim).transpose(0, 2, 1, 3)

    def projections(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The q, k and v projections of ``x`` (one stacked product on the CPU)."""
        if self.stacked is not None:
            q, k, v = self.stacked(x)
            return q, k, v
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def project(self, x: mx.array, position: int | mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Normed, rotated queries and keys and the values of ``x`` (B, L, H), or (B, H) for one position,
        at ``position``."""
        q, k, v = self.projections(x)
        queries = self.q_norm(self._heads(q, self.num_heads))
        keys = self.k_norm(self._heads(k, self.num_kv_heads))
        values = self._heads(v, self.num_kv_heads)
        # MLX's RoPE annotates ``offset`` as int; mx.fast.rope, which it calls, takes a scalar array too.
        return self.rope(queries, offset=position), self.rope(keys, offset=position), values  # type: ignore[arg-type]

    def attend(
        self, queries: mx.array, keys: mx.array, values: mx.array, mask: AttentionMask, cache: LayerCache | None
    ) -> mx.array:
        """Store the new keys/values and attend over the cache: (B, heads, L, D) mixed values."""
        if cache is not None:
            keys, values = cache.update(keys, values)
        if isinstance(mask, mx.array) and mask.shape[-1] != keys.shape[2]:
            mask = mask[..., -keys.shape[2] :]
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)

    def project_fast(self, rows: mx.array, position: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """:meth:`project` for one position's rows (B, H) through the fast heads (:attr:`AttentionParts.heads`):
        the queries and keys normed and rotated together, the values a view of their rows."""
        assert self.fast is not None and self.fast.heads is not None
        q, k, v = self.projections(rows)
        queries, keys = self.heads(q, k, position)
        return queries, keys, v.reshape(v.shape[0], self.num_kv_heads, 1, self.head_dim)

    def heads(self, q: mx.array, k: mx.array, position: mx.array) -> tuple[mx.array, mx.array]:
        """One position's query and key rows (B, H·D) as normed, rotated heads (B, heads, 1, D): through
        the fast heads (:attr:`AttentionParts.heads`) where they read them (float32), else the reference's
        operations."""
        q_scale, k_scale = self._norm_scales()
        fast_heads = None if self.fast is None else self.fast.heads
        heads = fast_heads if fast_heads is not None and q.dtype == k.dtype == mx.float32 else self._heads_ops
        return heads(q, k, q_scale, k_scale, position)

    def _heads_ops(
        self, q: mx.array, k: mx.array, q_scale: mx.array, k_scale: mx.array, position: mx.array
    ) -> tuple[mx.array, mx.array]:
        return norm_rope_ops(
            q,
            k,
            q_scale,
            k_scale,
            position,
            query_heads=self.num_heads,
            kv_heads=self.num_kv_heads,
            eps=self.q_norm.eps,
            base=self.rope.base,
        )

    def _norm_scales(self) -> tuple[mx.array, mx.array]:
        """The q and k norms' ``1 + w`` (formed in the weight dtype, as :class:`GemmaRMSNorm` does), made once
        per set of weights rather than in every step."""
        weights = (self.q_norm.weight, self.k_norm.weight)
        stored = self._scale_store.get("scales")
        if stored is None or stored[0] is not weights[0] or stored[1] is not weights[1]:
            scales = (1.0 + weights[0], 1.0 + weights[1])
            mx.eval(scales)
            stored = (*weights, *scales)
            self._scale_store["scales"] = stored
        return stored[2], stored[3]

    @functools.cached_property
    def _scale_store(self) -> dict[str, tuple[mx.array, mx.array, mx.array, mx.array]]:
        return {}  # in the instance __dict__, outside the parameter tree

    def attend_head_rows(
        self, q: mx.array, k: mx.array, values: mx.array, position: mx.array, cache: LayerCache
    ) -> mx.array:
        """:meth:`attend_rows` from the q and k projections' rows, made heads first (:meth:`heads`)."""
        queries, keys = self.heads(q, k, position)
        return self.attend_rows(queries, keys, values, cache)

    def attend_rows(self, queries: mx.array, keys: mx.array, values: mx.array, cache: LayerCache) -> mx.array:
        """Fast numerics' single-position attention: store the new keys/values and return the mixed values
        as rows (B, heads·D), through :attr:`AttentionParts.attention` (see :mod:`engine.kernels.decode_attention`)."""
        assert self.fast is not None
        key_buffer, value_buffer, filled = cache.store(keys, values)
        attention = self._attention_by_count(key_buffer.dtype, value_buffer.dtype)
        return attention(queries, key_buffer, value_buffer, filled, self.scale)

    def kernel_reads(self, key_dtype: mx.Dtype, value_dtype: mx.Dtype) -> bool:
        """Whether the attention kernel reads buffers of these dtypes: those it was admitted for, the dtype the
        cache stores (float32 where the cache keeps the keys' own)."""
        if self.fast is None:
            return False
        wanted = self.fast.cache_dtype or mx.float32
        return isinstance(self.fast.attention, DecodeAttention) and key_dtype == value_dtype == wanted

    def _attention_by_count(self, key_dtype: mx.Dtype, value_dtype: mx.Dtype) -> Callable[..., mx.array]:
        """:attr:`AttentionParts.attention`, or its fallback where the kernel does not read these buffers."""
        assert self.fast is not None
        if isinstance(self.fast.attention, DecodeAttention) and not self.kernel_reads(key_dtype, value_dtype):
            return decode_attention_ops
        return self.fast.attention

    def attend_slot(
        self,
        key_buffer: mx.array,
        value_buffer: mx.array,
        slot: BufferSlot,
        written: list[tuple[mx.array, mx.array] | None],
        q: mx.array,
        k: mx.array,
        values: mx.array,
        position: mx.array,
    ) -> mx.array:
        """:meth:`attend_head_rows` inside a traced step: the position is written at ``slot.index`` (an array, so
        each frame's slot needs no retrace), the written buffers appended to ``written``.

        The write is a scatter along the positions axis, not ``mx.slice_update`` at an array start: MLX 0.32's
        CUDA kernel for the latter launches a thread per element of the whole buffer, each rewriting one of
        the update's (the same values, so the same result), which took 118 µs a write over 7,300 cached
        positions (6.6 ms a frame) where the scatter launches one per element of the update. In place either
        way when the buffer can be donated (the program's graph holds the only other reference). Where the
        attention kernel writes the position itself (``slot.index`` None, :meth:`DecodeAttention.attend_writing`)
        there is no scatter, and None is appended: the cache keeps its buffers, written; with
        :attr:`AttentionParts.heads_in_attention` that kernel also makes the heads
        (:meth:`DecodeAttention.attend_heads`)."""
        fast = self.fast
        assert fast is not None
        if slot.index is None:
            assert isinstance(fast.attention, DecodeAttention) and slot.bounds is not None
            written.append(None)
            if fast.heads_in_attention:
                assert isinstance(fast.heads, NormRope)
                q_scale, k_scale = self._norm_scales()
                return fast.attention.attend_heads(
                    q,
                    k,
                    values,
                    q_scale,
                    k_scale,
                    position,
                    fast.heads.params,
                    key_buffer,
                    value_buffer,
                    slot.bounds,
                    slot.splits,
                    self.scale,
                )
            queries, keys = self.heads(q, k, position)
            return fast.attention.attend_writing(
                queries, keys, values, key_buffer, value_buffer, slot.bounds, slot.splits, self.scale
            )
        queries, keys = self.heads(q, k, position)
        key_buffer = mx.put_along_axis(key_buffer, slot.index, stored(keys, key_buffer.dtype), axis=2)
        value_buffer = mx.put_along_axis(value_buffer, slot.index, stored(values, value_buffer.dtype), axis=2)
        written.append((key_buffer, value_buffer))
        if slot.bounds is not None:
            assert isinstance(fast.attention, DecodeAttention)
            return fast.attention.attend_bounded(
                queries, key_buffer, value_buffer, slot.bounds, slot.splits, self.scale
            )
        assert slot.count is not None
        attention = self._attention_by_count(key_buffer.dtype, value_buffer.dtype)
        return attention(queries, key_buffer, value_buffer, slot.count, self.scale)

    def output(self, mixed: mx.array, rows: bool = False) -> mx.array:
        """(B, heads, L, D) mixed values → (B, L, H); with ``rows`` (one position) → (B, H)."""
        batch, _, length, _ = mixed.shape
        merged = mixed.transpose(0, 2, 1, 3)
        return self.o_proj(merged.reshape(batch, -1) if rows else merged.reshape(batch, length, -1))

    def __call__(self, x: mx.array, mask: AttentionMask, cache: LayerCache | None) -> mx.array:
        queries, keys, values = self.project(x, cache.offset if cache is not None else 0)
        return self.output(self.attend(queries, keys, values, mask, cache))


@dataclass(frozen=True)
class LayerRowParts:
    """A backbone layer's dense sublayers for ``rows`` rows, as :class:`engine.kernels.row_product.RowProduct` kernels
    or :func:`engine.kernels.row_product.row_product_ops` (same call signature)."""

    rows: int
    first_qkv: Callable[..., tuple[mx.array, ...]]  # input norm, q/k/v (the first layer; v split into heads)
    qkv: Callable[..., tuple[mx.array, ...]]  # the previous layer's post-norm and add, input norm, q/k/v
    output: Callable[..., tuple[mx.array, ...]]  # o_proj
    gate_up: Callable[..., tuple[mx.array, ...]]  # post-attention norm and add, pre-MLP norm, gelu(gate)·up
    down: Callable[..., tuple[mx.array, ...]]  # down_proj
    # Each part's name and shape (what a chain of them is built from, engine.kernels.row_chain).
    shapes: tuple[tuple[str, RowProductShape], ...] = ()


@dataclass(frozen=True)
class LayerRowWeights:
    """What :class:`LayerRowParts` read of one layer."""

    qkv: tuple[mx.array, mx.array, mx.array]
    output: mx.array
    gate_up: tuple[mx.array, mx.array]
    down: mx.array
    input_scale: mx.array
    post_attention_scale: mx.array
    pre_feedforward_scale: mx.array
    post_feedforward_scale: mx.array

    def arrays(self) -> list[mx.array]:
        return [
            *self.qkv,
            self.output,
            *self.gate_up,
            self.down,
            self.input_scale,
            self.post_attention_scale,
            self.pre_feedforward_scale,
            self.post_feedforward_scale,
        ]


@dataclass(frozen=True)
class BufferSlot:
    """Where a traced backbone step writes the new position in one kind of layer's cache buffers (every cache of
    a kind has seen the same positions), and how many positions attention then reads."""

    # The slot, int32: an input of the traced step shaped (1, 1, 1, 1), which the step broadcasts once to a
    # position's keys shape (batch, heads, 1, head size) for the layers' writes (BackboneAttention.attend_slot);
    # None where the attention kernel writes the position itself (the slot is then in ``bounds``).
    index: mx.array | None
    bounds: (
        mx.array | None
    )  # the attention kernel's view of the filled count (engine.kernels.decode_attention), or None
    splits: int  # the kernel's blocks per head for that count: the launch's shape, part of the trace's key
    count: int | None  # the filled count where the fallback reads it (slicing, so part of the key), else None

    def arrays(self) -> list[mx.array]:
        """The traced step's inputs for this slot, in order."""
        return [array for array in (self.index, self.bounds) if array is not None]

    def key(self, capacity: int) -> tuple[int, int, int | None, bool]:
        """What a trace of this slot depends on besides the arrays' values."""
        return capacity, self.splits, self.count, self.index is None


@dataclass(frozen=True)
class LayerRowsPending:
    """A layer's last sublayer output, not yet post-normed (``scale`` is that norm's ``1 + w``) and added; the
    output as a link into the step's :class:`engine.kernels.row_chain.RowSequence`."""

    output: mx.array | Link
    scale: mx.array


class BackboneLayer(nn.Module):
    """Gemma-3 decoder layer: normed attention and MLP sublayers with post-norms."""

    def __init__(self, config: TTSConfig, is_global: bool) -> None:
        super().__init__()
        width, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = BackboneAttention(config, is_global)
        self.mlp = GeluGatedMLP(width, config.intermediate_size)
        self.input_layernorm = GemmaRMSNorm(width, eps)
        self.post_attention_layernorm = GemmaRMSNorm(width, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(width, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(width, eps)
        # Fast numerics: the dense sublayers as row-product calls and the weights they read (step_rows).
        self.rows: LayerRowParts | None = None
        self.row_weights: LayerRowWeights | None = None

    def projection_layers(self) -> tuple[Linear, ...]:
        """q, k, v, o, gate, up and down."""
        attention, mlp = self.self_attn, self.mlp
        return (
            attention.q_proj,
            attention.k_proj,
            attention.v_proj,
            attention.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        )

    def make_row_weights(self, weight_dtype: mx.Dtype | None) -> LayerRowWeights:
        """The weights :meth:`step_rows` reads: the projections (as ``weight_dtype`` copies when given,
        which fast mode's kernels read instead of the float32 copies; made once, see
        :meth:`engine.networks.linear.KeepsCopy.weight_in`) and the norms' ``1 + w``."""
        q, k, v, o, gate, up, down = (linear.weight_in(weight_dtype) for linear in self.projection_layers())
        made = LayerRowWeights(
            qkv=(q, k, v),
            output=o,
            gate_up=(gate, up),
            down=down,
            input_scale=1.0 + self.input_layernorm.weight,
            post_attention_scale=1.0 + self.post_attention_layernorm.weight,
            pre_feedforward_scale=1.0 + self.pre_feedforward_layernorm.weight,
            post_feedforward_scale=1.0 + self.post_feedforward_layernorm.weight,
        )
        mx.eval(made.arrays())
        return made

    def __call__(self, x: mx.array, mask: AttentionMask, cache: LayerCache | None) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), mask, cache))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def _before_attention(self, x: mx.array, position: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return self.self_attn.project(self.input_layernorm(x), position)

    def _after_attention(self, x: mx.array, mixed: mx.array) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn.output(mixed, rows=True))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def _after_attention_rows(self, x: mx.array, mixed_rows: mx.array) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn.o_proj(mixed_rows))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def _before_attention_fast(self, x: mx.array, position: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return self.self_attn.project_fast(self.input_layernorm(x), position)

    @functools.cached_property
    def _compiled(self) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
        return jit(self._before_attention), jit(self._after_attention), jit(self._after_attention_rows)

    @functools.cached_property
    def _compiled_fast_before(self) -> dict[Any, Callable[..., Any]]:
        return {}  # one program per heads kernel in use (a trace holds the one it was traced with)

    def step_rows(
        self,
        sequence: RowSequence,
        hidden: mx.array | Link,
        pending: LayerRowsPending | None,
        attend: Callable[[mx.array, mx.array, mx.array, mx.array], mx.array],
        position: mx.array,
    ) -> tuple[mx.array | Link, LayerRowsPending]:
        """Fast numerics' layer step on rows through :attr:`rows` (row-product kernels, or their fallbacks),
        gathered in ``sequence`` (:class:`engine.kernels.row_chain.RowSequence`), which runs them when the attention
        reads its inputs: on a GPU those from this layer's output projection to the next layer's q/k/v
        projections as one launch where that chain was admitted.

        The layer's last sublayer is left pending: its output projection's result and post-norm scale,
        which the next layer's first kernel normalizes and adds (its prologue) — the same sum the exact
        step forms at the end of this layer. ``hidden`` plus the pending term is the layer's output (both as
        links into ``sequence``). ``attend(q, k, values, position)`` makes the query and key heads, stores
        the position and returns the mixed values as rows (:meth:`BackboneAttention.attend_head_rows` on a
        cache, or :meth:`BackboneAttention.attend_slot`).
        """
        rows, weights = self.rows, self.row_weights
        assert rows is not None and weights is not None
        qkv: Sequence[Link]
        if pending is None:
            qkv = sequence.add("first_qkv", rows.first_qkv, hidden, weights.qkv, norm_scale=weights.input_scale)
        else:
            *qkv, hidden = sequence.add(
                "qkv",
                rows.qkv,
                hidden,
                weights.qkv,
                norm_scale=weights.input_scale,
                residual=pending.output,
                residual_scale=pending.scale,
            )
        q, k, v = sequence.arrays(*qkv)
        mixed = attend(q, k, v, position)  # v comes split into heads; the attend makes q and k heads
        (attended,) = sequence.add("output", rows.output, mixed, (weights.output,))
        gated, hidden = sequence.add(
            "gate_up",
            rows.gate_up,
            hidden,
            weights.gate_up,
            norm_scale=weights.pre_feedforward_scale,
            residual=attended,
            residual_scale=weights.post_attention_scale,
        )
        (down,) = sequence.add("down", rows.down, gated, (weights.down,))
        return hidden, LayerRowsPending(down, weights.post_feedforward_scale)

    def step(self, x: mx.array, cache: LayerCache, position: mx.array) -> mx.array:
        """One position (at ``position``, a scalar array) of the (B, H) rows ``x`` through the layer; the
        parts around the cache read run compiled."""
        before, after, after_rows = self._compiled
        attention = self.self_attn
        fast = attention.fast
        if fast is not None:
            if fast.heads is not None:
                programs = self._compiled_fast_before
                if fast.heads not in programs:
                    programs[fast.heads] = jit(self._before_attention_fast)
                queries, keys, values = programs[fast.heads](x, position)
            else:
                queries, keys, values = before(x, position)
            stepped: mx.array = after_rows(x, attention.attend_rows(queries, keys, values, cache))
            return stepped
        queries, keys, values = before(x, position)
        output: mx.array = after(x, attention.attend(queries, keys, values, None, cache))
        return output


def _slot_index(slot: int) -> mx.array:
    """A traced step's scatter index for ``slot`` (:attr:`BufferSlot.index`)."""
    return mx.array([[[[slot]]]], dtype=mx.int32)


class Backbone(nn.Module):
    """The Gemma-3 text decoder on input embeddings (no token table, no input scaling)."""

    def __init__(self, config: TTSConfig) -> None:
        super().__init__()
        self.window = config.sliding_window
        self.global_layers = tuple(config.is_global_layer(i) for i in range(config.num_hidden_layers))
        self.layers = [BackboneLayer(config, is_global) for is_global in self.global_layers]
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.trace_rows: bool | None = None  # see traces_rows
        # Fast numerics: runs of the layers' row products as one launch each, where admitted (engine.kernels.row_chain).
        self.row_chains = ChainBook()

    def _masks(self, length: int, caches: list[LayerCache] | None) -> tuple[AttentionMask, AttentionMask]:
        """(global mask, sliding mask) for ``length`` new positions."""
        if caches is None:
            full: AttentionMask = None if length == 1 else "causal"
            if length == 1:
                sliding: AttentionMask = None
            elif length > self.window:
                sliding = causal_mask(length, window=self.window)
            else:
                sliding = "causal"
            return full, sliding
        by_kind: dict[bool, LayerCache] = {}
        for is_global, cache in zip(self.global_layers, caches, strict=True):
            by_kind.setdefault(is_global, cache)  # every cache of a kind has seen the same positions
        full = by_kind[True].attention_mask(length) if True in by_kind else None
        sliding = by_kind[False].attention_mask(length) if False in by_kind else None
        return full, sliding

    def __call__(self, x: mx.array, caches: list[LayerCache] | None = None) -> mx.array:
        """(B, L, H) inputs → (B, L, H) final-normed hidden states; ``caches`` None means a fresh causal pass."""
        if caches is not None and x.shape[1] == 1:
            # A single position needs no mask (a sliding cache never holds more than its window). It runs
            # on rows (B, H): a matrix product of a 3-D input is flattened to rows and back around the
            # same kernel, two views per projection.
            position = mx.array(caches[0].offset)
            rows = x.reshape(x.shape[0], -1)
            if self.layers and all(
                layer.rows is not None and layer.rows.rows == rows.shape[0] for layer in self.layers
            ):
                if self.traces_rows():
                    return self._traced_step(rows, caches, position)
                attends = [
                    functools.partial(layer.self_attn.attend_head_rows, cache=cache)
                    for layer, cache in zip(self.layers, caches, strict=True)
                ]
                return self._step_rows(rows, position, attends)
            for layer, cache in zip(self.layers, caches, strict=True):
                rows = layer.step(rows, cache, position)
            return mx.expand_dims(self.norm(rows), 1)
        full_mask, sliding_mask = self._masks(x.shape[1], caches)
        for index, layer in enumerate(self.layers):
            is_global = self.global_layers[index]
            x = layer(x, full_mask if is_global else sliding_mask, None if caches is None else caches[index])
        return self.norm(x)

    def _step_rows(
        self,
        rows: mx.array,
        position: mx.array,
        attends: Sequence[Callable[[mx.array, mx.array, mx.array, mx.array], mx.array]],
    ) -> mx.array:
        """Fast numerics' step of every layer on rows, each attending through its ``attends`` entry."""
        parts = self.layers[0].rows
        assert parts is not None
        sequence = RowSequence(parts.shapes, self.row_chains)
        pending: LayerRowsPending | None = None
        hidden: mx.array | Link = rows
        for layer, attend in zip(self.layers, attends, strict=True):
            hidden, pending = layer.step_rows(sequence, hidden, pending, attend, position)
        assert pending is not None
        rows, output = sequence.arrays(hidden, pending.output)
        rows = rows + self.layers[-1].post_feedforward_layernorm(output)
        return mx.expand_dims(self.norm(rows), 1)

    def row_runs(self) -> dict[tuple[Any, ...], list[RowCall]]:
        """The runs of row products a step gathers, one of each structure with more than one step, as their
        calls on the layers' own weights, random rows and random mixed values (the attention's): what the chains
        are built and admitted for (see :meth:`engine.networks.encoder.FastConformer.row_runs`). Runs one step op by
        op."""
        parts = self.layers[0].rows
        assert parts is not None
        attention = self.layers[0].self_attn
        width = attention.o_proj.weight.shape[1]
        keys = iter(mx.random.split(mx.random.key(97), len(self.layers) + 1))
        rows = mx.random.normal((parts.rows, self.layers[0].input_layernorm.weight.shape[0]), key=next(keys))

        def random_attend(key: mx.array) -> Callable[[mx.array, mx.array, mx.array, mx.array], mx.array]:
            return lambda q, k, v, position: 0.5 * mx.random.normal((parts.rows, width), key=key)

        attends = [random_attend(key) for key in keys]
        return find_runs(self, lambda: self._step_rows(rows, mx.array(0), attends))

    def traces_rows(self) -> bool:
        """Whether fast numerics' step runs as one traced program (:meth:`_traced_step`): when compiling
        and the attention kernel is in use. ``trace_rows`` overrides it (the fallback's attention slices
        the buffers to the filled count, so a trace holds one count: right for a test, a retrace a frame
        in use)."""
        if self.trace_rows is not None:
            return self.trace_rows
        fast = self.layers[0].self_attn.fast
        return compile_enabled() and fast is not None and isinstance(fast.attention, DecodeAttention)

    @functools.cached_property
    def _traced_steps(self) -> dict[Any, Callable[..., Any]]:
        return {}  # (parts in use, each kind's slot key) → the compiled step; a few kept

    def _traced_step(self, rows: mx.array, caches: list[LayerCache], position: mx.array) -> mx.array:
        """:meth:`_step_rows` as one compiled program: its Python and its kernels' launch arguments are
        built once per trace instead of every frame.

        The caches' bookkeeping (growth, slot, filled count) stays here; the program writes the new
        position into each buffer at the slot it is given as an array and returns the written buffers.
        A trace holds the buffers' capacity and the attention kernel's blocks per head, which change
        every :data:`engine.ops.cache.GROWTH_STEP` positions, so a conversation retraces once per 256 frames.
        """
        first = self.layers[0].self_attn
        layout = PositionLayout(
            rows.shape[0], first.num_kv_heads, first.head_dim, first.head_dim, mx.float32, mx.float32
        )
        slots: dict[bool, BufferSlot] = {}
        capacities: dict[bool, int] = {}
        for index, (layer, cache) in enumerate(zip(self.layers, caches, strict=True)):
            slot, filled = cache.reserve(layout)
            kind = self.global_layers[index]
            assert cache.keys is not None and cache.values is not None
            if kind in slots:
                continue
            attention = None if layer.self_attn.fast is None else layer.self_attn.fast.attention
            if isinstance(attention, DecodeAttention) and layer.self_attn.kernel_reads(
                cache.keys.dtype, cache.values.dtype
            ):
                writes = attention.writes_cache  # then the slot rides in the bounds: no index array to make
                slot_index = None if writes else _slot_index(slot)
                bounds = attention.bounds(filled, slot if writes else 0)
                slots[kind] = BufferSlot(slot_index, bounds, attention.splits(filled), None)
            else:
                slots[kind] = BufferSlot(_slot_index(slot), None, 0, filled)
            capacities[kind] = cache.keys.shape[2]
        kinds = sorted(slots)
        # Whether each kind's attention makes its heads (admitted per RoPE base, so per kind of layer).
        fasts = [self.layers[self.global_layers.index(kind)].self_attn.fast for kind in kinds]
        folded = tuple(fast is not None and fast.heads_in_attention for fast in fasts)
        chains = tuple(self.row_chains.chains.values())
        attention = None if first.fast is None else first.fast.attention
        merging = attention.merged_forms if isinstance(attention, DecodeAttention) else None
        heads = None if first.fast is None else first.fast.heads
        parts = (self.layers[0].rows, attention, merging, heads, folded, chains)
        key = (parts, tuple(slots[kind].key(capacities[kind]) for kind in kinds))
        programs = self._traced_steps
        if key not in programs:
            if len(programs) >= 4:
                programs.pop(next(iter(programs)))  # capacities only grow: the oldest trace is done with
            for layer in self.layers:
                layer.self_attn._norm_scales()  # made (and evaluated) outside the trace
            programs[key] = jit(self._step_program(kinds, {kind: slots[kind] for kind in kinds}))
        inputs = [array for kind in kinds for array in slots[kind].arrays()]
        buffers = [cache.keys for cache in caches] + [cache.values for cache in caches]
        outputs = programs[key](rows, position, *inputs, *buffers)
        # Once the caches hold the written buffers, only the program's graph holds the old ones: written in place.
        # Where the attention kernel wrote the position (no index), the caches keep the buffers they gave.
        del buffers
        scattered = [slots[kind].index is not None for kind in self.global_layers]
        key_buffers = iter(outputs[1 : 1 + sum(scattered)])
        value_buffers = iter(outputs[1 + sum(scattered) :])
        for cache, by_scatter in zip(caches, scattered, strict=True):
            assert cache.keys is not None and cache.values is not None
            if by_scatter:
                cache.advance(next(key_buffers), next(value_buffers))
            else:
                cache.advance(cache.keys, cache.values, written_by=outputs[0])
        hidden: mx.array = outputs[0]
        return hidden

    def _step_program(self, kinds: list[bool], traced: dict[bool, BufferSlot]) -> Callable[..., tuple[mx.array, ...]]:
        """The uncompiled step of :meth:`_traced_step`: inputs ``(rows, position, *each kind's slot arrays,
        *key buffers, *value buffers)``; returns ``(hidden, *key buffers, *value buffers)`` of the layers whose
        position it scattered (none where the attention kernel writes it into the buffers given)."""
        layers = len(self.layers)

        def program(rows: mx.array, position: mx.array, *arrays: mx.array) -> tuple[mx.array, ...]:
            slots: dict[bool, BufferSlot] = {}
            taken = 0
            first = self.layers[0].self_attn
            position_shape = (rows.shape[0], first.num_kv_heads, 1, first.head_dim)
            for kind in kinds:
                index: mx.array | None = None
                if traced[kind].index is not None:
                    index = mx.broadcast_to(arrays[taken], position_shape)  # once for all layers of the kind
                    taken += 1
                bounds: mx.array | None = None
                if traced[kind].bounds is not None:
                    bounds = arrays[taken]
                    taken += 1
                slots[kind] = BufferSlot(index, bounds, traced[kind].splits, traced[kind].count)
            buffers = arrays[taken:]
            written: list[tuple[mx.array, mx.array] | None] = []
            attends = [
                functools.partial(
                    layer.self_attn.attend_slot,
                    buffers[index],
                    buffers[layers + index],
                    slots[self.global_layers[index]],
                    written,
                )
                for index, layer in enumerate(self.layers)
            ]
            hidden = self._step_rows(rows, position, attends)
            scattered = [pair for pair in written if pair is not None]
            return (hidden, *(keys for keys, _ in scattered), *(values for _, values in scattered))

        return program
