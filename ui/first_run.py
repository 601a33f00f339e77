"""The first-run page, shown in the window while no model is loaded.

Three ways to get a model: download a published checkpoint (4-bit, 8-bit or bf16, with
progress, speed and cancel; resuming is the controller's job), point at a folder that
is already on disk, or start the demo checkpoint — clearly marked as making noise, not
speech. While a model loads the page shows progress; once it is loaded it shows the
speed check's verdict in plain words and a button to start. Nothing runs, and nothing
plays, until that button (or the talk key) is pressed. What is loading or loaded comes
only from the app's ``StateChanged`` snapshots. Main thread only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.download_layout import HUB_CACHE
from app.hf_cache import hub_cache_dir
from app.messages import AppState, DownloadProgress, ModelLoaded, SpeedCheck, StateChanged
from app.paths import models_dir, resource_path
from app.variants import MODEL_VARIANTS, Q4, variant

from .cached_models import CachedModelsCard
from .contracts import Controller
from .download_choice import DownloadLayoutChoice
from .download_status import DownloadStatus
from .theme import text_label

DEMO_NOISE: Final = (
    "The demo uses a tiny model with random weights: the window, meters and overlay work, but the assistant "
    "makes noise, not speech. It plays quietly; the volume control is next to the Assistant meter."
)


def _card(parent: QWidget) -> tuple[QFrame, QVBoxLayout]:
    card = QFrame(parent)
    card.setObjectName("Card")
    layout = QVBoxLayout(card)
    layout.setContentsMargins(20, 16, 20, 18)
    layout.setSpacing(10)
    return card, layout


class FirstRunPage(QWidget):
    """Download / choose folder / demo; then load progress; then the speed verdict."""

    start_requested = Signal()  # "Start talking" after a model loaded

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._controller = controller
        self._download_root = models_dir()
        self._downloading: str | None = None
        self._status = DownloadStatus()
        self.loaded: ModelLoaded | None = None
        self._loading = False
        self._verdict: SpeedCheck | None = None

        content = QWidget()
        column = QVBoxLayout(content)
        column.setContentsMargins(32, 28, 32, 28)
        column.setSpacing(16)

        header = QHBoxLayout()
        header.setSpacing(16)
        icon = QLabel(content)
        icon.setPixmap(QIcon(str(resource_path("parley.svg"))).pixmap(56, 56))
        icon.setFixedSize(56, 56)
        titles = QVBoxLayout()
        titles.setSpacing(4)
        self.title = text_label("Welcome to Parley", content, "title")
        self.subtitle = text_label("", content, "muted")
        titles.addWidget(self.title)
        titles.addWidget(self.subtitle)
        header.addWidget(icon, 0, Qt.AlignmentFlag.AlignTop)
        header.addLayout(titles, 1)
        column.addLayout(header)

        column.addWidget(self._build_status_card(content))
        self.cached_card = CachedModelsCard(controller, content)  # checkpoints already in the Hugging Face cache
        self.cached_card.checkpoint_used.connect(lambda _key, path: self._show_loading(f"Opening {path}…"))
        column.addWidget(self.cached_card)
        column.addWidget(self._build_download_card(content))
        self.cached_card.follow(self.download_card)
        column.addWidget(self._build_other_sources(content))
        column.addStretch(1)

        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(content)
        content.setMaximumWidth(760)
        outer = QHBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        scroll.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.setAccessibleName("Set up a model")
        self._show_choices()

    # -- building --------------------------------------------------------------------------------------------------

    def _build_download_card(self, parent: QWidget) -> QFrame:
        card, layout = _card(parent)
        self.download_card = card
        layout.addWidget(text_label("Download the model", card, "heading"))
        layout.addWidget(
            text_label(
                "From Hugging Face (mlx-community). An interrupted download continues where it stopped.", card, "muted"
            )
        )
        grid = QGridLayout()
        grid.setHorizontalSpacing(14)
        grid.setVerticalSpacing(10)
        self.download_buttons: dict[str, QPushButton] = {}
        for row, offered in enumerate(MODEL_VARIANTS):
            name = text_label(f"{offered.label} · {offered.download_gb} GB", card)
            name.setStyleSheet("font-weight: 600;")
            note = text_label(offered.note, card, "muted")
            button = QPushButton(f"Download {offered.label}", card)
            button.setAccessibleName(f"Download the {offered.label} model, {offered.download_gb} gigabytes")
            if offered == Q4:
                button.setProperty("kind", "primary")
            button.clicked.connect(lambda _checked=False, key=offered.key: self.start_download(key))
            grid.addWidget(name, row, 0)
            grid.addWidget(note, row, 1)
            grid.addWidget(button, row, 2)
            self.download_buttons[offered.key] = button
        grid.setColumnStretch(1, 1)
        layout.addLayout(grid)

        layout.addWidget(text_label("Save it in", card, "heading"))
        self.layout_choice = DownloadLayoutChoice(self._download_root, card, can_change_folder=True)
        self.layout_choice.set_layout_choice(self._controller.settings.download_layout)
        self.layout_choice.changed.connect(self._layout_chosen)
        self.layout_choice.change_folder_requested.connect(self._choose_download_root)
        layout.addWidget(self.layout_choice)

        self.download_progress = QProgressBar(card)
        self.download_progress.setAccessibleName("Download progress")
        self.download_text = text_label("", card, "muted")
        self.cancel_button = QPushButton("Cancel download", card)
        self.cancel_button.clicked.connect(self.cancel_download)
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.download_text, 1)
        progress_row.addWidget(self.cancel_button)
        layout.addWidget(self.download_progress)
        layout.addLayout(progress_row)
        return card

    def _build_other_sources(self, parent: QWidget) -> QWidget:
        row = QWidget(parent)
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(16)

        folder_card, folder = _card(row)
        folder.addWidget(text_label("Already downloaded?", folder_card, "heading"))
        folder.addWidget(text_label("Use a checkpoint folder that is already on this computer.", folder_card, "muted"))
        folder.addStretch(1)
        self.folder_button = QPushButton("Choose folder…", folder_card)
        self.folder_button.setAccessibleName("Use a checkpoint folder on this computer")
        self.folder_button.clicked.connect(self.choose_folder)
        folder.addWidget(self.folder_button, 0, Qt.AlignmentFlag.AlignLeft)

        demo_card, demo = _card(row)
        demo.addWidget(text_label("Just looking around?", demo_card, "heading"))
        demo.addWidget(text_label(DEMO_NOISE, demo_card, "muted"))
        demo.addStretch(1)
        self.demo_button = QPushButton("Load the demo (noise, not speech)", demo_card)
        self.demo_button.setAccessibleName("Load the demo checkpoint, which makes noise, not speech")
        self.demo_button.clicked.connect(self.start_demo)
        demo.addWidget(self.demo_button, 0, Qt.AlignmentFlag.AlignLeft)

        layout.addWidget(folder_card, 1)
        layout.addWidget(demo_card, 1)
        self.other_sources = row
        self.demo_card = demo_card
        return row

    def _build_status_card(self, parent: QWidget) -> QFrame:
        card, layout = _card(parent)
        self.status_card = card
        self.status_title = text_label("", card, "heading")
        self.status_text = text_label("", card, "muted")
        self.status_text.setAccessibleName("Model status")
        self.load_progress = QProgressBar(card)
        self.load_progress.setAccessibleName("Loading progress")
        self.verdict = text_label("", card)
        self.verdict.setStyleSheet("font-weight: 600;")
        self.verdict.setAccessibleName("Speed check")
        self.start_button = QPushButton("Start talking", card)
        self.start_button.setProperty("kind", "primary")
        self.start_button.clicked.connect(self.start_requested)
        layout.addWidget(self.status_title)
        layout.addWidget(self.status_text)
        layout.addWidget(self.load_progress)
        layout.addWidget(self.verdict)
        layout.addWidget(self.start_button, 0, Qt.AlignmentFlag.AlignLeft)
        return card

    # -- user actions ----------------------------------------------------------------------------------------------

    def download_target(self, key: str) -> Path:
        """Where the variant ``key`` is downloaded to: the Hugging Face cache folder (its ``models--…`` layout), or
        ``<Parley's download folder>/<repository name>``, as chosen."""
        if self.layout_choice.layout_choice == HUB_CACHE:
            return hub_cache_dir()
        return self._download_root / variant(key).folder_name

    def start_download(self, key: str) -> None:
        repo = variant(key).repo
        assert repo is not None
        self._downloading = repo
        self._status.reset()
        self._controller.start_download(repo, self.download_target(key), self.layout_choice.layout_choice)
        self._set_downloading(True)
        self.download_progress.setRange(0, 0)
        self.download_text.setText(f"Starting the download of {repo}…")

    def cancel_download(self) -> None:
        self._controller.cancel_download()
        self._downloading = None
        self._set_downloading(False)
        self.download_text.setText("Download cancelled. What was already downloaded is kept for next time.")
        self.download_text.show()
        self._show_choices()

    def choose_folder(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Choose a VoiceChat checkpoint folder", str(Path.home()))
        if chosen:
            # Progress follows from the state once the folder passes its checks; a refused folder is a banner, and
            # whatever was loaded (the demo) stays offered here.
            self._controller.use_checkpoint(Path(chosen))

    def start_demo(self) -> None:
        self._controller.start_demo()
        self._show_loading("Preparing the demo checkpoint…")

    def _choose_download_root(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Download models into", str(self._download_root))
        if chosen:
            self._download_root = Path(chosen)
            self.layout_choice.set_parley_folder(self._download_root)

    def _layout_chosen(self, layout: str) -> None:
        """Remembered at once (saved with the settings), so Settings → Model and the next launch agree."""
        settings = self._controller.settings
        if settings.download_layout != layout:
            self._controller.apply_settings(settings.with_changes(download_layout=layout))

    # -- messages from the app core --------------------------------------------------------------------------------

    def handle_download_progress(self, progress: DownloadProgress) -> None:
        if progress.failed:
            self._downloading = None
            self._set_downloading(False)
            reason = (progress.message or "The download failed").rstrip(".")
            self.download_text.setText(f"{reason}. Press Download to try again — finished files are kept.")
            self.download_text.show()
            return
        if progress.finished:
            self._downloading = None
            self._set_downloading(False)
            self.download_text.setText(progress.message or "Download complete.")
            self.download_text.show()
            self._show_loading("Download complete — loading the model…")
            return
        if self._downloading is None:  # a late report after Cancel: show its words, stay cancelled
            if progress.message:
                self.download_text.setText(progress.message)
            return
        self._set_downloading(True)
        view = self._status.update(progress, time.monotonic())
        if view.fraction is None:
            self.download_progress.setRange(0, 0)
        else:
            self.download_progress.setRange(0, 1000)
            self.download_progress.setValue(round(view.fraction * 1000))
        self.download_text.setText(view.text)
        self.download_progress.setAccessibleDescription(view.text)

    def show_status(self, status: StateChanged) -> None:
        """Follow the app state: load progress while loading, then what loaded (the demo keeps the choices)."""
        if status.state is AppState.LOADING:
            if not self._loading:
                self._verdict = None  # a new load: its own speed check follows
            self._loading = True
            self.loaded = None
            self._show_loading(status.detail)
            fraction = -1.0 if status.progress is None else status.progress
            if fraction < 0:
                self.load_progress.setRange(0, 0)
            else:
                self.load_progress.setRange(0, 1000)
                self.load_progress.setValue(round(min(1.0, fraction) * 1000))
            return
        self._loading = False
        if status.model is not None and status.model != self.loaded:
            self.loaded = status.model
            self._show_loaded(keep_choices=status.model.variant.demo)
            self.start_button.setFocus()

    def open_setup(self) -> None:
        """Offer the choices again (from the menu); a loaded model stays one click away."""
        self._show_choices()
        if self.loaded is not None:
            self._show_loaded(keep_choices=True)

    def handle_speed_check(self, check: SpeedCheck) -> None:
        self._verdict = check
        self.verdict.setText(f"{check.verdict} (realtime factor {check.realtime_factor:.2f}; below 1 keeps up.)")
        self.verdict.setVisible(self.loaded is not None)

    def handle_failure(self, message: str) -> None:
        """A load or download failed: offer the choices again, with the reason."""
        self._show_choices()
        self.status_card.show()
        self.load_progress.hide()
        self.start_button.hide()
        self.verdict.hide()
        self.status_title.setText("That did not work")
        self.status_text.setText(message)

    def reset(self) -> None:
        """Back to the three choices (no model is loaded)."""
        self.loaded = None
        self._show_choices()

    # -- internals -------------------------------------------------------------------------------------------------

    def _show_loaded(self, *, keep_choices: bool) -> None:
        loaded = self.loaded
        assert loaded is not None
        how = (
            "Press the talk key to open the microphone, then just talk (hands-free)."
            if self._controller.settings.hands_free
            else "Hold the talk key and speak; let go to hear the answer."
        )
        # One story per page: the demo (and any random-weight checkpoint) is a try-out, not a model to talk to.
        if loaded.variant.demo:
            self.title.setText("Try Parley with the demo")
            self.subtitle.setText(f"A stand-in until you get the model: it makes noise, not speech. {how}")
        elif loaded.random_weights:
            self.title.setText("A random-weight model is loaded")
            self.subtitle.setText(f"{loaded.name} makes noise, not speech. {how}")
        else:
            self.title.setText("You are all set")
            self.subtitle.setText(f"{loaded.description} is loaded. {how}")
        self.download_card.setVisible(keep_choices)
        self.other_sources.setVisible(keep_choices)
        self.demo_card.setVisible(not loaded.variant.demo)
        self._set_buttons_enabled(True)
        self.status_card.show()
        self.load_progress.hide()
        if loaded.variant.demo:
            self.status_title.setText("Demo ready — noise, not speech")
            self.status_text.setText(
                "The demo checkpoint is loaded and waiting: nothing plays until you press Try the demo or the "
                "talk key. Everything works — talk key, meters, overlay — but its weights are random, so the "
                "assistant makes quiet noise, not speech. Download or choose the real model below whenever you like."
            )
        elif loaded.random_weights:
            self.status_title.setText("Ready — noise, not speech")
            self.status_text.setText(
                f"{loaded.name} ({loaded.variant.label}) from {loaded.path} has random weights (made by parley "
                "make-checkpoint): it plays quiet noise, like the demo."
            )
        else:
            self.status_title.setText("Model ready")
            self.status_text.setText(f"{loaded.name} ({loaded.variant.label}) is loaded from {loaded.path}.")
        if self._verdict is None:
            self.verdict.setText("")
        self.verdict.setVisible(self._verdict is not None)
        self.start_button.setText("Try the demo" if loaded.variant.demo else "Start talking")
        self.start_button.show()

    def _show_choices(self) -> None:
        self.title.setText("Welcome to Parley")
        self.subtitle.setText(
            "Parley runs NVIDIA's NemotronLabs VoiceChat 11B on this computer — nothing you say leaves it. "
            "First, choose where the model comes from."
        )
        self.download_card.show()
        self.other_sources.show()
        self.demo_card.show()
        self.status_card.hide()
        self._set_buttons_enabled(True)
        self._set_downloading(self._downloading is not None)

    def _show_loading(self, message: str) -> None:
        self.status_card.show()
        self.status_title.setText("Loading the model")
        self.status_text.setText(message)
        self.load_progress.show()
        self.verdict.hide()
        self.start_button.hide()
        self._set_buttons_enabled(False)

    def _set_buttons_enabled(self, enabled: bool) -> None:
        for button in (*self.download_buttons.values(), self.folder_button, self.demo_button):
            button.setEnabled(enabled and self._downloading is None)
        self.layout_choice.setEnabled(enabled and self._downloading is None)

    def _set_downloading(self, downloading: bool) -> None:
        self.download_progress.setVisible(downloading)
        self.cancel_button.setVisible(downloading)
        self.download_text.setVisible(downloading or bool(self.download_text.text()))
        for button in (*self.download_buttons.values(), self.folder_button, self.demo_button):
            button.setEnabled(not downloading)
        self.layout_choice.setEnabled(not downloading)
