"""The sound devices: which microphones and speakers there are, and PortAudio, imported lazily.

This package is the only place that imports ``sounddevice``, and it does so on first use: ``app``
imports on machines without PortAudio, and the first call that needs it raises
``AudioUnavailable`` with a plain-words message instead of ``OSError``.
"""

from __future__ import annotations

import functools
import logging
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


class AudioUnavailable(RuntimeError):
    """Audio cannot be used; ``str(error)`` is a plain-words message for the user."""


@functools.cache
def _sounddevice() -> ModuleType:
    """Import sounddevice on first use (a failed import is retried on the next call)."""
    try:
        import sounddevice
    except OSError as error:  # "PortAudio library not found"
        raise AudioUnavailable(NO_PORTAUDIO) from error
    module: ModuleType = sounddevice
    return module


@dataclass(frozen=True)
class AudioDevice:
    """One PortAudio device, seen from one direction (input or output)."""

    name: str
    index: int  # PortAudio's index; only valid until the next refresh_devices()
    hostapi: str
    channels: int  # the most channels in this direction
    default_samplerate: float
    is_default: bool  # the system default for this direction


@dataclass(frozen=True)
class DeviceList:
    """The devices of the default host API (ALSA, Core Audio, WASAPI...), so each appears once."""

    inputs: tuple[AudioDevice, ...]
    outputs: tuple[AudioDevice, ...]

    @property
    def default_input(self) -> AudioDevice | None:
        """The system's default microphone, if there is one."""
        return next((d for d in self.inputs if d.is_default), None)

    @property
    def default_output(self) -> AudioDevice | None:
        """The system's default speaker, if there is one."""
        return next((d for d in self.outputs if d.is_default), None)

    def find_input(self, name: str) -> AudioDevice | None:
        """The input called ``name``, or the only one whose name contains it (case-insensitive)."""
        return _find(self.inputs, name)

    def find_output(self, name: str) -> AudioDevice | None:
        """The output called ``name``, or the only one whose name contains it (case-insensitive)."""
        return _find(self.outputs, name)


def _find(devices: Sequence[AudioDevice], name: str) -> AudioDevice | None:
    for device in devices:
        if device.name == name:
            return device
    matches = [d for d in devices if name.casefold() in d.name.casefold()]
    return matches[0] if len(matches) == 1 else None


def list_devices() -> DeviceList:
    """The input and output devices PortAudio knows now (empty lists when there are none).

    PortAudio enumerates devices once, when it starts; call ``refresh_devices()`` first to
    see devices plugged in since.

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
    inputs = [_device(info, hostapi, "input") for info in infos if info["max_input_channels"] > 0]
    outputs = [_device(info, hostapi, "output") for info in infos if info["max_output_channels"] > 0]
    return DeviceList(tuple(inputs), tuple(outputs))


def _device(info: dict[str, Any], hostapi: dict[str, Any], direction: Direction) -> AudioDevice:
    return AudioDevice(
        name=info["name"],
        index=info["index"],
        hostapi=hostapi["name"],
        channels=info[f"max_{direction}_channels"],
        default_samplerate=float(info["default_samplerate"]),
        is_default=info["index"] == hostapi[f"default_{direction}_device"],
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
