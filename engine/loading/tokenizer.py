"""Text tokenizer of the checkpoint, the RNN-T piece vocabulary, and streaming detokenizers.

The LLM and the TTS share the checkpoint's byte-level BPE (``tokenizer.json``), read
with the ``tokenizers`` library directly; transformers is not needed at run time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders

from ..errors import TokenizerError


class TextTokenizer:
    """Encode/decode with the checkpoint's ``tokenizer.json``."""

    def __init__(self, tokenizer: Tokenizer, source: str = "<memory>") -> None:
        self._tokenizer = tokenizer
        self.source = source
        self._vocab: dict[str, int] | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> TextTokenizer:
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"{path}: tokenizer file is missing")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({exc})") from exc
        return cls(tokenizer, str(path))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def decodes_by_concatenation(self) -> bool:
        """True when decoding is byte-level (the decode of a list is the decodes of its parts joined,
        wherever the parts end on whole characters)."""
        return isinstance(self._tokenizer.decoder, decoders.ByteLevel)

    def get_vocab(self) -> dict[str, int]:
        """Token string to id, including added (special) tokens."""
        if self._vocab is None:
            self._vocab = dict(self._tokenizer.get_vocab(with_added_tokens=True))
        return dict(self._vocab)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)


class StreamingDetokenizer:
    """Cumulative decode of one output channel, emitting per-token text deltas.

    Channel ids that carry no text (PAD, silence, BOS, EOS) are skipped. The
    cumulative text is always the decode of every kept token, so byte sequences
    split across tokens resolve once complete; when a decode revises earlier text
    the delta falls back to the token's own decode, as the reference sessions do.

    The reference re-decodes the whole history every frame (its cost grows through a
    conversation). Byte-level BPE decodes by concatenation wherever the text so far
    ends on a complete character, so here such a prefix is committed and only the
    tokens after it are decoded: same text, constant cost. Tokenizers with any other
    decoder (where that does not hold) are decoded in full.
    """

    def __init__(self, tokenizer: TextTokenizer, skipped_ids: Iterable[int]) -> None:
        self._tokenizer = tokenizer
        self._skipped = frozenset(skipped_ids)
        self._incremental = tokenizer.decodes_by_concatenation
        self.tokens: list[int] = []
        self.text = ""
        self._committed_tokens = 0  # tokens[:_committed_tokens] decode to text[:_committed_chars], for good
        self._committed_chars = 0

    def append(self, token_id: int) -> tuple[str, str] | None:
        """Add one token; returns ``(delta, text)`` or None for a skipped id."""
        if token_id in self._skipped:
            return None
        self.tokens.append(token_id)
        tail = self._tokenizer.decode(self.tokens[self._committed_tokens :])
        updated = self.text[: self._committed_chars] + tail
        if updated.startswith(self.text):
            delta = updated[len(self.text) :]
        else:
            delta = self._tokenizer.decode([token_id])
        self.text = updated
        if self._incremental and not tail.endswith(_REPLACEMENT):  # an unfinished character could still change
            self._committed_tokens, self._committed_chars = len(self.tokens), len(updated)
        return delta, updated


_REPLACEMENT = "\ufffd"  # what a decode shows for bytes that do not (yet) form a character


_LANGUAGE_TAG = re.compile(r"^<[a-z]{2,3}-[A-Za-z]{2,4}>$")
_SPECIAL_PIECES = frozenset({"<unk>", "<pad>", "<s>", "</s>"})


class RNNTVocabulary:
    """SentencePiece pieces of the RNN-T head (``config.rnnt_vocabulary``)."""

    def __init__(self, pieces: Sequence[str]) -> None:
        self.pieces = tuple(pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def is_special(self, token_id: int) -> bool:
        if not 0 <= token_id < len(self.pieces):
            return False
        piece = self.pieces[token_id]
        return piece in _SPECIAL_PIECES or bool(_LANGUAGE_TAG.match(piece))

    def decode(self, token_ids: Iterable[int]) -> str:
        """Token by token: the decode of a list is its parts' decodes joined (the streaming transcript relies on it)."""
        parts = []
        for token_id in token_ids:
            if not 0 <= token_id < len(self.pieces):
                continue
            piece = self.pieces[token_id]
            if piece in _SPECIAL_PIECES or _LANGUAGE_TAG.match(piece):
                continue
            parts.append(piece.replace("\u2581", " "))
        return "".join(parts)
