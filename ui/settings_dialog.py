"""The settings dialog: model (``ui.model_settings``), devices, conversation, appearance.

The form edits a copy of the settings; *Save* validates it, hands it to
``controller.apply_settings`` and closes, *Cancel* discards it. Problems are shown in the
dialog, which stays open, so nothing typed is lost. The model switch acts at once: it
calls ``controller.switch_variant`` (the reload reports progress through the window's
state line and the conversation restarts); which model is loaded comes from the window's
latest state snapshot (:meth:`SettingsDialog.show_status`). Main thread only.
"""

from __future__ import annotations

import logging
from typing import Final

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QKeySequenceEdit,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.messages import StateChanged
from app.settings import (
    DEFAULT_SYSTEM_PROMPT,
    IDLE_PAUSE_MAX_S,
    IDLE_PAUSE_MIN_S,
    Settings,
)
from engine.timeline import FRAME_MS

from .contracts import Controller
from .model_settings import ModelSettingsPage, muted_label
from .talk_button import parse_talk_key

log = logging.getLogger(__name__)

THEME_CHOICES: Final = (("system", "Same as the system"), ("light", "Light"), ("dark", "Dark"))


class SettingsDialog(QDialog):
    """Edits :class:`~app.settings.Settings`; see the module docstring for what applies when."""

    def __init__(
        self, controller: Controller, parent: QWidget | None = None, status: StateChanged | None = None
    ) -> None:
        super().__init__(parent)
        self._controller = controller
        self._base = controller.settings
        self._devices_loaded = False
        self.setWindowTitle("Parley Settings")
        self.setMinimumSize(560, 520)

        self.tabs = QTabWidget(self)
        self.model_page = ModelSettingsPage(controller, self.show_error, self)
        self.tabs.addTab(self.model_page, "Model")
        self.tabs.addTab(self._build_audio_tab(), "Audio")
        self.tabs.addTab(self._build_conversation_tab(), "Conversation")
        self.tabs.addTab(self._build_appearance_tab(), "Appearance")
        self.tabs.currentChanged.connect(self._tab_changed)

        self.error = QLabel(self)
        self.error.setWordWrap(True)
        self.error.setProperty("role", "error")
        self.error.setAccessibleName("Problem")
        self.error.hide()

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        save = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        save.setProperty("kind", "primary")
        save.setDefault(True)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 16, 20, 16)
        layout.setSpacing(12)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.error)
        layout.addWidget(self.buttons)
        self.load(self._base)
        if status is not None:
            self.show_status(status)

    def show_status(self, status: StateChanged) -> None:
        """The app's state changed (a model loaded, a switch began): the Model page follows it."""
        self.model_page.show_status(status)

    # -- tabs ------------------------------------------------------------------------------------------------------

    def _build_audio_tab(self) -> QWidget:
        page = QWidget(self)
        devices = QGroupBox("Devices", page)
        form = QFormLayout(devices)
        form.setSpacing(10)
        self.input_combo = QComboBox(devices)
        self.input_combo.setAccessibleName("Microphone")
        self.output_combo = QComboBox(devices)
        self.output_combo.setAccessibleName("Speaker")
        for combo in (self.input_combo, self.output_combo):
            combo.setMinimumContentsLength(24)
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.refresh_button = QPushButton("Refresh", devices)
        self.refresh_button.setToolTip("Look for newly connected microphones and speakers")
        self.refresh_button.setAccessibleName("Refresh device lists")
        self.refresh_button.clicked.connect(self.refresh_devices)
        form.addRow("Microphone:", self.input_combo)
        form.addRow("Speaker:", self.output_combo)
        refresh_row = QHBoxLayout()
        self.device_status = muted_label("", devices)
        refresh_row.addWidget(self.device_status, 1)
        refresh_row.addWidget(self.refresh_button)
        form.addRow(refresh_row)

        playback = QGroupBox("Playback", page)
        self.ducking_check = QCheckBox("Lower the assistant's voice while I hold the talk key", playback)
        self.ducking_check.setAccessibleDescription("Reduces echo from the speakers into the microphone")
        box = QVBoxLayout(playback)
        box.addWidget(self.ducking_check)
        box.addWidget(
            muted_label(
                "Helps when you use speakers instead of headphones: less of the assistant's voice "
                "reaches the microphone.",
                playback,
            )
        )

        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.setSpacing(14)
        layout.addWidget(devices)
        layout.addWidget(playback)
        layout.addStretch(1)
        return page

    def _build_conversation_tab(self) -> QWidget:
        page = QWidget(self)
        prompt_box = QGroupBox("System prompt", page)
        self.prompt_edit = QPlainTextEdit(prompt_box)
        self.prompt_edit.setAccessibleName("System prompt")
        self.prompt_edit.setTabChangesFocus(True)
        self.prompt_edit.setMinimumHeight(90)
        restore = QPushButton("Restore default", prompt_box)
        restore.setProperty("kind", "link")
        restore.clicked.connect(lambda: self.prompt_edit.setPlainText(DEFAULT_SYSTEM_PROMPT))
        prompt_footer = QHBoxLayout()
        prompt_footer.addWidget(muted_label("Changing the prompt starts a new conversation.", prompt_box), 1)
        prompt_footer.addWidget(restore)
        prompt_layout = QVBoxLayout(prompt_box)
        prompt_layout.addWidget(self.prompt_edit)
        prompt_layout.addLayout(prompt_footer)

        talk_box = QGroupBox("Push to talk", page)
        self.key_edit = QKeySequenceEdit(talk_box)
        self.key_edit.setMaximumSequenceLength(1)
        self.key_edit.setAccessibleName("Push-to-talk key")
        self.key_edit.setClearButtonEnabled(True)
        self.hold_radio = QRadioButton("Hold the key while you talk", talk_box)
        self.toggle_radio = QRadioButton("Press once to start, again to stop", talk_box)
        self.idle_check = QCheckBox("Pause when nobody has spoken for", talk_box)
        self.idle_spin = QDoubleSpinBox(talk_box)
        self.idle_spin.setRange(IDLE_PAUSE_MIN_S, IDLE_PAUSE_MAX_S)
        self.idle_spin.setDecimals(0)
        self.idle_spin.setSuffix(" s")
        self.idle_spin.setAccessibleName("Idle pause delay in seconds")
        self.idle_check.toggled.connect(self.idle_spin.setEnabled)
        idle_row = QHBoxLayout()
        idle_row.addWidget(self.idle_check)
        idle_row.addWidget(self.idle_spin)
        idle_row.addStretch(1)
        form = QFormLayout(talk_box)
        form.setSpacing(10)
        form.addRow("Key:", self.key_edit)
        form.addRow("Mode:", self.hold_radio)
        form.addRow("", self.toggle_radio)
        form.addRow(idle_row)
        form.addRow(
            muted_label("While paused the conversation keeps its memory; pressing the talk key resumes it.", talk_box)
        )

        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.setSpacing(14)
        layout.addWidget(prompt_box, 1)
        layout.addWidget(talk_box)
        return page

    def _build_appearance_tab(self) -> QWidget:
        page = QWidget(self)
        box = QGroupBox("Appearance", page)
        self.theme_combo = QComboBox(box)
        self.theme_combo.setAccessibleName("Theme")
        for key, label in THEME_CHOICES:
            self.theme_combo.addItem(label, key)
        self.overlay_check = QCheckBox("Show the live frame-time overlay", box)
        form = QFormLayout(box)
        form.setSpacing(10)
        form.addRow("Theme:", self.theme_combo)
        form.addRow(self.overlay_check)
        form.addRow(muted_label(f"The overlay shows how long each {FRAME_MS:.0f} ms frame took, phase by phase.", box))
        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.addWidget(box)
        layout.addStretch(1)
        return page

    # -- form <-> settings -----------------------------------------------------------------------------------------

    def load(self, settings: Settings) -> None:
        """Fill the form from ``settings``."""
        self._base = settings
        self.model_page.load(settings)
        self._fill_devices(self.input_combo, [], settings.input_device)
        self._fill_devices(self.output_combo, [], settings.output_device)
        self.ducking_check.setChecked(settings.ducking)
        self.prompt_edit.setPlainText(settings.system_prompt)
        try:
            self.key_edit.setKeySequence(parse_talk_key(settings.talk_key))
        except ValueError:
            self.key_edit.clear()
        self.hold_radio.setChecked(settings.talk_mode == "hold")
        self.toggle_radio.setChecked(settings.talk_mode == "toggle")
        self.idle_check.setChecked(settings.idle_pause)
        self.idle_spin.setValue(settings.idle_pause_delay_s)
        self.idle_spin.setEnabled(settings.idle_pause)
        self.theme_combo.setCurrentIndex(max(0, self.theme_combo.findData(settings.theme)))
        self.overlay_check.setChecked(settings.overlay)

    def settings(self) -> Settings:
        """The settings the form describes; raises ``ValueError`` with a message for the user."""
        folders = self.model_page.folders()
        key = self.key_edit.keySequence().toString(QKeySequence.SequenceFormat.PortableText)
        if not key:
            raise ValueError("Choose a push-to-talk key (click the Key field, then press the key).")
        return self._base.with_changes(
            checkpoints=folders,
            active_variant=self.model_page.variant,
            input_device=self.input_combo.currentData(),
            output_device=self.output_combo.currentData(),
            system_prompt=self.prompt_edit.toPlainText(),
            talk_key=key,
            talk_mode="toggle" if self.toggle_radio.isChecked() else "hold",
            idle_pause=self.idle_check.isChecked(),
            idle_pause_delay_s=float(self.idle_spin.value()),
            ducking=self.ducking_check.isChecked(),
            overlay=self.overlay_check.isChecked(),
            theme=self.theme_combo.currentData(),
        )

    def accept(self) -> None:
        try:
            settings = self.settings()
            self.model_page.check_folders(settings)
        except ValueError as exc:
            if self.model_page.has_invalid_folder():
                self.tabs.setCurrentWidget(self.model_page)
            self.show_error(str(exc))
            return
        try:
            self._controller.apply_settings(settings)
        except Exception as exc:  # keep the dialog (and what was typed) open
            log.exception("apply_settings failed")
            self.show_error(f"The settings could not be saved: {exc}")
            return
        super().accept()

    def show_error(self, message: str) -> None:
        self.error.setText(message)
        self.error.show()

    def _tab_changed(self, index: int) -> None:
        if self.tabs.widget(index) is self.tabs.widget(1) and not self._devices_loaded:
            self.refresh_devices()

    def refresh_devices(self) -> None:
        """Ask the app core for the current device lists and refill the combos, keeping the choices."""
        self._devices_loaded = True
        chosen_input, chosen_output = self.input_combo.currentData(), self.output_combo.currentData()
        try:
            inputs, outputs = self._controller.refresh_devices()
        except Exception as exc:  # the lists stay as they were
            log.exception("refresh_devices failed")
            self.device_status.setText(f"Could not list devices: {exc}")
            return
        self._fill_devices(self.input_combo, inputs, chosen_input)
        self._fill_devices(self.output_combo, outputs, chosen_output)
        self.device_status.setText(f"{len(inputs)} microphones, {len(outputs)} speakers found.")

    @staticmethod
    def _fill_devices(combo: QComboBox, names: list[str], chosen: str | None) -> None:
        combo.clear()
        combo.addItem("System default", None)
        for name in names:
            combo.addItem(name, name)
        if chosen is not None and chosen not in names:
            combo.addItem(f"{chosen} (not connected)", chosen)
        combo.setCurrentIndex(max(0, combo.findData(chosen)) if chosen is not None else 0)
