"""A ten-minute conversation's frames against a fresh one's, alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup longab``): the full-size 4-bit
random model, loaded for fast numerics (or ``exact``: ``python3 tests/device/long_ab.py exact``). Each round runs
one conversation fresh and one aged after its first frame by 7,300 frames of random attention history
(:func:`app.bench.age_conversation`, as ``parley bench --history`` does), so both pay for the same model, machine
and moment; processes differ by up to ±20 %, which is why the comparison stays inside one. Prints each round's
median and mean of the frames after the first six, and the aged-to-fresh ratio of the medians (the issue's target:
flat within 10 %).
"""

from __future__ import annotations

import sys

from traced_ab import alternating_rounds  # a sibling script

from app.bench import question_audio
from engine.loading.random_checkpoint import random_voicechat
from engine.session import warm_up

AGED_BY = 7300  # frames of history: with the bench's 100 frames, just short of the 7,500-frame conversation


def main() -> None:
    numerics = sys.argv[1] if len(sys.argv) > 1 else "fast"
    voicechat = random_voicechat("full", quantize=4, numerics=numerics)
    warm_up(voicechat, speech=question_audio())
    print(f"{numerics} numerics")
    medians = alternating_rounds(
        voicechat, {"fresh": lambda: {"history": 0}, "aged": lambda: {"history": AGED_BY}}, compare=False
    )
    ratios = [aged / fresh for fresh, aged in zip(medians["fresh"], medians["aged"], strict=True)]
    print(f"aged / fresh p50 per round: {', '.join(f'{ratio:.3f}' for ratio in ratios)}")


if __name__ == "__main__":
    main()
