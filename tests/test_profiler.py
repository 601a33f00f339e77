"""Profiler statistics and the session profile log (schema and writers)."""

from __future__ import annotations

import csv
import json
import time
from datetime import UTC, datetime

import mlx.core as mx
import pytest

from engine.counters import GraphCensus
from engine.events import FrameTiming
from engine.hooks import FrameHooks
from engine.profile_log import (
    AUDIO_COUNTERS,
    ConversationLog,
    build_profile_log,
    build_session_profile_log,
    validate_profile_log,
    write_profile_log,
)
from engine.profiler import FrameProfiler, percentile, summarize
from engine.timeline import STAGES


def _timing(index: int, total: float, syncs: int = 2) -> FrameTiming:
    part = total / 5
    return FrameTiming(index, index * 80.0, dict.fromkeys(STAGES, part), total, syncs, {"tts.backbone": part / 2})


def test_percentile_interpolates_linearly():
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 0.5) == 25.0
    assert percentile(values, 0.95) == pytest.approx(38.5)
    assert percentile([], 0.5) == 0.0


def test_summary_drops_cold_frames_and_reports_rtf_and_syncs():
    frames = [_timing(i, 500.0 if i < 5 else 40.0, syncs=9 if i < 5 else 2) for i in range(25)]
    summary = summarize(frames, drop_first=5)
    assert summary["frames"] == 20 and summary["dropped_cold_frames"] == 5
    assert summary["realtime_factor"] == pytest.approx(0.5)
    assert summary["host_syncs_per_frame"] == 2.0
    assert summary["stages"]["total"]["p95_ms"] == pytest.approx(40.0)
    assert summary["stages"]["tts"]["mean_ms"] == pytest.approx(8.0)
    assert summary["sub_stages"]["tts.backbone"]["mean_ms"] == pytest.approx(4.0)


def test_frame_profiler_counts_syncs_and_times_stages():
    profiler = FrameProfiler(sub_stages=True)
    profiler.begin_frame(3)
    x = mx.ones((64, 64))
    time.sleep(0.01)
    profiler.stage("perception", x @ x)
    profiler.sync(x + 1)
    assert profiler.read_back(x[0, :2] * 3) == [3.0, 3.0]
    profiler.sub_stage("tts.backbone", x * 2)
    profiler.stage("tts")
    timing = profiler.end_frame()
    assert timing.frame_index == 3
    # The pipeline's own sync and readback, plus the stage and sub-stage boundaries that waited.
    assert timing.host_syncs == 4
    assert timing.stage_ms("perception") >= 10.0
    assert timing.total_ms >= timing.stage_ms("perception") + timing.stage_ms("tts")
    assert "tts.backbone" in timing.sub_stages
    assert timing.stage_ms("language") == 0.0 and timing.timing_mode == "device"


def test_without_stage_timing_boundaries_do_not_wait():
    profiler = FrameProfiler()
    profiler.begin_frame(0)
    x = mx.ones((8, 8))
    profiler.stage("perception", x @ x)
    profiler.sub_stage("ignored", x)
    profiler.sync(x + 1)
    timing = profiler.end_frame()
    assert timing.host_syncs == 1 and timing.sub_stages == {}


def test_launch_starts_the_device_only_where_nothing_reads_the_graph_first(monkeypatch):
    """A plain frame launches each part early; stage timing (which evaluates at boundaries) and a census (which
    reads each graph before its sync) keep the graph lazy until the sync."""
    launched: list[int] = []
    monkeypatch.setattr(mx, "async_eval", lambda *arrays: launched.append(len(arrays)))
    x = mx.ones((4, 4))
    FrameProfiler().launch(x @ x, x + 1)
    assert launched == [2]
    FrameProfiler(stage_timing_every=1).launch(x @ x)
    FrameProfiler(sub_stages=True).launch(x @ x)
    FrameProfiler(census=GraphCensus({})).launch(x @ x)
    FrameProfiler().launch()
    assert launched == [2]


