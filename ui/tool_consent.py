"""The consent prompt: the assistant wants to run a tool; the user allows or denies it, with the keyboard too.

Shown above the talk control while a ``ConsentRequest`` waits: which tool, from where, its arguments (as plain
JSON text, never markup), and how long is left before the call is denied on its own ("the user did not answer").
**Allow** (Alt+A, or Ctrl+Return) and **Deny** (Alt+D, or Ctrl+D; Escape stays Stop) answer through
``controller.answer_consent``;
requests that come while one is shown wait in line. ``ConsentClosed`` removes a request however it ended
(answered, timed out, its conversation gone). Main thread only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Final

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.messages import ConsentClosed, ConsentRequest

from .theme import text_label

MAX_ARGUMENT_CHARS: Final = 1200  # what the prompt shows of long arguments (the transcript keeps them whole)


class ConsentPrompt(QFrame):
    """Allow / Deny for the oldest waiting tool call; hidden while none waits."""

    def __init__(self, answer: Callable[[int, bool], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Banner")
        self.setProperty("kind", "warning")
        self.setAccessibleName("Tool call waiting for your answer")
        self._answer = answer
        self._waiting: list[tuple[ConsentRequest, float]] = []  # (request, its deadline on time.monotonic())

        self.title = text_label("", self)
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.arguments = QLabel(self)
        self.arguments.setTextFormat(Qt.TextFormat.PlainText)
        self.arguments.setWordWrap(True)
        self.arguments.setProperty("role", "code")
        self.arguments.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.countdown = text_label("", self, "muted")
        self.allow_button = QPushButton("&Allow", self)
        self.allow_button.setProperty("kind", "primary")
        self.allow_button.setToolTip("Run this tool call (Alt+A or Ctrl+Return)")
        self.deny_button = QPushButton("&Deny", self)
        self.deny_button.setToolTip("Do not run it; the assistant is told you said no (Alt+D or Ctrl+D)")
        self.allow_button.clicked.connect(lambda: self.decide(True))
        self.deny_button.clicked.connect(lambda: self.decide(False))
        context = Qt.ShortcutContext.WindowShortcut
        for keys, allow in (("Ctrl+Return", True), ("Ctrl+D", False)):
            shortcut = QShortcut(QKeySequence(keys), self, context=context)
            shortcut.activated.connect(lambda allow=allow: self.decide(allow) if self.isVisible() else None)

        buttons = QHBoxLayout()
        buttons.addWidget(self.countdown, 1)
        buttons.addWidget(self.deny_button)
        buttons.addWidget(self.allow_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        layout.setSpacing(6)
        layout.addWidget(self.title)
        layout.addWidget(self.arguments)
        layout.addLayout(buttons)

        self._timer = QTimer(self)
        self._timer.setInterval(250)
        self._timer.timeout.connect(self._tick)
        self.hide()

    @property
    def current(self) -> ConsentRequest | None:
        return self._waiting[0][0] if self._waiting else None

    def pending(self) -> int:
        return len(self._waiting)

    def ask(self, request: ConsentRequest) -> None:
        self._waiting.append((request, time.monotonic() + request.timeout_s))
        self._show_current()

    def close_request(self, closed: ConsentClosed) -> None:
        self._waiting = [(r, d) for r, d in self._waiting if r.request_id != closed.request_id]
        self._show_current()

    def clear(self) -> None:
        self._waiting.clear()
        self._show_current()

    def decide(self, allow: bool) -> None:
        """Answer the request shown (the buttons and shortcuts); the next one, if any, takes its place."""
        request = self.current
        if request is None:
            return
        self._waiting.pop(0)
        self._answer(request.request_id, allow)
        self._show_current()

    def _show_current(self) -> None:
        request = self.current
        if request is None:
            self._timer.stop()
            self.hide()
            return
        where = "a built-in tool" if request.source == "built-in" else f"the tool server “{request.source}”"
        self.title.setText(f"The assistant wants to use {request.tool} ({where}).")
        shown = json.dumps(request.arguments, indent=2, ensure_ascii=False) if request.arguments else "(no arguments)"
        if len(shown) > MAX_ARGUMENT_CHARS:
            shown = shown[:MAX_ARGUMENT_CHARS] + " …"
        self.arguments.setText(shown)
        self._tick()
        self._timer.start()
        self.show()
        self.allow_button.setFocus()

    def _tick(self) -> None:
        if not self._waiting:
            return
        left = max(0.0, self._waiting[0][1] - time.monotonic())
        others = len(self._waiting) - 1
        queued = f" · {others} more waiting" if others else ""
        self.countdown.setText(
            f"The conversation waits: denied in {left:.0f} s without an answer{queued}. "
            "Allow: Ctrl+Return · Deny: Ctrl+D"
        )
