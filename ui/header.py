"""The window's header row: the state indicator, then chips for the model and the time left."""

from __future__ import annotations

from typing import Final

from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from app.messages import ModelLoaded

from .state_indicator import StateIndicator
from .theme import repolish

LOW_TIME_S: Final = 60.0


def _chip(parent: QWidget, name: str = "Chip") -> QLabel:
    chip = QLabel(parent)
    chip.setObjectName(name)
    chip.hide()
    return chip


def format_time_left(remaining_s: float) -> str:
    """``"3:55 left"``, or ``"Time is up"``."""
    if remaining_s <= 0:
        return "Time is up"
    minutes, seconds = divmod(int(remaining_s + 0.5), 60)
    return f"{minutes}:{seconds:02d} left"


class HeaderBar(QWidget):
    """State on the left; demo badge, model and remaining conversation time on the right."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.indicator = StateIndicator(self)
        self.model_chip = _chip(self)
        self.model_chip.setAccessibleName("Loaded model")
        self.demo_badge = _chip(self, "DemoBadge")
        self.demo_badge.setText("Demo — noise, not speech")
        self.demo_badge.setToolTip("A tiny random-weight model: it makes quiet noise, not speech")
        self.time_chip = _chip(self)
        self.time_chip.setAccessibleName("Conversation time left")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addWidget(self.indicator, 1)
        layout.addWidget(self.demo_badge)
        layout.addWidget(self.model_chip)
        layout.addWidget(self.time_chip)

    def show_model(self, loaded: ModelLoaded | None) -> None:
        """Show the loaded model ("name · 4-bit", or the demo badge); nothing while none is loaded."""
        if loaded is None:
            self.model_chip.hide()
            self.demo_badge.hide()
            return
        self.model_chip.setText(loaded.description)
        self.model_chip.setToolTip(str(loaded.path))
        self.model_chip.setVisible(not loaded.variant.demo)  # the demo badge says it all
        self.demo_badge.setVisible(loaded.variant.demo)

    def show_time_left(self, remaining_s: float) -> None:
        chip = self.time_chip
        chip.setText(format_time_left(remaining_s))
        chip.setProperty("level", "danger" if remaining_s <= 0 else "warning" if remaining_s < LOW_TIME_S else "")
        repolish(chip)
        chip.show()

    def hide_time_left(self) -> None:
        self.time_chip.hide()
