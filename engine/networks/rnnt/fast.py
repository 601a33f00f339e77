"""The RN-T's fast form: the streaming greedy loop with the LSTM cell update left to fuse, each attempt as the
parts of :mod:`engine.kernels.greedy_attempt` (one launch per LSTM layer and two for the joint, each the kernel
where admitted against its operations), and on CUDA a frame's attempts as one launch
(:class:`engine.kernels.greedy_attempt.GreedyLoop`).

:func:`rnnt_fast` builds it for a :class:`engine.kernels.plan.FastPlan`;
:meth:`engine.networks.rnnt.RNNTPredictor.use_numerics` keeps it in the predictor's one ``fast`` slot, which its
compiled greedy loops read (:func:`greedy_rows_by_attempt` runs the attempts through its parts).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ...kernels.admission import fast_part
from ...kernels.greedy_attempt import (
    AttemptParts,
    GreedyLoop,
    GreedyLoopShape,
    JointRow,
    LSTMStep,
    greedy_loop_ops,
    greedy_loop_samples,
    joint_row_ops,
    joint_row_samples,
    lstm_step_ops,
    lstm_step_samples,
)

if TYPE_CHECKING:
    from ...kernels.plan import FastPlan

# The RN-T's modules, named for the reader: this module imports nothing of engine.networks.rnnt.rnnt, which imports
# it (RNNTPredictor.use_numerics), so that the two make no import circle.
RNNTPredictor = Any  # engine.networks.rnnt.rnnt.RNNTPredictor
RNNTJoint = Any  # engine.networks.rnnt.rnnt.RNNTJoint
LSTMState = tuple[mx.array, mx.array]

# The environment variable that can turn off fast mode's RN-T loop in one launch
# (engine.kernels.greedy_attempt.GreedyLoop) on CUDA: "0" leaves the attempts one launch each. On by default since its
# barrier's counters sit on a ticket line (kernel_tickets): in an array of 8 bytes, which MLX keeps on the host, the
# loop took 20.3 ms a frame; on a line, 0.87 ms in isolation against its attempt kernels' 0.67, and whole frames level
# with them within noise on an H100 (tests/device/greedy_loop_probe.py and row_chains_ab.py, in git history), for 51
# primitives a frame fewer. Numerics reads it into FastPlan.rnnt_loop.
RNNT_LOOP_SETTING = "PARLEY_RNNT_LOOP"


def rnnt_loop_wanted() -> bool:
    """Whether fast mode builds the RN-T loop in one launch: unless :data:`RNNT_LOOP_SETTING` turns it off."""
    return os.environ.get(RNNT_LOOP_SETTING, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class RNNTFast:
    """Fast numerics' form of the RN-T's streaming loop: the cell update left to fuse (always), and ``parts`` to run
    each attempt as (None: the loop's operations, as on a GPU whose attempt kernels were not admitted)."""

    parts: AttemptParts | None = None


def rnnt_fast(
    predictor: RNNTPredictor, joint: RNNTJoint | None, plan: FastPlan | None
) -> tuple[RNNTFast | None, dict[str, bool]]:
    """The predictor's fast form for ``plan`` (None for exact mode) with ``joint`` (None: no attempt parts), and
    which of its parts run as kernels (``rnnt_attempts``, ``rnnt_loop``)."""
    if plan is None:
        return None, {}
    changes: dict[str, bool] = {}
    parts = None
    if joint is not None:
        parts, changes["rnnt_attempts"], changes["rnnt_loop"] = attempt_parts(predictor, joint, plan)
        if plan.on_gpu and not changes["rnnt_attempts"]:
            parts = None  # the compiled loop's operations (the CPU keeps the fallbacks, tested there)
    return RNNTFast(parts), changes


# One set of attempt parts per predictor layout and device, so that a model switched back and forth gets the
# same object again and its compiled greedy loops are reused (engine.networks.rnnt.GreedyPrograms keys them by it).
_ATTEMPT_PARTS: dict[tuple[Any, ...], tuple[Any, bool, bool]] = {}


def attempt_parts(predictor: RNNTPredictor, joint: RNNTJoint, plan: FastPlan) -> tuple[Any, bool, bool]:
    """One RN-T greedy attempt's parts (:mod:`engine.kernels.greedy_attempt`: each the kernel where admitted, else its
    operations), or None for a layout they do not take; the flags say whether every one is a kernel, and
    whether the parts run a frame's attempts as one launch (:class:`engine.kernels.greedy_attempt.GreedyLoop`, built
    where ``plan.rnnt_loop`` (:func:`rnnt_loop_wanted`) says so, admitted bit for bit against the attempt kernels, and
    only where all of them are kernels)."""
    lstm, table = predictor.prediction["dec_rnn"].lstm, predictor.prediction["embed"].weight
    output = joint.joint_net[-1]
    if any("bias" not in module for module in (*lstm, joint.pred, output)):
        return None, False, False
    weight_dtype, bias_dtype = lstm[0].Wx.dtype, lstm[0].bias.dtype
    dtypes = {table.dtype, *(array.dtype for layer in lstm for array in (layer.Wx, layer.Wh, layer.bias))}
    if not dtypes <= {mx.float32, mx.bfloat16} or len({(layer.Wx.dtype, layer.bias.dtype) for layer in lstm}) > 1:
        return None, False, False
    width = predictor.hidden_size
    # The reference multiplies a bf16 embedding row by bf16 weights in bf16: one rounding of the sum, kept.
    rounded = table.dtype == weight_dtype == bias_dtype == mx.bfloat16
    layout = GreedyLoopShape(
        width,
        len(lstm),
        table.shape[0],
        joint.pred.weight.shape[0],
        output.weight.shape[0],
        joint.activation_name,
        rounded,
    )
    steps, scores, hidden = layout.steps(), layout.scores(), layout.joint_row()
    types = (table.dtype, weight_dtype, bias_dtype, joint.pred.weight.dtype, output.weight.dtype)
    looping = plan.rnnt_loop
    key = (layout, types, plan.backend, looping)
    if key not in _ATTEMPT_PARTS:
        made: dict[str, Callable[..., Any]] = {}
        every = True
        for name, step in steps.items():
            made[name], used = fast_part(
                ("lstm_step", step, table.shape[0], types[:3]),
                f"RN-T {name} LSTM step",
                functools.partial(lstm_step_ops, shape=step),
                functools.partial(LSTMStep, shape=step),
                functools.partial(lstm_step_samples, step, table.shape[0], *types[:3]),
                reference_device=mx.cpu,
            )
            every = every and used
        for name, shape, weight in (("joint_hidden", hidden, joint.pred), ("joint_partials", scores, output)):
            made[name], used = fast_part(
                ("joint_row", shape, weight.weight.dtype, weight.bias.dtype),
                f"RN-T {name.replace('_', ' ')} row",
                functools.partial(joint_row_ops, shape=shape),
                functools.partial(JointRow, shape=shape),
                functools.partial(joint_row_samples, shape, weight.weight.dtype, weight.bias.dtype),
                reference_device=mx.cpu,
            )
            every = every and used
        parts = AttemptParts(**made, loop_shape=layout)
        looped = False
        if every and looping:  # the loop in one launch, against the attempt kernels it runs in turn
            projections = (joint.pred.weight, joint.pred.bias, output.weight, output.bias)
            loop, looped = fast_part(
                ("greedy_loop", layout, types, *(array.dtype for array in projections)),
                "RN-T greedy loop",
                functools.partial(greedy_loop_ops, parts, shape=layout),
                functools.partial(GreedyLoop, shape=layout),
                functools.partial(greedy_loop_samples, layout, *types[:3], *(a.dtype for a in projections)),
                tolerance=0.0,
            )
            if looped:
                parts = dataclasses.replace(parts, loop=loop)
        _ATTEMPT_PARTS[key] = (parts, every, looped)
    return _ATTEMPT_PARTS[key]


def greedy_rows_by_attempt(
    parts: AttemptParts,
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    encoded: mx.array,
    last: mx.array,
    hidden: LSTMState | None,
    *,
    started: bool,
    blank_id: int,
    max_symbols: int,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """:func:`engine.networks.rnnt.rnnt._greedy_rows` with each attempt as ``parts``
    (:mod:`engine.kernels.greedy_attempt`): one launch per LSTM layer and two for the joint, where that runs about 28
    operations an attempt — or, where the parts have the loop's kernel, every attempt in one launch.

    No attempt selects a state: one after an emission starts from that attempt's state, as it does in
    ``_greedy_rows``, and one after a blank is masked out here, whatever it computed. The first layer
    picks its token from the previous attempt's partial argmaxes (the frame's first attempt: from ``last``,
    as one pair); the end finishes every attempt's argmax at once and takes the state of the last emission.
    """
    lstm, embed = predictor.prediction["dec_rnn"].lstm, predictor.embedding_table
    if embed is None:
        embed = predictor.prediction["embed"].weight
    layers, width = len(lstm), predictor.hidden_size
    projected = joint.enc(encoded.reshape(1, -1))
    output = joint.joint_net[-1]
    if hidden is None:  # the start symbol's attempt reads no state; the end returns these only if none emitted
        zeros = mx.zeros((layers, 1, width))
        hidden = (zeros, zeros)
    weights = [array for layer in lstm for array in (layer.Wx, layer.Wh, layer.bias)]
    # The frame's incoming token as one partial pair, which the first attempt's first layer finishes.
    incoming = (embed, mx.zeros((1,)), last.reshape(1), *hidden, *weights)
    loop = parts.loop or functools.partial(greedy_loop_ops, parts, shape=parts.loop_shape)
    states_h, states_c, _, scores, candidates = loop(
        started, max_symbols, *incoming, joint.pred.weight, joint.pred.bias, projected, output.weight, output.bias
    )
    best = mx.take_along_axis(candidates, mx.argmax(scores, axis=1, keepdims=True), axis=1).reshape(-1)
    emitted = mx.cumsum((best == blank_id).astype(mx.int32)) == 0  # every attempt up to the first blank
    count = emitted.astype(mx.int32).sum(keepdims=True)
    new_last = mx.where(count > 0, mx.take(best, mx.maximum(count - 1, 0)), last.reshape(1))
    # The state after the last emission (index 0: the incoming state, kept when nothing was emitted).
    kept_h = mx.take(states_h, count, axis=0)
    kept_c = mx.take(states_c, count, axis=0)
    symbols = mx.where(emitted, best, -1)
    return symbols, new_last.reshape(1, 1), kept_h.reshape(layers, 1, width), kept_c.reshape(layers, 1, width)
