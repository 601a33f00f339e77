"""The application: ``run_gui()`` (composition root) and the main window.

``run_gui`` loads the settings, applies the theme, builds the controller through a
factory (tests and ``--fake-engine`` inject a fake), shows one :class:`MainWindow` and
runs the event loop. The window talks to the app core only through the controller's
methods, always on the Qt main thread, and hears back only through the event pump.
Every controller call it makes is guarded: a failure becomes a banner, never a crash.

What state the app is in — the state line, whether the talk key works, the devices in
the status bar, the loaded model's chip, the first-run page's progress, the overlay's
empty text, the settings dialog's model switch — is rendered from one place, the latest
``StateChanged`` snapshot (:meth:`MainWindow.handle_state`), so they cannot disagree.
The window repaints on the event pump's timer; no input event is needed for anything.

The tray icon (``ui.tray``) mirrors the state and offers talk, mute, open and quit. With
"keep running in the menu bar/tray" chosen (and a tray to keep it in), closing the window
hides it and Parley keeps running; Quit (menu, tray, or closing without that setting) ends
it. Neither Quit nor New Conversation drops a conversation without asking: with history on
it is kept there by the controller; with history off and the conversation not saved by hand
(``controller.conversation_at_risk()``), the window asks: save it, discard it, or cancel.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Final, TypeVar

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QCloseEvent, QDesktopServices, QIcon
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.messages import (
    AppState,
    ConsentRequest,
    ConversationCleared,
    ConversationStarted,
    ConversationTime,
    DeviceStatus,
    DownloadProgress,
    Failure,
    GlobalTalk,
    HistorySaved,
    Levels,
    ModelFallback,
    ModelLoaded,
    Notice,
    NumericsAdvice,
    NumericsChanged,
    ReplayProgress,
    SpeedCheck,
    StateChanged,
    TimerDone,
    ToolsListed,
    TurnLatency,
)
from app.paths import resource_path
from app.settings import Settings, load_settings
from app.status import TALKABLE

from .about import AboutDialog
from .banner import Banner, BannerArea
from .contracts import Controller, ControllerFactory
from .conversation_page import ConversationPage
from .event_pump import EventPump
from .first_run import FirstRunPage
from .geometry import encode_geometry, fit_to_screen, restore_geometry
from .header import HeaderBar
from .history_view import HistoryWindow
from .menus import build_menus
from .settings_dialog import SettingsDialog
from .theme import apply_theme
from .tray import TRAY_NAME, TrayIcon

log = logging.getLogger(__name__)

T = TypeVar("T")
# Why the talk button is off, by state (the hint under it).
NOT_TALKABLE: Final = {
    AppState.NO_MODEL: "Load a model to talk",
    AppState.LOADING: "Talking starts once the model is loaded",
    AppState.NO_AUDIO: "Connect a microphone and a speaker to talk",
    AppState.ERROR: "Start a new conversation to talk again",
}
INFO_TIMEOUT_MS: Final = 20_000

# What the empty overlay says, by state: why no frames are running.
WAITING_TEXT: Final = {
    AppState.NO_MODEL: "No model is loaded yet",
    AppState.LOADING: "Loading the model — frames appear once a conversation runs",
    AppState.NO_AUDIO: "No frames: there is no microphone or speaker to use",
    AppState.ERROR: "No frames: see the message above",
    AppState.PAUSED: "Asleep: no frames run — press the talk key to wake the conversation",
}


class MainWindow(QMainWindow):
    """The single app window: header, banners, first-run or conversation page, menus, status bar."""

    closed = Signal()  # the window really closed (Quit), not hidden in the tray: the app ends

    def __init__(self, controller: Controller, *, tray: TrayIcon | None = None) -> None:
        super().__init__()
        self.controller = controller
        self._quitting = False
        self._told_about_tray = False
        self.history_window: HistoryWindow | None = None
        self._first_run_active = controller.settings.active_checkpoint is None
        self._welcome = self._first_run_active  # on the launch's welcome page, not yet moved on
        self._time_up_offered = False
        self._time_up_banner: Banner | None = None
        self._speed_banner: Banner | None = None
        self.status = StateChanged(AppState.NO_MODEL)  # the latest snapshot: all the window shows of the state
        self._settings_dialog: SettingsDialog | None = None
        self.setWindowTitle("Parley")
        self.setWindowIcon(QIcon(str(resource_path("parley.svg"))))
        self.setMinimumSize(760, 640)
        fit_to_screen(self, 980, 820)

        self.banners = BannerArea(self)
        self.header = HeaderBar(self)
        self.indicator = self.header.indicator

        self.first_run = FirstRunPage(controller, self)
        self.conversation = ConversationPage(controller, self)
        self.pages = QStackedWidget(self)
        self.pages.addWidget(self.first_run)
        self.pages.addWidget(self.conversation)
        self.pages.setCurrentWidget(self.first_run if self._first_run_active else self.conversation)

        central = QWidget(self)
        layout = QVBoxLayout(central)
        layout.setContentsMargins(24, 16, 24, 16)
        layout.setSpacing(14)
        layout.addWidget(self.banners)
        layout.addWidget(self.header)
        layout.addWidget(self.pages, 1)
        self.setCentralWidget(central)

        self.device_label = QLabel(self)
        self.device_label.setAccessibleName("Sound devices")
        self.statusBar().addPermanentWidget(self.device_label)
        self.statusBar().setSizeGripEnabled(False)

        self.menu_actions = build_menus(self)
        self.tray = tray if tray is not None else TrayIcon(self)
        self._connect_actions()
        self._connect_tray()
        self.pump = EventPump(controller, self)
        self._connect_pump()
        self.first_run.start_requested.connect(self.start_from_first_run)
        talk = self.conversation.talk
        talk.talking_changed.connect(self._talking_changed)
        talk.talking_changed.connect(self.tray.set_talking)
        talk.failed.connect(self.show_failure)
        talk.reveal = self._reveal_talk_control
        self.apply_ui_settings(controller.settings)
        restore_geometry(self, controller.settings.window_geometry)
        self.handle_state(self.status)

    # -- wiring ----------------------------------------------------------------------------------------------------

    def _connect_actions(self) -> None:
        actions = self.menu_actions
        actions.export_profile.triggered.connect(self.export_profile)
        actions.save_conversation.triggered.connect(self.save_conversation)
        actions.get_model.triggered.connect(self.show_model_setup)
        actions.open_log_folder.triggered.connect(self.open_log_folder)
        actions.quit.triggered.connect(self.quit_app)
        actions.new_conversation.triggered.connect(self.new_conversation)
        actions.history.triggered.connect(self.open_history)
        actions.stop_speaking.triggered.connect(self.conversation.volume.stop)
        actions.mute.toggled.connect(self.conversation.volume.mute_button.setChecked)
        self.conversation.volume.mute_button.toggled.connect(actions.mute.setChecked)
        actions.show_overlay.toggled.connect(self._overlay_toggled)
        actions.theme_group.triggered.connect(lambda action: self.set_theme(action.data()))
        actions.settings.triggered.connect(self.open_settings)
        actions.about.triggered.connect(self.show_about)

    def _connect_tray(self) -> None:
        tray, actions = self.tray, self.menu_actions
        tray.open_requested.connect(self.show_window)
        tray.history_requested.connect(self.open_history)
        tray.quit_requested.connect(self.quit_app)
        tray.talk_action.toggled.connect(self._talk_from_tray)
        tray.mute_action.toggled.connect(actions.mute.setChecked)
        actions.mute.toggled.connect(tray.mute_action.setChecked)

    def _connect_pump(self) -> None:
        pump, page = self.pump, self.conversation
        pump.state_changed.connect(self.handle_state)
        pump.frame_stats.connect(page.overlay.add_stats)
        pump.levels.connect(self.handle_levels)
        pump.model_loaded.connect(self.handle_model_loaded)
        pump.conversation_started.connect(self.handle_conversation_started)
        pump.conversation_cleared.connect(self.handle_conversation_cleared)
        pump.model_fallback.connect(self.handle_model_fallback)
        pump.turn_latency.connect(self.handle_turn_latency)
        pump.speed_check.connect(self.handle_speed_check)
        pump.conversation_time.connect(self.handle_conversation_time)
        pump.device_status.connect(self.handle_device_status)
        pump.download_progress.connect(self.handle_download_progress)
        pump.failure.connect(self.show_failure)
        pump.notice.connect(self.handle_notice)
        pump.user_transcript.connect(page.transcript.add_user_delta)
        pump.assistant_text.connect(page.transcript.add_assistant_delta)
        pump.tool_call.connect(page.transcript.add_tool_call)
        pump.global_talk.connect(self.handle_global_talk)
        pump.history_saved.connect(self.handle_history_saved)
        pump.numerics_changed.connect(self.handle_numerics_changed)
        pump.numerics_advice.connect(self.handle_numerics_advice)
        pump.replay_progress.connect(self.handle_replay_progress)
        pump.consent_request.connect(self.handle_consent_request)
        pump.consent_closed.connect(page.consent.close_request)
        pump.tool_activity.connect(page.transcript.add_tool_activity)
        pump.tool_response.connect(page.transcript.add_tool_response)
        pump.tool_turn_heard.connect(page.transcript.add_tool_turn_heard)
        pump.timer_done.connect(self.handle_timer_done)
        pump.tools_listed.connect(self.handle_tools_listed)

    def start(self) -> None:
        """Start polling and ask the controller to load the configured model."""
        self.pump.start()
        self._attempt("start the app core", self.controller.start)

    # -- message handlers ------------------------------------------------------------------------------------------

    def handle_state(self, status: StateChanged) -> None:
        """Render the app's state snapshot everywhere it shows."""
        previous, self.status = self.status, status
        state = status.state
        detail = status.detail
        if state is AppState.LOADING and status.progress is not None and status.progress >= 0 and "%" not in detail:
            detail = f"{detail} ({status.progress:.0%})" if detail else f"{status.progress:.0%}"
        self.indicator.set_state(state, detail)
        self.conversation.talk.set_available(state in TALKABLE, NOT_TALKABLE.get(state, ""))
        if state is AppState.PAUSED and previous.state is not AppState.PAUSED:
            self.conversation.talk.conversation_slept()
        self.header.show_model(status.model)
        self._set_model_actions_enabled(status.model is not None)
        self._show_devices(status)
        overlay = self.conversation.overlay
        if state in WAITING_TEXT:
            overlay.set_waiting_text(WAITING_TEXT[state])
        elif not status.conversation:
            overlay.set_waiting_text("The conversation starts when you press the talk key; its frames appear here")
        else:
            overlay.set_waiting_text("Waiting for the first frame…")
        self.first_run.show_status(status)
        self.tray.show_state(status, hands_free=self.controller.settings.hands_free)
        if self._settings_dialog is not None:
            self._settings_dialog.show_status(status)
        if state is AppState.LOADING and previous.state is not AppState.LOADING:
            self.statusBar().clearMessage()  # an earlier "Loaded …" must not outlive the model it named
        if state is AppState.NO_MODEL and previous.state is not AppState.NO_MODEL:
            self._first_run_active = True
            self.first_run.reset()
            self.pages.setCurrentWidget(self.first_run)

    def _show_devices(self, status: StateChanged) -> None:
        mic = status.microphone or "none"
        speaker = status.speaker or "none"
        if status.audio_available:
            text = f"Mic: {mic}  ·  Speaker: {speaker}"
        elif status.microphone is None and status.speaker is None:
            text = "No microphone or speaker"
        else:
            text = f"Mic: {mic}  ·  Speaker: {speaker}"
        self.device_label.setText(text)
        self.device_label.setToolTip(text)
        self.conversation.mic_meter.set_caption(status.microphone or "No microphone")
        if status.microphone is None:
            self.conversation.mic_meter.set_peak(0.0)  # no more levels come from a device that is gone
            self.conversation.talk.set_level(0.0)
        if status.speaker is None:
            self.conversation.speaker_meter.set_peak(0.0)
        noise = status.model is not None and status.model.noise
        speaker_caption = status.speaker or "No speaker"
        self.conversation.speaker_meter.set_caption(
            f"{speaker_caption} · noise, not speech" if noise else speaker_caption
        )

    def handle_levels(self, levels: Levels) -> None:
        page = self.conversation
        page.mic_meter.set_peak(levels.input_peak)
        page.speaker_meter.set_peak(levels.output_peak)
        page.talk.set_level(levels.input_peak)

    def handle_model_loaded(self, loaded: ModelLoaded) -> None:
        self.banners.clear(kind="error")  # a model loaded fine: earlier errors are stale
        if not self._first_run_active:
            self.statusBar().showMessage(f"Loaded {loaded.description}.", 8000)

    def handle_model_fallback(self, fallback: ModelFallback) -> None:
        """The configured model could not be used at launch: say why and what loads instead (it stays shown)."""
        self.banners.show_message(fallback.message, kind="warning")

    def handle_conversation_started(self, started: ConversationStarted) -> None:
        """A new conversation: the previous one's transcript, frames and time are done with."""
        self._drop_conversation()

    def handle_conversation_cleared(self, cleared: ConversationCleared) -> None:
        """A switch or New Conversation: the old conversation is over and the next waits for the talk key."""
        self._drop_conversation()

    def _drop_conversation(self) -> None:
        self.conversation.transcript.clear()
        self.conversation.consent.clear()  # its calls were answered "the conversation ended"
        self.conversation.overlay.clear()
        self.header.hide_time_left()
        self._time_up_offered = False
        if self._time_up_banner is not None:
            self._time_up_banner.dismiss()  # its "New conversation" is done with
            self._time_up_banner = None

    def handle_turn_latency(self, latency: TurnLatency) -> None:
        self.conversation.overlay.set_latency(latency)

    def handle_speed_check(self, check: SpeedCheck) -> None:
        if self._first_run_active:
            self.first_run.handle_speed_check(check)
            return
        slow = check.realtime_factor > 1.0
        if self._speed_banner is not None:
            self._speed_banner.dismiss()  # the model it measured is gone
        self._speed_banner = self.banners.show_message(
            f"Speed check: {check.verdict} (realtime factor {check.realtime_factor:.2f})",
            kind="warning" if slow else "info",
            timeout_ms=None if slow else INFO_TIMEOUT_MS,
        )

    def handle_conversation_time(self, time: ConversationTime) -> None:
        remaining = max(0.0, time.remaining_s)
        self.header.show_time_left(remaining)
        if remaining <= 0 and not self._time_up_offered:
            self._time_up_offered = True
            self._time_up_banner = self.banners.show_message(
                "This conversation has reached its length limit. Start a new one to keep talking.",
                kind="warning",
                action=("New conversation", self.new_conversation),
            )

    def handle_device_status(self, status: DeviceStatus) -> None:
        """A device change worth telling (a fallback, a lost device, audio resumed); the names come with the state."""
        if status.message:
            self.banners.show_message(status.message, kind="warning")

    def handle_global_talk(self, talk: GlobalTalk) -> None:
        """The talk key, pressed in another app: as the window's key, the welcome page gives way."""
        if talk.start:
            self._leave_welcome()
        self.conversation.talk.handle_global(talk.start)

    def _talk_from_tray(self, talking: bool) -> None:
        if talking:
            self._leave_welcome()
        self.conversation.talk.request_talking(talking)

    def _leave_welcome(self) -> None:
        """Talking starts the conversation: on the launch's welcome page, with a model loaded, go to it."""
        if self._welcome and self.status.model is not None and self.status.state in TALKABLE:
            self.show_conversation()

    def handle_history_saved(self, saved: HistorySaved) -> None:
        self.statusBar().showMessage("The conversation is kept in the history (Conversation → History…).", 6000)
        if self.history_window is not None:
            self.history_window.refresh()

    def handle_numerics_changed(self, changed: NumericsChanged) -> None:
        kernels = changed.fast_changes
        used = sum(1 for in_use in kernels.values() if in_use)
        if not kernels:
            what = ""
        elif used:
            what = f" ({used} of {len(kernels)} GPU kernels in use)"
        else:
            what = " (no GPU kernels here, so no faster)"
        self.statusBar().showMessage(f"Numerics: {changed.numerics}{what}. A new conversation starts with them.", 8000)

    def handle_numerics_advice(self, advice: NumericsAdvice) -> None:
        """The speed check found that fast numerics would keep up where exact ones do not: offer the switch."""
        self.banners.show_message(
            advice.message,
            kind="warning",
            action=("Use fast numerics", lambda: self._update_settings(numerics="fast")),
        )

    def handle_consent_request(self, request: ConsentRequest) -> None:
        """A tool call waits for the user: the prompt shows on the conversation page (brought forward)."""
        if not self.isVisible():
            self.show_window()  # kept in the tray: the question must be seen to be answered
        if self.pages.currentWidget() is not self.conversation:
            self.show_conversation()
        self.conversation.consent.ask(request)

    def handle_tools_listed(self, listed: ToolsListed) -> None:
        if self._settings_dialog is not None:
            self._settings_dialog.tools_page.show_listed(listed)
        self.statusBar().showMessage(f"{listed.server} offers {len(listed.tools)} tools.", 8000)

    def handle_timer_done(self, timer: TimerDone) -> None:
        self.conversation.transcript.add_timer_done(timer)
        self.statusBar().showMessage(f"Timer done: {timer.label}", 15_000)

    def handle_replay_progress(self, progress: ReplayProgress) -> None:
        if self.history_window is not None:
            self.history_window.show_replay(progress)

    def handle_download_progress(self, progress: DownloadProgress) -> None:
        self.first_run.handle_download_progress(progress)  # a failure also arrives as a Failure (the banner)

    def handle_notice(self, notice: Notice) -> None:
        if not notice.paths:  # nothing was written: say so where it is seen, not in the status bar
            self.banners.show_message(notice.message, kind="info", timeout_ms=INFO_TIMEOUT_MS)
            return
        text = notice.message
        folder = str(notice.paths[0].parent) if notice.paths else ""
        if folder and folder not in text:
            text += f" ({folder})"
        self.statusBar().showMessage(text, 10000)

    def show_failure(self, failure: Failure) -> None:
        """Show a failure in a banner (with the traceback under "Details"); the window stays usable."""
        self.banners.show_message(failure.message, kind="error", details=failure.details)
        if self._first_run_active and self.status.state in (AppState.NO_MODEL, AppState.LOADING):
            self.first_run.handle_failure(failure.message)

    # -- user actions ----------------------------------------------------------------------------------------------

    def show_model_setup(self) -> None:
        """The first-run page again: download or choose a model (the menu's "Get a Model…")."""
        self._first_run_active = True
        self.first_run.open_setup()
        self.pages.setCurrentWidget(self.first_run)

    def show_conversation(self) -> None:
        self._first_run_active = self._welcome = False
        self.pages.setCurrentWidget(self.conversation)
        self.conversation.talk.button.setFocus()

    def start_from_first_run(self) -> None:
        """ "Try the demo" / "Start talking": the user chose, so the conversation starts now."""
        self.show_conversation()
        self._attempt("start the conversation", self.controller.start_conversation)

    def _reveal_talk_control(self) -> bool:
        """The talk key on the launch's welcome page, a model loaded: go to the conversation (it starts there)."""
        if not self._welcome or self.status.model is None or self.status.state not in TALKABLE:
            return False
        focus = QApplication.focusWidget()
        if isinstance(focus, QAbstractButton) and focus is not self.first_run.start_button:
            return False  # Space on a focused button presses that button
        self.show_conversation()
        return True

    def new_conversation(self) -> None:
        # The transcript and overlay clear when the new conversation starts (ConversationStarted), not before:
        # what the old one still said arrives first and must not land in the new one.
        if not self._may_drop_conversation("start a new one"):
            return
        self._attempt("start a new conversation", self.controller.new_conversation)

    def _may_drop_conversation(self, then: str) -> bool:
        """True when nothing would be lost, or the user chose (save it, or discard it); False: cancel."""
        ok, at_risk = self._attempt("check the conversation", self.controller.conversation_at_risk)
        if not ok or not at_risk:
            return True
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Keep this conversation?")
        box.setText("This conversation is not kept anywhere yet.")
        box.setInformativeText(f"Saving conversations is off (Settings → History). Save this one before you {then}?")
        save = box.addButton("Save…", QMessageBox.ButtonRole.AcceptRole)
        discard = box.addButton("Discard", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(save)
        box.exec()
        clicked = box.clickedButton()
        if clicked is discard:
            return True
        if clicked is save:
            return bool(self.save_conversation())
        return False

    def quit_app(self) -> None:
        """Quit Parley (menu, tray): ask first if a conversation would be lost, then close for good."""
        if not self._may_drop_conversation("quit"):
            return
        self._quitting = True
        self.close()

    def show_window(self) -> None:
        """Bring the window back (from the tray)."""
        self.show()
        self.setWindowState(self.windowState() & ~Qt.WindowState.WindowMinimized)
        self.raise_()
        self.activateWindow()

    def open_history(self) -> HistoryWindow:
        """Conversation → History…: one window, brought to the front if already open."""
        if self.history_window is None:
            self.history_window = HistoryWindow(self.controller, self)
        else:
            self.history_window.refresh()
        self.history_window.show()
        self.history_window.raise_()
        self.history_window.activateWindow()
        return self.history_window

    def show_about(self) -> AboutDialog | None:
        ok, facts = self._attempt("collect the diagnostics", self.controller.diagnostics)
        if not ok or facts is None:
            return None
        dialog = AboutDialog(facts, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def export_profile(self) -> None:
        ok, frames = self._attempt("read the profile", self.controller.profile_frames)
        if ok and not frames:
            self.banners.show_message(
                "Nothing to export yet: no conversation has run since Parley started. Talk first, then export.",
                kind="info",
                timeout_ms=INFO_TIMEOUT_MS,
            )
            return
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        suggested = str(Path.home() / f"parley-profile-{stamp}.json")
        chosen, _ = QFileDialog.getSaveFileName(self, "Export Profile", suggested, "Session profile (*.json)")
        if not chosen:
            return
        _, paths = self._attempt("export the profile", lambda: self.controller.export_profile(Path(chosen)))
        if paths:
            self.statusBar().showMessage(f"Exported {', '.join(p.name for p in paths)} to {paths[0].parent}", 10000)

    def save_conversation(self) -> list[Path]:
        chosen = QFileDialog.getExistingDirectory(self, "Save Conversation Into", str(Path.home()))
        if not chosen:
            return []
        _, paths = self._attempt("save the conversation", lambda: self.controller.save_conversation(Path(chosen)))
        if paths:
            self.statusBar().showMessage(f"Saved {len(paths)} files to {paths[0].parent}", 10000)
        return paths or []

    def open_log_folder(self) -> None:
        _, folder = self._attempt("find the log folder", self.controller.log_dir)
        if folder is None:
            return
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self.banners.show_message(f"Could not open a file browser. The logs are in {folder}", kind="warning")

    def open_settings(self) -> SettingsDialog:
        """Open the settings dialog (window-modal, non-blocking); returns it."""
        dialog = SettingsDialog(self.controller, self, self.status)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.apply_ui_settings(self.controller.settings))
        self._settings_dialog = dialog
        dialog.finished.connect(lambda _result: self._forget_settings_dialog(dialog))
        dialog.open()
        return dialog

    def _forget_settings_dialog(self, dialog: SettingsDialog) -> None:
        if self._settings_dialog is dialog:
            self._settings_dialog = None

    def set_theme(self, theme: str) -> None:
        self._update_settings(theme=theme)
        self.apply_ui_settings(self.controller.settings)

    def _overlay_toggled(self, shown: bool) -> None:
        self.conversation.set_overlay_visible(shown)
        if shown != self.controller.settings.overlay:
            self._update_settings(overlay=shown)

    def _talking_changed(self, talking: bool) -> None:
        if talking:
            self.conversation.transcript.start_new_turn()

    # -- settings -------------------------------------------------------------------------------------

    def apply_ui_settings(self, settings: Settings) -> None:
        """Make the window match ``settings`` (theme, overlay, talk key and mode)."""
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, settings.theme)
        self.menu_actions.themes[settings.theme].setChecked(True)
        self.menu_actions.show_overlay.setChecked(settings.overlay)
        self.conversation.set_overlay_visible(settings.overlay)
        self.conversation.volume.load(settings)
        self.menu_actions.mute.setChecked(settings.muted)
        try:
            self.conversation.talk.configure(settings.talk_key, settings.talk_mode, hands_free=settings.hands_free)
        except ValueError as exc:
            self.banners.show_message(
                f"The push-to-talk key cannot be used: {exc}. Space is used instead.", kind="warning"
            )
            self.conversation.talk.configure("Space", settings.talk_mode, hands_free=settings.hands_free)
        self.conversation.transcript.set_invitation("hands-free" if settings.hands_free else settings.talk_mode)
        self.tray.show_state(self.status, hands_free=settings.hands_free)

    def _update_settings(self, **changes: object) -> None:
        self._attempt(
            "save the settings",
            lambda: self.controller.apply_settings(self.controller.settings.with_changes(**changes)),
        )

    @property
    def keeps_running_in_tray(self) -> bool:
        """Whether closing the window hides it in the tray (chosen, and there is a tray)."""
        return self.controller.settings.keep_in_tray and self.tray.available

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._quitting and self.keeps_running_in_tray:
            event.ignore()
            self._save_geometry()
            self.hide()
            if not self._told_about_tray:
                self._told_about_tray = True
                self.tray.notify(
                    "Parley is still running",
                    f"It waits in the {TRAY_NAME}: click its icon to open it, or choose Quit Parley there.",
                )
            return
        if not self._quitting and not self._may_drop_conversation("quit"):
            event.ignore()
            return
        self._quitting = True
        self._save_geometry()
        self.pump.stop()
        self.tray.hide()
        if self.history_window is not None:
            self.history_window.close()
        super().closeEvent(event)
        self.closed.emit()

    def _save_geometry(self) -> None:
        geometry = encode_geometry(self)
        if geometry != self.controller.settings.window_geometry:
            self._update_settings(window_geometry=geometry)

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _attempt(self, what: str, call: Callable[[], T]) -> tuple[bool, T | None]:
        """Run a controller call: ``(True, result)``, or ``(False, None)`` after showing a banner."""
        try:
            return True, call()
        except Exception as exc:  # any failure of the app core becomes a banner
            log.exception("could not %s", what)
            self.banners.show_message(f"Could not {what}: {exc}", kind="error", details=traceback.format_exc())
            return False, None

    def _set_model_actions_enabled(self, enabled: bool) -> None:
        self.menu_actions.export_profile.setEnabled(enabled)
        self.menu_actions.save_conversation.setEnabled(enabled)
        self.menu_actions.new_conversation.setEnabled(enabled)


