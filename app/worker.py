"""The engine worker: the one thread that owns MLX.

Loading, warm-up, the speed check and every frame run on this thread (MLX streams and
its random generator are per thread; a lazy array must be evaluated where it was made).
Other threads talk to it only through its command queue and hear back only through
``emit`` (``app.messages`` and ``engine.events``, NumPy arrays only); it reaches the engine only through one
``EnginePort`` (``app.engine_port``: the MLX engine, or a fake in tests), and its audio comes and
goes through one ``AudioPort``.

A loaded model does not start a conversation by itself: nothing runs, and nothing plays,
until ``StartConversation`` (the talk key, or a start button). A load, ``NewConversation``
and ``SetNumerics`` all end the open conversation, prepare a fresh one (its system prompt
prefilled, so the next press of the talk key starts it without a wait) and report
``ConversationCleared``; none of them starts it.

Sleeping: ``Sleep`` (the user's Stop) and the idle pause put the open conversation to sleep:
no frame runs, the microphone is closed, the clock stands still, until ``StartConversation``
wakes it. The idle pause counts frames since the USER last spoke (the talk key held in push
to talk; a voiced frame in hands-free), not the assistant: a model that talks without a
break (the demo's noise) sleeps all the same.

A load that fails after its checks passed (out of memory, say) reloads the model that was
loaded before, so one bad folder never leaves the app without its working model.

Numerics: a model loads with the numerics its ``Load`` names, and ``SetNumerics`` switches the
loaded one in place (the engine port's ``set_numerics``: the weights are untouched, no reload),
then starts a new session. When the speed check after a load finds that exact numerics do
not keep up (realtime factor above 1), it measures fast numerics with the same check, puts
exact back, and reports ``NumericsAdvice`` if fast would keep up: the user decides.

Every ``exact_every``-th frame is timed stage by stage (``FrameTiming.timing_mode`` is
"device"): the session evaluates at each stage boundary for that one frame, so the
overlay can show exact per-stage times without paying three extra host syncs on every
frame. The other frames are timed where the host waited ("host"), which is exact for the
two phases (listening: perception + RN-T + language; speaking: TTS + codec).

Tools: with a ``ToolRunner`` set (``SetTools``), each new session's system prompt offers its enabled tools
(``engine.render_tool_prompt``). A frame that completes tool calls leaves the session waiting for their results:
the calls go to the runner (consent and the tool run on its thread), the worker keeps pushing microphone frames
(the session returns silence and keeps the user's audio for after), and between two frames, once every result is
in, answers them with ``answer_tool_calls`` and plays on. Calls that arrive while others are still running, or
when no tool is offered, are answered at once with the reason. Each answer is reported as ``ToolActivity``, and
the injected response as ``ToolResponseTiming``.

Concurrency contract
    - ``submit()`` may be called from any thread; commands run in order on the worker.
    - ``emit`` is called on the worker thread and must not block (the controller's
      queue ``put_nowait``).
    - An exception while loading or inside a frame is caught here, logged with its
      traceback and reported as ``Failure``; the worker keeps running and accepts
      ``Load`` / ``NewConversation`` to recover.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.events import AudioChunk, DeferredFramesDropped, Event, FrameTiming, ToolCall, ToolResponseInjected
from engine.timeline import FRAME_MS, FRAME_SECONDS, INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE

from .audio_port import AudioCounters, AudioPort
from .engine_port import Conversation, EnginePort, LoadedModel, MLXEngine
from .keep_up import ECONOMY_NAMES, KeepUpPolicy
from .messages import (
    AppState,
    ConversationCleared,
    ConversationEnded,
    ConversationStarted,
    ConversationTime,
    EngineInfo,
    EngineState,
    Failure,
    FrameStats,
    InputFrame,
    LoadProgress,
    ModelFallback,
    ModelLoaded,
    Notice,
    NumericsAdvice,
    NumericsChanged,
    SpeedCheck,
    ToolActivity,
    ToolResponseTiming,
    ToolTurnHeard,
)
from .speed_check import FrameWindow, numerics_advice, speed_verdict
from .tools.runner import OfferedTool, ToolRunner, model_specs, refusal, tool_results
from .variants import variant_for_checkpoint

if TYPE_CHECKING:
    from engine import Numerics

log = logging.getLogger(__name__)

FALLING_BEHIND_FRAMES = 4  # queued input frames that count as "falling behind" (320 ms)
SPEED_CHECK_FRAMES = 30  # frames of silence in the post-load speed check (5 of them warm-up)
DEFAULT_MAX_CONVERSATION_S = 600.0
EXACT_TIMING_EVERY = 25  # one frame in 25 (every 2 s) is timed stage by stage
DEMO_OUTPUT_GAIN = 10.0 ** (-26.0 / 20.0)
"""Random weights (the demo, a made checkpoint) make full-scale noise; they play 26 dB down (about -35 dBFS RMS)."""
USER_VOICE_RMS = 0.01
"""Hands-free: a microphone frame this loud (RMS) counts as the user speaking, for the idle pause."""


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Load:
    """Load a checkpoint folder; the conversation waits for ``StartConversation``."""

    path: Path
    demo: bool = False
    system_prompt: str = ""
    numerics: str = "exact"  # engine.numerics.NUMERICS
    random_weights: bool = False  # a made checkpoint (app.model_check found its marker): treated like the demo


@dataclass(frozen=True)
class LoadDemo:
    """Generate the demo checkpoint if needed (MLX work, so here), then load it."""

    system_prompt: str = ""
    numerics: str = "exact"


@dataclass(frozen=True)
class SetNumerics:
    """Switch the loaded model (and later loads) to "exact" or "fast" numerics in place; a new session follows."""

    numerics: str


@dataclass(frozen=True)
class StartConversation:
    """The user wants to talk: open a conversation if none is open, or wake a sleeping one."""


@dataclass(frozen=True)
class NewConversation:
    system_prompt: str | None = None  # None keeps the current prompt


@dataclass(frozen=True)
class SetIdlePause:
    """Sleep after ``delay_s`` in which the user did not speak (when ``enabled``), whatever the assistant does."""

    enabled: bool
    delay_s: float
    hands_free: bool = False  # the talk key opens the microphone for good: a voiced frame is what counts


@dataclass(frozen=True)
class SetKeepUp:
    """Fast numerics: let the TTS spend less per frame while frames fall behind (app.keep_up), or never."""

    enabled: bool


@dataclass(frozen=True)
class Sleep:
    """The user pressed Stop: the open conversation sleeps now (no frames, no clock) until the talk key."""

    reason: str = "Stopped. Press the talk key to wake the conversation."


@dataclass(frozen=True)
class SetTools:
    """Offer the tools of ``runner`` (None: none) from the next conversation on."""

    runner: ToolRunner | None


@dataclass(frozen=True)
class Shutdown:
    pass


Command = (
    Load
    | LoadDemo
    | StartConversation
    | NewConversation
    | SetIdlePause
    | SetNumerics
    | SetKeepUp
    | Sleep
    | SetTools
    | Shutdown
)


@dataclass
class ToolBatch:
    """Calls of one frame with the runner, and answers already decided (calls that came while it ran)."""

    future: concurrent.futures.Future[list[ToolActivity]]
    frame_index: int
    started: float  # time.monotonic() when the calls completed
    calls: int
    late: list[ToolActivity] = field(default_factory=list)
    dropped_told: bool = False  # the user was told that the oldest held frames are dropped


class EngineWorker(threading.Thread):
    """Owns the model and the live session; processes microphone frames as they arrive."""

    def __init__(
        self,
        *,
        emit: Callable[[object], None],
        audio: AudioPort,
        max_conversation_s: float = DEFAULT_MAX_CONVERSATION_S,
        speed_check: bool = True,
        exact_every: int = EXACT_TIMING_EVERY,
        engine: EnginePort | None = None,
    ) -> None:
        super().__init__(name="parley-engine", daemon=True)
        if exact_every < 1:
            raise ValueError(f"exact_every must be at least 1, got {exact_every}")
        self._emit = emit
        self._audio = audio
        self._engine: EnginePort = MLXEngine() if engine is None else engine
        self._commands: queue.Queue[Command] = queue.Queue()
        self.max_conversation_s = max_conversation_s
        self.speed_check_enabled = speed_check
        self.exact_every = exact_every
        # Everything below belongs to the worker thread.
        self._voicechat: LoadedModel | None = None
        self._model: ModelLoaded | None = None
        self._session: Conversation | None = None  # prepared, or running once started
        self._conversation_open = False  # the session's timeline runs (it consumes frames unless paused)
        self._system_prompt = ""
        self._paused = False
        self._conversations = 0
        self._frames = FrameWindow()
        self._counters_start = AudioCounters()
        self._stopping = False
        self._stopped = threading.Event()
        self._state = AppState.NO_MODEL
        self._last_user_frame = 0  # the session frame in which the user last spoke (or the conversation woke)
        self._idle_pause: SetIdlePause | None = None
        self._last_good: Load | None = None  # the last load that worked: reloaded if a later one fails
        self._numerics: Numerics = "exact"  # what the loaded model runs with
        self._keep_up: KeepUpPolicy | None = None  # the economy policy, when the user opted in (SetKeepUp)
        self._tools: ToolRunner | None = None
        self._offered: list[OfferedTool] = []  # what the open session's prompt offers
        self._tool_warnings: tuple[str, ...] = ()  # the last ones told, so that each is said once
        self._tool_batch: ToolBatch | None = None
        self._tool_turn_started: float | None = None  # a tool turn's start, until the assistant is heard again

    # ------------------------------------------------------------------ any thread

    def submit(self, command: Command) -> None:
        self._commands.put(command)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the session and release the model; returns once the worker is done (or after ``timeout``)."""
        if not self.is_alive():
            return
        self.submit(Shutdown())
        self._stopped.wait(timeout)

    # ------------------------------------------------------------------ worker thread

    def run(self) -> None:
        self._emit(EngineInfo(*self._engine.prepare_device()))
        while not self._stopping:
            live = self._session is not None and self._conversation_open and not self._paused
            try:
                # Idle: sleep until a command arrives. Live: take commands between frames.
                command = self._commands.get_nowait() if live else self._commands.get()
            except queue.Empty:
                command = None
            if command is not None:
                self._handle(command)
            elif live:
                self._pump_frame()
        self._voicechat = self._model = None
        self._stopped.set()
        # Parked, never returning: a thread that used MLX tears down MLX's per-thread state when it ends,
        # and that needs the GIL; if the interpreter is finalizing by then, the process aborts
        # ("terminate called without an active exception") on an ordinary quit. A daemon thread
        # parked here simply ends with the process.
        threading.Event().wait()

    def _handle(self, command: Command) -> None:
        try:
            if isinstance(command, Shutdown):
                self._stopping = True
                self._close_session()
            elif isinstance(command, Load):
                self._load(command)
            elif isinstance(command, LoadDemo):
                self._load_demo(command)
            elif isinstance(command, StartConversation):
                if self._session is None or not self._conversation_open:
                    self._start_session()
                elif self._paused:
                    self._resume()
            elif isinstance(command, NewConversation):
                if command.system_prompt is not None:
                    self._system_prompt = command.system_prompt
                self._fresh_conversation()
            elif isinstance(command, SetIdlePause):
                self._idle_pause = command
            elif isinstance(command, Sleep):
                if self._conversation_open:
                    self._pause(command.reason)
            elif isinstance(command, SetNumerics):
                self._set_numerics(command.numerics)
            elif isinstance(command, SetKeepUp):
                self._set_keep_up(command.enabled)
            elif isinstance(command, SetTools):
                self._tools = command.runner
        except Exception as exc:  # noqa: BLE001 - the worker must survive anything a command does
            self._fail(f"{command.__class__.__name__} failed: {exc}", exc)

    def _load_demo(self, command: LoadDemo) -> None:
        from .demo import ensure_demo_checkpoint

        self._close_session()
        self._set_state(AppState.LOADING, "Preparing the demo checkpoint…")
        path = ensure_demo_checkpoint()
        self._load(Load(path, demo=True, system_prompt=command.system_prompt, numerics=command.numerics))

    def _load(self, command: Load) -> None:
        self._close_session()
        self._voicechat = self._model = None
        self._emit(ConversationCleared())  # the old model's conversation is over, whatever this load does
        log.info("Loading %s%s", command.path, " (demo)" if command.demo else "")
        self._set_state(AppState.LOADING, f"Loading {command.path.name}…")
        self._emit(LoadProgress(-1.0, f"Reading {command.path}"))
        started = time.perf_counter()
        try:
            self._numerics = self._engine.check_numerics(command.numerics)
            voicechat = self._engine.load(
                command.path, conversation_seconds=self.max_conversation_s, numerics=self._numerics
            )
            model = ModelLoaded(
                voicechat.name,
                Path(command.path),
                variant_for_checkpoint(voicechat.quantization_bits, demo=command.demo),
                voicechat.describe(),
                random_weights=command.random_weights and not command.demo,
            )
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, the app stays usable
            previous, self._last_good = self._last_good, None
            text = str(exc) if str(command.path) in str(exc) else f"{command.path}: {exc}"
            if previous is None or previous.path == command.path:
                self._fail(f"Could not load {text}", exc, state=AppState.NO_MODEL)
                return
            log.error(
                "Could not load %s; reloading %s\n%s", text, previous.path, "".join(traceback.format_exception(exc))
            )
            self._emit(
                ModelFallback(f"Could not load {text}. The model loaded before, {previous.path.name}, loads again.")
            )
            self._load(previous)
            return
        self._system_prompt = command.system_prompt
        saving = "" if voicechat.precast_bytes else " (memory-saving mode: weights kept as stored, a little slower)"
        preparing = f"Loaded in {time.perf_counter() - started:.1f} s{saving}; preparing the engine"
        self._emit(LoadProgress(0.6, preparing))
        shown = [-1]

        def preparation(fraction: float) -> None:
            # A fresh GPU machine compiles its kernels here, for minutes: say how far it got.
            percent = int(fraction * 100)
            if percent != shown[0]:
                shown[0] = percent
                self._emit(LoadProgress(0.6 + 0.2 * fraction, f"{preparing} ({percent} %)"))

        self._warm_up(voicechat, progress=preparation)
        if self.speed_check_enabled:
            self._emit(LoadProgress(0.8, "Checking this machine's speed"))
            self._run_speed_check(voicechat, model)
        self._voicechat, self._model = voicechat, model
        self._last_good = command
        self._emit(LoadProgress(0.95, "Preparing the conversation (reading the system prompt)"))
        self._prepare_session()
        self._emit(model)
        self._set_state(AppState.READY)
        log.info(
            "Loaded %s (%s, %s numerics) from %s in %.1f s; ready",
            model.name,
            model.variant.label,
            voicechat.numerics,
            model.path,
            time.perf_counter() - started,
        )

    def _run_speed_check(self, voicechat: LoadedModel, model: ModelLoaded) -> None:
        rtf = self._measure_speed(voicechat)
        log.info("Speed check (%s numerics): realtime factor %.2f", voicechat.numerics, rtf)
        self._emit(SpeedCheck(rtf, speed_verdict(rtf, model.variant, random_weights=model.random_weights)))
        if voicechat.numerics != "exact" or rtf <= 1.0 or model.variant.demo:
            return  # the demo's speed says nothing about the real model's
        self._engine.set_numerics(voicechat, "fast")
        try:
            self._warm_up(voicechat)  # fast mode's own programs, so that tracing them is not timed
            fast = self._measure_speed(voicechat)
        finally:
            self._engine.set_numerics(voicechat, "exact")  # the user decides; until then the model stays as loaded
        log.info("Speed check (fast numerics, for comparison): realtime factor %.2f", fast)
        advice = numerics_advice(rtf, fast)
        if advice is not None:
            self._emit(NumericsAdvice(rtf, fast, advice))

    def _warm_up(self, voicechat: LoadedModel, progress: Callable[[float], None] | None = None) -> None:
        """Trace (and on a GPU compile) the programs of the numerics mode now in use (quick once traced), over
        the spoken question so that speech's paths are traced too; ``progress`` gets the fraction done."""
        from .bench import question_audio

        # The conversations' own prompt, so that fast numerics' first conversation finds its prefill traced.
        self._engine.warm_up(voicechat, speech=question_audio(), progress=progress, system_prompt=self._system_prompt)

    def _measure_speed(self, voicechat: LoadedModel) -> float:
        """The realtime factor of ``SPEED_CHECK_FRAMES`` frames of silence (the first 5 are warm-up)."""
        from engine import summarize

        session = self._engine.start_conversation(voicechat, system_prompt=None, max_seconds=None, seed=0)
        silence = np.zeros(INPUT_FRAME_SAMPLES, dtype=np.float32)
        timings = []
        for _ in range(SPEED_CHECK_FRAMES):
            timings += [e for e in session.push(silence, INPUT_SAMPLE_RATE) if isinstance(e, FrameTiming)]
        session.close()
        return float(summarize(timings, drop_first=5)["realtime_factor"])

    def _set_numerics(self, numerics: str) -> None:
        """Switch in place and start over: the conversation open now ends, a fresh one waits for the talk key."""
        self._numerics = self._engine.check_numerics(numerics)
        voicechat, model = self._voicechat, self._model
        if voicechat is None or model is None or voicechat.numerics == self._numerics:
            return
        self._engine.set_numerics(voicechat, self._numerics)
        self._warm_up(voicechat)  # the mode's programs differ: trace them now, not in the next conversation's frames
        self._model = dataclasses.replace(model, checkpoint=voicechat.describe())  # profiles record the mode
        log.info("Numerics switched to %s (fast changes in use: %s)", numerics, voicechat.fast_changes or "none")
        self._emit(NumericsChanged(numerics, dict(voicechat.fast_changes)))
        self._fresh_conversation()

    def _set_keep_up(self, enabled: bool) -> None:
        if enabled == (self._keep_up is not None):
            return
        if not enabled and self._keep_up is not None and self._keep_up.level and self._session is not None:
            self._session.set_economy(0)  # the full step from the next frame
        self._keep_up = KeepUpPolicy() if enabled else None
        log.info("Keeping up when slow: %s", "on (fast numerics only)" if enabled else "off")

    def _keep_up_after(self, timing: FrameTiming, backlog: int) -> int:
        """The economy level the next frame runs at, changed by the policy where the user opted in (fast numerics:
        exact never changes its numbers)."""
        policy, session = self._keep_up, self._session
        if policy is None or session is None or self._numerics != "fast":
            return 0
        level = policy.observe(timing.total_ms, backlog)
        if level is not None:
            session.set_economy(level)
            log.info(
                "Frame %d took %.0f ms with %d frames waiting: the voice now runs at economy level %d (%s)",
                timing.frame_index,
                timing.total_ms,
                backlog,
                level,
                ECONOMY_NAMES[level],
            )
        return policy.level

    def _fresh_conversation(self) -> None:
        """End the open conversation and prepare the next, which waits for the talk key like after a load."""
        self._prepare_session()
        self._emit(ConversationCleared())
        if self._model is not None:
            self._set_state(AppState.READY)

    def _prepare_session(self) -> None:
        """A fresh session with its prompt prefilled, not yet started (nothing reads or plays)."""
        self._close_session()  # also keeps the old conversation's unread microphone audio out of the next one
        if self._voicechat is None:
            return
        if self._keep_up is not None:
            self._keep_up.reset()  # a new session runs the full step
        prompt = self._conversation_prompt()  # offers the enabled tools, if any
        # One frame in N pays for exact per-stage times (the profiler's policy); the others keep the fast path.
        self._session = self._engine.start_conversation(
            self._voicechat,
            system_prompt=prompt,
            max_seconds=self.max_conversation_s,
            stage_timing_every=self.exact_every,
            await_tool_results=bool(self._offered),
        )

    def _start_session(self) -> None:
        """Start the prepared session (preparing one first if there is none): the conversation begins."""
        if self._session is None:
            self._prepare_session()
        if self._session is None or self._model is None:
            return
        self._conversation_open = True
        self._conversations += 1
        self._frames = FrameWindow()
        self._paused = False
        self._last_user_frame = 0
        self._counters_start = self._audio.counters()
        log.info(
            "Conversation %d started on %s (%s numerics)",
            self._conversations,
            self._model.description,
            self._model.checkpoint.get("numerics", "exact"),
        )
        self._emit(ConversationStarted(self._conversations, self._model))
        self._audio.start_capture()
        self._set_state(AppState.READY)
        self._emit(ConversationTime(0.0, self.max_conversation_s))

    def _conversation_prompt(self) -> str:
        """The system prompt, offering the enabled tools when there are any (and the prompt can take them)."""
        self._offered = []
        runner = self._tools
        if runner is None:
            return self._system_prompt
        prompt = self._system_prompt
        try:
            offered, warnings = runner.offered()
        except Exception as exc:  # tools must never stop a conversation from starting
            log.exception("The tools could not be prepared")
            offered, warnings = [], [f"No tools are offered in this conversation: {exc}."]
        if offered:
            from engine import render_tool_prompt

            try:
                prompt = render_tool_prompt(prompt, model_specs(offered))
            except ValueError as exc:  # ToolPromptError: a non-ASCII prompt, a bad description
                warnings = [*warnings, f"No tools are offered in this conversation: {exc}."]
            else:
                self._offered = offered
                log.info("Tools offered: %s", ", ".join(f"{t.name} ({t.source_label})" for t in offered))
        if tuple(warnings) != self._tool_warnings:
            self._tool_warnings = tuple(warnings)
            for warning in warnings:
                log.warning(warning)
                self._emit(Notice(warning))
        return prompt

    def _close_session(self) -> None:
        self._tool_turn_started = None
        if self._tool_batch is not None:
            self._tool_batch = None  # its answers would reach no one: the consent prompts close
            if self._tools is not None:
                self._tools.cancel_consents()
        if self._session is not None:
            self._session.close()
            self._session = None
            if self._conversation_open:
                self._audio.stop_capture()
                self._emit(ConversationEnded(self._conversations))  # after everything it said: keep it
        self._conversation_open = False

    def _pause(self, reason: str) -> None:
        if self._session is None or self._paused:
            return
        self._paused = True
        self._audio.stop_capture()
        self._audio.clear_output()  # asleep means silent: nothing queued plays on
        elapsed = self._session.frame_index * FRAME_SECONDS
        log.info("Conversation %d sleeps at %.2f s: %s", self._conversations, elapsed, reason)
        self._set_state(AppState.PAUSED, reason)
        self._emit(ConversationTime(elapsed, max(0.0, self.max_conversation_s - elapsed)))  # where the clock stops

    def _resume(self) -> None:
        self._paused = False
        self._last_user_frame = self._session.frame_index if self._session is not None else 0
        self._audio.start_capture()
        self._set_state(AppState.READY)

    def _pump_frame(self) -> None:
        self._answer_tool_calls()  # between two frames, when their results are in
        session = self._session
        frame = self._audio.read_frame(0.02)
        if frame is None or session is None:
            return
        key_held = self._audio.talking  # as the frame was read: the key may go up while it runs
        from engine.errors import ContextLimitError

        self._emit(InputFrame(frame))
        index = session.frame_index
        try:
            events = session.push(frame, INPUT_SAMPLE_RATE)
        except ContextLimitError as exc:
            self._prepare_session()  # the next press of the talk key starts a new conversation at once
            self._emit(ConversationTime(self.max_conversation_s, 0.0))
            self._set_state(AppState.READY, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a failing frame must not take the app down
            self._close_session()
            self._fail(f"The engine failed on a frame: {exc}. Start a new conversation to continue.", exc)
            return
        self._deliver(events)
        calls = [event for event in events if isinstance(event, ToolCall)]
        if calls:
            self._tool_calls_completed(session, calls)
        self._note_user(index, frame, key_held)
        self._maybe_idle_pause(session)

    def _deliver(self, events: list[Event]) -> None:
        """Play the audio, record the timings, report the rest."""
        gain = DEMO_OUTPUT_GAIN if self._model is not None and self._model.noise else 1.0
        for event in events:
            if isinstance(event, AudioChunk):
                if gain != 1.0:
                    event = dataclasses.replace(event, samples=event.samples * np.float32(gain))
                self._audio.play(event.samples)
                self._emit(event)  # for Save Conversation: what was played
                started = self._tool_turn_started
                if started is not None and np.any(event.samples):
                    self._tool_turn_started = None
                    self._emit(ToolTurnHeard(event.frame_index, time.monotonic() - started))
            elif isinstance(event, FrameTiming):
                self._record(event)
            elif isinstance(event, DeferredFramesDropped):
                batch = self._tool_batch
                if batch is not None and not batch.dropped_told:
                    batch.dropped_told = True
                    warning = (
                        "The tool call is taking long: what you say now is still transcribed, but the model will "
                        "hear only the last 20 s of it."
                    )
                    log.warning(warning)
                    self._emit(Notice(warning))
            else:
                self._emit(event)

    def _tool_calls_completed(self, session: Conversation, calls: list[ToolCall]) -> None:
        """Hand the calls to the runner; the session waits (its frames play silence) until they are answered."""
        if not session.awaiting_tool_results:
            return  # a session that does not wait for results: the calls are shown, nothing answers them
        pending = session.pending_tool_calls
        calls = [call for call in calls if call in pending]  # an interrupted call is reported, not waited for
        if not calls:
            return
        batch = self._tool_batch
        if batch is not None:
            reason = "another tool call is still running; wait for its result before calling again"
            batch.late += [refusal(call, reason) for call in calls]
            return
        future: concurrent.futures.Future[list[ToolActivity]]
        if self._tools is None or not self._offered:
            future = concurrent.futures.Future()
            future.set_result([refusal(call, "no tools are offered in this conversation") for call in calls])
        else:
            future = self._tools.run(calls, self._offered)
        self._tool_batch = ToolBatch(future, calls[0].frame_index, time.monotonic(), len(calls))

    def _answer_tool_calls(self) -> None:
        batch, session = self._tool_batch, self._session
        if batch is None or not batch.future.done():
            return
        self._tool_batch = None
        try:
            activities = batch.future.result() + batch.late
        except Exception as exc:
            log.exception("The tool runner failed")
            activities = [refusal(call, f"the app failed to run the tool: {exc}") for call in self._pending(session)]
        for activity in activities:
            self._emit(activity)
        if session is None or not session.awaiting_tool_results:
            return
        pending = self._pending(session)
        # One answer per pending call, in order (the session counts them): any it holds beyond ours are refused.
        activities = activities[: len(pending)] + [
            refusal(call, "the app lost track of this call") for call in pending[len(activities) :]
        ]
        try:
            events = session.answer_tool_calls(tool_results(activities))
        except Exception as exc:  # noqa: BLE001 - a failing answer must not take the app down
            self._close_session()
            self._fail(f"The engine failed to take the tool results: {exc}. Start a new conversation.", exc)
            return
        self._tool_turn_started = batch.started
        for event in events:
            if isinstance(event, ToolResponseInjected):
                turn_s = time.monotonic() - batch.started
                self._emit(
                    ToolResponseTiming(
                        event.frame_index,
                        len(activities),
                        event.positions,
                        event.seconds,
                        turn_s,
                        event.replayed_frames,
                    )
                )
                log.info(
                    "Tool results injected: %d positions in %.2f s; the tool turn took %.2f s; %d frames replayed",
                    event.positions,
                    event.seconds,
                    turn_s,
                    event.replayed_frames,
                )
        self._deliver([event for event in events if not isinstance(event, ToolResponseInjected)])
        calls = [event for event in events if isinstance(event, ToolCall)]
        if calls:
            self._tool_calls_completed(session, calls)  # the replayed frames may hold the next call

    @staticmethod
    def _pending(session: Conversation | None) -> tuple[ToolCall, ...]:
        return session.pending_tool_calls if session is not None else ()

    def _record(self, timing: FrameTiming) -> None:
        p50, p95, rtf = self._frames.add(timing)
        counters = self._audio.counters().since(self._counters_start)
        backlog = counters.backlog_frames
        lost, underruns, skipped = counters.input_lost_s, counters.output_underruns, counters.output_skipped_s
        economy = self._keep_up_after(timing, backlog)
        self._emit(
            FrameStats(
                timing,
                backlog,
                lost,
                underruns,
                p50,
                p95,
                rtf,
                self.exact_every,
                output_skipped_s=skipped,
                economy_level=economy,
            )
        )
        elapsed = (timing.frame_index + 1) * FRAME_SECONDS
        if timing.frame_index % 12 == 0:
            self._emit(ConversationTime(elapsed, max(0.0, self.max_conversation_s - elapsed)))
        if backlog >= FALLING_BEHIND_FRAMES:
            self._set_state(AppState.FALLING_BEHIND, f"{backlog} frames ({backlog * FRAME_MS:.0f} ms) waiting")
        elif self._state is AppState.FALLING_BEHIND:
            self._set_state(AppState.READY)

    def _note_user(self, index: int, frame: np.ndarray, key_held: bool) -> None:
        """Frame ``index`` counts as the user speaking: the talk key held (push to talk), or a voiced frame
        (hands-free, where the microphone stays open)."""
        idle = self._idle_pause
        hands_free = idle is not None and idle.hands_free
        if hands_free:
            spoke = float(np.sqrt(np.mean(np.square(frame)))) > USER_VOICE_RMS
        else:
            spoke = key_held
        if spoke:
            self._last_user_frame = index + 1

    def _frames_since_user(self, session: Conversation) -> int:
        """Frames since the user last spoke, or the conversation started or woke (what the idle pause counts)."""
        return session.frame_index - self._last_user_frame

    def _maybe_idle_pause(self, session: Conversation) -> None:
        idle = self._idle_pause
        if idle is None or not idle.enabled or self._paused or not self._conversation_open:
            return
        if self._frames_since_user(session) * FRAME_SECONDS >= idle.delay_s:
            self._pause(f"Nobody has spoken for {idle.delay_s:.0f} s. Press the talk key to wake the conversation.")

    def _set_state(self, state: AppState, detail: str = "") -> None:
        self._state = state
        self._emit(EngineState(state, detail, conversation=self._session is not None and self._conversation_open))

    def _fail(self, message: str, exc: BaseException, *, state: AppState = AppState.ERROR) -> None:
        details = "".join(traceback.format_exception(exc))
        log.error("%s\n%s", message, details)
        self._emit(Failure(message, details))
        self._set_state(state, message)
