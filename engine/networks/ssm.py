"""Mamba-2 selective state-space scan, as pure functions.

Notation (per batch row): ``x`` (L, H, P) head inputs, ``B``/``C`` (L, G, N) input and
output projections shared by the H/G heads of a group, ``dt`` (L, H) step sizes,
``A = -exp(A_log)`` (H,) per-head decay rates and ``D`` (H,) skip weights. The
recurrence per head is

    S_t = exp(A dt_t) S_{t-1} + dt_t x_t ⊗ B_t          (S is P × N, float32)
    y_t = S_t C_t + D x_t

It is evaluated in its chunked quadratic ("state-space dual") form: inside a chunk of
at most ``chunk_size`` positions the outputs come from a masked, decayed C·Bᵀ matrix
applied to ``dt x``; the carried-in state contributes through the cumulative decay,
and the chunk's final state is handed to the next chunk. The reference runtime uses
exactly this formulation on every non-Metal device, including single-token steps
with a carried state, so it is also used here for L = 1: the op sequence below is
what makes our outputs bit-identical to it.

Products that are then added (the skip term, the carried-in state) are stored first
(:func:`engine.jit.materialize`): compiled on a GPU, a multiply-add would otherwise be
contracted into one rounding.

Padding masks and per-row lengths are not supported: Parley runs one stream (or
equal-length rows) per call.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from ..jit import materialize
from ..kernels.admission import custom_kernel, kernel_constants

if TYPE_CHECKING:
    from .llm import Mamba2Mixer

# Positions per chunk of the quadratic form; the quadratic work is O(chunk²) per head.
SCAN_CHUNK = 256


@mx.compile
def step_sizes(dt_raw: mx.array, dt_bias: mx.array, time_step_limit: tuple[float, float]) -> mx.array:
    """``clip(softplus(dt_raw + dt_bias), *time_step_limit)`` in float32, shape of ``dt_raw``."""
    positive = nn.softplus(dt_raw.astype(mx.float32) + dt_bias)
    return mx.clip(positive, time_step_limit[0], time_step_limit[1])


@partial(mx.compile, shapeless=True)
def silu_gate(gate: mx.array, values: mx.array) -> mx.array:
    """``silu(gate) * values`` (the gate of Mamba's output norm), compiled like the reference."""
    return nn.silu(gate) * values


def pairwise_log_decay(log_decay: mx.array) -> mx.array:
    """``out[..., i, j] = sum(log_decay[..., j+1 : i+1])`` for ``j <= i`` (0 on the diagonal).

    ``log_decay`` is (..., T); ``exp(out[..., i, j])`` is the decay from position ``j`` to
    position ``i``. Entries above the diagonal are meaningless; callers mask them away
    with ``tril`` after the ``exp``.
    """
    length = log_decay.shape[-1]
    # Row i of the square holds log_decay[i] in every column; zero on and above the diagonal.
    square = mx.repeat(log_decay[..., None], length, axis=-1)
    square = mx.tril(square, -1)
    return mx.cumsum(square, axis=-2)


def _scan_chunk(
    dt_x: mx.array,
    dt_a: mx.array,
    b_mat: mx.array,
    c_mat: mx.array,
    state: mx.array | None,
    out_dtype: mx.Dtype,
) -> tuple[mx.array, mx.array]:
    """One chunk of the quadratic form: outputs (b, s, h, p) without the D skip, and the next state."""
    heads, groups = dt_x.shape[2], c_mat.shape[2]
    heads_per_group = heads // groups

    b_by_group = mx.transpose(b_mat, (0, 2, 3, 1))  # (b, g, n, s)
    # Intra-chunk "attention": C_i · B_j per group, shared by the group's heads.
    scores = mx.swapaxes(c_mat, 1, 2) @ b_by_group  # (b, g, s, s)
    scores = mx.repeat(scores, heads_per_group, axis=1)  # (b, h, s, s)
    decay = mx.exp(pairwise_log_decay(mx.swapaxes(dt_a, 1, 2)))  # (b, h, s, s)
    causal = mx.tril(scores * decay, 0)
    outputs = mx.swapaxes(causal @ mx.swapaxes(dt_x, 1, 2), 1, 2)  # (b, s, h, p)

    # Final state: every position's dt·x ⊗ B, decayed to the end of the chunk.
    decay_to_end = decay[:, :, -1:, :].transpose(0, 3, 1, 2)  # (b, s, h, 1)
    b_by_head = mx.repeat(b_by_group, heads_per_group, axis=1).swapaxes(2, 3)  # (b, h, s, n)
    weighted = (dt_x * decay_to_end).swapaxes(1, 2).swapaxes(2, 3)  # (b, h, p, s)
    next_state = weighted @ b_by_head  # (b, h, p, n)

    if state is not None:
        decay_from_start = mx.exp(mx.cumsum(dt_a, axis=-2))  # (b, s, h)
        outputs, next_state = _carry_in(outputs, next_state, state, c_mat, decay_from_start)

    return outputs.astype(out_dtype), next_state


def _carry_in(
    outputs: mx.array, next_state: mx.array, state: mx.array, c_mat: mx.array, decay_from_start: mx.array
) -> tuple[mx.array, mx.array]:
    """Add the carried-in ``state``: it decays by the running product of exp(A dt) (``decay_from_start``,
    (b, s, h)) into the next state, and is read out by C into every position's output."""
    batch, steps, groups, state_size = c_mat.shape
    heads, head_dim = state.shape[1], state.shape[2]
    next_state = next_state + materialize(decay_from_start[:, -1, :, None, None] * state)
    c_column = c_mat.reshape(batch, steps, groups, 1, state_size, 1)
    grouped_state = state.reshape(batch, 1, groups, heads // groups, head_dim, state_size)
    carried = (grouped_state @ c_column).squeeze(-1).flatten(2, 3)  # (b, s, h, p)
    return outputs + materialize(decay_from_start[..., None] * carried), next_state


def _scan_single(
    dt_x: mx.array,
    dt_a: mx.array,
    b_mat: mx.array,
    c_mat: mx.array,
    state: mx.array | None,
    out_dtype: mx.Dtype,
) -> tuple[mx.array, mx.array]:
    """:func:`_scan_chunk` for one position, with the operations that cannot change a bit left out.

    For a single position the pairwise decay is ``exp(0) = 1`` and the causal masks keep
    everything, so multiplying by the decay and masking are identities, and the running
    decay ``exp(cumsum(dt·A))`` is ``exp(dt·A)``. Every matrix product stays a matrix
    product of the same shapes (a product over a length-1 axis is not rewritten as an
    elementwise one: a backend may round matrix-product inputs differently, e.g. TF32).
    """
    heads, groups = dt_x.shape[2], c_mat.shape[2]
    heads_per_group = heads // groups

    b_by_group = mx.transpose(b_mat, (0, 2, 3, 1))  # (b, g, n, 1)
    scores = mx.repeat(mx.swapaxes(c_mat, 1, 2) @ b_by_group, heads_per_group, axis=1)  # (b, h, 1, 1)
    outputs = mx.swapaxes(scores @ mx.swapaxes(dt_x, 1, 2), 1, 2)  # (b, 1, h, p)
    b_by_head = mx.repeat(b_by_group, heads_per_group, axis=1).swapaxes(2, 3)  # (b, h, 1, n)
    next_state = dt_x.swapaxes(1, 2).swapaxes(2, 3) @ b_by_head  # (b, h, p, n)
    if state is not None:
        outputs, next_state = _carry_in(outputs, next_state, state, c_mat, mx.exp(dt_a))
    return outputs.astype(out_dtype), next_state


def ssm_scan(
    x: mx.array,
    a_log: mx.array,
    b_mat: mx.array,
    c_mat: mx.array,
    skip: mx.array,
    dt_raw: mx.array,
    dt_bias: mx.array,
    state: mx.array | None,
    time_step_limit: tuple[float, float],
    chunk_size: int = SCAN_CHUNK,
) -> tuple[mx.array, mx.array]:
    """Run the selective scan over ``L`` positions; returns ``(y, final_state)``.

    Shapes: ``x`` (b, L, h, p); ``b_mat``/``c_mat`` (b, L, g, n); ``dt_raw`` (b, L, h);
    ``a_log``/``skip``/``dt_bias`` (h,); ``state`` (b, h, p, n) or ``None`` for a zero
    start. ``y`` has the dtype of ``x``; the state is float32 (``dt`` is float32).
    ``skip`` is expected in the dtype of ``x``.
    """
    batch, length, heads, _ = x.shape
    if length < 1:
        raise ValueError("ssm_scan needs at least one position")
    dt = step_sizes(dt_raw, dt_bias, time_step_limit)  # (b, L, h) float32
    # exp in the parameter's dtype, then widened: this rounding is part of the reference maths.
    rates = -mx.exp(a_log).astype(dt.dtype)
    dt_a = dt * rates.reshape(1, 1, -1)
    dt_x = dt.reshape(batch, length, heads, 1) * x

    if length == 1:
        outputs, next_state = _scan_single(dt_x, dt_a, b_mat, c_mat, state, x.dtype)
        return outputs + materialize(x * skip.reshape(1, 1, heads, 1)), next_state

    chunks: list[mx.array] = []
    carried = state
    for start in range(0, length, chunk_size):
        stop = start + chunk_size
        outputs, next_state = _scan_chunk(
            dt_x[:, start:stop], dt_a[:, start:stop], b_mat[:, start:stop], c_mat[:, start:stop], carried, x.dtype
        )
        chunks.append(outputs)
        carried = next_state
    y = mx.concatenate(chunks, axis=1) + materialize(x * skip.reshape(1, 1, heads, 1))
    return y, next_state


# --------------------------------------------------------------------------- fast numerics: one kernel per step


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


def fused_step_sample(mixer: Mamba2Mixer, seed: int = 1234) -> tuple[mx.array, ...]:
    """Random inputs of one mixer's step (a projection, an earlier convolution window and state) with the
    mixer's own convolution and parameters: for admitting the kernel, and for testing the fallback."""
    keys = mx.random.split(mx.random.key(seed), 3)
    heads, head_dim, conv_dim = mixer.num_heads, mixer.head_dim, mixer.conv_dim
    bias = getattr(mixer.conv1d, "bias", None)
    return (
        mx.random.normal((heads * head_dim + conv_dim + heads,), key=keys[0]),
        mx.random.normal((1, mixer.kernel_size - 1, conv_dim), key=keys[1]),
        mixer.conv1d.weight,
        mx.zeros((conv_dim,)) if bias is None else bias,
        mixer.dt_bias,
        mixer.A_log,
        mixer.D,
        0.1 * mx.random.normal((1, heads, head_dim, mixer.state_size), key=keys[2]),
        kernel_constants(mixer.dt_min, mixer.dt_max),
    )


class FusedStep:
    """The fused Mamba-2 step kernel for one layer shape, on CUDA or Metal (see :mod:`engine.numerics`):
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
