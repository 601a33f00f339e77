"""The sound devices: which microphones and speakers there are, and PortAudio, imported lazily.

On Linux the list is the sound server's (PulseAudio, or PipeWire's PulseAudio side, through pulsectl): its real
sources and sinks with their descriptions ("Built-in Audio Analog Stereo"), monitors left out. PortAudio reaches
them through one ALSA device that goes to the server (``pulse``, ``pipewire`` or ``default``); a stream is routed
to the chosen one by naming it in ``PULSE_SINK`` / ``PULSE_SOURCE`` (and ``PIPEWIRE_NODE``) while the stream is
opened: the ALSA plugin reads them when it connects (``endpoint.start_stream``). Where no sound server answers
(macOS, Windows, plain ALSA) the list is PortAudio's own, of its default host API.

This package is the only place that imports ``sounddevice``, and it does so on first use: ``app``
imports on machines without PortAudio, and the first call that needs it raises
``AudioUnavailable`` with a plain-words message instead of ``OSError``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

log = logging.getLogger(__name__)

NO_PORTAUDIO = (
    "The PortAudio sound library is not installed, so Parley cannot use the microphone or speakers. "
    "On Debian or Ubuntu install it with: sudo apt install libportaudio2"
)
NO_MICROPHONE = "No microphone found. Connect one or check the sound settings."
NO_SPEAKER = "No speaker or headphones found. Connect them or check the sound settings."

Direction = Literal["input", "output"]

SERVER_PCMS = ("pulse", "pipewire", "default")
"""ALSA devices that go to the sound server, best first: the one the server's devices are opened through."""
SERVER_TIMEOUT_S = 1.0  # a sound server that does not answer within this is taken for none
_NO_INDEX = 2**32 - 1  # PA_INVALID_INDEX: a source that is no sink's monitor


class AudioUnavailable(RuntimeError):
    """Audio cannot be used; ``str(error)`` is a plain-words message for the user."""


@functools.cache
def _sounddevice() -> ModuleType:
    """Import sounddevice on first use (a failed import is retried on the next call)."""
    from .alsa import route_alsa_messages

    route_alsa_messages()  # before PortAudio starts: its probing of ALSA prints too
    try:
        import sounddevice
    except OSError as error:  # "PortAudio library not found"
        raise AudioUnavailable(NO_PORTAUDIO) from error
    module: ModuleType = sounddevice
    return module


@dataclass(frozen=True)
class AudioDevice:
    """One device, seen from one direction (input or output)."""

    name: str  # what the settings keep: the sound server's name for it ("alsa_output.pci-…"), else PortAudio's
    index: int  # PortAudio's index of the device the stream opens; only valid until the next refresh_devices()
    hostapi: str
    channels: int  # the most channels in this direction
    default_samplerate: float
    is_default: bool  # the system default for this direction
    description: str = ""  # the sound server's words for it; PortAudio's name where there is no server
    route: str | None = None  # the sound server's device a stream is routed to; None: PortAudio's device itself

    @property
    def label(self) -> str:
        """What the user reads: the description, else the name."""
        return self.description or self.name


@dataclass(frozen=True)
class DeviceList:
    """The devices of the sound server, or else of PortAudio's default host API (ALSA, Core Audio, WASAPI...)."""

    inputs: tuple[AudioDevice, ...]
    outputs: tuple[AudioDevice, ...]
    server: bool = False  # listed by the sound server (PortAudio's own names then mean its default)

    @property
    def default_input(self) -> AudioDevice | None:
        """The system's default microphone, if there is one."""
        return next((d for d in self.inputs if d.is_default), None)

    @property
    def default_output(self) -> AudioDevice | None:
        """The system's default speaker, if there is one."""
        return next((d for d in self.outputs if d.is_default), None)

    def find_input(self, name: str) -> AudioDevice | None:
        """The input called ``name``, or the only one whose name or description contains it (case-insensitive)."""
        return self._find(self.inputs, name)

    def find_output(self, name: str) -> AudioDevice | None:
        """The output called ``name``, or the only one whose name or description contains it (case-insensitive)."""
        return self._find(self.outputs, name)

    def candidates(self, direction: Direction, preferred: str | None) -> tuple[list[AudioDevice], str]:
        """The devices to try, best first: the chosen one, then the default (or the first); with why the chosen
        one is not first ("is not connected"), or "" when it is (or none was chosen).

        The default is opened unrouted, so that it follows the sound server's default as that changes."""
        devices = self.inputs if direction == "input" else self.outputs
        chosen = self._find(devices, preferred) if preferred is not None else None
        fallback = dataclasses.replace(next((d for d in devices if d.is_default), devices[0]), route=None)
        if chosen is None:
            return [fallback], "is not connected" if preferred is not None else ""
        return ([chosen, fallback] if chosen.name != fallback.name else [chosen]), ""

    def _find(self, devices: Sequence[AudioDevice], name: str) -> AudioDevice | None:
        for device in devices:
            if device.name == name:
                return device
        wanted = name.casefold()
        matches = [d for d in devices if wanted in d.name.casefold() or wanted in d.description.casefold()]
        if len(matches) == 1:
            return matches[0]
        if self.server and name in SERVER_PCMS:  # chosen from PortAudio's list before: that was the default
            return next((d for d in devices if d.is_default), None)
        return None


