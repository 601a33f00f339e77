"""The tool runner: from the calls the model made to the results it hears, bounded at every step.

One :class:`ToolRunner` per app (the controller's), shared with the engine worker. It owns a thread running an
asyncio loop (the MCP SDK is asynchronous), the built-in tools and one ``ServerConnection`` per configured server.
The worker hands it the calls of one frame (:meth:`ToolRunner.run`) and gets a future; it keeps pushing microphone
frames meanwhile and answers the engine once the future is done. For each call, in order:

1. **Read.** A call the engine could not read (not JSON, never ended, ...) is answered with what was wrong.
2. **Find.** A name that is no offered tool is answered with the names that are.
3. **Check.** The arguments are checked against the tool's JSON schema (``jsonschema``); a mismatch is answered
   with the first problem ("'seconds' must be integer").
4. **Consent.** ``never``: denied. ``always``: go. ``ask``: a ``ConsentRequest`` goes to the window and the call
   waits for :meth:`ToolRunner.answer_consent`, at most ``consent_timeout_s`` (30 s); unanswered is denied with
   "the user did not answer".
5. **Run.** The built-in tool, or the MCP server's (started now if it is not running): the start and the call
   each at most the server's ``timeout_s`` (15 s by default); a server that fails, a tool that errs or overruns
   is answered with the reason.

Every answer is a :class:`~app.messages.ToolActivity` (what was called, decided and told, and when); the worker
turns them into the engine's ``ToolResult`` (:func:`tool_results`). Results are cut to ``MAX_RESULT_CHARS`` here so
that the transcript shows what the model is told. Nothing here waits without a bound.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from engine.events import ToolCall

from ..messages import ConsentClosed, ConsentRequest, ToolActivity, ToolsListed
from .builtin import BUILTIN_TOOLS, BuiltinTools, TimerFired
from .config import ServerConfig, ToolEntry, ToolsConfig
from .mcp_servers import ServerConnection, ToolFailure

if TYPE_CHECKING:
    from engine import ToolResult

log = logging.getLogger(__name__)

MAX_OFFERED_TOOLS: Final = 5  # the prompt template's limit (engine.tools.MAX_TOOLS)
MAX_RESULT_CHARS: Final = 1500  # the envelope's limit (engine.tools.MAX_RESULT_CHARS)
MAX_DESCRIPTION_CHARS: Final = 520  # a description's limit in the prompt (engine.tools.MAX_DESCRIPTION_CHARS)
DEFAULT_CONSENT_TIMEOUT_S: Final = 30.0
BUILTIN: Final = "builtin"
CLOSE_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class OfferedTool:
    """A tool the model is told about: where it comes from, what it is, how long it may take."""

    source: str  # BUILTIN or a server's name
    entry: ToolEntry
    timeout_s: float

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def source_label(self) -> str:
        return "built-in" if self.source == BUILTIN else self.source


def builtin_entries(config: ToolsConfig) -> list[ToolEntry]:
    """The built-in tools with the user's choices applied."""
    entries = []
    for tool in BUILTIN_TOOLS:
        choice = config.builtin.get(tool.name)
        if choice is not None:
            tool = ToolEntry(
                tool.name, tool.description, tool.parameters, tool.read_only, choice.enabled, choice.consent
            )
        entries.append(tool)
    return entries


def tool_results(activities: Sequence[ToolActivity]) -> list[ToolResult]:
    """The engine's results for ``activities``, in order (what ``answer_tool_calls`` takes)."""
    from engine import ToolResult

    return [ToolResult(tool=a.tool or "unknown", ok=a.ok, content=a.content) for a in activities]


def model_specs(offered: Sequence[OfferedTool]) -> list[Any]:
    """The engine's ``ToolSpec`` of each offered tool: its description made ASCII and cut to what the prompt
    takes (the template is ASCII only), its name as the description when it has none."""
    from engine import ToolSpec

    specs = []
    for tool in offered:
        description = " ".join(tool.entry.description.split())
        # "café" -> "cafe"; what has no ASCII form is dropped
        description = unicodedata.normalize("NFKD", description).encode("ascii", "ignore").decode("ascii")
        specs.append(
            ToolSpec(tool.name, (description or tool.name)[:MAX_DESCRIPTION_CHARS], dict(tool.entry.parameters))
        )
    return specs


def refusal(call: ToolCall, reason: str) -> ToolActivity:
    """An answer without running anything (a call that came while another was pending, no tools offered, ...)."""
    return ToolActivity(
        call.frame_index, call.name or "", call.arguments, call.raw, "refused", False, _cut(reason), _now()
    )


