"""Hands-free: the echo canceller at AudioIO's device edge, and the whole app through PulseAudio.

Unit tests drive AudioIO's own callbacks block by block (as tests/test_audio_safety.py does), with an
``EchoCanceller`` whose AEC3 is replaced by a recorder, to check the wiring: the reference is exactly
what the speaker plays (after volume, ducking and the limiter) with its DAC time; each engine frame is
cleaned with its ADC time; a closed microphone stays true silence; ducking and Stop follow the user's
voice in the cleaned microphone, not a key; the canceller is reset when the streams reopen.

End to end (marked ``audio``): the real controller, engine worker (tiny random checkpoint) and AudioIO
on the PulseAudio virtual devices, with the virtual speaker looped back into the virtual microphone
(module-loopback, 60 ms, attenuated), as a laptop's speakers reach its microphone.

- The assistant's own output (the random weights' noise, limited at -6 dBFS) reaches the microphone at
  about -29 dBFS; with hands-free on, from 3 s on no 100 ms of what the engine hears is louder than
  -60 dBFS (a quiet room's noise floor; measured about -88 dBFS, the virtual microphone has no noise of
  its own), so the model hears a silent room, not itself. Measured on the engine's clock (tests/realtime.py):
  5 s of frames in which the speaker played steadily; the second after each counted starving of the speaker
  (located by the engine's frames and backlog) is AEC3's to find the echo again, and a busy machine waits longer.
- The user talking over the assistant (double talk): the assistant is replaced by real speech (espeak;
  random weights make noise, and AEC3's residual suppressor treats speech differently), its echo about
  10 dB below the user's voice, ducking on (the default). The question reaches the engine with a level
  loss under 3 dB (measured 1.8-2.1 dB) and a correlation of at least 0.75 (measured 0.83-0.85) with
  what was said. The assistant's words are queued ahead of the engine, so a busy machine's late frames do not
  starve the speaker; a question during which it starved all the same is asked again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np
import pytest

from app.audio.devices import AudioDevice
from app.audio.endpoint import Endpoint
from app.audio.output import OUTPUT_CEILING
from app.audio.streams import AudioIO
from app.audio.voice import USER_VOICE_RMS
from app.echo import BLOCK_SAMPLES, REFERENCE_HISTORY_S, EchoCanceller
from engine.timeline import FRAME_SECONDS, INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

if TYPE_CHECKING:
    from app.controller import AppController
    from app.messages import FrameStats
    from tests.pulse import PulseServer

BLOCK = 512
CONVERGED_FRAMES = 38  # AEC3 learns the room in the first 3 s
STEADY_FRAMES = 63  # then at least 5 s in which the speaker played steadily are measured
RECOVERY_FRAMES = 13  # after the speaker starved, AEC3 finds the echo again within about a second
MAX_ROOM_FRAMES = 400  # a machine that starves the speaker all the time gets 32 s to show 5 steady ones
LEARN_FRAMES = 150  # 12 s of the assistant talking before the user does
FEED_AHEAD_S = 3.0  # the assistant's words queued ahead of the engine in the double-talk test
QUESTION_TRIES = 8  # questions a busy machine may need for one asked while the speaker played steadily
OK = SimpleNamespace(output_underflow=False, input_overflow=False)


class Recorder:
    """An AEC3 stand-in: records what it is given and returns ``near * gain``."""

    def __init__(self, gain: float = 0.1) -> None:
        self.gain = gain
        self.near: list[np.ndarray] = []
        self.far: list[np.ndarray] = []
        self.resets = 0

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        self.near.append(near.copy())
        self.far.append(far.copy())
        return (near * self.gain).astype(np.float32)

    def reset(self) -> None:
        self.resets += 1


class Watched(EchoCanceller):
    """The real alignment, recording each call's times."""

    def __init__(self, backend: Recorder) -> None:
        super().__init__(backend=backend)
        self.fed: list[tuple[np.ndarray, int | None, float | None]] = []
        self.cleaned: list[float | None] = []

    def feed_playback(self, samples: np.ndarray, *, rate: int | None = None, dac_time: float | None = None) -> None:
        self.fed.append((np.array(samples), rate, dac_time))
        super().feed_playback(samples, rate=rate, dac_time=dac_time)

    def clean_capture(self, samples: np.ndarray, *, adc_time: float | None = None) -> np.ndarray:
        self.cleaned.append(adc_time)
        return super().clean_capture(samples, adc_time=adc_time)


