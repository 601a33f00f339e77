"""Log-mel front end: 16 kHz waveform to 128 log-mel features at 100 frames per second.

The maths is NeMo's ``AudioToMelSpectrogramPreprocessor`` at inference time, in the
exact op order of the reference MLX port so results are bit-identical on the same
backend: pre-emphasis, centred STFT (reflect padding at the signal edges) with a
symmetric Hann window zero-padded to ``n_fft``, power spectrum, Slaney mel filters
built in float32, ``log(mel + guard)`` and (for ``normalize: NA``) no normalisation.

Two entry points share the per-frame maths:

* :func:`log_mel_spectrogram` — a whole waveform at once.
* :class:`StreamingMel` — incremental (``make_state``, ``step(state, samples, hooks)``): samples are
  pushed as they arrive and a frame is emitted once the audio ``lookahead_samples`` past its centre
  is available. The retained sample tail lives in a :class:`MelState`; pre-emphasis of a frame whose
  window does not start at sample 0 uses the true previous sample, so streamed frames
  equal the offline ones.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mlx.core as mx

from ...hooks import NO_HOOKS, FrameHooks
from ...loading.config import PreprocessorConfig
from ...streaming import arrays_nbytes

_HANN_NAMES = frozenset({"hann", "hanning"})


# --------------------------------------------------------------------------- constants


@functools.cache
def hann_window(length: int) -> mx.array:
    """Symmetric Hann window, ``0.5 * (1 - cos(2πn / (length - 1)))``, evaluated in double then stored f32."""
    denominator = length - 1
    values = [0.5 * (1.0 - math.cos(2.0 * math.pi * n / denominator)) for n in range(length)]
    return mx.array(values)


@functools.cache
def _analysis_window(win_length: int, n_fft: int, window: str) -> mx.array:
    """The STFT window: Hann(win_length) centred inside ``n_fft`` zeros (as torch.stft pads it)."""
    if window not in _HANN_NAMES:
        raise ValueError(f"unsupported mel window {window!r}; this model uses 'hann'")
    core = hann_window(win_length)
    if win_length >= n_fft:
        return core
    left = (n_fft - win_length) // 2
    right = n_fft - win_length - left
    return mx.concatenate([mx.zeros((left,), dtype=core.dtype), core, mx.zeros((right,), dtype=core.dtype)])


def _hz_to_slaney_mel(frequency: float) -> float:
    """Slaney mel scale: linear below 1 kHz, logarithmic above (host arithmetic in double)."""
    linear_step = 200.0 / 3
    mel = frequency / linear_step
    knee_hz = 1000.0
    if frequency >= knee_hz:
        mel = knee_hz / linear_step + math.log(frequency / knee_hz) / (math.log(6.4) / 27.0)
    return mel


def _slaney_mel_to_hz(mels: mx.array) -> mx.array:
    """Inverse of the Slaney mel scale, elementwise in float32."""
    linear_step = 200.0 / 3
    knee_hz = 1000.0
    knee_mel = knee_hz / linear_step
    log_step = math.log(6.4) / 27.0
    below = 0.0 + linear_step * mels
    above = knee_hz * mx.exp(log_step * (mels - knee_mel))
    return mx.where(mels >= knee_mel, above, below)


@functools.cache
def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> mx.array:
    """Slaney-normalised triangular filters, shape ``(n_mels, n_fft // 2 + 1)``, built in float32.

    f_min is 0 and f_max the Nyquist frequency; every step runs in float32 on the
    device (not float64), which is what the reference front end does.
    """
    bins = n_fft // 2 + 1
    bin_hz = mx.linspace(0, sample_rate // 2, bins, dtype=mx.float32)
    top_mel = _hz_to_slaney_mel(sample_rate / 2)
    edges_hz = _slaney_mel_to_hz(mx.linspace(_hz_to_slaney_mel(0.0), top_mel, n_mels + 2, dtype=mx.float32))

    widths = edges_hz[1:] - edges_hz[:-1]
    offsets = mx.expand_dims(edges_hz, 0) - mx.expand_dims(bin_hz, 1)  # (bins, n_mels + 2)
    rising = (-offsets[:, :-2]) / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    filters = mx.maximum(mx.zeros_like(rising), mx.minimum(rising, falling))
    # Slaney area normalisation: each triangle integrates to the same value.
    filters *= mx.expand_dims(2.0 / (edges_hz[2 : n_mels + 2] - edges_hz[:n_mels]), 0)
    return filters.moveaxis(0, 1)


# --------------------------------------------------------------------------- shared maths


def _pre_emphasis(x: mx.array, coefficient: float) -> mx.array:
    """``y[0] = x[0]``, ``y[n] = x[n] - a·x[n-1]``; a no-op when the coefficient is 0."""
    if not coefficient or coefficient <= 0:
        return x
    return mx.concatenate([x[:1], x[1:] - coefficient * x[:-1]], axis=0)


def _power_to_features(power: mx.array, config: PreprocessorConfig, dtype: mx.Dtype) -> mx.array:
    """``(frames, bins)`` power spectrum to ``(1, frames, features)`` log-mel features."""
    filters = mel_filterbank(config.sample_rate, config.n_fft, config.features)
    mel = filters.astype(power.dtype) @ power.T  # (features, frames)
    mel = mx.log(mel + mx.array(config.log_zero_guard_value, dtype=mel.dtype))
    if config.normalize == "per_feature":
        mean = mx.mean(mel, axis=1, keepdims=True)
        dof = max(mel.shape[1] - 1, 1)
        std = mx.sqrt(mx.sum((mel - mean) ** 2, axis=1, keepdims=True) / dof)
        mel = (mel - mean) / (std + 1e-5)
    elif config.normalize == "all_features":
        mel = (mel - mx.mean(mel)) / (mx.std(mel) + 1e-5)
    return mx.expand_dims(mel.T, axis=0).astype(dtype)


def _power_spectrum(padded: mx.array, frames: int, config: PreprocessorConfig, dtype: mx.Dtype) -> mx.array:
    """Windowed rFFT power of ``frames`` hop-spaced ``n_fft`` slices of an already padded signal."""
    window = _analysis_window(config.win_length, config.n_fft, config.window)
    slices = mx.as_strided(padded, shape=(frames, config.n_fft), strides=(config.hop_length, 1))
    return mx.square(mx.abs(mx.fft.rfft(slices * window))).astype(dtype)


# --------------------------------------------------------------------------- offline


def log_mel_spectrogram(samples: mx.array, config: PreprocessorConfig) -> mx.array:
    """Log-mel features ``(1, 1 + N // hop, features)`` of a mono waveform ``(N,)``; frame t is centred on ``hop·t``."""
    if samples.ndim != 1:
        raise ValueError(f"log_mel_spectrogram needs mono samples of shape (N,), got {tuple(samples.shape)}")
    dtype = samples.dtype
    x = samples
    if config.pad_to > 0 and x.shape[0] < config.pad_to:
        x = mx.pad(x, [(0, config.pad_to - x.shape[0])], constant_values=config.pad_value)
    x = _pre_emphasis(x, config.preemph)

    half = config.n_fft // 2
    if config.pad_mode == "reflect":
        # Mirror about the edge samples, which are not repeated.
        x = mx.concatenate([x[1 : half + 1][::-1], x, x[-(half + 1) : -1][::-1]])
    elif config.pad_mode == "constant":
        x = mx.pad(x, [(half, half)])
    else:
        raise ValueError(f"unsupported STFT pad mode {config.pad_mode!r}")
    frames = 1 + (x.shape[0] - config.n_fft) // config.hop_length
    if frames <= 0:
        raise ValueError(f"audio too short for the mel front end: {samples.shape[0]} samples")
    return _power_to_features(_power_spectrum(x, frames, config, dtype), config, dtype)


def _frame_range(buffer: mx.array, config: PreprocessorConfig, first: int, end: int) -> mx.array:
    """Frames ``first .. end-1`` of the waveform held in ``buffer``, indices relative to ``buffer[0]``.

    Equal to the same frames of :func:`log_mel_spectrogram` over the whole signal as
    long as ``buffer`` holds the sample before each window (for pre-emphasis) and
    starts at the true beginning whenever a window reaches before ``buffer[0]``.
    """
    dtype = buffer.dtype
    count = end - first
    if count <= 0:
        return mx.zeros((1, 0, config.features), dtype=dtype)
    hop, n_fft, half = config.hop_length, config.n_fft, config.n_fft // 2
    window_start = first * hop - half
    window_end = (end - 1) * hop - half + n_fft
    available = buffer.shape[0]
    lo, hi = max(window_start, 0), min(window_end, available)
    raw = buffer[lo:hi]

    coefficient = config.preemph
    if coefficient and coefficient > 0 and raw.shape[0] > 0:
        if lo > 0:
            # Continue the filter from the true previous sample rather than restarting it.
            head = raw[:1] - coefficient * buffer[lo - 1 : lo]
            raw = mx.concatenate([head, raw[1:] - coefficient * raw[:-1]], axis=0)
        else:
            raw = _pre_emphasis(raw, coefficient)

    before, after = max(-window_start, 0), max(window_end - available, 0)
    parts: list[mx.array] = []
    if before:
        parts.append(_edge_padding(raw[1 : before + 1][::-1], before, config.pad_mode, dtype))
    parts.append(raw.astype(dtype))
    if after:
        parts.append(_edge_padding(raw[-(after + 1) : -1][::-1], after, config.pad_mode, dtype))
    segment = mx.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]

    needed = (count - 1) * hop + n_fft
    if segment.shape[0] < needed:
        segment = mx.pad(segment, [(0, needed - segment.shape[0])], constant_values=0.0)
    return _power_to_features(_power_spectrum(segment, count, config, dtype), config, dtype)


def _edge_padding(mirrored: mx.array, length: int, mode: str, dtype: mx.Dtype) -> mx.array:
    if mode == "reflect":
        return mirrored
    if mode == "constant":
        return mx.zeros((length,), dtype=dtype)
    raise ValueError(f"unsupported STFT pad mode {mode!r}")


# --------------------------------------------------------------------------- streaming


@dataclass
class MelState:
    """Streaming front-end state: the retained waveform tail and the frame counters (a
    :class:`engine.streaming.StreamState`).

    ``samples[0]`` is global sample ``start``; ``start`` is always a multiple of the hop.
    """

    samples: mx.array
    start: int
    total_samples: int
    next_frame: int
    lookahead_samples: int

    def arrays(self) -> list[mx.array]:
        """Arrays to evaluate once per frame so the retained tail does not chain lazily across frames."""
        return [self.samples]

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())


