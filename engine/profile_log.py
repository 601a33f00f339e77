"""The session profile log: one schema, written as JSON, CSV or a Chrome/Perfetto trace.

``parley run --profile-json`` and the app's *Export profile…* both produce this document
(schema: ``profile_log.schema.json`` beside this module, :data:`SCHEMA_PATH`). It tells
apart the two ways a frame is timed: every frame per phase (listening = perception +
RN-T + language, speaking = TTS + codec, other = the rest of the frame), exact because
each phase ends in one read-back; and one frame in N also stage by stage (``timing``
"stage"), where each stage is evaluated at its boundary. A phase-timed frame's stage
columns are null (there device work lands in the stage that waited for it), and the
per-stage summary comes from stage-timed frames only.

One session clock: ``start_ms`` counts from the first conversation's start, so
conversations follow one another in the frames, the CSV and the Chrome trace. Each
conversation records its own model, quantization, numerics and settings (the session
may run several), and the CSV repeats them on each row. Files are written to a temporary
name in the target folder and renamed into place, so a full disk or an unwritable folder
never leaves a half-written log behind and the in-memory log stays available for another
try.
"""

from __future__ import annotations

import csv
import io
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import mlx.core as mx

from .events import FrameTiming
from .files import write_atomic
from .profiler import DEFAULT_COLD_FRAMES, percentile, stage_stats
from .timeline import FRAME_MS, LISTEN_STAGES, SPEAK_STAGES, STAGES

SCHEMA_NAME = "parley.session-profile"
SCHEMA_VERSION = 2  # 2: one session clock, per-conversation model/numerics/settings, stage vs phase timing
SCHEMA_PATH = Path(__file__).with_name("profile_log.schema.json")
PHASES = ("listening", "speaking", "other")
# What the app's sound devices did in a conversation (a conversation's optional ``audio``, named as the app's
# ``FrameStats`` fields): times the speaker ran out of the assistant's audio, silence then skipped to win that
# delay back, and microphone audio dropped because the engine fell too far behind.
AUDIO_COUNTERS = ("output_underruns", "output_skipped_s", "input_lost_s")
# CSV: what each row says about its conversation (from the conversation's record), then the frame's own columns.
_CSV_CONVERSATION = ("conversation", "model", "variant", "quantization", "numerics")
_CSV_FRAME = (
    "frame_index",
    "start_ms",
    "conversation_ms",
    "timing",
    "total_ms",
    *(f"{phase}_ms" for phase in PHASES),
    *(f"{stage}_ms" for stage in STAGES),
    "host_syncs",
)
_SESSION_CLOCK = "start_ms: milliseconds since the first conversation started (monotonic)"


@cache
def profile_log_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the document, read from :data:`SCHEMA_PATH`."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


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


def stage_timed(timing: FrameTiming) -> bool:
    """Whether ``timing`` was timed stage by stage (each stage evaluated at its boundary)."""
    return timing.timing_mode == "device"


def phase_ms(timing: FrameTiming) -> dict[str, float]:
    """Listening, speaking and the rest of the frame, in ms: exact for every frame."""
    listening = sum(timing.stage_ms(stage) for stage in LISTEN_STAGES)
    speaking = sum(timing.stage_ms(stage) for stage in SPEAK_STAGES)
    return {"listening": listening, "speaking": speaking, "other": max(0.0, timing.total_ms - listening - speaking)}


def quantization_label(bits: int | None) -> str:
    return "bf16" if bits is None else f"{bits}-bit"


@dataclass(frozen=True)
class ConversationLog:
    """One conversation as the profile log records it: plain values, as the app or ``parley run`` has them."""

    number: int  # 1, 2, … since launch
    started: datetime
    variant: str  # "demo", "4bit", "8bit", "bf16"
    checkpoint: dict[str, Any]  # VoiceChat.describe(): name, path, quantization_bits, size_bytes, numerics, …
    frames: Sequence[FrameTiming]
    latencies_s: Sequence[float] = field(default_factory=tuple)  # key release -> first audible reply, per turn
    audio: dict[str, float] | None = None  # AUDIO_COUNTERS at the conversation's end (None: not played live)
    settings: dict[str, Any] = field(default_factory=dict)  # the settings in force when it started
    clock_s: float | None = None  # its start on any monotonic clock (None: right after the previous one)


