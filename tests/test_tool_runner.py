"""The tool runner (app/tools): a real MCP server process (tests/mcp_echo_server.py, stdio) started on demand,
consent before anything runs, denials and timeouts the model hears, each bad input answered, servers stopped."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.messages import ConsentClosed, ConsentRequest, ToolActivity, ToolsListed
from app.tools.config import ServerConfig, ToolEntry, ToolsConfig
from app.tools.runner import OfferedTool, ToolRunner, model_specs, tool_results
from engine.events import ToolCall

SERVER = Path(__file__).with_name("mcp_echo_server.py")


class Inbox:
    """What the runner posts (the controller's queue), with a hook to answer consent requests."""

    def __init__(self) -> None:
        self.messages: list[object] = []
        self.answer: bool | None = None  # None: leave consent requests unanswered
        self.runner: ToolRunner | None = None
        self._lock = threading.Lock()

    def post(self, message: object) -> None:
        with self._lock:
            self.messages.append(message)
        if isinstance(message, ConsentRequest) and self.answer is not None and self.runner is not None:
            self.runner.answer_consent(message.request_id, self.answer)

    def of(self, kind: type) -> list:
        with self._lock:
            return [m for m in self.messages if isinstance(m, kind)]


def echo_server(record: Path, **changes: object) -> ServerConfig:
    options: dict = {"env": {"PARLEY_TEST_RECORD": str(record)}, **changes}
    return ServerConfig("echo", (sys.executable, str(SERVER)), **options)


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
def make_runner(inbox: Inbox, tmp_path: Path) -> Iterator:
    made: list[ToolRunner] = []

    def make(*servers: ServerConfig, consent_timeout_s: float = 30.0, **config: object) -> ToolRunner:
        runner = ToolRunner(
            ToolsConfig(True, servers=servers, **config),  # type: ignore[arg-type]
            post=inbox.post,
            consent_timeout_s=consent_timeout_s,
            log_folder=tmp_path / "logs",
        )
        inbox.runner = runner
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()


def call(name: str | None, arguments: dict | None = None, *, raw: str = "", error: str | None = None) -> ToolCall:
    return ToolCall(7, raw=raw, name=name, arguments=arguments, error=error)


def offered_named(runner: ToolRunner, *names: str) -> list[OfferedTool]:
    """The named tools of the first server as offered to the model (its listing when the configuration has none:
    the server runs afterwards)."""
    server = runner.config.servers[0]
    tools = server.tools or runner.list_tools(server)
    return [OfferedTool(server.name, tool, server.timeout_s) for tool in tools if tool.name in names]


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def test_the_server_starts_on_demand_and_the_call_runs_only_after_allow(make_runner, inbox, tmp_path):
    record = tmp_path / "record.txt"
    server = echo_server(
        record,
        tools=(
            ToolEntry(
                "record",
                "Record text.",
                {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            ),
        ),
    )
    runner = make_runner(server)
    offered = offered_named(runner, "record")
    assert [t.name for t in runner.offered()[0]] == ["current_time", "set_timer", "record"]
    assert runner.running_servers() == [], "listing was not needed: the server starts with the first call"

    future = runner.run([call("record", {"text": "hello"})], offered)
    wait_until(lambda: inbox.of(ConsentRequest))
    request = inbox.of(ConsentRequest)[0]
    assert (request.tool, request.source, request.arguments) == ("record", "echo", {"text": "hello"})
    time.sleep(0.3)
    assert not future.done() and not record.exists() and runner.running_servers() == []

    runner.answer_consent(request.request_id, True)
    [activity] = future.result(30)
    assert activity.ok and activity.content == "recorded hello" and activity.decision == "allowed by you"
    assert record.read_text() == "hello\n"
    assert runner.running_servers() == ["echo"]
    assert inbox.of(ConsentClosed)[0].reason == "allowed"
    [result] = tool_results([activity])
    assert result.payload() == {"ok": True, "tool": "record", "result": "recorded hello"}


def test_deny_is_a_result_the_model_hears_and_nothing_runs(make_runner, inbox, tmp_path):
    record = tmp_path / "record.txt"
    runner = make_runner(echo_server(record))
    inbox.answer = False
    [activity] = runner.run([call("record", {"text": "x"})], offered_named(runner, "record")).result(30)
    assert not activity.ok and activity.decision == "denied by you" and "denied" in activity.content
    assert tool_results([activity])[0].payload() == {"ok": False, "tool": "record", "error": activity.content}
    assert not record.exists()
    assert inbox.of(ConsentClosed)[0].reason == "denied"


def test_consent_and_tool_timeouts_become_results(make_runner, inbox, tmp_path):
    server = echo_server(tmp_path / "r.txt", timeout_s=1.0)
    runner = make_runner(server, consent_timeout_s=0.3)
    offered = offered_named(runner, "slow", "echo")
    [unanswered] = runner.run([call("echo", {"text": "hi"})], offered).result(30)
    assert not unanswered.ok and unanswered.decision == "not answered"
    assert unanswered.content == "the user did not answer within 0.3 s"
    assert inbox.of(ConsentClosed)[-1].reason == "not answered"

    inbox.answer = True
    started = time.monotonic()
    [slow] = runner.run([call("slow", {"seconds": 20})], offered).result(30)
    print(f"a 20 s tool under a 1 s limit answered after {time.monotonic() - started:.2f} s")
    assert not slow.ok and slow.content == "the tool slow did not finish within 1 s"
    # The server still answers the next call.
    [echoed] = runner.run([call("echo", {"text": "again"})], offered).result(30)
    assert echoed.ok and echoed.content == "echo: again"


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (("/nonexistent/parley-tool-server",), "could not start: the command was not found"),
        (
            (sys.executable, "-c", "import sys; print('no config found', file=sys.stderr); sys.exit(3)"),
            "no config found",
        ),
    ],
)
def test_a_server_that_fails_to_start_is_a_result_with_the_reason(make_runner, inbox, command, reason):
    tool = ToolEntry("lookup", "Look up.", read_only=True)
    runner = make_runner(ServerConfig("broken", command, tools=(tool,), timeout_s=5.0))
    [activity] = runner.run([call("lookup", {})], offered_named(runner, "lookup")).result(30)
    assert not activity.ok and "broken" in activity.content and reason in activity.content
    assert activity.decision == "allowed (always)", "read-only: always allowed by default"


