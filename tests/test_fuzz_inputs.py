"""Fuzzing the files Parley reads: settings, history manifests, safetensors headers and checkpoint configs.

Each property takes a valid file, damages it in generated ways (any JSON value at any field, numbers of
thousands of digits, nesting deeper than Python's recursion limit, raw bytes) and asserts that only the
project's own, clear errors come out: settings always load, one damaged history entry never hides the
others, a shard header or a config is accepted or refused with a ``CheckpointError`` naming the file.
Bounded (``max_examples``, no deadline) so the whole module runs in CI in well under a minute.
"""

from __future__ import annotations

import copy
import functools
import json
import struct
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.history import ConversationHistory, ConversationRecord, TranscriptLine
from app.settings import Settings, load_settings
from engine.errors import ConfigError, ShardError
from engine.loading.checkpoint import read_config, read_safetensors_header
from engine.loading.layout import checkpoint_tensors
from engine.loading.memory import state_growth_per_frame
from engine.loading.random_checkpoint import base_config

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Raw JSON that ``json.dumps`` cannot produce, put in place of a marker after dumping.
POISON = {
    "<5000 digits>": "9" * 5000,
    "<nested>": "[" * 50_000 + "]" * 50_000,
    "<1e999>": "1e999",
    "<NaN>": "NaN",
    "<-Infinity>": "-Infinity",
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "\0", "../..", "M-*", "four", "BF16", "F32", "causal", "affine"]),
    st.sampled_from(list(POISON)),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)


def dump(value: Any) -> bytes:
    text = json.dumps(value)
    for marker, raw in POISON.items():
        text = text.replace(json.dumps(marker), raw)
    return text.encode()


def key_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside nested objects and lists (lists only up to their third item)."""
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            paths += key_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            paths += key_paths(item, (*prefix, index))
    return paths


def mutated(original: Any, changes: list[tuple[tuple[Any, ...], Any]]) -> Any:
    """A copy of ``original`` with the value at each path replaced (``"<delete>"``: removed)."""
    value = copy.deepcopy(original)
    for path, new in changes:
        parent = value
        try:
            for key in path[:-1]:
                parent = parent[key]
            if new == "<delete>" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = new
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced what this path went through
    return value


def changes_to(original: Any) -> st.SearchStrategy[list[tuple[tuple[Any, ...], Any]]]:
    paths = key_paths(original)
    return st.lists(
        st.tuples(st.sampled_from(paths), st.one_of(json_values, st.just("<delete>"))), min_size=1, max_size=3
    )


# --------------------------------------------------------------------------- settings

SETTINGS = Settings().to_dict()


@FUZZ
@given(data=st.one_of(changes_to(SETTINGS).map(lambda c: dump(mutated(SETTINGS, c))), json_values.map(dump)))
def test_any_settings_file_loads(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "settings.json"
        path.write_bytes(data)
        loaded, warning = load_settings(path)
        assert isinstance(loaded, Settings)
        kept = sorted(Path(folder).glob("settings.json.corrupt*"))
        if warning is not None:
            assert str(path) in warning and kept, "a file with problems is named and kept aside"
            assert kept[0].read_bytes() == data


@FUZZ
@given(data=st.binary(max_size=200))
def test_any_bytes_as_settings_load(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "settings.json"
        path.write_bytes(data)
        assert isinstance(load_settings(path).settings, Settings)


# --------------------------------------------------------------------------- history manifests


@functools.cache
def history_with_two_entries() -> tuple[ConversationHistory, str, Path, dict[str, Any]]:
    """A history holding a good entry and one whose manifest the tests overwrite: (history, good id, path, manifest)."""
    history = ConversationHistory(Path(tempfile.mkdtemp(prefix="parley-fuzz-history-")))
    started = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    saved = []
    for offset in range(2):
        record = ConversationRecord(
            started=started + timedelta(minutes=offset),
            transcript=[TranscriptLine("user", 0.5, "Hello there"), TranscriptLine("assistant", 1.0, "Hi.")],
            user_audio=np.zeros(1600, np.float32),
            assistant_audio=np.zeros(2205, np.float32),
        )
        entry = history.save(record)
        assert entry is not None
        saved.append(entry)
    manifest_path = saved[1].path / "conversation.json"
    return history, saved[0].id, manifest_path, json.loads(manifest_path.read_text(encoding="utf-8"))


MANIFEST = history_with_two_entries()[3]


@FUZZ
@given(
    data=st.one_of(
        changes_to(MANIFEST).map(lambda c: dump(mutated(MANIFEST, c))), json_values.map(dump), st.binary(max_size=100)
    )
)
def test_one_damaged_manifest_never_hides_the_other_entries(data: bytes) -> None:
    history, good, manifest_path, _ = history_with_two_entries()
    manifest_path.write_bytes(data)
    listing = history.entries()
    assert good in [entry.id for entry in listing.entries]
    assert len(listing.entries) + len(listing.damaged) == 2
    assert manifest_path.read_bytes() == data, "a damaged manifest is kept as it was"


# --------------------------------------------------------------------------- safetensors headers

HEADER = {
    "__metadata__": {"format": "mlx"},
    "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
    "b.scales": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]},
}


def shard(header: bytes, data_bytes: int) -> bytes:
    return struct.pack("<Q", len(header)) + header + bytes(data_bytes)


@FUZZ
@given(
    header=st.one_of(
        changes_to(HEADER).map(lambda c: dump(mutated(HEADER, c))), json_values.map(dump), st.binary(max_size=80)
    ),
    data_bytes=st.sampled_from([0, 12, 27, 28, 29, 56]),
    length_lies=st.sampled_from([0, 0, 0, 1, -1, 2**40]),
)
def test_a_shard_header_is_read_or_refused_with_a_shard_error(header: bytes, data_bytes: int, length_lies: int) -> None:
    content = shard(header, data_bytes)
    if length_lies:  # the 8-byte length prefix disagrees with the header that follows
        content = struct.pack("<Q", max(0, len(header) + length_lies)) + content[8:]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        path.write_bytes(content)
        try:
            tensors = read_safetensors_header(path)
        except ShardError as error:
            assert str(path) in str(error)
            return
        # Accepted: the entries fill the data bytes exactly, so the declared size is what is on disk.
        assert sum(tensor.nbytes for tensor in tensors.values()) == data_bytes


# --------------------------------------------------------------------------- checkpoint configs

CONFIG = base_config("tiny") | {"quantization": {"group_size": 64, "bits": 4, "stt_model.lm_head": {"bits": 4}}}


@FUZZ
@given(data=st.one_of(changes_to(CONFIG).map(lambda c: dump(mutated(CONFIG, c))), json_values.map(dump)))
def test_a_config_is_read_or_refused_with_a_config_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "config.json").write_bytes(data)
        try:
            config, _ = read_config(root)
        except ConfigError as error:
            assert str(root / "config.json") in str(error)
            return
        # Accepted: everything the loader derives from it before reading weights works.
        assert checkpoint_tensors(config)
        assert state_growth_per_frame(config) >= 0
        assert config.quantization_bits is None or config.quantization_bits >= 1
