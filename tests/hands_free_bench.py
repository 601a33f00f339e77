"""Hands-free in the whole app, measured: what the engine hears while the assistant talks, and of the user.

``python -m tests.hands_free_bench [--echo-gain G] [--user-at S] [--no-ducking] [--assistant speech|model]``

The real controller, engine worker (a tiny random checkpoint) and AudioIO run hands-free on the PulseAudio
virtual devices (tests/pulse.py), the virtual speaker looped back into the virtual microphone after 60 ms
at a linear gain ``G`` (0 is headphones: no echo at all). The microphone opens at once; ``S`` seconds later
the spoken test question is played into the microphone, over the assistant. Printed: the echo at the
microphone and what the engine heard, per half second; then the user's level loss and correlation against
the question as said. ``--assistant speech`` replaces the model's output (the random weights' noise) by
espeak speech, as the real model talks. docs/echo.md ("In the app") has the figures.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile
import soxr

from app.audio.devices import refresh_devices
from app.audio_port import AudioPort
from app.controller import AppController
from app.echo import EchoCanceller
from app.messages import ModelLoaded
from app.settings import Settings
from engine.loading.random_checkpoint import make_checkpoint
from tests.conftest import QUESTION, synthesize_speech
from tests.echo_bench import assistant_voice
from tests.pulse import MIC_FEED, SPEAKER, virtual_devices, xcorr_match
from tests.test_controller import wait_for

RATE = 16_000


class Tap(EchoCanceller):
    """The real canceller, keeping each frame before and after cleaning."""

    frames: list[tuple[np.ndarray, np.ndarray]]

    def __init__(self) -> None:
        super().__init__()
        Tap.frames = []

    def clean_capture(self, samples: np.ndarray, *, adc_time: float | None = None) -> np.ndarray:
        cleaned = super().clean_capture(samples, adc_time=adc_time)
        Tap.frames.append((np.array(samples), np.array(cleaned)))
        return cleaned


def level(samples: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.square(samples, dtype=np.float64))) + 1e-12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--echo-gain", type=float, default=0.6, help="the loop's linear gain (0: headphones)")
    parser.add_argument("--user-at", type=float, default=12.0, help="seconds before the user speaks")
    parser.add_argument("--no-ducking", action="store_true")
    parser.add_argument("--assistant", choices=("speech", "model"), default="speech")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp())
    checkpoint = make_checkpoint(work / "q4", size="tiny", quantize=4, seed=0)
    wav = synthesize_speech(QUESTION, work / "question.wav")
    if args.assistant == "speech":
        voice, position, play = assistant_voice(), [0], AudioPort.play

        def speak(self: AudioPort, samples: np.ndarray) -> None:
            start = position[0] % len(voice)
            position[0] += len(samples)
            play(self, np.resize(voice[start : start + len(samples)], len(samples)).astype(np.float32))

        AudioPort.play = speak  # type: ignore[method-assign]
    with virtual_devices() as pulse:
        pulse.pactl(
            "load-module", "module-loopback", f"source={SPEAKER}.monitor", f"sink={MIC_FEED}", "latency_msec=60"
        )
        for line in pulse.pactl("list", "short", "sink-inputs").splitlines():
            if line.split()[3] == "module-loopback.c":
                pulse.pactl("set-sink-input-volume", line.split()[0], f"{args.echo_gain}")
        refresh_devices()
        settings = Settings(
            checkpoints={"4bit": checkpoint},
            active_variant="4bit",
            hands_free=True,
            ducking=not args.no_ducking,
            idle_pause=False,
        )
        controller = AppController(
            settings,
            settings_path=work / "settings.json",
            log_folder=work / "logs",
            history_folder=work / "history",
            auto_demo=False,
            echo_factory=Tap,
        )
        try:
            controller.start()
            wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen), timeout=300)
            controller.set_talking(True)
            opened = time.monotonic()
            wait_for(controller, lambda _: time.monotonic() - opened > args.user_at, timeout=args.user_at + 60)
            pulse.play_into_mic(wav, wait=True)
            wait_for(controller, lambda _: time.monotonic() - opened > args.user_at + 3, timeout=60)
            stats = controller._echo.stats if controller._echo is not None else None
        finally:
            controller.shutdown()
    heard, _ = controller.recording.snapshot()
    raw = np.concatenate([before for before, _ in Tap.frames])
    for start in range(0, len(raw) - RATE // 2, RATE // 2):
        part = slice(start, start + RATE // 2)
        print(f"{start / RATE:5.1f} s  microphone {level(raw[part]):6.1f} dBFS  engine heard {level(heard[part]):6.1f}")
    question, rate = soundfile.read(wav, dtype="float32")
    question = soxr.resample(question, rate, RATE).astype(np.float32)
    lag, r = xcorr_match(question, heard)
    said = np.abs(question) > 0.01
    segment = heard[lag : lag + len(question)]
    echo_only = raw[max(0, round((args.user_at - 3) * RATE)) : round((args.user_at - 0.5) * RATE)]
    print(
        f"echo at the microphone {level(echo_only):.1f} dBFS, user {level(question[said]):.1f} dBFS; engine heard "
        f"the user at {level(segment[said]):.1f} dBFS: loss {level(question[said]) - level(segment[said]):.1f} dB, "
        f"correlation {r:.2f} at {lag / RATE:.2f} s; {stats}"
    )


if __name__ == "__main__":
    main()
