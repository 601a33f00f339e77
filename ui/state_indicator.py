"""The state indicator: a distinct shape and a word for every ``AppState`` (never colour alone).

Each state change updates the label's accessible name and is announced to screen
readers (polite, or assertive for errors and falling behind). Main thread only.
"""

from __future__ import annotations

from typing import Final

from PySide6.QtCore import QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QAccessible, QAccessibleAnnouncementEvent, QAccessibleEvent, QColor, QPainter, QPaintEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QWidget

from app.messages import AppState

from . import glyphs
from .theme import colors

# The words shown (and announced) for each state.
STATE_TEXT: Final[dict[AppState, str]] = {
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

# What the state means when the app core sends no detail of its own.
STATE_HINT: Final[dict[AppState, str]] = {
    AppState.NO_MODEL: "Download or choose a model to start",
    AppState.LOADING: "This can take a minute for the full model",
    AppState.READY: "",
    AppState.LISTENING: "Your microphone is live",
    AppState.SPEAKING: "",
    AppState.FALLING_BEHIND: "This computer is not keeping up with real time",
    AppState.PAUSED: "No frames run — press the talk key to wake it",
    AppState.NO_AUDIO: "Connect a microphone and a speaker",
    AppState.ERROR: "See the message above",
}

_URGENT: Final = {AppState.ERROR, AppState.FALLING_BEHIND, AppState.NO_AUDIO}


class StateIcon(QWidget):
    """The shape for one state, painted; the loading spinner turns while visible."""

    def __init__(self, parent: QWidget | None = None, size: int = 22) -> None:
        super().__init__(parent)
        self._state = AppState.NO_MODEL
        self._angle = 0.0
        self._size = size
        self._spin = QTimer(self)
        self._spin.setInterval(50)
        self._spin.timeout.connect(self._advance)
        self.setFixedSize(size, size)
        self.setAccessibleName("")  # the label next to it carries the meaning

    def sizeHint(self) -> QSize:
        return QSize(self._size, self._size)

    def set_state(self, state: AppState) -> None:
        self._state = state
        if state is AppState.LOADING:
            self._spin.start()
        else:
            self._spin.stop()
        self.update()

    def _advance(self) -> None:
        self._angle = (self._angle + 24.0) % 360.0
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        theme = colors()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        white = QColor("#ffffff")
        state = self._state
        if state is AppState.NO_MODEL:
            glyphs.hollow_circle(painter, rect, theme.qcolor("muted"))
        elif state is AppState.LOADING:
            glyphs.spinner(painter, rect, theme.qcolor("accent"), self._angle)
        elif state is AppState.READY:
            glyphs.check_circle(painter, rect, theme.qcolor("success"), white)
        elif state is AppState.LISTENING:
            glyphs.microphone(painter, rect, theme.qcolor("talk_active"))
        elif state is AppState.SPEAKING:
            glyphs.speaker(painter, rect, theme.qcolor("accent"))
        elif state is AppState.FALLING_BEHIND:
            glyphs.warning_triangle(painter, rect, theme.qcolor("warning"), white)
        elif state is AppState.PAUSED:
            glyphs.pause_bars(painter, rect, theme.qcolor("muted"))
        elif state is AppState.NO_AUDIO:
            glyphs.speaker_muted(painter, rect, theme.qcolor("warning"))
        else:
            glyphs.cross_octagon(painter, rect, theme.qcolor("danger"), white)
        painter.end()


class StateIndicator(QWidget):
    """Icon, state word and a short explanation, in one row."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state = AppState.NO_MODEL
        self._detail = ""
        self.icon = StateIcon(self)
        self.label = QLabel(self)
        self.label.setProperty("role", "state")
        self.detail_label = QLabel(self)
        self.detail_label.setProperty("role", "muted")
        self.detail_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.detail_label.setMinimumWidth(40)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignVCenter)
        layout.addWidget(self.label, 0, Qt.AlignmentFlag.AlignVCenter)
        layout.addWidget(self.detail_label, 1, Qt.AlignmentFlag.AlignVCenter)
        self.setAccessibleName("App state")
        self._show(announce=False)

    @property
    def state(self) -> AppState:
        return self._state

    def text(self) -> str:
        """The state word as shown, e.g. ``"Listening"``."""
        return self.label.text()

    def detail(self) -> str:
        return self.detail_label.text()

    def set_state(self, state: AppState, detail: str = "") -> None:
        """Show ``state``; ``detail`` (from the app core) replaces the default explanation.

        Only a change of state is announced; detail updates (load progress) are not, so a
        screen reader is not flooded.
        """
        changed = state is not self._state
        self._state = state
        self._detail = detail
        self._show(announce=changed)

    def _show(self, *, announce: bool) -> None:
        word = STATE_TEXT[self._state]
        detail = self._detail or STATE_HINT[self._state]
        self.icon.set_state(self._state)
        self.label.setText(word)
        self.detail_label.setText(detail)
        self.detail_label.setToolTip(detail)
        spoken = f"{word}. {detail}" if detail else word
        self.label.setAccessibleName(f"State: {word}")
        self.label.setAccessibleDescription(detail)
        self.setToolTip(spoken)
        if announce and QAccessible.isActive():
            QAccessible.updateAccessibility(QAccessibleEvent(self.label, QAccessible.Event.NameChanged))
            announcement = QAccessibleAnnouncementEvent(self.label, spoken)
            if self._state in _URGENT:
                announcement.setPoliteness(QAccessible.AnnouncementPoliteness.Assertive)
            QAccessible.updateAccessibility(announcement)
