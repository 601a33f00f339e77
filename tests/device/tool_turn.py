"""A tool turn at full size: the ~900-position tool prompt's prefill and one whole turn, timed (issue 52).

    python3 tests/device/tool_turn.py      (on the device; never in CI)

One full-size 4-bit random model (``SIZE=tiny`` tries the script here), fast numerics, warmed up. The system prompt
is five tools rendered by :func:`engine.tools.render_tool_prompt` and cut to 900 positions (tests/prefill_bench.py's
``prompt_of``). Prints: each prefill's seconds (a session opened with the prompt, less one opened without) in chunks
of 64 (twice: the first pays for tracing the chunked programs) and 256, and one position a step; then one tool turn
on a session whose function channel is scripted to call a tool (random weights never call one): the frames that emit
the call, the frames held while the "tool" runs, the injection of a 72-token result, the held frames' replay and the
first frame after. Then the model switched to exact numerics in place: the prompt's prefill one position a step, the
reference's arithmetic, and the same turn on a session without the prompt. docs/performance.md ("Tools") has figures.
"""

from __future__ import annotations

import os
import time

import mlx.core as mx
import numpy as np

from app.bench import bench_input, question_audio
from engine.events import AudioChunk, ToolCall, ToolResponseInjected
from engine.numerics import set_numerics
from engine.random_model import random_voicechat
from engine.session import Session
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE
from engine.tools import ScriptedChannels, ToolResult, ToolSpec, render_tool_prompt, render_tool_response
from engine.warming import warm_up
from tests.prefill_bench import TOOLS, prompt_of

POSITIONS = 900
HELD_FRAMES = 3  # frames that arrive while the tool runs
CALL = '[{"name":"weather","arguments":{"query":"Lisbon tomorrow"}}]'


def opened(voicechat: object, prompt: str, **options: object) -> tuple[Session, float]:
    mx.synchronize()
    began = time.perf_counter()
    session = Session(voicechat, system_prompt=prompt, seed=0, **options)  # type: ignore[arg-type]
    mx.synchronize()
    return session, time.perf_counter() - began


def prefill_seconds(voicechat: object, prompt: str, chunk: int) -> float:
    bare, without = opened(voicechat, "", prefill_chunk=chunk)
    bare.close()
    session, with_prompt = opened(voicechat, prompt, prefill_chunk=chunk)
    assert session.prompt_steps == POSITIONS, session.prompt_steps
    session.close()
    return with_prompt - without


def result_text(voicechat: object, tokens: int) -> str:
    """A weather report whose response (envelope, tags and <SPECIAL_22>) is about ``tokens`` tokens long."""
    words = "Tomorrow in Lisbon: sunny, 24 C high, 16 C low, light wind from the north, no rain expected. " * 8
    tokenizer = voicechat.tokenizer  # type: ignore[attr-defined]
    text = words
    while len(tokenizer.encode(render_tool_response([ToolResult("weather", True, text)]))) + 1 > tokens:
        text = text[:-4]
    return text


def tool_turn(voicechat: object, prompt: str, label: str) -> None:
    tokenizer = voicechat.tokenizer  # type: ignore[attr-defined]
    script = [20, *tokenizer.encode(CALL), 21]
    session, _ = opened(voicechat, prompt, await_tool_results=True, override_ids=ScriptedChannels(script))
    samples = bench_input(len(script) + HELD_FRAMES + 8)
    frames = [samples[i : i + INPUT_FRAME_SAMPLES] for i in range(0, samples.shape[0], INPUT_FRAME_SAMPLES)]
    calling: list[float] = []
    held: list[float] = []
    index = 0
    while not session.awaiting_tool_results:
        began = time.perf_counter()
        events = session.push(frames[index], INPUT_SAMPLE_RATE)
        calling.append((time.perf_counter() - began) * 1000.0)
        index += 1
        assert index <= len(script), "the scripted call never completed"
    (call,) = [event for event in events if isinstance(event, ToolCall)]
    for _ in range(HELD_FRAMES):
        began = time.perf_counter()
        session.push(frames[index], INPUT_SAMPLE_RATE)
        held.append((time.perf_counter() - began) * 1000.0)
        index += 1
    result = ToolResult(call.name or "weather", True, result_text(voicechat, 72))
    began = time.perf_counter()
    answered = session.answer_tool_calls([result])
    answered_ms = (time.perf_counter() - began) * 1000.0
    injected = answered[0]
    assert isinstance(injected, ToolResponseInjected)
    replayed_audio = sum(isinstance(event, AudioChunk) for event in answered)
    began = time.perf_counter()
    after = session.push(frames[index], INPUT_SAMPLE_RATE)
    after_ms = (time.perf_counter() - began) * 1000.0
    assert any(isinstance(event, AudioChunk) for event in after)
    print(
        f"{label} tool turn: call of {len(script)} positions emitted over {len(calling)} frames "
        f"(p50 {np.median(calling):.2f} ms a frame, {sum(calling):.1f} ms in all); {HELD_FRAMES} frames held "
        f"(p50 {np.median(held):.2f} ms each); injection of {injected.positions} positions "
        f"{injected.seconds * 1000.0:.1f} ms ({injected.llm_forwards} LLM forwards); answer_tool_calls in all "
        f"{answered_ms:.1f} ms with {injected.replayed_frames} frames replayed ({replayed_audio} audio chunks); "
        f"the next frame {after_ms:.2f} ms; from the call's end to the first audio after the response: "
        f"{answered_ms:.1f} ms plus the tool's own time"
    )
    session.close()


def main() -> None:
    voicechat = random_voicechat(os.environ.get("SIZE", "full"), quantize=4, numerics="fast")  # type: ignore[arg-type]
    mx.eval(voicechat.model.parameters())
    warm_up(voicechat, speech=question_audio())
    specs = [ToolSpec(tool["name"], tool["description"], tool["parameters"]) for tool in TOOLS]
    rendered = render_tool_prompt("You are a helpful voice assistant. " * 4, specs)
    prompt = prompt_of(voicechat.tokenizer, POSITIONS)
    print(
        f"device {mx.default_device()}; the rendered five-tool prompt is {len(voicechat.tokenizer.encode(rendered))} "
        f"tokens with this tokenizer; measured on {POSITIONS} positions"
    )
    for chunk in (64, 64, 256, 1):
        print(f"fast prefill, chunks of {chunk}: {prefill_seconds(voicechat, prompt, chunk):.3f} s", flush=True)
    tool_turn(voicechat, prompt, "fast")
    set_numerics(voicechat, "exact")
    warm_up(voicechat, speech=question_audio())
    print(f"exact prefill, one position a step: {prefill_seconds(voicechat, prompt, 1):.3f} s", flush=True)
    tool_turn(voicechat, "", "exact")  # without the prompt: its 900 steps again would not fit the step's limit


if __name__ == "__main__":
    main()
