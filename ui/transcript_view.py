"""The conversation as it streams: one bubble per turn, deltas appended, tool calls as their own entries (the
call, then what the model was told about it, then when it heard back; a timer's end).

A new entry starts when the speaker changes (user ↔ assistant), after a tool call, and for
the user's words after :meth:`TranscriptView.start_new_turn` (the window calls it when the
talk key goes down): an answer the assistant is still giving stays in its bubble however
often the key is pressed. All text is shown as plain text — model output is never
interpreted as markup — and what is not text for people is left out of bubbles and tool
call boxes (:func:`visible_text`: the model's special markers such as ``<SPECIAL_12>``,
U+FFFD replacement characters from a character split across tokens, control characters);
Save Conversation and the history keep the text raw. The view follows the newest entry
unless the user has scrolled up. Main thread only.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Final

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.messages import TimerDone, ToolActivity, ToolResponseTiming, ToolTurnHeard
from engine.events import SPECIAL_MARKER, AssistantTextDelta, ToolCall, UserTranscriptDelta

_BUBBLE_WIDTH: Final = 0.78  # of the visible width
# C0 and C1 controls except tab and newline, DEL, lone surrogates and U+FFFD (what a decoder puts where bytes are
# not yet a whole character): drawn as boxes or "�", never text.
NOT_TEXT: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffd]")


def visible_text(text: str) -> str:
    """``text`` as the window shows it: without the model's special markers, U+FFFD or control characters."""
    return NOT_TEXT.sub("", SPECIAL_MARKER.sub("", text))


_SELECTABLE: Final = Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.TextSelectableByKeyboard


