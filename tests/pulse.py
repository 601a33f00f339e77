"""A private PulseAudio server with virtual devices, for tests that need real audio.

Topology (platform-lab.md §4)::

    paplay -d virt_mic_feed ─► virt_mic_feed (null sink) ─► monitor ─► virt_mic (remap source) ─► app input
    app output ─► virt_speaker (null sink) ─► virt_speaker.monitor ─► parecord

``virt_mic`` is the default source and ``virt_speaker`` the default sink; each has a description
(``MIC_DESCRIPTION``, ``SPEAKER_DESCRIPTION``), as a real device does. Both null sinks
use ``norewinds=1``: without it the start of every clip is lost. Never use
``module-pipe-source`` instead: it hangs ``InputStream.stop()``.

PortAudio (through ALSA's pulse plugin) sees the server as the ALSA devices ``default`` and
``pulse``, plus two ALSA devices defined here so that choosing a device by name can be
tested: ``parley_virt_mic`` (records ``virt_mic``) and ``parley_virt_speaker`` (plays to
``virt_speaker``).

The server runs in its own temporary ``XDG_RUNTIME_DIR`` with its own cookie and client
config (no autospawn), so it never touches a desktop session's sound server. While it
runs, this process's environment points every PulseAudio client (the code under test,
paplay, parecord, pactl) at it; ``close()`` restores the environment. PortAudio
enumerates devices only when it initialises, so after ``start()``, ``stop()``,
``no_server()`` or ``reset()`` the code under test must call
``app.audio.devices.refresh_devices()`` to see the change.

Usage::

    with virtual_devices() as pulse:
        pulse.play_into_mic(wav)
        with pulse.record_speaker() as recording:
            ...
        recording.samples
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import soundfile

MIC_FEED = "virt_mic_feed"
MIC = "virt_mic"
SPEAKER = "virt_speaker"
MIC_DESCRIPTION = "Parley test microphone"
MIC_FEED_DESCRIPTION = "Parley test microphone feed"
SPEAKER_DESCRIPTION = "Parley test speaker"
ALSA_MIC = "parley_virt_mic"
ALSA_SPEAKER = "parley_virt_speaker"
SYSTEM_ALSA_CONF = Path("/usr/share/alsa/alsa.conf")
TOOLS = ("pulseaudio", "pactl", "pacmd", "paplay", "parecord")
CLIENT_ENV = ("XDG_RUNTIME_DIR", "PULSE_SERVER", "PULSE_COOKIE", "PULSE_CLIENTCONFIG", "ALSA_CONFIG_PATH")

# ALSA's default device goes to this server even where the desktop routes it elsewhere (pipewire-alsa).
_ALSA_DEVICES = f"""\
pcm.!default {{ type pulse hint {{ show on description "Parley test server" }} }}
ctl.!default {{ type pulse }}
pcm.{ALSA_MIC} {{ type pulse device {MIC} hint {{ show on description "Parley test microphone" }} }}
pcm.{ALSA_SPEAKER} {{ type pulse device {SPEAKER} hint {{ show on description "Parley test speaker" }} }}
"""


class PulseError(RuntimeError):
    """The test server could not be started or a pactl command failed."""


@dataclass
class Recording:
    """What ``record_speaker()`` captured: filled in when its ``with`` block ends."""

    path: Path
    rate: int
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))


class PulseServer:
    """A private ``pulseaudio -n`` daemon with a virtual microphone and speaker."""

    def __init__(self) -> None:
        # Short path under /tmp: the server's unix socket path must stay under 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="parley-pulse-"))
        self.runtime_dir = self.root / "xdg"
        self.log_path = self.root / "pulse.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._modules: dict[str, int] = {}  # our name for a device -> its module index
        self._saved_env: dict[str, str | None] | None = None
        self._recordings = 0
        client_conf = self.root / "client.conf"
        client_conf.write_text("autospawn = no\n")
        alsa_conf = self.root / "asound.conf"
        alsa_conf.write_text(_ALSA_DEVICES)
        self.client_env = {
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
            "PULSE_SERVER": f"unix:{self.runtime_dir}/pulse/native",
            "PULSE_COOKIE": str(self.root / "cookie"),
            "PULSE_CLIENTCONFIG": str(client_conf),
            "ALSA_CONFIG_PATH": f"{SYSTEM_ALSA_CONF}:{alsa_conf}",
        }

    # ------------------------------------------------------------------ server lifecycle

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the daemon with both virtual devices and point this process's environment at it."""
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise PulseError(
                f"Audio tests need {', '.join(missing)}: install pulseaudio and pulseaudio-utils "
                "(packaging/system-deps.sh test)"
            )
        if not SYSTEM_ALSA_CONF.exists():
            raise PulseError(f"ALSA's configuration {SYSTEM_ALSA_CONF} is missing (install libasound2-data)")
        self._apply_env()
        if self.running:
            return
        self.runtime_dir.mkdir(mode=0o700, exist_ok=True)
        (self.root / "home").mkdir(exist_ok=True)
        daemon_env = {
            **os.environ,
            **self.client_env,
            "HOME": str(self.root / "home"),
            "XDG_CONFIG_HOME": str(self.root / "home" / ".config"),
            "PULSE_STATE_PATH": str(self.root / "state"),
            "PULSE_RUNTIME_PATH": str(self.runtime_dir / "pulse"),
        }
        command = [
            "pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--disallow-exit",
            "--realtime=no", "--high-priority=no", f"--log-target=file:{self.log_path}",
            "-L", "module-native-protocol-unix auth-anonymous=1",
            "-L", "module-cli-protocol-unix",  # for pacmd, which can kill streams
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, env=daemon_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._modules.clear()
        self._wait_until(self._answers, 10.0, "the PulseAudio server to answer")
        self.load_speaker()
        self.load_mic()

    def stop(self) -> None:
        """Terminate the daemon: every device disappears at once (a sound-server crash)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        self._modules.clear()

    def reset(self) -> None:
        """Back to the initial state: server running, both devices loaded and default, environment applied."""
        self.start()
        self.load_speaker()
        self.load_mic()

    def close(self) -> None:
        """Stop the daemon, restore the environment and delete the temporary folder."""
        self.stop()
        self._restore_env()
        shutil.rmtree(self.root, ignore_errors=True)

    @contextmanager
    def no_server(self) -> Iterator[None]:
        """Within the block, PulseAudio clients of this process find no server at all."""
        previous = os.environ.get("PULSE_SERVER")
        os.environ["PULSE_SERVER"] = f"unix:{self.root}/no-server-here"
        try:
            yield
        finally:
            _set_env("PULSE_SERVER", previous)

    # ------------------------------------------------------------------ devices appearing and disappearing

    def load_mic(self) -> None:
        """Create the virtual microphone (feed sink + remap source) and make it the default source."""
        if "mic_feed" not in self._modules:
            self._load(
                "mic_feed", "module-null-sink", f"sink_name={MIC_FEED}", "norewinds=1", "rate=48000",
                _described(MIC_FEED_DESCRIPTION, "sink"),
            )  # fmt: skip
        if "mic" not in self._modules:
            self._load(
                "mic", "module-remap-source", f"master={MIC_FEED}.monitor", f"source_name={MIC}",
                _described(MIC_DESCRIPTION, "source"),
            )  # fmt: skip
        self.pactl("set-default-source", MIC)

    def unload_mic(self) -> None:
        """Remove the virtual microphone. PulseAudio moves its recording streams to another source, if any."""
        for name in ("mic", "mic_feed"):
            if name in self._modules:
                self.pactl("unload-module", str(self._modules.pop(name)))

    def load_speaker(self) -> None:
        """Create the virtual speaker and make it the default sink."""
        if "speaker" not in self._modules:
            self._load(
                "speaker", "module-null-sink", f"sink_name={SPEAKER}", "norewinds=1", "rate=48000",
                _described(SPEAKER_DESCRIPTION, "sink"),
            )  # fmt: skip
        self.pactl("set-default-sink", SPEAKER)

    def unload_speaker(self) -> None:
        """Remove the virtual speaker (and with it its monitor source)."""
        if "speaker" in self._modules:
            self.pactl("unload-module", str(self._modules.pop("speaker")))

    def suspend_mic(self, suspended: bool = True) -> None:
        """Suspend (or wake) the virtual microphone: its recording streams get no audio, and no error."""
        self.pactl("suspend-source", MIC, "1" if suspended else "0")

    def kill_recording_streams(self) -> None:
        """End every recording stream with an error, as a vanished device does under plain ALSA.

        PulseAudio itself moves streams to another device when theirs disappears, so
        applications never see the failure; this makes them see it.
        """
        for line in self.pactl("list", "short", "source-outputs").splitlines():
            index, _source, client, *_ = line.split()
            if client != "-":  # a client's stream, not module-remap-source's own
                subprocess.run(["pacmd", "kill-source-output", index], env=self._env(), check=True, timeout=10)

    # ------------------------------------------------------------------ audio in and out

    def play_into_mic(self, wav: Path, *, wait: bool = True) -> subprocess.Popen[bytes]:
        """Play ``wav`` into the virtual microphone (in real time); with ``wait`` returns when it ends."""
        process = subprocess.Popen(["paplay", "-d", MIC_FEED, str(wav)], env=self._env())
        if wait:
            process.wait(60)
        return process

    @contextmanager
    def record_speaker(self, rate: int = 22_050) -> Iterator[Recording]:
        """Record what is played to the virtual speaker, mono float32 at ``rate``, during the block."""
        self._recordings += 1
        recording = Recording(self.root / f"speaker-{self._recordings}.wav", rate)
        command = [
            "parecord", "-d", f"{SPEAKER}.monitor", f"--rate={rate}", "--channels=1",
            "--format=float32le", "--file-format=wav", "--latency-msec=20", str(recording.path),
        ]  # fmt: skip
        process = subprocess.Popen(command, env=self._env())
        try:
            marker = f'application.process.id = "{process.pid}"'
            self._wait_until(lambda: marker in self.pactl("list", "source-outputs"), 5.0, "parecord to connect")
            yield recording
        finally:
            process.send_signal(signal.SIGINT)  # lets parecord finish the WAV header
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        samples, _ = soundfile.read(recording.path, dtype="float32")
        recording.samples = samples if samples.ndim == 1 else samples[:, 0]

    # ------------------------------------------------------------------ plumbing

    def pactl(self, *args: str) -> str:
        """Run ``pactl`` against this server; returns its output."""
        result = subprocess.run(["pactl", *args], env=self._env(), capture_output=True, text=True, timeout=10)
        if result.returncode != 0:
            raise PulseError(f"pactl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _load(self, name: str, module: str, *arguments: str) -> None:
        self._modules[name] = int(self.pactl("load-module", module, *arguments).strip())

    def _answers(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            raise PulseError(f"pulseaudio exited with code {self._process.returncode}:\n{log[-2000:]}")
        try:
            self.pactl("info")
        except PulseError:
            return False
        return True

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.client_env}

    def _apply_env(self) -> None:
        if self._saved_env is None:
            self._saved_env = {key: os.environ.get(key) for key in CLIENT_ENV}
        os.environ.update(self.client_env)

    def _restore_env(self) -> None:
        if self._saved_env is not None:
            for key, value in self._saved_env.items():
                _set_env(key, value)
            self._saved_env = None

    @staticmethod
    def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise PulseError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.02)


def _described(description: str, kind: str) -> str:
    """The module argument that gives a sink or source its description (what the app shows)."""
    return f"{kind}_properties=\"device.description='{description}'\""


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def xcorr_match(reference: np.ndarray, recorded: np.ndarray) -> tuple[int, float]:
    """Lag of ``reference`` inside ``recorded`` and the Pearson r there (platform-lab.md §4)."""
    ref, rec = reference.astype(np.float64), recorded.astype(np.float64)
    n = len(ref) + len(rec) - 1
    nfft = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(rec, nfft) * np.conj(np.fft.rfft(ref, nfft)), nfft)[: len(rec)]
    lag = int(np.argmax(np.abs(corr)))
    segment = rec[lag : lag + len(ref)]
    return lag, float(np.corrcoef(ref[: len(segment)], segment)[0, 1])


def heard_match(reference: np.ndarray, recorded: np.ndarray, rate: int) -> tuple[int, float]:
    """``xcorr_match`` below 2 kHz. The demo answers with broadband noise, and the resamplers between
    the app and the recording delay it by a fraction of a sample, which decorrelates the top octaves
    (a half-sample shift of white noise alone gives r = 0.64); below 2 kHz it costs under 2 %."""

    def low_pass(samples: np.ndarray) -> np.ndarray:
        spectrum = np.fft.rfft(samples.astype(np.float64))
        spectrum[int(2_000 * samples.shape[0] / rate) :] = 0
        return np.fft.irfft(spectrum, samples.shape[0])

    return xcorr_match(low_pass(reference), low_pass(recorded))


def _latencies(
    pieces_of: np.ndarray, found_in: np.ndarray, rate: int, starts: range, length: int, captured: bool
) -> tuple[list[int], list[str]]:
    """Each piece ``pieces_of[start : start + length]`` looked for in ``found_in`` (:func:`heard_match`): the
    latencies of those found (capture position minus queued position, in samples; ``captured`` says which of the
    two the pieces come from), and the pieces found nowhere, described."""
    latencies: list[int] = []
    unmatched: list[str] = []
    for start in starts:
        lag, r = heard_match(pieces_of[start : start + length], found_in, rate)
        if r > 0.9:  # a clean piece reads 0.98 or more; another stream, or a skip, near 0
            latencies.append(start - lag if captured else lag - start)
        else:
            unmatched.append(f"{start / rate:.2f} s (r={r:.3f})")
    return latencies, unmatched


def _never_falls(latencies: list[int], slack: int, what: str) -> None:
    falls = [(a, b) for a, b in pairwise(latencies) if b < a - slack]
    assert not falls, f"{what} never reached the speaker: offsets fell {falls}"


def check_played_in_order(played: np.ndarray, output: np.ndarray, rate: int, underruns: int) -> tuple[float, float]:
    """Asserts that ``played`` (the speaker's capture) is ``output`` (what the app queued) in order.

    From the first audible sample, each eighth of a second, every quarter second, must be found in
    ``output``; its offset (played position minus output position) is the output latency. Nothing may
    be skipped: the offset never falls. Silence may be inserted only where the app counted playback
    underruns: then the offset grows, and a window straddling a gap may match nothing, at most one
    window per underrun. Returns the latency at the start and at the end of the capture, in seconds.
    """
    # Short windows, so that the brief gaps of a busy machine's underruns spoil few of them.
    window, hop, slack = rate // 8, rate // 4, rate // 100
    audible = np.flatnonzero(np.abs(played) > 0.01)
    assert audible.size, "nothing audible reached the speaker"
    starts = range(int(audible[0]) + window, played.size - hop, hop)  # from the speaker's start
    offsets, unmatched = _latencies(played, output, rate, starts, window, captured=True)
    assert len(offsets) >= 10, f"only {played.size / rate:.1f} s reached the speaker; unmatched: {unmatched}"
    if underruns == 0:
        assert not unmatched, f"speaker audio is not the queued output at {unmatched}"
        assert max(offsets) - min(offsets) <= slack, f"playback stalled without an underrun: offsets {offsets}"
    assert len(unmatched) <= underruns, f"{underruns} underruns cannot explain the unmatched {unmatched}"
    _never_falls(offsets, slack, "queued output")
    assert 0 <= offsets[0] < rate, f"output latency {offsets[0] / rate:.2f} s"
    return offsets[0] / rate, offsets[-1] / rate


def check_heard(answer: np.ndarray, recorded: np.ndarray, rate: int, underruns: int) -> int:
    """Asserts that ``recorded`` (the speaker's capture) holds ``answer`` (a clip queued whole); returns its lag.

    Whole, where the speaker never starved. Where it did (``underruns``, counted by the app), each starving put a
    gap of silence into the clip: then each eighth of a second of ``answer`` must be found in order, at most one
    piece per underrun excepted (the piece a gap split).
    """
    lag, r = heard_match(answer, recorded, rate)
    if r > 0.9 or underruns == 0:
        assert r > 0.9, f"the speaker did not play the answer (r={r:.3f}) and the app counted no underrun"
        return lag
    piece, slack = rate // 8, rate // 100
    starts = range(0, answer.size - piece + 1, piece)
    offsets, unmatched = _latencies(answer, recorded, rate, starts, piece, captured=False)
    assert offsets and len(unmatched) <= underruns, f"{underruns} underruns cannot explain the unmatched {unmatched}"
    _never_falls(offsets, slack, "parts of the answer")
    return offsets[0]


@contextmanager
def virtual_devices() -> Iterator[PulseServer]:
    """A started ``PulseServer``, closed (and the environment restored) when the block ends."""
    server = PulseServer()
    try:
        server.start()
        yield server
    finally:
        server.close()
