"""Input and output level meters: a labelled bar on a dBFS scale with a falling peak marker.

Levels arrive as linear peaks (0..1) from ``app.messages.Levels``; the bar shows them on
a -60..0 dBFS scale, which is how loud things sound. The bar falls back gradually
rather than flickering between blocks. Main thread only.
"""

from __future__ import annotations

import math
import time
from typing import Final

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from .theme import colors

FLOOR_DB: Final = -60.0
FALL_DB_PER_S: Final = 30.0
PEAK_HOLD_S: Final = 1.0
CLIP_DB: Final = -1.0


def peak_to_fraction(peak: float) -> float:
    """A linear peak as a 0..1 position on the -60..0 dBFS scale."""
    if peak <= 0.0 or math.isnan(peak):
        return 0.0
    db = 20.0 * math.log10(min(peak, 1.0))
    return max(0.0, min(1.0, 1.0 - db / FLOOR_DB))


class LevelBar(QWidget):
    """The painted bar of one meter."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._fraction = 0.0
        self._peak_fraction = 0.0
        self._peak_time = 0.0
        self._last_time = time.monotonic()
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(8)

    def sizeHint(self) -> QSize:
        return QSize(160, 8)

    @property
    def fraction(self) -> float:
        return self._fraction

    def set_peak(self, peak: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        target = peak_to_fraction(peak)
        fall = FALL_DB_PER_S * max(0.0, now - self._last_time) / -FLOOR_DB
        self._last_time = now
        self._fraction = max(target, self._fraction - fall)
        if target >= self._peak_fraction or now - self._peak_time > PEAK_HOLD_S:
            self._peak_fraction = target
            self._peak_time = now
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        theme = colors()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect())
        radius = rect.height() / 2
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(theme.qcolor("surface_alt"))
        painter.drawRoundedRect(rect, radius, radius)
        if self._fraction > 0:
            clip = 1.0 - CLIP_DB / FLOOR_DB
            colour = theme.qcolor("danger" if self._fraction >= clip else "success")
            painter.setBrush(colour)
            filled = QRectF(rect.left(), rect.top(), max(rect.height(), rect.width() * self._fraction), rect.height())
            painter.drawRoundedRect(filled, radius, radius)
        if self._peak_fraction > 0:
            x = rect.left() + (rect.width() - 2) * self._peak_fraction
            painter.setBrush(theme.qcolor("text"))
            painter.drawRect(QRectF(x, rect.top(), 2, rect.height()))
        painter.end()


class LevelMeter(QWidget):
    """A titled meter ("Microphone", "Assistant") with a caption under the bar."""

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel(title, self)
        self.title.setProperty("role", "heading")
        self.caption = QLabel("System default", self)
        self.caption.setProperty("role", "muted")
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.bar = LevelBar(self)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.title)
        head.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addLayout(head)
        layout.addWidget(self.bar)
        layout.addWidget(self.caption)
        self.setAccessibleName(f"{title} level")
        self.setMinimumWidth(150)

    def set_peak(self, peak: float) -> None:
        self.bar.set_peak(peak)
        db = 20.0 * math.log10(peak) if peak > 0 else -math.inf
        self.setAccessibleDescription("silent" if db < FLOOR_DB else f"{db:.0f} dBFS")

    def set_caption(self, text: str) -> None:
        """A short line under the bar (the device name)."""
        self.caption.setText(text)
        self.caption.setToolTip(text)
