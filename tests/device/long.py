"""A ten-minute conversation's frames against a fresh one's: fresh and aged by 7,300 frames, alternating in one process.

    python3 tests/device/long.py [fast|exact] [ROUNDS] [SIZE]        (bash tests/device/harness.sh setup long)

The full-size 4-bit random model (SIZE tiny: a check on the CPU), loaded for fast numerics (or exact). Each round
runs the bench's 100 frames as one conversation fresh and one aged after its first frame by 7,300 frames of random
attention history (:meth:`engine.session.Session.age`, as ``parley bench --history 7300`` does), so that both pay
for the same model, machine and moment; processes differ by up to ±20 %, which is why the comparison stays inside
one. Prints each run's median and mean of the frames after the first six, and the aged-to-fresh ratio of the medians
per round (the issue's target: flat within 10 %).
"""

from __future__ import annotations

import statistics
import sys

from app.bench import bench_input, question_audio, run_ours
from engine.random_model import random_voicechat
from engine.warming import warm_up

AGED_BY = 7300  # frames of history: with the bench's 100 frames, just short of the 7,500-frame conversation
FRAMES = 100
STEADY_FROM = 6  # the first frames speak the question and start the answer


def main(argv: list[str]) -> None:
    numerics = argv[0] if argv else "fast"
    rounds = int(argv[1]) if len(argv) > 1 else 3
    size = argv[2] if len(argv) > 2 else "full"
    voicechat = random_voicechat(size, quantize=4, numerics=numerics)
    warm_up(voicechat, speech=question_audio())
    print(f"{numerics} numerics, {FRAMES} frames, fresh and aged by {AGED_BY} frames, {rounds} rounds", flush=True)
    samples = bench_input(FRAMES)
    medians: dict[str, list[float]] = {"fresh": [], "aged": []}
    for round_ in range(rounds):
        for name, history in (("fresh", 0), ("aged", AGED_BY)):
            record = run_ours(voicechat, samples, seed=0, sub_stages=False, history=history)
            steady = record.totals_ms[STEADY_FROM:]
            medians[name].append(statistics.median(steady))
            print(
                f"round {round_ + 1} {name}: p50 {statistics.median(steady):.2f} ms, "
                f"mean {statistics.mean(steady):.2f} ms, longest {max(steady):.2f} ms",
                flush=True,
            )
    for name, values in medians.items():
        print(f"{name}: p50 per round {', '.join(f'{value:.2f}' for value in values)}")
    ratios = [aged / fresh for fresh, aged in zip(medians["fresh"], medians["aged"], strict=True)]
    print(f"aged / fresh p50 per round: {', '.join(f'{ratio:.3f}' for ratio in ratios)}")


if __name__ == "__main__":
    main(sys.argv[1:])
