"""The system prompt's prefill, one position a step (exact numerics: the reference's) or in chunks (fast numerics),
and ``engine.prefill.prefill_positions``, which a tool response's injection can use too."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from app.bench import bench_input
from engine import relative_l2
from engine.events import AudioChunk
from engine.model import load_voicechat
from engine.networks.llm import NemotronH
from engine.ops.cache import KVCache
from engine.prefill import PREFILL_CHUNK, forced_feedback, prefill_positions
from engine.random_model import random_voicechat
from engine.session import Session
from tests.prefill_bench import last_hidden, prompt_of

FRAMES = 24  # frames after the prompt whose ids (and, teacher-forced, codes) are compared
# The LLM's last hidden state after a ~900-position prompt, in chunks against step by step: measured 4.8e-7 max abs
# (tiny, 4-bit, fast, CPU); the bound leaves twenty times that.
HIDDEN_MAX_ABS = 1e-5


@pytest.fixture(scope="module")
def exact() -> Any:
    return random_voicechat("tiny", quantize=4, numerics="exact")


@pytest.fixture(scope="module")
def fast() -> Any:
    return random_voicechat("tiny", quantize=4, numerics="fast")


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    return bench_input(FRAMES)


def _run(voicechat: Any, prompt: str, audio: np.ndarray, **options: Any) -> tuple[Session, list[AudioChunk]]:
    session = Session(voicechat, seed=0, system_prompt=prompt, **options)
    frames = [e for e in session.push(audio, 16_000) if isinstance(e, AudioChunk) and e.codes.size]
    return session, frames


def _global_keys(session: Session) -> mx.array:
    """The keys of the TTS backbone's first global layer, every position (speaker prompt, prompt, frames)."""
    layer = next(layer for layer in session.caches.tts.layers if isinstance(layer, KVCache))
    assert layer.keys is not None
    keys = layer.keys[..., : layer.offset, :]
    mx.eval(keys)
    return keys


