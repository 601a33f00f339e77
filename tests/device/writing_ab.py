"""The backbone attention kernel writing the new position into its cache against the scatters, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup writingab``): the full-size 4-bit
random model, loaded for fast numerics. "kernel writes" is fast mode where the writing kernel was admitted
(:meth:`engine.kernels.decode_attention.DecodeAttention.attend_writing`: no scatter, the attention launch stores the key
and value); "scatters" is the traced step's two ``put_along_axis`` a layer before the attention. Prints what the
load admitted, each round's median and mean frame, and whether the two produced the same text ids, codes and
waveforms (they should be equal: the same numbers land in the same buffers).
"""

from __future__ import annotations

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.kernels.decode_attention import DecodeAttention
from engine.loading.random_checkpoint import random_voicechat
from engine.networks.tts import BackboneAttention


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    print("fast changes in use:", voicechat.fast_changes, flush=True)
    kernels = {
        id(module.fast_attention): module.fast_attention
        for _, module in voicechat.model.named_modules()
        if isinstance(module, BackboneAttention) and isinstance(module.fast_attention, DecodeAttention)
    }
    if not kernels or not voicechat.fast_changes.get("attention_writes_cache"):
        raise SystemExit("the writing attention kernel was not admitted: nothing to compare")

    def writing(writes: bool) -> dict[str, object]:
        for attention in kernels.values():
            attention.writes_cache = writes
        return {}

    warmed_alternating_rounds(voicechat, {"kernel writes": lambda: writing(True), "scatters": lambda: writing(False)})


if __name__ == "__main__":
    main()
