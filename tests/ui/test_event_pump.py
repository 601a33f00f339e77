"""The event pump: typed signals in order, unknown messages skipped; the PySide6 reference-leak guard."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QColor
from pytestqt.qtbot import QtBot

from app.messages import AppState, Levels, Notice, StateChanged
from engine.events import AssistantTextDelta, AudioChunk, FrameTiming, ToolCall
from tests.fakes import FakeController
from ui.event_pump import EventPump


def test_messages_become_typed_signals_in_order(qtbot: QtBot) -> None:
    fake = FakeController()
    pump = EventPump(fake)
    seen: list[object] = []
    pump.state_changed.connect(seen.append)
    pump.levels.connect(seen.append)
    pump.assistant_text.connect(seen.append)
    pump.tool_call.connect(seen.append)
    pump.notice.connect(seen.append)
    messages = [
        StateChanged(AppState.SPEAKING),
        Levels(0.1, 0.2),
        AssistantTextDelta(3, 9, " Hi", " Hi"),
        ToolCall(4, "{}", "lookup", {}),
        Notice("done"),
    ]
    unknown = [object(), FrameTiming(1, 0.0, {"perception": 1.0}, 5, 1)]  # no signal for these: skipped
    fake.poll()  # the fake's own first state snapshot
    fake.queue(messages[0], unknown[0], *messages[1:3], unknown[1], *messages[3:])
    assert pump.drain() == 7
    assert seen == messages


def test_timer_drains_without_being_asked(qtbot: QtBot) -> None:
    fake = FakeController()
    fake.poll()  # the fake's own first state snapshot
    pump = EventPump(fake, interval_ms=5)
    pump.start()
    assert pump.is_running()
    with qtbot.waitSignal(pump.state_changed, timeout=1000) as blocker:
        fake.queue(StateChanged(AppState.READY))
    assert blocker.args == [StateChanged(AppState.READY)]
    pump.stop()
    assert not pump.is_running()


def test_audio_chunks_are_not_forwarded_to_the_ui(qtbot: QtBot) -> None:
    import numpy as np

    fake = FakeController()
    pump = EventPump(fake)
    received: list[object] = []
    for name in ("frame_stats", "levels", "assistant_text"):
        getattr(pump, name).connect(received.append)
    fake.queue(AudioChunk(0, np.zeros(1764, np.float32), np.zeros(31, np.int32)))
    pump.drain()
    assert received == []


class _Emitter(QObject):
    fired = Signal(object)


def test_qt_calls_do_not_leak_references_to_none_or_true() -> None:
    """PySide6 6.12.0 dropped a reference to None per void call and to True per emit on CPython 3.11,
    aborting the app within seconds; 6.11.3 (pinned in pyproject.toml) does not. Guard against a regression."""
    emitter = _Emitter()
    got: list[object] = []
    emitter.fired.connect(got.append)
    colour = QColor()
    for index in range(50_000):
        colour.setAlphaF(0.5)
        if index % 10 == 0:
            emitter.fired.emit(index)
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for index in range(50_000):
        colour.setAlphaF(0.5)
        if index % 10 == 0:
            emitter.fired.emit(True)
    assert len(got) == 10_000
    assert sys.getrefcount(None) >= none_before - 100 and sys.getrefcount(True) >= true_before - 100
