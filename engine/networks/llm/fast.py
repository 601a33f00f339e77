"""Nemotron-H's fast form: what fast numerics runs in the LLM, and how the LLM chooses it for itself.

:meth:`engine.networks.llm.NemotronH.use_numerics` calls :func:`bind`, which admits the LLM's kernels for this
device (:func:`engine.kernels.admission.fast_part`: each the kernel where it matched its fallback, else the
fallback) and hands each block its part: the Mamba mixers a fused step (:class:`MambaFast`), the attention blocks
one-row views and, on CUDA, the attention kernel that writes its cache (:class:`AttentionFast`), every quantized
projection its one-row product, and each block its fused form (:class:`BlockFast`: the residual add, the MLP's
squared ReLU and the mixer's gated norm inside its projections' kernels; chained, the next block's norm too). The
model keeps the result in its one slot, :attr:`NemotronH.fast` (:class:`LLMFast`). docs/numerics.md says what each
change does to the numbers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ...kernels.admission import fast_part, kernel_constants
from ...kernels.decode_attention import DecodeAttention, decode_attention_writing_ops, decode_attention_writing_samples
from ...kernels.fused_step import FusedStep, block_rows, fused_step_ops, fused_step_sample
from ...kernels.plan import FastPlan
from ...kernels.quantized_product import RowRole
from ...ops.cache import AttentionMask, KVCache, PositionLayout
from ..linear import QuantizedLinear, quantized_row_part
from .state import ATTENTION, MAMBA, MLP, LayerCache, MambaCache

# The modules of engine.networks.llm.nemotron_h, which imports this module: by their block kind here, not their class.
Mixer = Any
Block = Any

StepPart = Callable[..., tuple[mx.array, mx.array, mx.array, mx.array]]


@dataclass(frozen=True, eq=False)
class MambaFast:
    """A Mamba mixer's single-position step as one part (:class:`engine.kernels.fused_step.FusedStep` or its
    operations fallback) and the constants it reads: the gated readout, both new states and the readout's partial
    sums of squares, from the position's whole input projection."""

    step: StepPart
    limits: mx.array  # the time-step clip, as a kernel reads it
    norm_params: mx.array  # the gated norm's eps, for a kernel finishing the norm
    conv_bias: mx.array  # the convolution's bias (zeros where the checkpoint has none)

    @classmethod
    def of(cls, mixer: Mixer, step: StepPart) -> MambaFast:
        bias = getattr(mixer.conv1d, "bias", None)
        conv_bias = mx.zeros((mixer.conv_dim,)) if bias is None else bias
        return cls(step, kernel_constants(mixer.dt_min, mixer.dt_max), kernel_constants(mixer.norm.eps), conv_bias)

    @staticmethod
    def ready(cache: MambaCache | None) -> bool:
        """Whether a position's step can run through the part: both states from earlier positions."""
        return cache is not None and cache.conv_state is not None and cache.ssm_state is not None

    def takes(self, projected: mx.array, cache: MambaCache | None) -> bool:
        """One position of one row with both states from earlier positions, in float32 (the step's types)."""
        return self.ready(cache) and projected.shape[0] == projected.shape[1] == 1 and projected.dtype == mx.float32

    def step_row(self, mixer: Mixer, projected: mx.array, cache: MambaCache) -> tuple[mx.array, mx.array]:
        """One position's projected row through the part (updating both states): the gated readout, in the row's
        shape, and its partial sums of squares."""
        assert cache.conv_state is not None and cache.ssm_state is not None
        gated, cache.conv_state, cache.ssm_state, squares = self.step(
            projected,
            cache.conv_state,
            mixer.conv1d.weight,
            self.conv_bias,
            mixer.dt_bias,
            mixer.A_log,
            mixer.D,
            cache.ssm_state,
            self.limits,
        )
        return gated, squares

    def block(self, mixer: Mixer, x: mx.array, normed: mx.array, cache: MambaCache) -> mx.array:
        """The fused block for one float32 row ``x``, normed ``normed``, with both states (:meth:`ready`): ``x``
        plus the mixer's output, the gated norm's last step and the add inside the output projection's kernel."""
        gated, squares = self.step_row(mixer, mixer.in_proj(normed), cache)
        assert isinstance(mixer.out_proj, QuantizedLinear)
        return mixer.out_proj.fused(gated, base=x, norm=(squares, mixer.norm.weight, self.norm_params))

    def chained(
        self, mixer: Mixer, x: mx.array, normed: mx.array, cache: MambaCache, next_weight: mx.array
    ) -> tuple[mx.array, mx.array]:
        """:meth:`block`, whose output projection also writes the next block's norm of its output (weight
        ``next_weight``): the block's output and the next block's input."""
        gated, squares = self.step_row(mixer, mixer.in_proj(normed), cache)
        assert isinstance(mixer.out_proj, QuantizedLinear)
        return mixer.out_proj.chained(gated, x, next_weight, norm=(squares, mixer.norm.weight, self.norm_params))


