"""The attention kernel's 2026-12-07 forms on this GPU, no model loaded: over bf16 buffers, and merging its shares.

Run on the device (``bash tests/device/h200.sh setup cachekernels``; never in CI, the CPU has no kernels). For the
TTS backbone's layout (16 heads of 72, batch 2) and the LLM's (32 over 8 of 128): each form (reading as stored,
writing the new position, making its heads) on float32 and bf16 buffers, plain and merging its shares, admitted
against its fallback or not (the admission's samples include one past a block's keys), its relative L2 to the
fallback, and whether the merged form gives the plain form's outputs bit for bit (the same merge in the same
order). Then the read form's time per call, queued as a frame queues them, over 7,500 positions: float32 two
launches (the build before), bf16 two launches, bf16 merged.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import mlx.core as mx
from fast_kernels import outputs, queued_us, worst_l2  # a sibling script

from engine.kernels.admission import admit_kernel, gpu_kernel_backend
from engine.kernels.decode_attention import (
    DecodeAttention,
    NormRope,
    decode_attention_heads_ops,
    decode_attention_heads_samples,
    decode_attention_ops,
    decode_attention_sample,
    decode_attention_samples,
    decode_attention_writing_ops,
    decode_attention_writing_samples,
)

BASE, EPS = 1_000_000.0, 1e-6


def forms(attention: DecodeAttention, rope: NormRope | None, buffers: mx.Dtype) -> dict[str, tuple[Any, ...]]:
    """Each form: (its plain check, its merged check, its fallback, its samples)."""
    heads = (attention.query_heads, attention.kv_heads, attention.head_dim)
    read = (
        lambda q, k, v, count, scale: attention.attend_bounded(
            q, k, v, attention.bounds(count), attention.splits(count), scale, merge=False
        ),
        attention.merged_kernel("read"),
        decode_attention_ops,
        decode_attention_samples(*heads, buffers),
    )
    writing = (
        functools.partial(attention.writing_check, merge=False),
        attention.merged_kernel("writing"),
        decode_attention_writing_ops,
        decode_attention_writing_samples(*heads, buffers),
    )
    found = {"read": read, "writing": writing}
    if rope is not None:
        found["heads"] = (
            functools.partial(attention.heads_check, rope=rope.params, merge=False),
            attention.merged_kernel("heads", rope.params),
            functools.partial(decode_attention_heads_ops, query_heads=heads[0], kv_heads=heads[1], eps=EPS, base=BASE),
            decode_attention_heads_samples(*heads, mx.bfloat16, buffers),
        )
    return found


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    backend = gpu_kernel_backend()
    assert backend == "cuda", f"needs CUDA, not {backend}"
    for name, heads in (("backbone", (16, 16, 72)), ("LLM", (32, 8, 128))):
        attention = DecodeAttention(backend, *heads)
        rope = NormRope(backend, heads[0], heads[1], heads[2], EPS, BASE) if name == "backbone" else None
        for buffers in (mx.float32, mx.bfloat16):
            for form, (plain, merged, fallback, samples) in forms(attention, rope, buffers).items():
                for inputs in samples:
                    count = next(value for value in inputs if isinstance(value, int))
                    admitted = [
                        admit_kernel(f"{form} {tag}", kernel, fallback, inputs)
                        for tag, kernel in (("plain", plain), ("merged", merged))
                    ]
                    got, reference = outputs(merged(*inputs)), outputs(fallback(*inputs))
                    same = all(mx.array_equal(a, b).item() for a, b in zip(got, outputs(plain(*inputs)), strict=True))
                    print(
                        f"{name} {form}, {buffers} buffers, {count} filled ({attention.splits(count)} blocks a head): "
                        f"admitted plain {admitted[0]}, merged {admitted[1]}; merged to the fallback "
                        f"{worst_l2(got, reference):.2e}, bit for bit the plain form {same}",
                        flush=True,
                    )
    attention = DecodeAttention(backend, 16, 16, 72)
    for buffers, merge in ((mx.float32, False), (mx.bfloat16, False), (mx.bfloat16, True)):
        queries, keys, values, _, scale = decode_attention_sample(16, 16, 72, 7680, 0, buffers)
        bounds, splits = attention.bounds(7500), attention.splits(7500)
        call = functools.partial(attention.attend_bounded, bounds=bounds, splits=splits, scale=scale, merge=merge)
        took = queued_us(call, (queries, keys, values))
        print(f"backbone read over 7,500: {buffers}, {'merged' if merge else 'two launches'}: {took:.1f} us a call")


if __name__ == "__main__":
    main()
