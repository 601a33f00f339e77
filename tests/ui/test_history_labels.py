"""History entries can be told apart: each shows its date, length, model and numerics.

Conversations that began alike ("Hello") on different models and numerics list differently; an
entry kept before the model and numerics were recorded still lists, with what is known.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from PySide6.QtWidgets import QApplication

from app.history import ConversationHistory, ConversationRecord, TranscriptLine
from tests.fakes import FakeController
from ui.app_window import MainWindow
from ui.history_view import ENTRY_ROLE

SHOTS = Path(os.environ.get("PARLEY_SHOTS", "/work/shots/h51-profile"))


def keep(
    history: ConversationHistory,
    started: datetime,
    seconds: float,
    model: str | None,
    numerics: str | None,
    words: str = "Hello",
) -> str:
    record = ConversationRecord(
        started,
        [TranscriptLine("user", 0.2, words), TranscriptLine("assistant", 1.0, "Hi<SPECIAL_27> there.\ufffd")],
        np.full(round(16_000 * seconds), 0.01, np.float32),
        np.full(round(22_050 * seconds), 0.02, np.float32),
        model=model,
        numerics=numerics,
    )
    entry = history.save(record)
    assert entry is not None
    return entry.id


def test_each_entry_shows_date_length_model_and_numerics_and_old_ones_still_list(
    window: MainWindow, fake: FakeController
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    old = keep(fake.history, now - timedelta(days=2), 3.0, None, None)  # as kept before these were recorded
    q4 = keep(fake.history, now - timedelta(hours=3), 12.0, "tiny4 · 4-bit", "exact")
    q8 = keep(fake.history, now - timedelta(hours=1), 75.0, "tiny8 · 8-bit", "fast", "<SPECIAL_12>Hello\ufffd\x07")
    manifest = json.loads((fake.history.folder / old / "conversation.json").read_text())
    assert "model" not in manifest and "numerics" not in manifest
    assert json.loads((fake.history.folder / q8 / "conversation.json").read_text())["model"] == "tiny8 · 8-bit"

    view = window.open_history()
    labels = [view.list.item(row).text() for row in range(view.list.count())]
    ids = [str(view.list.item(row).data(ENTRY_ROLE)) for row in range(view.list.count())]
    assert ids == [q8, q4, old], "newest first, none of them skipped"
    assert len(set(labels)) == 3, "no two alike"
    for label, started, length in (
        (labels[0], now - timedelta(hours=1), "1:15"),
        (labels[1], now - timedelta(hours=3), "0:12"),
        (labels[2], now - timedelta(days=2), "0:03"),
    ):
        assert started.astimezone().strftime("%a %d %b %Y, %H:%M") in label and f" · {length} · " in label
    assert labels[0].splitlines()[1] == "tiny8 · 8-bit · fast numerics"
    assert labels[1].splitlines()[1] == "tiny4 · 4-bit · exact numerics"
    assert labels[2].splitlines() == [labels[2].splitlines()[0], "“Hello”"], "what is known: date, length, words"
    assert "Model not recorded" in view.list.item(2).toolTip()
    assert "tiny8 · 8-bit · fast numerics" in view.list.item(0).toolTip()
    # What is not text for people stays out of this window too (the files keep it).
    assert labels[0].splitlines()[2] == "“Hello”"
    assert view.transcript.toPlainText() == "[00:00.2] user: Hello\n\n[00:01.0] assistant: Hi there."
    assert "<SPECIAL_12>Hello\ufffd\x07" in (fake.history.folder / q8 / "transcript.md").read_text()

    view.resize(820, 520)
    QApplication.processEvents()
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert view.grab().save(str(SHOTS / "history-list.png"))
