"""Non-modal message banners at the top of the window: errors, warnings and tips.

A banner shows one message with a shape-coded icon, an optional action button (for
example "New conversation"), a "Details" disclosure holding the traceback, and a close
button. The window stays fully usable while banners are shown. The area keeps the
newest few; an identical message does not stack. Main thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from PySide6.QtCore import QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import glyphs
from .theme import colors

KINDS: Final = ("error", "warning", "info")
MAX_BANNERS: Final = 3


class _KindIcon(QWidget):
    def __init__(self, kind: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._kind = kind
        self.setFixedSize(18, 18)

    def sizeHint(self) -> QSize:
        return QSize(18, 18)

    def paintEvent(self, event: QPaintEvent) -> None:
        theme = colors()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect())
        white = QColor("#ffffff")
        if self._kind == "error":
            glyphs.cross_octagon(painter, rect, theme.qcolor("danger"), white)
        elif self._kind == "warning":
            glyphs.warning_triangle(painter, rect, theme.qcolor("warning"), white)
        else:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(theme.qcolor("accent"))
            painter.drawEllipse(rect.adjusted(1, 1, -1, -1))
            painter.setPen(white)
            font = painter.font()
            font.setBold(True)
            painter.setFont(font)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, "i")
        painter.end()


class Banner(QFrame):
    """One message; ``kind`` is "error", "warning" or "info"."""

    dismissed = Signal()

    def __init__(
        self,
        message: str,
        *,
        kind: str = "error",
        details: str = "",
        action: tuple[str, Callable[[], None]] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        if kind not in KINDS:
            raise ValueError(f"banner kind must be one of {', '.join(KINDS)}; got {kind!r}")
        self.kind = kind
        self.is_dismissed = False
        self.setObjectName("Banner")
        self.setProperty("kind", kind)
        self.setAccessibleName({"error": "Error", "warning": "Warning", "info": "Note"}[kind])
        self.setAccessibleDescription(message)

        self.message = QLabel(message, self)
        self.message.setTextFormat(Qt.TextFormat.PlainText)
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.details_button = QToolButton(self)
        self.details_button.setText("Details")
        self.details_button.setCheckable(True)
        self.details_button.setAccessibleName("Show details")
        self.details_button.setVisible(bool(details))
        self.details = QPlainTextEdit(details, self)
        self.details.setReadOnly(True)
        self.details.setMaximumHeight(150)
        self.details.setAccessibleName("Error details")
        self.details.hide()
        self.details_button.toggled.connect(self._show_details)

        self.action_button: QPushButton | None = None
        if action is not None:
            label, callback = action
            self.action_button = QPushButton(label, self)
            self.action_button.setProperty("kind", "primary")
            self.action_button.clicked.connect(callback)

        self.close_button = QToolButton(self)
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAccessibleName("Dismiss message")
        self.close_button.clicked.connect(self.dismiss)

        row = QHBoxLayout()
        row.setSpacing(10)
        row.addWidget(_KindIcon(kind, self), 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.message, 1)
        if self.action_button is not None:
            row.addWidget(self.action_button, 0, Qt.AlignmentFlag.AlignVCenter)
        row.addWidget(self.details_button, 0, Qt.AlignmentFlag.AlignVCenter)
        row.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 9, 8, 9)
        layout.setSpacing(8)
        layout.addLayout(row)
        layout.addWidget(self.details)

    def text(self) -> str:
        return self.message.text()

    def _show_details(self, shown: bool) -> None:
        self.details.setVisible(shown)
        self.details_button.setText("Hide details" if shown else "Details")

    def dismiss(self) -> None:
        """Hide and delete the banner (the area notices through ``dismissed``)."""
        if self.is_dismissed:
            return
        self.is_dismissed = True
        self.hide()
        self.dismissed.emit()
        self.deleteLater()


class BannerArea(QWidget):
    """A column of banners, newest on top, at most :data:`MAX_BANNERS`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self.hide()

    def banners(self) -> list[Banner]:
        """The banners still shown, newest first."""
        found = []
        for index in range(self._layout.count()):
            item = self._layout.itemAt(index)
            widget = item.widget() if item is not None else None
            if isinstance(widget, Banner) and not widget.is_dismissed:
                found.append(widget)
        return found

    def show_message(
        self,
        message: str,
        *,
        kind: str = "error",
        details: str = "",
        action: tuple[str, Callable[[], None]] | None = None,
        timeout_ms: int | None = None,
    ) -> Banner:
        """Show a banner (replacing one with the same message, whatever its kind); returns it.

        With ``timeout_ms`` the banner dismisses itself after that long (for tips, never for errors).
        """
        for banner in self.banners():
            if banner.text() == message:
                banner.dismiss()
        banner = Banner(message, kind=kind, details=details, action=action, parent=self)
        banner.dismissed.connect(self._update_visibility)
        self._layout.insertWidget(0, banner)
        for old in self.banners()[MAX_BANNERS:]:
            old.dismiss()
        if timeout_ms is not None:
            QTimer.singleShot(timeout_ms, banner, banner.dismiss)
        self.show()
        return banner

    def clear(self, *, kind: str | None = None) -> None:
        """Dismiss every banner, or only those of ``kind``."""
        for banner in self.banners():
            if kind is None or banner.kind == kind:
                banner.dismiss()

    def _update_visibility(self) -> None:
        self.setVisible(bool(self.banners()))
