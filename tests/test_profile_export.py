"""The exported session profile tells the truth about a session that ran two models in two numerics modes.

Real engine on tiny random 4-bit and 8-bit checkpoints, a scripted microphone and speaker: one
conversation on the 4-bit model in exact numerics, then the 8-bit model in fast numerics (and a
setting changed), then File → Export Profile. The JSON is validated against the shipped schema with
jsonschema, and every field the issue asks for is checked against the frames it must come from.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
from pathlib import Path

import pytest

from app.messages import ConversationStarted, FrameStats, ModelLoaded
from app.settings import Settings
from app.worker import EngineWorker
from engine import profile_log
from engine.profiler import percentile
from engine.timeline import LISTEN_STAGES, SPEAK_STAGES, STAGES
from tests.realtime import wait_for

LOAD_WAIT_S = 120.0  # s: how long a step of these tests may take on a busy 2-core machine

COLD = 5  # engine.profiler.DEFAULT_COLD_FRAMES: each conversation's first frames are left out of summaries
EVERY = 4  # one frame in this many is timed stage by stage (the app's default is 25: too few for a short test)


def frames_of(seen: list, variant: str) -> int:
    """FrameStats after the last ConversationStarted on ``variant``."""
    starts = [i for i, m in enumerate(seen) if isinstance(m, ConversationStarted) and m.model.variant.key == variant]
    return sum(isinstance(m, FrameStats) for m in seen[starts[-1] :]) if starts else 0


@pytest.fixture
def exported(build_controller, tiny_q4: Path, tiny_q8: Path, tmp_path: Path) -> dict[str, Path]:
    settings = Settings(
        checkpoints={"4bit": tiny_q4, "8bit": tiny_q8}, active_variant="4bit", idle_pause=False, numerics="exact"
    )
    controller = build_controller(
        settings, history=False, worker_factory=functools.partial(EngineWorker, exact_every=EVERY)
    )
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen), timeout=LOAD_WAIT_S)
    controller.set_talking(True)
    controller.start_conversation()
    seen = wait_for(controller, lambda seen: frames_of(seen, "4bit") >= 18, timeout=LOAD_WAIT_S)
    controller.set_talking(False)

    # Another model, the other numerics and another setting: all three must show in the second record.
    controller.apply_settings(controller.settings.with_changes(active_variant="8bit", numerics="fast", ducking=False))
    seen = wait_for(
        controller,
        lambda seen: any(isinstance(m, ModelLoaded) and m.variant.key == "8bit" for m in seen),
        timeout=LOAD_WAIT_S,
    )
    controller.set_talking(True)
    controller.start_conversation()  # whether or not the press reached a model the window already knew of
    seen += wait_for(controller, lambda more: frames_of(seen + more, "8bit") >= 14, timeout=LOAD_WAIT_S)
    controller.set_talking(False)

    paths = controller.export_profile(tmp_path / "session.json")
    assert [p.name for p in paths] == ["session.json", "session.csv", "session.trace.json"]
    return {"json": paths[0], "csv": paths[1], "trace": paths[2]}


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean_ms": pytest.approx(sum(values) / len(values)),
        "p50_ms": pytest.approx(percentile(values, 0.5)),
        "p95_ms": pytest.approx(percentile(values, 0.95)),
        "max_ms": pytest.approx(max(values)),
    }


def _check_summary(summary: dict, frames: list[dict]) -> None:
    """``summary`` is computed from ``frames`` (already without cold ones): phases from all, stages from the
    stage-timed ones only, each labelled with its basis and frame count."""
    staged = [f for f in frames if f["timing"] == "stage"]
    assert staged, "the test needs stage-timed frames among the kept ones"
    assert summary["frames"] == len(frames)
    assert summary["phases"]["basis"] == "every frame" and summary["phases"]["frames"] == len(frames)
    assert summary["stages"]["basis"] == "stage-timed frames" and summary["stages"]["frames"] == len(staged)
    for phase in ("listening", "speaking", "other", "total"):
        assert summary["phases"][phase] == _stats([f[f"{phase}_ms"] for f in frames]), phase
    for stage in STAGES:
        assert summary["stages"][stage] == _stats([f[f"{stage}_ms"] for f in staged]), stage
    assert summary["realtime_factor"] == pytest.approx(sum(f["total_ms"] for f in frames) / len(frames) / 80.0)


def test_a_profile_of_two_models_and_two_numerics_modes_tells_each_apart(exported: dict[str, Path]) -> None:
    log = json.loads(exported["json"].read_text())

    # Versioned, and valid against the schema shipped in the repository (checked by jsonschema).
    assert log["schema"] == "parley.session-profile" and log["version"] == profile_log.SCHEMA_VERSION == 2
    assert profile_log.SCHEMA_PATH.is_file() and profile_log.profile_log_schema()["properties"]["version"] == {
        "const": 2
    }
    assert profile_log.validate_profile_log(log) == []
    assert "checkpoint" not in log and "settings" not in log, "no top-level record of only the final state"

    conversations = log["conversations"]
    for c in conversations:  # for the record (-s): what the export says of each conversation
        summary = c["summary"]
        print(
            f"conversation {c['conversation']}: {c['model']['name']} {c['model']['quantization']} {c['numerics']}, "
            f"{c['start_ms']:.0f}-{c['end_ms']:.0f} ms, {c['frames']} frames ({c['stage_timed_frames']} stage-timed); "
            f"listening p50 {summary['phases']['listening']['p50_ms']:.2f} ms over {summary['phases']['frames']}, "
            f"RN-T p50 {summary['stages']['rnnt']['p50_ms']:.2f} ms over {summary['stages']['frames']}"
        )

    # Each conversation's own model, quantization, numerics and settings.
    first, last = conversations[0], conversations[-1]
    assert first["model"]["variant"] == "4bit" and first["model"]["quantization"] == "4-bit"
    assert first["model"]["quantization_bits"] == 4 and first["model"]["name"]
    assert first["numerics"] == "exact" and first["settings"]["ducking"] is True
    assert last["model"]["variant"] == "8bit" and last["model"]["quantization"] == "8-bit"
    assert last["model"]["quantization_bits"] == 8 and last["model"]["path"] != first["model"]["path"]
    assert last["numerics"] == "fast" and last["settings"]["ducking"] is False
    for c in (first, last):
        assert c["settings"]["system_prompt"] and c["settings"]["talk_mode"] == "hold"
        assert "numerics" not in c["settings"], "numerics has one home: the conversation's, as it ran"

    # One session clock: conversations follow one another, frames never go back in time.
    frames = log["frames"]
    assert log["session"]["conversations"] == len(conversations) and log["session"]["frames"] == len(frames)
    assert first["start_ms"] == 0.0
    for earlier, later in itertools.pairwise(conversations):
        assert later["start_ms"] >= earlier["end_ms"] > earlier["start_ms"]
    assert log["session"]["duration_ms"] == pytest.approx(last["end_ms"])
    starts = [f["start_ms"] for f in frames]
    assert starts == sorted(starts)
    for c in conversations:
        own = [f for f in frames if f["conversation"] == c["conversation"]]
        assert len(own) == c["frames"] and own[0]["conversation_ms"] == 0.0
        assert own[0]["start_ms"] == pytest.approx(c["start_ms"])
        assert all(f["start_ms"] == pytest.approx(c["start_ms"] + f["conversation_ms"]) for f in own)
        assert c["end_ms"] == pytest.approx(max(f["start_ms"] + f["total_ms"] for f in own))

    # Every frame: phases always; stage columns only on the stage-timed ones.
    for f in frames:
        assert f["listening_ms"] + f["speaking_ms"] + f["other_ms"] == pytest.approx(f["total_ms"])
        if f["timing"] == "stage":
            assert all(f[f"{s}_ms"] is not None for s in STAGES)
            assert f["listening_ms"] == pytest.approx(sum(f[f"{s}_ms"] for s in LISTEN_STAGES))
            assert f["speaking_ms"] == pytest.approx(sum(f[f"{s}_ms"] for s in SPEAK_STAGES))
        else:
            assert f["timing"] == "phase" and all(f[f"{s}_ms"] is None for s in STAGES)
    for c in conversations:
        own = [f for f in frames if f["conversation"] == c["conversation"]]
        assert c["stage_timed_frames"] == sum(f["timing"] == "stage" for f in own)
        assert [f["frame_index"] for f in own if f["timing"] == "stage"] == [
            f["frame_index"] for f in own if f["frame_index"] % EVERY == 0
        ]

    # The summaries, computed the same way: each conversation's, and the session's over all kept frames.
    kept: list[dict] = []
    for c in (first, last):
        own = [f for f in frames if f["conversation"] == c["conversation"]][COLD:]
        _check_summary(c["summary"], own)
    for c in conversations:
        kept += [f for f in frames if f["conversation"] == c["conversation"]][COLD:]
    _check_summary(log["summary"], kept)


def test_the_csv_and_the_trace_carry_each_conversations_model_and_time(exported: dict[str, Path]) -> None:
    log = json.loads(exported["json"].read_text())
    by_number = {c["conversation"]: c for c in log["conversations"]}

    with exported["csv"].open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == len(log["frames"])
    header = rows[0].keys()
    for column in ("conversation", "model", "variant", "quantization", "numerics", "timing", "listening_ms"):
        assert column in header
    assert {"setting.system_prompt", "setting.ducking", "setting.talk_mode"} <= set(header)
    for row, frame in zip(rows, log["frames"], strict=True):
        c = by_number[int(row["conversation"])]
        assert (row["model"], row["variant"], row["quantization"], row["numerics"]) == (
            c["model"]["name"],
            c["model"]["variant"],
            c["model"]["quantization"],
            c["numerics"],
        )
        assert row["setting.ducking"] == str(c["settings"]["ducking"])
        assert float(row["start_ms"]) == pytest.approx(frame["start_ms"]) and row["timing"] == frame["timing"]
        assert (row["rnnt_ms"] == "") == (frame["timing"] == "phase")
    assert {(r["variant"], r["numerics"]) for r in rows} >= {("4bit", "exact"), ("8bit", "fast")}

    trace = json.loads(exported["trace"].read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    first, last = log["conversations"][0], log["conversations"][-1]
    assert "4-bit" in names[first["conversation"]] and "exact" in names[first["conversation"]]
    assert "8-bit" in names[last["conversation"]] and "fast" in names[last["conversation"]]
    spans = {e["pid"]: e for e in events if e.get("cat") == "conversation"}
    for c in log["conversations"]:
        assert spans[c["conversation"]]["ts"] == pytest.approx(c["start_ms"] * 1000.0)
        frame_slices = [e for e in events if e.get("cat") == "frame" and e["pid"] == c["conversation"]]
        assert min(e["ts"] for e in frame_slices) == pytest.approx(c["start_ms"] * 1000.0)
    first_end = max(e["ts"] + e["dur"] for e in events if e.get("cat") == "frame" and e["pid"] == 1)
    later = [e["ts"] for e in events if e.get("cat") == "frame" and e["pid"] == last["conversation"]]
    assert min(later) >= first_end, "the second conversation is laid out after the first, not on top of it"
    stage_slices = [e for e in events if e.get("cat") == "stage"]
    assert len(stage_slices) == 5 * sum(c["stage_timed_frames"] for c in log["conversations"])