class _Counted:
    """Counts the LLM's forwards and every ``mx.eval`` while in use."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.forwards = self.evaluations = 0
        forward, evaluate = NemotronH.__call__, mx.eval

        def counted_forward(llm: NemotronH, *args: Any, **kwargs: Any) -> mx.array:
            self.forwards += 1
            return forward(llm, *args, **kwargs)

        def counted_eval(*args: Any) -> None:
            self.evaluations += 1
            evaluate(*args)

        monkeypatch.setattr(NemotronH, "__call__", counted_forward)
        monkeypatch.setattr(mx, "eval", counted_eval)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Counted]:
    with monkeypatch.context() as patch:
        yield _Counted(patch)


def test_exact_mode_prefills_one_position_a_step(exact: Any, audio: np.ndarray, counted: _Counted) -> None:
    """Exact numerics keeps the reference's prefill: one LLM forward and one evaluation per prompt position, and
    a TTS step (codes sampled) for each but timeline 0; explicitly stepwise, the same ids, codes and samples."""
    prompt = prompt_of(exact.tokenizer, 120)
    session = Session(exact, seed=0, system_prompt=prompt)
    assert session.prefill_chunk == 1
    assert (counted.forwards, session.prompt_steps) == (120, 120)
    counts = session.prefill_counts
    assert (counts.positions, counts.llm_forwards, counts.tts_samples, counts.evaluations) == (120, 120, 119, 120)
    frames = [e for e in session.push(audio, 16_000) if isinstance(e, AudioChunk) and e.codes.size]
    stepwise, stepwise_frames = _run(exact, prompt, audio, prefill_chunk=1)
    assert session.text_ids == stepwise.text_ids and session.function_ids == stepwise.function_ids
    assert [f.codes.tolist() for f in frames] == [f.codes.tolist() for f in stepwise_frames]
    for ours, theirs in zip(frames, stepwise_frames, strict=True):
        np.testing.assert_array_equal(ours.samples, theirs.samples)


def test_a_chunked_prefill_is_not_exact_mode_s_arithmetic(exact: Any) -> None:
    """Why exact mode does not chunk: the multi-position path (Mamba's chunked scan, a block's products) rounds
    otherwise than a step, so the LLM's state after the prompt is not bit for bit the reference's."""
    prompt = prompt_of(exact.tokenizer, 120)
    stepwise, chunked = last_hidden(exact, prompt, 1), last_hidden(exact, prompt, PREFILL_CHUNK)
    assert not mx.array_equal(stepwise, chunked).item()
    assert float(mx.abs(chunked - stepwise).max().item()) <= HIDDEN_MAX_ABS


def test_fast_mode_prefills_900_positions_in_chunks(fast: Any, audio: np.ndarray, counted: _Counted) -> None:
    """Fast numerics: a ~900-position prompt (a system prompt and five tools) in 15 LLM forwards and 15 TTS backbone
    passes, one TTS step sampled, 32 evaluations — against 900, 899, 899 and 900 step by step — with the LLM's state
    within the bound and every text and function id of the following frames equal."""
    prompt = prompt_of(fast.tokenizer, 900)
    Session(fast, seed=0, system_prompt="Hi.").close()  # what a model makes once (its speaker prompt, copies)
    before, forwards_before = counted.evaluations, counted.forwards
    chunked = Session(fast, seed=0, system_prompt=prompt)
    chunked_evaluations = counted.evaluations - before
    chunked_frames = [e for e in chunked.push(audio, 16_000) if isinstance(e, AudioChunk) and e.codes.size]
    chunked_forwards = counted.forwards - forwards_before
    before = counted.evaluations
    stepwise = Session(fast, seed=0, system_prompt=prompt, prefill_chunk=1)
    stepwise_evaluations = counted.evaluations - before
    stepwise.push(audio, 16_000)
    assert chunked.prefill_chunk == PREFILL_CHUNK == 256
    chunks = math.ceil(900 / PREFILL_CHUNK)
    counts = chunked.prefill_counts
    assert (counts.positions, counts.llm_forwards, counts.tts_passes, counts.tts_samples) == (900, chunks, chunks, 1)
    assert counts.evaluations == 1 + chunks + chunks + 1  # the cache before, each LLM chunk, each TTS pass, the end
    assert chunked_evaluations == counts.evaluations + 1 and stepwise_evaluations == 900 + 1  # and the session's
    assert chunked_forwards == chunks + FRAMES  # the prefill's forwards, then one a frame
    assert stepwise.prefill_counts.llm_forwards == 900 and stepwise.prefill_counts.tts_samples == 899
    assert chunked.prompt_steps == stepwise.prompt_steps == 900
    assert len(chunked_frames) == FRAMES
    assert chunked.text_ids == stepwise.text_ids and chunked.function_ids == stepwise.function_ids
    hidden = [last_hidden(fast, prompt, chunk) for chunk in (1, PREFILL_CHUNK)]
    assert float(mx.abs(hidden[1] - hidden[0]).max().item()) <= HIDDEN_MAX_ABS
    stt = fast.model.stt_model
    assert [int(a.item()) for a in stt.choose(hidden[0])] == [int(a.item()) for a in stt.choose(hidden[1])]


@pytest.mark.parametrize(("numerics", "keys_bound"), [("exact", 1e-5), ("fast", 1e-3)])
def test_the_chunked_tts_prefill_is_stepping_teacher_forced_to_silence(
    numerics: str, keys_bound: float, exact: Any, fast: Any, audio: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the chunked TTS prefill changes is its input alone: stepped one position at a time with every prompt
    step after the first fed the codec's silence (not the codes the step before sampled), the TTS holds the same
    keys (float32: reordered sums; fast: its bf16 caches' roundings), ends the prompt on the same sampled codes
    (the draws it skipped leave the generator where stepping leaves it) and speaks the same codes after it."""
    voicechat = exact if numerics == "exact" else fast
    prompt = prompt_of(voicechat.tokenizer, 200)
    chunked = Session(voicechat, seed=0, system_prompt=prompt, prefill_chunk=PREFILL_CHUNK)
    chunked_keys, chunked_code = _global_keys(chunked), chunked.caches.previous_code
    chunked_frames = [e for e in chunked.push(audio, 16_000) if isinstance(e, AudioChunk) and e.codes.size]

    step = Session._tts_step

    def fed_silence(session: Session, text_id: int, probe: Any = None) -> mx.array:
        codes = step(session, text_id, probe)
        if 1 <= session._timeline_index < 200 - 1:  # a prompt step whose codes the next prompt step takes
            session.caches.previous_code, session.caches.previous_code_sum = session._silence_codes, None
        return codes

    monkeypatch.setattr(Session, "_tts_step", fed_silence)
    forced = Session(voicechat, seed=0, system_prompt=prompt, prefill_chunk=1)
    monkeypatch.setattr(Session, "_tts_step", step)
    assert forced.prefill_counts.tts_samples == 199
    assert relative_l2(chunked_keys, _global_keys(forced)) <= keys_bound
    assert mx.array_equal(forced.caches.previous_code, chunked_code).item()
    forced_frames = [e for e in forced.push(audio, 16_000) if isinstance(e, AudioChunk) and e.codes.size]
    assert [f.codes.tolist() for f in chunked_frames] == [f.codes.tolist() for f in forced_frames]

    # Stepping on the codes it samples instead, the TTS holds other keys: the teacher forcing is the change.
    stepwise = Session(voicechat, seed=0, system_prompt=prompt, prefill_chunk=1)
    assert relative_l2(chunked_keys, _global_keys(stepwise)) > keys_bound


