"""The speech codec: 31 residual codes per 80 ms frame <-> 1764 samples at 22.05 kHz.

Decoding sums one mean vector per quantizer (the PRVQ latent), runs it through a
causal decoder (ConvTranspose1d upsampling x9, x7, x7 with three ConvNeXt blocks after
each) to 18 channels per 4-sample hop, reads those as the magnitude logits and phases
of a 9-bin spectrum and inverts a 16-point STFT (hop 4, periodic Hann) by windowed
overlap-add. The encoder, used only for the TTS warm-up, runs the mirror image
(STFT -> ConvNeXt/strided Conv1d stack -> latent) and quantizes greedily.

Arithmetic follows the reference port op by op and dtype by dtype (decoder activations
in the weight dtype up to the inverse FFT, float32 from there on), so outputs match it
bit for bit on CPU.

Streaming and its delay
-----------------------
``step`` keeps, per decoder ConvNeXt block, the last ``kernel - 1`` (6) inputs of
its causal depthwise convolution, and the last 4 spectral frames. Each step prepends
those 4 frames, overlap-adds, and emits exactly 1764 samples per frame. Because the
carried frames cover 8 samples on each side of the step, the stream runs 8 samples
behind the offline decode::

    stream[i] == offline[i - 8]          for i >= 14

* The first 8 streamed samples precede offline sample 0: two zeros followed by the six
  samples the offline decode trims off its start (frame 0's leading window edge).
* Offline samples 0..5 (stream 8..13) agree only up to rounding: offline divides them by
  the partial window-square sum of the frames that exist, the stream by the full sum
  (1.5) because it treats the pre-roll as zero frames. They differ by exactly that
  normalisation factor.
* The last 8 offline samples are never emitted by the reference session (it never
  flushes). ``flush`` returns them from the carried spectral frames, so that
  ``concat(stream, flush)[14:] == offline[6:]`` bit for bit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...hooks import NO_HOOKS, FrameHooks
from ...jit import jit
from ...kernels.code_sum import code_sum_ops
from ...kernels.conv_norm import channel_layer_norm
from ...loading.config import CodecConfig
from ...streaming import arrays_nbytes
from ...weight_names import COPY_MARK
from ..parameters import parameter_leaves
from .fast import CodecFast, codec_fast

if TYPE_CHECKING:
    from ...kernels.plan import FastPlan

CODEC_PREFIX = "tts_model.audio_codec."
"""Where the codec's weights live in the runtime checkpoint."""

# Magnitudes are squashed into (0, MAX_MAGNITUDE) by a shifted sigmoid in log space.
_MAX_MAGNITUDE = 100.0
_LAYER_NORM_EPS = 1e-6
_NORM_FLOOR = 1e-10


# --------------------------------------------------------------------------- building blocks


