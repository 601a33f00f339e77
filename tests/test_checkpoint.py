"""Checkpoint generation, verification and loading. Every error a user can meet is in test_bad_input.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.loading.checkpoint import open_checkpoint, read_runtime_weights, sanitize, verify_layout
from engine.loading.config import VoiceChatConfig
from engine.loading.layout import checkpoint_tensors, runtime_tensors
from engine.loading.random_checkpoint import base_config, build_tokenizer, checkpoint_nbytes, make_checkpoint
from engine.loading.tokenizer import TextTokenizer

# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("quantize", [None, 4, 8])
def test_generated_checkpoint_has_published_layout(checkpoint_factory, quantize):
    root = checkpoint_factory(quantize, 0)
    files = open_checkpoint(root)
    quantized = verify_layout(files)
    config = files.config
    assert config.text_config.hybrid_override_pattern.count("M") >= 2
    assert "*" in config.text_config.hybrid_override_pattern and "-" in config.text_config.hybrid_override_pattern
    tts = config.tts_config
    assert any(tts.is_global_layer(i) for i in range(tts.num_hidden_layers))
    assert not all(tts.is_global_layer(i) for i in range(tts.num_hidden_layers))
    assert config.output_frame_samples == 1764 and config.frame_samples == 1280
    if quantize is None:
        assert quantized == {}
    else:
        # LLM projections, the embedding and both heads: everything else stays bf16.
        assert all(name.startswith("stt_model.") and ".perception." not in name for name in quantized)
        assert "stt_model.embed_tokens" in quantized and "stt_model.lm_head" in quantized
        assert {bits for _, bits in quantized.values()} == {quantize}
        scales = files.tensors["stt_model.lm_head.scales"]
        assert scales.dtype == "F32"
    assert len(files.shards) >= 2, "the tiny checkpoint is sharded so multi-shard loading is exercised"


def test_generation_is_seeded(tmp_path):
    a = make_checkpoint(tmp_path / "a", seed=3)
    b = make_checkpoint(tmp_path / "b", seed=3)
    c = make_checkpoint(tmp_path / "c", seed=4)
    _, wa, _ = read_runtime_weights(a)
    _, wb, _ = read_runtime_weights(b)
    _, wc, _ = read_runtime_weights(c)
    name = "stt_model.llm.layers.0.mixer.in_proj.weight"
    assert mx.array_equal(wa[name], wb[name]).item()
    assert not mx.array_equal(wa[name], wc[name]).item()


def test_full_size_matches_published_sizes():
    """Computed bytes of the full-size layout vs the published repositories (9.17 / 13.9 / 22.2 GB)."""
    published = {4: 9.17e9, 8: 13.9e9, None: 22.2e9}
    for quantize, size in published.items():
        assert abs(checkpoint_nbytes("full", quantize) - size) / size < 0.01


def test_full_size_parameter_count():
    config = VoiceChatConfig.from_dict(base_config("full"))
    total = sum(int(np.prod(spec.source_shape)) for spec in checkpoint_tensors(config))
    # 11.095 B parameters including integer buffers (and the stored mel filterbank/window).
    assert abs(total - 11_095_332_870) / 11_095_332_870 < 1e-4


def test_tokenizer_has_256_single_characters_and_covers_every_id():
    tokenizer = build_tokenizer(1024, seed=0)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    assert sorted(vocab.values()) == list(range(1024))
    assert sum(1 for token in vocab if len(token) == 1) == 256
    assert vocab["<s>"] == 1 and vocab["</s>"] == 2 and vocab["<SPECIAL_12>"] == 12
    text = "What is the capital of France?"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text), "merges shorten common English"


def test_tokenizer_round_trip_through_wrapper(tiny_bf16):
    tokenizer = TextTokenizer.from_file(tiny_bf16 / "tokenizer.json")
    ids = tokenizer.encode("Hello, what is the weather today?")
    assert tokenizer.decode(ids) == "Hello, what is the weather today?"
    assert tokenizer.get_vocab()["</s>"] == 2


# --------------------------------------------------------------------------- loading


def test_round_trip_generate_load_same_tensors(tmp_path):
    """Generated tensors come back unchanged (after the documented layout conversion)."""
    root = make_checkpoint(tmp_path / "ck", seed=5)
    files, weights, _ = read_runtime_weights(root)
    raw = {}
    for shard in files.shards:
        raw.update(mx.load(str(shard)))
    specs = runtime_tensors(files.config)
    assert set(weights) == set(specs)
    conv = "stt_model.perception.encoder.layers.0.conv.depthwise_conv.weight"
    assert mx.array_equal(weights[conv], raw[conv].transpose(0, 2, 1)).item()
    convt = "tts_model.audio_codec.decoder.layers.0.weight"
    assert mx.array_equal(weights[convt], raw[convt].transpose(1, 2, 0)).item()
    lstm = "stt_model.rnnt_decoder.prediction.dec_rnn.lstm.1"
    summed = raw[f"{lstm[:-2]}.bias_ih_l1"] + raw[f"{lstm[:-2]}.bias_hh_l1"]
    assert mx.array_equal(weights[f"{lstm}.bias"], summed).item()
    assert mx.array_equal(weights["tts_model.control_codes"], raw["tts_model._control_codes"]).item()
    plain = "tts_model.tts_model.mog_head.proj_mus.weight"
    assert mx.array_equal(weights[plain], raw[plain]).item()
    for name, spec in specs.items():
        assert tuple(weights[name].shape) == spec.shape, name


def test_sanitize_is_idempotent(tiny_q4):
    files, weights, _ = read_runtime_weights(tiny_q4)
    again = sanitize(weights, files.config)
    assert set(again) == set(weights)
    assert all(mx.array_equal(again[k], weights[k]).item() for k in weights)


def test_converted_runtime_layout_folder_loads(tmp_path, tiny_bf16):
    """A folder already in runtime layout (converted once) verifies and loads to the same weights."""
    _, weights, _ = read_runtime_weights(tiny_bf16)
    target = tmp_path / "converted"
    target.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(tiny_bf16 / name, target / name)
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    _, again, _ = read_runtime_weights(target)
    assert set(again) == set(weights)
    assert all(mx.array_equal(again[k], weights[k]).item() for k in weights)


def test_precast_copies_are_made_only_when_they_fit_and_change_nothing(
    tiny_q4: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The float32 copies are skipped when the weights, a 10-minute conversation and the copies would not
    fit in memory together; the conversation is then slower but says exactly the same."""
    import engine.loading.memory as engine_memory
    from app.bench import FRAME, bench_input
    from engine.loading.memory import state_growth_per_frame
    from engine.model import load_voicechat
    from engine.session import Session

    roomy = load_voicechat(tiny_q4, conversation_seconds=600)
    assert roomy.precast_bytes > 0 and roomy.describe()["precast_bytes"] == roomy.precast_bytes
    conversation = sum(state_growth_per_frame(roomy.config, frame) for frame in range(7500))
    just_short = roomy.nbytes + conversation + roomy.precast_bytes // 2  # room for half the copies
    monkeypatch.setattr(engine_memory, "physical_memory_bytes", lambda: int(just_short / engine_memory.MEMORY_SHARE))
    tight = load_voicechat(tiny_q4, conversation_seconds=600)
    assert tight.precast_bytes == 0
    assert load_voicechat(tiny_q4, conversation_seconds=0).precast_bytes == roomy.precast_bytes  # no conversation

    samples = bench_input(12)
    outputs = []
    for voicechat in (roomy, tight):
        session = Session(voicechat, seed=0)
        codes = []
        for start in range(0, samples.size, FRAME):
            codes += [
                e.codes.tolist() for e in session.push(samples[start : start + FRAME], 16_000) if hasattr(e, "codes")
            ]
        outputs.append((session.text_ids, session.function_ids, codes))
        session.close()
    assert outputs[0] == outputs[1] and len(outputs[0][2]) == 12
