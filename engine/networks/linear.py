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

Fast numerics' row-product kernels (:mod:`engine.kernels.row_product`) read some weights in bf16: a module
whose weight was precast to float32 then keeps a bf16 copy (:meth:`KeepsCopy.weight_in`, made once
and kept like the view; the census names it ``<parameter>%``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..kernels.admission import fast_part
from ..kernels.plan import FastPlan
from ..kernels.quantized_product import (
    QuantizedRowProduct,
    QuantizedRowShape,
    RowRole,
    quantized_row_ops,
    quantized_row_samples,
)
from ..weight_names import COPY_MARK, TRANSPOSE_MARK

TRANSPOSED = f"weight{TRANSPOSE_MARK}"  # the view's name in engine.counters: the whole weight, read transposed
COPIED = f"weight{COPY_MARK}"  # the copy's name there: the whole weight, in the copy's dtype


@dataclass(frozen=True)
class TransposedWeight:
    """``source.T``, evaluated once (a view sharing ``source``'s memory)."""

    source: mx.array
    view: mx.array


@dataclass(frozen=True)
class WeightCopy:
    """``source`` in another dtype, made once (a bf16 copy of a precast float32 weight)."""

    source: mx.array
    copy: mx.array


class KeepsCopy:
    """A module (with a ``weight``) that hands fast numerics its weight in another dtype, copied once."""

    copied: WeightCopy | None = None  # an instance attribute once set, outside the parameters

    def weight_in(self, dtype: mx.Dtype | None) -> mx.array:
        """The weight in ``dtype`` (itself for None or its own dtype): a copy made once and kept while the
        weight is current (outside any compiled function)."""
        weight: mx.array = self["weight"]  # type: ignore[index]
        if dtype is None or weight.dtype == dtype:
            return weight
        held = self.copied
        if held is None or held.source is not weight or held.copy.dtype != dtype:
            held = WeightCopy(weight, weight.astype(dtype))
            mx.eval(held.copy)
            self.copied = held
        return held.copy

    def forget_copy(self) -> None:
        """Let the copy go (exact mode reads none)."""
        self.copied = None

    def copy_views(self) -> dict[str, mx.array]:
        """The current copy, named for :func:`engine.counters.named_weights`."""
        held = self.copied
        return {COPIED: held.copy} if held is not None and held.source is self["weight"] else {}  # type: ignore[index]


class Linear(KeepsCopy, nn.Linear):
    """``nn.Linear`` (same parameters, same arithmetic) that reuses a prepared ``weight.T``."""

    transposed: TransposedWeight | None = None  # an instance attribute once set, outside the parameters

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

    def to_quantized(
        self, group_size: int | None = None, bits: int | None = None, mode: str = "affine", quantize_input: bool = False
    ) -> nn.Module:
        """What ``nn.quantize`` puts in this projection's place: :class:`QuantizedLinear` (the same as MLX's)."""
        if quantize_input:
            generic: nn.Module = super().to_quantized(group_size, bits, mode, quantize_input)
            return generic
        # MLX's from_linear defaults group_size and bits to None (its signature leaves the Optional implicit).
        quantized: nn.Module = QuantizedLinear.from_linear(self, group_size, bits, mode)  # type: ignore[arg-type]
        return quantized

    def weight_views(self) -> dict[str, mx.array]:
        """The prepared view and the copy, named for :func:`engine.counters.named_weights`."""
        views = self.copy_views()
        prepared = self.transposed
        if prepared is not None and prepared.source is self["weight"]:
            views[TRANSPOSED] = prepared.view
        return views


class QuantizedLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` (same parameters, same arithmetic); fast numerics may give it a kernel for a
    single float32 row (:mod:`engine.kernels.quantized_product`), called with the row in its own shape (no views:
    each costs host time) and the packed weight, scales and biases.

    Inside one of the LLM's blocks fast numerics also gives it ``fused_row``: the same product with the
    block's residual add (or the MLP's squared ReLU) after it, and the Mamba mixer's gated norm before it, which the
    block calls through :meth:`fused`; a block's last projection also gets ``chained_row``, which writes the
    next block's norm of the block's output too (:meth:`chained`)."""

    # Instance attributes once set, outside the parameters.
    fast_row: Callable[..., mx.array] | None = None
    fused_row: Callable[..., mx.array] | None = None
    chained_row: Callable[..., tuple[mx.array, mx.array]] | None = None

    def use_numerics(self, plan: FastPlan | None) -> bool:
        """Take the one-row product for ``plan`` (None: exact mode, none), and no block's fused or chained rows
        (the block that owns this projection gives those); True where the product is a kernel."""
        self.fast_row, used = quantized_row_part(self) if plan is not None else (None, False)
        self.fused_row = None
        self.chained_row = None
        return used

    def __call__(self, x: mx.array) -> mx.array:
        fast = self.fast_row
        if fast is None or x.dtype != mx.float32 or x.size != x.shape[-1]:
            product: mx.array = super().__call__(x)
            return product
        y: mx.array = fast(x, self["weight"], self["scales"], self["biases"])
        return y + self["bias"] if "bias" in self else y

    def fused(
        self, x: mx.array, base: mx.array | None = None, norm: tuple[mx.array, mx.array, mx.array] | None = None
    ) -> mx.array:
        """One float32 row through ``fused_row`` (given only to projections without a bias), added to ``base``
        where the part adds a residual; ``norm`` (partial sums of squares, weight, eps) where it finishes a
        group norm of ``x``."""
        assert self.fused_row is not None
        return self.fused_row(x, self["weight"], self["scales"], self["biases"], base, *(norm or ()))

    def chained(
        self,
        x: mx.array,
        base: mx.array,
        next_weight: mx.array,
        norm: tuple[mx.array, mx.array, mx.array] | None = None,
    ) -> tuple[mx.array, mx.array]:
        """:meth:`fused` with the residual added to ``base``, and that sum through the next block's RMS norm
        (weight ``next_weight``) from the same launch: the block's output and the next block's input."""
        assert self.chained_row is not None
        squares, norm_weight, norm_params = norm or (None, None, None)
        weight, scales, biases = self["weight"], self["scales"], self["biases"]
        return self.chained_row(x, weight, scales, biases, base, squares, norm_weight, norm_params, next_weight)


def quantized_row_part(
    module: QuantizedLinear,
    role: RowRole | None = None,
    norm_dtype: mx.Dtype | None = None,
    next_dtype: mx.Dtype | None = None,
) -> tuple[Callable[..., Any] | None, bool]:
    """The one-row product for an affine-quantized projection (:mod:`engine.kernels.quantized_product`), plain or in
    the ``role`` of its place in a block (a group norm's weight in ``norm_dtype``, the next block's norm weight
    in ``next_dtype``): the kernel where admitted, else MLX's own operations (the fallback; None for a layout
    the kernel does not read)."""
    role = role or RowRole()
    if module.mode != "affine" or module.get("biases") is None or module.bits not in (4, 8):
        return None, False
    outputs, words = module.weight.shape
    try:
        shape = QuantizedRowShape(words * 32 // module.bits, outputs, module.bits, module.group_size, role)
    except ValueError:
        return None, False
    scale_dtype = module.scales.dtype
    parts = "".join(f" {part}" for part in (role.prologue, role.epilogue) if part != "none")
    return fast_part(
        ("quantized_row", shape, scale_dtype, norm_dtype, next_dtype),
        f"{shape.bits}-bit {shape.width}→{shape.outputs}{parts} row product",
        functools.partial(quantized_row_ops, group_size=shape.group_size, bits=shape.bits, role=role),
        functools.partial(QuantizedRowProduct, shape=shape),
        functools.partial(
            quantized_row_samples, shape, scale_dtype, norm_dtype or mx.float32, next_dtype or mx.float32
        ),
    )


def prepare_transposed_weights(model: nn.Module) -> int:
    """Prepare every dense :class:`Linear` of ``model`` (quantized ones have no transpose); returns how many."""
    layers = [module for _, module in model.named_modules() if isinstance(module, Linear)]
    for layer in layers:
        layer.prepare()
    return len(layers)
