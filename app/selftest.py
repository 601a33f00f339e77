"""``parley --self-test``: check an installation end to end, from source or from a bundle.

Steps, each named in the message when it fails:

1. MLX imports and computes. On macOS a Metal kernel runs too, which is what fails in a bundle
   whose ``mlx.metallib`` is missing or not next to the ``libmlx.dylib`` actually loaded.
2. The demo checkpoint is generated into the user data folder unless it is already there
   (``app.demo``), then loaded and warmed up (every per-frame program compiled).
3. ``SELF_TEST_FRAMES`` frames of the bundled spoken question, then silence, stream through the
   whole pipeline (perception, RNN-T, language model, TTS, codec) as the app streams them, and
   every frame's output is checked: one chunk of finite 22.05 kHz audio and one timing record.
4. The answer plays through the app's own audio path (``AudioIO``: default microphone and
   speaker, resampling, jitter buffer) at -20 dB, since the demo's random weights make loud
   noise rather than speech. With no audio device, playback is skipped and the summary says so;
   the self-test still passes. A missing PortAudio library or a speaker that does not play fails.

Success prints one summary line with the realtime factor and exits 0; a failure prints one line
naming the step and the cause (after a traceback, for errors nobody anticipated) and exits 1.

Concurrency: everything runs on the calling thread, which thereby becomes the thread that owns
MLX; while playing, ``AudioIO`` adds its PortAudio callback threads. Nothing here imports Qt.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from engine.timeline import FRAME_MS

from .paths import is_frozen

if TYPE_CHECKING:
    from engine.events import FrameTiming

    from .audio.streams import AudioIO

SELF_TEST_FRAMES = 30  # 2.4 s: the 1.9 s question, then silence
MIN_FRAMES = 25
PLAYBACK_GAIN = 0.1  # -20 dB
PLAYBACK_GRACE_S = 5.0  # beyond the answer's length, before a speaker that does not play counts as broken
DEVICE_DRAIN_S = 0.5  # the device still holds its own buffer when our ring is empty; closing would cut it off
HEALTH_POLL_S = 0.25  # how often playback checks the streams, as the controller does


class SelfTestError(Exception):
    """A step of the self-test failed; ``str(error)`` names the step and the cause."""

    def __init__(self, step: str, cause: str, details: str | None = None) -> None:
        super().__init__(f"{step} failed: {cause}")
        self.step = step
        self.cause = cause
        self.details = details  # a traceback, for failures of an unanticipated kind


@dataclass(frozen=True)
class Playback:
    """What became of the answer's audio."""

    seconds: float  # how much was played; 0 when skipped
    device: str | None  # the speaker it went to
    skipped: str | None = None  # why it was not played
    gain: float = PLAYBACK_GAIN
    underruns: int = 0  # times the speaker starved while it played (a busy machine fed it too late)

    def describe(self) -> str:
        """``played 2.4 s on 'default' at -20 dB`` (``, 1 underrun`` where the speaker starved), or
        ``skipped playback (<why>)``."""
        if self.skipped is not None:
            return f"skipped playback ({self.skipped})"
        played = f"played {self.seconds:.1f} s on '{self.device}' at {20 * np.log10(self.gain):.0f} dB"
        if self.underruns:
            played += f", {self.underruns} underrun{'s' if self.underruns > 1 else ''}"
        return played


@dataclass(frozen=True)
class PipelineRun:
    """The output of streaming the test input through a session."""

    answer: np.ndarray  # float32 at ``sample_rate``: every frame's audio, then the codec's tail
    sample_rate: int
    timings: list[FrameTiming]


@dataclass(frozen=True)
class SelfTestReport:
    """Everything ``run_self_test`` measured."""

    frames: int
    input_seconds: float
    answer: np.ndarray  # the answer as the pipeline produced it (playback applies PLAYBACK_GAIN)
    sample_rate: int
    realtime_factor: float  # mean frame time / 80 ms, cold frames excluded
    p50_ms: float
    device: str
    setup_seconds: float  # generating (first run), loading and warming up the demo checkpoint
    checkpoint: Path
    frozen: bool
    playback: Playback

    def summary(self) -> str:
        """The one line ``parley --self-test`` prints."""
        origin = "bundle" if self.frozen else "source"
        return (
            f"parley self-test passed ({origin}): {self.frames} frames ({self.input_seconds:.1f} s of speech and "
            f"silence) through the demo checkpoint on {self.device} after {self.setup_seconds:.1f} s of setup; "
            f"realtime factor {self.realtime_factor:.2f} (p50 {self.p50_ms:.1f} ms per {FRAME_MS:.0f} ms frame); "
            f"{self.playback.describe()}"
        )


