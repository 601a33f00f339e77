"""File → Save Conversation… makes a folder of its own, as History → Export does, instead of dropping files loose.

The real controller and engine on a tiny checkpoint with a scripted microphone and speaker.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from app.controller import AppController
from app.messages import Failure, HistorySaved, ModelLoaded, Notice
from app.settings import Settings
from tests.realtime import frame_count
from tests.test_controller import wait_for

FILES = {"user.wav", "assistant.wav", "transcript.md", "profile.json"}
STAMP = "%Y-%m-%d %H.%M.%S"  # the local start time in the folder's name


def talked(build_controller, checkpoint: Path) -> AppController:
    controller: AppController = build_controller(
        Settings(checkpoints={"4bit": checkpoint}, active_variant="4bit", idle_pause=False)
    )
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    controller.set_talking(True)
    wait_for(controller, lambda seen: frame_count(seen) >= 10)
    controller.set_talking(False)
    return controller


def test_save_conversation_makes_a_folder_named_and_filled_as_history_export_makes_one(
    build_controller, tiny_q4: Path, tmp_path: Path
) -> None:
    controller = talked(build_controller, tiny_q4)
    controller.new_conversation()  # the first conversation goes to the history, to compare with its export
    seen = wait_for(controller, lambda seen: any(isinstance(m, HistorySaved) for m in seen))
    kept = next(m for m in seen if isinstance(m, HistorySaved))
    controller.set_talking(True)  # a new conversation waits for the talk key; this one is saved by hand below
    wait_for(controller, lambda seen: frame_count(seen) >= 6)
    controller.set_talking(False)
    chosen = tmp_path / "Documents"
    chosen.mkdir()
    (chosen / "user.wav").write_bytes(b"someone else's file")  # what a loose save used to overwrite

    saved = controller.save_conversation(chosen)
    folder = saved[0].parent
    current = controller.profile.current
    assert current is not None
    assert folder.parent == chosen and folder.name == f"Parley conversation {current.started.astimezone():{STAMP}}"
    assert {p.parent for p in saved} == {folder} and {p.name for p in saved} == FILES
    assert all(p.is_file() and p.stat().st_size > 0 for p in saved)
    assert (chosen / "user.wav").read_bytes() == b"someone else's file", "nothing loose, nothing overwritten"
    assert sorted(p.name for p in chosen.iterdir()) == sorted([folder.name, "user.wav"])
    notice = next(m for m in controller.poll() if isinstance(m, Notice))
    assert str(folder) in notice.message

    again = controller.save_conversation(chosen)  # saved twice: a second folder, the first one untouched
    assert again[0].parent.name == f"{folder.name} (2)"

    exported = controller.export_history(kept.entry_id, tmp_path / "exported")
    entry = controller.load_history(kept.entry_id).entry
    assert exported[0].parent.name == f"Parley conversation {entry.started.astimezone():{STAMP}}"
    assert {p.name for p in exported} == {p.name for p in saved}, "the same files both ways"


def test_a_save_that_fails_half_way_leaves_no_folder_and_says_so(
    build_controller, tiny_q4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app import export

    controller = talked(build_controller, tiny_q4)
    real = export.write_wav

    def full_disk(path: Path, samples, rate: int) -> Path:
        if Path(path).name == "assistant.wav":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, samples, rate)

    monkeypatch.setattr(export, "write_wav", full_disk)
    chosen = tmp_path / "Documents"
    assert controller.save_conversation(chosen) == []
    failure = next(m for m in controller.poll() if isinstance(m, Failure))
    assert "No space left on device" in failure.message and "still in memory" in failure.message
    assert list(chosen.iterdir()) == [], "no partial folder, no loose file"
    monkeypatch.setattr(export, "write_wav", real)
    assert {p.name for p in controller.save_conversation(chosen)} == FILES
