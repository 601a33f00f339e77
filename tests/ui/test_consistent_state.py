"""One state, shown the same everywhere: with no sound device, with a device unplugged, while loading,
and when a whole reload arrives in one poll, with nothing but the event pump's timer to show it.

(A module of its own: ``test_main_window``'s ``run_gui`` test quits the application, after which
Qt timers in this process no longer fire.)
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.messages import AppState, EngineState, LoadProgress
from tests.fakes import FakeController
from ui.app_window import MainWindow


def talk_calls(fake: FakeController) -> list[bool]:
    return [args[0] for args in fake.calls_to("set_talking")]


def press_talk_key(window: MainWindow) -> None:
    for kind in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease):
        QApplication.sendEvent(window, QKeyEvent(kind, Qt.Key.Key_Space, Qt.KeyboardModifier.NoModifier, " "))


def test_with_no_sound_device_everything_says_so(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    fake.set_devices(None, None, "No microphone found. Connect one or check the sound settings.")
    window.pump.drain()
    assert window.indicator.text() == "No sound device"
    assert window.indicator.detail() == "No microphone found. Connect one or check the sound settings."
    assert window.device_label.text() == "No microphone or speaker", "not 'default microphone'"
    assert window.conversation.mic_meter.caption.text() == "No microphone"
    talk = window.conversation.talk
    assert not talk.button.isEnabled() and talk.hint.text() == "Connect a microphone and a speaker to talk"
    press_talk_key(window)
    assert talk_calls(fake) == [] and window.indicator.text() == "No sound device", "never 'Listening'"
    assert "no microphone or speaker" in window.conversation.overlay.waiting_text
    assert window.header.model_chip.isVisibleTo(window), "the model is still loaded, and says so"


def test_a_device_unplugged_while_talking_stops_talking_and_says_so(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    QApplication.sendEvent(window, QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_Space, Qt.KeyboardModifier.NoModifier))
    window.pump.drain()
    assert window.indicator.text() == "Listening" and talk_calls(fake) == [True]
    fake.set_devices(None, None, "The microphone 'USB Headset' stopped working. Audio is paused.")
    window.pump.drain()
    assert talk_calls(fake) == [True, False]
    assert window.indicator.text() == "No sound device" and "stopped working" in window.indicator.detail()
    fake.set_devices("Built-in Microphone", "Built-in Speakers")
    window.pump.drain()
    assert window.indicator.text() == "Ready" and window.conversation.talk.button.isEnabled()


def test_while_loading_nothing_claims_a_model(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    window.statusBar().clearMessage()
    fake.queue(EngineState(AppState.LOADING, "Loading VoiceChat-8bit…"), LoadProgress(0.4, "Reading weights"))
    window.pump.drain()
    assert window.indicator.text() == "Loading model…" and window.indicator.detail() == "Reading weights (40%)"
    assert not window.header.model_chip.isVisibleTo(window) and not window.header.demo_badge.isVisibleTo(window)
    assert not window.conversation.talk.button.isEnabled()
    assert not window.menu_actions.export_profile.isEnabled()
    assert window.statusBar().currentMessage() == "", "no 'Loaded …' before the load is done"
    assert window.status.model is None and not window.status.conversation


def test_a_whole_reload_in_one_poll_ends_ready_without_any_input_event(
    window: MainWindow, fake: FakeController, qtbot: QtBot
) -> None:
    """The issue's stuck 'Loading model… / preparing the engine': a reload whose reports all arrive in one poll."""
    window.show_conversation()
    window.pump.start()  # only the pump's timer from here: no key, no pointer, no manual drain
    fake.switch_variant("8bit")  # loading, progress, speed check, loaded and ready, all queued at once
    qtbot.waitUntil(lambda: window.header.model_chip.text().endswith("8-bit"), timeout=2000)
    assert window.indicator.text() == "Ready" and window.status.model is not None
    assert window.statusBar().currentMessage().startswith("Loaded ") and window.conversation.talk.button.isEnabled()
    window.pump.stop()
