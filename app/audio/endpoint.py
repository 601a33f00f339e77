"""One open PortAudio stream and what its callback needs: :class:`Endpoint`, and PortAudio's clocks."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.ring_buffer import RingBuffer

from .devices import AudioDevice, AudioUnavailable, Direction, _sounddevice
from .output import GainRamp, Limiter

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0  # a stream that takes longer than this to stop is abandoned, never waited on
PA_INVALID_CHANNEL_COUNT = -9998  # PaErrorCode paInvalidChannelCount
PEAK_RELEASE_S = 0.3  # level meters fall by 1/e every 300 ms, so short peaks stay visible between UI polls


@dataclass(eq=False)
class Endpoint:
    """One open stream and what its callback needs; the callback is its only writer."""

    direction: Direction
    device: AudioDevice
    rate: int
    ring: RingBuffer
    stream: Any = None  # sounddevice.InputStream / OutputStream
    opened_at: float = field(default_factory=time.monotonic)
    last_callback: float = 0.0  # set to opened_at when it starts, then by every callback
    closing: bool = False  # set before we stop it, so finished() is not taken for a failure
    failed: bool = False  # PortAudio finished the stream on its own
    # Output only: jitter buffer and ducking state.
    playing: bool = False
    waited: int = 0  # samples played as silence while something short was queued
    ramp: GainRamp = field(default_factory=GainRamp)  # ducking × volume
    limiter: Limiter = field(default_factory=Limiter)
    alsa_underruns: int = 0  # alsa-lib's underrun recoveries (app.audio.alsa) seen by the output callback so far
    latency_s: float = 0.0  # from handing a block to PortAudio to hearing it, or from capture to us
    scratch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    replay_scratch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    @property
    def label(self) -> str:
        return f"{'microphone' if self.direction == 'input' else 'speaker'} '{self.device.label}'"

    @property
    def delivered(self) -> bool:
        """Whether the callback has run since the stream started."""
        return self.last_callback > self.opened_at

    def finished(self) -> None:
        if not self.closing:
            self.failed = True


def decayed_peak(block: np.ndarray, previous: float, frames: int, rate: int) -> float:
    peak = max(float(block.max(initial=0.0)), -float(block.min(initial=0.0)))
    held = previous * math.exp(-frames / (rate * PEAK_RELEASE_S))
    return min(1.0, max(peak, held))


def monotonic_time(time_info: Any, name: str) -> float | None:
    """A PortAudio callback time (``outputBufferDacTime``, ``inputBufferAdcTime``) on ``time.monotonic()``.

    Both times in one callback are on the stream's clock, so their difference carries over to ours; None
    when the host API does not report them (zero), or in a test's hand-made call.
    """
    try:
        when, now = float(getattr(time_info, name)), float(time_info.currentTime)
    except (AttributeError, TypeError):
        return None
    if when <= 0.0 or now <= 0.0 or abs(when - now) > 2.0:
        return None
    return time.monotonic() + (when - now)


def start_stream(
    endpoint: Endpoint, callback: Callable[[np.ndarray, int, Any, Any], None], latency: str | float
) -> None:
    """Open and start ``endpoint``'s stream at its rate (mono, else two channels; the callback uses the first).

    Raises:
        AudioUnavailable: the device could not be opened or started (the message names it).
    """
    sd = _sounddevice()
    device, direction = endpoint.device, endpoint.direction
    stream_type = sd.InputStream if direction == "input" else sd.OutputStream
    channels = 1
    while True:
        try:
            with _routed_to(device.route, direction):
                endpoint.stream = stream_type(
                    device=device.index,
                    samplerate=endpoint.rate,
                    channels=channels,
                    dtype="float32",
                    latency=latency,
                    callback=callback,
                    finished_callback=endpoint.finished,
                )
            break
        except sd.PortAudioError as error:
            # Some interfaces have no mono mode: open two channels and use the first.
            if error.args[1:2] == (PA_INVALID_CHANNEL_COUNT,) and channels == 1 and device.channels >= 2:
                channels = 2
                continue
            raise AudioUnavailable(f"The {endpoint.label} could not be opened ({error}).") from error
    endpoint.opened_at = endpoint.last_callback = time.monotonic()
    endpoint.latency_s = float(endpoint.stream.latency)
    try:
        endpoint.stream.start()
    except sd.PortAudioError as error:
        stop_stream(endpoint)
        raise AudioUnavailable(f"The {endpoint.label} could not be started ({error}).") from error


_ROUTING = threading.Lock()  # one stream opened under the routing variables at a time


@contextmanager
def _routed_to(route: str | None, direction: Direction) -> Iterator[None]:
    """While a stream opens, name the sound server's device it goes to (the ALSA plugin reads these when it
    connects, and only then): ``PULSE_SINK`` / ``PULSE_SOURCE`` for PulseAudio's plugin, ``PIPEWIRE_NODE``
    for PipeWire's. Without a route the stream goes to the server's default."""
    if route is None:
        yield
        return
    names = ("PULSE_SOURCE" if direction == "input" else "PULSE_SINK", "PIPEWIRE_NODE")
    with _ROUTING:
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update(dict.fromkeys(names, route))
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def stop_stream(endpoint: Endpoint) -> bool:
    """Abort and close the stream on a helper thread; False when it did not stop within ``CLOSE_TIMEOUT_S``
    (it is abandoned, never waited on)."""
    endpoint.closing = True
    stream = endpoint.stream
    if stream is None:
        return True
    worker = threading.Thread(target=abort_and_close, args=(stream,), name="parley-audio-close", daemon=True)
    worker.start()
    worker.join(CLOSE_TIMEOUT_S)
    if worker.is_alive():
        log.error("The %s did not stop within %.0f s; abandoning it", endpoint.label, CLOSE_TIMEOUT_S)
        return False
    return True


def abort_and_close(stream: Any) -> None:
    try:
        stream.abort(ignore_errors=True)
        stream.close(ignore_errors=True)
    except Exception:  # a dying device may fail in any way; the stream is gone either way
        log.warning("Error while closing an audio stream", exc_info=True)
