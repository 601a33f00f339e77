"""The assistant's volume, mute and stop, under the Assistant meter.

Volume and mute act at once (``controller.set_volume``), and the controller remembers them
between launches. Stop drops what the assistant was about to say; it speaks again after
the user's next turn. Every output also passes the limiter in ``app.audio.output``, so no
setting here can make it louder than the ceiling. Main thread only.
"""

from __future__ import annotations

import logging
from typing import Final

from PySide6.QtCore import QEvent, QRectF, QSize, Qt
from PySide6.QtGui import QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QToolButton, QWidget

from app.settings import Settings

from . import glyphs
from .contracts import Controller
from .theme import colors

log = logging.getLogger(__name__)

ICON_SIZE: Final = 18


def _glyph_icon(muted: bool) -> QIcon:
    pixmap = QPixmap(ICON_SIZE * 2, ICON_SIZE * 2)
    pixmap.setDevicePixelRatio(2.0)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    rect = QRectF(0, 0, ICON_SIZE, ICON_SIZE)
    colour = colors().qcolor("muted" if muted else "text")
    (glyphs.speaker_muted if muted else glyphs.speaker)(painter, rect, colour)
    painter.end()
    return QIcon(pixmap)


class VolumeControl(QWidget):
    """Mute button, volume slider with its percentage, and the Stop button."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self.mute_button = QToolButton(self)
        self.mute_button.setCheckable(True)
        self.mute_button.setIconSize(QSize(ICON_SIZE, ICON_SIZE))
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.slider.setRange(0, 100)
        self.slider.setPageStep(10)
        self.slider.setAccessibleName("Assistant volume")
        self.slider.setMinimumWidth(80)
        self.value_label = QLabel(self)
        self.value_label.setProperty("role", "muted")
        self.value_label.setMinimumWidth(34)
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setAccessibleName("Stop the assistant")
        self.stop_button.setToolTip(
            "Stop the assistant now (Esc): drops what it was about to say. It speaks again after your next turn."
        )
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(self.mute_button)
        layout.addWidget(self.slider, 1)
        layout.addWidget(self.value_label)
        layout.addWidget(self.stop_button)
        self.load(controller.settings)
        self.slider.valueChanged.connect(self._changed)
        self.mute_button.toggled.connect(self._changed)
        self.stop_button.clicked.connect(self.stop)

    @property
    def volume(self) -> float:
        return self.slider.value() / 100.0

    @property
    def muted(self) -> bool:
        return self.mute_button.isChecked()

    def load(self, settings: Settings) -> None:
        """Show the saved volume and mute (without sending them back)."""
        self.slider.blockSignals(True)
        self.mute_button.blockSignals(True)
        self.slider.setValue(round(settings.volume * 100))
        self.mute_button.setChecked(settings.muted)
        self.slider.blockSignals(False)
        self.mute_button.blockSignals(False)
        self._show()

    def toggle_mute(self) -> None:
        self.mute_button.toggle()

    def stop(self) -> None:
        try:
            self._controller.stop_speaking()
        except Exception:  # the window stays usable; the log has it
            log.exception("stop_speaking failed")

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.StyleChange):
            self._show()  # the speaker icon is painted in the theme's colours

    def _changed(self) -> None:
        self._show()
        try:
            self._controller.set_volume(self.volume, self.muted)
        except Exception:
            log.exception("set_volume failed")

    def _show(self) -> None:
        muted = self.muted
        percent = self.slider.value()
        self.value_label.setText("muted" if muted else f"{percent} %")
        self.mute_button.setIcon(_glyph_icon(muted))
        self.mute_button.setAccessibleName("Unmute the assistant" if muted else "Mute the assistant")
        self.mute_button.setToolTip(
            "Unmute the assistant (Ctrl+M)" if muted else "Mute the assistant (Ctrl+M); the conversation keeps running"
        )
        self.slider.setToolTip(
            f"Assistant volume: {percent} %. Loud moments are limited so nothing is played above -6 dBFS."
        )
        self.slider.setAccessibleDescription("muted" if muted else f"{percent} percent")
