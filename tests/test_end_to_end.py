"""The whole app core, end to end, through real (virtual) audio devices.

A fresh user with no checkpoint starts Parley: the demo checkpoint is generated and loaded,
the speed check runs, then a spoken question (espeak-ng) is played into the virtual
microphone while the talk key is held. The engine must receive the question frame by frame
and the assistant's codec output must reach the virtual speaker.

The test runs on the engine's clock, not the wall's: after the key is let go it waits for the frames the
microphone delivered and the assistant's turn after them, as long as they take at the speed the engine
measured in this run (tests/realtime.py), so a busy machine waits longer instead of failing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from app.audio.devices import refresh_devices
from app.controller import AppController
from app.messages import Failure, FrameStats, ModelLoaded, SpeedCheck
from app.settings import Settings
from engine.timeline import FRAME_SECONDS
from tests.pulse import PulseServer, check_played_in_order, virtual_devices, xcorr_match
from tests.realtime import MeasuredSpeed, wait_for_frames
from tests.test_controller import wait_for

pytestmark = [pytest.mark.audio, pytest.mark.slow]

FRAME = 1280
OUTPUT_RATE = 22_050
ANSWER_FRAMES = 31  # after the key is let go: the assistant's turn (2.5 s), then the last frames play out


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
            pressed = time.monotonic()
            controller.set_talking(True)  # the first press starts the conversation
            pulse.play_into_mic(question_wav, wait=True)
            time.sleep(0.3)  # the tail of the question still in flight through the server
            controller.set_talking(False)
            # Every frame the microphone delivered while the key was down, then the assistant's turn. Waiting
            # for them (not for a time) keeps a slow engine's answer in the capture; a stalled timeline fails.
            held = math.ceil((time.monotonic() - pressed) / FRAME_SECONDS)
            wait_for_frames(controller, held + ANSWER_FRAMES, messages, what="the question and the answer")
        assert not [m for m in messages if isinstance(m, Failure)], messages
        stats = [m for m in messages if isinstance(m, FrameStats)]
        # The timeline kept running: every frame since the press, in order, none dropped on the way.
        indices = [m.timing.frame_index for m in stats]
        assert indices == list(range(len(indices))), f"frames out of order or missing: {indices}"
        speed = MeasuredSpeed().update(messages)
        print(
            f"\nend to end: {len(stats)} frames ({held} with the key down) at the {speed.describe()}; backlog up to "
            f"{max(m.backlog_frames for m in stats)} frames, {stats[-1].output_underruns} underruns"
        )
    finally:
        controller.shutdown()

    heard, spoken = controller.recording.snapshot()
    question, question_rate = soundfile.read(question_wav, dtype="float32")
    question_16k = soxr.resample(question, question_rate, 16_000).astype(np.float32)

    # The engine got whole 80 ms frames, and the question is in them.
    assert heard.size % FRAME == 0 and heard.size >= question_16k.size
    lag, r = xcorr_match(question_16k, heard)
    assert r > 0.9, f"the engine did not hear the question (r={r:.3f} at lag {lag})"

    # What the codec produced is what the speaker played, in order, after one output latency. A busy
    # machine may starve the speaker for a moment: then the app counts the underrun and the speaker
    # plays silence, never skipping what the engine said (check_played_in_order).
    assert spoken.size % 1764 == 0 and np.abs(spoken).max() > 1e-3
    played = speaker.samples
    assert np.isfinite(played).all()
    last = stats[-1]
    underruns = last.output_underruns
    assert last.output_skipped_s == 0.0, "the demo's noise is never silent, so none of it is skipped to catch up"
    first_latency_s, last_latency_s = check_played_in_order(played, spoken, OUTPUT_RATE, underruns)
    # Nothing the engine said is stuck in a buffer: when the capture ends, what is still queued is
    # under half a second, plus the silence that underruns put in front of it.
    queued_s = spoken.size / OUTPUT_RATE - (played.size / OUTPUT_RATE - last_latency_s)
    assert queued_s < 0.5 + (last_latency_s - first_latency_s), f"{queued_s:.2f} s still queued"
