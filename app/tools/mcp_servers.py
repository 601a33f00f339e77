"""MCP servers through the official SDK (``mcp``): started on first use, listed, called, stopped on quit.

Everything here runs on the tool host's event loop (``app.tools.runner``). One :class:`ServerConnection` per
configured server owns one SDK ``Client`` inside one task (the SDK's contexts must be entered and left by the same
task): it enters on the first use, waits for :meth:`close`, and leaves, which stops a stdio server's process (the
SDK closes its stdin, then terminates and kills it, every wait bounded).

A stdio server gets a restricted environment: the SDK's safe few (``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``,
``TERM``, ``USER``) and exactly the variables its configuration names, nothing else of Parley's environment. Its
stderr goes to a file of its own in the log folder, whose last lines explain a server that failed to start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Final, TextIO

from .config import ServerConfig, ToolEntry

log = logging.getLogger(__name__)

STDERR_TAIL_CHARS: Final = 400


class ToolFailure(Exception):
    """A tool or its server could not give a result; the message is what the model and the window are told."""


class ServerConnection:
    """One MCP server, as the tool host reaches it."""

    def __init__(self, config: ServerConfig, log_folder: Path | None = None) -> None:
        self.config = config
        self._log_folder = log_folder
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._client: Any = None
        self._failure: str | None = None
        self._stderr: TextIO | None = None
        self._stderr_path: Path | None = None
        self.starts = 0  # how many times a process/session was started (for tests and the log)

    @property
    def running(self) -> bool:
        return self._client is not None

    async def ensure_started(self, timeout_s: float) -> Any:
        """The connected client, starting the server if needed; ToolFailure when it fails or takes too long."""
        if self._client is not None:
            return self._client
        if self._task is None or self._task.done():
            self._ready, self._stop, self._failure = asyncio.Event(), asyncio.Event(), None
            self.starts += 1
            self._task = asyncio.create_task(self._serve(), name=f"mcp-{self.config.name}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready.wait()), timeout_s)
        except TimeoutError:
            await self.close()
            raise ToolFailure(
                f"the tool server {self.config.name!r} did not start within {timeout_s:g} s{self._stderr_tail()}"
            ) from None
        if self._client is None:
            failure = self._failure or "it stopped"
            await self.close()
            raise ToolFailure(f"the tool server {self.config.name!r} could not start: {failure}{self._stderr_tail()}")
        return self._client

    async def _serve(self) -> None:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        config = self.config
        try:
            if config.url is not None:
                target: Any = config.url
            else:
                self._stderr = self._open_stderr()
                params = StdioServerParameters(
                    command=config.command[0], args=list(config.command[1:]), env=dict(config.env)
                )
                target = stdio_client(params, errlog=self._stderr)
            async with Client(target) as client:
                self._client = client
                self._ready.set()
                await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure to start is a reason the model hears
            self._failure = _reason(exc)
            log.warning("Tool server %s stopped: %s", config.name, self._failure)
        finally:
            self._client = None
            self._ready.set()

    def _open_stderr(self) -> TextIO:
        folder = self._log_folder or Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        self._stderr_path = folder / f"tool-server-{self.config.name}.log"
        stream = open(self._stderr_path, "w", encoding="utf-8")  # noqa: SIM115 - open while the server runs
        os.chmod(self._stderr_path, 0o600)
        return stream

    def _stderr_tail(self) -> str:
        path = self._stderr_path
        if path is None:
            return ""
        try:
            if self._stderr is not None:
                self._stderr.flush()
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""
        if not text:
            return ""
        last = text.splitlines()[-1][-STDERR_TAIL_CHARS:]
        return f" (it said: {last})"

    async def list_tools(self, timeout_s: float) -> tuple[ToolEntry, ...]:
        """What the server offers, as tool entries (the user's choices are added by the configuration)."""
        client = await self.ensure_started(timeout_s)
        try:
            listed = await asyncio.wait_for(client.list_tools(), timeout_s)
        except TimeoutError:
            raise ToolFailure(
                f"the tool server {self.config.name!r} did not list its tools within {timeout_s:g} s"
            ) from None
        entries = []
        for tool in listed.tools:
            annotations = getattr(tool, "annotations", None)
            read_only = bool(getattr(annotations, "read_only_hint", False)) if annotations is not None else False
            try:
                entries.append(
                    ToolEntry(tool.name, (tool.description or "").strip(), dict(tool.input_schema), read_only)
                )
            except ValueError as exc:
                log.warning("Tool server %s: tool %r left out: %s", self.config.name, tool.name, exc)
        return tuple(entries)

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> tuple[bool, str]:
        """Run one tool (the server started first, if needed: at most ``timeout_s`` each); (ok, text). A result the
        server flags as an error is (False, its text)."""
        client = await self.ensure_started(timeout_s)
        try:
            result = await asyncio.wait_for(client.call_tool(name, arguments), timeout_s)
        except TimeoutError:
            raise ToolFailure(f"the tool {name} did not finish within {timeout_s:g} s") from None
        parts = []
        for block in result.content:
            text = getattr(block, "text", None)
            parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
        text = "\n".join(parts).strip()
        if not text and result.structured_content is not None:
            import json

            text = json.dumps(result.structured_content, ensure_ascii=True)
        return not result.is_error, text or ("(no output)" if not result.is_error else "the tool failed")

    async def close(self) -> None:
        """Stop the server (its process ends): a running one leaves its session (the SDK's shutdown, every wait
        bounded), one still starting is cancelled."""
        task, self._task = self._task, None
        starting = self._client is None
        self._stop.set()
        if task is not None and not task.done():
            if starting:
                task.cancel()
            try:
                await asyncio.wait_for(task, 8.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
            except Exception:  # noqa: BLE001 - it is stopping anyway
                pass
        self._client = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _reason(exc: BaseException) -> str:
    """A readable reason from an exception (or the first of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"the command was not found ({exc.filename or exc})"
    text = str(exc).strip() or type(exc).__name__
    return text