class Role(enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


SPEAKER: Final = {Role.USER: "You", Role.ASSISTANT: "Assistant"}


def describe_tool_call(call: ToolCall) -> tuple[str, str, bool]:
    """Header, body and whether parsing failed, for one tool call entry."""
    if call.error is None and call.name is not None:
        arguments = json.dumps(call.arguments or {}, indent=2, ensure_ascii=False, sort_keys=False)
        return f"Tool call · {call.name}", arguments, False
    reason = call.error or "the call has no name"
    return "Tool call (could not be read)", f"{reason}\n\n{call.raw}", True


class _WrappingLabel(QLabel):
    """A word-wrapping label that asks for its natural text width (up to a limit) instead of Qt's narrow guess."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.max_text_width = 480

    def _natural_width(self) -> int:
        metrics = self.fontMetrics()
        widest = max((metrics.horizontalAdvance(line) for line in self.text().split("\n")), default=0)
        return min(widest + 4, self.max_text_width)

    def sizeHint(self) -> QSize:
        width = max(40, self._natural_width())
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        # Height at the natural width: the layouts use heightForWidth for the real one, and a minimum
        # computed at the narrowest width would leave empty space under short entries.
        natural = self._natural_width()
        return QSize(min(120, natural), self.heightForWidth(max(40, natural)))


class TranscriptEntry(QFrame):
    """One bubble: who spoke, and the text so far."""

    def __init__(self, role: Role, header: str, parent: QWidget | None = None, *, monospace: bool = False) -> None:
        super().__init__(parent)
        self.role = role
        self.setObjectName("Bubble")
        self.setProperty("role", role.value)
        self.header = QLabel(header, self)
        self.header.setProperty("role", "speaker")
        self.body = _WrappingLabel(self)
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(_SELECTABLE)
        self.body.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self._margin = 28
        if monospace:
            self.body.setProperty("role", "code")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 9, 14, 11)
        layout.setSpacing(3)
        layout.addWidget(self.header)
        layout.addWidget(self.body)
        self.body.setAccessibleName(f"{header} said" if role is not Role.TOOL else header)

    def text(self) -> str:
        return self.body.text()

    def set_width_limit(self, width: int) -> None:
        """The widest this bubble may grow; its text wraps inside."""
        self.setMaximumWidth(width)
        self.body.max_text_width = width - self._margin
        self.body.updateGeometry()

    def set_text(self, text: str) -> None:
        self.body.setText(text)

    def append(self, delta: str) -> None:
        current = self.body.text()
        self.body.setText(current + delta if current else delta.lstrip())


class TranscriptView(QWidget):
    """The scrolling list of conversation entries."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._entries: list[TranscriptEntry] = []
        self._heard_back: TranscriptEntry | None = None  # the last tool turn's entry, until the assistant speaks
        self._open_turn = False  # whether the last entry may still grow
        self._user_turn_done = False  # the talk key went down since the user's last words
        self._follow = True

        self.placeholder = QLabel(self)
        self.set_invitation("hold")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setProperty("role", "muted")
        self.placeholder.setWordWrap(True)

        self._content = QWidget()
        self._content.setObjectName("TranscriptContent")
        self._list = QVBoxLayout(self._content)
        self._list.setContentsMargins(16, 16, 16, 16)
        self._list.setSpacing(10)
        self._list.addStretch(1)

        self.scroll_area = QScrollArea(self)
        self.scroll_area.setObjectName("TranscriptScroll")
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setWidget(self._content)
        bar = self.scroll_area.verticalScrollBar()
        bar.rangeChanged.connect(self._keep_following)
        bar.valueChanged.connect(self._track_follow)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.placeholder, 1)
        layout.addWidget(self.scroll_area, 1)
        self.scroll_area.hide()
        self.setAccessibleName("Conversation transcript")

    def set_invitation(self, mode: str) -> None:
        """What the empty transcript asks the user to do, in the talk mode in use ("hold", "toggle", "hands-free")."""
        how = {
            "hold": "Hold the talk key and speak.",
            "toggle": "Press the talk key and speak; press it again when you are done.",
            "hands-free": "Press the talk key to open the microphone, then just talk.",
        }[mode]
        self.placeholder.setText(f"{how}\nWhat you say and what the assistant answers appears here.")

    # -- feeding ---------------------------------------------------------------------------------------------------

    def add_user_delta(self, event: UserTranscriptDelta) -> None:
        self._append(Role.USER, event.delta)

    def add_assistant_delta(self, event: AssistantTextDelta) -> None:
        self._append(Role.ASSISTANT, event.delta)

    def add_tool_call(self, call: ToolCall) -> None:
        header, body, failed = describe_tool_call(call)
        self._add_tool_entry(header, body, failed=failed)

    def add_tool_activity(self, activity: ToolActivity) -> None:
        """What the model is told about one call: the decision, the outcome, the result or the reason."""
        waited = f" after {activity.consent_s:.0f} s" if activity.consent_s >= 1.0 else ""
        ran = f" · {activity.run_s:.2f} s" if activity.run_s else ""
        if activity.ok:
            outcome = "result"
        else:
            outcome = "failed" if activity.decision.startswith("allowed") else "not run"
        header = f"Tool {outcome} · {activity.tool or 'no tool'} · {activity.decision}{waited}{ran}"
        self._add_tool_entry(header, activity.content, failed=not activity.ok)

    def add_tool_response(self, timing: ToolResponseTiming) -> None:
        """The model was given the results: how long the whole tool turn took."""
        body = (
            f"{timing.calls} result{'s' if timing.calls != 1 else ''} in {timing.positions} positions "
            f"({timing.inject_s:.2f} s); "
            f"the tool turn took {timing.turn_s:.1f} s"
        )
        self._heard_back = self._add_tool_entry("The assistant heard back", body, failed=False)

    def add_tool_turn_heard(self, heard: ToolTurnHeard) -> None:
        """The assistant spoke again: the whole tool turn's time joins its "heard back" entry."""
        entry = self._heard_back
        if entry is not None and entry in self._entries:
            entry.set_text(f"{entry.text()}; its first sound came {heard.seconds:.1f} s after the call")
        self._heard_back = None

    def add_timer_done(self, timer: TimerDone) -> None:
        from app.tools.builtin import describe_duration

        self._add_tool_entry("Timer done", f"{timer.label} ({describe_duration(timer.seconds)})", failed=False)

    def _add_tool_entry(self, header: str, body: str, *, failed: bool) -> TranscriptEntry:
        entry = TranscriptEntry(Role.TOOL, visible_text(header), monospace=True)
        entry.setProperty("failed", failed)
        entry.set_text(visible_text(body))
        self._add_entry(entry)
        self._open_turn = False
        return entry

    def start_new_turn(self) -> None:
        """The user's next words start a new entry even right after their last ones. The assistant's entry stays
        open: its answer may go on across key presses (each press used to cut it into one-word bubbles)."""
        self._user_turn_done = True

    def clear(self) -> None:
        for entry in self._entries:
            row = entry.parentWidget()
            if row is not None:
                self._list.removeWidget(row)
                row.deleteLater()
        self._entries.clear()
        self._open_turn = False
        self._user_turn_done = False
        self._follow = True
        self.scroll_area.hide()
        self.placeholder.show()

    # -- reading ---------------------------------------------------------------------------------------------------

    def entries(self) -> list[tuple[Role, str]]:
        """(role, text) of every entry, oldest first."""
        return [(entry.role, entry.text()) for entry in self._entries]

    def entry_widgets(self) -> list[TranscriptEntry]:
        return list(self._entries)

    def plain_text(self) -> str:
        """The conversation as readable text ("You: …", "Assistant: …", tool calls with their header)."""
        lines = []
        for entry in self._entries:
            if entry.role is Role.TOOL:
                lines.append(f"[{entry.header.text()}]\n{entry.text()}")
            else:
                lines.append(f"{SPEAKER[entry.role]}: {entry.text()}")
        return "\n\n".join(lines)

    # -- internals -------------------------------------------------------------------------------------------------

    def _append(self, role: Role, delta: str) -> None:
        delta = visible_text(delta)
        if not delta:
            return
        last = self._entries[-1] if self._entries else None
        new_user_turn = role is Role.USER and self._user_turn_done
        if last is None or last.role is not role or not self._open_turn or new_user_turn:
            if not delta.strip():
                return  # do not open a bubble with whitespace only
            last = TranscriptEntry(role, SPEAKER[role])
            self._add_entry(last)
            self._open_turn = True
            if role is Role.USER:
                self._user_turn_done = False
        last.append(delta)

    def _add_entry(self, entry: TranscriptEntry) -> None:
        row = QWidget()
        row_layout = QHBoxLayout(row)
        row_layout.setContentsMargins(0, 0, 0, 0)
        if entry.role is Role.USER:
            row_layout.addStretch(1)
            row_layout.addWidget(entry)
        else:
            row_layout.addWidget(entry)
            row_layout.addStretch(1)
        entry.setParent(row)
        entry.set_width_limit(self._bubble_width())
        self._list.insertWidget(self._list.count() - 1, row)
        self._entries.append(entry)
        if self.placeholder.isVisible() or not self.scroll_area.isVisibleTo(self):
            self.placeholder.hide()
            self.scroll_area.show()

    def _bubble_width(self) -> int:
        # From the view's own width: the scroll area's viewport is not laid out yet while it is hidden.
        margins = self._list.contentsMargins()
        scrollbar = self.scroll_area.verticalScrollBar().sizeHint().width()
        usable = self.width() - margins.left() - margins.right() - scrollbar
        return max(200, int(usable * _BUBBLE_WIDTH))

    def _keep_following(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.scroll_area.verticalScrollBar().setValue(maximum)

    def _track_follow(self, value: int) -> None:
        self._follow = value >= self.scroll_area.verticalScrollBar().maximum() - 8

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        width = self._bubble_width()
        for entry in self._entries:
            entry.set_width_limit(width)
