"""Messages from the app core (controller, worker, audio) to whoever presents them.

The controller turns everything that happens — engine events, frame timings, audio
levels, device changes, load progress, failures — into these plain frozen
dataclasses and queues them; the UI drains the queue on its own thread
(``AppController.poll()``). Engine events (``engine.events``: transcript and text
deltas, tool calls) are forwarded unchanged alongside them.

What state the app is in has one message: :class:`StateChanged`, a whole snapshot
(state, loaded model, devices, load progress, whether a conversation runs) made by
``app.status.StatusBoard``. Everything else is an event. The worker reports to the
controller with :class:`EngineState`, :class:`LoadProgress`, :class:`InputFrame` and
:class:`EngineInfo`, which the controller folds in and does not pass on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.events import FrameTiming

from .variants import Variant


class AppState(enum.Enum):
    """What the app is doing, shown by the state indicator (with text, not only colour)."""

    NO_MODEL = "no model"  # first run: no checkpoint configured yet
    LOADING = "loading"
    READY = "ready"  # model loaded, key released, assistant silent
    LISTENING = "listening"  # talk key held: the microphone feeds the model
    SPEAKING = "assistant speaking"
    FALLING_BEHIND = "falling behind"  # frames queue up faster than the engine processes them
    PAUSED = "paused"  # asleep (idle pause, or Stop): the timeline sleeps until the key is pressed
    NO_AUDIO = "no sound device"  # a model is loaded, but there is no microphone or speaker to use
    ERROR = "error"


@dataclass(frozen=True)
class ModelLoaded:
    """A checkpoint finished loading (warm-up and speed check included) and can converse."""

    name: str
    path: Path
    variant: Variant  # what the checkpoint is (from its own quantization, or the demo marker)
    checkpoint: dict[str, Any] = field(default_factory=dict, compare=False)  # for profile logs
    random_weights: bool = False  # made by ``parley make-checkpoint``: noise, not speech (like the demo)

    @property
    def noise(self) -> bool:
        """The weights are random (the demo, or a made checkpoint): it makes noise, not speech."""
        return self.variant.demo or self.random_weights

    @property
    def description(self) -> str:
        """``"NemotronLabs-VoiceChat-11B-4bit · 4-bit"``; the demo is just "Demo"; random weights say so."""
        if self.variant.demo:
            return self.variant.label
        described = f"{self.name} · {self.variant.label}"
        return f"{described} · random weights (noise, not speech)" if self.random_weights else described


@dataclass(frozen=True)
class StateChanged:
    """The whole app state, as one snapshot: every part of the window renders from the latest one."""

    state: AppState
    detail: str = ""
    model: ModelLoaded | None = None  # loaded and usable; None while loading or when there is none
    microphone: str | None = None  # the device in use; None: no microphone
    speaker: str | None = None  # likewise; None: no speaker
    progress: float | None = None  # while loading: 0..1, or -1 when unknown
    conversation: bool = False  # a conversation is open (its timeline runs unless paused)

    @property
    def audio_available(self) -> bool:
        return self.microphone is not None and self.speaker is not None


@dataclass(frozen=True)
class EngineState:
    """The worker's own state (no model / loading / ready / paused / falling behind / error), to the controller."""

    state: AppState
    detail: str = ""
    conversation: bool = False


@dataclass(frozen=True)
class ConversationStarted:
    """A new conversation began (frame indices restart at 0); everything of the previous one is complete."""

    number: int  # 1, 2, … since launch
    model: ModelLoaded


@dataclass(frozen=True, eq=False)
class InputFrame:
    """One 80 ms frame as the engine heard it (16 kHz), for Save Conversation."""

    samples: np.ndarray


@dataclass(frozen=True)
class EngineInfo:
    """What the worker's MLX runs on, for Help → About and the diagnostics."""

    mlx_version: str
    device: str  # e.g. "gpu: NVIDIA H200" or "cpu: x86_64"


@dataclass(frozen=True)
class FrameStats:
    """One processed frame, for the live overlay. Counters are this conversation's."""

    timing: FrameTiming  # timing_mode "device" on the frames timed stage by stage (one in N)
    backlog_frames: int  # input frames waiting for the engine
    input_lost_s: float  # microphone audio dropped because the engine fell more than the input ring behind
    output_underruns: int  # playback callbacks that ran out of audio
    p50_ms: float  # over the recent window
    p95_ms: float
    realtime_factor: float  # mean total / 80 ms over the recent window
    exact_every: int = 25  # one frame in this many is timed stage by stage
    echo: EchoSummary | None = None  # hands-free: what the echo canceller did (None in push-to-talk)
    output_skipped_s: float = 0.0  # silence between turns skipped to win back the delay that underruns added
    economy_level: int = 0  # fast numerics' TTS economy the next frame runs at (app.keep_up; 0: the full step)


