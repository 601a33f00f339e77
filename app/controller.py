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

Switching is checked first (``app.model_switch``): a folder that is not a VoiceChat checkpoint,
or holds another variant than its slot, is refused before anything is unloaded, and the
loaded model and the settings stay. At launch a refused folder falls back to another
configured model that passes (or the demo), and ``ModelFallback`` says so.

Stop (:meth:`stop_speaking`) hushes the speaker and puts the conversation to sleep; whatever
the worker still reports from frames run after the press (never heard) is dropped.

What else it owns:
    - **Hands-free**: one ``app.echo.EchoCanceller`` per launch, handed to the streams while
      the setting is on (``AudioIO.set_echo_canceller``); its stats go to the log at the end
      of each conversation and to the overlay with every frame's stats.
    - **The global talk key** (``app.global_key_control``): its events arrive on the
      listener's thread and are queued as ``GlobalTalk`` messages, so the window's talk
      control handles them on its own thread like the in-window key.
    - **Tools** (``app.tools.control``): ``tools.json`` beside the settings and the ``ToolRunner`` the worker
      shares; consent requests go to the window and come back through :meth:`answer_consent`.
    - **Conversation history** (``app.history_keeping``): when the worker reports
      ``ConversationEnded`` (in queue order, after everything that conversation said), the
      conversation is handed to a saver thread that writes it with
      ``app.history.ConversationHistory``; at shutdown the last one is saved before the
      process exits. With saving off, a conversation not
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
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.events import AssistantTextDelta, AudioChunk, ToolCall, UserTranscriptDelta

from .about import mlx_device, package_version, parley_version
from .audio_port import AudioPort, AudioStreams
from .download_runner import DownloadRunner
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
from .global_key_control import GlobalKeyControl
from .hf_cache import CacheListing, list_cached_checkpoints
from .history import ConversationHistory, HistoryListing, LoadedConversation, default_history_dir
from .history_keeping import ConversationKeeper, HistoryReplay, now
from .hotkey import GlobalKeySupport, HotkeyBackend, global_key_support
from .logs import CrashHandlers, configure_logging, install_crash_handlers, log_conversation_figures
from .messages import (
    ConversationCleared,
    ConversationEnded,
    ConversationStarted,
    ConversationTime,
    DeviceStatus,
    EchoSummary,
    EngineInfo,
    EngineState,
    Failure,
    FrameStats,
    InputFrame,
    Levels,
    ModelLoaded,
    Notice,
    NumericsChanged,
    StateChanged,
    TurnLatency,
)
from .model_switch import AdoptCheckpoint, ModelSwitcher, check_changed_folders
from .paths import config_dir, data_dir, log_dir
from .settings import Settings, save_settings
from .status import StatusBoard
from .tools.config import ToolsConfig
from .tools.control import TOOL_REPORTS, ToolControl
from .worker import EngineWorker, NewConversation, SetIdlePause, SetKeepUp, SetNumerics, Sleep, StartConversation

log = logging.getLogger(__name__)

