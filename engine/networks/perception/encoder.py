"""Perception: cache-aware FastConformer encoder and the projection into the LLM width.

One encoder frame covers 80 ms (8 mel frames). The network is NeMo's cache-aware
FastConformer as configured for VoiceChat: causal depthwise-striding subsampling
(8x, three stride-2 stages padded 2 before / 1 after on time and frequency), then
``n_layers`` Conformer blocks (half-step FFN, relative-position self-attention with
per-layer biases ``u``/``v``, causal convolution module, half-step FFN, LayerNorm).

Two ways to run it, both in the reference port's exact op order:

* offline, :meth:`Perception.__call__`: the whole mel spectrogram at once with the
  ``chunked_limited`` attention mask (each frame sees itself and the 70 before it);
* streaming, :meth:`Perception.step` (``state = perception.make_state()``, then
  ``perception.step(state, frame, hooks)``): one 80 ms frame of audio in, one encoder frame
  out. The subsampling stack is re-run over a short mel window (a cache of at most
  23 earlier mel frames, aligned to the 8-frame grid) and only its newest output
  frame is kept; every block attends to a cache of its last 70 attention inputs and
  convolves over a cache of its last 8 GLU outputs, so no mask is needed.

Both paths compute the same causal function. They differ by float rounding (other
matmul shapes), by mel frame 0 (the streaming front end builds its reflected left
edge one sample short, as the reference does) and by one extra offline frame at the
end, which sees the right-edge reflect padding.

Fast numerics' form of the encoder (its attention kernels and row products) is :mod:`.fast`, kept in
:attr:`FastConformer.fast` by :meth:`Perception.use_numerics`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from ...hooks import NO_HOOKS, FrameHooks
from ...jit import compile_enabled, jit
from ...loading.config import EncoderConfig, PerceptionConfig
from ...streaming import arrays_nbytes
from ..linear import KeepsCopy, Linear
from .attention import Attend, RelativePositionAttention, chunked_limited_mask, relative_positions
from .mel import MelState, StreamingMel

if TYPE_CHECKING:
    from ...kernels.plan import FastPlan
    from .fast import EncoderFast


# Mel frames the streaming subsampling keeps beyond the newest grid point: at least
# the causal receptive field of the three stride-2 stages.
_SUBSAMPLING_MEL_CONTEXT = 16


# --------------------------------------------------------------------------- subsampling


class CausalStridingSubsampling(nn.Module):
    """8x time (and frequency) reduction: three causal stride-2 3x3 stages, then a Linear to ``d_model``.

    ``conv`` follows NeMo's indices so the checkpoint keys match: 0 full conv, 2/5
    depthwise, 3/6 pointwise, and parameter-free ReLUs at 1/4/7.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        channels = config.subsampling_conv_channels
        self.stages = int(math.log(config.subsampling_factor, 2))
        self.kernel, self.stride = 3, 2
        # Causal padding: everything the kernel needs before, stride-1 after, on both axes.
        self.pad_before, self.pad_after = self.kernel - 1, self.stride - 1

        layers: list[nn.Module] = [nn.Conv2d(1, channels, kernel_size=3, stride=2, padding=0), nn.ReLU()]
        for _ in range(self.stages - 1):
            layers.append(nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=0, groups=channels))
            layers.append(nn.Conv2d(channels, channels, kernel_size=1, stride=1, padding=0))
            layers.append(nn.ReLU())
        self.conv = layers
        self._padded_layers = frozenset({0} | {2 + 3 * stage for stage in range(self.stages - 1)})

        frequency = config.feat_in
        for _ in range(self.stages):
            frequency = self._reduce(frequency)
        self.out = Linear(channels * frequency, config.d_model)

    def _reduce(self, size: int) -> int:
        return (size + self.pad_before + self.pad_after - self.kernel) // self.stride + 1

    def output_lengths(self, lengths: mx.array) -> mx.array:
        """Frame counts after subsampling (``L -> L // 2 + 1`` per stage), computed on the device."""
        for _ in range(self.stages):
            lengths = (lengths + self.pad_before + self.pad_after - self.kernel) // self.stride + 1
        return lengths.astype(mx.int32)

    def __call__(self, mel: mx.array) -> mx.array:
        """``(B, T, features)`` mel to ``(B, T', d_model)``."""
        x = mx.expand_dims(mel, axis=-1)  # time = height, frequency = width, one channel
        padding = [(0, 0), (self.pad_before, self.pad_after), (self.pad_before, self.pad_after), (0, 0)]
        for index, layer in enumerate(self.conv):
            if index in self._padded_layers:
                x = mx.pad(x, padding)
            x = layer(x)
        batch, frames, frequency, channels = x.shape
        # Channel-major flattening (index c·F + f), as the checkpoint's Linear expects.
        x = x.transpose(0, 1, 3, 2).reshape(batch, frames, channels * frequency)
        return self.out(x)


