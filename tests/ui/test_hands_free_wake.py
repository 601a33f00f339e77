"""A sleeping conversation wakes with ONE press of the talk control, in hands-free and in toggle mode.

Falling asleep (the idle pause, or Stop) closes the microphone; a talk control left "open" would make the first
press close a microphone that is already closed, and only the second wake the conversation. Counted in calls
to ``set_talking`` and presses, not time.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.messages import AppState, EngineState, GlobalTalk
from tests.fakes import FakeController
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
    assert not talk.talking, "asleep, the microphone is closed: the control shows it closed"
    assert fake.calls_to("set_talking")[-1] == (False,), "and the controller heard so"
    calls = len(fake.calls_to("set_talking"))

    wake(window, fake)  # ONE press
    window.pump.drain()
    assert fake.calls_to("set_talking")[calls:] == [(True,)], "the press opens the microphone, nothing else"
    assert talk.talking and window.status.state is not AppState.PAUSED, "and the conversation is awake"


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
