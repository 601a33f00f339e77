"""The engine worker's one connection to the sound devices: :class:`AudioPort`.

The controller owns the streams (``app.audio.streams.AudioIO``, or a test's stand-in) and may
replace them, or have none when no device is usable; it attaches whatever it has to the
port. The worker holds only the port, and the port behaves sensibly with no streams
attached: no frames to read, nothing to play. ``AudioStreams`` is what the controller
and the port need from a stream object.

Concurrency contract: the worker thread calls the reading/playing side (``read_frame``,
``play``, ``start_capture``, ``stop_capture``, ``clear_output``, ``counters``,
``talking``); the controller thread calls ``attach`` and uses ``streams`` for the rest.
The attached object is swapped by one assignment, and each call reads it once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .messages import DeviceStatus

if TYPE_CHECKING:
    from .echo import EchoCanceller


class AudioStreams(Protocol):
    """A microphone and a speaker stream, as ``AudioIO`` provides them."""

    duck_while_talking: bool
    volume: float
    muted: bool
    capturing: bool

    @property
    def talking(self) -> bool: ...
    @talking.setter
    def talking(self, talking: bool) -> None: ...

    def start(self) -> None: ...
    def close(self) -> None: ...
    def set_devices(self, input_name: str | None, output_name: str | None) -> None: ...
    def poll_health(self) -> list[DeviceStatus]: ...
    def read_frame(self, timeout: float = 0.0) -> np.ndarray | None: ...
    def play(self, samples: np.ndarray, *, live: bool = False) -> None: ...
    def start_capture(self) -> None: ...
    def stop_capture(self) -> None: ...
    def clear_output(self) -> None: ...
    def hush(self) -> None: ...
    def take_turn_latencies(self) -> list[float]: ...
    def set_echo_canceller(self, canceller: EchoCanceller | None) -> None: ...
    def start_replay(self, samples: np.ndarray, rate: int) -> float: ...
    def stop_replay(self) -> None: ...

    @property
    def replay_position(self) -> tuple[float, float] | None: ...

    @property
    def paused(self) -> bool: ...
    @property
    def input_device_name(self) -> str | None: ...
    @property
    def output_device_name(self) -> str | None: ...
    @property
    def input_device_label(self) -> str | None: ...
    @property
    def output_device_label(self) -> str | None: ...
    @property
    def input_peak(self) -> float: ...
    @property
    def output_peak(self) -> float: ...
    @property
    def input_backlog_frames(self) -> int: ...
    @property
    def input_lost_s(self) -> float: ...
    @property
    def output_underruns(self) -> int: ...
    @property
    def output_skipped_s(self) -> float: ...
    @property
    def last_audible(self) -> float: ...


@dataclass(frozen=True)
class AudioCounters:
    """Running totals since the streams were made; the worker subtracts a conversation's start."""

    backlog_frames: int = 0
    input_lost_s: float = 0.0
    output_underruns: int = 0
    output_skipped_s: float = 0.0

    def since(self, start: AudioCounters) -> AudioCounters:
        return AudioCounters(
            self.backlog_frames,
            max(0.0, self.input_lost_s - start.input_lost_s),
            max(0, self.output_underruns - start.output_underruns),
            max(0.0, self.output_skipped_s - start.output_skipped_s),
        )


class AudioPort:
    """What the engine worker reads frames from and plays into, whether or not a device is attached."""

    def __init__(self, streams: AudioStreams | None = None) -> None:
        self._streams = streams

    # ------------------------------------------------------------------ controller side

    @property
    def streams(self) -> AudioStreams | None:
        return self._streams

    def attach(self, streams: AudioStreams | None) -> None:
        self._streams = streams

    # ------------------------------------------------------------------ worker side

    def read_frame(self, timeout: float) -> np.ndarray | None:
        """The next 80 ms input frame, or None after ``timeout`` seconds without one."""
        streams = self._streams
        if streams is None:
            time.sleep(timeout)
            return None
        return streams.read_frame(timeout)

    def play(self, samples: np.ndarray) -> None:
        """Queue one frame of the engine's live stream (``AudioIO.play(live=True)``)."""
        streams = self._streams
        if streams is not None:
            streams.play(samples, live=True)

    def start_capture(self) -> None:
        streams = self._streams
        if streams is not None:
            streams.start_capture()

    def stop_capture(self) -> None:
        streams = self._streams
        if streams is not None:
            streams.stop_capture()

    def clear_output(self) -> None:
        streams = self._streams
        if streams is not None:
            streams.clear_output()

    @property
    def talking(self) -> bool:
        streams = self._streams
        return streams is not None and streams.talking

    def counters(self) -> AudioCounters:
        streams = self._streams
        if streams is None:
            return AudioCounters()
        return AudioCounters(
            streams.input_backlog_frames, streams.input_lost_s, streams.output_underruns, streams.output_skipped_s
        )
