"""The speed check's words: how a measured frame time compares with the 80 ms budget, said for the variant that
was measured, and the live window of frame times the status line reports."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.events import FrameTiming
from engine.timeline import FRAME_MS

from .variants import Q4, Variant

STATS_WINDOW = 100  # frames behind the overlay's live p50 / p95 / realtime factor


@dataclass
class FrameWindow:
    """The last frames' timings, for live statistics."""

    totals: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))

    def add(self, timing: FrameTiming) -> tuple[float, float, float]:
        from engine import percentile

        self.totals.append(timing.total_ms)
        totals = list(self.totals)
        return percentile(totals, 0.5), percentile(totals, 0.95), sum(totals) / len(totals) / FRAME_MS


def speed_verdict(realtime_factor: float, variant: Variant, *, random_weights: bool = False) -> str:
    """The speed check in plain words, with advice that fits the variant that was measured."""
    share = f"{realtime_factor:.0%} of its {FRAME_MS:.0f} ms"
    if variant.demo:
        return (
            f"The tiny demo model takes {share} per frame here. The real model is far larger, "
            "so this says little about how it will run: load it to find out."
        )
    if random_weights:
        return (
            f"This checkpoint has random weights, so it makes noise, not speech; a frame of a model of its shapes "
            f"takes {share} here."
        )
    if realtime_factor < 0.6:
        return f"This machine keeps up easily: a frame takes {share}."
    if realtime_factor < 0.9:
        return f"This machine keeps up: a frame takes {share} (little headroom)."
    if realtime_factor < 1.0:
        return f"This machine only just keeps up ({realtime_factor:.0%} of real time); expect occasional lag."
    advice = "try the 4-bit model or a faster machine" if variant != Q4 else "try a faster machine"
    return (
        f"This machine is too slow for live conversation: each {FRAME_MS:.0f} ms frame takes "
        f"{realtime_factor * FRAME_MS:.0f} ms. The assistant will fall behind; {advice}."
    )


def numerics_advice(exact_rtf: float, fast_rtf: float) -> str | None:
    """Advice to switch to fast numerics, when exact does not keep up here and fast would; else None."""
    if exact_rtf <= 1.0 or fast_rtf >= 1.0 or fast_rtf >= exact_rtf:
        return None
    return (
        f"Exact numerics do not keep up on this machine: each {FRAME_MS:.0f} ms frame takes "
        f"{exact_rtf * FRAME_MS:.0f} ms. Fast numerics would ({fast_rtf * FRAME_MS:.0f} ms): they use fused GPU "
        "kernels, and their outputs differ from the reference in the last digits."
    )
