"""Messages from the app core (controller, worker, audio) to whoever presents them.

The controller turns everything that happens — engine events, frame timings, audio
levels, device changes, load progress, failures — into these plain frozen
dataclasses and queues them; the UI drains the queue on its own thread
(``AppController.poll()``). Engine events (``engine.events``: transcript and text
deltas, tool calls) are forwarded unchanged alongside them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from engine.events import FrameTiming


class AppState(enum.Enum):
    """What the app is doing, shown by the state indicator (with text, not only colour)."""

    NO_MODEL = "no model"  # first run: no checkpoint configured yet
    LOADING = "loading"
    READY = "ready"  # model loaded, key released, assistant silent
    LISTENING = "listening"  # talk key held: the microphone feeds the model
    SPEAKING = "assistant speaking"
    FALLING_BEHIND = "falling behind"  # frames queue up faster than the engine processes them
    PAUSED = "paused"  # idle pause: the timeline sleeps until the key is pressed
    ERROR = "error"


@dataclass(frozen=True)
class StateChanged:
    state: AppState
    detail: str = ""


@dataclass(frozen=True)
class FrameStats:
    """One processed frame, for the live overlay."""

    timing: FrameTiming
    backlog_frames: int  # input frames waiting for the engine
    input_overflows: int  # microphone blocks dropped because the input ring was full
    output_underruns: int  # playback callbacks that ran out of audio
    p50_ms: float  # over the recent window
    p95_ms: float
    realtime_factor: float  # mean total / 80 ms over the recent window


@dataclass(frozen=True)
class Levels:
    """Peak levels (0..1) of the last audio blocks."""

    input_peak: float
    output_peak: float


@dataclass(frozen=True)
class LoadProgress:
    fraction: float  # 0..1, or -1 when unknown
    message: str


@dataclass(frozen=True)
class ModelLoaded:
    name: str
    path: Path
    quantization_bits: int | None
    demo: bool  # a generated random-weight checkpoint: produces no real speech


@dataclass(frozen=True)
class SpeedCheck:
    """Result of the short 'will this machine keep up?' run on silence after loading."""

    realtime_factor: float
    verdict: str  # plain words for the user


@dataclass(frozen=True)
class ConversationTime:
    """How much of the conversation length limit is left."""

    elapsed_s: float
    remaining_s: float


@dataclass(frozen=True)
class DeviceStatus:
    input_name: str | None
    output_name: str | None
    message: str = ""  # e.g. "Microphone disconnected — switched to the default device"


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    downloaded_bytes: int
    total_bytes: int | None
    message: str = ""
    finished: bool = False
    failed: bool = False


@dataclass(frozen=True)
class Failure:
    """Something went wrong; the app stays usable. ``details`` holds the traceback for the log view."""

    message: str
    details: str = ""
    recoverable: bool = True


@dataclass(frozen=True)
class Notice:
    """A transient message for the status line (export done, settings saved, ...)."""

    message: str
    paths: tuple[Path, ...] = field(default=())
