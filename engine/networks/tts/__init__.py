"""EAR-TTS, moving into a package of its own (its modules follow)."""

from .ear_tts import (
    GUIDED_ROWS,
    Backbone,
    BackboneAttention,
    BackboneLayer,
    EarTTS,
    LayerRowParts,
    MixtureHead,
    MixtureLayer,
    MixtureRowParts,
    RefinementRound,
    SpeakerPrompt,
    TTSCache,
    build_speaker_prompt,
    refinement_plan,
)

__all__ = [
    "GUIDED_ROWS",
    "Backbone",
    "BackboneAttention",
    "BackboneLayer",
    "EarTTS",
    "LayerRowParts",
    "MixtureHead",
    "MixtureLayer",
    "MixtureRowParts",
    "RefinementRound",
    "SpeakerPrompt",
    "TTSCache",
    "build_speaker_prompt",
    "refinement_plan",
]