def test_the_profiler_decides_which_frames_are_timed_on_the_device():
    """One frame in N evaluates at its stage boundaries (the app's overlay policy); the profiler decides as each
    frame begins and marks the frame's timing, so no caller flips a switch between frames."""
    x = mx.ones((8, 8))
    profiler = FrameProfiler(stage_timing_every=4)
    modes, syncs = [], []
    for index in range(9):
        profiler.begin_frame(index)
        profiler.stage("perception", x @ x)
        profiler.stage("rnnt", x + 1)
        profiler.sync(x * 2)
        timing = profiler.end_frame()
        modes.append(timing.timing_mode)
        syncs.append(timing.host_syncs)
    assert [index for index, mode in enumerate(modes) if mode == "device"] == [0, 4, 8]
    assert syncs == [3 if mode == "device" else 1 for mode in modes]
    assert [FrameProfiler(sub_stages=True).times_stages(i) for i in range(3)] == [True] * 3
    assert not any(FrameProfiler().times_stages(i) for i in range(3))
    with pytest.raises(ValueError, match="stage_timing_every"):
        FrameProfiler(stage_timing_every=-1)
    with pytest.raises(AttributeError):
        profiler.stage_timing = True  # type: ignore[misc]  # the policy is the profiler's, not its caller's


def test_the_profiler_is_the_frame_hooks_the_session_calls():
    """FrameProfiler implements engine.hooks.FrameHooks: every call the Protocol names, with its read-only flags."""
    profiler: FrameHooks = FrameProfiler(sub_stages=True)
    assert profiler.sub_stages and not profiler.observing
    protocol = {name for name in vars(FrameHooks) if not name.startswith("_")}
    assert {"read_back", "observe", "begin_frame", "end_frame", "stage", "sync"} <= protocol
    assert all(hasattr(FrameProfiler, name) for name in protocol)
    assert not hasattr(FrameProfiler, "readback")


CHECKPOINT = {"name": "tiny", "path": "/x/tiny", "quantization_bits": 4, "size_bytes": 10, "numerics": "exact"}


def _staged(index: int, total: float) -> FrameTiming:
    part = total / 5
    stages = dict.fromkeys(STAGES, part)
    return FrameTiming(index, index * 80.0, stages, total, 5, {"tts.backbone": part / 2}, timing_mode="device")


def _log():
    frames = [_staged(i, 30.0 + i) if i % 4 == 0 else _timing(i, 30.0 + i) for i in range(12)]
    return build_profile_log(frames, checkpoint=CHECKPOINT, settings={"seed": 0, "system_prompt": ""})


def test_profile_log_validates_and_detects_problems():
    log = _log()
    assert validate_profile_log(log) == []
    broken = json.loads(json.dumps(log))
    del broken["summary"]["stages"]["tts"]
    broken["frames"][2]["host_syncs"] = -1
    broken["frames"][1]["rnnt_ms"] = 1.0  # a phase-timed frame claiming a stage time
    broken["version"] = 99
    problems = validate_profile_log(broken)
    assert any("$.summary.stages: 'tts' is a required property" in p for p in problems), problems
    assert any(p.startswith("$.frames[2].host_syncs") for p in problems)
    assert any(p.startswith("$.frames[1].rnnt_ms") for p in problems)
    assert any(p.startswith("$.version") for p in problems)


