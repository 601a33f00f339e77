"""The tools that need no server: the current date and time, and a timer.

A timer "speaks" when it fires without the model: the model only talks in reply to the user's audio, and the
engine takes a tool result only while a call is pending, so nothing can make it say "your timer is up" at the
right moment. When a timer fires, the app plays a short chime through the speaker (mixed into whatever plays,
:func:`chime`) and shows a line in the conversation ("Timer done: tea, 5 min"); the history keeps that line. The
model was told, in the timer's result, that the app will chime, so it can say so when it sets one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import numpy as np

from .config import ToolEntry

MAX_TIMER_S: Final = 24 * 3600
MAX_TIMERS: Final = 20

CURRENT_TIME: Final = ToolEntry(
    "current_time",
    "Get the current local date, time and time zone.",
    {"type": "object", "properties": {}, "additionalProperties": False},
    read_only=True,
)
SET_TIMER: Final = ToolEntry(
    "set_timer",
    "Start a timer. When it ends, the app plays a chime and shows the label. Use for reminders within a day.",
    {
        "type": "object",
        "properties": {
            "seconds": {"type": "integer", "minimum": 1, "maximum": MAX_TIMER_S, "description": "how long"},
            "label": {"type": "string", "maxLength": 80, "description": "what the timer is for"},
        },
        "required": ["seconds"],
        "additionalProperties": False,
    },
    read_only=False,
)
BUILTIN_TOOLS: Final = (CURRENT_TIME, SET_TIMER)


@dataclass(frozen=True)
class TimerFired:
    """A timer the assistant set has ended (the app chimes and shows it)."""

    label: str
    seconds: int


def describe_duration(seconds: int) -> str:
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{hours} h" if hours else "", f"{minutes} min" if minutes else "", f"{secs} s" if secs else ""]
    return " ".join(part for part in parts if part)


class BuiltinTools:
    """Runs the built-in tools; timers fire on their own threads and are cancelled on :meth:`close`."""

    def __init__(self, on_timer: Callable[[TimerFired], None], *, clock: Callable[[], datetime] | None = None) -> None:
        self._on_timer = on_timer
        self._clock = clock or (lambda: datetime.now().astimezone())
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()

    def run(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The tool's result text; ValueError with the reason when it cannot be done."""
        if name == CURRENT_TIME.name:
            now = self._clock()
            return f"{now:%A %d %B %Y, %H:%M:%S} ({now.tzname() or 'local time'}, UTC{now:%z})"
        if name == SET_TIMER.name:
            return self._set_timer(int(arguments["seconds"]), str(arguments.get("label", "")).strip())
        raise ValueError(f"there is no built-in tool named {name!r}")

    def _set_timer(self, seconds: int, label: str) -> str:
        with self._lock:
            self._timers = [t for t in self._timers if t.is_alive()]
            if len(self._timers) >= MAX_TIMERS:
                raise ValueError(f"{MAX_TIMERS} timers are already running")
            fired = TimerFired(label or "timer", seconds)
            timer = threading.Timer(seconds, self._on_timer, args=(fired,))
            timer.daemon = True
            timer.name = f"parley-timer-{seconds}s"
            self._timers.append(timer)
            timer.start()
        return (
            f"Timer set for {describe_duration(seconds)}" + (f" ({label})" if label else "") + "; the app will chime."
        )

    @property
    def running(self) -> int:
        with self._lock:
            return sum(1 for t in self._timers if t.is_alive())

    def close(self) -> None:
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()


def chime(sample_rate: int, *, level: float = 0.25) -> np.ndarray:
    """A soft two-note chime (0.6 s, float32 mono), what a timer plays when it fires."""
    notes = ((880.0, 0.0), (1318.5, 0.18))  # A5 then E6
    length = int(0.6 * sample_rate)
    t = np.arange(length) / sample_rate
    out = np.zeros(length, dtype=np.float64)
    for frequency, start in notes:
        local = t - start
        envelope = np.where(local >= 0, np.exp(-np.clip(local, 0, None) * 7.0) * np.clip(local / 0.005, 0, 1), 0.0)
        out += np.sin(2 * np.pi * frequency * local) * envelope
    return (level * out / max(1e-9, float(np.max(np.abs(out))))).astype(np.float32)
