"""``mx.compile`` for the per-frame hot paths, with a switch for A/B measurement.

A frame is thousands of small operations; compiling the static-shape pieces of each
network (everything except the attention reads over caches that grow) fuses their
elementwise chains and removes most per-operation dispatch. Compiled functions
compute the same operations in the same order, so outputs are unchanged; the parity
tests run with compilation on, and ``PARLEY_COMPILE=0`` runs everything op by op
(``parley bench`` uses it to measure what compilation buys).

Compiled functions close over their module's weights, so they are created lazily,
after the weights are loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import mlx.core as mx

F = TypeVar("F", bound=Callable[..., Any])


def compile_enabled() -> bool:
    """False when ``PARLEY_COMPILE=0`` is set."""
    return os.environ.get("PARLEY_COMPILE", "1").strip() not in ("0", "false", "no", "off")


def jit(function: F, *, draws_random: bool = False) -> F:
    """Compile ``function`` (unless disabled); ``draws_random`` threads MLX's global RNG state through it."""
    if not compile_enabled():
        return function
    if draws_random:
        return mx.compile(function, inputs=mx.random.state, outputs=mx.random.state)  # type: ignore[return-value]
    return mx.compile(function)  # type: ignore[return-value]
