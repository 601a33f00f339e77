"""Frames with each part launched as soon as it is built against launched only at the syncs, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup launchab``): the full-size
4-bit random model, loaded for fast numerics (or ``exact``: ``python3 tests/device/launch_ab.py exact``).
"early" is the session as it runs (:meth:`engine.profiler.FrameProfiler.launch` starts the device on the
perception, the LLM and the TTS step while the host builds what follows); "at syncs" makes that a no-op, so
each phase's graph is launched only when the frame waits for it. With ``parts`` (``setup partsab``, fast numerics)
it compares the session as it runs against phases launched whole (:attr:`FrameProfiler.launch_parts` off: the RN-T
launched with the LLM step, the TTS backbone with the MaskGIT rounds). Prints each round's median and mean frame,
and whether the two produced the same text ids, codes and waveforms (the same graphs, so they must).
"""

from __future__ import annotations

import sys

from traced_ab import alternating_rounds  # a sibling script

from app.bench import question_audio
from engine.loading.random_checkpoint import random_voicechat
from engine.profiler import FrameProfiler
from engine.session import warm_up

EARLY = FrameProfiler.launch


def at_syncs(self: FrameProfiler, *arrays: object) -> None:
    """The launch made a no-op: the graph stays lazy until the next sync evaluates it."""


def main() -> None:
    numerics = sys.argv[1] if len(sys.argv) > 1 else "fast"
    parts = numerics == "parts"
    voicechat = random_voicechat("full", quantize=4, numerics="fast" if parts else numerics)
    warm_up(voicechat, speech=question_audio())
    if parts:

        def launching_parts(on: bool) -> dict[str, object]:
            FrameProfiler.launch_parts = on
            return {}

        print("fast numerics, parts of a phase launched as built or not")
        alternating_rounds(
            voicechat, {"parts": lambda: launching_parts(True), "phases": lambda: launching_parts(False)}
        )
        launching_parts(True)
        return

    def launching(launch: object) -> dict[str, object]:
        FrameProfiler.launch = launch  # type: ignore[method-assign]
        return {}

    print(f"{numerics} numerics")
    alternating_rounds(voicechat, {"early": lambda: launching(EARLY), "at syncs": lambda: launching(at_syncs)})
    launching(EARLY)


if __name__ == "__main__":
    main()
