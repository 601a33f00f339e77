"""Acoustic echo cancellation at the device edge: the assistant's voice is removed from the microphone.

With the microphone open next to speakers, the model hears itself. ``EchoCanceller`` takes what
the speakers play as the *far-end reference* and removes its echo from the microphone signal
before the engine sees it, so the user can talk over the assistant (hands-free, barge-in)::

    output callback ──► feed_playback(block, rate=device_rate, dac_time=…)   (copies; never blocks long)
    engine worker   ──► read_frame() ─► 1280 samples @ 16 kHz ─► clean_capture(frame, adc_time=…) ─► engine

The cancellation itself is WebRTC's AEC3 (linear adaptive filter, delay estimator, residual-echo
suppressor with comfort noise), through the ``pywebrtc-audio`` binding; this module only aligns the
two streams in time and feeds AEC3 matching 10 ms blocks. No DSP of our own.

API
    ``EchoCanceller(playback_rate=22050, *, output_latency_s=0.0, input_latency_s=0.0, guard_s=None,
    backend=None, clock=time.monotonic)``
        One canceller per conversation-independent audio session (AEC3 keeps what it learnt about the
        room across conversations; call ``reset()`` after a device change).
    ``feed_playback(samples, *, rate=None, dac_time=None) -> None``
        What the speaker plays (mono float32, any length, at ``rate``, default ``playback_rate``).
        ``dac_time``: when its first sample reaches the speaker, in ``clock`` seconds (PortAudio's
        ``time_info.outputBufferDacTime`` mapped to that clock, or ``now + stream.latency``);
        ``None`` means "now + output_latency_s". Feed silence too (every output block), or give
        ``dac_time`` for every chunk: the reference must be placed where it was heard.
    ``clean_capture(samples, *, adc_time=None) -> np.ndarray``
        Microphone samples at 16 kHz (any length). Returns the cleaned samples of every complete 10 ms
        block received so far: for chunks that are multiples of 160 samples (an 80 ms frame is 1280),
        exactly as many samples as were passed in; otherwise the remainder waits for the next call.
        ``adc_time``: when the chunk's first sample was captured (``None``: "now − input_latency_s −
        the chunk's duration", right only when called from the input callback itself). On the engine
        worker, take it from the input callback's ``time_info.inputBufferAdcTime`` of the block that
        holds the frame's first sample, plus that sample's offset in the block. Give ``dac_time`` and
        ``adc_time`` on one clock (both PortAudio's, or both ``clock``'s) or neither: times more than
        30 s apart are logged once as a warning.
    ``set_device_latencies(output_s, input_s) -> None``
        The devices' reported latencies (``sounddevice.Stream.latency``), used for the ``None`` times.
    ``reset() -> None``
        Forget the room (AEC3 state) and both streams' timing.
    ``stats -> EchoStats``
        Counters for the UI and logs: blocks, reference coverage, drift corrections, resyncs, cost.
    ``echo_cancellation_unavailable() -> str | None``
        ``None`` when the binding loads, else a plain-words reason (Hands-free is then not offered).
    ``WebRtcAec3`` / ``BlockCanceller``
        The AEC3 backend and the protocol a backend follows (tests and comparisons inject others).

Thread safety
    ``feed_playback`` may be called from any one thread at a time (the output callback): it copies
    the block into a preallocated ring under a lock held only for that copy, and does no resampling.
    ``clean_capture`` runs on one consumer thread at a time (serialised by its own lock): it resamples
    the pending reference, aligns, and runs AEC3. ``set_device_latencies``, ``reset`` and ``stats``
    may be called from any thread. ``pywebrtc-audio`` objects are not thread-safe; only
    ``clean_capture`` (and ``reset``, under the same lock) touches one.

Where it runs, and what it costs
    Off the audio callback: on the engine worker, on each 80 ms frame after resampling (that is where
    the 16 kHz signal first exists, and the callback contract is "copy only"). On this 2-core CI
    machine AEC3 alone takes 120–135 µs per 10 ms block and the whole ``clean_capture`` 130–240 µs per
    block (reference resampling and alignment included): 1.0–1.9 ms per 80 ms frame, about 2 % of one
    core. It would fit a callback's 10 ms budget too, but Python in a callback risks GIL stalls.
    ``docs/echo.md`` has the figures and the commands.

Timing: delay and drift
    Both streams are placed on one 16 kHz timeline of ``clock`` time: each playback chunk at its DAC
    time, each capture chunk at its ADC time. A capture block captured at time *t* is paired with the
    reference that reached the speaker at *t* + ``guard_s``; the echo then lags its reference by the
    acoustic path plus the guard, never less (AEC3 cannot cancel an echo that arrives before its
    reference, which over-reported device latencies would otherwise cause). The devices' reported
    latencies thus take out the bulk delay, and AEC3's own delay estimator finds the rest: up to
    500 ms beyond the reported latencies (measured; from 520 ms on it no longer converges: with the
    guard, AEC3's default delay search spans about half a second). ``guard_s``
    must stay below the real output + input latency, or the reference is not there yet when a block is
    cleaned (``stats.reference_lead_s`` turns negative, ``reference_missing_blocks`` grows).

    Between timestamps, each stream's position follows its own sample count, which is exact while no
    audio is dropped; the timestamps anchor it at its first chunk and re-anchor it after a jump larger
    than ``RESYNC_S`` (100 ms: a pause in playback, a device restart, dropped audio). Clock drift (the
    speaker's and the microphone's crystals differ by up to a few hundred ppm: 100 ppm is 6 ms a minute)
    shows as a slowly growing difference between count and timestamps; averaged over
    ``TIMING_SMOOTHING_S`` (30 s), once it exceeds ``DRIFT_DEADBAND_S`` (20 ms) the stream is pulled
    back by inserting or dropping reference samples, at most ``MAX_CORRECTION`` (1 ms) per chunk. AEC3
    follows what remains (a few ms, changing slowly). Playback that was never fed for a capture block
    counts as silence (``stats.reference_missing_blocks``).

Why pywebrtc-audio and not livekit's AudioProcessingModule (both are AEC3; ``docs/echo.md``
has the numbers and the commands)
    - Size: a 0.4 MB wheel (0.9 MB installed, numpy only) against 9–12 MB wheels (30 MB installed: the
      whole LiveKit client FFI library, plus protobuf and aiofiles) of which we would use one class, and
      which the app bundle would carry.
    - Cost and latency: a direct call per 10 ms block, float32 in and out, GIL released; livekit makes
      one protobuf FFI request per block and direction and takes int16 bytes: 1.4–2.3× the time per
      block here (121–134 against 190–286 µs). Both delay the microphone by the same 8 ms (AEC3's).
    - Echo path: the same AEC3 underneath, handling up to 500 ms of delay beyond the alignment and
      failing from 520 ms on (ERLE under 6 dB) in both. ERLE on our signals: 53–61 dB against 58–62 dB
      at 40–300 ms, both far above the 25 dB target; at 500 ms 56 against 49 dB.
    - Upkeep: livekit is a company's busy SDK (100+ releases) whose APM is a side feature;
      pywebrtc-audio (strands-labs, Apache-2.0; 0.2.0 of 2026-09, its third release) is young and
      small. Its API is the narrow one we need (``process(near, far)``), so moving to livekit through
      the ``BlockCanceller`` protocol (``tests/echo_compare.py`` has the adapter) is a local change if
      it stops being kept up.
    Double talk is the same for both: AEC3's residual suppressor attenuates the user's voice while the
    assistant speaks, by about 2 dB when the echo is 10 dB below the user's voice at the microphone and
    by about 5 dB at equal levels. Neither binding exposes the suppressor's tuning.

macOS: the system's voice-processing I/O (AVAudioEngine voice processing) is another canceller;
never run both on one stream (they fight over the same echo). This module is for PortAudio streams.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np

log = logging.getLogger(__name__)

CANCELLER_RATE: Final = 16_000
"""AEC3 runs at the engine's input rate: the microphone is already 16 kHz, only the reference is resampled."""
BLOCK_SAMPLES: Final = 160
"""AEC3 works in 10 ms blocks."""
PLAYBACK_RATE: Final = 22_050
"""The assistant's voice comes out of the codec at 22.05 kHz."""

