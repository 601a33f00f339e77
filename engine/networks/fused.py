"""Fused projections: one matrix product where a layer applies several to the same input.

A GPU frame is bound by the number of kernels it launches. Where a layer multiplies one
input by several weights (the TTS backbone's q/k/v and gate/up, the MoG head's gate/up,
the Conformer's k/v), stacking the weights row-wise gives a single product whose output
columns are exactly the separate products — each output element is the same dot
product over the same input — so the split results are unchanged. The separate weights
are then re-pointed at slices of the stacked one, so nothing is stored twice.

The stacked weight is kept in a :class:`Stacked` holder, outside the module's parameter
tree: checkpoint loading and saving see the original per-projection weights.

Stacking is applied on the CPU only. There each output element of a product is the
same dot product whatever the number of rows (tested bit for bit against the reference).
A GPU library may choose a different algorithm for a taller matrix — on CUDA the
stacked products made the TTS codes drift from the reference's within a few frames —
so on a GPU the projections stay separate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


@dataclass(frozen=True)
class Stacked:
    """Row-stacked weights of several bias-free projections and where each one's outputs end."""

    weight: mx.array  # (sum of output sizes, input size)
    splits: tuple[int, ...]  # cumulative output sizes, without the last
    members: tuple[str, ...]  # the stacked projections' attribute names, in order
    transposed: mx.array  # weight.T, a view made once (see engine.networks.linear)

    def __call__(self, x: mx.array) -> list[mx.array]:
        # MLX's stub types ``mx.split`` as returning one array; it returns the list of parts.
        return mx.split(x @ self.transposed, list(self.splits), axis=-1)  # type: ignore[return-value]


def stack_projections(module: nn.Module, names: Sequence[str]) -> Stacked | None:
    """Stack the bias-free, unquantized projections ``names`` of ``module`` (one input); None when they cannot be."""
    layers = [getattr(module, name) for name in names]
    if any(not isinstance(layer, nn.Linear) or "bias" in layer for layer in layers):
        return None
    weights = [layer.weight for layer in layers]
    if len({w.dtype for w in weights}) != 1 or len({w.shape[1] for w in weights}) != 1:
        return None
    stacked = mx.concatenate(weights, axis=0)
    transposed = stacked.T
    mx.eval(stacked, transposed)
    offsets, start = [], 0
    for layer, weight in zip(layers, weights, strict=True):
        layer.weight = stacked[start : start + weight.shape[0]]
        start += weight.shape[0]
        offsets.append(start)
    return Stacked(stacked, tuple(offsets[:-1]), tuple(names), transposed)


def stacking_is_exact() -> bool:
    """Whether stacked products reproduce separate ones bit for bit on the default device (the CPU)."""
    return mx.default_device().type == mx.cpu


def fuse_projections(model: nn.Module) -> int:
    """Stack the projections that share an input throughout ``model`` where that is exact (the CPU);
    returns how many groups were fused. Projections already stacked are left as they are."""
    if not stacking_is_exact():
        return 0
    fused = 0
    for _, module in model.named_modules():
        fuse = getattr(module, "fuse_projections", None)
        if callable(fuse) and getattr(module, "stacked", None) is None:
            fused += fuse()
    return fused
