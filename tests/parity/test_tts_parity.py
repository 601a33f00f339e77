"""EAR-TTS against mlx-vlm's ``RVQEARTTSModel`` on the tiny checkpoints.

The TTS is never quantized, but the quantized repositories are separate files, so
bf16 and q4 are both covered, each with seeds 0 and 1. Both sides are seeded alike
and driven through the speaker-prompt warm-up and 64 steps (the tiny sliding window
of 48 wraps after 11 of them); codes, hidden states, caches and every random draw
must agree exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.loading.config import VoiceChatConfig
from engine.loading.tokenizer import TextTokenizer
from engine.networks.tts import EarTTS, SpeakerPrompt, TTSCache, TTSInput, build_speaker_prompt
from engine.networks.tts.subword import CharacterTable
from engine.ops.cache import KVCache, SlidingKVCache
from tests.conftest import CheckpointFactory, parity_id
from tests.reference import load_reference

pytestmark = pytest.mark.parity

TTS_CHECKPOINTS = [(None, 0), (4, 0), (None, 1), (4, 1)]
PREFIX = "tts_model.tts_model."
STEPS = 64
# An id the tiny tokenizer does not have: it spells to no characters (the vocabulary has no such token).
UNSPELLED_ID = 1500


@dataclass
class Pair:
    """Our EAR-TTS and the reference's, loaded from one checkpoint."""

    config: VoiceChatConfig
    tokenizer: TextTokenizer
    chars: CharacterTable
    mine: EarTTS
    ref_model: Any
    ref_processor: Any
    weights: dict[str, mx.array]
    seed: int

    @property
    def ref(self) -> Any:
        return self.ref_model.tts_model.tts_model

    def silence_codes(self) -> mx.array:
        """Codec codes (1, 38, Q) of 38 frames of zeros, from the reference codec."""
        samples = 38 * self.config.output_frame_samples
        return self.ref_model.tts_model.audio_codec.encode(mx.zeros((1, 1, samples))).transpose(0, 2, 1)

    def prompt(self) -> SpeakerPrompt:
        return build_speaker_prompt(
            self.silence_codes(),
            self.weights["tts_model.audio_prompt_latents.Aria"],
            self.config.tts_config,
            self.config.pad_token_id,
        )

    def reference_prompt(self) -> tuple[mx.array, ...]:
        return self.ref_model.create_session(self.ref_processor)._tts_prompt()


@pytest.fixture(scope="module", params=TTS_CHECKPOINTS, ids=parity_id)
def pair(request: pytest.FixtureRequest, checkpoint_factory: CheckpointFactory) -> Pair:
    quantize, seed = request.param
    path: Path = checkpoint_factory(quantize, seed)
    files, weights, quantized = read_runtime_weights(path)
    config = files.config
    mine = EarTTS(config.tts_config)
    load_into(mine, weights, quantized, PREFIX)
    tokenizer = TextTokenizer.from_file(files.tokenizer_file)
    chars = CharacterTable.from_vocabulary(tokenizer.get_vocab(), config.tts_config.character_encoder)
    ref_model, ref_processor = load_reference(path)
    ref_model.tts_model.tts_model.set_vocabulary(ref_processor.get_vocab())
    return Pair(config, tokenizer, chars, mine, ref_model, ref_processor, weights, seed)


def _max_abs(a: mx.array, b: mx.array) -> float:
    return float(np.max(np.abs(np.asarray(a.astype(mx.float32)) - np.asarray(b.astype(mx.float32))), initial=0.0))


