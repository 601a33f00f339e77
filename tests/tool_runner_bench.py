"""How long the tool runner takes around a call (no model): a stdio MCP server's first call (its start included),
a warm call, and a built-in tool. ``PYTHONPATH=$PWD .venv/bin/python -m tests.tool_runner_bench``"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from app.tools.config import ServerConfig, ToolEntry, ToolsConfig
from app.tools.runner import OfferedTool, ToolRunner
from engine.events import ToolCall

SERVER = Path(__file__).with_name("mcp_echo_server.py")
ECHO = ToolEntry(
    "echo",
    "Echo.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    consent="always",
)


def main(rounds: int = 5, calls: int = 20) -> None:
    starts: list[float] = []
    warm: list[float] = []
    builtin: list[float] = []
    echo_call = ToolCall(0, "", "echo", {"text": "x"})
    for _ in range(rounds):
        server = ServerConfig("echo", (sys.executable, str(SERVER)), tools=(ECHO,))
        runner = ToolRunner(ToolsConfig(True, servers=(server,)), post=lambda message: None)
        offered = [OfferedTool("echo", ECHO, 15.0)]
        clock = time.perf_counter()
        [answer] = runner.run([echo_call], offered).result()
        starts.append(time.perf_counter() - clock)
        assert answer.ok, answer.content
        for _ in range(calls):
            clock = time.perf_counter()
            runner.run([echo_call], offered).result()
            warm.append(time.perf_counter() - clock)
        now = [tool for tool in runner.offered()[0] if tool.name == "current_time"]
        for _ in range(calls):
            clock = time.perf_counter()
            runner.run([ToolCall(0, "", "current_time", {})], now).result()
            builtin.append(time.perf_counter() - clock)
        runner.close()
    print(f"first call (server start + call): median {statistics.median(starts) * 1000:.0f} ms, n={len(starts)}")
    print(f"warm call: median {statistics.median(warm) * 1000:.1f} ms, n={len(warm)}")
    print(f"built-in current_time: median {statistics.median(builtin) * 1000:.2f} ms, n={len(builtin)}")


if __name__ == "__main__":
    main()
