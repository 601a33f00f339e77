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
equal-length rows) per call. Fast mode's single-position step, one kernel, is
:mod:`engine.kernels.fused_step`.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ...jit import materialize

# Positions per chunk of the quadratic form; the quadratic work is O(chunk²) per head.
SCAN_CHUNK = 256


@mx.compile
def step_sizes(dt_raw: mx.array, dt_bias: mx.array, time_step_limit: tuple[float, float]) -> mx.array:
    """``clip(softplus(dt_raw + dt_bias), *time_step_limit)`` in float32, shape of ``dt_raw``."""
    positive: mx.array = nn.softplus(dt_raw.astype(mx.float32) + dt_bias)
    return mx.clip(positive, time_step_limit[0], time_step_limit[1])


@partial(mx.compile, shapeless=True)
def silu_gate(gate: mx.array, values: mx.array) -> mx.array:
    """``silu(gate) * values`` (the gate of Mamba's output norm), compiled like the reference."""
    gated: mx.array = nn.silu(gate) * values
    return gated


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
