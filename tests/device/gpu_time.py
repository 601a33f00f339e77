"""Where a frame's GPU time goes, kernel by kernel, fresh and aged: CUPTI's kernel records over steady frames.

    python3 tests/device/gpu_time.py [frames] [history ...]      (on the device; never in CI)

One full-size 4-bit model loaded for fast numerics (``NUMERICS=exact``: exact); for each history (0 = a fresh
conversation, 7300 = aged by 7,300 frames, as ``parley bench --history`` ages it) a session runs 80 frames, then
``frames`` more under PyTorch's profiler, which records every kernel the process launches (MLX's included) through
CUPTI. Prints each run's GPU busy time a frame against its wall time (busy well below wall: the host is the
bottleneck), then the kernels by GPU time a frame, and for two histories the kernels whose time grew the most, and
the GPU's idle time between kernels, by the kernels either side of the gap and by what the host was doing meanwhile
(the session's launches, syncs and stage ends are marked in the profile: a gap inside a launch is MLX evaluating the
launched graph, one after a mark is the host's Python building what comes next); and the host's side: time in CUDA's
API calls (its synchronizes are the host waiting for the GPU) and its long stretches between launches, by the
kernels either side.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import pstats
import sys
import time
from collections import defaultdict
from typing import Any

import mlx.core as mx
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from app.bench import bench_input, question_audio
from engine.profiler import FrameProfiler
from engine.random_model import random_voicechat
from engine.session import Session
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, STAGES
from engine.warming import warm_up

SETTLE_FRAMES = 80
IDLE_GAP_US = 20.0
HOST_STRETCH_US = 50.0
PLACED_GAP_US = 100.0
MARK = "parley."


class MarkedHooks(FrameProfiler):
    """A :class:`engine.profiler.FrameProfiler` whose launches, syncs and stage ends are recorded as profiler
    ranges ``parley.<call>:<stage>`` (the stage being built, or the one a ``stage`` call closes): the hooks the
    session is given, so the marks come through the engine's one way in, not by patching it."""

    def __init__(self) -> None:
        super().__init__()
        self._building = STAGES[0]

    def stage(self, name: str, *arrays: Any) -> None:
        with record_function(f"{MARK}stage:{name}"):
            super().stage(name, *arrays)
        following = STAGES.index(name) + 1 if name in STAGES else 0
        self._building = STAGES[following % len(STAGES)]

    def launch(self, *arrays: Any) -> None:
        with record_function(f"{MARK}launch:{self._building}"):
            super().launch(*arrays)

    def launch_part(self, *arrays: Any) -> None:
        with record_function(f"{MARK}launch_part:{self._building}"):
            super().launch_part(*arrays)

    def sync(self, *arrays: Any) -> None:
        with record_function(f"{MARK}sync:{self._building}"):
            super().sync(*arrays)

    def begin_frame(self, frame_index: int) -> None:
        self._building = STAGES[0]
        super().begin_frame(frame_index)


def place_gaps(gaps: list[tuple[float, float]], marks: list[tuple[str, float, float]], frames: int) -> dict[str, float]:
    """The GPU's idle µs a frame by what the host was doing at each gap's middle: inside marked calls (their
    names, outermost first), or after the last mark that ended before it (``gaps``: (start, end); ``marks``:
    (name, start, end), all in the profile's µs, sorted by start)."""
    placed: dict[str, float] = defaultdict(float)
    for start, end in gaps:
        middle = (start + end) / 2
        inside = [name for name, begun, ended in marks if begun <= middle <= ended]
        if inside:
            where = "inside " + " > ".join(inside)
        else:
            before = [name for name, _, ended in marks if ended < middle]
            where = f"after {before[-1]}" if before else "before the first mark"
        placed[where] += (end - start) / frames
    return dict(placed)


def _is_source_hash(part: str) -> bool:
    return len(part) >= 8 and all(c in "0123456789abcdef" for c in part)


def kernel_family(name: str) -> str:
    """A kernel's name without its template arguments and source hash, so that a family's launches add up."""
    base = name.split("(")[0].split("<")[0]
    for prefix in ("parley_", "custom_kernel_"):
        if base.startswith(prefix):
            return "_".join(part for part in base.split("_") if not _is_source_hash(part))
    return base[:90]


