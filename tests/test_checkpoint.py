"""Checkpoint generation, verification and loading — including every error a user can meet."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.checkpoint import open_checkpoint, read_runtime_weights, sanitize, verify_layout
from engine.config import VoiceChatConfig
from engine.errors import (
    CheckpointNotFoundError,
    ConfigError,
    ShardError,
    TensorMismatchError,
    TokenizerError,
)
from engine.layout import checkpoint_tensors, runtime_tensors
from engine.random_checkpoint import base_config, build_tokenizer, checkpoint_nbytes, make_checkpoint
from engine.tokenizer import TextTokenizer


def _copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(source, target)
    return target


def _shard_with(root: Path, tensor: str) -> Path:
    index = json.loads((root / "model.safetensors.index.json").read_text())
    return root / index["weight_map"][tensor]


def _rewrite_shard(path: Path, edit) -> None:
    """Load a shard, let ``edit`` change the dict of arrays, write it back."""
    arrays = dict(mx.load(str(path)))
    edit(arrays)
    mx.save_safetensors(str(path), arrays, metadata={"format": "mlx"})


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


# --------------------------------------------------------------------------- errors


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        open_checkpoint(tmp_path / "nowhere")


def test_missing_config(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    (root / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"config\.json is missing"):
        open_checkpoint(root)


def test_unreadable_config(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    (root / "config.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="unreadable config"):
        open_checkpoint(root)


def test_config_from_another_model(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    config = json.loads((root / "config.json").read_text())
    config["model_type"] = "llama"
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="model_type is 'llama'"):
        open_checkpoint(root)


def test_missing_tokenizer(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    (root / "tokenizer.json").unlink()
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is missing"):
        open_checkpoint(root)


def test_corrupt_tokenizer(tmp_path, tiny_bf16):
    (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(TokenizerError, match=r"not a readable tokenizer\.json"):
        TextTokenizer.from_file(tmp_path / "tokenizer.json")


def test_missing_shard(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    shard = _shard_with(root, "stt_model.lm_head.weight")
    shard.unlink()
    with pytest.raises(
        ShardError, match=re.escape(f"shard {shard.name} listed in model.safetensors.index.json is missing")
    ):
        open_checkpoint(root)


def test_truncated_shard(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    shard = _shard_with(root, "stt_model.lm_head.weight")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ShardError, match=rf"{shard.name}: truncated: tensor '.+' needs bytes"):
        open_checkpoint(root)


def test_corrupt_shard_header(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    shard = _shard_with(root, "stt_model.lm_head.weight")
    data = bytearray(shard.read_bytes())
    assert struct.unpack("<Q", data[:8])[0] > 10
    data[8 : 8 + 10] = b"\x00garbage!!"
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=re.escape(f"{shard.name}: corrupt safetensors header")):
        open_checkpoint(root)


def test_shard_that_is_not_safetensors(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    shard = _shard_with(root, "stt_model.lm_head.weight")
    shard.write_bytes(b"<html>404 Not Found</html>")
    with pytest.raises(ShardError, match=re.escape(shard.name)):
        open_checkpoint(root)


def test_missing_tensor(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    name = "tts_model.tts_model.mog_head.proj_logits.weight"
    shard = _shard_with(root, name)
    _rewrite_shard(shard, lambda arrays: arrays.pop(name))
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"][name]
    index_path.write_text(json.dumps(index))
    with pytest.raises(TensorMismatchError, match=re.escape(f"tensor '{name}' is missing")):
        verify_layout(open_checkpoint(root))


def test_extra_tensor(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    shard = _shard_with(root, "stt_model.lm_head.weight")
    _rewrite_shard(shard, lambda arrays: arrays.__setitem__("vision_tower.patch_embed.weight", mx.zeros((4, 4))))
    with pytest.raises(TensorMismatchError, match=re.escape("unexpected tensor 'vision_tower.patch_embed.weight'")):
        verify_layout(open_checkpoint(root))


def test_wrong_shape(tmp_path, tiny_bf16):
    root = _copy(tiny_bf16, tmp_path)
    name = "stt_model.llm.layers.0.mixer.out_proj.weight"
    shard = _shard_with(root, name)
    _rewrite_shard(shard, lambda arrays: arrays.__setitem__(name, mx.zeros((64, 96), dtype=mx.bfloat16)))
    with pytest.raises(TensorMismatchError, match=rf"{shard.name}: tensor '{name}' has shape \[64, 96\], expected"):
        verify_layout(open_checkpoint(root))


def test_wrong_dtype(tmp_path, tiny_q4):
    root = _copy(tiny_q4, tmp_path)
    name = "stt_model.lm_head.weight"
    shard = _shard_with(root, name)

    def to_float(arrays):
        arrays[name] = arrays[name].astype(mx.float32)

    _rewrite_shard(shard, to_float)
    with pytest.raises(TensorMismatchError, match=re.escape(f"tensor '{name}' is stored as F32, expected U32")):
        verify_layout(open_checkpoint(root))


def test_quantized_config_with_unquantized_weights(tmp_path, tiny_bf16, tiny_q4):
    """A 4-bit config.json next to bf16 shards names the first tensor that does not fit."""
    root = _copy(tiny_bf16, tmp_path)
    shutil.copy(tiny_q4 / "config.json", root / "config.json")
    with pytest.raises(TensorMismatchError, match="stt_model"):
        verify_layout(open_checkpoint(root))
