"""The engine's tool loop on a tiny random checkpoint: a scripted call stops the clock, the held mic frames keep
their transcript and return silence, the answer reaches the LLM's function channel as documented
(docs/tools.md), the held frames replay, and every bad input gets a clear error.

Random weights never call a tool on purpose, so the function channel's ids are scripted
(:class:`engine.tools.ScriptedChannels` through ``Session(override_ids=...)``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

import engine.tool_turn as tool_turn
from engine.errors import SessionClosedError, ToolLoopError
from engine.events import (
    AssistantTextDelta,
    AudioChunk,
    Cancelled,
    DeferredFramesDropped,
    Done,
    FunctionDelta,
    ToolCall,
    ToolResponseInjected,
    UserTranscriptDelta,
)
from engine.hooks import NO_HOOKS, NoHooks
from engine.model import VoiceChat, load_voicechat
from engine.session import Session
from engine.tools import MAX_CALL_POSITIONS, ScriptedChannels, ToolResult, render_tool_response

CALL = '{"name":"now"}'
FRAME = 1280
PAD = 12


@pytest.fixture(scope="module")
def voicechat(tiny_q4) -> VoiceChat:
    return load_voicechat(tiny_q4)


@pytest.fixture(scope="module")
def frames(speech_16k) -> list[np.ndarray]:
    count = speech_16k.shape[0] // FRAME
    return [speech_16k[index * FRAME : (index + 1) * FRAME] for index in range(count)]


class Recorder(NoHooks):
    """Keeps every LLM input position and every frame's projected audio (the perception stage's first output)."""

    observing = True

    def __init__(self) -> None:
        self.inputs: list[mx.array] = []
        self.perceived: list[mx.array] = []

    def observe(self, name: str, value: Any) -> None:
        if name == "language.input":
            self.inputs.append(value)

    def stage(self, name: str, *arrays: Any) -> None:
        if name == "perception":
            self.perceived.append(arrays[0])


def call_ids(voicechat: VoiceChat, body: str = CALL) -> list[int]:
    return [20, *voicechat.tokenizer.encode(body), 21]


def push(session: Session, frames: list[np.ndarray]) -> list[Any]:
    events: list[Any] = []
    for frame in frames:
        events += session.push(frame, 16_000)
    return events


def tool_session(voicechat: VoiceChat, script: list[int] | ScriptedChannels, **options: Any) -> Session:
    channels = script if isinstance(script, ScriptedChannels) else ScriptedChannels(script)
    return Session(voicechat, system_prompt="", seed=0, await_tool_results=True, override_ids=channels, **options)


def encoded_silence(voicechat: VoiceChat) -> mx.array:
    """The documented audio channel of an injected position: 13 frames (1.04 s) of zeros perceived from a fresh
    state, the last one's projection."""
    perception = voicechat.model.stt_model.perception
    state = perception.make_state()
    for _ in range(13):
        projected, _ = perception.step(state, mx.zeros((FRAME,), dtype=mx.float32), NO_HOOKS)
        mx.eval(projected, *state.arrays())
    return projected


def quiet(count: int) -> list[np.ndarray]:
    return [np.zeros(FRAME, dtype=np.float32)] * count


def of_kind(events: list[Any], kind: type) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


