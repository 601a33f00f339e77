"""The app core the window talks to: push-to-talk, audio, the engine worker, settings, export.

Qt-free. The UI calls these methods on its main thread and drains :meth:`AppController.poll`
about 30 times a second; everything the worker, the audio streams and the download thread
report arrives there as ``app.messages`` / ``engine.events`` objects, in the order it
happened. The app's state has one owner, the ``StatusBoard``: ``poll`` hands the UI a new
``StateChanged`` snapshot right after whichever report changed it.

Nothing plays before the user chooses: a loaded model waits, and the conversation starts
with the first press of the talk key or :meth:`start_conversation` (a start button).

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
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from engine.events import AssistantTextDelta, AudioChunk, ToolCall, UserTranscriptDelta

from .audio_port import AudioPort, AudioStreams
from .demo import is_demo_checkpoint
from .export import (
    ConversationRecording,
    ExportError,
    NothingToExport,
    SessionProfile,
    Transcript,
    export_profile,
    save_conversation,
)
from .logs import CrashHandlers, configure_logging, install_crash_handlers
from .messages import (
    ConversationStarted,
    DeviceStatus,
    DownloadProgress,
    EngineInfo,
    Failure,
    FrameStats,
    InputFrame,
    Levels,
    Notice,
    StateChanged,
    TurnLatency,
)
from .paths import config_dir, data_dir, log_dir
from .settings import Settings, save_settings
from .status import StatusBoard
from .variants import variant, variant_for_checkpoint, variant_for_repo
from .worker import (
    EngineWorker,
    Load,
    LoadDemo,
    NewConversation,
    SetIdlePause,
    StartConversation,
)

log = logging.getLogger(__name__)

HEALTH_INTERVAL_S = 0.5
SPEAKING_HOLD_S = 0.6  # the assistant counts as speaking this long after its last audible block
SETTINGS_SAVE_DELAY_S = 0.5  # a dragged volume slider is saved once it rests, not at every step

AudioFactory = Callable[..., AudioStreams]
WorkerFactory = Callable[..., EngineWorker]


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
        self.worker.submit(SetIdlePause(self.settings.idle_pause, self.settings.idle_pause_delay_s))
        self._open_audio()
        path = self.settings.active_checkpoint
        if path is not None and path.exists():
            self._load(path)
        elif path is not None:
            self._post(Failure(f"The configured checkpoint folder {path} does not exist any more."))
            self._no_model()
        else:
            self._no_model()

    def _no_model(self) -> None:
        if self._auto_demo:
            # Loaded, not started: "Try the demo" (or the talk key) starts it at once, and nothing plays before.
            self.start_demo()

    def shutdown(self) -> None:
        self.cancel_download()
        self.worker.stop()
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
                from .audio_io import AudioIO

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

    def _update_devices(self, statuses: list[DeviceStatus] | None = None) -> None:
        streams = self.port.streams
        if streams is None:
            return
        problem = statuses[-1].message if statuses else None
        if streams.paused:
            self.board.set_audio(None, None, problem or "Audio is paused until a sound device is available.")
        else:
            self.board.set_audio(streams.input_device_name, streams.output_device_name)

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
                out.append(message)
            self._snapshot_into(out)
        if streams is not None:
            for latency in streams.take_turn_latencies():
                out.append(self._add_latency(latency))
            self.board.speaking = now - streams.last_audible < SPEAKING_HOLD_S
        self.board.talking = self.talking
        self._snapshot_into(out)
        if streams is not None:
            out.append(Levels(streams.input_peak, streams.output_peak))
        if self._save_due is not None and now >= self._save_due:
            self._flush_settings()
        return out

    def _consume(self, message: object) -> bool:
        """Fold ``message`` into the core's state; returns whether the UI needs it too."""
        if self.board.observe(message):
            return False
        if isinstance(message, _AdoptCheckpoint):
            self._adopt(message)
            return False
        if isinstance(message, EngineInfo):
            self.engine_info = message
            return False
        if isinstance(message, InputFrame):
            self.recording.add_input(message.samples)
            return False
        if isinstance(message, AudioChunk):
            self.recording.add_output(message.samples)
            return False
        if isinstance(message, ConversationStarted):
            # In queue order: whatever the previous conversation still said is already in, so nothing mixes.
            self.transcript.clear()
            self.recording.clear()
            self.profile.begin(message.number, message.model.variant.key, message.model.checkpoint)
        elif isinstance(message, FrameStats):
            current = self.profile.current
            if current is not None:
                current.timings.append(message.timing)
        elif isinstance(message, UserTranscriptDelta | AssistantTextDelta | ToolCall):
            self.transcript.add(message)
        return True

    def _add_latency(self, latency_s: float) -> TurnLatency:
        from engine.profiler import percentile

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
        self.talking = talking
        streams = self.port.streams
        if streams is not None:
            streams.talking = talking
        if talking and self.board.model is not None:
            if streams is not None:
                streams.start_capture()  # from the key press on: the first words are not lost while a session opens
            self.worker.submit(StartConversation())

    def start_conversation(self) -> None:
        """Start the conversation now, if none is open (the first-run page's start button)."""
        self.worker.submit(StartConversation())

    def new_conversation(self) -> None:
        log.info("New conversation requested")
        self.worker.submit(NewConversation(self.settings.system_prompt))

    def stop_speaking(self) -> None:
        """Stop the assistant mid-answer: drop what is queued for playback, until the talk key goes down again."""
        streams = self.port.streams
        if streams is not None:
            streams.hush()

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
        old, self.settings = self.settings, settings
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
        if (old.idle_pause, old.idle_pause_delay_s) != (settings.idle_pause, settings.idle_pause_delay_s):
            self.worker.submit(SetIdlePause(settings.idle_pause, settings.idle_pause_delay_s))
        if settings.active_checkpoint != old.active_checkpoint and settings.active_checkpoint is not None:
            self._load(settings.active_checkpoint)
        elif settings.system_prompt != old.system_prompt:
            self.new_conversation()

    def switch_variant(self, key: str) -> None:
        chosen = variant(key)
        path = self.settings.checkpoint_for(key)
        if path is None:
            self._post(Failure(f"No {chosen.label} checkpoint folder is configured; choose one in Settings."))
            return
        log.info("Switching to the %s model in %s", chosen.label, path)
        self.settings = self.settings.with_changes(active_variant=key)
        self._save()
        self._load(path)

    def use_checkpoint(self, path: Path) -> None:
        """Adopt a local checkpoint folder, stored as the variant its quantization makes it."""
        from engine.checkpoint import read_config
        from engine.errors import CheckpointError

        path = Path(path)
        try:
            config, _ = read_config(path)
            chosen = variant_for_checkpoint(config.quantization_bits)
        except (CheckpointError, ValueError) as exc:
            self._post(Failure(str(exc)))
            return
        log.info("Using the %s checkpoint in %s", chosen.label, path)
        self.settings = self.settings.with_checkpoint(chosen.key, path).with_changes(active_variant=chosen.key)
        self._save()
        self._load(path)

    def _adopt(self, finished: _AdoptCheckpoint) -> None:
        log.info("Downloaded the %s model to %s", finished.variant, finished.path)
        self.settings = self.settings.with_checkpoint(finished.variant, finished.path).with_changes(
            active_variant=finished.variant
        )
        self._save()
        self._load(finished.path)

    def start_demo(self) -> None:
        self.worker.submit(LoadDemo(self.settings.system_prompt))

    def _load(self, path: Path) -> None:
        path = Path(path)
        self.worker.submit(Load(path, demo=is_demo_checkpoint(path), system_prompt=self.settings.system_prompt))

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

    def refresh_devices(self) -> tuple[list[str], list[str]]:
        """Find devices plugged in or out since start; returns (input names, output names)."""
        from .audio_io import AudioUnavailable, list_devices, refresh_devices

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
        return [d.name for d in devices.inputs], [d.name for d in devices.outputs]

    def profile_frames(self) -> int:
        """Frames in the session profile (every conversation since launch)."""
        return self.profile.frame_count

    def export_profile(self, path: Path) -> list[Path]:
        settings = {
            "system_prompt": self.settings.system_prompt,
            "input_device": self.settings.input_device,
            "output_device": self.settings.output_device,
        }
        try:
            paths = export_profile(Path(path), self.profile, settings=settings)
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
        try:
            paths = save_conversation(Path(folder), self.recording, self.transcript)
        except NothingToExport as exc:
            self._post(Notice(str(exc)))
            return []
        except (OSError, ExportError) as exc:
            log.warning("Saving the conversation to %s failed: %s", folder, exc)
            self._post(Failure(f"{exc} The conversation is still in memory; choose another folder and try again."))
            return []
        log.info("Saved the conversation to %s", folder)
        self._post(Notice(f"Conversation saved to {folder}", tuple(paths)))
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
            "Device": info.device if info is not None else "not known yet",
            "Python": platform.python_version(),
            "PySide6": _package_version("PySide6-Essentials"),
            "System": platform.platform(),
            "Model": status.model.description if status.model is not None else "none loaded",
            "Microphone": status.microphone or "none",
            "Speaker": status.speaker or "none",
            "Settings": str(self._settings_path or config_dir()),
            "Models and demo": str(data_dir()),
            "Logs": str(self._log_folder),
        }


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _parley_version() -> str:
    version = _package_version("parley")
    return "0+unknown" if version == "not installed" else version


class _AdoptCheckpoint:
    """Internal: a finished download to adopt (handled in :meth:`AppController.poll`)."""

    def __init__(self, variant: str, path: Path) -> None:
        self.variant = variant
        self.path = path
