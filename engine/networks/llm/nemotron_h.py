"""Nemotron-H: the hybrid Mamba-2 / attention / ReLU² language model of VoiceChat.

The stack is given by ``LLMConfig.hybrid_override_pattern``, one character per block:
``M`` Mamba-2 mixer, ``*`` causal self-attention (no positional encoding), ``-``
ReLU² MLP. Every block is pre-norm residual, ``x + mixer(rms_norm(x))``, and the stack
ends in ``norm_f``. The model takes input embeddings (VoiceChat fuses text, function
and audio channels before the LLM) and returns the final hidden states; the
vocabulary heads live with the caller.

Streaming state is explicit (:mod:`engine.streaming`): :meth:`NemotronH.make_state` returns an
:class:`LLMCache` holding one :class:`MambaCache` per Mamba block and one :class:`KVCache` per
attention block, and :meth:`NemotronH.step` advances it by one position. The caches reproduce the
reference runtime's dtype behaviour exactly (see :class:`KVCache`), because the attention results
depend on it. Fast numerics' forms are :mod:`.fast`'s, kept in each module's ``fast`` slot and
chosen by :meth:`NemotronH.use_numerics`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ...hooks import NO_HOOKS, FrameHooks
from ...jit import jit
from ...kernels.admission import kernel_constants
from ...kernels.fused_step import MambaShape
from ...kernels.plan import FastPlan
from ...kernels.quantized_product import grouped_rms_norm
from ...loading.config import LLMConfig
from ...ops.cache import AttentionMask, KVCache
from ..linear import Linear
from .fast import AttentionFast, BlockFast, LLMFast, MambaFast, bind
from .ssm import silu_gate, ssm_scan
from .state import ATTENTION, BLOCK_KINDS, MAMBA, LayerCache, LLMCache, MambaCache

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
        # Fast numerics: one position's step as one part (engine.networks.llm.fast.MambaFast), or None.
        self.fast: MambaFast | None = None

    @property
    def step_shape(self) -> MambaShape:
        """The sizes a single-position step reads (engine.kernels.fused_step)."""
        return MambaShape(
            self.num_heads, self.head_dim, self.n_groups, self.state_size, self.kernel_size, self.conv_dim
        )

    def step_weights(self) -> tuple[mx.array, ...]:
        """The parameters a single-position step reads, as it reads them: the convolution's weight and bias
        (zeros where the checkpoint has none), ``dt_bias``, ``A_log``, ``D`` and the time-step clip."""
        bias = getattr(self.conv1d, "bias", None)
        conv_bias = mx.zeros((self.conv_dim,)) if bias is None else bias
        limits = kernel_constants(self.dt_min, self.dt_max)
        return self.conv1d.weight, conv_bias, self.dt_bias, self.A_log, self.D, limits

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
        convolved: mx.array = nn.silu(self.conv1d(padded))
        return convolved

    def __call__(self, x: mx.array, cache: MambaCache | None = None) -> mx.array:
        batch, length, _ = x.shape
        projected = self.in_proj(x)
        if self.fast is not None and self.fast.takes(projected, cache):
            assert cache is not None
            gated, _ = self.fast.step_row(self, projected, cache)
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
        # Fast numerics: one position's heads and rows as one reshape each, and on CUDA the attention kernel that
        # writes its cache (engine.networks.llm.fast.AttentionFast), or None.
        self.fast: AttentionFast | None = None

    def heads(self, projected: mx.array, count: int) -> mx.array:
        """``projected`` (B, L, count·D) as heads (B, count, L, D)."""
        batch, length, _ = projected.shape
        if self.fast is not None and length == 1:
            return projected.reshape(batch, count, 1, -1)
        return projected.reshape(batch, length, count, -1).transpose(0, 2, 1, 3)

    def project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Queries, keys and values of ``x`` (B, L, D), split into heads."""
        return (
            self.heads(self.q_proj(x), self.num_heads),
            self.heads(self.k_proj(x), self.num_kv_heads),
            self.heads(self.v_proj(x), self.num_kv_heads),
        )

    def project_rows(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The query, key and value projections of one position ``x`` (B, 1, D) as rows (B, 1, heads·D): the
        memory of its heads, for fast numerics' attention kernel (:meth:`.fast.AttentionFast.attend_rows`)."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def attend(
        self, queries: mx.array, keys: mx.array, values: mx.array, mask: AttentionMask, cache: KVCache | None
    ) -> mx.array:
        if cache is not None:
            keys, values = cache.update(keys, values)
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)

    def output(self, attended: mx.array) -> mx.array:
        return self.o_proj(self.rows(attended))

    def rows(self, attended: mx.array) -> mx.array:
        """Attended heads (B, heads, L, D) as rows (B, L, heads·D)."""
        if attended.ndim == 3:  # rows already (attend_rows)
            return attended
        batch, _, length, _ = attended.shape
        if self.fast is not None and length == 1:
            return attended.reshape(batch, 1, -1)
        return attended.transpose(0, 2, 1, 3).reshape(batch, length, -1)

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
        # Fast numerics: the block's projections have their fused rows, so a single row runs the block with the
        # residual add (and the MLP's squared ReLU) inside their kernels (engine.networks.llm.fast.BlockFast).
        self.fast: BlockFast | None = None
        self.mixer: Mamba2Mixer | CausalSelfAttention | ReLU2MLP
        if kind == MAMBA:
            self.mixer = Mamba2Mixer(config)
        elif kind == ATTENTION:
            self.mixer = CausalSelfAttention(config)
        else:
            self.mixer = ReLU2MLP(config)

    def __call__(self, x: mx.array, mask: AttentionMask, cache: LayerCache) -> mx.array:
        if self.fast is not None and x.dtype == mx.float32 and x.size == x.shape[-1]:
            fused = self.fast(self, x, mask, cache)
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


