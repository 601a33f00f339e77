"""The state indicator: a word and a distinct shape for every AppState, announced through its label."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QImage
from pytestqt.qtbot import QtBot

from app.messages import AppState, EngineState
from ui.app_window import MainWindow
from ui.state_indicator import STATE_HINT, STATE_TEXT, StateIndicator

EXPECTED_WORDS = {
    AppState.NO_MODEL: "No model",
    AppState.LOADING: "Loading model…",
    AppState.READY: "Ready",
    AppState.LISTENING: "Listening",
    AppState.SPEAKING: "Assistant speaking",
    AppState.FALLING_BEHIND: "Falling behind",
    AppState.PAUSED: "Asleep",
    AppState.NO_AUDIO: "No sound device",
    AppState.ERROR: "Error",
}


@pytest.fixture
def indicator(qtbot: QtBot) -> StateIndicator:
    widget = StateIndicator()
    qtbot.addWidget(widget)
    widget.show()
    return widget


@pytest.mark.parametrize("state", list(AppState), ids=[s.name for s in AppState])
def test_each_state_has_its_word(indicator: StateIndicator, state: AppState) -> None:
    indicator.set_state(state)
    assert indicator.text() == EXPECTED_WORDS[state] == STATE_TEXT[state]
    assert indicator.state is state
    assert indicator.label.accessibleName() == f"State: {EXPECTED_WORDS[state]}"
    assert indicator.detail() == STATE_HINT[state]


def test_detail_from_the_app_core_replaces_the_hint(indicator: StateIndicator) -> None:
    indicator.set_state(AppState.LOADING, "Reading weights (3 of 5)")
    assert indicator.detail() == "Reading weights (3 of 5)"
    assert indicator.label.accessibleDescription() == "Reading weights (3 of 5)"
    assert "Reading weights" in indicator.toolTip()


def test_every_state_has_a_different_shape_not_only_a_colour(indicator: StateIndicator) -> None:
    """Grey-scale renderings of the icon differ for every pair of states."""
    renderings: dict[bytes, AppState] = {}
    for state in AppState:
        indicator.set_state(state)
        image = indicator.icon.grab().toImage().convertToFormat(QImage.Format.Format_Grayscale8)
        data = bytes(image.constBits())
        assert data not in renderings, f"{state.name} looks like {renderings.get(data)}"
        renderings[data] = state


def test_window_shows_state_changes(window: MainWindow) -> None:
    assert window.indicator.text() == "Ready"  # the fake loaded its model on start()
    window.controller.queue(EngineState(AppState.FALLING_BEHIND, conversation=True))  # type: ignore[attr-defined]
    window.pump.drain()
    assert window.indicator.text() == "Falling behind"
    assert "keeping up" in window.indicator.detail()