@dataclass(frozen=True, eq=False)
class AttentionFast:
    """An attention block's fast form: one position's heads and rows as one reshape each (where the reference
    reshapes and transposes: the same elements in the same order when the length is one), and on CUDA, once
    admitted, the single-position attention kernel that writes the new position into the cache's buffers itself
    and reads the projections' rows as heads (:meth:`attend_rows`)."""

    kernel: DecodeAttention | None = None

    def attend_rows(
        self, mixer: Mixer, q_rows: mx.array, k_rows: mx.array, v_rows: mx.array, cache: KVCache
    ) -> mx.array:
        """One position's attention from its projections' rows (:meth:`CausalSelfAttention.project_rows`), stored
        in ``cache``; the mixed values as rows (B, 1, heads·D). Through the kernel where it reads this cache
        (float32 rows and buffers): one launch that writes the position into the buffers the cache keeps, where
        the reference's update slices the buffers around two writes and the attention takes heads made by views."""
        attention = self.kernel
        if attention is not None and q_rows.dtype == k_rows.dtype == v_rows.dtype == mx.float32:
            layout = PositionLayout(
                q_rows.shape[0], mixer.num_kv_heads, mixer.head_dim, mixer.head_dim, mx.float32, mx.float32
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
                    mixer.scale,
                    position_axis=True,
                )
                # The kernel writes the position into these very buffers as it runs (engine.ops.cache).
                cache.advance(cache.keys, cache.values, written_by=mixed)
                return mixed
        heads = mixer.heads(q_rows, mixer.num_heads), mixer.heads(k_rows, mixer.num_kv_heads)
        attended: mx.array = mixer.rows(mixer.attend(*heads, mixer.heads(v_rows, mixer.num_kv_heads), None, cache))
        return attended

    @staticmethod
    def output_fused(mixer: Mixer, attended: mx.array, base: mx.array) -> mx.array:
        """``base + output(attended)`` for one row, the add inside the output projection's kernel."""
        assert isinstance(mixer.o_proj, QuantizedLinear)
        return mixer.o_proj.fused(mixer.rows(attended), base=base)

    @staticmethod
    def output_chained(
        mixer: Mixer, attended: mx.array, base: mx.array, next_weight: mx.array
    ) -> tuple[mx.array, mx.array]:
        """:meth:`output_fused` and the next block's norm of it (weight ``next_weight``), from one kernel."""
        assert isinstance(mixer.o_proj, QuantizedLinear)
        return mixer.o_proj.chained(mixer.rows(attended), base, next_weight)


