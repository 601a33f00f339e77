"""Fast numerics with the TTS backbone's step traced (one compiled program) and op by op, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup tracedab``): the full-size
4-bit random model loaded for fast numerics. Prints each round's median and mean frame, and whether the two
forms produced the same text ids, codes and waveforms (the traced program runs the same kernels; only the
few operations between them are fused by the compiler).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from app.bench import RunRecord, bench_input, question_audio, run_ours
from engine.loading.random_checkpoint import random_voicechat
from engine.session import warm_up

RunOutputs = tuple[list[int], list[list[int]], np.ndarray]


def main() -> None:
    size = sys.argv[1] if len(sys.argv) > 1 else "full"
    voicechat = random_voicechat(size, quantize=4, numerics="fast")
    backbone = voicechat.model.tts_model.tts_model.backbone
    print(f"the backbone traces its step by default: {backbone.traces_rows()}")

    def tracing(traced: bool) -> dict[str, object]:
        backbone.trace_rows = traced
        return {}

    warmed_alternating_rounds(voicechat, {"traced": lambda: tracing(True), "op by op": lambda: tracing(False)})


def run_outputs(record: RunRecord) -> RunOutputs:
    """What two variants of one conversation must agree on: text ids, codes, the waveform."""
    return record.text_ids, record.codes, np.concatenate(record.waveforms)


def warmed_alternating_rounds(
    voicechat: object, variants: dict[str, Callable[[], dict[str, Any]]], rounds: int = 3
) -> dict[str, list[float]]:
    """:func:`alternating_rounds` after warming every variant up once (each traces its own programs), leaving the
    first variant switched on."""
    for switch in variants.values():
        switch()
        warm_up(voicechat, speech=question_audio())
    results = alternating_rounds(voicechat, variants, rounds)
    next(iter(variants.values()))()
    return results


def alternating_rounds(
    voicechat: object,
    variants: dict[str, Callable[[], dict[str, Any]]],
    rounds: int = 3,
    *,
    compare: bool = True,
) -> dict[str, list[float]]:
    """Run the bench's 100 frames once per variant per round, alternating (each variant's callable switches the
    session to it and returns further arguments of :func:`app.bench.run_ours`); print each round's median, mean,
    longest frame and host syncs a frame, the medians per variant and, with ``compare``, whether the first two
    variants' outputs agree. Returns each variant's medians."""
    samples = bench_input(100)
    results: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, RunOutputs] = {}
    for round_ in range(rounds):
        for name, switch in variants.items():
            record = run_ours(voicechat, samples, seed=0, sub_stages=False, **switch())
            steady = record.totals_ms[6:]
            results[name].append(statistics.median(steady))
            outputs[name] = run_outputs(record)
            syncs = statistics.mean(record.host_syncs[6:])
            print(
                f"round {round_ + 1} {name}: p50 {statistics.median(steady):.2f} ms, "
                f"mean {statistics.mean(steady):.2f} ms, longest {max(steady):.2f} ms, host syncs a frame {syncs:.1f}",
                flush=True,
            )
    for name, values in results.items():
        print(f"{name}: p50 per round {', '.join(f'{value:.2f}' for value in values)}")
    if compare:
        first, second = list(outputs)[:2]
        print(f"{first} against {second}: {same_outputs(outputs[first], outputs[second])}")
    return results


def same_outputs(first: RunOutputs, second: RunOutputs) -> str:
    """How far two runs' outputs agree, in words."""
    (text_a, codes_a, wave_a), (text_b, codes_b, wave_b) = first, second
    same_codes = sum(a == b for a, b in zip(codes_a, codes_b, strict=True))
    return (
        f"text ids equal {text_a == text_b}, codes equal in {same_codes}/{len(codes_a)} frames, "
        f"waveform max difference {float(np.abs(wave_a - wave_b).max()):.3g}"
    )


if __name__ == "__main__":
    main()
