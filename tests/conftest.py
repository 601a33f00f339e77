"""Shared fixtures: seeded tiny random checkpoints, generated once per test session."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from engine.random_checkpoint import make_checkpoint

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