# --------------------------------------------------------------------------- block parts


class FeedForward(nn.Module):
    """Linear → SiLU → Linear (no biases in this model)."""

    def __init__(self, d_model: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.linear1 = Linear(d_model, hidden, bias=bias)
        self.linear2 = Linear(hidden, d_model, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear2(nn.silu(self.linear1(x)))


class PointwiseConv(KeepsCopy, nn.Conv1d):
    """A kernel-size-1 ``nn.Conv1d`` (same parameters and arithmetic) whose weight fast numerics may read
    in bf16 (:class:`engine.networks.linear.KeepsCopy`)."""

    def weight_views(self) -> dict[str, mx.array]:
        return self.copy_views()


class ConvolutionModule(nn.Module):
    """Pointwise conv → GLU → causal depthwise conv → LayerNorm (named ``batch_norm``) → SiLU → pointwise conv."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        d_model, kernel = config.d_model, config.conv_kernel_size
        if config.conv_norm_type != "layer_norm":
            raise NotImplementedError(f"conv_norm_type {config.conv_norm_type!r} is not supported")
        context = config.conv_context_size
        if context == "causal":
            self.pad_before, self.pad_after = kernel - 1, 0
        else:
            self.pad_before, self.pad_after = int(context[0]), int(context[1])
        self.pointwise_conv1 = PointwiseConv(d_model, 2 * d_model, kernel_size=1, bias=config.use_bias)
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel_size=kernel, groups=d_model, bias=config.use_bias)
        self.batch_norm = nn.LayerNorm(d_model)
        self.pointwise_conv2 = PointwiseConv(d_model, d_model, kernel_size=1, bias=config.use_bias)

    def gate(self, x: mx.array) -> mx.array:
        """The GLU output, the input of the depthwise convolution (and what the streaming cache holds)."""
        gated: mx.array = nn.glu(self.pointwise_conv1(x), axis=-1)
        return gated

    def finish(self, convolved: mx.array) -> mx.array:
        projected: mx.array = self.pointwise_conv2(nn.silu(self.batch_norm(convolved)))
        return projected

    def __call__(self, x: mx.array) -> mx.array:
        gated = mx.pad(self.gate(x), [(0, 0), (self.pad_before, self.pad_after), (0, 0)])
        return self.finish(self.depthwise_conv(gated))


class ConformerLayer(nn.Module):
    """Macaron Conformer block; attribute names are the checkpoint's."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        d_model, hidden = config.d_model, config.d_model * config.ff_expansion_factor
        self.self_attn_left_context = config.left_context
        self.norm_feed_forward1 = nn.LayerNorm(d_model)
        self.feed_forward1 = FeedForward(d_model, hidden, config.use_bias)
        self.norm_self_att = nn.LayerNorm(d_model)
        self.self_attn = RelativePositionAttention(config.n_heads, d_model, config.use_bias)
        self.norm_conv = nn.LayerNorm(d_model)
        self.conv = ConvolutionModule(config)
        self.norm_feed_forward2 = nn.LayerNorm(d_model)
        self.feed_forward2 = FeedForward(d_model, hidden, config.use_bias)
        self.norm_out = nn.LayerNorm(d_model)

    def projection_layers(self) -> tuple[Linear | PointwiseConv, ...]:
        """The projections fast numerics' row products read: feed-forward, attention (not the positions',
        which are projected once per key length), and the convolution module's pointwise ones."""
        attention, conv = self.self_attn, self.conv
        return (
            self.feed_forward1.linear1,
            self.feed_forward1.linear2,
            attention.linear_q,
            attention.linear_k,
            attention.linear_v,
            attention.linear_out,
            conv.pointwise_conv1,
            conv.pointwise_conv2,
            self.feed_forward2.linear1,
            self.feed_forward2.linear2,
        )

    def __call__(self, x: mx.array, positions: mx.array, mask: mx.array | None) -> mx.array:
        """Offline: every frame of ``x`` at once under ``mask``."""
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        attention_in = self.norm_self_att(x)
        x = x + self.self_attn(attention_in, attention_in, positions, mask)
        x = x + self.conv(self.norm_conv(x))
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        normed: mx.array = self.norm_out(x)
        return normed

    def stream(
        self,
        x: mx.array,
        config: EncoderConfig,
        attention_cache: mx.array | None,
        conv_cache: mx.array | None,
        left_context: int,
        attend: Attend | None = None,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """Streaming, op by op: new frames ``x`` (rows (n, d), a batch of one) attend to
        ``[attention_cache ‖ x]`` (rows) and convolve over ``[conv_cache ‖ gate(x)]`` ((1, kernel-1, d)).

        Returns the block output (rows) and both updated caches (last ``left_context``
        attention inputs including the new ones; last ``kernel-1`` gate outputs).
        Once the attention cache is full the position projection no longer changes and
        is reused. (A stream of single frames runs all layers compiled instead:
        :meth:`FastConformer.stream_layers`.) ``attend``: fast numerics' one-row attention, if any.
        """
        if conv_cache is None:
            history = config.conv_kernel_size - 1
            conv_cache = mx.zeros((1, history, config.d_model), dtype=x.dtype)
        key_len = x.shape[0] + (0 if attention_cache is None else attention_cache.shape[0])
        if key_len == left_context + 1:
            projected = self._positions(config, key_len, x.dtype)
        else:
            projected = self.self_attn.linear_pos(relative_positions(config, key_len, x.dtype))
        return self._stream_ops(x, attention_cache, conv_cache, projected, left_context=left_context, attend=attend)

    def _positions(self, config: EncoderConfig, key_len: int, dtype: mx.Dtype) -> mx.array:
        """``linear_pos`` of the relative-position rows for ``key_len`` keys, computed once."""
        store = self._projected_positions
        if (key_len, dtype) not in store:
            store[(key_len, dtype)] = self.self_attn.linear_pos(relative_positions(config, key_len, dtype))
            mx.eval(store[(key_len, dtype)])
        return store[(key_len, dtype)]

    @functools.cached_property
    def _projected_positions(self) -> dict[tuple[int, mx.Dtype], mx.array]:
        return {}  # in the instance __dict__, outside the parameter tree

    def _stream_ops(
        self,
        x: mx.array,
        attention_cache: mx.array | None,
        conv_cache: mx.array,
        projected_positions: mx.array,
        *,
        left_context: int,
        attend: Attend | None = None,
    ) -> tuple[mx.array, mx.array, mx.array]:
        # Rows rather than (1, n, d): a matrix product of a 3-D input is flattened to rows and back
        # around the same kernel, two views per projection; only the convolutions need the batch axis.
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))

        attention_in = self.norm_self_att(x)
        keys = attention_in if attention_cache is None else mx.concatenate([attention_cache, attention_in], axis=0)
        x = x + self.self_attn(attention_in, keys, projected_positions, projected=True, attend=attend)
        next_attention = keys[-left_context:] if left_context > 0 else keys[:0]

        gated = self.conv.gate(mx.expand_dims(self.norm_conv(x), 0))
        conv_in = mx.concatenate([conv_cache, gated], axis=1)
        next_conv = conv_in[:, conv_in.shape[1] - conv_cache.shape[1] :]
        convolved = self.conv.finish(self.conv.depthwise_conv(conv_in))  # "valid" conv: the cache is the left padding
        x = x + convolved.reshape(x.shape)

        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        normed: mx.array = self.norm_out(x)
        return normed, next_attention, next_conv


def encoder_row_projections(model: nn.Module) -> list[Linear | PointwiseConv]:
    """The encoder projections of ``model`` that fast numerics' row products read (every Conformer layer's
    :meth:`ConformerLayer.projection_layers`)."""
    layers = [module for _, module in model.named_modules() if isinstance(module, ConformerLayer)]
    return [projection for layer in layers for projection in layer.projection_layers()]


# --------------------------------------------------------------------------- caches


@dataclass
class PerceptionState:
    """Everything the streaming perception carries from one 80 ms frame to the next (a
    :class:`engine.streaming.StreamState`).

    * ``mel``: the log-mel front end's retained samples and counters;
    * ``mel_window``: earlier mel frames re-fed to the subsampling stack (≤ 23, 17 in steady state);
    * ``attention``: per layer, the last ``left_context`` (70) ``norm_self_att`` outputs, as rows (70, d) —
      or, with fast numerics' row products, the keys projected from them, for the last ``left_context + 1``
      frames (the window the newest frame attended to; the next frame drops its oldest row);
    * ``values``: fast numerics' row products only: per layer, the projected values of those frames;
    * ``convolution``: per layer, the last ``kernel - 1`` (8) GLU outputs ((1, 8, d); rows (8, d) with
      the row products);
    * ``mel_consumed`` / ``frames_emitted``: mel frames fed to the encoder and encoder frames produced.
    """

    mel: MelState
    attention: list[mx.array | None]
    convolution: list[mx.array | None]
    values: list[mx.array | None] = field(default_factory=list)
    mel_window: mx.array | None = None
    mel_consumed: int = 0
    frames_emitted: int = 0

    def arrays(self) -> list[mx.array]:
        """Every cached array, for the session's one evaluation per frame."""
        held = [*self.mel.arrays()]
        if self.mel_window is not None:
            held.append(self.mel_window)
        held.extend(value for value in self.attention if value is not None)
        held.extend(value for value in self.values if value is not None)
        held.extend(value for value in self.convolution if value is not None)
        return held

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())


