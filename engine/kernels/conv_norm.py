"""A codec ConvNeXt block's streaming depthwise convolution and channel norm as one kernel (fast numerics).

Each of the codec decoder's nine ConvNeXt blocks joins its carried inputs to the frame's, runs the
causal depthwise convolution, adds its bias, normalizes every position over the channels (mean,
then the mean of the squared deviations, each stored before it is used) and applies the norm's
affine map, then keeps its last inputs for the next frame: about nineteen primitives a block as
operations. :class:`ConvNorm` does all of it in one launch, one block of threads per position;
the block's pointwise convolutions stay MLX's (:meth:`engine.networks.codec.fast.CodecFast.block_step`).

Arithmetic: the operations' own, step by step in the activations' dtype (bf16 in the published
checkpoints): every value the operations store is rounded to that dtype where they round it, and on CUDA
the norm's two channel sums are taken as MLX's own row sum takes them (:func:`mlx_row_sum_plan`,
:func:`_row_sum`): in MLX 0.32's CUDA backend an ``mx.sum`` over the last axis of bf16 rows accumulates in
bf16 (each add rounded) with one warp per row for these widths, each lane adding eight consecutive values a
pass, then a butterfly over the warp. The kernel comes in :data:`VARIANTS` (that accumulator or a float32
one; three forms of a bf16 ``rsqrt``), MLX's CUDA source's first, and admission keeps the first whose
outputs are the operations' bit for bit on this device, on inputs whose convolution sums are exact in any
order; the others stand for MLX versions or backends that take those two steps otherwise (Metal's sums are
float32 block sums here, not yet measured against MLX's). What can then still differ is the convolution's
seven-tap float32 sum, whose order inside MLX's convolution is not ours to match: where it lands across a
bf16 rounding boundary, that value moves by one bf16 step, and its position's norm with it. (The codec
amplifies such differences: computing the norm in float32 throughout, as MLX's one-kernel layer norm does,
cost 27 dB of waveform SNR — see docs/numerics.md, "Rejected".) The operations (:func:`conv_norm_ops`) are exact mode's,
which the CPU runs, so there the fast codec's waveform is exact mode's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import mlx.core as mx

from ..jit import materialize
from .admission import custom_kernel
from .source import CUDA, METAL, Dialect

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

    ``rows`` (1, T, C) are one stream's new inputs, ``history`` (1, taps − 1, C) the inputs it carries;
    ``conv_weight`` (C, taps, 1) is the depthwise convolution's. Returns the normed rows (1, T, C) and the
    next history (1, taps − 1, C).
    """
    padded = mx.concatenate([history, rows], axis=1)
    hidden = mx.conv1d(padded, conv_weight, 1, 0, 1, conv_weight.shape[0]) + conv_bias
    normed = channel_layer_norm(hidden, norm_weight, norm_bias, eps)
    return normed, padded[:, padded.shape[1] - history.shape[1] :]


Accumulator = Literal["dtype", "float32"]
RsqrtForm = Literal["float", "divide_sqrt", "intrinsic"]


@dataclass(frozen=True)
class ConvNormVariant:
    """How MLX's operations on this device take the two steps that its interface does not fix.

    ``accumulator``: MLX's row sum adds in the dtype, each add rounded (``"dtype"``: MLX 0.32's CUDA backend,
    whose ``ReduceResult<Sum, T>`` is ``T`` for every non-integer ``T``), or adds in float32 and rounds once
    (``"float32"``). ``rsqrt``: the dtype's ``rsqrt`` as float32 ``rsqrt`` of the value widened, rounded back
    (``"float"``: MLX 0.32's CUDA ``Rsqrt``), as one over the rounded square root (``"divide_sqrt"``: MLX's
    CPU), or through CUDA's bf16 intrinsic ``hrsqrt`` (``"intrinsic"``). Admission tries :data:`VARIANTS` in
    turn (:func:`variants_for`) and keeps the first that gives the operations' bits
    (:func:`engine.numerics.apply_numerics`).
    """

    accumulator: Accumulator
    rsqrt: RsqrtForm

    @property
    def label(self) -> str:
        return f"sums in {self.accumulator}, rsqrt as {self.rsqrt}"


# MLX's CUDA source's variant first (bf16 accumulators, float rsqrt); the rest for other MLX versions.
VARIANTS: tuple[ConvNormVariant, ...] = tuple(
    ConvNormVariant(accumulator, rsqrt)
    for accumulator in ("dtype", "float32")
    for rsqrt in ("float", "divide_sqrt", "intrinsic")
)


