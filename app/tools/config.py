"""The tools configuration: which tools the assistant is offered, where they come from, and who decides.

One file, ``tools.json`` in the config folder (beside ``settings.json``), is its only home: Settings → Tools edits
it, ``parley run --tools`` reads it (or any file of the same schema). Its schema (``parley-tools/1``)::

    {
      "format": "parley-tools/1",
      "offer_tools": false,                  # offer the enabled tools to the model at all (off: the plain prompt)
      "builtin": {                           # the tools that need no server (app.tools.builtin)
        "current_time": {"enabled": true, "consent": "always"},
        "set_timer":    {"enabled": true, "consent": "ask"}
      },
      "servers": [                           # MCP servers: a command (stdio) or a URL (Streamable HTTP)
        {"name": "notes", "command": ["uvx", "mcp-server-notes"], "env": {"NOTES_DIR": "/home/me/notes"},
         "enabled": true, "timeout_s": 15,
         "tools": {"read_note": {"enabled": true, "consent": "ask", "read_only": true,
                                 "description": "…", "parameters": {…}}}}
      ]
    }

A server's ``tools`` are what it listed the last time it was asked (Settings → Tools → List tools, or the first
conversation that needed them), with the user's choices beside each: ``enabled`` and ``consent``. Consent is one of
``always`` (run without asking), ``ask`` (the window asks every time, the default for anything not read-only) and
``never``; a tool without a choice takes the default for its kind (``always`` when read-only, else ``ask``).

Loading never fails: a missing file is the defaults (tools off), a file that is not JSON or not this schema is set
aside as ``tools.json.corrupt`` and the defaults are used, and an entry with a bad value is dropped with a warning
naming it, keeping the rest. Every warning is returned for the window to show.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from ..files import move_aside, write_private_text_file
from ..paths import config_dir

log = logging.getLogger(__name__)

TOOLS_FILENAME: Final = "tools.json"
FORMAT: Final = "parley-tools/1"
CONSENT_POLICIES: Final = ("always", "ask", "never")
DEFAULT_TOOL_TIMEOUT_S: Final = 15.0
MAX_TOOL_TIMEOUT_S: Final = 300.0
SERVER_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
TOOL_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")  # what the prompt template can carry (ASCII)


class ToolsConfigError(ValueError):
    """A tools configuration value is not allowed; the message names it."""


@dataclass(frozen=True)
class ToolEntry:
    """One tool: what its source says about it, and the user's choices."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    read_only: bool = False  # its source says it changes nothing (MCP's readOnlyHint); sets the default consent
    enabled: bool = True
    consent: str | None = None  # one of CONSENT_POLICIES; None: the default for its kind

    def __post_init__(self) -> None:
        if not TOOL_NAME.match(self.name):
            raise ToolsConfigError(f"tool name {self.name!r} is not a plain ASCII name (letters, digits, _ . -)")
        if self.consent is not None and self.consent not in CONSENT_POLICIES:
            raise ToolsConfigError(
                f"consent for {self.name!r} must be one of {', '.join(CONSENT_POLICIES)}; got {self.consent!r}"
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type", "object") != "object":
            raise ToolsConfigError(f"the parameters of {self.name!r} must be a JSON schema of an object")

    @property
    def policy(self) -> str:
        """The consent in force: the user's choice, else ``always`` for a read-only tool and ``ask`` otherwise."""
        if self.consent is not None:
            return self.consent
        return "always" if self.read_only else "ask"


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server: started on demand by command (stdio) or reached by URL, with the tools it listed."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # what the server is given beyond PATH, HOME, …
    enabled: bool = True
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    tools: tuple[ToolEntry, ...] = ()

    def __post_init__(self) -> None:
        if not SERVER_NAME.match(self.name):
            raise ToolsConfigError(f"server name {self.name!r} must be 1-40 letters, digits, _ . - (no spaces)")
        if bool(self.command) == bool(self.url):
            raise ToolsConfigError(f"server {self.name!r} needs either a command or a URL (one of them)")
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ToolsConfigError(f"server {self.name!r}: the URL must start with http:// or https://")
        if any(not isinstance(part, str) or not part or "\0" in part for part in self.command):
            raise ToolsConfigError(f"server {self.name!r}: every part of the command must be non-empty text")
        if not (isinstance(self.timeout_s, int | float) and 0 < self.timeout_s <= MAX_TOOL_TIMEOUT_S):
            raise ToolsConfigError(
                f"server {self.name!r}: timeout_s must be above 0 and at most {MAX_TOOL_TIMEOUT_S:g}; "
                f"got {self.timeout_s!r}"
            )
        for key, value in self.env.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) or not isinstance(value, str) or "\0" in value:
                raise ToolsConfigError(f"server {self.name!r}: env {key!r} must be a variable name with a text value")
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise ToolsConfigError(f"server {self.name!r} lists a tool twice")

    @property
    def where(self) -> str:
        """The command line or the URL, for people."""
        return self.url if self.url is not None else shlex.join(self.command)

    def tool(self, name: str) -> ToolEntry | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    def with_listed(self, listed: tuple[ToolEntry, ...]) -> ServerConfig:
        """The server with the tools it just listed, keeping the user's choices for the tools it still has."""
        kept = []
        for tool in listed:
            old = self.tool(tool.name)
            kept.append(tool if old is None else replace(tool, enabled=old.enabled, consent=old.consent))
        return replace(self, tools=tuple(kept))


