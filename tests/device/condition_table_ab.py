"""Fast numerics' text conditioning read from the vocabulary's table against encoded every frame, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup tableab``): the full-size 4-bit
random model, loaded for fast numerics, which on CUDA makes the table at load and checks it
(:func:`engine.numerics.use_condition_table`). Prints whether the load took it, how long a pass over the
vocabulary takes, each round's median and mean frame with the table ("table") and without ("encoded": the
character encoder on the token's spelling each frame), and whether the two gave the same text ids, codes and
waveforms (equal unless a table value rounded one bf16 step apart from the token encoded alone).
"""

from __future__ import annotations

import time

import mlx.core as mx
from traced_ab import warmed_alternating_rounds  # a sibling script

from engine import numerics
from engine.loading.random_checkpoint import random_voicechat


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    print("fast changes in use:", voicechat.fast_changes, flush=True)
    if not voicechat.fast_changes.get("condition_table"):
        raise SystemExit("the load did not take the conditioning table: nothing to compare")
    model, tts = voicechat.model, voicechat.model.tts_model.tts_model
    size = model.stt_model.text_vocabulary_size
    spelling = voicechat.characters.on_device(size)
    for _ in range(2):
        began = time.perf_counter()
        mx.eval(tts.embed_subword.encode_vocabulary(spelling))
        print(f"a pass over {size} tokens: {time.perf_counter() - began:.2f} s", flush=True)

    def table(use: bool) -> dict[str, object]:
        if use:
            assert numerics.use_condition_table(model, voicechat.characters)
        else:
            tts.forget_condition_tables()
        return {}

    warmed_alternating_rounds(voicechat, {"table": lambda: table(True), "encoded": lambda: table(False)})


if __name__ == "__main__":
    main()
