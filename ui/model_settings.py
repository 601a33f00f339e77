"""The settings dialog's Model page: a folder per published variant and the one-click switch between them.

The variants come from ``app.variants`` (4-bit, 8-bit, bf16). The switch shows the variant
that is *loaded* (from the app's state snapshot) until the user picks another: with the demo
loaded, none is checked and the page says so. Like every setting, a pick applies on Save
(the controller checks the folder first and refuses one that does not hold that variant; the
dialog then stays open with the reason) and Cancel forgets it. A variant without a folder is
not picked; the page says where to get one. Below, the numerics (exact or fast), also applied
on Save, in place. Main thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from app.messages import AppState, StateChanged
from app.paths import models_dir
from app.settings import Settings
from app.variants import MODEL_VARIANTS, Variant, variant

from .cached_models import CachedModelsSection
from .contracts import Controller
from .download_choice import DownloadLayoutChoice
from .theme import muted_label, repolish

log = logging.getLogger(__name__)


NUMERICS_NOTE = (
    "Fast uses fused GPU kernels that read bf16 weights and keeps the voice's history in bf16: twice as fast or "
    "more on a large GPU, and half the memory a long conversation adds; results differ from the reference in the "
    "last digits, so speech, and now and then a word, can come out differently. Exact is the reference, bit for "
    "bit. Switching (on Save) needs no reload; the next conversation waits for the talk key."
)
KEEP_UP_NOTE = (
    "On a machine too slow for the 80 ms frame (memory-bound Macs), fast mode can spend less on the voice while it "
    "falls behind (two refinement samples instead of five) and return to full quality once it catches up. The "
    "overlay says when. The voice may sound a little different; the words do not change. Exact never does this."
)


class ModelSettingsPage(QWidget):
    """Checkpoint folders (with Browse…) and the switch between the loaded variants."""

    def __init__(self, controller: Controller, report: Callable[[str], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._report = report
        self._variant = controller.settings.active_variant  # the variant chosen here (saved as active_variant)
        self._picked: str | None = None  # the variant clicked in this dialog (loads on Save)
        self._loaded: Variant | None = None  # the variant actually loaded, from the state snapshot

        folders = QGroupBox("Checkpoint folders", self)
        form = QFormLayout(folders)
        form.setSpacing(10)
        self.folder_edits: dict[str, QLineEdit] = {}
        for offered in MODEL_VARIANTS:
            edit = QLineEdit(folders)
            edit.setPlaceholderText(f"Folder with {offered.folder_name}")
            edit.setAccessibleName(f"{offered.label} checkpoint folder")
            edit.setClearButtonEnabled(True)
            browse = QPushButton("Browse…", folders)
            browse.setAccessibleName(f"Browse for the {offered.label} checkpoint folder")
            browse.clicked.connect(lambda _checked=False, key=offered.key: self.browse(key))
            row = QHBoxLayout()
            row.addWidget(edit, 1)
            row.addWidget(browse)
            form.addRow(f"{offered.label}:", row)
            self.folder_edits[offered.key] = edit
        form.addRow(muted_label("Each folder holds config.json and the .safetensors files of one checkpoint.", folders))

        cached = QGroupBox("In the Hugging Face cache", self)
        self.cached_models = CachedModelsSection(controller, cached, pick_only=True)
        self.cached_models.checkpoint_used.connect(self._used_from_cache)
        QVBoxLayout(cached).addWidget(self.cached_models)

        active = QGroupBox("Model in use", self)
        self.variant_buttons: dict[str, QPushButton] = {}
        self.variant_group = QButtonGroup(self)
        toggle = QHBoxLayout()
        toggle.setSpacing(0)
        last = len(MODEL_VARIANTS) - 1
        for index, offered in enumerate(MODEL_VARIANTS):
            button = QPushButton(offered.label, active)
            button.setCheckable(True)
            button.setProperty("segment", "left" if index == 0 else "right" if index == last else "middle")
            button.setAccessibleName(f"Use the {offered.label} model")
            button.setToolTip(f"{offered.label}, {offered.download_gb} GB: {offered.note}")
            button.clicked.connect(lambda _checked=False, key=offered.key: self.switch_variant(key))
            self.variant_group.addButton(button)
            self.variant_buttons[offered.key] = button
            toggle.addWidget(button)
        toggle.addStretch(1)
        self.loaded_label = muted_label("", active)
        self.loaded_label.setAccessibleName("Model loaded now")
        self.variant_status = muted_label("", active)
        self.variant_status.setAccessibleName("Model switch status")
        box = QVBoxLayout(active)
        box.setSpacing(8)
        box.addLayout(toggle)
        box.addWidget(self.loaded_label)
        box.addWidget(
            muted_label(
                "4-bit is the fastest and fits most machines; 8-bit and bf16 are closer to the original and need "
                "more memory and speed (hover over each for its size). A switch applies on Save.",
                active,
            )
        )
        box.addWidget(self.variant_status)

        numerics = QGroupBox("Numerics", self)
        self.exact_radio = QRadioButton("Exact", numerics)
        self.exact_radio.setAccessibleName("Exact numerics")
        self.fast_radio = QRadioButton("Fast", numerics)
        self.fast_radio.setAccessibleName("Fast numerics")
        choice = QHBoxLayout()
        choice.addWidget(self.exact_radio)
        choice.addWidget(self.fast_radio)
        choice.addStretch(1)
        numerics_box = QVBoxLayout(numerics)
        numerics_box.addLayout(choice)
        numerics_box.addWidget(muted_label(NUMERICS_NOTE, numerics))
        self.keep_up_check = QCheckBox("Keep up when slow (fast mode): spend less on the voice while behind", numerics)
        self.keep_up_check.setAccessibleName("Keep up when frames fall behind, in fast mode")
        numerics_box.addWidget(self.keep_up_check)
        self.fast_radio.toggled.connect(self.keep_up_check.setEnabled)  # kept when exact is picked, used only in fast
        self.keep_up_check.setEnabled(False)
        numerics_box.addWidget(muted_label(KEEP_UP_NOTE, numerics))

        downloads = QGroupBox("New downloads go into", self)
        self.download_choice = DownloadLayoutChoice(models_dir(), downloads)
        QVBoxLayout(downloads).addWidget(self.download_choice)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.setSpacing(14)
        layout.addWidget(folders)
        layout.addWidget(cached)
        layout.addWidget(active)
        layout.addWidget(numerics)
        layout.addWidget(downloads)
        layout.addStretch(1)

    @property
    def numerics(self) -> str:
        """The numerics chosen here: "exact" or "fast"."""
        return "fast" if self.fast_radio.isChecked() else "exact"

    @property
    def keep_up(self) -> bool:
        return self.keep_up_check.isChecked()

    @property
    def download_layout(self) -> str:
        """Where new downloads go, as chosen here (app.download_layout.DOWNLOAD_LAYOUTS)."""
        return self.download_choice.layout_choice

    @property
    def variant(self) -> str | None:
        """The variant chosen to load at start (changed by the switch); None when none was ever chosen."""
        return self._variant

    def load(self, settings: Settings) -> None:
        self._variant = settings.active_variant
        self._picked = None
        self.exact_radio.setChecked(settings.numerics == "exact")
        self.fast_radio.setChecked(settings.numerics == "fast")
        self.keep_up_check.setChecked(settings.keep_up)
        self.download_choice.set_layout_choice(settings.download_layout)
        for key, edit in self.folder_edits.items():
            folder = settings.checkpoint_for(key)
            edit.setText("" if folder is None else str(folder))
        self._check_loaded()

    def show_status(self, status: StateChanged) -> None:
        """Check the variant that is loaded now (unless another is picked), and say what is loaded (or loading)."""
        self._loaded = status.model.variant if status.model is not None else None
        if status.state is AppState.LOADING:
            self.loaded_label.setText("Loading a model…")
        elif status.model is None:
            self.loaded_label.setText("No model is loaded.")
        elif status.model.variant.demo:
            self.loaded_label.setText("The demo is loaded (noise, not speech). Choose a model above to use it.")
        elif status.model.random_weights:
            self.loaded_label.setText(
                f"Loaded: {status.model.name} · {status.model.variant.label}, random weights (noise, not speech)."
            )
        else:
            self.loaded_label.setText(f"Loaded: {status.model.description}.")
        self._check_loaded()

    @property
    def picked(self) -> str | None:
        """The variant picked here to load on Save; None when none was picked, or the pick is the one loaded."""
        loaded = self._loaded.key if self._loaded is not None else None
        return self._picked if self._picked != loaded else None

    def _check_loaded(self) -> None:
        # The picked variant is checked, else the loaded one: with the demo (or nothing) loaded and none picked, none.
        shown = self.picked or (self._loaded.key if self._loaded is not None else None)
        self.variant_group.setExclusive(False)
        for key, button in self.variant_buttons.items():
            button.setChecked(key == shown)
        self.variant_group.setExclusive(True)

    def folders(self) -> dict[str, Path]:
        """The folders as typed (``~`` expanded), for the variants that have one."""
        found: dict[str, Path] = {}
        for key, edit in self.folder_edits.items():
            text = edit.text().strip()
            if text:
                found[key] = Path(text).expanduser()
        return found

    def check_folders(self, settings: Settings) -> None:
        """Raise ``ValueError`` naming the first configured folder that does not exist (and mark its field)."""
        problem: str | None = None
        for key, edit in self.folder_edits.items():
            folder = settings.checkpoint_for(key)
            invalid = folder is not None and not folder.is_dir()
            edit.setProperty("invalid", invalid)
            repolish(edit)
            if invalid and problem is None:
                problem = f"The {variant(key).label} folder {folder} does not exist."
        if problem is not None:
            raise ValueError(problem)

    def has_invalid_folder(self) -> bool:
        return any(edit.property("invalid") for edit in self.folder_edits.values())

    def browse(self, key: str) -> None:
        label = variant(key).label
        current = self.folder_edits[key].text().strip()
        chosen = QFileDialog.getExistingDirectory(
            self, f"Choose the {label} checkpoint folder", current or str(Path.home())
        )
        if not chosen:
            return
        self.folder_edits[key].setText(chosen)
        if not (Path(chosen) / "config.json").is_file():
            self._report(f"{chosen} has no config.json — is it a VoiceChat checkpoint folder?")

    def switch_variant(self, key: str) -> None:
        """Pick ``key`` to load when the dialog is saved (nothing changes before Save; Cancel forgets it)."""
        chosen = variant(key)
        folder = self.folders().get(key)
        if folder is None:
            self._check_loaded()
            self.variant_status.setText(
                f"Choose the {chosen.label} folder above first, or get the model with File → Get a Model…."
            )
            return
        self._variant = self._picked = key
        self._check_loaded()
        loaded = self._loaded.key if self._loaded is not None else None
        if key == loaded:
            self.variant_status.setText("")
        else:
            self.variant_status.setText(
                f"The {chosen.label} model loads when you press Save; the next conversation waits for the talk key."
            )

    def _used_from_cache(self, key: str, path: Path) -> None:
        """A ready snapshot in the Hugging Face cache was picked: it becomes that variant's folder (used in place,
        nothing copied) and that variant is picked, to load on Save like any other choice here."""
        self.folder_edits[key].setText(str(path))
        self.switch_variant(key)
