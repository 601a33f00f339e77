"""EAR-TTS unit tests: schedule, top-p, caches, character table, speaker prompt and generated codes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.errors import TokenizerError
from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.loading.config import TTSConfig, VoiceChatConfig
from engine.loading.tokenizer import TextTokenizer
from engine.networks.tts import EarTTS, RefinementRound, SpeakerPrompt, TTSInput, build_speaker_prompt, refinement_plan
from engine.networks.tts.subword import CharacterTable, spell_tokens
from engine.ops.cache import KVCache, PositionLayout, SlidingKVCache
from engine.ops.sampling import draw_component, top_p_mask
from tests.conftest import CheckpointFactory


@dataclass
class Loaded:
    config: VoiceChatConfig
    tokenizer: TextTokenizer
    chars: CharacterTable
    tts: EarTTS
    aria: mx.array
    silence: mx.array


@pytest.fixture(scope="module")
def loaded(checkpoint_factory: CheckpointFactory) -> Loaded:
    path: Path = checkpoint_factory(None, 0)
    files, weights, quantized = read_runtime_weights(path)
    config = files.config
    tts = EarTTS(config.tts_config)
    load_into(tts, weights, quantized, "tts_model.tts_model.")
    tokenizer = TextTokenizer.from_file(files.tokenizer_file)
    chars = CharacterTable.from_vocabulary(tokenizer.get_vocab(), config.tts_config.character_encoder)
    return Loaded(
        config,
        tokenizer,
        chars,
        tts,
        weights["tts_model.audio_prompt_latents.Aria"],
        weights["tts_model.codec_silence_tokens"],
    )


def _random_silence_codes(config: TTSConfig, seed: int = 0) -> mx.array:
    """Stand-in for the codec's codes of 38 silent frames (only their shape and range matter here)."""
    rng = np.random.default_rng(seed)
    return mx.array(rng.integers(0, config.codebook_size, size=(1, 38, config.num_quantizers)), dtype=mx.uint32)


def _prompt(loaded: Loaded) -> SpeakerPrompt:
    config = loaded.config
    return build_speaker_prompt(
        _random_silence_codes(config.tts_config), loaded.aria, config.tts_config, config.pad_token_id
    )


# --------------------------------------------------------------------------- schedule and sampling


def test_refinement_schedule() -> None:
    config = TTSConfig()
    assert config.refinement_counts == (0, 0, 0, 1, 1, 3, 4, 22)
    assert refinement_plan(config) == (
        RefinementRound(0, 1),
        RefinementRound(1, 1),
        RefinementRound(2, 3),
        RefinementRound(5, 4),
        RefinementRound(9, 22),
    )
    assert sum(r.count for r in refinement_plan(config)) == config.num_quantizers


def test_top_p_keeps_the_nucleus() -> None:
    probs = np.array([0.07, 0.5, 0.03, 0.25, 0.15], dtype=np.float32)
    logits = mx.array(np.log(probs))[None]

    def kept(top_p: float) -> set[int]:
        masked = np.asarray(top_p_mask(logits, top_p))[0]
        assert np.all(masked[np.isfinite(masked)] == np.asarray(logits)[0][np.isfinite(masked)])
        return {int(i) for i in np.flatnonzero(np.isfinite(masked))}

    # Sorted: 0.5, 0.25, 0.15, 0.07, 0.03 with mass above 0, 0.5, 0.75, 0.90, 0.97.
    assert kept(0.95) == {1, 3, 4, 0}
    assert kept(0.6) == {1, 3}
    assert kept(0.1) == {1}
    assert kept(1.0) == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError):
        top_p_mask(logits, 0.0)


def test_component_draw_stays_in_the_nucleus() -> None:
    probs = np.array([0.07, 0.5, 0.03, 0.25, 0.15], dtype=np.float32)
    logits = mx.broadcast_to(mx.array(np.log(probs)), (4000, 5))
    mx.random.seed(3)
    drawn = np.asarray(draw_component(logits, 0.95))
    counts = np.bincount(drawn, minlength=5)
    assert counts[2] == 0  # outside the 0.95 nucleus
    # The other four are drawn in proportion to their renormalised probability.
    expected = probs / probs[[0, 1, 3, 4]].sum() * len(drawn)
    for index in (0, 1, 3, 4):
        assert abs(counts[index] - expected[index]) < 5 * np.sqrt(expected[index])


