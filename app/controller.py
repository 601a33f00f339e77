"""The app core the window talks to: push-to-talk, audio, the engine worker, settings, export.

Qt-free. The UI calls these methods on its main thread and drains :meth:`AppController.poll`
about 30 times a second; everything the worker, the audio streams and the download thread
report arrives there as ``app.messages`` / ``engine.events`` objects, in the order it
happened. The app's state has one owner, the ``StatusBoard``: ``poll`` hands the UI a new
``StateChanged`` snapshot right after whichever report changed it.

Nothing plays before the user chooses: a loaded model waits, and the conversation starts
with the first press of the talk key or :meth:`start_conversation` (a start button). A model
switch, New Conversation and a numerics switch alike end the conversation and wait for the
key again (``ConversationCleared`` tells the window to drop the old one).

Switching is checked first (``app.model_check``): a folder that is not a VoiceChat checkpoint,
or holds another variant than its slot, is refused before anything is unloaded, and the
loaded model and the settings stay. At launch a refused folder falls back to another
configured model that passes (or the demo), and ``ModelFallback`` says so.

Stop (:meth:`stop_speaking`) hushes the speaker and puts the conversation to sleep; whatever
the worker still reports from frames run after the press (never heard) is dropped.

What else it owns:
    - **Hands-free**: one ``app.echo.EchoCanceller`` per launch, handed to the streams while
      the setting is on (``AudioIO.set_echo_canceller``); its stats go to the log at the end
      of each conversation and to the overlay with every frame's stats.
    - **The global talk key** (``app.hotkey.GlobalTalkKey``): its events arrive on the
      listener's thread and are queued as ``GlobalTalk`` messages, so the window's talk
      control handles them on its own thread like the in-window key.
    - **Conversation history**: when the worker reports ``ConversationEnded`` (in queue
      order, after everything that conversation said), the conversation is handed to a
      saver thread that writes it with ``app.history.ConversationHistory``; at shutdown the
      last one is saved before the process exits. With saving off, a conversation not
      saved by hand is "at risk" (:meth:`conversation_at_risk`) and the window asks before
      New Conversation or Quit drops it. Replays go through the speaker (``start_replay``).

Concurrency contract
    - Public methods run on the caller's (UI) thread and never block on the engine: work
      for MLX goes to the worker's command queue, downloads to their own thread.
    - The worker, the download thread and the crash hooks only ``put_nowait`` into
      ``_messages``; the worker reaches the sound devices only through the ``AudioPort``.
    - The audio streams (``AudioIO``) are owned here.
"""

from __future__ import annotations

import logging
import platform
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from engine.events import AssistantTextDelta, AudioChunk, ToolCall, UserTranscriptDelta
from engine.timeline import OUTPUT_SAMPLE_RATE

from .audio_port import AudioPort, AudioStreams
from .echo import EchoCanceller, echo_cancellation_unavailable
from .export import (
    ConversationRecording,
    ExportError,
    NothingToExport,
    SessionProfile,
    Transcript,
    conversation_log,
    export_profile,
    save_conversation,
)
from .hf_cache import CacheListing, list_cached_checkpoints
from .history import (
    ConversationHistory,
    ConversationRecord,
    HistoryError,
    HistoryListing,
    LoadedConversation,
    TranscriptLine,
    default_history_dir,
)
from .hotkey import (
    GlobalKeySupport,
    GlobalTalkKey,
    HotkeyBackend,
    HotkeyUnavailable,
    KeySpecError,
    TalkEvent,
    TalkMode,
    global_key_support,
    parse_key_spec,
)
from .logs import CrashHandlers, configure_logging, install_crash_handlers
from .messages import (
    ConversationCleared,
    ConversationEnded,
    ConversationStarted,
    ConversationTime,
    DeviceStatus,
    DownloadProgress,
    EchoSummary,
    EngineInfo,
    EngineState,
    Failure,
    FrameStats,
    GlobalTalk,
    HistorySaved,
    InputFrame,
    Levels,
    ModelFallback,
    ModelLoaded,
    Notice,
    NumericsChanged,
    ReplayProgress,
    StateChanged,
    TurnLatency,
)
from .model_check import CheckedCheckpoint, CheckpointRefused, check_checkpoint
from .paths import config_dir, data_dir, log_dir
from .settings import Settings, save_settings
from .status import StatusBoard
from .variants import MODEL_VARIANTS, variant, variant_for_repo
from .worker import (
    EngineWorker,
    Load,
    LoadDemo,
    NewConversation,
    SetIdlePause,
    SetNumerics,
    Sleep,
    StartConversation,
)

log = logging.getLogger(__name__)

HEALTH_INTERVAL_S = 0.5
SPEAKING_HOLD_S = 0.6  # the assistant counts as speaking this long after its last audible block
SETTINGS_SAVE_DELAY_S = 0.5  # a dragged volume slider is saved once it rests, not at every step
REPLAY_REPORT_S = 0.25  # a replay's position is reported this often
SHUTDOWN_SAVE_TIMEOUT_S = 60.0  # quitting waits this long for the last conversation to reach the disk

AudioFactory = Callable[..., AudioStreams]
WorkerFactory = Callable[..., EngineWorker]
HotkeyBackendFactory = Callable[[], HotkeyBackend]
EchoFactory = Callable[[], EchoCanceller]


