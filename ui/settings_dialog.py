"""The settings dialog: model (``ui.model_settings``), audio, conversation, tools (``ui.tools_settings``), history,
appearance.

The form edits a copy of the settings; *Save* validates it, hands it to
``controller.apply_settings`` and closes, *Cancel* discards all of it, the model switch
included. Problems are shown in the dialog, which stays open, so nothing typed is lost: a
model folder the controller refuses (not a checkpoint, or another variant than its slot)
is one of them, and then nothing was applied. A picked model reloads on Save (progress in
the window's state line; the next conversation waits for the talk key); which model is
loaded comes from the window's latest state snapshot (:meth:`SettingsDialog.show_status`).

What this computer can do decides what is offered: hands-free only where echo cancellation
loads (``controller.hands_free_unavailable()``), the talk key in other apps with the
platform's limits in words (``controller.global_key_support()``: unavailable under Wayland,
permissions on macOS), keeping Parley in the tray only where the desktop has one. Main
thread only.
"""

from __future__ import annotations

import logging
from typing import Final

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QKeySequence
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
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.hotkey import EXAMPLES, KeySpecError, format_key_spec, parse_key_spec
from app.messages import StateChanged
from app.model_check import CheckpointRefused
from app.settings import (
    DEFAULT_SYSTEM_PROMPT,
    HISTORY_LIMIT_MAX_GB,
    HISTORY_LIMIT_MIN_GB,
    IDLE_PAUSE_MAX_S,
    IDLE_PAUSE_MIN_S,
    Settings,
)
from engine.timeline import FRAME_MS

from .contracts import Controller
from .model_settings import ModelSettingsPage
from .talk_button import parse_talk_key
from .theme import muted_label, repolish
from .tools_settings import ToolsSettingsPage
from .tray import TRAY_NAME, tray_available

log = logging.getLogger(__name__)