def _real_controller_factory(settings_path: Path | None) -> ControllerFactory:
    def build(settings: Settings) -> Controller:
        from app.controller import AppController  # imported here so tests never need the real engine

        return AppController(settings, settings_path=settings_path)

    return build


def run_gui(
    argv: Sequence[str] | None = None,
    *,
    controller_factory: ControllerFactory | None = None,
    settings_path: Path | None = None,
) -> int:
    """Open the window and run until it closes; returns the process exit code."""
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        app = QApplication(list(argv) if argv is not None else sys.argv[:1])
    app.setApplicationName("Parley")
    app.setApplicationDisplayName("Parley")
    app.setDesktopFileName("parley")
    app.setWindowIcon(QIcon(str(resource_path("parley.svg"))))

    settings, warning = load_settings(settings_path)
    apply_theme(app, settings.theme)
    factory = controller_factory or _real_controller_factory(settings_path)
    try:
        controller = factory(settings)
    except Exception as exc:  # nothing works without the core; say why and exit
        log.exception("could not create the app controller")
        QMessageBox.critical(None, "Parley cannot start", f"The app core could not be started:\n\n{exc}")
        return 1

    window = MainWindow(controller)
    # The app ends when the window really closes (Quit), not when its last window hides in the tray.
    app.setQuitOnLastWindowClosed(False)
    window.closed.connect(app.quit)
    hints = app.styleHints()
    hints.colorSchemeChanged.connect(
        lambda _scheme: apply_theme(app, "system") if controller.settings.theme == "system" else None
    )
    if warning:
        window.banners.show_message(warning, kind="warning")
    window.show()
    window.start()
    try:
        return app.exec()
    finally:
        try:
            controller.shutdown()
        except Exception:  # exiting anyway; the log has it
            log.exception("controller.shutdown() failed")