class BlockFast:
    """A block's fused form for one float32 row: its projections' fused parts (kernel or operations) fold the
    residual add, the MLP's squared ReLU and the Mamba mixer's gated norm into their kernels."""

    def __call__(self, block: Block, x: mx.array, mask: AttentionMask, cache: LayerCache) -> mx.array | None:
        """The block for one float32 row (None where the Mamba step cannot run yet: the states start with the
        first call)."""
        mixer = block.mixer
        if block.kind == MAMBA:
            assert cache is None or isinstance(cache, MambaCache)
            if mixer.fast is None or not mixer.fast.ready(cache):
                return None
            assert cache is not None
            mamba_out: mx.array = mixer.fast.block(mixer, x, block.norm(x), cache)
            return mamba_out
        if block.kind == MLP:
            assert isinstance(mixer.up_proj, QuantizedLinear) and isinstance(mixer.down_proj, QuantizedLinear)
            return mixer.down_proj.fused(mixer.up_proj.fused(block.norm(x)), base=x)
        assert cache is None or isinstance(cache, KVCache)
        return AttentionFast.output_fused(mixer, mixer.attend(*mixer.project(block.norm(x)), mask, cache), x)

    def chained(
        self, block: Block, x: mx.array, normed: mx.array, cache: LayerCache, next_weight: mx.array
    ) -> tuple[mx.array, mx.array]:
        """A Mamba or MLP block in the LLM's chained step: ``x`` and its norm ``normed`` (written by the block
        before) in; the block's output and the next block's norm of it (weight ``next_weight``) out, both from its
        last projection's kernel."""
        mixer = block.mixer
        if block.kind == MAMBA:
            assert isinstance(cache, MambaCache) and mixer.fast is not None
            mamba_chained: tuple[mx.array, mx.array] = mixer.fast.chained(mixer, x, normed, cache, next_weight)
            return mamba_chained
        assert block.kind == MLP, "an attention block is chained around its cache by the model's step"
        assert isinstance(mixer.up_proj, QuantizedLinear) and isinstance(mixer.down_proj, QuantizedLinear)
        return mixer.down_proj.chained(mixer.up_proj.fused(normed), x, next_weight)


BLOCK_FAST = BlockFast()


@dataclass(frozen=True, eq=False)
class LLMFast:
    """The LLM's fast form as bound (:func:`bind`): the parts its step's programs are traced with, and whether the
    step runs chained — every block's last projection also writes the next block's norm of its output, so that no
    block launches a norm of its own (all blocks, or none)."""

    step: StepPart | None
    attention: DecodeAttention | None
    chained: bool
    # The first quantized projection's row parts (every quantized projection of one shape and role gets the same
    # ones): found once here, since walking the model's modules costs about 0.6 ms, and the step asks every frame.
    rows: tuple[Any, Any] = (None, None)

    @property
    def key(self) -> tuple[Any, ...]:
        """What a step's program holds: the Mamba step and the attention kernel (with the forms whose blocks merge
        their own shares, which change its launches), the quantized row parts and the chained flag."""
        merging = None if self.attention is None else self.attention.merged_forms
        return self.step, (self.attention, merging), *self.rows, self.chained


def fused_projections(block: Block) -> list[tuple[nn.Module, RowRole]]:
    """The projections that fold a block's arithmetic around them into their kernels, each with its role
    (:mod:`engine.kernels.quantized_product`): the last adds the residual (Mamba's also finishes the gated norm
    from the step's partial sums of squares), the MLP's up projection squares its ReLU."""
    mixer = block.mixer
    if block.kind == MAMBA:
        partials = mixer.inner_size // block_rows(mixer.num_heads, mixer.head_dim, mixer.n_groups)
        role = RowRole(
            "residual", "group_norm", norm_groups=mixer.n_groups, norm_partials=partials, norm_eps=mixer.norm.eps
        )
        return [(mixer.out_proj, role)]
    if block.kind == ATTENTION:
        return [(mixer.o_proj, RowRole("residual"))]
    return [(mixer.up_proj, RowRole("relu2")), (mixer.down_proj, RowRole("residual"))]