def test_a_server_that_never_answers_times_out(make_runner, inbox):
    tool = ToolEntry("lookup", "Look up.", read_only=True)
    hang = (sys.executable, "-c", "import time; time.sleep(60)")
    runner = make_runner(ServerConfig("mute", hang, tools=(tool,), timeout_s=1.0))
    [activity] = runner.run([call("lookup", {})], offered_named(runner, "lookup")).result(30)
    assert not activity.ok and "did not start within 1 s" in activity.content


def test_bad_inputs_each_get_a_clear_result(make_runner, inbox, tmp_path):
    runner = make_runner(echo_server(tmp_path / "r.txt"))
    inbox.answer = True
    offered = offered_named(runner, "add", "echo")
    calls = [
        call(None, raw='{"name": "add", "arguments": {', error="not JSON: Expecting property name (column 30)"),
        call("launch_rockets", {}),
        call("add", {"a": "two", "b": 2}),
        call("add", {"a": 1}),
        call(None, raw='{"name": "add"', error="the call did not end within 256 positions"),
        call("add", {"a": 2, "b": 3}),
    ]
    answers = runner.run(calls, offered).result(60)
    assert [a.ok for a in answers] == [False, False, False, False, False, True]
    assert answers[0].content.startswith("the call could not be read: not JSON")
    assert answers[1].content == "there is no tool named 'launch_rockets'; the tools are: add, echo"
    assert answers[2].content == "wrong arguments for add: a: 'two' is not of type 'integer'"
    assert answers[3].content == "wrong arguments for add: 'b' is a required property"
    assert answers[4].content == "the call could not be read: the call did not end within 256 positions"
    assert answers[5].content == "5" and answers[5].decision == "allowed by you"
    assert {a.decision for a in answers[:5]} == {"refused"}
    assert len(inbox.of(ConsentRequest)) == 1, "only the well-formed call asks the user"


