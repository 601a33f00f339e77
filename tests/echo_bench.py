"""An offline echo path and the measures for the echo canceller (used by tests/test_echo.py and tests/echo_compare.py).

The simulation follows what happens at the devices, in one "true" clock:

* the speaker plays the assistant's 22.05 kHz voice from ``START_S`` on; its crystal may run
  ``drift_ppm`` fast, so the acoustic signal is the voice stretched accordingly;
* the room: a delay (the echo path beyond what the devices report: 40–300 ms), a room impulse
  response (direct sound, two early reflections, an exponentially decaying diffuse tail) and an
  attenuation; the microphone adds the user's voice and its own noise, at 16 kHz;
* the audio layer: the output callback feeds each playback block ``output_latency_s`` before it is
  heard, with its DAC time; the engine worker cleans the microphone in 80 ms frames once a frame is
  complete and has travelled ``input_latency_s``, with its ADC time. Events run in time order, so the
  canceller sees exactly the reference a real run would have fed by then.

Speech comes from espeak-ng (22.05 kHz, the codec's rate), two different voices for the assistant and
the user, cached per process.
"""

from __future__ import annotations

import functools
import heapq
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile
import soxr

from app.echo import CANCELLER_RATE, EchoCanceller

PLAYBACK_RATE = 22_050
START_S = 1000.0  # the true clock's time when both streams start (any value: only differences matter)
FRAME = 1280  # the engine's 80 ms frame at 16 kHz

ASSISTANT_TEXT = (
    "Paris is the capital of France. It sits on the river Seine in the north of the country, and it has been "
    "the seat of the French government for most of the last thousand years. The city is known for its museums, "
    "its cafes and its long avenues. About two million people live in the city itself, and more than twelve "
    "million in the wider region around it. Visitors come for the art, the food and the architecture, and many "
    "of them climb the Eiffel tower, which was built for the world fair of eighteen eighty nine."
)
USER_TEXT = (
    "Wait, stop for a moment. I wanted to ask about the weather tomorrow, is it going to rain in the morning "
    "or only later in the afternoon?"
)


