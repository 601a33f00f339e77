"""Conversation → History…: the list (a damaged entry marked, the others usable), reading, replay, export, delete."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.history import ConversationHistory, ConversationRecord, TranscriptLine
from app.messages import HistorySaved
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.history_view import DAMAGED_ROLE, HistoryWindow


def keep(history: ConversationHistory, hours_ago: float, words: str, seconds: float = 2.0) -> str:
    record = ConversationRecord(
        datetime.now(UTC) - timedelta(hours=hours_ago),
        [TranscriptLine("user", 0.2, words), TranscriptLine("assistant", 1.1, f"About {words.lower()}: yes.")],
        np.full(round(16_000 * seconds), 0.01, np.float32),
        np.full(round(22_050 * seconds), 0.02, np.float32),
    )
    entry = history.save(record)
    assert entry is not None
    return entry.id


@pytest.fixture
def three(fake: FakeController) -> list[str]:
    """Three kept conversations, the middle one then damaged (its manifest cut short)."""
    ids = [keep(fake.history, hours, words) for hours, words in ((5, "Oldest question"), (3, "Middle"), (1, "Newest"))]
    manifest = fake.history.folder / ids[1] / "conversation.json"
    manifest.write_text(manifest.read_text()[:40])
    return ids


def rows(view: HistoryWindow) -> list[str]:
    return [view.list.item(row).text() for row in range(view.list.count())]


def test_the_view_lists_newest_first_and_marks_a_damaged_entry_while_the_others_stay_readable(
    window: MainWindow, three: list[str]
) -> None:
    view = window.open_history()
    listed = rows(view)
    assert "“Newest”" in listed[0] and "“Oldest question”" in listed[1]
    assert listed[2].startswith("⚠ Damaged") and three[1] in listed[2]
    assert view.damage.isVisibleTo(view) and "1 conversation could not be read" in view.damage.text()
    assert "2 conversations" in view.summary.text() and "limit 2 GB" in view.summary.text()
    assert (
        "user: Newest" in view.transcript.toPlainText() and "assistant: About newest" in view.transcript.toPlainText()
    )
    view.list.setCurrentRow(2)  # the damaged one: why, and only Delete
    assert "could not be read" in view.transcript.toPlainText() and "conversation.json" in view.transcript.toPlainText()
    assert view.list.item(2).data(DAMAGED_ROLE) and not view.play_button.isEnabled()
    assert not view.export_button.isEnabled() and view.delete_button.isEnabled()
    view.list.setCurrentRow(1)
    assert "Oldest question" in view.transcript.toPlainText() and view.play_button.isEnabled()


def test_play_replays_through_the_controller_and_shows_how_far_it_got(
    window: MainWindow, fake: FakeController, three: list[str]
) -> None:
    view = window.open_history()
    view.play_button.click()
    assert fake.calls_to("replay_history") == [(three[2],)]
    window.pump.drain()  # the controller reports the replay's progress
    assert view.play_button.text() == "Stop" and view.status.text() == "Playing 0:01 of 0:02"
    view.play_button.click()
    assert fake.calls_to("stop_replay") == [()]
    window.pump.drain()
    assert view.play_button.text() == "Play" and view.status.text() == ""


def test_export_copies_the_conversation_into_a_chosen_folder(
    window: MainWindow, fake: FakeController, three: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path / "exports"))
    view = window.open_history()
    view.export_button.click()
    ((entry_id, folder),) = fake.calls_to("export_history")
    assert entry_id == three[2] and folder == tmp_path / "exports"
    (exported,) = (tmp_path / "exports").iterdir()
    assert sorted(p.name for p in exported.iterdir()) == ["assistant.wav", "transcript.md", "user.wav"]
    assert "Newest" in (exported / "transcript.md").read_text()
    assert view.status.text().startswith("Exported 3 files")


def answer_next_box(button_text: str) -> None:
    """Click ``button_text`` in the next message box that opens."""

    def click() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, click)
            return
        next(b for b in box.buttons() if b.text().replace("&", "") == button_text).click()

    QTimer.singleShot(20, click)


def test_delete_asks_first_and_removes_a_damaged_entry_too(
    window: MainWindow, fake: FakeController, three: list[str]
) -> None:
    view = window.open_history()
    view.list.setCurrentRow(2)
    answer_next_box("Cancel")
    view.delete_button.click()
    assert fake.calls_to("delete_history") == [] and view.list.count() == 3
    answer_next_box("Delete")
    view.delete_button.click()
    assert fake.calls_to("delete_history") == [(three[1],)]
    assert view.list.count() == 2 and not view.damage.isVisibleTo(view)
    assert not (fake.history.folder / three[1]).exists()


def test_a_conversation_kept_while_the_view_is_open_appears_in_it(
    window: MainWindow, fake: FakeController, three: list[str]
) -> None:
    view = window.open_history()
    time.sleep(1.0)  # entries are named by the second they started
    new = keep(fake.history, 0, "Just now")
    fake.queue(HistorySaved(new, fake.history.folder / new))
    window.pump.drain()
    assert "“Just now”" in rows(view)[0]
    assert "kept in the history" in window.statusBar().currentMessage()


def test_empty_history_says_what_will_happen(window: MainWindow, fake: FakeController) -> None:
    view = window.open_history()
    assert view.list.count() == 0 and "each one is kept here when it ends" in view.summary.text()
    fake.settings = fake.settings.with_changes(history=False)
    view.refresh()
    assert "Saving them is off" in view.summary.text()
    assert not view.play_button.isEnabled() and not view.delete_button.isEnabled()


def test_screenshot_of_the_history_view(window: MainWindow, three: list[str], tmp_path: Path, qtbot: QtBot) -> None:
    view = window.open_history()
    view.resize(820, 480)
    qtbot.wait(50)
    image = view.grab().toImage()
    image.save(str(tmp_path / "history.png"))
    colours = {image.pixelColor(x, y).name() for x in range(0, image.width(), 9) for y in range(0, image.height(), 9)}
    assert len(colours) > 8, "the view is drawn, not blank"
