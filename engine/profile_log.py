"""The session profile log: one schema, written as JSON, CSV or a Chrome/Perfetto trace.

``parley run --profile-json`` and the app's *Export profile…* both produce this
document. Files are written to a temporary name in the target folder and renamed
into place, so a full disk or an unwritable folder never leaves a half-written log
behind and the in-memory log stays available for another try.
"""

from __future__ import annotations

import csv
import io
import json
import platform
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import mlx.core as mx

from .events import FrameTiming
from .files import write_atomic
from .profiler import DEFAULT_COLD_FRAMES, summarize
from .timeline import STAGES

SCHEMA_NAME = "parley.session-profile"
SCHEMA_VERSION = 1

_NUMBER = {"type": "number"}
_STAGE_STATS = {
    "type": "object",
    "required": ["mean_ms", "p50_ms", "p95_ms", "max_ms"],
    "properties": {key: _NUMBER for key in ("mean_ms", "p50_ms", "p95_ms", "max_ms")},
}
_FRAME_FIELDS = ("frame_index", "start_ms", *(f"{s}_ms" for s in STAGES), "total_ms", "host_syncs")

# JSON Schema (the subset :func:`validate_profile_log` checks) of the whole document.
PROFILE_LOG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "schema",
        "version",
        "created",
        "parley_version",
        "mlx_version",
        "device",
        "checkpoint",
        "settings",
        "frames",
        "summary",
    ],
    "properties": {
        "schema": {"type": "string", "enum": [SCHEMA_NAME]},
        "version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "created": {"type": "string"},
        "parley_version": {"type": "string"},
        "mlx_version": {"type": "string"},
        "device": {
            "type": "object",
            "required": ["type", "name", "platform"],
            "properties": {"type": {"type": "string"}, "name": {"type": "string"}, "platform": {"type": "string"}},
        },
        "checkpoint": {
            "type": "object",
            "required": ["name", "path", "quantization_bits"],
            "properties": {
                "name": {"type": "string"},
                "path": {"type": "string"},
                "quantization_bits": {"type": ["integer", "null"]},
                "size_bytes": {"type": ["integer", "null"]},
            },
        },
        "settings": {"type": "object"},
        "frames": {
            "type": "array",
            "items": {
                "type": "object",
                "required": list(_FRAME_FIELDS),
                "properties": {
                    **{name: _NUMBER for name in _FRAME_FIELDS},
                    "frame_index": {"type": "integer", "minimum": 0},
                    "host_syncs": {"type": "integer", "minimum": 0},
                    "sub_stages": {"type": "object"},
                    "timing_mode": {"type": "string", "enum": ["host", "device"]},
                },
            },
        },
        "summary": {
            "type": "object",
            "required": ["frames", "dropped_cold_frames", "realtime_factor", "host_syncs_per_frame", "stages"],
            "properties": {
                "frames": {"type": "integer", "minimum": 0},
                "dropped_cold_frames": {"type": "integer", "minimum": 0},
                "realtime_factor": _NUMBER,
                "host_syncs_per_frame": _NUMBER,
                "stages": {
                    "type": "object",
                    "required": [*STAGES, "total"],
                    "properties": {name: _STAGE_STATS for name in (*STAGES, "total")},
                },
            },
        },
    },
}


def device_description() -> dict[str, str]:
    device = mx.default_device()
    try:
        info = mx.device_info()
        name = str(info.get("device_name", info.get("architecture", "")))
    except (AttributeError, RuntimeError):
        name = ""
    kind = "gpu" if device.type == mx.gpu else "cpu"
    return {"type": kind, "name": name or platform.processor() or platform.machine(), "platform": platform.platform()}


def parley_version() -> str:
    try:
        return metadata.version("parley")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def frame_record(timing: FrameTiming) -> dict[str, Any]:
    """One frame as the log stores it: a flat row, one ``<stage>_ms`` column per stage."""
    return {
        "frame_index": timing.frame_index,
        "start_ms": timing.start_ms,
        **{f"{stage}_ms": timing.stage_ms(stage) for stage in STAGES},
        "total_ms": timing.total_ms,
        "host_syncs": timing.host_syncs,
        "sub_stages": dict(timing.sub_stages),
        "timing_mode": timing.timing_mode,
    }


