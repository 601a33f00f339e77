"""The keep-up policy, driven by scripted frame times and queue depths (no engine, no clock)."""

from __future__ import annotations

import pytest

from app.keep_up import MAX_ECONOMY, KeepUpPolicy


def drive(policy: KeepUpPolicy, frames: list[tuple[float, int]]) -> list[int]:
    """The level after each frame."""
    levels = []
    for frame_ms, queued in frames:
        policy.observe(frame_ms, queued)
        levels.append(policy.level)
    return levels


def test_a_machine_that_keeps_up_never_economises() -> None:
    policy = KeepUpPolicy()
    assert drive(policy, [(79.0, 2)] * 200) == [0] * 200  # under 88 ms, fewer than 3 queued: not behind


def test_a_slow_frame_or_a_queue_steps_up_at_once_then_waits_before_the_next_step() -> None:
    policy = KeepUpPolicy(max_level=2)
    assert policy.observe(88.0, 0) == 1  # the first frame of 88 ms
    assert drive(policy, [(95.0, 0)] * 3) == [1, 1, 1]  # settling: the step is given three frames to work
    assert policy.observe(95.0, 0) == 2
    assert drive(policy, [(120.0, 6)] * 20) == [MAX_ECONOMY] * 20  # no level beyond the last

    queued = KeepUpPolicy()
    assert queued.observe(40.0, 3) == 1  # quick frames, but three waiting: behind all the same


def test_by_default_it_stops_at_fewer_samples_and_keeps_guidance() -> None:
    policy = KeepUpPolicy()
    assert drive(policy, [(150.0, 8)] * 30) == [1] * 30


def test_it_comes_back_one_step_at_a_time_after_two_seconds_of_quick_frames() -> None:
    policy = KeepUpPolicy(max_level=2)
    drive(policy, [(100.0, 4)] * 5)
    assert policy.level == 2
    levels = drive(policy, [(60.0, 1)] * 50)
    assert levels[:24] == [2] * 24 and levels[24] == 1  # 25 quick frames in a row
    assert levels[25:49] == [1] * 24 and levels[49] == 0


def test_hysteresis_a_frame_between_the_thresholds_neither_steps_up_nor_lets_it_come_back() -> None:
    policy = KeepUpPolicy()
    policy.observe(90.0, 0)
    # 70 ms is under the budget (not behind) but over 64 ms (no room to spare): it stays, never flipping.
    assert drive(policy, [(70.0, 0)] * 100) == [1] * 100
    # A slow frame breaks a run of quick ones: the count starts again.
    levels = drive(policy, [(60.0, 0)] * 20 + [(75.0, 0)] + [(60.0, 0)] * 25)
    assert levels[:45] == [1] * 45 and levels[45] == 0
    # Quick frames with a queue still draining do not count as caught up.
    policy = KeepUpPolicy()
    policy.observe(90.0, 0)
    assert drive(policy, [(50.0, 2)] * 60) == [1] * 60


def test_reset_starts_a_new_conversation_at_the_full_step() -> None:
    policy = KeepUpPolicy(max_level=2)
    drive(policy, [(100.0, 0)] * 5)
    policy.reset()
    assert policy.level == 0 and policy.observe(100.0, 0) == 1


def test_thresholds_that_would_flip_every_frame_are_refused() -> None:
    with pytest.raises(ValueError, match="below"):
        KeepUpPolicy(recover_ms=90.0, behind_ms=88.0)
    with pytest.raises(ValueError, match="recover_queue"):
        KeepUpPolicy(recover_queue=3, behind_queue=3)
    with pytest.raises(ValueError, match="max_level"):
        KeepUpPolicy(max_level=MAX_ECONOMY + 1)