def test_prefill_positions_feeds_back_the_ids_it_is_given(fast: Any) -> None:
    """A tool response's positions: the function channel forced, the text PAD, an audio embedding per position.
    In chunks, each position's input is ``E[text] + audio + 2·E[function]`` of the ids given for it, as a step's
    (``DuplexSTT.fuse_inputs``): the last hidden state matches stepping those inputs, and so do the ids after it."""
    stt = fast.model.stt_model
    pad = fast.config.pad_token_id
    positions = 40
    function_ids = [pad, *fast.tokenizer.encode('<TOOL_RESPONSE>[{"ok": true, "time": "10:42"}]</TOOL_RESPONSE>')]
    function_ids = (function_ids * positions)[:positions]
    text_ids = [pad] * positions
    audio = 0.1 * mx.random.normal((1, positions, stt.llm.config.hidden_size), key=mx.random.key(3))

    cache = stt.llm.make_cache()
    result = prefill_positions(stt, cache, audio, text_ids, function_ids, chunk=16)
    assert (result.forwards, result.last_hidden.shape, cache.position) == (3, (1, 1, stt.llm.config.hidden_size), 40)

    stepped = stt.llm.make_cache()
    for index in range(positions):
        hidden = stt.llm.step(
            stepped, stt.fuse_inputs(text_ids[index], audio[:, index : index + 1], function_ids[index])
        )
        mx.eval(stepped.arrays())
    assert float(mx.abs(result.last_hidden - hidden).max().item()) <= HIDDEN_MAX_ABS
    assert [int(a.item()) for a in stt.choose(hidden)] == [int(a.item()) for a in stt.choose(result.last_hidden)]
    # One position a forward is the step itself, bit for bit.
    single = stt.llm.make_cache()
    one = prefill_positions(stt, single, audio, text_ids, function_ids, chunk=1)
    assert one.forwards == positions and mx.array_equal(one.last_hidden, hidden).item()


def test_prefill_positions_refuses_inputs_it_cannot_place(fast: Any) -> None:
    stt = fast.model.stt_model
    width = stt.llm.config.hidden_size
    cache = stt.llm.make_cache()
    with pytest.raises(ValueError, match=r"audio_embeddings must be \(1, T, "):
        prefill_positions(stt, cache, mx.zeros((1, 3, width + 1)), [12] * 3, [12] * 3)
    with pytest.raises(ValueError, match="3 positions need as many feedback ids; got 2 text and 3 function"):
        prefill_positions(stt, cache, mx.zeros((1, 3, width)), [12] * 2, [12] * 3)
    with pytest.raises(ValueError, match="chunk must be at least 1"):
        prefill_positions(stt, cache, mx.zeros((1, 3, width)), [12] * 3, [12] * 3, chunk=0)
    with pytest.raises(ValueError, match="at least one position"):
        prefill_positions(stt, cache, mx.zeros((1, 0, width)), [], [])
    assert cache.position == 0  # nothing consumed
    with pytest.raises(ValueError, match="prefill_chunk must be at least 1"):
        Session(fast, system_prompt="Hi.", prefill_chunk=0)


def test_forced_feedback_shifts_the_forced_ids_by_one_position() -> None:
    """Forcing f0 f1 f2 on the function channel: each position is fed back the id forced one position before (the
    first, the ids chosen last), the text channel PAD after the first."""
    assert forced_feedback(7, 20, [30, 31, 22], pad_id=12) == ([7, 12, 12], [20, 30, 31])
    assert forced_feedback(12, 21, [22], pad_id=12) == ([12], [21])
    with pytest.raises(ValueError, match="at least one forced id"):
        forced_feedback(12, 12, [], pad_id=12)


def test_warm_up_in_fast_numerics_prefills_the_prompt_it_is_given(tiny_q4, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast numerics' warm-up traces the chunked prefill on the conversations' own prompt (its shapes), or on a
    stand-in a chunk and a half long; exact numerics (one position a step, the per-frame programs) need none."""
    from engine.warming import warm_up, warming_prompt

    fast = load_voicechat(tiny_q4, numerics="fast")
    prompt = "Answer in one short sentence."
    opened: list[Session] = []
    original = Session.__init__

    def recording(self: Session, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(Session, "__init__", recording)
    warm_up(fast, system_prompt=prompt)
    warm_up(fast)
    warm_up(load_voicechat(tiny_q4, numerics="exact"), system_prompt=prompt)
    prompted = [session for session in opened if session.prompt_steps]
    assert [session.system_prompt for session in prompted] == [prompt, warming_prompt(fast, PREFILL_CHUNK * 3 // 2)]
    assert prompted[1].prompt_steps >= PREFILL_CHUNK * 3 // 2 + 2 and prompted[1].prefill_counts.llm_forwards == 2