def build_profile_log(
    frames: Sequence[FrameTiming],
    *,
    checkpoint: dict[str, Any],
    settings: dict[str, Any],
    drop_first: int = DEFAULT_COLD_FRAMES,
) -> dict[str, Any]:
    """The profile log document for a session's frame timings."""
    return {
        "schema": SCHEMA_NAME,
        "version": SCHEMA_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "parley_version": parley_version(),
        "mlx_version": mx.__version__,
        "device": device_description(),
        "checkpoint": dict(checkpoint),
        "settings": dict(settings),
        "frames": [frame_record(frame) for frame in frames],
        "summary": summarize(frames, drop_first=drop_first),
    }


def validate_profile_log(doc: Any, schema: dict[str, Any] | None = None, where: str = "$") -> list[str]:
    """Problems with ``doc`` against :data:`PROFILE_LOG_SCHEMA` (empty when valid)."""
    schema = PROFILE_LOG_SCHEMA if schema is None else schema
    problems: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        kinds = expected if isinstance(expected, list) else [expected]
        if not any(_is_type(doc, kind) for kind in kinds):
            return [f"{where}: expected {' or '.join(kinds)}, found {type(doc).__name__}"]
    if "enum" in schema and doc not in schema["enum"]:
        problems.append(f"{where}: {doc!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(doc, int | float) and doc < schema["minimum"]:
        problems.append(f"{where}: {doc} is below {schema['minimum']}")
    if isinstance(doc, dict):
        for key in schema.get("required", []):
            if key not in doc:
                problems.append(f"{where}: missing '{key}'")
        for key, sub in schema.get("properties", {}).items():
            if key in doc:
                problems.extend(validate_profile_log(doc[key], sub, f"{where}.{key}"))
    if isinstance(doc, list) and "items" in schema:
        for index, item in enumerate(doc):
            problems.extend(validate_profile_log(item, schema["items"], f"{where}[{index}]"))
    return problems


def _is_type(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "object": dict, "array": list, "boolean": bool}[kind])


# --------------------------------------------------------------------------- writers


def to_json(log: dict[str, Any]) -> str:
    return json.dumps(log, indent=2) + "\n"


def to_csv(log: dict[str, Any]) -> str:
    """One row per frame; sub-stages become extra columns."""
    frames = log["frames"]
    sub_names = sorted({name for frame in frames for name in frame.get("sub_stages", {})})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([*_FRAME_FIELDS, *sub_names])
    for frame in frames:
        row = [frame[name] for name in _FRAME_FIELDS]
        row += [frame.get("sub_stages", {}).get(name, "") for name in sub_names]
        writer.writerow(row)
    return buffer.getvalue()


def to_chrome_trace(log: dict[str, Any]) -> str:
    """Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): one slice per frame and per stage."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Parley engine"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "frames"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "stages"}},
    ]
    for frame in log["frames"]:
        start = frame["start_ms"] * 1000.0
        events.append(
            {
                "name": f"frame {frame['frame_index']}",
                "cat": "frame",
                "ph": "X",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": frame["total_ms"] * 1000.0,
                "args": {"host_syncs": frame["host_syncs"]},
            }
        )
        offset = start
        for stage in STAGES:
            duration = frame[f"{stage}_ms"] * 1000.0
            events.append({"name": stage, "cat": "stage", "ph": "X", "pid": 1, "tid": 2, "ts": offset, "dur": duration})
            offset += duration
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"schema": SCHEMA_NAME}}) + "\n"


def write_profile_log(log: dict[str, Any], path: str | Path, fmt: str | None = None) -> Path:
    """Write ``log`` as ``json``, ``csv`` or ``trace`` (guessed from the suffix when ``fmt`` is None)."""
    path = Path(path)
    if fmt is None:
        fmt = "csv" if path.suffix.lower() == ".csv" else "trace" if path.name.endswith(".trace.json") else "json"
    render = {"json": to_json, "csv": to_csv, "trace": to_chrome_trace}.get(fmt)
    if render is None:
        raise ValueError(f"unknown profile format {fmt!r}; use json, csv or trace")
    return write_atomic(path, render(log))
