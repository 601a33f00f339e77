"""Tool calls parsed from the function channel."""

from __future__ import annotations

import pytest

from engine.loading.tokenizer import TextTokenizer
from engine.tools import CALL_END, CALL_START, ToolCallParser, parse_tool_calls


@pytest.fixture(scope="module")
def tokenizer(tiny_bf16) -> TextTokenizer:
    return TextTokenizer.from_file(tiny_bf16 / "tokenizer.json")


def _feed(parser: ToolCallParser, ids: list[int]) -> list:
    calls = []
    for frame, token in enumerate(ids):
        calls += parser.push(token, frame, ignored=frozenset({12}))
    return calls


def test_call_between_markers_is_parsed(tokenizer):
    start, end = tokenizer.token_to_id(CALL_START), tokenizer.token_to_id(CALL_END)
    body = tokenizer.encode('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    parser = ToolCallParser(tokenizer)
    calls = _feed(parser, [12, start, *body[:3], 12, *body[3:], end, 12])
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and call.arguments == {"city": "Paris"} and call.error is None
    assert call.frame_index == len(body) + 3
    assert not parser.in_call


def test_malformed_call_keeps_raw_text_and_reason(tokenizer):
    start, end = tokenizer.token_to_id(CALL_START), tokenizer.token_to_id(CALL_END)
    parser = ToolCallParser(tokenizer)
    calls = _feed(parser, [start, *tokenizer.encode('{"name": "lookup", "arguments": {'), end])
    assert len(calls) == 1 and calls[0].arguments is None
    assert calls[0].raw == '{"name": "lookup", "arguments": {' and calls[0].error.startswith("not JSON")


def test_interrupted_call_and_stray_end(tokenizer):
    start, end = tokenizer.token_to_id(CALL_START), tokenizer.token_to_id(CALL_END)
    parser = ToolCallParser(tokenizer)
    calls = _feed(parser, [end, start, *tokenizer.encode('{"na'), start, *tokenizer.encode('{"name": "x"}'), end])
    assert [c.error is None for c in calls] == [False, True]
    assert "interrupted" in calls[0].error and calls[1].name == "x" and calls[1].arguments == {}


def test_parse_variants():
    wrapped = parse_tool_calls('<TOOLCALL>[{"name": "a", "arguments": "{\\"k\\": 1}"}, {"name": "b"}]</TOOLCALL>', 4)
    assert [(c.name, c.arguments) for c in wrapped] == [("a", {"k": 1}), ("b", {})]
    assert parse_tool_calls("", 0)[0].error == "empty tool call"
    assert parse_tool_calls('{"arguments": {}}', 0)[0].error == "a call needs a string 'name'"
    assert parse_tool_calls('{"name": "a", "arguments": [1]}', 0)[0].error == "arguments must be an object"
