"""The settings dialog: exact round trip, saving through the controller, validation, the 4↔8-bit toggle."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from pytestqt.qtbot import QtBot

from app.messages import AppState, ModelLoaded, StateChanged
from app.settings import Settings
from app.variants import variant
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.settings_dialog import SettingsDialog


@pytest.fixture
def custom(model_dirs: dict[str, Path]) -> Settings:
    return Settings(
        checkpoints=dict(model_dirs),
        active_variant="4bit",
        input_device="USB Headset",
        output_device="Unplugged Speakers",  # not in the fake's list: must survive as "(not connected)"
        system_prompt="Be brief.\nAnswer in French.",
        talk_key="F5",
        talk_mode="toggle",
        idle_pause=False,
        idle_pause_delay_s=45.0,
        ducking=False,
        overlay=False,
        theme="dark",
        window_geometry="AdnQywADAAA=",
        keep_up=True,
        download_layout="parley",
    )


def loaded(key: str) -> StateChanged:
    """The state with the variant ``key`` loaded."""
    model = ModelLoaded(f"VoiceChat-{key}", Path(f"/models/{key}"), variant(key))
    return StateChanged(AppState.READY, model=model, microphone="Mic", speaker="Speaker")


def make_dialog(
    qtbot: QtBot, settings: Settings, status: StateChanged | None = None
) -> tuple[SettingsDialog, FakeController]:
    fake = FakeController(settings)
    dialog = SettingsDialog(fake, status=status if status is not None else loaded("4bit"))
    qtbot.addWidget(dialog)
    return dialog, fake


def test_round_trip_is_exact(qtbot: QtBot, custom: Settings) -> None:
    dialog, _ = make_dialog(qtbot, custom)
    assert dialog.settings() == custom
    dialog.refresh_devices()  # refilling the lists keeps the choices
    assert dialog.settings() == custom
    assert dialog.output_combo.currentText() == "Unplugged Speakers (not connected)"
    default_dialog, _ = make_dialog(qtbot, Settings())
    assert default_dialog.settings() == Settings()


def test_save_applies_the_edited_settings(qtbot: QtBot, custom: Settings) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    dialog.theme_combo.setCurrentIndex(dialog.theme_combo.findData("light"))
    dialog.hold_radio.setChecked(True)
    dialog.key_edit.setKeySequence(QKeySequence("Ctrl+Space"))
    dialog.idle_check.setChecked(True)
    dialog.prompt_edit.setPlainText("You are terse.")
    dialog.refresh_devices()
    dialog.input_combo.setCurrentIndex(0)  # system default
    assert dialog.model_page.download_choice.parley_radio.isChecked() and dialog.model_page.keep_up_check.isChecked()
    dialog.model_page.download_choice.cache_radio.click()
    assert not dialog.model_page.keep_up_check.isEnabled()  # exact numerics: the choice waits for fast
    dialog.model_page.fast_radio.setChecked(True)
    assert dialog.model_page.keep_up_check.isEnabled()
    dialog.model_page.keep_up_check.setChecked(False)
    with qtbot.waitSignal(dialog.accepted):
        dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    expected = custom.with_changes(
        theme="light",
        talk_mode="hold",
        talk_key="Ctrl+Space",
        idle_pause=True,
        system_prompt="You are terse.",
        input_device=None,
        download_layout="hf-cache",
        keep_up=False,
        numerics="fast",
    )
    assert fake.calls_to("apply_settings") == [(expected,)]


def test_missing_folder_is_reported_and_nothing_is_lost(qtbot: QtBot, custom: Settings, tmp_path: Path) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    dialog.show()
    dialog.tabs.setCurrentIndex(3)
    dialog.model_page.folder_edits["8bit"].setText(str(tmp_path / "nowhere"))
    dialog.accept()
    assert fake.calls_to("apply_settings") == []
    assert dialog.isVisible() and dialog.error.isVisible()
    assert "nowhere" in dialog.error.text() and "does not exist" in dialog.error.text()
    assert dialog.tabs.currentIndex() == 0, "the dialog shows the field with the problem"
    assert dialog.model_page.folder_edits["8bit"].text() == str(tmp_path / "nowhere")


def test_empty_key_is_rejected(qtbot: QtBot, custom: Settings) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    dialog.key_edit.clear()
    dialog.accept()
    assert fake.calls_to("apply_settings") == []
    assert "push-to-talk key" in dialog.error.text()


def test_apply_failure_keeps_the_dialog_open(qtbot: QtBot, custom: Settings) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    dialog.show()
    fake.fail("apply_settings", OSError(28, "No space left on device"))
    dialog.accept()
    assert dialog.isVisible()
    assert "No space left" in dialog.error.text()


def test_a_picked_model_loads_on_save_and_cancel_forgets_it(qtbot: QtBot, custom: Settings) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    assert dialog.model_page.variant_buttons["4bit"].isChecked()
    qtbot.mouseClick(dialog.model_page.variant_buttons["8bit"], Qt.MouseButton.LeftButton)
    assert dialog.model_page.variant_buttons["8bit"].isChecked()
    assert fake.calls_to("switch_variant") == [] and fake.calls_to("apply_settings") == [], "nothing before Save"
    assert "loads when you press Save" in dialog.model_page.variant_status.text()
    dialog.reject()
    assert fake.calls_to("switch_variant") == [] and fake.calls_to("apply_settings") == [], "Cancel reverts it all"
    assert fake.settings == custom

    dialog, fake = make_dialog(qtbot, custom)
    dialog.model_page.variant_buttons["8bit"].click()
    dialog.accept()
    ((saved,),) = fake.calls_to("apply_settings")
    assert saved.active_variant == "8bit" and fake.calls_to("switch_variant") == []


def test_a_picked_model_with_an_edited_folder_is_saved_together(qtbot: QtBot, custom: Settings, tmp_path: Path) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    new_folder = tmp_path / "elsewhere-8bit"
    new_folder.mkdir()
    dialog.model_page.folder_edits["8bit"].setText(str(new_folder))
    dialog.model_page.variant_buttons["8bit"].click()
    assert fake.calls_to("apply_settings") == []
    dialog.accept()
    ((saved,),) = fake.calls_to("apply_settings")
    assert saved.checkpoint_for("8bit") == new_folder and saved.active_variant == "8bit"


def test_variant_toggle_without_a_folder_explains(qtbot: QtBot, custom: Settings) -> None:
    dialog, fake = make_dialog(qtbot, custom.with_checkpoint("8bit", None))
    dialog.model_page.variant_buttons["8bit"].click()
    assert fake.calls_to("switch_variant") == []
    assert dialog.model_page.variant_buttons["4bit"].isChecked()
    status = dialog.model_page.variant_status.text()
    assert "Choose the 8-bit folder" in status and "File → Get a Model" in status and "first-run screen" not in status


def test_a_refused_folder_keeps_the_dialog_open_on_the_model_page(qtbot: QtBot, custom: Settings) -> None:
    from app.model_check import CheckpointRefused

    dialog, fake = make_dialog(qtbot, custom)
    dialog.show()
    dialog.tabs.setCurrentIndex(2)
    dialog.model_page.variant_buttons["8bit"].click()
    fake.fail("apply_settings", CheckpointRefused("The 8-bit folder cannot be used: /m holds the 4-bit checkpoint"))
    dialog.accept()
    assert dialog.isVisible() and dialog.tabs.currentWidget() is dialog.model_page
    assert dialog.error.text() == "The 8-bit folder cannot be used: /m holds the 4-bit checkpoint"
    assert fake.settings == custom


def test_refresh_button_lists_devices(qtbot: QtBot, custom: Settings) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    fake.inputs = ["Mic A", "Mic B", "USB Headset"]
    dialog.refresh_button.click()
    assert fake.calls_to("refresh_devices") == [()]
    items = [dialog.input_combo.itemText(i) for i in range(dialog.input_combo.count())]
    # Each device by its description, keeping its name (what the settings store) as data and tooltip.
    assert items == ["System default", "Mic A (described)", "Mic B (described)", "USB Headset (described)"]
    assert dialog.input_combo.currentText() == "USB Headset (described)"
    assert dialog.input_combo.currentData() == "USB Headset"
    assert dialog.input_combo.itemData(1, Qt.ItemDataRole.ToolTipRole) == "Mic A"
    assert "3 microphones" in dialog.device_status.text()


def test_refresh_failure_is_shown(qtbot: QtBot, custom: Settings) -> None:
    dialog, fake = make_dialog(qtbot, custom)
    fake.fail("refresh_devices", RuntimeError("PortAudio not initialised"))
    dialog.refresh_button.click()
    assert "PortAudio not initialised" in dialog.device_status.text()


def test_window_applies_saved_settings(window: MainWindow, fake: FakeController, qtbot: QtBot) -> None:
    dialog = window.open_settings()
    dialog.toggle_radio.setChecked(True)
    dialog.overlay_check.setChecked(False)
    dialog.accept()
    assert fake.settings.talk_mode == "toggle" and fake.settings.overlay is False
    assert window.conversation.talk.mode == "toggle"
    assert not window.menu_actions.show_overlay.isChecked()