THEME_CHOICES: Final = (("system", "Same as the system"), ("light", "Light"), ("dark", "Dark"))
HANDS_FREE_NOTE: Final = (
    "The talk key opens and closes the microphone, and echo cancellation keeps the assistant from hearing itself. "
    "With headphones it works at any volume; on speakers keep the volume moderate, because the louder the "
    "assistant is at the microphone, the more of your voice is lost while it talks."
)


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
        self.setMinimumSize(640, 720)

        self.tabs = QTabWidget(self)
        self.model_page = ModelSettingsPage(controller, self.show_error, self)
        self.tabs.addTab(self.model_page, "Model")
        self.tabs.addTab(self._build_audio_tab(), "Audio")
        self.tabs.addTab(self._build_conversation_tab(), "Conversation")
        self.tools_page = ToolsSettingsPage(controller, self.show_error, self)
        self.tabs.addTab(self.tools_page, "Tools")
        self.tabs.addTab(self._build_history_tab(), "History")
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

        hands_free = QGroupBox("Hands-free", page)
        self.hands_free_check = QCheckBox("Hands-free: keep the microphone open, so I can talk over the assistant")
        self.hands_free_check.setParent(hands_free)
        self.hands_free_note = muted_label(HANDS_FREE_NOTE, hands_free)
        box = QVBoxLayout(hands_free)
        box.addWidget(self.hands_free_check)
        box.addWidget(self.hands_free_note)
        unavailable = self._controller.hands_free_unavailable()
        if unavailable is not None:  # not offered: say why instead
            self.hands_free_check.setEnabled(False)
            self.hands_free_note.setText(unavailable)

        playback = QGroupBox("Playback", page)
        self.ducking_check = QCheckBox("Lower the assistant's voice while I talk", playback)
        self.ducking_check.setAccessibleDescription("Reduces echo from the speakers into the microphone")
        box = QVBoxLayout(playback)
        box.addWidget(self.ducking_check)
        box.addWidget(
            muted_label(
                "Helps on speakers: less of the assistant's voice reaches the microphone while you hold the talk "
                "key, or in hands-free while you speak.",
                playback,
            )
        )

        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.setSpacing(14)
        layout.addWidget(devices)
        layout.addWidget(hands_free)
        layout.addWidget(playback)
        layout.addStretch(1)
        return page

    def _build_conversation_tab(self) -> QWidget:
        page = QWidget(self)
        prompt_box = QGroupBox("System prompt", page)
        self.prompt_edit = QPlainTextEdit(prompt_box)
        self.prompt_edit.setAccessibleName("System prompt")
        self.prompt_edit.setTabChangesFocus(True)
        self.prompt_edit.setMinimumHeight(70)
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
        self.idle_check = QCheckBox("Sleep when I have not spoken for", talk_box)
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
        global_box = QGroupBox("Talk key in other apps", page)
        self.global_check = QCheckBox("Also listen for this key while other apps are in front:", global_box)
        self.global_edit = QLineEdit(global_box)
        self.global_edit.setAccessibleName("Talk key in other apps")
        self.global_edit.setPlaceholderText(EXAMPLES.removeprefix("For example: "))
        self.global_edit.setMinimumWidth(160)
        self.global_edit.textChanged.connect(self._global_key_edited)
        self.global_check.toggled.connect(self._global_key_edited)
        global_row = QHBoxLayout()
        global_row.addWidget(self.global_check)
        global_row.addWidget(self.global_edit, 1)
        self.global_status = muted_label("", global_box)
        self.global_status.setAccessibleName("Talk key in other apps: status")
        self.permissions_button = QPushButton("Open System Settings", global_box)
        self.permissions_button.setProperty("kind", "link")
        self.permissions_button.clicked.connect(self._open_permission_settings)
        self._support = self._controller.global_key_support()
        self.permissions_button.setVisible(bool(self._support.settings_urls))
        if self._support.session in ("wayland", "none"):  # cannot work in this session at all: not offered
            self.global_check.setEnabled(False)
            self.global_edit.setEnabled(False)
        form = QFormLayout(talk_box)
        form.setSpacing(10)
        form.addRow("Key:", self.key_edit)
        form.addRow("Mode:", self.hold_radio)
        form.addRow("", self.toggle_radio)
        form.addRow(muted_label("In hands-free (Audio) the key opens and closes the microphone instead.", talk_box))
        form.addRow(idle_row)
        form.addRow(
            muted_label("Asleep, no frames run and the conversation keeps its memory; the talk key wakes it.", talk_box)
        )

        global_layout = QVBoxLayout(global_box)
        global_layout.addLayout(global_row)
        global_layout.addWidget(self.global_status)
        global_layout.addWidget(self.permissions_button, 0, Qt.AlignmentFlag.AlignLeft)

        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.setSpacing(14)
        layout.addWidget(prompt_box, 1)
        layout.addWidget(talk_box)
        layout.addWidget(global_box)
        return page

    def _build_history_tab(self) -> QWidget:
        from app.history import default_history_dir

        page = QWidget(self)
        box = QGroupBox("Conversation history", page)
        self.history_check = QCheckBox(
            "Keep every conversation: its transcript, both sides' audio and its profile", box
        )
        self.history_limit = QDoubleSpinBox(box)
        self.history_limit.setRange(HISTORY_LIMIT_MIN_GB, HISTORY_LIMIT_MAX_GB)
        self.history_limit.setDecimals(1)
        self.history_limit.setSingleStep(0.5)
        self.history_limit.setSuffix(" GB")
        self.history_limit.setAccessibleName("History size limit in gigabytes")
        self.history_check.toggled.connect(self.history_limit.setEnabled)
        limit_row = QHBoxLayout()
        limit_row.addWidget(QLabel("Keep at most", box))
        limit_row.addWidget(self.history_limit)
        limit_row.addStretch(1)
        form = QFormLayout(box)
        form.setSpacing(10)
        form.addRow(self.history_check)
        form.addRow(muted_label(f"Kept in {default_history_dir()}, one folder per conversation.", box))
        form.addRow(limit_row)
        form.addRow(
            muted_label(
                "Beyond the limit the oldest conversations are removed first (a ten-minute conversation is about "
                "46 MB). With keeping off, New Conversation and Quit ask before dropping a conversation you have "
                "not saved.",
                box,
            )
        )
        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.addWidget(box)
        layout.addStretch(1)
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

        tray = QGroupBox(TRAY_NAME.capitalize(), page)
        self.tray_check = QCheckBox(f"Keep Parley running in the {TRAY_NAME} when its window is closed", tray)
        tray_box = QVBoxLayout(tray)
        tray_box.addWidget(self.tray_check)
        if tray_available():
            note = "Its icon there shows whether Parley listens or speaks, and offers talk, mute, open and quit."
        else:
            self.tray_check.setEnabled(False)
            note = f"This desktop shows no {TRAY_NAME} icons, so closing the window quits Parley."
        self.tray_note = muted_label(note, tray)
        tray_box.addWidget(self.tray_note)

        layout = QVBoxLayout(page)
        layout.setContentsMargins(4, 12, 4, 4)
        layout.setSpacing(14)
        layout.addWidget(box)
        layout.addWidget(tray)
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
        self.hands_free_check.setChecked(settings.hands_free)
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
        self.global_check.setChecked(settings.global_talk_key_enabled)
        self.global_edit.setText(settings.global_talk_key)
        self._global_key_edited()
        self.history_check.setChecked(settings.history)
        self.history_limit.setValue(settings.history_limit_gb)
        self.history_limit.setEnabled(settings.history)
        self.tray_check.setChecked(settings.keep_in_tray)

    def settings(self) -> Settings:
        """The settings the form describes; raises ``ValueError`` with a message for the user."""
        folders = self.model_page.folders()
        key = self.key_edit.keySequence().toString(QKeySequence.SequenceFormat.PortableText)
        if not key:
            raise ValueError("Choose a push-to-talk key (click the Key field, then press the key).")
        global_key = self.global_edit.text().strip() or self._base.global_talk_key
        if self.global_check.isChecked():
            try:
                global_key = format_key_spec(parse_key_spec(global_key))
            except KeySpecError as exc:
                raise ValueError(f"The talk key for other apps: {exc}") from exc
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
            hands_free=self.hands_free_check.isChecked(),
            global_talk_key_enabled=self.global_check.isChecked(),
            global_talk_key=global_key,
            history=self.history_check.isChecked(),
            history_limit_gb=round(float(self.history_limit.value()), 1),
            keep_in_tray=self.tray_check.isChecked(),
            numerics=self.model_page.numerics,
            keep_up=self.model_page.keep_up,
            download_layout=self.model_page.download_layout,
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
            if self.tools_page.config != self._controller.tools_config:
                self._controller.apply_tools_config(self.tools_page.config)
            picked = self.model_page.picked
            if picked is not None and picked == self._base.active_variant:
                # Picked what the settings already name, while another model runs (a fallback at launch): load it.
                self._controller.switch_variant(picked)
        except CheckpointRefused as exc:  # nothing was applied: show why, on the Model page
            self.tabs.setCurrentWidget(self.model_page)
            self.show_error(str(exc))
            return
        except Exception as exc:  # keep the dialog (and what was typed) open
            log.exception("apply_settings failed")
            self.show_error(f"The settings could not be saved: {exc}")
            return
        super().accept()

    def _global_key_edited(self, *_: object) -> None:
        """Say at once whether the typed key can be used, and where a global key works at all."""
        text = self.global_edit.text().strip()
        problem = ""
        if self.global_check.isChecked() and text:
            try:
                parse_key_spec(text)
            except KeySpecError as exc:
                problem = str(exc)
        self.global_edit.setProperty("invalid", bool(problem))
        repolish(self.global_edit)
        self.global_status.setText(problem or self._support.message)

    def _open_permission_settings(self) -> None:
        for url in self._support.settings_urls:
            QDesktopServices.openUrl(QUrl(url))

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
    def _fill_devices(combo: QComboBox, devices: list[tuple[str, str]], chosen: str | None) -> None:
        """One item per device: its description shown, its name kept (and shown as the tooltip)."""
        combo.clear()
        combo.addItem("System default", None)
        for name, description in devices:
            combo.addItem(description, name)
            combo.setItemData(combo.count() - 1, name, Qt.ItemDataRole.ToolTipRole)
        if chosen is not None and chosen not in [name for name, _ in devices]:
            combo.addItem(f"{chosen} (not connected)", chosen)
        combo.setCurrentIndex(max(0, combo.findData(chosen)) if chosen is not None else 0)
