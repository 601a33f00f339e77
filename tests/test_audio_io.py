"""AudioIO against real PulseAudio virtual devices (tests/pulse.py): microphone frames, silence while
the key is up, playback, underruns, ducking, device choice, no server, and devices lost and found."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from app.audio import devices as audio_devices
from app.audio.devices import AudioUnavailable, list_devices, refresh_devices
from app.audio.streams import AudioIO, AudioState
from app.messages import DeviceStatus
from tests.pulse import (
    ALSA_MIC,
    MIC,
    MIC_DESCRIPTION,
    MIC_FEED,
    MIC_FEED_DESCRIPTION,
    SPEAKER,
    SPEAKER_DESCRIPTION,
    PulseServer,
    check_heard,
    virtual_devices,
    xcorr_match,
)

pytestmark = pytest.mark.audio


@pytest.fixture(scope="module")
def pulse() -> Iterator[PulseServer]:
    with virtual_devices() as server:
        yield server


@pytest.fixture
def devices(pulse: PulseServer) -> PulseServer:
    """The virtual devices in their initial state, and PortAudio re-enumerated to see them."""
    pulse.reset()
    refresh_devices()
    return pulse


@pytest.fixture
def audio(devices: PulseServer) -> Iterator[AudioIO]:
    io = AudioIO(retry_interval_s=0.1)
    io.start()
    yield io
    io.close()


@pytest.fixture(scope="module")
def question(question_wav: Path) -> tuple[np.ndarray, np.ndarray]:
    """The spoken question at 22.05 kHz (as played) and at 16 kHz (what the engine should get)."""
    samples, rate = soundfile.read(question_wav, dtype="float32")
    assert rate == 22_050
    return samples, soxr.resample(samples, rate, 16_000).astype(np.float32)


def read_frames(audio: AudioIO, seconds: float, *, until: Callable[[], bool] | None = None) -> list[np.ndarray]:
    """Read frames as the engine worker does, for ``seconds`` (or until ``until()`` holds, then 0.4 s more)."""
    frames = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        frame = audio.read_frame(timeout=0.05)
        if frame is not None:
            frames.append(frame)
        if until is not None and until():
            until, deadline = None, time.monotonic() + 0.4
    return frames


def poll_until(
    audio: AudioIO, condition: Callable[[list[DeviceStatus]], bool], timeout: float = 6.0
) -> list[DeviceStatus]:
    """Call poll_health() as the controller does until ``condition(statuses so far)``; returns the statuses."""
    statuses: list[DeviceStatus] = []
    deadline = time.monotonic() + timeout
    while not condition(statuses):
        assert time.monotonic() < deadline, f"timed out; state {audio.state}, statuses {statuses}"
        statuses += audio.poll_health()
        time.sleep(0.05)
    return statuses


def speak_and_read(devices: PulseServer, audio: AudioIO, wav: Path) -> np.ndarray:
    player = devices.play_into_mic(wav, wait=False)
    frames = read_frames(audio, 10.0, until=lambda: player.poll() is not None)
    assert frames, "no frames arrived from the microphone"
    for frame in frames:
        assert frame.shape == (1280,) and frame.dtype == np.float32
    return np.concatenate(frames)


def test_lists_the_sound_servers_devices_with_their_descriptions(devices: PulseServer) -> None:
    found = list_devices()
    assert found.server
    assert [(d.name, d.label) for d in found.inputs] == [(MIC, MIC_DESCRIPTION)]  # monitors are not microphones
    assert {(d.name, d.label) for d in found.outputs} == {
        (SPEAKER, SPEAKER_DESCRIPTION),
        (MIC_FEED, MIC_FEED_DESCRIPTION),
    }
    assert found.default_input is not None and found.default_input.name == MIC
    assert found.default_output is not None and found.default_output.name == SPEAKER
    assert found.find_output("test speaker") == found.find_output(SPEAKER)  # a unique part of the description
    assert found.find_output("parley test") is None  # ambiguous: speaker and feed
    assert found.find_input("no such device") is None
    assert found.find_input("pulse") == found.default_input  # chosen from PortAudio's list before: the default


def test_without_a_sound_server_the_list_is_portaudios(devices: PulseServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audio_devices, "server_devices", lambda: None)
    found = list_devices()
    assert not found.server
    names = [device.name for device in found.inputs]
    assert {"default", ALSA_MIC} <= set(names)
    assert found.default_input is not None and found.default_input.name == "default"
    assert found.find_input(ALSA_MIC) == found.find_input("VIRT_MIC")  # a unique part, any case
    assert found.find_input("parley_virt") is None  # ambiguous: mic and speaker


def _stream_devices(pulse: PulseServer, kind: str) -> list[str]:
    """The sound server's device of each client stream of ``kind`` ("source-outputs", "sink-inputs") now."""
    names = {
        line.split()[0]: line.split()[1] for line in pulse.pactl("list", "short", kind.split("-")[0] + "s").splitlines()
    }
    streams = [line.split() for line in pulse.pactl("list", "short", kind).splitlines()]
    return [names[fields[1]] for fields in streams if fields[2] != "-"]  # "-": a module's own stream


