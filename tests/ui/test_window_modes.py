"""The window and the new modes: nothing dropped without asking, the talk key from other apps, hands-free's
talk control, the numerics advice, and the Settings pages for all of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from app.hotkey import ACCESSIBILITY_URL, WAYLAND_MESSAGE, GlobalKeySupport
from app.messages import GlobalTalk, NumericsAdvice, NumericsChanged
from app.settings import Settings
from tests.fakes import FakeController
from tests.ui.test_history_view import answer_next_box
from ui.app_window import MainWindow
from ui.model_settings import NUMERICS_NOTE
from ui.settings_dialog import HANDS_FREE_NOTE, SettingsDialog

# --------------------------------------------------------------------------- no silent discard


def test_new_conversation_goes_ahead_when_nothing_would_be_lost(window: MainWindow, fake: FakeController) -> None:
    window.menu_actions.new_conversation.trigger()
    assert fake.calls_to("new_conversation") == [()]


@pytest.mark.parametrize("action", ["new_conversation", "quit"])
def test_a_conversation_not_kept_anywhere_is_never_dropped_without_asking(
    window: MainWindow, fake: FakeController, action: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.at_risk = True  # saving is off and this one was not saved by hand
    trigger = getattr(window.menu_actions, action).trigger

    def happened() -> bool:
        return bool(fake.calls_to("new_conversation")) if action == "new_conversation" else not window.isVisible()

    answer_next_box("Cancel")
    trigger()
    assert not happened() and window.isVisible()

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: "")
    answer_next_box("Save…")  # …then the folder dialog is cancelled: nothing happens either
    trigger()
    assert not happened() and fake.calls_to("save_conversation") == []

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path))
    answer_next_box("Save…")
    trigger()
    assert fake.calls_to("save_conversation") == [(tmp_path,)] and happened()
    fake.at_risk = False  # saved: closing the window at the end of the test has nothing to ask


def test_discard_is_a_choice_and_closing_the_window_asks_too(window: MainWindow, fake: FakeController) -> None:
    fake.at_risk = True
    answer_next_box("Discard")
    window.menu_actions.new_conversation.trigger()
    assert fake.calls_to("new_conversation") == [()]
    answer_next_box("Cancel")  # the new conversation was not saved either
    window.close()  # the window manager's close button
    assert window.isVisible()
    answer_next_box("Discard")
    window.close()
    assert not window.isVisible()


# --------------------------------------------------------------------------- the talk key in other apps, hands-free


def test_the_key_pressed_in_another_app_talks_like_the_window_key(window: MainWindow, fake: FakeController) -> None:
    talk = window.conversation.talk
    fake.queue(GlobalTalk(True))
    window.pump.drain()
    assert talk.talking and fake.calls_to("set_talking") == [(True,)]
    fake.queue(GlobalTalk(False))
    window.pump.drain()
    assert not talk.talking and fake.calls_to("set_talking")[-1] == (False,)

    window.apply_ui_settings(fake.settings.with_changes(hands_free=True))  # each press opens or closes the mic
    assert talk.mode == "toggle" and talk.hands_free
    assert talk.hint.text() == "Press Space or the button to open the microphone"
    fake.queue(GlobalTalk(True))
    window.pump.drain()
    assert talk.talking and talk.hint.text().startswith("Microphone open")
    fake.queue(GlobalTalk(False))
    window.pump.drain()
    assert not talk.talking


def test_hands_free_the_button_opens_and_closes_the_microphone(window: MainWindow, fake: FakeController) -> None:
    talk = window.conversation.talk
    window.apply_ui_settings(fake.settings.with_changes(hands_free=True))
    talk.button.pressed.emit()
    talk.button.released.emit()
    assert talk.talking, "a press opens it, the release keeps it open"
    talk.button.pressed.emit()
    talk.button.released.emit()
    assert not talk.talking
    assert [args for args in fake.calls_to("set_talking")] == [(True,), (False,)]


def test_slow_exact_numerics_are_explained_and_fast_is_one_click_away(window: MainWindow, fake: FakeController) -> None:
    fake.queue(
        NumericsAdvice(1.3, 0.8, "Exact numerics do not keep up on this machine: each 80 ms frame takes 104 ms.")
    )
    window.pump.drain()
    banner = next(b for b in window.banners.banners() if "Exact numerics" in b.text())
    banner.action_button.click()
    (applied,) = fake.calls_to("apply_settings")
    assert applied[0].numerics == "fast" and fake.settings.numerics == "fast"
    fake.queue(NumericsChanged("fast", {"fused_mamba_step": True, "residual_vq": False}))
    window.pump.drain()
    assert window.statusBar().currentMessage().startswith("Numerics: fast (1 of 2 GPU kernels in use)")
    fake.queue(NumericsChanged("fast", {"fused_mamba_step": False}))
    window.pump.drain()
    assert "no GPU kernels here" in window.statusBar().currentMessage()


# --------------------------------------------------------------------------- settings


def make_dialog(qtbot: QtBot, fake: FakeController) -> SettingsDialog:
    dialog = SettingsDialog(fake)
    qtbot.addWidget(dialog)
    return dialog


def test_the_new_settings_round_trip_and_save(qtbot: QtBot, tmp_path: Path) -> None:
    custom = Settings(
        hands_free=True,
        global_talk_key_enabled=True,
        global_talk_key="Ctrl+Space",
        history=False,
        history_limit_gb=0.5,
        numerics="fast",
    )
    fake = FakeController(custom, history_folder=tmp_path / "h")
    dialog = make_dialog(qtbot, fake)
    assert dialog.settings() == custom
    assert dialog.hands_free_check.isChecked() and HANDS_FREE_NOTE in dialog.hands_free_note.text()
    assert "headphones" in HANDS_FREE_NOTE and "speakers" in HANDS_FREE_NOTE
    assert dialog.model_page.fast_radio.isChecked() and "last digits" in NUMERICS_NOTE
    assert not dialog.history_limit.isEnabled(), "no limit to set while keeping is off"

    dialog.model_page.exact_radio.setChecked(True)
    dialog.history_check.setChecked(True)
    dialog.history_limit.setValue(12.5)
    dialog.global_edit.setText("right alt")
    dialog.accept()
    (saved,) = fake.calls_to("apply_settings")
    assert saved[0] == custom.with_changes(
        numerics="exact", history=True, history_limit_gb=12.5, global_talk_key="Right Alt"
    )


def test_hands_free_is_offered_only_where_echo_cancellation_works(qtbot: QtBot, tmp_path: Path) -> None:
    fake = FakeController(history_folder=tmp_path / "h")
    fake.echo_unavailable = "Echo cancellation is not available on this computer (no wheel). Use headphones."
    dialog = make_dialog(qtbot, fake)
    assert not dialog.hands_free_check.isEnabled() and dialog.hands_free_note.text() == fake.echo_unavailable


def test_a_global_key_that_cannot_be_used_is_explained_as_it_is_typed_and_not_saved(
    qtbot: QtBot, tmp_path: Path
) -> None:
    fake = FakeController(history_folder=tmp_path / "h")
    dialog = make_dialog(qtbot, fake)
    assert dialog.global_status.text() == fake.key_support.message
    dialog.global_check.setChecked(True)
    dialog.global_edit.setText("a")
    assert "types text" in dialog.global_status.text() and dialog.global_edit.property("invalid")
    dialog.accept()
    assert fake.calls_to("apply_settings") == [] and "types text" in dialog.error.text()
    dialog.global_edit.setText("ctrl+")
    assert "empty part" in dialog.global_status.text()
    dialog.global_edit.setText("F9")
    assert dialog.global_status.text() == fake.key_support.message and not dialog.global_edit.property("invalid")


def test_wayland_and_macos_permissions_are_said_where_the_setting_is(qtbot: QtBot, tmp_path: Path) -> None:
    wayland = FakeController(history_folder=tmp_path / "h")
    wayland.key_support = GlobalKeySupport(False, "wayland", WAYLAND_MESSAGE)
    dialog = make_dialog(qtbot, wayland)
    assert not dialog.global_check.isEnabled() and dialog.global_status.text() == WAYLAND_MESSAGE
    assert "not available under Wayland" in WAYLAND_MESSAGE and dialog.permissions_button.isHidden()

    mac = FakeController(history_folder=tmp_path / "h")
    needs = "To use the talk key while other apps are in front, Parley needs the Accessibility permission. …"
    mac.key_support = GlobalKeySupport(False, "macos", needs, (ACCESSIBILITY_URL,))
    dialog = make_dialog(qtbot, mac)
    assert dialog.global_check.isEnabled(), "granting the permission makes it work: it stays choosable"
    assert dialog.global_status.text() == needs and not dialog.permissions_button.isHidden()


def test_on_the_welcome_page_the_key_from_another_app_or_the_tray_starts_the_conversation_there(
    make_window: object, tmp_path: Path
) -> None:
    fresh = FakeController(Settings(theme="light", hands_free=True), log_dir=tmp_path / "logs")
    window: MainWindow = make_window(fresh)  # type: ignore[operator]
    page = window.first_run
    fresh.queue(GlobalTalk(True))  # nothing loaded yet: nothing happens
    window.pump.drain()
    assert fresh.calls_to("set_talking") == [] and window.pages.currentWidget() is page
    page.demo_button.click()
    window.pump.drain()
    assert "open the microphone" in page.subtitle.text(), "the welcome page speaks of hands-free"
    fresh.queue(GlobalTalk(True))
    window.pump.drain()
    assert window.pages.currentWidget() is window.conversation, "the conversation shows where it runs"
    assert fresh.calls_to("set_talking") == [(True,)]
    window.tray.talk_action.trigger()  # the tray's item closes the microphone again
    assert fresh.calls_to("set_talking") == [(True,), (False,)]


def test_the_empty_transcript_asks_for_what_the_talk_mode_needs(make_window: object, tmp_path: Path) -> None:
    for settings, asks in (
        (Settings(theme="light"), "Hold the talk key and speak."),
        (Settings(theme="light", talk_mode="toggle"), "press it again when you are done"),
        (Settings(theme="light", hands_free=True), "open the microphone, then just talk"),
    ):
        controller = FakeController(settings, log_dir=tmp_path / "logs")
        window: MainWindow = make_window(controller)  # type: ignore[operator]
        assert asks in window.conversation.transcript.placeholder.text(), settings
