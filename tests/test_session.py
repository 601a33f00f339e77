"""The streaming session API: chunking, events, input validation, flush/cancel/limits."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.errors import AudioInputError, ContextLimitError, SessionClosedError
from engine.events import (
    AssistantTextDelta,
    AudioChunk,
    Cancelled,
    Done,
    FrameTiming,
    FunctionDelta,
    ToolCall,
    UserTranscriptDelta,
)
from engine.hooks import NoHooks
from engine.model import load_voicechat
from engine.profiler import FrameProfiler
from engine.session import Session
from engine.tools import ToolCallParser


@pytest.fixture(scope="module")
def voicechat(tiny_q4):
    return load_voicechat(tiny_q4)


@pytest.fixture(scope="module")
def audio(speech_16k) -> np.ndarray:
    return speech_16k[: 1280 * 24 + 500]


def _push_all(session: Session, samples: np.ndarray, chunk: int) -> list:
    events = []
    for start in range(0, samples.shape[0], chunk):
        events += session.push(samples[start : start + chunk], 16_000)
    return events


def _frames(events: list) -> list[AudioChunk]:
    return [e for e in events if isinstance(e, AudioChunk) and e.codes.size]


def _assert_same_audio(first: list, second: list) -> None:
    """Two runs' events carry the same codes and the same samples, frame by frame."""
    assert [c.codes.tolist() for c in _frames(first)] == [c.codes.tolist() for c in _frames(second)]
    for a, b in zip(_frames(first), _frames(second), strict=True):
        np.testing.assert_array_equal(a.samples, b.samples)


def test_chunk_size_does_not_change_anything(voicechat, audio):
    by_frame = _push_all(Session(voicechat, seed=3), audio, 1280)
    by_odd = _push_all(Session(voicechat, seed=3), audio, 777)
    a, b = _frames(by_frame), _frames(by_odd)
    assert len(a) == len(b) == 24
    for x, y in zip(a, b, strict=True):
        assert x.frame_index == y.frame_index
        np.testing.assert_array_equal(x.codes, y.codes)
        np.testing.assert_array_equal(x.samples, y.samples)
    texts = [(e.frame_index, e.token_id, e.delta) for e in by_frame if isinstance(e, AssistantTextDelta)]
    assert texts == [(e.frame_index, e.token_id, e.delta) for e in by_odd if isinstance(e, AssistantTextDelta)]


def test_events_per_frame_in_order(voicechat, audio):
    session = Session(voicechat, seed=0, hooks=FrameProfiler())
    events = session.push(audio[: 1280 * 6], 16_000)
    order = {
        UserTranscriptDelta: 0,
        AssistantTextDelta: 1,
        FunctionDelta: 2,
        ToolCall: 3,
        AudioChunk: 4,
        FrameTiming: 5,
    }
    for frame in range(6):
        kinds = [order[type(e)] for e in events if e.frame_index == frame]
        assert kinds == sorted(kinds) and kinds.count(4) == 1 and kinds.count(5) == 1
    chunk = _frames(events)[0]
    assert chunk.samples.dtype == np.float32 and chunk.samples.shape == (1764,)
    assert chunk.codes.dtype == np.int32 and chunk.codes.shape == (31,)
    # Without a system prompt the first timeline step emits the checkpoint's silence codes.
    silence = np.array(voicechat.model.tts_model.codec_silence_tokens, dtype=np.int32)
    np.testing.assert_array_equal(chunk.codes, silence)
    timing = [e for e in events if isinstance(e, FrameTiming)]
    assert all(t.host_syncs >= 2 and t.total_ms > 0 for t in timing)
    assert session.frame_index == 6 and len(session.text_ids) == 6