def speaker(io: AudioIO) -> tuple[Endpoint, object]:
    device = AudioDevice("test speaker", 0, "test", 1, float(OUTPUT_SAMPLE_RATE), True)
    endpoint = Endpoint("output", device, OUTPUT_SAMPLE_RATE, io._playback.ring)
    return endpoint, io._output_callback(endpoint)


def microphone(io: AudioIO) -> tuple[Endpoint, object]:
    device = AudioDevice("test mic", 0, "test", 1, float(INPUT_SAMPLE_RATE), True)
    endpoint = Endpoint("input", device, INPUT_SAMPLE_RATE, io._reader.ring)
    return endpoint, io._input_callback(endpoint)


def output_block(callback: object, *, ahead_s: float = 0.05) -> np.ndarray:
    now = 1000.0
    times = SimpleNamespace(currentTime=now, outputBufferDacTime=now + ahead_s)
    outdata = np.zeros((BLOCK, 1), dtype=np.float32)
    callback(outdata, BLOCK, times, OK)  # type: ignore[operator]
    return outdata[:, 0].copy()


def input_block(callback: object, samples: np.ndarray, *, behind_s: float = 0.03) -> None:
    now = 500.0
    times = SimpleNamespace(currentTime=now, inputBufferAdcTime=now - behind_s)
    callback(samples.reshape(-1, 1).astype(np.float32), len(samples), times, OK)  # type: ignore[operator]


