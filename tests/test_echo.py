"""Echo cancellation (app/echo.py), measured on an offline echo path with real (espeak-ng) speech.

The path and the measures are in tests/echo_bench.py; docs/echo.md has the figures these tests
print and why the bounds are where they are. Every scenario runs the canceller the way the app will:
the output callback feeds 512-sample playback blocks at 22.05 kHz with their DAC times, the engine
worker cleans 80 ms microphone frames with their ADC times, in time order.

Bounds, and why:
- ERLE ≥ 25 dB (the issue's target on a linear path), measured after the 17 s convergence window of
  3GPP TS 26.132; AEC3 gives about 50 dB, so 25 dB fails only when cancellation really broke.
- Re-convergence after the echo delay jumps by 200 ms: ≤ 4 s until every 0.5 s window in which the
  assistant talks is back at ≥ 20 dB ERLE (measured 2.5 s: AEC3's delay estimator has to find the new
  delay, then the filter re-adapts).
- Double talk at an echo 10 dB below the user's voice: the user's active speech level drops by < 3 dB,
  SI-SDR ≥ 3 dB and correlation ≥ 0.8 against the same speech cleaned while the assistant is silent
  (that reference carries AEC3's own high-pass filter and 8 ms delay, which are not losses). At equal
  levels AEC3's residual suppressor takes about 5 dB: asserted < 7 dB, correlation ≥ 0.6, and reported.
- Self-interruption: with a -65 dBFS microphone noise floor (a quiet room), after AEC3's first 3 s no
  100 ms window of the cleaned microphone is more than 2 dB above the same room with the assistant
  silent; during those first 3 s none exceeds -50 dBFS (the echo itself is about -30 dBFS).
- Drift: a speaker 500 ppm fast (15 ms over the run) keeps ERLE ≥ 25 dB with AEC3 following it inside the
  deadband; 100 ppm over ten minutes is pulled in to within the 20 ms deadband plus the 30 s average's lag;
  timestamps wandering by ±30 ms (as PulseAudio's were) move nothing.
- Cost per 10 ms block: printed, never asserted (wall-clock time on a shared machine).
- End to end through PulseAudio (marked ``audio``): the virtual speaker's monitor is looped back into the
  virtual microphone (module-loopback, 60 ms), real PortAudio streams feed the canceller with PortAudio's own
  DAC and ADC times; after 3 s, ERLE ≥ 25 dB (measured about 50 dB) and no block lacks its reference.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from app import echo as echo_module
from app.echo import (
    BLOCK_SAMPLES,
    CANCELLER_RATE,
    DEFAULT_GUARD_S,
    EchoCanceller,
    echo_cancellation_unavailable,
)
from tests.echo_bench import (
    EchoPath,
    Scenario,
    active_level_loss_db,
    erle_db,
    level_dbfs,
    reconvergence_s,
    run,
    si_sdr_db,
    user_voice,
    window_levels_db,
)

CONVERGENCE_S = 17.0  # 3GPP TS 26.132 discards the first 17 s for the canceller to converge
USER_AT_S = 12.0  # double talk starts here, after the canceller has converged on the assistant alone


def _heard(signals_far: np.ndarray, speaker_rate: float, length: int) -> np.ndarray:
    import soxr

    return soxr.resample(signals_far.astype(np.float64), speaker_rate, CANCELLER_RATE)[:length]


# --------------------------------------------------------------------------- measured on the echo path


@pytest.mark.parametrize("delay_ms", [40, 150, 300])
def test_far_end_single_talk_erle(delay_ms: int) -> None:
    scenario = Scenario(path=EchoPath(delay_s=delay_ms / 1000))
    signals = scenario.signals()
    cleaned, canceller = run(scenario, signals=signals)
    measured = slice(round(CONVERGENCE_S * CANCELLER_RATE), len(cleaned))
    erle = erle_db(signals.echo[measured], cleaned[measured])
    stats = canceller.stats
    print(
        f"\nERLE, echo delay {delay_ms} ms beyond the reported latencies: {erle:.1f} dB after {CONVERGENCE_S:.0f} s; "
        f"cost {stats.cost_per_block_s * 1e6:.0f} µs per 10 ms block (resampling and alignment included)"
    )
    assert erle >= 25.0
    assert stats.reference_missing_blocks == 0
    assert stats.blocks == len(cleaned) // BLOCK_SAMPLES


def test_reconvergence_after_the_echo_delay_jumps() -> None:
    jump_s = 14.0
    scenario = Scenario(path=EchoPath(delay_s=0.06, jump_at_s=jump_s, delay_after_s=0.26))
    signals = scenario.signals()
    cleaned, _ = run(scenario, signals=signals)
    echo = signals.echo[: len(cleaned)]
    heard = _heard(signals.far, signals.speaker_rate, len(cleaned))
    before = slice(round(8 * CANCELLER_RATE), round(jump_s * CANCELLER_RATE))
    seconds = reconvergence_s(echo, cleaned, heard, jump_s)
    after = slice(round((jump_s + seconds) * CANCELLER_RATE), len(cleaned))
    erle_before, erle_after = erle_db(echo[before], cleaned[before]), erle_db(echo[after], cleaned[after])
    print(
        f"\nre-convergence after the echo delay jumped 60 -> 260 ms: {seconds:.1f} s "
        f"(ERLE {erle_before:.1f} dB before, {erle_after:.1f} dB after)"
    )
    assert 0.0 < seconds <= 4.0  # zero would mean the jump was not seen at all: the scenario is broken
    assert erle_after >= 25.0


@pytest.mark.parametrize(
    ("echo_gain_db", "max_loss_db", "min_si_sdr_db", "min_correlation"),
    [(-10.0, 3.0, 3.0, 0.8), (0.0, 7.0, -2.0, 0.6)],
    ids=["echo-10dB-below-user", "echo-as-loud-as-user"],
)
def test_double_talk_keeps_the_user(
    echo_gain_db: float, max_loss_db: float, min_si_sdr_db: float, min_correlation: float
) -> None:
    path = EchoPath(delay_s=0.15, gain_db=echo_gain_db)
    talking = Scenario(path=path, user_at_s=USER_AT_S, noise_dbfs=-70.0)
    signals = talking.signals()
    cleaned, _ = run(talking, signals=signals)
    alone, _ = run(Scenario(path=path, far_end=False, user_at_s=USER_AT_S, noise_dbfs=-70.0))
    user = slice(round(USER_AT_S * CANCELLER_RATE), round(USER_AT_S * CANCELLER_RATE) + len(user_voice()))
    echo_to_user_db = level_dbfs(signals.echo[user]) - level_dbfs(signals.user[user])
    loss = -active_level_loss_db(cleaned[user], alone[user])
    si_sdr, _ = si_sdr_db(cleaned[user], alone[user])
    correlation = float(np.corrcoef(cleaned[user], alone[user])[0, 1])
    print(
        f"\ndouble talk, echo {echo_to_user_db:+.1f} dB against the user: the user loses {loss:.2f} dB, "
        f"SI-SDR {si_sdr:.1f} dB, correlation {correlation:.3f}"
    )
    assert loss < max_loss_db
    assert si_sdr >= min_si_sdr_db
    assert correlation >= min_correlation
    assert abs(echo_to_user_db - echo_gain_db) < 1.0  # the scenario is the one stated


def test_self_interruption_stays_at_the_silent_room_level() -> None:
    path = EchoPath(delay_s=0.15)
    speaking = Scenario(path=path, noise_dbfs=-65.0)
    signals = speaking.signals()
    cleaned, _ = run(speaking, signals=signals)
    silent_room, _ = run(Scenario(path=path, noise_dbfs=-65.0, far_end=False))
    window = CANCELLER_RATE // 10
    cleaned_levels = window_levels_db(cleaned, window)
    room_level = level_dbfs(silent_room)
    settled = 30  # windows: the first 3 s
    print(
        f"\nassistant speaking, user silent: microphone echo {level_dbfs(signals.echo):.1f} dBFS; cleaned "
        f"{level_dbfs(cleaned[settled * window :]):.1f} dBFS after 3 s (loudest 100 ms: "
        f"{cleaned_levels[settled:].max():.1f}), loudest 100 ms in the first 3 s {cleaned_levels[:settled].max():.1f}; "
        f"silent room {room_level:.1f} dBFS"
    )
    assert cleaned_levels[settled:].max() <= room_level + 2.0
    assert cleaned_levels[:settled].max() <= -50.0
    assert level_dbfs(signals.echo) > -35.0  # the scenario has a real echo to remove


def test_clock_drift_is_followed() -> None:
    # 500 ppm, five times a real pair of crystals: 15 ms over the run, all inside the deadband, so what
    # follows it here is AEC3 (the pull itself: test_ten_minutes_of_drift_are_pulled_in).
    drift_ppm = 500.0
    scenario = Scenario(path=EchoPath(delay_s=0.1), drift_ppm=drift_ppm)
    signals = scenario.signals()
    cleaned, canceller = run(scenario, signals=signals)
    measured = slice(round(CONVERGENCE_S * CANCELLER_RATE), len(cleaned))
    erle = erle_db(signals.echo[measured], cleaned[measured])
    expected = drift_ppm * 1e-6 * len(cleaned)  # samples the speaker gained on the microphone
    corrections = canceller.stats.drift_corrections
    print(f"\nspeaker {drift_ppm:.0f} ppm fast: ERLE {erle:.1f} dB, {corrections} samples corrected of {expected:.0f}")
    assert erle >= 25.0
    assert corrections == 0 and expected < echo_module.DRIFT_DEADBAND_S * CANCELLER_RATE


# --------------------------------------------------------------------------- alignment, through a recording backend


class RecordingBackend:
    """Returns the microphone unchanged and keeps every (near, far) pair it was given."""

    def __init__(self) -> None:
        self.near: list[np.ndarray] = []
        self.far: list[np.ndarray] = []
        self.resets = 0

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        self.near.append(near.copy())
        self.far.append(far.copy())
        return near.copy()

    def reset(self) -> None:
        self.resets += 1


def _ramp(start: int, count: int) -> np.ndarray:
    """Sample values that say where they came from: position / 2**20 (exact in float32)."""
    return (np.arange(start, start + count) / float(1 << 20)).astype(np.float32)


def _recording_canceller(**kwargs: float) -> tuple[EchoCanceller, RecordingBackend]:
    backend = RecordingBackend()
    return EchoCanceller(CANCELLER_RATE, backend=backend, **kwargs), backend  # type: ignore[arg-type]


def test_the_microphone_is_paired_with_the_reference_heard_at_its_time_plus_the_guard() -> None:
    canceller, backend = _recording_canceller()
    t0 = 500.0
    # Playback at 16 kHz (no resampling), fed 50 ms ahead of when it is heard.
    for block in range(40):
        canceller.feed_playback(_ramp(block * 160, 160), dac_time=t0 + block * 0.01)
    cleaned = canceller.clean_capture(np.zeros(1280, np.float32), adc_time=t0 + 0.1)
    assert len(cleaned) == 1280
    guard = round(DEFAULT_GUARD_S * CANCELLER_RATE)
    for index, far in enumerate(backend.far):
        first = round(0.1 * CANCELLER_RATE) + index * 160 + guard
        np.testing.assert_array_equal(far, _ramp(first, 160))


def test_chunks_of_any_length_come_back_as_whole_blocks_in_order() -> None:
    canceller, _ = _recording_canceller()
    microphone = _ramp(0, 4000)
    outputs, offset = [], 0
    for size in (100, 61, 1280, 7, 1000, 1552):
        outputs.append(canceller.clean_capture(microphone[offset : offset + size], adc_time=10.0 + offset / 16000))
        offset += size
        assert sum(len(o) for o in outputs) == offset // 160 * 160  # whatever is short of a block waits
    np.testing.assert_array_equal(np.concatenate(outputs), microphone[: offset // 160 * 160])


def test_a_pause_in_playback_reads_as_silence_and_playback_resumes_in_place() -> None:
    canceller, backend = _recording_canceller(guard_s=0.0)
    canceller.feed_playback(np.ones(1600, np.float32), dac_time=20.0)  # 20.0 .. 20.1 s
    canceller.feed_playback(np.full(1600, 2.0, np.float32), dac_time=20.5)  # 20.5 .. 20.6 s, after a pause
    canceller.clean_capture(np.zeros(16 * 160, np.float32), adc_time=20.05)  # 20.05 .. 20.21 s
    canceller.clean_capture(np.zeros(37 * 160, np.float32), adc_time=20.21)  # 20.21 .. 20.58 s
    far = np.concatenate(backend.far)
    np.testing.assert_array_equal(far[:800], 1.0)  # 20.05 .. 20.10
    np.testing.assert_array_equal(far[800:7200], 0.0)  # the pause
    np.testing.assert_array_equal(far[7200:], 2.0)  # 20.5 .. 20.58: the second chunk, where it was heard
    assert canceller.stats.resyncs == 3  # first playback chunk, first capture chunk, the end of the pause


def test_a_reference_not_fed_yet_counts_as_missing() -> None:
    canceller, backend = _recording_canceller()
    canceller.feed_playback(np.ones(160, np.float32), dac_time=30.0)
    canceller.clean_capture(np.zeros(320, np.float32), adc_time=31.0)  # a second after anything was fed
    stats = canceller.stats
    assert (stats.reference_blocks, stats.reference_missing_blocks) == (0, 2)
    assert stats.reference_lead_s < -0.9
    np.testing.assert_array_equal(np.concatenate(backend.far), 0.0)


class PassThrough:
    """A backend that only passes the microphone through: for long runs of the alignment alone."""

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        return near

    def reset(self) -> None:
        pass


def _run_timestamps(seconds: float, dac_error: Callable[[float], float], speaker_ppm: float = 0.0) -> EchoCanceller:
    """Feed and clean silence in 80 ms chunks for ``seconds``, with the playback's DAC times off by ``dac_error(t)``."""
    canceller = EchoCanceller(CANCELLER_RATE, backend=PassThrough())
    silence = np.zeros(1280, np.float32)
    for chunk in range(round(seconds / 0.08)):
        t = 50.0 + chunk * 0.08
        heard = 50.0 + chunk * 0.08 / (1 + speaker_ppm * 1e-6)  # a fast speaker plays its 80 ms sooner
        canceller.feed_playback(silence, dac_time=heard + dac_error(t - 50.0))
        canceller.clean_capture(silence, adc_time=t)
    return canceller


