"""Fast mode's fused Mamba-2 step: one position of a mixer as one kernel (see docs/numerics.md).

:class:`FusedStep` is the kernel (CUDA and Metal sources below), :func:`fused_step_ops` its fallback and fast mode's
step on the CPU, :func:`fused_step_sample` the inputs it is admitted on, and :func:`block_rows` the rows of a block,
whose sums of squares the output projection's kernel turns into the mixer's norm
(:mod:`engine.kernels.quantized_product`). The exact step is :func:`engine.networks.llm.ssm.ssm_scan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .admission import custom_kernel


@dataclass(frozen=True)
class MambaShape:
    """A Mamba-2 mixer's sizes as its step reads them: heads of ``head_dim`` in ``groups`` groups, a state of
    ``state_size`` per head, a depthwise convolution of ``kernel_size`` taps over ``conv_dim`` channels."""

    heads: int
    head_dim: int
    groups: int
    state_size: int
    kernel_size: int
    conv_dim: int


def block_rows(heads: int, head_dim: int, groups: int) -> int:
    """Rows (one warp each) per block of the fused step: the most, up to 16, that tile one norm group, so
    that each block's sum of squares belongs to one group."""
    group_rows = heads // groups * head_dim
    return next(rows for rows in (16, 8, 4, 2, 1) if group_rows % rows == 0)


# CONV_OF(channel, result) in both sources: the causal convolution of one channel over the window
# [conv_state rows 0 … K-2, this position's input], plus its bias, through SiLU.
_STEP_CUDA = """
    constexpr int INNER = H * P;
    constexpr int CONV = INNER + 2 * G * N;
    const int position = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = position / 32;  // one warp per (head, channel) row
    const int lane = threadIdx.x % 32;
    const int h = row / P;
    const int g = h / (H / G);
    const float* conv_input = projected + INNER;
    const float* dt_raw = projected + INNER + CONV;
    // The new convolution window: the old one moved up a row, this position's input last.
    for (int i = position; i < (K - 1) * CONV; i += gridDim.x * blockDim.x) {
        new_conv_state[i] =
            i < (K - 2) * CONV ? static_cast<float>(conv_state[i + CONV]) : conv_input[i - (K - 2) * CONV];
    }
    #define CONV_OF(channel, result) { \
        float sum = static_cast<float>(conv_bias[channel]); \
        for (int k = 0; k < K - 1; ++k) { \
            sum += static_cast<float>(conv_weight[(channel) * K + k]) * \
                   static_cast<float>(conv_state[k * CONV + (channel)]); \
        } \
        sum += static_cast<float>(conv_weight[(channel) * K + K - 1]) * conv_input[channel]; \
        result = sum / (1.0f + expf(-sum)); }
    const float raw = dt_raw[h] + static_cast<float>(dt_bias[h]);
    const float top = fmaxf(raw, 0.0f);
    float dt = top + log1pf(expf(fminf(raw, 0.0f) - top));  // softplus, as logaddexp(raw, 0)
    dt = fminf(fmaxf(dt, limits[0]), limits[1]);
    const float rate = -static_cast<float>(static_cast<AT>(expf(static_cast<float>(a_log[h]))));
    const float decay = expf(dt * rate);
    float x;
    CONV_OF(row, x);
    const float dt_x = dt * x;
    const float* old_state = state + static_cast<size_t>(row) * N;
    float* state_row = new_state + static_cast<size_t>(row) * N;
    float readout = 0.0f;
    for (int n = lane; n < N; n += 32) {
        float b, c;
        CONV_OF(INNER + g * N + n, b);
        CONV_OF(INNER + G * N + g * N + n, c);
        const float s = old_state[n] * decay + dt_x * b;
        state_row[n] = s;
        readout += s * c;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        readout += __shfl_down_sync(0xffffffff, readout, offset);
    }
    __shared__ float row_squares[ROWS];
    if (lane == 0) {
        const float gate_value = projected[row];
        const float skipped = readout + static_cast<float>(skip[h]) * x;
        const float gated = gate_value * (1.0f / (1.0f + expf(-gate_value))) * skipped;
        y[row] = gated;
        row_squares[threadIdx.x / 32] = gated * gated;
    }
    // The block's ROWS squares summed in order: the mixer's norm adds a group's blocks (engine.quantized_product).
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int r = 0; r < ROWS; ++r) sum += row_squares[r];
        squares[blockIdx.x] = sum;
    }
    #undef CONV_OF
"""

