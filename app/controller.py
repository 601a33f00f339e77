"""The app core the window talks to: push-to-talk state, audio, the engine worker, settings, export.

Qt-free. The UI calls these methods on its main thread and drains :meth:`AppController.poll`
about 30 times a second; everything the worker, the audio streams and the download thread
report arrives there as ``app.messages`` / ``engine.events`` objects.

Concurrency contract
    - Public methods run on the caller's (UI) thread and never block on the engine: work
      for MLX goes to the worker's command queue, downloads to their own thread.
    - The worker and download threads only ``put_nowait`` into ``_messages``.
    - ``AudioIO`` is owned here; the worker reads frames from it and plays into it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.events import AssistantTextDelta, ToolCall, UserTranscriptDelta

from .demo import ensure_demo_checkpoint, is_demo_checkpoint
from .export import ConversationRecording, Transcript, export_profile, save_conversation
from .logs import configure_logging
from .messages import (
    AppState,
    DeviceStatus,
    DownloadProgress,
    Failure,
    Levels,
    Notice,
    StateChanged,
)
from .paths import log_dir
from .settings import VARIANT_REPOS, Settings, save_settings
from .worker import Call, EngineWorker, Load, NewConversation, Pause, Resume

log = logging.getLogger(__name__)

HEALTH_INTERVAL_S = 0.5
SPEAKING_HOLD_S = 1.2  # the assistant counts as speaking this long after its last text token


class AppController:
    """Owns audio, the engine worker and the settings; turns UI intent into commands."""

    def __init__(
        self,
        settings: Settings,
        *,
        settings_path: Path | None = None,
        audio_factory: Callable[..., Any] | None = None,
        worker_factory: Callable[..., EngineWorker] = EngineWorker,
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
        self.audio: Any = None
        self.worker = worker_factory(
            emit=self._messages.put_nowait,
            frame_source=self._read_frame,
            play=self._play,
            backlog=lambda: self.audio.input_backlog_frames if self.audio is not None else 0,
            counters=lambda: (self.audio.input_overflows, self.audio.output_underruns) if self.audio else (0, 0),
            discard_audio=self._discard_audio,
            recording=self.recording,
        )
        self.talking = False
        self._engine_state = AppState.NO_MODEL
        self._state_detail = ""
        self._shown: tuple[AppState, str] | None = None
        self._last_speech = 0.0
        self._next_health = 0.0
        self._download: tuple[threading.Thread, threading.Event] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        configure_logging(self._log_folder)
        self.worker.start()
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
        self._post(StateChanged(AppState.NO_MODEL, "No model configured"))
        if self._auto_demo:
            self._post(Notice("No model configured: starting the demo checkpoint (random weights, no real speech)."))
            self.start_demo()

    def shutdown(self) -> None:
        self.cancel_download()
        self.worker.stop()
        if self.audio is not None:
            self.audio.close()
            self.audio = None

    def _open_audio(self) -> None:
        try:
            factory = self._audio_factory
            if factory is None:
                from .audio_io import AudioIO

                factory = AudioIO
            self.audio = factory(
                self.settings.input_device, self.settings.output_device, duck_while_talking=self.settings.ducking
            )
            self.audio.start()
        except Exception as exc:  # noqa: BLE001 - no audio must never stop the app from opening
            self.audio = None
            log.warning("audio unavailable: %s", exc)
            self._post(DeviceStatus(None, None, str(exc)))
            self._post(Failure(str(exc)))

    # ------------------------------------------------------------------ worker callbacks (worker thread)

    def _read_frame(self, timeout: float) -> Any:
        audio = self.audio
        if audio is None:
            time.sleep(timeout)
            return None
        return audio.read_frame(timeout)

    def _play(self, samples: Any) -> None:
        audio = self.audio
        if audio is not None:
            audio.play(samples)

    def _discard_audio(self) -> None:
        audio = self.audio
        if audio is not None:
            audio.clear_input()
            audio.clear_output()

    def _post(self, message: object) -> None:
        self._messages.put_nowait(message)

    # ------------------------------------------------------------------ polling (UI thread)

    def poll(self) -> list[object]:
        """Everything that happened since the last call, oldest first."""
        now = time.monotonic()
        out: list[object] = []
        if self.audio is not None and now >= self._next_health:
            self._next_health = now + HEALTH_INTERVAL_S
            out.extend(self.audio.poll_health())
        while True:
            try:
                message = self._messages.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, StateChanged):
                self._engine_state, self._state_detail = message.state, message.detail
                continue  # re-emitted below as the merged state
            if isinstance(message, _AdoptCheckpoint):
                self._adopt(message)
                continue
            if isinstance(message, AssistantTextDelta):
                self._last_speech = now
            if isinstance(message, UserTranscriptDelta | AssistantTextDelta | ToolCall):
                self.transcript.add(message)
            out.append(message)
        state = self._merged_state(now)
        if state != self._shown:
            self._shown = state
            out.append(StateChanged(*state))
        if self.audio is not None:
            out.append(Levels(self.audio.input_peak, self.audio.output_peak))
        self._maybe_idle_pause()
        return out

    def _merged_state(self, now: float) -> tuple[AppState, str]:
        engine, detail = self._engine_state, self._state_detail
        if engine is not AppState.READY:
            return engine, detail
        if self.talking:
            return AppState.LISTENING, ""
        if now - self._last_speech < SPEAKING_HOLD_S:
            return AppState.SPEAKING, ""
        return AppState.READY, detail

    def _maybe_idle_pause(self) -> None:
        settings = self.settings
        if not settings.idle_pause or self.talking or self._engine_state is not AppState.READY:
            return
        if self.worker.frames_since_speech() * 0.08 >= settings.idle_pause_delay_s:
            self._engine_state = AppState.PAUSED  # until the worker confirms
            self.worker.submit(Pause())

    # ------------------------------------------------------------------ push to talk and conversations

    def set_talking(self, talking: bool) -> None:
        self.talking = talking
        if self.audio is not None:
            self.audio.talking = talking
        if talking and self._engine_state is AppState.PAUSED:
            if self.audio is not None:
                self.audio.clear_input()  # silence that queued while asleep is not part of the conversation
            self.worker.submit(Resume())

    def new_conversation(self) -> None:
        self.transcript.clear()
        self.worker.submit(NewConversation(self.settings.system_prompt))

    # ------------------------------------------------------------------ settings and models

    def _save(self) -> None:
        try:
            save_settings(self.settings, self._settings_path)
        except OSError as exc:
            self._post(Failure(f"Could not save settings: {exc}"))

    def apply_settings(self, settings: Settings) -> None:
        old, self.settings = self.settings, settings
        self._save()
        if (old.input_device, old.output_device) != (settings.input_device, settings.output_device):
            if self.audio is not None:
                self.audio.set_devices(settings.input_device, settings.output_device)
            else:
                self._open_audio()
        if self.audio is not None:
            self.audio.duck_while_talking = settings.ducking
        if settings.active_checkpoint != old.active_checkpoint and settings.active_checkpoint is not None:
            self._load(settings.active_checkpoint)
        elif settings.system_prompt != old.system_prompt:
            self.new_conversation()

    def switch_variant(self, variant: str) -> None:
        path = self.settings.checkpoint_for(variant)
        if path is None:
            self._post(Failure(f"No {variant} checkpoint folder is configured; choose one in Settings."))
            return
        self.settings = self.settings.with_changes(active_variant=variant)
        self._save()
        self._load(path)

    def use_checkpoint(self, path: Path) -> None:
        """Adopt a local checkpoint folder: stored as the 4- or 8-bit variant by its quantization."""
        from engine.checkpoint import read_config
        from engine.errors import CheckpointError

        try:
            config, _ = read_config(Path(path))
        except CheckpointError as exc:
            self._post(Failure(str(exc)))
            return
        variant = "8bit" if config.quantization_bits == 8 else "4bit"
        self.settings = self.settings.with_changes(active_variant=variant, **{f"checkpoint_{variant}": Path(path)})
        self._save()
        self._load(Path(path))

    def _adopt(self, finished: _AdoptCheckpoint) -> None:
        self.settings = self.settings.with_changes(
            active_variant=finished.variant, **{f"checkpoint_{finished.variant}": finished.path}
        )
        self._save()
        self._load(finished.path)

    def start_demo(self) -> None:
        prompt = self.settings.system_prompt

        def generate_and_load(worker: EngineWorker) -> None:
            worker._emit(StateChanged(AppState.LOADING, "Preparing the demo checkpoint…"))
            path = ensure_demo_checkpoint()
            worker.submit(Load(path, demo=True, system_prompt=prompt))

        self.worker.submit(Call(generate_and_load, "generate the demo checkpoint"))

    def _load(self, path: Path) -> None:
        self.transcript.clear()
        self.worker.submit(
            Load(Path(path), demo=is_demo_checkpoint(Path(path)), system_prompt=self.settings.system_prompt)
        )

    # ------------------------------------------------------------------ downloads

    def start_download(self, repo_id: str, target: Path) -> None:
        from .download import DownloadCancelled, DownloadError, download_checkpoint

        if self._download is not None and self._download[0].is_alive():
            self._post(Failure("A download is already running."))
            return
        cancel = threading.Event()
        last = [0, None]  # bytes done and total, to report what was kept when it stops

        def progress(done: int, total: int | None, message: str) -> None:
            last[:] = [done, total]
            self._post(DownloadProgress(repo_id, done, total, message))

        def run() -> None:
            try:
                path = download_checkpoint(repo_id, Path(target), on_progress=progress, cancel=cancel)
            except DownloadCancelled:
                done, total = last
                self._post(DownloadProgress(repo_id, done, total, "Download cancelled; it resumes where it stopped."))
                return
            except DownloadError as exc:
                done, total = last
                self._post(DownloadProgress(repo_id, done, total, str(exc), failed=True))
                self._post(Failure(str(exc)))
                return
            done, total = last
            self._post(DownloadProgress(repo_id, done, total, "Download complete", finished=True))
            variant = next((v for v, repo in VARIANT_REPOS.items() if repo == repo_id), None)
            if variant is not None:
                self._post(_AdoptCheckpoint(variant, path))

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
            if self.audio is not None:
                # Reopening re-initialises PortAudio, which is what makes new devices visible.
                self.audio.set_devices(self.settings.input_device, self.settings.output_device)
            else:
                refresh_devices()
            devices = list_devices()
        except AudioUnavailable as exc:
            self._post(Failure(str(exc)))
            return [], []
        if self.audio is None:
            self._open_audio()
        return [d.name for d in devices.inputs], [d.name for d in devices.outputs]

    def export_profile(self, path: Path) -> list[Path]:
        voicechat = self.worker.voicechat
        checkpoint = (
            voicechat.describe() if voicechat is not None else {"name": "", "path": "", "quantization_bits": None}
        )
        settings = {
            "system_prompt": self.settings.system_prompt,
            "variant": self.settings.active_variant,
            "input_device": self.settings.input_device,
            "output_device": self.settings.output_device,
        }
        try:
            paths = export_profile(Path(path), list(self.worker.timings), checkpoint=checkpoint, settings=settings)
        except OSError as exc:
            self._post(Failure(f"{exc} The profile is still in memory; choose another place and try again."))
            return []
        self._post(Notice(f"Profile exported to {paths[0].parent}", tuple(paths)))
        return paths

    def save_conversation(self, folder: Path) -> list[Path]:
        try:
            paths = save_conversation(Path(folder), self.recording, self.transcript)
        except OSError as exc:
            self._post(Failure(f"{exc} The conversation is still in memory; choose another folder and try again."))
            return []
        self._post(Notice(f"Conversation saved to {folder}", tuple(paths)))
        return paths

    def log_dir(self) -> Path:
        return self._log_folder


class _AdoptCheckpoint:
    """Internal: a finished download to adopt (handled in :meth:`AppController.poll`)."""

    def __init__(self, variant: str, path: Path) -> None:
        self.variant = variant
        self.path = path
