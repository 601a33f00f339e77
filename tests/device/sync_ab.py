"""Fast frames with one sync (the TTS spells the text id on the device) against two, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup syncab``): the full-size 4-bit
random model, loaded for fast numerics. "one sync" is the session as it runs in fast numerics
(:meth:`engine.session.Session._tts_spells_on_device`: the frame is built to its end before the host waits);
"two syncs" reads the text id back after the LLM, as exact mode does, and looks up the token's conditioning on the
host. Prints each round's median and mean frame, each variant's host syncs a frame, and whether the two produced
the same text ids, codes and waveforms (the character encoder's sums run over the padded width in the first, so
they may differ by rounding; on the CPU's tiny checkpoint they are identical).
"""

from __future__ import annotations

import statistics

from traced_ab import RunOutputs, run_outputs, same_outputs  # a sibling script

from app.bench import bench_input, question_audio, run_ours
from engine.random_checkpoint import random_voicechat
from engine.session import Session, warm_up

ON_DEVICE = Session._tts_spells_on_device


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    variants = {"one sync": ON_DEVICE, "two syncs": property(lambda self: False)}
    for spells in variants.values():
        Session._tts_spells_on_device = spells  # type: ignore[method-assign]
        warm_up(voicechat, speech=question_audio())
    samples = bench_input(100)
    results: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, RunOutputs] = {}
    for round_ in range(3):
        for name, spells in variants.items():
            Session._tts_spells_on_device = spells  # type: ignore[method-assign]
            record = run_ours(voicechat, samples, seed=0, sub_stages=False)
            steady = record.totals_ms[6:]
            results[name].append(statistics.median(steady))
            outputs[name] = run_outputs(record)
            syncs = statistics.mean(record.host_syncs[6:])
            print(
                f"round {round_ + 1} {name}: p50 {statistics.median(steady):.2f} ms, "
                f"mean {statistics.mean(steady):.2f} ms, host syncs a frame {syncs:.1f}",
                flush=True,
            )
    Session._tts_spells_on_device = ON_DEVICE  # type: ignore[method-assign]
    for name in variants:
        print(f"{name}: p50 per round {', '.join(f'{value:.2f}' for value in results[name])}")
    print(f"one sync against two: {same_outputs(outputs['one sync'], outputs['two syncs'])}")


if __name__ == "__main__":
    main()
