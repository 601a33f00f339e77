"""Per-frame profiling: stage times, host synchronisations, optional sub-stage attribution.

:class:`FrameProfiler` is the :class:`engine.hooks.FrameHooks` a timed session is given
(``Session(voicechat, hooks=FrameProfiler(...))``); the session and the networks call it and import
nothing from here. The pipeline calls :meth:`FrameProfiler.sync` wherever it must wait for the device
(an ``mx.eval`` or a read-back of an unevaluated value); those are counted as host syncs. Stage
boundaries are recorded with :meth:`FrameProfiler.stage`.

On a frame without stage timing a stage's time is what the host spent in it: building graphs,
launching them (:meth:`FrameProfiler.launch` starts the device on a part while the host
builds the next), and waiting where the pipeline itself synchronises — so device work lands
in the stage that waited for it. On a frame with stage timing every stage boundary evaluates the
stage's outputs first, billing device time to the stage that caused it, as the reference
profiler does; those waits are real, so they count as host syncs. Which frames pay for that is
the profiler's own policy (``stage_timing_every``), decided as each frame begins and written into
its :class:`engine.events.FrameTiming` (``timing_mode``). ``sub_stages`` adds finer boundaries
inside the networks (more waits, counted likewise) and times every frame's stages.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import mlx.core as mx

from .counters import FrameCensus, GraphCensus
from .events import FrameTiming
from .hooks import Probe
from .timeline import FRAME_MS, STAGES

__all__ = ["DEFAULT_COLD_FRAMES", "FrameProfiler", "Probe", "percentile", "stage_stats", "summarize"]

DEFAULT_COLD_FRAMES = 5


class FrameProfiler:
    """Times the stages of one frame after another: the hooks a timed session is given.

    Args:
        stage_timing_every: time stages on the device (evaluate at every stage boundary) in frames whose index
            is a multiple of this; 1: every frame, 0: none. The other frames are timed where the host waited,
            without the three extra host syncs (the app times one frame in N so, for its overlay).
        sub_stages: also time sub-stages inside the networks (forces more evaluation, on every frame, whose
            stages are then all timed on the device).
        census: count every frame's graph, stage by stage, before it is evaluated (slow; for
            ``parley bench --counters``); each frame's counts are in :attr:`last_census`. May be set or
            cleared between frames.
    """

    # Whether parts inside a phase are launched as they are built too (:meth:`launch_part`); the device
    # scripts switch it off to measure what it buys.
    launch_parts: ClassVar[bool] = True

    def __init__(
        self, *, stage_timing_every: int = 0, sub_stages: bool = False, census: GraphCensus | None = None
    ) -> None:
        if stage_timing_every < 0:
            raise ValueError(f"stage_timing_every must be 0 (never) or positive, got {stage_timing_every}")
        self._stage_timing_every = stage_timing_every
        self.census = census  # when set, every evaluation's graph is counted first (slow; for counters only)
        self.last_census: FrameCensus | None = None
        self._sub_stages = sub_stages
        self._stage_timing = self.times_stages(0)  # this frame's mode; set as each frame begins
        self._origin = time.perf_counter()
        self._frame_start = 0.0
        self._mark = 0.0
        self._sub_mark = 0.0
        self._frame_index = 0
        self._stage_ms: dict[str, float] = {}
        self._sub_ms: dict[str, float] = {}
        self._sub_eval_ms: dict[str, float] = {}
        self._syncs = 0
        self._stage = STAGES[0]

    @property
    def stage_timing(self) -> bool:
        """Whether the frame under way is timed stage by stage (:meth:`times_stages`, decided as it began)."""
        return self._stage_timing

    @property
    def sub_stages(self) -> bool:
        return self._sub_stages

    @property
    def observing(self) -> bool:
        """False: the profiler times frames and watches no network's values (see FrameHooks.observe)."""
        return False

    def times_stages(self, frame_index: int) -> bool:
        """Whether frame ``frame_index`` is timed stage by stage on the device (the profiler's policy)."""
        every = self._stage_timing_every
        return self._sub_stages or (every > 0 and frame_index % every == 0)

    def observe(self, name: str, value: Any) -> None:
        """Nothing: the profiler does not watch values (:attr:`observing` is false)."""

    def begin_frame(self, frame_index: int) -> None:
        self._stage_timing = self.times_stages(frame_index)
        now = time.perf_counter()
        self._frame_index = frame_index
        self._frame_start = self._mark = self._sub_mark = now
        self._stage_ms = dict.fromkeys(STAGES, 0.0)
        self._sub_ms = {}
        self._sub_eval_ms = {}
        self._syncs = 0
        self._stage = STAGES[0]
        if self.census is not None:
            self.census.begin_frame(frame_index)

    def _evaluate(self, arrays: Sequence[Any]) -> None:
        if self.census is not None:
            self.census.count(self._stage, arrays)
        mx.eval(*arrays)
        if self.census is not None:
            self.census.evaluated()

    def sync(self, *arrays: Any) -> None:
        """The pipeline's own wait for the device: evaluate ``arrays`` and count it."""
        self._evaluate(arrays)
        self._syncs += 1

    def launch(self, *arrays: Any) -> None:
        """Start the device on ``arrays`` without waiting (``mx.async_eval``), so that it computes them while
        the host builds what follows; the next sync waits for them. The same graph is evaluated either way,
        so every result is unchanged. Skipped with stage timing (each stage is evaluated at its boundary
        already) and while a census counts the frame (it reads each graph before the sync evaluates it)."""
        if arrays and not self._stage_timing and self.census is None:
            mx.async_eval(*arrays)

    def launch_part(self, *arrays: Any) -> None:
        """:meth:`launch` for a part of a phase that the rest of the phase does not wait on to be built (the
        RN-T proposal before the LLM step, the TTS backbone before the MaskGIT rounds): the device computes it
        while the host builds the rest, where it would otherwise idle until the whole phase is launched."""
        if self.launch_parts:
            self.launch(*arrays)

    def read_back(self, array: Any) -> list[Any] | int | float | bool:
        """Read a not yet evaluated value back to the host (``tolist``), counted as a sync."""
        self._evaluate([array])
        self._syncs += 1
        values: list[Any] | int | float | bool = array.tolist()
        return values

    def sub_stage(self, name: str, *arrays: Any) -> None:
        """Close sub-stage ``name``; only active (and forcing evaluation) with ``sub_stages``."""
        if not self._sub_stages:
            return
        built = time.perf_counter()
        if arrays:
            self._evaluate(arrays)
            self._syncs += 1
        now = time.perf_counter()
        self._sub_ms[name] = self._sub_ms.get(name, 0.0) + (now - self._sub_mark) * 1000.0
        self._sub_eval_ms[name] = self._sub_eval_ms.get(name, 0.0) + (now - built) * 1000.0
        self._sub_mark = now

    def stage(self, name: str, *arrays: Any) -> None:
        """Close stage ``name`` (one of :data:`STAGES`); ``arrays`` are its outputs.

        With stage timing they are evaluated first (billing the device time to this
        stage); otherwise they are only counted, when a census is kept.
        """
        self._stage = name
        if self._stage_timing and arrays:
            self._evaluate(arrays)
            self._syncs += 1
        elif self.census is not None and arrays:
            self.census.count(name, arrays)
        now = time.perf_counter()
        self._stage_ms[name] += (now - self._mark) * 1000.0
        self._mark = self._sub_mark = now
        following = STAGES.index(name) + 1
        self._stage = STAGES[min(following, len(STAGES) - 1)]

    def end_frame(self) -> FrameTiming:
        now = time.perf_counter()
        if self.census is not None:
            self.last_census = self.census.end_frame()
        return FrameTiming(
            frame_index=self._frame_index,
            start_ms=(self._frame_start - self._origin) * 1000.0,
            stages_ms=dict(self._stage_ms),
            total_ms=(now - self._frame_start) * 1000.0,
            host_syncs=self._syncs,
            sub_stages=dict(self._sub_ms),
            sub_stage_evaluation=dict(self._sub_eval_ms),
            timing_mode="device" if self._stage_timing else "host",
        )


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolation percentile (the convention of the reference profiler)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (position - lower) * (ordered[upper] - ordered[lower])


