"""Checkpoints in the Hugging Face cache on the welcome page and in Settings → Model: a ready one is used in place
with one click, an incomplete one says what it lacks and has no button."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.hf_cache import CachedCheckpoint, CacheListing
from app.settings import Settings
from app.variants import Q4, Q8
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.cached_models import CachedModelsCard, CachedModelsSection
from ui.model_settings import ModelSettingsPage

SHOTS = Path(os.environ.get("PARLEY_SHOTS", "/work/shots/h54"))
CACHE = Path("/home/ada/.cache/huggingface/hub")
Q4_SNAPSHOT = CACHE / "models--mlx-community--NemotronLabs-VoiceChat-11B-4bit" / "snapshots" / ("3f2a9c1" + "0" * 33)
Q8_SNAPSHOT = CACHE / "models--mlx-community--NemotronLabs-VoiceChat-11B-8bit" / "snapshots" / ("77d0e4b" + "1" * 33)


def two_entries(offline: bool = False) -> CacheListing:
    ready = CachedCheckpoint(
        "mlx-community/NemotronLabs-VoiceChat-11B-4bit", Q4_SNAPSHOT.name, ("main",), Q4_SNAPSHOT, 9_878_000_000, Q4
    )
    partial = CachedCheckpoint(
        "mlx-community/NemotronLabs-VoiceChat-11B-8bit",
        Q8_SNAPSHOT.name,
        ("main",),
        Q8_SNAPSHOT,
        6_120_000_000,
        Q8,
        missing=("model-00003-of-00003.safetensors", "tokenizer.json"),
    )
    return CacheListing(CACHE, (ready, partial), offline)


def test_ready_entry_is_used_in_place_and_incomplete_one_says_what_is_missing(qtbot: QtBot) -> None:
    fake = FakeController(Settings())
    fake.cached = two_entries()
    section = CachedModelsSection(fake)
    qtbot.addWidget(section)
    used: list[tuple[str, Path]] = []
    section.checkpoint_used.connect(lambda key, path: used.append((key, path)))

    assert list(section.use_buttons) == [Q4_SNAPSHOT]  # only the complete one is offered
    assert section.use_buttons[Q4_SNAPSHOT].text() == "Use 4-bit"
    assert section.status_labels[Q8_SNAPSHOT].text() == (
        "Incomplete: missing model-00003-of-00003.safetensors, tokenizer.json."
    )
    assert str(CACHE) in section.summary.text()
    section.use_buttons[Q4_SNAPSHOT].click()
    assert fake.calls_to("use_checkpoint") == [(Q4_SNAPSHOT,)]
    assert used == [("4bit", Q4_SNAPSHOT)]


def test_an_incomplete_entry_is_never_passed_on(qtbot: QtBot) -> None:
    fake = FakeController(Settings())
    fake.cached = two_entries()
    section = CachedModelsSection(fake)
    qtbot.addWidget(section)
    section.use(fake.cached.checkpoints[1])
    assert fake.calls_to("use_checkpoint") == []


def test_scan_failure_and_offline_are_said(qtbot: QtBot) -> None:
    fake = FakeController(Settings())
    fake.fail("cached_checkpoints", OSError("permission denied"))
    section = CachedModelsSection(fake)
    qtbot.addWidget(section)
    assert section.summary.text() == "The Hugging Face cache could not be scanned: permission denied"
    fake.cached = two_entries(offline=True)
    section.rescan_button.click()
    assert section.summary.text().endswith("HF_HUB_OFFLINE is set: the cache is the only source.")
    assert list(section.use_buttons) == [Q4_SNAPSHOT]


def test_welcome_page_shows_the_cache_card_only_with_entries_and_while_choices_are_offered(
    make_window: Callable[[FakeController], MainWindow], tmp_path: Path
) -> None:
    empty = make_window(FakeController(Settings(theme="light"), log_dir=tmp_path / "logs")).first_run
    assert not empty.cached_card.isVisibleTo(empty)

    fake = FakeController(Settings(theme="light"), log_dir=tmp_path / "logs")
    fake.cached = two_entries()
    page = make_window(fake).first_run
    card = page.cached_card
    assert card.isVisibleTo(page) and list(card.section.use_buttons) == [Q4_SNAPSHOT]
    card.section.use_buttons[Q4_SNAPSHOT].click()
    assert fake.calls_to("use_checkpoint") == [(Q4_SNAPSHOT,)]
    assert page.status_title.text() == "Loading the model" and str(Q4_SNAPSHOT) in page.status_text.text()
    page.download_card.hide()  # as the page does once a model is loaded
    assert not card.isVisibleTo(page)
    page.download_card.show()
    assert card.isVisibleTo(page)


def test_settings_model_page_takes_the_snapshot_as_that_variants_folder(qtbot: QtBot) -> None:
    fake = FakeController(Settings())
    fake.cached = two_entries()
    page = ModelSettingsPage(fake, lambda message: None)
    qtbot.addWidget(page)
    page.load(fake.settings)
    page.cached_models.use_buttons[Q4_SNAPSHOT].click()
    # Settings apply on Save: the snapshot becomes the 4-bit folder and 4-bit is picked, nothing loads yet.
    assert fake.calls_to("use_checkpoint") == [] and fake.calls_to("switch_variant") == []
    assert page.folder_edits["4bit"].text() == str(Q4_SNAPSHOT) and page.variant == "4bit"
    assert "loads when you press Save" in page.variant_status.text()


def test_screenshot_of_the_cache_card(
    make_window: Callable[[FakeController], MainWindow], qtbot: QtBot, tmp_path: Path
) -> None:
    fake = FakeController(Settings(theme="light"), log_dir=tmp_path / "logs")
    fake.cached = two_entries()
    window = make_window(fake)
    window.resize(900, 900)
    qtbot.wait(50)
    card: CachedModelsCard = window.first_run.cached_card
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = card.grab()
    assert shot.width() > 400 and shot.save(str(SHOTS / "cached_models_welcome.png"))
    assert window.grab().save(str(SHOTS / "welcome_page.png"))
    from ui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(fake, status=None, parent=window)
    qtbot.addWidget(dialog)
    dialog.tabs.setCurrentWidget(dialog.model_page)
    dialog.resize(760, 980)
    dialog.show()
    qtbot.waitExposed(dialog)
    assert list(dialog.model_page.cached_models.use_buttons) == [Q4_SNAPSHOT]
    assert dialog.grab().save(str(SHOTS / "settings_model.png"))
