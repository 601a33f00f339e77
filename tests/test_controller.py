"""The app core with a real engine on tiny checkpoints and a scripted audio device."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from app.controller import AppController
from app.messages import AppState, ConversationTime, Failure, FrameStats, ModelLoaded, SpeedCheck, StateChanged
from app.settings import Settings
from app.worker import EngineWorker
from engine.events import AssistantTextDelta
from engine.profile_log import validate_profile_log


class ScriptedAudio:
    """Stands in for AudioIO: delivers microphone frames (or silence while the key is up) at full speed."""

    def __init__(self, input_device=None, output_device=None, *, duck_while_talking=False, speech=None):
        self.talking = False
        self.duck_while_talking = duck_while_talking
        self.speech = speech if speech is not None else np.zeros(1280 * 10, np.float32)
        self.position = 0
        self.frames_read: list[tuple[bool, np.ndarray]] = []
        self.played: list[np.ndarray] = []
        self.input_peak = self.output_peak = 0.0
        self.input_overflows = self.output_underruns = 0
        self.input_backlog_frames = 0
        self.started = False

    def start(self):
        self.started = True

    def close(self):
        self.started = False

    def poll_health(self):
        return []

    def read_frame(self, timeout=0.0):
        time.sleep(0.002)
        if self.talking:
            start = self.position % self.speech.shape[0]
            frame = np.resize(self.speech[start : start + 1280], 1280).astype(np.float32)
            self.position += 1280
        else:
            frame = np.zeros(1280, np.float32)
        self.frames_read.append((self.talking, frame))
        return frame

    def play(self, samples):
        self.played.append(samples)

    def clear_input(self):
        pass

    def clear_output(self):
        pass

    def set_devices(self, input_name, output_name):
        pass


def wait_for(controller: AppController, predicate, timeout: float = 60.0) -> list:
    seen: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = controller.poll()
        seen += batch
        if predicate(seen):
            return seen
        time.sleep(0.01)
    raise AssertionError(f"timed out; last messages: {seen[-5:]}")


@pytest.fixture
def make_controller(tmp_path, speech_16k):
    made: list[AppController] = []

    def make(settings: Settings, **kwargs) -> AppController:
        audio_holder = {}

        def audio_factory(*args, **kw):
            audio_holder["audio"] = ScriptedAudio(*args, speech=speech_16k, **kw)
            return audio_holder["audio"]

        kwargs.setdefault("audio_factory", audio_factory)
        controller = AppController(
            settings,
            settings_path=tmp_path / "settings.json",
            auto_demo=False,
            log_folder=tmp_path / "logs",
            **kwargs,
        )
        made.append(controller)
        return controller

    yield make
    for controller in made:
        controller.shutdown()


def _states(messages) -> list[AppState]:
    return [m.state for m in messages if isinstance(m, StateChanged)]


def test_talking_feeds_the_microphone_and_silence_otherwise(make_controller, tiny_q4):
    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=False))
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))
    assert any(isinstance(m, ModelLoaded) and m.quantization_bits == 4 for m in messages)
    assert any(isinstance(m, SpeedCheck) and m.verdict for m in messages)
    controller.set_talking(True)
    wait_for(controller, lambda seen: sum(isinstance(m, FrameStats) for m in seen) >= 8)
    assert AppState.LISTENING in _states(controller.poll()) or controller._shown[0] is AppState.LISTENING
    controller.set_talking(False)
    wait_for(controller, lambda seen: sum(isinstance(m, FrameStats) for m in seen) >= 4)
    audio = controller.audio
    talked = [frame for talking, frame in audio.frames_read if talking]
    quiet = [frame for talking, frame in audio.frames_read if not talking]
    assert talked and np.abs(np.concatenate(talked)).max() > 0.05
    assert quiet and np.abs(np.concatenate(quiet)).max() == 0.0
    assert audio.played and all(p.shape == (1764,) for p in audio.played[:-1])


def test_worker_exception_is_reported_and_conversation_recovers(make_controller, tiny_q4, monkeypatch):
    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=False))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))

    from engine.session import Session

    original = Session.push
    monkeypatch.setattr(Session, "push", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    failure = next(m for m in messages if isinstance(m, Failure))
    assert "boom" in failure.message and "Traceback" in failure.details
    assert AppState.ERROR in _states(messages)
    log_file = controller.log_dir() / "parley.log"
    assert "boom" in log_file.read_text()

    monkeypatch.setattr(Session, "push", original)
    controller.new_conversation()
    messages = wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))
    assert AppState.READY in _states(messages) or AppState.SPEAKING in _states(messages)


def test_variant_toggle_reloads(make_controller, tiny_q4, tiny_q8):
    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, checkpoint_8bit=tiny_q8, idle_pause=False))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    controller.switch_variant("8bit")
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    loaded = [m for m in messages if isinstance(m, ModelLoaded)]
    assert loaded[-1].quantization_bits == 8 and loaded[-1].path == tiny_q8
    assert AppState.LOADING in _states(messages)
    saved = json.loads((controller._settings_path).read_text())
    assert saved["active_variant"] == "8bit"
    controller.switch_variant("4bit")
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert [m for m in messages if isinstance(m, ModelLoaded)][-1].quantization_bits == 4


def test_broken_checkpoint_reports_and_stays_usable(make_controller, tmp_path, tiny_q4):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    controller = make_controller(Settings(checkpoint_4bit=broken, idle_pause=False))
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    assert "model_type" in next(m for m in messages if isinstance(m, Failure)).message
    controller.use_checkpoint(tiny_q4)
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))


def test_export_profile_and_conversation(make_controller, tiny_q4, tmp_path):
    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=False))
    controller.start()
    controller.set_talking(True)
    wait_for(controller, lambda seen: sum(isinstance(m, FrameStats) for m in seen) >= 12)
    paths = controller.export_profile(tmp_path / "out" / "session.json")
    assert paths == []  # the folder does not exist: reported, nothing written, log kept
    assert any(isinstance(m, Failure) and "still in memory" in m.message for m in controller.poll())
    (tmp_path / "out").mkdir()
    paths = controller.export_profile(tmp_path / "out" / "session.json")
    assert [p.name for p in paths] == ["session.json", "session.csv", "session.trace.json"]
    log = json.loads(paths[0].read_text())
    assert validate_profile_log(log) == [] and len(log["frames"]) >= 12
    saved = controller.save_conversation(tmp_path / "conversation")
    assert {p.name for p in saved} == {"user.wav", "assistant.wav", "transcript.md"}
    import soundfile

    user, rate = soundfile.read(tmp_path / "conversation" / "user.wav")
    assert rate == 16_000 and user.shape[0] >= 12 * 1280


def test_no_audio_device_is_a_message_not_a_crash(make_controller, tiny_q4):
    from app.audio_io import NO_MICROPHONE, AudioUnavailable

    def no_audio(*args, **kwargs):
        raise AudioUnavailable(NO_MICROPHONE)

    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=False), audio_factory=no_audio)
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert any(isinstance(m, Failure) and m.message == NO_MICROPHONE for m in messages)
    controller.set_talking(True)  # nothing to talk into, but nothing breaks
    controller.poll()


def test_idle_pause_and_resume(make_controller, tiny_q4, monkeypatch):
    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=True, idle_pause_delay_s=5.0))
    monkeypatch.setattr(EngineWorker, "frames_since_speech", lambda self: 10_000)
    controller.start()
    wait_for(controller, lambda seen: AppState.PAUSED in _states(seen))
    time.sleep(0.2)
    consumed = len(controller.audio.frames_read)
    time.sleep(0.3)
    assert len(controller.audio.frames_read) == consumed, "a paused timeline reads no frames"
    controller.set_talking(True)
    wait_for(controller, lambda seen: AppState.LISTENING in _states(seen))
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))


def test_assistant_text_reaches_the_ui_and_transcript(make_controller, tiny_q4):
    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=False))
    controller.start()
    controller.set_talking(True)
    messages = wait_for(controller, lambda seen: any(isinstance(m, AssistantTextDelta) for m in seen))
    assert controller.transcript.entries and controller.transcript.entries[0].role in ("assistant", "user")
    assert isinstance(Path(controller.log_dir()), Path) and messages


def test_conversation_length_limit_stops_the_timeline_and_a_new_conversation_restarts_it(make_controller, tiny_q4):
    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=False))
    controller.worker.max_conversation_s = 1.6  # 20 frames instead of 10 minutes
    controller.start()
    messages = wait_for(
        controller, lambda seen: any(isinstance(m, ConversationTime) and m.remaining_s == 0 for m in seen)
    )
    assert sum(isinstance(m, FrameStats) for m in messages) == 20
    # Once the assistant's last words have played, the state says why the timeline stopped.
    wait_for(controller, lambda seen: any(isinstance(m, StateChanged) and "1.6 s limit" in m.detail for m in seen))
    consumed = len(controller.audio.frames_read)
    time.sleep(0.3)
    assert len(controller.audio.frames_read) == consumed, "the timeline stops at the limit"
    assert not [m for m in controller.poll() if isinstance(m, FrameStats)]

    controller.new_conversation()
    messages = wait_for(controller, lambda seen: sum(isinstance(m, FrameStats) for m in seen) >= 3)
    assert ConversationTime(0.0, 1.6) in messages


def test_export_to_a_full_disk_reports_it_keeps_the_old_file_and_can_be_retried(
    make_controller, tiny_q4, tmp_path, monkeypatch
):
    import errno
    import io
    import os

    from engine import files

    controller = make_controller(Settings(checkpoint_4bit=tiny_q4, idle_pause=False))
    controller.start()
    wait_for(controller, lambda seen: sum(isinstance(m, FrameStats) for m in seen) >= 5)
    target = tmp_path / "session.json"
    target.write_text("an earlier export\n")

    class FullDisk(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_fdopen = os.fdopen
    monkeypatch.setattr(files.os, "fdopen", lambda handle, *a, **k: (os.close(handle), FullDisk())[1])
    assert controller.export_profile(target) == []
    failure = next(m for m in controller.poll() if isinstance(m, Failure))
    assert "No space left on device" in failure.message and "still in memory" in failure.message
    assert target.read_text() == "an earlier export\n", "a failed export must not damage the file it replaces"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "temporary files left behind"

    monkeypatch.setattr(files.os, "fdopen", real_fdopen)
    paths = controller.export_profile(target)
    assert validate_profile_log(json.loads(paths[0].read_text())) == []


def test_checkpoint_folder_that_disappears_keeps_the_conversation_and_reloading_says_so(
    make_controller, tiny_q4, tmp_path
):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_q4, folder)
    controller = make_controller(Settings(checkpoint_4bit=folder, idle_pause=False))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))
    shutil.rmtree(folder)  # e.g. an external drive unplugged: the weights are already in memory
    wait_for(controller, lambda seen: sum(isinstance(m, FrameStats) for m in seen) >= 10)

    controller.switch_variant("4bit")  # reload from the vanished folder
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    failure = next(m for m in messages if isinstance(m, Failure))
    assert str(folder) in failure.message and "does not exist" in failure.message
    controller.use_checkpoint(tiny_q4)  # the app is still usable
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))


def test_configured_checkpoint_folder_missing_at_start_is_reported(make_controller, tmp_path):
    controller = make_controller(Settings(checkpoint_4bit=tmp_path / "gone", idle_pause=False))
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    assert f"{tmp_path / 'gone'} does not exist" in next(m for m in messages if isinstance(m, Failure)).message
    assert AppState.NO_MODEL in _states(messages)
