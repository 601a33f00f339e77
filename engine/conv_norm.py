"""A codec ConvNeXt block's streaming depthwise convolution and channel norm as one kernel (fast numerics).

Each of the codec decoder's nine ConvNeXt blocks joins its carried inputs to the frame's, runs the
causal depthwise convolution, adds its bias, normalizes every position over the channels (mean,
then the mean of the squared deviations, each stored before it is used) and applies the norm's
affine map, then keeps its last inputs for the next frame: about nineteen primitives a block as
operations. :class:`ConvNorm` does all of it in one launch, one block of threads per position;
the block's pointwise layers stay matrix products (:meth:`engine.codec.ConvNeXtBlock.step_rows`).

Arithmetic: the operations' own, step by step in the activations' dtype (bf16 in the published
checkpoints) — every intermediate the operations store is rounded to that dtype where they round
it — with the convolution's seven taps and the norm's two channel sums accumulated in float32 in
another order. A sum that lands on another side of a bf16 rounding boundary moves one value by one
bf16 step; that is the only difference, and it is rare (the codec's layer norm is where the
codec amplifies differences: computing it in float32 throughout, as MLX's one-kernel layer norm
does, cost 27 dB of waveform SNR — see the README). The operations (:func:`conv_norm_ops`) are
exact mode's, which the CPU runs, so there the fast codec's waveform is exact mode's bit for bit.
"""

from __future__ import annotations

import mlx.core as mx

from .jit import materialize
from .kernel_source import CUDA, METAL, Dialect
from .numerics import custom_kernel

THREADS = 256

INPUTS = ("rows", "history", "conv_weight", "conv_bias", "norm_weight", "norm_bias")
OUTPUTS = ("normed", "next_history")


def channel_layer_norm(x: mx.array, weight: mx.array, bias: mx.array, eps: float) -> mx.array:
    """LayerNorm over the last axis with the biased variance, op by op as the reference writes it:
    ``mx.mean`` and the mean of squared deviations (MLX's ``mx.var``), then the affine map, each product
    that is then added to stored first (:func:`engine.jit.materialize`)."""
    mean = materialize(mx.mean(x, axis=-1, keepdims=True))
    deviation = x - mean
    variance = materialize(mx.mean(mx.square(deviation), axis=-1, keepdims=True))
    return materialize(deviation * mx.rsqrt(variance + eps) * weight) + bias


def conv_norm_ops(
    rows: mx.array,
    history: mx.array,
    conv_weight: mx.array,
    conv_bias: mx.array,
    norm_weight: mx.array,
    norm_bias: mx.array,
    *,
    eps: float,
) -> tuple[mx.array, mx.array]:
    """:class:`ConvNorm`'s computation as exact mode's operations (its fallback).

    ``rows`` (T, C) are one stream's new inputs, ``history`` (1, taps − 1, C) the inputs it carries;
    ``conv_weight`` (C, taps, 1) is the depthwise convolution's. Returns the normed rows (T, C) and the
    next history (1, taps − 1, C).
    """
    padded = mx.concatenate([history, mx.expand_dims(rows, 0)], axis=1)
    hidden = mx.conv1d(padded, conv_weight, 1, 0, 1, conv_weight.shape[0]) + conv_bias
    normed = channel_layer_norm(hidden, norm_weight, norm_bias, eps)
    return normed[0], padded[:, padded.shape[1] - history.shape[1] :]


def _rsqrt(d: Dialect, dtype: mx.Dtype, value: str) -> str:
    """MLX's ``rsqrt`` of ``value`` (a float holding a ``dtype`` value) on this backend, widened to float: on
    CUDA a bf16 goes through the bf16 intrinsic (``hrsqrt``), as MLX's own kernel takes it."""
    if not d.metal and dtype == mx.bfloat16:
        return f"__bfloat162float(hrsqrt(__float2bfloat16_rn({value})))"
    return f"{d.rsqrt}({value})"


