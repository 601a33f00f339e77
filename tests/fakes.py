"""A scripted stand-in for ``app.controller.AppController`` (the interface in ``ui.contracts``).

``FakeController`` records every call, returns queued messages from ``poll()`` and can be
told to raise from any method. Like the real controller it folds state reports
(``EngineState``, ``LoadProgress``, ``ModelLoaded``) into ``StateChanged`` snapshots with
the real ``StatusBoard``, so the window sees snapshots made the same way. With
``live=True`` it also simulates a running model on the wall clock — frame timings,
levels, transcript and assistant text, conversation time — which is enough to develop
the UI without MLX. It imports no Qt and is used from the Qt main thread only.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from app.hf_cache import CacheListing
from app.history import ConversationHistory, HistoryListing, LoadedConversation, default_history_dir
from app.hotkey import GlobalKeySupport
from app.messages import (
    AppState,
    ConversationCleared,
    ConversationStarted,
    ConversationTime,
    DeviceStatus,
    DownloadProgress,
    EngineState,
    FrameStats,
    Levels,
    LoadProgress,
    ModelLoaded,
    Notice,
    ReplayProgress,
    SpeedCheck,
    StateChanged,
)
from app.settings import Settings
from app.status import StatusBoard
from app.tools.config import ToolsConfig
from app.variants import DEMO, Variant, variant
from engine.events import AssistantTextDelta, FrameTiming, UserTranscriptDelta
from engine.timeline import FRAME_MS, FRAME_SECONDS, INPUT_FRAME_SAMPLES, STAGES

CONVERSATION_LIMIT_S = 300.0
USER_LINE = "What is the capital of France?"
ASSISTANT_LINE = "The capital of France is Paris. It sits on the Seine, in the north of the country."


def make_frame_stats(
    index: int,
    stages: tuple[float, float, float, float, float] = (6.0, 2.0, 24.0, 18.0, 5.0),
    *,
    other: float = 0.0,
    backlog: int = 0,
    underruns: int = 0,
    lost_s: float = 0.0,
    p50: float = 52.0,
    p95: float = 71.0,
    mode: str = "host",
) -> FrameStats:
    """One ``FrameStats`` with the given per-stage milliseconds (perception, RNN-T, language, TTS, codec)."""
    total = sum(stages) + other
    syncs = 5 if mode == "device" else 2
    stages_ms = dict(zip(STAGES, stages, strict=True))
    timing = FrameTiming(index, index * FRAME_MS, stages_ms, total, syncs, timing_mode=mode)
    return FrameStats(timing, backlog, lost_s, underruns, p50, p95, realtime_factor=total / FRAME_MS)


class FakeController:
    """Implements the controller interface with recorded calls and scripted messages."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        live: bool = False,
        inputs: Iterable[str] = ("Built-in Microphone", "USB Headset"),
        outputs: Iterable[str] = ("Built-in Speakers", "USB Headset"),
        log_dir: Path | None = None,
        seed: int = 0,
        devices: tuple[str | None, str | None] = ("Built-in Microphone", "Built-in Speakers"),
        history_folder: Path | None = None,
    ) -> None:
        self.settings = settings if settings is not None else Settings()
        self.live = live
        self.board = StatusBoard()
        self.board.set_audio(*devices)
        self._shown: StateChanged | None = None
        self.frames_exported = 0
        self.conversations = 0
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._log_dir = log_dir or Path("/tmp/parley-fake-logs")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.talking = False
        self.shut_down = False
        self._failures: dict[str, Exception] = {}
        self._queue: deque[object] = deque()
        self._random = random.Random(seed)
        self._loaded = False
        self._clock = 0.0
        self._frame = 0
        self._elapsed = 0.0
        self._script: deque[object] = deque()
        self.history = ConversationHistory(history_folder or default_history_dir())
        self.at_risk = False  # what conversation_at_risk() answers
        self.echo_unavailable: str | None = None  # what hands_free_unavailable() answers
        self.key_support = GlobalKeySupport(True, "x11", "The talk key works while other apps are in front.")
        self.cached = CacheListing(Path("/tmp/parley-fake-hf-cache"), (), offline=False)  # cached_checkpoints()
        self.tools_config = ToolsConfig()  # what apply_tools_config() last saved

    # -- test controls -------------------------------------------------------------------------------------------

    def queue(self, *messages: object) -> None:
        """Messages the next ``poll()`` returns, in order."""
        self._queue.extend(messages)

    def fail(self, method: str, error: Exception) -> None:
        """Make the next call of ``method`` raise ``error``."""
        self._failures[method] = error

    def calls_to(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``method`` so far."""
        return [args for name, args in self.calls if name == method]

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        error = self._failures.pop(method, None)
        if error is not None:
            raise error

    # -- the controller interface ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._record("start")
        folder = self.settings.active_checkpoint
        if folder is None:
            self.queue(EngineState(AppState.NO_MODEL, "No model configured"))
        else:
            assert self.settings.active_variant is not None
            self._load(folder.name, folder, variant(self.settings.active_variant))

    def poll(self) -> list[object]:
        """Queued messages, state reports folded into snapshots as the real controller does."""
        self._record("poll")
        if self.live and self._loaded:
            self._simulate()
        incoming = list(self._queue)
        self._queue.clear()
        out: list[object] = []
        for message in incoming:
            if not self.board.observe(message):
                out.append(message)
            self._snapshot_into(out)
        self.board.talking = self.talking
        self._snapshot_into(out)
        return out

    def _snapshot_into(self, out: list[object]) -> None:
        snapshot = self.board.snapshot()
        if snapshot != self._shown:
            self._shown = snapshot
            out.append(snapshot)

    def set_devices(self, microphone: str | None, speaker: str | None, problem: str | None = None) -> None:
        """Test control: the sound devices in use now (None: none)."""
        self.board.set_audio(microphone, speaker, problem)

    def set_talking(self, talking: bool) -> None:
        self._record("set_talking", talking)
        self.talking = talking
        if talking and self.board.model is not None and not self.board.engine.conversation:
            self._start_conversation()
        elif talking and self.board.engine.state is AppState.PAUSED:
            self.queue(EngineState(AppState.READY, conversation=True))  # as the real worker: the key wakes it
        if self._loaded and self.live:
            self._script_turn(talking)

    def start_conversation(self) -> None:
        self._record("start_conversation")
        if self.board.model is not None and not self.board.engine.conversation:
            self._start_conversation()

    def _start_conversation(self) -> None:
        assert self.board.model is not None
        self.conversations += 1
        self.queue(
            ConversationStarted(self.conversations, self.board.model),
            EngineState(AppState.READY, conversation=True),
            ConversationTime(0.0, CONVERSATION_LIMIT_S),
        )

    def new_conversation(self) -> None:
        """As the real worker: the old conversation ends and the next waits for the talk key."""
        self._record("new_conversation")
        self._elapsed = 0.0
        self._script.clear()
        if self.board.model is not None:
            self.queue(ConversationCleared(), EngineState(AppState.READY))

    def stop_speaking(self) -> None:
        """As the real worker: an open conversation sleeps."""
        self._record("stop_speaking")
        self._script.clear()
        if self.board.engine.conversation:
            self.queue(EngineState(AppState.PAUSED, "Stopped: the conversation sleeps", conversation=True))

    def set_volume(self, volume: float, muted: bool) -> None:
        self._record("set_volume", volume, muted)
        self.settings = self.settings.with_changes(volume=volume, muted=muted)

    def apply_settings(self, settings: Settings) -> None:
        """Records and keeps ``settings``; a changed active model reloads, as the real controller does."""
        self._record("apply_settings", settings)
        old, self.settings = self.settings, settings
        folder = settings.active_checkpoint
        if folder is not None and (folder, settings.active_variant) != (old.active_checkpoint, old.active_variant):
            assert settings.active_variant is not None
            self._load(folder.name, folder, variant(settings.active_variant))

    def switch_variant(self, key: str) -> None:
        self._record("switch_variant", key)
        self.settings = self.settings.with_changes(active_variant=key)
        folder = self.settings.active_checkpoint or Path(f"/models/VoiceChat-{key}")
        self._load(folder.name, folder, variant(key))

    def use_checkpoint(self, path: Path) -> None:
        self._record("use_checkpoint", path)
        self._load(path.name, path, variant("bf16"))

    def start_demo(self) -> None:
        self._record("start_demo")
        self._load("Demo checkpoint", Path("/tmp/parley-demo"), DEMO)

    def start_download(self, repo_id: str, target: Path, layout: str) -> None:
        self._record("start_download", repo_id, target, layout)
        self.queue(DownloadProgress(repo_id, 0, 9_200_000_000, "Connecting"))

    def cancel_download(self) -> None:
        self._record("cancel_download")

    def refresh_devices(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        self._record("refresh_devices")
        return [(name, f"{name} (described)") for name in self.inputs], [(n, f"{n} (described)") for n in self.outputs]

    def profile_frames(self) -> int:
        self._record("profile_frames")
        return self.frames_exported

    def export_profile(self, path: Path) -> list[Path]:
        self._record("export_profile", path)
        written = [path.with_suffix(".json"), path.with_suffix(".csv"), path.with_suffix(".trace.json")]
        for item in written:
            item.write_text("{}\n" if item.suffix == ".json" else "frame_index\n", encoding="utf-8")
        self.queue(Notice("Profile exported", tuple(written)))
        return written

    def save_conversation(self, folder: Path) -> list[Path]:
        self._record("save_conversation", folder)
        written = [folder / "user.wav", folder / "assistant.wav", folder / "transcript.md"]
        for item in written:
            item.write_bytes(b"")
        return written

    def log_dir(self) -> Path:
        self._record("log_dir")
        return self._log_dir

    def diagnostics(self) -> dict[str, str]:
        self._record("diagnostics")
        return {"Parley": "0.1.0", "MLX": "0.32.4", "Device": "cpu: fake", "Logs": str(self._log_dir)}

    def shutdown(self) -> None:
        self._record("shutdown")
        self.shut_down = True

    def hands_free_unavailable(self) -> str | None:
        self._record("hands_free_unavailable")
        return self.echo_unavailable

    def global_key_support(self) -> GlobalKeySupport:
        self._record("global_key_support")
        return self.key_support

    def conversation_at_risk(self) -> bool:
        self._record("conversation_at_risk")
        return self.at_risk

    def history_entries(self) -> HistoryListing:
        self._record("history_entries")
        return self.history.entries()

    def load_history(self, entry_id: str) -> LoadedConversation:
        self._record("load_history", entry_id)
        return self.history.load(entry_id)

    def replay_history(self, entry_id: str) -> float:
        self._record("replay_history", entry_id)
        duration = self.history.load(entry_id).entry.duration_s
        self.queue(ReplayProgress(entry_id, 0.5, duration))
        return duration

    def stop_replay(self) -> None:
        self._record("stop_replay")
        self.queue(ReplayProgress(None))

    def export_history(self, entry_id: str, folder: Path) -> list[Path]:
        self._record("export_history", entry_id, folder)
        return self.history.export(entry_id, folder)

    def delete_history(self, entry_id: str) -> None:
        self._record("delete_history", entry_id)
        self.history.delete(entry_id)

    def history_folder(self) -> Path:
        self._record("history_folder")
        return self.history.folder

    def cached_checkpoints(self) -> CacheListing:
        self._record("cached_checkpoints")
        return self.cached

    # -- scripted behaviour -------------------------------------------------------------------------------------------

    def apply_tools_config(self, config: ToolsConfig) -> None:
        self._record("apply_tools_config", config)
        self.tools_config = config

    def list_server_tools(self, name: str) -> None:
        self._record("list_server_tools", name)

    def answer_consent(self, request_id: int, allow: bool) -> None:
        self._record("answer_consent", request_id, allow)

    def _load(self, name: str, path: Path, loaded: Variant) -> None:
        """The real worker's report sequence for a load: it ends ready, with no conversation yet."""
        self._loaded = True
        self._clock = time.monotonic()
        self.queue(
            ConversationCleared(),
            EngineState(AppState.LOADING, f"Opening {name}"),
            LoadProgress(0.4, "Reading weights"),
            LoadProgress(0.8, "Checking this machine's speed"),
            SpeedCheck(0.62, "This computer keeps up with real time comfortably."),
            ModelLoaded(name, path, loaded, {"name": name, "path": str(path), "quantization_bits": loaded.bits}),
            EngineState(AppState.READY),
        )

    def _script_turn(self, talking: bool) -> None:
        """Queue a user line while talking and an assistant answer after release, word by word."""
        words = (USER_LINE if talking else ASSISTANT_LINE).split(" ")
        kind = UserTranscriptDelta if talking else AssistantTextDelta

        text = ""
        for word in words:
            delta = f" {word}" if text else word
            text += delta
            if kind is UserTranscriptDelta:
                self._script.append(UserTranscriptDelta(self._frame, delta, text))
            else:
                self._script.append(AssistantTextDelta(self._frame, 0, delta, text))

    def _simulate(self) -> None:
        now = time.monotonic()
        frames = min(25, int((now - self._clock) / FRAME_SECONDS))
        self._clock += frames * FRAME_SECONDS
        for _ in range(frames):
            self._frame += 1
            self._elapsed += FRAME_SECONDS
            jitter = self._random.uniform(0.8, 1.3)
            stages = (6.0 * jitter, 2.0, 26.0 * jitter, 18.0 * self._random.uniform(0.9, 1.6), 5.0)
            self.queue(make_frame_stats(self._frame, stages, other=1.0, p50=54.0, p95=78.0))
            if self._script and self._frame % 3 == 0:
                self.queue(self._script.popleft())
        if frames:
            speaking = bool(self._script) and not self.talking
            self.queue(
                Levels(self._random.uniform(0.2, 0.7) if self.talking else 0.01, 0.4 if speaking else 0.0),
                ConversationTime(self._elapsed, CONVERSATION_LIMIT_S - self._elapsed),
            )


class ScriptedAudio:
    """Stands in for AudioIO: delivers microphone frames (or silence while the key is up) at full speed.

    Frames are delivered only while capturing, as AudioIO's ring is filled only then.
    """

    def __init__(
        self,
        input_device=None,
        output_device=None,
        *,
        duck_while_talking=False,
        capture=True,
        volume=1.0,
        muted=False,
        speech=None,
    ):
        self._talking = False
        self.capturing = capture
        self.duck_while_talking = duck_while_talking
        self.volume, self.muted = volume, muted
        self.speech = speech if speech is not None else np.zeros(INPUT_FRAME_SAMPLES * 10, np.float32)
        self.position = 0
        self.frames_read: list[tuple[bool, np.ndarray]] = []
        self.played: list[np.ndarray] = []
        self.input_peak = self.output_peak = 0.0
        self.input_lost_s = 0.0
        self.output_underruns = 0
        self.output_skipped_s = 0.0
        self.input_backlog_frames = 0
        self.last_audible = 0.0
        self.latencies: list[float] = []
        self.started = False
        self.paused = False
        self.hushed = False
        self.health: list[DeviceStatus] = []
        self.input_device_name: str | None = "Scripted microphone"
        self.output_device_name: str | None = "Scripted speaker"

    @property
    def input_device_label(self) -> str | None:
        return self.input_device_name

    @property
    def output_device_label(self) -> str | None:
        return self.output_device_name

    @property
    def talking(self):
        return self._talking

    @talking.setter
    def talking(self, talking):
        if talking:
            self.hushed = False
        self._talking = talking

    def start(self):
        self.started = True

    def close(self):
        self.started = False

    def poll_health(self):
        statuses, self.health = self.health, []
        return statuses

    def unplug(self):
        """Both devices vanish: audio pauses, as AudioIO does when nothing is left to open."""
        self.paused = True
        self.input_device_name = self.output_device_name = None
        self.health.append(DeviceStatus(None, None, "The microphone stopped working. Audio is paused."))

    def set_devices(self, input_name, output_name):
        pass

    def start_capture(self):
        self.capturing = True

    def stop_capture(self):
        self.capturing = False

    def clear_output(self):
        pass

    def hush(self):
        self.hushed = True

    def take_turn_latencies(self):
        taken, self.latencies = self.latencies, []
        return taken

    def read_frame(self, timeout=0.0):
        time.sleep(0.002)
        if not self.capturing or self.paused:
            return None
        if self._talking:
            start = self.position % self.speech.shape[0]
            frame = np.resize(self.speech[start : start + INPUT_FRAME_SAMPLES], INPUT_FRAME_SAMPLES)
            self.position += INPUT_FRAME_SAMPLES
        else:
            frame = np.zeros(INPUT_FRAME_SAMPLES, np.float32)
        self.frames_read.append((self._talking, frame.astype(np.float32)))
        return frame.astype(np.float32)

    def play(self, samples, *, live=False):
        if not self.hushed:
            self.played.append(samples)
