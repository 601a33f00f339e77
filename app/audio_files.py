"""Reading and writing audio files for ``parley run``, the self-test and conversation export.

Any format libsndfile reads is accepted; the result is 16 kHz mono float32 for the
engine. What had to be done to get there (downmix, resampling, sample-format
conversion) is reported in ``AudioFile.notes`` so the caller can say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.timeline import INPUT_SAMPLE_RATE


class AudioFileError(ValueError):
    """An audio file cannot be used; the message says why in plain words."""


@dataclass(frozen=True)
class AudioFile:
    samples: np.ndarray  # float32 mono at ``sample_rate``
    sample_rate: int
    source_rate: int
    source_channels: int
    source_subtype: str
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return float(self.samples.shape[0] / self.sample_rate)


def read_audio(path: str | Path, *, target_rate: int = INPUT_SAMPLE_RATE) -> AudioFile:
    """Read ``path`` as mono float32 at ``target_rate`` (soxr high-quality resampling)."""
    import soundfile
    import soxr

    path = Path(path)
    if not path.exists():
        raise AudioFileError(f"{path}: file not found")
    if path.is_dir():
        raise AudioFileError(f"{path}: is a folder, not an audio file")
    try:
        info = soundfile.info(str(path))
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioFileError(f"{path}: not a readable audio file ({exc})") from exc
    if data.shape[0] == 0:
        raise AudioFileError(f"{path}: the file contains no audio")
    if not np.isfinite(data).all():
        raise AudioFileError(f"{path}: the audio contains NaN or infinite samples")
    notes = []
    channels = data.shape[1]
    if channels > 1:
        notes.append(f"mixed {channels} channels down to mono")
    samples = data.mean(axis=1, dtype=np.float32) if channels > 1 else data[:, 0]
    if info.subtype not in ("FLOAT", "DOUBLE", "PCM_16", "PCM_24", "PCM_32"):
        notes.append(f"converted {info.subtype} samples to float")
    if rate != target_rate:
        samples = soxr.resample(samples, rate, target_rate, quality="HQ").astype(np.float32)
        notes.append(f"resampled {rate} Hz to {target_rate} Hz")
    return AudioFile(
        samples=np.ascontiguousarray(samples, dtype=np.float32),
        sample_rate=target_rate,
        source_rate=int(rate),
        source_channels=channels,
        source_subtype=info.subtype,
        notes=notes,
    )


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> Path:
    """Write float samples as 16-bit PCM WAV (clipped to [-1, 1]) through a temporary file."""
    import soundfile

    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        soundfile.write(str(temporary), np.clip(samples, -1.0, 1.0), sample_rate, subtype="PCM_16", format="WAV")
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