def test_invalid_input_is_refused_without_consuming_anything(voicechat, audio):
    clean = Session(voicechat, seed=1)
    expected = _frames(clean.push(audio[: 1280 * 3], 16_000))
    session = Session(voicechat, seed=1)
    cases = [
        ((audio[:1280], 48_000), "expected 16000 Hz audio, received 48000 Hz"),
        ((np.stack([audio[:1280], audio[:1280]]), 16_000), "expected mono audio"),
        ((np.zeros(0, np.float32), 16_000), "empty audio chunk"),
        ((np.full(1280, np.nan, np.float32), 16_000), "NaN or infinite"),
        ((np.array(["a", "b"]), 16_000), "must be numbers"),
    ]
    for (samples, rate), message in cases:
        with pytest.raises(AudioInputError, match=message):
            session.push(samples, rate)
    got = _frames(session.push(audio[: 1280 * 3], 16_000))
    assert [c.codes.tolist() for c in got] == [c.codes.tolist() for c in expected]
    # (N, 1) and int16-range integer input are accepted as mono.
    assert session.push(audio[:1280].reshape(-1, 1), 16_000)


def test_flush_pads_partial_frame_and_emits_codec_tail(voicechat, audio):
    session = Session(voicechat, seed=0)
    events = session.push(audio[: 1280 * 2 + 300], 16_000)
    assert len(_frames(events)) == 2
    tail_events = session.flush()
    assert isinstance(tail_events[-1], Done) and tail_events[-1].frame_index == 3
    chunks = [e for e in tail_events if isinstance(e, AudioChunk)]
    assert [c.samples.shape[0] for c in chunks] == [1764, 8]
    assert session.closed and session.flush() == []
    with pytest.raises(SessionClosedError):
        session.push(audio[:1280], 16_000)


def test_cancel_stops_without_output(voicechat, audio):
    session = Session(voicechat, seed=0)
    session.push(audio[:2000], 16_000)
    assert session.cancel() == [Cancelled(1)]
    assert session.cancel() == [] and session.flush() == []
    with pytest.raises(SessionClosedError, match="start a new one"):
        session.push(audio[:1280], 16_000)


def test_length_limit(voicechat, audio):
    with pytest.raises(ValueError, match="must be positive"):
        Session(voicechat, max_seconds=0)
    session = Session(voicechat, seed=0, max_seconds=0.4)  # 5 frames
    assert len(_frames(session.push(audio[: 1280 * 5], 16_000))) == 5
    with pytest.raises(ContextLimitError, match="limit"):
        session.push(audio[:1280], 16_000)
    assert isinstance(session.flush()[-1], Done)


def test_tool_call_events_follow_the_function_channel(voicechat, speech_16k):
    session = Session(voicechat, seed=0)
    events = _push_all(session, np.concatenate([speech_16k, speech_16k]), 1280)
    parser = ToolCallParser(voicechat.tokenizer)
    expected = []
    for frame, token in enumerate(session.function_ids):
        expected += parser.push(token, frame, ignored=voicechat.config.special_text_ids)
    got = [e for e in events if isinstance(e, ToolCall)]
    assert got, "the tiny model opens and closes a call in this conversation"
    assert got == expected


def test_system_prompt_changes_the_conversation(voicechat, audio):
    plain = _frames(Session(voicechat, seed=0).push(audio[: 1280 * 4], 16_000))
    prompted = _frames(Session(voicechat, seed=0, system_prompt="Answer briefly.").push(audio[: 1280 * 4], 16_000))
    assert [c.codes.tolist() for c in plain] != [c.codes.tolist() for c in prompted]


def test_sub_stage_timing_changes_nothing_but_the_clock(voicechat, audio):
    """Sub-stage probes evaluate at boundaries and run the TTS rounds and codec op by op: same outputs."""
    plain = Session(voicechat, seed=2).push(audio[: 1280 * 8], 16_000)
    probed = Session(voicechat, seed=2, hooks=FrameProfiler(sub_stages=True)).push(audio[: 1280 * 8], 16_000)
    _assert_same_audio(plain, probed)
    timings = [e for e in probed if isinstance(e, FrameTiming)]
    names = set().union(*(t.sub_stages for t in timings))
    assert {"perception.layers", "language.llm", "tts.backbone", "tts.mog.5", "codec.decoder"} <= names
    assert all(t.host_syncs > 10 for t in timings[1:])


