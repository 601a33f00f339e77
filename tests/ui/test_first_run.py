"""The first-run page: each button calls the right controller method; progress; the speed verdict."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from app.download_layout import HUB_CACHE, PARLEY_FOLDER
from app.hf_cache import hub_cache_dir
from app.messages import AppState, DownloadProgress, EngineState, Failure, LoadProgress, ModelLoaded, SpeedCheck
from app.settings import Settings
from app.variants import Q4
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.download_status import DownloadStatus, format_bytes, format_duration

REPO_4 = "mlx-community/NemotronLabs-VoiceChat-11B-4bit"
REPO_8 = "mlx-community/NemotronLabs-VoiceChat-11B-8bit"


@pytest.fixture
def fresh(tmp_path: Path) -> FakeController:
    return FakeController(Settings(theme="light"), log_dir=tmp_path / "logs")


@pytest.fixture
def first_run_window(make_window: Callable[[FakeController], MainWindow], fresh: FakeController) -> MainWindow:
    return make_window(fresh)


def test_no_model_shows_the_first_run_page(first_run_window: MainWindow) -> None:
    assert first_run_window.pages.currentWidget() is first_run_window.first_run
    assert first_run_window.indicator.text() == "No model"
    assert not first_run_window.menu_actions.export_profile.isEnabled()


def test_download_buttons_start_the_right_download(
    first_run_window: MainWindow, fresh: FakeController, tmp_path: Path
) -> None:
    page = first_run_window.first_run
    page.layout_choice.parley_radio.click()
    page.download_buttons["8bit"].click()
    ((repo, target, layout),) = fresh.calls_to("start_download")
    assert repo == REPO_8 and layout == PARLEY_FOLDER
    assert target == tmp_path / "data" / "Parley" / "models" / "NemotronLabs-VoiceChat-11B-8bit"
    assert page.cancel_button.isVisibleTo(page) and not page.download_buttons["4bit"].isEnabled()

    page.cancel_button.click()
    assert fresh.calls_to("cancel_download") == [()]
    assert page.download_buttons["4bit"].isEnabled() and not page.cancel_button.isVisibleTo(page)
    page.download_buttons["4bit"].click()
    assert fresh.calls_to("start_download")[-1][0] == REPO_4


def test_download_progress_is_shown_in_bytes(first_run_window: MainWindow, fresh: FakeController) -> None:
    page = first_run_window.first_run
    page.download_buttons["4bit"].click()
    fresh.queue(DownloadProgress(REPO_4, 2_300_000_000, 9_200_000_000))
    first_run_window.pump.drain()
    assert page.download_progress.value() == 250
    assert page.download_text.text().startswith("2.3 GB of 9.2 GB (25%)")


def test_download_failure_offers_a_retry(first_run_window: MainWindow, fresh: FakeController) -> None:
    page = first_run_window.first_run
    page.download_buttons["4bit"].click()
    fresh.queue(DownloadProgress(REPO_4, 10, 100, "Connection reset by peer", failed=True))
    first_run_window.pump.drain()
    assert "Connection reset by peer. Press Download to try again" in page.download_text.text()
    assert page.download_buttons["4bit"].isEnabled()


def test_choose_folder_uses_that_checkpoint(
    first_run_window: MainWindow, fresh: FakeController, monkeypatch: pytest.MonkeyPatch, model_dirs: dict[str, Path]
) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *args, **kwargs: str(model_dirs["8bit"]))
    first_run_window.first_run.folder_button.click()
    assert fresh.calls_to("use_checkpoint") == [(model_dirs["8bit"],)]


def test_cancelled_folder_dialog_does_nothing(
    first_run_window: MainWindow, fresh: FakeController, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *args, **kwargs: "")
    first_run_window.first_run.folder_button.click()
    assert fresh.calls_to("use_checkpoint") == []


def test_demo_is_labelled_and_ends_with_the_speed_verdict(first_run_window: MainWindow, fresh: FakeController) -> None:
    page = first_run_window.first_run
    assert "noise, not speech" in page.demo_button.text()
    page.demo_button.click()
    assert fresh.calls_to("start_demo") == [()]
    first_run_window.pump.drain()
    assert "noise, not speech" in page.status_title.text() and "nothing plays until" in page.status_text.text()
    assert first_run_window.header.demo_badge.isVisibleTo(first_run_window)
    assert first_run_window.header.demo_badge.text() == "Demo — noise, not speech"
    assert page.verdict.text().startswith("This computer keeps up with real time comfortably.")
    assert "0.62" in page.verdict.text()
    assert first_run_window.pages.currentWidget() is page, "the verdict stays until the user moves on"
    assert fresh.calls_to("start_conversation") == [], "loaded is not started: nothing runs on the welcome page"
    assert not first_run_window.status.conversation
    page.start_button.click()
    assert first_run_window.pages.currentWidget() is first_run_window.conversation
    assert fresh.calls_to("start_conversation") == [()]
    first_run_window.pump.drain()
    assert first_run_window.status.conversation


def test_load_progress_and_failure(first_run_window: MainWindow, fresh: FakeController) -> None:
    page = first_run_window.first_run
    fresh.queue(EngineState(AppState.LOADING), LoadProgress(0.5, "Reading weights"))
    first_run_window.pump.drain()
    assert page.status_text.text() == "Reading weights" and page.load_progress.value() == 500
    assert not page.demo_button.isEnabled()
    fresh.queue(Failure("config.json is missing in /x"), EngineState(AppState.NO_MODEL))
    first_run_window.pump.drain()
    assert page.demo_button.isEnabled()
    assert any("config.json is missing" in b.text() for b in first_run_window.banners.banners())


def test_download_status_speed_and_time_left() -> None:
    status = DownloadStatus()
    first = status.update(DownloadProgress(REPO_4, 1_000_000_000, 9_000_000_000), now=100.0)
    assert first == (1 / 9, "1.0 GB of 9.0 GB (11%)")
    second = status.update(DownloadProgress(REPO_4, 1_050_000_000, 9_000_000_000, "file 3 of 5"), now=101.0)
    assert second.text == "1.1 GB of 9.0 GB (12%) · 50.0 MB/s, about 3 min left · file 3 of 5"
    unknown = status.update(DownloadProgress(REPO_4, 2_000, None), now=101.2)
    assert unknown == (None, "2.0 kB downloaded")
    assert format_bytes(512) == "512 B" and format_duration(30) == "30 s" and format_duration(7200) == "2.0 h"


def test_with_the_demo_loaded_the_real_model_is_still_offered(
    first_run_window: MainWindow, fresh: FakeController
) -> None:
    page = first_run_window.first_run
    page.demo_button.click()
    first_run_window.pump.drain()
    assert page.status_title.text() == "Demo ready — noise, not speech"
    assert page.download_card.isVisibleTo(page) and page.download_buttons["4bit"].isEnabled()
    assert page.folder_button.isVisibleTo(page) and not page.demo_card.isVisibleTo(page)


def test_a_real_model_hides_the_choices_and_the_menu_brings_them_back(
    first_run_window: MainWindow, fresh: FakeController, model_dirs: dict[str, Path]
) -> None:
    page = first_run_window.first_run
    fresh.use_checkpoint(model_dirs["4bit"])
    first_run_window.pump.drain()
    assert page.status_title.text() == "Model ready" and not page.download_card.isVisibleTo(page)
    page.start_button.click()
    assert first_run_window.pages.currentWidget() is first_run_window.conversation

    first_run_window.menu_actions.get_model.trigger()
    assert first_run_window.pages.currentWidget() is page
    assert page.download_card.isVisibleTo(page) and page.start_button.isVisibleTo(page)
    page.start_button.click()
    assert first_run_window.pages.currentWidget() is first_run_window.conversation


def test_late_progress_after_cancel_keeps_it_cancelled(first_run_window: MainWindow, fresh: FakeController) -> None:
    page = first_run_window.first_run
    page.download_buttons["4bit"].click()
    page.cancel_button.click()
    fresh.queue(DownloadProgress(REPO_4, 0, None, "Download cancelled; it resumes where it stopped."))
    first_run_window.pump.drain()
    assert not page.cancel_button.isVisibleTo(page) and page.download_buttons["4bit"].isEnabled()
    assert page.download_text.text() == "Download cancelled; it resumes where it stopped."


def test_real_load_sequence_ends_on_the_verdict(first_run_window: MainWindow, fresh: FakeController) -> None:
    """The worker's order: loading, progress, progress, speed check, loaded, ready."""
    page = first_run_window.first_run
    fresh.queue(
        EngineState(AppState.LOADING, "Loading x…"),
        LoadProgress(-1.0, "Reading /models/x"),
        LoadProgress(0.7, "Loaded in 2.0 s; preparing the engine (50 %)"),
        SpeedCheck(0.8, "This computer keeps up."),
        ModelLoaded("VoiceChat-11B-4bit", Path("/models/x"), Q4),
        EngineState(AppState.READY),
    )
    first_run_window.pump.drain()
    assert page.status_title.text() == "Model ready"
    assert page.verdict.text().startswith("This computer keeps up.") and page.start_button.isVisibleTo(page)
    assert not page.load_progress.isVisibleTo(page)