def variants_for(backend: str | None) -> tuple[ConvNormVariant, ...]:
    """The variants admission tries on ``backend``, in order: every one on CUDA; on Metal, whose sums do not
    depend on the accumulator (:func:`_row_sum`), one of each distinct source; the first alone elsewhere (the
    CPU runs the operations whichever is named)."""
    if backend == "cuda":
        return VARIANTS
    if backend == "metal":
        return tuple(variant for variant in VARIANTS if variant.accumulator == VARIANTS[0].accumulator)
    return VARIANTS[:1]


def _rsqrt(d: Dialect, form: RsqrtForm, dtype: mx.Dtype, value: str, r: Callable[[str], str]) -> str:
    """``rsqrt`` of ``value`` (a float holding a ``dtype`` value) in ``form``, widened to float."""
    if form == "divide_sqrt":
        sqrt = "metal::precise::sqrt" if d.metal else "sqrtf"
        return f"1.0f / {r(f'{sqrt}({value})')}"
    if form == "intrinsic" and not d.metal and dtype == mx.bfloat16:
        return f"__bfloat162float(hrsqrt(__float2bfloat16_rn({value})))"
    return f"{d.rsqrt}({value})"


@dataclass(frozen=True)
class RowSumPlan:
    """How MLX's CUDA ``row_reduce_simple`` sums one row of ``channels`` values of one dtype.

    ``threads`` (``warps`` × 32) lanes; lane ``l`` of pass ``p`` adds values ``(p · threads + l) · reads``
    onwards, ``reads`` in turn; ``full`` passes over whole blocks of ``threads · reads`` values, then, where
    ``tail``, one more in which the values past the row are the sum's zero (and added as such).
    """

    reads: int
    warps: int
    full: int
    tail: bool

    @property
    def threads(self) -> int:
        return 32 * self.warps