def _cut(text: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    mark = " … (result shortened)"
    return text[: MAX_RESULT_CHARS - len(mark)] + mark


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


class ToolRunner:
    """Runs the model's tool calls (see the module docstring). Thread-safe; its own thread does the work."""

    def __init__(
        self,
        config: ToolsConfig,
        *,
        post: Callable[[object], None],
        consent_timeout_s: float = DEFAULT_CONSENT_TIMEOUT_S,
        on_timer: Callable[[TimerFired], None] | None = None,
        log_folder: Path | None = None,
    ) -> None:
        self._config = config
        self._post = post
        self.consent_timeout_s = consent_timeout_s
        self._log_folder = log_folder
        self._builtin = BuiltinTools(on_timer or (lambda fired: None))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="parley-tools", daemon=True)
        self._connections: dict[str, ServerConnection] = {}
        self._consents: dict[int, asyncio.Future[bool]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._thread.start()

    # ------------------------------------------------------------------ configuration (any thread)

    @property
    def config(self) -> ToolsConfig:
        with self._lock:
            return self._config

    def configure(self, config: ToolsConfig) -> None:
        """Use ``config`` from the next call on; servers whose settings changed are stopped (restart on demand)."""
        with self._lock:
            old, self._config = self._config, config
        changed = [
            s.name
            for s in old.servers
            if (new := config.server(s.name)) is None or (new.command, new.url, new.env) != (s.command, s.url, s.env)
        ]
        if changed:  # on the loop, before any later call (which starts a fresh one); the caller does not wait
            self._submit(self._stop_servers(changed))

    def offered(self) -> tuple[list[OfferedTool], list[str]]:
        """The tools to tell the model about (at most 5, in the configuration's order) and a warning for each one
        left out. A server whose tools were never listed is asked now (bounded by its timeout); what it lists is
        posted as ``ToolsListed`` for the configuration file."""
        config = self.config
        if not config.offer_tools:
            return [], []
        candidates: list[OfferedTool] = [
            OfferedTool(BUILTIN, entry, 5.0) for entry in builtin_entries(config) if entry.enabled
        ]
        warnings: list[str] = []
        for server in config.servers:
            if not server.enabled:
                continue
            tools = server.tools
            if not tools:
                try:
                    tools = self.list_tools(server)
                except ToolFailure as exc:
                    warnings.append(f"The tools of {server.name!r} are not offered: {exc}.")
                    continue
            candidates += [OfferedTool(server.name, tool, server.timeout_s) for tool in tools if tool.enabled]
        offered: list[OfferedTool] = []
        for tool in candidates:
            if tool.entry.policy == "never":
                continue  # never allowed: offering it would only make the model try
            if any(t.name == tool.name for t in offered):
                warnings.append(f"{tool.name!r} of {tool.source_label} is not offered: another tool has its name.")
            elif len(offered) == MAX_OFFERED_TOOLS:
                warnings.append(f"{tool.name!r} of {tool.source_label} is not offered: the model takes at most 5.")
            else:
                offered.append(tool)
        return offered, warnings

    def list_tools(self, server: ServerConfig) -> tuple[ToolEntry, ...]:
        """Ask ``server`` for its tools now (starting it; bounded); posts ``ToolsListed``. Raises ToolFailure."""
        future = self._submit(self._list(server))
        try:
            listed = future.result(server.timeout_s + 5.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolFailure(f"the tool server {server.name!r} did not answer within {server.timeout_s:g} s") from None
        except ToolFailure:
            raise
        except Exception as exc:  # an MCP error, a server that broke its promise: a reason, never a crash
            raise ToolFailure(f"the tool server {server.name!r} could not list its tools: {exc}") from exc
        merged = server.with_listed(listed).tools
        self._post(ToolsListed(server.name, merged))
        return merged

    async def _list(self, server: ServerConfig) -> tuple[ToolEntry, ...]:
        return await self._connection(server).list_tools(server.timeout_s)

    # ------------------------------------------------------------------ calls (any thread)

    def run(
        self, calls: Sequence[ToolCall], offered: Sequence[OfferedTool]
    ) -> concurrent.futures.Future[list[ToolActivity]]:
        """Answer ``calls`` (one frame's, in order) against the ``offered`` tools; the future never hangs."""
        return self._submit(self._run_all(list(calls), {tool.name: tool for tool in offered}))

    def answer_consent(self, request_id: int, allow: bool) -> bool:
        """The user's answer to a ``ConsentRequest``; False when it is no longer waiting (timed out, ended)."""
        future = self._consents.get(request_id)
        if future is None:
            return False
        self._loop.call_soon_threadsafe(_settle, future, allow, None)
        return True

    def cancel_consents(self, reason: str = "the conversation ended") -> None:
        """Deny every consent still waiting (its conversation is over); their prompts close."""
        for future in list(self._consents.values()):
            self._loop.call_soon_threadsafe(_settle, future, None, _Ended(reason))

    @property
    def waiting_for_consent(self) -> int:
        return len(self._consents)

    def close(self) -> None:
        """Stop every server and timer and the runner's thread (at quit); bounded."""
        if self._closed:
            return
        self._closed = True
        self._builtin.close()
        self.cancel_consents("Parley is quitting")
        try:
            self._submit(self._stop_servers(list(self._connections))).result(CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - quitting goes on
            log.warning("Tool servers did not all stop: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)

    @property
    def timers_running(self) -> int:
        return self._builtin.running

    def running_servers(self) -> list[str]:
        return [name for name, c in self._connections.items() if c.running]

    # ------------------------------------------------------------------ the loop's side

    def _submit(self, coroutine: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _connection(self, server: ServerConfig) -> ServerConnection:
        connection = self._connections.get(server.name)
        if connection is None or (connection.config != server and not connection.running):
            connection = ServerConnection(server, self._log_folder)
            self._connections[server.name] = connection
        return connection

    async def _stop_servers(self, names: Sequence[str]) -> None:
        for name in names:
            connection = self._connections.pop(name, None)
            if connection is not None:
                await connection.close()

    async def _run_all(self, calls: list[ToolCall], offered: dict[str, OfferedTool]) -> list[ToolActivity]:
        results = []
        for call in calls:
            try:
                results.append(await self._run_one(call, offered))
            except Exception as exc:
                log.exception("Tool call %r failed unexpectedly", call.name)
                results.append(refusal(call, f"the app failed to run the tool: {exc}"))
        return results

    async def _run_one(self, call: ToolCall, offered: dict[str, OfferedTool]) -> ToolActivity:
        at = _now()

        def answer(decision: str, ok: bool, content: str, consent_s: float = 0.0, run_s: float = 0.0) -> ToolActivity:
            return ToolActivity(
                call.frame_index,
                call.name or "",
                call.arguments,
                call.raw,
                decision,
                ok,
                _cut(content),
                at,
                consent_s,
                run_s,
            )

        if call.error is not None or call.name is None:
            return answer("refused", False, f"the call could not be read: {call.error or 'it names no tool'}")
        tool = offered.get(call.name)
        if tool is None:
            names = ", ".join(sorted(offered)) or "none"
            return answer("refused", False, f"there is no tool named {call.name!r}; the tools are: {names}")
        arguments = call.arguments or {}
        problem = argument_problem(tool.entry.parameters, arguments)
        if problem is not None:
            return answer("refused", False, f"wrong arguments for {call.name}: {problem}")
        policy = tool.entry.policy
        consent_s = 0.0
        if policy == "never":
            return answer("never allowed", False, "the user does not allow this tool")
        decision = "allowed (always)"
        if policy == "ask":
            started = time.monotonic()
            decision, denial = await self._ask(tool, arguments)
            consent_s = time.monotonic() - started
            if denial is not None:
                return answer(decision, False, denial, consent_s)
        started = time.monotonic()
        try:
            ok, text = await self._execute(tool, arguments)  # bounded: the start and the call each by timeout_s
        except ToolFailure as exc:
            ok, text = False, str(exc)
        except Exception as exc:  # noqa: BLE001 - a tool's own failure is a result
            ok, text = False, f"the tool {call.name} failed: {exc}"
        return answer(decision, ok, text, consent_s, time.monotonic() - started)

    async def _ask(self, tool: OfferedTool, arguments: dict[str, Any]) -> tuple[str, str | None]:
        """The decision, and None when allowed or else the reason the model is told."""
        request_id = next(self._ids)
        future: asyncio.Future[bool] = self._loop.create_future()
        self._consents[request_id] = future
        self._post(ConsentRequest(request_id, tool.name, tool.source_label, dict(arguments), self.consent_timeout_s))
        try:
            if await asyncio.wait_for(future, self.consent_timeout_s):
                return "allowed by you", None
            return "denied by you", "the user denied this call"
        except TimeoutError:
            return "not answered", f"the user did not answer within {self.consent_timeout_s:g} s"
        except _Ended as ended:
            return "not answered", f"the call was not run: {ended}"
        finally:
            self._consents.pop(request_id, None)
            decided = future.done() and not future.cancelled() and future.exception() is None and future.result()
            answered = future.done() and not future.cancelled() and future.exception() is None
            self._post(ConsentClosed(request_id, ("allowed" if decided else "denied") if answered else "not answered"))

    async def _execute(self, tool: OfferedTool, arguments: dict[str, Any]) -> tuple[bool, str]:
        if tool.source == BUILTIN:
            try:
                return True, self._builtin.run(tool.name, arguments)
            except ValueError as exc:
                return False, str(exc)
        server = self.config.server(tool.source)
        if server is None or not server.enabled:
            raise ToolFailure(f"the tool server {tool.source!r} is no longer configured")
        return await self._connection(server).call(tool.name, arguments, tool.timeout_s)


def _settle(future: asyncio.Future[bool], allow: bool | None, error: BaseException | None) -> None:
    """On the loop: answer a consent wait unless it is already over."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(bool(allow))


class _Ended(Exception):
    """A consent wait ended because its conversation did (or the app quits)."""


def argument_problem(schema: Mapping[str, Any], arguments: Any) -> str | None:
    """The first way ``arguments`` break ``schema`` in words, or None when they fit."""
    import jsonschema

    if not isinstance(arguments, dict):
        return f"the arguments must be an object, not {type(arguments).__name__}"
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
        error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(arguments))
    except jsonschema.exceptions.SchemaError as exc:
        return f"the tool's own schema is not valid ({exc.message})"
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
