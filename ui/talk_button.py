"""The push-to-talk control: a large round button plus the talk key, anywhere in the window.

Hold mode: pressing the key or the button starts talking, releasing stops. Toggle mode:
each press flips. The key is caught by an application-wide event filter, so it works
whatever has focus in the main window — except editable text fields, which keep their
keys — while the talk control is on screen, and never in dialogs or menus. Auto-repeat
presses and releases are swallowed. If the window loses focus while the key is held
(the release would never arrive), talking stops. ``controller.set_talking`` is called
only when the state really changes. Main thread only.

Hands-free: the key and the button open and close the microphone (toggle mode, whatever the
talk mode says). The talk key in other apps (``handle_global``) and the tray's Talk item
(``request_talking``) reach the same state. When the conversation falls asleep the microphone
closes, and a toggled control closes with it (``conversation_slept``): one press wakes it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Final

from PySide6.QtCore import QEvent, QKeyCombination, QObject, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QEnterEvent,
    QFocusEvent,
    QHideEvent,
    QKeyEvent,
    QKeySequence,
    QPainter,
    QPaintEvent,
    QPen,
)
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QKeySequenceEdit,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.messages import Failure

from . import glyphs
from .contracts import Controller
from .theme import colors

log = logging.getLogger(__name__)

BUTTON_DIAMETER: Final = 116
_HALO: Final = 22  # room around the disc for the level halo


def first_key(sequence: QKeySequence) -> QKeyCombination:
    """The sequence's first key with its modifiers."""
    combination: QKeyCombination = sequence[0]  # type: ignore[index]  # PySide6's stubs omit __getitem__
    return combination


def parse_talk_key(text: str) -> QKeySequence:
    """A one-key sequence from settings text such as ``"Space"`` or ``"Ctrl+F5"``; raises ``ValueError``."""
    sequence = QKeySequence.fromString(text, QKeySequence.SequenceFormat.PortableText)
    if sequence.count() != 1 or first_key(sequence).key() in (Qt.Key.Key_unknown, 0):
        raise ValueError(f"{text!r} is not a single key (examples: Space, F5, Ctrl+Space)")
    return sequence


def key_display_name(text: str) -> str:
    """How to name the key to the user ("Space", "Ctrl+F5", "⌘Space" on macOS)."""
    try:
        return parse_talk_key(text).toString(QKeySequence.SequenceFormat.NativeText)
    except ValueError:
        return text


def _is_text_input(widget: QWidget | None) -> bool:
    """Editable text widgets keep their keys, so the talk key can still be typed there."""
    if widget is None:
        return False
    if isinstance(widget, QLineEdit | QPlainTextEdit | QTextEdit):
        return not widget.isReadOnly()
    if isinstance(widget, QComboBox):
        return widget.isEditable()
    return isinstance(widget, QAbstractSpinBox | QKeySequenceEdit)