def test_hooks_watch_without_changing_a_frame(voicechat, audio):
    """Instrumentation is the caller's: without hooks a session emits no timing; a profiler that times one frame
    in three on the device (its own policy) marks exactly those frames, each with its extra waits; hooks that
    observe see every network's inputs, the prompt's prefill included. The audio is the same every way."""
    plain = Session(voicechat, seed=2, system_prompt="Hi.")
    plain_events = plain.push(audio[: 1280 * 7], 16_000)
    assert not [e for e in plain_events if isinstance(e, FrameTiming)]

    profiled = Session(voicechat, seed=2, system_prompt="Hi.", hooks=FrameProfiler(stage_timing_every=3))
    profiled_events = profiled.push(audio[: 1280 * 7], 16_000)
    timings = [e for e in profiled_events if isinstance(e, FrameTiming)]
    assert [t.timing_mode for t in timings] == ["device", "host", "host"] * 2 + ["device"]
    # A frame timed on the device also waits at its stage boundaries; the others wait where a frame must.
    host_timed = Session(voicechat, seed=2, system_prompt="Hi.", hooks=FrameProfiler()).push(audio[: 1280 * 7], 16_000)
    host_syncs = [e.host_syncs for e in host_timed if isinstance(e, FrameTiming)]
    extra = [t.host_syncs - syncs for t, syncs in zip(timings, host_syncs, strict=True)]
    assert [count > 0 for count in extra] == [t.timing_mode == "device" for t in timings]
    assert extra.count(0) == 4

    class Watcher(NoHooks):
        observing = True

        def __init__(self) -> None:
            self.seen: list[str] = []

        def observe(self, name: str, value: object) -> None:
            self.seen.append(name)

    watcher = Watcher()
    watched = Session(voicechat, seed=2, system_prompt="Hi.", hooks=watcher)
    prompt_steps = watched.prompt_steps
    assert prompt_steps > 0 and watcher.seen.count("language.input") == prompt_steps
    watched_events = watched.push(audio[: 1280 * 7], 16_000)
    assert watcher.seen.count("language.input") == prompt_steps + 7
    assert watcher.seen.count("codec.samples") == 7
    for events in (profiled_events, watched_events):
        _assert_same_audio(plain_events, events)
    assert plain.text_ids == profiled.text_ids == watched.text_ids


@pytest.fixture(scope="module")
def fast_voicechat(tiny_q4):
    return load_voicechat(tiny_q4, numerics="fast")


def test_fast_frames_spell_the_text_id_on_the_device_and_sync_once(fast_voicechat, audio, monkeypatch):
    """Fast numerics builds a frame to its end before the host waits: the TTS takes the text id on the device,
    and the ids are read with the samples — a sync a frame fewer than with the id read back after the LLM, and
    on this CPU the same ids, codes and samples (the character encoder's padded sums come out exact here)."""
    once = Session(fast_voicechat, seed=2, hooks=FrameProfiler())
    once_events = once.push(audio[: 1280 * 8], 16_000)
    monkeypatch.setattr(Session, "_tts_spells_on_device", property(lambda self: False))
    twice = Session(fast_voicechat, seed=2, hooks=FrameProfiler())
    twice_events = twice.push(audio[: 1280 * 8], 16_000)
    assert once.text_ids == twice.text_ids and once.function_ids == twice.function_ids
    _assert_same_audio(once_events, twice_events)
    syncs_once, syncs_twice = (
        [t.host_syncs for t in events if isinstance(t, FrameTiming)][1:] for events in (once_events, twice_events)
    )
    assert len(syncs_once) == 7 and [count + 1 for count in syncs_once] == syncs_twice


@pytest.mark.parametrize("end_of_speech", [True, False])
def test_the_tts_step_on_the_device_follows_the_host_rules(fast_voicechat, audio, end_of_speech):
    """The device form of a TTS step keeps the host form's rules: an end of speech resets the fed-back codes
    (and their codebook sum) to silence; any other id leaves them. Same codes and state, bit for bit."""
    token_id = fast_voicechat.config.eos_token_id if end_of_speech else 5
    results = []
    for on_device in (True, False):
        session = Session(fast_voicechat, seed=4)  # seeds the generator: both steps draw the same numbers
        session.push(audio[: 1280 * 2], 16_000)  # past the timeline's silent first step: codes and their sum fed back
        assert session.caches.previous_code_sum is not None
        codes = session._tts_step_on_device(mx.array([token_id])) if on_device else session._tts_step(token_id)
        caches = session.caches
        results.append([codes, caches.previous_code, caches.previous_code_sum])
    for device_array, host_array in zip(*results, strict=True):
        assert mx.array_equal(device_array, host_array).item()


