"""The speaker's output chain after the jitter buffer: one gain (ducking × volume, ramped), then the limiter.

:class:`Limiter` is pure (numbers in, numbers out, its only state the gain it is giving back), so the
speaker's callback and whatever keeps the assistant's audio (history, exports) run the same one.
"""

from __future__ import annotations

from typing import Final

import numpy as np

OUTPUT_CEILING_DBFS: Final = -6.0
OUTPUT_CEILING: Final = 10.0 ** (OUTPUT_CEILING_DBFS / 20.0)
"""No sample reaches the speaker louder than this (0.50 of full scale), at any volume."""
LIMITER_RELEASE_DB_PER_S: Final = 20.0  # how fast the limiter gives back gain after a loud block
AUDIBLE_PEAK: Final = 10.0 ** (-45.0 / 20.0)
"""Assistant audio above this peak (-45 dBFS, before the volume) counts as audible: speaking, and the reply's start."""


def peak_of(block: np.ndarray) -> float:
    """The largest magnitude in ``block`` (0 for an empty one)."""
    return max(float(block.max(initial=0.0)), -float(block.min(initial=0.0)))


class Limiter:
    """Peak limiter: a loud block is scaled under the ceiling at once; the gain comes back slowly.

    Each block gets one gain, chosen from its own peak, so no sample exceeds the ceiling (the final
    clip only guards against rounding); in place, allocating nothing. One instance per stream of audio.
    """

    def __init__(self, ceiling: float = OUTPUT_CEILING, release_db_per_s: float = LIMITER_RELEASE_DB_PER_S) -> None:
        self.ceiling = ceiling
        self.release_db_per_s = release_db_per_s
        self.gain = 1.0

    def process(self, block: np.ndarray, rate: int, *, peak: float | None = None) -> None:
        """Limit ``block`` (float32, one channel, at ``rate``) in place.

        ``peak``: the block's peak as the speaker will see it, where that is more than its samples' (at a lower
        rate than the device's, the waveform between samples overshoots them: see :class:`TruePeakLimiter`).
        """
        frames = len(block)
        peak = peak_of(block) if peak is None else max(peak, peak_of(block))
        ceiling = self.ceiling
        wanted = 1.0 if peak * self.gain <= ceiling else ceiling / peak
        if wanted < self.gain:
            self.gain = wanted
        elif self.gain < 1.0:
            recovered = self.gain * 10.0 ** (self.release_db_per_s * frames / rate / 20.0)
            self.gain = min(1.0, recovered, ceiling / peak if peak > 0 else 1.0)
        if self.gain < 1.0:
            block *= self.gain
        np.clip(block, -ceiling, ceiling, out=block)


class GainRamp:
    """The output's one gain (ducking × volume, 0 when muted): a change is ramped over a block, not a click."""

    def __init__(self) -> None:
        self.gain = 1.0  # as last applied

    def apply(self, block: np.ndarray, target: float) -> None:
        """Scale ``block`` in place towards ``target`` (allocates only while ramping)."""
        if self.gain != target:
            block *= np.linspace(self.gain, target, len(block), dtype=np.float32)
            self.gain = target
        elif target != 1.0:
            block *= target


class TruePeakLimiter:
    """The speaker's limiter for audio kept at the engine's rate: each block's gain comes from its peak at twice
    the rate, as the speaker's limiter sees it after the resampler to the device (44.1 or 48 kHz), where the
    waveform between the engine's samples shows (full-scale noise overshoots its samples by about 5 dB)."""

    def __init__(self, rate: int) -> None:
        import soxr

        self.rate = rate
        self._limiter = Limiter()
        self._oversampler = soxr.ResampleStream(rate, 2 * rate, 1, dtype="float32")

    def process(self, block: np.ndarray) -> None:
        """Limit ``block`` (float32 at ``rate``) in place."""
        self._limiter.process(block, self.rate, peak=peak_of(self._oversampler.resample_chunk(block)))
