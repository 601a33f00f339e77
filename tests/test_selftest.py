"""``parley --self-test`` from source: the answer reaches the speaker, no audio device means a skip and
exit 0, and every failure gives exit 1 with one line naming the step and the cause."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app import selftest
from app.audio.devices import NO_MICROPHONE, NO_PORTAUDIO, AudioUnavailable
from app.demo import ensure_demo_checkpoint
from app.messages import DeviceStatus
from app.selftest import PLAYBACK_GAIN, SELF_TEST_FRAMES, play_answer, run_self_test, self_test_command
from tests.pulse import SPEAKER_DESCRIPTION, PulseServer, check_heard, virtual_devices

ROOT = Path(__file__).resolve().parents[1]
RATE = 22_050


@pytest.fixture(scope="module")
def pulse() -> Iterator[PulseServer]:
    with virtual_devices() as server:
        yield server


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh user data folder (platformdirs honours XDG_DATA_HOME), for this process and its children."""
    folder = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(folder))
    return folder


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``parley <args>`` from source, in a child process with this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "ui.main", *args], cwd=ROOT, capture_output=True, text=True, timeout=180, env=os.environ
    )


class StuckSpeaker:
    """Stands in for ``AudioIO``: opens, but never plays what it is given (or pauses, or cannot open)."""

    def __init__(self, *, paused: bool = False, start_error: str | None = None) -> None:
        self.paused = paused
        self.start_error = start_error
        self.queued = 0.0
        self.closed = False
        self.output_device_label = "Stuck speaker"

    def start(self) -> None:
        if self.start_error is not None:
            raise AudioUnavailable(self.start_error)

    def play(self, samples: np.ndarray) -> None:
        self.queued += samples.shape[0] / RATE

    @property
    def output_backlog_s(self) -> float:
        return self.queued

    def poll_health(self) -> list[DeviceStatus]:
        return [DeviceStatus("mic", None, "The speaker 'Stuck speaker' stopped working.")] if self.paused else []

    def close(self) -> None:
        self.closed = True


# --------------------------------------------------------------------------- the whole self-test


@pytest.mark.audio
def test_self_test_plays_the_answer_on_the_default_speaker(pulse: PulseServer, data_home: Path) -> None:
    pulse.reset()
    with pulse.record_speaker() as recording:
        report = run_self_test()

    assert report.checkpoint == data_home / "Parley" / "demo-checkpoint"  # generated at first run, not shipped
    assert (report.checkpoint / ".parley-demo-complete").is_file()
    assert report.frames == SELF_TEST_FRAMES >= 25
    assert report.answer.shape[0] >= SELF_TEST_FRAMES * 1764
    assert report.realtime_factor > 0 and report.p50_ms > 0
    assert report.playback.skipped is None and report.playback.device == SPEAKER_DESCRIPTION
    assert report.playback.seconds == pytest.approx(report.answer.shape[0] / RATE)
    # What reached the virtual speaker is the answer, at the self-test's gain.
    played = report.answer * PLAYBACK_GAIN
    lag = check_heard(played, recording.samples, recording.rate, report.playback.underruns)
    heard = recording.samples[lag : lag + played.shape[0]]
    assert np.sqrt(np.mean(heard**2)) / np.sqrt(np.mean(played**2)) == pytest.approx(1.0, rel=0.3)
    summary = report.summary()
    assert "\n" not in summary
    assert summary.startswith("parley self-test passed (source): 30 frames")
    assert f"realtime factor {report.realtime_factor:.2f}" in summary
    assert f"played 2.4 s on '{SPEAKER_DESCRIPTION}'" in summary
    print(f"\n{summary}")
    assert summary.endswith("at -20 dB") == (report.playback.underruns == 0), "the clip's own end is no underrun"


@pytest.mark.audio
def test_command_without_audio_devices_skips_playback_and_exits_0(pulse: PulseServer, data_home: Path) -> None:
    with pulse.no_server():  # the sound server is gone: PortAudio finds no device at all
        result = run_cli("--self-test")

    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("parley self-test passed (source): 30 frames")
    assert "realtime factor " in line
    assert line.endswith(f"skipped playback ({NO_MICROPHONE})")
    assert "Traceback" not in result.stderr
    assert (data_home / "Parley" / "demo-checkpoint" / ".parley-demo-complete").is_file()


# --------------------------------------------------------------------------- failures


def test_corrupt_demo_checkpoint_fails_with_the_file_and_a_remedy(data_home: Path) -> None:
    folder = ensure_demo_checkpoint(data_home / "Parley" / "demo-checkpoint")
    shard = max(folder.glob("*.safetensors"), key=lambda path: path.stat().st_size)
    with shard.open("r+b") as stream:
        stream.truncate(shard.stat().st_size // 2)  # an interrupted copy, say

    result = run_cli("--self-test")

    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()  # one line, no traceback: the checkpoint error is written for users
    assert line.startswith(f"parley self-test FAILED while loading the demo checkpoint from {folder}: ")
    assert f"{shard.name}: truncated" in line
    assert line.endswith(f"(delete {folder} to have it generated again)")


def test_unwritable_data_folder_fails_while_preparing_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be")
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker))

    assert self_test_command() == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("parley self-test FAILED while preparing the demo checkpoint: ")
    assert str(blocker) in err and err.count("\n") == 1


def test_unanticipated_error_shows_its_traceback_before_the_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken() -> str:
        raise ZeroDivisionError("division by zero in a kernel")

    monkeypatch.setattr(selftest, "check_mlx", broken)
    assert self_test_command() == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1] == (
        "parley self-test FAILED while starting MLX: ZeroDivisionError: division by zero in a kernel"
    )


def test_speaker_that_does_not_play_fails_and_is_closed() -> None:
    speaker = StuckSpeaker()
    with pytest.raises(RuntimeError, match=r"^the speaker 'Stuck speaker' played 0\.0 s of 0\.5 s in 1 s$"):
        play_answer(np.zeros(RATE // 2, np.float32), RATE, audio=speaker, grace_s=0.5)  # type: ignore[arg-type]
    assert speaker.closed


def test_audio_that_pauses_while_playing_fails_at_once() -> None:
    speaker = StuckSpeaker(paused=True)
    with pytest.raises(RuntimeError, match=r"stopped: The speaker 'Stuck speaker' stopped working\.$"):
        play_answer(np.zeros(RATE * 10, np.float32), RATE, audio=speaker)  # type: ignore[arg-type]
    assert speaker.closed


def test_no_microphone_is_a_skip_but_missing_portaudio_is_a_failure() -> None:
    skipped = play_answer(np.zeros(100, np.float32), RATE, audio=StuckSpeaker(start_error=NO_MICROPHONE))  # type: ignore[arg-type]
    assert skipped.seconds == 0 and skipped.device is None and skipped.skipped == NO_MICROPHONE
    assert skipped.describe() == f"skipped playback ({NO_MICROPHONE})"
    starved = selftest.Playback(2.4, "default", underruns=2)
    assert starved.describe() == "played 2.4 s on 'default' at -20 dB, 2 underruns"
    with pytest.raises(AudioUnavailable, match="libportaudio2"):
        play_answer(np.zeros(100, np.float32), RATE, audio=StuckSpeaker(start_error=NO_PORTAUDIO))  # type: ignore[arg-type]


def test_fewer_than_25_frames_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 25 frames, got 24"):
        run_self_test(frames=24)
