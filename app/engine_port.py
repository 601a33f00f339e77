"""The engine as the worker uses it: a Protocol, the MLX engine behind it, and a fake for tests.

:class:`app.worker.EngineWorker` reaches the engine only through an :class:`EnginePort` (as it reaches the sound
devices only through an ``AudioPort``): prepare the device, load a checkpoint, trace its programs, switch its
numerics, and start conversations that turn microphone frames into events. :class:`MLXEngine` is the real one,
over the :mod:`engine` facade; :class:`FakeEngine` answers without a model or MLX, so that the worker's own
behaviour (loading, the speed check, one frame in N timed by stage, a failing frame, the length limit) is tested
in milliseconds; it can also script tool calls (``FakeEngine.script_tool_calls``) and waits for their results as
the session does. This module imports no MLX itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine.errors import AudioInputError, CheckpointError, ContextLimitError, SessionClosedError, ToolLoopError
from engine.events import AssistantTextDelta, AudioChunk, Event, FrameTiming, ToolCall, ToolResponseInjected
from engine.timeline import FRAME_MS, INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, OUTPUT_FRAME_SAMPLES, STAGES

if TYPE_CHECKING:
    from engine import Numerics, ToolResult, VoiceChat


class LoadedModel(Protocol):
    """A loaded checkpoint, as the worker reads it."""

    @property
    def name(self) -> str: ...

    @property
    def numerics(self) -> str: ...

    @property
    def quantization_bits(self) -> int | None: ...

    @property
    def precast_bytes(self) -> int: ...

    @property
    def fast_changes(self) -> Mapping[str, bool]: ...

    def describe(self) -> dict[str, Any]: ...


class Conversation(Protocol):
    """One conversation: 16 kHz mono frames in, the events of every frame they complete out."""

    @property
    def frame_index(self) -> int: ...

    def push(self, samples: np.ndarray, sample_rate: int) -> list[Event]: ...

    def set_economy(self, level: int) -> None:
        """Fast numerics: the TTS spends less per frame from the next frame (engine ``Session.set_economy``; 0
        the full step); exact numerics refuses any level but 0 with ``ValueError``."""
        ...

    @property
    def awaiting_tool_results(self) -> bool:
        """True from the frame whose events held completed ``ToolCall``s until they are answered: the model's
        clock stands still meanwhile (frames still run perception and return silence)."""
        ...

    @property
    def pending_tool_calls(self) -> tuple[ToolCall, ...]: ...

    def answer_tool_calls(self, results: Sequence[ToolResult]) -> list[Event]:
        """One result per pending call, in order: injected into the function channel, then the deferred frames
        replay (their events are returned). ``ToolLoopError`` when nothing is pending or the count differs."""
        ...

    def close(self) -> None: ...


class EnginePort(Protocol):
    """What the worker asks of the engine; every call runs on the worker thread."""

    def prepare_device(self) -> tuple[str, str]:
        """Ready this thread's device (kernel cache, the thread's own stream); returns the compute library's
        version and the device in words (``"gpu: NVIDIA H200"``)."""
        ...

    def check_numerics(self, value: str) -> Numerics:
        """``value`` as a numerics mode, or ValueError naming the modes."""
        ...

    def load(self, path: Path, *, conversation_seconds: float, numerics: Numerics) -> LoadedModel: ...

    def warm_up(
        self,
        model: LoadedModel,
        *,
        speech: np.ndarray | None,
        progress: Callable[[float], None] | None,
        system_prompt: str | None = None,
    ) -> None:
        """Trace (and on a GPU compile) the per-frame programs of the numerics in use, and in fast numerics the
        chunked prefill of ``system_prompt`` (the one conversations will open with; None: a stand-in)."""
        ...

    def set_numerics(self, model: LoadedModel, numerics: Numerics) -> None: ...

    def start_conversation(
        self,
        model: LoadedModel,
        *,
        system_prompt: str | None,
        max_seconds: float | None,
        seed: int = 0,
        stage_timing_every: int = 0,
        await_tool_results: bool = False,
    ) -> Conversation:
        """A new conversation (its system prompt prefilled; None: the checkpoint's default). Every frame emits
        its timing; frames whose index is a multiple of ``stage_timing_every`` (0: none) are timed stage by
        stage on the device. With ``await_tool_results`` (the prompt offers tools) a completed tool call stops
        the model's clock until ``answer_tool_calls``."""
        ...


class MLXEngine:
    """The real engine: :mod:`engine` on this machine's device."""

    def prepare_device(self) -> tuple[str, str]:
        import mlx.core as mx

        from engine import device_description

        from .kernels import prepare_this_device

        prepare_this_device()  # before the first load compiles anything (on CUDA)
        # A stream of our own on the default device: everything MLX does happens on this thread.
        mx.set_default_stream(mx.new_stream(mx.default_device()))
        device = device_description()
        return str(getattr(mx, "__version__", "unknown")), f"{device['type']}: {device['name']}"

    def check_numerics(self, value: str) -> Numerics:
        from engine import check_numerics

        return check_numerics(value)

    def load(self, path: Path, *, conversation_seconds: float, numerics: Numerics) -> VoiceChat:
        from engine import load_voicechat

        return load_voicechat(path, conversation_seconds=conversation_seconds, numerics=numerics)

    def warm_up(
        self,
        model: LoadedModel,
        *,
        speech: np.ndarray | None,
        progress: Callable[[float], None] | None,
        system_prompt: str | None = None,
    ) -> None:
        from engine import warm_up

        warm_up(_voicechat(model), speech=speech, progress=progress, system_prompt=system_prompt)

    def set_numerics(self, model: LoadedModel, numerics: Numerics) -> None:
        from engine import set_numerics

        set_numerics(_voicechat(model), numerics)

    def start_conversation(
        self,
        model: LoadedModel,
        *,
        system_prompt: str | None,
        max_seconds: float | None,
        seed: int = 0,
        stage_timing_every: int = 0,
        await_tool_results: bool = False,
    ) -> Conversation:
        from engine import FrameProfiler, Session

        hooks = FrameProfiler(stage_timing_every=stage_timing_every)
        return Session(
            _voicechat(model),
            system_prompt=system_prompt,
            seed=seed,
            max_seconds=max_seconds,
            hooks=hooks,
            await_tool_results=await_tool_results,
        )


def _voicechat(model: LoadedModel) -> VoiceChat:
    from engine import VoiceChat

    if not isinstance(model, VoiceChat):
        raise TypeError(f"MLXEngine runs the models it loaded, not a {type(model).__name__}")
    return model


# --------------------------------------------------------------------------- the fake


@dataclass
class FakeModel:
    """A "loaded" checkpoint of :class:`FakeEngine`."""

    path: Path
    numerics: str = "exact"
    quantization_bits: int | None = 4
    precast_bytes: int = 1
    fast_changes: dict[str, bool] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "quantization_bits": self.quantization_bits,
            "size_bytes": 0,
            "precast_bytes": self.precast_bytes,
            "numerics": self.numerics,
            "fast_changes": dict(self.fast_changes),
        }


