"""Bad input → the specific message the user sees. One table per kind of input; add a row for every new case.

Checkpoints: each row damages a copy of a tiny checkpoint and names the error type and the
message (which must name the file, and the tensor where there is one). Loading goes through
``load_voicechat``, the same call the app and ``parley run`` make.

Audio files: each row writes a file and names either the error or, where Parley converts the
input instead of refusing it, the note that tells the user what was done.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
import soundfile

from app.audio_files import AudioFileError, read_audio
from app.cli import main as parley
from engine import model as engine_model
from engine.errors import (
    CheckpointMemoryError,
    CheckpointNotFoundError,
    ConfigError,
    ShardError,
    TensorMismatchError,
    TokenizerError,
)
from engine.loading import checkpoint as engine_checkpoint
from engine.loading import memory as engine_memory
from engine.loading.random_checkpoint import build_tokenizer
from engine.model import load_voicechat

# --------------------------------------------------------------------------- checkpoint helpers


def shard_with(root: Path, tensor: str) -> Path:
    index = json.loads((root / "model.safetensors.index.json").read_text())
    return root / index["weight_map"][tensor]


def rewrite_shard(path: Path, edit: Callable[[dict[str, mx.array]], object]) -> None:
    """Load a shard, let ``edit`` change the dict of arrays, write it back."""
    arrays = dict(mx.load(str(path)))
    edit(arrays)
    mx.save_safetensors(str(path), arrays, metadata={"format": "mlx"})


def edit_config(root: Path, **changes: object) -> None:
    config = json.loads((root / "config.json").read_text())
    config.update(changes)
    (root / "config.json").write_text(json.dumps(config))


DELETE = object()


def edit_config_at(root: Path, keys: tuple[str, ...], value: object) -> None:
    """Set (or, with ``DELETE``, remove) one nested value of ``config.json``."""
    config = json.loads((root / "config.json").read_text())
    section = config
    for key in keys[:-1]:
        section = section[key]
    if value is DELETE:
        del section[keys[-1]]
    else:
        section[keys[-1]] = value
    if keys[0] == "quantization":
        config["quantization_config"] = config["quantization"]
    (root / "config.json").write_text(json.dumps(config))


def replace_in_config(root: Path, old: str, new: str) -> None:
    """Edit ``config.json`` as text: for values ``json.dumps`` cannot write (numbers of 5,000 digits)."""
    text = (root / "config.json").read_text()
    assert old in text
    (root / "config.json").write_text(text.replace(old, new, 1))


def edit_header(path: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """Let ``edit`` change a shard's safetensors header; the tensor data stays byte for byte."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    edit(header)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + length :])


def same_offsets(header: dict[str, Any], first: str, second: str) -> None:
    """Point ``second`` at ``first``'s bytes: the header then declares more data than the file holds."""
    header[second]["data_offsets"] = header[first]["data_offsets"]
    header[second]["shape"], header[second]["dtype"] = header[first]["shape"], header[first]["dtype"]


def rename_shard(root: Path, tensor: str, new_name: str) -> None:
    """Give the shard holding ``tensor`` another file name (the index follows)."""
    old = shard_with(root, tensor)
    old.rename(root / new_name)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: new_name if v == old.name else v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))


def remove_tensor(root: Path, name: str) -> None:
    rewrite_shard(shard_with(root, name), lambda arrays: arrays.pop(name))
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"][name]
    index_path.write_text(json.dumps(index))


def truncate(path: Path, drop_bytes: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - drop_bytes])


def scramble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:18] = b"\x00garbage!!"
    path.write_bytes(bytes(data))


def foreign_tokenizer(root: Path) -> None:
    """A valid byte-level tokenizer.json of another model: a bigger vocabulary than this model's."""
    vocab_size = json.loads((root / "config.json").read_text())["text_config"]["vocab_size"]
    build_tokenizer(vocab_size * 2).save(str(root / "tokenizer.json"))


