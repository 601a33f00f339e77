"""The app core with a real engine on tiny checkpoints and a scripted audio device.

Also: nothing runs before the user chooses, one consistent state (no device, a device
unplugged, while loading), conversations kept apart (transcript order, per-conversation
export), and nothing written when there is nothing to write.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from app.engine_port import FakeEngine
from app.messages import (
    AppState,
    ConversationStarted,
    ConversationTime,
    DeviceStatus,
    Failure,
    FrameStats,
    ModelLoaded,
    Notice,
    SpeedCheck,
    StateChanged,
)
from app.settings import Settings
from app.worker import EngineWorker
from engine.events import AssistantTextDelta
from engine.profile_log import validate_profile_log
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, OUTPUT_FRAME_SAMPLES
from tests.realtime import frame_count, wait_for


@pytest.fixture
def make_controller(build_controller):
    """Controllers over a ScriptedAudio microphone and speaker, with no history folder of their own."""
    return functools.partial(build_controller, history=False)


def _states(messages) -> list[AppState]:
    return [m.state for m in messages if isinstance(m, StateChanged)]


def _snapshots(messages) -> list[StateChanged]:
    return [m for m in messages if isinstance(m, StateChanged)]


def q4(path: Path, **changes) -> Settings:
    """Settings with ``path`` as the 4-bit checkpoint, chosen; idle pause off unless asked."""
    return Settings(checkpoints={"4bit": path}, active_variant="4bit", **{"idle_pause": False, **changes})


def test_a_loaded_model_waits_for_the_talk_key_then_hears_the_microphone_and_silence_otherwise(
    make_controller, tiny_q4
):
    controller = make_controller(q4(tiny_q4))
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert any(isinstance(m, ModelLoaded) and m.variant.key == "4bit" for m in messages)
    assert any(isinstance(m, SpeedCheck) and m.verdict for m in messages)
    # Loaded, not started: nothing is read from the microphone, nothing is played, no frame runs.
    idle_until = time.monotonic() + 0.6
    messages += wait_for(controller, lambda _: time.monotonic() > idle_until)
    audio = controller.audio
    assert audio.frames_read == [] and audio.played == [] and frame_count(messages) == 0
    assert not audio.capturing, "the microphone stays out of the ring while no conversation reads it"
    ready = _snapshots(messages)[-1]
    assert ready.state is AppState.READY and not ready.conversation and ready.model is not None
    assert "talk key" in ready.detail

    controller.set_talking(True)  # the first press starts the conversation
    assert audio.capturing, "from the key press on, what the user says is kept"
    messages = wait_for(controller, lambda seen: frame_count(seen) >= 8)
    assert any(isinstance(m, ConversationStarted) and m.number == 1 for m in messages)
    assert controller.status.state is AppState.LISTENING and controller.status.conversation
    controller.set_talking(False)
    wait_for(controller, lambda seen: frame_count(seen) >= 4)
    talked = [frame for talking, frame in audio.frames_read if talking]
    quiet = [frame for talking, frame in audio.frames_read if not talking]
    assert talked and np.abs(np.concatenate(talked)).max() > 0.05
    assert quiet and np.abs(np.concatenate(quiet)).max() == 0.0
    assert audio.played and all(p.shape == (OUTPUT_FRAME_SAMPLES,) for p in audio.played)


def test_worker_exception_is_reported_and_conversation_recovers(make_controller, tiny_q4):
    """The worker over the fake engine (app/engine_port.py): no model runs to see a failing frame contained (the
    controller checks the folder before it asks for a load, so the folder is a real checkpoint's)."""
    engine = FakeEngine()
    worker_factory = functools.partial(EngineWorker, engine=engine)
    controller = make_controller(q4(tiny_q4), worker_factory=worker_factory)
    controller.start()
    controller.start_conversation()  # queued behind the load: it runs once the model is ready
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))

    engine.fail_next_push = RuntimeError("boom")
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    failure = next(m for m in messages if isinstance(m, Failure))
    assert "boom" in failure.message and "Traceback" in failure.details
    assert AppState.ERROR in _states(messages)
    log_file = controller.log_dir() / "parley.log"
    assert "boom" in log_file.read_text()

    controller.new_conversation()
    controller.start_conversation()  # a new conversation waits for the talk key
    messages = wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))
    assert _states(messages)[-1] in (AppState.READY, AppState.SPEAKING)


