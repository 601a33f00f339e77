"""The speech codec: its math (:mod:`.codec`) and its fast form (:mod:`.fast`)."""

from .codec import (
    CODEC_PREFIX,
    ChannelLayerNorm,
    Codec,
    CodecDecoder,
    CodecEncoder,
    CodecState,
    ConvNeXtBlock,
    ResidualQuantizer,
    replace_control_codes,
)
from .fast import CodecFast

__all__ = [
    "CODEC_PREFIX",
    "ChannelLayerNorm",
    "Codec",
    "CodecDecoder",
    "CodecEncoder",
    "CodecFast",
    "CodecState",
    "ConvNeXtBlock",
    "ResidualQuantizer",
    "replace_control_codes",
]
