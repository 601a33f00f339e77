"""The only bridge between the app core and Qt: drains ``controller.poll()`` into typed signals.

Concurrency contract: the pump lives on the Qt main thread and so does every call it
makes — ``controller.poll()`` is the controller's thread-safe drain of messages that the
engine worker and audio callbacks queued. A QTimer ticks at about 30 Hz; each tick emits
at most ``max_per_tick`` messages and keeps the rest, in order, for the next tick, so a
burst (say, after the window was blocked) cannot freeze the UI. Signals are emitted
synchronously on the main thread, so slots may touch widgets directly.
"""

from __future__ import annotations

import logging
import traceback
from collections import deque
from typing import Final

from PySide6.QtCore import QObject, QTimer, Signal, SignalInstance

from app.messages import (
    ConsentClosed,
    ConsentRequest,
    ConversationCleared,
    ConversationStarted,
    ConversationTime,
    DeviceStatus,
    DownloadProgress,
    Failure,
    FrameStats,
    GlobalTalk,
    HistorySaved,
    Levels,
    ModelFallback,
    ModelLoaded,
    Notice,
    NumericsAdvice,
    NumericsChanged,
    ReplayProgress,
    SpeedCheck,
    StateChanged,
    TimerDone,
    ToolActivity,
    ToolResponseTiming,
    ToolsListed,
    ToolTurnHeard,
    TurnLatency,
)
from engine.events import AssistantTextDelta, ToolCall, UserTranscriptDelta

from .contracts import Controller

log = logging.getLogger(__name__)

TICK_MS: Final = 33
MAX_PER_TICK: Final = 256


class EventPump(QObject):
    """Polls the controller on a timer and re-emits each message as the signal of its type."""

    state_changed = Signal(StateChanged)
    frame_stats = Signal(FrameStats)
    levels = Signal(Levels)
    model_loaded = Signal(ModelLoaded)
    conversation_started = Signal(ConversationStarted)
    conversation_cleared = Signal(ConversationCleared)
    model_fallback = Signal(ModelFallback)
    turn_latency = Signal(TurnLatency)
    speed_check = Signal(SpeedCheck)
    conversation_time = Signal(ConversationTime)
    device_status = Signal(DeviceStatus)
    download_progress = Signal(DownloadProgress)
    failure = Signal(Failure)
    notice = Signal(Notice)
    user_transcript = Signal(UserTranscriptDelta)
    assistant_text = Signal(AssistantTextDelta)
    tool_call = Signal(ToolCall)
    global_talk = Signal(GlobalTalk)
    history_saved = Signal(HistorySaved)
    numerics_changed = Signal(NumericsChanged)
    numerics_advice = Signal(NumericsAdvice)
    replay_progress = Signal(ReplayProgress)
    consent_request = Signal(ConsentRequest)
    consent_closed = Signal(ConsentClosed)
    tool_activity = Signal(ToolActivity)
    tool_response = Signal(ToolResponseTiming)
    timer_done = Signal(TimerDone)
    tools_listed = Signal(ToolsListed)
    tool_turn_heard = Signal(ToolTurnHeard)

    def __init__(
        self,
        controller: Controller,
        parent: QObject | None = None,
        *,
        interval_ms: int = TICK_MS,
        max_per_tick: int = MAX_PER_TICK,
    ) -> None:
        super().__init__(parent)
        if max_per_tick < 1:
            raise ValueError(f"max_per_tick must be at least 1; got {max_per_tick}")
        self._controller = controller
        self._max_per_tick = max_per_tick
        self._pending: deque[object] = deque()
        self._poll_failed = False
        self._routes: dict[type, SignalInstance] = {
            StateChanged: self.state_changed,
            FrameStats: self.frame_stats,
            Levels: self.levels,
            ModelLoaded: self.model_loaded,
            ConversationStarted: self.conversation_started,
            ConversationCleared: self.conversation_cleared,
            ModelFallback: self.model_fallback,
            TurnLatency: self.turn_latency,
            SpeedCheck: self.speed_check,
            ConversationTime: self.conversation_time,
            DeviceStatus: self.device_status,
            DownloadProgress: self.download_progress,
            Failure: self.failure,
            Notice: self.notice,
            UserTranscriptDelta: self.user_transcript,
            AssistantTextDelta: self.assistant_text,
            ToolCall: self.tool_call,
            GlobalTalk: self.global_talk,
            HistorySaved: self.history_saved,
            NumericsChanged: self.numerics_changed,
            NumericsAdvice: self.numerics_advice,
            ReplayProgress: self.replay_progress,
            ConsentRequest: self.consent_request,
            ConsentClosed: self.consent_closed,
            ToolActivity: self.tool_activity,
            ToolResponseTiming: self.tool_response,
            TimerDone: self.timer_done,
            ToolsListed: self.tools_listed,
            ToolTurnHeard: self.tool_turn_heard,
        }
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.drain)

    @property
    def pending(self) -> int:
        """Messages already polled but not yet emitted (left over from a burst)."""
        return len(self._pending)

    def start(self) -> None:
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def is_running(self) -> bool:
        return self._timer.isActive()

    def drain(self) -> int:
        """Poll once and emit up to ``max_per_tick`` messages; returns how many were emitted."""
        try:
            self._pending.extend(self._controller.poll())
            self._poll_failed = False
        except Exception as exc:  # the app core failed; report it, keep the UI alive
            log.exception("controller.poll() failed")
            if not self._poll_failed:  # report once, not 30 times a second
                self._poll_failed = True
                problem = f"The app core stopped responding: {exc}"
                self.failure.emit(Failure(problem, traceback.format_exc(), recoverable=False))
        emitted = 0
        while self._pending and emitted < self._max_per_tick:
            message = self._pending.popleft()
            emitted += 1
            signal = self._routes.get(type(message))
            if signal is None:
                log.debug("ignoring message of type %s", type(message).__name__)
                continue
            signal.emit(message)
        return emitted
