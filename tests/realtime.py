"""Bounds for tests that run the engine against the wall clock, taken from the speed the engine measured in the
same run.

On a shared 2-core machine the tiny engine runs anywhere from a fifth of real time to past it (three busy loops
beside it: the demo's speed check said 0.84-0.91, and its frames came slower still). A test that counts frames in
a fixed wall-clock window, or waits a fixed time for audio, then fails for the machine, not for the code. Such a
test waits on the engine's clock instead: for a number of frames, for as long as those frames take at the speed
the engine reports (its speed check after loading and the live realtime factor of its frames), with a margin.
A timeline that stalls still runs out of that patience, and the failure says which measured speed it came from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.messages import FrameStats, SpeedCheck
from engine.timeline import FRAME_SECONDS

PATIENCE = 3.0  # times the wall time the measured speed predicts: the engine thread also waits between frames
SLACK_S = 10.0  # and a start-up allowance: the first frames of a conversation, a descheduled poll

if TYPE_CHECKING:
    from app.controller import AppController


@dataclass
class MeasuredSpeed:
    """The engine's realtime factors seen so far in this run (frame time / 80 ms)."""

    speed_check: float | None = None  # the speed check after loading (frames of silence)
    live: float | None = None  # the latest frame's: the mean over the worker's recent window

    def update(self, messages: Iterable[object]) -> MeasuredSpeed:
        for message in messages:
            if isinstance(message, SpeedCheck):
                self.speed_check = message.realtime_factor
            elif isinstance(message, FrameStats):
                self.live = message.realtime_factor
        return self

    @property
    def factor(self) -> float:
        """The slower of the two, and never faster than real time: a live engine gets its frames at that pace."""
        return max([1.0, *(f for f in (self.speed_check, self.live) if f is not None)])

    def seconds_for(self, frames: int) -> float:
        """The wall time ``frames`` frames take at this speed."""
        return frames * FRAME_SECONDS * self.factor

    def describe(self) -> str:
        check = "none" if self.speed_check is None else f"{self.speed_check:.2f}"
        live = "none yet" if self.live is None else f"{self.live:.2f}"
        return f"realtime factor {self.factor:.2f} (speed check {check}, live {live})"


def frame_count(messages: Iterable[object]) -> int:
    return sum(isinstance(m, FrameStats) for m in messages)


def wait_for_frames(
    controller: AppController,
    frames: int,
    seen: list[object],
    *,
    what: str = "frames",
    done: Callable[[list[object]], bool] | None = None,
) -> list[object]:
    """Poll ``controller`` until ``seen`` (extended in place, and returned) holds ``frames`` FrameStats, or until
    ``done(seen)`` where given. Patience: PATIENCE times what that many frames take at the speed the engine has
    measured (updated as frames report it), plus SLACK_S."""
    speed = MeasuredSpeed().update(seen)
    started = time.monotonic()
    first = frame_count(seen)

    def finished() -> bool:
        return done(seen) if done is not None else frame_count(seen) - first >= frames

    while not finished():
        patience = PATIENCE * speed.seconds_for(frames) + SLACK_S
        elapsed = time.monotonic() - started
        if elapsed > patience:
            ran = frame_count(seen) - first
            raise AssertionError(
                f"waiting for {what}: the engine ran {ran} of {frames} frames in {elapsed:.1f} s; at the "
                f"{speed.describe()} it measured in this run they take {speed.seconds_for(frames):.1f} s, and the "
                f"test waits {PATIENCE:.0f} times that plus {SLACK_S:.0f} s: the timeline stalled. Last messages: "
                f"{seen[-3:]}"
            )
        batch = controller.poll()
        seen += batch
        speed.update(batch)
        time.sleep(0.01)
    return seen


def wait_for(controller: AppController, predicate: Callable[[list[object]], bool], timeout: float = 60.0) -> list:
    """Poll ``controller`` until ``predicate`` holds for every message seen so far (returned), for at most
    ``timeout`` s: a bound on waits that are not counted in frames (a load, a tool's consent, an export)."""
    seen: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += controller.poll()
        if predicate(seen):
            return seen
        time.sleep(0.01)
    raise AssertionError(f"timed out; last messages: {seen[-5:]}")
