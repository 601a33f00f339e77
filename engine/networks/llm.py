"""Nemotron-H: the hybrid Mamba-2 / attention / ReLU² language model of VoiceChat.

The stack is given by ``LLMConfig.hybrid_override_pattern``, one character per block:
``M`` Mamba-2 mixer, ``*`` causal self-attention (no positional encoding), ``-``
ReLU² MLP. Every block is pre-norm residual, ``x + mixer(rms_norm(x))``, and the stack
ends in ``norm_f``. The model takes input embeddings (VoiceChat fuses text, function
and audio channels before the LLM) and returns the final hidden states; the
vocabulary heads live with the caller.

Streaming state is explicit: :meth:`NemotronH.make_cache` returns an :class:`LLMCache`
holding one :class:`MambaCache` per Mamba block and one :class:`KVCache` per
attention block. The caches reproduce the reference runtime's dtype behaviour
exactly (see :class:`KVCache`), because the attention results depend on it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from ..jit import jit
from ..kernels.admission import kernel_constants
from ..kernels.decode_attention import DecodeAttention
from ..kernels.fused_step import block_rows
from ..kernels.quantized_product import RowRole, grouped_rms_norm
from ..loading.config import LLMConfig
from ..ops.cache import AttentionMask, KVCache, PositionLayout
from .linear import Linear, QuantizedLinear
from .ssm import silu_gate, ssm_scan

MAMBA: Literal["M"] = "M"
ATTENTION: Literal["*"] = "*"
MLP: Literal["-"] = "-"
BLOCK_KINDS = (MAMBA, ATTENTION, MLP)


# --------------------------------------------------------------------------- caches


@dataclass(eq=False)
class MambaCache:
    """Recurrent state of one Mamba block.

    ``conv_state`` (B, K-1, conv_dim): the last K-1 inputs of the causal depthwise
    convolution. ``ssm_state`` (B, H, head_dim, N), float32: the scan state. Both are
    ``None`` until the first call, which (like the reference) starts from zeros; the
    convolution window then takes the dtype of the inputs it was last fed.
    """

    conv_state: mx.array | None = None
    ssm_state: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.conv_state, self.ssm_state) if a is not None]


LayerCache = MambaCache | KVCache | None


@dataclass(eq=False)
class LLMCache:
    """All streaming state of :class:`NemotronH`: one entry per block (``None`` for MLP blocks)."""

    layers: list[LayerCache] = field(default_factory=list)
    position: int = 0  # positions consumed so far

    def arrays(self) -> list[mx.array]:
        """Every array the next call reads; evaluate these once per frame."""
        return [array for layer in self.layers if layer is not None for array in layer.arrays()]


# --------------------------------------------------------------------------- mixers


class GroupedGatedRMSNorm(nn.Module):
    """``weight * rms_norm_per_group(values * silu(gate))`` over ``n_groups`` equal slices."""

    def __init__(self, width: int, group_width: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.ones((width,))
        self.group_width = group_width
        self.eps = eps

    def __call__(self, values: mx.array, gate: mx.array) -> mx.array:
        return self.normalize(silu_gate(gate, values))

    def normalize(self, gated: mx.array) -> mx.array:
        """The norm of already gated values (the fused step gates them itself)."""
        return grouped_rms_norm(gated, self.weight, groups=gated.shape[-1] // self.group_width, eps=self.eps)


class Mamba2Mixer(nn.Module):
    """Mamba-2: in_proj → [gate | conv input | dt], causal depthwise conv + SiLU, selective scan, gated norm."""

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        self.num_heads = config.mamba_num_heads
        self.head_dim = config.mamba_head_dim
        self.n_groups = config.n_groups
        self.state_size = config.ssm_state_size
        self.kernel_size = config.conv_kernel
        self.inner_size = config.mamba_intermediate_size
        self.conv_dim = config.mamba_conv_dim
        # Two floats, not a tuple: tuples on an nn.Module would join its parameter tree.
        self.dt_min = float(config.time_step_limit[0])
        self.dt_max = float(config.time_step_limit[1])

        self.in_proj = Linear(config.hidden_size, config.mamba_projection_size, bias=config.mamba_proj_bias)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            kernel_size=self.kernel_size,
            padding=0,
            groups=self.conv_dim,
            bias=config.use_conv_bias,
        )
        self.dt_bias = mx.ones((self.num_heads,))
        self.A_log = mx.log(mx.arange(1, self.num_heads + 1, dtype=mx.float32))
        self.D = mx.ones((self.num_heads,))
        self.norm = GroupedGatedRMSNorm(
            self.inner_size, self.inner_size // self.n_groups, eps=config.layer_norm_epsilon
        )
        self.out_proj = Linear(self.inner_size, config.hidden_size, bias=config.mamba_proj_bias)
        # Fast numerics: one position's step from its input projection (convolution included) as one kernel, or
        # its operations fallback; returns the gated readout, both new states and the readout's partial sums
        # of squares (engine.kernels.fused_step.fused_step_ops).
        self.fast_step: Callable[..., tuple[mx.array, mx.array, mx.array, mx.array]] | None = None

    def use_fast_step(self, step: Callable[..., tuple[mx.array, mx.array, mx.array, mx.array]] | None) -> None:
        """Run single-position steps through ``step`` (:class:`engine.kernels.fused_step.FusedStep` or its fallback), or
        not."""
        self.fast_step = step
        self._step_limits = kernel_constants(self.dt_min, self.dt_max)
        self._norm_params = kernel_constants(self.norm.eps)  # what a kernel finishing the norm reads
        bias = getattr(self.conv1d, "bias", None)
        # A kernel takes the convolution's bias as an array: zeros when the checkpoint has none.
        self._step_conv_bias = mx.zeros((self.conv_dim,)) if bias is None else bias

    def _takes_fast_step(self, projected: mx.array, cache: MambaCache | None) -> bool:
        """One position of one row with both states from earlier positions, in float32 (the step's types)."""
        return (
            self.steps_fast(cache) and projected.shape[0] == projected.shape[1] == 1 and projected.dtype == mx.float32
        )

    def steps_fast(self, cache: MambaCache | None) -> bool:
        """Whether a position's step runs through ``fast_step``: given one, and both states from earlier ones."""
        return (
            self.fast_step is not None
            and cache is not None
            and cache.conv_state is not None
            and cache.ssm_state is not None
        )

    def _step_fast(self, projected: mx.array, cache: MambaCache) -> tuple[mx.array, mx.array]:
        """One position's projected row through ``fast_step`` (updating both states): the gated readout, in the
        row's shape, and its partial sums of squares."""
        assert self.fast_step is not None and cache.conv_state is not None and cache.ssm_state is not None
        gated, cache.conv_state, cache.ssm_state, squares = self.fast_step(
            projected,
            cache.conv_state,
            self.conv1d.weight,
            self._step_conv_bias,
            self.dt_bias,
            self.A_log,
            self.D,
            cache.ssm_state,
            self._step_limits,
        )
        return gated, squares

    def norm_role(self) -> RowRole:
        """The output projection's part in fast numerics' fused block: it finishes the gated norm from the
        step's partial sums of squares, and adds the block's residual."""
        partials = self.inner_size // block_rows(self.num_heads, self.head_dim, self.n_groups)
        return RowRole(
            "residual", "group_norm", norm_groups=self.n_groups, norm_partials=partials, norm_eps=self.norm.eps
        )

    def fused_block(self, x: mx.array, normed: mx.array, cache: MambaCache) -> mx.array:
        """Fast numerics' block for one float32 row ``x``, normed ``normed``, with both states (:meth:`steps_fast`):
        ``x`` plus the mixer's output, the gated norm's last step and the add inside the output projection's
        kernel."""
        gated, squares = self._step_fast(self.in_proj(normed), cache)
        return self.out_proj.fused(gated, base=x, norm=(squares, self.norm.weight, self._norm_params))

    def chained_block(
        self, x: mx.array, normed: mx.array, cache: MambaCache, next_weight: mx.array
    ) -> tuple[mx.array, mx.array]:
        """:meth:`fused_block`, whose output projection also writes the next block's norm of its output (weight
        ``next_weight``): the block's output and the next block's input."""
        gated, squares = self._step_fast(self.in_proj(normed), cache)
        return self.out_proj.chained(gated, x, next_weight, norm=(squares, self.norm.weight, self._norm_params))

    def _causal_conv(self, conv_input: mx.array, cache: MambaCache | None) -> mx.array:
        keep = self.kernel_size - 1
        if cache is None:
            padded = mx.pad(conv_input, [(0, 0), (keep, 0), (0, 0)])
        else:
            history = cache.conv_state
            if history is None:
                history = mx.zeros((conv_input.shape[0], keep, self.conv_dim), dtype=conv_input.dtype)
            padded = mx.concatenate([history, conv_input], axis=1)
            cache.conv_state = padded[:, -keep:, :]
        return nn.silu(self.conv1d(padded))

    def __call__(self, x: mx.array, cache: MambaCache | None = None) -> mx.array:
        batch, length, _ = x.shape
        projected = self.in_proj(x)
        if self._takes_fast_step(projected, cache):
            assert cache is not None
            gated, _ = self._step_fast(projected, cache)
            return self.out_proj(self.norm.normalize(gated))
        conv_start = self.inner_size
        dt_start = conv_start + self.conv_dim
        gate = projected[..., :conv_start]
        conv_input = projected[..., conv_start:dt_start]
        dt_raw = projected[..., dt_start:]

        mixed = self._causal_conv(conv_input, cache)
        bc_width = self.n_groups * self.state_size
        head_inputs, b_mat, c_mat = mx.split(mixed, [self.inner_size, self.inner_size + bc_width], axis=-1)

        y, state = ssm_scan(
            head_inputs.reshape(batch, length, self.num_heads, self.head_dim),
            self.A_log,
            b_mat.reshape(batch, length, self.n_groups, self.state_size),
            c_mat.reshape(batch, length, self.n_groups, self.state_size),
            self.D.astype(head_inputs.dtype),
            dt_raw,
            self.dt_bias,
            None if cache is None else cache.ssm_state,
            (self.dt_min, self.dt_max),
        )
        if cache is not None:
            cache.ssm_state = state
        y = self.norm(y.reshape(batch, length, self.inner_size), gate)
        return self.out_proj(y)


class CausalSelfAttention(nn.Module):
    """Grouped-query attention without positional encoding (Nemotron-H's ``*`` blocks)."""

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.attention_head_dim
        self.scale = self.head_dim**-0.5
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        # Fast numerics: one position's heads and rows as one reshape each, where the reference reshapes and
        # transposes (the same elements in the same order when the length is one: a view fewer each way).
        self.one_row_views = False
        # Fast numerics on CUDA, once admitted: the single-position attention kernel that writes the new position
        # into the cache's buffers itself and reads the projections' rows as heads (attend_rows).
        self.fast_attention: DecodeAttention | None = None

    def _heads(self, projected: mx.array, count: int) -> mx.array:
        batch, length, _ = projected.shape
        if self.one_row_views and length == 1:
            return projected.reshape(batch, count, 1, -1)
        return projected.reshape(batch, length, count, -1).transpose(0, 2, 1, 3)

    def project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Queries, keys and values of ``x`` (B, L, D), split into heads."""
        return (
            self._heads(self.q_proj(x), self.num_heads),
            self._heads(self.k_proj(x), self.num_kv_heads),
            self._heads(self.v_proj(x), self.num_kv_heads),
        )

    def project_rows(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The query, key and value projections of one position ``x`` (B, 1, D) as rows (B, 1, heads·D): the
        memory of its heads, for :meth:`attend_rows`."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def attend_rows(self, q_rows: mx.array, k_rows: mx.array, v_rows: mx.array, cache: KVCache) -> mx.array:
        """One position's attention from its projections' rows (:meth:`project_rows`), stored in ``cache``; the
        mixed values as rows (B, 1, heads·D). Through :attr:`fast_attention` where it reads this cache (float32
        rows and buffers): one launch that writes the position into the buffers the cache keeps, where the
        reference's update slices the buffers around two writes and the attention takes heads made by views."""
        attention = self.fast_attention
        if attention is not None and q_rows.dtype == k_rows.dtype == v_rows.dtype == mx.float32:
            layout = PositionLayout(
                q_rows.shape[0], self.num_kv_heads, self.head_dim, self.head_dim, mx.float32, mx.float32
            )
            slot, filled = cache.reserve(layout)
            assert cache.keys is not None and cache.values is not None
            if cache.keys.dtype == cache.values.dtype == mx.float32:
                mixed = attention.attend_writing(
                    q_rows,
                    k_rows,
                    v_rows,
                    cache.keys,
                    cache.values,
                    attention.bounds(filled, slot),
                    attention.splits(filled),
                    self.scale,
                    position_axis=True,
                )
                # The kernel writes the position into these very buffers as it runs (engine.ops.cache).
                cache.advance(cache.keys, cache.values, written_by=mixed)
                return mixed
        heads = self._heads(q_rows, self.num_heads), self._heads(k_rows, self.num_kv_heads)
        return self._rows(self.attend(*heads, self._heads(v_rows, self.num_kv_heads), None, cache))

    def attend(
        self, queries: mx.array, keys: mx.array, values: mx.array, mask: AttentionMask, cache: KVCache | None
    ) -> mx.array:
        if cache is not None:
            keys, values = cache.update(keys, values)
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)

    def output(self, attended: mx.array) -> mx.array:
        return self.o_proj(self._rows(attended))

    def _rows(self, attended: mx.array) -> mx.array:
        if attended.ndim == 3:  # rows already (attend_rows)
            return attended
        batch, _, length, _ = attended.shape
        if self.one_row_views and length == 1:
            return attended.reshape(batch, 1, -1)
        return attended.transpose(0, 2, 1, 3).reshape(batch, length, -1)

    def output_fused(self, attended: mx.array, base: mx.array) -> mx.array:
        """``base + output(attended)`` for one row, the add inside the output projection's kernel."""
        return self.o_proj.fused(self._rows(attended), base=base)

    def output_chained(self, attended: mx.array, base: mx.array, next_weight: mx.array) -> tuple[mx.array, mx.array]:
        """:meth:`output_fused` and the next block's norm of it (weight ``next_weight``), from one kernel."""
        return self.o_proj.chained(self._rows(attended), base, next_weight)

    def __call__(self, x: mx.array, mask: AttentionMask, cache: KVCache | None = None) -> mx.array:
        return self.output(self.attend(*self.project(x), mask, cache))


