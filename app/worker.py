"""The engine worker: the one thread that owns MLX.

Loading, warm-up, the speed check and every frame run on this thread (MLX streams and
its random generator are per thread; a lazy array must be evaluated where it was made).
Other threads talk to it only through its command queue and receive plain messages
(``app.messages`` and ``engine.events``, NumPy arrays only) through ``emit``.

Concurrency contract
    - ``submit()`` may be called from any thread; commands run in order on the worker.
    - ``emit`` is called on the worker thread and must not block (the controller's
      queue ``put_nowait``).
    - ``frame_source(timeout)`` and ``play(samples)`` are the audio side (``AudioIO``
      ``read_frame`` / ``play``), thread-safe by contract.
    - An exception while loading or inside a frame is caught here, logged with its
      traceback and reported as ``Failure``; the worker keeps running and accepts
      ``Load`` / ``NewConversation`` to recover.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.events import AssistantTextDelta, AudioChunk, FrameTiming

from .export import ConversationRecording
from .messages import (
    AppState,
    ConversationTime,
    Failure,
    FrameStats,
    LoadProgress,
    ModelLoaded,
    SpeedCheck,
    StateChanged,
)

log = logging.getLogger(__name__)

FRAME_S = 0.08
STATS_WINDOW = 100  # frames behind the overlay's live p50 / p95 / realtime factor
FALLING_BEHIND_FRAMES = 4  # queued input frames that count as "falling behind" (320 ms)
SPEED_CHECK_FRAMES = 30  # frames of silence in the post-load speed check (5 of them warm-up)
DEFAULT_MAX_CONVERSATION_S = 600.0


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Load:
    """Load a checkpoint folder (or generate the demo checkpoint first when ``demo``)."""

    path: Path
    demo: bool = False
    system_prompt: str = ""


@dataclass(frozen=True)
class NewConversation:
    system_prompt: str | None = None  # None keeps the current prompt


@dataclass(frozen=True)
class Pause:
    """Stop consuming frames (idle pause); audio input is discarded meanwhile."""


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Call:
    """Run ``function(worker)`` on the worker thread (for MLX work such as generating the demo checkpoint)."""

    function: Callable[[EngineWorker], Any]
    description: str = ""


Command = Load | NewConversation | Pause | Resume | Shutdown | Call


@dataclass
class FrameWindow:
    """The last frames' timings, for live statistics."""

    totals: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))

    def add(self, timing: FrameTiming) -> tuple[float, float, float]:
        from engine.profiler import percentile

        self.totals.append(timing.total_ms)
        totals = list(self.totals)
        return percentile(totals, 0.5), percentile(totals, 0.95), sum(totals) / len(totals) / (FRAME_S * 1000.0)


def speed_verdict(realtime_factor: float) -> str:
    if realtime_factor < 0.6:
        return f"This machine keeps up easily: a frame takes {realtime_factor:.0%} of its 80 ms."
    if realtime_factor < 0.9:
        return f"This machine keeps up: a frame takes {realtime_factor:.0%} of its 80 ms (little headroom)."
    if realtime_factor < 1.0:
        return f"This machine only just keeps up ({realtime_factor:.0%} of real time); expect occasional lag."
    return (
        f"This machine is too slow for live conversation: each 80 ms frame takes {realtime_factor * 80:.0f} ms. "
        "The assistant will fall behind; try the 4-bit model or a faster machine."
    )


