"""The live frame-time overlay: one stacked bar per recent frame against the 80 ms budget.

Everything it shows comes from ``app.messages.FrameStats`` alone: the bars from each
message's ``FrameTiming`` (perception / RNN-T / language / TTS / codec, plus any time
not attributed to a stage as "other"), and the figures (p50, p95, realtime factor,
backlog, underruns, overflows) from the latest message. The y scale steps between a
few fixed ranges so the bars do not jump around, and frames over budget get a marker.
Main thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final, NamedTuple

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.messages import FrameStats
from engine.events import FrameTiming

from .theme import colors


class Stage(NamedTuple):
    field: str  # the FrameTiming attribute, without "_ms"
    label: str
    color: str


# Okabe–Ito colours: distinguishable with the common colour-vision deficiencies, in light and dark.
STAGES: Final = (
    Stage("perception", "Perception", "#56b4e9"),
    Stage("rnnt", "RNN-T", "#e69f00"),
    Stage("language", "Language", "#0072b2"),
    Stage("tts", "TTS", "#cc79a7"),
    Stage("codec", "Codec", "#009e73"),
)
STAGE_COLORS: Final = {stage.field: stage.color for stage in STAGES}
OTHER_COLOR: Final = "#9a9a9a"
BUDGET_COLOR: Final = "#d55e00"
BUDGET_MS: Final = 80.0
HISTORY: Final = 120
SCALES_MS: Final = (120.0, 160.0, 240.0, 400.0, 800.0, 1600.0)

_PAD: Final = 12.0
_HEADER_H: Final = 22.0
_LEGEND_H: Final = 20.0
_AXIS_W: Final = 40.0


def other_ms(timing: FrameTiming) -> float:
    """Frame time not attributed to any stage (queueing, host work between stages)."""
    return max(0.0, timing.total_ms - sum(timing.stage_ms(s.field) for s in STAGES))


def scale_for(frames: Sequence[FrameTiming]) -> float:
    """The smallest fixed y range that holds the slowest frame shown."""
    worst = max((f.total_ms for f in frames), default=0.0)
    for scale in SCALES_MS:
        if worst <= scale * 0.95:
            return scale
    return SCALES_MS[-1]


def _figures(stats: FrameStats) -> list[tuple[str, str]]:
    """The header figures with the theme colour role each is drawn in (warnings stand out)."""
    figures = [
        (f"p50 {stats.p50_ms:.1f} ms", "text"),
        (f"p95 {stats.p95_ms:.1f} ms", "danger" if stats.p95_ms > BUDGET_MS else "text"),
        (f"RTF {stats.realtime_factor:.2f}", "danger" if stats.realtime_factor > 1.0 else "text"),
        (f"backlog {stats.backlog_frames}", "warning" if stats.backlog_frames > 2 else "text"),
        (f"underruns {stats.output_underruns}", "warning" if stats.output_underruns else "text"),
    ]
    if stats.input_overflows:
        figures.append((f"overflows {stats.input_overflows}", "warning"))
    return figures


def format_stats(stats: FrameStats) -> str:
    """The figures line, e.g. ``"p50 42.0 ms · p95 61.5 ms · RTF 0.53 · backlog 0 · underruns 0"``."""
    return " · ".join(text for text, _ in _figures(stats))


class FrameOverlay(QWidget):
    """Stacked per-stage bars for the last ``history`` frames, the budget line, a legend and live figures."""

    def __init__(self, parent: QWidget | None = None, history: int = HISTORY) -> None:
        super().__init__(parent)
        self._frames: deque[FrameTiming] = deque(maxlen=history)
        self._history = history
        self._latest: FrameStats | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(178)
        self.setMinimumWidth(420)
        self.setAccessibleName("Frame time overlay")
        self.setAccessibleDescription("Waiting for frames")

    def sizeHint(self) -> QSize:
        return QSize(720, 178)

    @property
    def frames(self) -> list[FrameTiming]:
        return list(self._frames)

    @property
    def latest(self) -> FrameStats | None:
        return self._latest

    def add_stats(self, stats: FrameStats) -> None:
        """Add one processed frame (the overlay's only input)."""
        self._frames.append(stats.timing)
        self._latest = stats
        self.setAccessibleDescription(format_stats(stats))
        self.update()

    def clear(self) -> None:
        self._frames.clear()
        self._latest = None
        self.setAccessibleDescription("Waiting for frames")
        self.update()

    # -- geometry (public so tests and tooltips can locate things) -------------------------------------------------

    def plot_rect(self) -> QRectF:
        top = _PAD + _HEADER_H + 6
        bottom = self.height() - _PAD - _LEGEND_H - 6
        return QRectF(_PAD + _AXIS_W, top, self.width() - 2 * _PAD - _AXIS_W, max(10.0, bottom - top))

    def scale_ms(self) -> float:
        return scale_for(self._frames)

    def value_to_y(self, ms: float) -> float:
        plot = self.plot_rect()
        return plot.bottom() - plot.height() * min(ms, self.scale_ms()) / self.scale_ms()

    # -- painting --------------------------------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:
        theme = colors()
        painter = QPainter(self)
        plot = self.plot_rect()
        painter.fillRect(plot, theme.qcolor("plot_bg"))
        self._paint_grid(painter, plot)
        self._paint_bars(painter, plot)
        self._paint_budget(painter, plot)
        self._paint_header(painter)
        self._paint_legend(painter)
        painter.end()

    def _paint_grid(self, painter: QPainter, plot: QRectF) -> None:
        theme = colors()
        scale = self.scale_ms()
        step = 40.0 if scale <= 240 else 100.0 if scale <= 400 else 200.0 if scale <= 800 else 400.0
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, self.font().pointSizeF() - 1.5))
        painter.setFont(small)
        metrics = QFontMetricsF(small)
        value = 0.0
        while value <= scale + 0.01:
            y = round(self.value_to_y(value)) + 0.5
            painter.setPen(QPen(theme.qcolor("grid"), 1))
            painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            if abs(value - BUDGET_MS) > step / 3:  # the budget line carries its own label
                painter.setPen(theme.qcolor("muted"))
                label = f"{value:.0f}"
                painter.drawText(
                    QPointF(plot.left() - 6 - metrics.horizontalAdvance(label), y + metrics.capHeight() / 2), label
                )
            value += step

    def _paint_bars(self, painter: QPainter, plot: QRectF) -> None:
        theme = colors()
        if not self._frames:
            painter.setPen(theme.qcolor("muted"))
            painter.drawText(plot, Qt.AlignmentFlag.AlignCenter, "Waiting for frames — they appear once a model runs")
            return
        slot = plot.width() / self._history
        gap = 1.0 if slot >= 3.0 else 0.0
        scale = self.scale_ms()
        per_ms = plot.height() / scale
        first_slot = self._history - len(self._frames)  # newest frame on the right
        stage_colors = [QColor(stage.color) for stage in STAGES]
        other = QColor(OTHER_COLOR)
        for index, timing in enumerate(self._frames):
            left = round(plot.left() + (first_slot + index) * slot)
            right = round(plot.left() + (first_slot + index + 1) * slot - gap)
            width = max(1, right - left)
            base = plot.bottom()
            parts = [(timing.stage_ms(stage.field), stage_colors[i]) for i, stage in enumerate(STAGES)]
            parts.append((other_ms(timing), other))
            for ms, colour in parts:
                if ms <= 0 or base <= plot.top():
                    continue
                top = max(plot.top(), base - ms * per_ms)
                y0, y1 = round(top), round(base)
                if y1 > y0:
                    painter.fillRect(int(left), y0, int(width), y1 - y0, colour)
                base = top
            if timing.total_ms > BUDGET_MS:  # a missed deadline: a marker above the bar
                marker_y = max(plot.top(), plot.bottom() - min(timing.total_ms, scale) * per_ms) - 5
                painter.fillRect(int(left), round(max(plot.top() - 4, marker_y)), int(width), 3, QColor(BUDGET_COLOR))

    def _paint_budget(self, painter: QPainter, plot: QRectF) -> None:
        y = round(self.value_to_y(BUDGET_MS))
        painter.fillRect(QRectF(plot.left(), y - 1, plot.width(), 2), QColor(BUDGET_COLOR))
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, self.font().pointSizeF() - 1.5))
        small.setBold(True)
        painter.setFont(small)
        metrics = QFontMetricsF(small)
        painter.setPen(QColor(BUDGET_COLOR))
        label = "80 ms"
        painter.drawText(
            QPointF(plot.left() - 6 - metrics.horizontalAdvance(label), y + metrics.capHeight() / 2), label
        )

    def _paint_header(self, painter: QPainter) -> None:
        theme = colors()
        header = QRectF(_PAD, _PAD, self.width() - 2 * _PAD, _HEADER_H)
        x = header.right()
        if self._latest is not None:
            painter.setFont(self.font())
            metrics = QFontMetricsF(self.font())
            # Right-aligned figures, drawn right to left so each can carry its own warning colour.
            for text, role in reversed(_figures(self._latest)):
                width = metrics.horizontalAdvance(text)
                painter.setPen(theme.qcolor(role))
                painter.drawText(
                    QRectF(x - width, header.top(), width, header.height()), Qt.AlignmentFlag.AlignVCenter, text
                )
                x -= width + 16
        title_font = QFont(self.font())
        title_font.setBold(True)
        painter.setFont(title_font)
        painter.setPen(theme.qcolor("text"))
        room = x - header.left() - 8
        metrics = QFontMetricsF(title_font)
        title = f"Frame time · last {self._history} frames"
        if metrics.horizontalAdvance(title) > room:
            title = metrics.elidedText("Frame time", Qt.TextElideMode.ElideRight, max(0.0, room))
        painter.drawText(header, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title)

    def _paint_legend(self, painter: QPainter) -> None:
        theme = colors()
        painter.setFont(self.font())
        metrics = QFontMetricsF(self.font())
        y = self.height() - _PAD - _LEGEND_H
        x = _PAD + _AXIS_W
        entries = [(stage.label, QColor(stage.color)) for stage in STAGES]
        if any(other_ms(f) > 0.05 for f in self._frames):
            entries.append(("Other", QColor(OTHER_COLOR)))
        for label, colour in entries:
            painter.fillRect(QRectF(x, y + _LEGEND_H / 2 - 5, 10, 10), colour)
            x += 15
            painter.setPen(theme.qcolor("muted"))
            painter.drawText(
                QRectF(x, y, metrics.horizontalAdvance(label) + 2, _LEGEND_H), Qt.AlignmentFlag.AlignVCenter, label
            )
            x += metrics.horizontalAdvance(label) + 16
        painter.fillRect(QRectF(x, y + _LEGEND_H / 2 - 1, 16, 2), QColor(BUDGET_COLOR))
        x += 21
        painter.setPen(theme.qcolor("muted"))
        label = "80 ms budget (one frame)"
        painter.drawText(
            QRectF(x, y, metrics.horizontalAdvance(label) + 2, _LEGEND_H), Qt.AlignmentFlag.AlignVCenter, label
        )
