"""EAR-TTS: the speech-token generator (one frame of 31 codec codes per text token).

Per step the previous frame's codes are embedded (sum of their RVQ codebook
vectors, then ``embed_code``), the current text token is embedded by the
character-aware subword encoder (:mod:`engine.networks.subword`), and both are fused by a
gated projection. A Gemma-3 decoder runs that one position at batch 2 for
classifier-free guidance (row 0 conditioned on the text, row 1 on ``null_emb``),
and a MaskGIT-style loop fills the 31 codes in five rounds: a mixture-of-Gaussians
head predicts a latent, which greedy residual VQ turns into the next codes.

All float work after the code embedding is float32 (the bf16 weights promote), as
in the reference port. Attention state lives in a :class:`TTSCache` from
:meth:`EarTTS.make_cache`. Parameter attribute names follow the checkpoint keys
under ``tts_model.tts_model.``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ...jit import compile_enabled, jit
from ...kernels.decode_attention import DecodeAttention, NormRope, decode_attention_ops, norm_rope_ops
from ...kernels.mixture_sample import gaussian_of, low_rank_mean
from ...kernels.residual_vq import nearest_code_ops
from ...kernels.row_chain import ChainBook, Link, RowCall, RowSequence, find_runs
from ...kernels.row_product import RowProductShape
from ...kernels.step_draws import Draw
from ...loading.config import MoGConfig, TTSConfig
from ...ops.cache import AttentionMask, KVCache, PositionLayout, SlidingKVCache, causal_mask, stored
from ...ops.sampling import draw_component, draw_latent_noise, gaussian_latent, guide
from ...profiler import Probe
from ...weight_names import GATHER_MARK, TRANSPOSE_MARK, VIEW_MARK
from ..fused import Stacked, stack_projections
from ..linear import Linear
from ..subword import CharacterTable, CharAwareSubwordEncoder, DeviceSpelling, FloatRMSNorm, GeluGatedMLP

# Rows of a guided backbone step: the text-conditioned one, then the one conditioned on ``null_emb``.
GUIDED_ROWS = 2
# Text tokens whose conditioning is memoised (about 4.6 KB each at full size).
_CONDITION_MEMO_SIZE = 8192

# --------------------------------------------------------------------------- attention caches


LayerCache = KVCache | SlidingKVCache


@dataclass
class TTSCache:
    """Attention state of the EAR-TTS backbone (one KV cache per layer), and fast numerics' random key."""

    layers: list[LayerCache]
    # Fast numerics' random key, where a step's draws are made at once (EarTTS.step_draws): the key after the
    # last step's splits, carried here because MLX's global generator takes no key from outside. None until the
    # first such step, which starts from the global generator's key, as drawing one by one would.
    draw_key: mx.array | None = None

    @property
    def offset(self) -> int:
        """Positions processed so far (speaker prompt included)."""
        return self.layers[0].offset if self.layers else 0

    def arrays(self) -> list[mx.array]:
        """Every array the cache holds, to evaluate once per frame."""
        arrays = [array for layer in self.layers for array in layer.arrays()]
        return arrays if self.draw_key is None else [*arrays, self.draw_key]


# --------------------------------------------------------------------------- Gemma-3 backbone