def test_early_launches_change_nothing_but_the_clock(voicechat, audio, monkeypatch):
    """Each part of a frame is launched as soon as it is built (``FrameProfiler.launch``); launched only at the
    syncs instead, the frame evaluates the same graphs: the same ids, codes and samples."""
    early = Session(voicechat, seed=2, hooks=FrameProfiler())
    early_events = early.push(audio[: 1280 * 8], 16_000)
    monkeypatch.setattr(FrameProfiler, "launch", lambda self, *arrays: None)
    late = Session(voicechat, seed=2, hooks=FrameProfiler())
    late_events = late.push(audio[: 1280 * 8], 16_000)
    assert early.text_ids == late.text_ids and early.function_ids == late.function_ids
    _assert_same_audio(early_events, late_events)


def test_parts_launched_within_a_phase_change_nothing_but_the_clock(fast_voicechat, audio, monkeypatch):
    """Fast numerics' frame also launches the RN-T proposal before the LLM step is built and the TTS backbone
    before the MaskGIT rounds (``FrameProfiler.launch_part``); with phases launched whole instead, the frame
    evaluates the same graphs: the same ids, codes and samples."""
    launches: list[int] = []
    launch = FrameProfiler.launch

    def counted(self: FrameProfiler, *arrays: mx.array) -> None:
        launches.append(len(arrays))
        launch(self, *arrays)

    monkeypatch.setattr(FrameProfiler, "launch", counted)
    parts = Session(fast_voicechat, seed=2, hooks=FrameProfiler())
    parts_events = parts.push(audio[: 1280 * 8], 16_000)
    with_parts = len(launches)
    monkeypatch.setattr(FrameProfiler, "launch_parts", False)
    launches.clear()
    whole = Session(fast_voicechat, seed=2, hooks=FrameProfiler())
    whole_events = whole.push(audio[: 1280 * 8], 16_000)
    frames = len(whole.text_ids)
    # Two parts a frame, but the first frame's TTS step (the timeline's silence, no backbone).
    assert frames == 8 and with_parts - len(launches) == 2 * frames - 1
    assert parts.text_ids == whole.text_ids and parts.function_ids == whole.function_ids
    _assert_same_audio(parts_events, whole_events)


def test_a_model_encodes_its_speaker_prompt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TTS's speaker prompt (the codec's codes of silence) is encoded by a model's first session and kept per
    numerics mode: later sessions encode nothing (at full size the encoding holds about 0.9 GB while it runs), and
    the kept prompt is the one a fresh encoding makes."""
    from engine.networks.codec import Codec
    from engine.numerics import set_numerics
    from engine.random_model import random_voicechat
    from engine.session import speaker_prompt

    voicechat = random_voicechat("tiny", quantize=4)
    encodings = []
    encode = Codec.encode

    def counted(self: Codec, waveform: mx.array) -> mx.array:
        encodings.append(waveform.shape)
        return encode(self, waveform)

    monkeypatch.setattr(Codec, "encode", counted)
    first, second = Session(voicechat, seed=0), Session(voicechat, seed=1)
    assert len(encodings) == 1 and first.caches is not second.caches
    kept = voicechat.speaker_prompts["exact"]
    voicechat.speaker_prompts.clear()
    fresh = speaker_prompt(voicechat)
    assert len(encodings) == 2 and fresh is not kept
    for name in ("codes", "subword_ids", "subword_mask", "audio_mask", "latent"):
        assert mx.array_equal(getattr(fresh, name), getattr(kept, name)).item(), name
    set_numerics(voicechat, "fast")
    Session(voicechat, seed=0)
    assert len(encodings) == 3 and set(voicechat.speaker_prompts) == {"exact", "fast"}