def test_a_chosen_speaker_is_really_played_to(devices: PulseServer) -> None:
    with AudioIO(None, MIC_FEED, capture=False) as io:
        assert (io.output_device_name, io.output_device_label) == (MIC_FEED, MIC_FEED_DESCRIPTION)
        assert _stream_devices(devices, "sink-inputs") == [MIC_FEED]
        io.set_devices(None, SPEAKER)
        assert _stream_devices(devices, "sink-inputs") == [SPEAKER]
        assert io.output_device_label == SPEAKER_DESCRIPTION
        with devices.record_speaker() as recording:
            io.play(np.full(11_025, 0.1, dtype=np.float32))
            time.sleep(1.0)
    assert np.abs(recording.samples).max() > 0.05, "the chosen speaker played nothing"


def test_the_microphone_is_open_only_while_frames_are_read(devices: PulseServer) -> None:
    io = AudioIO(capture=False)
    with io:
        assert io.input_device_label == MIC_DESCRIPTION  # named before it opens
        assert _stream_devices(devices, "source-outputs") == [], "nothing listens before a conversation reads"
        assert not io.microphone_open
        io.start_capture()
        assert _stream_devices(devices, "source-outputs") == [MIC]
        assert io.read_frame(timeout=1.0) is not None
        io.stop_capture()
        assert _stream_devices(devices, "source-outputs") == [], "the microphone closes when reading stops"
        assert io.input_peak == 0.0
        io.start_capture()
        assert io.read_frame(timeout=1.0) is not None, "and opens again for the next conversation"
    assert _stream_devices(devices, "source-outputs") == []


def test_microphone_delivers_speech_resampled_to_16k_frames(
    devices: PulseServer, audio: AudioIO, question_wav: Path, question: tuple[np.ndarray, np.ndarray]
) -> None:
    audio.talking = True
    assert audio.input_rate == 44_100  # the device's native rate: resampling is ours
    received = speak_and_read(devices, audio, question_wav)
    lag, r = xcorr_match(question[1], received)
    assert r > 0.9, f"microphone frames do not match the spoken question (r={r:.3f}, lag={lag})"
    assert audio.input_overflows == 0
    assert audio.input_backlog_frames <= 1  # a frame may have arrived since the last read


def test_released_key_sends_silence_but_keeps_the_timeline_running(
    devices: PulseServer, audio: AudioIO, question_wav: Path
) -> None:
    audio.talking = False
    peaks = []
    start = time.monotonic()
    player = devices.play_into_mic(question_wav, wait=False)
    frames = []
    while player.poll() is None:
        frame = audio.read_frame(timeout=0.05)
        if frame is not None:
            frames.append(frame)
        peaks.append(audio.input_peak)
    elapsed = time.monotonic() - start
    assert max(peaks) > 0.1, "the microphone (and its meter) heard the speech"
    assert all(not frame.any() for frame in frames), "frames must be silence while the key is up"
    assert len(frames) >= 0.75 * elapsed / 0.08, f"{len(frames)} frames in {elapsed:.2f} s"


