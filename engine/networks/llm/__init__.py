"""Nemotron-H, VoiceChat's language model: its math (:mod:`.nemotron_h`, the scan :mod:`.ssm`), its streaming
state (:mod:`.state`) and its fast form (:mod:`.fast`)."""

from .fast import LLMFast
from .nemotron_h import CausalSelfAttention, GroupedGatedRMSNorm, HybridBlock, Mamba2Mixer, NemotronH, ReLU2MLP
from .state import ATTENTION, BLOCK_KINDS, MAMBA, MLP, LayerCache, LLMCache, MambaCache

__all__ = [
    "ATTENTION",
    "BLOCK_KINDS",
    "MAMBA",
    "MLP",
    "CausalSelfAttention",
    "GroupedGatedRMSNorm",
    "HybridBlock",
    "LLMCache",
    "LLMFast",
    "LayerCache",
    "Mamba2Mixer",
    "MambaCache",
    "NemotronH",
    "ReLU2MLP",
]