# --------------------------------------------------------------------------- encoder


class FastConformer(nn.Module):
    """Subsampling plus Conformer layers (``stt_model.perception.encoder``)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.pre_encode = CausalStridingSubsampling(config)
        self.layers = [ConformerLayer(config) for _ in range(config.n_layers)]
        # Fast numerics' form (engine.networks.perception.fast): the attention kernels, the layers' row products and
        # their chains; None: the reference's operations. The one slot the stream branches on.
        self.fast: EncoderFast | None = None

    def use_numerics(self, plan: FastPlan | None) -> dict[str, bool]:
        """Take fast numerics' form for ``plan`` (None: exact mode); returns which of its parts run as kernels
        (:func:`engine.networks.perception.fast.encoder_fast`)."""
        from .fast import encoder_fast

        self.fast, changes = encoder_fast(self, plan)
        return changes

    def __call__(self, mel: mx.array, lengths: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """Offline: ``(B, T, features)`` mel → ``((B, T', d_model), lengths')`` under the chunked_limited mask."""
        config = self.config
        if lengths is None:
            lengths = mx.full((mel.shape[0],), mel.shape[-2], dtype=mx.int32)
        x = self.pre_encode(mel)
        out_lengths = self.pre_encode.output_lengths(lengths)
        if config.xscaling:
            x = x * math.sqrt(config.d_model)
        positions = relative_positions(config, x.shape[1], x.dtype)
        mask = None
        if config.att_context_style == "chunked_limited":
            mask = chunked_limited_mask(x.shape[1], config.left_context, config.right_context, x.dtype)
        for layer in self.layers:
            x = layer(x, positions, mask)
        return x, out_lengths

    def step(self, cache: PerceptionState, mel: mx.array, hooks: FrameHooks = NO_HOOKS) -> list[mx.array]:
        """Feed new mel frames ``(1, n, features)``; return the encoder chunks they complete.

        Mel frames are consumed in chunks of ``subsampling_factor`` (one encoder frame
        each); the last chunk emits the subsampling stack's right-boundary frame, which
        is valid because a causal frame needs no future mel. Bookkeeping is host
        integers only.
        """
        chunk = self.config.subsampling_factor  # one encoder frame per chunk
        outputs: list[mx.array] = []
        remaining = mel
        while remaining.shape[1] > 0:
            take = min(chunk, remaining.shape[1])
            piece, remaining = remaining[:, :take], remaining[:, take:]
            encoded = self._encode_chunk(cache, piece, last=remaining.shape[1] == 0, hooks=hooks)
            if encoded is not None:
                outputs.append(encoded)
        return outputs

    def _encode_chunk(
        self, cache: PerceptionState, mel: mx.array, *, last: bool, hooks: FrameHooks = NO_HOOKS
    ) -> mx.array | None:
        factor = self.config.subsampling_factor
        cached = 0 if cache.mel_window is None else cache.mel_window.shape[1]
        window = mel if cache.mel_window is None else mx.concatenate([cache.mel_window, mel], axis=1)
        subsampled = self.pre_encode(window)
        if hooks.sub_stages:
            hooks.sub_stage("perception.subsampling", subsampled)

        consumed = cache.mel_consumed + mel.shape[1]
        first_index = (cache.mel_consumed - cached) // factor  # encoder index of subsampled[:, 0]
        lo = cache.frames_emitted - first_index
        hi = subsampled.shape[1] if last else consumed // factor - first_index
        cache.mel_consumed = consumed
        # Keep the window start on the subsampling grid so its outputs line up with earlier ones.
        keep = _SUBSAMPLING_MEL_CONTEXT + (consumed - _SUBSAMPLING_MEL_CONTEXT) % factor
        cache.mel_window = window[:, -keep:]
        if hi <= lo:
            cache.frames_emitted = first_index + max(lo, hi)
            return None
        cache.frames_emitted = first_index + hi

        x = self.stream_layers(cache, subsampled[:, lo:hi])
        if hooks.sub_stages:
            hooks.sub_stage("perception.layers", x)
        return x

    def stream_layers(self, cache: PerceptionState, x: mx.array) -> mx.array:
        """Run new encoder frames ``x`` (1, n, d_model) through every layer, updating the layer caches.

        A single new frame, the streaming case, runs as one compiled program over all the
        layers: one per attention cache length (0 … 70 cached frames; the programs are traced
        at load, see :func:`engine.warming.warm_up`), the same operations as layer by layer.
        Until its cache is full, a layer projects the relative positions of its key window
        inside the program, as the reference does; once full (71 keys), it reuses that
        projection, which no longer changes.
        """
        config, left = self.config, self.config.left_context
        if x.shape[0] != 1:
            raise ValueError(f"the stream is one conversation: a batch of 1, got {x.shape[0]}")
        row_products = self.rows_in_use
        if any(state is not None for state in cache.values) != (row_products and cache.attention[0] is not None):
            raise RuntimeError("this stream's encoder cache was filled in the other numerics mode: start a new session")
        if row_products:
            assert self.fast is not None
            return self.fast.stream_rows(self, cache, x)
        if x.shape[1] != 1 or not compile_enabled():
            rows = x.reshape(-1, config.d_model)
            attend = None if self.fast is None else self.fast.attention
            for index, layer in enumerate(self.layers):
                rows, cache.attention[index], cache.convolution[index] = layer.stream(
                    rows, config, cache.attention[index], cache.convolution[index], left, attend
                )
            return rows.reshape(x.shape)
        layers = len(self.layers)
        convolution = [
            mx.zeros((1, config.conv_kernel_size - 1, config.d_model), dtype=x.dtype) if state is None else state
            for state in cache.convolution
        ]
        attention = cache.attention
        if attention[0] is None:
            outputs = self._fresh_stream(x, *convolution)
        elif attention[0].shape[0] + 1 == left + 1:
            key_len = left + 1
            positions = [layer._positions(config, key_len, x.dtype) for layer in self.layers]
            outputs = self._steady_stream(x, *attention, *convolution, *positions)
        else:
            outputs = self._filling_stream(x, *attention, *convolution)
        x, states = outputs[0], outputs[1:]
        cache.attention = list(states[:layers])
        cache.convolution = list(states[layers:])
        return x

    @property
    def rows_in_use(self) -> bool:
        """Whether a stream runs fast numerics' row products
        (:meth:`engine.networks.perception.fast.EncoderFast.stream_rows`)."""
        return bool(self.layers) and self.fast is not None and self.fast.rows is not None

    def trace_stream(self, dtype: mx.Dtype) -> list[mx.array]:
        """Trace the stream's programs for every attention cache length (0 … 70; 71 with the row products) on
        zeros; returns outputs to evaluate (evaluation compiles their kernels). Nothing is stored."""
        config = self.config
        rows = self.rows_in_use
        outputs: list[mx.array] = []
        # The row products' caches hold the window the newest frame attended to, up to left_context + 1 rows.
        for cached in range(config.left_context + (2 if rows else 1)):
            history = None if cached == 0 else mx.zeros((cached, config.d_model), dtype=dtype)
            scratch = PerceptionState(
                mel=None,  # type: ignore[arg-type]  # the layers never touch the front end
                attention=[history] * len(self.layers),
                convolution=[None] * len(self.layers),
                values=[history if rows else None] * len(self.layers),
            )
            outputs.append(self.stream_layers(scratch, mx.zeros((1, 1, config.d_model), dtype=dtype)))
        return outputs

    def _layers_ops(
        self,
        x: mx.array,
        attention: list[mx.array | None],
        convolution: list[mx.array],
        positions: list[mx.array] | None,
    ) -> tuple[mx.array, ...]:
        """Every layer's :meth:`ConformerLayer._stream_ops` in turn on ``x`` (1, n, d); returns
        ``(x, *attention, *convolution)``."""
        attend = None if self.fast is None else self.fast.attention
        config, left = self.config, self.config.left_context
        shape, x = x.shape, x.reshape(-1, config.d_model)  # the layers run on rows
        key_len = x.shape[0] + (0 if attention[0] is None else attention[0].shape[0])
        next_attention, next_convolution = [], []
        for index, layer in enumerate(self.layers):
            if positions is None:
                projected = layer.self_attn.linear_pos(relative_positions(config, key_len, x.dtype))
            else:
                projected = positions[index]
            x, attention_state, conv_state = layer._stream_ops(
                x, attention[index], convolution[index], projected, left_context=left, attend=attend
            )
            next_attention.append(attention_state)
            next_convolution.append(conv_state)
        return (x.reshape(shape), *next_attention, *next_convolution)

    @property
    def _fresh_stream(self) -> Callable[..., tuple[mx.array, ...]]:
        """The first frame: no attention cache yet; inputs ``(x, *convolution)``."""
        return self._stream_program("fresh")

    @property
    def _filling_stream(self) -> Callable[..., tuple[mx.array, ...]]:
        """Frames 2 … 70, while the attention caches fill; inputs ``(x, *attention, *convolution)``."""
        return self._stream_program("filling")

    @property
    def _steady_stream(self) -> Callable[..., tuple[mx.array, ...]]:
        """Full caches; inputs ``(x, *attention, *convolution, *projected positions)``."""
        return self._stream_program("steady")

    def _stream_program(self, kind: str) -> Callable[..., tuple[mx.array, ...]]:
        """The compiled ``kind`` program for the fast parts in use: a trace holds the attention and row
        products it was traced with, so a model switched between numerics modes keeps one program per mode."""
        fast = self.fast
        rows = None if fast is None else fast.rows
        key = (kind, None if fast is None else fast.program_key(), rows)
        programs = self._stream_programs
        if key not in programs and fast is not None and rows is not None:
            programs[key] = jit(fast.rows_program(self, kind))
        if key not in programs:
            layers = len(self.layers)

            def fresh(x: mx.array, *convolution: mx.array) -> tuple[mx.array, ...]:
                return self._layers_ops(x, [None] * layers, list(convolution), None)

            def filling(x: mx.array, *states: mx.array) -> tuple[mx.array, ...]:
                return self._layers_ops(x, list(states[:layers]), list(states[layers:]), None)

            def steady(x: mx.array, *states: mx.array) -> tuple[mx.array, ...]:
                attention, convolution, positions = states[:layers], states[layers : 2 * layers], states[2 * layers :]
                return self._layers_ops(x, list(attention), list(convolution), list(positions))

            programs[key] = jit({"fresh": fresh, "filling": filling, "steady": steady}[kind])
        return programs[key]

    @functools.cached_property
    def _stream_programs(self) -> dict[tuple[Any, ...], Callable[..., tuple[mx.array, ...]]]:
        return {}  # in the instance __dict__, outside the parameter tree

    def forget_row_programs(self) -> None:
        """Drop the programs traced with row products: they hold the weights' bf16 copies as constants."""
        programs = self._stream_programs
        for key in [key for key in programs if key[2] is not None]:
            del programs[key]


class Perception(nn.Module):
    """Encoder plus ``proj`` (``stt_model.perception``): audio to LLM-width embeddings."""

    def __init__(self, config: PerceptionConfig) -> None:
        super().__init__()
        self.perception_config = config
        self.encoder = FastConformer(config.encoder)
        self.proj = Linear(config.encoder.d_model, config.output_dim, bias=True)

    @property
    def frame_samples(self) -> int:
        """Audio samples per encoder frame (1280 = 80 ms at 16 kHz)."""
        return self.perception_config.preprocessor.hop_length * self.perception_config.encoder.subsampling_factor

    def __call__(self, mel: mx.array, lengths: mx.array | None = None) -> tuple[mx.array, mx.array, mx.array]:
        """Offline: ``(projected (B, T', output_dim), lengths', encoded (B, T', d_model))``."""
        encoded, lengths = self.encoder(mel, lengths)
        return self.proj(encoded), lengths, encoded

    def use_numerics(self, plan: FastPlan | None) -> dict[str, bool]:
        """Take fast numerics' form for ``plan`` (None: exact mode): the encoder's (the front end and the
        projection have none); returns which of its parts run as kernels."""
        return self.encoder.use_numerics(plan)

    @functools.cached_property
    def mel(self) -> StreamingMel:
        """The streaming front end; it looks one frame (1280 samples) ahead, as the sessions do."""
        return StreamingMel(self.perception_config.preprocessor, self.frame_samples)

    def make_state(self) -> PerceptionState:
        """Fresh streaming state."""
        layers = len(self.encoder.layers)
        return PerceptionState(
            mel=self.mel.make_state(),
            attention=[None] * layers,
            convolution=[None] * layers,
            values=[None] * layers,
        )

    def step(self, state: PerceptionState, frame: mx.array, hooks: FrameHooks = NO_HOOKS) -> tuple[mx.array, mx.array]:
        """One 80 ms frame ``(1280,)`` in; ``(projected (1, 1, output_dim), encoded (1, 1, d_model))`` out.

        Raises ``ValueError`` for a frame of the wrong shape (the state is left
        untouched) and ``RuntimeError`` if the encoder would not emit exactly one frame. Where ``hooks`` times
        sub-stages, closes ``perception.mel``, ``.subsampling``, ``.layers`` and ``.projection``.
        """
        cache = state
        if frame.ndim != 1 or frame.shape[0] != self.frame_samples:
            raise ValueError(
                f"perception step needs one frame of {self.frame_samples} mono samples, got shape {tuple(frame.shape)}"
            )
        if frame.dtype != mx.float32:
            frame = frame.astype(mx.float32)
        mel = self.mel.step(cache.mel, frame, hooks)
        if hooks.sub_stages:
            hooks.sub_stage("perception.mel", mel)
        chunks = self.encoder.step(cache, mel, hooks)
        if len(chunks) != 1 or chunks[0].shape[1] != 1:
            shapes = [tuple(chunk.shape) for chunk in chunks]
            raise RuntimeError(
                f"cached perception did not emit exactly one encoder frame: mel={tuple(mel.shape)}, encoded={shapes}"
            )
        encoded = chunks[0]
        projected = self.proj(encoded)
        if hooks.sub_stages:
            hooks.sub_stage("perception.projection", projected)
        return projected, encoded