def bind(llm: Any, plan: FastPlan | None) -> tuple[LLMFast | None, dict[str, bool]]:
    """Hand every block of ``llm`` its fast part for ``plan`` (None: exact mode, every slot emptied); returns the
    model's fast form and which changes run as kernels (``fused_mamba_step``, ``llm_attention``,
    ``llm_attention_merges_shares``, ``quantized_rows``)."""
    changes: dict[str, bool] = {}
    modules = [module for _, module in llm.named_modules()]
    blocks = list(llm.layers)
    mixers = [block.mixer for block in blocks if block.kind == MAMBA]
    step: StepPart | None = None
    if plan is not None and mixers:
        shape = mixers[0].step_shape
        step, changes["fused_mamba_step"] = fast_part(
            ("mamba", shape.heads, shape.head_dim, shape.groups, shape.state_size, mixers[0].conv1d.weight.dtype),
            "Mamba-2 step",
            functools.partial(fused_step_ops, groups=shape.groups),
            lambda backend: FusedStep(backend, shape.heads, shape.head_dim, shape.groups, shape.state_size),
            lambda: fused_step_sample(shape, *mixers[0].step_weights()),
        )
    for mixer in mixers:
        mixer.fast = None if step is None else MambaFast.of(mixer, step)

    # The attention blocks: the writing form of the TTS backbone's kernel for their heads (CUDA only), reading the
    # projections' rows as heads and writing each new position into the cache's buffers.
    attentions = [block.mixer for block in blocks if block.kind == ATTENTION]
    attention: DecodeAttention | None = None
    if plan is not None and attentions:
        heads = (attentions[0].num_heads, attentions[0].num_kv_heads, attentions[0].head_dim)
        writing_part, changes["llm_attention"] = fast_part(
            ("llm_attention_writing", *heads),
            "the LLM's single-position attention writing its cache",
            decode_attention_writing_ops,
            lambda backend: DecodeAttention(backend, *heads).writing_kernel(),
            lambda: decode_attention_writing_samples(*heads),
        )
        owner = getattr(writing_part, "__self__", None)  # the admitted check is a method of its DecodeAttention
        attention = owner if changes["llm_attention"] and isinstance(owner, DecodeAttention) else None
        changes["llm_attention_merges_shares"] = False
        if attention is not None:
            kernel = attention
            _, merges = fast_part(
                ("llm_attention_writing_merged", *heads),
                "single-position attention (writing form) merging its shares",
                decode_attention_writing_ops,
                lambda backend: kernel.merged_kernel("writing", None),
                lambda: decode_attention_writing_samples(*heads),
            )
            attention.merged_forms = frozenset({"writing"} if merges else ())
            changes["llm_attention_merges_shares"] = merges
    for module in attentions:
        module.fast = None if plan is None else AttentionFast(attention)

    quantized = [module for module in modules if isinstance(module, QuantizedLinear)]
    every_row = bool(quantized)
    for module in quantized:
        every_row = module.use_numerics(plan) and every_row
    for block in blocks:
        # A block runs fused only when every projection of it has its fused part (kernel or operations).
        fused = fused_projections(block)
        block.fast = None
        if plan is not None and all(isinstance(p, QuantizedLinear) and "bias" not in p for p, _ in fused):
            made = True
            for projection, role in fused:
                assert isinstance(projection, QuantizedLinear)
                norm_dtype = block.mixer.norm.weight.dtype if role.prologue == "group_norm" else None
                projection.fused_row, used = quantized_row_part(projection, role, norm_dtype)
                made = made and projection.fused_row is not None
                every_row = every_row and used
            block.fast = BLOCK_FAST if made else None
    # With every block fused, each block's last projection also writes the next block's norm of its output (the
    # chained step): all of them, or none.
    chained = False
    if plan is not None and blocks and all(block.fast is not None for block in blocks):
        lasts = [fused_projections(block)[-1] for block in blocks]
        for index, (block, (projection, role)) in enumerate(zip(blocks, lasts, strict=True)):
            assert isinstance(projection, QuantizedLinear)
            norm_dtype = block.mixer.norm.weight.dtype if role.prologue == "group_norm" else None
            next_norm = llm.next_norm(index)
            chained_role = dataclasses.replace(role, epilogue="residual_norm", next_eps=next_norm.eps)
            projection.chained_row, used = quantized_row_part(
                projection, chained_role, norm_dtype, next_norm.weight.dtype
            )
            every_row = every_row and used
        chained = all(isinstance(p, QuantizedLinear) and p.chained_row is not None for p, _ in lasts)
        if not chained:
            for projection, _ in lasts:
                assert isinstance(projection, QuantizedLinear)
                projection.chained_row = None
    if plan is not None and quantized:
        changes["quantized_rows"] = every_row
    if plan is None:
        return None, changes
    rows = (None, None) if not quantized else (quantized[0].fast_row, quantized[0].fused_row)
    return LLMFast(step, attention, chained, rows), changes
