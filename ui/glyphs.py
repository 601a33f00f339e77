"""Small vector glyphs painted with QPainter, so icons scale crisply and follow the theme colours.

Each function draws into ``rect`` (any size, best square) with ``color``; the painter's
state is saved and restored.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen, QPolygonF


def _pen(color: QColor, width: float) -> QPen:
    pen = QPen(color, width)
    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
    pen.setJoinStyle(Qt.PenJoinStyle.RoundJoin)
    return pen


def microphone(painter: QPainter, rect: QRectF, color: QColor) -> None:
    """A capsule microphone on a stand."""
    painter.save()
    s = min(rect.width(), rect.height())
    cx, top = rect.center().x(), rect.center().y() - s / 2
    line = max(1.5, s * 0.085)
    body = QRectF(cx - s * 0.17, top + s * 0.06, s * 0.34, s * 0.56)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    painter.drawRoundedRect(body, body.width() / 2, body.width() / 2)
    painter.setPen(_pen(color, line))
    painter.setBrush(Qt.BrushStyle.NoBrush)
    cup = QRectF(cx - s * 0.29, top + s * 0.22, s * 0.58, s * 0.54)
    painter.drawArc(cup, 180 * 16, 180 * 16)
    painter.drawLine(QPointF(cx, top + s * 0.76), QPointF(cx, top + s * 0.92))
    painter.drawLine(QPointF(cx - s * 0.16, top + s * 0.92), QPointF(cx + s * 0.16, top + s * 0.92))
    painter.restore()


def speaker(painter: QPainter, rect: QRectF, color: QColor) -> None:
    """A loudspeaker with two sound waves."""
    painter.save()
    s = min(rect.width(), rect.height())
    x0, y0 = rect.center().x() - s / 2, rect.center().y() - s / 2
    body = QPolygonF(
        [
            QPointF(x0 + s * 0.08, y0 + s * 0.36),
            QPointF(x0 + s * 0.26, y0 + s * 0.36),
            QPointF(x0 + s * 0.48, y0 + s * 0.16),
            QPointF(x0 + s * 0.48, y0 + s * 0.84),
            QPointF(x0 + s * 0.26, y0 + s * 0.64),
            QPointF(x0 + s * 0.08, y0 + s * 0.64),
        ]
    )
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    painter.drawPolygon(body)
    painter.setPen(_pen(color, max(1.5, s * 0.08)))
    painter.setBrush(Qt.BrushStyle.NoBrush)
    for radius in (0.18, 0.32):
        arc = QRectF(x0 + s * (0.5 - radius), y0 + s * (0.5 - radius), s * radius * 2, s * radius * 2)
        painter.drawArc(arc, -50 * 16, 100 * 16)
    painter.restore()


def speaker_muted(painter: QPainter, rect: QRectF, color: QColor) -> None:
    """A loudspeaker with a cross instead of sound waves."""
    painter.save()
    s = min(rect.width(), rect.height())
    x0, y0 = rect.center().x() - s / 2, rect.center().y() - s / 2
    body = QPolygonF(
        [
            QPointF(x0 + s * 0.08, y0 + s * 0.36),
            QPointF(x0 + s * 0.26, y0 + s * 0.36),
            QPointF(x0 + s * 0.48, y0 + s * 0.16),
            QPointF(x0 + s * 0.48, y0 + s * 0.84),
            QPointF(x0 + s * 0.26, y0 + s * 0.64),
            QPointF(x0 + s * 0.08, y0 + s * 0.64),
        ]
    )
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    painter.drawPolygon(body)
    painter.setPen(_pen(color, max(1.5, s * 0.08)))
    painter.drawLine(QPointF(x0 + s * 0.62, y0 + s * 0.36), QPointF(x0 + s * 0.90, y0 + s * 0.64))
    painter.drawLine(QPointF(x0 + s * 0.62, y0 + s * 0.64), QPointF(x0 + s * 0.90, y0 + s * 0.36))
    painter.restore()


def check_circle(painter: QPainter, rect: QRectF, color: QColor, mark: QColor) -> None:
    """A filled disc with a check mark."""
    painter.save()
    s = min(rect.width(), rect.height())
    disc = QRectF(rect.center().x() - s / 2, rect.center().y() - s / 2, s, s).adjusted(1, 1, -1, -1)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    painter.drawEllipse(disc)
    painter.setPen(_pen(mark, max(1.5, s * 0.11)))
    x0, y0 = disc.left(), disc.top()
    w = disc.width()
    path = QPainterPath(QPointF(x0 + w * 0.28, y0 + w * 0.52))
    path.lineTo(QPointF(x0 + w * 0.44, y0 + w * 0.67))
    path.lineTo(QPointF(x0 + w * 0.72, y0 + w * 0.36))
    painter.setBrush(Qt.BrushStyle.NoBrush)
    painter.drawPath(path)
    painter.restore()


def hollow_circle(painter: QPainter, rect: QRectF, color: QColor) -> None:
    """An empty ring with a dash: nothing loaded."""
    painter.save()
    s = min(rect.width(), rect.height())
    line = max(1.5, s * 0.1)
    disc = QRectF(rect.center().x() - s / 2, rect.center().y() - s / 2, s, s).adjusted(line, line, -line, -line)
    painter.setPen(_pen(color, line))
    painter.setBrush(Qt.BrushStyle.NoBrush)
    painter.drawEllipse(disc)
    c = disc.center()
    painter.drawLine(QPointF(c.x() - s * 0.16, c.y()), QPointF(c.x() + s * 0.16, c.y()))
    painter.restore()


def spinner(painter: QPainter, rect: QRectF, color: QColor, angle: float) -> None:
    """A three-quarter arc starting at ``angle`` degrees: busy."""
    painter.save()
    s = min(rect.width(), rect.height())
    line = max(1.5, s * 0.12)
    disc = QRectF(rect.center().x() - s / 2, rect.center().y() - s / 2, s, s).adjusted(line, line, -line, -line)
    track = QColor(color)
    track.setAlphaF(0.25)
    painter.setPen(_pen(track, line))
    painter.drawEllipse(disc)
    painter.setPen(_pen(color, line))
    painter.drawArc(disc, int(-angle * 16), 270 * 16)
    painter.restore()


def warning_triangle(painter: QPainter, rect: QRectF, color: QColor, mark: QColor) -> None:
    """A filled triangle with an exclamation mark."""
    painter.save()
    s = min(rect.width(), rect.height())
    x0, y0 = rect.center().x() - s / 2, rect.center().y() - s / 2
    triangle = QPolygonF([QPointF(x0 + s / 2, y0 + s * 0.06), QPointF(x0 + s * 0.97, y0 + s * 0.9)])
    triangle.append(QPointF(x0 + s * 0.03, y0 + s * 0.9))
    painter.setPen(_pen(color, max(1.0, s * 0.06)))
    painter.setBrush(color)
    painter.drawPolygon(triangle)
    painter.setPen(_pen(mark, max(1.5, s * 0.1)))
    painter.drawLine(QPointF(x0 + s / 2, y0 + s * 0.36), QPointF(x0 + s / 2, y0 + s * 0.6))
    painter.drawPoint(QPointF(x0 + s / 2, y0 + s * 0.75))
    painter.restore()


def pause_bars(painter: QPainter, rect: QRectF, color: QColor) -> None:
    """Two vertical bars: paused."""
    painter.save()
    s = min(rect.width(), rect.height())
    x0, y0 = rect.center().x() - s / 2, rect.center().y() - s / 2
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    radius = s * 0.06
    painter.drawRoundedRect(QRectF(x0 + s * 0.2, y0 + s * 0.12, s * 0.22, s * 0.76), radius, radius)
    painter.drawRoundedRect(QRectF(x0 + s * 0.58, y0 + s * 0.12, s * 0.22, s * 0.76), radius, radius)
    painter.restore()


def cross_octagon(painter: QPainter, rect: QRectF, color: QColor, mark: QColor) -> None:
    """A filled octagon with an X: an error (the stop-sign shape)."""
    painter.save()
    s = min(rect.width(), rect.height())
    c = rect.center()
    radius = s / 2 - 0.5
    points = [
        QPointF(
            c.x() + radius * math.cos(math.radians(22.5 + 45 * i)),
            c.y() + radius * math.sin(math.radians(22.5 + 45 * i)),
        )
        for i in range(8)
    ]
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    painter.drawPolygon(QPolygonF(points))
    painter.setPen(_pen(mark, max(1.5, s * 0.11)))
    d = s * 0.2
    painter.drawLine(QPointF(c.x() - d, c.y() - d), QPointF(c.x() + d, c.y() + d))
    painter.drawLine(QPointF(c.x() - d, c.y() + d), QPointF(c.x() + d, c.y() - d))
    painter.restore()
