"""The logs quote what was said, so they are private: folder 0700, every log file 0600, whatever the umask."""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from app.export import ConversationRecording, Transcript, save_conversation
from app.logs import CRASH_FILE, LOG_FILE, configure_logging, install_crash_handlers
from tests.conftest import file_mode


@pytest.fixture
def root_handlers() -> Iterator[None]:
    """Removes the handlers a test adds to the root logger."""
    root = logging.getLogger()
    before = list(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in before]:
        root.removeHandler(handler)
        handler.close()


@pytest.mark.usefixtures("permissive_umask", "root_handlers")
def test_the_log_its_rotations_and_the_crash_log_are_private(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir(mode=0o777)
    (folder / f"{LOG_FILE}.1").write_text("an older version's log\n")
    (folder / f"{LOG_FILE}.1").chmod(0o644)

    path = configure_logging(folder)
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "baseFilename", None) == str(path))
    assert isinstance(handler, logging.handlers.RotatingFileHandler)
    logging.getLogger("test").warning("the user said: something private")
    handler.doRollover()
    logging.getLogger("test").warning("after the rollover")
    crash = install_crash_handlers(lambda message, details: None, folder)
    crash.uninstall()

    assert file_mode(folder) == 0o700
    files = {p.name: file_mode(p) for p in folder.iterdir()}
    assert set(files) >= {LOG_FILE, f"{LOG_FILE}.1", f"{LOG_FILE}.2", CRASH_FILE}
    assert set(files.values()) == {0o600}, files


@pytest.mark.usefixtures("permissive_umask")
def test_a_saved_conversation_is_private(tmp_path: Path) -> None:
    recording = ConversationRecording()
    recording.add_input(np.zeros(1280, np.float32))
    recording.add_output(np.zeros(1764, np.float32))

    saved = save_conversation(tmp_path, recording, Transcript(), started=datetime.now(UTC))

    assert {p.name: file_mode(p) for p in saved} == {"user.wav": 0o600, "assistant.wav": 0o600, "transcript.md": 0o600}
    assert file_mode(saved[0].parent) == 0o700, "the conversation's own folder is private too"
