"""Cast, once at load, the bf16 weights that only ever meet float32 activations.

MLX promotes a bf16 weight to float32 whenever it meets float32 activations, which costs
a conversion kernel (and a float32 copy of the weight) on every call. Converting those
weights once gives the same float32 values the promotion would — bf16 → float32 is
exact — so every output is unchanged, while each frame runs hundreds fewer kernels
and reads fewer bytes. The price is memory: a precast weight takes twice its bf16 size.

Only weights whose inputs are float32 in every code path are listed. Left alone, because
their arithmetic happens in bf16 on some path: the Gemma ``1 + w`` norms and q/k norms of
the TTS backbone (formed in bf16), the character encoder and the fusion's text branch
(bf16 activations), the fusion gate (sigmoid in the parameter dtype), the RN-T LSTM (a
bf16 embedding feeds it), the codec (bf16 activations), ``A_log`` (its exp is rounded in
bf16), and the LLM of a bf16 checkpoint (the system-prompt prefill runs in bf16).

A model loaded for fast numerics also keeps, as stored, the weights its kernels read in bf16
directly — the row products' projections, the MoG draw's mean tables and, on CUDA, the residual-VQ
codebooks (:func:`engine.numerics.fast_bf16_weights`): a float32 copy of them would only be read by
exact mode's operations, and fast mode would need a bf16 copy of it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

# Module prefixes whose floating-point parameters are cast (all of them, unless excluded below).
_ALWAYS = (
    "stt_model.perception.",
    "stt_model.rnnt_joint.",
    "tts_model.tts_model.mog_head.",
    "tts_model.tts_model.embed_code.",
    "tts_model.tts_model.gated_fusion_audio_text.audio_proj.",
    "tts_model.tts_model.rvq_embs",
)
# TTS backbone: its projections only (the norms keep their bf16 ``1 + w``).
_BACKBONE = "tts_model.tts_model.backbone.layers."
_BACKBONE_LINEARS = (".q_proj.", ".k_proj.", ".v_proj.", ".o_proj.", ".gate_proj.", ".up_proj.", ".down_proj.")
# A quantized LLM runs float32 throughout (its embedding dequantizes to float32 scales).
_LLM = "stt_model.llm."
_LLM_EXCLUDED = (".A_log",)


def _eligible(name: str, llm_is_float32: bool) -> bool:
    if name.startswith(_ALWAYS):
        return True
    if name.startswith(_BACKBONE):
        return any(part in name for part in _BACKBONE_LINEARS)
    if llm_is_float32 and name.startswith(_LLM):
        return not name.endswith(_LLM_EXCLUDED)
    return False


def llm_runs_float32(model: nn.Module) -> bool:
    """True when the token embedding yields float32 (a quantized checkpoint with float32 scales)."""
    embed = model.stt_model.embed_tokens
    probe: mx.array = embed(mx.array([[0]], dtype=mx.int32))
    return probe.dtype == mx.float32


def precast_targets(model: nn.Module, keep: frozenset[str] = frozenset()) -> Iterator[tuple[str, mx.array]]:
    """The bf16 parameters :func:`precast_float32` would cast (none named in ``keep``)."""
    float32_llm = llm_runs_float32(model)
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):  # a list without destination
        if value.dtype == mx.bfloat16 and _eligible(name, float32_llm) and name not in keep:
            yield name, value


def precast_float32(model: nn.Module, budget: int | None = None, keep: frozenset[str] = frozenset()) -> int:
    """Cast the eligible bf16 parameters of ``model`` (except those named in ``keep``) to float32 in place;
    returns the bytes added.

    Nothing is cast (and 0 returned) when the copies would add more than ``budget`` bytes.
    """
    targets = list(precast_targets(model, keep))
    added = sum(value.nbytes for _, value in targets)  # a bf16 weight doubles in float32
    if budget is not None and added > budget:
        return 0
    updates = [(name, value.astype(mx.float32)) for name, value in targets]
    # ``rvq_embs`` also feeds the codebook norms, which sum in bf16: the TTS derives them before the cast.
    tts = model.tts_model.tts_model
    _ = tts.codebook_norms
    model.load_weights(updates, strict=False)
    mx.eval([value for _, value in updates])
    return added