@dataclass(frozen=True)
class ToolsConfig:
    """Everything in ``tools.json``."""

    offer_tools: bool = False
    builtin: Mapping[str, ToolEntry] = field(default_factory=dict)  # the user's choices for the built-in tools
    servers: tuple[ServerConfig, ...] = ()

    def __post_init__(self) -> None:
        names = [server.name for server in self.servers]
        if len(set(names)) != len(names):
            raise ToolsConfigError("two servers have the same name")

    def server(self, name: str) -> ServerConfig | None:
        return next((server for server in self.servers if server.name == name), None)

    def with_server(self, server: ServerConfig) -> ToolsConfig:
        """A copy with ``server`` added, or replacing the one of its name."""
        servers = [s for s in self.servers if s.name != server.name]
        position = next((i for i, s in enumerate(self.servers) if s.name == server.name), len(servers))
        servers.insert(position, server)
        return replace(self, servers=tuple(servers))

    def without_server(self, name: str) -> ToolsConfig:
        return replace(self, servers=tuple(s for s in self.servers if s.name != name))

    def with_choice(self, source: str, tool: str, *, enabled: bool, consent: str | None) -> ToolsConfig:
        """A copy with the user's choice for ``tool`` of ``source`` (a server name, or ``builtin``)."""
        if source == "builtin":
            entry = self.builtin.get(tool, ToolEntry(tool))
            builtin = {**self.builtin, tool: replace(entry, enabled=enabled, consent=consent)}
            return replace(self, builtin=builtin)
        server = self.server(source)
        if server is None or server.tool(tool) is None:
            raise ToolsConfigError(f"there is no tool {tool!r} on server {source!r}")
        tools = tuple(replace(t, enabled=enabled, consent=consent) if t.name == tool else t for t in server.tools)
        return self.with_server(replace(server, tools=tools))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "offer_tools": self.offer_tools,
            "builtin": {name: _choice_dict(entry) for name, entry in self.builtin.items()},
            "servers": [_server_dict(server) for server in self.servers],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> tuple[ToolsConfig, list[str]]:
        """The configuration in ``data``, and one warning per entry that was dropped (the rest is kept)."""
        problems: list[str] = []
        if data.get("format", FORMAT) != FORMAT:
            raise ToolsConfigError(f"the file is of format {data.get('format')!r}, not {FORMAT!r}")
        offer = data.get("offer_tools", False)
        if not isinstance(offer, bool):
            problems.append(f"offer_tools must be true or false, not {offer!r}; tools are off")
            offer = False
        builtin: dict[str, ToolEntry] = {}
        raw_builtin = data.get("builtin", {})
        if not isinstance(raw_builtin, Mapping):
            problems.append("builtin must be an object; the built-in tools take their defaults")
            raw_builtin = {}
        for name, choice in raw_builtin.items():
            try:
                builtin[name] = _entry(name, choice, choices_only=True)
            except (ToolsConfigError, TypeError) as exc:
                problems.append(f"builtin {name!r}: {exc}; it takes its defaults")
        servers: list[ServerConfig] = []
        raw_servers = data.get("servers", [])
        if not isinstance(raw_servers, list):
            problems.append("servers must be a list; no server is configured")
            raw_servers = []
        for number, raw in enumerate(raw_servers, 1):
            try:
                server = _server(raw)
            except (ToolsConfigError, TypeError) as exc:
                problems.append(f"server {number}: {exc}; it is left out")
                continue
            if any(s.name == server.name for s in servers):
                problems.append(f"server {number}: the name {server.name!r} is taken; it is left out")
                continue
            servers.append(server)
        return cls(offer, builtin, tuple(servers)), problems


def _choice_dict(entry: ToolEntry) -> dict[str, Any]:
    return {"enabled": entry.enabled, "consent": entry.consent}