def test_wandering_timestamps_move_nothing() -> None:
    # What PulseAudio's ALSA plugin reported: times wandering by tens of ms against the sample count.
    rng = np.random.default_rng(3)
    wander = _run_timestamps(120.0, lambda t: 0.03 * np.sin(2 * np.pi * t / 8.0) + rng.uniform(-0.0015, 0.0015))
    assert wander.stats.drift_corrections == 0
    assert wander.stats.resyncs == 2  # each stream's first chunk


def test_ten_minutes_of_drift_are_pulled_in() -> None:
    ppm = 100.0  # a realistic pair of crystals: 60 ms over a 10-minute conversation
    canceller = _run_timestamps(600.0, lambda t: 0.0, speaker_ppm=ppm)
    drifted = ppm * 1e-6 * 600.0 * CANCELLER_RATE  # 960 samples
    # The pull stops at the deadband and lags by what the 30 s average has not seen yet (1.6 samples/s).
    deadband = echo_module.DRIFT_DEADBAND_S * CANCELLER_RATE
    lag = ppm * 1e-6 * CANCELLER_RATE * echo_module.TIMING_SMOOTHING_S
    corrections = canceller.stats.drift_corrections
    print(f"\n{ppm:.0f} ppm over 10 minutes: {drifted:.0f} samples drifted, {corrections} corrected")
    assert drifted - deadband - lag - 20 <= corrections <= drifted - deadband + 20
    assert canceller.stats.resyncs == 2


