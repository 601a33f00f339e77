"""A sleeping conversation wakes with ONE press of the talk control, in hands-free and in toggle mode.

Falling asleep (the idle pause, or Stop) closes the microphone; a talk control left "open" would make the first
press close a microphone that is already closed, and only the second wake the conversation. Counted in calls
to ``set_talking`` and presses, not time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from app.messages import AppState, EngineState, GlobalTalk
from app.settings import Settings
from tests.fakes import FakeController, ScriptedAudio
from tests.ui.test_talk_button import press, release
from ui.app_window import MainWindow

IDLE_SLEEP = EngineState(AppState.PAUSED, "Nobody has spoken for 30 s.", conversation=True)


def _stop(window: MainWindow, fake: FakeController) -> None:
    window.menu_actions.stop_speaking.trigger()


def _idle(window: MainWindow, fake: FakeController) -> None:
    fake.queue(IDLE_SLEEP)  # the worker's idle pause


def _key(window: MainWindow, fake: FakeController) -> None:
    press(window)
    release(window)


def _button(window: MainWindow, fake: FakeController) -> None:
    window.conversation.talk.button.pressed.emit()
    window.conversation.talk.button.released.emit()


def _global(window: MainWindow, fake: FakeController) -> None:
    fake.queue(GlobalTalk(True))  # the key in another app (toggle: every event is a press)
    window.pump.drain()


Step = Callable[[MainWindow, FakeController], None]


@pytest.mark.parametrize("hands_free", [True, False], ids=["hands-free", "toggle"])
@pytest.mark.parametrize("sleep", [_stop, _idle], ids=["stop", "idle-pause"])
@pytest.mark.parametrize("wake", [_key, _button, _global], ids=["key", "button", "global-key"])
def test_one_press_wakes_a_sleeping_conversation(
    window: MainWindow, fake: FakeController, hands_free: bool, sleep: Step, wake: Step
) -> None:
    window.show_conversation()
    window.apply_ui_settings(fake.settings.with_changes(hands_free=hands_free, talk_mode="toggle"))
    talk = window.conversation.talk
    assert talk.mode == "toggle" and talk.hands_free is hands_free
    _key(window, fake)  # open the microphone: the conversation starts
    window.pump.drain()
    assert talk.talking and window.status.conversation and window.status.state is not AppState.PAUSED

    sleep(window, fake)
    window.pump.drain()
    assert window.status.state is AppState.PAUSED

    wake(window, fake)  # ONE press
    window.pump.drain()
    assert window.status.state is not AppState.PAUSED, "one press wakes the conversation"
    assert talk.talking and fake.calls_to("set_talking")[-1] == (True,), "with the microphone open"


@pytest.mark.parametrize("hands_free", [True, False], ids=["hands-free", "toggle"])
def test_asleep_the_talk_control_shows_the_microphone_closed(
    window: MainWindow, fake: FakeController, hands_free: bool
) -> None:
    window.show_conversation()
    window.apply_ui_settings(fake.settings.with_changes(hands_free=hands_free, talk_mode="toggle"))
    talk = window.conversation.talk
    _key(window, fake)
    window.pump.drain()
    _stop(window, fake)
    window.pump.drain()
    assert window.status.state is AppState.PAUSED
    assert not talk.talking and not talk.button.talking, "asleep, the microphone is closed: so is the control"
    assert fake.calls_to("set_talking") == [(True,), (False,)], "and the controller heard so"
    assert talk.hint.text() == (
        "Press Space or the button to open the microphone" if hands_free else "Press Space or the button to talk"
    )


def test_a_held_key_is_not_let_go_by_a_sleep_in_hold_mode(window: MainWindow, fake: FakeController) -> None:
    """Hold mode has no open state to close: the key's own release ends the turn."""
    window.show_conversation()
    window.apply_ui_settings(fake.settings.with_changes(hands_free=False, talk_mode="hold"))
    talk = window.conversation.talk
    press(window)
    window.pump.drain()
    fake.queue(IDLE_SLEEP)
    window.pump.drain()
    assert talk.talking and fake.calls_to("set_talking") == [(True,)]
    release(window)
    assert not talk.talking and fake.calls_to("set_talking") == [(True,), (False,)]


def test_hands_free_one_press_wakes_the_real_core(
    qtbot: QtBot, build_controller: Callable[..., Any], tiny_q4: Path
) -> None:
    """The window over the real controller and worker (tiny checkpoint, scripted microphone): after Stop, frames
    run again after one press of the talk key."""
    settings = Settings(
        checkpoints={"4bit": tiny_q4}, active_variant="4bit", idle_pause=False, hands_free=True, theme="light"
    )
    controller = build_controller(settings, audio=EchoReadyAudio)
    window = MainWindow(controller)
    qtbot.addWidget(window)
    window.show()
    window.start()
    audio = controller.audio
    try:
        qtbot.waitUntil(lambda: window.status.model is not None, timeout=REAL_CORE_WAIT_MS)
        window.show_conversation()
        talk = window.conversation.talk
        assert talk.hands_free and controller.board.hands_free
        press(window)  # opens the microphone: the conversation starts
        release(window)
        qtbot.waitUntil(lambda: len(audio.frames_read) >= 4, timeout=REAL_CORE_WAIT_MS)

        window.menu_actions.stop_speaking.trigger()
        qtbot.waitUntil(lambda: window.status.state is AppState.PAUSED, timeout=REAL_CORE_WAIT_MS)
        assert not audio.capturing and not talk.talking and not controller.talking
        asleep_at = len(audio.frames_read)

        press(window)  # ONE press
        release(window)
        qtbot.waitUntil(lambda: len(audio.frames_read) >= asleep_at + 4, timeout=REAL_CORE_WAIT_MS)
        assert talk.talking and controller.talking and audio.capturing
        assert window.status.state is not AppState.PAUSED
    finally:
        window.pump.stop()


REAL_CORE_WAIT_MS = 120_000  # generous: the machine's cores are shared; nothing here measures time


class EchoReadyAudio(ScriptedAudio):
    """The scripted devices, taking the echo canceller hands-free hands them (it is not used: no real sound)."""

    def set_echo_canceller(self, canceller: object) -> None:
        self.echo = canceller
