"""Measure what fast mode's TTS economy levels (``Session.set_economy``) change and save (docs/numerics.md).

    PYTHONPATH=. .venv/bin/python tests/economy_drift.py [--frames 60] [--size tiny] [--quantize 4] [--cuda-path]

One fast session per level on the random checkpoint (seed 0, the spoken test question then silence), the level set
before the first frame; against level 0 (full fast mode), and for scale full fast mode drawing with seed 1: the
share of frames whose 31 codes are all equal, the share of codes equal, the first frame that differs, and the
waveform's difference (RMS of the difference over RMS of level 0's waveform). Then one session at level 0 that runs
frames [20, 40) at level 1 and returns: how its frames after 40 compare with level 0's. And per frame, from the
graph census (engine.counters, full-size prices at 4 bits): the TTS stage's primitives, kernels and weight bytes at
each level, on this device (the CPU here: every fast part its operations fallback), or with ``--cuda-path`` as a
CUDA GPU's frame has them (engine.stand_in_kernels: each kernel one primitive; the counts only). Counts, not times.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from app.bench import bench_input
from engine import FrameProfiler, GraphCensus, Session, named_weights, stand_in_kernels
from engine.events import AudioChunk
from engine.pricing import full_size_prices, weight_bytes
from engine.random_model import random_voicechat
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE
from engine.warming import warm_up

LEVELS = (0, 1, 2)


@dataclass
class Run:
    codes: np.ndarray  # (frames, 31)
    audio: np.ndarray


def run(voicechat: object, samples: np.ndarray, schedule: dict[int, int], seed: int = 0) -> Run:
    """One session; ``schedule`` maps a frame index to the economy level set before it."""
    session = Session(voicechat, seed=seed)  # type: ignore[arg-type]
    codes, audio = [], []
    for index, start in enumerate(range(0, samples.shape[0], INPUT_FRAME_SAMPLES)):
        if index in schedule:
            session.set_economy(schedule[index])
        for event in session.push(samples[start : start + INPUT_FRAME_SAMPLES], INPUT_SAMPLE_RATE):
            if isinstance(event, AudioChunk):
                audio.append(np.asarray(event.samples))
        codes.append(np.array(session.caches.previous_code).reshape(-1))
    session.close()
    return Run(np.stack(codes), np.concatenate(audio) if audio else np.zeros(0))


def compare(full: Run, other: Run, frames: slice = slice(None)) -> dict[str, float | int | None]:
    a, b = full.codes[frames], other.codes[frames]
    equal_frames = np.all(a == b, axis=1)
    differing = np.flatnonzero(~equal_frames)
    per_frame = full.audio.shape[0] // max(full.codes.shape[0], 1)
    first, last = frames.indices(full.codes.shape[0])[:2]
    wa, wb = full.audio[first * per_frame : last * per_frame], other.audio[first * per_frame : last * per_frame]
    rms = float(np.sqrt(np.mean(wa.astype(np.float64) ** 2))) or 1.0
    return {
        "frames_equal_pct": round(100.0 * float(np.mean(equal_frames)), 1),
        "codes_equal_pct": round(100.0 * float(np.mean(a == b)), 1),
        "first_differing_frame": None if differing.size == 0 else int(differing[0]) + (frames.start or 0),
        "waveform_difference": round(float(np.sqrt(np.mean((wa - wb).astype(np.float64) ** 2))) / rms, 3),
    }


def tts_census(voicechat: object, samples: np.ndarray, level: int, frames: int) -> dict[str, float]:
    """Mean per frame over the last half of ``frames``: the TTS stage's primitives, kernels and full-size bytes."""
    profiler = FrameProfiler(census=GraphCensus(named_weights(voicechat.model)))  # type: ignore[attr-defined]
    session = Session(voicechat, seed=0, hooks=profiler)  # type: ignore[arg-type]
    session.set_economy(level)
    prices = full_size_prices(voicechat.model, 4)  # type: ignore[attr-defined]
    rows = []
    for index, start in enumerate(range(0, samples.shape[0], INPUT_FRAME_SAMPLES)):
        session.push(samples[start : start + INPUT_FRAME_SAMPLES], INPUT_SAMPLE_RATE)
        census = profiler.last_census
        if index >= frames // 2 and census is not None and "tts" in census.stages:
            stage = census.stages["tts"]
            rows.append((stage.primitives, stage.kernels, weight_bytes(stage.weight_uses, prices)))
    session.close()
    means = np.mean(np.array(rows, dtype=np.float64), axis=0)
    return {"primitives": round(means[0], 1), "kernels": round(means[1], 1), "weight_bytes": round(means[2])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--quantize", type=int, default=4)
    parser.add_argument("--census-size", default="structure", help="the model the counts are taken on")
    parser.add_argument("--cuda-path", action="store_true", help="count a CUDA GPU's frame (kernels standing in) only")
    args = parser.parse_args()
    if args.cuda_path:
        stand_in_kernels()
        census(args.census_size, args.quantize)
        return
    samples = bench_input(args.frames)
    voicechat = random_voicechat(args.size, quantize=args.quantize, numerics="fast")
    mx.eval(voicechat.model.parameters())
    warm_up(voicechat)
    runs = {level: run(voicechat, samples, {0: level}) for level in LEVELS}
    for level in LEVELS[1:]:
        print(f"level {level} against full fast mode, {args.frames} frames:", compare(runs[0], runs[level]))
    other_seed = run(voicechat, samples, {}, seed=1)
    print("for scale, full fast mode with seed 1 against seed 0:", compare(runs[0], other_seed))
    back = run(voicechat, samples, {20: 1, 40: 0})
    print("level 1 on frames 20-39, then 0; frames 0-19:", compare(runs[0], back, slice(0, 20)))
    print("  frames 40 on:", compare(runs[0], back, slice(40, None)))
    census(args.census_size, args.quantize)


def census(size: str, quantize: int) -> None:
    counted = random_voicechat(size, quantize=quantize, numerics="fast")
    mx.eval(counted.model.parameters())
    warm_up(counted)
    census_frames = 12
    census_samples = bench_input(census_frames)
    for level in LEVELS:
        print(
            f"TTS stage per frame at level {level} ({size}):", tts_census(counted, census_samples, level, census_frames)
        )


if __name__ == "__main__":
    main()
