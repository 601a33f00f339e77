"""EAR-TTS, VoiceChat's speech-token generator: the network (:mod:`.ear_tts`), its Gemma-3 backbone
(:mod:`.backbone`), its mixture-of-Gaussians head (:mod:`.mixture`), the character-aware subword encoder
(:mod:`.subword`), its streaming state (:mod:`.state`) and its fast form (:mod:`.fast`)."""

from .backbone import GUIDED_ROWS, Backbone, BackboneAttention, BackboneLayer, GemmaRMSNorm, LayerRowParts
from .ear_tts import (
    ECONOMY_LEVELS,
    EarTTS,
    GatedFusion,
    RefinementRound,
    SpeakerPrompt,
    TTSInput,
    TTSStepResult,
    build_speaker_prompt,
    refinement_plan,
)
from .mixture import MixtureHead, MixtureLayer, MixtureRowParts
from .state import LayerCache, TTSCache

__all__ = [
    "ECONOMY_LEVELS",
    "GUIDED_ROWS",
    "Backbone",
    "BackboneAttention",
    "BackboneLayer",
    "EarTTS",
    "GatedFusion",
    "GemmaRMSNorm",
    "LayerCache",
    "LayerRowParts",
    "MixtureHead",
    "MixtureLayer",
    "MixtureRowParts",
    "RefinementRound",
    "SpeakerPrompt",
    "TTSCache",
    "TTSInput",
    "TTSStepResult",
    "build_speaker_prompt",
    "refinement_plan",
]
