"""EAR-TTS's mixture-of-Gaussians head: the latent a MaskGIT round draws from the guided features.

Fast numerics' row products and draw (:mod:`.fast`) are kept in the head's ``rows`` and ``sample_weights``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import mlx.nn as nn

from ...kernels.mixture_sample import gaussian_of, low_rank_mean
from ...loading.config import MoGConfig
from ...ops.sampling import draw_component, draw_latent_noise, gaussian_latent, guide
from ...weight_names import GATHER_MARK
from ..fused import Stacked, stack_projections
from ..linear import Linear
from .backbone import LayerRowsPending
from .subword import FloatRMSNorm, GeluGatedMLP

# --------------------------------------------------------------------------- MoG head


@dataclass(frozen=True)
class MixtureRowParts:
    """The MoG head's MLP layers for ``rows`` rows as :class:`engine.kernels.row_product.RowProduct` kernels or
    :func:`engine.kernels.row_product.row_product_ops` (same call signature)."""

    rows: int
    first_gate_up: Callable[..., tuple[mx.array, ...]]  # pre-norm, gelu(gate)·up (the first layer)
    gate_up: Callable[..., tuple[mx.array, ...]]  # the previous layer's post-norm and add, pre-norm, gelu(gate)·up
    down: Callable[..., tuple[mx.array, ...]]  # down_proj
    # The draw after the layers, for the model's sampling constants (guidance, top-p, noise scale); None keeps
    # the head's operations: the last post-norm and add, the final norm, the guidance and the three
    # projections as one guided row product, then engine.kernels.mixture_sample's kernel.
    sampling: tuple[float, float, float] | None = None
    projections: Callable[..., tuple[mx.array, ...]] | None = None
    sample: Callable[..., mx.array] | None = None


@dataclass(frozen=True)
class MixtureSampleWeights:
    """What :attr:`MixtureRowParts.projections` and :attr:`MixtureRowParts.sample` read of the head."""

    projections: tuple[mx.array, mx.array, mx.array]  # proj_logits, proj_else, proj_logs
    final_scale: mx.array  # the final norm's float32 1 + w
    mus: mx.array  # proj_mus.weight as one row per component (K, R·H): the kernel reads the drawn one's
    low_mat: mx.array  # low_mat likewise (K, L·R)


@dataclass(frozen=True)
class MixtureRowWeights:
    """What :class:`MixtureRowParts` read of one MoG layer."""

    gate_up: tuple[mx.array, mx.array]
    down: mx.array
    pre_scale: mx.array
    post_scale: mx.array


class MixtureLayer(nn.Module):
    """Residual MLP block of the MoG head."""

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float) -> None:
        super().__init__()
        self.pre_norm = FloatRMSNorm(hidden_size, eps)
        self.mlp = GeluGatedMLP(hidden_size, intermediate_size)
        self.post_norm = FloatRMSNorm(hidden_size, eps)
        self.row_weights: MixtureRowWeights | None = None  # fast numerics (MixtureHead.rows)

    def projection_layers(self) -> tuple[Linear, ...]:
        """The MLP's projections: gate, up, down."""
        return self.mlp.gate_proj, self.mlp.up_proj, self.mlp.down_proj

    def make_row_weights(self, weight_dtype: mx.Dtype | None) -> MixtureRowWeights:
        """The weights the row parts read: the projections (as ``weight_dtype`` copies when given, made
        once, see :meth:`engine.networks.linear.KeepsCopy.weight_in`) and the norms' float32 ``1 + w``."""
        gate, up, down = (linear.weight_in(weight_dtype) for linear in self.projection_layers())
        made = MixtureRowWeights(
            gate_up=(gate, up),
            down=down,
            pre_scale=1.0 + self.pre_norm.weight.astype(mx.float32),
            post_scale=1.0 + self.post_norm.weight.astype(mx.float32),
        )
        mx.eval(made.gate_up, made.down, made.pre_scale, made.post_scale)
        return made

    def __call__(self, x: mx.array) -> mx.array:
        return x + self.post_norm(self.mlp(self.pre_norm(x)))


