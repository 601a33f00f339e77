"""Tool calls on the function channel.

The function channel carries PAD while idle, ``<SPECIAL_20>`` where a tool call
starts, the call text, ``<SPECIAL_21>`` where it ends, and ``<SPECIAL_22>`` after a
tool response (the base model's ``<TOOLCALL>`` convention). The call text is JSON:
``{"name": ..., "arguments": {...}}`` or a list of such objects, optionally wrapped
in ``<TOOLCALL>…</TOOLCALL>``. Each complete call becomes a :class:`ToolCall`; text
that does not parse is kept raw with the reason.

The way back is here too: the tool prompt (:func:`render_tool_prompt`, vLLM-Omni's rendering of the training
template) and the response the session forces into the function channel (:func:`render_tool_response`,
:func:`tool_response_ids`). docs/tools.md has the protocol and its sources.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .errors import ToolPromptError
from .events import SPECIAL_MARKER, ToolCall
from .loading.tokenizer import TextTokenizer

CALL_START = "<SPECIAL_20>"
CALL_END = "<SPECIAL_21>"
RESPONSE_END = "<SPECIAL_22>"

MAX_TOOLS: Final = 5
"""The most tools one prompt offers (vLLM-Omni and speech-swift both refuse more: the checkpoint was trained so)."""
MAX_DESCRIPTION_CHARS: Final = 520
"""A tool description's bound (speech-swift's model-facing definition)."""
MAX_RESULT_CHARS: Final = 1_500
"""A result's (or error's) text, at most, in the envelope the model hears (speech-swift's bound)."""
MAX_RESPONSE_TOKENS: Final = 512
"""The most response tokens injected (``<SPECIAL_22>`` excluded): speech-swift's bound."""
MAX_CALL_POSITIONS: Final = 256
"""Function-channel positions after ``<SPECIAL_20>`` within which ``<SPECIAL_21>`` must come (speech-swift's and
the NVIDIA pipeline's bounded recovery: 256)."""

_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# vLLM-Omni's ``_render_tool_prompt`` (duplex/serving_adapter.py), byte for byte after the instructions: the
# training template (docs/tools.md). The checkpoint is prompt-sensitive; change nothing here.
_TOOL_PROMPT_TEMPLATE: Final = (
    "{instructions}\n\n"
    "You can use the following tools to assist the user if required:"
    "\n<AVAILABLE_TOOLS>{available}</AVAILABLE_TOOLS>\n\n"
    "If you decide to call any tool(s), use the following format:\n"
    '<TOOLCALL>[{{"name": "tool_name1", "arguments": "tool_args1"}}, '
    '{{"name": "tool_name2", "arguments": "tool_args2"}}]</TOOLCALL>\n\n'
    "The user will execute tool-calls and return responses from tool(s) in this format:\n"
    '<TOOL_RESPONSE>[{{"tool_response1"}}, {{"tool_response2"}}]</TOOL_RESPONSE>\n\n'
    "Based on the tool responses, you can call additional tools if needed, correct tool calls if any "
    "errors are found, or just respond to the user."
)


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about one tool: its name, what it does, and the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        """The model-facing definition, ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def _check_spec(index: int, spec: ToolSpec) -> None:
    where = f"tool {index + 1}"
    if not isinstance(spec.name, str) or not _TOOL_NAME.fullmatch(spec.name):
        raise ToolPromptError(f"{where}: the name {spec.name!r} must be 1-64 ASCII letters, digits, '_', '.' or '-'")
    where = f"tool {spec.name!r}"
    if not isinstance(spec.description, str) or not spec.description.strip():
        raise ToolPromptError(f"{where}: the description is empty")
    if not spec.description.isascii():
        raise ToolPromptError(f"{where}: the description must be ASCII (the model was trained on ASCII prompts)")
    if len(spec.description) > MAX_DESCRIPTION_CHARS:
        raise ToolPromptError(
            f"{where}: the description has {len(spec.description)} characters, at most {MAX_DESCRIPTION_CHARS}"
        )
    if not isinstance(spec.parameters, dict):
        raise ToolPromptError(f"{where}: the parameters must be a JSON schema object")
    try:
        json.dumps(spec.parameters, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ToolPromptError(f"{where}: the parameters are not JSON ({exc})") from exc


def render_tool_prompt(instructions: str, tools: Sequence[ToolSpec]) -> str:
    """The system prompt offering ``tools``: ``instructions``, then the training template with
    ``json.dumps(definitions, sort_keys=True)`` inside ``<AVAILABLE_TOOLS>``.

    Raises:
        ToolPromptError: no tools or more than :data:`MAX_TOOLS`, a name that is not 1-64 of ``[A-Za-z0-9_.-]``
            or is given twice, an empty, non-ASCII or over-long description, parameters that are not a JSON
            object, or non-ASCII instructions.
    """
    if not tools:
        raise ToolPromptError("no tools to offer: use the plain instructions as the system prompt")
    if len(tools) > MAX_TOOLS:
        raise ToolPromptError(f"{len(tools)} tools are enabled; the model takes at most {MAX_TOOLS}")
    if not instructions.isascii():
        raise ToolPromptError("the instructions must be ASCII when tools are offered (the training prompts were)")
    seen: set[str] = set()
    for index, spec in enumerate(tools):
        _check_spec(index, spec)
        if spec.name in seen:
            raise ToolPromptError(f"two tools are named {spec.name!r}")
        seen.add(spec.name)
    # ensure_ascii (the default) escapes any non-ASCII character of a schema, so the prompt stays ASCII.
    available = json.dumps([spec.definition() for spec in tools], sort_keys=True)
    return _TOOL_PROMPT_TEMPLATE.format(instructions=instructions, available=available)


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome, as the model will hear it: the result text, or (``ok`` false) the error text."""

    tool: str
    ok: bool
    content: str

    def payload(self, limit: int = MAX_RESULT_CHARS) -> dict[str, Any]:
        """The envelope ``{"ok": true, "tool", "result"}`` or ``{"ok": false, "tool", "error"}``, the text cut to
        ``limit`` characters."""
        text = self.content[: max(0, min(limit, MAX_RESULT_CHARS))]
        if self.ok:
            return {"ok": True, "tool": self.tool, "result": text}
        return {"ok": False, "tool": self.tool, "error": text}


def render_tool_response(results: Sequence[ToolResult], limit: int = MAX_RESULT_CHARS) -> str:
    """``<TOOL_RESPONSE>`` + the results' envelopes as one compact ASCII JSON array + ``</TOOL_RESPONSE>``
    (vLLM-Omni's ``_render_tool_response`` serialization), each text cut to ``limit`` characters."""
    body = json.dumps([result.payload(limit) for result in results], ensure_ascii=True, separators=(",", ":"))
    return f"<TOOL_RESPONSE>{body}</TOOL_RESPONSE>"


def tool_response_ids(
    results: Sequence[ToolResult], tokenizer: TextTokenizer, max_tokens: int = MAX_RESPONSE_TOKENS
) -> list[int]:
    """The function-channel ids that answer the pending calls: the rendered response's tokens, then
    ``<SPECIAL_22>``.

    A response over ``max_tokens`` tokens is cut at the JSON level: every text is shortened to the longest common
    length that fits, so the envelope stays valid. Only where the envelopes alone are too long (many calls with
    long names) are the tokens themselves cut.
    """
    end = tokenizer.token_to_id(RESPONSE_END)
    if end is None:
        raise ToolPromptError(f"the tokenizer has no {RESPONSE_END} token to end a tool response with")

    def ids(limit: int) -> list[int]:
        return tokenizer.encode(render_tool_response(results, limit))

    tokens = ids(MAX_RESULT_CHARS)
    if len(tokens) > max_tokens:
        low, high = 0, MAX_RESULT_CHARS  # ids(low) is what is kept unless a longer limit fits
        while low < high:
            middle = (low + high + 1) // 2
            if len(ids(middle)) <= max_tokens:
                low = middle
            else:
                high = middle - 1
        tokens = ids(low)[:max_tokens]
    return [*tokens, end]


class ToolCallParser:
    """Collects function-channel tokens between the start and end markers.

    A call ends at ``<SPECIAL_21>``, or after ``max_positions`` positions without it (a :class:`ToolCall` whose
    error says so); either way :attr:`ended_call` is true for that push, and the session waits for the call's
    results. A new ``<SPECIAL_20>`` inside an open call abandons the open one (a :class:`ToolCall` with an error,
    not waited for: the new call goes on).
    """

    def __init__(self, tokenizer: TextTokenizer, max_positions: int = MAX_CALL_POSITIONS) -> None:
        self._tokenizer = tokenizer
        self._start = tokenizer.token_to_id(CALL_START)
        self._end = tokenizer.token_to_id(CALL_END)
        self._max_positions = max_positions
        self._tokens: list[int] | None = None  # None while outside a call
        self._positions = 0  # positions since the open call's start
        self.ended_call = False  # whether the last push ended a call (at its end marker or its bound)

    @property
    def in_call(self) -> bool:
        return self._tokens is not None

    def push(self, token_id: int, frame_index: int, *, ignored: frozenset[int] = frozenset()) -> list[ToolCall]:
        """Feed one function-channel id; returns the calls it completes."""
        self.ended_call = False
        if token_id == self._start:
            # A new start inside an open call abandons the unfinished one.
            abandoned = self._finish(frame_index, complete=False) if self._tokens else []
            self._tokens, self._positions = [], 0
            return abandoned
        if self._tokens is None:
            return []
        if token_id == self._end:
            self.ended_call = True
            return self._finish(frame_index, complete=True)
        if token_id not in ignored:
            self._tokens.append(token_id)
        self._positions += 1
        if self._positions >= self._max_positions:
            self.ended_call = True
            raw = self._tokenizer.decode(self._tokens).strip()
            self._tokens = None
            return [
                ToolCall(frame_index, raw=raw, error=f"the call did not end within {self._max_positions} positions")
            ]
        return []

    def _finish(self, frame_index: int, *, complete: bool) -> list[ToolCall]:
        raw = self._tokenizer.decode(self._tokens or []).strip()
        self._tokens = None
        if not complete:
            return [ToolCall(frame_index, raw=raw, error="tool call was interrupted by a new call")]
        return parse_tool_calls(raw, frame_index)


def parse_tool_calls(raw: str, frame_index: int) -> list[ToolCall]:
    """Parse one call's text into structured calls (or one call carrying the error). The model's own markers
    (``<SPECIAL_n>``) are not part of the call's JSON: they are skipped here and kept in ``raw``."""
    text = SPECIAL_MARKER.sub("", raw).strip()
    if text.startswith("<TOOLCALL>"):
        text = text.removeprefix("<TOOLCALL>").removesuffix("</TOOLCALL>").strip()
    if not text:
        return [ToolCall(frame_index, raw=raw, error="empty tool call")]
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        return [ToolCall(frame_index, raw=raw, error=f"not JSON: {exc.msg} (column {exc.colno})")]
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            calls.append(ToolCall(frame_index, raw=raw, error="a call needs a string 'name'"))
            continue
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                calls.append(ToolCall(frame_index, raw=raw, name=item["name"], error="arguments are not JSON"))
                continue
        if not isinstance(arguments, dict):
            calls.append(ToolCall(frame_index, raw=raw, name=item["name"], error="arguments must be an object"))
            continue
        calls.append(ToolCall(frame_index, raw=raw, name=item["name"], arguments=arguments))
    return calls


class ScriptedChannels:
    """A test seam for :class:`engine.session.Session` (its ``override_ids``): plays scripted ids in place of the
    heads' greedy choices, one per frame, then lets the heads choose again. Random weights never call a tool; a
    script makes them. Each channel's script runs on its own (an empty one leaves that channel to the model)."""

    def __init__(self, function_ids: Sequence[int] = (), text_ids: Sequence[int] = ()) -> None:
        self._function: list[int] = list(function_ids)
        self._text: list[int] = list(text_ids)

    def extend(self, function_ids: Sequence[int] = (), text_ids: Sequence[int] = ()) -> None:
        """Script more frames after those still to come."""
        self._function.extend(function_ids)
        self._text.extend(text_ids)

    def __call__(self, text_id: int, function_id: int) -> tuple[int, int]:
        if self._text:
            text_id = self._text.pop(0)
        if self._function:
            function_id = self._function.pop(0)
        return text_id, function_id
