"""PyInstaller runtime hook: let sounddevice find the PortAudio library inside the bundle.

On Linux sounddevice locates PortAudio with ``ctypes.util.find_library("portaudio")``, which
PyInstaller only redirects into the bundle on Windows. Without this hook a bundle started on
a machine without libportaudio2 fails with "PortAudio library not found" although the library
is right there (platform-lab.md §5). On macOS sounddevice's wheel ships its own copy and
finds it by itself; the hook then changes nothing.
"""

from __future__ import annotations

import ctypes.util
import os
import sys

_BUNDLED_NAMES = ("libportaudio.so.2", "libportaudio.so")
_system_find_library = ctypes.util.find_library


def _find_library(name: str) -> str | None:
    if name == "portaudio":
        bundle = getattr(sys, "_MEIPASS", "")
        for candidate in _BUNDLED_NAMES:
            path = os.path.join(bundle, candidate)
            if os.path.exists(path):
                return path
    return _system_find_library(name)


ctypes.util.find_library = _find_library
