"""Crashes outside the guarded calls reach the log and the window: a thread's, the main thread's, fatal ones."""

from __future__ import annotations

import faulthandler
import sys
import threading
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.controller import AppController
from app.settings import Settings
from tests.fakes import ScriptedAudio
from ui.app_window import MainWindow


def test_a_crash_in_a_thread_reaches_the_log_and_a_banner(qtbot: QtBot, tmp_path: Path) -> None:
    before = (sys.excepthook, threading.excepthook)
    controller = AppController(
        Settings(),
        settings_path=tmp_path / "settings.json",
        audio_factory=ScriptedAudio,
        auto_demo=False,
        log_folder=tmp_path / "logs",
    )
    window = MainWindow(controller)
    qtbot.addWidget(window)
    window.show()
    window.start()
    try:
        assert faulthandler.is_enabled() and (tmp_path / "logs" / "crash.log").is_file(), "fatal errors go to a file"

        def helper() -> None:
            raise ZeroDivisionError("the helper divided by zero")

        thread = threading.Thread(target=helper, name="parley-helper")
        thread.start()
        thread.join()

        def banner_says(text: str) -> bool:
            return any(text in banner.text() for banner in window.banners.banners())

        qtbot.waitUntil(lambda: banner_says("the helper divided by zero"), timeout=5000)
        banner = next(b for b in window.banners.banners() if "divided by zero" in b.text())
        assert "thread 'parley-helper'" in banner.text() and banner.kind == "error"
        assert 'raise ZeroDivisionError("the helper divided by zero")' in banner.details.toPlainText()
        log = (tmp_path / "logs" / "parley.log").read_text()
        assert "Unexpected error in the thread 'parley-helper'" in log and "Traceback" in log

        # The main thread: Qt hands an exception escaping a slot to sys.excepthook.
        try:
            raise KeyError("a slot went wrong")
        except KeyError:
            sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
        qtbot.waitUntil(lambda: banner_says("a slot went wrong"), timeout=5000)
        assert "Unexpected error in the main thread" in (tmp_path / "logs" / "parley.log").read_text()
        assert window.isVisible(), "the app keeps running"
    finally:
        window.pump.stop()
        window.close()
        controller.shutdown()
    assert (sys.excepthook, threading.excepthook) == before, "shutdown puts the previous hooks back"
