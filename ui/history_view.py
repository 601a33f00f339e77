"""Conversation → History…: past conversations, listed, read, replayed, exported and deleted.

One window (not modal: the conversation goes on beside it). The list comes from
``controller.history_entries()``, newest first; a damaged entry is listed too, marked with
a warning and its reason, and the others stay usable. Selecting one shows its transcript;
*Play* replays both sides as they happened through the speaker (``controller.replay_history``;
its progress arrives as ``ReplayProgress`` through :meth:`HistoryWindow.show_replay`),
*Export…* copies its files (WAV, transcript, profile) into a folder, *Delete* removes it after
asking. Each entry shows its date, length, size, model and numerics (what an older entry recorded) and its
first words; like the main transcript it leaves out what is not text for people (markers, U+FFFD, control
characters: :func:`ui.transcript_view.visible_text`), which the saved files keep. The window refreshes itself
when a conversation is kept (:meth:`refresh`). Every controller call is guarded: a failure shows in the
window's status line. Main thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.history import DamagedEntry, HistoryEntry
from app.messages import ReplayProgress

from .contracts import Controller
from .theme import colors, muted_label
from .transcript_view import visible_text

log = logging.getLogger(__name__)

T = TypeVar("T")
ENTRY_ROLE: Final = Qt.ItemDataRole.UserRole
DAMAGED_ROLE: Final = Qt.ItemDataRole.UserRole + 1
FIRST_WORDS_SHOWN: Final = 44


def format_duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds + 0.5), 60)
    return f"{minutes}:{rest:02d}"


def format_size(size: int) -> str:
    if size >= 1024**3:
        return f"{size / 1024**3:.1f} GB"
    if size >= 1024**2:
        return f"{size / 1024**2:.1f} MB"
    return f"{max(1, round(size / 1024))} KB"


def model_words(entry: HistoryEntry) -> str:
    """``"tiny4 · 4-bit · exact numerics"``: what is known of the model (entries kept before it was recorded
    have neither, or only one)."""
    parts = [entry.model] if entry.model else []
    if entry.numerics:
        parts.append(f"{entry.numerics} numerics")
    return " · ".join(parts)


def entry_label(entry: HistoryEntry) -> str:
    """``"Mon 30 Nov 2026, 23:15 · 2:41 · 8.5 MB"`` (local time), the model and numerics, then the first words."""
    started = entry.started.astimezone().strftime("%a %d %b %Y, %H:%M")
    shown = " ".join(visible_text(entry.first_words).split())
    words = shown if len(shown) <= FIRST_WORDS_SHOWN else shown[:FIRST_WORDS_SHOWN] + "…"
    first = f"“{words}”" if words else "(no words, audio only)"
    model = model_words(entry)
    lines = [f"{started} · {format_duration(entry.duration_s)} · {format_size(entry.size_bytes)}"]
    return "\n".join([*lines, model, first] if model else [*lines, first])


class HistoryWindow(QDialog):
    """The History view (see the module docstring)."""

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._playing: str | None = None
        self.setWindowTitle("Conversation History")
        self.setMinimumSize(720, 460)
        self.setModal(False)

        self.summary = muted_label("", self)
        self.summary.setAccessibleName("History summary")
        self.damage = QLabel(self)
        self.damage.setWordWrap(True)
        self.damage.setProperty("role", "warning")
        self.damage.setAccessibleName("Damaged conversations")
        self.damage.hide()

        self.list = QListWidget(self)
        self.list.setObjectName("HistoryList")
        self.list.setAccessibleName("Past conversations")
        self.list.setMinimumWidth(320)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.currentItemChanged.connect(lambda _new, _old: self._selected())
        self.transcript = QPlainTextEdit(self)
        self.transcript.setReadOnly(True)
        self.transcript.setAccessibleName("Transcript of the selected conversation")
        self.transcript.setPlaceholderText("Select a conversation to read it here.")
        splitter = QSplitter(self)
        splitter.addWidget(self.list)
        splitter.addWidget(self.transcript)
        splitter.setStretchFactor(1, 1)

        self.play_button = QPushButton("Play", self)
        self.play_button.setToolTip("Replay both sides of the conversation through the speaker")
        self.play_button.clicked.connect(self.toggle_play)
        self.export_button = QPushButton("Export…", self)
        self.export_button.setToolTip("Copy its audio, transcript and profile into a folder")
        self.export_button.clicked.connect(self.export_selected)
        self.delete_button = QPushButton("Delete…", self)
        self.delete_button.clicked.connect(self.delete_selected)
        self.folder_button = QPushButton("Open Folder", self)
        self.folder_button.setToolTip("Show the history folder in the file browser")
        self.folder_button.clicked.connect(self.open_folder)
        self.status = muted_label("", self)
        self.status.setAccessibleName("History status")
        buttons = QHBoxLayout()
        for button in (self.play_button, self.export_button, self.delete_button):
            buttons.addWidget(button)
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.folder_button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 14, 16, 14)
        layout.setSpacing(10)
        layout.addWidget(self.summary)
        layout.addWidget(self.damage)
        layout.addWidget(splitter, 1)
        layout.addLayout(buttons)
        self.refresh()

    # -- the list --------------------------------------------------------------------------------------------------

    @property
    def selected_id(self) -> str | None:
        item = self.list.currentItem()
        return None if item is None else str(item.data(ENTRY_ROLE))

    @property
    def selected_damaged(self) -> bool:
        item = self.list.currentItem()
        return item is not None and bool(item.data(DAMAGED_ROLE))

    def refresh(self) -> None:
        """Read the history again, keeping the selection where it can."""
        keep = self.selected_id
        ok, listing = self._attempt("read the history", self._controller.history_entries)
        if not ok or listing is None:
            return
        self.list.clear()
        for entry in listing.entries:
            item = QListWidgetItem(entry_label(entry))
            item.setData(ENTRY_ROLE, entry.id)
            item.setToolTip(
                f"{entry.path}\n{format_size(entry.size_bytes)}\n{model_words(entry) or 'Model not recorded'}"
            )
            self.list.addItem(item)
        for damaged in listing.damaged:
            self.list.addItem(self._damaged_item(damaged))
        settings = self._controller.settings
        total = sum(entry.size_bytes for entry in listing.entries)
        if not listing.entries and not listing.damaged:
            self.summary.setText(
                "No conversations yet: each one is kept here when it ends."
                if settings.history
                else "No conversations kept. Saving them is off (Settings → History)."
            )
        else:
            count = len(listing.entries)
            saving = (
                f"limit {settings.history_limit_gb:g} GB, the oldest go first"
                if settings.history
                else "saving new ones is off (Settings → History)"
            )
            self.summary.setText(f"{count} conversation{'s' if count != 1 else ''}, {format_size(total)}; {saving}.")
        if listing.damaged:
            n = len(listing.damaged)
            self.damage.setText(
                f"⚠ {n} conversation{'s' if n != 1 else ''} could not be read and {'are' if n != 1 else 'is'} "
                "marked below; the others are fine. You can delete a damaged one."
            )
        self.damage.setVisible(bool(listing.damaged))
        rows = {str(self.list.item(row).data(ENTRY_ROLE)): row for row in range(self.list.count())}
        self.list.setCurrentRow(rows.get(keep or "", 0 if self.list.count() else -1))
        self._selected()

    def _damaged_item(self, damaged: DamagedEntry) -> QListWidgetItem:
        item = QListWidgetItem(f"⚠ Damaged, cannot be read\n{damaged.id}")
        item.setForeground(colors().qcolor("warning"))
        item.setData(ENTRY_ROLE, damaged.id)
        item.setData(DAMAGED_ROLE, True)
        item.setToolTip(damaged.reason)
        return item

    def _selected(self) -> None:
        entry_id = self.selected_id
        damaged = self.selected_damaged
        for button in (self.play_button, self.export_button):
            button.setEnabled(entry_id is not None and not damaged)
        self.delete_button.setEnabled(entry_id is not None)
        if self._playing is not None:
            self.play_button.setEnabled(True)  # Stop stays reachable
        if entry_id is None:
            self.transcript.clear()
            return
        if damaged:
            item = self.list.currentItem()
            self.transcript.setPlainText(f"This conversation could not be read:\n\n{item.toolTip()}")
            return
        ok, loaded = self._attempt("read the conversation", lambda: self._controller.load_history(entry_id))
        if not ok or loaded is None:
            self.transcript.clear()
            return
        lines = []
        for line in sorted(loaded.transcript, key=lambda line: line.seconds):
            minutes, seconds = divmod(line.seconds, 60)
            lines.append(f"[{int(minutes):02d}:{seconds:04.1f}] {line.role}: {visible_text(line.text).strip()}")
        self.transcript.setPlainText("\n\n".join(lines) or "(Nothing was said in words: the audio is kept.)")

    # -- actions ---------------------------------------------------------------------------------------------------

    def toggle_play(self) -> None:
        if self._playing is not None:
            self._attempt("stop the replay", self._controller.stop_replay)
            self.show_replay(ReplayProgress(None))
            return
        entry_id = self.selected_id
        if entry_id is None or self.selected_damaged:
            return
        ok, duration = self._attempt("play the conversation", lambda: self._controller.replay_history(entry_id))
        if ok and duration is not None:
            self.show_replay(ReplayProgress(entry_id, 0.0, duration))

    def show_replay(self, progress: ReplayProgress) -> None:
        """A replay's progress (or its end, with ``entry_id`` None)."""
        self._playing = progress.entry_id
        if progress.entry_id is None:
            self.play_button.setText("Play")
            self.status.setText("")
        else:
            self.play_button.setText("Stop")
            self.status.setText(
                f"Playing {format_duration(progress.position_s)} of {format_duration(progress.duration_s)}"
            )
        self._selected()

    def export_selected(self) -> None:
        entry_id = self.selected_id
        if entry_id is None or self.selected_damaged:
            return
        chosen = QFileDialog.getExistingDirectory(self, "Export the Conversation Into", str(Path.home()))
        if not chosen:
            return
        ok, paths = self._attempt(
            "export the conversation", lambda: self._controller.export_history(entry_id, Path(chosen))
        )
        if ok and paths:
            self.status.setText(f"Exported {len(paths)} files to {paths[0].parent}")

    def delete_selected(self) -> None:
        entry_id = self.selected_id
        if entry_id is None:
            return
        item = self.list.currentItem()
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Delete the Conversation?")
        box.setText(f"Delete “{item.text()}” from the history?")
        box.setInformativeText("Its audio, transcript and profile are removed for good.")
        delete = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        if box.clickedButton() is not delete:
            return
        ok, _ = self._attempt("delete the conversation", lambda: self._controller.delete_history(entry_id))
        if ok:
            self.refresh()
            self.status.setText("Deleted.")

    def open_folder(self) -> None:
        ok, folder = self._attempt("find the history folder", self._controller.history_folder)
        if not ok or folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self.status.setText(f"Could not open a file browser. The history is in {folder}")

    def _attempt(self, what: str, call: Callable[[], T]) -> tuple[bool, T | None]:
        try:
            return True, call()
        except Exception as exc:  # shown here; the window stays usable
            log.exception("could not %s", what)
            self.status.setText(f"Could not {what}: {exc}")
            return False, None
