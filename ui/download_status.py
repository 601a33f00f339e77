"""Download progress in words: bytes done of total, smoothed speed and time left (no Qt)."""

from __future__ import annotations

from typing import NamedTuple

from app.messages import DownloadProgress


def format_bytes(count: float) -> str:
    """``1.5 GB``, ``320.0 MB``, ``12.0 kB`` (decimal units, as download sizes are quoted)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


class DownloadView(NamedTuple):
    fraction: float | None  # None while the total size is unknown
    text: str


class DownloadStatus:
    """Turns successive ``DownloadProgress`` messages into a progress fraction and a status line."""

    SAMPLE_S = 0.5  # measure the speed over at least this long
    SMOOTHING = 0.2

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None
        self.rate = 0.0  # bytes per second

    def reset(self) -> None:
        self._last = None
        self.rate = 0.0

    def update(self, progress: DownloadProgress, now: float) -> DownloadView:
        self._measure(progress.downloaded_bytes, now)
        done = format_bytes(progress.downloaded_bytes)
        if not progress.total_bytes:
            parts = [f"{done} downloaded"]
            fraction = None
        else:
            fraction = min(1.0, progress.downloaded_bytes / progress.total_bytes)
            parts = [f"{done} of {format_bytes(progress.total_bytes)} ({fraction:.0%})"]
            if self.rate > 0:
                left = max(0, progress.total_bytes - progress.downloaded_bytes) / self.rate
                parts.append(f"{format_bytes(self.rate)}/s, about {format_duration(left)} left")
        if progress.message:
            parts.append(progress.message)
        return DownloadView(fraction, " · ".join(parts))

    def _measure(self, downloaded: int, now: float) -> None:
        if self._last is None:
            self._last = (now, downloaded)
            return
        then, before = self._last
        if now - then < self.SAMPLE_S:
            return
        sample = max(0.0, (downloaded - before) / (now - then))
        self.rate = sample if self.rate == 0 else (1 - self.SMOOTHING) * self.rate + self.SMOOTHING * sample
        self._last = (now, downloaded)