_STEP_METAL = """
    constexpr int INNER = H * P;
    constexpr int CONV = INNER + 2 * G * N;
    const uint position = thread_position_in_grid.x;  // ("thread" is an address space in Metal)
    const uint row = position / 32;  // one simdgroup per (head, channel) row
    const uint lane = thread_index_in_simdgroup;
    const uint h = row / P;
    const uint g = h / (H / G);
    for (uint i = position; i < (K - 1) * CONV; i += threads_per_grid.x) {
        new_conv_state[i] = i < (K - 2) * CONV ? static_cast<float>(conv_state[i + CONV])
                                               : projected[INNER + i - (K - 2) * CONV];
    }
    #define CONV_OF(channel, result) { \
        float sum = static_cast<float>(conv_bias[channel]); \
        for (int k = 0; k < K - 1; ++k) { \
            sum += static_cast<float>(conv_weight[(channel) * K + k]) * \
                   static_cast<float>(conv_state[k * CONV + (channel)]); \
        } \
        sum += static_cast<float>(conv_weight[(channel) * K + K - 1]) * projected[INNER + (channel)]; \
        result = sum / (1.0f + metal::exp(-sum)); }
    const float raw = projected[INNER + CONV + h] + static_cast<float>(dt_bias[h]);
    const float top = metal::max(raw, 0.0f);
    float dt = top + metal::log(1.0f + metal::exp(metal::min(raw, 0.0f) - top));
    dt = metal::min(metal::max(dt, limits[0]), limits[1]);
    const float rate = -static_cast<float>(static_cast<AT>(metal::exp(static_cast<float>(a_log[h]))));
    const float decay = metal::exp(dt * rate);
    float x;
    CONV_OF(row, x);
    const float dt_x = dt * x;
    const uint base = row * N;
    float readout = 0.0f;
    for (uint n = lane; n < N; n += 32) {
        float b, c;
        CONV_OF(INNER + g * N + n, b);
        CONV_OF(INNER + G * N + g * N + n, c);
        const float s = state[base + n] * decay + dt_x * b;
        new_state[base + n] = s;
        readout += s * c;
    }
    readout = metal::simd_sum(readout);
    threadgroup float row_squares[ROWS];
    if (lane == 0) {
        const float gate_value = projected[row];
        const float skipped = readout + static_cast<float>(skip[h]) * x;
        const float gated = gate_value * (1.0f / (1.0f + metal::exp(-gate_value))) * skipped;
        y[row] = gated;
        row_squares[simdgroup_index_in_threadgroup] = gated * gated;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (thread_index_in_threadgroup == 0) {
        float sum = 0.0f;
        for (uint r = 0; r < ROWS; ++r) sum += row_squares[r];
        squares[threadgroup_position_in_grid.x] = sum;
    }
    #undef CONV_OF
"""

_STEP_INPUTS = ["projected", "conv_state", "conv_weight", "conv_bias", "dt_bias", "a_log", "skip", "state", "limits"]
_STEP_OUTPUTS = ["y", "new_conv_state", "new_state", "squares"]