def _check_streamable(config: PreprocessorConfig) -> None:
    if config.pad_to > 0:
        raise NotImplementedError("streaming mel extraction does not support pad_to > 0")
    if config.normalize in ("per_feature", "all_features"):
        raise NotImplementedError("streaming mel extraction needs normalize='NA'")


class StreamingMel:
    """The streaming front end for ``config``: a frame is emitted once ``lookahead_samples`` past its centre are
    pushed (the :class:`engine.streaming.Streamer` contract)."""

    def __init__(self, config: PreprocessorConfig, lookahead_samples: int) -> None:
        _check_streamable(config)
        if lookahead_samples < config.n_fft // 2:
            raise ValueError(
                f"lookahead_samples={lookahead_samples} must cover half the STFT window ({config.n_fft // 2} samples)"
            )
        self.config = config
        self.lookahead_samples = lookahead_samples

    def make_state(self) -> MelState:
        """An empty stream."""
        return MelState(
            samples=mx.zeros((0,), dtype=mx.float32),
            start=0,
            total_samples=0,
            next_frame=0,
            lookahead_samples=self.lookahead_samples,
        )

    def step(self, state: MelState, samples: mx.array, hooks: FrameHooks = NO_HOOKS) -> mx.array:
        """Push mono samples; return the newly available frames ``(1, n, features)`` (n may be 0).

        Frame t is emitted once ``total_samples - lookahead_samples >= hop·t``. With a
        1280-sample lookahead and 1280-sample pushes, push 1 emits frame 0 and every later
        push 8 frames. Only host integers are used for the bookkeeping; nothing is evaluated.
        """
        config, cache = self.config, state
        if not isinstance(samples, mx.array):
            samples = mx.array(samples)
        if samples.ndim != 1:
            raise ValueError(f"the mel step needs mono samples of shape (N,), got {tuple(samples.shape)}")
        if cache.samples.shape[0] == 0:
            cache.samples = samples
        elif samples.shape[0] > 0:
            cache.samples = mx.concatenate([cache.samples, samples.astype(cache.samples.dtype)])
        cache.total_samples += samples.shape[0]

        hop = config.hop_length
        newest_centre = cache.total_samples - cache.lookahead_samples
        end = newest_centre // hop + 1 if newest_centre >= 0 else 0
        if end <= cache.next_frame:
            return mx.zeros((1, 0, config.features), dtype=cache.samples.dtype)

        buffer_first_frame = cache.start // hop
        frames = _frame_range(cache.samples, config, cache.next_frame - buffer_first_frame, end - buffer_first_frame)
        cache.next_frame = end

        # Keep enough audio before the next frame's window (plus one sample for pre-emphasis).
        lookbehind_frames = math.ceil((config.n_fft // 2 + 1) / hop)
        keep_from = max(end - lookbehind_frames, 0) * hop
        drop = keep_from - cache.start
        if drop > 0:
            cache.samples = cache.samples[drop:]
            cache.start = keep_from
        return frames
