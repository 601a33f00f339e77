"""Numerics modes: ``exact`` (the reference's arithmetic, bit for bit) and ``fast`` (a written decision).

This module is the policy only: which mode, the :class:`engine.kernels.plan.FastPlan` it builds for this device,
and :func:`apply_numerics`, which hands that plan to each network's ``use_numerics`` and merges what each reports
(which of fast mode's changes run as kernels). Each network keeps its fast form beside it
(``engine/networks/<network>/fast.py``). What fast mode changes, why each change is safe and how far it moves the
numbers is docs/numerics.md.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from .kernels.plan import FastPlan
from .networks.codec import Codec
from .networks.linear import KeepsCopy, QuantizedLinear
from .networks.llm import NemotronH
from .networks.perception import FastConformer, Perception, encoder_row_projections
from .networks.rnnt import RNNTJoint, RNNTPredictor
from .networks.rnnt.fast import rnnt_loop_wanted
from .networks.tts import EarTTS
from .networks.tts.fast import bf16_weight_names

Numerics = Literal["exact", "fast"]
NUMERICS: tuple[Numerics, ...] = ("exact", "fast")

# The dtype fast mode's TTS backbone caches store keys and values in (docs/numerics.md; the plan carries it to the
# TTS, engine.networks.tts.fast). float32 here would leave fast mode's arithmetic the reference's but for the order of
# its sums (what the drift test's tight bounds check, with this so set).
BACKBONE_CACHE_DTYPE: mx.Dtype = mx.bfloat16

log = logging.getLogger(__name__)


def check_numerics(value: str) -> Numerics:
    if value not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}; got {value!r}")
    return value


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
    vocabulary = model.stt_model.text_vocabulary_size if hasattr(model, "stt_model") else None
    for tts in (module for module in modules if isinstance(module, EarTTS)):
        changes.update(tts.use_numerics(fast_plan, release=release, vocabulary_size=vocabulary))

    for perception in (module for module in modules if isinstance(module, Perception)):
        changes.update(perception.use_numerics(fast_plan))

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
        changes.update(predictor.use_numerics(fast_plan, joints[0] if len(joints) == 1 else None))

    for codec in (module for module in modules if isinstance(module, Codec)):
        changes.update(codec.use_numerics(fast_plan))
    return changes


def fast_bf16_weights(model: nn.Module, backend: str | None) -> frozenset[str]:
    """Parameter names of the weights fast mode's kernels read in bf16, directly: the encoder's one-row
    projections, and the TTS's (:func:`engine.networks.tts.fast.bf16_weight_names`). A model loaded for fast numerics
    does not precast them (:func:`engine.loading.precast.precast_float32`)."""
    read = {id(projection) for projection in encoder_row_projections(model)}
    named = model.named_modules()
    names = {f"{path}.weight" for path, module in named if id(module) in read}
    for path, module in model.named_modules():
        if isinstance(module, EarTTS):
            names.update(f"{path}.{name}" for name in bf16_weight_names(module, backend))
    return frozenset(names)


def kept_bf16_weights(model: nn.Module, numerics: Numerics, backend: str | None) -> frozenset[str]:
    """What a model loaded for ``numerics`` keeps in bf16 rather than precast: :func:`fast_bf16_weights` for fast
    numerics, nothing for exact."""
    return fast_bf16_weights(model, backend) if check_numerics(numerics) == "fast" else frozenset()


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
