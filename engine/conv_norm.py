"""A codec ConvNeXt block's streaming depthwise convolution and channel norm as one kernel (fast numerics).

Each of the codec decoder's nine ConvNeXt blocks joins its carried inputs to the frame's, runs the
causal depthwise convolution, adds its bias, normalizes every position over the channels (mean,
then the mean of the squared deviations, each stored before it is used) and applies the norm's
affine map, then keeps its last inputs for the next frame: about nineteen primitives a block as
operations. :class:`ConvNorm` does all of it in one launch, one block of threads per position;
the block's pointwise layers stay matrix products (:meth:`engine.codec.ConvNeXtBlock.step_rows`).

Arithmetic: the operations' own, step by step in the activations' dtype (bf16 in the published
checkpoints): every value the operations store is rounded to that dtype where they round it, and the
norm's two channel sums are taken in the order MLX's CUDA row sum takes them (eight values per thread in
turn, then a butterfly over each warp and over the warps: :func:`_row_sum`). Two steps are not fixed by
MLX's interface — whether its row sum accumulates in float32 or in the dtype, and how its kernel takes a
bf16 ``rsqrt`` — so the kernel comes in :data:`VARIANTS`, and admission keeps the first whose outputs are
the operations' bit for bit on this device, on inputs whose convolution sums are exact in any order.
What can then still differ is the convolution's seven-tap float32 sum, whose order inside MLX's
convolution is not ours to match: where it lands across a bf16 rounding boundary, that value moves by
one bf16 step, and its position's norm with it. (The codec amplifies such differences: computing the
norm in float32 throughout, as MLX's one-kernel layer norm does, cost 27 dB of waveform SNR — see the
README.) The operations (:func:`conv_norm_ops`) are exact mode's, which the CPU runs, so there the fast
codec's waveform is exact mode's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

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


Accumulator = Literal["float32", "dtype"]
RsqrtForm = Literal["float", "divide_sqrt", "intrinsic"]


@dataclass(frozen=True)
class ConvNormVariant:
    """How MLX's operations on this device take the two steps whose form its kernels do not fix for us.

    ``accumulator``: MLX's row sum adds in float32 and rounds once, or adds in the dtype (each add rounded;
    the CUDA source of some MLX versions). ``rsqrt``: the dtype's ``rsqrt`` as float32 ``rsqrt`` of the value
    rounded (``"float"``), as one over the rounded square root (``"divide_sqrt"``: MLX's CPU), or through
    CUDA's bf16 intrinsic ``hrsqrt`` (``"intrinsic"``). Admission tries :data:`VARIANTS` in turn and keeps
    the first that gives the operations' bits (:func:`engine.numerics.apply_numerics`).
    """

    accumulator: Accumulator
    rsqrt: RsqrtForm

    @property
    def label(self) -> str:
        return f"sums in {self.accumulator}, rsqrt as {self.rsqrt}"


VARIANTS: tuple[ConvNormVariant, ...] = tuple(
    ConvNormVariant(accumulator, rsqrt)
    for accumulator in ("float32", "dtype")
    for rsqrt in ("float", "divide_sqrt", "intrinsic")
)


def _rsqrt(d: Dialect, form: RsqrtForm, dtype: mx.Dtype, value: str, r: Callable[[str], str]) -> str:
    """``rsqrt`` of ``value`` (a float holding a ``dtype`` value) in ``form``, widened to float."""
    if form == "divide_sqrt":
        sqrt = "metal::precise::sqrt" if d.metal else "sqrtf"
        return f"1.0f / {r(f'{sqrt}({value})')}"
    if form == "intrinsic" and not d.metal and dtype == mx.bfloat16:
        return f"__bfloat162float(hrsqrt(__float2bfloat16_rn({value})))"
    return f"{d.rsqrt}({value})"


def mlx_sum_threads(channels: int) -> int:
    """The threads of MLX's CUDA row sum over ``channels`` values (``row_reduce_simple``: eight reads each, at
    most 1,024, a whole number of warps)."""
    reads = -(-channels // SUM_READS)
    return -(-min(1024, reads) // 32) * 32


SUM_READS = 8  # values each of MLX's CUDA row-sum threads reads and adds in turn


def _row_sum(d: Dialect, name: str, target: str, r: Callable[[str], str], accumulator: Accumulator) -> str:
    """The sum of the shared ``values_shared[C]`` into ``target``, rounded to the dtype (``r``).

    On CUDA in MLX's own order (``row_reduce_simple`` with a one-row block): each of ``RT`` threads adds its
    ``SUM_READS`` consecutive values in turn, passing over the row ``FULL`` times and once more over what is
    left; then a butterfly over each warp and one over the warps' results, as ``cooperative_groups::reduce``
    takes them — every add rounded to the dtype (``accumulator`` "dtype") or the float32 total rounded once.
    On Metal (not yet measured against MLX's kernel there): a float32 block sum, rounded once.
    """
    if d.metal:
        return f"""
    float {name} = 0.0f;
    for (int c = local; c < C; c += THREADS) {name} += values_shared[c];
    {d.block_reduce(name, target, "sum")}
    if (local == 0) {target} = {r(target)};
    {d.barrier}
"""

    def add(expression: str) -> str:
        return r(expression) if accumulator == "dtype" else f"({expression})"

    return f"""
    float {name} = 0.0f;
    if (local < RT) {{
        for (int pass = 0; pass <= FULL; ++pass) {{
            for (int j = 0; j < {SUM_READS}; ++j) {{
                const int at = (pass * RT + local) * {SUM_READS} + j;
                if (pass < FULL || at < C) {name} = {add(f"{name} + values_shared[at]")};
            }}
        }}
    }}
    for (int o = 16; o > 0; o /= 2) {name} = {add(f"{name} + __shfl_xor_sync(0xffffffff, {name}, o)")};
    if (lane == 0) scratch[warp] = {name};
    {d.barrier}
    if (warp == 0) {{
        float across = lane < RT / 32 ? scratch[lane] : 0.0f;
        for (int o = 16; o > 0; o /= 2) across = {add("across + __shfl_xor_sync(0xffffffff, across, o)")};
        if (lane == 0) {target} = {r("across")};
    }}
    {d.barrier}
"""


def _source(d: Dialect, eps: float, dtype: mx.Dtype, variant: ConvNormVariant) -> str:
    # ``R(v)``: v rounded to the activations' dtype and widened back, where the operations store a value.
    rounded = "static_cast<float>(static_cast<DT>({}))"

    def r(expression: str) -> str:
        return rounded.format(expression)

    return f"""
    {d.header}
    {d.shared} float scratch[THREADS / 32];
    {d.shared} float stats[2];
    {d.shared} float values_shared[C];
    const int t = block;  // this block's position among the frame's T
    const float inverse = {r("1.0f / static_cast<float>(C)")};  // the mean's 1/C, in the dtype
    const float epsilon = {r(f"{float(eps)!r}f")};
    float values[PER];
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
            values_shared[c] = value;
        }}
        values[i] = value;
    }}
    {d.barrier}
    {_row_sum(d, "sum", "stats[0]", r, variant.accumulator)}
    const float mean = {r("stats[0] * inverse")};
    for (int i = 0; i < PER; ++i) {{
        const int c = local + i * THREADS;
        if (c < C) {{
            const float deviation = {r("values[i] - mean")};
            values[i] = deviation;
            values_shared[c] = {r("deviation * deviation")};
        }}
    }}
    {d.barrier}
    {_row_sum(d, "squares", "stats[1]", r, variant.accumulator)}
    const float variance = {r("stats[1] * inverse")};
    const float scale = {r(_rsqrt(d, variant.rsqrt, dtype, r("variance + epsilon"), r))};
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
    """The kernel on CUDA or Metal, for one norm ``eps``, activations' ``dtype`` (the rows', the history's and
    every parameter's) and :class:`ConvNormVariant`. Needs at least as many rows as the history holds."""

    def __init__(self, backend: str, eps: float, dtype: mx.Dtype, variant: ConvNormVariant) -> None:
        self.eps = eps
        self.variant = variant
        self._kernel = custom_kernel(
            backend,
            "parley_conv_norm",
            list(INPUTS),
            list(OUTPUTS),
            cuda=_source(CUDA, eps, dtype, variant),
            metal=_source(METAL, eps, dtype, variant),
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
        threads = mlx_sum_threads(channels)
        if threads > THREADS:
            raise ValueError(f"MLX sums {channels} channels with {threads} threads; the kernel has {THREADS}")
        normed, next_history = self._kernel(
            inputs=[rows, history, conv_weight, conv_bias, norm_weight, norm_bias],
            template=[
                ("T", positions),
                ("C", channels),
                ("K", conv_weight.shape[1]),
                ("CONTEXT", context),
                ("PER", -(-channels // THREADS)),
                ("THREADS", THREADS),
                ("RT", threads),
                ("FULL", channels // (threads * SUM_READS)),
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