def list_devices() -> DeviceList:
    """The input and output devices there are now (empty lists when there are none).

    The sound server's devices are seen as they come and go. PortAudio's own list is only
    enumerated when it starts; call ``refresh_devices()`` first to see devices plugged in since.

    Raises:
        AudioUnavailable: PortAudio is not installed.
    """
    sd = _sounddevice()
    try:
        hostapi = sd.query_hostapis(sd.default.hostapi)
        infos = [sd.query_devices(index) for index in hostapi["devices"]]
    except sd.PortAudioError:
        log.warning("PortAudio could not list devices", exc_info=True)
        return DeviceList((), ())
    pcm = next((info for name in SERVER_PCMS for info in infos if info["name"] == name), None)
    server = server_devices() if pcm is not None else None
    if pcm is not None and server is not None:
        return _through_server(server, pcm, hostapi["name"])
    inputs = [_device(info, hostapi, "input") for info in infos if info["max_input_channels"] > 0]
    outputs = [_device(info, hostapi, "output") for info in infos if info["max_output_channels"] > 0]
    return DeviceList(tuple(inputs), tuple(outputs))


@dataclass(frozen=True)
class ServerDevices:
    """The sound server's sources (monitors left out) and sinks, each as (name, description), and its defaults."""

    sources: tuple[tuple[str, str], ...]
    sinks: tuple[tuple[str, str], ...]
    default_source: str
    default_sink: str


def server_devices() -> ServerDevices | None:
    """What the sound server has now, or None where there is none (not Linux, no pulsectl, nothing answers within
    ``SERVER_TIMEOUT_S``: a server that hangs is left to its helper thread, never waited on)."""
    if sys.platform != "linux":
        return None
    found: list[ServerDevices | None] = []
    worker = threading.Thread(target=lambda: found.append(_ask_server()), name="parley-device-list", daemon=True)
    worker.start()
    worker.join(SERVER_TIMEOUT_S)
    return found[0] if found else None


def _ask_server() -> ServerDevices | None:
    try:
        import pulsectl
    except (ImportError, OSError, AttributeError):  # not installed, or no libpulse to load
        return None
    try:
        # Without a timeout of pulsectl's own: with one it polls for all of it, even once connected.
        with pulsectl.Pulse("Parley device list", connect=False) as pulse:
            pulse.connect(autospawn=False)
            info = pulse.server_info()
            sources = [(s.name, s.description) for s in pulse.source_list() if s.monitor_of_sink == _NO_INDEX]
            sinks = [(s.name, s.description) for s in pulse.sink_list()]
    except Exception as error:  # noqa: BLE001 - no answering server (of any kind of failure) means PortAudio's list
        log.debug("No sound server to list devices from: %s", error)
        return None
    return ServerDevices(tuple(sources), tuple(sinks), info.default_source_name or "", info.default_sink_name or "")


def _through_server(server: ServerDevices, pcm: dict[str, Any], hostapi: str) -> DeviceList:
    """The server's devices, each opened through the ALSA device ``pcm`` and routed to itself."""

    def devices(found: tuple[tuple[str, str], ...], default: str, direction: Direction) -> tuple[AudioDevice, ...]:
        channels = max(1, min(2, int(pcm[f"max_{direction}_channels"])))
        return tuple(
            AudioDevice(
                name=name,
                index=int(pcm["index"]),
                hostapi=f"{hostapi} (sound server)",
                channels=channels,
                default_samplerate=float(pcm["default_samplerate"]),
                is_default=name == default,
                description=description,
                route=name,
            )
            for name, description in found
        )

    inputs = devices(server.sources, server.default_source, "input")
    outputs = devices(server.sinks, server.default_sink, "output")
    return DeviceList(inputs, outputs, server=True)


def _device(info: dict[str, Any], hostapi: dict[str, Any], direction: Direction) -> AudioDevice:
    return AudioDevice(
        name=info["name"],
        index=info["index"],
        hostapi=hostapi["name"],
        channels=info[f"max_{direction}_channels"],
        default_samplerate=float(info["default_samplerate"]),
        is_default=info["index"] == hostapi[f"default_{direction}_device"],
        description=info["name"],
    )


def refresh_devices() -> None:
    """Re-initialise PortAudio so that devices plugged in (or out) since it started are seen.

    This closes every PortAudio stream of the process: stop them first (``AudioIO`` does
    this itself when it reopens its streams).

    Raises:
        AudioUnavailable: PortAudio is not installed or cannot start.
    """
    sd = _sounddevice()
    # PortAudio only enumerates at initialisation; sounddevice has no public call for this.
    try:
        if sd._initialized:
            sd._terminate()
        sd._initialize()
    except sd.PortAudioError as error:
        raise AudioUnavailable(f"The sound system could not be started ({error}).") from error