def noise(seconds: float, amplitude: float, rate: int = OUTPUT_SAMPLE_RATE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (amplitude * rng.uniform(-1.0, 1.0, round(seconds * rate))).astype(np.float32)


def hands_free_io(backend: Recorder, **kwargs: object) -> tuple[AudioIO, Watched]:
    io = AudioIO(capture=True, prefill_frames=0, **kwargs)
    canceller = Watched(backend)
    io.set_echo_canceller(canceller)
    return io, canceller


def test_the_reference_is_exactly_what_the_speaker_plays_and_when() -> None:
    io, canceller = hands_free_io(Recorder(), volume=0.5)
    _, callback = speaker(io)
    io.play(noise(0.3, 1.0))  # full scale: the limiter acts on it, after the volume
    before = time.monotonic()
    played = [output_block(callback) for _ in range(8)]
    after = time.monotonic()
    assert len(canceller.fed) == 8
    for out, (fed, rate, dac_time) in zip(played, canceller.fed, strict=True):
        np.testing.assert_array_equal(fed, out)  # after volume and limiter, sample for sample
        assert rate == OUTPUT_SAMPLE_RATE
        assert dac_time is not None and before + 0.05 <= dac_time <= after + 0.05  # on time.monotonic()
    assert np.abs(np.concatenate(played)).max() <= OUTPUT_CEILING + 1e-6


def test_push_to_talk_feeds_no_canceller_and_a_closed_capture_feeds_none() -> None:
    io, canceller = hands_free_io(Recorder())
    _, callback = speaker(io)
    io.stop_capture()  # no conversation reads the microphone: nothing to pair the reference with
    output_block(callback)
    assert canceller.fed == []
    io.start_capture()
    output_block(callback)
    assert len(canceller.fed) == 1
    io.set_echo_canceller(None)  # push to talk
    output_block(callback)
    assert len(canceller.fed) == 1 and not io.hands_free


def test_each_frame_is_cleaned_with_its_capture_time() -> None:
    backend = Recorder(gain=0.1)
    io, canceller = hands_free_io(backend)
    _, callback = microphone(io)
    io.talking = True  # the microphone is open
    speech = noise(0.4, 0.3, INPUT_SAMPLE_RATE)
    before = time.monotonic()
    for start in range(0, len(speech), 256):  # PortAudio's blocks, not the engine's frames
        input_block(callback, speech[start : start + 256])
    after = time.monotonic()
    frames = [io.read_frame() for _ in range(len(speech) // INPUT_FRAME_SAMPLES)]
    assert all(frame is not None for frame in frames)
    heard = np.concatenate(frames)
    np.testing.assert_allclose(heard, speech[: len(heard)] * 0.1, atol=1e-6)  # what the canceller returned
    assert sum(len(block) for block in backend.near) == len(heard) and len(backend.near[0]) == BLOCK_SAMPLES
    times = canceller.cleaned
    assert all(t is not None for t in times)
    # Counted back from the newest block's ADC time (30 ms before its callback) by sample count: the blocks
    # here arrive all at once, so the first sample was captured 0.384 s of audio before the newest block.
    back = (len(speech) - 256) / INPUT_SAMPLE_RATE + 0.03
    first = times[0]
    assert first is not None and before - back <= first <= after - back
    steps = np.diff(np.array(times, dtype=float))
    np.testing.assert_allclose(steps, INPUT_FRAME_SAMPLES / INPUT_SAMPLE_RATE, atol=2e-3)  # 80 ms apart


def test_a_closed_microphone_gives_the_engine_true_silence() -> None:
    backend = Recorder(gain=0.0)
    backend.process = lambda near, far: np.full_like(near, 1e-3)  # type: ignore[method-assign]  # comfort noise
    io, canceller = hands_free_io(backend)
    _, callback = microphone(io)
    io.talking = False  # hands-free, microphone closed: the ring gets zeros
    for _ in range(4):
        input_block(callback, noise(0.08, 0.3, INPUT_SAMPLE_RATE))
    frame = io.read_frame()
    assert frame is not None and not frame.any(), "not the canceller's comfort noise"
    assert len(canceller.cleaned) == 1, "still run through the canceller, so its timeline stays continuous"


def test_hands_free_ducks_and_resumes_on_the_users_voice_not_the_key() -> None:
    backend = Recorder(gain=1.0)
    io, _ = hands_free_io(backend, duck_while_talking=True, duck_gain=0.2)
    _, out = speaker(io)
    _, mic = microphone(io)
    io.talking = True  # the microphone is open all the time in hands-free
    tone = (0.2 * np.sin(2 * np.pi * 300 * np.arange(OUTPUT_SAMPLE_RATE) / OUTPUT_SAMPLE_RATE)).astype(np.float32)
    io.play(tone)
    output_block(out)
    steady = output_block(out)
    assert np.abs(steady).max() == pytest.approx(0.2, rel=0.02), "an open microphone alone does not duck"

    quiet = np.full(INPUT_FRAME_SAMPLES, USER_VOICE_RMS / 3, dtype=np.float32)  # a residual, not a voice
    input_block(mic, quiet)
    io.read_frame()
    assert not io.user_speaking
    assert np.abs(output_block(out)).max() == pytest.approx(0.2, rel=0.02)

    io.hush()  # Stop: the assistant's audio is dropped…
    assert io.hushed
    # …until the user speaks: louder than the speaker (the echo gap is not learnt yet, so taken as 0 dB).
    input_block(mic, noise(0.08, 0.6, INPUT_SAMPLE_RATE))
    io.read_frame()
    assert io.user_speaking and not io.hushed
    io.play(tone)
    output_block(out)  # the gain ramps down
    assert np.abs(output_block(out)).max() == pytest.approx(0.2 * 0.2, rel=0.05), "ducked while the user speaks"


def test_the_canceller_forgets_the_room_when_set_and_when_the_streams_reopen(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = Recorder()
    io, _ = hands_free_io(backend)
    assert backend.resets == 1
    monkeypatch.setattr(io, "_open_both", lambda: [])
    io._open_streams()  # a device change or a recovery reopens both streams
    assert backend.resets == 2


def test_a_replay_is_mixed_into_the_speaker_at_the_volume_and_is_not_the_assistant() -> None:
    io = AudioIO(prefill_frames=0, volume=0.5)
    _, callback = speaker(io)
    tone = (0.4 * np.sin(2 * np.pi * 440 * np.arange(OUTPUT_SAMPLE_RATE) / OUTPUT_SAMPLE_RATE)).astype(np.float32)
    duration = io.start_replay(tone, OUTPUT_SAMPLE_RATE)
    assert duration == pytest.approx(1.0)
    deadline = time.monotonic() + 5
    while (io.replayer.ring is None or io.replayer.ring.available < BLOCK * 4) and time.monotonic() < deadline:
        time.sleep(0.01)
    out = np.concatenate([output_block(callback) for _ in range(6)])
    np.testing.assert_allclose(out[BLOCK:], tone[BLOCK : len(out)] * 0.5, atol=1e-5)
    assert io.last_audible == 0.0, "a replay is not the assistant speaking"
    position = io.replay_position
    assert position is not None and position[1] == pytest.approx(1.0)
    io.stop_replay()
    assert io.replay_position is None and np.abs(output_block(callback)).max() == 0.0


# --------------------------------------------------------------------------- end to end through PulseAudio


def _level_db(samples: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.square(samples, dtype=np.float64))) + 1e-12))


def _loudest_window_db(samples: np.ndarray, window: int = 1600) -> float:
    count = len(samples) // window
    blocks = samples[: count * window].reshape(count, window).astype(np.float64)
    return float(20 * np.log10(np.sqrt(np.mean(blocks**2, axis=1)).max() + 1e-12))


class _Tap(EchoCanceller):
    """The real canceller, keeping each frame before and after cleaning, and its blocks without reference so far."""

    frames: ClassVar[list[tuple[np.ndarray, np.ndarray]]] = []
    missing: ClassVar[list[int]] = []

    def clean_capture(self, samples: np.ndarray, *, adc_time: float | None = None) -> np.ndarray:
        cleaned = super().clean_capture(samples, adc_time=adc_time)
        _Tap.frames.append((np.array(samples), np.array(cleaned)))
        _Tap.missing.append(self.stats.reference_missing_blocks)
        return cleaned


def _stats(messages: list[object]) -> list[FrameStats]:
    from app.messages import FrameStats

    return [m for m in messages if isinstance(m, FrameStats)]


def _starved(stats: list[FrameStats]) -> set[int]:
    """The frames the engine heard while the speaker starved or AEC3 re-converged after it (RECOVERY_FRAMES).

    Located on the engine's clock: the frame whose counters first show an underrun was processed while the
    microphone captured frame ``index + 1 + backlog`` (the frames waiting behind it), and the one before it
    while it captured ``index + 1 + backlog`` of its own; the starving happened between the two."""
    starved: set[int] = set()
    captured_before, underruns_before = 0, 0  # the frame the microphone captured when the previous frame ran
    for now in stats:
        captured = now.timing.frame_index + 1 + now.backlog_frames
        if now.output_underruns > underruns_before:
            starved.update(range(max(captured_before - 1, 0), captured + RECOVERY_FRAMES + 1))  # -1: the echo's delay
        captured_before, underruns_before = captured, now.output_underruns
    return starved


def _steady(stats: list[FrameStats], missing: list[int], first: int = CONVERGED_FRAMES) -> list[int]:
    """Frames from ``first`` (AEC3's convergence) on that the engine heard with the speaker playing steadily and
    every block paired with its reference (a block cleaned without one is cleaned against silence, by design)."""
    starved = _starved(stats)
    heard = min(len(stats), len(missing))
    return [i for i in range(max(first, 1), heard) if i not in starved and missing[i] == missing[i - 1]]


def _captured(controller: AppController, messages: list[object]) -> int:
    """The frames the microphone has delivered so far: those the engine ran and those waiting for it."""
    messages += controller.poll()
    stats = _stats(messages)
    return stats[-1].timing.frame_index + 1 + stats[-1].backlog_frames if stats else 0


@pytest.fixture
def echo_room() -> Iterator[PulseServer]:
    """Virtual devices whose speaker comes back into the microphone after 60 ms (plus the devices' latency)."""
    from app.audio.devices import refresh_devices
    from tests.pulse import MIC_FEED, SPEAKER, virtual_devices

    with virtual_devices() as pulse:
        pulse.pactl(
            "load-module", "module-loopback", f"source={SPEAKER}.monitor", f"sink={MIC_FEED}", "latency_msec=60"
        )
        refresh_devices()
        yield pulse


def _set_loop_gain(pulse: PulseServer, gain: float) -> None:
    for line in pulse.pactl("list", "short", "sink-inputs").splitlines():
        if line.split()[3] == "module-loopback.c":
            pulse.pactl("set-sink-input-volume", line.split()[0], f"{gain}")  # a linear factor
            return
    raise AssertionError("the loopback has no sink input")


def _hands_free_controller(checkpoint: Path, tmp_path: Path, *, ducking: bool = True) -> AppController:
    from app.controller import AppController
    from app.settings import Settings

    _Tap.frames, _Tap.missing = [], []
    settings = Settings(
        checkpoints={"4bit": checkpoint}, active_variant="4bit", hands_free=True, idle_pause=False, ducking=ducking
    )
    return AppController(
        settings,
        settings_path=tmp_path / "settings.json",
        log_folder=tmp_path / "logs",
        history_folder=tmp_path / "history",
        auto_demo=False,
        echo_factory=_Tap,
    )


@pytest.mark.audio
@pytest.mark.slow
def test_hands_free_the_engine_does_not_hear_the_assistant(
    echo_room: PulseServer, tiny_q4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.worker
    from app.messages import ModelLoaded
    from tests.realtime import MeasuredSpeed, wait_for_frames
    from tests.test_controller import wait_for

    # A random checkpoint plays 26 dB down, like the demo; the room's echo is measured at a talking level.
    monkeypatch.setattr(app.worker, "DEMO_OUTPUT_GAIN", 1.0)
    _set_loop_gain(echo_room, 0.25)
    controller = _hands_free_controller(tiny_q4, tmp_path, ducking=False)
    try:
        controller.start()
        messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen), timeout=300)
        controller.set_talking(True)  # the microphone opens and stays open
        # On the engine's clock: until it has heard 5 s with the speaker playing steadily. A busy machine starves
        # the speaker now and then (each counted), and then takes longer (tests/realtime.py gives the patience).
        wait_for_frames(
            controller,
            MAX_ROOM_FRAMES,
            messages,
            what="5 s of steady playback into the room",
            done=lambda seen: len(_steady(_stats(seen), _Tap.missing)) >= STEADY_FRAMES,
        )
        echo = controller._echo.stats
    finally:
        controller.shutdown()
    heard, spoken = controller.recording.snapshot()
    raw = np.concatenate([before for before, _ in _Tap.frames])
    stats = _stats(messages)
    steady = _steady(stats, _Tap.missing)
    in_steady = np.concatenate([heard[i * INPUT_FRAME_SAMPLES : (i + 1) * INPUT_FRAME_SAMPLES] for i in steady])
    after = slice(3 * INPUT_SAMPLE_RATE, len(heard))
    late = sum(m.backlog_frames * FRAME_SECONDS >= REFERENCE_HISTORY_S - 0.5 for m in stats)
    measured = (
        f"{len(stats)} frames at the {MeasuredSpeed().update(messages).describe()}, the speaker starved "
        f"{stats[-1].output_underruns} times, backlog up to {max(m.backlog_frames for m in stats)} frames; "
        f"{len(steady)} steady frames from 3 s on"
    )
    print(
        f"\nhands-free, the assistant talking into the room for {len(heard) / INPUT_SAMPLE_RATE:.1f} s ({measured})"
        f": speaker {_level_db(spoken):.1f} dBFS; microphone from 3 s {_level_db(raw[after]):.1f} dBFS; the engine "
        f"heard {_level_db(heard[after]):.1f} dBFS, in the steady frames {_level_db(in_steady):.1f} (loudest 100 ms "
        f"{_loudest_window_db(in_steady):.1f}); {echo.reference_missing_blocks} blocks without reference, "
        f"{echo.cost_per_block_s * 1e6:.0f} µs per block"
    )
    assert np.abs(spoken).max() > 0.1, "the assistant did talk"
    assert _level_db(raw[after]) > -40.0, "the loop brought the assistant back into the microphone"
    # Where the speaker played steadily, the engine hears a silent room; only in the second after a counted starving
    # (the app counts each one; where, the engine's frames say) may AEC3 still be finding the echo again.
    assert _loudest_window_db(in_steady) <= -60.0, f"the engine hears the assistant, not a silent room ({measured})"
    # The reference covered the conversation. A block cleaned before its playback was fed counts as silence, by
    # design (the playback callback runs late on a loaded machine: 2 of 792 blocks in one CI run, its reference
    # 5 ms behind at the end), and so does one whose frame the engine took up after the reference history had
    # moved on (its backlog measured that late); a broken wiring would leave them all without one.
    allowed = echo.blocks // 100 + late * INPUT_FRAME_SAMPLES // BLOCK_SAMPLES
    assert echo.reference_missing_blocks <= allowed, f"{echo} ({late} frames taken up that late; {measured})"