# --------------------------------------------------------------------------- caches and backbone


def test_make_cache_kinds(loaded: Loaded) -> None:
    config = loaded.config.tts_config
    cache = loaded.tts.make_cache()
    assert len(cache.layers) == config.num_hidden_layers
    for index, layer in enumerate(cache.layers):
        if (index + 1) % 6 == 0:
            assert isinstance(layer, KVCache)
        else:
            assert isinstance(layer, SlidingKVCache) and layer.window == config.sliding_window == 48
    assert cache.arrays() == [] and cache.offset == 0


def test_sliding_cache_rotates_like_a_ring() -> None:
    cache = SlidingKVCache(window=5)

    def position(p: int) -> mx.array:
        return mx.full((1, 1, 1, 2), float(p))

    def stored(keys: mx.array) -> list[int]:
        return [int(v) for v in np.asarray(keys)[0, 0, :, 0]]

    for p in range(3):
        keys, _ = cache.update(position(p), position(p))
        assert stored(keys) == list(range(p + 1))
    for p in range(3, 12):
        keys, _ = cache.update(position(p), position(p))
    # Slot = position mod 5 once full: the buffer is read in rotated order.
    assert stored(keys) == [10, 11, 7, 8, 9] and cache.offset == 12 and cache.write_index == 2
    # A block is appended to the window - 1 newest positions, in time order.
    block = mx.concatenate([position(12), position(13)], axis=2)
    keys, _ = cache.update(block, block)
    assert stored(keys) == [8, 9, 10, 11, 12, 13] and cache.offset == 14
    keys, _ = cache.update(position(14), position(14))
    assert sorted(stored(keys)) == [10, 11, 12, 13, 14] and len(cache.arrays()) == 2


def test_full_cache_grows_in_blocks() -> None:
    cache = KVCache()
    block = mx.arange(3, dtype=mx.float32).reshape(1, 1, 3, 1)
    keys, _ = cache.update(block, block)
    assert cache.keys is not None and cache.keys.shape[2] == 256
    for p in range(3, 300):
        keys, _ = cache.update(mx.full((1, 1, 1, 1), float(p)), mx.full((1, 1, 1, 1), float(p)))
    assert cache.keys.shape[2] == 512 and cache.offset == 300
    assert np.array_equal(np.asarray(keys)[0, 0, :, 0], np.arange(300, dtype=np.float32))


@pytest.mark.parametrize("kind", ["full", "sliding"])
def test_a_cache_of_a_dtype_stores_every_position_in_it(kind: str) -> None:
    """Fast numerics' bf16 caches: a block and single positions are stored rounded to bf16, growth and the ring's
    wrap keep the dtype, ``update`` hands the stored positions back widened to the keys' own dtype and ``store``
    the buffers as stored (what the attention kernel reads); a reserved slot (the traced step's) is bf16 too."""
    window = 300

    def make() -> KVCache | SlidingKVCache:
        return KVCache(dtype=mx.bfloat16) if kind == "full" else SlidingKVCache(window=window, dtype=mx.bfloat16)

    def rounded(values: np.ndarray) -> np.ndarray:
        return np.asarray(mx.array(values).astype(mx.bfloat16).astype(mx.float32))

    cache = make()
    positions = np.random.default_rng(3).standard_normal((2, 3, 320, 4)).astype(np.float32)
    cache.update(mx.array(positions[:, :, :5]), mx.array(-positions[:, :, :5]))
    for p in range(5, 319):  # past a growth step and, for the ring, past its window
        fresh = positions[:, :, p : p + 1]
        if p % 2:
            cache.update(mx.array(fresh), mx.array(-fresh))
        else:
            key_buffer, value_buffer, _ = cache.store(mx.array(fresh), mx.array(-fresh))
            assert key_buffer.dtype == value_buffer.dtype == mx.bfloat16
    keys, values = cache.update(mx.array(positions[:, :, 319:]), mx.array(-positions[:, :, 319:]))
    expected = rounded(positions)
    if kind == "sliding":  # the last 300 positions, read as stored: slot = position mod 300
        expected = np.roll(expected[:, :, -window:], positions.shape[2] % window, axis=2)
    assert cache.keys is not None and cache.keys.dtype == mx.bfloat16
    assert keys.dtype == values.dtype == mx.float32
    assert np.array_equal(np.asarray(keys), expected) and np.array_equal(np.asarray(values), -expected)
    reserved = make()
    reserved.reserve(PositionLayout(2, 3, 4, 4, mx.float32, mx.float32))
    assert reserved.keys is not None and reserved.values is not None
    assert reserved.keys.dtype == reserved.values.dtype == mx.bfloat16


