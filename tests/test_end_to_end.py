"""The whole app core, end to end, through real (virtual) audio devices.

A fresh user with no checkpoint starts Parley: the demo checkpoint is generated and loaded,
the speed check runs, then a spoken question (espeak-ng) is played into the virtual
microphone while the talk key is held. The engine must receive the question frame by frame
and the assistant's codec output must reach the virtual speaker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from app.audio_io import refresh_devices
from app.controller import AppController
from app.messages import Failure, FrameStats, ModelLoaded, SpeedCheck
from app.settings import Settings
from tests.pulse import PulseServer, virtual_devices, xcorr_match
from tests.test_controller import wait_for

pytestmark = [pytest.mark.audio, pytest.mark.slow]

FRAME = 1280
OUTPUT_RATE = 22_050


@pytest.fixture
def pulse() -> Iterator[PulseServer]:
    with virtual_devices() as server:
        refresh_devices()
        yield server


def test_spoken_question_reaches_the_engine_and_the_answer_reaches_the_speaker(
    pulse: PulseServer, question_wav: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # the demo checkpoint goes here
    controller = AppController(
        Settings(ducking=False, idle_pause=False),
        settings_path=tmp_path / "settings.json",
        log_folder=tmp_path / "logs",
    )
    try:
        controller.start()
        messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen), timeout=300)
        assert not [m for m in messages if isinstance(m, Failure)], messages
        assert any(isinstance(m, SpeedCheck) for m in messages)
        loaded = next(m for m in messages if isinstance(m, ModelLoaded))
        assert loaded.variant.demo and loaded.path == tmp_path / "data" / "Parley" / "demo-checkpoint"
        assert not [m for m in messages if isinstance(m, FrameStats)], "the demo waits for the user"

        with pulse.record_speaker(rate=OUTPUT_RATE) as speaker:
            controller.set_talking(True)  # the first press starts the conversation
            pulse.play_into_mic(question_wav, wait=True)
            time.sleep(0.3)  # the tail of the question still in flight through the server
            controller.set_talking(False)
            answer_until = time.monotonic() + 2.5  # the assistant's turn, then the last frames play out
            messages = wait_for(controller, lambda _: time.monotonic() > answer_until, timeout=30)
        assert not [m for m in messages if isinstance(m, Failure)], messages
        assert sum(isinstance(m, FrameStats) for m in messages) >= 40  # the timeline kept running in real time
    finally:
        controller.shutdown()

    heard, spoken = controller.recording.snapshot()
    question, question_rate = soundfile.read(question_wav, dtype="float32")
    question_16k = soxr.resample(question, question_rate, 16_000).astype(np.float32)

    # The engine got whole 80 ms frames, and the question is in them.
    assert heard.size % FRAME == 0 and heard.size >= question_16k.size
    lag, r = xcorr_match(question_16k, heard)
    assert r > 0.9, f"the engine did not hear the question (r={r:.3f} at lag {lag})"

    # What the codec produced is what the speaker played, as one continuous stream: every half
    # second of the capture is found in the engine's output at the same offset (the output latency).
    assert spoken.size % 1764 == 0 and np.abs(spoken).max() > 1e-3
    played = speaker.samples
    assert np.isfinite(played).all()
    rate = OUTPUT_RATE
    offsets = []
    for start in range(rate // 2, played.size - rate // 2, rate // 2):
        lag, r = xcorr_match(played[start : start + rate // 4], spoken)
        # 0.5: a quarter second straddling an underrun on a busy 2-core machine reads about 0.6; another
        # stream, or a skip, reads near 0 (and a skip moves the offsets, checked below).
        assert r > 0.5, f"speaker audio at {start / rate:.1f} s is not the codec output (r={r:.3f})"
        offsets.append(start - lag)
    assert len(offsets) >= 6, f"only {played.size / rate:.1f} s reached the speaker"
    assert max(offsets) - min(offsets) <= rate // 100, f"playback skipped or stalled: offsets {offsets}"
    latency_s = offsets[0] / rate
    assert 0 <= latency_s < 1.0, f"output latency {latency_s:.2f} s"
    # Nothing the engine said is stuck in a buffer: the capture reaches the end of the output.
    assert spoken.size / rate - (played.size / rate - latency_s) < 0.5
