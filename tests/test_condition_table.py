"""Fast numerics' table of every token's text conditioning (:func:`engine.networks.tts.fast.use_condition_table`).

On CUDA a load makes it and a frame gathers its token's row where it ran the character encoder on the token's
spelling. The CPU never makes it at load (at full size that would take hours here), so these tests make it
themselves on the tiny model and check what the load's check and the frames rely on."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from app.bench import bench_input
from engine import numerics
from engine.counters import GraphCensus, named_weights
from engine.events import AudioChunk
from engine.networks.tts.fast import use_condition_table
from engine.networks.tts.subword import CharAwareSubwordEncoder
from engine.profiler import FrameProfiler
from engine.random_model import random_voicechat
from engine.session import Session
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE

FRAMES = 24


def _conversation(voicechat: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes and samples of FRAMES frames, and the TTS stage's primitives in the last (a census counts them)."""
    profiler = FrameProfiler(census=GraphCensus(named_weights(voicechat.model)))
    session = Session(voicechat, seed=0, hooks=profiler)
    samples = bench_input(FRAMES)
    codes, audio = [], []
    for start in range(0, samples.shape[0], INPUT_FRAME_SAMPLES):
        for event in session.push(samples[start : start + INPUT_FRAME_SAMPLES], INPUT_SAMPLE_RATE):
            if isinstance(event, AudioChunk):
                codes.append(event.codes_raw)
                audio.append(event.samples)
    census = profiler.last_census
    session.close()
    assert census is not None
    return np.array(codes), np.concatenate(audio), census.stages["tts"].primitives


@pytest.fixture(scope="module")
def voicechat() -> Any:
    loaded = random_voicechat("tiny", quantize=4, numerics="fast")
    mx.eval(loaded.model.parameters())  # the census reads the weights as graph inputs
    return loaded


def _vocabulary(voicechat: Any) -> int:
    return voicechat.model.stt_model.text_vocabulary_size


def test_the_table_holds_each_token_as_a_frame_encoded_it_and_changes_no_output(voicechat: Any) -> None:
    tts = voicechat.model.tts_model.tts_model
    size = _vocabulary(voicechat)
    tts.forget_condition_tables()
    codes, audio, encoded_primitives = _conversation(voicechat)

    assert use_condition_table(tts, voicechat.characters, size)
    assert tts.has_condition_table(size)
    spelling = voicechat.characters.on_device(size)
    ids = mx.arange(size, dtype=mx.int32)
    read = tts.condition_on_device(ids.reshape(1, -1), spelling)  # every token read from the table at once
    encoded = mx.concatenate(
        [tts.embed_subword.encode_on_device(ids[index : index + 1].reshape(1, 1), spelling) for index in range(size)],
        axis=1,
    )
    assert read.shape == (2, size, encoded.shape[-1]) and encoded.shape == (1, size, read.shape[-1])
    # Bit for bit on this CPU (a GPU's products over more rows may round a bf16 value one step apart: the load's
    # check allows that).
    assert mx.array_equal(read[:1], encoded).item()
    # Made in small groups (each at its own longest spelling's width, put back in id order): the same rows.
    grouped = tts.embed_subword.encode_vocabulary(spelling, positions=64)
    assert mx.array_equal(grouped[None], encoded).item()

    with_table = _conversation(voicechat)
    assert np.array_equal(with_table[0], codes) and np.array_equal(with_table[1], audio)
    # The character encoder's layer, pooling and flags no longer run each frame: a gather does.
    print(f"TTS stage primitives a frame: {encoded_primitives} encoding the token, {with_table[2]} with the table")
    assert with_table[2] <= encoded_primitives - 80, (with_table[2], encoded_primitives)

    numerics.set_numerics(voicechat, "exact")
    assert not tts.has_condition_table(size)  # exact mode never reads it, and lets it go
    numerics.set_numerics(voicechat, "fast")


def test_a_table_unlike_the_tokens_encoded_alone_is_not_used(voicechat: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    tts = voicechat.model.tts_model.tts_model
    tts.forget_condition_tables()
    made = CharAwareSubwordEncoder.encode_vocabulary

    def shifted(self: CharAwareSubwordEncoder, *args: Any, **kwargs: Any) -> mx.array:
        return mx.roll(made(self, *args, **kwargs), 1, axis=0)  # each row one token off

    monkeypatch.setattr(CharAwareSubwordEncoder, "encode_vocabulary", shifted)
    assert not use_condition_table(tts, voicechat.characters, _vocabulary(voicechat))
    assert not tts.has_condition_table(_vocabulary(voicechat))
