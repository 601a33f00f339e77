"""Typed events a streaming session emits, one small frozen dataclass per kind.

Events hold only plain Python values and NumPy arrays, so they can cross from the
engine thread to any other thread safely. Within one frame they come in this order:
user transcript, assistant text, function channel (and tool calls), audio, timing.
:meth:`engine.session.Session.answer_tool_calls` returns :class:`ToolResponseInjected`, then the replayed
frames' events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

SPECIAL_MARKER: Final = re.compile(r"<SPECIAL_\d+>")
"""How the model's special tokens read as text (``<SPECIAL_27>``): markers, never words for people or JSON."""


@dataclass(frozen=True)
class UserTranscriptDelta:
    """The RNN-T transcript of what the user said grew (or was revised)."""

    frame_index: int
    delta: str
    text: str


@dataclass(frozen=True)
class AssistantTextDelta:
    """The assistant's text channel produced a token with text."""

    frame_index: int
    token_id: int
    delta: str
    text: str


@dataclass(frozen=True)
class FunctionDelta:
    """The function (tool-call) channel produced a token with text."""

    frame_index: int
    token_id: int
    delta: str
    text: str


@dataclass(frozen=True)
class ToolCall:
    """A complete call on the function channel, between the start and end markers.

    ``arguments`` is the parsed JSON object when the call text is well formed;
    otherwise ``error`` says why and ``raw`` keeps the text.
    """

    frame_index: int
    raw: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class ToolResponseInjected:
    """The tool results went into the function channel (:meth:`engine.session.Session.answer_tool_calls`): what the
    model was given, and how long it took."""

    frame_index: int  # the audio frame index at which the clock resumed
    positions: int  # timeline positions the response took (its tokens + <SPECIAL_22>)
    token_ids: tuple[int, ...]
    seconds: float  # host wall time of the injection (unpaced)
    replayed_frames: int  # deferred mic frames replayed after it


@dataclass(frozen=True)
class DeferredFramesDropped:
    """While the session waited for tool results, more mic frames arrived than it keeps for replay: the oldest of
    them will not be heard by the model (their transcript was still emitted)."""

    frame_index: int
    dropped: int  # frames dropped so far in this wait


@dataclass(frozen=True, eq=False)
class AudioChunk:
    """80 ms of assistant speech: the codec output and the codes it decoded."""

    frame_index: int
    samples: np.ndarray  # float32, 1764 samples at sample_rate
    codes: np.ndarray  # int32 (31,), sent to the codec (control codes replaced)
    sample_rate: int = 22_050
    codes_raw: np.ndarray | None = None  # int32 (31,), as the TTS produced them


@dataclass(frozen=True)
class FrameTiming:
    """Where one frame's wall time went, in milliseconds.

    ``stages_ms`` is keyed by :data:`engine.timeline.STAGES`, whose order the stages
    followed one another in. ``timing_mode`` says what a stage's time means: ``"host"``,
    where the host waited (device work lands in the stage that read it back), or
    ``"device"``, each stage's outputs evaluated at its boundary (exact per stage, at the
    cost of more host syncs).
    """

    frame_index: int
    start_ms: float  # since the session started
    stages_ms: dict[str, float]
    total_ms: float
    host_syncs: int
    sub_stages: dict[str, float] = field(default_factory=dict)
    # Of each sub-stage's time, the part spent evaluating its outputs (the rest built their graphs).
    sub_stage_evaluation: dict[str, float] = field(default_factory=dict)
    timing_mode: str = "host"

    def stage_ms(self, name: str) -> float:
        return self.stages_ms.get(name, 0.0)


@dataclass(frozen=True)
class Done:
    """The session was flushed; no more events follow."""

    frame_index: int


@dataclass(frozen=True)
class Cancelled:
    """The session was cancelled; no more events follow."""

    frame_index: int


Event = (
    UserTranscriptDelta
    | AssistantTextDelta
    | FunctionDelta
    | ToolCall
    | ToolResponseInjected
    | DeferredFramesDropped
    | AudioChunk
    | FrameTiming
    | Done
    | Cancelled
)