def test_the_first_press_of_the_talk_key_starts_the_demo(first_run_window: MainWindow, fresh: FakeController) -> None:
    from PySide6.QtCore import QEvent, Qt
    from PySide6.QtGui import QKeyEvent
    from PySide6.QtWidgets import QApplication

    def key(kind: QEvent.Type) -> None:
        QApplication.sendEvent(first_run_window, QKeyEvent(kind, Qt.Key.Key_Space, Qt.KeyboardModifier.NoModifier))

    page = first_run_window.first_run
    key(QEvent.Type.KeyPress)  # nothing loaded yet: the key does nothing
    key(QEvent.Type.KeyRelease)
    assert fresh.calls_to("set_talking") == [] and first_run_window.pages.currentWidget() is page
    page.demo_button.click()
    first_run_window.pump.drain()
    page.download_buttons["8bit"].setFocus()
    key(QEvent.Type.KeyPress)  # Space on a focused button is that button's, not the talk key's
    assert fresh.calls_to("set_talking") == [] and first_run_window.pages.currentWidget() is page
    page.start_button.setFocus()
    key(QEvent.Type.KeyPress)
    assert first_run_window.pages.currentWidget() is first_run_window.conversation
    assert fresh.calls_to("set_talking") == [(True,)], "the press starts the demo and talks"
    first_run_window.pump.drain()
    assert first_run_window.status.conversation and first_run_window.indicator.text() == "Listening"
    key(QEvent.Type.KeyRelease)
    assert fresh.calls_to("set_talking") == [(True,), (False,)]


