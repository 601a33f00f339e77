"""Codec parity with mlx-audio 0.6.2's ``NemotronVoiceChatCodec`` (through mlx-vlm 0.7.10's loaded model).

The codec is stored in bf16 in every checkpoint (never quantized), so bf16 and q4 of
both seeds cover it. Floats must agree bit for bit (max-abs 0.0), codes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
import soxr

from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.networks.codec import CODEC_PREFIX, Codec, replace_control_codes
from tests.conftest import parity_id
from tests.reference import load_reference, reference_session

pytestmark = pytest.mark.parity

CODEC_CHECKPOINTS = [(None, 0), (4, 0), (None, 1), (4, 1)]
STREAM_FRAMES = 66


@dataclass
class Pair:
    ours: Codec
    reference: Any
    session: Any
    silence: mx.array  # (Q,) the checkpoint's codec_silence_tokens
    control: mx.array  # (3,) the checkpoint's control codes
    root: Path


@pytest.fixture(scope="module", params=CODEC_CHECKPOINTS, ids=parity_id)
def pair(request: pytest.FixtureRequest, checkpoint_factory) -> Pair:
    root = checkpoint_factory(*request.param)
    files, weights, quantized = read_runtime_weights(root)
    codec = Codec(files.config.codec_config)
    load_into(codec, weights, quantized, CODEC_PREFIX)
    model, _ = load_reference(root)
    return Pair(
        ours=codec,
        reference=model.tts_model.audio_codec,
        session=reference_session(root),
        silence=weights["tts_model.codec_silence_tokens"],
        control=weights["tts_model.control_codes"],
        root=root,
    )


def _max_abs(a: mx.array, b: mx.array) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def _timeline_codes(pair: Pair, seed: int) -> mx.array:
    """``(1, frames, Q)`` codes as the TTS hands them over: random, some control codes, silence frames."""
    rng = np.random.default_rng(seed)
    config = pair.ours.config
    codes = rng.integers(0, config.codebook_size, (1, STREAM_FRAMES, config.num_quantizers))
    control = np.asarray(pair.control)
    sprinkle = rng.random(codes.shape) < 0.05
    codes[sprinkle] = rng.choice(control, size=int(sprinkle.sum()))
    silence = np.asarray(pair.silence)
    codes[:, 0] = silence  # timeline step 0 emits silence without a TTS step
    codes[:, 40:43] = silence
    return mx.array(codes.astype(np.int32))


def test_streaming_step_matches_reference_decode_step(pair: Pair) -> None:
    from mlx_audio.codec.models.nemotron_voicechat import CausalConv1dCache

    raw = _timeline_codes(pair, seed=7)
    ours_clean = replace_control_codes(raw, pair.control, pair.silence)
    reference_clean = pair.session._replace_control_codes(raw)
    assert mx.array_equal(ours_clean, reference_clean).item()

    cache = pair.ours.make_state()
    reference_cache = CausalConv1dCache()
    worst = 0.0
    for frame in range(raw.shape[1]):
        step_codes = ours_clean[:, frame : frame + 1, :].transpose(0, 2, 1)
        samples = pair.ours.step(cache, step_codes)
        mx.eval(samples, *cache.arrays())
        expected = pair.reference.decode_step(
            reference_clean[:, frame : frame + 1, :].transpose(0, 2, 1), reference_cache
        )
        assert samples.shape == (1, 1764) and samples.dtype == mx.float32
        assert expected.shape == (1, 1, 1764)
        worst = max(worst, _max_abs(samples, expected[:, 0]))
    print(f"codec step {pair.root.name}: {raw.shape[1]} frames, max-abs {worst}")
    assert worst == 0.0


def test_offline_decode_matches_reference(pair: Pair) -> None:
    rng = np.random.default_rng(11)
    config = pair.ours.config
    codes = mx.array(rng.integers(0, config.codebook_size, (2, config.num_quantizers, 12)).astype(np.int32))
    ours = pair.ours.decode(codes)
    expected = pair.reference.decode(codes)[:, 0]
    assert ours.shape == expected.shape == (2, 12 * 1764) and ours.dtype == mx.float32
    difference = _max_abs(ours, expected)
    print(f"codec decode {pair.root.name}: 2 x 12 frames, max-abs {difference}")
    assert difference == 0.0


def test_encode_of_warmup_silence_matches_reference(pair: Pair) -> None:
    silence = mx.zeros((1, 1, 38 * 1764), dtype=mx.float32)
    ours = pair.ours.encode(silence)
    expected = pair.reference.encode(silence)
    assert ours.shape == expected.shape == (1, 31, 38)
    assert mx.array_equal(ours, expected.astype(mx.int32)).item()


def test_encode_of_speech_matches_reference(pair: Pair, speech_16k: np.ndarray) -> None:
    speech = soxr.resample(speech_16k, 16_000, 22_050).astype(np.float32)
    waveform = mx.array(np.stack([speech, 0.5 * speech[::-1]])[:, None, :])
    latents = pair.ours.encode_latents(waveform)
    expected_latents = pair.reference.encode_latents(waveform)
    difference = _max_abs(latents, expected_latents)
    ours = pair.ours.encode(waveform)
    expected = pair.reference.encode(waveform)
    frames = speech.shape[0] // 1764
    assert ours.shape == expected.shape == (2, 31, frames)
    assert mx.array_equal(ours, expected.astype(mx.int32)).item()
    assert len(np.unique(np.asarray(ours[0, 0]))) > 1  # the input actually varies
    print(f"codec encode {pair.root.name}: 2 x {frames} frames, latents max-abs {difference}")
    assert difference == 0.0


def test_replace_control_codes_matches_reference(pair: Pair) -> None:
    rng = np.random.default_rng(3)
    config = pair.ours.config
    # Codes up to codebook_size + 3 cover all three control codes and their neighbours.
    codes = mx.array(rng.integers(0, config.codebook_size + 3, (2, 9, config.num_quantizers)).astype(np.int32))
    ours = replace_control_codes(codes, pair.control, pair.silence)
    expected = pair.session._replace_control_codes(codes)
    assert mx.array_equal(ours, expected).item()
    assert not mx.array_equal(ours, codes).item()
    assert int(mx.max(ours).item()) < config.codebook_size
    # The (B, Q, T) layout gives the same result transposed.
    transposed = replace_control_codes(codes.transpose(0, 2, 1), pair.control, pair.silence, quantizer_axis=1)
    assert mx.array_equal(transposed, expected.transpose(0, 2, 1)).item()


def test_istft_constants_match_reference() -> None:
    from mlx_audio.dsp import ISTFTCache, hanning

    from engine.networks.codec.codec import _overlap_norm, _periodic_hann

    window = hanning(16, periodic=True).astype(mx.float32)
    assert np.array_equal(_periodic_hann(16), np.asarray(window))
    for frames in (4, 445, 441 * 3):
        expected = ISTFTCache().get_norm_buffer(16, 4, 16, window, frames)
        assert np.array_equal(np.asarray(_overlap_norm(16, 4, frames)).reshape(-1), np.asarray(expected))