def latency_summary(latencies_s: Sequence[float]) -> dict[str, Any]:
    """Turns, p50 and p95 (None without turns) and every turn's delay, in milliseconds."""
    values = [value * 1000.0 for value in latencies_s]
    return {
        "turns": len(values),
        "p50_ms": percentile(values, 0.5) if values else None,
        "p95_ms": percentile(values, 0.95) if values else None,
        "latencies_ms": values,
    }


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    return stage_stats(values) if values else None


def profile_summary(
    frames: Sequence[FrameTiming], *, dropped_cold_frames: int = 0, frame_ms: float = FRAME_MS
) -> dict[str, Any]:
    """Figures over ``frames`` (cold frames already dropped), each labelled with the frames it comes from:
    phases and totals from every frame, stages only from the stage-timed ones."""
    staged = [frame for frame in frames if stage_timed(frame)]
    phases = [phase_ms(frame) for frame in frames]
    totals = [frame.total_ms for frame in frames]
    mean_total = sum(totals) / len(totals) if totals else 0.0
    sub_names = sorted({name for frame in frames for name in frame.sub_stages})
    return {
        "frames": len(frames),
        "dropped_cold_frames": dropped_cold_frames,
        "frame_duration_ms": frame_ms,
        "realtime_factor": mean_total / frame_ms if frame_ms else 0.0,
        "processing_frames_per_second": 1000.0 / mean_total if mean_total else 0.0,
        "host_syncs_per_frame": sum(frame.host_syncs for frame in frames) / len(frames) if frames else 0.0,
        "phases": {
            "basis": "every frame",
            "frames": len(frames),
            **{phase: _stats([values[phase] for values in phases]) for phase in PHASES},
            "total": _stats(totals),
        },
        "stages": {
            "basis": "stage-timed frames",
            "frames": len(staged),
            **{stage: _stats([frame.stage_ms(stage) for frame in staged]) for stage in STAGES},
        },
        "sub_stages": {
            name: stage_stats([frame.sub_stages.get(name, 0.0) for frame in frames if frame.sub_stages])
            for name in sub_names
        },
    }


def frame_record(timing: FrameTiming, conversation: int, session_ms: float, conversation_ms: float) -> dict[str, Any]:
    """One frame as the log stores it: a flat row; stage columns only where it was timed stage by stage."""
    staged = stage_timed(timing)
    return {
        "conversation": conversation,
        "frame_index": timing.frame_index,
        "start_ms": session_ms,
        "conversation_ms": conversation_ms,
        "timing": "stage" if staged else "phase",
        "total_ms": timing.total_ms,
        **{f"{phase}_ms": value for phase, value in phase_ms(timing).items()},
        **{f"{stage}_ms": timing.stage_ms(stage) if staged else None for stage in STAGES},
        "host_syncs": timing.host_syncs,
        "sub_stages": dict(timing.sub_stages),
    }


def _model(c: ConversationLog) -> dict[str, Any]:
    checkpoint = c.checkpoint
    bits = checkpoint.get("quantization_bits")
    return {
        "name": str(checkpoint.get("name", "")),
        "path": str(checkpoint.get("path", "")),
        "variant": c.variant,
        "quantization": quantization_label(bits),
        "quantization_bits": bits,
        "size_bytes": checkpoint.get("size_bytes"),
    }