def test_never_and_always_policies(make_runner, inbox, tmp_path):
    record = tmp_path / "record.txt"
    server = echo_server(record)
    runner = make_runner(server)
    runner.list_tools(server)  # as Settings' "List tools" does
    listed = inbox.of(ToolsListed)[0]
    tools = {tool.name: tool for tool in listed.tools}
    choices = (
        tools["record"].__class__(**{**tools["record"].__dict__, "consent": "always"}),
        tools["echo"].__class__(**{**tools["echo"].__dict__, "consent": "never"}),
    )
    runner.configure(ToolsConfig(True, servers=(echo_server(record, tools=choices),)))
    offered, _ = runner.offered()
    names = [tool.name for tool in offered]
    assert "echo" not in names and "record" in names, "a tool never allowed is not offered"
    [recorded, never] = runner.run([call("record", {"text": "ok"}), call("echo", {"text": "x"})], offered).result(30)
    assert recorded.ok and recorded.decision == "allowed (always)" and record.read_text() == "ok\n"
    assert not never.ok and never.content.startswith("there is no tool named 'echo'")
    assert inbox.of(ConsentRequest) == []


def test_the_server_gets_a_restricted_environment(make_runner, inbox, tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_SECRET_TOKEN", "hunter2")
    runner = make_runner(echo_server(tmp_path / "r.txt"))
    inbox.answer = True
    [activity] = runner.run([call("environment", {})], offered_named(runner, "environment", "echo")).result(30)
    names = set(activity.content.split(","))
    assert "PARLEY_SECRET_TOKEN" not in names and "PARLEY_TEST_RECORD" in names
    assert names <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "PARLEY_TEST_RECORD", "LC_CTYPE"}


def test_close_stops_the_server_process(make_runner, inbox, tmp_path):
    runner = make_runner(echo_server(tmp_path / "r.txt"))
    inbox.answer = True
    offered, _ = runner.offered()
    pid_tool = [OfferedTool("echo", ToolEntry("pid", "pid"), 15.0)]
    [activity] = runner.run([call("pid", {})], pid_tool).result(30)
    pid = int(activity.content)
    os.kill(pid, 0)  # alive
    runner.close()
    with pytest.raises(ProcessLookupError):
        for _ in range(200):
            os.kill(pid, 0)
            time.sleep(0.05)
    assert offered, "the server's tools were listed"


def test_at_most_five_tools_are_offered_and_specs_are_ascii(make_runner, inbox, tmp_path):
    runner = make_runner(echo_server(tmp_path / "r.txt"))
    offered, warnings = runner.offered()
    assert [t.name for t in offered] == ["current_time", "set_timer", "echo", "add", "slow"]
    assert len(warnings) == 4 and all("at most 5" in w for w in warnings)
    accented = OfferedTool("builtin", ToolEntry("cafe", "Find a café — near you"), 5.0)
    [spec] = model_specs([accented])
    assert spec.description == "Find a cafe  near you" and spec.description.isascii()


def test_results_are_cut_to_what_the_envelope_takes(make_runner, inbox, tmp_path):
    runner = make_runner(echo_server(tmp_path / "r.txt"))
    inbox.answer = True
    [activity] = runner.run([call("echo", {"text": "x" * 5000})], offered_named(runner, "echo")).result(30)
    assert activity.ok and len(activity.content) == 1500 and activity.content.endswith("(result shortened)")


def test_a_consent_wait_ends_with_its_conversation(make_runner, inbox, tmp_path):
    runner = make_runner(echo_server(tmp_path / "r.txt"))
    future = runner.run([call("echo", {"text": "x"})], offered_named(runner, "echo"))
    wait_until(lambda: runner.waiting_for_consent == 1)
    runner.cancel_consents()
    [activity] = future.result(30)
    assert not activity.ok and activity.content == "the call was not run: the conversation ended"
    assert isinstance(activity, ToolActivity) and inbox.of(ConsentClosed)[0].reason == "not answered"