def test_a_scripted_call_stops_the_clock_and_its_answer_reaches_the_function_channel(voicechat, frames):
    script = [PAD, *call_ids(voicechat)]
    before, held = len(script), 14
    recorder = Recorder()
    session = tool_session(voicechat, script, hooks=recorder)

    # The call is parsed on the frame of <SPECIAL_21>, and the session waits from then on.
    events = push(session, frames[:before])
    calls = of_kind(events, ToolCall)
    assert calls == [ToolCall(before - 1, raw=CALL, name="now", arguments={})]
    assert session.awaiting_tool_results and session.pending_tool_calls == tuple(calls)
    positions = len(session.text_ids)
    assert positions == before and session.function_ids[-1] == 21

    # Held frames: the clock stands still, the transcript keeps coming (the same as without any tool loop), the
    # audio is the codec's silence.
    held_events = push(session, frames[before : before + held])
    assert len(session.text_ids) == positions and len(recorder.inputs) == positions
    assert session.frame_index == before + held and session.awaiting_tool_results
    assert not of_kind(held_events, AssistantTextDelta) + of_kind(held_events, FunctionDelta)
    assert not of_kind(held_events, ToolCall)
    chunks = of_kind(held_events, AudioChunk)
    silence_codes = np.asarray(voicechat.model.tts_model.codec_silence_tokens, dtype=np.int32)
    assert [chunk.frame_index for chunk in chunks] == list(range(before, before + held))
    for chunk in chunks:
        assert chunk.samples.shape == (1764,) and not chunk.samples.any()
        np.testing.assert_array_equal(chunk.codes, silence_codes)
    plain = Session(voicechat, system_prompt="", seed=0)
    plain_events = push(plain, frames[: before + held])
    transcript = [(e.frame_index, e.delta) for e in of_kind(events + held_events, UserTranscriptDelta)]
    assert transcript == [(e.frame_index, e.delta) for e in of_kind(plain_events, UserTranscriptDelta)]
    assert any(index >= before for index, _ in transcript), "the user speaks while the call waits"

    # The answer: the response's tokens, then <SPECIAL_22>, one per position.
    results = [ToolResult("now", True, "It is noon.")]
    expected = [*voicechat.tokenizer.encode(render_tool_response(results)), 22]
    answered = session.answer_tool_calls(results)
    injected = answered[0]
    assert isinstance(injected, ToolResponseInjected)
    assert injected.token_ids == tuple(expected) and injected.positions == len(expected)
    assert injected.frame_index == before + held and injected.replayed_frames == held and injected.seconds > 0
    assert voicechat.tokenizer.decode(expected[:-1]) == (
        '<TOOL_RESPONSE>[{"ok":true,"tool":"now","result":"It is noon."}]</TOOL_RESPONSE>'
    )
    response = slice(positions, positions + len(expected))
    assert session.function_ids[response] == expected
    assert session.text_ids[response] == [PAD] * len(expected)
    assert not session.awaiting_tool_results and session.pending_tool_calls == ()

    # The held frames replay as ordinary frames, on the resume frame's index.
    replayed = answered[1:]
    assert not of_kind(replayed, ToolResponseInjected) + of_kind(replayed, UserTranscriptDelta)
    assert [chunk.frame_index for chunk in of_kind(replayed, AudioChunk)] == [before + held] * held
    assert len(session.text_ids) == positions + len(expected) + held

    # The conversation goes on.
    after = push(session, frames[before + held : before + held + 3])
    assert len(of_kind(after, AudioChunk)) == 3 and not session.awaiting_tool_results
    assert len(session.text_ids) == positions + len(expected) + held + 3

    # Every LLM input after the first is E[text fed back] + audio + 2 E[function fed back], the ids fed back being
    # the previous position's; the audio is each frame's own perception, and encoded silence while injecting.
    audio = [
        *recorder.perceived[:before],
        *[encoded_silence(voicechat)] * len(expected),
        *recorder.perceived[before:],
    ]
    text, function = session.text_ids, session.function_ids
    assert len(recorder.inputs) == len(audio) == len(text)
    stt = voicechat.model.stt_model
    for position in range(1, len(text)):
        fused = stt.fuse_inputs(text[position - 1], audio[position], function[position - 1])
        assert mx.array_equal(recorder.inputs[position], fused).item(), f"position {position}"
    # So the function channel's inputs over the response are <SPECIAL_21>, its tokens, then <SPECIAL_22>.
    assert function[response.start - 1 : response.stop] == [21, *expected]


def test_the_tool_loop_changes_nothing_until_a_call(voicechat, frames):
    # One after the other: a session seeds MLX's global generator, which the TTS sampler draws from.
    plain = Session(voicechat, seed=4)
    first = push(plain, frames[:8])
    looped = Session(voicechat, seed=4, await_tool_results=True, override_ids=ScriptedChannels())
    second = push(looped, frames[:8])
    for a, b in zip(of_kind(first, AudioChunk), of_kind(second, AudioChunk), strict=True):
        np.testing.assert_array_equal(a.samples, b.samples)
    assert plain.text_ids == looped.text_ids and plain.function_ids == looped.function_ids


