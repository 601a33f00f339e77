"""The VoiceChat checkpoints already in the Hugging Face cache, each usable in place with one click.

Shown on the welcome page and in Settings → Model. The list comes from
``controller.cached_checkpoints()`` (scanned again whenever the section is shown, and by
"Look again"): a ready checkpoint has a "Use" button, which hands its snapshot folder to
``controller.use_checkpoint`` (nothing is copied); an incomplete one says what is missing and
has no button. Main thread only.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.hf_cache import CachedCheckpoint, CacheListing

from .contracts import Controller
from .theme import text_label

log = logging.getLogger(__name__)

RESCAN_AFTER_S = 2.0


class CachedModelsSection(QWidget):
    """The cache's VoiceChat snapshots: name, quantization, size, revision, and "Use" or what is missing."""

    # variant key, snapshot folder: after controller.use_checkpoint, or only picked where ``pick_only``
    checkpoint_used = Signal(str, object)
    listed = Signal()  # after each scan

    def __init__(
        self,
        controller: Controller,
        parent: QWidget | None = None,
        *,
        hide_when_empty: bool = False,
        pick_only: bool = False,
    ) -> None:
        """``pick_only``: "Use" only says which snapshot was picked (Settings, which applies on Save) instead of
        loading it at once (the welcome page)."""
        super().__init__(parent)
        self._controller = controller
        self._hide_when_empty = hide_when_empty
        self._pick_only = pick_only
        self.listing: CacheListing | None = None
        self._scanned_at = 0.0
        self.use_buttons: dict[Path, QPushButton] = {}
        self.status_labels: dict[Path, QLabel] = {}

        self.summary = text_label("", self, "muted")
        self.summary.setAccessibleName("Hugging Face cache")
        self.rows = QGridLayout()
        self.rows.setHorizontalSpacing(14)
        self.rows.setVerticalSpacing(8)
        self.rows.setColumnStretch(0, 1)
        self.rescan_button = QPushButton("Look again", self)
        self.rescan_button.setProperty("kind", "link")
        self.rescan_button.setAccessibleName("Scan the Hugging Face cache again")
        self.rescan_button.clicked.connect(self.refresh)
        header = QHBoxLayout()
        header.addWidget(self.summary, 1)
        header.addWidget(self.rescan_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addLayout(header)
        layout.addLayout(self.rows)
        self.refresh()

    def showEvent(self, event: QShowEvent) -> None:
        # Another tool may have downloaded (or deleted) a checkpoint since the page was last shown; a scan made a
        # moment ago (the card's, as the page appears) is not repeated.
        if time.monotonic() - self._scanned_at > RESCAN_AFTER_S:
            self.refresh()
        super().showEvent(event)

    def refresh(self) -> None:
        self._scanned_at = time.monotonic()
        try:
            listing = self._controller.cached_checkpoints()
        except Exception as exc:  # a scan failure is reported here; the page stays usable
            log.exception("Scanning the Hugging Face cache failed")
            self._show_rows(None, f"The Hugging Face cache could not be scanned: {exc}")
            return
        self._show_rows(listing, self._summary(listing))

    @staticmethod
    def _summary(listing: CacheListing) -> str:
        where = str(listing.cache_dir)
        if listing.note is not None:
            text = listing.note
        elif not listing.checkpoints:
            text = f"No VoiceChat checkpoint in the Hugging Face cache ({where})."
        else:
            text = f"Found in {where}; used in place, not copied."
        if listing.offline:
            text += " HF_HUB_OFFLINE is set: the cache is the only source."
        return text

    def _show_rows(self, listing: CacheListing | None, summary: str) -> None:
        self.listing = listing
        while self.rows.count():
            item = self.rows.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.use_buttons.clear()
        self.status_labels.clear()
        self.summary.setText(summary)
        entries = listing.checkpoints if listing is not None else ()
        for row, entry in enumerate(entries):
            self._add_row(row, entry)
        if self._hide_when_empty:
            self.setVisible(bool(entries))
        self.listed.emit()

    def _add_row(self, row: int, entry: CachedCheckpoint) -> None:
        name = text_label(entry.repo_id.split("/")[-1], self)
        name.setStyleSheet("font-weight: 600;")
        name.setToolTip(f"{entry.repo_id}\n{entry.path}")
        details = f"{entry.quantization} · {entry.size_text} · revision {entry.revision_text}"
        text = QWidget(self)
        column = QVBoxLayout(text)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(name)
        column.addWidget(text_label(details, text, "muted"))
        self.rows.addWidget(text, row, 0)
        if entry.ready:
            button = QPushButton(f"Use {entry.quantization}", self)
            button.setAccessibleName(f"Use the {entry.quantization} checkpoint {entry.repo_id} from the cache")
            button.clicked.connect(lambda _checked=False, chosen=entry: self.use(chosen))
            self.rows.addWidget(button, row, 1)
            self.use_buttons[entry.path] = button
        else:
            # What is missing goes under the name, where a shard's long file name has room.
            status = text_label(entry.why_not_ready, text, "warning")
            status.setAccessibleName(f"{entry.repo_id} is not ready")
            column.addWidget(status)
            self.rows.addWidget(text_label("Not ready", self, "muted"), row, 1)
            self.status_labels[entry.path] = status

    def use(self, entry: CachedCheckpoint) -> None:
        """Load that snapshot in place (or, ``pick_only``, pick it); an incomplete one is never passed on."""
        if not entry.ready or entry.variant is None:
            return
        if self._pick_only:
            self.checkpoint_used.emit(entry.variant.key, entry.path)
            return
        try:
            self._controller.use_checkpoint(entry.path)
        except Exception as exc:  # say it on the page, keep the list
            log.exception("use_checkpoint(%s) failed", entry.path)
            self.summary.setText(f"Could not use {entry.repo_id}: {exc}")
            return
        self.checkpoint_used.emit(entry.variant.key, entry.path)


class CachedModelsCard(QFrame):
    """The welcome page's card: a heading over the section, shown only when the cache holds a VoiceChat snapshot."""

    checkpoint_used = Signal(str, object)  # as CachedModelsSection.checkpoint_used

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Card")
        self._followed: QWidget | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 16, 20, 18)
        layout.setSpacing(10)
        layout.addWidget(text_label("Already in the Hugging Face cache", self, "heading"))
        self.section = CachedModelsSection(controller, self, hide_when_empty=True)
        self.section.checkpoint_used.connect(self.checkpoint_used)
        self.section.listed.connect(self._update)
        layout.addWidget(self.section)
        self._update()

    def follow(self, widget: QWidget) -> None:
        """Be shown only while ``widget`` (the page's other model choices) is: none is offered once one is loaded."""
        self._followed = widget
        widget.installEventFilter(self)
        self._update()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self._followed and event.type() == QEvent.Type.Show:
            self.section.refresh()  # the section cannot rescan while this card is hidden
        elif watched is self._followed and event.type() == QEvent.Type.Hide:
            self._update()
        return False

    def _update(self) -> None:
        listing = self.section.listing
        found = listing is not None and bool(listing.checkpoints)
        self.setVisible(found and (self._followed is None or not self._followed.isHidden()))
