"""The menu-bar (macOS) / system-tray (Linux, Windows) icon: the state at a glance, and a short menu.

The icon shows three states from the window's ``StateChanged`` snapshot, each with its own shape
(not colour alone): *idle* (Parley's own icon: ready, loading, paused, no device…; the tooltip
names which), *listening* (a microphone on red) and *speaking* (a speaker on the accent colour).
Its menu: Talk (checkable: a menu item cannot be held, so it starts and stops talking, or opens
and closes the microphone in hands-free), Mute the Assistant, Open Parley, History…, Quit.
A click on the icon opens the window.

Not every desktop has a tray (GNOME without an extension, a bare X server, Qt's offscreen
platform): :attr:`TrayIcon.available` says so, the icon is then never created, and the window
quits when it is closed instead of hiding where nobody could reach it. Main thread only.
"""

from __future__ import annotations

import sys
from typing import Final

from PySide6.QtCore import QObject, QRectF, Qt, Signal
from PySide6.QtGui import QAction, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.messages import AppState, StateChanged
from app.paths import resource_path
from app.status import TALKABLE

from . import glyphs
from .theme import colors

TRAY_NAME: Final = "menu bar" if sys.platform == "darwin" else "tray"
"""What the place is called on this platform, for the menus and Settings."""
ICON_SIZE: Final = 64


def tray_available() -> bool:
    """Whether this desktop shows tray icons at all."""
    return QSystemTrayIcon.isSystemTrayAvailable()


def icon_kind(status: StateChanged) -> str:
    """``"listening"``, ``"speaking"`` or ``"idle"``: what the tray icon shows for ``status``."""
    if status.state is AppState.LISTENING:
        return "listening"
    if status.state is AppState.SPEAKING:
        return "speaking"
    return "idle"


def _badge(kind: str) -> QIcon:
    """A disc with the state's glyph, drawn in the theme's colours."""
    theme = colors()
    pixmap = QPixmap(ICON_SIZE, ICON_SIZE)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(theme.qcolor("talk_active" if kind == "listening" else "accent"))
    painter.drawEllipse(QRectF(2, 2, ICON_SIZE - 4, ICON_SIZE - 4))
    inner = QRectF(ICON_SIZE * 0.2, ICON_SIZE * 0.2, ICON_SIZE * 0.6, ICON_SIZE * 0.6)
    white = theme.qcolor("accent_text")
    if kind == "listening":
        glyphs.microphone(painter, inner, white)
    else:
        glyphs.speaker(painter, inner, white)
    painter.end()
    return QIcon(pixmap)


class TrayIcon(QObject):
    """The tray icon and its menu; the window connects the signals and feeds :meth:`show_state`."""

    open_requested = Signal()
    history_requested = Signal()
    quit_requested = Signal()

    def __init__(self, parent: QObject | None = None, *, available: bool | None = None) -> None:
        super().__init__(parent)
        self.available = tray_available() if available is None else available
        self.kind = "idle"
        self.icons = {
            "idle": QIcon(str(resource_path("parley.svg"))),
            **{k: _badge(k) for k in ("listening", "speaking")},
        }
        self.menu = QMenu()
        self.talk_action = QAction("Talk", self.menu)
        self.talk_action.setCheckable(True)
        self.talk_action.setEnabled(False)
        self.mute_action = QAction("Mute the Assistant", self.menu)
        self.mute_action.setCheckable(True)
        self.open_action = QAction("Open Parley", self.menu)
        self.history_action = QAction("History…", self.menu)
        self.quit_action = QAction("Quit Parley", self.menu)
        self.menu.addActions([self.talk_action, self.mute_action])
        self.menu.addSeparator()
        self.menu.addActions([self.open_action, self.history_action])
        self.menu.addSeparator()
        self.menu.addAction(self.quit_action)
        self.open_action.triggered.connect(self.open_requested)
        self.history_action.triggered.connect(self.history_requested)
        self.quit_action.triggered.connect(self.quit_requested)
        self.icon: QSystemTrayIcon | None = None
        if self.available:
            self.icon = QSystemTrayIcon(self.icons["idle"], self)
            self.icon.setContextMenu(self.menu)
            self.icon.setToolTip("Parley")
            self.icon.activated.connect(self._activated)
            self.icon.show()

    @property
    def tooltip(self) -> str:
        return self.icon.toolTip() if self.icon is not None else ""

    def show_state(self, status: StateChanged, *, hands_free: bool = False) -> None:
        """Show the state of ``status``; the Talk item is there only when talking is possible."""
        self.kind = icon_kind(status)
        self.talk_action.setEnabled(status.state in TALKABLE)
        self.talk_action.setText("Microphone Open (Hands-free)" if hands_free else "Talk")
        if self.icon is not None:
            self.icon.setIcon(self.icons[self.kind])
            words = status.state.value.capitalize()
            self.icon.setToolTip(f"Parley — {words}" + (f": {status.detail}" if status.detail else ""))

    def set_talking(self, talking: bool) -> None:
        """Check the Talk item as the talk control says, without echoing it back."""
        self.talk_action.blockSignals(True)
        self.talk_action.setChecked(talking)
        self.talk_action.blockSignals(False)

    def notify(self, title: str, message: str) -> None:
        if self.icon is not None:
            self.icon.showMessage(title, message, QSystemTrayIcon.MessageIcon.Information, 6000)

    def hide(self) -> None:
        if self.icon is not None:
            self.icon.hide()

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.open_requested.emit()
