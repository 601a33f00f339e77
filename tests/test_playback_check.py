"""The speaker checks of the end-to-end and self-tests against captures made up here: they must tell an honest
underrun (counted, silence inserted) from a stall nobody counted and from audio that was skipped."""

from __future__ import annotations

import numpy as np
import pytest

from tests.pulse import check_heard, check_played_in_order

RATE = 22_050
LATENCY = 3_000  # samples of silence before the speaker starts


@pytest.fixture
def output() -> np.ndarray:
    """Five seconds of broadband noise, like the demo model's answer."""
    return np.random.default_rng(7).standard_normal(5 * RATE).astype(np.float32) * 0.1


def capture(*parts: np.ndarray) -> np.ndarray:
    """The speaker's capture: a latency of silence, then ``parts``, then a little room noise."""
    played = np.concatenate([np.zeros(LATENCY, np.float32), *parts])
    return played + np.random.default_rng(8).standard_normal(played.size).astype(np.float32) * 1e-3


def test_a_continuous_capture_passes_and_gives_the_latency(output: np.ndarray) -> None:
    latency = LATENCY / RATE
    assert check_played_in_order(capture(output), output, RATE, underruns=0) == pytest.approx((latency, latency))


def test_a_gap_passes_only_when_the_app_counted_underruns(output: np.ndarray) -> None:
    gap = RATE // 5
    cut = int(2.05 * RATE) - LATENCY  # inside the capture's window from 2.01 to 2.14 s
    played = capture(output[:cut], np.zeros(gap, np.float32), output[cut:])
    with pytest.raises(AssertionError, match="is not the queued output"):
        check_played_in_order(played, output, RATE, underruns=0)
    latencies = (LATENCY / RATE, (LATENCY + gap) / RATE)
    assert check_played_in_order(played, output, RATE, underruns=3) == pytest.approx(latencies)


def test_a_stall_between_windows_is_an_underrun_nobody_counted(output: np.ndarray) -> None:
    cut = int(1.4 * RATE) - LATENCY  # between the capture's windows at 1.26 and 1.51 s: each still matches
    played = capture(output[:cut], np.zeros(RATE // 10, np.float32), output[cut:])
    with pytest.raises(AssertionError, match="stalled without an underrun"):
        check_played_in_order(played, output, RATE, underruns=0)


def test_skipped_output_fails_even_with_underruns(output: np.ndarray) -> None:
    cut = int(1.4 * RATE)
    played = capture(output[:cut], output[cut + RATE // 10 :])
    with pytest.raises(AssertionError, match="never reached the speaker"):
        check_played_in_order(played, output, RATE, underruns=5)


def test_another_stream_fails(output: np.ndarray) -> None:
    other = np.random.default_rng(9).standard_normal(output.size).astype(np.float32) * 0.1
    with pytest.raises(AssertionError, match="reached the speaker"):
        check_played_in_order(capture(other), output, RATE, underruns=2)


def test_a_clip_with_a_gap_is_heard_only_when_the_app_counted_an_underrun(output: np.ndarray) -> None:
    clip = output[: int(2.4 * RATE)]
    assert check_heard(clip, capture(clip), RATE, underruns=0) == LATENCY
    cut = int(1.3 * RATE)
    gapped = capture(clip[:cut], np.zeros(RATE // 50, np.float32), clip[cut:])
    with pytest.raises(AssertionError, match="counted no underrun"):
        check_heard(clip, gapped, RATE, underruns=0)
    assert check_heard(clip, gapped, RATE, underruns=1) == LATENCY
    skipped = capture(clip[:cut], clip[cut + RATE // 5 :])
    with pytest.raises(AssertionError, match="cannot explain"):
        check_heard(clip, skipped, RATE, underruns=1)