def fused_step_ops(
    projected: mx.array,
    conv_state: mx.array,
    conv_weight: mx.array,
    conv_bias: mx.array,
    dt_bias: mx.array,
    a_log: mx.array,
    skip: mx.array,
    state: mx.array,
    limits: mx.array,
    *,
    groups: int,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """The fused step's arithmetic as operations: its fallback, and fast mode's step on the CPU.

    ``projected`` (…, P) is one position's input projection ``[gate (H·P) | conv input (conv_dim) | dt (H)]``;
    ``conv_state`` (1, K-1, conv_dim) the convolution's window before it, ``conv_weight`` (conv_dim, K, 1)
    and ``conv_bias`` (conv_dim,) the depthwise convolution; ``state`` (1, H, P, N) float32 and ``limits``
    the (2,) time-step clip. Returns ``silu(gate) · y`` (…, H·P), the gated readout the mixer's norm takes,
    the new convolution window (1, K-1, conv_dim), the new state, and the sums of the readout's squares
    over each :func:`block_rows` rows (the norm's statistics, which the output projection's kernel
    completes). Unlike the exact form it sums the convolution tap by tap and reads the output from the
    new state, ``y = C·S_new + D·x``: the same quantities, summed in another order.
    """
    _, heads, head_dim, state_size = state.shape
    inner = heads * head_dim
    conv_dim = conv_state.shape[-1]
    gate, conv_input, dt_raw = mx.split(projected.reshape(-1), [inner, inner + conv_dim])
    window = mx.concatenate([conv_state[0].astype(mx.float32), conv_input[None]], axis=0)  # (K, conv_dim)
    mixed = nn.silu(mx.sum(window * conv_weight[..., 0].T.astype(mx.float32), axis=0) + conv_bias)
    x = mixed[:inner].reshape(heads, head_dim)
    b_heads = mx.repeat(mixed[inner : inner + groups * state_size].reshape(groups, state_size), heads // groups, 0)
    c_heads = mx.repeat(mixed[inner + groups * state_size :].reshape(groups, state_size), heads // groups, 0)
    dt = mx.clip(nn.softplus(dt_raw + dt_bias), limits[0], limits[1])
    decay = mx.exp(dt * -mx.exp(a_log).astype(mx.float32))
    new_state = state[0] * decay[:, None, None] + (dt[:, None] * x)[:, :, None] * b_heads[:, None, :]
    y = mx.sum(new_state * c_heads[:, None, :], axis=-1) + skip[:, None] * x
    gated = nn.silu(gate) * y.reshape(inner)
    squares = mx.sum(mx.square(gated).reshape(-1, block_rows(heads, head_dim, groups)), axis=1)
    return gated.reshape(*projected.shape[:-1], inner), window[1:][None], new_state[None], squares


def fused_step_sample(
    shape: MambaShape,
    conv_weight: mx.array,
    conv_bias: mx.array,
    dt_bias: mx.array,
    a_log: mx.array,
    skip: mx.array,
    limits: mx.array,
    seed: int = 1234,
) -> tuple[mx.array, ...]:
    """Random inputs of one mixer's step (a projection, an earlier convolution window and state) of ``shape``
    with the mixer's own convolution and parameters (:meth:`engine.networks.llm.Mamba2Mixer.step_weights`): for
    admitting the kernel, and for testing the fallback."""
    keys = mx.random.split(mx.random.key(seed), 3)
    heads, head_dim, conv_dim = shape.heads, shape.head_dim, shape.conv_dim
    return (
        mx.random.normal((heads * head_dim + conv_dim + heads,), key=keys[0]),
        mx.random.normal((1, shape.kernel_size - 1, conv_dim), key=keys[1]),
        conv_weight,
        conv_bias,
        dt_bias,
        a_log,
        skip,
        0.1 * mx.random.normal((1, heads, head_dim, shape.state_size), key=keys[2]),
        limits,
    )


class FusedStep:
    """The fused Mamba-2 step kernel for one layer shape, on CUDA or Metal (see docs/numerics.md):
    the causal convolution of one position, the state update, its readout, the skip term and the gate, and
    the sums of the gated readout's squares per block (:func:`fused_step_ops` says what each output is)."""

    def __init__(self, backend: str, heads: int, head_dim: int, groups: int, state_size: int) -> None:
        if heads % groups:
            raise ValueError(f"no fused step for {heads} heads in {groups} groups")
        self.heads, self.head_dim, self.groups, self.state_size = heads, head_dim, groups, state_size
        self._kernel = custom_kernel(
            backend, "parley_mamba_step", _STEP_INPUTS, _STEP_OUTPUTS, cuda=_STEP_CUDA, metal=_STEP_METAL
        )

    def __call__(
        self,
        projected: mx.array,
        conv_state: mx.array,
        conv_weight: mx.array,
        conv_bias: mx.array,
        dt_bias: mx.array,
        a_log: mx.array,
        skip: mx.array,
        state: mx.array,
        limits: mx.array,
    ) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        rows = self.heads * self.head_dim
        block = block_rows(self.heads, self.head_dim, self.groups)
        kernel_size = conv_weight.shape[1]
        y, new_conv_state, new_state, squares = self._kernel(
            inputs=[projected, conv_state, conv_weight, conv_bias, dt_bias, a_log, skip, state, limits],
            template=[
                ("H", self.heads),
                ("P", self.head_dim),
                ("G", self.groups),
                ("N", self.state_size),
                ("K", kernel_size),
                ("ROWS", block),
                ("AT", a_log.dtype),
                # The source is generated for its inputs' types: they name the kernel too.
                ("ST", conv_state.dtype),
                ("WT", conv_weight.dtype),
                ("BT", conv_bias.dtype),
            ],
            grid=(rows * 32, 1, 1),
            threadgroup=(block * 32, 1, 1),
            output_shapes=[
                (*projected.shape[:-1], rows),
                (1, kernel_size - 1, conv_state.shape[-1]),
                state.shape,
                (rows // block,),
            ],
            output_dtypes=[mx.float32, mx.float32, mx.float32, mx.float32],
        )
        return y, new_conv_state, new_state, squares