def test_without_await_tool_results_a_call_is_reported_and_the_conversation_goes_on(voicechat, frames):
    script = call_ids(voicechat)
    session = Session(voicechat, system_prompt="", seed=0, override_ids=ScriptedChannels(script))
    events = push(session, frames[: len(script) + 2])
    assert [call.name for call in of_kind(events, ToolCall)] == ["now"]
    assert not session.awaiting_tool_results and len(session.text_ids) == len(script) + 2
    with pytest.raises(ToolLoopError, match="no tool call is waiting for results"):
        session.answer_tool_calls([ToolResult("now", True, "noon")])


def test_a_call_list_needs_one_result_per_call_and_a_wrong_count_loses_nothing(voicechat, frames):
    body = '[{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Paris"}}]'
    script = call_ids(voicechat, body)
    session = tool_session(voicechat, script)
    with pytest.raises(ToolLoopError, match="no tool call is waiting for results"):
        session.answer_tool_calls([])
    push(session, quiet(len(script) + 2))
    assert [call.name for call in session.pending_tool_calls] == ["now", "get_weather"]
    positions = len(session.text_ids)
    for results in ([ToolResult("now", True, "noon")], [ToolResult("now", True, "noon")] * 3):
        with pytest.raises(ToolLoopError, match=rf"2 tool call\(s\) are waiting for results; received {len(results)}"):
            session.answer_tool_calls(results)
    with pytest.raises(ToolLoopError, match="must be a ToolResult, received dict"):
        session.answer_tool_calls([ToolResult("now", True, "noon"), {"ok": True}])  # type: ignore[list-item]
    with pytest.raises(ToolLoopError, match="needs a str tool, a bool ok and a str content"):
        session.answer_tool_calls([ToolResult("now", True, "noon"), ToolResult("w", True, 21)])  # type: ignore[arg-type]
    assert session.awaiting_tool_results and len(session.text_ids) == positions
    injected = session.answer_tool_calls([ToolResult("now", True, "noon"), ToolResult("get_weather", False, "offline")])
    assert isinstance(injected[0], ToolResponseInjected) and injected[0].replayed_frames == 2
    text = voicechat.tokenizer.decode(list(injected[0].token_ids[:-1]))
    assert text == (
        '<TOOL_RESPONSE>[{"ok":true,"tool":"now","result":"noon"},'
        '{"ok":false,"tool":"get_weather","error":"offline"}]</TOOL_RESPONSE>'
    )


def test_a_call_that_never_ends_is_cut_at_its_bound_and_waits(voicechat, frames):
    letter = voicechat.tokenizer.encode("a")[0]
    script = [20, *[letter] * (MAX_CALL_POSITIONS + 10)]
    session = tool_session(voicechat, script)
    events = push(session, quiet(MAX_CALL_POSITIONS))
    assert not of_kind(events, ToolCall) and not session.awaiting_tool_results
    events = push(session, quiet(1))
    (call,) = of_kind(events, ToolCall)
    assert call.error == f"the call did not end within {MAX_CALL_POSITIONS} positions" and call.name is None
    assert call.frame_index == MAX_CALL_POSITIONS and call.raw == "a" * MAX_CALL_POSITIONS
    assert session.pending_tool_calls == (call,)
    answered = session.answer_tool_calls([ToolResult("unknown", False, call.error)])
    assert isinstance(answered[0], ToolResponseInjected) and not session.awaiting_tool_results


def test_a_call_that_is_not_json_waits_for_its_error_result(voicechat, frames):
    script = call_ids(voicechat, "call now please")
    session = tool_session(voicechat, script)
    (call,) = of_kind(push(session, quiet(len(script))), ToolCall)
    assert call.error is not None and call.error.startswith("not JSON") and call.raw == "call now please"
    assert session.pending_tool_calls == (call,)
    answered = session.answer_tool_calls([ToolResult("", False, f"the call was not understood: {call.error}")])
    assert '"ok":false' in voicechat.tokenizer.decode(list(answered[0].token_ids))