def build_session_profile_log(
    conversations: Sequence[ConversationLog], *, drop_first: int = DEFAULT_COLD_FRAMES
) -> dict[str, Any]:
    """The profile log of ``conversations`` (in order) on one session clock.

    A conversation starts on that clock where its ``clock_s`` says (relative to the first's), never before the
    previous one's last frame ended; its frames keep their spacing. Summaries drop each conversation's first
    ``drop_first`` frames (warm-up).
    """
    if not conversations:
        raise ValueError("a session profile needs at least one conversation")
    origin = conversations[0].clock_s
    frames: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    kept: list[FrameTiming] = []
    end_ms = 0.0
    for c in conversations:
        measured = None if origin is None or c.clock_s is None else (c.clock_s - origin) * 1000.0
        start_ms = end_ms if measured is None else max(measured, end_ms)
        first = c.frames[0].start_ms if c.frames else 0.0
        for timing in c.frames:
            own = max(0.0, timing.start_ms - first)
            frames.append(frame_record(timing, c.number, start_ms + own, own))
        last = max((timing.start_ms - first + timing.total_ms for timing in c.frames), default=0.0)
        end_ms = start_ms + last
        kept += c.frames[drop_first:]
        dropped = min(drop_first, len(c.frames))
        records.append(
            {
                "conversation": c.number,
                "started": c.started.isoformat(timespec="seconds"),
                "start_ms": start_ms,
                "end_ms": end_ms,
                "model": _model(c),
                "numerics": str(c.checkpoint.get("numerics", "exact")),
                "fast_changes": dict(c.checkpoint.get("fast_changes", {})),
                "settings": dict(c.settings),
                "frames": len(c.frames),
                "stage_timed_frames": sum(1 for timing in c.frames if stage_timed(timing)),
                "summary": profile_summary(c.frames[drop_first:], dropped_cold_frames=dropped),
                "latency": latency_summary(c.latencies_s),
                **({} if c.audio is None else {"audio": {key: c.audio[key] for key in AUDIO_COUNTERS}}),
            }
        )
    dropped_total = sum(min(drop_first, len(c.frames)) for c in conversations)
    return {
        "schema": SCHEMA_NAME,
        "version": SCHEMA_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "parley_version": parley_version(),
        "mlx_version": str(getattr(mx, "__version__", "unknown")),
        "device": device_description(),
        "session": {
            "started": conversations[0].started.isoformat(timespec="seconds"),
            "clock": _SESSION_CLOCK,
            "conversations": len(conversations),
            "frames": len(frames),
            "duration_ms": end_ms,
        },
        "conversations": records,
        "frames": frames,
        "summary": profile_summary(kept, dropped_cold_frames=dropped_total),
    }


def build_profile_log(
    frames: Sequence[FrameTiming],
    *,
    checkpoint: dict[str, Any],
    settings: dict[str, Any],
    drop_first: int = DEFAULT_COLD_FRAMES,
) -> dict[str, Any]:
    """The profile log of one offline run (``parley run``): a session of one conversation."""
    bits = checkpoint.get("quantization_bits")
    variant = "bf16" if bits is None else f"{bits}bit"
    conversation = ConversationLog(1, datetime.now(UTC), variant, checkpoint, frames, settings=settings)
    return build_session_profile_log([conversation], drop_first=drop_first)


def validate_profile_log(doc: Any) -> list[str]:
    """Problems with ``doc`` against the schema (empty when valid), each as ``$.path.to.field: what is wrong``.

    Uses ``jsonschema`` (a test dependency: the app writes logs, it never needs to check one).
    """
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(profile_log_schema(), format_checker=Draft202012Validator.FORMAT_CHECKER)
    return [
        f"{error.json_path}: {error.message}"
        for error in sorted(validator.iter_errors(doc), key=lambda error: list(error.absolute_path))
    ]


# --------------------------------------------------------------------------- writers


def to_json(log: dict[str, Any]) -> str:
    return json.dumps(log, indent=2) + "\n"


def _setting_text(value: Any) -> Any:
    return "" if value is None else value


