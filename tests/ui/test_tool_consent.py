"""The consent prompt in the window: the call shown with its arguments, Allow and Deny by button and keyboard,
requests in line, a timed-out one removed, and the transcript's tool entries. Screenshots go to /tmp/h52-shots/."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.messages import ConsentClosed, ConsentRequest, TimerDone, ToolActivity, ToolResponseTiming, ToolTurnHeard
from engine.events import AssistantTextDelta, ToolCall, UserTranscriptDelta
from tests.fakes import FakeController
from ui.transcript_view import Role

SHOTS = Path("/tmp/h52-shots")


def shoot(widget, name: str) -> None:
    QApplication.processEvents()  # lay out what was just added
    QApplication.processEvents()
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert widget.grab().save(str(SHOTS / f"{name}.png"))


def press(window, key: Qt.Key) -> None:
    """Ctrl+``key`` as the window system delivers it (through the window, where shortcuts are matched)."""
    QTest.keyClick(window.windowHandle(), key, Qt.KeyboardModifier.ControlModifier)


def request(request_id: int, tool: str = "read_note", arguments: dict | None = None) -> ConsentRequest:
    arguments = {"title": "Shopping list", "folder": "~/notes"} if arguments is None else arguments
    return ConsentRequest(request_id, tool, "notes", arguments, 30.0)


def activity(tool: str, decision: str, ok: bool, content: str, consent_s: float = 0.0) -> ToolActivity:
    return ToolActivity(
        12, tool, {"title": "Shopping list"}, "", decision, ok, content, "2026-12-07T23:50:00+00:00", consent_s, 0.04
    )


def test_allow_and_deny_answer_the_controller_and_the_transcript_shows_every_step(
    make_window, fake: FakeController, qtbot: QtBot
) -> None:
    window = make_window(fake)
    window.show_conversation()
    window.resize(980, 820)
    window.activateWindow()
    qtbot.waitActive(window)
    page = window.conversation
    call = ToolCall(12, '{"name":"read_note"}', "read_note", {"title": "Shopping list", "folder": "~/notes"})
    fake.queue(
        UserTranscriptDelta(3, "What is on my shopping list?", ""),
        call,
        request(1),
        request(2, "set_timer", {"seconds": 300, "label": "tea"}),
    )
    window.pump.drain()
    prompt = page.consent
    assert prompt.isVisible() and prompt.pending() == 2
    assert "read_note" in prompt.title.text() and "notes" in prompt.title.text()
    assert '"title": "Shopping list"' in prompt.arguments.text()
    assert "1 more waiting" in prompt.countdown.text() and "denied in 30 s" in prompt.countdown.text()
    shoot(window, "consent-prompt-window")
    shoot(prompt, "consent-prompt")

    qtbot.mouseClick(prompt.allow_button, Qt.MouseButton.LeftButton)
    assert fake.calls_to("answer_consent") == [(1, True)]
    assert prompt.isVisible() and "set_timer" in prompt.title.text(), "the next request takes its place"
    press(window, Qt.Key.Key_D)  # Ctrl+D denies
    assert fake.calls_to("answer_consent") == [(1, True), (2, False)]
    assert not prompt.isVisible()

    fake.queue(
        ConsentClosed(1, "allowed"),
        activity("read_note", "allowed by you", True, "eggs, milk, coffee", consent_s=2.4),
        ToolResponseTiming(14, 1, 23, 0.31, 2.9, 30),
        ToolTurnHeard(15, 3.4),
        AssistantTextDelta(15, 7, " You need eggs, milk and coffee.", ""),
        activity("set_timer", "denied by you", False, "the user denied this call", consent_s=1.2),
        TimerDone("tea", 300, 40),
    )
    window.pump.drain()
    entries = page.transcript.entries()
    tools = [text for role, text in entries if role is Role.TOOL]
    headers = [w.header.text() for w in page.transcript.entry_widgets() if w.role is Role.TOOL]
    assert headers == [
        "Tool call · read_note",
        "Tool result · read_note · allowed by you after 2 s · 0.04 s",
        "The assistant heard back",
        "Tool not run · set_timer · denied by you after 1 s · 0.04 s",
        "Timer done",
    ]
    assert "eggs, milk, coffee" in tools[1] and "the tool turn took 2.9 s" in tools[2]
    assert tools[2].endswith("its first sound came 3.4 s after the call")
    assert tools[3] == "the user denied this call" and tools[4] == "tea (5 min)"
    failed = [w.property("failed") for w in page.transcript.entry_widgets() if w.role is Role.TOOL]
    assert failed == [False, False, False, True, False]
    window.resize(980, 1400)
    shoot(window, "transcript-tool-entries")


def test_keyboard_allow_and_a_request_that_timed_out(make_window, fake: FakeController, qtbot: QtBot) -> None:
    window = make_window(fake)
    window.show_conversation()
    window.activateWindow()
    qtbot.waitActive(window)
    prompt = window.conversation.consent
    fake.queue(request(7), request(8))
    window.pump.drain()
    fake.queue(ConsentClosed(7, "not answered"))  # the first timed out in the runner: it leaves the prompt
    window.pump.drain()
    assert prompt.current is not None and prompt.current.request_id == 8
    press(window, Qt.Key.Key_Return)  # Ctrl+Return allows
    assert fake.calls_to("answer_consent") == [(8, True)]
    assert not prompt.isVisible()


def test_a_new_conversation_drops_waiting_requests(make_window, fake: FakeController) -> None:
    window = make_window(fake)
    window.show_conversation()
    fake.queue(request(3))
    window.pump.drain()
    assert window.conversation.consent.isVisible()
    window.handle_conversation_cleared(None)  # type: ignore[arg-type]
    assert not window.conversation.consent.isVisible() and fake.calls_to("answer_consent") == []


def test_settings_tools_tab_adds_a_server_lists_its_tools_and_saves_the_choices(
    fake: FakeController, qtbot: QtBot
) -> None:
    from app.messages import ToolsListed
    from app.tools.config import ToolEntry
    from ui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(fake)
    qtbot.addWidget(dialog)
    dialog.resize(720, 860)
    dialog.show()
    page = dialog.tools_page
    dialog.tabs.setCurrentWidget(page)
    assert not page.offer_check.isChecked() and not page.table.isEnabled(), "tools are off until chosen"
    page.offer_check.setChecked(True)
    assert page.tool_rows() == [
        ("current_time", "built-in", True, "Default (always allow)"),
        ("set_timer", "built-in", True, "Default (ask every time)"),
    ]

    page.server_name.setText("notes")
    page.server_where.setText("uvx 'mcp server notes' --root ~/notes")
    qtbot.mouseClick(page.add_button, Qt.MouseButton.LeftButton)
    [server] = page.config.servers
    assert server.command == ("uvx", "mcp server notes", "--root", "~/notes") and server.url is None
    page.server_name.setText("bad name")
    page.server_where.setText("x")
    qtbot.mouseClick(page.add_button, Qt.MouseButton.LeftButton)
    assert "could not be added" in dialog.error.text() and "no spaces" in dialog.error.text()
    assert page.server_name.text() == "bad name", "what was typed stays"

    page.list_tools("notes")
    assert fake.calls_to("list_server_tools") == [("notes",)]
    listed = (ToolEntry("read_note", "Read a note.", read_only=True), ToolEntry("delete_note", "Delete a note."))
    page.show_listed(ToolsListed("notes", listed))
    rows = page.tool_rows()
    assert rows[2:] == [
        ("read_note", "notes", True, "Default (always allow)"),
        ("delete_note", "notes", True, "Default (ask every time)"),
    ]
    # Never for delete_note, the timer off.
    consent = page.table.cellWidget(3, 3)
    consent.setCurrentIndex(consent.findData("never"))
    page.table.cellWidget(1, 2).setChecked(False)
    shoot(dialog, "settings-tools-tab")
    dialog.accept()
    saved = fake.calls_to("apply_tools_config")[-1][0]
    assert saved.offer_tools and saved.server("notes").tool("delete_note").consent == "never"
    assert saved.builtin["set_timer"].enabled is False
