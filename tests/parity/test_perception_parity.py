"""Perception and RNN-T parity with the reference ports (mlx-vlm 0.7.10 / mlx-audio 0.6.2).

Same checkpoint, same audio: our mel front end, FastConformer (offline and cache-aware
streaming), projection and RNN-T greedy decoding against the reference modules of
``mlx_vlm.load`` of the same tiny checkpoint, driven the way the reference sessions
drive them. Perception and RNN-T weights are never quantized; the q4 cases prove the
loader path on a checkpoint whose other tensors differ.

The tiny checkpoints' joint favours blank by about 3 logits on every frame of the test
speech, so the RNN-T is also compared with the blank bias lowered by 3.0 in both
models alike; that run emits tokens, hits the ``max_symbols`` cap and grows the
transcript frame by frame.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.loading.config import VoiceChatConfig
from engine.loading.tokenizer import RNNTVocabulary
from engine.networks.perception import Perception, StreamingMel, log_mel_spectrogram
from engine.networks.rnnt import RNNTJoint, RNNTPredictor, RNNTState, rnnt_decode, rnnt_step
from tests.conftest import CheckpointFactory, parity_id
from tests.reference import load_reference

pytestmark = pytest.mark.parity

CASES = [(None, 0), (4, 0), (None, 1), (4, 1)]
FRAME = 1280
BLANK_SHIFT = 3.0


@dataclass
class Ours:
    config: VoiceChatConfig
    perception: Perception
    predictor: RNNTPredictor
    joint: RNNTJoint
    vocabulary: RNNTVocabulary

    def rnnt(self) -> dict[str, Any]:
        """Keyword arguments of the greedy decoders."""
        audio = self.config.audio_config
        return {
            "blank_id": self.config.rnnt_blank_id,
            "max_symbols": audio.max_symbols,
            "vocabulary": self.vocabulary,
        }


@functools.lru_cache(maxsize=8)
def _ours(path: Path) -> Ours:
    files, weights, quantized = read_runtime_weights(path)
    audio = files.config.audio_config
    perception = Perception(audio)
    load_into(perception, weights, quantized, "stt_model.perception.")
    predictor = RNNTPredictor(audio.decoder)
    load_into(predictor, weights, quantized, "stt_model.rnnt_decoder.")
    joint = RNNTJoint(audio.joint)
    load_into(joint, weights, quantized, "stt_model.rnnt_joint.")
    return Ours(files.config, perception, predictor, joint, RNNTVocabulary(files.config.rnnt_vocabulary))


def _lowered_blank(ours: Ours, reference: Any) -> tuple[RNNTJoint, Any]:
    """Copies of both joints whose blank logit is lowered by the same bf16 amount (cached models untouched)."""
    from mlx_audio.stt.models.nemotron_asr.rnnt import JointNetwork

    bias = ours.joint.joint_net[2].bias
    assert mx.array_equal(bias, reference.stt_model.rnnt_joint.joint_net[2].bias)
    shift = np.zeros(bias.shape[0], dtype=np.float32)
    shift[ours.config.rnnt_blank_id] = BLANK_SHIFT
    lowered = bias - mx.array(shift, dtype=bias.dtype)

    our_joint = RNNTJoint(ours.config.audio_config.joint)
    our_joint.update(ours.joint.parameters())
    our_joint.joint_net[2].bias = lowered
    reference_joint = JointNetwork(reference.config.audio_config.joint)
    reference_joint.update(reference.stt_model.rnnt_joint.parameters())
    reference_joint.joint_net[2].bias = lowered
    return our_joint, reference_joint


def _reference_parent(reference: Any, joint: Any) -> Any:
    """Stand-in for the session objects the reference RNN-T code reads ``.model`` from."""
    stt = SimpleNamespace(rnnt_decoder=reference.stt_model.rnnt_decoder, rnnt_joint=joint)
    return SimpleNamespace(model=SimpleNamespace(config=reference.config, stt_model=stt))


def _frames(samples: np.ndarray) -> list[mx.array]:
    """80 ms frames; a partial last frame is zero-padded, as the sessions' flush does."""
    count = -(-samples.shape[0] // FRAME)
    padded = np.zeros(count * FRAME, dtype=np.float32)
    padded[: samples.shape[0]] = samples
    audio = mx.array(padded)
    return [audio[index * FRAME : (index + 1) * FRAME] for index in range(count)]


def _max_abs(a: mx.array, b: mx.array) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    return mx.abs(a - b).max().item() if a.size else 0.0


@pytest.mark.parametrize("case", CASES, ids=parity_id)
def test_offline_parity(case: tuple[int | None, int], checkpoint_factory: CheckpointFactory, speech_16k) -> None:
    from mlx_audio.stt.models.nemotron_asr.audio import log_mel_spectrogram as reference_log_mel
    from mlx_vlm.models.nemotron_voicechat.session import VoiceChatSession

    path = checkpoint_factory(*case)
    ours, (reference, _) = _ours(path), load_reference(path)
    samples = mx.array(speech_16k)

    mel = log_mel_spectrogram(samples, ours.config.audio_config.preprocessor)
    reference_mel = reference_log_mel(samples, reference.config.audio_config.preprocessor)
    mel_gap = _max_abs(mel, reference_mel)

    projected, lengths, encoded = ours.perception(mel, mx.array([mel.shape[1]], dtype=mx.int32))
    reference_projected, reference_lengths, reference_encoded = reference.stt_model.perception(
        reference_mel, mx.array([reference_mel.shape[1]], dtype=mx.int32)
    )
    encoded_gap, projected_gap = _max_abs(encoded, reference_encoded), _max_abs(projected, reference_projected)
    assert lengths.tolist() == reference_lengths.tolist() == [encoded.shape[1]]

    frames = int(lengths[0])
    transcripts = []
    for our_joint, reference_joint in [
        (ours.joint, reference.stt_model.rnnt_joint),
        _lowered_blank(ours, reference),
    ]:
        text = rnnt_decode(ours.predictor, our_joint, encoded, frames, **ours.rnnt())
        expected = VoiceChatSession._rnnt_decode(_reference_parent(reference, reference_joint), encoded, frames)
        assert text == expected
        transcripts.append(text)
    assert transcripts[1], "the lowered-blank run should produce a transcript"

    print(
        f"\n[offline {parity_id(case)}] {encoded.shape[1]} encoder frames; max-abs mel {mel_gap} "
        f"encoded {encoded_gap} projected {projected_gap}; "
        f"transcripts {len(transcripts[0])}/{len(transcripts[1])} chars (raw/lowered blank)"
    )
    assert mel_gap == 0.0
    assert encoded_gap == 0.0
    assert projected_gap == 0.0


def _stream_and_compare(path: Path, frames: list[mx.array], *, with_rnnt: bool) -> dict[str, float]:
    from mlx_audio.stt.models.nemotron_asr import ConformerStreamingState, StreamingLogMelSpectrogram
    from mlx_vlm.models.nemotron_voicechat.streaming import _RNNTState

    ours, (reference, _) = _ours(path), load_reference(path)
    audio = ours.config.audio_config
    left, right = audio.encoder.att_context_size[0]

    mel_front_end = StreamingMel(audio.preprocessor, FRAME)
    mel_cache = mel_front_end.make_state()
    cache = ours.perception.make_state()
    reference_mel = StreamingLogMelSpectrogram(reference.config.audio_config.preprocessor, lookahead_samples=FRAME)
    reference_encoder = ConformerStreamingState(
        reference.stt_model.perception.encoder, chunk_frames=1, att_context_size=[left, right]
    )

    joints = [(ours.joint, reference.stt_model.rnnt_joint), _lowered_blank(ours, reference)] if with_rnnt else []
    decoders = [
        (our_joint, RNNTState(ours.config.rnnt_blank_id), _RNNTState(_reference_parent(reference, ref_joint)))
        for our_joint, ref_joint in joints
    ]
    updates = [0] * len(decoders)

    gaps = {"mel": 0.0, "encoded": 0.0, "projected": 0.0}
    for frame in frames:
        mel = mel_front_end.step(mel_cache, frame)
        projected, encoded = ours.perception.step(cache, frame)
        mx.eval(mel, projected, encoded, *mel_cache.arrays(), *cache.arrays())

        expected_mel = reference_mel.push(frame)
        chunks = reference_encoder.push(expected_mel, emit_partial=True)
        assert len(chunks) == 1 and chunks[0].shape[1] == 1
        expected_encoded = chunks[0]
        expected_projected = reference.stt_model.perception.proj(expected_encoded)
        reference_encoder.materialize(expected_projected, expected_encoded)

        gaps["mel"] = max(gaps["mel"], _max_abs(mel, expected_mel))
        gaps["encoded"] = max(gaps["encoded"], _max_abs(encoded, expected_encoded))
        gaps["projected"] = max(gaps["projected"], _max_abs(projected, expected_projected))

        for index, (our_joint, state, reference_state) in enumerate(decoders):
            # Both decoders see the same (reference) encoder frame.
            update = rnnt_step(ours.predictor, our_joint, state, expected_encoded, **ours.rnnt())
            mx.eval(*state.arrays())
            assert update == reference_state.step(expected_encoded)
            assert state.tokens == reference_state.tokens
            assert state.last_token == reference_state.last_token
            updates[index] += update is not None

    assert cache.frames_emitted == len(frames)
    if decoders:
        lowered_state = decoders[1][1]
        assert updates[1] > 1 and len(lowered_state.tokens) > 10, "the lowered-blank run should emit tokens"
        gaps["transcript_updates"] = float(updates[1])
        gaps["tokens"] = float(len(lowered_state.tokens))
    gaps["attention_cache"] = float(cache.attention[0].shape[0]) if cache.attention[0] is not None else 0.0
    return gaps


@pytest.mark.parametrize("case", CASES, ids=parity_id)
def test_streaming_parity(case: tuple[int | None, int], checkpoint_factory: CheckpointFactory, speech_16k) -> None:
    frames = _frames(speech_16k)
    assert len(frames) == 42
    gaps = _stream_and_compare(checkpoint_factory(*case), frames, with_rnnt=True)
    print(f"\n[streaming {parity_id(case)}] {len(frames)} frames: {gaps}")
    assert gaps["mel"] == 0.0
    assert gaps["encoded"] == 0.0
    assert gaps["projected"] == 0.0


@pytest.mark.parametrize("case", [(None, 0), (4, 1)], ids=parity_id)
def test_long_streaming_parity(case: tuple[int | None, int], checkpoint_factory: CheckpointFactory, speech_16k) -> None:
    """100 frames: past the 70-frame attention context, so the cache trimming is compared too."""
    rng = np.random.default_rng(case[1])
    noise = (rng.standard_normal(20 * FRAME) * 0.05).astype(np.float32)
    frames = _frames(np.concatenate([speech_16k, speech_16k, noise]))[:100]
    gaps = _stream_and_compare(checkpoint_factory(*case), frames, with_rnnt=False)
    print(f"\n[long streaming {parity_id(case)}] {len(frames)} frames: {gaps}")
    assert gaps["attention_cache"] == 70.0
    assert gaps["mel"] == 0.0
    assert gaps["encoded"] == 0.0
    assert gaps["projected"] == 0.0