def test_variant_toggle_reloads(make_controller, tiny_q4, tiny_q8):
    controller = make_controller(Settings(checkpoints={"4bit": tiny_q4, "8bit": tiny_q8}, active_variant="4bit"))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    controller.switch_variant("8bit")
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    loaded = [m for m in messages if isinstance(m, ModelLoaded)]
    assert loaded[-1].variant.key == "8bit" and loaded[-1].path == tiny_q8
    assert AppState.LOADING in _states(messages)
    # While loading, the state has no model and no conversation; the "Loaded" event and READY come together.
    loading = [m for m in _snapshots(messages) if m.state is AppState.LOADING]
    assert loading and all(m.model is None and not m.conversation for m in loading)
    assert [m for m in messages if isinstance(m, ModelLoaded | StateChanged)][-1].model == loaded[-1]
    saved = json.loads((controller._settings_path).read_text())
    assert saved["active_variant"] == "8bit" and saved["checkpoints"]["8bit"] == str(tiny_q8)
    controller.switch_variant("4bit")
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert [m for m in messages if isinstance(m, ModelLoaded)][-1].variant.key == "4bit"


def test_a_bf16_folder_is_stored_and_shown_as_bf16(make_controller, tiny_bf16):
    controller = make_controller(Settings(idle_pause=False))
    controller.start()
    controller.use_checkpoint(tiny_bf16)
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert next(m for m in messages if isinstance(m, ModelLoaded)).variant.key == "bf16"
    assert controller.settings.active_variant == "bf16" and controller.settings.checkpoint_for("bf16") == tiny_bf16
    assert controller.status.model is not None and " · bf16" in controller.status.model.description


def test_broken_checkpoint_reports_and_stays_usable(make_controller, tmp_path, tiny_q4):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    controller = make_controller(q4(broken))
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    assert "model_type" in next(m for m in messages if isinstance(m, Failure)).message
    controller.use_checkpoint(tiny_q4)
    controller.start_conversation()
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))


def test_export_covers_every_conversation_each_marked_with_its_reply_delays(make_controller, tiny_q4, tmp_path, caplog):
    controller = make_controller(q4(tiny_q4))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    controller.set_talking(True)
    wait_for(controller, lambda seen: frame_count(seen) >= 12)
    controller.set_talking(False)
    controller.audio.latencies += [0.42, 0.30]  # the speaker heard two replies (AudioIO measures these)
    controller.audio.output_underruns, controller.audio.output_skipped_s = 3, 0.4  # and ran dry three times
    first = wait_for(controller, lambda seen: frame_count(seen) >= 2)
    assert [m.p50_s for m in first if hasattr(m, "p50_s")] == [0.42, pytest.approx(0.36)]
    with caplog.at_level(logging.INFO, logger="app.controller"):
        controller.new_conversation()
        controller.start_conversation()  # a new conversation waits for the talk key
        wait_for(controller, lambda seen: any(isinstance(m, ConversationStarted) and m.number == 2 for m in seen))
    assert "ran out of the assistant's audio 3 times (0.40 s of silence skipped to catch up)" in caplog.text
    wait_for(controller, lambda seen: frame_count(seen) >= 10)

    paths = controller.export_profile(tmp_path / "out" / "session.json")
    assert paths == []  # the folder does not exist: reported, nothing written, log kept
    assert any(isinstance(m, Failure) and "still in memory" in m.message for m in controller.poll())
    (tmp_path / "out").mkdir()
    paths = controller.export_profile(tmp_path / "out" / "session.json")
    assert [p.name for p in paths] == ["session.json", "session.csv", "session.trace.json"]
    log = json.loads(paths[0].read_text())
    assert validate_profile_log(log) == []
    conversations = log["conversations"]
    assert [c["conversation"] for c in conversations] == [1, 2]
    assert all(c["model"]["variant"] == "4bit" for c in conversations)
    assert conversations[0]["latency"]["turns"] == 2 and conversations[0]["latency"]["p50_ms"] == pytest.approx(360)
    assert conversations[1]["latency"] == {"turns": 0, "p50_ms": None, "p95_ms": None, "latencies_ms": []}
    assert conversations[0]["audio"] == {"output_underruns": 3, "output_skipped_s": 0.4, "input_lost_s": 0.0}
    assert conversations[1]["audio"]["output_underruns"] == 0, "each conversation counts its own"
    numbers = [frame["conversation"] for frame in log["frames"]]
    assert numbers == sorted(numbers) and set(numbers) == {1, 2}
    assert numbers.count(1) == conversations[0]["frames"] >= 14 and numbers.count(2) == conversations[1]["frames"]
    assert {frame["timing"] for frame in log["frames"]} == {"phase", "stage"}
    trace = json.loads(paths[2].read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2}
    assert "conversation" in paths[1].read_text().splitlines()[0].split(",")

    saved = controller.save_conversation(tmp_path / "conversation")
    assert {p.name for p in saved} == {"user.wav", "assistant.wav", "transcript.md", "profile.json"}
    import soundfile

    user, rate = soundfile.read(saved[0].parent / "user.wav")
    assert rate == INPUT_SAMPLE_RATE and user.shape[0] >= 10 * INPUT_FRAME_SAMPLES
    controller.apply_settings(controller.settings.with_changes(theme="dark"))  # writes settings.json
    modes = {p.name: p.stat().st_mode & 0o777 for p in [*paths, *saved, controller._settings_path]}
    assert len(set(modes.values())) == 1, f"every written file gets the same permissions: {modes}"
    from app.files import PRIVATE_FILE_MODE

    assert set(modes.values()) == {PRIVATE_FILE_MODE}