@functools.cache
def espeak(text: str, voice: str, pitch: int, speed: int) -> np.ndarray:
    """``text`` spoken by espeak-ng: float32 mono at 22.05 kHz."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (packaging/system-deps.sh test installs it)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "speech.wav"
        command = ["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "-w", str(path), text]
        subprocess.run(command, check=True, capture_output=True)
        samples, rate = soundfile.read(path, dtype="float32")
    assert rate == PLAYBACK_RATE, rate
    return samples


def assistant_voice() -> np.ndarray:
    """About 30 s of the assistant talking, 22.05 kHz, about -21 dBFS RMS."""
    return espeak(ASSISTANT_TEXT, "en-us", 50, 165)


def user_voice() -> np.ndarray:
    """About 9 s of the user talking, 16 kHz (the microphone's rate), about -21 dBFS RMS."""
    voice = espeak(USER_TEXT, "en-gb", 30, 150).astype(np.float64)
    return soxr.resample(voice, PLAYBACK_RATE, CANCELLER_RATE, quality="VHQ").astype(np.float32)


def room_impulse_response(rt60_s: float = 0.3, direct_to_reverb_db: float = 6.0, seed: int = 1) -> np.ndarray:
    """A room-like impulse response at 16 kHz, unit energy: a desk, a laptop's speakers and microphone."""
    rng = np.random.default_rng(seed)
    length = int(rt60_s * CANCELLER_RATE)
    t = np.arange(length) / CANCELLER_RATE
    tail = rng.standard_normal(length) * np.exp(-6.9 * t / rt60_s)  # -60 dB at rt60
    tail[:48] = 0.0  # the diffuse tail starts 3 ms after the direct sound
    early = np.zeros(length)
    early[16], early[16 + 37], early[16 + 90] = 1.0, 0.4, -0.3  # direct sound (1 ms), desk, wall
    direct = float(np.sum(early**2))
    tail *= np.sqrt(direct / float(np.sum(tail**2)) / 10 ** (direct_to_reverb_db / 10))
    response = early + tail
    return response / np.sqrt(np.sum(response**2))


def convolve(signal: np.ndarray, response: np.ndarray) -> np.ndarray:
    """Full linear convolution through the FFT (numpy only)."""
    length = len(signal) + len(response) - 1
    size = 1 << (length - 1).bit_length()
    spectrum = np.fft.rfft(signal.astype(np.float64), size) * np.fft.rfft(response.astype(np.float64), size)
    return np.fft.irfft(spectrum, size)[:length]


@dataclass
class EchoPath:
    """What the microphone picks up of the speaker: delay, room, attenuation; optionally a delay jump."""

    delay_s: float = 0.1
    gain_db: float = -10.0  # the echo's level relative to the played voice
    rt60_s: float = 0.3
    direct_to_reverb_db: float = 6.0
    jump_at_s: float | None = None  # from here on the delay is ``delay_after_s``
    delay_after_s: float = 0.0

    def apply(self, heard: np.ndarray) -> np.ndarray:
        """The echo at the microphone (16 kHz, true time) of ``heard`` (what the speaker emitted, 16 kHz)."""
        room = convolve(heard, room_impulse_response(self.rt60_s, self.direct_to_reverb_db))
        room = room[: len(heard)] * 10 ** (self.gain_db / 20)

        def delayed(delay_s: float) -> np.ndarray:
            shift = round(delay_s * CANCELLER_RATE)
            return np.concatenate([np.zeros(shift), room])[: len(heard)]

        echo = delayed(self.delay_s)
        if self.jump_at_s is not None:
            cut = round(self.jump_at_s * CANCELLER_RATE)
            echo[cut:] = delayed(self.delay_after_s)[cut:]
        return echo.astype(np.float32)


@dataclass
class Scenario:
    """One simulated session: who talks when, the echo path, the devices' timing."""

    path: EchoPath = field(default_factory=EchoPath)
    far_end: bool = True  # the assistant speaks from the start
    user_at_s: float | None = None  # the user starts talking here (double talk)
    user_gain_db: float = 0.0
    noise_dbfs: float | None = None  # the microphone's own noise (a quiet room: about -65 dBFS)
    drift_ppm: float = 0.0  # the speaker's clock runs this much fast against the microphone's
    output_latency_s: float = 0.03  # from the output callback to the speaker
    input_latency_s: float = 0.02  # from the microphone to the input callback
    reported_error_s: float = 0.0  # the devices' reported timing is off by this much (positive: too late)
    playback_block: int = 512  # the output callback's block, at 22.05 kHz
    seed: int = 0

    def signals(self) -> Signals:
        far = assistant_voice() if self.far_end else np.zeros_like(assistant_voice())
        # The speaker's clock: sample i is heard at START_S + i / (rate * (1 + drift)).
        speaker_rate = PLAYBACK_RATE * (1 + self.drift_ppm * 1e-6)
        heard = soxr.resample(far.astype(np.float64), speaker_rate, CANCELLER_RATE, quality="VHQ")
        echo = self.path.apply(heard)
        length = len(echo) - len(echo) % FRAME
        echo = echo[:length]
        user = np.zeros(length, dtype=np.float32)
        if self.user_at_s is not None:
            voice = user_voice() * 10 ** (self.user_gain_db / 20)
            start = round(self.user_at_s * CANCELLER_RATE)
            end = min(length, start + len(voice))
            user[start:end] = voice[: end - start]
        noise = np.zeros(length, dtype=np.float32)
        if self.noise_dbfs is not None:
            rng = np.random.default_rng(self.seed)
            noise = (rng.standard_normal(length) * 10 ** (self.noise_dbfs / 20)).astype(np.float32)
        return Signals(far=far, echo=echo, user=user, noise=noise, speaker_rate=speaker_rate)


@dataclass
class Signals:
    far: np.ndarray  # what the assistant said, 22.05 kHz (the reference fed to the canceller)
    echo: np.ndarray  # its echo at the microphone, 16 kHz
    user: np.ndarray  # the user's voice at the microphone, 16 kHz
    noise: np.ndarray  # the microphone's noise, 16 kHz
    speaker_rate: float  # the speaker's true sample rate

    @property
    def microphone(self) -> np.ndarray:
        return self.echo + self.user + self.noise


def run(
    scenario: Scenario,
    canceller_factory: Callable[[], EchoCanceller] | None = None,
    *,
    microphone: np.ndarray | None = None,
    signals: Signals | None = None,
) -> tuple[np.ndarray, EchoCanceller]:
    """Run the scenario's devices through a canceller; returns the cleaned microphone (16 kHz) and the canceller.

    ``microphone`` replaces the scenario's microphone signal (the same reference is still played).
    """
    signals = signals or scenario.signals()
    mic = signals.microphone if microphone is None else microphone
    canceller = (canceller_factory or EchoCanceller)()
    events: list[tuple[float, int, int]] = []  # (when the callback runs, kind, index); kind 0 = playback
    block = scenario.playback_block
    for start in range(0, len(signals.far), block):
        heard_at = START_S + start / signals.speaker_rate
        heapq.heappush(events, (heard_at - scenario.output_latency_s, 0, start))
    for start in range(0, len(mic), FRAME):
        complete_at = START_S + (start + FRAME) / CANCELLER_RATE
        heapq.heappush(events, (complete_at + scenario.input_latency_s, 1, start))
    cleaned: list[np.ndarray] = []
    while events:
        _, kind, start = heapq.heappop(events)
        if kind == 0:
            dac_time = START_S + start / signals.speaker_rate + scenario.reported_error_s
            canceller.feed_playback(signals.far[start : start + block], rate=PLAYBACK_RATE, dac_time=dac_time)
        else:
            adc_time = START_S + start / CANCELLER_RATE
            cleaned.append(canceller.clean_capture(mic[start : start + FRAME], adc_time=adc_time))
    return np.concatenate(cleaned), canceller


# --------------------------------------------------------------------------- measures


def level_dbfs(samples: np.ndarray) -> float:
    """RMS level in dB relative to full scale (a full-scale sine is -3 dBFS)."""
    return float(10 * np.log10(np.mean(np.square(samples, dtype=np.float64)) + 1e-20))


def erle_db(echo: np.ndarray, cleaned: np.ndarray) -> float:
    """Echo return loss enhancement: echo energy in, over residual energy out (far-end single talk)."""
    echo_energy = np.sum(np.square(echo, dtype=np.float64))
    return float(10 * np.log10(echo_energy / (np.sum(np.square(cleaned, dtype=np.float64)) + 1e-20)))


def window_levels_db(samples: np.ndarray, window: int) -> np.ndarray:
    count = len(samples) // window
    frames = samples[: count * window].astype(np.float64).reshape(count, window)
    return 10 * np.log10(np.mean(frames**2, axis=1) + 1e-20)


def reconvergence_s(
    echo: np.ndarray, cleaned: np.ndarray, far_heard: np.ndarray, jump_s: float, *, threshold_db: float = 20.0
) -> float:
    """Seconds after ``jump_s`` until every later 0.5 s window in which the assistant talks keeps ERLE ≥ threshold."""
    window = CANCELLER_RATE // 2
    erle = window_levels_db(echo, window) - window_levels_db(cleaned, window)
    talking = window_levels_db(far_heard, window) > -40.0
    first = int(np.ceil(jump_s * CANCELLER_RATE / window))
    failing = [index for index in range(first, len(erle)) if talking[index] and erle[index] < threshold_db]
    return (failing[-1] + 1 - jump_s * CANCELLER_RATE / window) * window / CANCELLER_RATE if failing else 0.0


def si_sdr_db(estimate: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Scale-invariant SDR of ``estimate`` against ``reference`` and the scale (gain, dB) it found."""
    est, ref = estimate.astype(np.float64), reference.astype(np.float64)
    scale = float(np.dot(est, ref) / np.dot(ref, ref))
    error = est - scale * ref
    return float(10 * np.log10(np.sum((scale * ref) ** 2) / np.sum(error**2))), float(20 * np.log10(abs(scale)))


def active_level_loss_db(processed: np.ndarray, reference: np.ndarray, frame: int = 320) -> float:
    """Level of ``processed`` against ``reference`` over the reference's active 20 ms frames (P.56-like)."""
    ref_levels = window_levels_db(reference, frame)
    active = ref_levels > ref_levels.max() - 35.0  # the speech, not its pauses
    count = len(ref_levels)
    ref_frames = reference[: count * frame].astype(np.float64).reshape(count, frame)[active]
    out_frames = processed[: count * frame].astype(np.float64).reshape(count, frame)[active]
    return float(10 * np.log10(np.sum(out_frames**2) / np.sum(ref_frames**2)))
