"""A MaskGIT round's quantizers in one launch against one launch each, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup rvqroundsab``): the full-size 4-bit
random model, loaded for fast numerics. "rounds" is fast mode where the round kernels were admitted
(:class:`engine.kernels.residual_vq.NearestRoundProduct`: a round's steps in one launch, its blocks meeting at a barrier
between quantizers); "steps" is :class:`engine.kernels.residual_vq.NearestCodeProduct` once a quantizer. Prints what the
load admitted, each round's median and mean frame, and whether the two produced the same text ids, codes and
waveforms (they should be equal: the same arithmetic in the same order).
"""

from __future__ import annotations

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.loading.random_checkpoint import random_voicechat


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    print("fast changes in use:", voicechat.fast_changes, flush=True)
    tts = voicechat.model.tts_model.tts_model
    admitted = dict(tts.nearest_rounds)
    if not admitted:
        raise SystemExit("no round kernel was admitted: nothing to compare")
    print("round kernels admitted for rounds of", sorted(admitted), "quantizers", flush=True)

    def rounds(on: bool) -> dict[str, object]:
        tts.nearest_rounds = dict(admitted) if on else {}
        return {}

    warmed_alternating_rounds(voicechat, {"rounds": lambda: rounds(True), "steps": lambda: rounds(False)})


if __name__ == "__main__":
    main()