def test_nothing_to_export_or_save_is_a_message_and_no_file(make_controller, tiny_q4, tmp_path):
    controller = make_controller(q4(tiny_q4))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert controller.profile_frames() == 0
    assert controller.export_profile(tmp_path / "empty.json") == []
    assert controller.save_conversation(tmp_path / "conversation") == []
    notices = [m.message for m in controller.poll() if isinstance(m, Notice)]
    assert any(n.startswith("Nothing to export yet") for n in notices)
    assert any(n.startswith("Nothing to save yet") for n in notices)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"], "no empty files"


def test_no_audio_device_is_one_consistent_state(make_controller, tiny_q4):
    from app.audio.devices import NO_MICROPHONE, AudioUnavailable

    def no_audio(*args, **kwargs):
        raise AudioUnavailable(NO_MICROPHONE)

    controller = make_controller(q4(tiny_q4), audio_factory=no_audio)
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert any(isinstance(m, Failure) and m.message == NO_MICROPHONE for m in messages)
    status = _snapshots(messages)[-1]
    assert status.state is AppState.NO_AUDIO and status.detail == NO_MICROPHONE
    assert status.microphone is None and status.speaker is None and not status.audio_available
    assert status.model is not None, "the model is loaded all the same"
    controller.set_talking(True)  # nothing to talk into: no "Listening", no frames, nothing breaks
    messages = wait_for(controller, lambda _: True)
    time.sleep(0.3)
    messages += controller.poll()
    assert all(m.state is AppState.NO_AUDIO for m in _snapshots(messages))
    assert frame_count(messages) == 0


def test_a_device_unplugged_mid_conversation_is_one_consistent_state(make_controller, tiny_q4):
    controller = make_controller(q4(tiny_q4))
    controller.start()
    controller.start_conversation()
    messages = wait_for(controller, lambda seen: frame_count(seen) >= 3)
    status = _snapshots(messages)[-1]
    assert status.microphone == "Scripted microphone" and status.state is AppState.READY and status.conversation
    controller.audio.unplug()
    messages = wait_for(controller, lambda seen: any(isinstance(m, DeviceStatus) for m in seen))
    status = _snapshots(messages)[-1]
    assert status.state is AppState.NO_AUDIO and status.microphone is None and status.speaker is None
    assert "Audio is paused" in status.detail
    controller.set_talking(True)
    assert controller.poll() and controller.status.state is AppState.NO_AUDIO, "not 'Listening' without a microphone"


