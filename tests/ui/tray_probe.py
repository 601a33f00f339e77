"""Run by tests/ui/test_tray.py in its own process on a real X server: Parley's window and tray icon.

``python -m tests.ui.tray_probe OUT_JSON [SCREENSHOT_DIR]`` builds the main window on a scripted
controller (keep running in the tray chosen), then, on the Qt event loop: reports whether Qt found a
tray, shows the listening and speaking states, closes the window (with a tray it must hide and the app
keep running; without one the app ends there), then chooses Quit Parley from the tray menu (the app
must end). What it saw goes to OUT_JSON; ``ended_at`` says at which step the window closed for good.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from app.messages import AppState, StateChanged
from app.settings import Settings
from tests.fakes import FakeController
from ui.app_window import MainWindow


def main(out: Path, shots: Path | None) -> int:
    app = QApplication([])
    app.setQuitOnLastWindowClosed(False)
    folder = Path(tempfile.mkdtemp())
    model = folder / "m4"
    model.mkdir()
    (model / "config.json").write_text("{}")
    fake = FakeController(
        Settings(checkpoints={"4bit": model}, active_variant="4bit", keep_in_tray=True), history_folder=folder / "h"
    )
    window = MainWindow(fake)
    seen: dict[str, Any] = {"system_tray_available": QSystemTrayIcon.isSystemTrayAvailable(), "stage": "states"}
    window.closed.connect(lambda: seen.setdefault("ended_at", seen["stage"]))
    window.closed.connect(app.quit)
    window.show()
    window.start()

    def snapshot(name: str) -> None:
        if shots is not None:
            app.primaryScreen().grabWindow(0).save(str(shots / f"{name}.png"))

    def step_states() -> None:
        tray = window.tray
        seen["available"] = tray.available
        seen["icon_visible"] = tray.icon is not None and tray.icon.isVisible()
        geometry = tray.icon.geometry() if tray.icon is not None else None
        seen["icon_size"] = [geometry.width(), geometry.height()] if geometry is not None else None
        kinds = []
        for state in (AppState.LISTENING, AppState.SPEAKING, AppState.READY):
            window.handle_state(StateChanged(state, microphone="Mic", speaker="Speaker", model=fake.board.model))
            app.processEvents()
            kinds.append([tray.kind, tray.tooltip])
            snapshot(f"tray-{state.name.lower()}")
        seen["kinds"] = kinds
        seen["stage"] = "close"
        window.close()  # as the window manager's close button does
        seen["hidden_after_close"] = not window.isVisible()
        QTimer.singleShot(300, step_hidden)

    def step_hidden() -> None:
        seen["pump_running_after_close"] = window.pump.is_running()
        seen["stage"] = "tray quit"
        window.tray.quit_action.trigger()  # Quit Parley, from the tray menu
        QTimer.singleShot(3000, lambda: (seen.setdefault("quit_timed_out", True), app.quit()))

    QTimer.singleShot(800, step_states)
    code = app.exec()
    seen["exit_code"] = code
    seen["shut_down_window"] = not window.isVisible() and not window.pump.is_running()
    out.write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None))
