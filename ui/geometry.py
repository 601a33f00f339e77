"""Window geometry: a first size that fits the screen, and Qt's saved geometry as settings text."""

from __future__ import annotations

import base64
import binascii
import logging

from PySide6.QtCore import QByteArray
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

log = logging.getLogger(__name__)

SCREEN_SHARE = 0.92  # leave room for panels and docks


def fit_to_screen(window: QWidget, width: int, height: int) -> None:
    """Resize ``window`` to ``width`` × ``height``, or smaller where the screen is smaller."""
    screen = QGuiApplication.primaryScreen()
    if screen is not None:
        available = screen.availableGeometry()
        width = min(width, int(available.width() * SCREEN_SHARE))
        height = min(height, int(available.height() * SCREEN_SHARE))
    window.resize(width, height)


def encode_geometry(window: QWidget) -> str:
    """``saveGeometry()`` as base64 text (``Settings.window_geometry``)."""
    return base64.b64encode(bytes(window.saveGeometry().data())).decode("ascii")


def restore_geometry(window: QWidget, encoded: str | None) -> bool:
    """Apply a geometry from :func:`encode_geometry`; unreadable text is logged and ignored."""
    if not encoded:
        return False
    try:
        return window.restoreGeometry(QByteArray(base64.b64decode(encoded, validate=True)))
    except (binascii.Error, ValueError):
        log.warning("ignoring an unreadable saved window geometry")
        return False