class EngineWorker(threading.Thread):
    """Owns the model and the live session; processes microphone frames as they arrive."""

    def __init__(
        self,
        *,
        emit: Callable[[object], None],
        frame_source: Callable[[float], np.ndarray | None],
        play: Callable[[np.ndarray], None],
        backlog: Callable[[], int] = lambda: 0,
        counters: Callable[[], tuple[int, int]] = lambda: (0, 0),
        discard_audio: Callable[[], None] = lambda: None,
        max_conversation_s: float = DEFAULT_MAX_CONVERSATION_S,
        speed_check: bool = True,
        recording: ConversationRecording | None = None,
    ) -> None:
        super().__init__(name="parley-engine", daemon=True)
        self._emit = emit
        self._frame_source = frame_source
        self._play = play
        self._backlog = backlog
        self._counters = counters
        self._discard_audio = discard_audio
        self._recording = recording
        self._commands: queue.Queue[Command] = queue.Queue()
        self.max_conversation_s = max_conversation_s
        self.speed_check_enabled = speed_check
        self.voicechat: Any = None
        self.session: Any = None
        self.system_prompt = ""
        self.paused = False
        self.frames = FrameWindow()
        self.timings: list[FrameTiming] = []  # the current conversation's, for profile export
        self._stopping = False
        self._last_state: AppState | None = None
        self._last_speech_frame = 0

    # ------------------------------------------------------------------ any thread

    def submit(self, command: Command) -> None:
        self._commands.put(command)

    def stop(self, timeout: float = 5.0) -> None:
        self.submit(Shutdown())
        self.join(timeout)

    # ------------------------------------------------------------------ worker thread

    def run(self) -> None:
        import mlx.core as mx

        # A stream of our own on the default device: everything MLX does happens on this thread.
        mx.set_default_stream(mx.new_stream(mx.default_device()))
        while not self._stopping:
            live = self.session is not None and not self.paused
            try:
                # Idle: sleep until a command arrives. Live: take commands between frames.
                command = self._commands.get_nowait() if live else self._commands.get()
            except queue.Empty:
                command = None
            if command is not None:
                self._handle(command)
            elif live:
                self._pump_frame()

    def _handle(self, command: Command) -> None:
        try:
            if isinstance(command, Shutdown):
                self._stopping = True
                self._close_session()
            elif isinstance(command, Load):
                self._load(command)
            elif isinstance(command, NewConversation):
                if command.system_prompt is not None:
                    self.system_prompt = command.system_prompt
                self._open_session()
            elif isinstance(command, Pause):
                self.paused = True
                self._set_state(AppState.PAUSED, "Idle: the conversation sleeps until you talk.")
            elif isinstance(command, Resume):
                if self.paused:
                    self.paused = False
                    self._set_state(AppState.READY)
            elif isinstance(command, Call):
                command.function(self)
        except Exception as exc:  # noqa: BLE001 - the worker must survive anything a command does
            self._fail(f"{command.__class__.__name__.lower()} failed: {exc}", exc)

    def _load(self, command: Load) -> None:
        from engine.model import load_voicechat

        self._close_session()
        self.voicechat = None
        self._set_state(AppState.LOADING, f"Loading {command.path.name}…")
        self._emit(LoadProgress(-1.0, f"Reading {command.path}"))
        started = time.perf_counter()
        try:
            voicechat = load_voicechat(command.path, conversation_seconds=self.max_conversation_s)
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, the app stays usable
            self._fail(f"Could not load {command.path}: {exc}", exc, state=AppState.NO_MODEL)
            return
        self.voicechat = voicechat
        self.system_prompt = command.system_prompt
        saving = "" if voicechat.precast_bytes else " (memory-saving mode: weights kept as stored, a little slower)"
        self._emit(LoadProgress(0.6, f"Loaded in {time.perf_counter() - started:.1f} s{saving}; preparing the engine"))
        from engine.session import warm_up

        warm_up(voicechat)
        self._emit(LoadProgress(0.8, "Checking this machine's speed"))
        self._emit(ModelLoaded(voicechat.name, Path(command.path), voicechat.quantization_bits, command.demo))
        if self.speed_check_enabled:
            self._run_speed_check()
        self._emit(LoadProgress(1.0, "Ready"))
        self._open_session()

    def _run_speed_check(self) -> None:
        from engine.profiler import summarize
        from engine.session import Session

        session = Session(self.voicechat, seed=0)
        silence = np.zeros(self.voicechat.config.frame_samples, dtype=np.float32)
        timings = []
        for _ in range(SPEED_CHECK_FRAMES):
            timings += [e for e in session.push(silence, 16_000) if isinstance(e, FrameTiming)]
        session.close()
        rtf = summarize(timings, drop_first=5)["realtime_factor"]
        self._emit(SpeedCheck(rtf, speed_verdict(rtf)))

    def _open_session(self) -> None:
        from engine.session import Session

        if self.voicechat is None:
            return
        self._close_session()
        self.session = Session(self.voicechat, system_prompt=self.system_prompt, max_seconds=self.max_conversation_s)
        self.timings = []
        self.frames = FrameWindow()
        if self._recording is not None:
            self._recording.clear()
        self.paused = False
        self._last_speech_frame = 0
        # Microphone audio that queued while loading (or in the old conversation) is not part of this one;
        # feeding it would start the conversation a backlog behind.
        self._discard_audio()
        self._set_state(AppState.READY)
        self._emit(ConversationTime(0.0, self.max_conversation_s))

    def _close_session(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def _pump_frame(self) -> None:
        frame = self._frame_source(0.02)
        if frame is None:
            return
        from engine.errors import ContextLimitError

        session = self.session
        if self._recording is not None:
            self._recording.add_input(frame)
        try:
            events = session.push(frame, 16_000)
        except ContextLimitError as exc:
            self._close_session()
            self._emit(ConversationTime(self.max_conversation_s, 0.0))
            self._set_state(AppState.READY, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a failing frame must not take the app down
            self._close_session()
            self._fail(f"The engine failed on a frame: {exc}. Start a new conversation to continue.", exc)
            return
        for event in events:
            if isinstance(event, AudioChunk):
                self._play(event.samples)
                if self._recording is not None:
                    self._recording.add_output(event.samples)
            if isinstance(event, FrameTiming):
                self._record(event)
            elif isinstance(event, AssistantTextDelta):
                self._last_speech_frame = event.frame_index
                self._emit(event)
            else:
                self._emit(event)

    def _record(self, timing: FrameTiming) -> None:
        self.timings.append(timing)
        p50, p95, rtf = self.frames.add(timing)
        overflows, underruns = self._counters()
        backlog = self._backlog()
        self._emit(FrameStats(timing, backlog, overflows, underruns, p50, p95, rtf))
        elapsed = (timing.frame_index + 1) * FRAME_S
        if timing.frame_index % 12 == 0:
            self._emit(ConversationTime(elapsed, max(0.0, self.max_conversation_s - elapsed)))
        if backlog >= FALLING_BEHIND_FRAMES:
            self._set_state(AppState.FALLING_BEHIND, f"{backlog} frames ({backlog * 80} ms) waiting")
        elif self._last_state is AppState.FALLING_BEHIND:
            self._set_state(AppState.READY)

    def frames_since_speech(self) -> int:
        """Frames since the assistant last produced text (for the idle pause)."""
        session = self.session
        return 0 if session is None else session.frame_index - self._last_speech_frame

    def _set_state(self, state: AppState, detail: str = "") -> None:
        self._last_state = state
        self._emit(StateChanged(state, detail))

    def _fail(self, message: str, exc: BaseException, *, state: AppState = AppState.ERROR) -> None:
        details = "".join(traceback.format_exception(exc))
        log.error("%s\n%s", message, details)
        self._emit(Failure(message, details))
        self._set_state(state, message)
