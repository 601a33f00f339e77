"""The tool loop end to end on a tiny random checkpoint: the app (controller, worker, runner) over the real MLX
session, a real MCP server process (tests/mcp_echo_server.py), and the function channel's ids scripted
(``engine.ScriptedChannels``: random weights never call a tool). The call runs only after Allow, its result's
tokens reach the LLM's function channel in the documented order with the text channel PAD, and the conversation
goes on."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from app.engine_port import Conversation, LoadedModel, MLXEngine
from app.messages import ConsentRequest, FrameStats, ModelLoaded, Notice, ToolActivity, ToolResponseTiming
from app.settings import Settings
from app.tools.config import ServerConfig, ToolEntry, ToolsConfig, save_tools_config
from app.worker import EngineWorker
from tests.realtime import wait_for

TURN_WAIT_S = 300.0  # s: how long a step of these tests may take on a busy 2-core machine

SERVER = Path(__file__).with_name("mcp_echo_server.py")
CALL = '{"name":"record","arguments":{"text":"hello"}}'
PAD = 12


class ScriptedEngine(MLXEngine):
    """The MLX engine whose conversations play scripted function-channel ids (the engine's test seam)."""

    def __init__(self) -> None:
        self.script: list[int] = []
        self.sessions: list[Any] = []

    def start_conversation(
        self,
        model: LoadedModel,
        *,
        system_prompt: str | None,
        max_seconds: float | None,
        seed: int = 0,
        stage_timing_every: int = 0,
        await_tool_results: bool = False,
    ) -> Conversation:
        from engine import FrameProfiler, Session
        from engine.tools import ScriptedChannels

        channels = ScriptedChannels(self.script if await_tool_results else ())
        session = Session(
            model,  # type: ignore[arg-type]
            system_prompt=system_prompt,
            seed=seed,
            max_seconds=max_seconds,
            await_tool_results=await_tool_results,
            override_ids=channels,
            hooks=FrameProfiler(stage_timing_every=stage_timing_every),
        )
        self.sessions.append(session)
        return session  # type: ignore[return-value]


def of(kind: type, messages: list) -> list:
    return [m for m in messages if isinstance(m, kind)]


@pytest.mark.timeout(900)
def test_a_scripted_call_runs_on_the_mcp_server_after_allow_and_the_model_hears_it(build_controller, tiny_q4, tmp_path):
    from engine import ToolResult, render_tool_response
    from engine.loading.tokenizer import TextTokenizer

    tokenizer = TextTokenizer.from_file(tiny_q4 / "tokenizer.json")
    engine = ScriptedEngine()
    engine.script = [PAD, PAD, 20, *tokenizer.encode(CALL), 21]
    record = tmp_path / "record.txt"
    server = ServerConfig(
        "echo",
        (sys.executable, str(SERVER)),
        env={"PARLEY_TEST_RECORD": str(record)},
        tools=(
            ToolEntry(
                "record",
                "Write the text down.",
                {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            ),
        ),
    )
    save_tools_config(ToolsConfig(True, servers=(server,)), tmp_path / "tools.json")
    settings = Settings(checkpoints={"4bit": tiny_q4}, active_variant="4bit", idle_pause=False, system_prompt="Help.")
    worker = functools.partial(EngineWorker, engine=engine, speed_check=False)
    controller = build_controller(settings, worker_factory=worker)
    controller.start()
    wait_for(controller, lambda seen: of(ModelLoaded, seen), timeout=TURN_WAIT_S)
    controller.start_conversation()

    messages = wait_for(controller, lambda seen: of(ConsentRequest, seen), timeout=TURN_WAIT_S)
    [request] = of(ConsentRequest, messages)
    assert (request.tool, request.arguments) == ("record", {"text": "hello"})
    session = engine.sessions[-1]
    assert "<AVAILABLE_TOOLS>" in session.system_prompt and '"name": "record"' in session.system_prompt
    positions = len(session.text_ids)
    held = wait_for(controller, lambda seen: len(of(FrameStats, seen)) >= 5, timeout=TURN_WAIT_S)
    assert session.awaiting_tool_results and len(session.text_ids) == positions, "the clock stands still"
    assert not record.exists(), "nothing runs before the user allows it"
    assert len(of(FrameStats, held)) >= 5, "the worker keeps pushing frames while the call waits"
    # A long wait: beyond 20 s of held audio the oldest is dropped, and the window says so once.
    told = wait_for(controller, lambda seen: of(Notice, seen), timeout=TURN_WAIT_S)
    assert len(of(Notice, told)) == 1 and "last 20 s" in of(Notice, told)[0].message

    controller.answer_consent(request.request_id, True)
    messages = wait_for(controller, lambda seen: of(ToolResponseTiming, seen), timeout=TURN_WAIT_S)
    [activity] = of(ToolActivity, messages)
    assert activity.ok and activity.content == "recorded hello" and activity.decision == "allowed by you"
    assert record.read_text() == "hello\n"
    [timing] = of(ToolResponseTiming, messages)
    assert timing.replayed_frames == 250, "MAX_DEFERRED_FRAMES: the newest 20 s replay"
    print(
        f"tool turn {timing.turn_s:.2f} s (consent included); injection {timing.positions} positions in "
        f"{timing.inject_s:.2f} s; {timing.replayed_frames} frames replayed"
    )

    expected = [*tokenizer.encode(render_tool_response([ToolResult("record", True, "recorded hello")])), 22]
    assert timing.positions == len(expected)
    response = slice(positions, positions + len(expected))
    assert session.function_ids[positions - 1 : response.stop] == [21, *expected]
    assert session.text_ids[response] == [PAD] * len(expected)
    assert not session.awaiting_tool_results

    # The conversation goes on: the clock runs again.
    after = len(session.text_ids)
    wait_for(controller, lambda seen: len(session.text_ids) >= after + 3, timeout=TURN_WAIT_S)
    tools_log = controller.export_profile(tmp_path / "profile.json")[-1]
    calls = json.loads(tools_log.read_text())["conversations"][0]["calls"]
    assert [(c["tool"], c["decision"], c["ok"], c["content"]) for c in calls] == [
        ("record", "allowed by you", True, "recorded hello")
    ]


def test_parley_run_offers_the_tools_of_a_tools_json_and_cannot_ask(tiny_q4, tmp_path, speech_16k):
    from app.run import _tool_runner, run_audio
    from engine import load_voicechat
    from engine.events import ToolCall

    (tmp_path / "tools.json").write_text('{"format": "parley-tools/1", "offer_tools": true}')
    lines: list[str] = []
    runner = _tool_runner(tmp_path / "tools.json", lines.append)
    assert runner is not None
    try:
        result = run_audio(load_voicechat(tiny_q4), speech_16k[: 16_000 * 2], system_prompt="Help.", tools=runner)
        prompt = result.settings["system_prompt"]
        assert prompt.startswith("Help.\n\n") and '"name": "current_time"' in prompt and '"name": "set_timer"' in prompt
        # Every call was answered (random weights call now and then, or not at all).
        print(f"{len(result.tool_calls)} calls, {len(result.tool_activities)} answers")
        assert len(result.tool_activities) == len(result.tool_calls)
        # An "ask" tool cannot be asked here: it is denied, and the output says so.
        offered, _ = runner.offered()
        [answer] = runner.run([ToolCall(0, "", "set_timer", {"seconds": 5})], offered).result(30)
        assert not answer.ok and answer.content == "the user denied this call"
        assert any("cannot ask" in line for line in lines)
    finally:
        runner.close()
    off = tmp_path / "off.json"
    off.write_text('{"format": "parley-tools/1", "offer_tools": false}')
    assert _tool_runner(off, lines.append) is None and "does not offer tools" in lines[-1]
