"""The app's state has one owner: :class:`StatusBoard` folds every report into one snapshot.

Reports come from three places: the engine worker (``EngineState``, ``LoadProgress``,
``ModelLoaded``), the audio devices (which microphone and speaker are in use, or why
there are none) and the push-to-talk key with the assistant's audible output. The board
keeps the latest of each and derives a :class:`~app.messages.StateChanged` snapshot from
them, so the state line, the talk button, the status bar, the model chip and the overlay
all show the same thing: there is no second place a state word, a device name or the
loaded variant could come from. In hands-free mode the open microphone shows as listening
and, while the assistant speaks over it, as speaking. The real controller and the UI
tests' fake both use it. No Qt, no MLX; one thread (the controller's).
"""

from __future__ import annotations

from .messages import AppState, EngineState, LoadProgress, ModelLoaded, StateChanged

NO_DEVICE = "No microphone or speaker found. Connect one, or check the sound settings."
WAITING_FOR_KEY = "The conversation starts when you press the talk key"
HANDS_FREE = "hands-free: the microphone is open, talk any time"

TALKABLE = frozenset({AppState.READY, AppState.LISTENING, AppState.SPEAKING, AppState.FALLING_BEHIND, AppState.PAUSED})
"""The states in which the talk key (or button, or tray item) can start talking."""

# The engine's own states that say everything there is to say (nothing about audio or the key matters then).
_ENGINE_FIRST = (AppState.NO_MODEL, AppState.LOADING, AppState.ERROR)


class StatusBoard:
    """The latest report of each source, and the snapshot they add up to."""

    def __init__(self) -> None:
        self.engine = EngineState(AppState.NO_MODEL)
        self.model: ModelLoaded | None = None
        self.progress: LoadProgress | None = None
        self.microphone: str | None = None
        self.speaker: str | None = None
        self.audio_problem = NO_DEVICE
        self.talking = False  # push-to-talk: the key is held; hands-free: the microphone is open
        self.speaking = False
        self.hands_free = False

    # ------------------------------------------------------------------ reports

    def observe(self, message: object) -> bool:
        """Fold in ``message`` if it is a state report; returns whether it was one only the board needs."""
        if isinstance(message, EngineState):
            self.engine = message
            if message.state in (AppState.NO_MODEL, AppState.LOADING):
                self.model = None  # whatever was loaded is gone
            if message.state is not AppState.LOADING:
                self.progress = None
            return True
        if isinstance(message, LoadProgress):
            self.progress = message
            return True
        if isinstance(message, ModelLoaded):
            self.model = message
            return False  # also an event: the window says "Loaded …"
        return False

    def set_audio(self, microphone: str | None, speaker: str | None, problem: str | None = None) -> None:
        """The devices in use (None where there is none) and, when audio is unusable, why."""
        self.microphone, self.speaker = microphone, speaker
        self.audio_problem = problem or NO_DEVICE

    # ------------------------------------------------------------------ the snapshot

    def snapshot(self) -> StateChanged:
        engine = self.engine
        state, detail = self._state_and_detail()
        loading = state is AppState.LOADING
        return StateChanged(
            state=state,
            detail=detail,
            model=None if loading or state is AppState.NO_MODEL else self.model,
            microphone=self.microphone,
            speaker=self.speaker,
            progress=(self.progress.fraction if self.progress is not None else -1.0) if loading else None,
            conversation=engine.conversation and not loading,
        )

    def _state_and_detail(self) -> tuple[AppState, str]:
        engine = self.engine
        if engine.state in _ENGINE_FIRST:
            if engine.state is AppState.LOADING and self.progress is not None and self.progress.message:
                return engine.state, self.progress.message
            return engine.state, engine.detail
        if self.microphone is None or self.speaker is None:
            return AppState.NO_AUDIO, self.audio_problem
        if engine.state in (AppState.PAUSED, AppState.FALLING_BEHIND):
            return engine.state, engine.detail
        if self.hands_free and self.talking:
            # The microphone stays open while the assistant speaks (barge-in): show who is speaking.
            return (AppState.SPEAKING, HANDS_FREE) if self.speaking else (AppState.LISTENING, HANDS_FREE)
        if self.talking:
            return AppState.LISTENING, ""
        if self.speaking:
            return AppState.SPEAKING, ""
        if not engine.conversation:
            return AppState.READY, engine.detail or WAITING_FOR_KEY
        return AppState.READY, engine.detail