DRIFT_DEADBAND_S: Final = 0.02
"""A stream's position may lag or lead its timestamps by this much before it is corrected.

Timestamps are not exact: through PulseAudio's ALSA plugin the capture's ADC times wandered by up to 36 ms
against its sample count within seconds (docs/echo.md). Chasing that wander moved the alignment
all the time and cost AEC3 its convergence; a sample count is exact as long as no audio is dropped."""
MAX_CORRECTION: Final = 16
"""At most this many samples (1 ms) are inserted or dropped per chunk: a gentle pull, not a jump."""
RESYNC_S: Final = 0.1
"""A timestamp this far from where a stream's sample count puts it re-anchors the stream at once."""
TIMING_SMOOTHING_S: Final = 30.0
"""Timestamps are averaged over about this long: their wander averages out, a crystal's drift does not."""
DEFAULT_GUARD_S: Final = 0.02
"""Pair the microphone with the reference played this much later, so over-reported latencies stay causal."""
CLOCK_MISMATCH_S: Final = 30.0
"""Playback and capture times this far apart cannot be one clock: warned about once."""
REFERENCE_HISTORY_S: Final = 8.0
"""How far back the reference is kept: the consumer may fall this far behind the speaker."""
PENDING_CAPACITY: Final = 1 << 17
"""Raw playback samples waiting for the consumer (2.7 s at 48 kHz); the oldest are dropped beyond."""