HEALTH_INTERVAL_S = 0.5
SPEAKING_HOLD_S = 0.6  # the assistant counts as speaking this long after its last audible block
SETTINGS_SAVE_DELAY_S = 0.5  # a dragged volume slider is saved once it rests, not at every step
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
        tools_path: Path | None = None,
    ) -> None:
        self.settings = settings
        self._settings_path = settings_path
        self._audio_factory = audio_factory
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
        self._downloads = DownloadRunner(self._post)
        self._crash_handlers: CrashHandlers | None = None
        self.history = ConversationHistory(
            history_folder or default_history_dir(), max_bytes=settings.history_max_bytes, enabled=settings.history
        )
        self._keeper = ConversationKeeper(self.history, self._post)
        self._echo_factory = echo_factory
        self._echo: EchoCanceller | None = None
        self._global_key = GlobalKeyControl(self._post, hotkey_backend)
        self._models = ModelSwitcher(
            self.worker, self.board, self._post, lambda: self.settings, self._keep_settings, auto_demo=auto_demo
        )
        self._replay = HistoryReplay(self.history, lambda: self.port.streams, self._post)
        self._numerics: str | None = None  # what the loaded model runs with (None: nothing loaded yet)
        self._stopped = False  # Stop was pressed and the worker has not reported its sleep yet: drop its frames
        self._audible_at_release = False  # the assistant was still heard as the talk key went up
        self._tools = ToolControl(tools_path, settings_path, self.worker, self._post, self._log_folder, self.board)

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
        log.info("Parley %s starting (Python %s, %s)", parley_version(), platform.python_version(), platform.platform())
        self.worker.start()
        self._set_idle_pause()
        if self.settings.keep_up:
            self.worker.submit(SetKeepUp(True))
        self._open_audio()
        self._global_key.configure(self.settings)
        self._tools.configure()
        self._models.load_configured()

    def _set_idle_pause(self) -> None:
        settings = self.settings
        self.worker.submit(SetIdlePause(settings.idle_pause, settings.idle_pause_delay_s, settings.hands_free))

    def shutdown(self) -> None:
        self.cancel_download()
        self._global_key.stop()
        self.worker.stop()
        self._tools.close()  # its servers stop, its timers are cancelled
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
        if (progress := self._replay.progress_due(now)) is not None:
            out.append(progress)
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
        if isinstance(message, AdoptCheckpoint):
            self._models.adopt(message)
            return False
        if self._keeper.observe(message):
            return False
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
            self._keeper.conversation_began()
            self.profile.begin(
                message.number,
                message.model.variant.key,
                message.model.checkpoint,
                model=message.model.description,
                settings=self._profile_settings(),
            )
        elif isinstance(message, ModelLoaded):
            self._numerics = str(message.checkpoint.get("numerics", "exact"))
            self._models.came_back(message)
        elif isinstance(message, NumericsChanged):
            self._numerics = message.numerics
        elif isinstance(message, FrameStats):
            current = self.profile.current
            if current is not None:
                current.timings.append(message.timing)
                current.last_stats = message
            self._tools.last_frame = message.timing.frame_index
        elif isinstance(message, UserTranscriptDelta | AssistantTextDelta | ToolCall):
            self.transcript.add(message)
        elif isinstance(message, TOOL_REPORTS):
            self._tools.observe(message, self.transcript, self.profile.current, self.port.streams)
        return True

    def _drop_conversation(self) -> None:
        self._keep_in_history()  # if never reported as ended (it should have been): keep it all the same
        self.transcript.clear()
        self.recording.clear()
        self._keeper.kept = False

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

    def _keep_settings(self, settings: Settings) -> None:
        self.settings = settings
        self._save()

    def _flush_settings(self) -> None:
        if self._save_due is not None:
            self._save()

    def apply_settings(self, settings: Settings) -> None:
        """Apply and save ``settings``. A model folder that changed is checked first (for its slot).

        Raises:
            CheckpointRefused: a changed folder cannot be used; nothing was applied or saved.
        """
        old = self.settings
        checked = check_changed_folders(old, settings)
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
            self._global_key.configure(settings)
        if (old.history, old.history_limit_gb) != (settings.history, settings.history_limit_gb):
            log.info("History %s, limit %.1f GB", "on" if settings.history else "off", settings.history_limit_gb)
            lowered = settings.history_limit_gb < old.history_limit_gb
            self._keeper.set_limits(settings.history, settings.history_max_bytes, lowered=lowered)
        if old.numerics != settings.numerics:
            log.info("Numerics chosen: %s", settings.numerics)
            self.worker.submit(SetNumerics(settings.numerics))
        if old.keep_up != settings.keep_up:
            self.worker.submit(SetKeepUp(settings.keep_up))
        active = settings.active_checkpoint
        if active is not None and (active != old.active_checkpoint or settings.active_variant != old.active_variant):
            self._models.load(checked[settings.active_variant or ""])  # checked above: the active model is switching
        elif settings.system_prompt != old.system_prompt:
            self.new_conversation()

    def switch_variant(self, key: str) -> None:
        """Load the configured ``key`` model once its folder passes the checks; refused, nothing changes."""
        self._models.switch_variant(key)

    def use_checkpoint(self, path: Path) -> None:
        """Adopt a local checkpoint folder, stored as the variant its tensors' quantization makes it."""
        self._models.use_checkpoint(path)

    def start_demo(self) -> None:
        self._models.start_demo()

    # ------------------------------------------------------------------ tools

    @property
    def tools_config(self) -> ToolsConfig:
        return self._tools.config

    def apply_tools_config(self, config: ToolsConfig) -> None:
        """Save and use ``config``; a prepared conversation starts over with the new tool prompt."""
        if self._tools.apply(config) and self.board.model is not None:
            self.new_conversation()

    def list_server_tools(self, name: str) -> None:
        """Ask server ``name`` for its tools off the UI thread (``ToolsListed`` or a ``Failure`` follows)."""
        self._tools.list_server_tools(name)

    def answer_consent(self, request_id: int, allow: bool) -> None:
        self._tools.answer_consent(request_id, allow)  # Allow / Deny in the window

    # ------------------------------------------------------------------ downloads

    def start_download(self, repo_id: str, target: Path, layout: str) -> None:
        """Download ``repo_id`` into ``target`` in ``layout`` (app.download_layout: the Hugging Face cache folder, or
        Parley's folder for this checkpoint)."""
        self._downloads.start(repo_id, target, layout)

    def cancel_download(self) -> None:
        self._downloads.cancel()

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
        started = current.started if current is not None else now()
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
        self._keeper.kept = True
        self._post(Notice(f"Conversation saved to {paths[0].parent}", tuple(paths)))
        return paths

    def log_dir(self) -> Path:
        return self._log_folder

    def diagnostics(self) -> dict[str, str]:
        """Versions, device and folders, for Help → About and bug reports."""
        info = self.engine_info
        status = self.board.snapshot()
        return {
            "Parley": parley_version(),
            "MLX": info.mlx_version if info is not None else package_version("mlx"),
            "Device": self.mlx_device(),
            "Python": platform.python_version(),
            "PySide6": package_version("PySide6-Essentials"),
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

    @property
    def global_key_active(self) -> bool:
        return self._global_key.active

    # ------------------------------------------------------------------ conversation history

    def conversation_at_risk(self) -> bool:
        """Whether ending the conversation now would lose it: not saved by hand, and the history will not keep
        it (saving is off, or saving it failed)."""
        return self._keeper.at_risk(self.recording, self.transcript)

    def _conversation_ended(self, ended: ConversationEnded) -> None:
        log.info("Conversation %d ended", ended.number)
        current = self.profile.current
        echo = self._echo if self.settings.hands_free else None
        log_conversation_figures(current.last_stats if current is not None else None, echo)
        self._keep_in_history()

    def _keep_in_history(self) -> None:
        """Hand the current conversation to the saver thread, once (when saving is on and there is something)."""
        self._keeper.keep(self.recording, self.transcript, self.profile.current)

    def _keep_what_is_left(self) -> None:
        """At shutdown: fold in what the stopped worker still reported, keep the last conversation, wait."""
        while True:
            try:
                message = self._messages.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, AdoptCheckpoint):
                continue  # a download that finished as the app quit: adopted at the next start, not now
            self._consume(message)
        self._keep_in_history()
        self._keeper.close(SHUTDOWN_SAVE_TIMEOUT_S)

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
        if self._replay.entry_id == entry_id:
            self.stop_replay()
        self.history.delete(entry_id)
        log.info("Deleted history entry %s", entry_id)

    def replay_history(self, entry_id: str) -> float:
        """Play a past conversation (both sides, as they happened) through the speaker; returns its length in s.

        Raises:
            HistoryError: the entry is damaged or gone.
            RuntimeError: there is no speaker to play on.
        """
        return self._replay.start(entry_id)

    def stop_replay(self) -> None:
        self._replay.stop()

    # ------------------------------------------------------------------ the Hugging Face cache

    def cached_checkpoints(self) -> CacheListing:
        """The VoiceChat checkpoints in the Hugging Face cache; a ready one is used with ``use_checkpoint(path)``."""
        listing = list_cached_checkpoints()
        log.info(
            "HF cache %s: %d VoiceChat snapshots, %d ready",
            listing.cache_dir,
            len(listing.checkpoints),
            len(listing.ready),
        )
        return listing

    def mlx_device(self) -> str:
        """The device MLX computes on ("gpu: NVIDIA H100 …"), and on Linux's CPU why not the GPU (for About)."""
        return mlx_device(self.engine_info)


_FROM_FRAMES = (UserTranscriptDelta, AssistantTextDelta, ToolCall, AudioChunk, FrameStats, InputFrame, ConversationTime)
"""What the worker reports from running frames (dropped between Stop and the worker's sleep)."""
