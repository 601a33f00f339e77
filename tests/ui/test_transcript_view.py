"""The transcript: streamed deltas per turn, turn boundaries, tool calls, plain-text display."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from engine.events import AssistantTextDelta, ToolCall, UserTranscriptDelta
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.transcript_view import Role, TranscriptView


def user(delta: str) -> UserTranscriptDelta:
    return UserTranscriptDelta(0, delta, "")


def assistant(delta: str) -> AssistantTextDelta:
    return AssistantTextDelta(0, 7, delta, "")


@pytest.fixture
def view(qtbot: QtBot) -> TranscriptView:
    widget = TranscriptView()
    qtbot.addWidget(widget)
    widget.resize(600, 400)
    widget.show()
    return widget


def test_deltas_are_appended_per_turn(view: TranscriptView) -> None:
    assert view.placeholder.isVisible() and not view.scroll_area.isVisible()
    for delta in ("What", " is", " the", " capital", "?"):
        view.add_user_delta(user(delta))
    for delta in (" Paris", " is", " the", " capital."):
        view.add_assistant_delta(assistant(delta))
    assert view.entries() == [(Role.USER, "What is the capital?"), (Role.ASSISTANT, "Paris is the capital.")]
    assert view.scroll_area.isVisible() and not view.placeholder.isVisible()
    assert view.plain_text() == "You: What is the capital?\n\nAssistant: Paris is the capital."


def test_new_turn_starts_a_new_entry(view: TranscriptView) -> None:
    view.add_user_delta(user("Hello"))
    view.start_new_turn()
    view.add_user_delta(user(" again"))
    view.add_assistant_delta(assistant(" Hi"))
    view.add_user_delta(user(" more"))
    assert [role for role, _ in view.entries()] == [Role.USER, Role.USER, Role.ASSISTANT, Role.USER]
    assert view.entries()[1] == (Role.USER, "again")


def test_whitespace_only_delta_does_not_open_an_entry(view: TranscriptView) -> None:
    view.add_assistant_delta(assistant(" "))
    view.add_assistant_delta(assistant(""))
    assert view.entries() == []


def test_tool_call_entry_shows_name_and_arguments(view: TranscriptView) -> None:
    view.add_assistant_delta(assistant("Let me check."))
    view.add_tool_call(ToolCall(3, "raw", "get_weather", {"city": "Paris", "days": 2}))
    view.add_assistant_delta(assistant(" It is sunny."))
    entries = view.entry_widgets()
    assert [e.role for e in entries] == [Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    tool = entries[1]
    assert tool.header.text() == "Tool call · get_weather"
    assert json.loads(tool.text()) == {"city": "Paris", "days": 2}
    assert tool.property("failed") is False


def test_tool_call_parse_error_shows_reason_and_raw_text(view: TranscriptView) -> None:
    raw = '{"name": "get_weather", "arguments": {"city": '
    view.add_tool_call(ToolCall(3, raw, error="unterminated JSON object at offset 44"))
    tool = view.entry_widgets()[0]
    assert tool.header.text() == "Tool call (could not be read)"
    assert "unterminated JSON object" in tool.text() and raw in tool.text()
    assert tool.property("failed") is True


def test_model_text_is_never_markup(view: TranscriptView) -> None:
    view.add_assistant_delta(assistant("<b>bold</b> & <a href='x'>link</a>"))
    entry = view.entry_widgets()[0]
    assert entry.body.textFormat() == Qt.TextFormat.PlainText
    assert entry.text() == "<b>bold</b> & <a href='x'>link</a>"


def test_clear_returns_to_the_placeholder(view: TranscriptView, qtbot: QtBot) -> None:
    view.add_user_delta(user("Hi"))
    view.clear()
    assert view.entries() == []
    assert view.placeholder.isVisible()


def test_window_streams_events_into_the_transcript(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    fake.queue(user("Hi"), user(" there"), assistant(" Hello!"), ToolCall(1, "{}", "lookup", {}))
    window.pump.drain()
    transcript = window.conversation.transcript
    assert transcript.entries()[:2] == [(Role.USER, "Hi there"), (Role.ASSISTANT, "Hello!")]
    assert transcript.entries()[2][0] is Role.TOOL
    # The old conversation's last words may still be on their way: the view clears when the new one starts.
    fake.queue(assistant(" late words of the old conversation"))
    window.menu_actions.new_conversation.trigger()
    assert fake.calls_to("new_conversation") == [()]
    window.pump.drain()
    assert transcript.entries() == []