def _server_dict(server: ServerConfig) -> dict[str, Any]:
    data: dict[str, Any] = {"name": server.name}
    if server.url is not None:
        data["url"] = server.url
    else:
        data["command"] = list(server.command)
    data.update(env=dict(server.env), enabled=server.enabled, timeout_s=server.timeout_s)
    data["tools"] = {
        tool.name: {
            **_choice_dict(tool),
            "read_only": tool.read_only,
            "description": tool.description,
            "parameters": dict(tool.parameters),
        }
        for tool in server.tools
    }
    return data


def _entry(name: Any, raw: Any, *, choices_only: bool = False) -> ToolEntry:
    if not isinstance(name, str):
        raise ToolsConfigError("a tool name must be text")
    if not isinstance(raw, Mapping):
        raise ToolsConfigError("a tool's entry must be an object")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ToolsConfigError(f"enabled must be true or false, not {enabled!r}")
    consent = raw.get("consent")
    if consent is not None and not isinstance(consent, str):
        raise ToolsConfigError(f"consent must be one of {', '.join(CONSENT_POLICIES)}, not {consent!r}")
    if choices_only:
        return ToolEntry(name, enabled=enabled, consent=consent)
    description = raw.get("description", "")
    parameters = raw.get("parameters", {"type": "object", "properties": {}})
    read_only = raw.get("read_only", False)
    if not isinstance(description, str) or not isinstance(parameters, Mapping) or not isinstance(read_only, bool):
        raise ToolsConfigError("description must be text, parameters an object and read_only true or false")
    return ToolEntry(name, description, dict(parameters), read_only, enabled, consent)


def _server(raw: Any) -> ServerConfig:
    if not isinstance(raw, Mapping):
        raise ToolsConfigError("a server must be an object")
    name = raw.get("name")
    if not isinstance(name, str):
        raise ToolsConfigError("a server needs a name")
    command = raw.get("command", [])
    if isinstance(command, str):
        command = command.split()
    if not isinstance(command, list):
        raise ToolsConfigError(f"server {name!r}: command must be a list of words")
    url = raw.get("url")
    if url is not None and not isinstance(url, str):
        raise ToolsConfigError(f"server {name!r}: url must be text")
    env = raw.get("env", {})
    if not isinstance(env, Mapping):
        raise ToolsConfigError(f"server {name!r}: env must be an object of texts")
    enabled = raw.get("enabled", True)
    timeout = raw.get("timeout_s", DEFAULT_TOOL_TIMEOUT_S)
    if not isinstance(enabled, bool):
        raise ToolsConfigError(f"server {name!r}: enabled must be true or false")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
        raise ToolsConfigError(f"server {name!r}: timeout_s must be a number of seconds")
    raw_tools = raw.get("tools", {})
    if not isinstance(raw_tools, Mapping):
        raise ToolsConfigError(f"server {name!r}: tools must be an object keyed by tool name")
    tools = tuple(_entry(tool, value) for tool, value in raw_tools.items())
    return ServerConfig(name, tuple(command), url, dict(env), enabled, float(timeout), tools)


def default_tools_path() -> Path:
    return config_dir() / TOOLS_FILENAME


@dataclass(frozen=True)
class ToolsLoad:
    config: ToolsConfig
    warnings: tuple[str, ...] = ()


def load_tools_config(path: Path | None = None) -> ToolsLoad:
    """Read ``tools.json`` (default: in the config folder); never fails (see the module's docstring)."""
    path = default_tools_path() if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ToolsLoad(ToolsConfig())
    except (OSError, UnicodeDecodeError) as exc:
        return ToolsLoad(ToolsConfig(), (f"The tools file {path} could not be read ({exc}); tools are off.",))
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ToolsConfigError(f"it holds a JSON {type(data).__name__}, not an object")
        config, problems = ToolsConfig.from_dict(data)
    except (ValueError, RecursionError) as exc:
        _, kept = move_aside(path)
        warning = f"The tools file {path} is not usable ({exc}); tools are off and {kept}."
        log.warning(warning)
        return ToolsLoad(ToolsConfig(), (warning,))
    warnings = tuple(f"In {path}: {problem}." for problem in problems)
    for warning in warnings:
        log.warning(warning)
    return ToolsLoad(config, warnings)


def save_tools_config(config: ToolsConfig, path: Path | None = None) -> Path:
    """Write ``config`` atomically and privately (it may hold a server's secrets in ``env``)."""
    path = default_tools_path() if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_private_text_file(path, json.dumps(config.to_dict(), indent=2, ensure_ascii=False) + "\n")
