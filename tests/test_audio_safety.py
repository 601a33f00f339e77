"""Output safety and input accounting inside AudioIO, driven through its own callbacks (no sound server).

The limiter, master volume, mute and Stop act in the output callback; the reply delay is
measured there; the microphone enters the input ring only while the engine captures, and
what a full ring drops is counted in seconds. The callbacks are called here the way
PortAudio calls them, block by block, so every sample they produce can be checked. One test
compares the saved assistant audio with what reached PulseAudio's virtual speaker.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from app.audio.devices import AudioDevice
from app.audio.endpoint import Endpoint
from app.audio.output import AUDIBLE_PEAK, OUTPUT_CEILING, OUTPUT_CEILING_DBFS
from app.audio.streams import AudioIO
from app.audio_files import write_wav
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

BLOCK = 512
OK = SimpleNamespace(output_underflow=False, input_overflow=False)


def speaker(io: AudioIO) -> tuple[Endpoint, object]:
    """An output endpoint at the engine's rate (no resampling) and its callback."""
    device = AudioDevice("test speaker", 0, "test", 1, float(OUTPUT_SAMPLE_RATE), True)
    endpoint = Endpoint("output", device, OUTPUT_SAMPLE_RATE, io._playback.ring)
    endpoint.latency_s = 0.05
    return endpoint, io._output_callback(endpoint)


def played(callback: object, blocks: int) -> np.ndarray:
    """What the callback hands PortAudio over ``blocks`` blocks."""
    out = []
    for _ in range(blocks):
        outdata = np.zeros((BLOCK, 1), dtype=np.float32)
        callback(outdata, BLOCK, None, OK)  # type: ignore[operator]
        out.append(outdata[:, 0].copy())
    return np.concatenate(out)


