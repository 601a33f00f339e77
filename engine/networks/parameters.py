"""Typed access to a module's parameter leaves.

``mlx.utils.tree_flatten`` is typed to return a list or a dict (the dict only with a ``destination``), so each
caller would otherwise narrow it; this is the one place that does.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def parameter_leaves(module: nn.Module) -> list[tuple[str, mx.array]]:
    """``(dotted name, array)`` for every parameter of ``module`` (``tree_flatten(module.parameters())``)."""
    return cast(list[tuple[str, mx.array]], tree_flatten(module.parameters()))
