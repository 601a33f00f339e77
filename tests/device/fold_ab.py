"""A fast part folded into another kernel against left apart, alternating rounds in one process.

Run on the lent GPU from the repository root, the full-size 4-bit random model loaded for fast numerics:
- ``python3 tests/device/fold_ab.py chained`` (``bash tests/device/h200.sh setup chainedab``): the LLM's step
  chained (each block's last kernel also writes the next block's norm) against unchained (MLX's RMS norm launched
  before every block);
- ``python3 tests/device/fold_ab.py heads`` (``setup headsab``): the TTS backbone's query and key heads made by its
  attention kernel (:meth:`engine.kernels.decode_attention.DecodeAttention.attend_heads`) against their own kernel.

Prints each round's median and mean frame and whether the two forms gave the same text ids, codes and waveform.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.loading.random_checkpoint import random_voicechat


def chained_toggle(voicechat: object) -> Callable[[bool], None]:
    llm = voicechat.model.stt_model.llm  # type: ignore[attr-defined]
    last_projections = [block.fused_projections()[-1][0] for block in llm.layers]
    chained_rows = [projection.chained_row for projection in last_projections]
    print(f"chained rows given: {all(row is not None for row in chained_rows)}")

    def toggle(on: bool) -> None:
        for projection, row in zip(last_projections, chained_rows, strict=True):
            projection.chained_row = row if on else None

    return toggle


def heads_toggle(voicechat: object) -> Callable[[bool], None]:
    from engine.networks.tts import BackboneAttention

    attentions = [m for _, m in voicechat.model.named_modules() if isinstance(m, BackboneAttention)]  # type: ignore[attr-defined]
    admitted = [attention.heads_in_attention for attention in attentions]
    print(f"heads made by the attention kernel in {sum(admitted)} of {len(admitted)} layers")

    def toggle(on: bool) -> None:
        for attention, folded in zip(attentions, admitted, strict=True):
            attention.heads_in_attention = folded and on

    return toggle


def main() -> None:
    part = sys.argv[1] if len(sys.argv) > 1 else "chained"
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    toggle = {"chained": chained_toggle, "heads": heads_toggle}[part](voicechat)

    def switch(on: bool) -> dict[str, object]:
        toggle(on)
        return {}

    names = {"chained": ("chained", "unchained"), "heads": ("heads in the attention", "heads apart")}[part]
    warmed_alternating_rounds(voicechat, {names[0]: lambda: switch(True), names[1]: lambda: switch(False)})


if __name__ == "__main__":
    main()
