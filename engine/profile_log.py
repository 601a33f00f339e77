"""The session profile log: one schema, written as JSON, CSV or a Chrome/Perfetto trace.

``parley run --profile-json`` and the app's *Export profile…* both produce this
document. The app's covers every conversation since launch: each frame carries its
conversation's number, and ``conversations`` lists each one with its model, its own
summary, the delay the user felt in each turn (key release to the assistant's first
audible output, ``latency``) and what the sound devices did (underruns, ``audio``). Files
are written to a temporary name in the target folder and renamed into place, so a full
disk or an unwritable folder never leaves a half-written log behind and the in-memory log
stays available for another try.
"""

from __future__ import annotations

import csv
import io
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import mlx.core as mx

from .events import FrameTiming
from .files import write_atomic
from .profiler import DEFAULT_COLD_FRAMES, percentile, summarize
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
_OPTIONAL_FRAME_FIELDS = ("timing_mode", "conversation")  # CSV columns after the required ones
# What the app's sound devices did in a conversation (a conversation's optional ``audio``, named as the app's
# ``FrameStats`` fields): times the speaker ran out of the assistant's audio, silence then skipped to win that
# delay back, and microphone audio dropped because the engine fell too far behind.
AUDIO_COUNTERS = ("output_underruns", "output_skipped_s", "input_lost_s")
_LATENCY = {
    "type": "object",
    "required": ["turns", "p50_ms", "p95_ms", "latencies_ms"],
    "properties": {
        "turns": {"type": "integer", "minimum": 0},
        "p50_ms": {"type": ["number", "null"]},
        "p95_ms": {"type": ["number", "null"]},
        "latencies_ms": {"type": "array", "items": _NUMBER},
    },
}
_AUDIO = {
    "type": "object",
    "required": list(AUDIO_COUNTERS),
    "properties": {
        "output_underruns": {"type": "integer", "minimum": 0},
        "output_skipped_s": {"type": "number", "minimum": 0},
        "input_lost_s": {"type": "number", "minimum": 0},
    },
}

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
                    "conversation": {"type": "integer", "minimum": 1},
                },
            },
        },
        "conversations": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["conversation", "started", "variant", "checkpoint", "frames", "summary", "latency"],
                "properties": {
                    "conversation": {"type": "integer", "minimum": 1},
                    "started": {"type": "string"},
                    "variant": {"type": "string"},
                    "checkpoint": {"type": "object"},
                    "frames": {"type": "integer", "minimum": 0},
                    "summary": {"type": "object"},
                    "latency": _LATENCY,
                    "audio": _AUDIO,
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


def frame_record(timing: FrameTiming, conversation: int | None = None) -> dict[str, Any]:
    """One frame as the log stores it: a flat row, one ``<stage>_ms`` column per stage."""
    record = {
        "frame_index": timing.frame_index,
        "start_ms": timing.start_ms,
        **{f"{stage}_ms": timing.stage_ms(stage) for stage in STAGES},
        "total_ms": timing.total_ms,
        "host_syncs": timing.host_syncs,
        "sub_stages": dict(timing.sub_stages),
        "timing_mode": timing.timing_mode,
    }
    if conversation is not None:
        record["conversation"] = conversation
    return record


@dataclass(frozen=True)
class ConversationLog:
    """One conversation of an app session, as the profile log records it."""

    number: int  # 1, 2, … since launch
    started: datetime
    variant: str  # "demo", "4bit", "8bit", "bf16"
    checkpoint: dict[str, Any]
    frames: Sequence[FrameTiming]
    latencies_s: Sequence[float] = field(default_factory=tuple)  # key release -> first audible reply, per turn
    audio: dict[str, float] | None = None  # AUDIO_COUNTERS at the conversation's end (None: not played live)


def latency_summary(latencies_s: Sequence[float]) -> dict[str, Any]:
    """Turns, p50 and p95 (None without turns) and every turn's delay, in milliseconds."""
    values = [value * 1000.0 for value in latencies_s]
    return {
        "turns": len(values),
        "p50_ms": percentile(values, 0.5) if values else None,
        "p95_ms": percentile(values, 0.95) if values else None,
        "latencies_ms": values,
    }


def build_session_profile_log(
    conversations: Sequence[ConversationLog],
    *,
    settings: dict[str, Any],
    drop_first: int = DEFAULT_COLD_FRAMES,
) -> dict[str, Any]:
    """The profile log of every conversation since launch, each marked (in ``frames`` and ``conversations``).

    ``checkpoint`` is the last conversation's; ``summary`` covers all frames, less each
    conversation's first ``drop_first``.
    """
    if not conversations:
        raise ValueError("a session profile needs at least one conversation")
    kept = [frame for conversation in conversations for frame in conversation.frames[drop_first:]]
    summary = summarize(kept, drop_first=0)
    summary["dropped_cold_frames"] = sum(min(drop_first, len(c.frames)) for c in conversations)
    return {
        **_document(
            conversations[-1].checkpoint,
            settings,
            [frame_record(frame, c.number) for c in conversations for frame in c.frames],
            summary,
        ),
        "conversations": [
            {
                "conversation": c.number,
                "started": c.started.isoformat(timespec="seconds"),
                "variant": c.variant,
                "checkpoint": dict(c.checkpoint),
                "frames": len(c.frames),
                "summary": summarize(c.frames, drop_first=drop_first),
                "latency": latency_summary(c.latencies_s),
                **({} if c.audio is None else {"audio": {key: c.audio[key] for key in AUDIO_COUNTERS}}),
            }
            for c in conversations
        ],
    }


def build_profile_log(
    frames: Sequence[FrameTiming],
    *,
    checkpoint: dict[str, Any],
    settings: dict[str, Any],
    drop_first: int = DEFAULT_COLD_FRAMES,
) -> dict[str, Any]:
    """The profile log document for a session's frame timings."""
    return _document(
        checkpoint, settings, [frame_record(frame) for frame in frames], summarize(frames, drop_first=drop_first)
    )


def _document(
    checkpoint: dict[str, Any], settings: dict[str, Any], frames: list[dict[str, Any]], summary: dict[str, Any]
) -> dict[str, Any]:
    """The fields every profile log has, in schema order."""
    return {
        "schema": SCHEMA_NAME,
        "version": SCHEMA_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "parley_version": parley_version(),
        "mlx_version": str(getattr(mx, "__version__", "unknown")),
        "device": device_description(),
        "checkpoint": dict(checkpoint),
        "settings": dict(settings),
        "frames": frames,
        "summary": summary,
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
    optional = [name for name in _OPTIONAL_FRAME_FIELDS if any(name in frame for frame in frames)]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([*_FRAME_FIELDS, *optional, *sub_names])
    for frame in frames:
        row = [frame[name] for name in _FRAME_FIELDS]
        row += [frame.get(name, "") for name in optional]
        row += [frame.get("sub_stages", {}).get(name, "") for name in sub_names]
        writer.writerow(row)
    return buffer.getvalue()


def to_chrome_trace(log: dict[str, Any]) -> str:
    """Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): one slice per frame and per stage.

    Each conversation is its own process (its frame times start at 0).
    """
    events: list[dict[str, Any]] = []
    for pid in sorted({frame.get("conversation", 1) for frame in log["frames"]} or {1}):
        name = "Parley engine" if "conversation" not in (log["frames"] or [{}])[0] else f"Conversation {pid}"
        events += [
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "frames"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "stages"}},
        ]
    for frame in log["frames"]:
        start = frame["start_ms"] * 1000.0
        pid = frame.get("conversation", 1)
        events.append(
            {
                "name": f"frame {frame['frame_index']}",
                "cat": "frame",
                "ph": "X",
                "pid": pid,
                "tid": 1,
                "ts": start,
                "dur": frame["total_ms"] * 1000.0,
                "args": {"host_syncs": frame["host_syncs"], "timing_mode": frame.get("timing_mode", "host")},
            }
        )
        offset = start
        for stage in STAGES:
            duration = frame[f"{stage}_ms"] * 1000.0
            slice_ = {"name": stage, "cat": "stage", "ph": "X", "pid": pid, "tid": 2, "ts": offset, "dur": duration}
            events.append(slice_)
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
