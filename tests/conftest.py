"""Shared fixtures: seeded tiny random checkpoints (generated once per test session), the spoken question,
and app controllers over a scripted audio device."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.settings import Settings
from engine.loading.random_checkpoint import make_checkpoint

if TYPE_CHECKING:
    from app.controller import AppController
    from tests.fakes import ScriptedAudio

CheckpointFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory) -> CheckpointFactory:
    """``make(quantize=None|4|8, seed=0, size="tiny") -> Path``, cached per argument set."""
    cache: dict[tuple[str, int | None, int], Path] = {}
    root = tmp_path_factory.mktemp("checkpoints")

    def make(quantize: int | None = None, seed: int = 0, size: str = "tiny") -> Path:
        key = (size, quantize, seed)
        if key not in cache:
            label = f"{size}-{'bf16' if quantize is None else f'q{quantize}'}-s{seed}"
            cache[key] = make_checkpoint(root / label, size=size, quantize=quantize, seed=seed)  # type: ignore[arg-type]
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_bf16(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory(None, 0)


@pytest.fixture(scope="session")
def tiny_q4(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory(4, 0)


@pytest.fixture(scope="session")
def tiny_q8(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory(8, 0)


# Parity matrix used by the reference comparisons: bf16 and both quantizations, two seeds.
PARITY_CHECKPOINTS = [(None, 0), (4, 0), (8, 0), (None, 1), (4, 1), (8, 1)]


def parity_id(param: tuple[int | None, int]) -> str:
    quantize, seed = param
    return f"{'bf16' if quantize is None else f'q{quantize}'}-seed{seed}"


QUESTION = "What is the capital of France?"


def synthesize_speech(text: str, out: Path) -> Path:
    """Speak ``text`` with espeak-ng into a 22.05 kHz mono WAV (the CI test voice)."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (packaging/system-deps.sh test installs it)")
    subprocess.run(["espeak-ng", "-w", str(out), text], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """espeak-ng saying the test question, as written (22.05 kHz, 16-bit mono)."""
    return synthesize_speech(QUESTION, tmp_path_factory.mktemp("speech") / "question.wav")


@pytest.fixture(scope="session")
def speech_16k(question_wav: Path) -> np.ndarray:
    """The test question resampled to 16 kHz float32 followed by 1.5 s of silence (about 42 frames)."""
    import soundfile
    import soxr

    samples, rate = soundfile.read(question_wav, dtype="float32")
    samples = soxr.resample(samples, rate, 16_000).astype(np.float32)
    return np.concatenate([samples, np.zeros(24_000, dtype=np.float32)])


@pytest.fixture
def build_controller(tmp_path: Path, speech_16k: np.ndarray) -> Iterator[Callable[..., AppController]]:
    """Makes AppControllers over a scripted microphone and speaker that plays the spoken question (``audio``:
    ScriptedAudio or a subclass), with settings, logs and (``history``) a history folder in the test's
    folder; every one made is shut down after the test. Other keywords go to AppController."""
    from app.controller import AppController
    from tests.fakes import ScriptedAudio

    made: list[AppController] = []

    def build(
        settings: Settings, *, audio: type[ScriptedAudio] = ScriptedAudio, history: bool = True, **kwargs: Any
    ) -> AppController:
        def audio_factory(*args: Any, **options: Any) -> ScriptedAudio:
            return audio(*args, speech=speech_16k, **options)

        kwargs.setdefault("audio_factory", audio_factory)
        if history:
            kwargs.setdefault("history_folder", tmp_path / "history")
        controller = AppController(
            settings, settings_path=tmp_path / "settings.json", auto_demo=False, log_folder=tmp_path / "logs", **kwargs
        )
        made.append(controller)
        return controller

    yield build
    for controller in made:
        controller.shutdown()


def file_mode(path: Path) -> int:
    """A file's or folder's permission bits (what privacy tests compare against 0o600 / 0o700)."""
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """Umask 0: every file and folder would be readable and writable by everyone unless Parley says otherwise."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)
