"""The menu-bar / tray icon: its state, its menu, and what closing the window does, with and without a tray.

In this process Qt runs offscreen, where there is no tray: the icon is not created, and closing the
window quits even with "keep running in the tray" chosen (the only honest thing to do), which the
Settings page says. The icon's logic (state, tooltip, menu) is tested here on an injected tray. The
real thing runs in a child process on a private X server (tests/ui/tray_probe.py): with a tray host
(trayer) Qt finds the tray, the icon shows the states, closing the window hides it and Parley keeps
running until Quit Parley is chosen from the tray menu; without one, Qt finds no tray.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PySide6.QtWidgets import QSystemTrayIcon
from pytestqt.qtbot import QtBot

from app.messages import AppState, StateChanged
from tests.fakes import FakeController
from tests.test_hotkey import private_x_server
from tests.ui.test_state_indicator import ink
from ui import tray as tray_module
from ui.app_window import MainWindow
from ui.settings_dialog import SettingsDialog
from ui.theme import ThemeColors, colors
from ui.tray import TrayIcon, icon_kind

ROOT = Path(__file__).resolve().parents[2]


def state(kind: AppState, detail: str = "") -> StateChanged:
    return StateChanged(kind, detail, microphone="Mic", speaker="Speaker")


def one_colour_theme() -> ThemeColors:
    """Both badge discs in one colour, their glyphs white."""
    return dataclasses.replace(colors(), talk_active="#000000", accent="#000000", accent_text="#ffffff")


def test_the_icon_shows_idle_listening_and_speaking_each_with_its_own_shape(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert icon_kind(state(AppState.LISTENING)) == "listening"
    assert icon_kind(state(AppState.SPEAKING)) == "speaking"
    for other in (AppState.READY, AppState.LOADING, AppState.PAUSED, AppState.NO_AUDIO, AppState.ERROR):
        assert icon_kind(state(other)) == "idle"
    monkeypatch.setattr(tray_module, "colors", one_colour_theme)  # only shapes can tell the badges apart
    tray = TrayIcon(available=False)
    shapes = {kind: ink(icon.pixmap(32, 32).toImage()) for kind, icon in tray.icons.items()}
    assert len(set(shapes.values())) == 3, "two states share one shape"


def test_without_a_tray_there_is_no_icon_and_closing_the_window_quits(
    qtbot: QtBot, fake: FakeController, make_window: object
) -> None:
    assert not QSystemTrayIcon.isSystemTrayAvailable(), "Qt's offscreen platform has no tray"
    fake.settings = fake.settings.with_changes(keep_in_tray=True)
    window: MainWindow = make_window(fake)  # type: ignore[operator]
    assert not window.tray.available and window.tray.icon is None and not window.keeps_running_in_tray
    dialog = SettingsDialog(fake, window)
    qtbot.addWidget(dialog)
    assert not dialog.tray_check.isEnabled() and "closing the window quits Parley" in dialog.tray_note.text()
    with qtbot.waitSignal(window.closed, timeout=2000):
        window.close()
    assert not window.isVisible() and not window.pump.is_running()


@pytest.fixture
def tray_window(qtbot: QtBot, fake: FakeController) -> Iterator[MainWindow]:
    """The window with a tray injected (its QSystemTrayIcon exists, though offscreen shows nothing)."""
    window = MainWindow(fake, tray=TrayIcon(available=True))
    qtbot.addWidget(window)
    window.show()
    window.start()
    window.pump.drain()
    yield window
    window.pump.stop()


def test_the_tray_follows_the_state_and_its_menu_talks_mutes_opens_and_quits(
    qtbot: QtBot, tray_window: MainWindow, fake: FakeController
) -> None:
    tray = tray_window.tray
    assert tray.icon is not None and tray.talk_action.isEnabled()  # the model is loaded: talking is possible
    tray_window.handle_state(state(AppState.LOADING, "Loading m4…"))
    assert tray.kind == "idle" and not tray.talk_action.isEnabled() and "Loading m4" in tray.tooltip
    tray_window.handle_state(state(AppState.READY))
    tray.talk_action.trigger()  # a menu item cannot be held: it starts talking…
    assert fake.calls_to("set_talking") == [(True,)] and tray_window.conversation.talk.talking
    fake.talking = True
    tray_window.pump.drain()
    assert tray.kind == "listening" and tray.tooltip.startswith("Parley — Listening")
    tray.talk_action.trigger()  # …and stops it
    assert fake.calls_to("set_talking")[-1] == (False,) and not tray_window.conversation.talk.talking
    tray_window.conversation.talk.button.pressed.emit()  # the window's own button: the tray item follows
    assert tray.talk_action.isChecked()
    tray_window.conversation.talk.button.released.emit()
    assert not tray.talk_action.isChecked()
    tray_window.handle_state(state(AppState.SPEAKING))
    assert tray.kind == "speaking"

    tray.mute_action.trigger()
    assert tray_window.menu_actions.mute.isChecked() and fake.settings.muted
    tray_window.menu_actions.mute.trigger()
    assert not tray.mute_action.isChecked()

    tray_window.hide()
    tray.open_action.trigger()
    assert tray_window.isVisible()
    with qtbot.waitSignal(tray_window.closed, timeout=2000):
        tray.quit_action.trigger()


def test_kept_in_the_tray_closing_hides_the_window_and_parley_keeps_running(
    qtbot: QtBot, tray_window: MainWindow, fake: FakeController
) -> None:
    fake.settings = fake.settings.with_changes(keep_in_tray=True)
    closed: list[bool] = []
    tray_window.closed.connect(lambda: closed.append(True))
    tray_window.close()
    assert not tray_window.isVisible() and not closed, "hidden, not quit"
    assert tray_window.pump.is_running(), "the app keeps listening for the talk key and the assistant"
    assert "shutdown" not in [name for name, _ in fake.calls]
    tray_window.tray.open_action.trigger()
    assert tray_window.isVisible()
    with qtbot.waitSignal(tray_window.closed, timeout=2000):
        tray_window.menu_actions.quit.trigger()  # File → Quit quits, tray or not


@contextmanager
def tray_host(display: str) -> Iterator[None]:
    host = subprocess.Popen(
        ["trayer", "--edge", "top", "--align", "right", "--widthtype", "pixel", "--width", "120", "--height", "32"],
        env={**os.environ, "DISPLAY": display},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # trayer takes the _NET_SYSTEM_TRAY selection
        assert host.poll() is None, "trayer did not start"
        yield
    finally:
        host.terminate()
        host.wait(10)


def probe(display: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "probe.json"
    environment = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "XDG_DATA_HOME": str(tmp_path / "d")}
    environment.pop("WAYLAND_DISPLAY", None)
    shots = tmp_path / "shots"
    shots.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "tests.ui.tray_probe", str(out), str(shots)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen: dict[str, object] = json.loads(out.read_text())
    print(f"\ntray probe on {display}: {seen}")
    return seen


@pytest.mark.gui
def test_on_a_desktop_with_a_tray_closing_the_window_keeps_parley_in_the_tray_until_quit(tmp_path: Path) -> None:
    if shutil.which("trayer") is None:
        raise RuntimeError("the tray test needs trayer (packaging/system-deps.sh test installs it)")
    with private_x_server() as display, tray_host(display):
        seen = probe(display, tmp_path)
    assert seen["system_tray_available"] is True and seen["available"] is True
    assert seen["icon_visible"] is True and seen["icon_size"] not in (None, [0, 0])
    kinds = [kind for kind, _ in seen["kinds"]]  # type: ignore[union-attr]
    assert kinds == ["listening", "speaking", "idle"]
    assert seen["hidden_after_close"] is True and seen["pump_running_after_close"] is True
    assert seen["ended_at"] == "tray quit", "closing hid it; Quit Parley in the tray ended it"
    assert "quit_timed_out" not in seen and seen["exit_code"] == 0 and seen["shut_down_window"] is True


@pytest.mark.gui
def test_on_a_desktop_without_a_tray_qt_finds_none_and_closing_quits(tmp_path: Path) -> None:
    with private_x_server() as display:
        seen = probe(display, tmp_path)
    assert seen["system_tray_available"] is False and seen["available"] is False and seen["icon_visible"] is False
    assert seen["hidden_after_close"] is True and seen["ended_at"] == "close", "closing the window quit"
    assert "quit_timed_out" not in seen and seen["exit_code"] == 0