def profiled_frames(
    voicechat: object, frames: int, history: int
) -> tuple[dict[str, float], dict[str, int], dict[str, float], float]:
    """Per-frame GPU µs and launch counts by kernel family over ``frames`` steady frames, the GPU's idle µs a
    frame by the kernels either side of each gap, and wall ms a frame."""
    session = Session(voicechat, seed=0, hooks=MarkedHooks())
    samples = bench_input(SETTLE_FRAMES + frames)
    chunks = [samples[start : start + INPUT_FRAME_SAMPLES] for start in range(0, samples.shape[0], INPUT_FRAME_SAMPLES)]
    for index, chunk in enumerate(chunks[:SETTLE_FRAMES]):
        session.push(chunk, INPUT_SAMPLE_RATE)
        if index == 0 and history:
            session.age(history, seed=0)
    mx.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        began = time.perf_counter()
        for chunk in chunks[SETTLE_FRAMES:]:
            session.push(chunk, INPUT_SAMPLE_RATE)
        mx.synchronize()
        wall_ms = (time.perf_counter() - began) * 1000.0 / frames
    session.close()
    times: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    # The session's marks also appear on the GPU's timeline (as ranges over the kernels launched inside them): they
    # are not kernels, and counting them would add each launch's span to the GPU's busy time.
    kernels = sorted(
        (
            event
            for event in prof.events()
            if event.device_type == torch.autograd.DeviceType.CUDA and not event.name.startswith(MARK)
        ),
        key=lambda event: event.time_range.start,
    )
    if not kernels:
        raise SystemExit("the profiler recorded no GPU kernels (CUPTI did not see MLX's launches)")
    for event in kernels:
        family = kernel_family(event.name)
        times[family] += event.time_range.elapsed_us() / frames
        launches[family] += 1
    # The GPU's idle time between kernels, by the kernels either side of the gap: long gaps are the host building
    # or dispatching what comes next (after a sync, the whole time the host takes to launch the next kernel).
    idle: dict[str, float] = defaultdict(float)
    for before, after in itertools.pairwise(kernels):
        gap = after.time_range.start - before.time_range.end
        if gap > IDLE_GAP_US:
            idle[f"{kernel_family(before.name)[:60]}  →  {kernel_family(after.name)[:60]}"] += gap / frames
    marks = sorted(
        (
            (event.name, event.time_range.start, event.time_range.end)
            for event in prof.events()
            if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith(MARK)
        ),
        key=lambda mark: mark[1],
    )
    long_gaps = [
        (before.time_range.end, after.time_range.start)
        for before, after in itertools.pairwise(kernels)
        if after.time_range.start - before.time_range.end > PLACED_GAP_US
    ]
    placed = place_gaps(long_gaps, marks, frames)
    print(
        f"  GPU idle in gaps over {PLACED_GAP_US} µs by what the host was doing ({len(marks) // frames} marks a frame):"
    )
    for where, value in sorted(placed.items(), key=lambda item: -item[1])[:12]:
        print(f"    {value:9.1f} µs  {where}")
    host_report(prof.events(), kernels, frames)
    return dict(times), {name: count // frames for name, count in launches.items()}, dict(idle), wall_ms


def host_report(events: list, kernels: list, frames: int) -> None:
    """The host's side of the same frames, from the CUDA API calls CUPTI recorded: time a frame in each call
    (a synchronize's time is the host waiting for the GPU; a launch's, the driver's cost per kernel), and the
    host's longest stretches between launches — Python and MLX's own work — by the kernels either side."""
    calls = sorted(
        (
            event
            for event in events
            if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("cu")
        ),
        key=lambda event: event.time_range.start,
    )
    if not calls:
        print("  (the profiler recorded no CUDA API calls)")
        return
    by_name: dict[str, list[float]] = defaultdict(list)
    for call in calls:
        by_name[call.name].append(call.time_range.elapsed_us())
    span_ms = (calls[-1].time_range.end - calls[0].time_range.start) / 1000.0 / frames
    in_calls = sum(sum(values) for values in by_name.values()) / 1000.0 / frames
    print(f"  host: {span_ms:.2f} ms a frame from first to last CUDA call, {in_calls:.2f} ms of it inside them:")
    for name, values in sorted(by_name.items(), key=lambda item: -sum(item[1]))[:12]:
        per_call = sorted(values)[len(values) // 2]
        print(
            f"    {sum(values) / 1000.0 / frames:7.2f} ms  {len(values) / frames:7.1f}×  p50 {per_call:6.1f} µs  {name}"
        )
    launches = [call for call in calls if "LaunchKernel" in call.name]
    if len(launches) != len(kernels):
        print(f"  ({len(launches)} launch calls against {len(kernels)} kernels: host stretches not keyed)")
        return
    stretches: dict[str, float] = defaultdict(float)
    between = [after.time_range.start - before.time_range.end for before, after in itertools.pairwise(launches)]
    for gap, (before, after) in zip(between, itertools.pairwise(kernels), strict=True):
        if gap > HOST_STRETCH_US:
            stretches[f"{kernel_family(before.name)[:60]}  →  {kernel_family(after.name)[:60]}"] += gap / frames
    typical = sorted(between)[len(between) // 2]
    print(
        f"  host between launches: p50 {typical:.1f} µs; stretches over {HOST_STRETCH_US} µs "
        f"{sum(stretches.values()) / 1000.0:.2f} ms a frame, between:"
    )
    for name, value in sorted(stretches.items(), key=lambda item: -item[1])[:16]:
        print(f"    {value:9.1f} µs  {name}")


def host_functions(voicechat: object, frames: int) -> None:
    """The host's Python over ``frames`` steady frames (cProfile, a fresh session settled first), by own time: what
    the device waits on while the host builds a frame (cProfile's cost inflates every call alike)."""
    session = Session(voicechat, seed=0, hooks=FrameProfiler())
    samples = bench_input(SETTLE_FRAMES + frames)
    chunks = [samples[start : start + INPUT_FRAME_SAMPLES] for start in range(0, samples.shape[0], INPUT_FRAME_SAMPLES)]
    for chunk in chunks[:SETTLE_FRAMES]:
        session.push(chunk, INPUT_SAMPLE_RATE)
    mx.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for chunk in chunks[SETTLE_FRAMES:]:
        session.push(chunk, INPUT_SAMPLE_RATE)
    mx.synchronize()
    profiler.disable()
    session.close()
    print(f"=== the host's Python over {frames} steady frames (cProfile), by own time, then by cumulative time")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)


def main() -> None:
    frames = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    histories = [int(value) for value in sys.argv[2:]] or [0]
    numerics = os.environ.get("NUMERICS", "fast")
    voicechat = random_voicechat("full", quantize=4, numerics=numerics)
    print(f"numerics {numerics}")
    mx.eval(voicechat.model.parameters())
    warm_up(voicechat, speech=question_audio())
    results = {}
    for history in histories:
        times, launches, idle, wall_ms = profiled_frames(voicechat, frames, history)
        results[history] = times
        busy = sum(times.values()) / 1000.0
        print(
            f"=== history {history}: wall {wall_ms:.2f} ms a frame under the profiler, GPU busy {busy:.2f} ms "
            f"({sum(launches.values())} launches a frame)"
        )
        for name, value in sorted(times.items(), key=lambda item: -item[1])[:40]:
            print(f"  {value:9.1f} µs  {launches[name]:5d}×  {name}")
        print(f"  GPU idle in gaps over {IDLE_GAP_US} µs: {sum(idle.values()) / 1000.0:.2f} ms a frame; between:")
        for name, value in sorted(idle.items(), key=lambda item: -item[1])[:16]:
            print(f"    {value:9.1f} µs  {name}")
    host_functions(voicechat, frames)
    if len(histories) == 2:
        fresh, aged = (results[history] for history in histories)
        print(f"=== grew from history {histories[0]} to {histories[1]} (µs a frame)")
        growth = {name: aged.get(name, 0.0) - fresh.get(name, 0.0) for name in set(fresh) | set(aged)}
        for name, value in sorted(growth.items(), key=lambda item: -abs(item[1]))[:20]:
            print(f"  {value:+9.1f}  ({fresh.get(name, 0.0):.1f} → {aged.get(name, 0.0):.1f})  {name}")


if __name__ == "__main__":
    main()
