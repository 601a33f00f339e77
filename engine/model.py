"""The VoiceChat module tree and loading a checkpoint into it.

The tree mirrors the checkpoint's key hierarchy (``stt_model.*``, ``tts_model.*``),
so weights load by name, strictly. Each network lives in its own file; this module
only assembles them and owns the load procedure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .errors import CheckpointMemoryError, TokenizerError
from .jit import jit
from .kernels.admission import gpu_kernel_backend
from .loading import memory
from .loading.checkpoint import load_arrays, load_into, open_checkpoint, sanitize, verify_layout
from .loading.config import VoiceChatConfig
from .loading.layout import PROMPT_FRAMES
from .loading.memory import check_fits, format_bytes, precast_budget
from .loading.precast import precast_float32
from .loading.tokenizer import RNNTVocabulary, TextTokenizer
from .networks.codec import Codec
from .networks.fused import fuse_projections
from .networks.linear import Linear, prepare_transposed_weights
from .networks.llm import NemotronH
from .networks.perception import Perception
from .networks.rnnt import RNNTJoint, RNNTPredictor
from .networks.tts import EarTTS
from .networks.tts.subword import CharacterTable
from .numerics import Numerics, apply_numerics, kept_bf16_weights


class DuplexSTT(nn.Module):
    """Perception, the RNN-T head, the fused-input Nemotron-H and its two vocab heads."""

    def __init__(self, config: VoiceChatConfig) -> None:
        super().__init__()
        text = config.text_config
        self.embed_tokens = nn.Embedding(text.vocab_size, text.hidden_size)
        self.llm = NemotronH(text)
        self.lm_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self.function_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self.perception = Perception(config.audio_config)
        self.rnnt_decoder = RNNTPredictor(config.audio_config.decoder)
        self.rnnt_joint = RNNTJoint(config.audio_config.joint)
        self.function_channel_weight = config.function_channel_weight

    @property
    def text_vocabulary_size(self) -> int:
        """The ids the text head can emit (its rows): what the TTS's device spelling and conditioning tables
        cover."""
        return int(self.lm_head.weight.shape[0])

    def fuse_inputs(self, text_id: int, audio: mx.array, function_id: int) -> mx.array:
        """One LLM input position: ``E[text] + audio + w·E[function]``, in that order (the reference's).

        Left uncompiled: a fused kernel could contract the multiply-add into one rounding.
        """
        text, function = self.token_embedding(text_id), self.token_embedding(function_id)
        return text + audio + self.function_channel_weight * function

    def token_embedding(self, token_id: int) -> mx.array:
        """``embed_tokens`` row (1, 1, D) of one id; looked up once per id (the same values every time)."""
        memo = self._embedding_memo
        row = memo.get(token_id)
        if row is None:
            row = self.embed_tokens(mx.array([[token_id]], dtype=mx.int32))
            if len(memo) >= 4096:
                memo.pop(next(iter(memo)))
            memo[token_id] = row
        return row

    def choose(self, hidden: mx.array) -> tuple[mx.array, mx.array]:
        """Greedy text and function ids (1,) from the last position of ``hidden``: one program per fast part of
        the heads (a trace holds the part it was traced with)."""
        part = getattr(self.lm_head, "fast_row", None)
        programs = self._compiled_choose
        if part not in programs:
            programs[part] = jit(self._choose)
        return programs[part](hidden)

    def _choose(self, hidden: mx.array) -> tuple[mx.array, mx.array]:
        last = hidden[:, -1]
        return mx.argmax(self.lm_head(last), axis=-1), mx.argmax(self.function_head(last), axis=-1)

    @functools.cached_property
    def _compiled_choose(self) -> dict[Any, Callable[[mx.array], tuple[mx.array, mx.array]]]:
        return {}  # in the instance __dict__, outside the parameter tree

    @functools.cached_property
    def _embedding_memo(self) -> dict[int, mx.array]:
        return {}  # in the instance __dict__, outside the parameter tree


class SpeakerLatents(nn.Module):
    """Built-in speaker prompts; the published checkpoints carry one voice, Aria."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.Aria = mx.zeros((1, PROMPT_FRAMES, hidden_size))


class SpeechDecoder(nn.Module):
    """EAR-TTS, the codec and the speech buffers (control codes, silence codes, speaker latent)."""

    def __init__(self, config: VoiceChatConfig) -> None:
        super().__init__()
        tts = config.tts_config
        self.audio_codec = Codec(config.codec_config)
        self.tts_model = EarTTS(tts)
        self.control_codes = mx.zeros((3,), dtype=mx.int32)
        self.audio_prompt_latents = SpeakerLatents(tts.hidden_size)
        self.codec_silence_tokens = mx.zeros((tts.num_quantizers,), dtype=mx.int32)


class VoiceChatModel(nn.Module):
    """The whole checkpoint: ``stt_model`` and ``tts_model``."""

    def __init__(self, config: VoiceChatConfig) -> None:
        super().__init__()
        self.stt_model = DuplexSTT(config)
        self.tts_model = SpeechDecoder(config)


@dataclass
class VoiceChat:
    """A loaded checkpoint: the model, its config and tokenizers, ready to open sessions."""

    model: VoiceChatModel
    config: VoiceChatConfig
    tokenizer: TextTokenizer
    rnnt_vocabulary: RNNTVocabulary
    characters: CharacterTable
    quantized: dict[str, tuple[int, int]]
    name: str
    source: Path | None  # the checkpoint folder; None for weights made in memory
    nbytes: int  # bytes of weights
    precast_bytes: int = 0  # memory the float32 precast copies added (0: not precast, to save memory)
    numerics: Numerics = "exact"
    fast_changes: dict[str, bool] = field(default_factory=dict)  # which of fast mode's changes are in use
    # The TTS's speaker prompt per numerics mode, made by the first session (engine.session.speaker_prompt).
    speaker_prompts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def quantization_bits(self) -> int | None:
        bits = {bits for _, bits in self.quantized.values()}
        return bits.pop() if len(bits) == 1 else None

    def describe(self) -> dict[str, Any]:
        """Identity of the checkpoint for profile logs and the UI."""
        return {
            "name": self.name,
            "path": str(self.source) if self.source is not None else "",
            "quantization_bits": self.quantization_bits,
            "size_bytes": self.nbytes,
            "precast_bytes": self.precast_bytes,
            "numerics": self.numerics,
            "fast_changes": dict(self.fast_changes),
        }


def assemble_voicechat(
    config: VoiceChatConfig,
    weights: dict[str, mx.array],
    quantized: dict[str, tuple[int, int]],
    tokenizer: TextTokenizer,
    *,
    name: str,
    source: Path | None = None,
    nbytes: int = 0,
    precast: bool = True,
    precast_budget: int | None = None,
    numerics: Numerics = "exact",
) -> VoiceChat:
    """Build the module tree, load runtime-layout ``weights`` into it strictly, and wrap it up.

    With ``precast`` the weights that only meet float32 activations are converted once
    (see :mod:`engine.loading.precast`; exact, faster, more memory), unless the copies would take
    more than ``precast_budget`` bytes; the rest stays lazy. ``numerics`` picks exact or fast
    arithmetic (see docs/numerics.md); for fast, the weights its row products read stay bf16.
    """
    if tokenizer.vocab_size > config.text_config.vocab_size:
        raise TokenizerError(
            f"{tokenizer.source}: the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary "
            f"has {config.text_config.vocab_size}; the tokenizer belongs to another model"
        )
    try:
        characters = CharacterTable.from_vocabulary(tokenizer.get_vocab(), config.tts_config.character_encoder)
    except TokenizerError as exc:
        raise TokenizerError(f"{tokenizer.source}: {exc}") from exc
    model = VoiceChatModel(config)
    load_into(model, weights, quantized)
    # Fast numerics' kernels read some weights in bf16: loaded for it, those are not cast.
    keep = kept_bf16_weights(model, numerics, gpu_kernel_backend())
    added = precast_float32(model, budget=precast_budget, keep=keep) if precast else 0
    fuse_projections(model)
    prepare_transposed_weights(model)  # after every change of weights: views of the final ones
    fast_changes = apply_numerics(model, numerics, characters=characters)
    return VoiceChat(
        model=model,
        config=config,
        tokenizer=tokenizer,
        rnnt_vocabulary=RNNTVocabulary(config.rnnt_vocabulary),
        characters=characters,
        quantized=quantized,
        name=name,
        source=source,
        nbytes=nbytes,
        precast_bytes=added,
        numerics=numerics,
        fast_changes=fast_changes,
    )


def evaluate_weights(model: nn.Module) -> None:
    """Read every weight into memory now (loading is lazy until this)."""
    mx.eval(model.parameters())


def load_voicechat(
    path: str | Path, *, lazy: bool = False, conversation_seconds: float = 0.0, numerics: Numerics = "exact"
) -> VoiceChat:
    """Verify and load a checkpoint folder.

    The float32 precast copies (faster, same outputs) are made only if they fit in memory
    next to the weights and the state of a ``conversation_seconds``-long conversation;
    otherwise the weights stay as stored (``VoiceChat.precast_bytes`` is 0).

    Raises a :class:`engine.errors.CheckpointError` subclass naming the file and
    tensor for any problem with the folder, and :class:`CheckpointMemoryError`
    when the machine cannot hold it.
    """
    files = open_checkpoint(path)
    quantized = verify_layout(files)
    check_fits(files)
    tokenizer = TextTokenizer.from_file(files.tokenizer_file)
    weights = sanitize(load_arrays(files), files.config)
    voicechat = assemble_voicechat(
        files.config,
        weights,
        quantized,
        tokenizer,
        name=files.root.name,
        source=files.root,
        nbytes=files.nbytes,
        precast_budget=precast_budget(files, conversation_seconds),
        numerics=numerics,
    )
    if not lazy:
        try:
            evaluate_weights(voicechat.model)
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, MemoryError) or "malloc" in str(exc).lower() or "memory" in str(exc).lower():
                total = memory.physical_memory_bytes()
                have = format_bytes(total) if total else "unknown"
                raise CheckpointMemoryError(
                    f"{files.root}: out of memory while loading {format_bytes(files.nbytes)} of weights "
                    f"(machine memory: {have})"
                ) from exc
            raise
    return voicechat
