"""The tool loop through the app (controller, worker, runner) over the fake engine, which scripts tool calls and
waits for their results as the session does: the prompt offers the tools, the conversation keeps running while
a call waits for consent, the model hears every answer, and every call lands in the transcript, history and
exported profile."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np

from app.engine_port import FakeEngine
from app.messages import (
    ConsentClosed,
    ConsentRequest,
    FrameStats,
    TimerDone,
    ToolActivity,
    ToolResponseTiming,
    ToolTurnHeard,
)
from app.settings import Settings
from app.tools.config import ServerConfig, ToolEntry, ToolsConfig, load_tools_config, save_tools_config
from app.worker import EngineWorker
from engine.events import ToolCall
from engine.timeline import OUTPUT_SAMPLE_RATE
from tests.realtime import wait_for

SERVER = Path(__file__).with_name("mcp_echo_server.py")
ECHO = ToolEntry(
    "echo", "Say the text back.", {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
)


def of(kind: type, messages: list) -> list:
    return [m for m in messages if isinstance(m, kind)]


def tool_controller(make_controller, tiny_q4: Path, tmp_path: Path, engine: FakeEngine, **tools: object):
    config = ToolsConfig(
        True,
        builtin={"set_timer": ToolEntry("set_timer", consent="always")},
        servers=(ServerConfig("echo", (sys.executable, str(SERVER)), tools=(ECHO,)),),
        **tools,  # type: ignore[arg-type]
    )
    save_tools_config(config, tmp_path / "tools.json")  # beside tmp_path / "settings.json"
    settings = Settings(checkpoints={"4bit": tiny_q4}, active_variant="4bit", idle_pause=False)
    return make_controller(settings, worker_factory=functools.partial(EngineWorker, engine=engine))


def test_a_call_waits_for_allow_while_frames_run_then_the_model_hears_the_result(build_controller, tiny_q4, tmp_path):
    engine = FakeEngine(frame_ms=2.0)
    engine.script_tool_calls = {
        3: [ToolCall(3, raw='{"name":"echo","arguments":{"text":"hi"}}', name="echo", arguments={"text": "hi"})],
        6: [ToolCall(6, raw='{"name":"echo"}', name="echo", arguments={"text": "too soon"})],  # while the first waits
    }
    controller = tool_controller(build_controller, tiny_q4, tmp_path, engine)
    controller.start()
    controller.start_conversation()
    messages = wait_for(controller, lambda seen: of(ConsentRequest, seen))
    [request] = of(ConsentRequest, messages)
    assert (request.tool, request.source, request.arguments) == ("echo", "echo", {"text": "hi"})
    conversation = engine.conversations[-1]
    assert "<AVAILABLE_TOOLS>" in (conversation.system_prompt or "") and '"name": "echo"' in conversation.system_prompt
    assert conversation.await_tool_results

    # Waiting for the user: the worker keeps pushing frames; the session plays silence and hears nothing back yet.
    wait_for(controller, lambda seen: len(of(FrameStats, seen)) >= 20)
    assert conversation.awaiting_tool_results and conversation.answers == []
    played = controller.audio.played
    assert len(played) >= 20 and not np.any(np.concatenate(played[-10:])), "waiting frames play silence"

    controller.answer_consent(request.request_id, True)
    messages = wait_for(controller, lambda seen: of(ToolResponseTiming, seen))
    first, late = of(ToolActivity, messages)
    assert first.ok and first.content == "echo: hi" and first.decision == "allowed by you"
    assert not late.ok and late.content.startswith("another tool call is still running")
    [answer] = conversation.answers
    assert [(r.tool, r.ok, r.content) for r in answer] == [("echo", True, "echo: hi"), ("echo", False, late.content)]
    [timing] = of(ToolResponseTiming, messages)
    assert timing.calls == 2 and timing.replayed_frames >= 10
    print(f"tool turn (consent included) {timing.turn_s:.2f} s")
    assert [m.reason for m in of(ConsentClosed, messages)] == ["allowed"]
    assert not conversation.awaiting_tool_results
    # The conversation goes on: audible frames again.
    heard = len(played)
    more = wait_for(controller, lambda seen: of(ToolTurnHeard, messages + seen) and len(played) > heard + 5)
    assert np.any(np.concatenate(played[heard:]))
    [turn] = of(ToolTurnHeard, messages + more)
    assert turn.seconds >= timing.turn_s and turn.frame_index >= timing.frame_index

    roles = [entry.role for entry in controller.transcript.entries]
    assert roles.count("tool call") == 2 and roles.count("tool result") == 2 and "tool response" in roles
    result_line = next(e.text for e in controller.transcript.entries if e.role == "tool result")
    assert "echo" in result_line and "allowed by you" in result_line and "echo: hi" in result_line
    markdown = controller.transcript.to_markdown()
    assert "tool result:** echo" in markdown

    # The exported profile carries every call, decision, result and time.
    paths = controller.export_profile(tmp_path / "profile.json")
    tools_file = next(p for p in paths if p.name == "profile.tools.json")
    log = json.loads(tools_file.read_text())
    calls = log["conversations"][0]["calls"]
    assert [(c["tool"], c["decision"], c["ok"]) for c in calls] == [
        ("echo", "allowed by you", True),
        ("echo", "refused", False),
    ]
    assert calls[0]["content"] == "echo: hi" and calls[0]["at"] and calls[0]["consent_s"] > 0
    assert log["conversations"][0]["responses"][0]["calls"] == 2
    assert log["conversations"][0]["first_sound_after_call_s"] == [round(turn.seconds, 4)]

    # The history keeps the same lines.
    controller.new_conversation()
    wait_for(controller, lambda seen: controller.history_entries().entries)
    kept = controller.load_history(controller.history_entries().entries[-1].id)
    lines = [(line.role, line.text) for line in kept.transcript]
    assert [role for role, _ in lines].count("tool result") == 2
    assert any(role == "tool result" and "allowed by you" in text and "echo: hi" in text for role, text in lines)


def test_deny_and_a_timer_that_chimes(build_controller, tiny_q4, tmp_path):
    engine = FakeEngine(frame_ms=2.0)
    engine.script_tool_calls = {
        2: [ToolCall(2, raw="", name="echo", arguments={"text": "secret"})],
        300: [ToolCall(300, raw="", name="set_timer", arguments={"seconds": 1, "label": "tea"})],
    }
    controller = tool_controller(build_controller, tiny_q4, tmp_path, engine)
    controller.start()
    controller.start_conversation()
    messages = wait_for(controller, lambda seen: of(ConsentRequest, seen))
    controller.answer_consent(of(ConsentRequest, messages)[0].request_id, False)
    messages = wait_for(controller, lambda seen: len(of(ToolResponseTiming, seen)) >= 1)
    [denied] = of(ToolActivity, messages)
    assert not denied.ok and denied.decision == "denied by you" and denied.content == "the user denied this call"
    conversation = engine.conversations[-1]
    assert [(r.ok, r.content) for r in conversation.answers[0]] == [(False, "the user denied this call")]

    # Later, a timer (its consent here: always).
    messages = wait_for(controller, lambda seen: of(TimerDone, seen), timeout=30)
    [timer_set] = of(ToolActivity, messages)
    assert timer_set.ok and timer_set.decision == "allowed (always)" and "the app will chime" in timer_set.content
    [done] = of(TimerDone, messages)
    assert done.label == "tea" and done.seconds == 1
    chimes = [p for p in controller.audio.played if len(p) == int(0.6 * OUTPUT_SAMPLE_RATE)]
    assert chimes and float(np.max(np.abs(chimes[0]))) > 0.1
    assert any(e.role == "timer" and "tea" in e.text for e in controller.transcript.entries)


def test_tools_off_keeps_the_plain_prompt_and_bad_tool_files_are_reported(build_controller, tiny_q4, tmp_path):
    (tmp_path / "tools.json").write_text(
        '{"format": "parley-tools/1", "offer_tools": true, "servers": [{"name": "x"}]}'
    )
    engine = FakeEngine(frame_ms=2.0)
    settings = Settings(checkpoints={"4bit": tiny_q4}, active_variant="4bit", idle_pause=False)
    controller = build_controller(settings, worker_factory=functools.partial(EngineWorker, engine=engine))
    loaded = load_tools_config(tmp_path / "tools.json")
    assert loaded.config.offer_tools and loaded.config.servers == ()
    assert "needs either a command or a URL" in loaded.warnings[0]
    controller.start()
    controller.start_conversation()
    wait_for(controller, lambda seen: of(FrameStats, seen))
    conversation = engine.conversations[-1]
    assert "<AVAILABLE_TOOLS>" in conversation.system_prompt, "the built-in tools are offered"

    before = len(engine.conversations)
    controller.apply_tools_config(controller.tools_config.__class__(offer_tools=False))
    wait_for(controller, lambda seen: len(engine.conversations) > before)
    assert engine.conversations[-1].system_prompt == settings.system_prompt
    assert not engine.conversations[-1].await_tool_results
    assert json.loads((tmp_path / "tools.json").read_text())["offer_tools"] is False
