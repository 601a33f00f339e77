"""What is not text for people never reaches the transcript window, and key presses do not cut an answer up.

The model's ``<SPECIAL_n>`` markers (inside a tool call that could not be read, too), U+FFFD and
control characters are left out of what the window shows, while the saved transcript keeps the
text as the model produced it. Pressing the talk key again and again while the assistant answers
keeps its answer in one bubble; the user's own words after a press still start a new one.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication, QWidget

from app.export import Transcript
from engine.events import AssistantTextDelta, ToolCall, UserTranscriptDelta
from engine.tools import parse_tool_calls
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.transcript_view import Role

SHOTS = Path(os.environ.get("PARLEY_SHOTS", "/work/shots/h51-profile"))
JUNK = ("<SPECIAL_", "\ufffd", "\x00", "\x07", "\x1b", "\x7f", "\x85")


def user(delta: str, frame: int = 0) -> UserTranscriptDelta:
    return UserTranscriptDelta(frame, delta, "")


def assistant(delta: str, frame: int = 0) -> AssistantTextDelta:
    return AssistantTextDelta(frame, 7, delta, "")


def key(widget: QWidget, kind: QEvent.Type) -> None:
    QApplication.sendEvent(widget, QKeyEvent(kind, Qt.Key.Key_Space, Qt.KeyboardModifier.NoModifier, " ", False))


def shown(window: MainWindow) -> str:
    """Everything the transcript draws: headers and bodies."""
    widgets = window.conversation.transcript.entry_widgets()
    return "\n".join(f"{w.header.text()}\n{w.text()}" for w in widgets)


def test_markers_replacement_and_control_characters_never_reach_the_window_but_stay_in_the_saved_transcript(
    window: MainWindow, fake: FakeController
) -> None:
    window.show_conversation()
    # What the model really produced: a call whose text carries a marker (the "<SPECIAL_27>"), a
    # character split across tokens (decoded as U+FFFD), and stray control characters.
    (unreadable,) = parse_tool_calls('<SPECIAL_27>{"name": "get_weather", "arguments": {"city": "Par\ufffd', 4)
    assert unreadable.error is not None and "<SPECIAL_27>" in unreadable.raw
    # A marker is no reason to call a call unreadable: it is skipped where the JSON is parsed, and kept raw.
    (readable,) = parse_tool_calls('<SPECIAL_27>{"name": "get_time", "arguments": {}}', 6)
    assert readable.error is None and readable.name == "get_time" and readable.raw.startswith("<SPECIAL_27>")
    events = [
        user("What is\x07 the weather\ufffd"),
        user(" in Paris?\x1b", 1),
        assistant("<SPECIAL_12>Let me\x00 check", 2),
        assistant("\ufffd\ufffd the<SPECIAL_3> weather.\x7f\x85", 3),
        unreadable,
        ToolCall(5, "<SPECIAL_20>{}", "lookup<SPECIAL_9>", {"where": "Paris\ufffd"}),
    ]
    fake.queue(*events)
    window.pump.drain()
    transcript = window.conversation.transcript
    assert transcript.entries()[:2] == [
        (Role.USER, "What is the weather in Paris?"),
        (Role.ASSISTANT, "Let me check the weather."),
    ]
    tool_headers = [w.header.text() for w in transcript.entry_widgets() if w.role is Role.TOOL]
    assert tool_headers == ["Tool call (could not be read)", "Tool call · lookup"]
    everything = shown(window)
    assert "get_weather" in everything and '"where": "Paris"' in everything
    assert not [junk for junk in JUNK if junk in everything], repr(everything)
    assert "\n" in transcript.entry_widgets()[2].text(), "line breaks are text: they stay"

    saved = Transcript()
    for event in events:
        saved.add(event)
    markdown = saved.to_markdown()
    for raw in ("<SPECIAL_12>", "<SPECIAL_27>", "\ufffd", "\x07"):
        assert raw in markdown, f"the saved transcript keeps {raw!r} as the model produced it"

    window.conversation.set_overlay_visible(False)  # room for the transcript in the picture
    window.resize(820, 1000)
    QApplication.processEvents()
    transcript.scroll_area.verticalScrollBar().setValue(0)
    QApplication.processEvents()
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert window.grab().save(str(SHOTS / "transcript-junk-filtered.png"))


def test_rapid_presses_do_not_split_an_answer_into_one_word_bubbles(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    fake.start_conversation()  # under way: the presses below do not start a new one
    window.pump.drain()
    fake.queue(user("Tell me about Paris."), assistant("Paris"))
    window.pump.drain()
    for index, word in enumerate((" is", " the", " capital", " of", " France.")):
        key(window, QEvent.Type.KeyPress)  # the user taps the key while the assistant goes on
        key(window, QEvent.Type.KeyRelease)
        fake.queue(assistant(word, index + 1))
        window.pump.drain()
    assert [args[0] for args in fake.calls_to("set_talking")] == [True, False] * 5, "every tap reached the engine"
    transcript = window.conversation.transcript
    assert transcript.entries() == [
        (Role.USER, "Tell me about Paris."),
        (Role.ASSISTANT, "Paris is the capital of France."),
    ]
    # A press followed by the user's words is a new turn of theirs, as before.
    key(window, QEvent.Type.KeyPress)
    fake.queue(user("And Lyon?", 9))
    window.pump.drain()
    key(window, QEvent.Type.KeyRelease)
    key(window, QEvent.Type.KeyPress)
    fake.queue(user("Or Nice?", 10))
    window.pump.drain()
    key(window, QEvent.Type.KeyRelease)
    assert [role for role, _ in transcript.entries()] == [Role.USER, Role.ASSISTANT, Role.USER, Role.USER]
    assert transcript.entries()[2:] == [(Role.USER, "And Lyon?"), (Role.USER, "Or Nice?")]