def echo_cancellation_unavailable() -> str | None:
    """``None`` when the AEC3 binding loads here, else a plain-words reason for the user."""
    try:
        import pywebrtc_audio  # noqa: F401
    except (ImportError, OSError) as error:
        return f"Echo cancellation is not available on this computer ({error}). Use headphones or push-to-talk."
    return None


class BlockCanceller(Protocol):
    """One echo canceller working on matching 10 ms blocks at :data:`CANCELLER_RATE`."""

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        """Clean ``near`` (160 float32 samples of microphone) given ``far`` (160 of reference)."""
        ...

    def reset(self) -> None:
        """Forget everything learnt about the echo path."""
        ...


class WebRtcAec3:
    """WebRTC's AEC3 through ``pywebrtc-audio`` (its high-pass filter comes with it). Not thread-safe."""

    def __init__(self) -> None:
        import pywebrtc_audio

        self._canceller = pywebrtc_audio.EchoCanceller(sample_rate=CANCELLER_RATE, num_channels=1)

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        return np.asarray(self._canceller.process(near, far), dtype=np.float32)

    def reset(self) -> None:
        self._canceller.reset()


@dataclass(frozen=True)
class EchoStats:
    """A snapshot of what the canceller did (plain values, safe to hand to another thread)."""

    blocks: int
    """10 ms capture blocks cleaned."""
    reference_blocks: int
    """Blocks whose paired reference had been fed (playback or fed silence)."""
    reference_missing_blocks: int
    """Blocks for which no reference had been fed at all (treated as silence; many mean feed earlier)."""
    drift_corrections: int
    """Samples inserted or dropped to keep both streams on their timestamps."""
    resyncs: int
    """Times a stream was re-anchored (first chunk, a pause in playback, a device restart)."""
    playback_dropped: int
    """Raw playback samples dropped because the consumer did not call ``clean_capture`` in time."""
    reference_lead_s: float
    """How much reference was fed beyond the last block's (negative: the reference arrives too late)."""
    cost_per_block_s: float
    """Mean processing time per 10 ms block, alignment and resampling included."""


