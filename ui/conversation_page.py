"""The conversation page: transcript card, a tool call's consent prompt when one waits, the talk control between
the two level meters, the overlay.

Under the Assistant meter: its volume, mute and Stop (``ui.volume_control``).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QVBoxLayout, QWidget

from .contracts import Controller
from .level_meter import LevelMeter
from .overlay import FrameOverlay
from .talk_button import TalkControl
from .tool_consent import ConsentPrompt
from .transcript_view import TranscriptView
from .volume_control import VolumeControl


class ConversationPage(QWidget):
    """Lays out the conversation widgets; the window feeds them."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.transcript = TranscriptView(self)
        transcript_card = QFrame(self)
        transcript_card.setObjectName("ConversationCard")
        card_layout = QVBoxLayout(transcript_card)
        card_layout.setContentsMargins(1, 1, 1, 1)
        card_layout.addWidget(self.transcript)

        self.consent = ConsentPrompt(controller.answer_consent, self)

        self.mic_meter = LevelMeter("Microphone", self)
        self.speaker_meter = LevelMeter("Assistant", self)
        self.volume = VolumeControl(controller, self)
        self.talk = TalkControl(controller, self)
        # The volume row sits under the Assistant meter; an empty row of the same height under the
        # Microphone meter keeps the two bars level.
        balance = QWidget(self)
        balance.setFixedHeight(self.volume.sizeHint().height())
        controls = QHBoxLayout()
        controls.setContentsMargins(8, 4, 8, 0)
        controls.setSpacing(24)
        controls.addLayout(_column(self.mic_meter, balance), 1)
        controls.addWidget(self.talk, 0, Qt.AlignmentFlag.AlignCenter)
        controls.addLayout(_column(self.speaker_meter, self.volume), 1)

        self.overlay = FrameOverlay(self)
        self.overlay_card = QFrame(self)
        self.overlay_card.setObjectName("OverlayCard")
        overlay_layout = QVBoxLayout(self.overlay_card)
        overlay_layout.setContentsMargins(0, 0, 0, 0)
        overlay_layout.addWidget(self.overlay)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(14)
        layout.addWidget(transcript_card, 1)
        layout.addWidget(self.consent)
        layout.addLayout(controls)
        layout.addWidget(self.overlay_card)

    def set_overlay_visible(self, visible: bool) -> None:
        self.overlay_card.setVisible(visible)


def _column(meter: QWidget, below: QWidget) -> QVBoxLayout:
    """A meter and the row under it, centred vertically beside the talk button."""
    column = QVBoxLayout()
    column.setSpacing(10)
    column.addStretch(1)
    column.addWidget(meter)
    column.addWidget(below)
    column.addStretch(1)
    return column
