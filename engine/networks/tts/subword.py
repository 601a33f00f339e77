"""Character-aware subword encoder of EAR-TTS (the text conditioning, ``embed_subword``).

Each text token is spelled out as the dense ids of its single-character tokens,
encoded by one bidirectional T5Gemma layer, mean-pooled over its characters and
projected to the TTS width. Two small flag embeddings (word continuation, BOS/EOS)
are added at every position. Parameter attribute names follow the checkpoint keys
under ``tts_model.tts_model.embed_subword.``.

The spelling lookup is a Python dictionary keyed by token id, so it needs the ids
on the host: :func:`spell_tokens` is the one place that synchronises. Fast numerics
spells a token chosen on the device from a device copy of the table instead
(:meth:`CharacterTable.on_device`, :meth:`CharAwareSubwordEncoder.encode_on_device`).

Also home of the two building blocks that the EAR-TTS fusion and MoG head share
with this encoder (:class:`FloatRMSNorm`, :class:`GeluGatedMLP`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...errors import TokenizerError
from ...loading.config import CharEncoderConfig
from ...loading.layout import SUBWORD_TABLE_SIZE
from ..fused import Stacked, stack_projections
from ..linear import Linear

# Score given to padded character keys; finite, so a row with no character still softmaxes.
_MASKED_SCORE = -1e30
# Characters encoded at once while the vocabulary's table is made (bounds the encoder's activations: at full size
# about 0.3 GB for the MLP's widest, in float32).
VOCABULARY_CHUNK_POSITIONS = 16384


class FloatRMSNorm(nn.Module):
    """Gemma RMSNorm ``x · rsqrt(mean(x²) + eps) · (1 + w)`` evaluated in float32, cast back to x's dtype."""

    def __init__(self, dims: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        dtype = x.dtype
        scale = 1.0 + self.weight.astype(mx.float32)
        return mx.fast.rms_norm(x.astype(mx.float32), scale, self.eps).astype(dtype)


class GeluGatedMLP(nn.Module):
    """``down(gelu_tanh(gate(x)) · up(x))`` without biases."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)
        self.stacked: Stacked | None = None  # gate and up in one product, after fuse_projections()

    def fuse_projections(self) -> int:
        self.stacked = stack_projections(self, ("gate_proj", "up_proj"))
        return int(self.stacked is not None)

    def __call__(self, x: mx.array) -> mx.array:
        if self.stacked is not None:
            gate, up = self.stacked(x)
            return self.down_proj(nn.gelu_approx(gate) * up)
        return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))


# --------------------------------------------------------------------------- character table


@dataclass(frozen=True)
class CharacterTable:
    """Token id → dense character ids, derived once from the text tokenizer's vocabulary.

    The character alphabet is every vocabulary entry whose string is exactly one
    character, ordered by token id and renumbered 0..n-1; the id n pads. A token is
    spelled by the alphabet ids of its characters, skipping characters outside the
    alphabet (so some tokens spell to nothing).
    """

    spellings: Mapping[int, tuple[int, ...]]
    num_characters: int

    @property
    def pad_id(self) -> int:
        return self.num_characters

    @classmethod
    def from_vocabulary(cls, vocabulary: Mapping[str, int], encoder: CharEncoderConfig | int) -> CharacterTable:
        """Build the table for a character encoder (its config, or its ``char_vocab_size``, pad id included).

        Raises :class:`TokenizerError` unless the vocabulary has exactly ``char_vocab_size - 1``
        single-character tokens (256 for the published checkpoints).
        """
        char_vocab_size = encoder if isinstance(encoder, int) else encoder.char_vocab_size
        single = sorted((token_id, token) for token, token_id in vocabulary.items() if len(token) == 1)
        alphabet = {token: dense for dense, (_, token) in enumerate(single)}
        if len(alphabet) != char_vocab_size - 1:
            raise TokenizerError(
                f"the tokenizer vocabulary has {len(alphabet)} single-character tokens; the TTS character "
                f"encoder of this checkpoint needs exactly {char_vocab_size - 1}"
            )
        spellings = {
            token_id: tuple(alphabet[char] for char in token if char in alphabet)
            for token, token_id in vocabulary.items()
        }
        return cls(spellings=spellings, num_characters=len(alphabet))

    def spell(self, token_id: int) -> tuple[int, ...]:
        """Character ids of a token; empty for ids outside the vocabulary."""
        return self.spellings.get(token_id, ())

    def on_device(self, size: int) -> DeviceSpelling:
        """The spellings of ids ``0 .. size - 1`` as device arrays, made once per size (see :class:`DeviceSpelling`)."""
        made = self._device_spellings
        if size not in made:
            width = max((len(spelling) for spelling in self.spellings.values()), default=0) or 1
            char_ids = np.full((size, width), self.pad_id, dtype=np.int16)
            lengths = np.zeros((size,), dtype=np.int16)
            for token_id, spelling in self.spellings.items():
                if 0 <= token_id < size:
                    char_ids[token_id, : len(spelling)] = spelling
                    lengths[token_id] = len(spelling)
            made[size] = DeviceSpelling(char_ids=mx.array(char_ids), lengths=mx.array(lengths))
            mx.eval(made[size].char_ids, made[size].lengths)
        return made[size]

    @functools.cached_property
    def _device_spellings(self) -> dict[int, DeviceSpelling]:
        return {}  # in the instance __dict__ (a frozen dataclass allows that), one table per size


@dataclass(frozen=True)
class DeviceSpelling:
    """Every token's spelling on the device, so that a token chosen on the device is spelled there, with no
    readback: row ``id`` of ``char_ids`` (V, M) holds the token's character ids padded with the pad id to the
    longest spelling, ``lengths[id]`` how many of them are its own (0 for a token that spells to nothing, or an
    id outside the vocabulary). int16 (character ids are below 32,768): at the published vocabulary's 131,072
    ids, 256 KB per column of width."""

    char_ids: mx.array
    lengths: mx.array


@dataclass(frozen=True)
class SpelledTokens:
    """The unmasked tokens of a (B, T) id grid, spelled and padded for the character encoder."""

    char_ids: mx.array  # (N, L) int32, padded with the table's pad id
    lengths: mx.array  # (N,) int32
    batch_index: mx.array  # (N,) int32 position of each spelled token in the grid
    time_index: mx.array  # (N,) int32
    longest: int  # L before the at-least-one-column rule; 0 when nothing spells to a character

    @property
    def count(self) -> int:
        return int(self.char_ids.shape[0])


def spell_tokens(table: CharacterTable, subword_ids: mx.array, subword_mask: mx.array) -> SpelledTokens:
    """Spell every position of ``subword_ids`` (B, T) where ``subword_mask`` is true.

    Host synchronisation: the ids and the mask are read back with ``tolist()``
    because the spelling table is a Python dictionary. This is the only readback in
    the TTS; a device-side (vocab, max_len) table would remove it.
    """
    # Both are 2-D (rows, tokens): ``tolist()`` gives nested lists (MLX's stub allows a scalar too).
    ids = cast(list[list[int]], subword_ids.tolist())
    keep = cast(list[list[bool]], subword_mask.tolist())
    spellings: list[tuple[int, ...]] = []
    rows: list[int] = []
    cols: list[int] = []
    for row, (row_ids, row_keep) in enumerate(zip(ids, keep, strict=True)):
        for col, (token_id, kept) in enumerate(zip(row_ids, row_keep, strict=True)):
            if kept:
                spellings.append(table.spell(int(token_id)))
                rows.append(row)
                cols.append(col)
    longest = max((len(spelling) for spelling in spellings), default=0)
    width = max(longest, 1)
    padded = [list(spelling) + [table.pad_id] * (width - len(spelling)) for spelling in spellings]
    return SpelledTokens(
        char_ids=mx.array(padded, dtype=mx.int32).reshape(len(spellings), width),
        lengths=mx.array([len(spelling) for spelling in spellings], dtype=mx.int32),
        batch_index=mx.array(rows, dtype=mx.int32),
        time_index=mx.array(cols, dtype=mx.int32),
        longest=longest,
    )


# --------------------------------------------------------------------------- character encoder


class CharSelfAttention(nn.Module):
    """Bidirectional attention with RoPE, logit soft-capping and a key padding mask."""

    def __init__(self, config: CharEncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scale = config.query_pre_attn_scalar**-0.5
        self.softcap = config.attn_logit_softcapping
        width = config.hidden_size
        self.q_proj = Linear(width, self.num_heads * config.head_dim, bias=False)
        self.k_proj = Linear(width, self.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = Linear(width, self.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = Linear(self.num_heads * config.head_dim, width, bias=False)
        self.rope = nn.RoPE(config.head_dim, traditional=False, base=config.rope_base)

    def _heads(self, x: mx.array, heads: int) -> mx.array:
        batch, length, _ = x.shape
        return x.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)

    def __call__(self, x: mx.array, key_mask: mx.array) -> mx.array:
        batch, length, _ = x.shape
        queries = self.rope(self._heads(self.q_proj(x), self.num_heads))
        keys = self.rope(self._heads(self.k_proj(x), self.num_kv_heads))
        values = self._heads(self.v_proj(x), self.num_kv_heads)
        if self.num_heads != self.num_kv_heads:
            repeats = self.num_heads // self.num_kv_heads
            keys = mx.repeat(keys, repeats, axis=1)
            values = mx.repeat(values, repeats, axis=1)
        scores = (queries @ keys.transpose(0, 1, 3, 2)) * self.scale
        scores = mx.tanh(scores / self.softcap) * self.softcap
        scores = mx.where(key_mask[:, None, None, :], scores, _MASKED_SCORE)
        weights = mx.softmax(scores.astype(mx.float32), axis=-1).astype(queries.dtype)
        mixed = (weights @ values).transpose(0, 2, 1, 3).reshape(batch, length, -1)
        return self.o_proj(mixed)


class CharEncoderLayer(nn.Module):
    """Pre- and post-normed attention and MLP sublayers (T5Gemma encoder layer)."""

    def __init__(self, config: CharEncoderConfig) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = CharSelfAttention(config)
        self.pre_self_attn_layernorm = FloatRMSNorm(config.hidden_size, eps)
        self.post_self_attn_layernorm = FloatRMSNorm(config.hidden_size, eps)
        self.mlp = GeluGatedMLP(config.hidden_size, config.intermediate_size)
        self.pre_feedforward_layernorm = FloatRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = FloatRMSNorm(config.hidden_size, eps)

    def __call__(self, x: mx.array, key_mask: mx.array) -> mx.array:
        x = x + self.post_self_attn_layernorm(self.self_attn(self.pre_self_attn_layernorm(x), key_mask))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class CharEncoder(nn.Module):
    """Embedding scale, the encoder layers and the final norm."""

    def __init__(self, config: CharEncoderConfig) -> None:
        super().__init__()
        self.layers = [CharEncoderLayer(config) for _ in range(config.num_hidden_layers)]
        self.norm = FloatRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_scale = config.hidden_size**0.5

    def __call__(self, embedded: mx.array, key_mask: mx.array) -> mx.array:
        # The scale is rounded to the embedding dtype first (sqrt(1152) → 34.0 in bf16).
        x = embedded * mx.array(self.input_scale, dtype=embedded.dtype)
        for layer in self.layers:
            x = layer(x, key_mask)
        return self.norm(x)


class CharBackbone(nn.Module):
    """Holder that reproduces the checkpoint's ``backbone.encoder`` nesting."""

    def __init__(self, config: CharEncoderConfig) -> None:
        super().__init__()
        self.encoder = CharEncoder(config)


class ContinuationFlagEmbedding(nn.Module):
    """Adds ``cont_emb[is_continuation[id]]``; ids past the table use the checkpoint's pad entry."""

    def __init__(self, table_size: int, hidden_size: int) -> None:
        super().__init__()
        self.is_continuation = mx.zeros((table_size + 1,), dtype=mx.int32)
        self.pad_tensor = mx.array(table_size, dtype=mx.int32)
        self.cont_emb = nn.Embedding(2, hidden_size)

    def __call__(self, embeds: mx.array, token_ids: mx.array) -> mx.array:
        in_table = mx.where(token_ids >= self.is_continuation.shape[0] - 1, self.pad_tensor, token_ids)
        flagged: mx.array = embeds + self.cont_emb(self.is_continuation[in_table])
        return flagged


class BosEosFlagEmbedding(nn.Module):
    """Adds ``special_emb[special_flags[id]]`` (0 ordinary, 1 BOS, 2 EOS)."""

    def __init__(self, table_size: int, hidden_size: int) -> None:
        super().__init__()
        self.special_flags = mx.zeros((table_size,), dtype=mx.int32)
        # NeMo stores the largest vocabulary id, not the table length, as its out-of-table index.
        self.pad_tensor = mx.array(table_size - 1, dtype=mx.int32)
        self.special_emb = nn.Embedding(3, hidden_size)

    def __call__(self, embeds: mx.array, token_ids: mx.array) -> mx.array:
        in_table = mx.where(token_ids >= self.special_flags.shape[0], self.pad_tensor, token_ids)
        flagged: mx.array = embeds + self.special_emb(self.special_flags[in_table])
        return flagged


class CharAwareSubwordEncoder(nn.Module):
    """Text token ids (B, T) → conditioning vectors (B, T, out_size) in the weight dtype.

    Masked positions get no character term, only the two flag embeddings.
    """

    def __init__(self, config: CharEncoderConfig, out_size: int, table_size: int = SUBWORD_TABLE_SIZE) -> None:
        super().__init__()
        self.backbone = CharBackbone(config)
        self.embed_tokens = nn.Embedding(config.char_vocab_size, config.hidden_size)
        self.proj_embedding = Linear(config.hidden_size, out_size, bias=False)
        self.subword_flag_emb = ContinuationFlagEmbedding(table_size, config.hidden_size)
        self.bos_eos_emb = BosEosFlagEmbedding(table_size, config.hidden_size)

    def encode_spelled(self, spelled: SpelledTokens) -> mx.array:
        """Pooled and projected encodings (N, out_size) of spelled tokens."""
        return self.encode_characters(spelled.char_ids, spelled.lengths)

    def encode_characters(self, char_ids: mx.array, lengths: mx.array) -> mx.array:
        """Pooled and projected encodings (N, out_size) of padded character rows (N, L) and their lengths (N,)."""
        key_mask = mx.arange(char_ids.shape[1])[None, :] < lengths[:, None]
        hidden = self.backbone.encoder(self.embed_tokens(char_ids), key_mask)
        pooled = mx.sum(hidden * key_mask[..., None], axis=1) / mx.maximum(lengths[:, None], 1)
        return self.proj_embedding(pooled)

    def encode_tokens(self, token_ids: mx.array, char_ids: mx.array, lengths: mx.array) -> mx.array:
        """The conditioning (N, out_size) of tokens ``token_ids`` (N,) spelled as ``char_ids`` (N, L), of which
        ``lengths`` (N,) are their own, in the weight dtype: the pooled character encoding and the two flags."""
        # A token that spells to nothing pools to zero, as the host form's skipped encoder leaves it.
        encoded = self.encode_characters(char_ids.astype(mx.int32), lengths.astype(mx.int32))
        encoded = encoded.astype(self.embed_tokens.weight.dtype)
        return self.bos_eos_emb(self.subword_flag_emb(encoded, token_ids), token_ids)

    def encode_on_device(self, token_ids: mx.array, spelling: DeviceSpelling) -> mx.array:
        """:meth:`__call__` for every position of ``token_ids`` (B, T), spelled from ``spelling`` on the device.

        Each token runs the encoder at the table's full width, its padding masked as a batch's is: the same
        function of the token, with its sums (attention, pooling) over more terms, the padded ones zero. Fast
        numerics only (the sums' order may differ from the host's spelling at the token's own width)."""
        flat = token_ids.reshape(-1)
        rows = self.encode_tokens(flat, spelling.char_ids[flat], spelling.lengths[flat])
        return rows.reshape(*token_ids.shape, -1)

    def encode_vocabulary(self, spelling: DeviceSpelling, positions: int = VOCABULARY_CHUNK_POSITIONS) -> mx.array:
        """Every token's conditioning (V, out_size), V the rows of ``spelling``: what :meth:`encode_on_device`
        gives a token, made for all of them at once (fast numerics' table, read by one gather a frame).

        Tokens go in order of length, as many at a time as fill about ``positions`` characters, each group at its
        longest spelling's width (the whole vocabulary at the table's widest would be mostly padding). The same
        function of each token, its sums over fewer padded (zero) terms and its products over more rows, so a
        value may round differently from the one-token form: within one bf16 step, which the load checks
        (:func:`engine.networks.tts.fast.use_condition_table`)."""
        lengths = np.array(spelling.lengths, dtype=np.int32)
        order = np.argsort(lengths, kind="stable")
        parts: list[mx.array] = []
        start = 0
        while start < order.size:
            # The next tokens while the group, at its last (longest) one's width, stays within ``positions``.
            stop = start + 1
            while stop < order.size and (stop + 1 - start) * max(int(lengths[order[stop]]), 1) <= positions:
                stop += 1
            width = max(int(lengths[order[stop - 1]]), 1)
            ids = mx.array(order[start:stop].astype(np.int32))
            part = self.encode_tokens(ids, spelling.char_ids[ids, :width], spelling.lengths[ids])
            mx.eval(part)
            parts.append(part)
            start = stop
        by_length = mx.concatenate(parts)
        mx.eval(by_length)
        parts.clear()
        table = by_length[mx.array(np.argsort(order).astype(np.int32))]
        mx.eval(table)
        return table

    def __call__(self, subword_ids: mx.array, subword_mask: mx.array, table: CharacterTable) -> mx.array:
        spelled = spell_tokens(table, subword_ids, subword_mask)
        out = mx.zeros((*subword_ids.shape, self.proj_embedding.weight.shape[0]), dtype=self.embed_tokens.weight.dtype)
        # Tokens that spell to nothing pool to an exact zero, so the encoder is skipped when all do.
        if spelled.count and spelled.longest:
            out = out.at[spelled.batch_index, spelled.time_index].add(self.encode_spelled(spelled))
        out = self.subword_flag_emb(out, subword_ids)
        return self.bos_eos_emb(out, subword_ids)