# --------------------------------------------------------------------------- model


class NemotronH(nn.Module):
    """The VoiceChat LLM backbone (weights under ``stt_model.llm.``), embeddings in, hidden states out."""

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = [HybridBlock(config, kind) for kind in config.hybrid_override_pattern]
        self.norm_f = nn.RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        # Fast numerics' form (engine.networks.llm.fast), set by use_numerics; None in exact mode.
        self.fast: LLMFast | None = None

    def use_numerics(self, plan: FastPlan | None) -> dict[str, bool]:
        """Run fast numerics' forms for ``plan`` (None: exact mode's operations); returns which of fast mode's
        changes to the LLM run as kernels (:func:`.fast.bind`)."""
        self.fast, changes = bind(self, plan)
        return changes

    def make_state(self) -> LLMCache:
        """The streaming contract's state (:mod:`engine.streaming`): :meth:`make_cache`."""
        return self.make_cache()

    def step(self, state: LLMCache, x: mx.array, hooks: FrameHooks = NO_HOOKS) -> mx.array:
        """The streaming contract's step: the hidden states after ``norm_f`` for input embeddings ``x`` (B, L, D),
        advancing ``state`` by L (compiled for one position once every state is ready)."""
        return self(x, state)

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
        normed: mx.array = self.norm_f(hidden)
        return normed

    # ----------------------------------------------------------------- compiled single-position step

    def next_norm(self, index: int) -> nn.RMSNorm:
        """The norm that block ``index``'s output meets next: the next block's, or ``norm_f`` after the last."""
        return self.layers[index + 1].norm if index + 1 < len(self.layers) else self.norm_f

    @property
    def _fast_parts(self) -> tuple[Any, ...]:
        """What a step's programs are traced with: the fast form's parts (:attr:`.fast.LLMFast.key`), or exact
        mode's none."""
        return EXACT_PARTS if self.fast is None else self.fast.key

    @property
    def _chained(self) -> bool:
        """Whether the step runs chained: every block's last projection also writes the next block's norm of its
        output (fast numerics, :meth:`.fast.BlockFast.chained`), so that no block launches a norm of its own."""
        return self.fast is not None and self.fast.chained

    @property
    def _segments(self) -> list[tuple[str, tuple[int, ...], Callable[..., Any]]]:
        """The compiled pieces for the fast parts in use: a program's trace holds the parts it was traced
        with, so a model switched between numerics modes keeps one set of programs per mode."""
        parts = self._fast_parts
        if parts not in self._segment_sets:
            self._segment_sets[parts] = self._build_segments()
        return self._segment_sets[parts]

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
                assert layer.fast is not None
                hidden, normed = layer.fast.chained(layer, hidden, normed, cache, self.next_norm(index).weight)
            if cache is not None:
                assert cache.conv_state is not None and cache.ssm_state is not None
                updated += [cache.conv_state, cache.ssm_state]
        return (hidden, *updated) if normed is None else (hidden, normed, *updated)

    def _attention_inputs(self, index: int, chained: bool, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """An attention block's queries, keys and values of its input ``x`` (chained: ``x`` normed already, by the
        block before): heads, or rows where its attention kernel reads them so
        (:meth:`.fast.AttentionFast.attend_rows`)."""
        layer = self.layers[index]
        assert isinstance(layer.mixer, CausalSelfAttention)
        normed = x if chained else layer.norm(x)
        if layer.mixer.fast is not None and layer.mixer.fast.kernel is not None:
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
                if mixer.fast is not None and mixer.fast.kernel is not None:
                    attended = mixer.fast.attend_rows(mixer, queries, keys, values, layer_cache)
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
            fast = mixer.fast
            if self._chained:
                assert fast is not None
                next_norm = self.next_norm(index)
                programs[key] = jit(
                    lambda hidden, attended: fast.output_chained(mixer, attended, hidden, next_norm.weight)
                )
            elif layer.fast is not None:
                assert fast is not None
                programs[key] = jit(lambda hidden, attended: fast.output_fused(mixer, attended, hidden))
            else:
                programs[key] = jit(lambda hidden, attended: hidden + mixer.output(attended))
        return programs[key]

    @functools.cached_property
    def _residual_programs(self) -> dict[tuple[int, Any], Callable[[mx.array, mx.array], Any]]:
        # Held in the instance __dict__ (not the module's parameter tree), like every cached_property here.
        return {}


# What a step's programs hold in exact mode (no fast part): the shape of LLMFast.key.
EXACT_PARTS: tuple[Any, ...] = (None, (None, None), None, None, False)


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