def _source(d: Dialect, eps: float, dtype: mx.Dtype) -> str:
    # ``R(v)``: v rounded to the activations' dtype and widened back, where the operations store a value.
    rounded = "static_cast<float>(static_cast<DT>({}))"

    def r(expression: str) -> str:
        return rounded.format(expression)

    return f"""
    {d.header}
    {d.shared} float scratch[THREADS / 32];
    {d.shared} float stats[2];
    const int t = block;  // this block's position among the frame's T
    const float inverse = {r("1.0f / static_cast<float>(C)")};  // the mean's 1/C, in the dtype
    const float epsilon = {r(f"{float(eps)!r}f")};
    float values[PER];
    float sum = 0.0f;
    for (int i = 0; i < PER; ++i) {{
        const int c = local + i * THREADS;
        float value = 0.0f;
        if (c < C) {{
            // Position t of the convolution reads inputs t .. t + K - 1 of the history joined to the rows.
            float acc = 0.0f;
            for (int k = 0; k < K; ++k) {{
                const int p = t + k;
                const float x = p < CONTEXT ? static_cast<float>(history[p * C + c])
                                            : static_cast<float>(rows[(p - CONTEXT) * C + c]);
                acc += x * static_cast<float>(conv_weight[c * K + k]);
            }}
            value = {r(f"{r('acc')} + static_cast<float>(conv_bias[c])")};
            sum += value;
        }}
        values[i] = value;
    }}
    {d.block_reduce("sum", "stats[0]", "sum")}
    const float mean = {r(f"{r('stats[0]')} * inverse")};
    float squares = 0.0f;
    for (int i = 0; i < PER; ++i) {{
        const int c = local + i * THREADS;
        if (c < C) {{
            const float deviation = {r("values[i] - mean")};
            values[i] = deviation;
            squares += {r("deviation * deviation")};
        }}
    }}
    {d.block_reduce("squares", "stats[1]", "sum")}
    const float variance = {r(f"{r('stats[1]')} * inverse")};
    const float scale = {r(_rsqrt(d, dtype, r("variance + epsilon")))};
    for (int i = 0; i < PER; ++i) {{
        const int c = local + i * THREADS;
        if (c < C) {{
            const float scaled = {r(f"{r('values[i] * scale')} * static_cast<float>(norm_weight[c])")};
            normed[t * C + c] = static_cast<DT>(scaled + static_cast<float>(norm_bias[c]));
        }}
    }}
    // The next history is the last CONTEXT inputs of the join: rows T - CONTEXT .. T - 1 (T >= CONTEXT).
    if (t < CONTEXT) {{
        for (int c = local; c < C; c += THREADS) next_history[t * C + c] = rows[(T - CONTEXT + t) * C + c];
    }}
"""


class ConvNorm:
    """The kernel on CUDA or Metal, for one norm ``eps`` and activations' ``dtype`` (the rows', the history's
    and every parameter's). Needs at least as many rows as the history holds."""

    def __init__(self, backend: str, eps: float, dtype: mx.Dtype) -> None:
        self.eps = eps
        self._kernel = custom_kernel(
            backend,
            "parley_conv_norm",
            list(INPUTS),
            list(OUTPUTS),
            cuda=_source(CUDA, eps, dtype),
            metal=_source(METAL, eps, dtype),
        )

    def __call__(
        self,
        rows: mx.array,
        history: mx.array,
        conv_weight: mx.array,
        conv_bias: mx.array,
        norm_weight: mx.array,
        norm_bias: mx.array,
    ) -> tuple[mx.array, mx.array]:
        positions, channels = rows.shape
        context = history.shape[1]
        if positions < context:
            raise ValueError(f"the kernel takes at least {context} rows, got {positions}")
        normed, next_history = self._kernel(
            inputs=[rows, history, conv_weight, conv_bias, norm_weight, norm_bias],
            template=[
                ("T", positions),
                ("C", channels),
                ("K", conv_weight.shape[1]),
                ("CONTEXT", context),
                ("PER", -(-channels // THREADS)),
                ("THREADS", THREADS),
                ("DT", rows.dtype),
            ],
            grid=(positions * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(positions, channels), history.shape],
            output_dtypes=[rows.dtype, rows.dtype],
        )
        return normed, next_history


def conv_norm_samples(positions: int, channels: int, taps: int, dtype: mx.Dtype) -> tuple[mx.array, ...]:
    """Inputs for admitting :class:`ConvNorm` against :func:`conv_norm_ops`, on which both must agree to the
    bit: quarter steps times quarter steps, so that every convolution sum is exact in float32 in any order;
    channels in pairs of opposite values, so that the mean is exactly zero; and positions of at most 15/16 in
    sixteenths, so that their squares are exact in bf16 and their sum exact in float32 (the reordered sums
    then round alike, and only the elementwise steps remain to compare)."""
    if channels % 2:
        raise ValueError("the admission sample pairs channels: an even count is needed")
    if taps * (1 / 2) * (1 / 4) + 1 / 16 > 15 / 16:
        raise ValueError(f"the admission sample keeps |convolution + bias| ≤ 15/16 for at most 7 taps, not {taps}")
    keys = mx.random.split(mx.random.key(4242), 4)
    half = channels // 2
    context = taps - 1

    def paired(values: mx.array) -> mx.array:
        return mx.concatenate([values, -values], axis=-1).astype(dtype)

    inputs = mx.random.randint(-2, 3, (positions + context, half), key=keys[0]).astype(mx.float32) / 4
    weight = mx.random.randint(-1, 2, (half, taps), key=keys[1]).astype(mx.float32) / 4
    bias = mx.random.randint(-1, 2, (half,), key=keys[2]).astype(mx.float32) / 16
    joined = paired(inputs)
    conv_weight = mx.concatenate([weight, weight], axis=0).reshape(channels, taps, 1).astype(dtype)
    norm_keys = mx.random.split(keys[3], 2)
    norm_weight = (1 + 0.1 * mx.random.normal((channels,), key=norm_keys[0])).astype(dtype)
    norm_bias = (0.1 * mx.random.normal((channels,), key=norm_keys[1])).astype(dtype)
    return (
        joined[context:],
        mx.expand_dims(joined[:context], 0),
        conv_weight,
        paired(bias),
        norm_weight,
        norm_bias,
    )
