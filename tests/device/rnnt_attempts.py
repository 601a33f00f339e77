"""The RN-T greedy attempt's kernels on this GPU: admission, drift, tokens against exact mode, time per frame.

Run on the device (never in CI; the CPU runs the operations): ``python3 tests/device/rnnt_attempts.py``.
Full-size prediction network and joint (640 units, two LSTM layers, 1,025 classes; the embedding and LSTM
weights in bf16 as the checkpoints store them, the joint float32 as exact mode precasts it), random weights.

1. Each part's kernel against its operations on the CPU, on ordinary random inputs: relative L2 of the
   outputs (the embedding step rounds its input product to bf16 like the reference, so a reordered sum that
   crosses a rounding boundary moves one gate by a bf16 step).
2. Frames of random encoder output through the unrolled loop of ten attempts, three ways in one process,
   alternating: exact mode's loop, fast mode's loop on rows (operations), fast mode's attempts as kernels
   (the loop in one launch where admitted, then also the attempt kernels one launch each: a fourth way).
   The symbols each gives, frame by frame, against exact's, and the median time per frame.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import time

import mlx.core as mx
from mlx.utils import tree_map

from engine.kernels.admission import gpu_kernel_backend, relative_l2
from engine.kernels.greedy_attempt import (
    JointRowShape,
    LSTMStep,
    LSTMStepShape,
    joint_row_ops,
    joint_row_samples,
    lstm_step_ops,
    lstm_step_samples,
)
from engine.loading.config import JointConfig, PredictorConfig
from engine.networks.rnnt import RNNTJoint, RNNTPredictor, make_rnnt_state, rnnt_propose
from engine.numerics import _attempt_parts

ATTEMPTS = 10
BLANK = 1024
LEAN = 2.5
FRAMES = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def modules() -> tuple[RNNTPredictor, RNNTJoint]:
    mx.random.seed(5)
    predictor = RNNTPredictor(PredictorConfig())
    predictor.update(tree_map(lambda array: array.astype(mx.bfloat16), predictor.parameters()))
    joint = RNNTJoint(JointConfig())
    # Lean towards blank, so that frames stop after a varying number of symbols (random weights emit at every
    # attempt otherwise) and the loop's choice of the last emission's state is exercised.
    output = joint.joint_net[-1]
    output.bias = output.bias + LEAN * (mx.arange(output.bias.shape[0]) == BLANK)
    mx.eval(predictor.parameters(), joint.parameters())
    return predictor, joint


def kernel_drift() -> None:
    """Each kernel on ordinary (not grid) inputs against its operations computed on the CPU."""
    from engine.kernels.greedy_attempt import JointRow

    backend = gpu_kernel_backend()
    if backend is None:
        print("no GPU kernels here: the operations run")
        return
    steps = [
        LSTMStepShape("zero", 640, 640),
        LSTMStepShape("embedding", 640, 640, partials=129, round_input=True),
        LSTMStepShape("row", 640, 640),
    ]
    for shape in steps:
        ordinary = LSTMStepShape(shape.input, 640, 640, shape.partials)  # normal values, not the admission's grid
        inputs = list(lstm_step_samples(ordinary, 1025, mx.bfloat16, mx.bfloat16, mx.bfloat16))
        got = LSTMStep(backend, shape)(*inputs)
        with mx.stream(mx.cpu):
            want = lstm_step_ops(*inputs, shape=shape)
            mx.eval(want)
        errors = [relative_l2(a, b) for a, b in zip(got, want, strict=True)]
        rounded = "rounded" if shape.round_input else "float32"
        print(f"LSTM step {shape.input:9s} ({rounded}) relative L2: hidden {errors[0]:.2e}, cell {errors[1]:.2e}")
    for shape in (JointRowShape(640, 640, "activation"), JointRowShape(640, 1025, "partials")):
        inputs = list(joint_row_samples(shape, mx.float32, mx.float32))
        got = JointRow(backend, shape)(*inputs)
        with mx.stream(mx.cpu):
            want = joint_row_ops(*inputs, shape=shape)
            mx.eval(want)
        got, want = (got,) if isinstance(got, mx.array) else got, (want,) if isinstance(want, mx.array) else want
        errors = [relative_l2(a, b) for a, b in zip(got, want, strict=True)]
        print(f"joint row {shape.epilogue:10s} relative L2 {', '.join(f'{e:.2e}' for e in errors)}")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kernel_drift()
    exact_predictor, joint = modules()
    fast_predictor, _ = modules()
    kernel_predictor, _ = modules()
    fast_predictor.fused_cell = kernel_predictor.fused_cell = True
    parts, every, looped = _attempt_parts(kernel_predictor, joint)
    kernel_predictor.use_attempt_parts(parts)
    print(f"every attempt part a kernel: {every}; the loop in one launch: {looped}")
    frames = 2.0 * mx.random.normal((FRAMES, 1, 1, 1024), key=mx.random.key(9))
    ways = {"exact": exact_predictor, "fast rows": fast_predictor, "fast kernels": kernel_predictor}
    if looped:  # the attempt kernels one launch each, beside the loop in one
        attempts_predictor, _ = modules()
        attempts_predictor.fused_cell = True
        attempts_predictor.use_attempt_parts(dataclasses.replace(parts, loop=None))
        ways["fast attempts"] = attempts_predictor
    states = {name: make_rnnt_state(BLANK) for name in ways}
    symbols: dict[str, list[list[int]]] = {name: [] for name in ways}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for index in range(frames.shape[0]):
        for name, predictor in ways.items():
            state = states[name]
            started = time.perf_counter()
            proposal = rnnt_propose(predictor, joint, state, frames[index], blank_id=BLANK, attempts=ATTEMPTS)
            mx.eval(proposal.symbols, proposal.last_token, *proposal.hidden)
            times[name].append(time.perf_counter() - started)
            emitted = proposal.symbols.tolist()
            symbols[name].append(emitted)
            kept = [symbol for symbol in emitted if symbol >= 0]
            if kept:
                state.last_token, state.hidden = kept[-1], proposal.hidden
        if looped and index < 20:  # the loop's state bit for bit the attempt kernels' (both carried the same)
            loop_state, attempts_state = states["fast kernels"].hidden, states["fast attempts"].hidden
            if loop_state is not None and attempts_state is not None:
                same = all(mx.array_equal(a, b).item() for a, b in zip(loop_state, attempts_state, strict=True))
                print(f"frame {index}: loop state equal to the attempt kernels': {same}")
    emitted_per_frame = statistics.mean(sum(s >= 0 for s in frame) for frame in symbols["exact"])
    print(f"{frames.shape[0]} frames, {emitted_per_frame:.1f} symbols a frame (exact), {ATTEMPTS} attempts unrolled")
    for name in ways:
        same = sum(a == b for a, b in zip(symbols[name], symbols["exact"], strict=True))
        first = next((i for i, (a, b) in enumerate(zip(symbols[name], symbols["exact"], strict=True)) if a != b), None)
        steady = times[name][10:] or times[name]  # past the first ten (warm-up), when there are more
        print(
            f"{name:13s} frames equal to exact {same}/{frames.shape[0]} (first difference: {first}); "
            f"median {statistics.median(steady) * 1e3:.3f} ms, mean {statistics.mean(steady) * 1e3:.3f} ms a frame"
        )


if __name__ == "__main__":
    main()
