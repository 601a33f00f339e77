"""The LLM's step chained (each block's last kernel also writes the next block's norm) against unchained (MLX's
RMS norm launched before every block), alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup chainedab``): the full-size
4-bit random model loaded for fast numerics. Prints each round's median and mean frame and whether the two forms
gave the same text ids, codes and waveform (the kernel's norm sums its squares in another order than MLX's, so
the two may part where a near tie flips; text and function ids are what the user meets).
"""

from __future__ import annotations

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.random_checkpoint import random_voicechat


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    llm = voicechat.model.stt_model.llm
    last_projections = [block.fused_projections()[-1][0] for block in llm.layers]
    chained_rows = [projection.chained_row for projection in last_projections]
    print(f"chained rows given: {all(row is not None for row in chained_rows)}")

    def chaining(on: bool) -> dict[str, object]:
        for projection, row in zip(last_projections, chained_rows, strict=True):
            projection.chained_row = row if on else None
        return {}

    warmed_alternating_rounds(voicechat, {"chained": lambda: chaining(True), "unchained": lambda: chaining(False)})


if __name__ == "__main__":
    main()
