"""Compare the two AEC3 bindings on Parley's echo path; prints the tables of docs/echo.md.

    .venv/bin/python -m pip install livekit==1.2.1 pystoi==0.4.1   # comparison only, not dependencies
    .venv/bin/python -m tests.echo_compare

Both run behind the same ``EchoCanceller`` (alignment, resampling, 10 ms blocks), so only the binding
differs. Times are this machine's, at the moment of the run: compare them within one run only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from app.echo import BLOCK_SAMPLES, CANCELLER_RATE, BlockCanceller, EchoCanceller, WebRtcAec3
from tests.echo_bench import (
    EchoPath,
    Scenario,
    active_level_loss_db,
    erle_db,
    level_dbfs,
    reconvergence_s,
    run,
    si_sdr_db,
    user_voice,
    window_levels_db,
)

CONVERGENCE_S = 17.0


class LiveKitApm:
    """livekit's AudioProcessingModule (AEC3 and its high-pass filter) behind the ``BlockCanceller`` protocol."""

    def __init__(self) -> None:
        from livekit import rtc

        self._rtc = rtc
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)

    @staticmethod
    def _int16(samples: np.ndarray) -> bytes:
        return np.clip(np.round(samples * 32767.0), -32768, 32767).astype(np.int16).tobytes()

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        reverse = self._rtc.AudioFrame(self._int16(far), CANCELLER_RATE, 1, BLOCK_SAMPLES)
        self._apm.process_reverse_stream(reverse)
        self._apm.set_stream_delay_ms(0)  # the streams are aligned already; AEC3 estimates the rest
        capture = self._rtc.AudioFrame(self._int16(near), CANCELLER_RATE, 1, BLOCK_SAMPLES)
        self._apm.process_stream(capture)
        return np.frombuffer(capture.data, dtype=np.int16).astype(np.float32) / 32768.0

    def reset(self) -> None:
        self._apm = self._rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)


def _factory(backend: Callable[[], BlockCanceller]) -> Callable[[], EchoCanceller]:
    return lambda: EchoCanceller(backend=backend())


def _stoi(clean: np.ndarray, processed: np.ndarray) -> float:
    try:
        from pystoi import stoi
    except ImportError:
        return float("nan")
    return float(stoi(clean, processed, CANCELLER_RATE))


def measure(name: str, backend: Callable[[], BlockCanceller]) -> dict[str, str]:
    factory = _factory(backend)
    row: dict[str, str] = {"binding": name}
    for delay_ms in (40, 150, 300, 500, 750, 1000):
        scenario = Scenario(path=EchoPath(delay_s=delay_ms / 1000))
        signals = scenario.signals()
        cleaned, canceller = run(scenario, factory, signals=signals)
        cut = round(CONVERGENCE_S * CANCELLER_RATE)
        row[f"ERLE {delay_ms} ms"] = f"{erle_db(signals.echo[cut:], cleaned[cut:]):.1f}"
        window = CANCELLER_RATE // 2
        erle_windows = window_levels_db(signals.echo[cut:], window) - window_levels_db(cleaned[cut:], window)
        row[f"worst 0.5 s {delay_ms} ms"] = f"{np.min(erle_windows):.0f}"
        if delay_ms == 150:
            row["µs per 10 ms block"] = f"{canceller.stats.cost_per_block_s * 1e6:.0f}"

    jump = Scenario(path=EchoPath(delay_s=0.06, jump_at_s=14.0, delay_after_s=0.26))
    signals = jump.signals()
    cleaned, _ = run(jump, factory, signals=signals)
    import soxr

    heard = soxr.resample(signals.far.astype(np.float64), signals.speaker_rate, CANCELLER_RATE)[: len(cleaned)]
    row["re-convergence s"] = f"{reconvergence_s(signals.echo[: len(cleaned)], cleaned, heard, 14.0):.1f}"

    for gain in (-10.0, 0.0):
        path = EchoPath(delay_s=0.15, gain_db=gain)
        talking = Scenario(path=path, user_at_s=12.0, noise_dbfs=-70.0)
        signals = talking.signals()
        cleaned, _ = run(talking, factory, signals=signals)
        alone, _ = run(Scenario(path=path, far_end=False, user_at_s=12.0, noise_dbfs=-70.0), factory)
        user = slice(12 * CANCELLER_RATE, 12 * CANCELLER_RATE + len(user_voice()))
        loss = -active_level_loss_db(cleaned[user], alone[user])
        si_sdr, _ = si_sdr_db(cleaned[user], alone[user])
        correlation = float(np.corrcoef(cleaned[user], alone[user])[0, 1])
        label = f"echo {gain:+.0f} dB"
        row[f"DT loss dB, {label}"] = f"{loss:.2f}"
        row[f"DT SI-SDR / r / STOI, {label}"] = (
            f"{si_sdr:.1f} / {correlation:.2f} / {_stoi(alone[user], cleaned[user]):.2f}"
        )

    path = EchoPath(delay_s=0.15)
    speaking = Scenario(path=path, noise_dbfs=-65.0)
    cleaned, _ = run(speaking, factory)
    room, _ = run(Scenario(path=path, noise_dbfs=-65.0, far_end=False), factory)
    levels = window_levels_db(cleaned, CANCELLER_RATE // 10)
    row["self-interruption dBFS (room)"] = (
        f"{levels[30:].max():.1f} ({level_dbfs(room):.1f}); first 3 s {levels[:30].max():.1f}"
    )

    # The binding alone, on 10 ms blocks of the echo (no alignment, no resampling).
    block_canceller = backend()
    signals = Scenario().signals()
    near = signals.microphone[: 3000 * BLOCK_SAMPLES].reshape(-1, BLOCK_SAMPLES)
    far = signals.echo[: 3000 * BLOCK_SAMPLES].reshape(-1, BLOCK_SAMPLES)
    started = time.perf_counter()
    for index in range(len(near)):
        block_canceller.process(near[index], far[index])
    row["binding alone µs per block"] = f"{(time.perf_counter() - started) / len(near) * 1e6:.0f}"
    return row


def main() -> None:
    rows = [measure("pywebrtc-audio 0.2.0", WebRtcAec3), measure("livekit 1.2.1", LiveKitApm)]
    keys = list(rows[0])
    print("| measure | " + " | ".join(row["binding"] for row in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for key in keys[1:]:
        print(f"| {key} | " + " | ".join(row[key] for row in rows) + " |")


if __name__ == "__main__":
    main()
