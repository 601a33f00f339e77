"""The app's microphone and speaker streams: :class:`AudioIO` (rings, resampling, level meters, hot-plug).

The devices are listed in ``app.audio.devices``, the output chain (volume, ducking, limiter) lives in
``app.audio.output``, a history replay in ``app.audio.replay``, hands-free's "the user speaks" in ``app.audio.voice``.

Data path::

    mic ─► input callback ─► input ring (device rate) ─► read_frame(): soxr ─► 1280 samples @ 16 kHz
    play(22.05 kHz) : soxr ─► output ring (device rate) ─► output callback (jitter buffer, ducking) ─► speaker

Both streams run at the device's native rate; all resampling happens on the engine worker's side, never in a callback.

Hands-free (``set_echo_canceller``): an ``app.echo.EchoCanceller`` sits at the device edge. The output callback feeds
it what the speaker actually plays (after volume, ducking and the limiter, with the block's DAC time); ``read_frame()``
cleans each 16 kHz frame with it on the engine worker (with the frame's ADC time, tracked from the input callback's
timestamps by sample count), so the engine never hears the assistant's own voice. Each stream's PortAudio times are
turned into ``time.monotonic()`` in its own callback (PortAudio's clock base differs between host APIs; the offsets
within one callback do not). In hands-free the talk key opens and closes the microphone, ducking follows the user's
voice instead of the key, and the canceller is reset whenever the streams reopen.

The microphone is open only while ``capturing`` (a conversation reads frames, or is about to: the talk key went down):
while the engine loads, sleeps or waits for the first key press, no stream listens, so a desktop's microphone-in-use
indicator stays off. Audio that a full ring drops is counted in seconds (``input_lost_s``). The output callback plays
the jitter buffer through the chain of ``app.audio.output``, whose limiter no sample exceeds, whatever the model, the
demo or the volume do.

Concurrency contract
    - PortAudio callback threads run the input and output callbacks. They never block (the rings hold their locks
      only for a copy), allocate nothing in the steady state (only a short gain ramp when ducking starts or ends),
      and read ``talking`` / ``duck_while_talking`` once per block.
    - One engine thread calls ``read_frame()`` and ``play()`` (and ``clear_input()`` / ``clear_output()``,
      ``start_capture()`` / ``stop_capture()``, which open and close the microphone under the lifecycle lock). The
      reader's and the playback queue's locks guard the resamplers and the rings' identity on that side, so a
      reopen at a new rate swaps them safely.
    - One controller thread calls ``start()``, ``set_devices()``, ``poll_health()`` and ``close()`` (serialised by
      a lock) and sets ``talking`` / ``duck_while_talking`` / ``volume`` / ``muted``, ``hush()`` and
      ``take_turn_latencies()``; it may call ``start_capture()`` too (the talk key went down).
    - Any thread may read the levels, counters and backlogs: plain attribute reads.

Hot-plug: the controller calls ``poll_health()`` periodically (every 0.25–1 s). A stream that PortAudio finished
unexpectedly, that went inactive, or whose callbacks stopped is reopened on the chosen device, else on the default
one; with nothing to open, audio is *paused* and retried on later polls until a device returns. What happened is
reported as ``DeviceStatus`` messages in the list ``poll_health()`` returns (no callbacks). Running on a fallback,
AudioIO does not switch back by itself when the chosen device returns; ``set_devices()`` does, and so does any
later reopen.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from app.messages import DeviceStatus
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

from .alsa import xruns as alsa_xruns
from .devices import (
    NO_MICROPHONE,
    NO_SPEAKER,
    AudioDevice,
    AudioUnavailable,
    DeviceList,
    Direction,
    list_devices,
    refresh_devices,
)
from .endpoint import Endpoint, decayed_peak, monotonic_time, start_stream, stop_stream
from .frames import FrameReader
from .output import AUDIBLE_PEAK, peak_of
from .playback import PlaybackQueue
from .replay import Replayer
from .voice import UserVoice

if TYPE_CHECKING:
    from app.echo import EchoCanceller

log = logging.getLogger(__name__)


class AudioState(enum.Enum):
    """Where an ``AudioIO`` is in its life."""

    STOPPED = "stopped"  # not started, or closed
    RUNNING = "running"
    PAUSED = "paused"  # started, but no usable device right now; poll_health() retries


class AudioIO:
    """The app's microphone and speaker streams (one instance per app).

    Args:
        input_device: the microphone's name (exact, or a unique part of it); None for the system default.
        output_device: the speaker's name, likewise.
        capture: start with the microphone feeding the input ring (the app starts without, and lets the
            engine worker open it when it begins to read frames).
        input_ring_s: microphone audio buffered for the engine while it catches up; beyond it the oldest
            is dropped (and counted in ``input_lost_s``).
        output_ring_s: assistant audio that ``play()`` may queue ahead.
        prefill_frames: engine frames (80 ms) buffered before playback starts or resumes (jitter buffer).
        duck_gain: playback gain while the talk key is held, when ``duck_while_talking`` is set.
        latency: PortAudio latency, "low", "high" or seconds.
        retry_interval_s: while paused, how often ``poll_health()`` looks for a device again.
        stall_timeout_s: a running stream whose callback has not run for this long counts as lost.
        engine_input_rate, engine_output_rate, frame_samples: the engine's contract (``engine.loading.config``).

    Attributes set by the controller (read once per audio block, no locks):
        talking: True while the talk key is held; otherwise the engine receives silence.
        duck_while_talking: attenuate playback by ``duck_gain`` while ``talking``.
        volume: the master playback level, 0..1.
        muted: play silence (the engine keeps running).
    """

    def __init__(
        self,
        input_device: str | None = None,
        output_device: str | None = None,
        *,
        capture: bool = True,
        input_ring_s: float = 20.0,
        output_ring_s: float = 10.0,
        prefill_frames: int = 2,
        duck_while_talking: bool = False,
        duck_gain: float = 0.2,
        volume: float = 1.0,
        muted: bool = False,
        latency: str | float = "high",
        retry_interval_s: float = 1.0,
        stall_timeout_s: float = 3.0,
        engine_input_rate: int = INPUT_SAMPLE_RATE,
        engine_output_rate: int = OUTPUT_SAMPLE_RATE,
        frame_samples: int = INPUT_FRAME_SAMPLES,
    ) -> None:
        if not 0.0 <= duck_gain <= 1.0:
            raise ValueError(f"duck_gain must be between 0 and 1, got {duck_gain}")
        if not 0.0 <= volume <= 1.0:
            raise ValueError(f"volume must be between 0 and 1, got {volume}")
        self._talking = False
        self.capturing = capture
        self.duck_while_talking = duck_while_talking
        self.duck_gain = duck_gain
        self.volume = volume
        self.muted = muted
        self._hushed = False  # stop_speaking(): drop the assistant's audio until the key goes down again
        self._released_at: float | None = None  # when the talk key went up, until the reply is heard
        self._turn_latencies: list[float] = []
        self._last_audible = 0.0
        self._input_pref = input_device
        self._output_pref = output_device
        self._prefill_s = prefill_frames * frame_samples / engine_input_rate
        self._latency = latency
        self._retry_interval_s = retry_interval_s
        self._stall_timeout_s = stall_timeout_s
        self._frame_samples = frame_samples

        self._lifecycle = threading.RLock()
        self._state = AudioState.STOPPED
        self._input: Endpoint | None = None  # open only while ``capturing``
        self._input_device: AudioDevice | None = None  # the microphone in use, open or to open on demand
        self._output: Endpoint | None = None
        self._statuses: list[DeviceStatus] = []
        self._next_retry = 0.0
        self._abandoned_streams = 0  # streams that would not stop; PortAudio is not re-initialised under them
        self._echo: EchoCanceller | None = None  # hands-free: set by the controller
        self._resuming = False  # reopened after a pause, not yet confirmed by audio flowing
        self._resume_notes: list[str] = []

        self._reader = FrameReader(input_ring_s, engine_input_rate, frame_samples)  # the microphone's reader side
        self._voice = UserVoice()  # hands-free: whether the user speaks (ducking, unhushing)
        self._playback = PlaybackQueue(output_ring_s, engine_output_rate, self._prefill_s)  # the speaker's writer side
        self.replayer = Replayer(lambda: self._playback.rate)  # a history replay, mixed into the speaker

        # Written only by the callbacks; read by anyone.
        self._input_peak = 0.0
        self._output_peak = 0.0
        self._input_device_overflows = 0
        self._output_device_underflows = 0

    # ------------------------------------------------------------------ lifecycle (controller thread)

    def start(self) -> None:
        """Open both streams (chosen devices, else the defaults) and start them.

        A chosen device that is missing or fails falls back to the default, which is
        reported by the next ``poll_health()``.

        Raises:
            AudioUnavailable: no usable microphone or speaker (the message says which), or no PortAudio.
        """
        with self._lifecycle:
            if self._state is not AudioState.STOPPED:
                return
            notes = self._open_streams()
            self._state, self._resuming = AudioState.RUNNING, False
            if notes:
                self._report(" ".join(notes))

    def close(self) -> None:
        """Stop and close both streams. Never hangs; safe to call more than once."""
        self.stop_replay()
        with self._lifecycle:
            self._close_streams()
            self._state, self._resuming = AudioState.STOPPED, False

    def set_devices(self, input_name: str | None, output_name: str | None) -> None:
        """Choose the microphone and speaker by name (None = system default) and reopen the streams.

        Devices plugged in since the last refresh are found. A device that cannot be
        opened falls back to the default; with nothing usable audio pauses. A change of
        device, a fallback or a pause is reported by the next ``poll_health()``; reopening
        the same devices is not.
        """
        with self._lifecycle:
            self._input_pref, self._output_pref = input_name, output_name
            if self._state is AudioState.STOPPED:
                return
            before = (self.input_device_name, self.output_device_name)
            self._close_streams()
            try:
                notes = self._open_streams()
            except AudioUnavailable as error:
                self._pause(f"{error} Audio is paused and resumes when a device is available.")
                return
            self._state, self._resuming = AudioState.RUNNING, False
            # Reopening the same devices (a refresh of the device lists) is nothing to tell the user about.
            if notes or before != (self.input_device_name, self.output_device_name):
                self._report(" ".join([*notes, f"Using the {self._input_label()} and the {self._output_label()}."]))

    def poll_health(self) -> list[DeviceStatus]:
        """Check the streams, recover from lost devices, and return what changed since the last call.

        Call it periodically from the controller (every 0.25–1 s). It may block for a
        fraction of a second while it reopens streams. Returns one ``DeviceStatus`` per
        event (fallback, device lost, paused, resumed), oldest first; empty when all is well.
        """
        with self._lifecycle:
            if self._state is AudioState.RUNNING:
                lost = self._lost_endpoints()
                if lost:
                    self._recover(lost)
                elif self._resuming:
                    self._confirm_resumed()
            elif self._state is AudioState.PAUSED and time.monotonic() >= self._next_retry:
                self._try_resume()
            statuses, self._statuses = self._statuses, []
            return statuses

    def __enter__(self) -> AudioIO:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ push to talk and playback control

    @property
    def talking(self) -> bool:
        """True while the talk key is held: the engine gets the microphone, otherwise silence."""
        return self._talking

    @talking.setter
    def talking(self, talking: bool) -> None:
        if talking and not self._talking:
            self._hushed = False  # the user took the turn; the next answer plays again
            self._released_at = None
        elif self._talking and not talking and self._echo is None:
            # The reply's delay is measured from here (in hands-free, closing the microphone is not a turn).
            self._released_at = time.monotonic()
        self._talking = talking

    def hush(self) -> None:
        """Stop the assistant now: drop what is queued for playback, and its audio until the key goes down again."""
        self._hushed = True
        self._released_at = None
        self.clear_output()

    @property
    def hushed(self) -> bool:
        return self._hushed

    def take_turn_latencies(self) -> list[float]:
        """Seconds from each key release to the first audible assistant audio at the speaker, since the last call."""
        taken, self._turn_latencies = self._turn_latencies, []
        return taken

    @property
    def last_audible(self) -> float:
        """``time.monotonic()`` of the last block of audible assistant audio (0 if none yet)."""
        return self._last_audible

    # ------------------------------------------------------------------ hands-free

    def set_echo_canceller(self, canceller: EchoCanceller | None) -> None:
        """Hands-free with ``canceller`` at the device edge, or push-to-talk without one (None)."""
        with self._lifecycle:
            if canceller is not None:
                canceller.reset()  # what it knew may be of other devices
                self._voice.reset()
                self._tell_latencies(canceller)
            self._echo = canceller

    @property
    def hands_free(self) -> bool:
        return self._echo is not None

    @property
    def user_speaking(self) -> bool:
        """Hands-free: the cleaned microphone carried the user's voice within the last half second."""
        return self._voice.speaking(time.monotonic())

    def _tell_latencies(self, canceller: EchoCanceller) -> None:
        inp, out = self._input, self._output
        canceller.set_device_latencies(out.latency_s if out else 0.0, inp.latency_s if inp else 0.0)

    # ------------------------------------------------------------------ history replay

    def start_replay(self, samples: np.ndarray, rate: int) -> float:
        """Play ``samples`` (mono, at ``rate``) mixed with the assistant, replacing a replay; returns its seconds."""
        return self.replayer.start(samples, rate)

    def stop_replay(self) -> None:
        """Stop a replay now (what is queued is dropped)."""
        self.replayer.stop()

    @property
    def replay_position(self) -> tuple[float, float] | None:
        """``(seconds played, seconds in all)`` of the replay in progress, or None when none plays."""
        return self.replayer.position

    # ------------------------------------------------------------------ state for anyone

    @property
    def state(self) -> AudioState:
        """Stopped, running or paused (waiting for a device)."""
        return self._state

    @property
    def paused(self) -> bool:
        """Started, but waiting for a device to come back."""
        return self._state is AudioState.PAUSED

    @property
    def input_device_name(self) -> str | None:
        """The microphone in use (open, or opened when a conversation reads it), or None while stopped or paused."""
        device = self._input_device
        return device.name if device else None

    @property
    def output_device_name(self) -> str | None:
        """The speaker in use, or None while stopped or paused."""
        endpoint = self._output
        return endpoint.device.name if endpoint else None

    @property
    def input_device_label(self) -> str | None:
        """The microphone in use in the user's words (the sound server's description), or None."""
        device = self._input_device
        return device.label if device else None

    @property
    def output_device_label(self) -> str | None:
        """The speaker in use in the user's words, or None."""
        endpoint = self._output
        return endpoint.device.label if endpoint else None

    @property
    def microphone_open(self) -> bool:
        """Whether the microphone's stream is open (only while a conversation reads it)."""
        return self._input is not None

    @property
    def input_rate(self) -> int:
        """The microphone stream's sample rate: the device's native rate once started."""
        return self._reader.rate

    @property
    def output_rate(self) -> int:
        """The speaker stream's sample rate: the device's native rate once started."""
        return self._playback.rate

    @property
    def input_peak(self) -> float:
        """Recent microphone peak, 0..1, with a short release; the real microphone even while the key is up."""
        return self._input_peak

    @property
    def output_peak(self) -> float:
        """Recent playback peak, 0..1, after ducking."""
        return self._output_peak

    @property
    def input_overflows(self) -> int:
        """Microphone blocks that pushed out unread audio because the engine fell more than ``input_ring_s`` behind."""
        return self._reader.overflows

    @property
    def input_lost_s(self) -> float:
        """Seconds of captured microphone audio dropped unread (the engine fell more than ``input_ring_s`` behind)."""
        return self._reader.lost_s

    @property
    def input_device_overflows(self) -> int:
        """Blocks in which PortAudio reported microphone audio lost before it reached us."""
        return self._input_device_overflows

    @property
    def output_underruns(self) -> int:
        """Times the speaker ran out of the assistant's audio mid-stream and played silence: the queue ran dry,
        or the device starved (``output_device_underflows``)."""
        return self._playback.underruns + self._output_device_underflows

    @property
    def output_skipped_s(self) -> float:
        """Seconds of inaudible live assistant audio skipped to win back the delay that underruns added."""
        return self._playback.skipped_s

    @property
    def output_overflows(self) -> int:
        """``play()`` calls that dropped the oldest queued audio because more than ``output_ring_s`` was queued."""
        return self._playback.overflows

    @property
    def output_device_underflows(self) -> int:
        """Blocks in which PortAudio reported the speaker starved while it played: our callback came too late."""
        return self._output_device_underflows

    @property
    def input_backlog_frames(self) -> int:
        """Whole engine frames of microphone audio waiting for ``read_frame()``."""
        return self._reader.backlog_frames

    @property
    def output_backlog_s(self) -> float:
        """Seconds of assistant audio queued and not yet played."""
        return self._playback.backlog_s

    # ------------------------------------------------------------------ engine side

    def read_frame(self, timeout: float = 0.0) -> np.ndarray | None:
        """The next engine frame: exactly ``frame_samples`` (1280) float32 samples at 16 kHz.

        Waits up to ``timeout`` seconds for enough audio; returns None if there is not.
        While the talk key is up the frames are silence, so the timeline keeps running.
        """
        deadline = time.monotonic() + timeout
        reader = self._reader
        while True:
            reader.ready.clear()
            with reader.lock:
                taken = reader.take_frame()
            if taken is not None:
                frame, adc_time = taken
                echo = self._echo
                return frame if echo is None else self._clean(echo, frame, adc_time)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            reader.ready.wait(remaining)

    def _clean(self, echo: EchoCanceller, frame: np.ndarray, adc_time: float | None) -> np.ndarray:
        """Hands-free: the frame without the assistant's echo; notes whether the user is speaking."""
        cleaned = echo.clean_capture(frame, adc_time=adc_time)
        if len(cleaned) != len(frame):  # whole 10 ms blocks in, whole blocks out: only after a canceller swap
            cleaned = np.resize(cleaned, len(frame)) if len(cleaned) else np.zeros_like(frame)
        if self._talking and self._voice.judge(frame, cleaned, time.monotonic()):  # an open microphone
            self._hushed = False  # the user took the turn (hands-free has no key press for it)
        if not frame.any():
            return frame  # the microphone is closed: the engine gets true silence, not AEC3's comfort noise
        return cleaned

    def start_capture(self) -> None:
        """The engine starts reading frames: microphone audio from now on goes to it (nothing older).

        Does nothing while already capturing, so audio captured since the talk key went down is kept.
        """
        if self.capturing:
            return
        with self._reader.lock:
            self._reader.clear_locked()
            self.capturing = True
        self._open_microphone()

    def stop_capture(self) -> None:
        """The engine stops reading frames (loading, asleep, no conversation): the microphone closes."""
        self.capturing = False
        self.clear_input()
        self._close_microphone()

    def play(self, samples: np.ndarray, *, live: bool = False) -> None:
        """Queue assistant speech (mono, at the engine's 22.05 kHz) for playback; never blocks.

        Non-finite values become silence and the rest is clipped to [-1, 1]. When more
        than ``output_ring_s`` is queued the oldest audio is dropped (``output_overflows``).
        After ``hush()`` and until the talk key goes down, the audio is dropped instead.

        ``live`` marks the engine's stream, one frame at a time. An underrun plays silence and leaves
        everything queued after it that much later; so while more than the jitter buffer and this
        frame are queued, a live frame with nothing audible in it (peak at most ``AUDIBLE_PEAK``) is
        skipped, and the pauses between turns win the delay back (``output_skipped_s``).

        Raises:
            ValueError: ``samples`` is not one-dimensional.
        """
        data = np.asarray(samples, dtype=np.float32)
        if data.ndim != 1:
            raise ValueError(f"play() expects mono samples of shape (n,), got shape {data.shape}")
        if not np.isfinite(data).all():
            data = np.nan_to_num(data, nan=0.0, posinf=0.0, neginf=0.0)
        data = np.clip(data, -1.0, 1.0)
        if self._hushed:
            return
        self._playback.queue(data, live=live)

    def clear_input(self) -> None:
        """Drop microphone audio not yet read (e.g. when a new conversation starts)."""
        with self._reader.lock:
            self._reader.clear_locked()

    def clear_output(self) -> None:
        """Drop queued assistant audio that has not been played (e.g. on reset)."""
        self._playback.clear()

    # ------------------------------------------------------------------ opening and recovering

    def _open_streams(self) -> list[str]:
        """Refresh, open and start both streams; returns notes about fallbacks. Caller holds ``_lifecycle``."""
        notes = self._open_both()
        echo = self._echo
        if echo is not None:  # other devices (or the same ones, restarted): a new echo path and new timing
            echo.reset()
            self._voice.reset()
            self._tell_latencies(echo)
        return notes

    def _open_both(self) -> list[str]:
        """The speaker, and the microphone only while ``capturing`` (else just chosen, to open on demand)."""
        if self._abandoned_streams == 0:
            refresh_devices()
        devices = list_devices()
        if not devices.inputs:
            raise AudioUnavailable(NO_MICROPHONE)
        if not devices.outputs:
            raise AudioUnavailable(NO_SPEAKER)
        notes: list[str] = []
        if self.capturing:
            self._input = self._open_first("input", devices, self._input_pref, notes)
            self._input_device = self._input.device
        else:
            candidates, reason = devices.candidates("input", self._input_pref)
            self._input_device = candidates[-1] if reason else candidates[0]
            if reason:
                notes.append(f"The microphone '{self._input_pref}' {reason}; using '{self._input_device.label}'.")
        try:
            self._output = self._open_first("output", devices, self._output_pref, notes)
        except AudioUnavailable:
            self._close_streams()
            raise
        return notes

    def _open_microphone(self) -> None:
        """Open the microphone for a conversation that starts reading it; with none to open, audio pauses."""
        with self._lifecycle:
            if self._state is not AudioState.RUNNING or self._input is not None or not self.capturing:
                return
            notes: list[str] = []
            try:
                devices = list_devices()  # the server's devices as they are now; PortAudio is not restarted under
                if not devices.inputs:  # the speaker
                    raise AudioUnavailable(NO_MICROPHONE)
                self._input = self._open_first("input", devices, self._input_pref, notes)
            except AudioUnavailable as error:
                self._close_streams()
                self._pause(f"{error} Audio is paused and resumes when a device is available.")
                return
            before, self._input_device = self._input_device, self._input.device
            echo = self._echo
            if echo is not None:  # the same room, kept; the microphone's timing is known only now
                self._tell_latencies(echo)
            if notes or (before is not None and before.name != self._input_device.name):
                self._report(" ".join([*notes, f"Using the {self._input_label()}."]))

    def _close_microphone(self) -> None:
        with self._lifecycle:
            endpoint, self._input = self._input, None
            if endpoint is not None:
                self._shutdown(endpoint)
            self._input_peak = 0.0

    def _open_first(
        self, direction: Direction, device_list: DeviceList, preferred: str | None, notes: list[str]
    ) -> Endpoint:
        """Open the chosen device, else the default one (or the first, when there is no default)."""
        kind = "microphone" if direction == "input" else "speaker"
        candidates, reason = device_list.candidates(direction, preferred)
        errors = []
        for device in candidates:
            try:
                endpoint = self._open_endpoint(direction, device)
            except AudioUnavailable as error:
                log.debug("Could not open the %s %r: %s", kind, device.name, error)
                errors.append(str(error))
                reason = "could not be opened"
                continue
            if preferred is not None and reason:
                notes.append(f"The {kind} '{preferred}' {reason}; using '{device.label}' instead.")
            return endpoint
        raise AudioUnavailable(" ".join(errors))

    def _open_endpoint(self, direction: Direction, device: AudioDevice) -> Endpoint:
        """Open and start one stream at the device's native rate (mono, else its first channel)."""
        rate = round(device.default_samplerate)
        if direction == "input":
            ring = self._reader.adopt_rate(rate)
        else:
            ring = self._playback.adopt_rate(rate)
        endpoint = Endpoint(direction=direction, device=device, rate=rate, ring=ring)
        callback = self._input_callback(endpoint) if direction == "input" else self._output_callback(endpoint)
        start_stream(endpoint, callback, self._latency)
        return endpoint

    def _lost_endpoints(self) -> list[tuple[Endpoint, bool]]:
        """The streams that failed, went inactive or stalled, each with whether it (only) stalled."""
        now = time.monotonic()
        lost = []
        for endpoint in (self._input, self._output):
            if endpoint is None:
                continue
            broken = endpoint.failed or not endpoint.stream.active
            stalled = now - endpoint.last_callback > self._stall_timeout_s
            if broken or stalled:
                log.warning("Lost the %s (failed=%s, stalled=%s)", endpoint.label, endpoint.failed, stalled)
                lost.append((endpoint, not broken))
        return lost

    def _recover(self, lost: list[tuple[Endpoint, bool]]) -> None:
        what = " and the ".join(endpoint.label for endpoint, _ in lost)
        resuming, self._resuming = self._resuming, False
        if resuming or all(stalled and not endpoint.delivered for endpoint, stalled in lost):
            # A retry after a pause that did not work out goes back to the pause quietly. Streams
            # that never delivered a block since they were reopened, without an error, would only
            # do that again if reopened at once (a hung or suspended device): pause and retry slower.
            self._close_streams()
            self._pause(
                None if resuming else f"The {what} is not delivering audio. Audio is paused and resumes when it does."
            )
            return
        before = {endpoint.direction: endpoint.device.name for endpoint, _ in lost}
        self._close_streams()
        try:
            notes = self._open_streams()
        except AudioUnavailable as error:
            log.warning("No audio device to fall back on: %s", error)
            self._pause(f"The {what} stopped working. Audio is paused and resumes when a device is available.")
            return
        self._state = AudioState.RUNNING
        now = {"input": self.input_device_name, "output": self.output_device_name}
        if all(before[direction] == now[direction] for direction in before):
            outcome = "It was reopened." if len(lost) == 1 else "They were reopened."
        else:
            outcome = f"Now using the {self._input_label()} and the {self._output_label()}."
        self._report(" ".join([f"The {what} stopped working.", outcome, *notes]))

    def _try_resume(self) -> None:
        """Reopen while paused; "resumed" is reported once both streams deliver audio."""
        try:
            self._resume_notes = self._open_streams()
        except AudioUnavailable as error:
            log.debug("Audio still paused: %s", error)
            self._next_retry = time.monotonic() + self._retry_interval_s
            return
        self._state = AudioState.RUNNING
        self._resuming = True

    def _confirm_resumed(self) -> None:
        opened = [endpoint for endpoint in (self._input, self._output) if endpoint is not None]
        if self._output is not None and all(endpoint.delivered for endpoint in opened):
            self._resuming = False
            resumed = f"Audio resumed on the {self._input_label()} and the {self._output_label()}."
            self._report(" ".join([resumed, *self._resume_notes]))

    def _pause(self, message: str | None) -> None:
        self._state = AudioState.PAUSED
        self._next_retry = time.monotonic() + self._retry_interval_s
        if message is not None:
            self._report(message)

    def _report(self, message: str) -> None:
        self._statuses.append(DeviceStatus(self.input_device_name, self.output_device_name, message))

    def _input_label(self) -> str:
        return f"microphone '{self._input_device.label}'" if self._input_device else "no microphone"

    def _output_label(self) -> str:
        return self._output.label if self._output else "no speaker"

    def _close_streams(self) -> None:
        for endpoint in (self._input, self._output):
            if endpoint is not None:
                self._shutdown(endpoint)
        self._input = self._output = None
        self._input_device = None

    def _shutdown(self, endpoint: Endpoint) -> None:
        if not stop_stream(endpoint):
            # PortAudio would hang on re-initialisation under this stream, so refreshing stops from now on.
            self._abandoned_streams += 1

    # ------------------------------------------------------------------ callbacks (PortAudio threads)

    def _input_callback(self, endpoint: Endpoint) -> Callable[[np.ndarray, int, Any, Any], None]:
        ring, reader, rate = endpoint.ring, self._reader, endpoint.rate

        def callback(indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
            endpoint.last_callback = time.monotonic()
            if status.input_overflow:
                self._input_device_overflows += 1
            mono = indata[:, 0]
            self._input_peak = decayed_peak(mono, self._input_peak, frames, rate)
            if not self.capturing:
                return  # nobody reads frames now: the meter shows the microphone, the ring stays empty
            if self._echo is not None:
                adc = monotonic_time(time_info, "inputBufferAdcTime")
                if adc is None:
                    adc = endpoint.last_callback - endpoint.latency_s - frames / rate
                reader.adc_anchor = (reader.captured, adc)
            reader.captured += frames
            if self._talking:
                ring.write(mono)
            else:
                ring.write_zeros(frames)
            reader.ready.set()

        return callback

    def _output_callback(self, endpoint: Endpoint) -> Callable[[np.ndarray, int, Any, Any], None]:
        ring, rate = endpoint.ring, endpoint.rate
        prefill = round(self._prefill_s * rate)
        endpoint.alsa_underruns = alsa_xruns["underrun"]  # those of earlier streams are not this one's

        def callback(outdata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
            endpoint.last_callback = time.monotonic()
            recovered = alsa_xruns["underrun"] != endpoint.alsa_underruns  # alsa-lib's recovery, not always flagged
            endpoint.alsa_underruns = alsa_xruns["underrun"]
            if (status.output_underflow or recovered) and endpoint.playing:
                # The device starved mid-stream: the machine called back too late, and the speaker went silent.
                self._output_device_underflows += 1
            if outdata.shape[1] == 1:
                mono = outdata[:, 0]
            else:
                if len(endpoint.scratch) < frames:
                    endpoint.scratch = np.zeros(frames, dtype=np.float32)
                mono = endpoint.scratch[:frames]
            if not endpoint.playing:
                # Jitter buffer: start once `prefill` is queued, or once a shorter clip has waited as long.
                queued = ring.available
                endpoint.waited = endpoint.waited + frames if queued else 0
                endpoint.playing = queued >= prefill or endpoint.waited >= prefill
            if endpoint.playing:
                if ring.read_into(mono) < frames:
                    endpoint.playing, endpoint.waited = False, 0
            else:
                mono.fill(0.0)
            source_peak = peak_of(mono)
            if source_peak > AUDIBLE_PEAK:
                now = time.monotonic()
                self._last_audible = now
                released = self._released_at
                if released is not None:
                    # The reply's delay, as heard: this block reaches the ear after the stream's latency.
                    self._released_at = None
                    self._turn_latencies.append(now + endpoint.latency_s - released)
            replay = self.replayer.ring
            if replay is not None and replay.available:
                if len(endpoint.replay_scratch) < frames:
                    endpoint.replay_scratch = np.zeros(frames, dtype=np.float32)
                extra = endpoint.replay_scratch[:frames]
                got = replay.read_into(extra)
                mono[:got] += extra[:got]
            echo = self._echo
            # Hands-free has no key: duck while the microphone carries the user's voice (app.audio.voice).
            user_turn = self._talking if echo is None else self._voice.speaking(time.monotonic())
            duck = self.duck_gain if self.duck_while_talking and user_turn else 1.0
            target = 0.0 if self.muted else duck * self.volume
            endpoint.ramp.apply(mono, target)
            endpoint.limiter.process(mono, rate)
            if outdata.shape[1] != 1:
                outdata[:] = mono[:, np.newaxis]
            self._output_peak = decayed_peak(mono, self._output_peak, frames, rate)
            if echo is not None:
                self._voice.heard_speaker(mono, rate)
            if echo is not None and self.capturing:  # the reference: exactly what the speaker plays, and when
                echo.feed_playback(mono, rate=rate, dac_time=monotonic_time(time_info, "outputBufferDacTime"))

        return callback
