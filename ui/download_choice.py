"""Where a new download goes: the Hugging Face cache (the default) or Parley's own folder.

Shown on the welcome page's download card (a change applies at once) and on Settings → Model (applies on Save).
The default is the Hugging Face cache: mlx-vlm, mlx-audio and ``hf download`` keep the same checkpoints there, so
the model is stored once, each tool finds what the others downloaded, and ``hf cache`` lists and removes it.
Main thread only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QButtonGroup, QHBoxLayout, QPushButton, QRadioButton, QVBoxLayout, QWidget

from app.download_layout import DOWNLOAD_LAYOUTS, HUB_CACHE, PARLEY_FOLDER
from app.hf_cache import hub_cache_dir

from .theme import muted_label

_PATH_INDENT: Final = 24  # under a radio button's text, past its indicator
DEFAULT_NOTE: Final = (
    "The Hugging Face cache is the default: mlx-vlm, mlx-audio and the hf command keep their models there too, so "
    "the model is stored once and every tool finds it."
)


class DownloadLayoutChoice(QWidget):
    """Two radio buttons (the cache, with its folder; Parley's folder, with Change… when offered) and a note."""

    changed = Signal(str)  # the layout picked by the user (app.download_layout.DOWNLOAD_LAYOUTS)
    change_folder_requested = Signal()

    def __init__(self, parley_folder: Path, parent: QWidget | None = None, *, can_change_folder: bool = False) -> None:
        super().__init__(parent)
        self.cache_radio = QRadioButton("Hugging Face cache (the default), shared with other tools", self)
        self.cache_radio.setAccessibleName("Download into the Hugging Face cache, shared with other tools")
        self.parley_radio = QRadioButton("Parley's own folder", self)
        self.parley_radio.setAccessibleName("Download into Parley's own folder")
        group = QButtonGroup(self)
        group.addButton(self.cache_radio)
        group.addButton(self.parley_radio)
        self.cache_radio.toggled.connect(self._toggled)

        parley_row = QHBoxLayout()
        parley_row.setContentsMargins(0, 0, 0, 0)
        parley_row.addWidget(self.parley_radio, 1)
        self.change_button: QPushButton | None = None
        if can_change_folder:
            change = QPushButton("Change…", self)
            change.setProperty("kind", "link")
            change.setAccessibleName("Change Parley's download folder")
            change.clicked.connect(self.change_folder_requested)
            parley_row.addWidget(change)
            self.change_button = change

        # The folders on lines of their own, indented under their buttons: a long path wraps instead of being cut.
        self.cache_path = muted_label("", self)
        self.parley_path = muted_label("", self)
        for path_label in (self.cache_path, self.parley_path):
            path_label.setContentsMargins(_PATH_INDENT, 0, 0, 0)
            path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(self.cache_radio)
        column.addWidget(self.cache_path)
        column.addLayout(parley_row)
        column.addWidget(self.parley_path)
        column.addSpacing(4)
        column.addWidget(muted_label(DEFAULT_NOTE, self))
        self.set_parley_folder(parley_folder)
        self.set_layout_choice(DOWNLOAD_LAYOUTS[0])

    @property
    def layout_choice(self) -> str:
        return HUB_CACHE if self.cache_radio.isChecked() else PARLEY_FOLDER

    def set_layout_choice(self, layout: str) -> None:
        """Show ``layout`` as chosen, without announcing it as the user's change."""
        self.cache_radio.blockSignals(True)
        self.cache_radio.setChecked(layout == HUB_CACHE)
        self.parley_radio.setChecked(layout == PARLEY_FOLDER)
        self.cache_radio.blockSignals(False)
        self._update_enabled()

    def set_parley_folder(self, folder: Path) -> None:
        cache = hub_cache_dir()
        self.cache_path.setText(f"{cache} (from HF_HUB_CACHE or HF_HOME when set)")
        self.parley_path.setText(str(folder))
        self.parley_path.setAccessibleName("Parley's download folder")

    def _toggled(self, _checked: bool) -> None:
        self._update_enabled()
        self.changed.emit(self.layout_choice)

    def _update_enabled(self) -> None:
        if self.change_button is not None:
            self.change_button.setEnabled(self.parley_radio.isChecked())  # a disabled parent still disables it