def tokenizer_without_single_characters(root: Path) -> None:
    """A tokenizer whose vocabulary lacks the 256 one-character entries the TTS character table needs."""
    data = json.loads((root / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    for token in [token for token in vocab if len(token) == 1][:10]:
        vocab[f"{token}{token}{token}"] = vocab.pop(token)
    data["model"]["merges"] = []
    (root / "tokenizer.json").write_text(json.dumps(data))


LM_HEAD = "stt_model.lm_head.weight"
FUNCTION_HEAD = "stt_model.function_head.weight"  # the same shape as the LM head, in the same shard
MOG_LOGITS = "tts_model.tts_model.mog_head.proj_logits.weight"
MIXER_OUT = "stt_model.llm.layers.0.mixer.out_proj.weight"


@dataclass(frozen=True)
class BadCheckpoint:
    name: str
    damage: Callable[[Path], object]  # applied to a fresh copy of the checkpoint
    error: type[Exception]
    message: str  # a regular expression; {shard} is replaced by the damaged shard's file name
    quantize: int | None = None  # which tiny checkpoint to start from
    shard_of: str = LM_HEAD  # the tensor whose shard {shard} names


BAD_CHECKPOINTS = [
    BadCheckpoint("missing folder", lambda root: shutil.rmtree(root), CheckpointNotFoundError, "does not exist"),
    BadCheckpoint("no config", lambda root: (root / "config.json").unlink(), ConfigError, r"config\.json is missing"),
    BadCheckpoint(
        "config not JSON",
        lambda root: (root / "config.json").write_text("{ not json"),
        ConfigError,
        "unreadable config",
    ),
    BadCheckpoint(
        "config of another model",
        lambda root: edit_config(root, model_type="llama"),
        ConfigError,
        "model_type is 'llama'",
    ),
    BadCheckpoint(
        "no tokenizer", lambda root: (root / "tokenizer.json").unlink(), TokenizerError, r"tokenizer\.json is missing"
    ),
    BadCheckpoint(
        "tokenizer not readable",
        lambda root: (root / "tokenizer.json").write_text('{"model": 3}'),
        TokenizerError,
        r"not a readable tokenizer\.json",
    ),
    BadCheckpoint(
        "tokenizer of another model", foreign_tokenizer, TokenizerError, "tokenizer belongs to another model"
    ),
    BadCheckpoint(
        "tokenizer without the character table",
        tokenizer_without_single_characters,
        TokenizerError,
        r"tokenizer\.json: the tokenizer vocabulary has 246 single-character tokens; the TTS character encoder",
    ),
    BadCheckpoint(
        "missing shard",
        lambda root: shard_with(root, LM_HEAD).unlink(),
        ShardError,
        r"shard {shard} listed in model\.safetensors\.index\.json is missing",
    ),
    BadCheckpoint(
        "truncated shard",
        lambda root: truncate(shard_with(root, LM_HEAD), 1000),
        ShardError,
        r"{shard}: truncated: tensor '.+' needs bytes",
    ),
    BadCheckpoint(
        "corrupt shard header",
        lambda root: scramble_header(shard_with(root, LM_HEAD)),
        ShardError,
        r"{shard}: corrupt safetensors header",
    ),
    BadCheckpoint(
        "shard that is a web page",
        lambda root: shard_with(root, LM_HEAD).write_bytes(b"<html>404 Not Found</html>"),
        ShardError,
        "{shard}",
    ),
    BadCheckpoint(
        "missing tensor",
        lambda root: remove_tensor(root, MOG_LOGITS),
        TensorMismatchError,
        f"tensor '{MOG_LOGITS}' is missing",
        shard_of=MOG_LOGITS,
    ),
    BadCheckpoint(
        "extra tensor",
        lambda root: rewrite_shard(
            shard_with(root, LM_HEAD), lambda a: a.__setitem__("vision_tower.patch_embed.weight", mx.zeros((4, 4)))
        ),
        TensorMismatchError,
        r"{shard}: unexpected tensor 'vision_tower\.patch_embed\.weight'",
    ),
    BadCheckpoint(
        "tensor of the wrong shape",
        lambda root: rewrite_shard(
            shard_with(root, MIXER_OUT), lambda a: a.__setitem__(MIXER_OUT, mx.zeros((64, 96), dtype=mx.bfloat16))
        ),
        TensorMismatchError,
        rf"{{shard}}: tensor '{MIXER_OUT}' has shape \[64, 96\], expected",
        shard_of=MIXER_OUT,
    ),
    BadCheckpoint(
        "tensor of the wrong dtype",
        lambda root: rewrite_shard(
            shard_with(root, LM_HEAD), lambda a: a.__setitem__(LM_HEAD, a[LM_HEAD].astype(mx.float32))
        ),
        TensorMismatchError,
        rf"tensor '{LM_HEAD}' is stored as F32, expected U32",
        quantize=4,
    ),
    BadCheckpoint(
        "4-bit config over bf16 weights",
        lambda root: edit_config(
            root, quantization={"group_size": 64, "bits": 4, "stt_model.lm_head": {"group_size": 64, "bits": 4}}
        ),
        TensorMismatchError,
        "stt_model",
    ),
    # Wrongly typed config fields: the message names config.json and the field.
    BadCheckpoint(
        "hidden_size as text",
        lambda root: edit_config_at(root, ("text_config", "hidden_size"), "64"),
        ConfigError,
        r"config\.json: text_config\.hidden_size must be a whole number, got the text '64'",
    ),
    BadCheckpoint(
        "n_layers 2.5",
        lambda root: edit_config_at(root, ("audio_config", "encoder", "n_layers"), 2.5),
        ConfigError,
        r"config\.json: audio_config\.encoder\.n_layers must be a whole number, got 2\.5",
    ),
    BadCheckpoint(
        "quantization bits as text",
        lambda root: edit_config_at(root, ("quantization", "bits"), "four"),
        ConfigError,
        r"config\.json: quantization\.bits must be a whole number, got the text 'four'",
        quantize=4,
    ),
    BadCheckpoint(
        "quantization without bits",
        lambda root: edit_config_at(root, ("quantization", "bits"), DELETE),
        ConfigError,
        r"config\.json: quantization lacks 'bits'",
        quantize=4,
    ),
    BadCheckpoint(
        "module quantization bits as text",
        lambda root: edit_config_at(root, ("quantization", "stt_model.lm_head", "bits"), [4]),
        ConfigError,
        r"config\.json: quantization\.stt_model\.lm_head\.bits must be a whole number, got a JSON array",
        quantize=4,
    ),
    BadCheckpoint(
        "unknown block letter",
        lambda root: edit_config_at(root, ("text_config", "hybrid_override_pattern"), "M-X*M-M"),
        ConfigError,
        r"config\.json: text_config\.hybrid_override_pattern .* unknown block letter 'X'",
    ),
    BadCheckpoint(
        "a list where a number belongs",
        lambda root: edit_config_at(root, ("codec_config", "downsample_rates"), ["7", 7, 9]),
        ConfigError,
        r"config\.json: codec_config\.downsample_rates\[0\] must be a whole number, got the text '7'",
    ),
    BadCheckpoint(
        "a layer count that would stall loading",
        lambda root: edit_config_at(root, ("tts_config", "num_hidden_layers"), 10**9),
        ConfigError,
        r"config\.json: tts_config\.num_hidden_layers must be between 1 and 1024, got 1000000000",
    ),
    BadCheckpoint(
        "400-digit number",
        lambda root: edit_config_at(root, ("audio_config", "output_dim"), 10**400),
        ConfigError,
        r"config\.json: audio_config\.output_dim must be between 1 and 2147483647, got a 401-digit number",
    ),
    BadCheckpoint(
        "5000-digit number",
        lambda root: replace_in_config(root, '"hidden_size": 64', '"hidden_size": ' + "9" * 5000),
        ConfigError,
        r"config\.json: unreadable config \(Exceeds the limit",
    ),
    BadCheckpoint(
        "config nested 100,000 deep",
        lambda root: replace_in_config(root, '"speaker": "Aria"', '"speaker": ' + "[" * 100_000 + "]" * 100_000),
        ConfigError,
        r"config\.json: unreadable config \(nested too deeply\)",
    ),
    BadCheckpoint(
        "frame_duration 0",
        lambda root: edit_config_at(root, ("frame_duration",), 0),
        ConfigError,
        r"config\.json: frame_duration must be a positive number, got 0",
    ),
    # Wrongly typed header entries: the message names the shard, the tensor and the field.
    BadCheckpoint(
        "data_offsets as text",
        lambda root: edit_header(
            shard_with(root, LM_HEAD), lambda h: h[LM_HEAD].__setitem__("data_offsets", ["0", "131072"])
        ),
        ShardError,
        rf"{{shard}}: tensor '{LM_HEAD}': data_offsets must be two whole numbers \[start, end\], got \[\"0\"",
    ),
    BadCheckpoint(
        "dtype as a list",
        lambda root: edit_header(shard_with(root, LM_HEAD), lambda h: h[LM_HEAD].__setitem__("dtype", ["BF16"])),
        ShardError,
        rf"{{shard}}: tensor '{LM_HEAD}': dtype must be one of .*, got \[\"BF16\"\]",
    ),
    BadCheckpoint(
        "shape as text",
        lambda root: edit_header(shard_with(root, LM_HEAD), lambda h: h[LM_HEAD].__setitem__("shape", "1024x64")),
        ShardError,
        rf"{{shard}}: tensor '{LM_HEAD}': shape must be a list of whole numbers",
    ),
    BadCheckpoint(
        "header entry without data_offsets",
        lambda root: edit_header(shard_with(root, LM_HEAD), lambda h: h[LM_HEAD].pop("data_offsets")),
        ShardError,
        rf"{{shard}}: tensor '{LM_HEAD}': data_offsets is missing",
    ),
    BadCheckpoint(
        "header entry that is a number",
        lambda root: edit_header(shard_with(root, LM_HEAD), lambda h: h.__setitem__(LM_HEAD, 5)),
        ShardError,
        rf"{{shard}}: tensor '{LM_HEAD}': the header entry is not an object",
    ),
    BadCheckpoint(
        "metadata that is not text",
        lambda root: edit_header(shard_with(root, LM_HEAD), lambda h: h.__setitem__("__metadata__", {"format": 5})),
        ShardError,
        r"{shard}: corrupt safetensors header \(__metadata__ must map names to text\)",
    ),
    # Declared sizes against each other and against the file: the memory check counts what the header declares.
    BadCheckpoint(
        "overlapping data_offsets (declares more bytes than the file holds)",
        lambda root: edit_header(shard_with(root, LM_HEAD), lambda h: same_offsets(h, LM_HEAD, FUNCTION_HEAD)),
        ShardError,
        r"{shard}: tensors '.+' and '.+' overlap",
    ),
    BadCheckpoint(
        "bytes no tensor claims",
        lambda root: shard_with(root, LM_HEAD).open("ab").write(b"\0" * 1000),
        ShardError,
        r"{shard}: the header declares [\d,]+ bytes of tensor data but the file holds [\d,]+",
    ),
    BadCheckpoint(
        "shard named outside the folder",
        lambda root: rename_shard(root, LM_HEAD, "../elsewhere.safetensors"),
        ShardError,
        r"model\.safetensors\.index\.json: weight_map names the shard \"\.\./elsewhere\.safetensors\"",
    ),
]


@pytest.mark.parametrize("case", BAD_CHECKPOINTS, ids=lambda case: case.name)
def test_bad_checkpoint_gives_a_specific_error(case: BadCheckpoint, checkpoint_factory, tmp_path: Path) -> None:
    root = tmp_path / "checkpoint"
    shutil.copytree(checkpoint_factory(case.quantize, 0), root)
    shard = shard_with(root, case.shard_of).name
    case.damage(root)
    with pytest.raises(case.error, match=case.message.replace("{shard}", re.escape(shard))):
        load_voicechat(root)


@pytest.mark.parametrize("name", ["model-00001-of-00003.gguf", "weights.npz"])
def test_the_loader_is_chosen_by_what_the_file_is_not_its_name(
    name: str, checkpoint_factory: Callable[..., Path], tmp_path: Path
) -> None:
    """A shard checked as safetensors is read as safetensors, never by MLX's GGUF or NPZ parser."""
    root = tmp_path / "checkpoint"
    shutil.copytree(checkpoint_factory(None, 0), root)
    rename_shard(root, LM_HEAD, name)
    model = load_voicechat(root, lazy=True)
    assert model.nbytes == sum(t.nbytes for t in engine_checkpoint.open_checkpoint(root).tensors.values())


def test_the_memory_check_counts_the_bytes_the_headers_declare(tiny_q4: Path) -> None:
    files = engine_checkpoint.open_checkpoint(tiny_q4)
    declared = 0
    for shard in files.shards:
        data = shard.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        declared += sum(
            end - start
            for name, entry in header.items()
            if name != "__metadata__"
            for start, end in [entry["data_offsets"]]
        )
    on_disk = sum(path.stat().st_size for path in files.shards)
    assert files.nbytes == declared < on_disk  # the headers are not tensor data


def test_checkpoint_too_big_for_this_machine_names_both_sizes(tiny_q4: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_memory, "physical_memory_bytes", lambda: 4_000_000)
    with pytest.raises(
        CheckpointMemoryError, match=r"the checkpoint needs \d\.\d MB of memory but this machine has 4\.0 MB"
    ):
        load_voicechat(tiny_q4)


def test_out_of_memory_while_loading_is_reported_as_such(tiny_q4: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(model: object) -> None:
        raise RuntimeError("[malloc] Unable to allocate 9166935272 bytes")

    monkeypatch.setattr(engine_model, "evaluate_weights", fail)
    with pytest.raises(
        CheckpointMemoryError, match=r"out of memory while loading \d\.\d MB of weights \(machine memory: "
    ):
        load_voicechat(tiny_q4)


def test_bad_checkpoint_on_the_command_line_exits_2_with_the_message(
    tiny_bf16: Path, tmp_path: Path, question_wav: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "checkpoint"
    shutil.copytree(tiny_bf16, root)
    edit_config(root, model_type="llama")
    assert parley(["run", "--model", str(root), "--audio", str(question_wav)]) == 2
    assert "model_type is 'llama'" in capsys.readouterr().err


HOSTILE_ON_THE_COMMAND_LINE = [
    "hidden_size as text",
    "quantization without bits",
    "unknown block letter",
    "5000-digit number",
    "data_offsets as text",
    "dtype as a list",
    "overlapping data_offsets (declares more bytes than the file holds)",
]


@pytest.mark.parametrize("name", HOSTILE_ON_THE_COMMAND_LINE)
def test_hostile_checkpoint_on_the_command_line_exits_2_with_one_line(
    name: str, checkpoint_factory: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (case,) = [case for case in BAD_CHECKPOINTS if case.name == name]
    root = tmp_path / "checkpoint"
    shutil.copytree(checkpoint_factory(case.quantize, 0), root)
    shard = shard_with(root, case.shard_of).name
    case.damage(root)
    audio = tmp_path / "input.wav"
    write_speech(audio)
    assert parley(["run", "--model", str(root), "--audio", str(audio)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("parley: "), err
    assert re.search(case.message.replace("{shard}", re.escape(shard)), err), err


# --------------------------------------------------------------------------- audio files


def write_not_audio(path: Path) -> None:
    path.write_text("these are not the samples you are looking for\n" * 50)


def write_speech(path: Path, *, rate: int = 16_000, channels: int = 1, subtype: str = "PCM_16") -> None:
    t = np.arange(rate) / rate
    tone = 0.3 * np.sin(2 * np.pi * 220 * t)
    data = np.stack([tone] * channels, axis=1) if channels > 1 else tone
    soundfile.write(str(path), data, rate, subtype=subtype)


def write_float(path: Path, value: float) -> None:
    data = np.full(16_000, 0.1, dtype=np.float32)
    data[1000:1010] = value
    soundfile.write(str(path), data, 16_000, subtype="FLOAT")


@dataclass(frozen=True)
class AudioCase:
    name: str
    write: Callable[[Path], object]
    error: str | None = None  # a regular expression for the AudioFileError, or None when the file is accepted
    notes: tuple[str, ...] = ()  # what Parley tells the user it did to an accepted file


AUDIO_CASES = [
    AudioCase("16 kHz mono 16-bit", write_speech),
    AudioCase("empty", lambda p: soundfile.write(str(p), np.zeros(0), 16_000), error="the file contains no audio"),
    AudioCase("not audio at all", write_not_audio, error="not a readable audio file"),
    AudioCase("a folder", lambda p: p.mkdir(), error="is a folder, not an audio file"),
    AudioCase("missing", lambda p: None, error="file not found"),
    AudioCase("NaN samples", lambda p: write_float(p, np.nan), error="the audio contains NaN or infinite samples"),
    AudioCase("infinite samples", lambda p: write_float(p, np.inf), error="the audio contains NaN or infinite samples"),
    AudioCase("stereo", lambda p: write_speech(p, channels=2), notes=("mixed 2 channels down to mono",)),
    AudioCase("8-bit", lambda p: write_speech(p, subtype="PCM_U8"), notes=("converted PCM_U8 samples to float",)),
    AudioCase("48 kHz", lambda p: write_speech(p, rate=48_000), notes=("resampled 48000 Hz to 16000 Hz",)),
    AudioCase(
        "48 kHz stereo 24-bit",
        lambda p: write_speech(p, rate=48_000, channels=2, subtype="PCM_24"),
        notes=("mixed 2 channels down to mono", "resampled 48000 Hz to 16000 Hz"),
    ),
]


@pytest.mark.parametrize("case", AUDIO_CASES, ids=lambda case: case.name)
def test_audio_file_is_read_or_refused_with_a_specific_message(case: AudioCase, tmp_path: Path) -> None:
    path = tmp_path / "input.wav"
    case.write(path)
    if case.error is not None:
        with pytest.raises(AudioFileError, match=rf"^{re.escape(str(path))}: {case.error}"):
            read_audio(path)
        return
    audio = read_audio(path)
    assert tuple(audio.notes) == case.notes
    assert audio.sample_rate == 16_000 and audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert abs(audio.seconds - 1.0) < 0.01 and np.isfinite(audio.samples).all()
    assert 0.25 < np.abs(audio.samples).max() < 0.35  # the tone survived the conversion


def test_bad_audio_on_the_command_line_exits_2_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "input.wav"
    write_not_audio(path)
    assert parley(["run", "--model", str(tmp_path / "no-checkpoint-here"), "--audio", str(path)]) == 2
    assert f"{path}: not a readable audio file" in capsys.readouterr().err