def test_downloads_go_to_the_hugging_face_cache_unless_parleys_folder_is_chosen(
    first_run_window: MainWindow, fresh: FakeController, tmp_path: Path
) -> None:
    page = first_run_window.first_run
    choice = page.layout_choice
    assert fresh.settings.download_layout == HUB_CACHE and choice.cache_radio.isChecked()  # the default, said
    assert "default" in choice.cache_radio.text() and str(hub_cache_dir()) in choice.cache_path.text()
    assert choice.change_button is not None and not choice.change_button.isEnabled()  # Change… is for Parley's folder
    page.download_buttons["4bit"].click()
    assert fresh.calls_to("start_download")[-1] == (REPO_4, hub_cache_dir(), HUB_CACHE)
    page.cancel_button.click()

    choice.parley_radio.click()  # remembered at once: saved with the settings
    assert fresh.settings.download_layout == PARLEY_FOLDER and choice.change_button.isEnabled()
    assert [call[0].download_layout for call in fresh.calls_to("apply_settings")] == [PARLEY_FOLDER]
    page.download_buttons["4bit"].click()
    models = tmp_path / "data" / "Parley" / "models"
    assert fresh.calls_to("start_download")[-1] == (REPO_4, models / Q4.folder_name, PARLEY_FOLDER)


def test_the_download_choice_screenshots(
    make_window: Callable[[FakeController], MainWindow], tmp_path: Path, qtbot: QtBot
) -> None:
    """Renders the welcome page with each choice (into /tmp/h54-shots when PARLEY_SHOTS is set, for a person)."""
    import os

    shots = Path(os.environ.get("PARLEY_SHOTS", tmp_path / "shots"))
    shots.mkdir(parents=True, exist_ok=True)
    for layout in (HUB_CACHE, PARLEY_FOLDER):
        controller = FakeController(Settings(theme="light", download_layout=layout), log_dir=tmp_path / "logs")
        window = make_window(controller)
        window.resize(900, 1000)
        page = window.first_run
        assert page.layout_choice.layout_choice == layout
        page.download_card.grab().save(str(shots / f"welcome-download-{layout}.png"))
        assert (shots / f"welcome-download-{layout}.png").stat().st_size > 0
