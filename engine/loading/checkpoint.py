"""Find, verify and read a VoiceChat checkpoint folder.

A folder holds ``config.json`` (runtime schema), the weights as
``model.safetensors.index.json`` plus shards or a single ``model.safetensors``, and
the tokenizer files. Shard headers are checked against the layout of
:mod:`engine.loading.layout` before MLX reads a byte, so a truncated download, a missing
shard or a checkpoint of another model fails with a message that names the file
and the tensor. Tensor data is memory-mapped lazily by ``mx.load``; nothing is read
twice or held twice.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn

from ..errors import CheckpointNotFoundError, ConfigError, ShardError, TensorMismatchError, TokenizerError
from .config import MODEL_TYPE, VoiceChatConfig
from .layout import TensorSpec, checkpoint_tensors

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"

_FLOAT_DTYPES = {"BF16", "F16", "F32"}
_INDEX_DTYPES = {"I64", "I32", "U32", "I16", "U8", "I8"}
_DTYPE_BYTES = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "U32": 4,
    "I32": 4,
    "I64": 8,
    "U64": 8,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class StoredTensor:
    """One entry of a shard header."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    nbytes: int  # as the header declares it (checked against the file)


@dataclass(frozen=True)
class CheckpointFiles:
    """The files of a checkpoint folder and what their headers declare."""

    root: Path
    config: VoiceChatConfig
    raw_config: dict[str, Any]
    shards: tuple[Path, ...]
    tensors: dict[str, StoredTensor]
    tokenizer_file: Path

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data the headers declare (checked to cover each shard's data exactly)."""
        return sum(tensor.nbytes for tensor in self.tensors.values())


# --------------------------------------------------------------------------- config


def read_config(root: Path) -> tuple[VoiceChatConfig, dict[str, Any]]:
    path = root / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: config.json is missing; this folder is not a VoiceChat checkpoint")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ConfigError(f"{path}: unreadable config (nested too deeply)") from None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON, or a number too long to read
        raise ConfigError(f"{path}: unreadable config ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    if raw.get("model_type") != MODEL_TYPE:
        raise ConfigError(
            f"{path}: model_type is {raw.get('model_type')!r}; Parley needs a {MODEL_TYPE!r} checkpoint "
            "(mlx-community/NemotronLabs-VoiceChat-11B-4bit, -8bit or -bf16)"
        )
    try:
        config = VoiceChatConfig.from_dict(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return config, raw


# --------------------------------------------------------------------------- safetensors headers


def read_safetensors_header(path: Path) -> dict[str, StoredTensor]:
    """Parse a shard header, check every entry's type, and check that the entries cover the file's data exactly.

    The data section must be laid out as the safetensors format requires: each tensor's byte range matches its
    dtype and shape, ranges do not overlap, and together they fill every data byte of the file, so the sizes the
    header declares are the bytes on disk (what the memory check counts).
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ShardError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(_MAX_HEADER_BYTES, size - 8):
                raise ShardError(f"{path}: corrupt safetensors header (declares {header_len} header bytes)")
            header_bytes = handle.read(header_len)
    except OSError as exc:
        raise ShardError(f"{path}: cannot read shard ({exc})") from exc
    if not header_bytes.startswith(b"{"):
        raise ShardError(f"{path}: corrupt safetensors header (not a safetensors file)")
    try:
        header = json.loads(header_bytes, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise ShardError(f"{path}: corrupt safetensors header (nested too deeply)") from None
    except ValueError as exc:  # not UTF-8, not JSON, a repeated name, or a number too long to read
        raise ShardError(f"{path}: corrupt safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise ShardError(f"{path}: corrupt safetensors header (not an object)")
    metadata = header.get("__metadata__")
    if metadata is not None and (  # MLX writes null when there is none
        not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values())
    ):
        raise ShardError(f"{path}: corrupt safetensors header (__metadata__ must map names to text)")

    data_bytes = size - 8 - header_len
    tensors: dict[str, StoredTensor] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end, stored = _header_entry(path, name, entry)
        if end > data_bytes:
            raise ShardError(
                f"{path}: truncated: tensor {name!r} needs bytes up to {end:,} but the file holds "
                f"{data_bytes:,} data bytes (incomplete download?)"
            )
        ranges.append((start, end, name))
        tensors[name] = stored
    ordered = sorted(ranges)
    for (_, end, first), (start, _, second) in itertools.pairwise(ordered):
        if start < end:
            raise ShardError(f"{path}: tensors {first!r} and {second!r} overlap (their data_offsets share bytes)")
    covered = sum(end - start for start, end, _ in ranges)  # without overlaps, the bytes the tensors fill
    if covered != data_bytes:
        raise ShardError(
            f"{path}: the header declares {covered:,} bytes of tensor data but the file holds {data_bytes:,}"
        )
    return tensors


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        repeated = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"{repeated!r} appears twice")
    return dict(pairs)


def _header_entry(path: Path, name: str, entry: Any) -> tuple[int, int, StoredTensor]:
    """One tensor's header entry, every field type-checked: ``(start, end, tensor)``."""

    def bad(field: str, problem: str) -> ShardError:
        return ShardError(f"{path}: tensor {name!r}: {field} {problem}")

    if not isinstance(entry, dict):
        raise bad("the header entry", "is not an object")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in entry:
            raise bad(field, "is missing")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_BYTES:
        raise bad("dtype", f"must be one of {', '.join(sorted(_DTYPE_BYTES))}, got {_shown(dtype)}")
    if not isinstance(shape, list) or not all(_is_count(dim) for dim in shape):
        raise bad("shape", f"must be a list of whole numbers, got {_shown(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(offset) for offset in offsets)):
        raise bad("data_offsets", f"must be two whole numbers [start, end], got {_shown(offsets)}")
    start, end = offsets
    expected = math.prod(shape) * _DTYPE_BYTES[dtype]
    if end - start != expected:
        raise ShardError(
            f"{path}: tensor {name!r} has an inconsistent header entry ({dtype} {list(shape)} needs {expected:,} "
            f"bytes, data_offsets span {end - start:,})"
        )
    return start, end, StoredTensor(name, path, dtype, tuple(shape), expected)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shard_paths(root: Path) -> tuple[tuple[Path, ...], dict[str, str] | None]:
    index_path = root / INDEX_FILE
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            weight_map = index["weight_map"]
        except RecursionError:
            raise ShardError(f"{index_path}: unreadable shard index (nested too deeply)") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ShardError(f"{index_path}: unreadable shard index ({exc!r})") from exc
        if not isinstance(weight_map, dict):
            raise ShardError(f"{index_path}: weight_map must be an object, got {_shown(weight_map)}")
        for name, shard_name in weight_map.items():
            if not _is_plain_file_name(shard_name):
                raise ShardError(
                    f"{index_path}: weight_map names the shard {_shown(shard_name)} for {name!r}; "
                    "a shard must be a plain file name in the checkpoint folder"
                )
        names = sorted(set(weight_map.values()))
        missing = [name for name in names if not (root / name).is_file()]
        if missing:
            raise ShardError(
                f"{root}: shard {missing[0]} listed in {INDEX_FILE} is missing"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        return tuple(root / name for name in names), weight_map
    single = root / SINGLE_FILE
    if single.is_file():
        return (single,), None
    found = sorted(root.glob("*.safetensors"))
    if found:
        return tuple(found), None
    raise ShardError(f"{root}: no weights found (expected {INDEX_FILE} with shards, or {SINGLE_FILE})")


def _is_plain_file_name(name: Any) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and not any(char in name for char in ("/", "\\", "\0"))


def open_checkpoint(path: str | Path) -> CheckpointFiles:
    """Locate every file of a checkpoint and read (not load) its tensor headers."""
    root = Path(path).expanduser()
    if not root.exists():
        raise CheckpointNotFoundError(f"{root}: checkpoint folder does not exist")
    if not root.is_dir():
        raise CheckpointNotFoundError(f"{root}: not a folder")
    config, raw = read_config(root)
    tokenizer_file = root / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise TokenizerError(f"{tokenizer_file}: tokenizer.json is missing from the checkpoint")
    shards, weight_map = _shard_paths(root)
    tensors: dict[str, StoredTensor] = {}
    for shard in shards:
        for name, stored in read_safetensors_header(shard).items():
            if name in tensors:
                raise ShardError(f"{shard}: tensor {name!r} is also stored in {tensors[name].file.name}")
            tensors[name] = stored
    if weight_map is not None:
        for name, shard_name in weight_map.items():
            stored_tensor = tensors.get(name)
            if stored_tensor is None:
                raise ShardError(f"{root / shard_name}: tensor {name!r} listed in {INDEX_FILE} is not in the shard")
            if stored_tensor.file.name != shard_name:
                raise ShardError(f"{root / shard_name}: tensor {name!r} is stored in {stored_tensor.file.name} instead")
    return CheckpointFiles(root, config, raw, shards, tensors, tokenizer_file)


# --------------------------------------------------------------------------- layout check


def quantized_module_settings(config: VoiceChatConfig, tensors: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``module -> (group_size, bits)`` for every module stored quantized.

    A module is quantized when its per-module entry in ``quantization`` says so,
    or, as in the reference loader, when the shards hold ``<module>.scales``.
    """
    block = config.quantization
    if not block:
        return {}
    default = (int(block["group_size"]), int(block["bits"]))
    names = set(tensors)
    settings: dict[str, tuple[int, int]] = {}
    for key, value in block.items():
        if isinstance(value, dict) and f"{key}.weight" in names:
            settings[key] = (int(value.get("group_size", default[0])), int(value.get("bits", default[1])))
    for name in names:
        if name.endswith(".scales"):
            module = name.removesuffix(".scales")
            settings.setdefault(module, default)
    return settings


def _expected_source(spec: TensorSpec, quantized: dict[str, tuple[int, int]]) -> dict[str, tuple[int, ...]]:
    """Source names and shapes that stand for ``spec`` in the shards."""
    if spec.name.endswith(".weight") and spec.module in quantized:
        group_size, bits = quantized[spec.module]
        out_dim, in_dim = spec.shape
        return {
            spec.source_name: (out_dim, in_dim * bits // 32),
            f"{spec.module}.scales": (out_dim, in_dim // group_size),
            f"{spec.module}.biases": (out_dim, in_dim // group_size),
        }
    return {spec.source_name: spec.source_shape}


def verify_layout(files: CheckpointFiles) -> dict[str, tuple[int, int]]:
    """Check every stored tensor against the layout the config implies.

    Accepts tensors in the published (source) layout or already in runtime layout,
    so a folder converted once loads as well. Returns the quantized modules.
    """
    config, stored = files.config, files.tensors
    quantized = quantized_module_settings(config, stored)
    for module, (group_size, bits) in quantized.items():
        if bits not in (2, 3, 4, 5, 6, 8) or group_size not in (32, 64, 128):
            raise TensorMismatchError(
                f"{files.root / CONFIG_FILE}: unsupported quantization of {module}: {bits} bits, group {group_size}"
            )

    known: set[str] = set()
    missing: list[str] = []
    for spec in checkpoint_tensors(config):
        for name, shape in _expected_source(spec, quantized).items():
            quantized_part = spec.module in quantized and spec.name.endswith(".weight")
            role: str = "packed" if quantized_part and name == spec.source_name else spec.role
            if name.endswith((".scales", ".biases")) and quantized_part:
                role = "quant"
            # The runtime name and shape, if a converted folder stores the tensor that way.
            runtime = (spec.name, spec.shape) if name == spec.source_name and not quantized_part else None
            known.add(name)
            if runtime:
                known.add(runtime[0])
            entry = stored.get(name)
            accepted = {shape}
            if entry is None and runtime and runtime[0] in stored:
                entry = stored[runtime[0]]
            if runtime and spec.runtime:
                accepted.add(runtime[1])
            if entry is None:
                if not spec.runtime:
                    continue  # source-only buffers are absent from converted folders
                missing.append(name)
                continue
            if entry.shape not in accepted:
                raise TensorMismatchError(
                    f"{entry.file}: tensor {entry.name!r} has shape {list(entry.shape)}, expected {list(shape)}"
                )
            _check_dtype(entry, role)
    if missing:
        raise TensorMismatchError(
            f"{files.root}: tensor {missing[0]!r} is missing from the checkpoint"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    extra = sorted(name for name in stored if name not in known)
    if extra:
        entry = stored[extra[0]]
        raise TensorMismatchError(
            f"{entry.file}: unexpected tensor {extra[0]!r}"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + " — is this checkpoint from another model or version?"
        )
    return quantized


def _check_dtype(entry: StoredTensor, role: str) -> None:
    if role == "packed":
        allowed = {"U32"}
    elif role == "index":
        allowed = _INDEX_DTYPES
    else:
        allowed = _FLOAT_DTYPES
    if entry.dtype not in allowed:
        expected = ", ".join(sorted(allowed))
        raise TensorMismatchError(
            f"{entry.file}: tensor {entry.name!r} is stored as {entry.dtype}, expected {expected}"
        )


# --------------------------------------------------------------------------- reading and sanitizing


def load_arrays(files: CheckpointFiles) -> dict[str, mx.array]:
    """Lazily map every shard; arrays are read from disk when first evaluated."""
    weights: dict[str, mx.array] = {}
    for shard in files.shards:
        try:
            # The format is named: the header check read this file as safetensors, so its name never picks
            # MLX's GGUF or NPZ parser (mx.load goes by the extension otherwise). A safetensors shard loads as a dict.
            weights.update(cast(dict[str, mx.array], mx.load(str(shard), format="safetensors")))
        except (RuntimeError, ValueError, OSError) as exc:
            raise ShardError(f"{shard}: cannot be read ({exc})") from exc
    return weights


def sanitize(weights: dict[str, mx.array], config: VoiceChatConfig) -> dict[str, mx.array]:
    """Map published (NeMo / PyTorch layout) tensors to runtime names and MLX layouts.

    Idempotent: each conversion is chosen by comparing the stored shape with the
    runtime shape, so tensors already in runtime layout pass through unchanged.
    """
    specs = checkpoint_tensors(config)
    by_source = {spec.source_name: spec for spec in specs}
    out: dict[str, mx.array] = {}
    lstm_hh: dict[str, mx.array] = {}
    for name, value in weights.items():
        spec = by_source.get(name)
        if spec is None:
            out[name] = value  # runtime-named tensors and quantization scales/biases
            continue
        if not spec.runtime:
            if ".bias_hh_l" in name:
                lstm_hh[spec.name.replace(".bias_hh", ".bias")] = value
            continue
        if spec.transform != "same" and tuple(value.shape) == spec.source_shape != spec.shape:
            value = _to_runtime_layout(spec, value)
        out[spec.name] = value
    for name, value in lstm_hh.items():
        out[name] = out[name] + value
    return out


def _to_runtime_layout(spec: TensorSpec, value: mx.array) -> mx.array:
    if spec.transform == "conv2d":
        return value.transpose(0, 2, 3, 1)
    if spec.transform == "conv_transpose1d":
        return value.transpose(1, 2, 0)
    if spec.transform == "conv1d":
        return value.transpose(0, 2, 1)
    raise AssertionError(f"no layout conversion for {spec.name} {tuple(value.shape)}")


def read_runtime_weights(path: str | Path) -> tuple[CheckpointFiles, dict[str, mx.array], dict[str, tuple[int, int]]]:
    """Open, verify and sanitize a checkpoint: runtime-layout arrays (still lazy)."""
    files = open_checkpoint(path)
    quantized = verify_layout(files)
    weights = sanitize(load_arrays(files), files.config)
    return files, weights, quantized


def load_into(
    module: nn.Module,
    weights: dict[str, mx.array],
    quantized: dict[str, tuple[int, int]],
    prefix: str = "",
) -> None:
    """Load the runtime weights under ``prefix`` into ``module``, strictly.

    Modules stored quantized are first replaced by their quantized counterparts
    (``QuantizedLinear`` / ``QuantizedEmbedding``) with the recorded group size and
    bits; their scales and biases keep the dtype the file stores them in.
    """
    local = {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}
    settings = {name[len(prefix) :]: gs_bits for name, gs_bits in quantized.items() if name.startswith(prefix)}
    if settings:

        def predicate(path: str, _: nn.Module) -> dict[str, int] | bool:
            if path not in settings:
                return False
            group_size, bits = settings[path]
            return {"group_size": group_size, "bits": bits}

        nn.quantize(module, class_predicate=predicate)
    try:
        module.load_weights(list(local.items()), strict=True)
    except ValueError as exc:
        raise TensorMismatchError(f"weights under {prefix or '<root>'!r} do not fit the model: {exc}") from exc
