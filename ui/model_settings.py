"""The settings dialog's Model page: the two checkpoint folders and the one-click 4-bit/8-bit toggle.

The toggle acts at once: it saves an edited folder for that variant first (if any),
then calls ``controller.switch_variant``; the reload reports progress in the main
window and the conversation restarts. A variant without a folder is not switched to;
the page says what to do instead. Main thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from PySide6.QtWidgets import (
    QButtonGroup,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.settings import VARIANT_REPOS, VARIANT_SIZES_GB, VARIANTS, Settings

from .contracts import Controller
from .theme import repolish

log = logging.getLogger(__name__)

VARIANT_LABELS: Final = {"4bit": "4-bit", "8bit": "8-bit"}


def muted_label(text: str, parent: QWidget) -> QLabel:
    """A wrapped explanatory line in the secondary text colour."""
    label = QLabel(text, parent)
    label.setProperty("role", "muted")
    label.setWordWrap(True)
    return label


class ModelSettingsPage(QWidget):
    """Checkpoint folders (with Browse…) and the active-variant toggle."""

    def __init__(self, controller: Controller, report: Callable[[str], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._report = report
        self._variant = controller.settings.active_variant

        folders = QGroupBox("Checkpoint folders", self)
        form = QFormLayout(folders)
        form.setSpacing(10)
        self.folder_edits: dict[str, QLineEdit] = {}
        for variant in VARIANTS:
            label = VARIANT_LABELS[variant]
            edit = QLineEdit(folders)
            edit.setPlaceholderText(f"Folder with {VARIANT_REPOS[variant].split('/')[1]}")
            edit.setAccessibleName(f"{label} checkpoint folder")
            edit.setClearButtonEnabled(True)
            browse = QPushButton("Browse…", folders)
            browse.setAccessibleName(f"Browse for the {label} checkpoint folder")
            browse.clicked.connect(lambda _checked=False, v=variant: self.browse(v))
            row = QHBoxLayout()
            row.addWidget(edit, 1)
            row.addWidget(browse)
            form.addRow(f"{label}:", row)
            self.folder_edits[variant] = edit
        form.addRow(muted_label("Each folder holds config.json and the .safetensors files of one checkpoint.", folders))

        active = QGroupBox("Model in use", self)
        self.variant_buttons: dict[str, QPushButton] = {}
        self.variant_group = QButtonGroup(self)
        toggle = QHBoxLayout()
        toggle.setSpacing(0)
        for variant, segment in (("4bit", "left"), ("8bit", "right")):
            button = QPushButton(VARIANT_LABELS[variant], active)
            button.setCheckable(True)
            button.setProperty("segment", segment)
            button.setAccessibleName(f"Use the {VARIANT_LABELS[variant]} model")
            button.clicked.connect(lambda _checked=False, v=variant: self.switch_variant(v))
            self.variant_group.addButton(button)
            self.variant_buttons[variant] = button
            toggle.addWidget(button)
        toggle.addStretch(1)
        self.variant_status = muted_label("", active)
        self.variant_status.setAccessibleName("Model switch status")
        box = QVBoxLayout(active)
        box.setSpacing(8)
        box.addLayout(toggle)
        box.addWidget(
            muted_label(
                f"4-bit ({VARIANT_SIZES_GB['4bit']} GB) is faster and fits most machines. 8-bit "
                f"({VARIANT_SIZES_GB['8bit']} GB) is closer to the original but needs more memory and speed. "
                "Switching reloads the model right away and starts a new conversation.",
                active,
            )
        )
        box.addWidget(self.variant_status)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.setSpacing(14)
        layout.addWidget(folders)
        layout.addWidget(active)
        layout.addStretch(1)

    @property
    def variant(self) -> str:
        """The variant in use (changed by the toggle)."""
        return self._variant

    def load(self, settings: Settings) -> None:
        self._variant = settings.active_variant
        for variant, edit in self.folder_edits.items():
            folder = settings.checkpoint_for(variant)
            edit.setText("" if folder is None else str(folder))
        self.variant_buttons[settings.active_variant].setChecked(True)

    def folders(self) -> dict[str, Path | None]:
        """The folders as typed (``~`` expanded); ``None`` where empty."""
        found: dict[str, Path | None] = {}
        for variant, edit in self.folder_edits.items():
            text = edit.text().strip()
            found[variant] = Path(text).expanduser() if text else None
        return found

    def check_folders(self, settings: Settings) -> None:
        """Raise ``ValueError`` naming the first configured folder that does not exist (and mark its field)."""
        problem: str | None = None
        for variant, edit in self.folder_edits.items():
            folder = settings.checkpoint_for(variant)
            invalid = folder is not None and not folder.is_dir()
            edit.setProperty("invalid", invalid)
            repolish(edit)
            if invalid and problem is None:
                problem = f"The {VARIANT_LABELS[variant]} folder {folder} does not exist."
        if problem is not None:
            raise ValueError(problem)

    def has_invalid_folder(self) -> bool:
        return any(edit.property("invalid") for edit in self.folder_edits.values())

    def browse(self, variant: str) -> None:
        current = self.folder_edits[variant].text().strip()
        chosen = QFileDialog.getExistingDirectory(
            self, f"Choose the {VARIANT_LABELS[variant]} checkpoint folder", current or str(Path.home())
        )
        if not chosen:
            return
        self.folder_edits[variant].setText(chosen)
        if not (Path(chosen) / "config.json").is_file():
            self._report(f"{chosen} has no config.json — is it a VoiceChat checkpoint folder?")

    def switch_variant(self, variant: str) -> None:
        """The one-click toggle: reload the other checkpoint now."""
        if variant == self._variant:
            return
        folder = self.folders()[variant]
        if folder is None:
            self.variant_buttons[self._variant].setChecked(True)
            self.variant_status.setText(
                f"Choose the {VARIANT_LABELS[variant]} folder above first, or download "
                f"{VARIANT_REPOS[variant]} from the first-run screen."
            )
            return
        try:
            current = self._controller.settings
            if current.checkpoint_for(variant) != folder:
                self._controller.apply_settings(current.with_changes(**{f"checkpoint_{variant}": folder}))
            self._controller.switch_variant(variant)
        except Exception as exc:  # report on the page, keep the previous choice
            log.exception("switch_variant(%s) failed", variant)
            self.variant_buttons[self._variant].setChecked(True)
            self.variant_status.setText(f"Could not switch to {VARIANT_LABELS[variant]}: {exc}")
            return
        self._variant = variant
        self.variant_status.setText(
            f"Loading the {VARIANT_LABELS[variant]} model — progress shows in the main window; "
            "the conversation starts over."
        )