class Conv1d(nn.Module):
    """Channels-last 1-D convolution (weight ``(out, kernel, in/groups)``), created zeroed.

    Zero initialisation keeps construction free of global-RNG draws; the checkpoint
    overwrites every value.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int = 1, groups: int = 1, bias: bool
    ) -> None:
        super().__init__()
        self.stride = stride
        self.groups = groups
        self.weight = mx.zeros((out_channels, kernel_size, in_channels // groups))
        if bias:
            self.bias = mx.zeros((out_channels,))

    def __call__(self, inputs: mx.array) -> mx.array:
        outputs = mx.conv1d(inputs, self.weight, self.stride, 0, 1, self.groups)
        if "bias" in self:
            outputs = outputs + self.bias
        return outputs


class ConvTranspose1d(nn.Module):
    """Channels-last transposed convolution without bias (weight ``(out, kernel, in)``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.weight = mx.zeros((out_channels, kernel_size, in_channels))

    def __call__(self, inputs: mx.array) -> mx.array:
        return mx.conv_transpose1d(inputs, self.weight, self.stride, 0, 1, 0)


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis with the biased variance, written out op by op.

    ``mx.fast.layer_norm`` rounds differently, so the reference's explicit form is kept
    (:func:`engine.kernels.conv_norm.channel_layer_norm`): ``mx.mean`` and ``mx.var`` (which MLX computes
    as a sum times ``1/n``, the variance as the mean of the squared deviations from that mean),
    then the affine map, each product that is then added to stored first, as the reference's
    separate kernels store it (see :func:`engine.jit.materialize`).
    """

    def __init__(self, channels: int, eps: float = _LAYER_NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((channels,))
        self.bias = mx.zeros((channels,))

    def __call__(self, inputs: mx.array) -> mx.array:
        return channel_layer_norm(inputs, self.weight, self.bias, self.eps)


class ConvNeXtBlock(nn.Module):
    """Residual block: causal depthwise conv -> LayerNorm -> 4x pointwise MLP (exact GELU)."""

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        self.context = kernel_size - 1
        self.dwconv = Conv1d(channels, channels, kernel_size, groups=channels, bias=True)
        self.norm = ChannelLayerNorm(channels)
        self.pwconv1 = Conv1d(channels, 4 * channels, 1, bias=True)
        self.pwconv2 = Conv1d(4 * channels, channels, 1, bias=True)

    def __call__(self, inputs: mx.array, history: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """``inputs (B, T, C)`` -> ``(outputs, new history)``.

        ``history`` holds the previous ``kernel - 1`` inputs of this block; ``None``
        means the start of a signal (zero left padding).
        """
        if history is None:
            padded = mx.pad(inputs, [(0, 0), (self.context, 0), (0, 0)])
        else:
            padded = mx.concatenate([history, inputs], axis=1)
        hidden = self.dwconv(padded)
        hidden = self.norm(hidden)
        hidden = self.pwconv1(hidden)
        hidden = nn.gelu(hidden)  # the compiled MLX GELU, as the reference uses
        hidden = self.pwconv2(hidden)
        return inputs + hidden, padded[:, padded.shape[1] - self.context :]


# --------------------------------------------------------------------------- encoder / decoder stacks

BlockStep = Callable[[ConvNeXtBlock, mx.array, mx.array], tuple[mx.array, mx.array]]


class CodecEncoder(nn.Module):
    """STFT features ``(B, F, 18)`` -> latents ``(B, F / 441, latent_dim)``.

    ``layers``: Conv1d(18 -> C0, k1), then per stage ``blocks_per_stage`` ConvNeXt blocks
    and a strided Conv1d down to the next width (the last one to ``latent_dim``).
    """

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        widths = config.stage_channels
        layers: list[nn.Module] = [Conv1d(config.stft_channels, widths[0], 1, bias=False)]
        for stage, (width, rate) in enumerate(zip(widths, config.downsample_rates, strict=True)):
            layers.extend(ConvNeXtBlock(width, config.block_kernel_size) for _ in range(config.blocks_per_stage))
            next_width = widths[stage + 1] if stage + 1 < len(widths) else config.latent_dim
            layers.append(Conv1d(width, next_width, rate, stride=rate, bias=False))
        self.layers = layers

    def __call__(self, features: mx.array) -> mx.array:
        hidden = features
        for layer in self.layers:
            hidden = layer(hidden)[0] if isinstance(layer, ConvNeXtBlock) else layer(hidden)
        return hidden


class CodecDecoder(nn.Module):
    """Latents ``(B, T, latent_dim)`` -> spectral features ``(B, 441 T, 18)``.

    ``layers``: per stage (widest first) a ConvTranspose1d upsampler (kernel = stride, so
    frames never overlap) and ``blocks_per_stage`` ConvNeXt blocks; then Conv1d(C0 -> 18, k1).
    """

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        source = config.latent_dim
        for width, rate in zip(reversed(config.stage_channels), reversed(config.downsample_rates), strict=True):
            layers.append(ConvTranspose1d(source, width, rate, stride=rate))
            layers.extend(ConvNeXtBlock(width, config.block_kernel_size) for _ in range(config.blocks_per_stage))
            source = width
        layers.append(Conv1d(config.stage_channels[0], config.stft_channels, 1, bias=False))
        self.layers = layers

    @property
    def blocks(self) -> list[ConvNeXtBlock]:
        return [layer for layer in self.layers if isinstance(layer, ConvNeXtBlock)]

    def __call__(
        self, latents: mx.array, histories: list[mx.array] | None = None, block_step: BlockStep | None = None
    ) -> tuple[mx.array, list[mx.array]]:
        """Run the stack; ``histories`` (one per ConvNeXt block) carries causal context between calls.
        ``block_step(block, inputs, history)`` runs each ConvNeXt block in place of its own call (fast numerics'
        streaming form, :meth:`engine.networks.codec.fast.CodecFast.block_step`)."""
        hidden = latents
        new_histories: list[mx.array] = []
        for layer in self.layers:
            if isinstance(layer, ConvNeXtBlock):
                history = None if histories is None else histories[len(new_histories)]
                if block_step is not None and history is not None:
                    hidden, history = block_step(layer, hidden, history)
                else:
                    hidden, history = layer(hidden, history)
                new_histories.append(history)
            else:
                hidden = layer(hidden)
        return hidden, new_histories

    def stream_shapes(self) -> list[tuple[int, int]]:
        """Each stage's ``(positions, channels)`` in its blocks for one frame (one latent) of one stream."""
        shapes: list[tuple[int, int]] = []
        positions = 1
        for layer in self.layers:
            if isinstance(layer, ConvTranspose1d):
                positions *= layer.stride
                shapes.append((positions, layer.weight.shape[0]))
        return shapes


class QuantizerVariance(nn.Module):
    """Holds one quantizer's scalar variance (a training parameter, loaded but unused)."""

    def __init__(self) -> None:
        super().__init__()
        self.variance = mx.array(1.0)


@dataclass(frozen=True)
class StackedCodebooks:
    """Every codebook of ``sources`` stacked into one ``(Q · codebook_size, latent_dim)`` table (a copy made
    once), and each quantizer's first row in it."""

    sources: tuple[mx.array, ...]
    table: mx.array
    offsets: mx.array  # (Q, 1) int32


class ResidualQuantizer(nn.Module):
    """Probabilistic residual VQ: ``mus_list[q]`` is codebook ``q`` (``codebook_size x latent_dim``)."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        self.mus_list = [mx.zeros((config.codebook_size, config.latent_dim)) for _ in range(config.num_quantizers)]
        self.variance_list = [QuantizerVariance() for _ in range(config.num_quantizers)]

    def decode(
        self, codes: mx.array, code_sum: Callable[[mx.array, mx.array, mx.array], mx.array] | None = None
    ) -> mx.array:
        """``codes (B, Q, T)`` -> latents ``(B, T, D)``: the codebook rows summed in quantizer order.

        The sum runs one quantizer at a time in the codebook dtype, as the reference does;
        a single reduction would round differently. The rows come from :meth:`codebook_table` in
        one gather (a gather per codebook, with its slice of the codes, was about 120 primitives a
        frame); they are the same values, added in the same order. ``code_sum``, fast numerics' sum as one
        kernel (:class:`engine.kernels.code_sum.CodeSum`, bit for bit the operations'), takes one stream's codes.
        """
        if codes.ndim != 3 or not 0 < codes.shape[1] <= len(self.mus_list):
            raise ValueError(f"codes must be (batch, <= {len(self.mus_list)} quantizers, frames), got {codes.shape}")
        stacked = self.codebook_table()
        quantizers = codes.shape[1]
        if code_sum is not None and codes.shape[0] == 1 and codes.dtype == mx.int32:
            return code_sum(codes, stacked.table, stacked.offsets[:quantizers])
        return code_sum_ops(codes, stacked.table, stacked.offsets[:quantizers])

    def codebook_table(self) -> StackedCodebooks:
        """The stacked codebooks of the current ``mus_list``, made on first use after a load (outside any
        compiled function: :meth:`Codec.step` asks for it before its compiled step)."""
        held = self._stacked_store.get("codebooks")
        if held is None or any(a is not b for a, b in zip(held.sources, self.mus_list, strict=True)):
            size = self.mus_list[0].shape[0]
            offsets = (mx.arange(len(self.mus_list), dtype=mx.int32) * size)[:, None]
            held = StackedCodebooks(tuple(self.mus_list), mx.concatenate(self.mus_list, axis=0), offsets)
            mx.eval(held.table, held.offsets)
            self._stacked_store["codebooks"] = held
        return held

    def weight_views(self) -> dict[str, mx.array]:
        """The stacked table, named for :func:`engine.counters.named_weights` (``prvq.mus_list%``: the
        codebooks, whole, in their dtype)."""
        held = self._stacked_store.get("codebooks")
        return {} if held is None else {f"mus_list{COPY_MARK}": held.table}

    @functools.cached_property
    def _stacked_store(self) -> dict[str, StackedCodebooks]:
        return {}  # in the instance __dict__, outside the parameter tree

    def encode(self, latents: mx.array) -> mx.array:
        """``latents (B, T, D)`` -> codes ``(B, Q, T)`` (int32): greedy nearest mean per quantizer."""
        residual = latents
        codes: list[mx.array] = []
        for means in self.mus_list:
            distances = (
                mx.sum(residual * residual, axis=-1, keepdims=True)
                - 2.0 * (residual @ means.T)
                + mx.sum(means * means, axis=-1)[None, None, :]
            )
            chosen = mx.argmin(distances, axis=-1)
            codes.append(chosen)
            residual = residual - means[chosen]
        return mx.stack(codes, axis=1).astype(mx.int32)


# --------------------------------------------------------------------------- STFT pieces


@functools.lru_cache(maxsize=8)
def _periodic_hann(n_fft: int) -> np.ndarray:
    """float32 periodic Hann window (computed in double, rounded once)."""
    values = [0.5 * (1.0 - math.cos(2.0 * math.pi * n / n_fft)) for n in range(n_fft)]
    return np.asarray(values, dtype=np.float64).astype(np.float32)


@functools.lru_cache(maxsize=32)
def _overlap_norm(n_fft: int, hop: int, num_frames: int) -> mx.array:
    """Window-square sum under each overlap-add sample, shaped ``(num_frames + R - 1, hop)``.

    Summed in float32 frame by frame, in the order a scatter-add over the frames
    accumulates it, then floored at 1e-10, so the values equal the reference's buffer.
    """
    overlap = n_fft // hop
    squares = np.square(_periodic_hann(n_fft)).reshape(overlap, hop)
    rows = num_frames + overlap - 1
    chunk = np.arange(rows)[:, None]
    total = np.zeros((rows, hop), dtype=np.float32)
    for part in reversed(range(overlap)):  # earlier frames contribute their later parts
        covered = (chunk - part >= 0) & (chunk - part < num_frames)
        total = total + np.where(covered, squares[part], np.float32(0.0))
    return mx.array(np.maximum(total, np.float32(_NORM_FLOOR)))


def _overlap_add(frames: mx.array, hop: int) -> mx.array:
    """Overlap-add ``frames (B, F, n_fft)`` at ``hop`` -> ``(B, F + R - 1, hop)`` chunks.

    Output chunk ``m`` adds part ``R-1`` of frame ``m-R+1`` first and part 0 of frame
    ``m`` last: the same float32 order as the reference's scatter-add, without scatter.
    """
    batch, num_frames, n_fft = frames.shape
    overlap = n_fft // hop
    parts = frames.reshape(batch, num_frames, overlap, hop)
    shifted = [
        mx.pad(parts[:, :, part, :], [(0, 0), (part, overlap - 1 - part), (0, 0)]) for part in reversed(range(overlap))
    ]
    total = shifted[0]
    for term in shifted[1:]:
        total = total + term
    return total


# --------------------------------------------------------------------------- cache


@dataclass
class CodecState:
    """Streaming state of one decode stream (a :class:`engine.streaming.StreamState`).

    ``block_inputs[i]``: the last ``kernel - 1`` inputs ``(B, 6, C_i)`` of decoder ConvNeXt
    block ``i``; ``spectrum_real`` / ``spectrum_imag``: the last 4 spectral frames
    ``(B, 4, n_fft/2 + 1)``. All in the decoder's activation dtype; zeros at the start.
    """

    block_inputs: list[mx.array]
    spectrum_real: mx.array
    spectrum_imag: mx.array

    def arrays(self) -> list[mx.array]:
        return [*self.block_inputs, self.spectrum_real, self.spectrum_imag]

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())


# --------------------------------------------------------------------------- codec


class Codec(nn.Module):
    """The VoiceChat codec; load its weights with ``load_into(codec, weights, quantized, CODEC_PREFIX)``.

    A stream is ``state = codec.make_state()``, then ``codec.step(state, codes, hooks)`` per frame (the
    :class:`engine.streaming.Streamer` contract) and ``codec.flush(state)`` at its end. Fast numerics
    (:meth:`use_numerics`) keeps its parts in :attr:`fast`, the one slot the decode branches on.
    """

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        if config.n_fft % config.hop_length:
            raise ValueError(f"n_fft {config.n_fft} must be a multiple of hop_length {config.hop_length}")
        self.config = config
        self.encoder = CodecEncoder(config)
        self.decoder = CodecDecoder(config)
        self.prvq = ResidualQuantizer(config)
        # Samples the centred STFT framing adds on each side of a signal.
        self.edge = (config.n_fft - config.hop_length) // 2
        # Spectral frames carried between streaming steps: enough for both window halves.
        self.carried_frames = 2 * math.ceil(self.edge / config.hop_length)
        # The stream's lag behind the offline decode (8 samples).
        self.delay = self.carried_frames // 2 * config.hop_length
        self._window = mx.array(_periodic_hann(config.n_fft))
        # Fast numerics' form of this codec (engine.networks.codec.fast); None: the reference's operations.
        self.fast: CodecFast | None = None

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    def activation_dtype(self) -> mx.Dtype:
        """The dtype the decoder computes in (the codebooks' and convolution weights' common type)."""
        dtypes = [self.prvq.mus_list[0].dtype]
        for layer in self.decoder.layers:
            dtypes.extend(value.dtype for _, value in parameter_leaves(layer))
        return mx.result_type(*dtypes)

    def use_numerics(self, plan: FastPlan | None) -> dict[str, bool]:
        """Take fast numerics' form for ``plan`` (None: exact mode, the reference's operations); returns which
        of its parts run as kernels (:func:`engine.networks.codec.fast.codec_fast`)."""
        self.fast, changes = codec_fast(self, plan)
        return changes

    def make_state(self, batch_size: int = 1) -> CodecState:
        """A fresh stream: zero convolution context and zero spectral frames."""
        dtype = self.activation_dtype()
        bins = self.config.n_fft // 2 + 1
        return CodecState(
            block_inputs=[
                mx.zeros((batch_size, block.context, block.dwconv.weight.shape[0]), dtype=dtype)
                for block in self.decoder.blocks
            ],
            spectrum_real=mx.zeros((batch_size, self.carried_frames, bins), dtype=dtype),
            spectrum_imag=mx.zeros((batch_size, self.carried_frames, bins), dtype=dtype),
        )

    # ----------------------------------------------------------------------- decode

    def step(self, state: CodecState, codes: mx.array, hooks: FrameHooks = NO_HOOKS) -> mx.array:
        """Decode the next ``codes (B, Q, T)`` of a stream -> ``(B, T * 1764)`` float32; updates ``state``.

        Output lags the offline decode by ``self.delay`` (8) samples (see the module docstring). Where ``hooks``
        times sub-stages the step runs op by op, closing ``codec.dequantize``, ``codec.decoder``, ``codec.istft``.
        """
        self.prvq.codebook_table()  # made here, outside the compiled step, on the first call after a load
        step: Callable[..., tuple[mx.array, list[mx.array], mx.array, mx.array]]
        if hooks.sub_stages:  # a compiled call cannot be split into its parts
            step = functools.partial(self._step_ops, hooks=hooks)
        else:
            step = self._compiled_step() if codes.shape[2] == 1 else self._step_ops
        samples, state.block_inputs, state.spectrum_real, state.spectrum_imag = step(
            codes, state.block_inputs, state.spectrum_real, state.spectrum_imag
        )
        return samples

    def _compiled_step(self) -> Callable[..., tuple[mx.array, list[mx.array], mx.array, mx.array]]:
        """The step compiled for the fast form in use (a trace holds the parts it was traced with)."""
        programs = self._compiled_steps
        if self.fast not in programs:
            programs[self.fast] = jit(self._step_ops)
        return programs[self.fast]

    @functools.cached_property
    def _compiled_steps(self) -> dict[Any, Callable[..., tuple[mx.array, list[mx.array], mx.array, mx.array]]]:
        return {}  # in the instance __dict__, outside the parameter tree

    def _step_ops(
        self,
        codes: mx.array,
        block_inputs: list[mx.array],
        spectrum_real: mx.array,
        spectrum_imag: mx.array,
        hooks: FrameHooks = NO_HOOKS,
    ) -> tuple[mx.array, list[mx.array], mx.array, mx.array]:
        """The streaming decode as a pure function of the codes and the state's arrays."""
        fast = self.fast
        latents = self._dequantize(codes)
        if hooks.sub_stages:
            hooks.sub_stage("codec.dequantize", latents)
        if fast is not None and fast.streams(latents):
            features, block_inputs = fast.decoder_step(self.decoder, latents, block_inputs)
        else:
            features, block_inputs = self.decoder(latents, block_inputs)
        if hooks.sub_stages:
            hooks.sub_stage("codec.decoder", features)
        real, imag = self._spectrum(features)
        real = mx.concatenate([spectrum_real, real], axis=1)
        imag = mx.concatenate([spectrum_imag, imag], axis=1)
        waveform = self._synthesize(real, imag)
        start = self.edge + self.delay
        samples = waveform[:, start : start + codes.shape[2] * self.samples_per_frame]
        if hooks.sub_stages:
            hooks.sub_stage("codec.istft", samples)
        return samples, block_inputs, real[:, -self.carried_frames :], imag[:, -self.carried_frames :]

    def flush(self, state: CodecState) -> mx.array:
        """The last ``delay`` (8) samples of the stream, ``(B, 8)`` float32, which ``step`` holds back.

        Synthesised from the carried spectral frames alone, normalised like the offline
        decode's end. Does not change ``state``; a new stream needs ``make_state()``.
        """
        waveform = self._synthesize(state.spectrum_real, state.spectrum_imag)
        start = self.edge + self.delay
        return waveform[:, start : waveform.shape[1] - self.edge]

    def decode(self, codes: mx.array) -> mx.array:
        """Offline decode of a whole utterance: ``codes (B, Q, T)`` -> ``(B, T * 1764)`` float32."""
        features, _ = self.decoder(self._dequantize(codes))
        waveform = self._synthesize(*self._spectrum(features))
        return waveform[:, self.edge : waveform.shape[1] - self.edge]

    def _dequantize(self, codes: mx.array) -> mx.array:
        """The latents of ``codes``: the codebook rows summed, by fast numerics' kernel where it has one."""
        return self.prvq.decode(codes, None if self.fast is None else self.fast.code_sum)

    def _spectrum(self, features: mx.array) -> tuple[mx.array, mx.array]:
        """Decoder features ``(B, F, 2 * bins)`` -> real and imaginary parts ``(B, F, bins)``."""
        bins = self.config.n_fft // 2 + 1
        magnitude_logits = features[..., :bins]
        phase = features[..., bins:]
        # 100 * sigmoid(m - ln 100), computed in log space as the reference does.
        magnitude = _MAX_MAGNITUDE * mx.exp(-nn.softplus(-magnitude_logits + math.log(_MAX_MAGNITUDE)))
        real = magnitude * mx.cos(phase)
        imag = magnitude * mx.sin(phase)
        # The DC and Nyquist bins of a real signal's spectrum have no imaginary part.
        imag = mx.concatenate([mx.zeros_like(imag[..., :1]), imag[..., 1:-1], mx.zeros_like(imag[..., -1:])], axis=-1)
        return real, imag

    def _synthesize(self, real: mx.array, imag: mx.array) -> mx.array:
        """Inverse STFT of ``(B, F, bins)`` frames -> ``(B, (F - 1) * hop + n_fft)`` float32, untrimmed."""
        n_fft, hop = self.config.n_fft, self.config.hop_length
        frames = mx.fft.irfft(real + 1j * imag, n=n_fft, axis=-1)
        # Keep every sample of a frame inside the window envelope before windowing it.
        frames = mx.clip(frames, -self._window, self._window) * self._window
        chunks = _overlap_add(frames, hop) / _overlap_norm(n_fft, hop, real.shape[1])
        return chunks.reshape(chunks.shape[0], -1)

    # ----------------------------------------------------------------------- encode

    def encode(self, waveform: mx.array) -> mx.array:
        """``waveform (B, 1, N)`` or ``(B, N)`` at 22.05 kHz -> codes ``(B, Q, N // 1764)`` int32."""
        return self.prvq.encode(self.encode_latents(waveform))

    def encode_latents(self, waveform: mx.array) -> mx.array:
        """``waveform (B, 1, N)`` or ``(B, N)`` -> continuous latents ``(B, N // 1764, latent_dim)``."""
        return self.encoder(self._analysis_features(waveform))

    def _analysis_features(self, waveform: mx.array) -> mx.array:
        """Windowed STFT (centred by zero padding, no reflection) -> ``[Re ; Im]`` features ``(B, F, 18)``."""
        if waveform.ndim == 3:
            if waveform.shape[1] != 1:
                raise ValueError(f"the codec encodes mono audio, got {waveform.shape[1]} channels")
            waveform = waveform[:, 0, :]
        if waveform.ndim != 2 or waveform.shape[-1] == 0:
            raise ValueError(f"waveform must be (batch, samples) with samples > 0, got {waveform.shape}")
        n_fft, hop = self.config.n_fft, self.config.hop_length
        padded = mx.pad(waveform.astype(mx.float32), [(0, 0), (self.edge, n_fft - hop - self.edge)])
        if padded.shape[1] < n_fft:
            padded = mx.pad(padded, [(0, 0), (0, n_fft - padded.shape[1])])
        batch, length = padded.shape
        num_frames = 1 + (length - n_fft) // hop
        frames = mx.as_strided(padded, shape=(batch, num_frames, n_fft), strides=(length, hop, 1))
        spectrum = mx.fft.rfft(frames * self._window)
        return mx.concatenate([spectrum.real, spectrum.imag], axis=-1)


def replace_control_codes(
    codes: mx.array, control_codes: mx.array, silence_codes: mx.array, *, quantizer_axis: int = -1
) -> mx.array:
    """Replace every code equal to a control code by its quantizer's silence code.

    ``silence_codes`` has one entry per quantizer, laid along ``quantizer_axis`` of
    ``codes`` (the TTS emits ``(B, T, Q)``, hence -1; pass 1 for ``(B, Q, T)``). Compared on
    the device, no host readback. Keeps ``codes.dtype``.
    """
    is_control = mx.any(mx.expand_dims(codes, -1) == control_codes.astype(codes.dtype), axis=-1)
    axis = quantizer_axis % codes.ndim
    shape = [1] * codes.ndim
    shape[axis] = silence_codes.shape[0]
    silence = silence_codes.astype(codes.dtype).reshape(shape)
    return mx.where(is_control, silence, codes)