class AppController:
    """Owns audio, the engine worker and the settings; turns UI intent into commands."""

    def __init__(
        self,
        settings: Settings,
        *,
        settings_path: Path | None = None,
        audio_factory: AudioFactory | None = None,
        worker_factory: WorkerFactory = EngineWorker,
        auto_demo: bool = True,
        log_folder: Path | None = None,
        history_folder: Path | None = None,
        hotkey_backend: HotkeyBackendFactory | None = None,
        echo_factory: EchoFactory = EchoCanceller,
    ) -> None:
        self.settings = settings
        self._settings_path = settings_path
        self._audio_factory = audio_factory
        self._auto_demo = auto_demo
        self._log_folder = log_folder or log_dir()
        self._messages: queue.Queue[object] = queue.Queue()
        self.recording = ConversationRecording()
        self.transcript = Transcript()
        self.profile = SessionProfile()
        self.port = AudioPort()
        self.worker = worker_factory(emit=self._messages.put_nowait, audio=self.port)
        self.board = StatusBoard()
        self.engine_info: EngineInfo | None = None
        self.talking = False
        self._shown: StateChanged | None = None
        self._next_health = 0.0
        self._save_due: float | None = None
        self._download: tuple[threading.Thread, threading.Event] | None = None
        self._crash_handlers: CrashHandlers | None = None
        self.history = ConversationHistory(
            history_folder or default_history_dir(), max_bytes=settings.history_max_bytes, enabled=settings.history
        )
        self._saver = _HistorySaver(self.history, self._post)
        self._kept = False  # the current conversation was saved (to the history, or by hand)
        self._serial = 0  # counts conversations seen here, to match a failed save to its conversation
        self._history_failing = False  # the last save to the history failed (until one succeeds)
        self._echo_factory = echo_factory
        self._echo: EchoCanceller | None = None
        self._hotkey_backend = hotkey_backend
        self._global_key: GlobalTalkKey | None = None
        self._replaying: str | None = None
        self._next_replay_report = 0.0
        self._numerics: str | None = None  # what the loaded model runs with (None: nothing loaded yet)
        self._stopped = False  # Stop was pressed and the worker has not reported its sleep yet: drop its frames
        self._audible_at_release = False  # the assistant was still heard as the talk key went up
        self._requested: Path | None = None  # the folder of the load asked for last (None: the demo)

    @property
    def audio(self) -> AudioStreams | None:
        """The sound streams in use, or None when no device could be opened."""
        return self.port.streams

    @property
    def status(self) -> StateChanged:
        """The current state snapshot (what the last ``StateChanged`` said, or will say)."""
        return self.board.snapshot()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        configure_logging(self._log_folder)
        self._crash_handlers = install_crash_handlers(self._report_crash, self._log_folder)
        log.info(
            "Parley %s starting (Python %s, %s)", _parley_version(), platform.python_version(), platform.platform()
        )
        self.worker.start()
        self._set_idle_pause()
        self._open_audio()
        self._configure_global_key()
        self._load_configured()

    def _set_idle_pause(self) -> None:
        settings = self.settings
        self.worker.submit(SetIdlePause(settings.idle_pause, settings.idle_pause_delay_s, settings.hands_free))

    def _load_configured(self) -> None:
        """At launch: the active model if its folder passes the checks, else another configured one, else the demo."""
        active = self.settings.active_variant
        path = self.settings.active_checkpoint
        if active is None or path is None:
            self._no_model()
            return
        try:
            self._load(check_checkpoint(path, active))
            return
        except CheckpointRefused as exc:
            reason = f"The {variant(active).label} folder cannot be used: {exc}"
        log.warning("%s", reason)
        for other in MODEL_VARIANTS:
            folder = self.settings.checkpoint_for(other.key)
            if other.key == active or folder is None:
                continue
            try:
                checked = check_checkpoint(folder, other.key)
            except CheckpointRefused as exc:
                log.warning("The %s folder cannot be used either: %s", other.label, exc)
                continue
            self._post(ModelFallback(f"{reason} The {other.label} model loads instead (Settings → Model)."))
            self._load(checked)
            return
        if self._auto_demo:
            self._post(ModelFallback(f"{reason} The demo loads instead (File → Get a Model… for a model)."))
        else:
            self._post(Failure(reason))
        self._no_model()

    def _no_model(self) -> None:
        if self._auto_demo:
            # Loaded, not started: "Try the demo" (or the talk key) starts it at once, and nothing plays before.
            self.start_demo()

    def shutdown(self) -> None:
        self.cancel_download()
        self._stop_global_key()
        self.worker.stop()
        self._keep_what_is_left()
        self._flush_settings()
        streams = self.port.streams
        self.port.attach(None)
        if streams is not None:
            streams.close()
        if self._crash_handlers is not None:
            self._crash_handlers.uninstall()
            self._crash_handlers = None
        log.info("Parley stopped")

    def _open_audio(self) -> None:
        try:
            factory = self._audio_factory
            if factory is None:
                from .audio.streams import AudioIO

                factory = AudioIO
            settings = self.settings
            streams = factory(
                settings.input_device,
                settings.output_device,
                duck_while_talking=settings.ducking,
                capture=False,  # the worker opens the microphone when a conversation reads it
                volume=settings.volume,
                muted=settings.muted,
            )
            streams.start()
        except Exception as exc:  # noqa: BLE001 - no audio must never stop the app from opening
            log.warning("Audio unavailable: %s", exc)
            self.port.attach(None)
            self.board.set_audio(None, None, str(exc))
            self._post(Failure(str(exc)))
            return
        self.port.attach(streams)
        self._update_devices()
        log.info("Audio: microphone %r, speaker %r", streams.input_device_name, streams.output_device_name)
        self._configure_hands_free()

    def _update_devices(self, statuses: list[DeviceStatus] | None = None) -> None:
        streams = self.port.streams
        if streams is None:
            return
        problem = statuses[-1].message if statuses else None
        if streams.paused:
            self.board.set_audio(None, None, problem or "Audio is paused until a sound device is available.")
        else:
            self.board.set_audio(streams.input_device_label, streams.output_device_label)

    def _report_crash(self, message: str, details: str) -> None:
        # Called from any thread by the crash hooks: only the queue is touched here.
        self._post(Failure(f"{message}. Parley keeps running; the log has the details.", details))

    def _post(self, message: object) -> None:
        self._messages.put_nowait(message)

    # ------------------------------------------------------------------ polling (UI thread)

    def poll(self) -> list[object]:
        """Everything that happened since the last call, oldest first, with a snapshot after each state change."""
        now = time.monotonic()
        out: list[object] = []
        streams = self.port.streams
        if streams is not None and now >= self._next_health:
            self._next_health = now + HEALTH_INTERVAL_S
            statuses = streams.poll_health()
            for status in statuses:
                log.info("Audio devices: %s", status.message)
                out.append(status)
            if statuses:
                self._update_devices(statuses)
                self._snapshot_into(out)
        while True:
            try:
                message = self._messages.get_nowait()
            except queue.Empty:
                break
            if self._consume(message):
                out.append(self._with_echo(message) if isinstance(message, FrameStats) else message)
            self._snapshot_into(out)
        if streams is not None:
            for latency in streams.take_turn_latencies():
                if self._audible_at_release:
                    # Still heard as the key went up (talking over the user, or a noise model that never stops):
                    # the first sound after the release is no reply, and its "delay" would be the audio block's.
                    log.info("No reply delay this turn: the assistant was still audible when the key went up")
                    continue
                out.append(self._add_latency(latency))
            self.board.speaking = now - streams.last_audible < SPEAKING_HOLD_S
        self.board.talking = self.talking
        self._snapshot_into(out)
        if streams is not None:
            out.append(Levels(streams.input_peak, streams.output_peak))
        if self._replaying is not None and now >= self._next_replay_report:
            self._next_replay_report = now + REPLAY_REPORT_S
            out.append(self._replay_progress())
        if self._save_due is not None and now >= self._save_due:
            self._flush_settings()
        return out

    def _consume(self, message: object) -> bool:
        """Fold ``message`` into the core's state; returns whether the UI needs it too."""
        if self._stopped:
            if isinstance(message, EngineState | ConversationStarted | ConversationCleared):
                self._stopped = False  # the worker heard Stop (asleep), or another conversation began
            elif isinstance(message, _FROM_FRAMES):
                return False  # from frames run after Stop was pressed: never heard, so never "said"
        if self.board.observe(message):
            return False
        if isinstance(message, _AdoptCheckpoint):
            self._adopt(message)
            return False
        if isinstance(message, _NotKept):
            # Until a save works again the history cannot be relied on: the window asks before dropping anything.
            self._history_failing = True
            if message.serial == self._serial:
                self._kept = False  # still the current conversation: Save Conversation… can keep it
            return False
        if isinstance(message, HistorySaved):
            self._history_failing = False
        if isinstance(message, EngineInfo):
            self.engine_info = message
            return False
        if isinstance(message, ConversationEnded):
            self._conversation_ended(message)
            return False
        if isinstance(message, InputFrame):
            self.recording.add_input(message.samples)
            return False
        if isinstance(message, AudioChunk):
            self.recording.add_output(message.samples)
            return False
        if isinstance(message, ConversationCleared):
            # In queue order, after all the old conversation said (ConversationEnded kept it): the next one starts
            # clean, and the window drops the old one's transcript, clock and counters.
            self._drop_conversation()
        elif isinstance(message, ConversationStarted):
            # In queue order: whatever the previous conversation still said is already in, so nothing mixes.
            self._drop_conversation()
            self._serial += 1
            self.profile.begin(
                message.number,
                message.model.variant.key,
                message.model.checkpoint,
                model=message.model.description,
                settings=self._profile_settings(),
            )
        elif isinstance(message, ModelLoaded):
            self._numerics = str(message.checkpoint.get("numerics", "exact"))
            self._came_back(message)
        elif isinstance(message, NumericsChanged):
            self._numerics = message.numerics
        elif isinstance(message, FrameStats):
            current = self.profile.current
            if current is not None:
                current.timings.append(message.timing)
                current.last_stats = message
        elif isinstance(message, UserTranscriptDelta | AssistantTextDelta | ToolCall):
            self.transcript.add(message)
        return True

    def _came_back(self, loaded: ModelLoaded) -> None:
        """The worker reloaded the previous model because the one asked for failed after its checks: the active
        model setting goes back with it (the worker's ModelFallback said why)."""
        requested, self._requested = self._requested, None
        if requested is None or loaded.path == requested or loaded.variant.demo:
            return
        key = loaded.variant.key
        if self.settings.checkpoint_for(key) == loaded.path and self.settings.active_variant != key:
            self.settings = self.settings.with_changes(active_variant=key)
            self._save()

    def _drop_conversation(self) -> None:
        if not self._kept:
            self._keep_in_history()  # never reported as ended (it should have been): keep it all the same
        self.transcript.clear()
        self.recording.clear()
        self._kept = False

    def _add_latency(self, latency_s: float) -> TurnLatency:
        from engine import percentile

        current = self.profile.current
        values = [latency_s]
        if current is not None:
            current.latencies_s.append(latency_s)
            values = current.latencies_s
        log.info("Reply heard %.0f ms after the talk key was released", latency_s * 1000.0)
        return TurnLatency(latency_s, percentile(values, 0.5), percentile(values, 0.95), len(values))

    def _snapshot_into(self, out: list[object]) -> None:
        snapshot = self.board.snapshot()
        if snapshot != self._shown:
            self._shown = snapshot
            out.append(snapshot)

    # ------------------------------------------------------------------ push to talk and conversations

    def set_talking(self, talking: bool) -> None:
        streams = self.port.streams
        if self.talking and not talking:
            self._audible_at_release = streams is not None and (
                time.monotonic() - streams.last_audible < SPEAKING_HOLD_S
            )
        self.talking = talking
        if streams is not None:
            streams.talking = talking
        if talking and self.board.model is not None:
            if streams is not None:
                streams.start_capture()  # from the key press on: the first words are not lost while a session opens
            self.worker.submit(StartConversation())

    def _with_echo(self, stats: FrameStats) -> FrameStats:
        """``stats`` with the echo canceller's summary, in hands-free."""
        echo = self._echo
        streams = self.port.streams
        if echo is None or streams is None or not self.settings.hands_free:
            return stats
        figures = echo.stats
        blocks = max(1, figures.blocks)
        summary = EchoSummary(
            figures.cost_per_block_s * 8 * 1000.0,  # 8 blocks of 10 ms per 80 ms frame
            figures.reference_blocks / blocks,
            figures.drift_corrections,
        )
        return replace(stats, echo=summary)

    def start_conversation(self) -> None:
        """Start the conversation now, if none is open (the first-run page's start button)."""
        self.worker.submit(StartConversation())

    def new_conversation(self) -> None:
        log.info("New conversation requested")
        self.worker.submit(NewConversation(self.settings.system_prompt))

    def stop_speaking(self) -> None:
        """Stop: the assistant falls silent at once and the conversation sleeps (no frames, no clock) until the
        talk key wakes it; nothing the engine makes after the press reaches the transcript."""
        streams = self.port.streams
        if streams is not None:
            streams.hush()
        if self.board.engine.conversation:
            self._stopped = True
        log.info("Stop pressed")
        self.worker.submit(Sleep())

    def set_volume(self, volume: float, muted: bool) -> None:
        """Master volume (0..1) and mute, at once; saved to the settings shortly after."""
        self.settings = self.settings.with_changes(volume=min(1.0, max(0.0, volume)), muted=muted)
        streams = self.port.streams
        if streams is not None:
            streams.volume, streams.muted = self.settings.volume, muted
        self._save_due = time.monotonic() + SETTINGS_SAVE_DELAY_S

    # ------------------------------------------------------------------ settings and models

    def _save(self) -> None:
        self._save_due = None
        try:
            save_settings(self.settings, self._settings_path)
        except OSError as exc:
            log.warning("Could not save settings: %s", exc)
            self._post(Failure(f"Could not save settings: {exc}"))

    def _flush_settings(self) -> None:
        if self._save_due is not None:
            self._save()

    def apply_settings(self, settings: Settings) -> None:
        """Apply and save ``settings``. A model folder that changed is checked first (for its slot).

        Raises:
            CheckpointRefused: a changed folder cannot be used; nothing was applied or saved.
        """
        old = self.settings
        checked = self._check_changed_folders(old, settings)
        self.settings = settings
        self._save()
        streams = self.port.streams
        if (old.input_device, old.output_device) != (settings.input_device, settings.output_device):
            log.info("Devices chosen: microphone %r, speaker %r", settings.input_device, settings.output_device)
            if streams is not None:
                streams.set_devices(settings.input_device, settings.output_device)
            else:
                self._open_audio()
        streams = self.port.streams
        if streams is not None:
            streams.duck_while_talking = settings.ducking
            streams.volume, streams.muted = settings.volume, settings.muted
        idle = ("idle_pause", "idle_pause_delay_s", "hands_free")
        if any(getattr(old, name) != getattr(settings, name) for name in idle):
            self._set_idle_pause()
        if old.hands_free != settings.hands_free:
            self._configure_hands_free()
        global_key = ("global_talk_key_enabled", "global_talk_key", "talk_mode", "hands_free")
        if any(getattr(old, name) != getattr(settings, name) for name in global_key):
            self._configure_global_key()
        if (old.history, old.history_limit_gb) != (settings.history, settings.history_limit_gb):
            self.history.enabled, self.history.max_bytes = settings.history, settings.history_max_bytes
            log.info("History %s, limit %.1f GB", "on" if settings.history else "off", settings.history_limit_gb)
            if settings.history_limit_gb < old.history_limit_gb:
                self._saver.prune()
        if old.numerics != settings.numerics:
            log.info("Numerics chosen: %s", settings.numerics)
            self.worker.submit(SetNumerics(settings.numerics))
        active = settings.active_checkpoint
        if active is not None and (active != old.active_checkpoint or settings.active_variant != old.active_variant):
            self._load(checked[settings.active_variant or ""])  # checked above: the active model is switching
        elif settings.system_prompt != old.system_prompt:
            self.new_conversation()

    @staticmethod
    def _check_changed_folders(old: Settings, new: Settings) -> dict[str, CheckedCheckpoint]:
        """Check each model folder that changed, and the active one if the active model changes; by variant key.

        Raises:
            CheckpointRefused: the first that cannot be used, in words that name the slot.
        """
        checked: dict[str, CheckedCheckpoint] = {}
        switching = new.active_checkpoint != old.active_checkpoint or new.active_variant != old.active_variant
        for offered in MODEL_VARIANTS:
            folder = new.checkpoint_for(offered.key)
            if folder is None:
                continue
            if folder == old.checkpoint_for(offered.key) and not (switching and offered.key == new.active_variant):
                continue
            try:
                checked[offered.key] = check_checkpoint(folder, offered.key)
            except CheckpointRefused as exc:
                raise CheckpointRefused(f"The {offered.label} folder cannot be used: {exc}") from None
        return checked

    def switch_variant(self, key: str) -> None:
        """Load the configured ``key`` model once its folder passes the checks; refused, nothing changes."""
        chosen = variant(key)
        path = self.settings.checkpoint_for(key)
        if path is None:
            self._post(Failure(f"No {chosen.label} checkpoint folder is configured; choose one in Settings."))
            return
        try:
            checked = check_checkpoint(path, key)
        except CheckpointRefused as exc:
            self._refused(f"Not switched to {chosen.label}: {exc}")
            return
        log.info("Switching to the %s model in %s", chosen.label, path)
        self.settings = self.settings.with_changes(active_variant=key)
        self._save()
        self._load(checked)

    def use_checkpoint(self, path: Path) -> None:
        """Adopt a local checkpoint folder, stored as the variant its tensors' quantization makes it."""
        try:
            checked = check_checkpoint(Path(path))
        except CheckpointRefused as exc:
            self._refused(f"Not used: {exc}")
            return
        chosen = checked.variant
        log.info("Using the %s checkpoint in %s", chosen.label, checked.path)
        self.settings = self.settings.with_checkpoint(chosen.key, checked.path).with_changes(active_variant=chosen.key)
        self._save()
        self._load(checked)

    def _adopt(self, finished: _AdoptCheckpoint) -> None:
        log.info("Downloaded the %s model to %s", finished.variant, finished.path)
        try:
            checked = check_checkpoint(finished.path, finished.variant)
        except CheckpointRefused as exc:
            self._refused(f"The downloaded {variant(finished.variant).label} model cannot be used: {exc}")
            return
        self.settings = self.settings.with_checkpoint(finished.variant, finished.path).with_changes(
            active_variant=finished.variant
        )
        self._save()
        self._load(checked)

    def _refused(self, message: str) -> None:
        """A folder failed its checks before anything was unloaded: say so in one line; what is loaded stays."""
        loaded = self.board.model
        message = message.rstrip(".") + "."
        if loaded is not None:
            named = "The demo" if loaded.variant.demo else f"{loaded.name} ({loaded.variant.label})"
            message += f" {named} stays loaded."
        log.warning("%s", message)
        self._post(Failure(message))

    def start_demo(self) -> None:
        self._requested = None
        self.worker.submit(LoadDemo(self.settings.system_prompt, numerics=self.settings.numerics))

    def _load(self, checked: CheckedCheckpoint) -> None:
        self._requested = checked.path
        self.worker.submit(
            Load(
                checked.path,
                demo=checked.demo,
                system_prompt=self.settings.system_prompt,
                numerics=self.settings.numerics,
                random_weights=checked.random_weights,
            )
        )

    # ------------------------------------------------------------------ downloads

    def start_download(self, repo_id: str, target: Path) -> None:
        from .download import DownloadCancelled, DownloadError, download_checkpoint

        if self._download is not None and self._download[0].is_alive():
            self._post(Failure("A download is already running."))
            return
        cancel = threading.Event()
        last = DownloadProgress(repo_id, 0, None)  # bytes done and total, to report what was kept when it stops
        log.info("Downloading %s to %s", repo_id, target)

        def progress(done: int, total: int | None, message: str) -> None:
            nonlocal last
            last = DownloadProgress(repo_id, done, total, message)
            self._post(last)

        def run() -> None:
            try:
                path = download_checkpoint(repo_id, Path(target), on_progress=progress, cancel=cancel)
            except DownloadCancelled:
                log.info("Download of %s cancelled", repo_id)
                self._post(replace(last, message="Download cancelled; it resumes where it stopped."))
                return
            except DownloadError as exc:
                log.warning("Download of %s failed: %s", repo_id, exc)
                self._post(replace(last, message=str(exc), failed=True))
                self._post(Failure(str(exc)))
                return
            except Exception as exc:  # a bug or an input nobody foresaw: the user must hear of it, not a dead thread
                log.exception("Download of %s failed unexpectedly", repo_id)
                text = f"The download of {repo_id} failed unexpectedly ({type(exc).__name__}: {exc}). What was "
                text += "downloaded so far is kept; the log has the details."
                self._post(replace(last, message=text, failed=True))
                self._post(Failure(text))
                return
            self._post(replace(last, message="Download complete", finished=True))
            downloaded = variant_for_repo(repo_id)
            if downloaded is not None:
                self._post(_AdoptCheckpoint(downloaded.key, path))

        thread = threading.Thread(target=run, name="parley-download", daemon=True)
        self._download = (thread, cancel)
        thread.start()

    def cancel_download(self) -> None:
        if self._download is not None:
            self._download[1].set()

    # ------------------------------------------------------------------ devices and export

    def refresh_devices(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Find devices plugged in or out since start; returns the inputs and the outputs, each (name, description)."""
        from .audio.devices import AudioUnavailable, list_devices, refresh_devices

        try:
            streams = self.port.streams
            if streams is not None:
                # Reopening re-initialises PortAudio, which is what makes new devices visible.
                streams.set_devices(self.settings.input_device, self.settings.output_device)
            else:
                refresh_devices()
            devices = list_devices()
        except AudioUnavailable as exc:
            self._post(Failure(str(exc)))
            return [], []
        if self.port.streams is None:
            self._open_audio()
        return [(d.name, d.label) for d in devices.inputs], [(d.name, d.label) for d in devices.outputs]

    def profile_frames(self) -> int:
        """Frames in the session profile (every conversation since launch)."""
        return self.profile.frame_count

    def _profile_settings(self) -> dict[str, Any]:
        """The settings that shape a conversation, as its profile record keeps them from its start (its numerics
        are the loaded model's, recorded beside them, not the setting's)."""
        settings = self.settings
        return {
            "system_prompt": settings.system_prompt,
            "input_device": settings.input_device,
            "output_device": settings.output_device,
            "hands_free": settings.hands_free,
            "talk_mode": settings.talk_mode,
            "ducking": settings.ducking,
            "idle_pause": settings.idle_pause,
            "idle_pause_delay_s": settings.idle_pause_delay_s,
        }

    def export_profile(self, path: Path) -> list[Path]:
        try:
            paths = export_profile(Path(path), self.profile)
        except NothingToExport as exc:
            self._post(Notice(str(exc)))
            return []
        except OSError as exc:
            log.warning("Profile export to %s failed: %s", path, exc)
            self._post(Failure(f"{exc} The profile is still in memory; choose another place and try again."))
            return []
        conversations = sum(1 for c in self.profile.conversations if c.timings)
        log.info(
            "Exported the profile of %d conversation(s), %d frames, to %s",
            conversations,
            self.profile.frame_count,
            ", ".join(str(p) for p in paths),
        )
        self._post(Notice(f"Profile exported to {paths[0].parent}", tuple(paths)))
        return paths

    def save_conversation(self, folder: Path) -> list[Path]:
        """Save the conversation into a new folder inside ``folder`` (as History → Export does)."""
        from engine import build_session_profile_log

        current = self.profile.current
        profile = None
        if current is not None and current.timings:
            profile = build_session_profile_log([conversation_log(current)])
        started = current.started if current is not None else _now()
        try:
            paths = save_conversation(Path(folder), self.recording, self.transcript, started=started, profile=profile)
        except NothingToExport as exc:
            self._post(Notice(str(exc)))
            return []
        except (OSError, ExportError) as exc:
            log.warning("Saving the conversation to %s failed: %s", folder, exc)
            self._post(Failure(f"{exc} The conversation is still in memory; choose another folder and try again."))
            return []
        log.info("Saved the conversation to %s", paths[0].parent)
        self._kept = True
        self._post(Notice(f"Conversation saved to {paths[0].parent}", tuple(paths)))
        return paths

    def log_dir(self) -> Path:
        return self._log_folder

    def diagnostics(self) -> dict[str, str]:
        """Versions, device and folders, for Help → About and bug reports."""
        info = self.engine_info
        status = self.board.snapshot()
        return {
            "Parley": _parley_version(),
            "MLX": info.mlx_version if info is not None else _package_version("mlx"),
            "Device": self.mlx_device(),
            "Python": platform.python_version(),
            "PySide6": _package_version("PySide6-Essentials"),
            "System": platform.platform(),
            "Model": status.model.description if status.model is not None else "none loaded",
            "Numerics": self._numerics or self.settings.numerics,
            "Hands-free": self._hands_free_words(),
            "Microphone": status.microphone or "none",
            "Speaker": status.speaker or "none",
            "Settings": str(self._settings_path or config_dir()),
            "Models and demo": str(data_dir()),
            "Logs": str(self._log_folder),
            "History": f"{self.history.folder} ({'on' if self.history.enabled else 'off'})",
        }

    def _hands_free_words(self) -> str:
        if not self.settings.hands_free:
            return "off"
        echo = self._echo
        if echo is None:
            return "on (echo cancellation unavailable)"
        figures = echo.stats
        return f"on: {figures.blocks} blocks cleaned, {figures.cost_per_block_s * 1e6:.0f} µs per 10 ms block"

    # ------------------------------------------------------------------ hands-free and the global talk key

    def hands_free_unavailable(self) -> str | None:
        """Why hands-free cannot be offered here (no echo canceller), or None."""
        return echo_cancellation_unavailable()

    def _configure_hands_free(self) -> None:
        wanted = self.settings.hands_free
        if wanted and self._echo is None:
            reason = echo_cancellation_unavailable()
            if reason is None:
                try:
                    self._echo = self._echo_factory()
                except (ImportError, OSError) as exc:
                    reason = f"Echo cancellation could not start ({exc})."
            if reason is not None:
                log.warning("Hands-free is off: %s", reason)
                self._post(Failure(f"{reason} Hands-free is off."))
                self.settings = self.settings.with_changes(hands_free=False)
                self._save()
                wanted = False
        self.board.hands_free = wanted
        streams = self.port.streams
        if streams is not None and self._echo is not None:  # without a canceller ever made, streams have none
            streams.set_echo_canceller(self._echo if wanted else None)
        log.info("Hands-free %s", "on: echo cancellation at the device edge" if wanted else "off: push to talk")

    def global_key_support(self) -> GlobalKeySupport:
        """Whether a talk key can work while other apps are in front, in words for Settings."""
        return global_key_support()

    def _configure_global_key(self) -> None:
        settings = self.settings
        if not settings.global_talk_key_enabled:
            self._stop_global_key()
            return
        try:
            spec = parse_key_spec(settings.global_talk_key)
        except KeySpecError as exc:
            self._stop_global_key()
            self._post(Failure(f"The talk key for other apps cannot be used: {exc}"))
            return
        mode = TalkMode.TOGGLE if settings.talk_mode == "toggle" or settings.hands_free else TalkMode.HOLD
        if self._global_key is not None:
            self._global_key.configure(spec, mode)
            log.info("Global talk key: %s (%s)", settings.global_talk_key, mode.value)
            return
        backend = self._hotkey_backend() if self._hotkey_backend is not None else None
        key = GlobalTalkKey(spec, self._global_talk, mode=mode, backend=backend)
        try:
            key.start()
        except HotkeyUnavailable as exc:
            log.warning("Global talk key unavailable: %s", exc)
            self._post(Notice(f"{exc} The talk key still works in Parley's window."))
            return
        self._global_key = key
        log.info("Global talk key: %s (%s)", settings.global_talk_key, mode.value)

    def _global_talk(self, event: TalkEvent) -> None:
        # On the key listener's thread: only the queue is touched here.
        self._post(GlobalTalk(event is TalkEvent.START))

    def _stop_global_key(self) -> None:
        key, self._global_key = self._global_key, None
        if key is not None:
            key.stop()

    @property
    def global_key_active(self) -> bool:
        return self._global_key is not None and self._global_key.running

    # ------------------------------------------------------------------ conversation history

    def conversation_at_risk(self) -> bool:
        """Whether ending the conversation now would lose it: not saved by hand, and the history will not keep
        it (saving is off, or saving it failed)."""
        if self._kept or (self.recording.empty and not self.transcript.entries):
            return False
        return not self.history.enabled or self._history_failing

    def _conversation_ended(self, ended: ConversationEnded) -> None:
        log.info("Conversation %d ended", ended.number)
        current = self.profile.current
        stats = current.last_stats if current is not None else None
        if stats is not None and (stats.output_underruns or stats.input_lost_s):
            log.info(
                "The speaker ran out of the assistant's audio %d times (%.2f s of silence skipped to catch up); "
                "%.2f s of microphone audio lost",
                stats.output_underruns,
                stats.output_skipped_s,
                stats.input_lost_s,
            )
        echo = self._echo
        if echo is not None and self.settings.hands_free:
            figures = echo.stats
            log.info(
                "Echo cancellation: %d blocks, reference present for %d, missing for %d; %d samples of drift "
                "corrected, %d resyncs, %d playback samples dropped, reference lead %.0f ms, %.0f µs per block",
                figures.blocks,
                figures.reference_blocks,
                figures.reference_missing_blocks,
                figures.drift_corrections,
                figures.resyncs,
                figures.playback_dropped,
                figures.reference_lead_s * 1000.0,
                figures.cost_per_block_s * 1e6,
            )
        if not self._kept:
            self._keep_in_history()

    def _keep_in_history(self) -> None:
        """Hand the current conversation to the saver thread (when saving is on and there is something)."""
        if not self.history.enabled or (self.recording.empty and not self.transcript.entries):
            return
        current = self.profile.current
        user, assistant = self.recording.snapshot()
        record = ConversationRecord(
            started=current.started if current is not None else _now(),
            transcript=[TranscriptLine(e.role, e.seconds, e.text) for e in self.transcript.entries],
            user_audio=user,
            assistant_audio=assistant,
            user_rate=self.recording.input_rate,
            assistant_rate=self.recording.output_rate,
            model=current.model if current is not None else None,
            numerics=current.numerics if current is not None else None,
        )
        profile = conversation_log(current) if current is not None and current.timings else None
        self._saver.save(record, profile, self._serial)
        self._kept = True

    def _keep_what_is_left(self) -> None:
        """At shutdown: fold in what the stopped worker still reported, keep the last conversation, wait."""
        while True:
            try:
                message = self._messages.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, _AdoptCheckpoint):
                continue  # a download that finished as the app quit: adopted at the next start, not now
            self._consume(message)
        if not self._kept:
            self._keep_in_history()
        self._saver.close(SHUTDOWN_SAVE_TIMEOUT_S)

    def history_folder(self) -> Path:
        return self.history.folder

    def history_entries(self) -> HistoryListing:
        """Past conversations, newest first, and the damaged ones with their reasons."""
        return self.history.entries()

    def load_history(self, entry_id: str) -> LoadedConversation:
        return self.history.load(entry_id)

    def export_history(self, entry_id: str, folder: Path) -> list[Path]:
        paths = self.history.export(entry_id, Path(folder))
        log.info("Exported history entry %s to %s", entry_id, paths[0].parent if paths else folder)
        return paths

    def delete_history(self, entry_id: str) -> None:
        if self._replaying == entry_id:
            self.stop_replay()
        self.history.delete(entry_id)
        log.info("Deleted history entry %s", entry_id)

    def replay_history(self, entry_id: str) -> float:
        """Play a past conversation (both sides, as they happened) through the speaker; returns its length in s.

        Raises:
            HistoryError: the entry is damaged or gone.
            RuntimeError: there is no speaker to play on.
        """
        streams = self.port.streams
        if streams is None or streams.paused:
            raise RuntimeError("There is no speaker to play on. Connect one, or check the sound settings.")
        loaded = self.history.load(entry_id)
        duration = streams.start_replay(replay_mix(loaded, OUTPUT_SAMPLE_RATE), OUTPUT_SAMPLE_RATE)
        self._replaying = entry_id
        self._next_replay_report = 0.0
        log.info("Replaying history entry %s (%.1f s)", entry_id, duration)
        return duration

    def stop_replay(self) -> None:
        streams = self.port.streams
        if streams is not None:
            streams.stop_replay()
        if self._replaying is not None:
            self._replaying = None
            self._post(ReplayProgress(None))

    def _replay_progress(self) -> ReplayProgress:
        streams = self.port.streams
        position = streams.replay_position if streams is not None else None
        if position is None:
            self._replaying = None
            return ReplayProgress(None)
        return ReplayProgress(self._replaying, *position)

    # ------------------------------------------------------------------ the Hugging Face cache

    def cached_checkpoints(self) -> CacheListing:
        """The VoiceChat checkpoints in the Hugging Face cache; a ready one is used with ``use_checkpoint(path)``."""
        listing = list_cached_checkpoints()
        log.info(
            "Hugging Face cache %s: %d VoiceChat snapshot(s), %d ready",
            listing.cache_dir,
            len(listing.checkpoints),
            len(listing.ready),
        )
        return listing

    def mlx_device(self) -> str:
        """The device MLX computes on ("gpu: NVIDIA H100 …"), and on Linux's CPU why not the GPU (for About)."""
        from engine import device_description

        from .cuda_check import device_note

        if self.engine_info is not None:
            device = self.engine_info.device
        else:
            described = device_description()
            device = f"{described['type']}: {described['name']}"
        note = device_note(device.startswith("gpu"))
        return device + (f" — {note}" if note else "")


def replay_mix(loaded: LoadedConversation, rate: int) -> np.ndarray:
    """Both sides of a saved conversation as one track at ``rate``: they share a timeline from its start."""
    import soxr

    def at_rate(samples: np.ndarray, source: int) -> np.ndarray:
        data = np.asarray(samples, dtype=np.float32).reshape(-1)
        return data if source == rate or not len(data) else np.asarray(soxr.resample(data, source, rate), np.float32)

    user = at_rate(loaded.user_audio, loaded.user_rate)
    assistant = at_rate(loaded.assistant_audio, loaded.assistant_rate)
    mixed = np.zeros(max(len(user), len(assistant)), dtype=np.float32)
    mixed[: len(user)] += user
    mixed[: len(assistant)] += assistant
    return np.clip(mixed, -1.0, 1.0)


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


class _HistorySaver:
    """Writes conversations to the history on its own thread (a long one is tens of MB), in order.

    The controller calls ``save`` / ``prune`` / ``close`` on its thread; results come back through ``post``
    (``HistorySaved`` or ``Failure``).
    """

    def __init__(self, history: ConversationHistory, post: Callable[[object], None]) -> None:
        self._history = history
        self._post = post
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def save(self, record: ConversationRecord, profile: Any, serial: int) -> None:
        """Keep ``record`` with the profile of ``profile`` (an ``engine.profile_log.ConversationLog``, or None)."""
        self._submit(lambda: self._save(record, profile, serial))

    def prune(self) -> None:
        self._submit(self._prune)

    def close(self, timeout: float) -> None:
        """Finish what is queued (for at most ``timeout`` seconds) and stop."""
        thread = self._thread
        if thread is None:
            return
        self._jobs.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.error("The history is still being written after %.0f s; quitting without waiting", timeout)
        self._thread = None

    def _submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="parley-history", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # a failed save is reported; the saver keeps going
                log.exception("History job failed")
                self._post(Failure(f"Could not keep the conversation in the history: {exc}"))

    def _save(self, record: ConversationRecord, profile: Any, serial: int) -> None:
        if profile is not None:
            from engine import build_session_profile_log

            record = replace(record, profile=build_session_profile_log([profile]))
        try:
            entry = self._history.save(record)
        except HistoryError as exc:
            log.warning("Could not keep the conversation: %s", exc)
            self._post(_NotKept(serial))
            self._post(
                Failure(
                    f"Could not keep the conversation in the history: {exc} Until saving works again, New "
                    "Conversation and Quit ask before dropping a conversation (File → Save Conversation… keeps it)."
                )
            )
            return
        if entry is None:
            return
        log.info("Kept the conversation in %s (%.1f s, %d bytes)", entry.path, entry.duration_s, entry.size_bytes)
        self._post(HistorySaved(entry.id, entry.path))

    def _prune(self) -> None:
        removed = self._history.prune()
        if removed:
            log.info("History limit lowered: removed the %d oldest conversations", len(removed))


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _parley_version() -> str:
    version = _package_version("parley")
    return "0+unknown" if version == "not installed" else version


@dataclass(frozen=True)
class _NotKept:
    """Internal: saving conversation ``serial`` to the history failed."""

    serial: int


_FROM_FRAMES = (UserTranscriptDelta, AssistantTextDelta, ToolCall, AudioChunk, FrameStats, InputFrame, ConversationTime)
"""What the worker reports from running frames (dropped between Stop and the worker's sleep)."""


class _AdoptCheckpoint:
    """Internal: a finished download to adopt (handled in :meth:`AppController.poll`)."""

    def __init__(self, variant: str, path: Path) -> None:
        self.variant = variant
        self.path = path
