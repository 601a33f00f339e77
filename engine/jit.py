"""``mx.compile`` for the per-frame hot paths, with switches to measure and to verify it.

A frame is thousands of small operations; compiling the static-shape pieces of each
network fuses their elementwise chains and removes most per-operation dispatch.
Compiled functions compute the same operations in the same order, so outputs are
unchanged — with one condition on a GPU: a fused kernel must not hold a multiply whose
result an add or subtract consumes (``x * y + z``), because the GPU compiler contracts
that into one fused multiply-add, one rounding instead of the reference's two. Where a
program would, :func:`materialize` stores the product first, as the reference does.

``PARLEY_COMPILE``:

* ``1`` (default): compile;
* ``0``: run everything op by op (``parley bench`` uses it to measure what compiling buys);
* ``check``: run every compiled program *and* its op-by-op form on the same inputs and
  compare the outputs bit for bit (:func:`check_report`); slow, for verifying a device.

Compiled functions close over their module's weights, so they are created lazily,
after the weights are loaded.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import mlx.core as mx

F = TypeVar("F", bound=Callable[..., Any])


def _mode() -> str:
    value = os.environ.get("PARLEY_COMPILE", "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    return "check" if value == "check" else "on"


def compile_enabled() -> bool:
    """False when ``PARLEY_COMPILE=0`` is set."""
    return _mode() != "off"


def compile_checking() -> bool:
    """True when ``PARLEY_COMPILE=check`` is set."""
    return _mode() == "check"


def materialize(x: mx.array) -> mx.array:
    """``x`` itself, stored before its consumers run: compilation does not fuse across this point.

    Use it on a product that the next operation adds to (see the module docstring). It costs
    one operation that launches nothing (the array is already contiguous) and splits one
    fused kernel in two.
    """
    return mx.contiguous(x)


@dataclass
class ProgramCheck:
    """What ``PARLEY_COMPILE=check`` saw of one compiled program."""

    name: str
    calls: int = 0
    mismatches: int = 0
    max_abs_difference: float = 0.0


_CHECKS: dict[str, ProgramCheck] = {}


def check_report() -> list[ProgramCheck]:
    """Every program checked so far in this process, the mismatching ones first."""
    return sorted(_CHECKS.values(), key=lambda check: (-check.mismatches, check.name))


def _program_name(function: Callable[..., Any]) -> str:
    inner = function.func if isinstance(function, functools.partial) else function
    return getattr(inner, "__qualname__", repr(inner))


def _leaves(tree: Any) -> list[mx.array]:
    if isinstance(tree, mx.array):
        return [tree]
    if isinstance(tree, list | tuple):
        return [leaf for item in tree for leaf in _leaves(item)]
    return []


def _checked(function: F, compiled: Callable[..., Any], draws_random: bool) -> F:
    name = _program_name(function)
    check = _CHECKS.setdefault(name, ProgramCheck(name))

    def run_both(*args: Any, **kwargs: Any) -> Any:
        # Both runs see the same random draws (the stream differs from an unchecked run: this mode only verifies).
        seed = check.calls + 1
        if draws_random:
            mx.random.seed(seed)
        expected = function(*args, **kwargs)
        mx.eval(_leaves(expected))
        if draws_random:
            mx.random.seed(seed)
        result = compiled(*args, **kwargs)
        mx.eval(_leaves(result))
        check.calls += 1
        worst = 0.0
        for want, got in zip(_leaves(expected), _leaves(result), strict=True):
            if not mx.array_equal(want, got, equal_nan=True).item():
                difference = cast(float, mx.abs(want.astype(mx.float32) - got.astype(mx.float32)).max().item())
                worst = max(worst, float("inf") if difference != difference else difference)
        if worst > 0.0:
            check.mismatches += 1
            check.max_abs_difference = max(check.max_abs_difference, worst)
        return result

    return run_both  # type: ignore[return-value]


def jit(function: F, *, draws_random: bool = False) -> F:
    """Compile ``function`` (unless disabled); ``draws_random`` threads MLX's global RNG state through it."""
    mode = _mode()
    if mode == "off":
        return function
    if draws_random:
        compiled = mx.compile(function, inputs=mx.random.state, outputs=mx.random.state)
    else:
        compiled = mx.compile(function)
    if mode == "check":
        return _checked(function, compiled, draws_random)
    return compiled  # type: ignore[return-value]