@pytest.mark.audio
@pytest.mark.slow
def test_hands_free_the_user_gets_through_while_the_assistant_talks(
    echo_room: PulseServer, tiny_q4: Path, tmp_path: Path, question_wav: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import soundfile
    import soxr

    from app.audio_port import AudioPort
    from app.messages import ModelLoaded
    from tests.echo_bench import assistant_voice
    from tests.pulse import xcorr_match
    from tests.realtime import MeasuredSpeed, wait_for_frames
    from tests.test_controller import wait_for

    voice, position = assistant_voice(), [0]

    def speak(self: AudioPort, samples: np.ndarray) -> None:
        # The engine runs; the speaker says real words, queued FEED_AHEAD_S ahead of the engine's frames (and not
        # as the live stream, whose late silences are skipped): the speaker keeps the wall clock's pace, so a busy
        # machine's late frames do not starve it.
        streams = cast("AudioIO | None", self.streams)
        while streams is not None and streams.output_backlog_s < FEED_AHEAD_S:
            start = position[0] % len(voice)
            position[0] += len(samples)
            streams.play(np.resize(voice[start : start + len(samples)], len(samples)).astype(np.float32))

    monkeypatch.setattr(AudioPort, "play", speak)
    _set_loop_gain(echo_room, 0.6)  # the echo about 10 dB below the user's voice at the microphone
    controller = _hands_free_controller(tiny_q4, tmp_path)  # ducking on, as by default
    try:
        controller.start()
        messages = wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen), timeout=300)
        controller.set_talking(True)
        # AEC3 learns the room while the assistant talks: 12 s of it on the engine's clock, however long a busy
        # machine takes over them (tests/realtime.py).
        wait_for_frames(controller, LEARN_FRAMES, messages, what="the assistant's 12 s of talking into the room")
        # The user asks while the speaker plays steadily: where it starved all the same (a late playback callback;
        # counted, and where, the engine's frames say) AEC3 is still finding the echo again, so a busy machine has
        # the question asked again, up to QUESTION_TRIES times, rather than judged on those frames.
        for attempt in range(1, QUESTION_TRIES + 1):
            asked = _captured(controller, messages)
            echo_room.play_into_mic(question_wav, wait=True)
            # Until the engine has taken in every frame captured by the question's end, and a second more.
            answered = _captured(controller, messages) + round(1 / FRAME_SECONDS)
            ran = len(_stats(messages))
            wait_for_frames(controller, answered - ran, messages, what=f"question {attempt}, heard to its end")
            stats = _stats(messages)
            unsteady = set(range(asked, answered)) - set(_steady(stats, _Tap.missing, first=asked))
            if not unsteady:
                break
    finally:
        controller.shutdown()
    heard, _ = controller.recording.snapshot()
    raw = np.concatenate([before for before, _ in _Tap.frames])
    measured = (
        f"question {attempt} of {QUESTION_TRIES} asked at {asked * FRAME_SECONDS:.2f} s; {len(stats)} frames at the "
        f"{MeasuredSpeed().update(messages).describe()}, the speaker starved {stats[-1].output_underruns} times, "
        f"backlog up to {max(m.backlog_frames for m in stats)} frames"
    )
    assert not unsteady, f"the speaker starved during every question ({measured}; unsteady frames {sorted(unsteady)})"
    question, rate = soundfile.read(question_wav, dtype="float32")
    question = soxr.resample(question, rate, INPUT_SAMPLE_RATE).astype(np.float32)
    asked_at = asked * INPUT_FRAME_SAMPLES
    lag, r = xcorr_match(question, heard[asked_at : answered * INPUT_FRAME_SAMPLES])
    said = np.abs(question) > 0.01
    segment = heard[asked_at + lag : asked_at + lag + len(question)]
    assert segment.size == question.size, (
        f"the question was found at {(asked_at + lag) / INPUT_SAMPLE_RATE:.2f} s, too late (r={r:.2f}; {measured})"
    )
    loss = _level_db(question[said]) - _level_db(segment[said])
    echo_only = raw[8 * INPUT_SAMPLE_RATE : 11 * INPUT_SAMPLE_RATE]
    print(
        f"\nhands-free double talk: echo at the microphone {_level_db(echo_only):.1f} dBFS, the user "
        f"{_level_db(question[said]):.1f} dBFS; the engine heard the user at {_level_db(segment[said]):.1f} dBFS "
        f"(loss {loss:.1f} dB), correlation {r:.2f} at {(asked_at + lag) / INPUT_SAMPLE_RATE:.2f} s ({measured})"
    )
    assert _level_db(echo_only) > -40.0, "the assistant's echo was in the microphone"
    assert lag < 0.5 * INPUT_SAMPLE_RATE, f"found where the user spoke, not elsewhere ({measured})"
    assert loss < 3.0, measured
    assert r >= 0.75, measured


