"""The tool loop's text protocol: the tool prompt (the training template, byte for byte) and the tool response."""

from __future__ import annotations

import json

import pytest

from engine.errors import ToolPromptError
from engine.loading.tokenizer import TextTokenizer
from engine.tools import (
    MAX_RESPONSE_TOKENS,
    MAX_RESULT_CHARS,
    MAX_TOOLS,
    ToolResult,
    ToolSpec,
    render_tool_prompt,
    render_tool_response,
    tool_response_ids,
)

WEATHER = ToolSpec(
    name="get_weather",
    description="The weather now in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolSpec(name="now", description="The date and time.", parameters={"type": "object", "properties": {}})


@pytest.fixture(scope="module")
def tokenizer(tiny_bf16) -> TextTokenizer:
    return TextTokenizer.from_file(tiny_bf16 / "tokenizer.json")


def test_tool_prompt_is_the_training_template_byte_for_byte() -> None:
    # Written out in full (not rebuilt from the module's template): the string vLLM-Omni's _render_tool_prompt makes.
    expected = (
        "You are a helpful assistant.\n\n"
        "You can use the following tools to assist the user if required:\n"
        '<AVAILABLE_TOOLS>[{"description": "The weather now in a city.", "name": "get_weather", "parameters": '
        '{"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}}, '
        '{"description": "The date and time.", "name": "now", "parameters": {"properties": {}, "type": "object"}}]'
        "</AVAILABLE_TOOLS>\n\n"
        "If you decide to call any tool(s), use the following format:\n"
        '<TOOLCALL>[{"name": "tool_name1", "arguments": "tool_args1"}, {"name": "tool_name2", "arguments": '
        '"tool_args2"}]</TOOLCALL>\n\n'
        "The user will execute tool-calls and return responses from tool(s) in this format:\n"
        '<TOOL_RESPONSE>[{"tool_response1"}, {"tool_response2"}]</TOOL_RESPONSE>\n\n'
        "Based on the tool responses, you can call additional tools if needed, correct tool calls if any errors are "
        "found, or just respond to the user."
    )
    prompt = render_tool_prompt("You are a helpful assistant.", [WEATHER, CLOCK])
    assert prompt == expected
    assert prompt.isascii()


def test_tool_prompt_escapes_a_schemas_non_ascii_text() -> None:
    spec = ToolSpec("greet", "Says hello.", {"type": "object", "description": "caf\u00e9"})
    prompt = render_tool_prompt("Hi.", [spec])
    assert prompt.isascii() and "caf\\u00e9" in prompt


@pytest.mark.parametrize(
    ("instructions", "tools", "message"),
    [
        ("Hi.", [], "no tools to offer"),
        ("Hi.", [CLOCK] * (MAX_TOOLS + 1), "6 tools are enabled; the model takes at most 5"),
        ("Caf\u00e9.", [CLOCK], "the instructions must be ASCII"),
        ("Hi.", [ToolSpec("get weather", "x", {})], "tool 1: the name 'get weather' must be 1-64 ASCII letters"),
        ("Hi.", [CLOCK, ToolSpec("", "x", {})], "tool 2: the name '' must be"),
        ("Hi.", [ToolSpec("a" * 65, "x", {})], "must be 1-64"),
        ("Hi.", [ToolSpec("t", "na\u00efve", {})], "tool 't': the description must be ASCII"),
        ("Hi.", [ToolSpec("t", "   ", {})], "tool 't': the description is empty"),
        ("Hi.", [ToolSpec("t", "x" * 521, {})], "tool 't': the description has 521 characters, at most 520"),
        ("Hi.", [ToolSpec("t", "x", [])], "tool 't': the parameters must be a JSON schema object"),  # type: ignore[arg-type]
        ("Hi.", [ToolSpec("t", "x", {"default": {1, 2}})], "tool 't': the parameters are not JSON"),
        ("Hi.", [CLOCK, CLOCK], "two tools are named 'now'"),
    ],
)
def test_tool_prompt_refuses_what_the_model_cannot_take(instructions, tools, message) -> None:
    with pytest.raises(ToolPromptError, match=message.replace("(", r"\(").replace(")", r"\)")):
        render_tool_prompt(instructions, tools)
    assert issubclass(ToolPromptError, ValueError)


def test_tool_response_is_the_compact_ascii_envelope_list() -> None:
    results = [
        ToolResult("get_weather", True, "Sunny, 21 \u00b0C"),
        ToolResult("now", False, 'the user did not answer "allow"'),
    ]
    assert render_tool_response(results) == (
        '<TOOL_RESPONSE>[{"ok":true,"tool":"get_weather","result":"Sunny, 21 \\u00b0C"},'
        '{"ok":false,"tool":"now","error":"the user did not answer \\"allow\\""}]</TOOL_RESPONSE>'
    )
    assert results[0].payload() == {"ok": True, "tool": "get_weather", "result": "Sunny, 21 \u00b0C"}
    assert results[1].payload() == {"ok": False, "tool": "now", "error": 'the user did not answer "allow"'}


def test_a_long_result_is_cut_to_the_bound() -> None:
    payload = ToolResult("read_file", True, "x" * 5000).payload()
    assert payload["result"] == "x" * MAX_RESULT_CHARS


def test_response_ids_end_with_special_22(tokenizer) -> None:
    results = [ToolResult("now", True, "It is noon.")]
    ids = tool_response_ids(results, tokenizer)
    assert ids[-1] == 22 == tokenizer.token_to_id("<SPECIAL_22>")
    assert ids[:-1] == tokenizer.encode(render_tool_response(results))
    assert (
        tokenizer.decode(ids[:-1]) == '<TOOL_RESPONSE>[{"ok":true,"tool":"now","result":"It is noon."}]</TOOL_RESPONSE>'
    )


def test_a_response_over_512_tokens_is_cut_in_its_text_and_stays_valid_json(tokenizer) -> None:
    results = [ToolResult("read_file", True, "lorem ipsum dolor sit amet " * 60), ToolResult("now", True, "noon")]
    assert len(tokenizer.encode(render_tool_response(results))) > MAX_RESPONSE_TOKENS
    ids = tool_response_ids(results, tokenizer)
    assert len(ids) - 1 <= MAX_RESPONSE_TOKENS
    text = tokenizer.decode(ids[:-1])
    assert text.startswith("<TOOL_RESPONSE>") and text.endswith("</TOOL_RESPONSE>")
    envelopes = json.loads(text.removeprefix("<TOOL_RESPONSE>").removesuffix("</TOOL_RESPONSE>"))
    assert [envelope["tool"] for envelope in envelopes] == ["read_file", "now"]
    assert results[0].content.startswith(envelopes[0]["result"]) and len(envelopes[0]["result"]) > 100
    # The longest common cut that fits: one more character would not.
    longer = len(envelopes[0]["result"]) + 1
    assert len(tokenizer.encode(render_tool_response(results, longer))) > MAX_RESPONSE_TOKENS
