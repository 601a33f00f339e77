"""Tool calls on the function channel.

The function channel carries PAD while idle, ``<SPECIAL_20>`` where a tool call
starts, the call text, ``<SPECIAL_21>`` where it ends, and ``<SPECIAL_22>`` after a
tool response (the base model's ``<TOOLCALL>`` convention). The call text is JSON:
``{"name": ..., "arguments": {...}}`` or a list of such objects, optionally wrapped
in ``<TOOLCALL>…</TOOLCALL>``. Each complete call becomes a :class:`ToolCall`; text
that does not parse is kept raw with the reason.
"""

from __future__ import annotations

import json
from typing import Any

from .events import SPECIAL_MARKER, ToolCall
from .loading.tokenizer import TextTokenizer

CALL_START = "<SPECIAL_20>"
CALL_END = "<SPECIAL_21>"
RESPONSE_END = "<SPECIAL_22>"


class ToolCallParser:
    """Collects function-channel tokens between the start and end markers."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._start = tokenizer.token_to_id(CALL_START)
        self._end = tokenizer.token_to_id(CALL_END)
        self._tokens: list[int] | None = None  # None while outside a call

    @property
    def in_call(self) -> bool:
        return self._tokens is not None

    def push(self, token_id: int, frame_index: int, *, ignored: frozenset[int] = frozenset()) -> list[ToolCall]:
        """Feed one function-channel id; returns the calls it completes."""
        if token_id == self._start:
            # A new start inside an open call abandons the unfinished one.
            abandoned = self._finish(frame_index, complete=False) if self._tokens else []
            self._tokens = []
            return abandoned
        if token_id == self._end:
            return self._finish(frame_index, complete=True) if self._tokens is not None else []
        if self._tokens is not None and token_id not in ignored:
            self._tokens.append(token_id)
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