class _StreamTiming:
    """Keeps one stream on the shared timeline: position of its sample *i* = ``origin + i``.

    ``follow(t, duration)`` is told each chunk's timestamp before the chunk is counted. While the
    count and the timestamps agree within ``DRIFT_DEADBAND_S`` (averaged over ``TIMING_SMOOTHING_S``,
    so callback jitter does not move anything) the origin stays; beyond, it moves by a few samples
    per chunk (drift); a disagreement over ``RESYNC_S`` moves it at once (a pause, a restart).
    """

    def __init__(self) -> None:
        self.origin = 0
        self.elapsed = 0.0  # the stream's length so far, in timeline samples
        self.error = 0.0  # smoothed (timestamp position - counted position), in samples
        self.anchored = False
        self.corrections = 0
        self.resyncs = 0

    def follow(self, timestamp: float, duration_s: float) -> None:
        error = timestamp * CANCELLER_RATE - (self.origin + self.elapsed)
        if not self.anchored or abs(error) > RESYNC_S * CANCELLER_RATE:
            self.origin += round(error)
            self.error = 0.0
            self.anchored = True
            self.resyncs += 1
        else:
            weight = 1.0 - math.exp(-max(duration_s, 1e-4) / TIMING_SMOOTHING_S)
            self.error += weight * (error - self.error)
            if abs(self.error) > DRIFT_DEADBAND_S * CANCELLER_RATE:
                # Pull harder the further off it is (1 sample per 1 ms of error), never more than 1 ms per chunk.
                step = int(min(MAX_CORRECTION, max(1, abs(self.error) // 16)))
                step = step if self.error > 0 else -step
                self.origin += step
                self.error -= step
                self.corrections += abs(step)
        self.elapsed += duration_s * CANCELLER_RATE


class _ReferenceTimeline:
    """The reference at 16 kHz, indexed by absolute timeline position; unfed positions read as silence."""

    def __init__(self, history_s: float = REFERENCE_HISTORY_S) -> None:
        self.size = 1 << math.ceil(math.log2(history_s * CANCELLER_RATE))
        self.samples = np.zeros(self.size, dtype=np.float32)
        self.end: int | None = None  # one past the newest position written
        self.written = 0  # positions written since the last reset (bounded by ``size`` for coverage)

    def write(self, position: int, samples: np.ndarray) -> None:
        count = len(samples)
        if count == 0:
            return
        if self.end is not None and position > self.end:
            gap = min(position - self.end, self.size)
            if gap <= 2 * MAX_CORRECTION:  # a drift correction: hold the last sample rather than click to 0
                held = self.samples[(self.end - 1) % self.size]
                self._fill(self.end, gap, np.full(gap, held, dtype=np.float32))
            else:  # a pause: nothing was playing
                self._fill(self.end, gap, None)
        if self.end is not None and position + count <= self.end - self.size:
            return  # older than anything kept
        self._fill(position, count, samples)
        if self.end is None or position + count > self.end:
            self.end = position + count

    def _fill(self, position: int, count: int, samples: np.ndarray | None) -> None:
        start = position % self.size
        first = min(count, self.size - start)
        if samples is None:
            self.samples[start : start + first] = 0.0
            self.samples[: count - first] = 0.0
        else:
            self.samples[start : start + first] = samples[:first]
            self.samples[: count - first] = samples[first:count]

    def read(self, position: int, out: np.ndarray) -> int:
        """Copy ``len(out)`` samples from ``position`` into ``out``; returns how many had been written."""
        count = len(out)
        out[:] = 0.0
        if self.end is None:
            return 0
        lo = max(position, self.end - self.size)
        hi = min(position + count, self.end)
        if hi <= lo:
            return 0
        start = lo % self.size
        first = min(hi - lo, self.size - start)
        offset = lo - position
        out[offset : offset + first] = self.samples[start : start + first]
        out[offset + first : offset + (hi - lo)] = self.samples[: hi - lo - first]
        return hi - lo


class EchoCanceller:
    """Removes the assistant's playback from the microphone (see the module docstring for the contract)."""

    def __init__(
        self,
        playback_rate: int = PLAYBACK_RATE,
        *,
        output_latency_s: float = 0.0,
        input_latency_s: float = 0.0,
        guard_s: float | None = None,
        backend: BlockCanceller | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            playback_rate: the rate ``feed_playback`` gets unless a call says otherwise.
            output_latency_s / input_latency_s: the devices' reported latencies, for calls without times.
            guard_s: pair the microphone with the reference played this much later (default
                :data:`DEFAULT_GUARD_S`); must stay below the real output + input latency, or the
                reference for a block is not fed yet when the block is cleaned.
            backend: the block canceller (default :class:`WebRtcAec3`).
            clock: the clock every ``dac_time`` / ``adc_time`` is read on.

        Raises:
            ImportError / OSError: the default backend's binding cannot be loaded
            (``echo_cancellation_unavailable()`` says so in words first).
        """
        if playback_rate <= 0:
            raise ValueError(f"playback_rate must be positive, not {playback_rate}")
        self.playback_rate = int(playback_rate)
        self.guard_s = DEFAULT_GUARD_S if guard_s is None else float(guard_s)
        self._clock = clock
        self._latencies = (float(output_latency_s), float(input_latency_s))
        self._backend: BlockCanceller = backend if backend is not None else WebRtcAec3()

        # Producer side (feed_playback): a preallocated ring of raw samples and one small tuple per chunk.
        self._pending_lock = threading.Lock()
        self._pending = np.zeros(PENDING_CAPACITY, dtype=np.float32)
        self._pending_write = 0  # total raw samples ever written
        self._pending_chunks: deque[tuple[int, int, int, float]] = deque()  # (start, count, rate, dac_time)
        self._playback_dropped = 0

        # Consumer side (clean_capture): everything below is touched under _process_lock only.
        self._process_lock = threading.Lock()
        self._init_consumer_state()

    def _init_consumer_state(self) -> None:
        self._resamplers: dict[int, Any] = {}
        self._playback_timing = _StreamTiming()
        self._capture_timing = _StreamTiming()
        self._reference = _ReferenceTimeline()
        self._reference_written = 0  # resampled reference samples so far (the playback stream's count)
        self._carry = np.zeros(0, dtype=np.float32)  # capture samples short of a whole block
        self._cleaned = 0  # capture samples cleaned so far (the capture stream's count at the carry's start)
        self._far = np.zeros(BLOCK_SAMPLES, dtype=np.float32)
        self._blocks = 0
        self._reference_blocks = 0
        self._missing_blocks = 0
        self._lead_s = 0.0
        self._busy_s = 0.0
        self._warned_clocks = False

    # ------------------------------------------------------------------ configuration

    def set_device_latencies(self, output_s: float, input_s: float) -> None:
        """The devices' reported latencies (seconds), used where a call gives no timestamp."""
        self._latencies = (float(output_s), float(input_s))

    def reset(self) -> None:
        """Forget the echo path and both streams' timing (after a device change)."""
        with self._process_lock:
            with self._pending_lock:
                self._pending_chunks.clear()
                self._playback_dropped = 0
            self._backend.reset()
            self._init_consumer_state()

    # ------------------------------------------------------------------ producer

    def feed_playback(self, samples: np.ndarray, *, rate: int | None = None, dac_time: float | None = None) -> None:
        """Queue what the speaker plays (mono; any length). Cheap: a copy under a short lock."""
        if dac_time is None:
            dac_time = self._clock() + self._latencies[0]
        rate = int(rate or self.playback_rate)
        data = np.asarray(samples, dtype=np.float32).reshape(-1)
        skipped = max(0, len(data) - PENDING_CAPACITY)
        if skipped:  # keep the newest part; the rest could never be consumed in time anyway
            data = data[skipped:]
            dac_time += skipped / rate
        count = len(data)
        with self._pending_lock:
            self._playback_dropped += skipped
            if count == 0:
                return
            start = self._pending_write
            position = start % PENDING_CAPACITY
            first = min(count, PENDING_CAPACITY - position)
            self._pending[position : position + first] = data[:first]
            self._pending[: count - first] = data[first:]
            self._pending_write += count
            self._pending_chunks.append((start, count, rate, float(dac_time)))
            oldest_kept = self._pending_write - PENDING_CAPACITY
            while self._pending_chunks and self._pending_chunks[0][0] < oldest_kept:
                self._playback_dropped += self._pending_chunks.popleft()[1]

    # ------------------------------------------------------------------ consumer

    def clean_capture(self, samples: np.ndarray, *, adc_time: float | None = None) -> np.ndarray:
        """Remove the echo from microphone samples at 16 kHz; returns every complete 10 ms block so far."""
        data = np.asarray(samples, dtype=np.float32).reshape(-1)
        if adc_time is None:
            adc_time = self._clock() - self._latencies[1] - len(data) / CANCELLER_RATE
        with self._process_lock:
            started = time.perf_counter()
            self._drain_playback()
            if len(data):
                # The chunk's first sample is the stream's sample number cleaned + len(carry).
                self._capture_timing.follow(adc_time, len(data) / CANCELLER_RATE)
                data = np.nan_to_num(data, nan=0.0, posinf=0.0, neginf=0.0)  # one NaN would poison AEC3 for good
                self._carry = np.concatenate([self._carry, data]) if len(self._carry) else data
            blocks = len(self._carry) // BLOCK_SAMPLES
            cleaned = np.empty(blocks * BLOCK_SAMPLES, dtype=np.float32)
            guard = round(self.guard_s * CANCELLER_RATE)
            for index in range(blocks):
                block = slice(index * BLOCK_SAMPLES, (index + 1) * BLOCK_SAMPLES)
                read_at = self._capture_timing.origin + self._cleaned + index * BLOCK_SAMPLES + guard
                if self._reference.read(read_at, self._far):
                    self._reference_blocks += 1
                else:
                    self._missing_blocks += 1
                cleaned[block] = self._backend.process(self._carry[block], self._far)
            if blocks and self._reference.end is not None:
                self._lead_s = (self._reference.end - (read_at + BLOCK_SAMPLES)) / CANCELLER_RATE
                if abs(self._lead_s) > CLOCK_MISMATCH_S and not self._warned_clocks:
                    self._warned_clocks = True
                    log.warning(
                        "Echo cancellation: playback and capture times are %.0f s apart, so they are not on one "
                        "clock; pass both streams' PortAudio times, or neither",
                        self._lead_s,
                    )
            self._carry = self._carry[blocks * BLOCK_SAMPLES :]
            self._cleaned += blocks * BLOCK_SAMPLES
            self._blocks += blocks
            self._busy_s += time.perf_counter() - started
        return cleaned

    def _drain_playback(self) -> None:
        import soxr

        with self._pending_lock:
            chunks = list(self._pending_chunks)
            self._pending_chunks.clear()
            raw = [self._pending_slice(start, count) for start, count, _, _ in chunks]
        for (_, count, rate, dac_time), data in zip(chunks, raw, strict=True):
            data = np.nan_to_num(data, nan=0.0, posinf=0.0, neginf=0.0)
            if rate == CANCELLER_RATE:
                resampled = data
            else:
                resampler = self._resamplers.get(rate)
                if resampler is None:
                    # Soxr's "quick" quality has no look-ahead (HQ holds back 40 ms, which could make the
                    # reference late) and AEC3's ERLE was the same with it (docs/echo.md).
                    resampler = soxr.ResampleStream(rate, CANCELLER_RATE, 1, dtype="float32", quality="QQ")
                    self._resamplers[rate] = resampler
                resampled = np.asarray(resampler.resample_chunk(data), dtype=np.float32)
            # Timing follows the chunk's own duration, so the resampler's output granularity never shifts it.
            self._playback_timing.follow(dac_time, count / rate)
            self._reference.write(self._playback_timing.origin + self._reference_written, resampled)
            self._reference_written += len(resampled)

    def _pending_slice(self, start: int, count: int) -> np.ndarray:
        position = start % PENDING_CAPACITY
        first = min(count, PENDING_CAPACITY - position)
        return np.concatenate([self._pending[position : position + first], self._pending[: count - first]])

    # ------------------------------------------------------------------ reporting

    @property
    def stats(self) -> EchoStats:
        with self._process_lock:
            return EchoStats(
                blocks=self._blocks,
                reference_blocks=self._reference_blocks,
                reference_missing_blocks=self._missing_blocks,
                drift_corrections=self._playback_timing.corrections + self._capture_timing.corrections,
                resyncs=self._playback_timing.resyncs + self._capture_timing.resyncs,
                playback_dropped=self._playback_dropped,
                reference_lead_s=self._lead_s,
                cost_per_block_s=self._busy_s / self._blocks if self._blocks else 0.0,
            )
