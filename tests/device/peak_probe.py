"""Where a conversation's peak memory comes from: the peak above the memory in use before it, per phase.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup peakprobe``): the full-size 4-bit
random model loaded for fast numerics (or ``exact``). The bench's peak (``peak memory alone`` in ``parley bench
--compare mlx-vlm``) covers a session's creation and its frames; this prints, for the session's creation (the TTS
warm-up on the speaker prompt, the system prompt's prefill) and each of the first frames and a steady one, the
peak and the memory still held after it, in GB, so that a transient can be traced to its phase.
"""

from __future__ import annotations

import sys

import mlx.core as mx

from app.bench import FRAME, INPUT_SAMPLE_RATE, bench_input, question_audio
from engine.loading.random_checkpoint import random_voicechat
from engine.session import Session, warm_up

GB = 1e9


def main() -> None:
    numerics = sys.argv[1] if len(sys.argv) > 1 else "fast"
    voicechat = random_voicechat("full", quantize=4, numerics=numerics)
    warm_up(voicechat, speech=question_audio())
    mx.synchronize()
    mx.clear_cache()
    held = mx.get_active_memory()
    print(f"{numerics}: held before the session {held / GB:.3f} GB (weights and what the process keeps)")
    tts = voicechat.model.tts_model.tts_model
    phases: list[tuple[str, float, float]] = []

    def mark(name: str) -> None:
        mx.synchronize()
        phases.append((name, mx.get_peak_memory() / GB, mx.get_active_memory() / GB))
        mx.reset_peak_memory()

    original_warmup = type(tts).warmup
    original_prefill = Session._prefill

    def warmup(self: object, *args: object, **kwargs: object) -> object:
        mark("session start")
        result = original_warmup(self, *args, **kwargs)
        mx.eval(result)
        mark("TTS warm-up")
        return result

    def prefill(self: Session, prompt: str) -> None:
        mark("caches made")
        original_prefill(self, prompt)
        mx.eval(self.caches.arrays())
        mark("prompt prefill")

    type(tts).warmup = warmup  # type: ignore[method-assign]
    Session._prefill = prefill  # type: ignore[method-assign]
    mx.reset_peak_memory()
    session = Session(voicechat, seed=0)
    mark("session made")
    samples = bench_input(100)
    for index, start in enumerate(range(0, samples.shape[0], FRAME)):
        session.push(samples[start : start + FRAME], INPUT_SAMPLE_RATE)
        if index < 8 or index in (70, 71, 99):
            mark(f"frame {index}")
        else:
            mx.synchronize()
    print(f"{'phase':16} {'peak GB':>8} {'above held':>10} {'held after':>10}")
    for name, peak, after in phases:
        print(f"{name:16} {peak:8.3f} {peak - held / GB:10.3f} {after:10.3f}")


if __name__ == "__main__":
    main()
