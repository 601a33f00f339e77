"""Push-to-talk: the talk key anywhere in the window and the button, in hold and toggle mode."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication, QLineEdit, QWidget
from pytestqt.qtbot import QtBot

from app.messages import AppState, StateChanged
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.talk_button import parse_talk_key


def talking_calls(fake: FakeController) -> list[bool]:
    return [args[0] for args in fake.calls_to("set_talking")]


def send_key(
    widget: QWidget,
    kind: QEvent.Type,
    key: Qt.Key = Qt.Key.Key_Space,
    modifiers: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier,
    *,
    auto_repeat: bool = False,
) -> None:
    text = " " if key == Qt.Key.Key_Space else ""
    QApplication.sendEvent(widget, QKeyEvent(kind, key, modifiers, text, auto_repeat))


def press(widget: QWidget, **kwargs: object) -> None:
    send_key(widget, QEvent.Type.KeyPress, **kwargs)  # type: ignore[arg-type]


def release(widget: QWidget, **kwargs: object) -> None:
    send_key(widget, QEvent.Type.KeyRelease, **kwargs)  # type: ignore[arg-type]


def test_hold_mode_key_press_and_release(window: MainWindow, fake: FakeController) -> None:
    talk = window.conversation.talk
    press(window)
    assert talking_calls(fake) == [True]
    assert talk.talking and talk.button.talking
    assert talk.hint.text() == "Release to stop"
    release(window)
    assert talking_calls(fake) == [True, False]
    assert not talk.talking
    assert "Hold Space" in talk.hint.text()


def test_auto_repeat_is_ignored(window: MainWindow, fake: FakeController) -> None:
    press(window)
    for _ in range(5):  # what X11 and macOS send while a key is held
        release(window, auto_repeat=True)
        press(window, auto_repeat=True)
    assert talking_calls(fake) == [True]
    release(window)
    assert talking_calls(fake) == [True, False]


def test_key_works_whatever_has_focus_and_is_swallowed(window: MainWindow, fake: FakeController, qtbot: QtBot) -> None:
    focused = window.conversation.transcript.scroll_area
    focused.setFocus()
    press(focused)
    release(focused)
    assert talking_calls(fake) == [True, False]


def test_text_fields_keep_the_talk_key(window: MainWindow, fake: FakeController) -> None:
    field = QLineEdit(window.centralWidget())
    field.show()
    field.setFocus()
    QApplication.processEvents()
    assert QApplication.focusWidget() is field
    press(field)
    release(field)
    assert talking_calls(fake) == []


def test_toggle_mode_key(window: MainWindow, fake: FakeController) -> None:
    talk = window.conversation.talk
    talk.configure("Space", "toggle")
    press(window)
    release(window)
    assert talking_calls(fake) == [True]
    assert talk.hint.text() == "Press Space again to stop"
    press(window, auto_repeat=True)
    press(window)
    release(window)
    assert talking_calls(fake) == [True, False]


def test_button_hold_and_toggle(window: MainWindow, fake: FakeController, qtbot: QtBot) -> None:
    button = window.conversation.talk.button
    centre = QPoint(button.width() // 2, button.height() // 2)
    qtbot.mousePress(button, Qt.MouseButton.LeftButton, pos=centre)
    assert talking_calls(fake) == [True]
    qtbot.mouseRelease(button, Qt.MouseButton.LeftButton, pos=centre)
    assert talking_calls(fake) == [True, False]

    window.conversation.talk.configure("Space", "toggle")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton, pos=centre)
    assert talking_calls(fake) == [True, False, True]
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton, pos=centre)
    assert talking_calls(fake) == [True, False, True, False]


def test_configured_key_with_modifier(window: MainWindow, fake: FakeController) -> None:
    window.conversation.talk.configure("Ctrl+F5", "hold")
    press(window)  # Space is no longer the talk key
    press(window, key=Qt.Key.Key_F5)  # F5 without Ctrl is not it either
    assert talking_calls(fake) == []
    press(window, key=Qt.Key.Key_F5, modifiers=Qt.KeyboardModifier.ControlModifier)
    release(window, key=Qt.Key.Key_F5)  # Ctrl may be let go first
    assert talking_calls(fake) == [True, False]
    assert "Ctrl+F5" in window.conversation.talk.hint.text()


def test_no_talking_without_a_model(window: MainWindow, fake: FakeController) -> None:
    window.handle_state(StateChanged(AppState.LOADING))
    talk = window.conversation.talk
    assert not talk.button.isEnabled()
    assert talk.hint.text() == "Talking starts once the model is loaded"
    press(window)
    release(window)
    assert talking_calls(fake) == []


def test_losing_the_model_while_talking_stops(window: MainWindow, fake: FakeController) -> None:
    press(window)
    window.handle_state(StateChanged(AppState.ERROR, "engine crashed"))
    assert talking_calls(fake) == [True, False]


def test_window_deactivation_releases_a_held_key(window: MainWindow, fake: FakeController) -> None:
    press(window)
    QApplication.sendEvent(window, QEvent(QEvent.Type.WindowDeactivate))
    assert talking_calls(fake) == [True, False]
    release(window)  # the late release changes nothing
    assert talking_calls(fake) == [True, False]


def test_set_talking_failure_shows_a_banner(window: MainWindow, fake: FakeController) -> None:
    fake.fail("set_talking", RuntimeError("audio device is gone"))
    press(window)
    assert any("audio device is gone" in banner.text() for banner in window.banners.banners())
    release(window)
    assert talking_calls(fake) == [True, False]


def test_accessible_names(window: MainWindow) -> None:
    button = window.conversation.talk.button
    assert button.accessibleName() == "Talk"
    assert "Hold Space" in button.accessibleDescription()


def test_parse_talk_key() -> None:
    assert parse_talk_key("Space")[0].key() == Qt.Key.Key_Space
    with pytest.raises(ValueError, match="single key"):
        parse_talk_key("Ctrl+A, Ctrl+B")
    with pytest.raises(ValueError, match="single key"):
        parse_talk_key("")


def test_key_is_left_alone_while_the_talk_control_is_not_shown(window: MainWindow, fake: FakeController) -> None:
    window.show_model_setup()  # the first-run page: Space must reach its buttons
    press(window)
    release(window)
    assert talking_calls(fake) == []
    window.show_conversation()
    press(window)
    assert talking_calls(fake) == [True]


def test_leaving_the_conversation_page_stops_talking(window: MainWindow, fake: FakeController) -> None:
    press(window)
    window.show_model_setup()
    assert talking_calls(fake) == [True, False]
    assert not window.conversation.talk.talking