def test_a_second_call_during_the_replay_stops_the_clock_again(voicechat, frames):
    first, second = call_ids(voicechat), call_ids(voicechat, '{"name": "later", "arguments": {}}')
    held = len(second) + 4
    channels = ScriptedChannels(first)
    session = tool_session(voicechat, channels)
    push(session, quiet(len(first) + held))
    # The replayed frames are the next ones the heads choose for: script the second call into them.
    channels.extend(second)
    answered = session.answer_tool_calls([ToolResult("now", True, "noon")])
    assert answered[0].replayed_frames == len(second)
    assert [call.name for call in of_kind(answered, ToolCall)] == ["later"]
    assert session.awaiting_tool_results and [c.name for c in session.pending_tool_calls] == ["later"]
    rest = session.answer_tool_calls([ToolResult("later", True, "done")])
    assert rest[0].replayed_frames == 4 and not session.awaiting_tool_results


def test_held_frames_beyond_the_bound_drop_the_oldest_and_say_so(voicechat, frames, monkeypatch):
    monkeypatch.setattr(tool_turn, "MAX_DEFERRED_FRAMES", 3)
    script = call_ids(voicechat)
    recorder = Recorder()
    session = tool_session(voicechat, script, hooks=recorder)
    push(session, frames[: len(script)])
    events = push(session, frames[len(script) : len(script) + 5])
    dropped = of_kind(events, DeferredFramesDropped)
    assert [(e.frame_index, e.dropped) for e in dropped] == [(len(script) + 3, 1), (len(script) + 4, 2)]
    answered = session.answer_tool_calls([ToolResult("now", True, "noon")])
    assert answered[0].replayed_frames == 3
    # The three newest held frames were replayed, in order.
    replay = recorder.inputs[-3:]
    kept = recorder.perceived[len(script) + 2 :]
    text, function, stt = session.text_ids, session.function_ids, voicechat.model.stt_model
    for offset, (observed, audio) in enumerate(zip(replay, kept, strict=True)):
        position = len(text) - 3 + offset
        assert mx.array_equal(observed, stt.fuse_inputs(text[position - 1], audio, function[position - 1])).item()


@pytest.mark.parametrize("end", ["cancel", "close", "flush"])
def test_ending_a_session_while_it_waits(voicechat, frames, end):
    script = call_ids(voicechat)
    session = tool_session(voicechat, script)
    push(session, quiet(len(script) + 2))
    assert session.awaiting_tool_results
    if end == "cancel":
        assert session.cancel() == [Cancelled(len(script) + 2)]
    elif end == "close":
        session.close()
    else:
        assert isinstance(session.flush()[-1], Done)
    assert not session.awaiting_tool_results and session.pending_tool_calls == ()
    with pytest.raises(SessionClosedError, match="start a new one"):
        session.answer_tool_calls([ToolResult("now", True, "noon")])


def test_an_interrupted_call_is_reported_and_not_waited_for(voicechat):
    interrupted = [20, *voicechat.tokenizer.encode('{"na')]
    script = [*interrupted, *call_ids(voicechat)]
    session = tool_session(voicechat, script)
    events = push(session, quiet(len(interrupted) + 1))
    (abandoned,) = of_kind(events, ToolCall)
    assert abandoned.error == "tool call was interrupted by a new call" and not session.awaiting_tool_results
    events = push(session, quiet(len(script) - len(interrupted) - 1))
    assert [call.name for call in of_kind(events, ToolCall)] == ["now"] and session.awaiting_tool_results


def test_the_tool_loop_in_fast_numerics(tiny_q4, frames):
    fast = load_voicechat(tiny_q4, numerics="fast")
    script = call_ids(fast)
    session = tool_session(fast, script)
    push(session, frames[: len(script) + 3])
    answered = session.answer_tool_calls([ToolResult("now", True, "noon")])
    injected = answered[0]
    assert isinstance(injected, ToolResponseInjected) and injected.replayed_frames == 3
    assert session.function_ids[len(script) : len(script) + injected.positions] == list(injected.token_ids)
    assert len(of_kind(answered, AudioChunk)) == 3
    assert len(of_kind(push(session, frames[len(script) + 3 : len(script) + 5]), AudioChunk)) == 2