def _message(error: BaseException) -> str:
    from engine.errors import EngineError

    from .audio.devices import AudioUnavailable

    if isinstance(error, (EngineError, AudioUnavailable)):
        return str(error)  # written for users already
    return f"{type(error).__name__}: {error}"


@contextmanager
def _step(name: str, *, hint: str = "") -> Iterator[None]:
    """Turn any failure inside the block into a ``SelfTestError`` for step ``name``."""
    from engine.errors import EngineError

    from .audio.devices import AudioUnavailable

    try:
        yield
    except SelfTestError:
        raise
    except Exception as error:  # the self-test reports every failure, of any kind, as its result
        expected = isinstance(error, (EngineError, AudioUnavailable, OSError))
        details = None if expected else traceback.format_exc()
        raise SelfTestError(name, _message(error) + hint, details) from error


def check_mlx() -> str:
    """Run a small computation (and a Metal kernel on macOS); returns the device MLX runs on, e.g. ``gpu (NVIDIA
    H100 80GB HBM3)``, or on Linux's CPU with why, e.g. ``cpu (x86_64) — no NVIDIA driver (nvidia-smi is not
    installed)``."""
    import mlx.core as mx

    from engine import device_description

    from .cuda_check import device_note

    if sys.platform == "darwin":
        if not mx.metal.is_available():
            raise RuntimeError("Metal is not available; Parley needs a Mac with Apple silicon")
        # Loads mlx.metallib: a bundle without it fails here with "Failed to load the default metallib".
        mx.eval(mx.ones(4, stream=mx.gpu) + 1)
    total = (mx.arange(4) * 2).sum().item()
    if total != 12:
        raise RuntimeError(f"MLX computed 0 + 2 + 4 + 6 = {total}")
    device = device_description()
    note = device_note(device["type"] == "gpu")  # on Linux's CPU, why not the GPU
    return f"{device['type']} ({device['name']})" + (f" — {note}" if note else "")


def stream_test_input(voicechat: Any, frames: int = SELF_TEST_FRAMES) -> PipelineRun:
    """Stream the bundled question (cut or padded with silence to ``frames`` frames) through a new session.

    Raises:
        RuntimeError: a frame's output is not one chunk of finite audio of the expected length plus one
            timing record, or the session did not end properly.
    """
    from engine import FrameProfiler, Session
    from engine.events import AudioChunk, Done, FrameTiming

    from .bench import bench_input

    config = voicechat.config
    size = config.frame_samples
    samples = bench_input(frames)

    session = Session(voicechat, seed=0, hooks=FrameProfiler())
    chunks: list[np.ndarray] = []
    timings: list[FrameTiming] = []
    try:
        for index in range(frames):
            events = session.push(samples[index * size : (index + 1) * size], config.input_sample_rate)
            audio = [event for event in events if isinstance(event, AudioChunk)]
            timing = [event for event in events if isinstance(event, FrameTiming)]
            if len(audio) != 1 or len(timing) != 1:
                raise RuntimeError(
                    f"frame {index} produced {len(audio)} audio chunks and {len(timing)} timing records; "
                    "expected one of each"
                )
            _check_chunk(audio[0], config.output_frame_samples, config.output_sample_rate, f"frame {index}")
            chunks.append(audio[0].samples)
            timings.append(timing[0])
        ending = session.flush()
    finally:
        session.close()
    tail = [event for event in ending if isinstance(event, AudioChunk)]
    if not any(isinstance(event, Done) for event in ending) or len(tail) != 1:
        raise RuntimeError("the session did not end with the codec's tail and a Done event")
    _check_chunk(tail[0], None, config.output_sample_rate, "the codec's tail")
    chunks.append(tail[0].samples)
    return PipelineRun(np.concatenate(chunks).astype(np.float32), config.output_sample_rate, timings)


def _check_chunk(chunk: Any, samples: int | None, rate: int, what: str) -> None:
    if chunk.sample_rate != rate:
        raise RuntimeError(f"{what}: audio at {chunk.sample_rate} Hz, expected {rate} Hz")
    if chunk.samples.ndim != 1 or (samples is not None and chunk.samples.shape[0] != samples):
        raise RuntimeError(f"{what}: audio of shape {chunk.samples.shape}, expected ({samples},)")
    if not np.isfinite(chunk.samples).all():
        raise RuntimeError(f"{what}: the audio contains NaN or infinite samples")


