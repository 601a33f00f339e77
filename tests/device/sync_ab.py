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

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.loading.random_checkpoint import random_voicechat
from engine.session import Session

ON_DEVICE = Session._tts_spells_on_device
TWO_SYNCS = property(lambda self: False)


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")

    def spelling(form: property) -> dict[str, object]:
        Session._tts_spells_on_device = form  # type: ignore[method-assign]
        return {}

    warmed_alternating_rounds(
        voicechat, {"one sync": lambda: spelling(ON_DEVICE), "two syncs": lambda: spelling(TWO_SYNCS)}
    )


if __name__ == "__main__":
    main()
