"""Perception: offline FastConformer, the cache-aware streaming step, and their agreement."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.loading.config import PerceptionConfig
from engine.networks.perception import (
    Perception,
    PerceptionState,
    StreamingMel,
    chunked_limited_mask,
    log_mel_spectrogram,
    relative_positions,
)

FRAME = 1280


@pytest.fixture(scope="module")
def perception(tiny_bf16: Path) -> Perception:
    files, weights, quantized = read_runtime_weights(tiny_bf16)
    module = Perception(files.config.audio_config)
    load_into(module, weights, quantized, "stt_model.perception.")
    return module


def _signal(speech: np.ndarray, frames: int) -> mx.array:
    """Speech followed by noise, ``frames`` whole frames long."""
    rng = np.random.default_rng(7)
    tail = (rng.standard_normal(frames * FRAME) * 0.05).astype(np.float32)
    return mx.array(np.concatenate([speech, tail])[: frames * FRAME])


def _stream(perception: Perception, samples: mx.array) -> tuple[mx.array, mx.array, PerceptionState]:
    cache = perception.make_state()
    projected, encoded = [], []
    for index in range(samples.shape[0] // FRAME):
        out = perception.step(cache, samples[index * FRAME : (index + 1) * FRAME])
        mx.eval(*out, *cache.arrays())
        projected.append(out[0])
        encoded.append(out[1])
    return mx.concatenate(projected, axis=1), mx.concatenate(encoded, axis=1), cache


def test_offline_shapes_and_lengths(perception: Perception, speech_16k: np.ndarray) -> None:
    config: PerceptionConfig = perception.perception_config
    samples = _signal(speech_16k, 42)
    mel = log_mel_spectrogram(samples, config.preprocessor)
    assert mel.shape[1] == 42 * 8 + 1
    projected, lengths, encoded = perception(mel)
    # Three stride-2 causal stages: L -> L // 2 + 1 each; 337 -> 169 -> 85 -> 43.
    assert lengths.tolist() == [43]
    assert lengths.dtype == mx.int32
    assert encoded.shape == (1, 43, config.encoder.d_model)
    assert projected.shape == (1, 43, config.output_dim)
    assert encoded.dtype == projected.dtype == mx.float32
    assert np.isfinite(np.array(projected)).all()
    assert perception.encoder.pre_encode.output_lengths(mx.array([1, 8, 9, 100, 337])).tolist() == [1, 2, 2, 14, 43]


def test_streaming_agrees_with_offline(perception: Perception, speech_16k: np.ndarray) -> None:
    """90 frames (past the 70-frame attention context): the two paths differ by float rounding only.

    Measured on the tiny bf16 checkpoint: max-abs 5.4e-6 over all frames (values up to ~3.5),
    not growing with time. The offline pass runs the same causal maths on different matmul
    shapes, and its mel frame 0 has a one-sample-longer reflected edge than the streamed one.
    """
    config = perception.perception_config
    samples = _signal(speech_16k, 90)
    projected, encoded, _ = _stream(perception, samples)
    offline_projected, _, offline_encoded = perception(log_mel_spectrogram(samples, config.preprocessor))
    # Offline has one more frame: the last one sees the right-edge reflect padding.
    assert offline_encoded.shape[1] == encoded.shape[1] + 1 == 91
    encoded_gap = mx.abs(offline_encoded[:, :90] - encoded).max().item()
    projected_gap = mx.abs(offline_projected[:, :90] - projected).max().item()
    assert encoded_gap < 1e-4
    assert projected_gap < 1e-4


def test_step_shapes_and_bounded_caches(perception: Perception, speech_16k: np.ndarray) -> None:
    config = perception.perception_config
    d_model = config.encoder.d_model
    projected, encoded, cache = _stream(perception, _signal(speech_16k, 80))
    assert projected.shape == (1, 80, config.output_dim)
    assert encoded.shape == (1, 80, d_model)
    assert np.isfinite(np.array(projected)).all() and np.isfinite(np.array(encoded)).all()
    assert cache.frames_emitted == 80 and cache.mel_consumed == 8 * 79 + 1
    assert cache.mel.samples.shape == (1440,)
    assert cache.mel_window is not None and cache.mel_window.shape == (1, 17, 128)
    assert all(item is not None and item.shape == (70, d_model) for item in cache.attention)
    assert all(item is not None and item.shape == (1, 8, d_model) for item in cache.convolution)
    layers = len(perception.encoder.layers)
    assert len(cache.arrays()) == 2 + 2 * layers
    assert cache.nbytes() == sum(array.nbytes for array in cache.arrays()) > 0


def test_use_numerics_sets_the_encoder_s_one_fast_slot_and_sub_stages_reach_its_hooks(
    perception: Perception, speech_16k: np.ndarray
) -> None:
    """Perception takes its fast form from a plan (the encoder's one slot; None: exact mode) and a frame whose hooks
    time sub-stages closes each of its four parts with its output; the outputs stay exact mode's (the CPU's fallbacks
    are the operations, the row products summed in another order)."""
    from engine.hooks import NoHooks
    from engine.kernels.plan import FastPlan
    from engine.timeline import INPUT_FRAME_SAMPLES

    class Watching(NoHooks):
        sub_stages = True

        def __init__(self) -> None:
            self.closed: list[str] = []

        def sub_stage(self, name: str, *arrays: object) -> None:
            self.closed.append(name)

    samples = _signal(speech_16k, 3)
    assert INPUT_FRAME_SAMPLES == FRAME
    watching = Watching()
    state = perception.make_state()
    watched = [perception.step(state, samples[i * FRAME : (i + 1) * FRAME], watching)[1] for i in range(3)]
    assert watching.closed == 3 * [
        "perception.mel",
        "perception.subsampling",
        "perception.layers",
        "perception.projection",
    ]
    _, exact, _ = _stream(perception, samples)
    assert mx.array_equal(mx.concatenate(watched, axis=1), exact).item()
    try:
        changes = perception.use_numerics(FastPlan(backend=None))
        assert changes == dict.fromkeys(
            ("relative_attention", "relative_window", "encoder_row_products", "encoder_row_chains"), False
        )
        fast_form = perception.encoder.fast
        assert fast_form is not None and fast_form.rows is not None
        assert len(fast_form.row_weights) == len(perception.encoder.layers)
        _, fast, fast_state = _stream(perception, samples)
        assert all(values is not None for values in fast_state.values)  # the row products cache projected values
    finally:
        assert perception.use_numerics(None) == {}
    assert perception.encoder.fast is None
    assert mx.abs(fast - exact).max().item() < 1e-4


def test_step_is_causal(perception: Perception, speech_16k: np.ndarray) -> None:
    """Encoder frame n depends on audio up to sample 1280·n + 256 only."""
    first = _signal(speech_16k, 12)
    changed = np.array(first)
    changed[6 * FRAME + 257 :] += 0.3  # alter everything after frame 6's right half-window
    _, encoded_a, _ = _stream(perception, first)
    _, encoded_b, _ = _stream(perception, mx.array(changed))
    assert mx.array_equal(encoded_a[:, :7], encoded_b[:, :7])
    assert not mx.array_equal(encoded_a[:, 7], encoded_b[:, 7])


def test_step_rejects_a_wrong_frame(perception: Perception) -> None:
    cache = perception.make_state()
    with pytest.raises(ValueError, match=r"1280 mono samples, got shape \(1279,\)"):
        perception.step(cache, mx.zeros((1279,), dtype=mx.float32))
    with pytest.raises(ValueError, match=r"got shape \(1, 1280\)"):
        perception.step(cache, mx.zeros((1, FRAME), dtype=mx.float32))
    assert cache.mel.total_samples == 0 and cache.frames_emitted == 0  # untouched


def test_step_raises_when_no_encoder_frame_comes_out(perception: Perception) -> None:
    # A front end that looks two frames ahead emits no mel on the first push, so no encoder frame.
    cache = perception.make_state()
    cache.mel = StreamingMel(perception.perception_config.preprocessor, 2 * FRAME).make_state()
    with pytest.raises(RuntimeError, match=r"exactly one encoder frame: mel=\(1, 0, 128\), encoded=\[\]"):
        perception.step(cache, mx.zeros((FRAME,), dtype=mx.float32))


def test_chunked_limited_mask_pattern() -> None:
    mask = np.array(chunked_limited_mask(5, 2, 0, mx.float32))[0, 0]
    visible = mask == 0.0
    expected = np.array([[0 <= i - j <= 2 for j in range(5)] for i in range(5)])
    np.testing.assert_array_equal(visible, expected)
    assert (mask[~visible] == np.float32(-1e30)).all()


def test_relative_positions_are_centred(perception: Perception) -> None:
    config = perception.perception_config.encoder
    rows = np.array(relative_positions(config, 3, mx.float32))
    assert rows.shape == (5, config.d_model)
    # Row 2 is offset 0: sin(0) = 0 in even channels, cos(0) = 1 in odd ones.
    np.testing.assert_array_equal(rows[2, 0::2], 0.0)
    np.testing.assert_array_equal(rows[2, 1::2], 1.0)
    # Rows are offsets +2 .. -2: sin is odd and cos even in the offset.
    np.testing.assert_array_equal(rows[0, 0::2], -rows[4, 0::2])
    np.testing.assert_array_equal(rows[0, 1::2], rows[4, 1::2])
