"""``parley bench``: the report it builds, its agreement check against mlx-vlm, the curve, and bad options."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from app.bench import FRAME, bench, bench_input, format_report, question_audio
from app.cli import main as parley


def test_input_repeats_the_question_every_n_frames() -> None:
    question = question_audio()
    once = bench_input(100)
    assert np.array_equal(once[: question.size], question) and not once[question.size :].any()
    repeated = bench_input(100, speech_every=40)
    for start in (0, 40, 80):
        piece = repeated[start * FRAME : start * FRAME + question.size]
        assert np.array_equal(piece, question[: piece.size])
    assert not repeated[question.size : 40 * FRAME].any()


@pytest.mark.parity
def test_report_against_mlx_vlm_with_curve(tmp_path: Path) -> None:
    lines: list[str] = []
    report = bench(
        model=None,
        random_size="tiny",
        quantize=4,
        seed=0,
        frames=24,
        rounds=1,
        compare="mlx-vlm",
        sub_stages=False,
        curve_every=8,
        speech_every=12,
        out=lines.append,
    )
    ours = report["parley"]
    assert ours["frames"] == 24 and ours["host_syncs_per_frame"] >= 2.0
    assert set(ours["stages"]) == {"perception", "rnnt", "language", "tts", "codec"}
    assert report["agreement"]["frames"] == 24
    for channel in ("text_ids_identical", "function_ids_identical", "codes_identical"):
        assert report["agreement"][channel] == 24, report["agreement"]
    assert report["speedup_p50"] > 0 and "mlx_vlm" in report
    alone = report["peak_alone_gb"]  # each peak less what only the other model holds: at least its own weights
    assert report["weights_gb"] <= alone["parley"] <= report["parley"]["peak_memory_gb"]
    assert report["mlx_vlm_weights_gb"] <= alone["mlx_vlm"] <= report["mlx_vlm"]["peak_memory_gb"]

    points = ours["curve"]
    assert [(p["start_frame"], p["end_frame"]) for p in points] == [(0, 8), (8, 16), (16, 24)]
    assert points[0]["state_gb"] < points[1]["state_gb"] < points[2]["state_gb"]  # the attention history grows
    assert all(p["active_gb"] >= p["state_gb"] for p in points)

    text = format_report(report)
    assert "peak memory alone" in text
    assert "speedup vs mlx-vlm" in text and "identical frames: text 24/24, function 24/24, codes 24/24" in text
    assert "min (frames 16-24)" in text
    assert any("parley p50" in line for line in lines)
    json.dumps(report)  # the --json output must serialise


def test_fast_against_exact_alternates_in_one_process_and_puts_fast_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # The backbone's caches kept in float32, so that fast mode only reorders sums and every output can be held equal
    # (the bf16 caches' drift is measured apart, tests/test_numerics.py).
    monkeypatch.setattr("engine.numerics.BACKBONE_CACHE_DTYPE", mx.float32)
    lines: list[str] = []
    report = bench(
        model=None,
        random_size="tiny",
        quantize=4,
        seed=0,
        frames=16,
        rounds=2,
        compare="exact",
        sub_stages=False,
        numerics="fast",
        out=lines.append,
    )
    assert len(report["parley_rounds"]) == len(report["exact_rounds"]) == 2
    assert [line.split(":")[0] for line in lines if line.startswith("round ")] == [
        "round 1",
        "round 1",
        "round 2",
        "round 2",
    ], "fast and exact alternate round by round"
    assert report["model"]["numerics"] == "fast", "the model is switched back to fast after each exact round"
    agree = report["agreement_with_exact"]
    # On the CPU the fused step's fallback reorders a float32 sum: ids and codes stay equal over 16 frames.
    assert agree["frames"] == 16 and agree["codes_identical"] == 16, agree
    assert report["speedup_vs_exact_p50"] > 0
    assert "fast vs exact (same process, alternating)" in format_report(report)


def test_kernels_stand_in_for_a_timed_run_and_stop_standing_in_after() -> None:
    """``--stand-in-kernels`` times the host's work for a GPU's frame on this CPU: every frame runs, one sync each,
    and the process's kernels are its own again afterwards."""
    from engine.kernels.admission import standing_in

    lines: list[str] = []
    report = bench(
        model=None,
        random_size="tiny",
        quantize=4,
        seed=0,
        frames=10,
        rounds=1,
        compare=None,
        sub_stages=False,
        numerics="fast",
        stand_in_kernels=True,
        out=lines.append,
    )
    assert report["kernels_standing_in"] and not standing_in()
    assert report["parley"]["frames"] == 10 and report["parley"]["host_syncs_per_frame"] == pytest.approx(1.0)
    assert any("CUDA's kernels standing in" in line for line in lines)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--frames", "4"], "--frames must be at least 8"),
        (["--curve-every", "500"], "--curve-every must be between 1 and --frames (100)"),
        (["--speech-every", "0"], "--speech-every must be between 1 and --frames (100)"),
        (["--history", "-1"], "--history must not be negative"),
        (["--history", "500", "--compare", "mlx-vlm"], "cannot be used with --compare"),
        (["--compare", "exact"], "--compare exact times --numerics fast against exact; add --numerics fast"),
        (["--stand-in-kernels"], "use --numerics fast, and no --compare"),
        (["--stand-in-kernels", "--numerics", "fast", "--compare", "exact"], "use --numerics fast, and no --compare"),
    ],
)
def test_bad_options_exit_2_with_the_reason(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parley(["bench", "--random", "tiny", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_an_aged_conversation_holds_the_state_of_a_long_one() -> None:
    """``--history N`` stands in for N frames: every growing attention cache gains N positions and the
    state matches what N real frames would have added (within the caches' 256-position blocks)."""
    from engine.loading.memory import state_growth_per_frame
    from engine.random_model import random_voicechat
    from engine.session import Session

    voicechat = random_voicechat("tiny", quantize=4, seed=0)
    session = Session(voicechat, seed=0)
    samples = bench_input(3)
    session.push(samples[:FRAME], 16_000)
    language_before, tts_before, state_before = (
        session.caches.language.position,
        session.caches.tts.offset,
        session.state_nbytes,
    )
    session.age(3000)
    assert session.caches.language.position == language_before + 3000
    assert session.caches.tts.offset == tts_before + 3000
    grown = session.state_nbytes - state_before
    expected = sum(state_growth_per_frame(voicechat.config, frame) for frame in range(1, 3001))
    assert abs(grown - expected) <= 256 * state_growth_per_frame(voicechat.config, 0)
    for start in (FRAME, 2 * FRAME):  # and the conversation goes on from there
        session.push(samples[start : start + FRAME], 16_000)
    assert session.caches.tts.offset == tts_before + 3002
    session.close()