class TalkButton(QAbstractButton):
    """The big round button: accent disc with a microphone; red with a level halo while talking."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._talking = False
        self._level = 0.0
        self._hovered = False
        self._focus_ring = False
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setAccessibleName("Talk")
        side = BUTTON_DIAMETER + 2 * _HALO
        self.setFixedSize(side, side)

    def sizeHint(self) -> QSize:
        side = BUTTON_DIAMETER + 2 * _HALO
        return QSize(side, side)

    @property
    def talking(self) -> bool:
        return self._talking

    def set_talking(self, talking: bool) -> None:
        self._talking = talking
        self.update()

    def set_level(self, level: float) -> None:
        """Input peak (0..1); drives the halo while talking."""
        level = min(1.0, max(0.0, level))
        if abs(level - self._level) > 0.01:
            self._level = level
            if self._talking:
                self.update()

    def hitButton(self, pos: QPointF) -> bool:  # type: ignore[override]
        centre = QPointF(self.width() / 2, self.height() / 2)
        delta = QPointF(pos) - centre
        return delta.x() ** 2 + delta.y() ** 2 <= (BUTTON_DIAMETER / 2 + 4) ** 2

    def focusInEvent(self, event: QFocusEvent) -> None:
        # The ring is for keyboard users; a click or the window giving focus does not need it.
        self._focus_ring = event.reason() in (
            Qt.FocusReason.TabFocusReason,
            Qt.FocusReason.BacktabFocusReason,
            Qt.FocusReason.ShortcutFocusReason,
        )
        super().focusInEvent(event)

    def focusOutEvent(self, event: QFocusEvent) -> None:
        self._focus_ring = False
        super().focusOutEvent(event)

    def enterEvent(self, event: QEnterEvent) -> None:
        self._hovered = True
        self.update()
        super().enterEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        self._hovered = False
        self.update()
        super().leaveEvent(event)

    def paintEvent(self, event: QPaintEvent) -> None:
        theme = colors()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        centre = QPointF(self.width() / 2, self.height() / 2)
        radius = BUTTON_DIAMETER / 2
        if not self.isEnabled():
            fill, glyph = theme.qcolor("surface_alt"), theme.qcolor("muted")
        elif self._talking:
            fill, glyph = theme.qcolor("talk_active"), QColor("#ffffff")
        else:
            fill = theme.qcolor("accent_hover" if self._hovered or self.isDown() else "accent")
            glyph = theme.qcolor("accent_text")

        halo = QColor(fill)
        if self.isEnabled():
            extent = 8 + (_HALO - 8) * (self._level**0.5 if self._talking else 0.0)
            halo.setAlphaF(0.22 if self._talking else 0.12)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(halo)
            painter.drawEllipse(centre, radius + extent, radius + extent)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(fill)
        painter.drawEllipse(centre, radius, radius)
        if not self.isEnabled():
            painter.setPen(QPen(theme.qcolor("border"), 1.5))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawEllipse(centre, radius, radius)

        icon = radius * 0.95
        glyphs.microphone(painter, QRectF(centre.x() - icon / 2, centre.y() - icon / 2, icon, icon), glyph)

        if self.hasFocus() and self._focus_ring:
            pen = QPen(theme.qcolor("text"), 2, Qt.PenStyle.DashLine)
            painter.setPen(pen)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawEllipse(centre, radius + 5, radius + 5)
        painter.end()


class TalkControl(QWidget):
    """The talk button with its hint line, and the talk-key handling for the window it lives in.

    ``reveal``, when set, is asked on a talk-key press while the control is out of sight (the
    first-run page): if it brings the control on screen (and returns True), the press counts.
    """

    talking_changed = Signal(bool)
    failed = Signal(Failure)

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._talking = False
        self._key_down = False
        self._available = False
        self._mode = "hold"
        self._hands_free = False
        self._key_text = "Space"
        self._key = parse_talk_key("Space")
        self.reveal: Callable[[], bool] | None = None
        self._unavailable_reason = "Load a model to talk"

        self.button = TalkButton(self)
        self.hint = QLabel(self)
        self.hint.setProperty("role", "talkHint")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addWidget(self.hint, 0, Qt.AlignmentFlag.AlignHCenter)

        self.button.pressed.connect(self._button_pressed)
        self.button.released.connect(self._button_released)
        app = QApplication.instance()
        if app is not None:
            app.installEventFilter(self)
        self.set_available(False)

    # -- configuration ---------------------------------------------------------------------------------------------

    @property
    def talking(self) -> bool:
        return self._talking

    @property
    def mode(self) -> str:
        """The mode in effect: "toggle" in hands-free, else the configured one."""
        return "toggle" if self._hands_free else self._mode

    @property
    def hands_free(self) -> bool:
        return self._hands_free

    def configure(self, key: str, mode: str, *, hands_free: bool = False) -> None:
        """Use ``key`` (settings text, e.g. "Space") in ``mode`` ("hold" or "toggle"), or hands-free."""
        if mode not in ("hold", "toggle"):
            raise ValueError(f"talk mode must be hold or toggle; got {mode!r}")
        self._key = parse_talk_key(key)
        self._key_text = key
        if (mode, hands_free) != (self._mode, self._hands_free):
            self._set_talking(False)
        self._mode = mode
        self._hands_free = hands_free
        self._key_down = False
        self._update_hint()

    def handle_global(self, start: bool) -> None:
        """The talk key in another app: down (``start``) or up; in toggle mode every event is a press."""
        if self.mode == "hold":
            self._set_talking(start)
        else:
            self._set_talking(not self._talking)

    def request_talking(self, talking: bool) -> None:
        """Talk (or stop) from elsewhere (the tray's Talk item): as if the button were toggled."""
        self._set_talking(talking)

    def conversation_slept(self) -> None:
        """The conversation fell asleep (the idle pause, or Stop), and that closed the microphone: an open toggle
        closes too, so the next press opens it and wakes the conversation (instead of closing a microphone that is
        already closed, and only the press after waking it). A held key in hold mode ends with its release."""
        if self.mode == "toggle":
            self._set_talking(False)

    def set_available(self, available: bool, reason: str = "Load a model to talk") -> None:
        """Whether talking is possible now; stops talking when it is not. ``reason`` is the hint then."""
        self._available = available
        self._unavailable_reason = reason
        if not available:
            self._set_talking(False)
        self.button.setEnabled(available)
        self._update_hint()

    def set_level(self, level: float) -> None:
        self.button.set_level(level)

    def hideEvent(self, event: QHideEvent) -> None:
        # Out of sight the key is no longer ours, so a held key's release would never come.
        self._key_down = False
        self._set_talking(False)
        super().hideEvent(event)

    # -- input -----------------------------------------------------------------------------------------------------

    def _button_pressed(self) -> None:
        if self.mode == "hold":
            self._set_talking(True)
        else:
            self._set_talking(not self._talking)

    def _button_released(self) -> None:
        if self.mode == "hold" and not self._key_down:
            self._set_talking(False)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind == QEvent.Type.WindowDeactivate:
            if watched is self.window() and self.mode == "hold" and self._key_down:
                self._key_down = False
                self._set_talking(False)
            return False
        if kind not in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease, QEvent.Type.ShortcutOverride):
            return False
        if not isinstance(watched, QWidget) or watched.window() is not self.window():
            return False  # another window
        assert isinstance(event, QKeyEvent)
        if not self._matches(event, release=kind == QEvent.Type.KeyRelease):
            return False
        if _is_text_input(QApplication.focusWidget()):
            return False
        if not self.isVisible() and not self._revealed_by(event):
            return False  # a page of this window without the talk control (first run)
        if kind == QEvent.Type.ShortcutOverride:
            event.accept()  # we want it as a key press, not as a menu shortcut
            return True
        if event.isAutoRepeat():
            return True
        if kind == QEvent.Type.KeyPress:
            self._key_pressed()
        else:
            self._key_released()
        return True

    def _revealed_by(self, event: QKeyEvent) -> bool:
        """A talk-key press while out of sight: ``reveal`` may bring the control on screen."""
        if event.type() != QEvent.Type.KeyPress or event.isAutoRepeat() or self.reveal is None:
            return False
        return self.reveal()

    def _matches(self, event: QKeyEvent, *, release: bool) -> bool:
        wanted = first_key(self._key)
        if event.key() != wanted.key():
            return False
        if release:
            return True  # modifiers may already be up when the key is released
        modifiers = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
        return bool(modifiers == wanted.keyboardModifiers())

    def _key_pressed(self) -> None:
        if not self._available:
            return
        self._key_down = True
        if self.mode == "hold":
            self._set_talking(True)
        else:
            self._set_talking(not self._talking)

    def _key_released(self) -> None:
        was_down = self._key_down
        self._key_down = False
        if was_down and self.mode == "hold" and not self.button.isDown():
            self._set_talking(False)

    # -- state -----------------------------------------------------------------------------------------------------

    def _set_talking(self, talking: bool) -> None:
        if talking == self._talking or (talking and not self._available):
            return
        self._talking = talking
        self.button.set_talking(talking)
        self._update_hint()
        try:
            self._controller.set_talking(talking)
        except Exception as exc:  # report and keep the window usable
            log.exception("set_talking(%s) failed", talking)
            failure = Failure(f"Could not {'start' if talking else 'stop'} talking: {exc}", traceback.format_exc())
            self.failed.emit(failure)
        self.talking_changed.emit(talking)

    def _update_hint(self) -> None:
        key = key_display_name(self._key_text)
        if not self._available:
            hint = self._unavailable_reason
        elif self._hands_free:
            hint = (
                f"Microphone open: talk any time · {key} closes it"
                if self._talking
                else f"Press {key} or the button to open the microphone"
            )
        elif self._mode == "hold":
            hint = "Release to stop" if self._talking else f"Hold {key} or the button to talk"
        else:
            hint = f"Press {key} again to stop" if self._talking else f"Press {key} or the button to talk"
        self.hint.setText(hint)
        self.button.setAccessibleDescription(hint)
        self.button.setToolTip(hint)
