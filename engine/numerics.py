"""Numerics modes: ``exact`` (the reference's arithmetic, bit for bit) and ``fast`` (a written decision).

This module is the policy only: which mode, the :class:`engine.kernels.plan.FastPlan` it builds for this device,
and :func:`apply_numerics`, which hands that plan to each network's ``use_numerics`` and merges what each reports
(which of fast mode's changes run as kernels). Each network keeps its fast form beside it
(``engine/networks/<network>/fast.py``). What fast mode changes, why each change is safe and how far it moves the
numbers is docs/numerics.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Literal

import mlx.core as mx

from .kernels.admission import fast_part, gpu_kernel_backend
from .kernels.plan import FastPlan
from .kernels.row_parts import kernel_weight_dtype as _kernel_weight_dtype
from .kernels.row_parts import row_chains as _row_chains
from .kernels.row_parts import row_product_parts as _row_product_parts

Numerics = Literal["exact", "fast"]
NUMERICS: tuple[Numerics, ...] = ("exact", "fast")

# Rows the encoder's streaming layers carry: one 80 ms frame of one conversation.
ENCODER_ROWS = 1
# The environment variable that can turn off fast mode's RN-T loop in one launch
# (engine.kernels.greedy_attempt.GreedyLoop) on CUDA: "0" leaves the attempts one launch each. On by default since its
# barrier's counters sit on a ticket line (kernel_tickets): in an array of 8 bytes, which MLX keeps on the host, the
# loop took 20.3 ms a frame; on a line, 0.87 ms in isolation against its attempt kernels' 0.67, and whole frames level
# with them within noise on an H100 (tests/device/greedy_loop_probe.py and row_chains_ab.py, in git history), for 51
# primitives a frame fewer.
RNNT_LOOP_SETTING = "PARLEY_RNNT_LOOP"
# The dtype fast mode's TTS backbone caches store keys and values in (docs/numerics.md; the plan carries it to the
# TTS, engine.networks.tts.fast). float32 here would leave fast mode's arithmetic the reference's but for the order of
# its sums (what the drift test's tight bounds check, with this so set).
BACKBONE_CACHE_DTYPE: mx.Dtype = mx.bfloat16

log = logging.getLogger(__name__)


def check_numerics(value: str) -> Numerics:
    if value not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}; got {value!r}")
    return value  # type: ignore[return-value]


def rnnt_loop_wanted() -> bool:
    """Whether fast mode builds the RN-T loop in one launch: unless :data:`RNNT_LOOP_SETTING` turns it off."""
    return os.environ.get(RNNT_LOOP_SETTING, "1").strip().lower() not in ("0", "false", "no", "off")


def apply_numerics(
    model: object, numerics: Numerics, *, release: bool = True, characters: Any = None
) -> dict[str, bool]:
    """Prepare a loaded model for ``numerics``; returns which of fast mode's changes run as kernels.

    Exact mode runs the reference's operations (undoing fast mode on a model that had it).
    Fast mode gives each Mamba-2 mixer the fused step, the TTS backbone's and the encoder's
    attention their single-position kernels (and the TTS its query and key heads kernel), the
    TTS backbone, the MoG head's MLP and the encoder's streaming layers row products, the MoG head
    its guided projections and draw, the LLM's quantized projections their one-row kernel, the
    MaskGIT rounds the residual-VQ kernel, the RN-T its attempts' kernels (on CUDA a frame's attempts as one
    launch), the codec decoder's blocks their convolution-and-norm kernel, and the codec's dequantization the
    code-sum kernel — and on CUDA the encoder's and the backbone's runs of row products one launch each: each the kernel
    where it matched its fallback on this device, else the fallback (operations; always so on the CPU).
    On CUDA, given the model's ``characters`` (:class:`engine.networks.tts.subword.CharacterTable`), fast mode also
    reads a token's text conditioning from a table made at load (:func:`use_condition_table`).
    Either way the weights are untouched, so a loaded model switches in place. Fast mode on
    precast weights makes bf16 copies of those its row products read; exact mode, with
    ``release``, lets them go with the compiled programs that hold them (a switch back to fast
    makes and traces them again). A benchmark alternating the modes keeps both ready.
    """
    import functools

    from mlx.utils import tree_flatten

    from .kernels.code_sum import CodeSum, code_sum_ops, code_sum_samples
    from .kernels.conv_norm import ConvNorm, conv_norm_ops
    from .kernels.conv_norm import variants_for as conv_norm_variants
    from .kernels.relative_attention import RelativeDecodeAttention, relative_attention_samples, relative_window_samples
    from .networks.codec import Codec
    from .networks.encoder import (
        ConformerLayer,
        ConformerRowParts,
        FastConformer,
        RelativePositionAttention,
        attend_relative,
        attend_relative_window,
    )
    from .networks.linear import KeepsCopy, QuantizedLinear
    from .networks.llm import NemotronH
    from .networks.rnnt import RNNTJoint, RNNTPredictor
    from .networks.tts import EarTTS

    fast = check_numerics(numerics) == "fast"
    modules = [module for _, module in model.named_modules()]  # type: ignore[attr-defined]
    changes: dict[str, bool] = {}
    fast_plan = (
        FastPlan.for_this_device(
            release=release,
            rnnt_loop=rnnt_loop_wanted(),
            backbone_cache_dtype=BACKBONE_CACHE_DTYPE,
            characters=characters,
        )
        if fast
        else None
    )
    llms = [module for module in modules if isinstance(module, NemotronH)]
    for llm in llms:
        changes.update(llm.use_numerics(fast_plan))
    # The text vocabulary a conditioning table covers (the text head's rows).
    vocabulary = model.stt_model.text_vocabulary_size if hasattr(model, "stt_model") else None  # type: ignore[attr-defined]
    for tts in (module for module in modules if isinstance(module, EarTTS)):
        changes.update(tts.use_numerics(fast_plan, release=release, vocabulary_size=vocabulary))

    relatives = [module for module in modules if isinstance(module, RelativePositionAttention)]
    relative: Callable[..., Any] | None = None
    if fast and relatives:
        first_relative = relatives[0]
        shape = (first_relative.heads, first_relative.head_dim)
        relative, changes["relative_attention"] = fast_part(
            ("relative", *shape, first_relative.pos_bias_u.dtype),
            "encoder attention",
            attend_relative,
            lambda backend: RelativeDecodeAttention(backend, *shape),
            lambda: relative_attention_samples(*shape, first_relative.pos_bias_u.dtype),
        )
    window: Callable[..., Any] | None = None
    if fast and relatives:
        window, changes["relative_window"] = fast_part(
            ("relative_window", *shape, first_relative.pos_bias_u.dtype),
            "encoder attention window",
            attend_relative_window,
            lambda backend: RelativeDecodeAttention(backend, *shape).window,
            lambda: relative_window_samples(*shape, first_relative.pos_bias_u.dtype),
        )
    for module in relatives:
        module.fast_attention = relative
        module.fast_window = window

    on_gpu = gpu_kernel_backend() is not None
    conformers = [module for module in modules if isinstance(module, ConformerLayer)]
    conformer_parts: ConformerRowParts | None = None
    weight_dtype: mx.Dtype | None = None
    projections = encoder_row_projections(model)
    if fast and conformers and relative is not None and not any("bias" in module for module in projections):
        weight_dtype = _kernel_weight_dtype(projections, on_gpu)
        conformer_parts, changes["encoder_row_products"] = _conformer_row_parts(conformers[0], weight_dtype)
        if on_gpu and not (changes["encoder_row_products"] and changes["relative_attention"]):
            conformer_parts, weight_dtype = None, None  # the compiled encoder's operations, as in exact mode
    for conformer in conformers:
        conformer.rows = conformer_parts
        conformer.row_weights = None if conformer_parts is None else conformer.make_row_weights(weight_dtype)
    encoders = [module for module in modules if isinstance(module, FastConformer)]
    _apply_row_chains("encoder", encoders, fast and conformer_parts is not None, fast, changes)

    if not fast and release:
        # Exact mode reads no bf16 copy: release those a switch to fast made, and the programs holding them.
        for module in modules:
            if isinstance(module, KeepsCopy):
                module.forget_copy()
            elif isinstance(module, FastConformer):
                module.forget_row_programs()
    # The quantized projections outside the LLM (the text and function heads) take their one-row product too.
    in_llm = {id(module) for llm in llms for module in llm.modules()}
    heads_rows = [
        module.use_numerics(fast_plan)
        for module in modules
        if isinstance(module, QuantizedLinear) and id(module) not in in_llm
    ]
    if fast and (heads_rows or "quantized_rows" in changes):
        changes["quantized_rows"] = changes.get("quantized_rows", True) and all(heads_rows)

    joints = [module for module in modules if isinstance(module, RNNTJoint)]
    for predictor in (module for module in modules if isinstance(module, RNNTPredictor)):
        predictor.fused_cell = fast  # the cell update left to fuse, where the attempts run as operations
        attempt_parts = None
        if fast and len(joints) == 1:
            attempt_parts, changes["rnnt_attempts"], changes["rnnt_loop"] = _attempt_parts(predictor, joints[0])
            if on_gpu and not changes["rnnt_attempts"]:
                attempt_parts = None  # the compiled loop's operations (the CPU keeps the fallbacks, tested there)
        predictor.use_attempt_parts(attempt_parts)

    for codec in (module for module in modules if isinstance(module, Codec)):
        blocks = codec.decoder.blocks
        conv_norm: Callable[..., Any] | None = None
        dtype = codec.activation_dtype()
        eps = {block.norm.eps for block in blocks}
        taps = {block.dwconv.weight.shape[1] for block in blocks}
        # The kernel rounds in the activations' dtype, which is every block parameter's dtype as published.
        uniform = all(value.dtype == dtype for block in blocks for _, value in tree_flatten(block.parameters()))
        if fast and blocks and uniform and len(eps) == len(taps) == 1:
            (norm_eps,), (kernel_size,) = eps, taps
            # The first variant whose outputs are the operations' bits on this device (engine.kernels.conv_norm).
            for variant in conv_norm_variants(gpu_kernel_backend()):
                conv_norm, changes["codec_conv_norm"] = fast_part(
                    ("codec_conv_norm", norm_eps, kernel_size, dtype, variant),
                    f"codec convolution and norm ({variant.label})",
                    functools.partial(conv_norm_ops, eps=norm_eps),
                    functools.partial(ConvNorm, eps=norm_eps, dtype=dtype, variant=variant),
                    functools.partial(_conv_norm_samples, codec.decoder.stream_shapes(), kernel_size, dtype),
                    tolerance=0.0,  # on inputs whose convolution sums are exact: the operations' bits, or not used
                )
                if changes["codec_conv_norm"]:
                    break
            if on_gpu and not changes["codec_conv_norm"]:
                conv_norm = None  # the compiled step's operations, as in exact mode
        for block in blocks:
            block.fast_conv_norm = conv_norm
        code_sum: Callable[..., Any] | None = None
        if fast:
            quantizers, table_dtype = len(codec.prvq.mus_list), codec.prvq.mus_list[0].dtype
            size, width = codec.prvq.mus_list[0].shape
            code_sum, changes["codec_code_sum"] = fast_part(
                ("codec_code_sum", table_dtype),
                "codec dequantization",
                code_sum_ops,
                CodeSum,
                functools.partial(code_sum_samples, quantizers, size, width, table_dtype),
                tolerance=0.0,  # bit-identical to the operations, or not used
            )
            if on_gpu and not changes["codec_code_sum"]:
                code_sum = None
        codec.prvq.fast_sum = code_sum
    return changes


def _conv_norm_samples(shapes: list[tuple[int, int]], taps: int, dtype: mx.Dtype) -> list[tuple[Any, ...]]:
    """The codec kernel's admission inputs at each decoder stage's shape (see
    :func:`engine.kernels.conv_norm.conv_norm_samples`)."""
    from .kernels.conv_norm import conv_norm_samples

    return [conv_norm_samples(positions, channels, taps, dtype) for positions, channels in shapes]


# One set of attempt parts per predictor layout and device, so that a model switched back and forth gets the
# same object again and its compiled greedy loops are reused (engine.networks.rnnt.GreedyPrograms keys them by it).
_ATTEMPT_PARTS: dict[tuple[Any, ...], tuple[Any, bool, bool]] = {}


def _attempt_parts(predictor: Any, joint: Any) -> tuple[Any, bool, bool]:
    """One RN-T greedy attempt's parts (:mod:`engine.kernels.greedy_attempt`: each the kernel where admitted, else its
    operations), or None for a layout they do not take; the flags say whether every one is a kernel, and
    whether the parts run a frame's attempts as one launch (:class:`engine.kernels.greedy_attempt.GreedyLoop`, built
    unless :func:`rnnt_loop_wanted` says no, admitted bit for bit against the attempt kernels, and only where all of
    them are kernels)."""
    import dataclasses
    import functools

    from .kernels.greedy_attempt import (
        AttemptParts,
        GreedyLoop,
        GreedyLoopShape,
        JointRow,
        LSTMStep,
        greedy_loop_ops,
        greedy_loop_samples,
        joint_row_ops,
        joint_row_samples,
        lstm_step_ops,
        lstm_step_samples,
    )

    lstm, table = predictor.prediction["dec_rnn"].lstm, predictor.prediction["embed"].weight
    output = joint.joint_net[-1]
    if any("bias" not in module for module in (*lstm, joint.pred, output)):
        return None, False, False
    weight_dtype, bias_dtype = lstm[0].Wx.dtype, lstm[0].bias.dtype
    dtypes = {table.dtype, *(array.dtype for layer in lstm for array in (layer.Wx, layer.Wh, layer.bias))}
    if not dtypes <= {mx.float32, mx.bfloat16} or len({(layer.Wx.dtype, layer.bias.dtype) for layer in lstm}) > 1:
        return None, False, False
    width = predictor.hidden_size
    # The reference multiplies a bf16 embedding row by bf16 weights in bf16: one rounding of the sum, kept.
    rounded = table.dtype == weight_dtype == bias_dtype == mx.bfloat16
    layout = GreedyLoopShape(
        width,
        len(lstm),
        table.shape[0],
        joint.pred.weight.shape[0],
        output.weight.shape[0],
        joint.activation_name,
        rounded,
    )
    steps, scores, hidden = layout.steps(), layout.scores(), layout.joint_row()
    types = (table.dtype, weight_dtype, bias_dtype, joint.pred.weight.dtype, output.weight.dtype)
    looping = rnnt_loop_wanted()
    key = (layout, types, gpu_kernel_backend(), looping)
    if key not in _ATTEMPT_PARTS:
        made: dict[str, Callable[..., Any]] = {}
        every = True
        for name, step in steps.items():
            made[name], used = fast_part(
                ("lstm_step", step, table.shape[0], types[:3]),
                f"RN-T {name} LSTM step",
                functools.partial(lstm_step_ops, shape=step),
                functools.partial(LSTMStep, shape=step),
                functools.partial(lstm_step_samples, step, table.shape[0], *types[:3]),
                reference_device=mx.cpu,
            )
            every = every and used
        for name, shape, weight in (("joint_hidden", hidden, joint.pred), ("joint_partials", scores, output)):
            made[name], used = fast_part(
                ("joint_row", shape, weight.weight.dtype, weight.bias.dtype),
                f"RN-T {name.replace('_', ' ')} row",
                functools.partial(joint_row_ops, shape=shape),
                functools.partial(JointRow, shape=shape),
                functools.partial(joint_row_samples, shape, weight.weight.dtype, weight.bias.dtype),
                reference_device=mx.cpu,
            )
            every = every and used
        parts = AttemptParts(**made, loop_shape=layout)
        looped = False
        if every and looping:  # the loop in one launch, against the attempt kernels it runs in turn
            projections = (joint.pred.weight, joint.pred.bias, output.weight, output.bias)
            loop, looped = fast_part(
                ("greedy_loop", layout, types, *(array.dtype for array in projections)),
                "RN-T greedy loop",
                functools.partial(greedy_loop_ops, parts, shape=layout),
                functools.partial(GreedyLoop, shape=layout),
                functools.partial(greedy_loop_samples, layout, *types[:3], *(a.dtype for a in projections)),
                tolerance=0.0,
            )
            if looped:
                parts = dataclasses.replace(parts, loop=loop)
        _ATTEMPT_PARTS[key] = (parts, every, looped)
    return _ATTEMPT_PARTS[key]


def fast_bf16_weights(model: object, backend: str | None) -> frozenset[str]:
    """Parameter names of the weights fast mode's kernels read in bf16, directly: the encoder's one-row
    projections, and the TTS's (:func:`engine.networks.tts.fast.bf16_weight_names`). A model loaded for fast numerics
    does not precast them (:func:`engine.loading.precast.precast_float32`)."""
    from .networks.tts import EarTTS
    from .networks.tts.fast import bf16_weight_names

    read = {id(projection) for projection in encoder_row_projections(model)}
    named = model.named_modules()  # type: ignore[attr-defined]
    names = {f"{path}.weight" for path, module in named if id(module) in read}
    for path, module in model.named_modules():  # type: ignore[attr-defined]
        if isinstance(module, EarTTS):
            names.update(f"{path}.{name}" for name in bf16_weight_names(module, backend))
    return frozenset(names)


def kept_bf16_weights(model: object, numerics: Numerics, backend: str | None) -> frozenset[str]:
    """What a model loaded for ``numerics`` keeps in bf16 rather than precast: :func:`fast_bf16_weights` for fast
    numerics, nothing for exact."""
    return fast_bf16_weights(model, backend) if check_numerics(numerics) == "fast" else frozenset()


def encoder_row_projections(model: object) -> list[Any]:
    """The encoder's projections that fast numerics' row products read (every layer's
    :meth:`engine.networks.encoder.ConformerLayer.projection_layers`)."""
    from .networks.encoder import ConformerLayer

    modules = [module for _, module in model.named_modules()]  # type: ignore[attr-defined]
    layers = [module for module in modules if isinstance(module, ConformerLayer)]
    return [projection for layer in layers for projection in layer.projection_layers()]


def _conformer_row_parts(layer: Any, weight_dtype: mx.Dtype | None) -> tuple[Any, bool]:
    """The row-product parts of a Conformer layer for a stream's newest frame (the kernels where admitted,
    else the fallbacks); the flag says whether every one is a kernel."""
    from .kernels.row_product import RowProductShape
    from .networks.encoder import ConformerRowParts

    norm, conv = layer.norm_feed_forward1, layer.conv
    width, hidden = norm.weight.shape[0], layer.feed_forward1.linear1.weight.shape[0]
    dtype = weight_dtype if weight_dtype is not None else layer.feed_forward1.linear1.weight.dtype
    taps = conv.depthwise_conv.weight.shape[1]
    rows = ENCODER_ROWS
    shapes = {
        "feed_forward_up": RowProductShape(rows, width, (hidden,), "layer_norm", "silu"),
        "feed_forward_down": RowProductShape(rows, hidden, (width,), "none", "residual", factor=0.5),
        "qkv": RowProductShape(rows, width, (width, width, width), "layer_norm"),
        "output": RowProductShape(rows, width, (width,), "none", "residual"),
        "convolution_in": RowProductShape(rows, width, (2 * width,), "layer_norm", "glu"),
        "convolution_out": RowProductShape(rows, width, (width,), "conv_norm", "residual", taps=taps),
    }
    if layer.norm_out.eps == norm.eps:  # one eps for both norms: the previous layer's output norm folds in
        shapes["feed_forward_up_twice"] = RowProductShape(rows, width, (hidden,), "layer_norm_twice", "silu")
    # The convolution module's norm may have an eps of its own.
    eps = {name: conv.batch_norm.eps if name == "convolution_out" else norm.eps for name in shapes}
    parts, every = _row_product_parts("encoder", shapes, dtype, norm.weight.dtype, eps)
    return ConformerRowParts(**parts, shapes=tuple(shapes.items())), every


def _apply_row_chains(network: str, modules: list[Any], chained: bool, fast: bool, changes: dict[str, bool]) -> None:
    """Give each of a network's ``modules`` (those with ``row_chains`` and ``row_runs()``) its chains where
    ``chained`` (fast numerics with the network's row parts) on CUDA (the only backend with a chain kernel: the
    runs are not even looked for elsewhere), else none; fast mode records the flag as
    ``changes[f"{network}_row_chains"]``."""
    from .kernels.row_chain import ChainBook

    for module in modules:
        module.row_chains = ChainBook()
        if chained and gpu_kernel_backend() == "cuda":
            module.row_chains, changes[f"{network}_row_chains"] = _row_chains(network, module.row_runs(), "cuda")
        elif fast:
            changes[f"{network}_row_chains"] = False


def set_numerics(voicechat: object, numerics: Numerics, *, release: bool = True) -> None:
    """Switch a loaded :class:`engine.model.VoiceChat` to ``numerics`` in place (sessions opened after it use it;
    ``release``: see :func:`apply_numerics`)."""
    voicechat.fast_changes = apply_numerics(  # type: ignore[attr-defined]
        voicechat.model,  # type: ignore[attr-defined]
        numerics,
        release=release,
        characters=voicechat.characters,  # type: ignore[attr-defined]
    )
    voicechat.numerics = numerics  # type: ignore[attr-defined]
