"""Fixtures for the window tests: an isolated home, a scripted controller, a shown main window."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QCoreApplication, QEvent
from pytestqt.qtbot import QtBot

from app.settings import Settings
from tests.fakes import FakeController
from ui.app_window import MainWindow


@pytest.fixture(autouse=True)
def isolated_user_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep settings, downloads and logs of every UI test inside its tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture
def model_dirs(tmp_path: Path) -> dict[str, Path]:
    """Two existing checkpoint folders (with a config.json each)."""
    folders = {}
    for variant in ("4bit", "8bit"):
        folder = tmp_path / "models" / f"NemotronLabs-VoiceChat-11B-{variant}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}", encoding="utf-8")
        folders[variant] = folder
    return folders


@pytest.fixture
def fake(model_dirs: dict[str, Path], tmp_path: Path) -> FakeController:
    """A controller whose 4-bit model loads on start()."""
    settings = Settings(checkpoints=dict(model_dirs), active_variant="4bit", theme="light")
    return FakeController(settings, log_dir=tmp_path / "logs")


WindowFactory = Callable[[FakeController], MainWindow]


@pytest.fixture
def make_window(qtbot: QtBot) -> Iterator[WindowFactory]:
    """Builds shown, started windows (first messages delivered) and frees them after the test."""
    made: list[MainWindow] = []

    def make(controller: FakeController) -> MainWindow:
        win = MainWindow(controller)
        qtbot.addWidget(win)
        win.show()
        qtbot.waitExposed(win)
        win.start()
        win.pump.drain()
        made.append(win)
        return win

    yield make
    for win in made:
        win.pump.stop()
        win.close()
        win.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # free them now, not at exit


@pytest.fixture
def window(make_window: WindowFactory, fake: FakeController) -> MainWindow:
    """The main window on a controller whose 4-bit model has loaded."""
    return make_window(fake)