def noise(seconds: float, amplitude: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (amplitude * rng.uniform(-1.0, 1.0, round(seconds * OUTPUT_SAMPLE_RATE))).astype(np.float32)


def test_no_sample_exceeds_the_ceiling_at_any_volume() -> None:
    io = AudioIO(volume=1.0, prefill_frames=0)
    _, callback = speaker(io)
    io.play(noise(0.5, 1.0))  # full-scale noise, as the demo's random weights make
    out = played(callback, 40)  # 0.93 s: the noise, then silence in which the limiter lets go
    print(f"full-scale noise in: peak {20 * np.log10(np.abs(out).max()):.1f} dBFS out (ceiling -6.0)")
    assert np.abs(out).max() <= OUTPUT_CEILING + 1e-6
    assert np.abs(out).max() > 0.9 * OUTPUT_CEILING, "limited to the ceiling, not silenced"

    quiet = noise(0.5, 0.1, seed=1)  # below the ceiling: passes unchanged once the limiter has let go
    io.play(quiet)
    after = played(callback, 30)
    np.testing.assert_allclose(after[: quiet.size], quiet, atol=1e-6)


def level_dbfs(samples: np.ndarray) -> tuple[float, float, float]:
    """RMS and peak in dBFS, and the percentage of samples at full scale."""
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    peak = float(np.abs(samples).max())
    return (
        20 * np.log10(max(rms, 1e-10)),
        20 * np.log10(max(peak, 1e-10)),
        100.0 * float(np.mean(np.abs(samples) >= 0.999)),
    )


@pytest.mark.audio
def test_the_saved_assistant_audio_is_what_the_speaker_played(tmp_path: Path) -> None:
    import soundfile

    from app.audio.devices import refresh_devices
    from app.export import ConversationRecording
    from tests.pulse import virtual_devices

    loud = noise(3.0, 1.0, seed=7)  # full-scale noise: what random weights make
    recording = ConversationRecording()
    with virtual_devices() as pulse:
        refresh_devices()
        with AudioIO(capture=False) as io, pulse.record_speaker() as heard:
            for start in range(0, loud.size, 1764):  # one 80 ms engine frame at a time, as the worker plays them
                chunk = loud[start : start + 1764]
                io.play(chunk)
                recording.add_output(chunk)  # and as the controller keeps them
            while io.output_backlog_s > 0:
                time.sleep(0.05)
            time.sleep(0.3)
    _, assistant = recording.snapshot()
    write_wav(tmp_path / "assistant.wav", assistant, OUTPUT_SAMPLE_RATE)  # as History and Save Conversation do
    saved, _ = soundfile.read(tmp_path / "assistant.wav", dtype="float32")
    speaker = heard.samples[np.flatnonzero(np.abs(heard.samples) > 1e-3)[0] :][: saved.size]
    saved_rms, saved_peak, saved_full = level_dbfs(saved[saved.size // 10 :])  # past the limiter's first block
    heard_rms, heard_peak, _ = level_dbfs(speaker[speaker.size // 10 :])
    print(
        f"\nfull-scale noise: saved RMS {saved_rms:.1f} dBFS, peak {saved_peak:.2f} dBFS, {saved_full:.1f} % at full "
        f"scale; the speaker got RMS {heard_rms:.1f} dBFS, peak {heard_peak:.2f} dBFS"
    )
    assert saved_full == 0.0, "nothing clipped"
    assert saved_peak <= OUTPUT_CEILING_DBFS + 0.01, "never above the speaker's ceiling"
    assert abs(saved_rms - heard_rms) < 1.0, "saved at the level that was heard"


def test_volume_and_mute_scale_what_is_played() -> None:
    io = AudioIO(volume=0.25, prefill_frames=0)
    _, callback = speaker(io)
    tone = (0.4 * np.sin(2 * np.pi * 440 * np.arange(OUTPUT_SAMPLE_RATE) / OUTPUT_SAMPLE_RATE)).astype(np.float32)
    io.play(tone)
    out = played(callback, 30)
    steady = out[BLOCK * 2 : BLOCK * 20]  # after the ramp from full gain
    assert np.abs(steady).max() == pytest.approx(0.4 * 0.25, rel=0.02)
    io.muted = True
    played(callback, 1)  # the ramp down
    assert np.abs(played(callback, 5)).max() == 0.0, "muted: silence, while the engine's audio keeps flowing"


def test_stop_drops_what_is_queued_until_the_user_talks_again() -> None:
    io = AudioIO(prefill_frames=0)
    _, callback = speaker(io)
    io.play(noise(2.0, 0.2))
    assert io.output_backlog_s > 1.5
    io.hush()
    assert io.output_backlog_s == 0.0 and io.hushed
    io.play(noise(0.5, 0.2))  # the assistant keeps talking: not played
    assert io.output_backlog_s == 0.0 and np.abs(played(callback, 4)).max() == 0.0
    io.talking = True  # the user takes the turn
    io.talking = False
    io.play(noise(0.5, 0.2))
    assert not io.hushed and io.output_backlog_s > 0.4


def test_a_starved_device_counts_as_an_underrun_only_while_the_assistant_plays() -> None:
    io = AudioIO()  # with a jitter buffer, as the app plays: an empty queue is idle, not an underrun
    _, callback = speaker(io)
    late = SimpleNamespace(output_underflow=True, input_overflow=False)  # PortAudio: our callback came too late
    callback(np.zeros((BLOCK, 1), np.float32), BLOCK, None, late)  # idle: the silence it missed was silence
    assert io.output_underruns == 0 and io.output_device_underflows == 0
    io.play(noise(0.5, 0.2))
    played(callback, 3)
    callback(np.zeros((BLOCK, 1), np.float32), BLOCK, None, late)  # mid-answer: the speaker went silent
    assert io.output_device_underflows == 1
    assert io.output_underruns == 1, "the user heard a gap, though the queue never ran dry"
    played(callback, 40)  # the queue runs dry once
    assert io.output_underruns == 2


def test_alsa_lib_s_underrun_recoveries_count_as_the_device_starving_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import Counter

    from app.audio import streams

    recoveries: Counter[str] = Counter()
    monkeypatch.setattr(streams, "alsa_xruns", recoveries)
    io = AudioIO()
    _, callback = speaker(io)
    recoveries["underrun"] += 1  # alsa-lib recovered the speaker while it idled: silence missed, nothing counted
    played(callback, 1)
    assert io.output_device_underflows == 0
    io.play(noise(0.5, 0.2))
    played(callback, 3)
    recoveries["underrun"] += 1  # mid-answer, without PortAudio's flag
    played(callback, 1)
    assert io.output_device_underflows == 1
    recoveries["underrun"] += 1  # and with it: one starving, counted once
    callback(
        np.zeros((BLOCK, 1), np.float32), BLOCK, None, SimpleNamespace(output_underflow=True, input_overflow=False)
    )
    assert io.output_device_underflows == 2


def test_the_reply_delay_runs_from_key_release_to_the_first_audible_block() -> None:
    io = AudioIO(prefill_frames=0)
    endpoint, callback = speaker(io)
    io.talking = True
    io.play(noise(0.2, 0.3))
    played(callback, 10)  # heard while talking: not a reply
    assert io.take_turn_latencies() == []
    io.talking = False
    released = time.monotonic()
    played(callback, 5)  # silence after the release: still waiting
    io.play(np.full(BLOCK * 4, AUDIBLE_PEAK / 2, dtype=np.float32))  # below audible
    played(callback, 6)
    assert io.take_turn_latencies() == []
    io.play(noise(0.2, 0.3))
    played(callback, 10)
    heard = time.monotonic()
    (latency,) = io.take_turn_latencies()
    print(f"reply delay measured: {latency * 1000:.1f} ms (includes the stream's {endpoint.latency_s * 1000:.0f} ms)")
    assert endpoint.latency_s <= latency <= heard - released + endpoint.latency_s
    played(callback, 10)
    assert io.take_turn_latencies() == [], "one delay per turn"
    assert io.last_audible > released


def test_the_microphone_fills_the_ring_only_while_the_engine_captures() -> None:
    io = AudioIO(capture=False, input_ring_s=1.0)
    device = AudioDevice("test mic", 0, "test", 1, float(INPUT_SAMPLE_RATE), True)
    endpoint = Endpoint("input", device, INPUT_SAMPLE_RATE, io._reader.ring)
    callback = io._input_callback(endpoint)
    block = np.full((INPUT_FRAME_SAMPLES, 1), 0.25, dtype=np.float32)
    io.talking = True
    for _ in range(100):  # 8 s of talking while nothing reads (loading, asleep, no conversation)
        callback(block, INPUT_FRAME_SAMPLES, None, OK)
    assert io.input_peak > 0.2, "the meter still shows the microphone"
    assert io.input_overflows == 0 and io.input_lost_s == 0.0 and io.input_backlog_frames == 0

    io.start_capture()
    for _ in range(5):
        callback(block, INPUT_FRAME_SAMPLES, None, OK)
    frames = [io.read_frame() for _ in range(5)]
    assert all(frame is not None and np.allclose(frame, 0.25, atol=1e-3) for frame in frames[1:])
    assert io.input_lost_s == 0.0, "nothing lost while the engine keeps up"

    for _ in range(25 + 5):  # the engine stalls for 2.4 s with a 1 s ring: 1.4 s are dropped, and said so
        callback(block, INPUT_FRAME_SAMPLES, None, OK)
    assert io.input_lost_s == pytest.approx(30 * INPUT_FRAME_SAMPLES / INPUT_SAMPLE_RATE - 1.0, abs=1e-9)
    io.stop_capture()
    assert io.input_backlog_frames == 0
