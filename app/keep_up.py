"""Keeping up where the machine is slow: when to make fast mode's TTS spend less per frame, and when to stop.

The engine offers economy levels (``Session.set_economy``; docs/numerics.md "Keeping up"): 0 the full step, 1 fewer
MaskGIT samples, 2 that and guidance off. :class:`KeepUpPolicy` watches each frame's time and the input frames
waiting behind it and picks the level, as speech-swift does on slower Macs: a frame of 88 ms or more (10 % over the
80 ms budget), or three frames queued, means the machine is behind, so the level goes up one step (to
``max_level``, 1 unless told: see :data:`DEFAULT_MAX_LEVEL`); a step is given time to work (``settle_frames``)
before the next. It comes back one step at a time, only after
``recover_frames`` frames in a row (2 s) at most ``recover_ms`` (80 % of the budget, more than a level saves) with at
most one frame queued: the two thresholds apart (hysteresis), so a machine near the budget does not flip between
levels every frame. Opt-in (Settings → Model, fast numerics only); the worker applies the level and the overlay
shows it. No MLX, no Qt: plain numbers in, a level out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from engine.timeline import FRAME_MS

MAX_ECONOMY: Final = 2  # engine.networks.tts.ECONOMY_LEVELS[-1], named here without importing MLX
# The policy stops at level 1 unless told otherwise: level 2 (guidance off) saves arithmetic only, no weight bytes,
# and on a GPU it leaves the MoG draw's kernel, built for the guided pair of rows (docs/numerics.md "Keeping up").
DEFAULT_MAX_LEVEL: Final = 1
ECONOMY_NAMES: Final = {0: "full", 1: "fewer MaskGIT samples", 2: "fewer samples, guidance off"}


@dataclass
class KeepUpPolicy:
    """The economy level for the next frame, from the frames so far (one :meth:`observe` per frame)."""

    behind_ms: float = 1.1 * FRAME_MS  # 88 ms: a frame this slow is behind
    behind_queue: int = 3  # or this many input frames waiting
    settle_frames: int = 3  # after a step up, frames before another
    recover_ms: float = 0.8 * FRAME_MS  # 64 ms: a frame this quick has room to spare ...
    recover_queue: int = 1  # ... with at most this many frames waiting ...
    recover_frames: int = 25  # ... for this many frames in a row (2 s) before one step back
    max_level: int = DEFAULT_MAX_LEVEL
    level: int = 0
    _since_change: int = field(default=0, repr=False)
    _quick_run: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not self.recover_ms < self.behind_ms:
            raise ValueError(f"recover_ms ({self.recover_ms}) must be below behind_ms ({self.behind_ms})")
        if self.recover_queue >= self.behind_queue:
            raise ValueError("recover_queue must be below behind_queue")
        if not 0 <= self.max_level <= MAX_ECONOMY:
            raise ValueError(f"max_level must be between 0 and {MAX_ECONOMY}; got {self.max_level}")
        self.reset()

    def observe(self, frame_ms: float, queued: int) -> int | None:
        """Take one frame's time and the input frames waiting after it; returns the new level when it changes."""
        self._since_change += 1
        behind = frame_ms >= self.behind_ms or queued >= self.behind_queue
        quick = frame_ms <= self.recover_ms and queued <= self.recover_queue
        self._quick_run = self._quick_run + 1 if quick else 0
        if behind and self.level < self.max_level and self._since_change > self.settle_frames:
            return self._change(self.level + 1)
        if self.level > 0 and self._quick_run >= self.recover_frames:
            return self._change(self.level - 1)
        return None

    def reset(self) -> None:
        """A new conversation starts at the full step; its first frame behind may step up at once."""
        self.level, self._since_change, self._quick_run = 0, self.settle_frames, 0

    def _change(self, level: int) -> int:
        self.level, self._since_change, self._quick_run = level, 0, 0
        return level
