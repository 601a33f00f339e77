"""The streaming detokenizer: constant cost per token, and exactly the deltas of a full re-decode."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models

from engine.loading.random_checkpoint import build_tokenizer
from engine.loading.tokenizer import StreamingDetokenizer, TextTokenizer

SKIPPED = (0, 1, 2, 12)


def full_redecode_deltas(tokenizer: TextTokenizer, ids: list[int]) -> list[tuple[str, str] | None]:
    """The reference sessions' rule: decode everything each time; if that revises the text, the token's own decode."""
    kept: list[int] = []
    text = ""
    out: list[tuple[str, str] | None] = []
    for token_id in ids:
        if token_id in SKIPPED:
            out.append(None)
            continue
        kept.append(token_id)
        updated = tokenizer.decode(kept)
        delta = updated[len(text) :] if updated.startswith(text) else tokenizer.decode([token_id])
        text = updated
        out.append((delta, updated))
    return out


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(build_tokenizer(2048, seed=0))


def multibyte_ids(tokenizer: TextTokenizer, text: str) -> list[int]:
    """``text`` as single-byte tokens, so characters arrive split over several tokens."""
    return [tokenizer.token_to_id(_BYTE_TO_SYMBOL[byte]) for byte in text.encode("utf-8")]


def _bytes_to_symbols() -> dict[int, str]:
    """GPT-2's byte-to-symbol table (each byte is one printable character in a byte-level vocabulary)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


_BYTE_TO_SYMBOL = _bytes_to_symbols()


def test_byte_level_tokenizers_decode_incrementally(tokenizer: TextTokenizer) -> None:
    assert tokenizer.decodes_by_concatenation
    other = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    other.decoder = decoders.WordPiece()
    assert not TextTokenizer(other).decodes_by_concatenation


@pytest.mark.parametrize("seed", range(5))
def test_deltas_equal_a_full_redecode_including_split_characters(tokenizer: TextTokenizer, seed: int) -> None:
    rng = random.Random(seed)
    words = tokenizer.encode(" hello world, how are you today")
    split_chars = [multibyte_ids(tokenizer, text) for text in ("é", "€", "日本", "🎙️")]
    lone_bytes = [[tokenizer.token_to_id(_BYTE_TO_SYMBOL[b])] for b in (0xC3, 0xE2, 0x82, 0xF0, 0xFF)]
    ids: list[int] = []
    for _ in range(400):
        choice = rng.random()
        if choice < 0.5:
            ids.append(rng.choice(words))
        elif choice < 0.7:
            ids += rng.choice(split_chars)
        elif choice < 0.8:
            ids += rng.choice(lone_bytes)  # invalid or unfinished UTF-8
        elif choice < 0.9:
            ids.append(rng.choice(SKIPPED))
        else:
            ids.append(rng.randrange(tokenizer.vocab_size))
    streaming = StreamingDetokenizer(tokenizer, SKIPPED)
    got = [streaming.append(token_id) for token_id in ids]
    assert got == full_redecode_deltas(tokenizer, ids)


def test_cost_per_token_does_not_grow_with_the_conversation(
    tokenizer: TextTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: each appended token decodes a bounded tail, at the start of a conversation and after
    20,000 tokens alike (re-decoding the history, as the reference does, would decode ever more)."""
    words = tokenizer.encode(" the quick brown fox jumps over the lazy dog")
    streaming = StreamingDetokenizer(tokenizer, SKIPPED)
    decoded: list[int] = []
    decode = tokenizer.decode
    monkeypatch.setattr(tokenizer, "decode", lambda ids: decoded.append(len(ids)) or decode(ids))

    def tokens_decoded(count: int) -> list[int]:
        decoded.clear()
        for index in range(count):
            streaming.append(words[index % len(words)])
        return list(decoded)

    early = tokens_decoded(500)
    tokens_decoded(20_000)  # a long conversation's worth of text
    late = tokens_decoded(500)
    assert len(streaming.tokens) == 21_000
    assert max(late) <= max(early) <= 4, f"a token decoded up to {max(early)} tokens early and {max(late)} late"
    assert sum(late) == sum(early)
