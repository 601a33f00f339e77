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

Fast numerics only (:mod:`engine.numerics`): a bf16 weight meeting float32 activations is
read directly by :class:`Bf16Product`, one kernel that widens each weight as it reads it and
accumulates in float32, instead of a float32 copy of the weight (made per call, or once at
load as :mod:`engine.precast` does for exact mode). Half the weight bytes per frame, and no
copies in memory; the sums run in the kernel's own order, which is the numerics change.
"""

from __future__ import annotations

from collections.abc import Callable
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
    # Fast numerics: float32 rows times a bf16 weight through this product (see Bf16Product), or None.
    bf16_product: Callable[[mx.array, mx.array], mx.array] | None = None

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
        weight = self["weight"]
        if self.bf16_product is not None and weight.dtype == mx.bfloat16 and x.dtype == mx.float32:
            rows = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
            y = self.bf16_product(rows, weight)
            if x.ndim != 2:
                y = y.reshape(*x.shape[:-1], y.shape[-1])
            return y + self["bias"] if "bias" in self else y
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


def use_bf16_product(model: nn.Module, product: Callable[[mx.array, mx.array], mx.array] | None) -> int:
    """Route every :class:`Linear` of ``model`` through ``product`` (None: back to MLX's); returns how many."""
    layers = [module for _, module in model.named_modules() if isinstance(module, Linear)]
    for layer in layers:
        layer.bf16_product = product
    return len(layers)


# --------------------------------------------------------------------------- fast numerics: bf16 weights read directly


def bf16_product_ops(x: mx.array, weight: mx.array) -> mx.array:
    """``x @ weight.T`` with the bf16 ``weight`` widened to float32 first: MLX's own arithmetic, the fallback."""
    return x @ weight.astype(mx.float32).T


# One warp (simdgroup) per output column: its lanes stride over the weight's row, each widening
# the bf16 values it reads, for four input rows at a time; the lanes' sums are then reduced.
_PRODUCT_CUDA = """
    const int M = x_shape[0];
    const int K = x_shape[1];
    const int N = weight_shape[0];
    const int column = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (column >= N) {
        return;  // the whole warp: a warp never spans two columns
    }
    // The weight is read in pairs (K is even); the rows, small and shared by every warp, one by one.
    const __nv_bfloat162* w = reinterpret_cast<const __nv_bfloat162*>(weight) + static_cast<size_t>(column) * (K / 2);
    for (int m = 0; m < M; m += 4) {
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = lane; k < K / 2; k += 32) {
            const float2 wk = __bfloat1622float2(w[k]);
            for (int r = 0; r < 4; ++r) {
                if (m + r < M) {
                    const float* row = x + static_cast<size_t>(m + r) * K + 2 * k;
                    sum[r] += row[0] * wk.x + row[1] * wk.y;
                }
            }
        }
        for (int r = 0; r < 4; ++r) {
            float total = sum[r];
            for (int offset = 16; offset > 0; offset /= 2) {
                total += __shfl_down_sync(0xffffffff, total, offset);
            }
            if (lane == 0 && m + r < M) {
                y[static_cast<size_t>(m + r) * N + column] = total;
            }
        }
    }
"""

_PRODUCT_METAL = """
    const int M = x_shape[0];
    const int K = x_shape[1];
    const int N = weight_shape[0];
    const int column = thread_position_in_grid.x / 32;
    const uint lane = thread_index_in_simdgroup;
    if (column >= N) {
        return;  // the whole simdgroup: it never spans two columns
    }
    const size_t base = static_cast<size_t>(column) * K;
    for (int m = 0; m < M; m += 4) {
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = lane; k < K; k += 32) {
            const float wk = static_cast<float>(weight[base + k]);
            for (int r = 0; r < 4; ++r) {
                if (m + r < M) {
                    sum[r] += x[static_cast<size_t>(m + r) * K + k] * wk;
                }
            }
        }
        for (int r = 0; r < 4; ++r) {
            const float total = metal::simd_sum(sum[r]);
            if (lane == 0 && m + r < M) {
                y[static_cast<size_t>(m + r) * N + column] = total;
            }
        }
    }
"""


class Bf16Product:
    """``x @ weight.T`` for float32 rows ``x`` (M, K) and a bf16 ``weight`` (N, K), reading the weight as stored."""

    def __init__(self, backend: str) -> None:
        if backend == "cuda":
            self._kernel = mx.fast.cuda_kernel(
                name="parley_bf16_product", input_names=["x", "weight"], output_names=["y"], source=_PRODUCT_CUDA
            )
        elif backend == "metal":
            self._kernel = mx.fast.metal_kernel(
                name="parley_bf16_product", input_names=["x", "weight"], output_names=["y"], source=_PRODUCT_METAL
            )
        else:
            raise ValueError(f"no bf16 product kernel for {backend!r}")

    def __call__(self, x: mx.array, weight: mx.array) -> mx.array:
        columns, depth = weight.shape
        if x.ndim != 2 or x.shape[1] != depth or depth % 2:
            return bf16_product_ops(x, weight)  # shapes the kernel does not take (an odd depth: no paired loads)
        (y,) = self._kernel(
            inputs=[x, weight],
            grid=(columns * 32, 1, 1),
            threadgroup=(128 if columns % 4 == 0 else 32, 1, 1),
            output_shapes=[(x.shape[0], columns)],
            output_dtypes=[mx.float32],
        )
        return y


def product_sample() -> tuple[mx.array, mx.array]:
    """Inputs for admitting :class:`Bf16Product`: five rows (a partial block of four) against 200 columns."""
    keys = mx.random.split(mx.random.key(2024), 2)
    x = mx.random.normal((5, 1024), key=keys[0])
    weight = (0.05 * mx.random.normal((200, 1024), key=keys[1])).astype(mx.bfloat16)
    return x, weight
