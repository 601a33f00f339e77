"""The codec's dequantization as one kernel (fast numerics): each frame's codebook rows summed in quantizer order.

The decoder's input is the sum of one row per quantizer, added one quantizer at a time in the codebooks'
dtype, as the reference adds them (:meth:`engine.networks.codec.ResidualQuantizer.decode`). As operations that is a
gather, a slice per quantizer and the adds: about 34 primitives for 31 quantizers. :class:`CodeSum` reads
each row from the stacked table itself and adds them in the same order, rounding to the table's dtype after
each add as the operations do (two values of that dtype added in float32 and rounded once give the correctly
rounded sum MLX's add gives), so its result is the operations' bit for bit, and it is admitted only if it
is (tolerance 0). Fallback: :func:`code_sum_ops`, exact mode's operations.
"""

from __future__ import annotations

import mlx.core as mx

from .admission import custom_kernel
from .source import CUDA, METAL, Dialect

THREADS = 256

INPUTS = ("codes", "table", "offsets")
OUTPUTS = ("latents",)


def code_sum_ops(codes: mx.array, table: mx.array, offsets: mx.array) -> mx.array:
    """``codes (B, Q, T)`` → ``(B, T, D)``: the rows ``table[codes[:, q] + offsets[q]]`` summed in quantizer
    order, in the table's dtype (``offsets (Q, 1)``: each quantizer's first row in the stacked table)."""
    quantizers = codes.shape[1]
    rows = table[codes + offsets]  # (B, Q, T, D)
    parts = mx.split(rows, quantizers, axis=1) if quantizers > 1 else [rows]
    latents = parts[0]
    for part in parts[1:]:
        latents = latents + part
    return latents.squeeze(1)


def _source(d: Dialect) -> str:
    return f"""
    {d.header}
    const int at = block * THREADS + local;  // one output value: position t, channel c
    if (at >= T * D) return;
    const int t = at / D;
    const int c = at % D;
    float sum = static_cast<float>(table[static_cast<size_t>(codes[t] + offsets[0]) * D + c]);
    for (int q = 1; q < Q; ++q) {{
        const float row = static_cast<float>(table[static_cast<size_t>(codes[q * T + t] + offsets[q]) * D + c]);
        sum = static_cast<float>(static_cast<DT>(sum + row));
    }}
    latents[at] = static_cast<DT>(sum);
"""


class CodeSum:
    """The kernel on CUDA or Metal, for one stream (batch 1): int32 codes, the table in its dtype."""

    def __init__(self, backend: str) -> None:
        self._kernel = custom_kernel(
            backend, "parley_code_sum", list(INPUTS), list(OUTPUTS), cuda=_source(CUDA), metal=_source(METAL)
        )

    def __call__(self, codes: mx.array, table: mx.array, offsets: mx.array) -> mx.array:
        batch, quantizers, positions = codes.shape
        if batch != 1 or codes.dtype != mx.int32:
            raise ValueError(f"the kernel sums one stream's int32 codes, got {codes.shape} {codes.dtype}")
        width = table.shape[1]
        (latents,) = self._kernel(
            inputs=[codes, table, offsets],
            template=[("Q", quantizers), ("T", positions), ("D", width), ("THREADS", THREADS), ("DT", table.dtype)],
            grid=(-(-positions * width // THREADS) * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(1, positions, width)],
            output_dtypes=[table.dtype],
        )
        return latents


def code_sum_samples(quantizers: int, size: int, width: int, dtype: mx.Dtype) -> tuple[mx.array, ...]:
    """Inputs for admitting :class:`CodeSum` against :func:`code_sum_ops`: one frame's random codes and a
    random stacked table of ``quantizers`` codebooks of ``size`` rows."""
    keys = mx.random.split(mx.random.key(3131), 2)
    codes = mx.random.randint(0, size, (1, quantizers, 1), key=keys[0]).astype(mx.int32)
    table = mx.random.normal((quantizers * size, width), key=keys[1]).astype(dtype)
    offsets = (mx.arange(quantizers, dtype=mx.int32) * size)[:, None]
    return codes, table, offsets
