"""Frames with each part launched as soon as it is built against launched only at the syncs, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup launchab``): the full-size
4-bit random model, loaded for fast numerics (or ``exact``: ``python3 tests/device/launch_ab.py exact``).
"early" is the session as it runs (:meth:`engine.profiler.FrameProfiler.launch` starts the device on the
perception, the LLM and the TTS step while the host builds what follows); "at syncs" makes that a no-op, so
each phase's graph is launched only when the frame waits for it. Prints each round's median and mean frame,
and whether the two produced the same text ids, codes and waveforms (the same graphs, so they must).
"""

from __future__ import annotations

import statistics
import sys

from traced_ab import RunOutputs, run_outputs, same_outputs  # a sibling script

from app.bench import bench_input, question_audio, run_ours
from engine.profiler import FrameProfiler
from engine.random_checkpoint import random_voicechat
from engine.session import warm_up

EARLY = FrameProfiler.launch


def at_syncs(self: FrameProfiler, *arrays: object) -> None:
    """The launch made a no-op: the graph stays lazy until the next sync evaluates it."""


def main() -> None:
    numerics = sys.argv[1] if len(sys.argv) > 1 else "fast"
    voicechat = random_voicechat("full", quantize=4, numerics=numerics)
    warm_up(voicechat, speech=question_audio())
    samples = bench_input(100)
    variants = {"early": EARLY, "at syncs": at_syncs}
    results: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, RunOutputs] = {}
    for round_ in range(3):
        for name, launch in variants.items():
            FrameProfiler.launch = launch  # type: ignore[method-assign]
            record = run_ours(voicechat, samples, seed=0, sub_stages=False)
            steady = record.totals_ms[6:]
            results[name].append(statistics.median(steady))
            outputs[name] = run_outputs(record)
            print(
                f"round {round_ + 1} {name}: p50 {statistics.median(steady):.2f} ms, "
                f"mean {statistics.mean(steady):.2f} ms",
                flush=True,
            )
    FrameProfiler.launch = EARLY  # type: ignore[method-assign]
    for name in variants:
        print(f"{numerics}, {name}: p50 per round {', '.join(f'{value:.2f}' for value in results[name])}")
    print(f"early against at syncs: {same_outputs(outputs['early'], outputs['at syncs'])}")


if __name__ == "__main__":
    main()