def test_times_from_two_clocks_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    canceller, _ = _recording_canceller()
    with caplog.at_level(logging.WARNING, logger="app.echo"):
        canceller.feed_playback(np.zeros(1600, np.float32), dac_time=1_796_081_886.5)  # PortAudio's clock
        canceller.clean_capture(np.zeros(1280, np.float32), adc_time=12.0)  # time.monotonic()
        canceller.clean_capture(np.zeros(1280, np.float32), adc_time=12.08)
    assert [r.message for r in caplog.records if "not on one clock" in r.message] != []
    assert len(caplog.records) == 1  # once


def test_non_finite_samples_never_reach_the_canceller() -> None:
    canceller, backend = _recording_canceller()
    noisy = np.zeros(320, np.float32)
    noisy[[3, 50, 200]] = [np.nan, np.inf, -np.inf]
    canceller.feed_playback(noisy, dac_time=5.0)
    canceller.clean_capture(noisy, adc_time=5.0)
    assert np.isfinite(np.concatenate(backend.near)).all()
    assert np.isfinite(np.concatenate(backend.far)).all()


def test_reset_forgets_timing_and_the_echo_path() -> None:
    canceller, backend = _recording_canceller()
    canceller.feed_playback(np.ones(1600, np.float32), dac_time=1.0)
    canceller.clean_capture(np.zeros(1600, np.float32), adc_time=1.0)
    canceller.reset()
    assert backend.resets == 1
    assert canceller.stats.blocks == 0
    canceller.clean_capture(np.zeros(160, np.float32), adc_time=1.2)  # the old reference is gone
    np.testing.assert_array_equal(backend.far[-1], 0.0)


