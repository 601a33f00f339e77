"""EAR-TTS's fast form: what fast numerics runs in the TTS, and how the TTS chooses it for itself.

:meth:`engine.networks.tts.EarTTS.use_numerics` calls :func:`bind`, which admits the TTS's kernels for this device
(:func:`engine.kernels.admission.fast_part`: each the kernel where it matched its fallback, else the fallback) and hands
each part of the network its own: the backbone's attention its single-position kernel, its caches the plan's dtype
and its query and key heads their kernel (on CUDA the attention writing its cache and making its heads, and its
blocks merging their shares), the backbone's layers and the MoG head's MLP their row products (on CUDA the backbone's
runs of them one launch each), the MoG head its guided projections and draw, the MaskGIT rounds the residual-VQ step
(on CUDA a round's quantizers in one launch), a step's draws one kernel, and on CUDA a token's text conditioning a
table of the vocabulary (:func:`use_condition_table`). The network keeps what was bound in its one slot,
:attr:`EarTTS.fast` (:class:`TTSFast`). docs/numerics.md says what each change does to the numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ...kernels.admission import admit_kernel, fast_part, gpu_kernel_backend
from ...kernels.decode_attention import (
    DecodeAttention,
    decode_attention_heads_ops,
    decode_attention_heads_samples,
    decode_attention_ops,
    decode_attention_samples,
    decode_attention_writing_ops,
    decode_attention_writing_samples,
)
from ...kernels.mixture_sample import MixtureSample, MixtureSampleShape, mixture_sample_ops, mixture_sample_samples
from ...kernels.norm_rope import NormRope, norm_rope_ops, norm_rope_samples
from ...kernels.plan import FastPlan
from ...kernels.residual_vq import (
    NearestRoundProduct,
    nearest_code_ops,
    nearest_code_sample,
    nearest_code_step,
    nearest_codes_ops,
    nearest_round_sample,
    reads_stored_codebook,
)
from ...kernels.row_chain import ChainBook
from ...kernels.row_parts import kernel_weight_dtype, row_chains, row_product_part, row_product_parts
from ...kernels.row_product import RowProductShape
from ...kernels.step_draws import (
    KeySkip,
    StepDraws,
    key_skip_samples,
    skip_key_ops,
    step_draws_ops,
    step_draws_samples,
)
from .backbone import GUIDED_ROWS, AttentionParts, LayerRowParts
from .mixture import MixtureRowParts
from .subword import CharacterTable

# engine.networks.tts.ear_tts.EarTTS, which imports this module: by its attributes here, not its class.
EarTTS = Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class TTSFast:
    """What :func:`bind` gave the TTS itself (its backbone and MoG head keep their own parts, set by :func:`bind`):
    the dtype the backbone's caches store keys and values in (None: the reference's float32), one quantizer's greedy
    step after its product (fast numerics' kernel, or the operations), on CUDA a round's quantizers in one launch by
    the round's count (rounds of one quantizer and counts not admitted take ``nearest`` quantizer by quantizer), a
    step's draws made at once from the generator's key (engine.kernels.step_draws; None: one by one, as each round
    needs them), the key moved on past a prefill's skipped draws (on CUDA one launch, else split by split), and
    which of fast mode's changes run as kernels."""

    cache_dtype: mx.Dtype | None
    nearest: Callable[..., tuple[mx.array, mx.array, mx.array]] = nearest_code_ops
    rounds: dict[int, Callable[..., tuple[mx.array, mx.array, mx.array]]] = dataclasses.field(default_factory=dict)
    draws: Callable[[mx.array], tuple[mx.array, ...]] | None = None
    skip_key: Callable[[mx.array, mx.array], mx.array] = skip_key_ops
    changes: tuple[tuple[str, bool], ...] = ()


def bind(
    tts: EarTTS, plan: FastPlan | None, *, vocabulary_size: int | None = None
) -> tuple[TTSFast | None, dict[str, bool]]:
    """Hand every part of ``tts`` its fast form for ``plan`` (None: exact mode, every slot emptied); returns the
    network's fast form and which changes run as kernels. Given the text ``vocabulary_size`` and the plan's
    characters, on CUDA a token's text conditioning is read from a table (:func:`use_condition_table`)."""
    changes: dict[str, bool] = {}
    on_gpu = plan is not None and plan.on_gpu
    attentions = [layer.self_attn for layer in tts.backbone.layers]
    attention: Callable[..., Any] | None = None
    # The backbone's caches store keys and values in the plan's dtype (bf16 as shipped: docs/numerics.md), where its
    # attention kernel (if any) reads them.
    cache_dtype = None if plan is None else plan.backbone_cache_dtype
    if plan is not None and attentions:
        first_attention = attentions[0]
        heads = (first_attention.num_heads, first_attention.num_kv_heads, first_attention.head_dim)
        attention, changes["decode_attention"], cache_dtype = backbone_attention(heads, cache_dtype)
    buffers = cache_dtype or mx.float32
    # The forms of the backbone's attention kernel in use whose blocks merge their own shares (CUDA, each admitted).
    merged_forms: dict[str, bool] = {}
    if plan is not None and isinstance(attention, DecodeAttention):
        merged_forms["read"] = merges_shares(
            attention,
            "read",
            ("attention_merged", *heads, buffers),
            decode_attention_ops,
            lambda: decode_attention_samples(*heads, buffers),
        )
    if plan is not None and attentions:
        # The kernel that also writes the new position into the cache buffers, where it matches the scatters and
        # the attention it replaces (outputs and written buffers).
        writes = False
        if isinstance(attention, DecodeAttention):
            kernel_attention = attention
            _, writes = fast_part(
                ("attention_writing", *heads, buffers),
                "single-position attention writing its cache",
                decode_attention_writing_ops,
                lambda backend: kernel_attention.writing_kernel(),
                lambda: decode_attention_writing_samples(*heads, buffers),
            )
            kernel_attention.writes_cache = writes
            if writes:
                merged_forms["writing"] = merges_shares(
                    kernel_attention,
                    "writing",
                    ("attention_writing_merged", *heads, buffers),
                    decode_attention_writing_ops,
                    lambda: decode_attention_writing_samples(*heads, buffers),
                )
        changes["attention_writes_cache"] = writes
    parts: dict[float, AttentionParts] = {}  # by RoPE base
    if plan is not None:
        # The norm-and-rotate kernel per RoPE base (local and global layers differ), its fallback per base too.
        for base in sorted({module.rope.base for module in attentions}):
            first_base = next(module for module in attentions if module.rope.base == base)
            layout = (first_base.num_heads, first_base.num_kv_heads, first_base.head_dim)
            eps, scale_dtype = first_base.q_norm.eps, first_base.q_norm.weight.dtype
            heads_part, used = fast_part(
                ("norm_rope", *layout, eps, base, scale_dtype),
                "query and key heads",
                functools.partial(norm_rope_ops, query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base),
                functools.partial(
                    NormRope, head_dim=layout[2], query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base
                ),
                functools.partial(norm_rope_samples, *layout, scale_dtype),
            )
            changes["norm_rope"] = changes.get("norm_rope", True) and used
            # Where the attention writes the cache, it may make the heads too (per base: its parameters differ).
            folded = False
            if writes and isinstance(heads_part, NormRope) and isinstance(attention, DecodeAttention):
                _, folded = fast_part(
                    ("attention_heads", *layout, eps, base, scale_dtype, buffers),
                    "single-position attention making its heads and writing its cache",
                    functools.partial(
                        decode_attention_heads_ops, query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base
                    ),
                    functools.partial(heads_kernel, attention, heads_part.params),
                    functools.partial(decode_attention_heads_samples, *layout, scale_dtype, buffers),
                )
                changes["attention_heads"] = changes.get("attention_heads", True) and folded
                if folded:
                    merged_forms["heads"] = merged_forms.get("heads", True) and merges_shares(
                        attention,
                        "heads",
                        ("attention_heads_merged", *layout, eps, base, scale_dtype, buffers),
                        functools.partial(
                            decode_attention_heads_ops, query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base
                        ),
                        functools.partial(decode_attention_heads_samples, *layout, scale_dtype, buffers),
                        rope=heads_part.params,
                    )
            assert attention is not None
            parts[base] = AttentionParts(attention, heads_part, folded, cache_dtype)
    for module in attentions:
        module.fast = parts.get(module.rope.base)
    if isinstance(attention, DecodeAttention):
        attention.merged_forms = frozenset(form for form, merges in merged_forms.items() if merges)
    if plan is not None and attentions:
        changes["attention_merges_shares"] = bool(merged_forms) and all(merged_forms.values())

    layers = list(tts.backbone.layers)
    row_parts: LayerRowParts | None = None
    weight_dtype = None
    if plan is not None and layers:
        projections = [linear for layer in layers for linear in layer.projection_layers()]
        weight_dtype = kernel_weight_dtype(projections, on_gpu)
        row_parts, changes["tts_row_products"] = backbone_row_parts(layers[0], GUIDED_ROWS, weight_dtype)
        if on_gpu and not changes["tts_row_products"]:
            # On a GPU the fallbacks, run op by op, would cost more than the compiled step they replace;
            # the CPU keeps them (the same arithmetic as that step), so the wiring is tested there.
            row_parts, weight_dtype = None, None
    for layer in layers:
        layer.rows = row_parts
        layer.row_weights = None if row_parts is None else layer.make_row_weights(weight_dtype)
    tts.backbone.row_chains = ChainBook()
    if row_parts is not None and plan is not None and plan.backend == "cuda":
        # The only backend with a chain kernel: the runs are not even looked for elsewhere.
        tts.backbone.row_chains, changes["tts_row_chains"] = row_chains("tts", tts.backbone.row_runs(), "cuda")
    elif plan is not None:
        changes["tts_row_chains"] = False

    head = tts.mog_head
    mixture_parts: MixtureRowParts | None = None
    weight_dtype = None
    mixture_layers = head.mlp_stack[:-1]
    if plan is not None and mixture_layers:
        projections = [linear for layer in mixture_layers for linear in layer.projection_layers()]
        weight_dtype = kernel_weight_dtype(projections, on_gpu)
        first_layer = mixture_layers[0]
        mixture_parts, changes["mog_row_products"] = mixture_row_parts(first_layer, GUIDED_ROWS, weight_dtype)
        if on_gpu and not changes["mog_row_products"]:
            mixture_parts, weight_dtype = None, None  # the compiled MaskGIT rounds' own operations
        if mixture_parts is not None:
            mixture_parts, changes["mog_sample"] = mixture_sample_parts(head, mixture_parts, tts.config)
            if on_gpu and not changes["mog_sample"]:
                mixture_parts = dataclasses.replace(mixture_parts, sampling=None, projections=None, sample=None)
    head.rows = mixture_parts
    head.sample_weights = None if mixture_parts is None else head.make_sample_weights()
    for layer in mixture_layers:
        layer.row_weights = None if mixture_parts is None else layer.make_row_weights(weight_dtype)

    nearest: Callable[..., Any] = nearest_code_ops
    if plan is not None:
        shape = (tts.config.codebook_size, tts.config.latent_size)
        types = (tts.rvq_embs.dtype, tts.codebook_norms[0].dtype)  # precast codebooks keep bf16 norms
        nearest, changes["residual_vq"] = fast_part(
            ("residual_vq", *shape, *types),
            "residual-VQ step",
            nearest_code_ops,
            nearest_code_step,
            functools.partial(nearest_code_sample, *shape, *types),
            tolerance=0.0,  # the operations' codes and rows, bit for bit, or not used
        )
    # A round's quantizers in one launch, per round size, where the step with its product was admitted.
    rounds: dict[int, Callable[..., Any]] = {}
    if plan is not None and changes.get("residual_vq") and reads_stored_codebook(plan.backend):
        every_round = True
        for count in sorted({round_.count for round_ in tts.plan if round_.count > 1}):
            part, used = fast_part(
                ("residual_vq_round", count, *shape, *types),
                f"residual-VQ round of {count} quantizers",
                nearest_codes_ops,
                functools.partial(NearestRoundProduct, count=count),
                functools.partial(nearest_round_sample, count, *shape, *types),
                tolerance=0.0,
            )
            every_round = every_round and used
            if used:
                rounds[count] = part
        changes["residual_vq_rounds"] = every_round
    elif plan is not None:
        changes["residual_vq_rounds"] = False
    draws: Callable[..., Any] | None = None
    if plan is not None:
        draw_plan = tts.draw_plan()
        draws, changes["step_draws"] = fast_part(
            ("step_draws", draw_plan),
            "step's random draws",
            functools.partial(step_draws_ops, plan=draw_plan),
            functools.partial(StepDraws, plan=draw_plan),
            step_draws_samples,
            tolerance=0.0,  # the library's draws, bit for bit, or not used
        )
        if on_gpu and not changes["step_draws"]:
            draws = None  # drawn one by one, as in exact mode
    skip_key: Callable[..., Any] = skip_key_ops
    if draws is not None:
        skip_key, changes["key_skip"] = fast_part(
            ("key_skip",), "prefill's skipped draws", skip_key_ops, KeySkip, key_skip_samples, tolerance=0.0
        )
    elif plan is not None:
        changes["key_skip"] = False
    if plan is not None and plan.characters is not None and vocabulary_size is not None:
        changes["condition_table"] = plan.backend == "cuda" and use_condition_table(
            tts, plan.characters, vocabulary_size
        )
    if plan is None:
        return None, changes
    return TTSFast(cache_dtype, nearest, rounds, draws, skip_key, tuple(changes.items())), changes


def bf16_weight_names(tts: EarTTS, backend: str | None) -> set[str]:
    """Names (under ``tts``) of the weights fast mode's kernels read in bf16, directly: the backbone's projections
    and the MoG head's MLP projections (the row products), the MoG head's mean tables (``proj_mus.weight``,
    ``low_mat``: the draw reads its component's rows of them, and the operations, gathering those rows first, widen
    only them), and where ``backend``'s residual-VQ step forms the distance product
    (:func:`engine.kernels.residual_vq.reads_stored_codebook`) the codebooks. A model loaded for fast numerics does
    not precast them (:func:`engine.loading.precast.precast_float32`)."""
    read = {id(linear) for layer in tts.backbone.layers for linear in layer.projection_layers()}
    read.update(id(linear) for layer in tts.mog_head.mlp_stack[:-1] for linear in layer.projection_layers())
    names = {f"{path}.weight" for path, module in tts.named_modules() if id(module) in read}
    names.update(("mog_head.proj_mus.weight", "mog_head.low_mat"))
    if reads_stored_codebook(backend):
        names.add("rvq_embs")
    return names


def backbone_attention(
    heads: tuple[int, int, int], cache_dtype: mx.Dtype | None
) -> tuple[Callable[..., Any], bool, mx.Dtype | None]:
    """The TTS backbone's single-position attention for caches of ``cache_dtype`` (None: float32), its kernel
    admitted on such buffers: ``(attention, kernel in use, cache dtype)``. Where a GPU's kernel reads no such
    buffers, the caches stay float32 and the kernel is admitted on those (a slower attention would cost more than
    the bytes saved); the CPU has no kernel and keeps the dtype."""

    def admitted_on(dtype: mx.Dtype) -> tuple[Callable[..., Any], bool]:
        return fast_part(
            ("attention", *heads, dtype),
            "single-position attention",
            decode_attention_ops,
            lambda backend: DecodeAttention(backend, *heads),
            lambda: decode_attention_samples(*heads, dtype),
        )

    buffers = cache_dtype or mx.float32
    attention, used = admitted_on(buffers)
    if not used and buffers != mx.float32 and gpu_kernel_backend() is not None:
        log.warning("the backbone's caches stay float32: its attention kernel reads no %s buffers here", buffers)
        cache_dtype = None
        attention, used = admitted_on(mx.float32)
    return attention, used, cache_dtype


def merges_shares(
    attention: Any,
    form: str,
    key: tuple[Any, ...],
    fallback: Callable[..., Any],
    sample: Callable[[], list[tuple[Any, ...]]],
    rope: mx.array | None = None,
) -> bool:
    """Whether ``attention``'s (an :class:`engine.kernels.decode_attention.DecodeAttention`) ``form`` may run with its
    blocks merging their own shares: that kernel admitted against the form's ``fallback`` on ``sample``, whose inputs
    include one past a block's keys (CUDA only)."""
    _, merges = fast_part(
        key,
        f"single-position attention ({form} form) merging its shares",
        fallback,
        lambda backend: attention.merged_kernel(form, rope),
        sample,
    )
    return merges


def heads_kernel(attention: Any, rope: mx.array, backend: str) -> Callable[..., Any]:
    """The attention kernel that makes its heads (:meth:`engine.kernels.decode_attention.DecodeAttention.heads_kernel`),
    as :func:`engine.kernels.admission.fast_part` makes kernels: by backend (the attention's is fixed already)."""
    kernel: Callable[..., Any] = attention.heads_kernel(rope)
    return kernel


def backbone_row_parts(layer: Any, rows: int, weight_dtype: mx.Dtype | None) -> tuple[Any, bool]:
    """The row-product parts of a TTS backbone layer (the kernels where admitted, else the fallbacks);
    the flag says whether every one is a kernel."""
    attention, mlp, norm = layer.self_attn, layer.mlp, layer.input_layernorm
    width, eps, scale_dtype = norm.weight.shape[0], norm.eps, norm.weight.dtype
    dtype = weight_dtype if weight_dtype is not None else attention.q_proj.weight.dtype
    qkv = (attention.q_proj.weight.shape[0], attention.k_proj.weight.shape[0], attention.v_proj.weight.shape[0])
    inner = mlp.gate_proj.weight.shape[0]
    heads = attention.num_kv_heads  # the values come out as the cache stores them
    shapes = {
        "first_qkv": RowProductShape(rows, width, qkv, "norm", value_heads=heads),
        "qkv": RowProductShape(rows, width, qkv, "residual_norm", value_heads=heads),
        "output": RowProductShape(rows, attention.o_proj.weight.shape[1], (width,), "none"),
        "gate_up": RowProductShape(rows, width, (inner, inner), "residual_norm", "gelu_gate"),
        "down": RowProductShape(rows, inner, (width,), "none"),
    }
    parts, every = row_product_parts("TTS", shapes, dtype, scale_dtype, dict.fromkeys(shapes, eps))
    return LayerRowParts(rows=rows, **parts, shapes=tuple(shapes.items())), every


def mixture_row_parts(layer: Any, rows: int, weight_dtype: mx.Dtype | None) -> tuple[Any, bool]:
    """The row-product parts of the MoG head's MLP layers (the kernels where admitted, else the fallbacks);
    the flag says whether every one is a kernel."""
    mlp = layer.mlp
    width, eps = mlp.gate_proj.weight.shape[1], layer.pre_norm.eps
    inner = mlp.gate_proj.weight.shape[0]
    dtype = weight_dtype if weight_dtype is not None else mlp.gate_proj.weight.dtype
    shapes = {
        "first_gate_up": RowProductShape(rows, width, (inner, inner), "norm", "gelu_gate"),
        "gate_up": RowProductShape(rows, width, (inner, inner), "residual_norm", "gelu_gate"),
        "down": RowProductShape(rows, inner, (width,), "none"),
    }
    # The norms' 1 + w is formed in float32 (engine.networks.tts.subword.FloatRMSNorm).
    parts, every = row_product_parts("MoG", shapes, dtype, mx.float32, dict.fromkeys(shapes, eps))
    mixture = MixtureRowParts(
        rows=rows, first_gate_up=parts["first_gate_up"], gate_up=parts["gate_up"], down=parts["down"]
    )
    return mixture, every


def mixture_sample_parts(head: Any, parts: Any, config: Any) -> tuple[Any, bool]:
    """``parts`` with the MoG head's draw after its layers (:class:`engine.networks.tts.MixtureRowParts`): the guided
    row product of the three projections and :mod:`engine.kernels.mixture_sample`'s kernel, each the kernel where
    admitted, else its operations; the flag says whether both are kernels. A config the kernel does not take
    (no guidance, or no nucleus) keeps the head's operations (False)."""
    final_norm = head.mlp_stack[-1]
    width, eps = final_norm.weight.shape[0], final_norm.eps
    latent = head.proj_else.weight.shape[0]
    if head.mlp_stack[-2].post_norm.eps != eps:  # the guided product's prologue takes one eps for both norms
        return parts, False
    try:
        shape = MixtureSampleShape(
            head.num_components,
            latent,
            head.low_rank,
            width,
            eps,
            config.guidance_scale,
            config.top_p,
            head.min_log_std,
            config.noise_scale,
        )
    except ValueError as exc:
        log.info("the MoG draw keeps its operations (%s)", exc)
        return parts, False
    weight_dtype = head.proj_logits.weight.dtype
    product = RowProductShape(2, width, (head.num_components, latent, 1), "residual_norm", guided=True)
    projections, kernel = row_product_part(
        product, weight_dtype, mx.float32, eps, "MoG guided projections row product", config.guidance_scale
    )
    means_dtype = head.proj_mus.weight.dtype
    sample, sampled = fast_part(
        ("mixture_sample", shape, means_dtype),
        "MoG draw",
        functools.partial(mixture_sample_ops, shape=shape),
        functools.partial(MixtureSample, shape=shape),
        functools.partial(mixture_sample_samples, shape, means_dtype),
        reference_device=mx.cpu,
    )
    sampling = (config.guidance_scale, config.top_p, config.noise_scale)
    return dataclasses.replace(parts, sampling=sampling, projections=projections, sample=sample), kernel and sampled


# A token's conditioning read from the vocabulary's table against the same token encoded alone, as a frame
# encoded it before the table (relative L2 over the checked tokens). The table's rows come from bf16 products over
# many rows, which accumulate in another order than one row's, so a bf16 value may round one step apart (at most
# 2^-7 of it): the bound is every value a step apart. A row of another token is about 1.4 away.
CONDITION_TABLE_TOLERANCE = 2**-7
# Tokens the load checks the table on: the first and last ids, the longest spelling, and this many more at random.
CONDITION_TABLE_CHECKS = 13


def use_condition_table(tts: EarTTS, characters: CharacterTable, size: int) -> bool:
    """Fast numerics' table of every token's text conditioning: a frame gathers its token's row where it
    encoded the token's spelling (about 85 primitives a frame on CUDA, and the character encoder's weights read
    every frame). Made once per vocabulary size
    (:meth:`engine.networks.tts.subword.CharAwareSubwordEncoder.encode_vocabulary`)
    and used only where its rows match the tokens encoded alone, as a frame encodes them, within
    :data:`CONDITION_TABLE_TOLERANCE` (else the log says why and frames encode the token as before). True when in
    use. The table holds the vocabulary × the TTS width in the character embedding's dtype (0.3 GB at full size
    in bf16). Made on CUDA only (:func:`bind`), where a primitive costs the host about 20 µs and the
    vocabulary's pass a fraction of a second; on Metal the trade (seconds of a Mac's GPU at load against about
    85 primitives a frame at a few µs each) is not measured, and the CPU would take hours at full size."""
    if tts.has_condition_table(size):
        return True
    spelling = characters.on_device(size)
    encoder = tts.embed_subword
    table = encoder.encode_vocabulary(spelling)
    lengths = np.array(spelling.lengths)
    picks = np.random.default_rng(0).choice(size, size=min(size, CONDITION_TABLE_CHECKS), replace=False)
    checked = mx.array(np.unique([0, size - 1, int(lengths.argmax()), *picks.tolist()]).astype(np.int32))

    def alone(ids: mx.array) -> mx.array:
        rows = [encoder.encode_on_device(ids[index : index + 1].reshape(1, 1), spelling) for index in range(ids.size)]
        return mx.concatenate([row.reshape(1, -1) for row in rows])

    admitted = admit_kernel(
        "text conditioning table", lambda ids: table[ids], alone, (checked,), tolerance=CONDITION_TABLE_TOLERANCE
    )
    tts.use_condition_table(table if admitted else None, size)
    return admitted
