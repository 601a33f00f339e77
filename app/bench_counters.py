"""``parley bench --counters``: what each frame asks of the machine, counted (never timed).

A counting pass runs the session with a graph census (:class:`engine.GraphCensus`): per frame and per stage the MLX
primitives and kernels, the host syncs and the weights read, priced at full size; early (frames 6–70, the encoder's
attention cache filling) and steady (71+). A second short session counts the host's Python calls a frame
(:func:`engine.python_calls`). Counts do not move with the machine's load: CI guards them (tests/test_counters.py).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, STAGES

FRAME = INPUT_FRAME_SAMPLES
# Counters are reported before and after the encoder's attention cache fills (frame 70).
COUNTER_WINDOWS = {"early": (6, 70), "steady": (71, None)}
HOST_CALL_FRAMES = (6, 15)  # the frames whose Python calls are counted (each frame's are the same after warm-up)
COUNTER_BITS = (4, 8)


def count_frames(voicechat: Any, samples: np.ndarray, *, seed: int) -> tuple[list[Any], list[int]]:
    """One pass of our session with a graph census: each frame's counts and host syncs."""
    from engine import FrameProfiler, GraphCensus, Session, named_weights
    from engine.events import FrameTiming

    profiler = FrameProfiler(census=GraphCensus(named_weights(voicechat.model)))
    session = Session(voicechat, seed=seed, hooks=profiler)
    censuses, syncs = [], []
    for start in range(0, samples.shape[0], FRAME):
        for event in session.push(samples[start : start + FRAME], INPUT_SAMPLE_RATE):
            if isinstance(event, FrameTiming):
                syncs.append(event.host_syncs)
                assert profiler.last_census is not None
                censuses.append(profiler.last_census)
    session.close()
    return censuses, syncs


def host_calls(voicechat: Any, samples: np.ndarray, *, seed: int) -> dict[str, Any]:
    """The Python calls a frame makes on the host (:func:`engine.python_calls`), a mean over frames
    :data:`HOST_CALL_FRAMES` of ``samples`` (at least that many frames) through a session hooked as the app's (a
    profiler without the census, which would count its own walks), with the functions called most."""
    from collections import Counter

    from engine import FrameProfiler, Session, python_calls

    first, last = HOST_CALL_FRAMES
    session = Session(voicechat, seed=seed, hooks=FrameProfiler())
    total: Counter[str] = Counter()
    for index, start in enumerate(range(0, FRAME * (last + 1), FRAME)):
        chunk = samples[start : start + FRAME]
        if index < first:
            session.push(chunk, INPUT_SAMPLE_RATE)
        else:
            total += python_calls(functools.partial(session.push, chunk, INPUT_SAMPLE_RATE))
    session.close()
    frames = last - first + 1
    return {
        "python_calls_per_frame": round(sum(total.values()) / frames, 1),
        "python_calls_by_function": {name: round(count / frames, 1) for name, count in total.most_common(15)},
    }


def _window_mean(values: list[float], window: tuple[int, int | None]) -> float | None:
    start, end = window
    part = values[start : None if end is None else end + 1]
    return round(sum(part) / len(part), 1) if part else None


def counters_report(voicechat: Any, censuses: list[Any], syncs: list[int]) -> dict[str, Any]:
    """``counters`` of the JSON report: per frame and per stage, early (6–70) and steady (71+)."""
    from collections import Counter

    from engine import full_size_prices, weight_bytes, weight_bytes_by_network, weight_bytes_by_weight

    def windows(values: list[float]) -> dict[str, float | None]:
        return {name: _window_mean(values, window) for name, window in COUNTER_WINDOWS.items()}

    steady = censuses[COUNTER_WINDOWS["steady"][0] :] or censuses[COUNTER_WINDOWS["early"][0] :] or censuses
    frames = max(len(steady), 1)
    per_stage = {}
    for stage in STAGES:
        parts = [census.stages.get(stage) for census in censuses]
        stage_primitives: Counter[str] = Counter()
        for census in steady:
            if stage in census.stages:
                stage_primitives.update(census.stages[stage].by_primitive)
        per_stage[stage] = {
            "primitives": windows([part.primitives if part else 0 for part in parts]),
            "kernels": windows([part.kernels if part else 0 for part in parts]),
            "steady_by_primitive": {name: round(count / frames, 1) for name, count in stage_primitives.most_common()},
        }
    uses: Counter[Any] = Counter()
    by_primitive: Counter[str] = Counter()
    for census in steady:
        uses.update(census.weight_uses())
        for stage in census.stages.values():
            by_primitive.update(stage.by_primitive)
    uses = Counter({use: count / frames for use, count in uses.items()})
    prices = {bits: full_size_prices(voicechat.model, bits) for bits in COUNTER_BITS}
    kept_syncs = syncs[COUNTER_WINDOWS["early"][0] :] or syncs
    return {
        "primitives_per_frame": windows([float(c.primitives) for c in censuses]),
        "kernels_per_frame": windows([float(c.kernels) for c in censuses]),
        "host_syncs_per_frame": round(sum(kept_syncs) / len(kept_syncs), 2) if kept_syncs else None,
        "weight_bytes_per_frame": {str(bits): weight_bytes(uses, prices[bits]) for bits in COUNTER_BITS},
        "weight_bytes_by_network": {str(bits): weight_bytes_by_network(uses, prices[bits]) for bits in COUNTER_BITS},
        "weight_bytes_by_weight": {str(bits): weight_bytes_by_weight(uses, prices[bits]) for bits in COUNTER_BITS},
        "per_stage": per_stage,
        "steady_by_primitive": {name: round(count / frames, 1) for name, count in by_primitive.most_common()},
        "frames": len(censuses),
        "device": None,
    }


def format_counters(counters: dict[str, Any]) -> str:
    def pair(values: dict[str, float | None]) -> str:
        return " / ".join("-" if values[w] is None else f"{values[w]:,.0f}" for w in COUNTER_WINDOWS)

    lines = [
        f"counters per frame (early 6-70 / steady 71+), {counters['frames']} frames on {counters['device']}:",
        f"  primitives {pair(counters['primitives_per_frame'])}, kernels {pair(counters['kernels_per_frame'])}, "
        f"host syncs {counters['host_syncs_per_frame']}",
        "  weight bytes a full-size frame reads: "
        + ", ".join(f"{bits}-bit {value / 1e9:.2f} GB" for bits, value in counters["weight_bytes_per_frame"].items()),
    ]
    networks = counters.get("weight_bytes_by_network", {}).get(str(COUNTER_BITS[0]), {})
    if networks:
        shares = ", ".join(f"{name} {value / 1e9:.3f}" for name, value in networks.items())
        lines.append(f"  of which ({COUNTER_BITS[0]}-bit, GB): {shares}")
    for stage, values in counters["per_stage"].items():
        lines.append(f"  {stage:10} primitives {pair(values['primitives'])}, kernels {pair(values['kernels'])}")
    top = ", ".join(f"{name} {count:g}" for name, count in list(counters["steady_by_primitive"].items())[:12])
    lines.append(f"  most frequent (steady, per frame): {top}")
    if "python_calls_per_frame" in counters:
        first, last = HOST_CALL_FRAMES
        calls = ", ".join(f"{name} {count:g}" for name, count in list(counters["python_calls_by_function"].items())[:8])
        count = counters["python_calls_per_frame"]
        lines.append(f"  host: {count:,.0f} Python calls a frame (frames {first}-{last}); most: {calls}")
    return "\n".join(lines)
