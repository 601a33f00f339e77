"""The levers on a long conversation's frames, fresh and aged, alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup longlevers``): the full-size 4-bit
random model loaded for fast numerics, switched in place between

* ``bf16 merged``: this build — the TTS backbone's caches in bf16 (:data:`engine.numerics.BACKBONE_CACHE_DTYPE`)
  and the attention's blocks merging their own shares past one block's keys (``DecodeAttention.merged_forms``);
* ``bf16``: the same caches, the shares merged by a second launch;
* ``float32``: float32 caches, a second launch (the build before);

each fresh and aged after its first frame by 7,300 frames of random history, so that all pay for the same model,
machine and moment. Each cache dtype admits its attention kernels on buffers of its dtype. Prints the kernels in use,
the bytes the aged caches hold, each round's median and mean frame, the aged-to-fresh ratio of each (the issue's
ten-minute target: within 10 %), and whether ``bf16 merged`` and ``bf16`` agree (they should, bit for bit: the
same merge in the same order).
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
from long_ab import AGED_BY  # sibling scripts
from traced_ab import warmed_alternating_rounds

import engine.numerics as numerics
from engine.kernels.decode_attention import DecodeAttention
from engine.loading.random_checkpoint import random_voicechat
from engine.networks.llm import CausalSelfAttention
from engine.networks.tts import GUIDED_ROWS
from engine.numerics import set_numerics

LEVERS = {"bf16 merged": (mx.bfloat16, True), "bf16": (mx.bfloat16, False), "float32": (mx.float32, False)}


def main() -> None:
    size = sys.argv[1] if len(sys.argv) > 1 else "full"  # "tiny" tries the script on the CPU
    # "quick": this build against the build before only, two rounds (for a call with little device time left).
    quick = sys.argv[2:] == ["quick"]
    levers = {name: lever for name, lever in LEVERS.items() if not quick or name != "bf16"}
    voicechat = random_voicechat(size, quantize=4, numerics="fast")
    model = voicechat.model
    tts = model.tts_model.tts_model
    llm_attention = next(m for _, m in model.stt_model.llm.named_modules() if isinstance(m, CausalSelfAttention))
    admitted: dict[Any, dict[int, frozenset[str]]] = {}

    def kernels() -> list[DecodeAttention]:
        candidates = (tts.backbone.layers[0].self_attn.fast_attention, llm_attention.fast_attention)
        return [kernel for kernel in candidates if isinstance(kernel, DecodeAttention)]

    def switch(dtype: mx.Dtype, merged: bool, history: int) -> dict[str, int]:
        if dtype != numerics.BACKBONE_CACHE_DTYPE or dtype not in admitted:
            numerics.BACKBONE_CACHE_DTYPE = dtype
            set_numerics(voicechat, "fast", release=False)
            admitted.setdefault(dtype, {id(kernel): kernel.merged_forms for kernel in kernels()})
        for kernel in kernels():
            kernel.merged_forms = admitted[dtype][id(kernel)] if merged else frozenset()
        return {"history": history}

    for dtype in (mx.bfloat16, mx.float32):
        switch(dtype, True, 0)
        changes = voicechat.fast_changes
        print(f"{dtype} caches ({tts.make_cache().layers[0].dtype}), fast changes in use: {changes}", flush=True)
        attention = tts.backbone.layers[0].self_attn
        layers = len(tts.backbone.layers)
        # A position's keys and values in a layer: the guided rows × kv heads × head size, each.
        held = 2 * layers * GUIDED_ROWS * attention.num_kv_heads * attention.head_dim * (AGED_BY + 100) * dtype.size
        print(f"{dtype}: the aged backbone caches hold {held / 1e9:.2f} GB", flush=True)
    variants = {}
    for history, label in ((0, "fresh"), (AGED_BY, "aged")):
        for name, (dtype, merged) in levers.items():
            variants[f"{name} {label}"] = lambda d=dtype, m=merged, h=history: switch(d, m, h)
    # The first two variants' outputs are compared: "bf16 merged" against "bf16" (or, quick, "float32") fresh.
    medians = warmed_alternating_rounds(voicechat, variants, rounds=2 if quick else 3)
    for name in levers:
        fresh, aged = medians[f"{name} fresh"], medians[f"{name} aged"]
        ratios = ", ".join(f"{a / f:.3f}" for f, a in zip(fresh, aged, strict=True))
        print(f"{name}: aged / fresh p50 per round {ratios}")


if __name__ == "__main__":
    main()