class FakeConversation:
    """Frames out in the session's order: a word every ``FakeEngine.word_every`` frames, a chunk of quiet tone,
    then the frame's timing. The sample rate and the length limit are checked as the session checks them."""

    def __init__(
        self,
        engine: FakeEngine,
        system_prompt: str | None,
        max_seconds: float | None,
        stage_timing_every: int,
        numerics: str = "exact",
        await_tool_results: bool = False,
    ) -> None:
        self._engine = engine
        self.numerics = numerics
        self.economy_levels: list[tuple[int, int]] = []  # (frame index, level) of each set_economy
        self.await_tool_results = await_tool_results
        self.system_prompt = system_prompt
        self._max_frames = None if max_seconds is None else int(max_seconds * 1000.0 / FRAME_MS)
        self.stage_timing_every = stage_timing_every
        self._pending = np.zeros(0, dtype=np.float32)
        self._frame_index = 0
        self._text = ""
        self.closed = False
        self._pending_calls: tuple[ToolCall, ...] = ()
        self._deferred = 0  # frames run while waiting for results (replayed, as the session does)
        self.answers: list[list[ToolResult]] = []  # every answer_tool_calls, for tests

    @property
    def frame_index(self) -> int:
        return self._frame_index

    @property
    def awaiting_tool_results(self) -> bool:
        return bool(self._pending_calls)

    @property
    def pending_tool_calls(self) -> tuple[ToolCall, ...]:
        return self._pending_calls

    def answer_tool_calls(self, results: Sequence[ToolResult]) -> list[Event]:
        if not self._pending_calls:
            raise ToolLoopError("no tool call is waiting for a result")
        if len(results) != len(self._pending_calls):
            raise ToolLoopError(f"{len(self._pending_calls)} calls are pending; {len(results)} results were given")
        self.answers.append(list(results))
        self._pending_calls = ()
        replayed, self._deferred = self._deferred, 0
        positions = 1 + sum(len(result.content) // 4 + 8 for result in results)  # about a token per 4 characters
        return [ToolResponseInjected(self._frame_index, positions, tuple(range(positions)), 0.0, replayed)]

    def push(self, samples: np.ndarray, sample_rate: int) -> list[Event]:
        if self.closed:
            raise SessionClosedError("this conversation has ended; start a new one")
        if sample_rate != INPUT_SAMPLE_RATE:
            raise AudioInputError(f"expected {INPUT_SAMPLE_RATE} Hz audio, received {sample_rate} Hz")
        failure = self._engine.fail_next_push
        if failure is not None:
            self._engine.fail_next_push = None
            raise failure
        self._pending = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        events: list[Event] = []
        while self._pending.size >= INPUT_FRAME_SAMPLES:
            self._pending = self._pending[INPUT_FRAME_SAMPLES:]
            events += self._frame()
        return events

    def _frame(self) -> list[Event]:
        index = self._frame_index
        if self._max_frames is not None and index >= self._max_frames:
            raise ContextLimitError("the conversation reached its limit; start a new conversation")
        events: list[Event] = []
        scripted = tuple(replace(call, frame_index=index) for call in self._engine.script_tool_calls.get(index, ()))
        waiting = bool(self._pending_calls)
        if self.await_tool_results:
            self._pending_calls += scripted  # a call scripted while others wait joins them (the app refuses it)
        events += scripted
        if waiting:
            # The clock stands still: perception would run, the model says nothing, the frame plays silence.
            self._deferred += 1
            events.append(AudioChunk(index, np.zeros(OUTPUT_FRAME_SAMPLES, np.float32), np.zeros(31, np.int32)))
            events.append(self._timing(index))
            self._frame_index += 1
            return events
        word_every = self._engine.word_every
        if index % word_every == word_every - 1:
            delta = f" word{index}"
            self._text += delta
            events.append(AssistantTextDelta(index, 1000 + index, delta, self._text))
        tone = (0.01 * np.sin(np.arange(OUTPUT_FRAME_SAMPLES) * 0.1)).astype(np.float32)
        events.append(AudioChunk(index, tone, np.zeros(31, dtype=np.int32)))
        events.append(self._timing(index))
        self._frame_index += 1
        return events

    def _timing(self, index: int) -> FrameTiming:
        every = self.stage_timing_every
        on_device = every > 0 and index % every == 0
        total = self._engine.frame_ms
        return FrameTiming(
            frame_index=index,
            start_ms=index * FRAME_MS,
            stages_ms={stage: total / len(STAGES) for stage in STAGES},
            total_ms=total,
            host_syncs=5 if on_device else 2,
            timing_mode="device" if on_device else "host",
        )

    def set_economy(self, level: int) -> None:
        if level not in (0, 1, 2):
            raise ValueError(f"economy level must be one of (0, 1, 2); got {level!r}")
        if level and self.numerics != "fast":
            raise ValueError("exact numerics never spends less per frame; switch to fast numerics first")
        self.economy_levels.append((self._frame_index, level))

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    """An :class:`EnginePort` without a model: it loads any existing folder, and its frames take ``frame_ms``.

    It keeps what the worker asked of it (``loads``, ``warm_ups``, ``numerics_switches``, ``conversations``);
    ``fail_next_push`` (an exception) makes the next push into any conversation raise it.
    ``script_tool_calls`` maps a frame index to the ``ToolCall``s that frame completes (in every conversation):
    the conversation then waits for their results, playing silence, as the session does.
    """

    def __init__(self, *, frame_ms: float = 20.0, word_every: int = 4) -> None:
        self.frame_ms = frame_ms
        self.word_every = word_every
        self.fail_next_push: Exception | None = None
        self.script_tool_calls: dict[int, list[ToolCall]] = {}
        self.loads: list[Path] = []
        self.warm_ups = 0
        self.warmed_prompts: list[str | None] = []  # the system prompt each warm-up traced
        self.numerics_switches: list[str] = []
        self.conversations: list[FakeConversation] = []

    def prepare_device(self) -> tuple[str, str]:
        return "fake", "cpu: fake engine"

    def check_numerics(self, value: str) -> Numerics:
        if value == "exact":
            return "exact"
        if value == "fast":
            return "fast"
        raise ValueError(f"numerics must be one of exact, fast; got {value!r}")

    def load(self, path: Path, *, conversation_seconds: float, numerics: Numerics) -> FakeModel:
        if not Path(path).is_dir():
            raise CheckpointError(f"no checkpoint folder at {path}")
        self.loads.append(Path(path))
        return FakeModel(Path(path), numerics=numerics)

    def warm_up(
        self,
        model: LoadedModel,
        *,
        speech: np.ndarray | None,
        progress: Callable[[float], None] | None,
        system_prompt: str | None = None,
    ) -> None:
        self.warm_ups += 1
        self.warmed_prompts.append(system_prompt)
        if progress is not None:
            progress(1.0)

    def set_numerics(self, model: LoadedModel, numerics: Numerics) -> None:
        if not isinstance(model, FakeModel):
            raise TypeError(f"FakeEngine runs the models it loaded, not a {type(model).__name__}")
        model.numerics = numerics
        self.numerics_switches.append(numerics)

    def start_conversation(
        self,
        model: LoadedModel,
        *,
        system_prompt: str | None,
        max_seconds: float | None,
        seed: int = 0,
        stage_timing_every: int = 0,
        await_tool_results: bool = False,
    ) -> FakeConversation:
        numerics = model.numerics if isinstance(model, FakeModel) else "exact"
        conversation = FakeConversation(
            self, system_prompt, max_seconds, stage_timing_every, numerics, await_tool_results
        )
        self.conversations.append(conversation)
        return conversation
