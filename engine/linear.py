"""Dense projections that multiply by a transposed weight made once at load.

``nn.Linear`` computes ``x @ weight.T``: a Transpose primitive in every call's graph, about
370 of them per frame, each scheduled and dispatched by the host like any other operation.
A transpose is a view (the same buffer with its strides swapped), so the view can be made
once and reused: every product then receives exactly the array the per-call transpose gave
it — same buffer, same strides, so the same kernel and the same output bits — and the frame
has one primitive fewer per projection.

The view is remembered together with the weight it was made from: when a weight is replaced
(a precast, a reload), the stale view is ignored and the projection transposes per call
until :func:`prepare_transposed_weights` runs again. Correctness never depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .counters import TRANSPOSE_MARK

TRANSPOSED = f"weight{TRANSPOSE_MARK}"  # the view's name in engine.counters: the whole weight, read transposed


@dataclass(frozen=True)
class TransposedWeight:
    """``source.T``, evaluated once (a view sharing ``source``'s memory)."""

    source: mx.array
    view: mx.array


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same arithmetic) that reuses a prepared ``weight.T``."""

    transposed: TransposedWeight | None = None  # an instance attribute once prepared, outside the parameters

    def prepare(self) -> None:
        """Make the transposed view of the current weight (outside any compiled function)."""
        weight = self["weight"]
        view = weight.T
        mx.eval(view)
        self.transposed = TransposedWeight(weight, view)

    def weight_t(self) -> mx.array:
        """``weight.T``: the prepared view while it belongs to the current weight."""
        weight = self["weight"]
        prepared = self.transposed
        return prepared.view if prepared is not None and prepared.source is weight else weight.T

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" in self:
            return mx.addmm(self["bias"], x, self.weight_t())
        return x @ self.weight_t()

    def weight_views(self) -> dict[str, mx.array]:
        """The prepared view, named for :func:`engine.counters.named_weights`."""
        prepared = self.transposed
        return {TRANSPOSED: prepared.view} if prepared is not None and prepared.source is self["weight"] else {}


def prepare_transposed_weights(model: nn.Module) -> int:
    """Prepare every dense :class:`Linear` of ``model`` (quantized ones have no transpose); returns how many."""
    layers = [module for _, module in model.named_modules() if isinstance(module, Linear)]
    for layer in layers:
        layer.prepare()
    return len(layers)
