"""The main window: failures in banners, conversation time, menus, themes, a screenshot, and run_gui."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtGui import QColor, QDesktopServices, QImage, QPalette
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.messages import (
    AppState,
    ConversationTime,
    DeviceStatus,
    EngineState,
    Failure,
    Levels,
    LoadProgress,
    Notice,
    SpeedCheck,
    StateChanged,
    TurnLatency,
)
from app.settings import Settings, save_settings
from engine.events import AssistantTextDelta, ToolCall, UserTranscriptDelta
from tests.fakes import FakeController, make_frame_stats
from ui.app_window import MainWindow, run_gui
from ui.overlay import PHASE_COLORS, STAGE_COLORS
from ui.theme import DARK, LIGHT


def banner_texts(window: MainWindow) -> list[str]:
    return [banner.text() for banner in window.banners.banners()]


def test_failure_shows_a_banner_and_the_window_keeps_working(window: MainWindow, fake: FakeController) -> None:
    window.banners.clear()  # the speed-check note from loading
    trace = 'Traceback (most recent call last):\n  File "engine/session.py", line 1\nRuntimeError: Metal OOM'
    fake.queue(Failure("The engine ran out of memory; the conversation was restarted.", trace))
    window.pump.drain()
    (banner,) = window.banners.banners()
    assert banner.text() == "The engine ran out of memory; the conversation was restarted."
    assert banner.isVisibleTo(window) and not banner.details.isVisibleTo(window)
    banner.details_button.click()
    assert banner.details.isVisibleTo(window) and "RuntimeError: Metal OOM" in banner.details.toPlainText()

    # Still usable: new messages are shown, menus work, the talk key works.
    fake.queue(EngineState(AppState.READY), UserTranscriptDelta(1, "Still here", "Still here"))
    window.pump.drain()
    assert window.conversation.transcript.entries()[-1][1] == "Still here"
    window.menu_actions.new_conversation.trigger()
    assert fake.calls_to("new_conversation") == [()]
    banner.close_button.click()
    assert window.banners.banners() == []


def test_identical_failures_do_not_stack_and_banners_are_capped(window: MainWindow, fake: FakeController) -> None:
    fake.queue(*[Failure("Same problem")] * 5, *(Failure(f"Problem {i}") for i in range(6)))
    window.pump.drain()
    texts = banner_texts(window)
    assert len(texts) == 3 and texts[0] == "Problem 5"


def test_controller_errors_become_banners(
    window: MainWindow, fake: FakeController, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "profile.json"), ""))
    fake.frames_exported = 12
    fake.fail("export_profile", PermissionError(13, "Permission denied", str(tmp_path)))
    window.menu_actions.export_profile.trigger()
    assert any("Could not export the profile" in text and "Permission denied" in text for text in banner_texts(window))
    window.menu_actions.export_profile.trigger()  # the next try works
    assert (tmp_path / "profile.csv").exists()
    assert "profile.json" in window.statusBar().currentMessage()


def test_save_conversation_and_log_folder(
    window: MainWindow, fake: FakeController, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path))
    window.menu_actions.save_conversation.trigger()
    assert fake.calls_to("save_conversation") == [(tmp_path,)]
    assert "Saved 3 files" in window.statusBar().currentMessage()

    opened: list[str] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toLocalFile()) or False)
    window.menu_actions.open_log_folder.trigger()
    assert opened == [str(tmp_path / "logs")]
    assert any(str(tmp_path / "logs") in text for text in banner_texts(window)), "the path is shown if no browser opens"


def test_conversation_time_counts_down_and_offers_a_new_conversation(window: MainWindow, fake: FakeController) -> None:
    window.banners.clear()
    fake.queue(ConversationTime(65.0, 235.0))
    window.pump.drain()
    assert window.header.time_chip.text() == "3:55 left" and window.header.time_chip.property("level") == ""
    fake.queue(ConversationTime(260.0, 40.0))
    window.pump.drain()
    assert window.header.time_chip.property("level") == "warning"
    fake.queue(ConversationTime(300.0, 0.0), ConversationTime(300.1, 0.0))
    window.pump.drain()
    assert window.header.time_chip.text() == "Time is up"
    (banner,) = window.banners.banners()
    assert "length limit" in banner.text() and banner.action_button is not None
    banner.action_button.click()
    assert fake.calls_to("new_conversation") == [()]
    window.pump.drain()  # the old conversation is gone: no clock, no banner; the next waits for the talk key
    assert window.header.time_chip.isHidden() and window.banners.banners() == []
    fake.start_conversation()
    window.pump.drain()  # the new conversation starts, with all its time
    assert window.header.time_chip.text() == "5:00 left" and window.header.time_chip.property("level") == ""


def test_speed_check_device_status_and_notices(window: MainWindow, fake: FakeController) -> None:
    window.banners.clear()
    fake.queue(
        SpeedCheck(1.4, "This computer is too slow for the 8-bit model; try 4-bit."),
        DeviceStatus(None, "USB Headset", "Microphone disconnected — switched to the default device"),
        Notice("Profile exported", (Path("/tmp/p.json"),)),
        Levels(0.5, 0.25),
    )
    window.pump.drain()
    texts = banner_texts(window)
    assert any("too slow" in t for t in texts) and any("Microphone disconnected" in t for t in texts)
    # The device names come with the state snapshot, not with the event's message.
    assert window.device_label.text() == "Mic: Built-in Microphone  ·  Speaker: Built-in Speakers"
    assert window.statusBar().currentMessage() == "Profile exported (/tmp)"
    assert window.conversation.mic_meter.bar.fraction > 0.8


def test_theme_switch_from_the_view_menu(window: MainWindow, fake: FakeController) -> None:
    window.menu_actions.themes["dark"].trigger()
    assert fake.settings.theme == "dark"
    assert QApplication.palette().color(QPalette.ColorRole.Window) == QColor(DARK.window)
    window.menu_actions.themes["light"].trigger()
    assert QApplication.palette().color(QPalette.ColorRole.Window) == QColor(LIGHT.window)


def test_geometry_is_saved_on_close(window: MainWindow, fake: FakeController, qtbot: QtBot) -> None:
    window.resize(771, 702)  # the offscreen screen is 800×800
    window.close()
    assert fake.settings.window_geometry
    restored = MainWindow(fake)
    qtbot.addWidget(restored)
    assert (restored.width(), restored.height()) == (771, 702)
    fake.settings = fake.settings.with_changes(window_geometry="not base64!")
    fallback = MainWindow(fake)  # an unreadable geometry is ignored
    qtbot.addWidget(fallback)
    assert fallback.height() <= 800 and fallback.width() <= 800, "the default size fits the screen"


def test_screenshot_of_the_whole_window(window: MainWindow, fake: FakeController, tmp_path: Path) -> None:
    window.start_from_first_run()
    fake.board.speaking = True
    fake.queue(
        *(
            make_frame_stats(
                i, (6.0, 2.0, 26.0 + i % 9, 18.0 + i % 13, 5.0), other=1.0, mode="device" if i % 25 == 0 else "host"
            )
            for i in range(120)
        ),
        Levels(0.3, 0.2),
        UserTranscriptDelta(1, "What is the capital of France?", ""),
        AssistantTextDelta(2, 5, "Paris is the capital of France.", ""),
        ToolCall(3, "{}", "get_weather", {"city": "Paris"}),
        ConversationTime(30.0, 270.0),
        TurnLatency(0.52, 0.48, 0.61, 3),
    )
    window.pump.drain()
    assert window.indicator.text() == "Assistant speaking"
    QApplication.processEvents()
    path = tmp_path / "main-window.png"
    assert window.grab().save(str(path))
    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB32)
    assert image.width() >= 760 and image.height() >= 640
    colours = Counter(
        image.pixel(x, y) & 0xFFFFFF for y in range(0, image.height(), 2) for x in range(0, image.width(), 2)
    )
    assert len(colours) > 100, "a real window has text, bars and icons, not a flat fill"
    for phase, colour in PHASE_COLORS.items():
        assert colours[QColor(colour).rgb() & 0xFFFFFF] > 50, f"overlay bars for {phase}"
    for stage, colour in STAGE_COLORS.items():
        assert colours[QColor(colour).rgb() & 0xFFFFFF] > 3, f"the exact-stage panel's bar for {stage}"
    assert colours[QColor(LIGHT.accent).rgb() & 0xFFFFFF] > 1000, "the talk button"


def test_event_pump_limits_each_tick_and_survives_poll_failures(window: MainWindow, fake: FakeController) -> None:
    window.pump.stop()
    fake.queue(*(make_frame_stats(i) for i in range(600)))
    assert window.pump.drain() == 256 and window.pump.pending == 344
    assert window.pump.drain() == 256
    assert window.pump.drain() == 88 and window.pump.pending == 0
    assert len(window.conversation.overlay.frames) == 120
    fake.fail("poll", RuntimeError("queue broken"))
    window.pump.drain()
    assert any("stopped responding" in text for text in banner_texts(window))
    fake.queue(StateChanged(AppState.READY))
    window.pump.drain()  # polling goes on
    assert window.indicator.text() == "Ready"


def test_run_gui_builds_the_controller_and_shuts_it_down(qtbot: QtBot, tmp_path: Path) -> None:
    settings_file = tmp_path / "settings.json"
    settings_file.write_text("{ corrupt", encoding="utf-8")
    made: list[FakeController] = []
    seen_banners: list[str] = []

    def factory(settings: Settings) -> FakeController:
        made.append(FakeController(settings))
        return made[-1]

    def close_soon() -> None:
        window = next(w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible())
        seen_banners.extend(banner_texts(window))
        window.close()
        QApplication.quit()

    QTimer.singleShot(200, close_soon)
    assert run_gui(controller_factory=factory, settings_path=settings_file) == 0
    (controller,) = made
    assert [name for name, _ in controller.calls if name in ("start", "shutdown")] == ["start", "shutdown"]
    assert any("not valid JSON" in text for text in seen_banners), "the settings warning is shown"
    assert (tmp_path / "settings.json.corrupt").exists()


def test_run_gui_reports_a_controller_that_cannot_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shown: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text: shown.append(text))

    def broken(settings: Settings) -> FakeController:
        raise RuntimeError("no audio backend")

    save_settings(Settings(), tmp_path / "settings.json")
    assert run_gui(controller_factory=broken, settings_path=tmp_path / "settings.json") == 1
    assert shown and "no audio backend" in shown[0]


def test_variant_reload_shows_progress_in_the_state_line(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    dialog = window.open_settings()
    dialog.model_page.variant_buttons["8bit"].click()
    dialog.accept()
    assert [args[0].active_variant for args in fake.calls_to("apply_settings")] == ["8bit"]
    window.pump.drain()  # the fake reloads: loading, progress, loaded, speed check, ready
    assert window.indicator.text() == "Ready"
    assert window.header.model_chip.text().endswith("8-bit")
    assert window.pages.currentWidget() is window.conversation

    fake.queue(EngineState(AppState.LOADING), LoadProgress(0.25, "Reading weights"))
    window.pump.drain()
    assert window.indicator.text() == "Loading model…"
    assert window.indicator.detail() == "Reading weights (25%)"
    assert not window.conversation.talk.button.isEnabled()


def test_the_about_box_lists_versions_and_copies_them(window: MainWindow, fake: FakeController) -> None:
    about = window.show_about()
    assert about is not None
    assert about.value_labels["MLX"].text() == "0.32.4" and about.value_labels["Device"].text() == "cpu: fake"
    about.copy_button.click()
    copied = QApplication.clipboard().text()
    assert copied.startswith("Parley: 0.1.0\nMLX: 0.32.4\nDevice: cpu: fake\n") and about.copied.text()
    about.close()


def test_nothing_to_export_says_so_and_opens_no_dialog(
    window: MainWindow, fake: FakeController, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: opened.append(a) or ("", ""))
    window.menu_actions.export_profile.trigger()
    assert opened == [] and fake.calls_to("export_profile") == []
    assert any(text.startswith("Nothing to export yet") for text in banner_texts(window))


def test_volume_and_mute_reach_the_controller_and_stop_drops_speech(window: MainWindow, fake: FakeController) -> None:
    volume = window.conversation.volume
    assert volume.slider.value() == 80 and not volume.muted, "the saved level (default 0.8)"
    volume.slider.setValue(35)
    window.menu_actions.mute.trigger()
    assert fake.calls_to("set_volume")[-1] == (0.35, True) and volume.mute_button.isChecked()
    assert volume.value_label.text() == "muted"
    window.menu_actions.stop_speaking.trigger()
    volume.stop_button.click()
    assert fake.calls_to("stop_speaking") == [(), ()]