class GemmaRMSNorm(nn.Module):
    """Gemma RMSNorm with ``1 + w`` formed in the weight dtype (bf16-rounded), as the reference backbone does."""

    def __init__(self, dims: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


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
        # Fast numerics: one position's attention over the cache buffer as one kernel, and the query and key
        # heads normed and rotated as one kernel (engine.kernels.decode_attention), or their fallbacks.
        self.fast_attention: Callable[..., mx.array] | None = None
        self.fast_heads: Callable[..., tuple[mx.array, mx.array]] | None = None
        # Where the attention kernel writes the cache, it may also norm and rotate the heads itself (CUDA, fast
        # numerics: DecodeAttention.attend_heads, admitted per RoPE base): the traced step then launches no heads.
        self.heads_in_attention = False
        # The dtype this layer's cache stores keys and values in: None keeps the reference's (the keys' own, float32);
        # fast numerics stores bf16 (engine.numerics), which EarTTS.make_cache gives the caches it makes.
        self.cache_dtype: mx.Dtype | None = None

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
        return self.rope(queries, offset=position), self.rope(keys, offset=position), values

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
        """:meth:`project` for one position's rows (B, H) through :attr:`fast_heads` (fast numerics): the
        queries and keys normed and rotated together, the values a view of their rows."""
        assert self.fast_heads is not None
        q, k, v = self.projections(rows)
        queries, keys = self.heads(q, k, position)
        return queries, keys, v.reshape(v.shape[0], self.num_kv_heads, 1, self.head_dim)

    def heads(self, q: mx.array, k: mx.array, position: mx.array) -> tuple[mx.array, mx.array]:
        """One position's query and key rows (B, H·D) as normed, rotated heads (B, heads, 1, D): through
        :attr:`fast_heads` where it reads them (float32), else the reference's operations."""
        q_scale, k_scale = self._norm_scales()
        fast = self.fast_heads is not None and q.dtype == k.dtype == mx.float32
        heads = self.fast_heads if fast else self._heads_ops
        assert heads is not None
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
        as rows (B, heads·D), through :attr:`fast_attention` (see :mod:`engine.kernels.decode_attention`)."""
        assert self.fast_attention is not None
        key_buffer, value_buffer, filled = cache.store(keys, values)
        attention = self._attention_by_count(key_buffer.dtype, value_buffer.dtype)
        return attention(queries, key_buffer, value_buffer, filled, self.scale)

    def kernel_reads(self, key_dtype: mx.Dtype, value_dtype: mx.Dtype) -> bool:
        """Whether the attention kernel reads buffers of these dtypes: those it was admitted for, the dtype the
        cache stores (float32 where the cache keeps the keys' own)."""
        wanted = self.cache_dtype or mx.float32
        return isinstance(self.fast_attention, DecodeAttention) and key_dtype == value_dtype == wanted

    def _attention_by_count(self, key_dtype: mx.Dtype, value_dtype: mx.Dtype) -> Callable[..., mx.array]:
        """:attr:`fast_attention`, or its fallback where the kernel does not read these buffers."""
        assert self.fast_attention is not None
        if isinstance(self.fast_attention, DecodeAttention) and not self.kernel_reads(key_dtype, value_dtype):
            return decode_attention_ops
        return self.fast_attention

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
        :attr:`heads_in_attention` that kernel also makes the heads (:meth:`DecodeAttention.attend_heads`)."""
        if slot.index is None:
            assert isinstance(self.fast_attention, DecodeAttention) and slot.bounds is not None
            written.append(None)
            if self.heads_in_attention:
                assert isinstance(self.fast_heads, NormRope)
                q_scale, k_scale = self._norm_scales()
                return self.fast_attention.attend_heads(
                    q,
                    k,
                    values,
                    q_scale,
                    k_scale,
                    position,
                    self.fast_heads.params,
                    key_buffer,
                    value_buffer,
                    slot.bounds,
                    slot.splits,
                    self.scale,
                )
            queries, keys = self.heads(q, k, position)
            return self.fast_attention.attend_writing(
                queries, keys, values, key_buffer, value_buffer, slot.bounds, slot.splits, self.scale
            )
        queries, keys = self.heads(q, k, position)
        key_buffer = mx.put_along_axis(key_buffer, slot.index, stored(keys, key_buffer.dtype), axis=2)
        value_buffer = mx.put_along_axis(value_buffer, slot.index, stored(values, value_buffer.dtype), axis=2)
        written.append((key_buffer, value_buffer))
        if slot.bounds is not None:
            assert isinstance(self.fast_attention, DecodeAttention)
            return self.fast_attention.attend_bounded(
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
        if attention.fast_attention is not None:
            if attention.fast_heads is not None:
                programs = self._compiled_fast_before
                if attention.fast_heads not in programs:
                    programs[attention.fast_heads] = jit(self._before_attention_fast)
                queries, keys, values = programs[attention.fast_heads](x, position)
            else:
                queries, keys, values = before(x, position)
            return after_rows(x, attention.attend_rows(queries, keys, values, cache))
        queries, keys, values = before(x, position)
        return after(x, attention.attend(queries, keys, values, None, cache))


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
        attends: list[Callable[[mx.array, mx.array, mx.array, mx.array], mx.array]],
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
        attends = [
            lambda q, k, v, position, key=key: 0.5 * mx.random.normal((parts.rows, width), key=key) for key in keys
        ]
        return find_runs(self, lambda: self._step_rows(rows, mx.array(0), attends))

    def traces_rows(self) -> bool:
        """Whether fast numerics' step runs as one traced program (:meth:`_traced_step`): when compiling
        and the attention kernel is in use. ``trace_rows`` overrides it (the fallback's attention slices
        the buffers to the filled count, so a trace holds one count: right for a test, a retrace a frame
        in use)."""
        if self.trace_rows is not None:
            return self.trace_rows
        attention = self.layers[0].self_attn.fast_attention
        return compile_enabled() and isinstance(attention, DecodeAttention)

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
            attention = layer.self_attn.fast_attention
            if isinstance(attention, DecodeAttention) and layer.self_attn.kernel_reads(
                cache.keys.dtype, cache.values.dtype
            ):
                writes = attention.writes_cache  # then the slot rides in the bounds: no index array to make
                index = None if writes else _slot_index(slot)
                bounds = attention.bounds(filled, slot if writes else 0)
                slots[kind] = BufferSlot(index, bounds, attention.splits(filled), None)
            else:
                slots[kind] = BufferSlot(_slot_index(slot), None, 0, filled)
            capacities[kind] = cache.keys.shape[2]
        kinds = sorted(slots)
        # Whether each kind's attention makes its heads (admitted per RoPE base, so per kind of layer).
        folded = tuple(self.layers[self.global_layers.index(kind)].self_attn.heads_in_attention for kind in kinds)
        chains = tuple(self.row_chains.chains.values())
        attention = first.fast_attention
        merging = attention.merged_forms if isinstance(attention, DecodeAttention) else None
        parts = (self.layers[0].rows, attention, merging, first.fast_heads, folded, chains)
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
        return outputs[0]

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


# --------------------------------------------------------------------------- fusion and MoG head


class GatedFusion(nn.Module):
    """``norm(σ(rs) · (σ(g) ⊙ audio_proj(audio / Q) + (1 − σ(g)) ⊙ text_proj(text)))``."""

    def __init__(self, hidden_size: int, num_codebooks: int, eps: float) -> None:
        super().__init__()
        self.num_codebooks = num_codebooks
        self.audio_proj = Linear(hidden_size, hidden_size)
        self.text_proj = Linear(hidden_size, hidden_size)
        self.gate = mx.zeros((hidden_size,))
        self.residual_scale = mx.array(0.5)
        self.final_norm = FloatRMSNorm(hidden_size, eps)

    def __call__(self, audio: mx.array, text: mx.array) -> mx.array:
        audio = self.audio_proj(audio / self.num_codebooks)
        text = self.text_proj(text)
        # The sigmoids run in the parameter dtype and are then cast to the activations'.
        gate = mx.sigmoid(self.gate).astype(audio.dtype)
        scale = mx.sigmoid(self.residual_scale).astype(audio.dtype)
        return self.final_norm(scale * (gate * audio + (1.0 - gate) * text))


@dataclass(frozen=True)
class MixtureRowParts:
    """The MoG head's MLP layers for ``rows`` rows as :class:`engine.kernels.row_product.RowProduct` kernels or
    :func:`engine.kernels.row_product.row_product_ops` (same call signature)."""

    rows: int
    first_gate_up: Callable[..., tuple[mx.array, ...]]  # pre-norm, gelu(gate)·up (the first layer)
    gate_up: Callable[..., tuple[mx.array, ...]]  # the previous layer's post-norm and add, pre-norm, gelu(gate)·up
    down: Callable[..., tuple[mx.array, ...]]  # down_proj
    # The draw after the layers, for the model's sampling constants (guidance, top-p, noise scale); None keeps
    # the head's operations: the last post-norm and add, the final norm, the guidance and the three
    # projections as one guided row product, then engine.kernels.mixture_sample's kernel.
    sampling: tuple[float, float, float] | None = None
    projections: Callable[..., tuple[mx.array, ...]] | None = None
    sample: Callable[..., mx.array] | None = None


@dataclass(frozen=True)
class MixtureSampleWeights:
    """What :attr:`MixtureRowParts.projections` and :attr:`MixtureRowParts.sample` read of the head."""

    projections: tuple[mx.array, mx.array, mx.array]  # proj_logits, proj_else, proj_logs
    final_scale: mx.array  # the final norm's float32 1 + w
    mus: mx.array  # proj_mus.weight as one row per component (K, R·H): the kernel reads the drawn one's
    low_mat: mx.array  # low_mat likewise (K, L·R)


@dataclass(frozen=True)
class MixtureRowWeights:
    """What :class:`MixtureRowParts` read of one MoG layer."""

    gate_up: tuple[mx.array, mx.array]
    down: mx.array
    pre_scale: mx.array
    post_scale: mx.array


class MixtureLayer(nn.Module):
    """Residual MLP block of the MoG head."""

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float) -> None:
        super().__init__()
        self.pre_norm = FloatRMSNorm(hidden_size, eps)
        self.mlp = GeluGatedMLP(hidden_size, intermediate_size)
        self.post_norm = FloatRMSNorm(hidden_size, eps)
        self.row_weights: MixtureRowWeights | None = None  # fast numerics (MixtureHead.rows)

    def projection_layers(self) -> tuple[Linear, ...]:
        """The MLP's projections: gate, up, down."""
        return self.mlp.gate_proj, self.mlp.up_proj, self.mlp.down_proj

    def make_row_weights(self, weight_dtype: mx.Dtype | None) -> MixtureRowWeights:
        """The weights the row parts read: the projections (as ``weight_dtype`` copies when given, made
        once, see :meth:`engine.networks.linear.KeepsCopy.weight_in`) and the norms' float32 ``1 + w``."""
        gate, up, down = (linear.weight_in(weight_dtype) for linear in self.projection_layers())
        made = MixtureRowWeights(
            gate_up=(gate, up),
            down=down,
            pre_scale=1.0 + self.pre_norm.weight.astype(mx.float32),
            post_scale=1.0 + self.post_norm.weight.astype(mx.float32),
        )
        mx.eval(made.gate_up, made.down, made.pre_scale, made.post_scale)
        return made

    def __call__(self, x: mx.array) -> mx.array:
        return x + self.post_norm(self.mlp(self.pre_norm(x)))


class MixtureHead(nn.Module):
    """Mixture-of-Gaussians over the codec latent with low-rank component means."""

    def __init__(self, hidden_size: int, latent_size: int, config: MoGConfig) -> None:
        super().__init__()
        self.latent_size = latent_size
        self.num_components = config.num_predictions
        self.low_rank = config.low_rank
        self.min_log_std = config.min_log_std
        self.mlp_stack = [
            *(MixtureLayer(hidden_size, config.intermediate_size, config.eps) for _ in range(config.num_layers)),
            FloatRMSNorm(hidden_size, config.eps),
        ]
        self.proj_logits = Linear(hidden_size, config.num_predictions, bias=False)
        self.proj_mus = Linear(hidden_size, config.num_predictions * config.low_rank, bias=False)
        self.proj_logs = Linear(hidden_size, 1, bias=False)
        self.proj_else = Linear(hidden_size, latent_size, bias=False)
        self.low_mat = mx.zeros((config.num_predictions, latent_size, config.low_rank))
        self.stacked: Stacked | None = None  # proj_logits, proj_else and proj_logs in one product
        # Fast numerics: the MLP layers as row-product calls (each layer's row_weights say what they read), and
        # the draw after them (what sample_weights say).
        self.rows: MixtureRowParts | None = None
        self.sample_weights: MixtureSampleWeights | None = None

    def make_sample_weights(self) -> MixtureSampleWeights:
        """What fast numerics' draw reads: the projections as they are, the final norm's ``1 + w`` in float32."""
        final_norm = self.mlp_stack[-1]
        final_scale = 1.0 + final_norm.weight.astype(mx.float32)
        mx.eval(final_scale)
        projections = (self.proj_logits.weight, self.proj_else.weight, self.proj_logs.weight)
        tables = (self.proj_mus.weight.reshape(self.num_components, -1), self.low_mat.reshape(self.num_components, -1))
        mx.eval(*tables)  # views of the weights (no copies), made once: the census names them
        return MixtureSampleWeights(projections, final_scale, *tables)

    def weight_views(self) -> dict[str, mx.array]:
        """The tables fast numerics' draw gathers a component's rows of (named for the census,
        :func:`engine.counters.named_weights`)."""
        weights = self.sample_weights
        if weights is None:
            return {}
        return {f"proj_mus.weight{GATHER_MARK}": weights.mus, f"low_mat{GATHER_MARK}": weights.low_mat}

    def table_rows(self) -> dict[str, int]:
        """Rows of the tables :meth:`weight_views` names (one per component), for pricing them at full size."""
        return dict.fromkeys((f"proj_mus.weight{GATHER_MARK}", f"low_mat{GATHER_MARK}"), self.num_components)

    def sample_latent(
        self,
        x: mx.array,
        guidance_scale: float,
        top_p: float,
        noise_scale: float,
        draws: tuple[mx.array, mx.array] | None = None,
    ) -> mx.array:
        """The latent a MaskGIT round draws from guided features ``x``: :meth:`sample_gaussian`, then the latent
        noise (engine.ops.sampling's two draws, in order; ``draws``, when given, are those two made already).
        Fast numerics' rows run the layers and the draw as kernels where the head's parts are the kernels'
        (:class:`MixtureRowParts`)."""
        rows, weights = self.rows, self.sample_weights
        uniform: mx.array | None = None
        noise: mx.array | None = None
        if draws is not None:
            uniform, noise = draws
        if (
            rows is not None
            and rows.projections is not None
            and rows.sample is not None
            and weights is not None
            and rows.sampling == (guidance_scale, top_p, noise_scale)
            and x.ndim == 2
            and x.shape[0] == rows.rows
            and x.dtype == mx.float32
        ):
            hidden, pending = self._layers_rows_pending(rows, self.mlp_stack[:-1], x)
            assert pending is not None
            logits, residual, log_std, summed = rows.projections(
                hidden, weights.projections, weights.final_scale, pending.output, pending.scale
            )
            if uniform is None or noise is None:
                uniform = mx.random.uniform(shape=logits.shape)
                noise = draw_latent_noise(residual.shape)
            return rows.sample(
                logits, residual, log_std, summed, weights.final_scale, uniform, noise, weights.mus, weights.low_mat
            )
        mean, log_std = self.sample_gaussian(x, guidance_scale, top_p, uniform)
        return gaussian_latent(mean, log_std, draw_latent_noise(mean.shape) if noise is None else noise, noise_scale)

    def fuse_projections(self) -> int:
        self.stacked = stack_projections(self, ("proj_logits", "proj_else", "proj_logs"))
        return int(self.stacked is not None)

    def sample_gaussian(
        self, x: mx.array, guidance_scale: float, top_p: float, uniform: mx.array | None = None
    ) -> tuple[mx.array, mx.array]:
        """Guided features (2B, T, H) or rows (2N, H) → (mean (B, T, latent), log std (B, T, 1)) or
        (N, latent) and (N, 1) of one drawn component.

        The first half (rows [0, B) or [0, N)) is conditional, the second unconditional; guidance
        mixes them after the MLP stack. Draws the component (one uniform tensor, see engine.ops.sampling,
        unless ``uniform`` is that draw made already).
        """
        *layers, final_norm = self.mlp_stack
        rows = self.rows
        if rows is not None and x.ndim == 2 and x.shape[0] == rows.rows and x.dtype == mx.float32:
            x = self._layers_rows(rows, layers, x)
        else:
            for block in layers:
                x = block(x)
        x = final_norm(x)
        if guidance_scale > 0.0:
            x = guide(x, guidance_scale)
        leading = x.shape[:-1]
        if self.stacked is not None:
            logits, residual, log_std_raw = self.stacked(x)
        else:
            logits, residual, log_std_raw = self.proj_logits(x), self.proj_else(x), self.proj_logs(x)
        component = draw_component(logits, top_p, uniform)
        rows = x
        if x.ndim != 2:
            component, rows = component.reshape(-1), x.reshape(-1, x.shape[-1])
        # Only the drawn component's rows of proj_mus are needed (the weight is read raw, never quantized).
        mean = low_rank_mean(component, rows, self.proj_mus.weight, self.low_mat, self.low_rank)
        if len(leading) != 1:
            mean = mean.reshape(*leading, self.latent_size)
        return gaussian_of(mean, residual, log_std_raw, self.min_log_std)

    @staticmethod
    def _layers_rows(parts: MixtureRowParts, layers: list[MixtureLayer], hidden: mx.array) -> mx.array:
        """Fast numerics' MLP layers on rows: each layer's post-norm and residual add is left pending and done
        by the next layer's first kernel (its prologue), the last one's by the operations."""
        hidden, pending = MixtureHead._layers_rows_pending(parts, layers, hidden)
        if pending is None:
            return hidden
        return hidden + layers[-1].post_norm(pending.output)

    @staticmethod
    def _layers_rows_pending(
        parts: MixtureRowParts, layers: list[MixtureLayer], hidden: mx.array
    ) -> tuple[mx.array, LayerRowsPending | None]:
        """:meth:`_layers_rows` with the last layer's post-norm and residual add left pending (None: no layers)."""
        pending: LayerRowsPending | None = None
        for layer in layers:
            weights = layer.row_weights
            assert weights is not None
            if pending is None:
                (gated,) = parts.first_gate_up(hidden, weights.gate_up, weights.pre_scale)
            else:
                gated, hidden = parts.gate_up(hidden, weights.gate_up, weights.pre_scale, pending.output, pending.scale)
            (down,) = parts.down(gated, (weights.down,))
            pending = LayerRowsPending(down, weights.post_scale)
        return hidden, pending


# --------------------------------------------------------------------------- speaker prompt


@dataclass(frozen=True)
class SpeakerPrompt:
    """Inputs of the warm-up pass that conditions the TTS on the built-in speaker.

    ``codes`` (1, P, Q): codec codes of silence with the mask code at frame 0 and at
    the last frame; ``subword_ids`` (1, P): PAD everywhere, ``subword_mask`` true on
    the last two positions; ``audio_mask`` true on the last position only (the BOS
    frame); ``latent`` (1, P, H): the speaker latent that replaces the code embedding
    before the BOS frame.
    """

    codes: mx.array
    subword_ids: mx.array
    subword_mask: mx.array
    audio_mask: mx.array
    latent: mx.array


def build_speaker_prompt(
    silence_codes: mx.array, aria_latent: mx.array, config: TTSConfig, pad_id: int
) -> SpeakerPrompt:
    """Assemble the speaker prompt from the codec codes of P + 1 frames of zeros (1, P + 1, Q).

    ``aria_latent`` (1, P, H) is ``tts_model.audio_prompt_latents.Aria``; P = 37.
    """
    frames = aria_latent.shape[1]
    expected = (1, frames + 1, config.num_quantizers)
    if tuple(silence_codes.shape) != expected:
        raise ValueError(f"silence codes have shape {tuple(silence_codes.shape)}, expected {expected}")
    masked_frame = mx.full((1, 1, config.num_quantizers), config.mask_code, dtype=mx.int32)
    codes = mx.concatenate([masked_frame, silence_codes[:, 1 : frames - 1].astype(mx.int32), masked_frame], axis=1)
    position = mx.arange(frames)[None, :]
    return SpeakerPrompt(
        codes=codes,
        subword_ids=mx.full((1, frames), pad_id, dtype=mx.int32),
        subword_mask=position >= frames - 2,
        audio_mask=position == frames - 1,
        latent=aria_latent[:1],
    )


# --------------------------------------------------------------------------- EAR-TTS


@dataclass(frozen=True)
class TTSStepResult:
    """One generated frame: ``codes`` (1, 1, Q) int32 in [0, codebook_size), ``hidden`` (2, 1, H) float32,
    and ``code_sum`` (1, 1, latent) float32, the sum of the codes' codebook vectors (the next step's input)."""

    codes: mx.array
    hidden: mx.array
    code_sum: mx.array


@dataclass(frozen=True)
class RefinementRound:
    """One non-empty MaskGIT round: quantizers [start, start + count) are filled."""

    start: int
    count: int


def refinement_plan(config: TTSConfig) -> tuple[RefinementRound, ...]:
    """The non-empty rounds of the cosine-cubed schedule ((0, 1), (1, 1), (2, 3), (5, 4), (9, 22) at full size)."""
    rounds: list[RefinementRound] = []
    start = 0
    for count in config.refinement_counts:
        if count:
            rounds.append(RefinementRound(start, count))
            start += count
    return tuple(rounds)


class EarTTS(nn.Module):
    """The EAR-TTS network (checkpoint prefix ``tts_model.tts_model.``)."""

    def __init__(self, config: TTSConfig) -> None:
        super().__init__()
        self.config = config
        self.plan = refinement_plan(config)
        self.backbone = Backbone(config)
        self.bos_emb = mx.zeros((config.hidden_size,))
        self.null_emb = mx.zeros((config.hidden_size,))
        self.embed_code = Linear(config.latent_size, config.hidden_size, bias=False)
        self.embed_subword = CharAwareSubwordEncoder(config.character_encoder, config.hidden_size)
        self.gated_fusion_audio_text = GatedFusion(config.hidden_size, config.num_quantizers, config.rms_norm_eps)
        # Projects reference-audio embeddings into speaker prompts (voice cloning); unused with the built-in latent.
        self.audio_prompt_projection_W = mx.zeros((config.hidden_size, config.hidden_size))
        self.mog_head = MixtureHead(config.hidden_size, config.latent_size, config.mog_head)
        self.rvq_embs = mx.zeros((config.num_quantizers, config.codebook_size, config.latent_size))
        # One quantizer's greedy step after its product: the operations, or fast numerics' kernel.
        self.nearest_code: Callable[..., tuple[mx.array, mx.array, mx.array]] = nearest_code_ops
        # Fast numerics on CUDA: a round's quantizers in one launch, by the round's count (rounds of one quantizer
        # and counts not admitted take nearest_code quantizer by quantizer).
        self.nearest_rounds: dict[int, Callable[..., tuple[mx.array, mx.array, mx.array]]] = {}
        # Fast numerics: a step's draws made at once from the generator's key (engine.kernels.step_draws), or None (one
        # by one, as each round needs them).
        self.step_draws: Callable[[mx.array], tuple[mx.array, ...]] | None = None

    def draw_plan(self) -> tuple[Draw, ...]:
        """The draws of a step's MaskGIT rounds, in order: per round the component's uniform over the guided
        row's mixture logits, then the latent's normal noise."""
        head = self.mog_head
        rows = 1 if self.config.guidance_scale > 0.0 else GUIDED_ROWS  # guidance mixes the two rows into one
        round_draws = (Draw("uniform", (rows, head.num_components)), Draw("normal", (rows, head.latent_size)))
        return round_draws * len(self.plan)

    def make_cache(self) -> TTSCache:
        """Fresh attention state: unbounded caches on global layers, sliding-window caches elsewhere, storing
        the dtype the backbone's attention asks for (:attr:`BackboneAttention.cache_dtype`)."""
        window = self.config.sliding_window
        dtype = self.backbone.layers[0].self_attn.cache_dtype if self.backbone.layers else None
        return TTSCache(
            layers=[
                KVCache(dtype=dtype) if is_global else SlidingKVCache(window=window, dtype=dtype)
                for is_global in self.backbone.global_layers
            ]
        )

    # ----------------------------------------------------------------- embeddings

    def _codebook_sum(self, columns: list[mx.array]) -> mx.array:
        """Σ_q rvq_embs[q, code_q] in float32, in quantizer order; the mask code adds zero."""
        mask_code = self.config.mask_code
        total = mx.zeros((*columns[0].shape, self.config.latent_size))
        for quantizer, column in enumerate(columns):
            known = column < mask_code
            rows = self.codebooks[quantizer][mx.where(known, column, 0)]
            total = total + mx.where(known[..., None], rows, 0.0)
        return total

    def code_sum(self, codes: mx.array) -> mx.array:
        """(B, T, Q) codes → (B, T, latent) float32: the sum of their codebook vectors."""
        return self._codebook_sum([codes[..., quantizer] for quantizer in range(self.config.num_quantizers)])

    def embed_codes(self, codes: mx.array) -> mx.array:
        """(B, T, Q) codes → (B, T, H) float32 code embeddings."""
        return self.embed_code(self.code_sum(codes))

    def _guided_condition(self, subword_ids: mx.array, subword_mask: mx.array, chars: CharacterTable) -> mx.array:
        """Text conditioning (1, T) → (2, T, H): row 0 the text, row 1 the learned null embedding."""
        return self._guided(self.embed_subword(subword_ids, subword_mask, chars))

    def _guided(self, text: mx.array) -> mx.array:
        """Text conditioning (1, T, H) → (2, T, H): the null embedding's row joined after it."""
        return mx.concatenate([text, mx.broadcast_to(self.null_emb, text.shape)], axis=0)

    def _token_condition(self, token_id: int, chars: CharacterTable) -> mx.array:
        """The guided conditioning (2, 1, H) of one text token, computed once per token id.

        It depends only on the id (and the weights), so a memo returns the very same
        values; a conversation repeats few tokens (PAD most of all), so most frames skip
        the character encoder entirely.
        """
        memo = self._condition_memo
        condition = memo.get(token_id)
        if condition is None:
            token = mx.array([[token_id]], dtype=mx.int32)
            condition = self._guided_condition(token, mx.ones(token.shape, dtype=mx.bool_), chars)
            if len(memo) >= _CONDITION_MEMO_SIZE:
                memo.pop(next(iter(memo)))
            memo[token_id] = condition
        return condition

    @functools.cached_property
    def _condition_memo(self) -> dict[int, mx.array]:
        return {}  # token id -> conditioning; in the instance __dict__, outside the parameter tree

    def condition_on_device(self, text_token: mx.array, spelling: DeviceSpelling) -> mx.array:
        """The guided conditioning (2, 1, H) of a text token (1, 1) that stays on the device (fast numerics).

        Read from the vocabulary's table where one is in use for ``spelling``'s size (:meth:`use_condition_table`),
        else spelled from ``spelling`` and encoded every step (no memo: the id is not known on the host), as one
        compiled program; see :meth:`CharAwareSubwordEncoder.encode_on_device` for how it differs from
        :meth:`_token_condition`."""
        table = self._condition_tables.get(spelling.lengths.shape[0])
        if table is not None:
            return self._guided(table[text_token.reshape(-1)].reshape(*text_token.shape, -1))
        return self._device_condition(text_token, spelling.char_ids, spelling.lengths)

    def use_condition_table(self, table: mx.array | None, size: int) -> None:
        """Read a token's text conditioning from ``table`` (V, H) — every token's, made at load
        (:meth:`CharAwareSubwordEncoder.encode_vocabulary`) — for spellings of ``size`` tokens; None: encode it
        every step again."""
        if table is None:
            self._condition_tables.pop(size, None)
        else:
            self._condition_tables[size] = table

    def has_condition_table(self, size: int) -> bool:
        """Whether :meth:`condition_on_device` reads a table for spellings of ``size`` tokens."""
        return size in self._condition_tables

    def forget_condition_tables(self) -> None:
        """Let every table of :meth:`use_condition_table` go."""
        self._condition_tables.clear()

    @functools.cached_property
    def _condition_tables(self) -> dict[int, mx.array]:
        return {}  # vocabulary size -> table; in the instance __dict__, outside the parameter tree

    @functools.cached_property
    def _device_condition(self) -> Callable[[mx.array, mx.array, mx.array], mx.array]:
        # The character encoder's weights are bf16 in either numerics mode (engine.loading.precast), so one trace
        # serves.
        def condition(text_token: mx.array, char_ids: mx.array, lengths: mx.array) -> mx.array:
            spelling = DeviceSpelling(char_ids=char_ids, lengths=lengths)
            return self._guided(self.embed_subword.encode_on_device(text_token, spelling))

        return jit(condition)

    # ----------------------------------------------------------------- warm-up and step

    def warmup(self, prompt: SpeakerPrompt, cache: TTSCache, chars: CharacterTable) -> mx.array:
        """Run the speaker prompt through the backbone to fill ``cache``; returns the first previous code (1, 1, Q).

        The prompt's codes enter shifted right by one frame (code 0 first). Positions
        before the BOS frame (the first audio-mask position) take the speaker latent
        instead of their code embedding; the BOS frame adds ``bos_emb``.
        """
        codes = prompt.codes
        shifted = mx.concatenate([mx.zeros_like(codes[:, :1]), codes[:, :-1]], axis=1)
        audio = self.embed_codes(shifted)
        audio_before = mx.concatenate([mx.zeros_like(prompt.audio_mask[:, :1]), prompt.audio_mask[:, :-1]], axis=1)
        bos = prompt.audio_mask & ~audio_before
        before_bos = mx.cumsum(bos.astype(mx.int32), axis=1) == 0
        audio = mx.where(before_bos[..., None], prompt.latent.astype(audio.dtype), audio)
        audio = audio + bos[..., None] * self.bos_emb
        guided_audio = mx.concatenate([audio, audio], axis=0)
        inputs = self.gated_fusion_audio_text(
            guided_audio, self._guided_condition(prompt.subword_ids, prompt.subword_mask, chars)
        )
        self.backbone(inputs, cache.layers)  # the hidden states of the prompt are not needed
        return codes[:, -1:]

    def step(
        self,
        previous_code: mx.array,
        text_token: mx.array,
        cache: TTSCache,
        chars: CharacterTable,
        previous_code_sum: mx.array | None = None,
        probe: Probe | None = None,
        text_id: int | None = None,
        condition: mx.array | None = None,
        launch: Callable[..., None] | None = None,
    ) -> TTSStepResult:
        """Generate one frame of codes from the previous frame's codes (1, 1, Q) and the text token (1, 1).

        ``previous_code_sum``, when given, is the previous step's ``code_sum`` — the sum of
        ``previous_code``'s codebook vectors, which the code embedding would recompute.
        ``text_id``, when given, is ``text_token``'s value, known on the host: the token's
        conditioning is then looked up in (or added to) a per-token memo, with no readback.
        ``condition``, when given, is the token's guided conditioning already built
        (:meth:`condition_on_device`), and ``text_token`` is not read. ``launch``, when given, is called with
        the backbone's output before the MaskGIT rounds are built (:meth:`engine.profiler.FrameProfiler.launch_part`).
        With neither, reads the token id on the host (see :func:`engine.networks.subword.spell_tokens`). Draws
        one uniform and one normal tensor per refinement round from the global RNG — or, with
        :attr:`step_draws`, the same draws at once from ``cache.draw_key``, which then moves on.
        """
        if previous_code_sum is None:
            previous_code_sum = self.code_sum(previous_code)
        audio = self.embed_code(previous_code_sum)
        guided_audio = mx.concatenate([audio, audio], axis=0)
        if probe is not None:
            probe("tts.embed", guided_audio)
        if condition is None and text_id is not None:
            condition = self._token_condition(text_id, chars)
        elif condition is None:
            condition = self._guided_condition(text_token, mx.ones(text_token.shape, dtype=mx.bool_), chars)
        if probe is not None:
            probe("tts.condition", condition)
        fused = self.gated_fusion_audio_text(guided_audio, condition)
        if probe is not None:
            probe("tts.fusion", fused)
        hidden = self.backbone(fused, cache.layers)
        if probe is not None:
            probe("tts.backbone", hidden)
        if launch is not None:
            launch(hidden)
        draw_key = None
        if self.step_draws is not None and hidden.shape[1] == 1:
            draw_key = cache.draw_key if cache.draw_key is not None else mx.random.state[0]
        # Probing times every round, which needs the op-by-op form (a compiled call cannot be split).
        if probe is None:
            codes, code_sum, next_key = self._refine(hidden, draw_key)
        elif draw_key is None:
            (codes, code_sum), next_key = self._refine_ops(hidden, probe), None
        else:
            codes, code_sum, next_key = self._refine_drawn(hidden, draw_key, probe)
        if next_key is not None:
            cache.draw_key = next_key
        return TTSStepResult(codes=codes, hidden=hidden, code_sum=code_sum)

    # ----------------------------------------------------------------- code generation

    def generate_codes(self, hidden: mx.array) -> mx.array:
        """Guided hidden states (2, T, H) → codes (1, T, Q) int32, refined round by round."""
        return self._refine(hidden)[0]

    @property
    def codebooks(self) -> list[mx.array]:
        """``rvq_embs[q]`` for each quantizer, as views of the stored tensor (no copy).

        Indexing the stack with ``q`` inside a frame would gather (copy) a whole codebook each
        time, 31 times a frame; these are the same values, sliced once per stored tensor (so
        again after a precast replaces it).
        """
        return self._codebook_views()[0]

    @property
    def codebooks_transposed(self) -> list[mx.array]:
        """``rvq_embs[q].T`` for each quantizer: views too, made once (see :mod:`engine.networks.linear`)."""
        return self._codebook_views()[1]

    def _codebook_views(self) -> tuple[list[mx.array], list[mx.array]]:
        source, books, transposed = self._codebook_store.get("views", (None, [], []))
        if source is not self.rvq_embs:
            books = [self.rvq_embs[q : q + 1].squeeze(0) for q in range(self.rvq_embs.shape[0])]
            transposed = [book.T for book in books]
            mx.eval(books, transposed)
            self._codebook_store["views"] = (self.rvq_embs, books, transposed)
        return books, transposed

    def weight_views(self) -> dict[str, mx.array]:
        """The codebook views, named for :func:`engine.counters.named_weights`."""
        books, transposed = self._codebook_views()
        named = {f"rvq_embs{VIEW_MARK}{quantizer}": book for quantizer, book in enumerate(books)}
        named.update({f"rvq_embs{VIEW_MARK}{q}{TRANSPOSE_MARK}": book for q, book in enumerate(transposed)})
        return named

    @functools.cached_property
    def _codebook_store(self) -> dict[str, tuple[mx.array | None, list[mx.array], list[mx.array]]]:
        return {}  # in the instance __dict__, outside the parameter tree

    @functools.cached_property
    def codebook_norms(self) -> list[mx.array]:
        """‖e‖² of every codebook entry, summed in the codebook dtype exactly as the per-call form does."""
        norms = [mx.sum(book * book, axis=-1) for book in self.rvq_embs]
        mx.eval(norms)
        return norms

    @functools.cached_property
    def _compiled_refines(self) -> dict[Any, Callable[[mx.array], tuple[mx.array, mx.array]]]:
        return {}  # one program per residual-VQ step and MoG row parts in use (a trace holds those it was traced with)

    def forget_row_programs(self) -> None:
        """Drop the programs traced with row products (the MaskGIT rounds', the backbone's steps): they hold
        the weights' bf16 copies."""
        programs = self._compiled_refines
        for key in [key for key in programs if key[1] is not None]:
            del programs[key]
        self.backbone._traced_steps.clear()

    def _refine(self, hidden: mx.array, draw_key: mx.array | None = None) -> tuple[mx.array, mx.array, mx.array | None]:
        """:meth:`_refine_ops` compiled for one position (drawing from the global generator, or with ``draw_key``
        through :meth:`_refine_drawn`); also returns the key after the draws (None without ``draw_key``)."""
        if hidden.shape[1] != 1:
            return (*self._refine_ops(hidden), None)
        programs = self._compiled_refines
        rounds = tuple(sorted(self.nearest_rounds.items(), key=lambda item: item[0]))
        key = (self.nearest_code, rounds, self.mog_head.rows, None if draw_key is None else self.step_draws)
        if key not in programs:
            programs[key] = jit(self._refine_ops, draws_random=True) if draw_key is None else jit(self._refine_drawn)
        if draw_key is None:
            return (*programs[key](hidden), None)
        return programs[key](hidden, draw_key)  # type: ignore[no-any-return]

    def _refine_drawn(
        self, hidden: mx.array, draw_key: mx.array, probe: Probe | None = None
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:meth:`_refine_ops` on the draws :attr:`step_draws` makes at once from ``draw_key``; also returns the
        key after them."""
        assert self.step_draws is not None
        next_key, *draws = self.step_draws(draw_key)
        codes, code_sum = self._refine_ops(hidden, probe, tuple(draws))
        return codes, code_sum, next_key

    def _refine_ops(
        self, hidden: mx.array, probe: Probe | None = None, draws: tuple[mx.array, ...] | None = None
    ) -> tuple[mx.array, mx.array]:
        """The MaskGIT rounds: codes (1, T, Q) and the float32 sum of their codebook vectors. ``draws``, when
        given, are the rounds' draws made already (:meth:`draw_plan`), else each round draws its own.

        Quantizers are filled in order, so the code embedding of a round — the sum over
        every quantizer with unfilled ones adding zero — is the running sum of the rows
        chosen so far; it is carried instead of recomputed. Adding the zeros would not
        change a single bit, so this is the reference's arithmetic.
        """
        config = self.config
        # The rounds run on rows (T, ·) rather than (1, T, ·): a matrix product of a 3-D input is
        # flattened to rows and unflattened again around the same kernel, two views per product.
        _, length, width = hidden.shape
        rows = hidden.reshape(-1, width)
        columns: list[mx.array | None] = [
            mx.full((length, 1), config.mask_code, dtype=mx.int32)
        ] * config.num_quantizers
        chosen_sum = mx.zeros((length, config.latent_size))
        norms = self.codebook_norms
        nearest, nearest_rounds = self.nearest_code, self.nearest_rounds
        if rows.dtype != mx.float32:
            nearest, nearest_rounds = nearest_code_ops, {}  # the kernels take float32 residuals
        for number, round_ in enumerate(self.plan, start=1):
            embedded = self.embed_code(chosen_sum)
            if length == 1:  # the same two adds, broadcast over both rows: no join
                features = embedded + rows
            else:
                features = mx.concatenate([embedded + rows[:length], embedded + rows[length:]], axis=0)
            round_draws = None if draws is None else (draws[2 * number - 2], draws[2 * number - 1])
            latent = self.mog_head.sample_latent(
                features, config.guidance_scale, config.top_p, config.noise_scale, round_draws
            )
            if probe is not None:
                probe(f"tts.mog.{number}", latent)
            # ‖e‖² − 2 z·e ranks entries like ‖z − e‖² (engine.kernels.residual_vq).
            quantizers = slice(round_.start, round_.start + round_.count)
            round_kernel = nearest_rounds.get(round_.count)
            if round_kernel is not None:  # the round's codes as one block of columns, in its first column's place
                columns[quantizers] = [None] * round_.count
                columns[round_.start], latent, chosen_sum = round_kernel(
                    latent,
                    self.codebooks[quantizers],
                    self.codebooks_transposed[quantizers],
                    norms[quantizers],
                    chosen_sum,
                )
            else:
                for quantizer in range(quantizers.start, quantizers.stop):
                    book, transposed = self.codebooks[quantizer], self.codebooks_transposed[quantizer]
                    columns[quantizer], latent, chosen_sum = nearest(
                        latent, book, transposed, norms[quantizer], chosen_sum
                    )
            if probe is not None:
                probe(f"tts.rvq.{number}", chosen_sum, *[column for column in columns if column is not None])
        filled = [column for column in columns if column is not None]
        return mx.expand_dims(mx.concatenate(filled, axis=-1), 0), mx.expand_dims(chosen_sum, 0)