def test_idle_pause_and_resume(make_controller, tiny_q4):
    """The real trigger: frames counted since the user let go of the key (the random model talks on meanwhile)."""
    controller = make_controller(q4(tiny_q4, idle_pause=True, idle_pause_delay_s=5.0))
    controller.start()
    controller.start_conversation()
    controller.set_talking(True)
    wait_for(controller, lambda seen: frame_count(seen) >= 3)
    controller.set_talking(False)
    wait_for(controller, lambda seen: AppState.PAUSED in _states(seen), timeout=180.0)
    talking = [held for held, _ in controller.audio.frames_read]
    quiet = len(talking) - 1 - max(i for i, held in enumerate(talking) if held)
    assert 63 <= quiet <= 64, f"asleep after {quiet} frames of 80 ms without the user; 5 s is 63"
    assert not controller.audio.capturing, "asleep, the microphone is kept out (nothing overflows)"
    time.sleep(0.2)
    consumed = len(controller.audio.frames_read)
    time.sleep(0.3)
    assert len(controller.audio.frames_read) == consumed, "a paused timeline reads no frames"
    controller.set_talking(True)
    wait_for(controller, lambda seen: AppState.LISTENING in _states(seen))
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))


def test_assistant_text_reaches_the_ui_and_transcript(make_controller, tiny_q4, tmp_path):
    controller = make_controller(q4(tiny_q4))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    controller.set_talking(True)
    messages = wait_for(controller, lambda seen: any(isinstance(m, AssistantTextDelta) for m in seen))
    assert controller.transcript.entries and controller.transcript.entries[0].role in ("assistant", "user")
    said = "".join(m.delta for m in messages if isinstance(m, AssistantTextDelta))
    written = "".join(e.text for e in controller.transcript.entries if e.role == "assistant")
    assert said and written.startswith(said), "the text the UI got is the transcript's"
    assert Path(controller.log_dir()) == tmp_path / "logs" and (tmp_path / "logs" / "parley.log").is_file()


def test_conversation_length_limit_stops_the_timeline_and_a_new_conversation_restarts_it(make_controller, tiny_q4):
    controller = make_controller(q4(tiny_q4))
    controller.worker.max_conversation_s = 1.6  # 20 frames instead of 10 minutes
    controller.start()
    controller.start_conversation()
    messages = wait_for(
        controller, lambda seen: any(isinstance(m, ConversationTime) and m.remaining_s == 0 for m in seen)
    )
    assert frame_count(messages) == 20
    # Once the assistant's last words have played, the state says why the timeline stopped.
    said = lambda seen: any(isinstance(m, StateChanged) and "1.6 s limit" in m.detail for m in seen)  # noqa: E731
    if not said(messages):
        wait_for(controller, said)
    assert not controller.status.conversation
    consumed = len(controller.audio.frames_read)
    time.sleep(0.3)
    assert len(controller.audio.frames_read) == consumed, "the timeline stops at the limit"
    assert not [m for m in controller.poll() if isinstance(m, FrameStats)]

    controller.new_conversation()
    controller.start_conversation()  # a new conversation waits for the talk key
    messages = wait_for(controller, lambda seen: frame_count(seen) >= 3)
    assert ConversationTime(0.0, 1.6) in messages


def test_export_to_a_full_disk_reports_it_keeps_the_old_file_and_can_be_retried(
    make_controller, tiny_q4, tmp_path, monkeypatch
):
    import errno
    import io
    import os

    from engine import files

    controller = make_controller(q4(tiny_q4))
    controller.start()
    controller.start_conversation()
    wait_for(controller, lambda seen: frame_count(seen) >= 5)
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
    controller = make_controller(q4(folder))
    controller.start()
    controller.start_conversation()
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))
    shutil.rmtree(folder)  # e.g. an external drive unplugged: the weights are already in memory
    wait_for(controller, lambda seen: frame_count(seen) >= 10)

    controller.switch_variant("4bit")  # reload from the vanished folder
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    failure = next(m for m in messages if isinstance(m, Failure))
    assert str(folder) in failure.message and "does not exist" in failure.message
    controller.use_checkpoint(tiny_q4)  # the app is still usable
    controller.start_conversation()
    wait_for(controller, lambda seen: any(isinstance(m, FrameStats) for m in seen))


def test_configured_checkpoint_folder_missing_at_start_is_reported(make_controller, tmp_path):
    controller = make_controller(q4(tmp_path / "gone"))
    controller.start()
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    assert f"{tmp_path / 'gone'} does not exist" in next(m for m in messages if isinstance(m, Failure)).message
    assert controller.status.state is AppState.NO_MODEL