def _text_tokens(pair: Pair) -> list[int]:
    """PAD, BOS, ordinary words, EOS (with the silence reset), the silence id and an unspelled id."""
    config = pair.config
    pad, bos, eos = config.pad_token_id, config.bos_token_id, config.eos_token_id
    words = pair.tokenizer.encode(" What is the capital of France?")
    assert len(words) >= 8
    sentence = [pad, pad, bos, *words, pad, eos, pad, config.silence_token_id, UNSPELLED_ID, pad]
    tokens = (sentence * (STEPS // len(sentence) + 1))[:STEPS]
    assert {pad, bos, eos, UNSPELLED_ID} <= set(tokens)
    # Every token of the tiny vocabulary spells to characters; the id outside it exercises the empty spelling.
    assert all(pair.chars.spell(token_id) for token_id in pair.tokenizer.get_vocab().values())
    assert pair.chars.spell(UNSPELLED_ID) == ()
    return tokens


class DrawRecorder:
    """Wraps MLX's sampling functions to log every draw (kind, array) in call order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.draws: list[tuple[str, mx.array]] = []
        for kind in ("uniform", "normal", "categorical", "gumbel", "bernoulli", "randint"):
            monkeypatch.setattr(mx.random, kind, self._wrap(kind, getattr(mx.random, kind)))

    def _wrap(self, kind: str, draw: Callable[..., mx.array]) -> Callable[..., mx.array]:
        def recorded(*args: Any, **kwargs: Any) -> mx.array:
            value = draw(*args, **kwargs)
            self.draws.append((kind, value))
            return value

        return recorded

    def take(self) -> list[tuple[str, mx.array]]:
        draws, self.draws = self.draws, []
        return draws


@dataclass
class Trace:
    codes: list[np.ndarray]
    hidden: list[mx.array]
    draws: list[tuple[str, mx.array]]
    warmup_draws: int


def _drive(
    warmup: Callable[[], mx.array],
    step: Callable[[mx.array, mx.array], tuple[mx.array, mx.array]],
    tokens: list[int],
    silence: mx.array,
    eos_id: int,
    recorder: DrawRecorder,
    seed: int,
) -> Trace:
    """Seed, warm up and step like the streaming session (EOS resets the previous code to silence)."""
    mx.random.seed(seed)
    recorder.take()
    previous = warmup()
    warmup_draws = len(recorder.take())
    codes, hidden = [], []
    for token in tokens:
        if token == eos_id:
            previous = mx.broadcast_to(silence[None, None, :], previous.shape)
        step_codes, step_hidden = step(previous, mx.array([[token]], dtype=mx.int32))
        mx.eval(step_codes, step_hidden)
        previous = step_codes
        codes.append(np.asarray(step_codes))
        hidden.append(step_hidden)
    return Trace(codes, hidden, recorder.take(), warmup_draws)


# (kind, keys, values, offset, ring write index); the buffers are copied out, since later steps write in place.
CacheState = list[tuple[str, np.ndarray, np.ndarray, int, int | None]]


def _our_cache_state(cache: TTSCache) -> CacheState:
    state: CacheState = []
    for layer in cache.layers:
        assert layer.keys is not None and layer.values is not None
        if isinstance(layer, SlidingKVCache):
            state.append(("sliding", np.array(layer.keys), np.array(layer.values), layer.offset, layer.write_index))
        else:
            assert isinstance(layer, KVCache)
            state.append(("full", np.array(layer.keys), np.array(layer.values), layer.offset, None))
    return state


def _reference_cache_state(caches: list[Any]) -> CacheState:
    kinds = {"RotatingKVCache": "sliding", "KVCache": "full"}
    return [
        (kinds[type(c).__name__], np.array(c.keys), np.array(c.values), c.offset, getattr(c, "_idx", None))
        for c in caches
    ]


def _compare_cache_states(ours: CacheState, theirs: CacheState) -> float:
    """Same kinds, offsets, ring positions and buffer shapes; returns the max-abs difference of the buffers."""
    worst = 0.0
    assert len(ours) == len(theirs)
    for (kind, keys, values, offset, ring), (ref_kind, ref_keys, ref_values, ref_offset, ref_ring) in zip(
        ours, theirs, strict=True
    ):
        assert (kind, offset, ring) == (ref_kind, ref_offset, ref_ring)
        assert keys.shape == ref_keys.shape and values.shape == ref_values.shape
        assert keys.dtype == ref_keys.dtype == np.float32
        worst = max(worst, float(np.abs(keys - ref_keys).max()), float(np.abs(values - ref_values).max()))
    return worst


def test_speaker_prompt_matches_reference(pair: Pair) -> None:
    ours = pair.prompt()
    codes, subword_ids, subword_mask, audio_mask, latent = pair.reference_prompt()
    assert ours.codes.dtype == mx.int32
    for mine, theirs in (
        (ours.codes, codes),
        (ours.subword_ids, subword_ids),
        (ours.subword_mask, subword_mask),
        (ours.audio_mask, audio_mask),
        (ours.latent, latent),
    ):
        assert mine.shape == theirs.shape
        assert mx.array_equal(mine, theirs).item()


def test_character_table_matches_reference(pair: Pair) -> None:
    assert pair.tokenizer.get_vocab() == pair.ref_processor.get_vocab()
    assert dict(pair.chars.spellings) == pair.ref.embed_subword._subword_to_chars


def test_subword_encoder_matches_reference(pair: Pair) -> None:
    """A batch of spellings of different lengths, masked positions, unknown and out-of-table ids."""
    rng = np.random.default_rng(7)
    config = pair.config
    ids = rng.integers(0, pair.tokenizer.vocab_size, size=(2, 12))
    ids[0, :6] = [config.bos_token_id, config.eos_token_id, config.pad_token_id, UNSPELLED_ID, 131_072 + 5, 3]
    mask = rng.random((2, 12)) < 0.7
    mask[0, :6] = True
    subword_ids, subword_mask = mx.array(ids, dtype=mx.int32), mx.array(mask)
    ours = pair.mine.embed_subword(subword_ids, subword_mask, pair.chars)
    theirs = pair.ref.embed_subword(subword_ids, subword_mask)
    assert ours.dtype == theirs.dtype == mx.bfloat16
    assert _max_abs(ours, theirs) == 0.0

    # Only unspelled tokens: no character term at all.
    unspelled = mx.array([[UNSPELLED_ID, 131_072 + 9]], dtype=mx.int32)
    everywhere = mx.ones(unspelled.shape, dtype=mx.bool_)
    ours = pair.mine.embed_subword(unspelled, everywhere, pair.chars)
    theirs = pair.ref.embed_subword(unspelled, everywhere)
    assert _max_abs(ours, theirs) == 0.0


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "op-by-op"])
def test_warmup_and_steps_match_reference(pair: Pair, monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    """Compiled (what the session runs) and op by op (where every draw can be recorded): both match."""
    if not compiled:
        # Exact mode draws one by one: no key comes in and none goes out.
        monkeypatch.setattr(
            EarTTS,
            "_refine",
            lambda self, hidden, draw_key=None, economy=0: (*self._refine_ops(hidden, economy=economy), None),
        )
    config = pair.config
    seed = 1234 + pair.seed  # the session's seed, the same on both sides
    tokens = _text_tokens(pair)
    silence = pair.weights["tts_model.codec_silence_tokens"]
    recorder = DrawRecorder(monkeypatch)

    reference_prompt = pair.reference_prompt()
    ref_state: dict[str, Any] = {}

    def ref_warmup() -> mx.array:
        _, cache = pair.ref.warmup(*reference_prompt[:-1], audio_prompt_latent=reference_prompt[-1], guidance=True)
        ref_state["cache"] = cache
        ref_state["after_warmup"] = _reference_cache_state(cache)
        return reference_prompt[0][:, -1:]

    def ref_step(previous: mx.array, token: mx.array) -> tuple[mx.array, mx.array]:
        out = pair.ref.step(previous, token, mx.ones(token.shape, dtype=mx.bool_), ref_state["cache"], guidance=True)
        return out.codes, out.hidden_states

    prompt = pair.prompt()
    state: dict[str, Any] = {}

    def our_warmup() -> mx.array:
        state["cache"] = cache = pair.mine.make_cache()
        first = pair.mine.warmup(prompt, cache, pair.chars)
        state["after_warmup"] = _our_cache_state(cache)
        return first

    def our_step(previous: mx.array, token: mx.array) -> tuple[mx.array, mx.array]:
        # As the session does: evaluate the frame's outputs and the caches once per step.
        result = pair.mine.step(state["cache"], TTSInput(previous, token, pair.chars))
        mx.eval(result.codes, result.hidden, state["cache"].arrays())
        return result.codes, result.hidden

    theirs = _drive(ref_warmup, ref_step, tokens, silence, config.eos_token_id, recorder, seed)
    their_rng = np.array(mx.random.state[0])
    ours = _drive(our_warmup, our_step, tokens, silence, config.eos_token_id, recorder, seed)
    # Both consumed the global generator identically (a compiled step threads the state through).
    assert np.array_equal(np.array(mx.random.state[0]), their_rng)

    # Codes: identical every step, int32, inside the codebook.
    assert len(ours.codes) == len(theirs.codes) == STEPS
    for index, (mine, reference) in enumerate(zip(ours.codes, theirs.codes, strict=True)):
        assert mine.dtype == np.int32 and mine.shape == (1, 1, config.tts_config.num_quantizers)
        assert np.array_equal(mine, reference), f"codes differ at step {index} (token {tokens[index]})"
    # Hidden states: bit-identical.
    hidden_diff = max(_max_abs(a, b) for a, b in zip(ours.hidden, theirs.hidden, strict=True))
    assert ours.hidden[0].shape == (2, 1, config.tts_config.hidden_size) and ours.hidden[0].dtype == mx.float32
    assert hidden_diff == 0.0
    # Caches: same layout and values after the warm-up and after crossing the sliding window.
    assert _compare_cache_states(state["after_warmup"], ref_state["after_warmup"]) == 0.0
    assert _compare_cache_states(_our_cache_state(state["cache"]), _reference_cache_state(ref_state["cache"])) == 0.0
    assert state["cache"].offset == 37 + STEPS
    # Random draws: none in the warm-up; per step one uniform over the components then one normal latent, per round.
    assert ours.warmup_draws == theirs.warmup_draws == 0
    if compiled:
        return  # a compiled step records its draws only while tracing; the op-by-op run checks them one by one
    rounds = 5
    assert len(ours.draws) == len(theirs.draws) == STEPS * rounds * 2
    components, latent = config.tts_config.mog_head.num_predictions, config.tts_config.latent_size
    for index, ((kind, value), (ref_kind, ref_value)) in enumerate(zip(ours.draws, theirs.draws, strict=True)):
        # The same draw, as rows (1, ·) where the reference's is (1, 1, ·): a draw's values depend on its size only.
        expected = ("uniform", components) if index % 2 == 0 else ("normal", latent)
        assert (kind, value.shape[-1]) == (ref_kind, ref_value.shape[-1]) == expected
        assert tuple(value.shape) == (1, expected[1]) and tuple(ref_value.shape) == (1, 1, expected[1])
        assert value.dtype == ref_value.dtype == mx.float32
        assert mx.array_equal(value.reshape(-1), ref_value.reshape(-1)).item(), f"draw {index} differs"
