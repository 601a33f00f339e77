"""A :class:`engine.model.VoiceChat` with seeded random weights, made in memory (nothing written).

:mod:`engine.loading.random_checkpoint` makes the arrays and configs of a random checkpoint and
knows nothing of the model; assembling them into a model is this module's, one layer above the model.
"""

from __future__ import annotations

from .loading.random_checkpoint import Size, random_weights
from .loading.tokenizer import TextTokenizer
from .model import VoiceChat, assemble_voicechat
from .numerics import Numerics, check_numerics


def random_voicechat(
    size: Size = "tiny", *, quantize: int | None = None, seed: int = 0, numerics: str = "exact"
) -> VoiceChat:
    """The model :func:`engine.loading.random_checkpoint.make_checkpoint` would write and
    :func:`engine.model.load_voicechat` load, for these ``size``, ``quantize`` and ``seed``."""
    mode: Numerics = check_numerics(numerics)
    _, config, weights, quantized, tokenizer, nbytes = random_weights(size, quantize=quantize, seed=seed)
    label = f"random-{size}-{'bf16' if quantize is None else f'q{quantize}'}-seed{seed}"
    return assemble_voicechat(
        config, weights, quantized, TextTokenizer(tokenizer, label), name=label, nbytes=nbytes, numerics=mode
    )
