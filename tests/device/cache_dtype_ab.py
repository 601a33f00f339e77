"""Fast numerics' TTS backbone caches in bf16 against float32, fresh and aged, alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup cachedtypeab``): the full-size 4-bit
random model loaded for fast numerics, switched in place between the two cache dtypes
(:data:`engine.numerics.BACKBONE_CACHE_DTYPE`; each admits its attention kernels on buffers of its dtype). Each round
runs a fresh conversation and one aged after its first frame by 7,300 frames of random history in each dtype, so
that all four pay for the same model, machine and moment. Prints each round's median and mean frame, the aged-to-fresh
ratio per dtype (the issue's ten-minute target: within 10 %), the bytes the aged caches hold, and how far the two
dtypes' fresh outputs agree.
"""

from __future__ import annotations

import mlx.core as mx
from long_ab import AGED_BY  # a sibling script
from traced_ab import warmed_alternating_rounds

import engine.numerics as numerics
from engine.numerics import set_numerics
from engine.random_checkpoint import random_voicechat
from engine.tts import GUIDED_ROWS

DTYPES = {"bf16": mx.bfloat16, "float32": mx.float32}


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")

    def switch(dtype: mx.Dtype, history: int) -> dict[str, int]:
        if dtype != numerics.BACKBONE_CACHE_DTYPE:
            numerics.BACKBONE_CACHE_DTYPE = dtype
            set_numerics(voicechat, "fast", release=False)
        return {"history": history}

    variants = {}
    for history, label in ((0, "fresh"), (AGED_BY, "aged")):
        for name, dtype in DTYPES.items():
            variants[f"{name} {label}"] = lambda dtype=dtype, history=history: switch(dtype, history)
    for name, dtype in DTYPES.items():
        switch(dtype, 0)
        changes = voicechat.fast_changes
        kernels = {key: changes.get(key) for key in ("decode_attention", "attention_writes_cache", "attention_heads")}
        tts = voicechat.model.tts_model.tts_model
        cache = tts.make_cache()
        print(f"{name} caches ({cache.layers[0].dtype}): kernels {kernels}", flush=True)
        layers = len(cache.layers)
        attention = tts.backbone.layers[0].self_attn
        # A position's keys and values in a layer: the guided rows × kv heads × head size, each.
        held = 2 * layers * GUIDED_ROWS * attention.num_kv_heads * attention.head_dim * (AGED_BY + 100) * dtype.size
        print(f"{name}: the aged caches hold {held / 1e9:.2f} GB", flush=True)
    medians = warmed_alternating_rounds(voicechat, variants)
    for name in DTYPES:
        fresh, aged = medians[f"{name} fresh"], medians[f"{name} aged"]
        ratios = ", ".join(f"{a / f:.3f}" for f, a in zip(fresh, aged, strict=True))
        print(f"{name}: aged / fresh p50 per round {ratios}")


if __name__ == "__main__":
    main()