class ReLU2MLP(nn.Module):
    """``down(relu(up(x))²)``, no gate."""

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.relu2(self.up_proj(x)))


class HybridBlock(nn.Module):
    """Pre-norm residual block around one mixer of the given kind (``M``, ``*`` or ``-``)."""

    def __init__(self, config: LLMConfig, kind: str) -> None:
        super().__init__()
        if kind not in BLOCK_KINDS:
            raise ValueError(f"unsupported Nemotron-H block type {kind!r} (expected one of {BLOCK_KINDS})")
        self.kind = kind
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        # Fast numerics: the projections of fused_projections have their fused rows (engine.numerics), so a
        # single row runs the block with the residual add (and the MLP's squared ReLU) inside their kernels.
        self.fused_rows = False
        self.mixer: Mamba2Mixer | CausalSelfAttention | ReLU2MLP
        if kind == MAMBA:
            self.mixer = Mamba2Mixer(config)
        elif kind == ATTENTION:
            self.mixer = CausalSelfAttention(config)
        else:
            self.mixer = ReLU2MLP(config)

    def fused_projections(self) -> list[tuple[nn.Module, RowRole]]:
        """The projections that fold the block's arithmetic around them into their kernels, each with its
        role (:mod:`engine.kernels.quantized_product`): the last adds the residual (Mamba's also finishes the gated
        norm), the MLP's up projection squares its ReLU."""
        mixer = self.mixer
        if isinstance(mixer, Mamba2Mixer):
            return [(mixer.out_proj, mixer.norm_role())]
        if isinstance(mixer, CausalSelfAttention):
            return [(mixer.o_proj, RowRole("residual"))]
        return [(mixer.up_proj, RowRole("relu2")), (mixer.down_proj, RowRole("residual"))]

    def __call__(self, x: mx.array, mask: AttentionMask, cache: LayerCache) -> mx.array:
        if self.fused_rows and x.dtype == mx.float32 and x.size == x.shape[-1]:
            fused = self._fused(x, mask, cache)
            if fused is not None:
                return fused
        normed = self.norm(x)
        if isinstance(self.mixer, Mamba2Mixer):
            assert cache is None or isinstance(cache, MambaCache)
            update = self.mixer(normed, cache)
        elif isinstance(self.mixer, CausalSelfAttention):
            assert cache is None or isinstance(cache, KVCache)
            update = self.mixer(normed, mask, cache)
        else:
            update = self.mixer(normed)
        return x + update

    def _fused(self, x: mx.array, mask: AttentionMask, cache: LayerCache) -> mx.array | None:
        """The block for one float32 row with its fused projections (None where the Mamba step cannot run
        yet: the states start with the first call)."""
        mixer = self.mixer
        if isinstance(mixer, Mamba2Mixer):
            assert cache is None or isinstance(cache, MambaCache)
            return mixer.fused_block(x, self.norm(x), cache) if mixer.steps_fast(cache) else None
        if isinstance(mixer, ReLU2MLP):
            return mixer.down_proj.fused(mixer.up_proj.fused(self.norm(x)), base=x)
        assert cache is None or isinstance(cache, KVCache)
        return mixer.output_fused(mixer.attend(*mixer.project(self.norm(x)), mask, cache), x)

    def chained(
        self, x: mx.array, normed: mx.array, cache: LayerCache, next_weight: mx.array
    ) -> tuple[mx.array, mx.array]:
        """A Mamba or MLP block in the LLM's chained step (:meth:`NemotronH._step`, chained): ``x`` and its norm
        ``normed`` (written by the block before) in; the block's output and the next block's norm of it (weight
        ``next_weight``) out, both from its last projection's kernel."""
        mixer = self.mixer
        if isinstance(mixer, Mamba2Mixer):
            assert isinstance(cache, MambaCache)
            return mixer.chained_block(x, normed, cache, next_weight)
        assert isinstance(mixer, ReLU2MLP), "an attention block is chained around its cache by the model's step"
        return mixer.down_proj.chained(mixer.up_proj.fused(normed), x, next_weight)


