"""The encoder's fast form: the newest frame's relative-position attention as one kernel (over the cached window
too), each Conformer layer's sublayers as six row products, and on CUDA the runs of those products as one launch
each — every part the kernel where admitted against its operations, else the operations (always so on the CPU).

:func:`encoder_fast` builds it for a :class:`engine.kernels.plan.FastPlan`;
:meth:`engine.networks.perception.FastConformer.use_numerics` keeps it in the encoder's one ``fast`` slot, and the
stream branches on that slot: the attention kernels reach the layers' operations as an argument
(:attr:`EncoderFast.attention`), and a stream of row products runs through :meth:`EncoderFast.stream_rows`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from ...kernels.admission import fast_part
from ...kernels.relative_attention import RelativeDecodeAttention, relative_attention_samples, relative_window_samples
from ...kernels.row_chain import ChainBook, Link, RowCall, RowSequence, find_runs
from ...kernels.row_parts import kernel_weight_dtype, row_chains, row_product_parts
from ...kernels.row_product import RowProductShape
from .attention import attend_relative, attend_relative_window, attention_window, relative_positions

if TYPE_CHECKING:
    from ...kernels.plan import FastPlan

# The encoder's modules, named for the reader: this module imports nothing of engine.networks.perception.encoder,
# which imports it (FastConformer.use_numerics), so that the two make no import circle.
FastConformer = Any  # engine.networks.perception.encoder.FastConformer
ConformerLayer = Any  # engine.networks.perception.encoder.ConformerLayer
PerceptionState = Any  # engine.networks.perception.encoder.PerceptionState

# Rows the encoder's streaming layers carry: one 80 ms frame of one conversation.
ENCODER_ROWS = 1

RowPart = Callable[..., tuple[mx.array, ...]]


@dataclass(frozen=True)
class ConformerRowParts:
    """A Conformer layer's sublayers for a stream's newest frame, as :class:`engine.kernels.row_product.RowProduct`
    kernels or :func:`engine.kernels.row_product.row_product_ops` (same call signature); fast numerics only."""

    feed_forward_up: RowPart  # layer norm, linear1, SiLU
    feed_forward_down: RowPart  # linear2, then x + ½·y
    qkv: RowPart  # layer norm, the query, key and value projections
    output: RowPart  # linear_out, then x + y
    convolution_in: RowPart  # layer norm, pointwise_conv1, GLU
    convolution_out: RowPart  # depthwise conv over the window, layer norm, SiLU, pointwise_conv2, then x + y
    # The previous layer's output norm, then feed_forward_up's (None: each layer applies its own output norm).
    feed_forward_up_twice: RowPart | None = None
    # Each part's name and shape (what a chain of them is built from, engine.kernels.row_chain).
    shapes: tuple[tuple[str, RowProductShape], ...] = ()


@dataclass(frozen=True)
class ConformerRowWeights:
    """The projection weights :class:`ConformerRowParts` read of one layer (bf16 copies, or as they are)."""

    feed_forward1: tuple[mx.array, mx.array]
    qkv: tuple[mx.array, mx.array, mx.array]
    output: mx.array
    pointwise1: mx.array
    pointwise2: mx.array
    feed_forward2: tuple[mx.array, mx.array]


def conformer_row_weights(layer: ConformerLayer, weight_dtype: mx.Dtype | None) -> ConformerRowWeights:
    """The weights :meth:`EncoderFast.layer_rows` reads of ``layer``, as ``weight_dtype`` copies when given (made
    once and kept, see :class:`engine.networks.linear.KeepsCopy`)."""
    up1, down1, q, k, v, output, pointwise1, pointwise2, up2, down2 = (
        module.weight_in(weight_dtype) for module in layer.projection_layers()
    )
    return ConformerRowWeights((up1, down1), (q, k, v), output, pointwise1, pointwise2, (up2, down2))


@dataclass(eq=False)
class EncoderFast:
    """Fast numerics' parts of one encoder: ``attention`` (one query row's attention,
    :class:`engine.kernels.decode_attention.RelativeDecodeAttention` or :func:`attend_relative`) and ``window`` (the
    same over the cached window, writing the next); with row products, ``rows`` (every layer's, of one shape) and
    ``row_weights`` (per layer), and ``row_chains`` (runs of them as one launch, CUDA)."""

    attention: Callable[..., mx.array] | None = None
    window: Callable[..., tuple[mx.array, mx.array, mx.array]] | None = None
    rows: ConformerRowParts | None = None
    row_weights: tuple[ConformerRowWeights, ...] = ()
    # Read and swapped by engine.kernels.row_chain.find_runs while the load looks for the runs.
    row_chains: ChainBook = field(default_factory=ChainBook)

    def program_key(self) -> tuple[Any, ...]:
        """What a compiled stream program traced with these parts holds (besides the row parts)."""
        return (self.attention, self.window, tuple(self.row_chains.chains.values()))

    # ----------------------------------------------------------------------- the stream through the row products

    def stream_rows(self, encoder: FastConformer, cache: PerceptionState, x: mx.array) -> mx.array:
        """:meth:`engine.networks.perception.FastConformer.stream_layers` through the row products: one compiled
        program per phase, as in exact mode."""
        config, left, layers = encoder.config, encoder.config.left_context, len(encoder.layers)
        if x.shape[1] != 1:
            raise ValueError(f"fast numerics' encoder takes one frame at a time, got {x.shape[1]}")
        convolution = [
            mx.zeros((config.conv_kernel_size - 1, config.d_model), dtype=x.dtype) if state is None else state
            for state in cache.convolution
        ]
        keys, values = cache.attention, cache.values
        if keys[0] is None:
            outputs = encoder._stream_program("fresh")(x, *convolution)
        elif attention_window(keys[0].shape[0], left)[1] == left + 1:  # a full window: fixed positions
            positions = [layer._positions(config, left + 1, x.dtype) for layer in encoder.layers]
            outputs = encoder._stream_program("steady")(x, *keys, *values, *convolution, *positions)
        else:
            outputs = encoder._stream_program("filling")(x, *keys, *values, *convolution)
        x, states = outputs[0], outputs[1:]
        cache.attention = list(states[:layers])
        cache.values = list(states[layers : 2 * layers])
        cache.convolution = list(states[2 * layers :])
        return x

    def rows_program(self, encoder: FastConformer, kind: str) -> Callable[..., tuple[mx.array, ...]]:
        """The uncompiled ``kind`` program through the row products (inputs as in :meth:`stream_rows`)."""
        layers = len(encoder.layers)

        def fresh(x: mx.array, *convolution: mx.array) -> tuple[mx.array, ...]:
            return self.layers_rows(encoder, x, [None] * layers, [None] * layers, list(convolution), None)

        def filling(x: mx.array, *states: mx.array) -> tuple[mx.array, ...]:
            keys, values, convolution = states[:layers], states[layers : 2 * layers], states[2 * layers :]
            return self.layers_rows(encoder, x, list(keys), list(values), list(convolution), None)

        def steady(x: mx.array, *states: mx.array) -> tuple[mx.array, ...]:
            keys, values = states[:layers], states[layers : 2 * layers]
            convolution, positions = states[2 * layers : 3 * layers], states[3 * layers :]
            return self.layers_rows(encoder, x, list(keys), list(values), list(convolution), list(positions))

        return {"fresh": fresh, "filling": filling, "steady": steady}[kind]

    def layers_rows(
        self,
        encoder: FastConformer,
        x: mx.array,
        keys: list[mx.array | None],
        values: list[mx.array | None],
        convolution: list[mx.array],
        positions: list[mx.array] | None,
    ) -> tuple[mx.array, ...]:
        """Every layer's :meth:`layer_rows` in turn on ``x`` (1, 1, d); returns
        ``(x, *keys, *values, *convolution)``."""
        config, left = encoder.config, encoder.config.left_context
        shape, x = x.shape, x.reshape(-1, config.d_model)
        key_len = 1 if keys[0] is None else attention_window(keys[0].shape[0], left)[1]
        next_keys, next_values = [], []
        next_convolution: list[mx.array | Link] = []
        rows = self.rows
        assert rows is not None
        # Each layer's output norm, applied by the next layer's first row product where the parts have it.
        deferring = rows.feed_forward_up_twice is not None
        prior: nn.LayerNorm | None = None
        sequence = RowSequence(rows.shapes, self.row_chains)
        hidden: mx.array | Link = x
        for index, layer in enumerate(encoder.layers):
            if positions is None:
                projected = layer.self_attn.linear_pos(relative_positions(config, key_len, x.dtype))
            else:
                projected = positions[index]
            hidden, key_state, value_state, conv_state = self.layer_rows(
                layer,
                self.row_weights[index],
                sequence,
                hidden,
                keys[index],
                values[index],
                convolution[index],
                projected,
                left_context=left,
                prior=prior,
                defer_norm=deferring,
            )
            prior = layer.norm_out if deferring else None
            next_keys.append(key_state)
            next_values.append(value_state)
            next_convolution.append(conv_state)
        x, *convolution_states = sequence.arrays(hidden, *next_convolution)
        if prior is not None:
            x = prior(x)
        return (x.reshape(shape), *next_keys, *next_values, *convolution_states)

    def layer_rows(
        self,
        layer: ConformerLayer,
        weights: ConformerRowWeights,
        sequence: RowSequence,
        x: mx.array | Link,
        key_cache: mx.array | None,
        value_cache: mx.array | None,
        conv_cache: mx.array,
        projected_positions: mx.array,
        *,
        left_context: int,
        prior: nn.LayerNorm | None = None,
        defer_norm: bool = False,
    ) -> tuple[mx.array | Link, mx.array, mx.array, mx.array | Link]:
        """``layer``'s streaming step through :attr:`rows`: the newest frame ``x`` (one row) attends to
        its projected key and value and the cached ones of the frames before it (rows), and convolves over
        ``[conv_cache ‖ gate(x)]`` (rows). Six row products, the attention kernel and the output norm, where
        :meth:`engine.networks.perception.ConformerLayer._stream_ops` runs about thirty operations; keys and values
        are projected once per frame (cached projected) instead of for the whole window every frame. The row
        products are gathered in ``sequence`` (:class:`engine.kernels.row_chain.RowSequence`), which runs them when
        the attention reads its inputs: on a GPU those from this layer's output projection to the next layer's
        query, key and value projections as one launch where that chain was admitted.

        Returns the block output and the updated caches: the keys and values the newest frame attended to
        (its window: the last ``left_context + 1`` frames', the next frame drops the oldest when full) and the
        last ``kernel - 1`` gate outputs, each written by the kernel that reads it (no joins or slices); the
        block output and the gate outputs as links into ``sequence`` (its :meth:`~RowSequence.arrays` gives
        them). With ``prior`` (the previous layer's output norm) ``x`` is that layer's output before its norm,
        which the first row product applies (``feed_forward_up_twice``); with ``defer_norm`` the block output
        is returned before this layer's output norm, for the next layer (or the caller) to apply.
        """
        parts, attention = self.rows, layer.self_attn
        assert parts is not None and self.attention is not None and self.window is not None
        x = self._feed_forward_rows(sequence, x, layer.norm_feed_forward1, weights.feed_forward1, prior)
        norm = layer.norm_self_att
        qkv = sequence.add("qkv", parts.qkv, x, weights.qkv, norm_scale=norm.weight, norm_bias=norm.bias)
        q, k, v = sequence.arrays(*qkv)
        bias_u, bias_v = attention.pos_bias_u, attention.pos_bias_v
        if key_cache is None or value_cache is None:
            keys, values = k, v
            attended = self.attention(q, k, v, projected_positions, bias_u, bias_v, attention.scale)
        else:
            drop, _ = attention_window(key_cache.shape[0], left_context)
            attended, keys, values = self.window(
                q, key_cache, k, value_cache, v, projected_positions, bias_u, bias_v, attention.scale, drop
            )
        (x,) = sequence.add("output", parts.output, attended, (weights.output,), base=x)
        norm, conv = layer.norm_conv, layer.conv
        (gated,) = sequence.add(
            "convolution_in",
            parts.convolution_in,
            x,
            (weights.pointwise1,),
            norm_scale=norm.weight,
            norm_bias=norm.bias,
        )
        tail = conv.batch_norm
        x, next_conv = sequence.add(
            "convolution_out",
            parts.convolution_out,
            conv_cache,
            (weights.pointwise2,),
            norm_scale=tail.weight,
            norm_bias=tail.bias,
            depthwise=conv.depthwise_conv.weight,
            base=x,
            newest=gated,
        )
        x = self._feed_forward_rows(sequence, x, layer.norm_feed_forward2, weights.feed_forward2)
        if not defer_norm:
            (x,) = sequence.arrays(x)
            x = layer.norm_out(x)
        return x, keys, values, next_conv

    def _feed_forward_rows(
        self,
        sequence: RowSequence,
        x: mx.array | Link,
        norm: nn.LayerNorm,
        weights: tuple[mx.array, mx.array],
        prior: nn.LayerNorm | None = None,
    ) -> mx.array | Link:
        """``x + ½·feed_forward(norm(x))`` as two row products; with ``prior``, ``x`` is first ``prior(x)``."""
        rows = self.rows
        assert rows is not None
        scales = {"norm_scale": norm.weight, "norm_bias": norm.bias}
        if prior is None:
            (hidden,) = sequence.add("feed_forward_up", rows.feed_forward_up, x, weights[:1], **scales)
        else:
            assert rows.feed_forward_up_twice is not None
            hidden, x = sequence.add(
                "feed_forward_up_twice",
                rows.feed_forward_up_twice,
                x,
                weights[:1],
                **scales,
                prior_scale=prior.weight,
                prior_bias=prior.bias,
            )
        (x,) = sequence.add("feed_forward_down", rows.feed_forward_down, hidden, weights[1:], base=x)
        return x

    def row_runs(self, encoder: FastConformer) -> dict[tuple[Any, ...], list[RowCall]]:
        """The runs of row products a stream step gathers (:class:`engine.kernels.row_chain.RowSequence`), one of each
        structure (:func:`engine.kernels.row_chain.run_key`) with more than one step, as their calls on the layers' own
        weights and a random first frame: what the chains are built and admitted for. Runs one step op by op."""
        config, layers = encoder.config, len(encoder.layers)
        keys = mx.random.split(mx.random.key(89), 2)
        x = mx.random.normal((1, 1, config.d_model), key=keys[0])
        window = 0.5 * mx.random.normal((config.conv_kernel_size - 1, config.d_model), key=keys[1])
        return find_runs(
            self, lambda: self.layers_rows(encoder, x, [None] * layers, [None] * layers, [window] * layers, None)
        )


# --------------------------------------------------------------------------- building the fast form


def encoder_fast(encoder: FastConformer, plan: FastPlan | None) -> tuple[EncoderFast | None, dict[str, bool]]:
    """``encoder``'s fast form for ``plan`` (None for exact mode) and which of its parts run as kernels
    (``relative_attention``, ``relative_window``, ``encoder_row_products``, ``encoder_row_chains``)."""
    if plan is None or not encoder.layers:
        return None, {}
    changes: dict[str, bool] = {}
    first = encoder.layers[0].self_attn
    shape = (first.heads, first.head_dim)
    attention, changes["relative_attention"] = fast_part(
        ("relative", *shape, first.pos_bias_u.dtype),
        "encoder attention",
        attend_relative,
        lambda backend: RelativeDecodeAttention(backend, *shape),
        lambda: relative_attention_samples(*shape, first.pos_bias_u.dtype),
    )
    window, changes["relative_window"] = fast_part(
        ("relative_window", *shape, first.pos_bias_u.dtype),
        "encoder attention window",
        attend_relative_window,
        lambda backend: RelativeDecodeAttention(backend, *shape).window,
        lambda: relative_window_samples(*shape, first.pos_bias_u.dtype),
    )
    fast = EncoderFast(attention, window)
    projections = [projection for layer in encoder.layers for projection in layer.projection_layers()]
    if not any("bias" in module for module in projections):
        weight_dtype = kernel_weight_dtype(projections, plan.on_gpu)
        rows, changes["encoder_row_products"] = conformer_row_parts(encoder.layers[0], weight_dtype)
        if not plan.on_gpu or (changes["encoder_row_products"] and changes["relative_attention"]):
            fast.rows = rows
            fast.row_weights = tuple(conformer_row_weights(layer, weight_dtype) for layer in encoder.layers)
        # else: the compiled encoder's operations, as in exact mode
    changes["encoder_row_chains"] = False
    if fast.rows is not None and plan.backend == "cuda":  # the only backend with a chain kernel
        fast.row_chains, changes["encoder_row_chains"] = row_chains("encoder", fast.row_runs(encoder), "cuda")
    return fast, changes


def conformer_row_parts(layer: ConformerLayer, weight_dtype: mx.Dtype | None) -> tuple[ConformerRowParts, bool]:
    """The row-product parts of a Conformer layer for a stream's newest frame (the kernels where admitted,
    else the fallbacks); the flag says whether every one is a kernel."""
    norm, conv = layer.norm_feed_forward1, layer.conv
    width, hidden = norm.weight.shape[0], layer.feed_forward1.linear1.weight.shape[0]
    dtype = weight_dtype if weight_dtype is not None else layer.feed_forward1.linear1.weight.dtype
    taps = conv.depthwise_conv.weight.shape[1]
    rows = ENCODER_ROWS
    shapes = {
        "feed_forward_up": RowProductShape(rows, width, (hidden,), "layer_norm", "silu"),
        "feed_forward_down": RowProductShape(rows, hidden, (width,), "none", "residual", factor=0.5),
        "qkv": RowProductShape(rows, width, (width, width, width), "layer_norm"),
        "output": RowProductShape(rows, width, (width,), "none", "residual"),
        "convolution_in": RowProductShape(rows, width, (2 * width,), "layer_norm", "glu"),
        "convolution_out": RowProductShape(rows, width, (width,), "conv_norm", "residual", taps=taps),
    }
    if layer.norm_out.eps == norm.eps:  # one eps for both norms: the previous layer's output norm folds in
        shapes["feed_forward_up_twice"] = RowProductShape(rows, width, (hidden,), "layer_norm_twice", "silu")
    # The convolution module's norm may have an eps of its own.
    eps = {name: conv.batch_norm.eps if name == "convolution_out" else norm.eps for name in shapes}
    parts, every = row_product_parts("encoder", shapes, dtype, norm.weight.dtype, eps)
    return ConformerRowParts(**parts, shapes=tuple(shapes.items())), every
