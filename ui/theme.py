"""Light and dark themes: a colour set, the Qt palette built from it, and ``assets/style.qss``.

The stylesheet is a template: ``$name`` placeholders are filled from the active
:class:`ThemeColors`. Custom-painted widgets read :func:`colors` in ``paintEvent`` so
they follow a theme switch on their next repaint. Main thread only.
"""

from __future__ import annotations

import logging
import string
from dataclasses import asdict, dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QLabel, QStyleFactory, QWidget

from app.paths import resource_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThemeColors:
    """The colours of one theme, as ``#rrggbb`` strings."""

    name: str
    window: str
    surface: str
    surface_alt: str
    text: str
    muted: str  # secondary text, still enabled
    disabled: str  # text and marks of disabled controls: dimmer than muted, so a disabled control looks it
    border: str
    accent: str
    accent_hover: str
    accent_text: str
    talk_active: str
    user_bubble: str
    success: str
    warning: str
    danger: str
    error_bg: str
    error_border: str
    warning_bg: str
    warning_border: str
    info_bg: str
    info_border: str
    plot_bg: str
    grid: str

    def qcolor(self, name: str) -> QColor:
        return QColor(getattr(self, name))


LIGHT = ThemeColors(
    name="light",
    window="#f3f4f7",
    surface="#ffffff",
    surface_alt="#eceef2",
    text="#1d2026",
    muted="#5c6370",
    disabled="#a3a9b3",
    border="#d5d9e0",
    accent="#2f6feb",
    accent_hover="#255ed0",
    accent_text="#ffffff",
    talk_active="#d93f3f",
    user_bubble="#e3ecfd",
    success="#1f8a4c",
    warning="#a35f00",
    danger="#c62f2f",
    error_bg="#fdecec",
    error_border="#f0b4b4",
    warning_bg="#fff5e0",
    warning_border="#efd29a",
    info_bg="#e8f1fe",
    info_border="#b5cdf5",
    plot_bg="#fafbfc",
    grid="#e3e6eb",
)

DARK = ThemeColors(
    name="dark",
    window="#17191d",
    surface="#212429",
    surface_alt="#2b2f35",
    text="#e6e8eb",
    muted="#9aa1ab",
    disabled="#5c626b",
    border="#393e46",
    accent="#5a8ff2",
    accent_hover="#7aa5f5",
    accent_text="#0d1117",
    talk_active="#f0605d",
    user_bubble="#243752",
    success="#4cc38a",
    warning="#f0b44c",
    danger="#f07070",
    error_bg="#3a2224",
    error_border="#6b3436",
    warning_bg="#3a3020",
    warning_border="#6b5526",
    info_bg="#1e2c42",
    info_border="#35507a",
    plot_bg="#1b1e22",
    grid="#2c3037",
)

_current: ThemeColors = LIGHT


def colors() -> ThemeColors:
    """The active theme's colours."""
    return _current


def resolve_theme(theme: str) -> ThemeColors:
    """``"light"``, ``"dark"`` or ``"system"`` (the desktop's colour scheme; light when it is unknown)."""
    if theme == "dark":
        return DARK
    if theme == "light":
        return LIGHT
    if theme != "system":
        raise ValueError(f"theme must be system, light or dark; got {theme!r}")
    hints = QGuiApplication.styleHints()
    return DARK if hints is not None and hints.colorScheme() == Qt.ColorScheme.Dark else LIGHT


def build_palette(theme: ThemeColors) -> QPalette:
    palette = QPalette()
    roles = {
        QPalette.ColorRole.Window: theme.window,
        QPalette.ColorRole.WindowText: theme.text,
        QPalette.ColorRole.Base: theme.surface,
        QPalette.ColorRole.AlternateBase: theme.surface_alt,
        QPalette.ColorRole.Text: theme.text,
        QPalette.ColorRole.Button: theme.surface,
        QPalette.ColorRole.ButtonText: theme.text,
        QPalette.ColorRole.ToolTipBase: theme.surface,
        QPalette.ColorRole.ToolTipText: theme.text,
        QPalette.ColorRole.PlaceholderText: theme.muted,
        QPalette.ColorRole.Highlight: theme.accent,
        QPalette.ColorRole.HighlightedText: theme.accent_text,
        QPalette.ColorRole.Accent: theme.accent,
        QPalette.ColorRole.Link: theme.accent,
        QPalette.ColorRole.Mid: theme.border,
        QPalette.ColorRole.Midlight: theme.surface_alt,
        QPalette.ColorRole.Dark: theme.border,
        QPalette.ColorRole.Light: theme.surface,
    }
    for role, value in roles.items():
        palette.setColor(role, QColor(value))
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(theme.disabled))  # labels and check marks
    for role in (QPalette.ColorRole.Base, QPalette.ColorRole.Button):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(theme.window))  # a box that is not there to click
    return palette


def stylesheet(theme: ThemeColors) -> str:
    """``assets/style.qss`` filled in for ``theme`` (``$assets`` is the assets folder, for arrow images).

    Empty, with a logged warning, if the file cannot be read: the palette alone still gives a usable window.
    """
    path = resource_path("style.qss")
    try:
        template = string.Template(path.read_text(encoding="utf-8"))
    except OSError as exc:
        log.warning("stylesheet %s could not be read (%s); using the plain palette", path, exc)
        return ""
    return template.safe_substitute(asdict(theme), assets=path.parent.as_posix())


def apply_theme(app: QApplication, theme: str) -> ThemeColors:
    """Switch the whole application to ``theme`` ("system", "light" or "dark"); returns its colours."""
    global _current
    resolved = resolve_theme(theme)
    _current = resolved
    sheet = stylesheet(resolved)
    if app.property("parleyTheme") == resolved.name and app.styleSheet() == sheet:
        return resolved  # re-polishing every widget is slow; skip when nothing changes
    fusion = QStyleFactory.create("Fusion")  # the same look everywhere, and it honours the palette fully
    if fusion is not None:
        app.setStyle(fusion)
    app.setPalette(build_palette(resolved))
    app.setStyleSheet(sheet)
    app.setProperty("parleyTheme", resolved.name)
    for widget in app.allWidgets():
        widget.update()
    return resolved


def repolish(widget: QWidget) -> None:
    """Re-apply the stylesheet after a dynamic property that selectors use has changed."""
    style = widget.style()
    style.unpolish(widget)
    style.polish(widget)
    widget.update()


def text_label(text: str, parent: QWidget, role: str | None = None) -> QLabel:
    """A wrapped line of text, styled by ``role`` (the stylesheet's ``role`` selectors: "muted", "title", …)."""
    label = QLabel(text, parent)
    label.setWordWrap(True)
    if role is not None:
        label.setProperty("role", role)
    return label


def muted_label(text: str, parent: QWidget) -> QLabel:
    """A wrapped explanatory line in the secondary text colour."""
    return text_label(text, parent, "muted")
