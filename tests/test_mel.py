"""Log-mel front end: constants, offline features, and the streaming emission rule."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from engine.loading.config import PreprocessorConfig
from engine.networks.perception.mel import StreamingMel, hann_window, log_mel_spectrogram, mel_filterbank

CONFIG = PreprocessorConfig()
FRAME = 1280  # one 80 ms frame at 16 kHz


def _noise(frames: int, seed: int = 1) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array((rng.standard_normal(frames * FRAME) * 0.1).astype(np.float32))


def _stream(samples: mx.array, chunk: int, lookahead: int = FRAME) -> tuple[mx.array, list[int]]:
    """Push ``samples`` in ``chunk``-sample pieces; return all frames and the frame count of each push."""
    mel = StreamingMel(CONFIG, lookahead)
    cache = mel.make_state()
    outputs, counts = [], []
    for start in range(0, samples.shape[0], chunk):
        frames = mel.step(cache, samples[start : start + chunk])
        mx.eval(frames, *cache.arrays())
        outputs.append(frames)
        counts.append(frames.shape[1])
    return mx.concatenate(outputs, axis=1), counts


def _slaney_filters_numpy(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Independent float64 Slaney filterbank (librosa's formulation)."""

    def to_mel(hz: np.ndarray) -> np.ndarray:
        mel = hz / (200.0 / 3)
        log_region = hz >= 1000.0
        mel[log_region] = 15.0 + np.log(hz[log_region] / 1000.0) / (np.log(6.4) / 27.0)
        return mel

    def to_hz(mel: np.ndarray) -> np.ndarray:
        hz = mel * (200.0 / 3)
        log_region = mel >= 15.0
        hz[log_region] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[log_region] - 15.0))
        return hz

    bins = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = to_hz(np.linspace(0.0, to_mel(np.array([sample_rate / 2.0]))[0], n_mels + 2))
    filters = np.zeros((n_mels, bins.size))
    for m in range(n_mels):
        rising = (bins - edges[m]) / (edges[m + 1] - edges[m])
        falling = (edges[m + 2] - bins) / (edges[m + 2] - edges[m + 1])
        filters[m] = np.maximum(0.0, np.minimum(rising, falling)) * 2.0 / (edges[m + 2] - edges[m])
    return filters


def test_hann_window_is_numpys_symmetric_hann() -> None:
    window = np.array(hann_window(400))
    np.testing.assert_allclose(window, np.hanning(400), atol=1e-7)
    assert window.dtype == np.float32


def test_filterbank_matches_an_independent_slaney_implementation() -> None:
    ours = np.array(mel_filterbank(16_000, 512, 128))
    assert ours.shape == (128, 257)
    expected = _slaney_filters_numpy(16_000, 512, 128)
    # Built in float32 on the device, as the reference does: agreement to float32 rounding.
    np.testing.assert_allclose(ours, expected, atol=2e-6)


def test_offline_shape_dtype_and_silence_floor(speech_16k: np.ndarray) -> None:
    samples = mx.array(speech_16k)
    features = log_mel_spectrogram(samples, CONFIG)
    assert features.shape == (1, 1 + speech_16k.shape[0] // 160, 128)
    assert features.dtype == mx.float32
    values = np.array(features)
    assert np.isfinite(values).all()
    # The last 1.5 s are exact zeros: power 0, so the log hits the guard value exactly.
    floor = np.float32(math.log(np.float32(2.0**-24)))
    np.testing.assert_array_equal(values[0, -50:], np.full((50, 128), floor, dtype=np.float32))
    # Speech is well above the floor.
    assert values[0, :100].max() > floor + 10


def test_offline_rejects_non_mono() -> None:
    with pytest.raises(ValueError, match="mono"):
        log_mel_spectrogram(mx.zeros((2, 1600)), CONFIG)


def test_emission_rule_one_then_eight_frames_and_bounded_buffer() -> None:
    mel = StreamingMel(CONFIG, FRAME)
    cache = mel.make_state()
    samples = _noise(12)
    for push in range(12):
        frames = mel.step(cache, samples[push * FRAME : (push + 1) * FRAME])
        mx.eval(frames, *cache.arrays())
        assert cache.nbytes() == 4 * cache.samples.shape[0]  # the retained float32 tail
        assert frames.shape == (1, 1 if push == 0 else 8, 128)
        # After push k (1-based) the newest frame is centred on sample 1280·(k-1).
        assert cache.next_frame == 8 * push + 1
        if push >= 1:
            # Retained: two frames of look-behind before the next frame, up to the newest sample.
            assert cache.samples.shape == (1440,)
            assert cache.start == cache.total_samples - 1440


def test_chunk_size_does_not_change_the_frames() -> None:
    samples = _noise(30)
    by_frame, _ = _stream(samples, FRAME)
    by_777, counts = _stream(samples, 777)
    assert 0 in counts  # some 777-sample pushes complete no frame
    assert by_frame.shape == by_777.shape == (1, 8 * 29 + 1, 128)
    # Frame 0 of a 1280-sample first push is computed before sample 256 has arrived, so its
    # reflected left edge is one sample short (the reference front end does the same); every
    # later frame sees identical samples and is bit-identical.
    assert mx.array_equal(by_frame[:, 1:], by_777[:, 1:])
    frame0_gap = mx.abs(by_frame[:, 0] - by_777[:, 0]).max().item()
    assert 0.0 < frame0_gap < 1e-3


def test_streamed_frames_equal_offline_frames() -> None:
    samples = _noise(30)
    offline = log_mel_spectrogram(samples, CONFIG)
    streamed, _ = _stream(samples, 777)
    # Streaming never synthesises right padding, so it stops 8 frames short of the offline end.
    assert offline.shape[1] == streamed.shape[1] + 8
    assert mx.array_equal(streamed, offline[:, : streamed.shape[1]])


def test_lookahead_and_input_validation() -> None:
    with pytest.raises(ValueError, match="lookahead"):
        StreamingMel(CONFIG, 255)
    mel = StreamingMel(CONFIG, FRAME)
    with pytest.raises(ValueError, match="mono"):
        mel.step(mel.make_state(), mx.zeros((1, FRAME)))
    with pytest.raises(NotImplementedError):
        StreamingMel(PreprocessorConfig(normalize="per_feature"), FRAME)


def test_empty_push_emits_nothing() -> None:
    mel = StreamingMel(CONFIG, FRAME)
    cache = mel.make_state()
    frames = mel.step(cache, mx.zeros((0,), dtype=mx.float32))
    assert frames.shape == (1, 0, 128)
    assert cache.total_samples == 0 and cache.next_frame == 0