class MixtureHead(nn.Module):
    """Mixture-of-Gaussians over the codec latent with low-rank component means."""

    def __init__(self, hidden_size: int, latent_size: int, config: MoGConfig) -> None:
        super().__init__()
        self.latent_size = latent_size
        self.num_components = config.num_predictions
        self.low_rank = config.low_rank
        self.min_log_std = config.min_log_std
        self.mlp_stack = [
            *(MixtureLayer(hidden_size, config.intermediate_size, config.eps) for _ in range(config.num_layers)),
            FloatRMSNorm(hidden_size, config.eps),
        ]
        self.proj_logits = Linear(hidden_size, config.num_predictions, bias=False)
        self.proj_mus = Linear(hidden_size, config.num_predictions * config.low_rank, bias=False)
        self.proj_logs = Linear(hidden_size, 1, bias=False)
        self.proj_else = Linear(hidden_size, latent_size, bias=False)
        self.low_mat = mx.zeros((config.num_predictions, latent_size, config.low_rank))
        self.stacked: Stacked | None = None  # proj_logits, proj_else and proj_logs in one product
        # Fast numerics: the MLP layers as row-product calls (each layer's row_weights say what they read), and
        # the draw after them (what sample_weights say).
        self.rows: MixtureRowParts | None = None
        self.sample_weights: MixtureSampleWeights | None = None

    def mixture_layers(self) -> list[MixtureLayer]:
        """The MLP stack's layers, without its final norm."""
        return cast(list[MixtureLayer], self.mlp_stack[:-1])

    def make_sample_weights(self) -> MixtureSampleWeights:
        """What fast numerics' draw reads: the projections as they are, the final norm's ``1 + w`` in float32."""
        final_norm = self.mlp_stack[-1]
        final_scale = 1.0 + final_norm.weight.astype(mx.float32)
        mx.eval(final_scale)
        projections = (self.proj_logits.weight, self.proj_else.weight, self.proj_logs.weight)
        tables = (self.proj_mus.weight.reshape(self.num_components, -1), self.low_mat.reshape(self.num_components, -1))
        mx.eval(*tables)  # views of the weights (no copies), made once: the census names them
        return MixtureSampleWeights(projections, final_scale, *tables)

    def weight_views(self) -> dict[str, mx.array]:
        """The tables fast numerics' draw gathers a component's rows of (named for the census,
        :func:`engine.counters.named_weights`)."""
        weights = self.sample_weights
        if weights is None:
            return {}
        return {f"proj_mus.weight{GATHER_MARK}": weights.mus, f"low_mat{GATHER_MARK}": weights.low_mat}

    def table_rows(self) -> dict[str, int]:
        """Rows of the tables :meth:`weight_views` names (one per component), for pricing them at full size."""
        return dict.fromkeys((f"proj_mus.weight{GATHER_MARK}", f"low_mat{GATHER_MARK}"), self.num_components)

    def sample_latent(
        self,
        x: mx.array,
        guidance_scale: float,
        top_p: float,
        noise_scale: float,
        draws: tuple[mx.array, mx.array] | None = None,
    ) -> mx.array:
        """The latent a MaskGIT round draws from guided features ``x``: :meth:`sample_gaussian`, then the latent
        noise (engine.ops.sampling's two draws, in order; ``draws``, when given, are those two made already).
        Fast numerics' rows run the layers and the draw as kernels where the head's parts are the kernels'
        (:class:`MixtureRowParts`)."""
        rows, weights = self.rows, self.sample_weights
        uniform: mx.array | None = None
        noise: mx.array | None = None
        if draws is not None:
            uniform, noise = draws
        if (
            rows is not None
            and rows.projections is not None
            and rows.sample is not None
            and weights is not None
            and rows.sampling == (guidance_scale, top_p, noise_scale)
            and x.ndim == 2
            and x.shape[0] == rows.rows
            and x.dtype == mx.float32
        ):
            hidden, pending = self._layers_rows_pending(rows, self.mixture_layers(), x)
            assert pending is not None
            logits, residual, log_std, summed = rows.projections(
                hidden, weights.projections, weights.final_scale, pending.output, pending.scale
            )
            if uniform is None or noise is None:
                uniform = mx.random.uniform(shape=logits.shape)
                noise = draw_latent_noise(residual.shape)
            return rows.sample(
                logits, residual, log_std, summed, weights.final_scale, uniform, noise, weights.mus, weights.low_mat
            )
        mean, log_std = self.sample_gaussian(x, guidance_scale, top_p, uniform)
        return gaussian_latent(mean, log_std, draw_latent_noise(mean.shape) if noise is None else noise, noise_scale)

    def fuse_projections(self) -> int:
        self.stacked = stack_projections(self, ("proj_logits", "proj_else", "proj_logs"))
        return int(self.stacked is not None)

    def sample_gaussian(
        self, x: mx.array, guidance_scale: float, top_p: float, uniform: mx.array | None = None
    ) -> tuple[mx.array, mx.array]:
        """Guided features (2B, T, H) or rows (2N, H) → (mean (B, T, latent), log std (B, T, 1)) or
        (N, latent) and (N, 1) of one drawn component.

        The first half (rows [0, B) or [0, N)) is conditional, the second unconditional; guidance
        mixes them after the MLP stack. Draws the component (one uniform tensor, see engine.ops.sampling,
        unless ``uniform`` is that draw made already).
        """
        *layers, final_norm = self.mlp_stack
        rows = self.rows
        if rows is not None and x.ndim == 2 and x.shape[0] == rows.rows and x.dtype == mx.float32:
            x = self._layers_rows(rows, cast(list[MixtureLayer], layers), x)  # the stack's layers, then its norm
        else:
            for block in layers:
                x = block(x)
        x = final_norm(x)
        if guidance_scale > 0.0:
            x = guide(x, guidance_scale)
        leading = x.shape[:-1]
        if self.stacked is not None:
            logits, residual, log_std_raw = self.stacked(x)
        else:
            logits, residual, log_std_raw = self.proj_logits(x), self.proj_else(x), self.proj_logs(x)
        component = draw_component(logits, top_p, uniform)
        feature_rows = x
        if x.ndim != 2:
            component, feature_rows = component.reshape(-1), x.reshape(-1, x.shape[-1])
        # Only the drawn component's rows of proj_mus are needed (the weight is read raw, never quantized).
        mean = low_rank_mean(component, feature_rows, self.proj_mus.weight, self.low_mat, self.low_rank)
        if len(leading) != 1:
            mean = mean.reshape(*leading, self.latent_size)
        return gaussian_of(mean, residual, log_std_raw, self.min_log_std)

    @staticmethod
    def _layers_rows(parts: MixtureRowParts, layers: list[MixtureLayer], hidden: mx.array) -> mx.array:
        """Fast numerics' MLP layers on rows: each layer's post-norm and residual add is left pending and done
        by the next layer's first kernel (its prologue), the last one's by the operations."""
        hidden, pending = MixtureHead._layers_rows_pending(parts, layers, hidden)
        if pending is None:
            return hidden
        # The mixture's row parts return arrays (no RowSequence links): its pending output is one.
        return hidden + layers[-1].post_norm(cast(mx.array, pending.output))

    @staticmethod
    def _layers_rows_pending(
        parts: MixtureRowParts, layers: list[MixtureLayer], hidden: mx.array
    ) -> tuple[mx.array, LayerRowsPending | None]:
        """:meth:`_layers_rows` with the last layer's post-norm and residual add left pending (None: no layers)."""
        pending: LayerRowsPending | None = None
        for layer in layers:
            weights = layer.row_weights
            assert weights is not None
            if pending is None:
                (gated,) = parts.first_gate_up(hidden, weights.gate_up, weights.pre_scale)
            else:
                gated, hidden = parts.gate_up(hidden, weights.gate_up, weights.pre_scale, pending.output, pending.scale)
            (down,) = parts.down(gated, (weights.down,))
            pending = LayerRowsPending(down, weights.post_scale)
        return hidden, pending