def test_speaker_plays_queued_speech_and_counts_one_underrun_when_it_runs_dry(
    devices: PulseServer, audio: AudioIO, question: tuple[np.ndarray, np.ndarray]
) -> None:
    speech = question[0]
    with devices.record_speaker() as recording:
        time.sleep(0.3)
        assert audio.output_underruns == 0, "idle playback with nothing ever queued is not an underrun"
        for start in range(0, len(speech), 1764):  # AudioChunk-sized pieces, as the engine sends them
            audio.play(speech[start : start + 1764])
        assert audio.output_backlog_s > 1.0
        deadline = time.monotonic() + 5.0
        while audio.output_backlog_s > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.4)
    # Whole, unless a busy machine made the device starve mid-speech (each such gap is counted).
    check_heard(speech, recording.samples, recording.rate, audio.output_device_underflows)
    # The queue ran dry once; a busy machine may also have made the device itself starve, which counts too.
    assert audio.output_underruns == 1 + audio.output_device_underflows
    assert audio.output_peak < 0.05, "after the speech the output is silent"


def test_ducking_attenuates_playback_while_the_key_is_held(devices: PulseServer, audio: AudioIO) -> None:
    audio.duck_while_talking = True
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(int(1.4 * 22_050)) / 22_050)).astype(np.float32)
    with devices.record_speaker() as recording:
        audio.play(tone)
        while audio.output_backlog_s > 0.6:  # about halfway through
            time.sleep(0.01)
        audio.talking = True
        while audio.output_backlog_s > 0:
            time.sleep(0.02)
        time.sleep(0.3)
    window = 1102  # 50 ms
    samples = recording.samples[: len(recording.samples) // window * window].reshape(-1, window)
    rms = np.sqrt((samples.astype(np.float64) ** 2).mean(axis=1))
    tone_windows = np.flatnonzero(rms > 0.01)
    assert len(tone_windows) >= 20, "the tone was not played"
    full, ducked = rms[tone_windows[2]], rms[tone_windows[-3]]  # away from the ramps at both ends
    assert full == pytest.approx(0.5 / np.sqrt(2), rel=0.15)
    assert ducked / full == pytest.approx(audio.duck_gain, rel=0.25)


def test_no_audio_server_gives_a_clear_error(devices: PulseServer) -> None:
    with devices.no_server():
        refresh_devices()
        assert list_devices().inputs == ()
        io = AudioIO()
        with pytest.raises(AudioUnavailable, match=r"^No microphone found\. Connect one or check the sound settings"):
            io.start()
        assert io.state is AudioState.STOPPED
        io.close()


def test_missing_portaudio_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    audio_devices._sounddevice.cache_clear()
    monkeypatch.delitem(sys.modules, "sounddevice")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    try:
        with pytest.raises(AudioUnavailable, match=r"PortAudio.*libportaudio2"):
            list_devices()
    finally:
        audio_devices._sounddevice.cache_clear()


def test_app_imports_without_loading_sounddevice() -> None:
    code = "import sys, app.audio.streams, app.ring_buffer; assert 'sounddevice' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1], timeout=60)


def test_unknown_device_name_falls_back_to_the_default_and_says_so(devices: PulseServer) -> None:
    with AudioIO("USB headset that is not plugged in") as io:
        assert io.input_device_name == MIC
        (status,) = io.poll_health()
    assert f"'USB headset that is not plugged in' is not connected; using '{MIC_DESCRIPTION}'" in status.message
    assert status.input_name == MIC


def test_lost_devices_pause_audio_and_it_resumes_when_they_return(
    devices: PulseServer, audio: AudioIO, question_wav: Path, question: tuple[np.ndarray, np.ndarray]
) -> None:
    audio.talking = True
    devices.unload_mic()
    devices.unload_speaker()
    lost = poll_until(audio, lambda _: audio.paused)
    assert len(lost) == 1 and "stopped working" in lost[0].message and "paused" in lost[0].message
    assert (lost[0].input_name, lost[0].output_name) == (None, None)
    assert audio.poll_health() == [], "retries while paused stay quiet"

    devices.load_speaker()
    devices.load_mic()
    resumed = poll_until(audio, lambda statuses: bool(statuses))
    assert [s.message for s in resumed] == [
        f"Audio resumed on the microphone '{MIC_DESCRIPTION}' and the speaker '{SPEAKER_DESCRIPTION}'."
    ]
    assert audio.state is AudioState.RUNNING
    _, r = xcorr_match(question[1], speak_and_read(devices, audio, question_wav))
    assert r > 0.9, f"after resuming, the microphone frames do not match the speech (r={r:.3f})"


def test_lost_chosen_microphone_falls_back_to_the_default_and_returns_on_request(devices: PulseServer) -> None:
    # A second microphone, the default, so that the chosen one has somewhere to fall back to.
    devices.pactl(
        "load-module", "module-remap-source", f"master={SPEAKER}.monitor", "source_name=backup_mic",
        "source_properties=\"device.description='Backup microphone'\"",
    )  # fmt: skip
    devices.pactl("set-default-source", "backup_mic")
    with AudioIO(MIC, retry_interval_s=0.1) as io:
        assert io.input_device_name == MIC
        assert io.read_frame(timeout=1.0) is not None
        devices.unload_mic()
        devices.kill_recording_streams()
        statuses = poll_until(io, lambda _: io.input_device_name == "backup_mic")
        assert io.state is AudioState.RUNNING
        (status,) = statuses
        assert status.message.startswith(f"The microphone '{MIC_DESCRIPTION}' stopped working.")
        assert f"The microphone '{MIC}' is not connected; using 'Backup microphone' instead." in status.message
        assert io.read_frame(timeout=1.0) is not None, "frames flow from the fallback microphone"

        devices.load_mic()
        io.set_devices(MIC, None)
        assert io.input_device_name == MIC
        assert _stream_devices(devices, "source-outputs") == [MIC]
        assert [s.input_name for s in io.poll_health()] == [MIC]
        assert io.read_frame(timeout=1.0) is not None
        io.set_devices(MIC, None)  # a refresh of the device lists reopens the same devices
        assert io.poll_health() == [], "reopening the devices already in use is nothing to report"


def test_audio_queued_before_start_is_converted_to_the_device_rate(devices: PulseServer) -> None:
    io = AudioIO()
    io.play(np.full(22_050, 0.1, dtype=np.float32))
    assert io.output_backlog_s == pytest.approx(1.0, abs=0.01)
    assert io.read_frame() is None  # nothing captured yet, and no waiting
    with io:
        assert io.output_rate == 44_100
        assert io.output_backlog_s == pytest.approx(1.0, abs=0.15), "queued audio is kept across the rate change"


def test_stalled_microphone_is_reopened_then_paused_once_and_resumes_when_audio_flows(devices: PulseServer) -> None:
    with AudioIO(stall_timeout_s=0.4, retry_interval_s=0.1) as io:
        assert io.read_frame(timeout=1.0) is not None
        devices.suspend_mic()
        statuses = poll_until(io, lambda _: io.paused)
        assert [s.message for s in statuses] == [
            f"The microphone '{MIC_DESCRIPTION}' stopped working. It was reopened.",
            f"The microphone '{MIC_DESCRIPTION}' is not delivering audio. Audio is paused and resumes when it does.",
        ]
        quiet = time.monotonic() + 1.0  # several reopen-and-stall cycles
        while time.monotonic() < quiet:
            assert io.poll_health() == [], "retries on a stalled device stay quiet"
            time.sleep(0.05)

        devices.suspend_mic(False)
        (resumed,) = poll_until(io, lambda statuses: bool(statuses))
        assert resumed.message == (
            f"Audio resumed on the microphone '{MIC_DESCRIPTION}' and the speaker '{SPEAKER_DESCRIPTION}'."
        )
        assert io.read_frame(timeout=1.0) is not None


def test_play_validates_and_sanitises_input() -> None:
    io = AudioIO()
    with pytest.raises(ValueError, match=r"shape \(10, 2\)"):
        io.play(np.zeros((10, 2), dtype=np.float32))
    io.play(np.array([np.nan, np.inf, -np.inf, 2.0, -2.0, 0.5] * 400, dtype=np.float32))
    queued = io._playback.ring.read(io._playback.ring.available)
    assert queued is not None and np.isfinite(queued).all() and np.abs(queued).max() <= 1.0


OUTPUT_FRAME = 1764  # one engine frame at 22.05 kHz


def test_live_silence_is_skipped_only_while_an_underrun_has_left_the_queue_late() -> None:
    io = AudioIO()  # not started: nothing plays, so the queue is what play() leaves
    voice = np.full(OUTPUT_FRAME, 0.1, dtype=np.float32)
    hush = np.full(OUTPUT_FRAME, 1e-4, dtype=np.float32)  # -80 dBFS: inaudible
    frame_s = OUTPUT_FRAME / 22_050
    for _ in range(2):  # the jitter buffer (two frames) and then one more frame may queue as they come
        io.play(hush, live=True)
    assert io.output_backlog_s == pytest.approx(2 * frame_s, abs=1e-3) and io.output_skipped_s == 0.0
    io.play(voice, live=True)  # speech is never skipped
    io.play(hush, live=True)  # three frames queued: late, and this one is silent
    assert io.output_backlog_s == pytest.approx(3 * frame_s, abs=1e-3)
    assert io.output_skipped_s == pytest.approx(frame_s)
    io.play(voice, live=True)
    io.play(hush)  # not the live stream (a self-test's answer): kept whole
    assert io.output_backlog_s == pytest.approx(5 * frame_s, abs=1e-3)
    assert io.output_skipped_s == pytest.approx(frame_s)


def test_the_silence_after_an_underrun_wins_its_delay_back(devices: PulseServer, audio: AudioIO) -> None:
    voice = (np.random.default_rng(3).standard_normal(OUTPUT_FRAME) * 0.05).astype(np.float32)
    silence = np.zeros(OUTPUT_FRAME, dtype=np.float32)
    frame_s = OUTPUT_FRAME / 22_050
    for _ in range(8):  # the engine keeping time
        audio.play(voice, live=True)
        time.sleep(frame_s)
    time.sleep(0.5)  # then stalling: the speaker runs dry
    assert audio.output_underruns >= 1
    for _ in range(6):  # and catching up on its backlog at once: everything after the stall is late
        audio.play(voice, live=True)
    late_s = audio.output_backlog_s
    assert late_s >= 0.3  # six frames, less what the speaker took since it restarted
    for _ in range(12):  # a pause in the conversation, at the engine's pace
        audio.play(silence, live=True)
        time.sleep(frame_s)
    assert audio.output_skipped_s >= frame_s
    assert audio.output_backlog_s <= 3 * frame_s, f"still {audio.output_backlog_s:.2f} s queued (was {late_s:.2f})"


def test_close_stops_both_streams_without_waiting_and_is_idempotent(audio: AudioIO) -> None:
    streams = [endpoint.stream for endpoint in (audio._input, audio._output) if endpoint is not None]
    assert len(streams) == 2
    audio.close()
    audio.close()
    assert all(stream.closed for stream in streams)
    assert audio._abandoned_streams == 0, "a stream only let go after the close timeout"
    assert not [thread for thread in threading.enumerate() if thread.name == "parley-audio-close"]
    assert audio.state is AudioState.STOPPED
    assert audio.input_device_name is None and audio.output_device_name is None
