"""The LLM's attention blocks through the writing attention kernel against MLX's operations, alternating rounds.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup llmattnab``): the full-size 4-bit
random model, loaded for fast numerics. "kernel" is fast mode where the LLM's writing attention kernel was admitted
(:meth:`engine.networks.llm.CausalSelfAttention.attend_rows`: one launch reads the projections' rows as heads and writes
the new position into the cache's buffers); "operations" is the cache update, its slices and MLX's fused attention
between views. Prints what the load admitted, each round's median and mean frame, and whether the two produced the
same text ids, codes and waveforms (the softmax's sums run in another order, so the waveforms may differ a little;
random weights' flat logits make a changed id possible, which the drift bounds judge, not this comparison).
"""

from __future__ import annotations

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.loading.random_checkpoint import random_voicechat
from engine.networks.llm import CausalSelfAttention


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    print("fast changes in use:", voicechat.fast_changes, flush=True)
    mixers = [module for _, module in voicechat.model.named_modules() if isinstance(module, CausalSelfAttention)]
    kernel = mixers[0].fast_attention if mixers else None
    if kernel is None:
        raise SystemExit("the LLM's attention kernel was not admitted: nothing to compare")

    def attention(use_kernel: bool) -> dict[str, object]:
        for mixer in mixers:
            mixer.fast_attention = kernel if use_kernel else None
        return {}

    warmed_alternating_rounds(voicechat, {"kernel": lambda: attention(True), "operations": lambda: attention(False)})


if __name__ == "__main__":
    main()
