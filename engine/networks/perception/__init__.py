"""Perception: the streaming log-mel front end (:mod:`.mel`), the cache-aware FastConformer and its projection
(:mod:`.encoder`, its relative-position attention :mod:`.attention`), and the encoder's fast form (:mod:`.fast`)."""

from .attention import (
    RelativePositionAttention,
    attend_relative,
    attend_relative_window,
    chunked_limited_mask,
    relative_positions,
)
from .encoder import ConformerLayer, FastConformer, Perception, PerceptionState, encoder_row_projections
from .fast import EncoderFast
from .mel import MelState, StreamingMel, hann_window, log_mel_spectrogram, mel_filterbank

__all__ = [
    "ConformerLayer",
    "EncoderFast",
    "FastConformer",
    "MelState",
    "Perception",
    "PerceptionState",
    "RelativePositionAttention",
    "StreamingMel",
    "attend_relative",
    "attend_relative_window",
    "chunked_limited_mask",
    "encoder_row_projections",
    "hann_window",
    "log_mel_spectrogram",
    "mel_filterbank",
    "relative_positions",
]