def test_cached_steps_equal_a_full_causal_pass(loaded: Loaded) -> None:
    """Prompt-sized block then single positions, across the sliding window, against one masked pass."""
    config = loaded.config.tts_config
    backbone = loaded.tts.backbone
    prompt_length, total = 37, 37 + 40
    inputs = mx.random.normal((2, total, config.hidden_size), key=mx.random.key(11))
    full = backbone(inputs)
    cache = loaded.tts.make_cache()
    pieces = [backbone(inputs[:, :prompt_length], cache.layers)]
    for position in range(prompt_length, total):
        pieces.append(backbone(inputs[:, position : position + 1], cache.layers))
        mx.eval(pieces[-1], cache.arrays())
    cached = mx.concatenate(pieces, axis=1)
    # The prompt block is the same computation as the full pass's first 37 rows.
    assert float(mx.abs(cached[:, :prompt_length] - full[:, :prompt_length]).max()) == 0.0
    # Single-position steps reduce in other shapes and orders: float32 rounding only (measured 2e-6 on |h| ≤ 4).
    assert float(mx.abs(cached - full).max()) < 1e-5
    assert total > config.sliding_window and cache.offset == total


# --------------------------------------------------------------------------- character table


def test_character_table_of_the_tiny_tokenizer(loaded: Loaded) -> None:
    chars = loaded.chars
    assert chars.num_characters == 256 and chars.pad_id == 256
    vocab = loaded.tokenizer.get_vocab()
    singles = sorted((i, t) for t, i in vocab.items() if len(t) == 1)
    assert chars.spell(singles[0][0]) == (0,) and chars.spell(singles[-1][0]) == (255,)
    word = "\u0120the"
    assert word in vocab
    assert chars.spell(vocab[word]) == tuple(chars.spell(vocab[c])[0] for c in word)
    assert chars.spell(10**6) == ()


def test_character_table_rejects_a_wrong_vocabulary(loaded: Loaded) -> None:
    vocab = loaded.tokenizer.get_vocab()
    size = loaded.config.tts_config.character_encoder.char_vocab_size
    missing = {t: i for t, i in vocab.items() if t != "a"}
    with pytest.raises(TokenizerError, match="255 single-character tokens"):
        CharacterTable.from_vocabulary(missing, size)
    extra = {**vocab, "\u4e2d": max(vocab.values()) + 1}
    with pytest.raises(TokenizerError, match="needs exactly 256"):
        CharacterTable.from_vocabulary(extra, size)


def test_spelling_pads_and_locates_tokens(loaded: Loaded) -> None:
    vocab = loaded.tokenizer.get_vocab()
    ids = mx.array([[vocab["\u0120the"], vocab["a"], 10**6]], dtype=mx.int32)
    spelled = spell_tokens(loaded.chars, ids, mx.array([[True, False, True]]))
    assert spelled.count == 2 and spelled.longest == 4
    assert spelled.lengths.tolist() == [4, 0]
    assert spelled.char_ids.tolist()[1] == [256] * 4
    assert spelled.time_index.tolist() == [0, 2] and spelled.batch_index.tolist() == [0, 0]