def test_the_summary_takes_stages_from_stage_timed_frames_and_phases_from_every_frame():
    log = _log()
    kept = [i for i in range(5, 12)]  # the first five are cold
    staged = [i for i in kept if i % 4 == 0]  # 8
    assert log["summary"]["phases"]["frames"] == len(kept) and log["summary"]["stages"]["frames"] == len(staged)
    assert log["summary"]["stages"]["tts"]["mean_ms"] == pytest.approx((30.0 + 8) / 5)
    assert log["summary"]["phases"]["total"]["mean_ms"] == pytest.approx(sum(30.0 + i for i in kept) / len(kept))
    assert log["summary"]["phases"]["listening"]["max_ms"] == pytest.approx(3 * (30.0 + 11) / 5)
    assert log["frames"][1]["timing"] == "phase" and log["frames"][1]["tts_ms"] is None
    assert log["frames"][4]["timing"] == "stage" and log["frames"][4]["tts_ms"] == pytest.approx(34.0 / 5)
    only_phases = build_profile_log([_timing(i, 40.0) for i in range(8)], checkpoint=CHECKPOINT, settings={})
    assert only_phases["summary"]["stages"]["rnnt"] is None, "no stage-timed frame: no stage figure, not zeros"
    assert validate_profile_log(only_phases) == []


def test_a_conversations_audio_counters_are_checked_and_optional():
    started = datetime.now(UTC)
    frames = [_timing(i, 40.0) for i in range(3)]
    partial = {"output_underruns": 2, "output_skipped_s": 0.16}
    played = ConversationLog(1, started, "4bit", CHECKPOINT, frames, audio=partial)
    with pytest.raises(KeyError, match="input_lost_s"):
        build_session_profile_log([played])
    played = ConversationLog(1, started, "4bit", CHECKPOINT, frames, audio=dict.fromkeys(AUDIO_COUNTERS, 0))
    unplayed = ConversationLog(2, started, "4bit", CHECKPOINT, frames)
    log = build_session_profile_log([played, unplayed])
    assert validate_profile_log(log) == []
    assert log["conversations"][0]["audio"] == dict.fromkeys(AUDIO_COUNTERS, 0)
    assert "audio" not in log["conversations"][1], "a conversation not played live has none"
    log["conversations"][0]["audio"]["output_underruns"] = -1
    assert any("audio.output_underruns" in problem for problem in validate_profile_log(log))


def test_profile_log_writers(tmp_path):
    log = _log()
    json_path = write_profile_log(log, tmp_path / "session.json")
    assert validate_profile_log(json.loads(json_path.read_text())) == []
    with write_profile_log(log, tmp_path / "s.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == 12 and float(rows[3]["total_ms"]) == 33.0 and "tts.backbone" in rows[0]
    assert rows[3]["tts_ms"] == "" and float(rows[4]["tts_ms"]) == pytest.approx(34.0 / 5)
    assert rows[0]["model"] == "tiny" and rows[0]["quantization"] == "4-bit" and rows[0]["numerics"] == "exact"
    trace = json.loads(write_profile_log(log, tmp_path / "s.trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # The conversation, every frame and its three phases, and the five stages of the three stage-timed frames.
    assert len(slices) == 1 + 12 * 4 + 3 * 5
    frame0 = [e for e in slices if e["tid"] == 3 and e["ts"] == 0.0]
    assert frame0 and frame0[0]["name"] == "perception"
    assert not list(tmp_path.glob(".*.tmp")), "no temporary files left behind"


def test_atomic_write_failure_leaves_no_partial_file(tmp_path):
    target = tmp_path / "missing-folder" / "log.json"
    with pytest.raises(FileNotFoundError):
        write_profile_log(_log(), target)
    assert not target.exists()


def test_the_chrome_trace_is_written_as_json_dumps_would_write_it_without_its_one_shot_encoder() -> None:
    """The trace goes through the encoder in Python (which lets the frame thread run between its pieces, where
    json.dumps's C encoder held the GIL for the whole trace); its text is json.dumps's to the byte."""
    import json

    from engine.profile_log import to_chrome_trace

    frames = [_staged(index, 40.0 + index) for index in range(12)]
    log = build_profile_log(frames, checkpoint=CHECKPOINT, settings={"talk_mode": "hold"}, drop_first=2)
    text = to_chrome_trace(log)
    assert text == json.dumps(json.loads(text)) + "\n"
    assert len(json.loads(text)["traceEvents"]) > len(frames)