@pytest.mark.audio
@pytest.mark.parametrize(
    ("echo_gain", "amplitude"),
    [(0.0, 0.3), (0.6, 0.08)],
    ids=["no echo, the assistant at -15 dBFS", "an echo 10 dB under the user, the assistant at -27 dBFS"],
)
def test_hands_free_ducks_the_speaker_while_the_user_speaks_and_not_before(
    echo_gain: float, amplitude: float, question_wav: Path
) -> None:
    """Measured at the virtual speaker: the assistant (steady, under the limiter's ceiling) plays at one level until
    the user's question reaches the microphone, then at the duck gain; with an echo of its own in the microphone it
    never ducks itself. Without an echo (headphones, or the virtual devices alone) AEC3 holds the user's voice down
    in the cleaned microphone while the assistant talks: the raw microphone, above the echo, is what tells."""
    import soundfile

    from app.audio.devices import refresh_devices
    from tests.pulse import MIC_FEED, SPEAKER, virtual_devices

    assistant = noise(20.0, amplitude, OUTPUT_SAMPLE_RATE, seed=5)  # peaks under the ceiling: the limiter stays out
    window = 2_205  # 100 ms at the recording's 22.05 kHz
    with virtual_devices() as pulse:
        if echo_gain:
            pulse.pactl(
                "load-module", "module-loopback", f"source={SPEAKER}.monitor", f"sink={MIC_FEED}", "latency_msec=60"
            )
            _set_loop_gain(pulse, echo_gain)
        refresh_devices()
        io = AudioIO(capture=False, duck_while_talking=True, duck_gain=0.2)
        io.start()
        io.set_echo_canceller(EchoCanceller())
        io.start_capture()
        io.talking = True  # hands-free: the microphone is open
        judged: list[bool] = []  # per engine frame: the user speaking
        with pulse.record_speaker() as heard:
            io.play(assistant)
            while len(judged) < 60:  # 4.8 s of the assistant alone, on the engine's clock
                if io.read_frame(timeout=0.5) is not None:
                    judged.append(io.user_speaking)
            alone = len(judged)
            player = pulse.play_into_mic(question_wav, wait=False)
            while player.poll() is None:
                if io.read_frame(timeout=0.5) is not None:
                    judged.append(io.user_speaking)
            io.close()
    samples = heard.samples[np.flatnonzero(np.abs(heard.samples) > 1e-3)[0] :]  # from the assistant's start
    windows = [samples[i : i + window] for i in range(0, samples.size - window, window)]
    # Windows with 10 ms of silence in them are a busy machine's underruns (counted by AudioIO), not ducking.
    levels = np.array([_level_db(w) for w in windows if min(_level_db(p) for p in np.array_split(w, 10)) > -60.0])
    before = levels[: alone * 8 // 10 - 10]  # 100 ms windows well inside the 60 frames (80 ms) of the assistant alone
    full = float(np.median(before))
    ducked = levels[levels < full - 10.0]
    print(
        f"\nhands-free ducking ({echo_gain=}): the assistant alone at {full:.1f} dBFS, {np.sum(before < full - 3)} "
        f"of {before.size} windows below it by 3 dB; {ducked.size} windows ducked, at {np.median(ducked):.1f} dBFS; "
        f"the user judged speaking in {sum(judged[:alone])} frames before the question, {sum(judged[alone:])} during"
    )
    question, rate = soundfile.read(question_wav, dtype="float32")
    voiced_s = sum(_level_db(piece) > -40.0 for piece in np.array_split(question, len(question) // (rate // 10))) / 10
    assert sum(judged[:alone]) == 0 and np.sum(before < full - 10.0) == 0, "the assistant never ducks itself"
    # The whole question, not a word here and there (the hold bridges the gaps between words).
    assert sum(judged[alone:]) * FRAME_SECONDS >= 0.75 * voiced_s, "the user's question was heard as the user"
    assert ducked.size / 10 >= 0.75 * voiced_s, "the speaker was lowered while the user spoke"
    assert float(np.median(ducked)) == pytest.approx(full + 20 * np.log10(0.2), abs=2.0), "by the duck gain"