@dataclass(frozen=True)
class EchoSummary:
    """Hands-free echo cancellation, for the overlay: its cost and whether its reference kept up."""

    cost_ms_per_frame: float  # alignment, resampling and AEC3 for one 80 ms frame
    reference_share: float  # of the cleaned 10 ms blocks, the share whose playback reference was there (0..1)
    drift_corrections: int  # samples inserted or dropped to keep speaker and microphone aligned


@dataclass(frozen=True)
class TurnLatency:
    """The delay the user feels: key release to the assistant's first audible output, this conversation."""

    latency_s: float  # the latest turn's
    p50_s: float
    p95_s: float
    turns: int


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


@dataclass(frozen=True)
class ConversationEnded:
    """The worker closed a conversation (new conversation, reload, length limit, quit); all it said is in."""

    number: int


@dataclass(frozen=True)
class ConversationCleared:
    """A fresh conversation waits for the talk key (a model loaded or switched, New Conversation, a numerics
    switch): everything of the old one has been reported, and the window drops its transcript, clock, overlay
    and counters."""


@dataclass(frozen=True)
class ModelFallback:
    """At launch the configured model could not be used; ``message`` says why and what loads instead."""

    message: str


@dataclass(frozen=True)
class HistorySaved:
    """A finished conversation was kept in the history (``folder`` is its entry's folder)."""

    entry_id: str
    folder: Path


@dataclass(frozen=True)
class GlobalTalk:
    """The global talk key went down (``start``) or up / was pressed again (``not start``), in another app."""

    start: bool


@dataclass(frozen=True)
class NumericsChanged:
    """The loaded model now runs with ``numerics`` ("exact" or "fast"); the next conversation uses it."""

    numerics: str
    fast_changes: dict[str, bool] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class NumericsAdvice:
    """The speed check: exact numerics do not keep up here and fast ones would. ``message`` says so in words."""

    exact_rtf: float
    fast_rtf: float
    message: str


@dataclass(frozen=True)
class ReplayProgress:
    """A history replay through the speaker: which entry, how far (``entry_id`` None: nothing plays any more)."""

    entry_id: str | None
    position_s: float = 0.0
    duration_s: float = 0.0


# --------------------------------------------------------------------------- the tool loop (app.tools)


@dataclass(frozen=True)
class ConsentRequest:
    """The assistant called a tool whose consent is "ask": the window shows the call with Allow / Deny.

    Unanswered for ``timeout_s``, the call is denied ("the user did not answer") and ``ConsentClosed`` follows.
    """

    request_id: int
    tool: str
    source: str  # "built-in" or the MCP server's name
    arguments: dict[str, Any]
    timeout_s: float


@dataclass(frozen=True)
class ConsentClosed:
    """A consent request is over (answered, timed out, or its conversation ended): the prompt goes away."""

    request_id: int
    reason: str


@dataclass(frozen=True)
class ToolActivity:
    """One tool call, finished: what was called, what was decided, what the model is told, and when.

    Every call the model completes gets one, well formed or not (``raw`` keeps what it wrote). It goes into the
    transcript, the history and the exported profile.
    """

    frame_index: int  # the frame whose events held the completed call
    tool: str  # the tool's name, or "" when the call named none
    arguments: dict[str, Any] | None
    raw: str
    decision: str  # "allowed (always)", "allowed by you", "denied by you", "not answered", "never allowed", "refused"
    ok: bool
    content: str  # the result text, or the reason it failed: exactly what the model is told
    at: str  # ISO 8601 local time the call completed on the function channel
    consent_s: float = 0.0  # waiting for the user
    run_s: float = 0.0  # the tool itself (its server's start included)

    def to_dict(self) -> dict[str, Any]:
        return {
            "frame_index": self.frame_index,
            "tool": self.tool,
            "arguments": self.arguments,
            "raw": self.raw,
            "decision": self.decision,
            "ok": self.ok,
            "content": self.content,
            "at": self.at,
            "consent_s": round(self.consent_s, 3),
            "run_s": round(self.run_s, 3),
        }


@dataclass(frozen=True)
class ToolResponseTiming:
    """The model was given the results of its calls: how long the whole tool turn took (engine + tools)."""

    frame_index: int
    calls: int
    positions: int  # timeline positions the injected response took
    inject_s: float  # the injection itself (unpaced)
    turn_s: float  # from the call's completion to the response injected (consent and tools included)
    replayed_frames: int


@dataclass(frozen=True)
class ToolTurnHeard:
    """The first audible sound after a tool turn: the whole turn, from the call's completion to the assistant
    speaking again (consent, the tool, the injection and the replay included)."""

    frame_index: int
    seconds: float


@dataclass(frozen=True)
class ToolsListed:
    """An MCP server listed its tools (on first need): the controller keeps them in ``tools.json``."""

    server: str
    tools: tuple[Any, ...]  # app.tools.config.ToolEntry


@dataclass(frozen=True)
class TimerDone:
    """A timer the assistant set has ended: the app chimed and the window shows the line."""

    label: str
    seconds: int
    frame_index: int | None  # the conversation's frame when it fired (None: no conversation open)