def test_a_token_spelled_on_the_device_is_conditioned_as_on_the_host(loaded: Loaded) -> None:
    """Fast numerics spells the text id on the device (no readback): the whole vocabulary's spellings at the
    longest one's width, each token's padding masked. Ordinary, single-character, special and out-of-vocabulary
    ids (the last spell to nothing) get the conditioning the host's spelling at their own width gives, up to one
    rounding of the bf16 result (the padded sums run over more terms; on this CPU they come out exact)."""
    vocab = loaded.tokenizer.get_vocab()
    config = loaded.config
    size = max(vocab.values()) + 2  # one id past the vocabulary
    spelling = loaded.chars.on_device(size)
    longest = max(vocab.values(), key=lambda token_id: len(loaded.chars.spell(token_id)))
    ids = [vocab["\u0120the"], vocab["a"], longest, config.eos_token_id, config.bos_token_id, size - 1]
    assert spelling.char_ids.shape == (size, len(loaded.chars.spell(longest)))
    for token_id in ids:
        spelled = loaded.chars.spell(token_id)
        assert spelling.lengths[token_id].item() == len(spelled)
        row = spelling.char_ids[token_id].tolist()
        assert row == [*spelled, *[loaded.chars.pad_id] * (len(row) - len(spelled))]
        on_device = loaded.tts.condition_on_device(mx.array([[token_id]], dtype=mx.int32), spelling)
        on_host = loaded.tts._token_condition(token_id, loaded.chars)
        assert on_device.shape == on_host.shape and on_device.dtype == on_host.dtype
        np.testing.assert_allclose(
            np.array(on_device.astype(mx.float32)), np.array(on_host.astype(mx.float32)), rtol=2**-7, atol=1e-6
        )


# --------------------------------------------------------------------------- speaker prompt and steps


def test_speaker_prompt_layout(loaded: Loaded) -> None:
    config = loaded.config.tts_config
    silence = _random_silence_codes(config)
    prompt = build_speaker_prompt(silence, loaded.aria, config, loaded.config.pad_token_id)
    codes = np.asarray(prompt.codes)
    assert codes.shape == (1, 37, 31) and codes.dtype == np.int32
    assert (codes[:, [0, 36]] == config.codebook_size).all()
    assert np.array_equal(codes[:, 1:36], np.asarray(silence)[:, 1:36])
    assert prompt.subword_ids.tolist() == [[12] * 37]
    assert np.flatnonzero(np.asarray(prompt.subword_mask)[0]).tolist() == [35, 36]
    assert np.flatnonzero(np.asarray(prompt.audio_mask)[0]).tolist() == [36]
    with pytest.raises(ValueError, match="expected"):
        build_speaker_prompt(silence[:, :37], loaded.aria, config, 12)


def test_warmup_fills_the_caches(loaded: Loaded) -> None:
    config = loaded.config.tts_config
    cache = loaded.tts.make_cache()
    first = loaded.tts.warmup(_prompt(loaded), cache, loaded.chars)
    assert first.tolist() == [[[config.codebook_size] * 31]]
    assert cache.offset == 37 and len(cache.arrays()) == 2 * config.num_hidden_layers
    assert all(a.shape[0] == 2 and a.dtype == mx.float32 for a in cache.arrays())


def test_codes_stay_in_the_codebook(loaded: Loaded) -> None:
    config = loaded.config
    tts = loaded.tts
    tokens = [config.bos_token_id, *loaded.tokenizer.encode(" the capital"), config.eos_token_id, 12, 12]
    for seed in (0, 5):
        mx.random.seed(seed)
        cache = tts.make_cache()
        previous = tts.warmup(_prompt(loaded), cache, loaded.chars)
        seen = set()
        for token in tokens * 2:
            if token == config.eos_token_id:
                previous = mx.broadcast_to(loaded.silence[None, None, :], previous.shape)
            result = tts.step(cache, TTSInput(previous, mx.array([[token]], dtype=mx.int32), loaded.chars))
            mx.eval(result.codes, result.hidden, cache.arrays())
            codes = np.asarray(result.codes)
            assert codes.shape == (1, 1, 31) and codes.dtype == np.int32
            assert codes.min() >= 0 and codes.max() < config.tts_config.codebook_size
            assert result.hidden.shape == (2, 1, config.tts_config.hidden_size)
            assert result.hidden.dtype == mx.float32
            seen.add(codes.tobytes())
            previous = result.codes
        assert len(seen) > 1  # the generator is not stuck on one frame