# --------------------------------------------------------------------------- model


class NemotronH(nn.Module):
    """The VoiceChat LLM backbone (weights under ``stt_model.llm.``), embeddings in, hidden states out."""

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = [HybridBlock(config, kind) for kind in config.hybrid_override_pattern]
        self.norm_f = nn.RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def make_cache(self) -> LLMCache:
        """Fresh, empty streaming state for one sequence (any batch size)."""
        layers: list[LayerCache] = []
        for layer in self.layers:
            if layer.kind == MAMBA:
                layers.append(MambaCache())
            elif layer.kind == ATTENTION:
                layers.append(KVCache())
            else:
                layers.append(None)
        return LLMCache(layers)

    def __call__(self, inputs_embeds: mx.array, cache: LLMCache | None = None) -> mx.array:
        """Hidden states (B, L, D) after ``norm_f`` for inputs (B, L, D); advances ``cache`` by L."""
        length = inputs_embeds.shape[1]
        if cache is not None and len(cache.layers) != len(self.layers):
            raise ValueError(f"cache has {len(cache.layers)} layer entries, the model {len(self.layers)} layers")
        if cache is not None and length == 1 and _states_ready(cache):
            return self._step(inputs_embeds, cache)
        # New positions attend causally among themselves and to every cached position;
        # a single position needs no mask.
        mask: AttentionMask = None if length == 1 else "causal"
        hidden = inputs_embeds
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, mask, None if cache is None else cache.layers[index])
        if cache is not None:
            cache.position += length
        return self.norm_f(hidden)

    # ----------------------------------------------------------------- compiled single-position step

    def next_norm(self, index: int) -> nn.RMSNorm:
        """The norm that block ``index``'s output meets next: the next block's, or ``norm_f`` after the last."""
        return self.layers[index + 1].norm if index + 1 < len(self.layers) else self.norm_f

    @property
    def _fast_parts(self) -> tuple[Any, ...]:
        """The fast parts a step's programs are traced with: the Mamba step and the quantized row products
        (engine.numerics gives every mixer and every quantized projection of one shape and role the same ones),
        and the last block's chained row (given to every block's last projection, or to none). The attention
        counts with the forms whose blocks merge their own shares, which change its launches."""
        step = self._first_mixer.fast_step if self._first_mixer is not None else None
        attention = self._first_attention.fast_attention if self._first_attention is not None else None
        merging = None if attention is None else attention.merged_forms
        projection = self._first_quantized
        if projection is None:
            return step, (attention, merging), None, None, None
        chained_row = getattr(self._last_projection, "chained_row", None)
        return step, (attention, merging), projection.fast_row, projection.fused_row, chained_row

    @functools.cached_property
    def _last_projection(self) -> nn.Module:
        """The last block's last projection, whose chained row (if any) writes ``norm_f``'s norm."""
        return self.layers[-1].fused_projections()[-1][0]

    @property
    def _chained(self) -> bool:
        """Whether the step runs chained: every block's last projection also writes the next block's norm of its
        output (fast numerics, :meth:`HybridBlock.chained`), so that no block launches a norm of its own."""
        return self._fast_parts[-1] is not None

    @functools.cached_property
    def _first_quantized(self) -> QuantizedLinear | None:
        """The first quantized projection (after loading: the checkpoint decides which are quantized)."""
        return next((module for module in self.modules() if isinstance(module, QuantizedLinear)), None)

    @property
    def _segments(self) -> list[tuple[str, tuple[int, ...], Callable[..., Any]]]:
        """The compiled pieces for the fast parts in use: a program's trace holds the parts it was traced
        with, so a model switched between numerics modes keeps one set of programs per mode."""
        parts = self._fast_parts
        if parts not in self._segment_sets:
            self._segment_sets[parts] = self._build_segments()
        return self._segment_sets[parts]

    @functools.cached_property
    def _first_mixer(self) -> Mamba2Mixer | None:
        """The first Mamba block's mixer: every mixer gets the same step (engine.numerics.apply_numerics)."""
        return next((layer.mixer for layer in self.layers if isinstance(layer.mixer, Mamba2Mixer)), None)

    @functools.cached_property
    def _first_attention(self) -> CausalSelfAttention | None:
        """The first attention block's mixer: every one gets the same attention kernel (engine.numerics)."""
        return next((layer.mixer for layer in self.layers if isinstance(layer.mixer, CausalSelfAttention)), None)

    @functools.cached_property
    def _segment_sets(self) -> dict[Any, list[tuple[str, tuple[int, ...], Callable[..., Any]]]]:
        return {}  # in the instance __dict__, outside the parameter tree

    def _build_segments(self) -> list[tuple[str, tuple[int, ...], Callable[..., Any]]]:
        """The stack as compiled pieces: runs of Mamba/MLP blocks, and attention blocks split around the cache."""
        segments: list[tuple[str, tuple[int, ...], Callable[..., Any]]] = []
        run: list[int] = []
        chained = self._chained

        def close_run() -> None:
            if run:
                indices = tuple(run)
                segments.append(("run", indices, jit(functools.partial(self._run_blocks, indices, chained))))
                run.clear()

        for index, layer in enumerate(self.layers):
            if layer.kind == ATTENTION:
                close_run()
                segments.append(("attention", (index,), jit(functools.partial(self._attention_inputs, index, chained))))
            else:
                run.append(index)
        close_run()
        return segments

    def _run_blocks(
        self, indices: tuple[int, ...], chained: bool, hidden: mx.array, *rest: mx.array
    ) -> tuple[mx.array, ...]:
        """Mamba and MLP blocks in order; ``rest`` is each Mamba block's (conv, ssm) state, in order, after (in the
        chained step) ``normed``, the first block's norm of ``hidden``, whose last block's norm for the block after
        it comes back beside its output."""
        normed, states = (rest[0], rest[1:]) if chained else (None, rest)
        pending = iter(states)
        updated: list[mx.array] = []
        for index in indices:
            layer = self.layers[index]
            cache = MambaCache(conv_state=next(pending), ssm_state=next(pending)) if layer.kind == MAMBA else None
            if normed is None:
                hidden = layer(hidden, None, cache)
            else:
                hidden, normed = layer.chained(hidden, normed, cache, self.next_norm(index).weight)
            if cache is not None:
                assert cache.conv_state is not None and cache.ssm_state is not None
                updated += [cache.conv_state, cache.ssm_state]
        return (hidden, *updated) if normed is None else (hidden, normed, *updated)

    def _attention_inputs(self, index: int, chained: bool, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """An attention block's queries, keys and values of its input ``x`` (chained: ``x`` normed already, by the
        block before): heads, or rows where its attention kernel reads them so
        (:meth:`CausalSelfAttention.attend_rows`)."""
        layer = self.layers[index]
        assert isinstance(layer.mixer, CausalSelfAttention)
        normed = x if chained else layer.norm(x)
        if layer.mixer.fast_attention is not None:
            return layer.mixer.project_rows(normed)
        return layer.mixer.project(normed)

    def _step(self, inputs_embeds: mx.array, cache: LLMCache) -> mx.array:
        """One position through the compiled segments. Chained (fast numerics, :attr:`_chained`), each block's
        output and the next block's norm of it come from one kernel: only the first block's norm is MLX's, and the
        last block's kernel writes ``norm_f``'s."""
        hidden = inputs_embeds
        normed = self.layers[0].norm(hidden) if self._chained else None
        for kind, indices, program in self._segments:
            if kind == "run":
                carried = (hidden,) if normed is None else (hidden, normed)
                hidden, *updated = program(*carried, *_mamba_states(cache, indices))
                if normed is not None:
                    normed, *updated = updated
                pending = iter(updated)
                for index in indices:
                    layer_cache = cache.layers[index]
                    if isinstance(layer_cache, MambaCache):
                        layer_cache.conv_state, layer_cache.ssm_state = next(pending), next(pending)
            else:
                (index,) = indices
                mixer = self.layers[index].mixer
                layer_cache = cache.layers[index]
                assert isinstance(mixer, CausalSelfAttention) and isinstance(layer_cache, KVCache)
                queries, keys, values = program(hidden if normed is None else normed)
                if mixer.fast_attention is not None:
                    attended = mixer.attend_rows(queries, keys, values, layer_cache)
                else:
                    attended = mixer.attend(queries, keys, values, None, layer_cache)
                if normed is None:
                    hidden = self._attention_residual(index)(hidden, attended)
                else:
                    hidden, normed = self._attention_residual(index)(hidden, attended)
        cache.position += 1
        return self._compiled_norm(hidden) if normed is None else normed

    @functools.cached_property
    def _compiled_norm(self) -> Callable[[mx.array], mx.array]:
        return jit(self.norm_f)

    def _attention_residual(self, index: int) -> Callable[[mx.array, mx.array], Any]:
        programs = self._residual_programs
        key = (index, self._fast_parts)
        if key not in programs:
            layer = self.layers[index]
            mixer = layer.mixer
            assert isinstance(mixer, CausalSelfAttention)
            if self._chained:
                next_norm = self.next_norm(index)
                programs[key] = jit(lambda hidden, attended: mixer.output_chained(attended, hidden, next_norm.weight))
            elif layer.fused_rows:
                programs[key] = jit(lambda hidden, attended: mixer.output_fused(attended, hidden))
            else:
                programs[key] = jit(lambda hidden, attended: hidden + mixer.output(attended))
        return programs[key]

    @functools.cached_property
    def _residual_programs(self) -> dict[tuple[int, Any], Callable[[mx.array, mx.array], Any]]:
        # Held in the instance __dict__ (not the module's parameter tree), like every cached_property here.
        return {}


def _mamba_states(cache: LLMCache, indices: tuple[int, ...]) -> list[mx.array]:
    """The (conv, ssm) states of the Mamba blocks among ``indices``, in order: a compiled run's inputs."""
    states: list[mx.array] = []
    for index in indices:
        layer_cache = cache.layers[index]
        if isinstance(layer_cache, MambaCache):
            assert layer_cache.conv_state is not None and layer_cache.ssm_state is not None
            states += [layer_cache.conv_state, layer_cache.ssm_state]
    return states


def _states_ready(cache: LLMCache) -> bool:
    """Every Mamba block has its state (after the first call), so a step has static shapes."""
    return all(
        layer.conv_state is not None and layer.ssm_state is not None
        for layer in cache.layers
        if isinstance(layer, MambaCache)
    )
