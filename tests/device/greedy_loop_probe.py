"""Where the RN-T loop's one launch spends its time, on the lent GPU (never in CI).

Run from the repository root: ``python3 tests/device/greedy_loop_probe.py [ncu]``. Full-size prediction network
and joint (as ``rnnt_attempts.py`` builds them), the loop's admission inputs, ten attempts:

- the loop kernel (:class:`engine.kernels.greedy_attempt.GreedyLoop`) at 1 and 10 attempts;
- the attempt kernels one launch each (:func:`engine.kernels.greedy_attempt.greedy_loop_ops`), compiled as fast mode
  runs them, at 1 and 10 attempts;
- a kernel of the loop's grid that only meets at the loop's barrier as often as ten attempts do (the barrier's
  share), with its counters on a ticket line and in an array of 8 bytes (which MLX keeps on the host: how the
  loop kept them when it measured 20.3 ms a frame);
- the loop's source with its ``volatile`` reads of the rows other blocks wrote read through ``__ldcg`` (past L1,
  as the barrier needs, without ``volatile``'s one load at a time), against the loop bit for bit. (With plain
  reads, on an H100 its first launch finished but 50 more did not within the step's four minutes: a read the
  compiler may keep in a register or L1 can wait on a value another block has long since written.)

Each is the mean of 50 launches, each waited for (``fast_kernels.per_call_us``). With ``ncu``: only a few
loop launches, for Nsight Compute.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from fast_kernels import per_call_us  # sibling scripts
from rnnt_attempts import modules

from engine.kernels import greedy_attempt
from engine.kernels.admission import custom_kernel, gpu_kernel_backend, kernel_tickets
from engine.kernels.greedy_attempt import WARPS, GreedyLoop, greedy_loop_ops, greedy_loop_samples
from engine.kernels.source import GRID_BARRIER_CUDA, GRID_BARRIER_STATE_CUDA
from engine.numerics import _attempt_parts

ATTEMPTS = 10
CALLS = 50


def per_call_ms(function: Callable[..., Any], *inputs: Any) -> float:
    return per_call_us(function, inputs, CALLS) / 1e3


def loop_with(rewrite: Callable[[str], str], shape: greedy_attempt.GreedyLoopShape) -> GreedyLoop:
    """A :class:`GreedyLoop` whose source is ``rewrite`` of this build's."""
    original = greedy_attempt._loop_source
    greedy_attempt._loop_source = lambda layout: rewrite(original(layout))
    try:
        return GreedyLoop("cuda", shape)
    finally:
        greedy_attempt._loop_source = original


def main() -> None:
    if gpu_kernel_backend() != "cuda":
        print("no CUDA kernels here")
        return
    predictor, joint = modules()
    predictor.fused_cell = True
    parts, every, looped = _attempt_parts(predictor, joint)
    print(f"every attempt part a kernel: {every}; the loop admitted: {looped}", flush=True)
    shape = parts.loop_shape
    projections = (joint.pred.weight, joint.pred.bias, joint.joint_net[-1].weight, joint.joint_net[-1].bias)
    lstm = predictor.prediction["dec_rnn"].lstm
    dtypes = (predictor.prediction["embed"].weight.dtype, lstm[0].Wx.dtype, lstm[0].bias.dtype)
    _, _, *arrays = greedy_loop_samples(shape, *dtypes, *(array.dtype for array in projections))[0]
    loop = GreedyLoop("cuda", shape)
    blocks = -(-max(shape.hidden, shape.joint) // WARPS)
    print(f"loop: {blocks} blocks of {WARPS * 32} threads, {shape.layers} layers, {shape.classes} classes", flush=True)
    if sys.argv[1:] == ["ncu"]:
        for _ in range(6):
            mx.eval(loop(True, ATTEMPTS, *arrays))
        return

    apart = functools.partial(greedy_loop_ops, parts, shape=shape)
    compiled = {attempts: mx.compile(functools.partial(apart, True, attempts)) for attempts in (1, ATTEMPTS)}
    for attempts in (1, ATTEMPTS):
        print(f"loop kernel, {attempts:2d} attempts: {per_call_ms(loop, True, attempts, *arrays):.3f} ms")
        print(f"attempt kernels, {attempts:2d} attempts: {per_call_ms(compiled[attempts], *arrays):.3f} ms")
    reference = loop(True, ATTEMPTS, *arrays)

    barriers = (shape.layers + 2) * ATTEMPTS - 1
    only_barriers = custom_kernel(
        "cuda",
        "parley_probe_barriers",
        ["x", "tickets"],
        ["y"],
        cuda=f"""
    const int local = threadIdx.x;
    {GRID_BARRIER_STATE_CUDA}
    for (int i = 0; i < {barriers}; ++i) {{
        {GRID_BARRIER_CUDA}
    }}
    if (blockIdx.x == 0 && local == 0) y[0] = x[0];
""",
        metal="",
    )
    one = mx.ones((1,))
    # The counters on a ticket line, as the loop keeps them now, and in an array of 8 bytes, as it kept them before
    # (MLX serves those from a pool on the host).
    for where, tickets in (("a ticket line", kernel_tickets()), ("8 bytes", mx.zeros((2,), dtype=mx.int32))):

        def barrier_launch(tickets: mx.array = tickets) -> mx.array:
            return only_barriers(
                inputs=[one, tickets],
                grid=(blocks * WARPS * 32, 1, 1),
                threadgroup=(WARPS * 32, 1, 1),
                output_shapes=[(1,)],
                output_dtypes=[mx.float32],
            )[0]

        print(f"{barriers} barriers alone, {blocks} blocks, counters on {where}: {per_call_ms(barrier_launch):.3f} ms")

    rewrites = {
        "__ldcg reads": lambda source: (
            source.replace("const volatile float*", "const float*")
            .replace("const volatile int*", "const int*")
            .replace("x[k] *", "__ldcg(x + k) *")
            .replace("const float v = hidden[k];", "const float v = __ldcg(hidden + k);")
        ),
    }
    for name, rewrite in rewrites.items():
        try:
            variant = loop_with(rewrite, shape)
            outputs = variant(True, ATTEMPTS, *arrays)
            same = all(mx.array_equal(a, b).item() for a, b in zip(outputs, reference, strict=True))
            timed = per_call_ms(variant, True, ATTEMPTS, *arrays)
            print(f"loop kernel, {name}: {timed:.3f} ms; equal to the loop: {same}")
        except Exception as exc:  # noqa: BLE001 - a probe variant that does not build is reported, not fatal
            print(f"loop kernel, {name}: failed ({exc})")


if __name__ == "__main__":
    main()