def test_feeding_and_cleaning_from_two_threads() -> None:
    canceller = EchoCanceller()  # the real AEC3: one producer thread, one consumer thread
    voice = np.sin(np.arange(22050 * 2) * 0.05).astype(np.float32) * 0.3
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for start in range(0, len(voice), 512):
                canceller.feed_playback(voice[start : start + 512], dac_time=100.0 + start / 22050)
        except Exception as error:  # noqa: BLE001 - reported below; a thread's exception would otherwise vanish
            errors.append(error)

    producer = threading.Thread(target=produce)
    producer.start()
    cleaned = [canceller.clean_capture(np.zeros(1280, np.float32), adc_time=100.0 + i * 0.08) for i in range(25)]
    producer.join()
    assert not errors
    assert sum(len(c) for c in cleaned) == 25 * 1280
    assert canceller.stats.blocks == 200


def test_availability_is_reported_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    assert echo_cancellation_unavailable() is None
    import builtins

    real_import = builtins.__import__

    def failing_import(name: str, *args: object, **kwargs: object) -> object:
        if name == "pywebrtc_audio":
            raise ImportError("no wheel for this platform")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", failing_import)
    reason = echo_cancellation_unavailable()
    assert reason is not None
    assert "headphones" in reason and "no wheel for this platform" in reason