def mlx_row_sum_plan(channels: int, dtype: mx.Dtype) -> RowSumPlan:
    """MLX's launch of ``row_reduce_simple`` for a sum over the last, contiguous axis (mlx/backend/cuda/reduce/
    row_reduce.cu, ``row_reduce_simple``, the host function): ``N_READS = 16 / sizeof(T)``, ``warps =
    ceil(ceil(size / N_READS) / 32) / 4`` (integer division), clamped to 1 … 32. For bf16 rows of 384, 768
    or 1,536 channels: one warp of eight reads a lane (passes 1 and a tail, 3, 6)."""
    reads = 16 // dtype.size
    reductions = -(-channels // reads)
    warps = max(min(-(-reductions // 32) // 4, 32), 1)
    full = channels // (32 * warps * reads)
    return RowSumPlan(reads, warps, full, full * 32 * warps * reads < channels)


def _row_sum(d: Dialect, name: str, target: str, r: Callable[[str], str], accumulator: Accumulator) -> str:
    """The sum of the shared ``values_shared[C]`` into ``target``, rounded to the dtype (``r``).

    On CUDA in MLX's own order (``SUM_*``, :func:`mlx_row_sum_plan`). This reproduces MLX 0.32's
    mlx/backend/cuda/reduce/row_reduce.cu, ``cu::row_reduce_simple<T, U, Sum, N_READS>`` with one row a block
    (``M = 1``; with ``M = 2``, for 1,024 rows or more, each row's order is the same): each lane starts from
    ``ReduceInit<Sum, T>`` (zero) and adds its ``N_READS`` consecutive values in turn (``accs = op(accs,
    vals[j])``) on each of ``full_blocks`` passes, then on a final pass the values left, past the row the
    zero; then ``block_reduce`` (reduce/reduce_utils.cuh): ``cg::reduce`` over each warp, which for MLX's
    ``Sum`` (not a ``cg::plus``, so no ``redux.sync``) is cooperative groups' ``coalesced_reduce`` on a
    32-thread tile (cooperative_groups/details/coalesced_reduce.h): ``out = op(out, shfl_xor(out, mask))``
    for masks 16, 8, 4, 2, 1; and only with more than one warp, each warp's lane-0 total to shared memory,
    lanes below the warp count read them (the others zero) and the same butterfly once more. With the
    ``"dtype"`` accumulator every add is the dtype's own (for bf16, ``__nv_bfloat16``'s ``operator+``, the
    ``__hadd`` that MLX's ``Sum`` calls with ``U = T``); with ``"float32"``, float adds in the same order,
    the total rounded once. On Metal (not yet measured against MLX's kernel there): a float32 block sum,
    rounded once.
    """
    if d.metal:
        return f"""
    float {name} = 0.0f;
    for (int c = local; c < C; c += THREADS) {name} += values_shared[c];
    {d.block_reduce(name, target, "sum")}
    if (local == 0) {target} = {r(target)};
    {d.barrier}
"""
    acc = "DT" if accumulator == "dtype" else "float"
    zero = f"static_cast<{acc}>(0.0f)"
    butterfly = "for (int o = 16; o > 0; o /= 2) {0} = {0} + __shfl_xor_sync(0xffffffff, {0}, o);"
    return f"""
    // MLX's order: mlx/backend/cuda/reduce/row_reduce.cu row_reduce_simple, reduce_utils.cuh block_reduce.
    {acc} {name} = {zero};
    if (local < SUM_THREADS) {{
        for (int pass = 0; pass < SUM_FULL; ++pass) {{
            for (int j = 0; j < SUM_READS; ++j) {{
                {name} = {name} + static_cast<{acc}>(values_shared[(pass * SUM_THREADS + local) * SUM_READS + j]);
            }}
        }}
        if (SUM_TAIL) {{
            for (int j = 0; j < SUM_READS; ++j) {{
                const int at = (SUM_FULL * SUM_THREADS + local) * SUM_READS + j;
                {name} = {name} + (at < C ? static_cast<{acc}>(values_shared[at]) : {zero});
            }}
        }}
    }}
    {butterfly.format(name)}
    if (SUM_WARPS > 1) {{
        if (lane == 0 && warp < SUM_WARPS) scratch[warp] = static_cast<float>({name});
        {d.barrier}
        if (warp == 0) {{
            {acc} across = lane < SUM_WARPS ? static_cast<{acc}>(scratch[lane]) : {zero};
            {butterfly.format("across")}
            if (lane == 0) {target} = {r("static_cast<float>(across)")};
        }}
    }} else if (local == 0) {{
        {target} = {r(f"static_cast<float>({name})")};
    }}
    {d.barrier}
"""


def _source(d: Dialect, eps: float, dtype: mx.Dtype, variant: ConvNormVariant) -> str:
    """The kernel body. Each elementwise step of the operations is one float32 operation on values of the
    dtype, rounded back to it (``r``): for +, −, × of two bf16 values that is the bf16 operation's own
    rounding (float32's 24 bits ≥ 2 · 8 + 2, so rounding twice is rounding once) — what MLX's CUDA
    ``Add``/``Subtract``/``Multiply`` (device/binary_ops.cuh, ``__nv_bfloat16`` operators) give. The mean is
    the sum times ``1/C`` in the dtype (mlx/ops.cpp ``mean``: ``multiply(sum, number_of_elements(...,
    inverted, dtype))``), the variance likewise (``mx.var``); MLX's CUDA ``Rsqrt`` of a bf16 value is
    ``rsqrt`` of it widened to float, rounded back (device/unary_ops.cuh), the ``"float"`` form."""
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
        _, positions, channels = rows.shape  # one stream's rows (1, T, C)
        context = history.shape[1]
        if positions < context:
            raise ValueError(f"the kernel takes at least {context} rows, got {positions}")
        plan = mlx_row_sum_plan(channels, rows.dtype)
        if plan.threads > THREADS:
            raise ValueError(f"MLX sums {channels} channels with {plan.threads} threads; the kernel has {THREADS}")
        normed, next_history = self._kernel(
            inputs=[rows, history, conv_weight, conv_bias, norm_weight, norm_bias],
            template=[
                ("T", positions),
                ("C", channels),
                ("K", conv_weight.shape[1]),
                ("CONTEXT", context),
                ("PER", -(-channels // THREADS)),
                ("THREADS", THREADS),
                ("SUM_READS", plan.reads),
                ("SUM_WARPS", plan.warps),
                ("SUM_THREADS", plan.threads),
                ("SUM_FULL", plan.full),
                ("SUM_TAIL", plan.tail),
                ("DT", rows.dtype),
            ],
            grid=(positions * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[rows.shape, history.shape],
            output_dtypes=[rows.dtype, rows.dtype],
        )
        return normed, next_history


def conv_norm_samples(positions: int, channels: int, taps: int, dtype: mx.Dtype) -> tuple[mx.array, ...]:
    """Inputs for admitting :class:`ConvNorm` against :func:`conv_norm_ops`, on which both must agree to the
    bit: quarter steps times quarter steps, so that every convolution sum is exact in float32 in any order;
    channels in pairs of opposite values, so that the mean is exactly zero; and positions of at most 15/16 in
    sixteenths, so that their squares are exact in bf16 and their sum exact in float32 (summed in float32, in
    any order, the sums then round alike, and only the elementwise steps remain to compare). Summed in bf16,
    as MLX's CUDA row sum sums them, the squares' partial sums round (hundreds of 1/256ths need more than
    bf16's 8 bits): there the sample checks the kernel's order of adds too."""
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
        mx.expand_dims(joined[context:], 0),
        mx.expand_dims(joined[:context], 0),
        conv_weight,
        paired(bias),
        norm_weight,
        norm_bias,
    )
