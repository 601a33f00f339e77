"""A small stdio MCP server for the tool-loop tests (the official SDK's ``MCPServer``, once called FastMCP).

Tools: ``echo`` (returns its text), ``add`` (two integers), ``slow`` (sleeps, to test the runner's time limit),
``fail`` (raises: the call comes back as an MCP error result), ``environment`` (which variables the server
process was given: the runner restricts them), ``record`` (appends its text to the file named by the
``PARLEY_TEST_RECORD`` variable: a side effect tests can see) and ``pid`` (the server's process id).
Run: ``python tests/mcp_echo_server.py`` (it speaks MCP on stdin/stdout).
"""

from __future__ import annotations

import os
import time

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("parley-test-echo")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def slow(seconds: float) -> str:
    """Wait, then answer."""
    time.sleep(seconds)
    return f"waited {seconds} s"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason given."""
    raise ToolError(reason)


@server.tool()
def record(text: str) -> str:
    """Append the text to the record file."""
    with open(os.environ["PARLEY_TEST_RECORD"], "a", encoding="utf-8") as stream:
        stream.write(text + "\n")
    return f"recorded {text}"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def environment() -> str:
    """The names of the environment variables this server was started with, sorted."""
    return ",".join(sorted(os.environ))


if __name__ == "__main__":
    server.run()
