"""The state indicator: a word and a distinct shape for every AppState, announced through its label."""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QImage, QPainter, qAlpha, qGray
from pytestqt.qtbot import QtBot

from app.messages import AppState, EngineState
from ui import glyphs, state_indicator, theme
from ui.app_window import MainWindow
from ui.state_indicator import STATE_HINT, STATE_TEXT, StateIndicator
from ui.theme import ThemeColors

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


def ink(image: QImage) -> bytes:
    """Where the picture is dark, pixel by pixel: its shape, with every colour and shade of grey taken out."""
    grey = image.convertToFormat(QImage.Format.Format_ARGB32)
    return bytes(
        int(qAlpha(pixel := grey.pixel(x, y)) > 127 and qGray(pixel) < 128)
        for y in range(grey.height())
        for x in range(grey.width())
    )


def one_colour_theme() -> ThemeColors:
    """The theme with every colour a glyph is drawn in made black: what is left to tell states apart is shape."""
    names = ("muted", "accent", "success", "talk_active", "warning", "danger")
    return dataclasses.replace(theme.colors(), **dict.fromkeys(names, "#000000"))


def test_the_shape_comparison_ignores_colour() -> None:
    """The check below can fail: one glyph in two colours is one shape."""
    shapes = set()
    for colour in ("#d03030", "#3050d0"):
        image = QImage(22, 22, QImage.Format.Format_ARGB32)
        image.fill(QColor("#ffffff"))
        painter = QPainter(image)
        glyphs.hollow_circle(painter, QRectF(1, 1, 20, 20), QColor(colour))
        painter.end()
        shapes.add(ink(image))
    assert len(shapes) == 1


def test_every_state_has_a_different_shape_not_only_a_colour(
    indicator: StateIndicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drawn all in one colour, the icon still differs for every pair of states."""
    monkeypatch.setattr(state_indicator, "colors", one_colour_theme)
    renderings: dict[bytes, AppState] = {}
    for state in AppState:
        indicator.set_state(state)
        shape = ink(indicator.icon.grab().toImage())
        assert shape not in renderings, f"{state.name} has the shape of {renderings.get(shape)}"
        assert any(shape), f"{state.name} draws nothing"
        renderings[shape] = state


def test_window_shows_state_changes(window: MainWindow) -> None:
    assert window.indicator.text() == "Ready"  # the fake loaded its model on start()
    window.controller.queue(EngineState(AppState.FALLING_BEHIND, conversation=True))  # type: ignore[attr-defined]
    window.pump.drain()
    assert window.indicator.text() == "Falling behind"
    assert "keeping up" in window.indicator.detail()