def play_answer(
    samples: np.ndarray,
    sample_rate: int,
    *,
    audio: AudioIO | None = None,
    gain: float = PLAYBACK_GAIN,
    grace_s: float = PLAYBACK_GRACE_S,
) -> Playback:
    """Play ``samples`` (mono, at the engine's output rate) on the default devices and wait until it has played.

    Returns a skipped ``Playback`` when there is no microphone or speaker to open.

    Raises:
        AudioUnavailable: the PortAudio library is missing (a broken installation, not a machine without sound).
        RuntimeError: the speaker did not play the audio within its length plus ``grace_s``, or audio paused.
        ValueError: ``gain`` is not in (0, 1].
    """
    from .audio.devices import NO_PORTAUDIO, AudioUnavailable
    from .audio.streams import AudioIO

    if not 0.0 < gain <= 1.0:
        raise ValueError(f"gain must be in (0, 1], got {gain}")
    seconds = samples.shape[0] / sample_rate
    if audio is None:
        audio = AudioIO(output_ring_s=max(10.0, seconds + 1.0), engine_output_rate=sample_rate, capture=False)
    try:
        audio.start()
    except AudioUnavailable as error:
        if str(error) == NO_PORTAUDIO:
            raise
        return Playback(0.0, None, skipped=str(error))
    try:
        device = audio.output_device_label  # in the user's words: the sound server's description
        audio.play(samples * gain)
        deadline = time.monotonic() + seconds + grace_s
        next_poll = time.monotonic() + HEALTH_POLL_S
        while audio.output_backlog_s > 0:
            now = time.monotonic()
            if now >= deadline:
                played = max(0.0, seconds - audio.output_backlog_s)
                raise RuntimeError(
                    f"the speaker '{device}' played {played:.1f} s of {seconds:.1f} s in {seconds + grace_s:.0f} s"
                )
            if now >= next_poll:
                statuses = audio.poll_health()
                if audio.paused:
                    reason = statuses[-1].message if statuses else "audio paused"
                    raise RuntimeError(f"the speaker '{device}' stopped: {reason}")
                next_poll = now + HEALTH_POLL_S
            time.sleep(0.02)
        time.sleep(DEVICE_DRAIN_S)
        # Queued whole, the clip ends where the queue runs dry; a gap inside it is the device starving.
        return Playback(seconds, device, gain=gain, underruns=audio.output_device_underflows)
    finally:
        audio.close()


def run_self_test(
    *, frames: int = SELF_TEST_FRAMES, checkpoint: Path | None = None, audio: AudioIO | None = None
) -> SelfTestReport:
    """Run every step (see the module docstring); ``checkpoint`` overrides the demo checkpoint's folder.

    Raises:
        SelfTestError: a step failed; the message names it and says why.
        ValueError: ``frames`` is below ``MIN_FRAMES``.
    """
    if frames < MIN_FRAMES:
        raise ValueError(f"the self-test needs at least {MIN_FRAMES} frames, got {frames}")
    started = time.perf_counter()
    with _step("starting MLX"):
        device = check_mlx()
    with _step("preparing the demo checkpoint"):
        from .demo import ensure_demo_checkpoint

        path = ensure_demo_checkpoint(checkpoint)
    hint = f" (delete {path} to have it generated again)"
    with _step(f"loading the demo checkpoint from {path}", hint=hint):
        from engine import load_voicechat, warm_up

        voicechat = load_voicechat(path)
        warm_up(voicechat)
    setup_seconds = time.perf_counter() - started
    with _step("streaming speech through the pipeline"):
        from engine import summarize

        run = stream_test_input(voicechat, frames)
        stats = summarize(run.timings)
    with _step("playing the answer"):
        playback = play_answer(run.answer, run.sample_rate, audio=audio)
    return SelfTestReport(
        frames=frames,
        input_seconds=frames * voicechat.config.frame_samples / voicechat.config.input_sample_rate,
        answer=run.answer,
        sample_rate=run.sample_rate,
        realtime_factor=stats["realtime_factor"],
        p50_ms=stats["stages"]["total"]["p50_ms"],
        device=device,
        setup_seconds=setup_seconds,
        checkpoint=path,
        frozen=is_frozen(),
        playback=playback,
    )


def self_test_command(out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``parley --self-test``: run the self-test, print its one-line result; returns the exit code."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        report = run_self_test()
    except SelfTestError as error:
        if error.details:
            print(error.details, file=err, end="")
        print(f"parley self-test FAILED while {error.step}: {error.cause}", file=err)
        return 1
    print(report.summary(), file=out, flush=True)
    return 0