def stage_stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean_ms": sum(values) / len(values) if values else 0.0,
        "p50_ms": percentile(values, 0.5),
        "p95_ms": percentile(values, 0.95),
        "max_ms": max(values, default=0.0),
    }


def summarize(
    frames: Sequence[FrameTiming], *, drop_first: int = DEFAULT_COLD_FRAMES, frame_ms: float = FRAME_MS
) -> dict[str, Any]:
    """Mean/p50/p95/max per stage, realtime factor and host syncs, after dropping cold frames."""
    kept = list(frames[drop_first:])
    stages = {name: stage_stats([f.stage_ms(name) for f in kept]) for name in STAGES}
    stages["total"] = stage_stats([f.total_ms for f in kept])
    sub_names = sorted({name for f in kept for name in f.sub_stages})
    mean_total = stages["total"]["mean_ms"]
    return {
        "frames": len(kept),
        "dropped_cold_frames": min(drop_first, len(frames)),
        "frame_duration_ms": frame_ms,
        "realtime_factor": mean_total / frame_ms if frame_ms else 0.0,
        "processing_frames_per_second": 1000.0 / mean_total if mean_total else 0.0,
        "host_syncs_per_frame": sum(f.host_syncs for f in kept) / len(kept) if kept else 0.0,
        "stages": stages,
        "sub_stages": {name: stage_stats([f.sub_stages.get(name, 0.0) for f in kept]) for name in sub_names},
    }