def to_csv(log: dict[str, Any]) -> str:
    """One row per frame, each with its conversation's model, quantization, numerics and settings
    (``setting.<name>``); stage columns are empty on phase-timed frames; sub-stages become extra columns."""
    frames = log["frames"]
    by_number = {c["conversation"]: c for c in log["conversations"]}
    setting_names = sorted({name for c in log["conversations"] for name in c["settings"]})
    sub_names = sorted({name for frame in frames for name in frame.get("sub_stages", {})})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([*_CSV_CONVERSATION, *_CSV_FRAME, *(f"setting.{name}" for name in setting_names), *sub_names])
    for frame in frames:
        c = by_number[frame["conversation"]]
        model = c["model"]
        row: list[Any] = [c["conversation"], model["name"], model["variant"], model["quantization"], c["numerics"]]
        row += ["" if frame[name] is None else frame[name] for name in _CSV_FRAME]
        row += [_setting_text(c["settings"].get(name)) for name in setting_names]
        row += [frame["sub_stages"].get(name, "") for name in sub_names]
        writer.writerow(row)
    return buffer.getvalue()


def to_chrome_trace(log: dict[str, Any]) -> str:
    """Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev) on the session clock.

    Each conversation is a process named by its number, model and numerics, laid out at its own time: a
    slice for the conversation, one per frame, the frame's phases, and its stages where it was timed stage by
    stage.
    """
    events: list[dict[str, Any]] = []
    for c in log["conversations"]:
        pid = c["conversation"]
        name = f"Conversation {pid} · {c['model']['name']} · {c['model']['quantization']} · {c['numerics']}"
        events += [
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "conversation"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "frames"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "phases (every frame)"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 3, "args": {"name": "stages (stage-timed frames)"}},
            {
                "name": name,
                "cat": "conversation",
                "ph": "X",
                "pid": pid,
                "tid": 0,
                "ts": c["start_ms"] * 1000.0,
                "dur": (c["end_ms"] - c["start_ms"]) * 1000.0,
                "args": {"frames": c["frames"], "stage_timed_frames": c["stage_timed_frames"], **c["settings"]},
            },
        ]
    for frame in log["frames"]:
        start = frame["start_ms"] * 1000.0
        pid = frame["conversation"]
        events.append(
            {
                "name": f"frame {frame['frame_index']}",
                "cat": "frame",
                "ph": "X",
                "pid": pid,
                "tid": 1,
                "ts": start,
                "dur": frame["total_ms"] * 1000.0,
                "args": {"host_syncs": frame["host_syncs"], "timing": frame["timing"]},
            }
        )
        for tid, parts in ((2, PHASES), (3, STAGES if frame["timing"] == "stage" else ())):
            offset = start
            for part in parts:
                duration = frame[f"{part}_ms"] * 1000.0
                events.append(
                    {
                        "name": part,
                        "cat": "phase" if tid == 2 else "stage",
                        "ph": "X",
                        "pid": pid,
                        "tid": tid,
                        "ts": offset,
                        "dur": duration,
                    }
                )
                offset += duration
    other = {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION, "clock": _SESSION_CLOCK}
    trace = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
    # The same text as json.dumps, through the encoder in Python: json.dumps's one-shot C encoder holds the GIL for
    # the whole trace (24-30 ms for a long session), which the engine's frame thread waited out during an export.
    return "".join(json.JSONEncoder().iterencode(trace)) + "\n"


def write_profile_log(log: dict[str, Any], path: str | Path, fmt: str | None = None) -> Path:
    """Write ``log`` as ``json``, ``csv`` or ``trace`` (guessed from the suffix when ``fmt`` is None)."""
    path = Path(path)
    if fmt is None:
        fmt = "csv" if path.suffix.lower() == ".csv" else "trace" if path.name.endswith(".trace.json") else "json"
    render = {"json": to_json, "csv": to_csv, "trace": to_chrome_trace}.get(fmt)
    if render is None:
        raise ValueError(f"unknown profile format {fmt!r}; use json, csv or trace")
    return write_atomic(path, render(log))