# --------------------------------------------------------------------------- end to end through PulseAudio


@pytest.mark.audio
def test_echo_is_cancelled_through_real_streams_and_a_pulseaudio_loop() -> None:
    from app.audio.devices import refresh_devices
    from tests.echo_bench import assistant_voice
    from tests.pulse import MIC_FEED, SPEAKER, virtual_devices

    seconds = 7
    voice = assistant_voice()[: 22_050 * seconds] * 0.5
    with virtual_devices() as pulse:
        # The speaker's sound comes back into the microphone, as from a laptop's speakers.
        pulse.pactl(
            "load-module", "module-loopback", f"source={SPEAKER}.monitor", f"sink={MIC_FEED}", "latency_msec=60"
        )
        refresh_devices()
        import sounddevice

        canceller = EchoCanceller()
        played = [0]
        captured: queue.Queue[tuple[np.ndarray, float]] = queue.Queue()

        def play(outdata: np.ndarray, frames: int, times: object, status: object) -> None:
            block = np.zeros(frames, np.float32)
            chunk = voice[played[0] : played[0] + frames]
            block[: len(chunk)] = chunk
            played[0] += frames
            outdata[:, 0] = block
            canceller.feed_playback(block, dac_time=times.outputBufferDacTime)  # type: ignore[attr-defined]

        def record(indata: np.ndarray, frames: int, times: object, status: object) -> None:
            captured.put((indata[:, 0].copy(), times.inputBufferAdcTime))  # type: ignore[attr-defined]

        microphone, cleaned = [], []
        with (
            sounddevice.InputStream(samplerate=16_000, channels=1, blocksize=1280, dtype="float32", callback=record),
            sounddevice.OutputStream(samplerate=22_050, channels=1, blocksize=512, dtype="float32", callback=play),
        ):
            deadline = time.monotonic() + seconds + 0.5
            while time.monotonic() < deadline:  # the engine worker's side: clean each 80 ms frame
                try:
                    frame, adc_time = captured.get(timeout=0.5)
                except queue.Empty:
                    continue
                microphone.append(frame)
                cleaned.append(canceller.clean_capture(frame, adc_time=adc_time))
    mic, out = np.concatenate(microphone), np.concatenate(cleaned)
    measured = slice(3 * CANCELLER_RATE, (seconds - 1) * CANCELLER_RATE)
    erle = level_dbfs(mic[measured]) - level_dbfs(out[measured])
    stats = canceller.stats
    print(
        f"\nPulseAudio loop: microphone {level_dbfs(mic[measured]):.1f} dBFS, cleaned {level_dbfs(out[measured]):.1f} "
        f"dBFS: ERLE {erle:.1f} dB; {stats.drift_corrections} samples of drift corrected, "
        f"reference lead {stats.reference_lead_s * 1000:.0f} ms, missing for {stats.reference_missing_blocks} of "
        f"{stats.blocks} blocks"
    )
    assert level_dbfs(mic[measured]) > -40.0  # the loop did bring the speaker into the microphone
    assert erle >= 25.0
    # Paired on one timeline, the reference is there when each block is cleaned; a busy machine's late playback
    # callback may leave a few blocks without it (cleaned against silence, counted). A timeline that paired the
    # streams wrongly would miss most blocks.
    assert stats.reference_missing_blocks <= stats.blocks // 20, stats
