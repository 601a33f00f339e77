"""alsa-lib's messages go to the log, not the terminal: :func:`route_alsa_messages`.

alsa-lib prints its errors to stderr ("ALSA lib pcm.c:8570:(snd_pcm_recover) underrun occurred" each time
PortAudio recovers a starved stream, and a screenful of probing noise when PortAudio starts). Its handler is
replaced, through ctypes, by one that logs each message and counts the underruns and overruns it reports.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections import Counter
from typing import Any

log = logging.getLogger(__name__)

# void handler(const char *file, int line, const char *function, int err, const char *fmt, ...). The variadic
# arguments come in the registers (x86-64 and arm64 Linux alike) after the named ones: the first is read only where
# the format's first conversion is a string ("%s occurred").
_Handler = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
)

xruns: Counter[str] = Counter()
"""ALSA's recoveries since the handler was set, by kind ("underrun": the speaker starved; "overrun": the microphone
was not read in time)."""

_installed: Any = None  # the handler, kept alive as long as alsa-lib may call it


def _first_conversion(fmt: bytes) -> bytes:
    index = fmt.find(b"%")
    while index != -1 and fmt[index + 1 : index + 2] == b"%":
        index = fmt.find(b"%", index + 2)
    return fmt[index : index + 2] if index != -1 else b""


def _on_message(file: bytes | None, line: int, function: bytes | None, err: int, fmt: bytes | None, arg: int) -> None:
    try:
        text = (fmt or b"").decode(errors="replace")
        if arg and _first_conversion(fmt or b"") == b"%s":
            word = ctypes.string_at(arg).decode(errors="replace")
            text = text.replace("%s", word, 1)
            if function == b"snd_pcm_recover" and word in ("underrun", "overrun"):
                xruns[word] += 1
        where = f"{(file or b'?').decode(errors='replace')}:{line}:({(function or b'?').decode(errors='replace')})"
        log.debug("ALSA lib %s %s%s", where, text, f" (error {err})" if err else "")
    except Exception:  # noqa: BLE001 - never raise into alsa-lib
        pass


def route_alsa_messages() -> bool:
    """Send alsa-lib's messages to the log (once, on Linux where alsa-lib is found); returns whether they go there."""
    global _installed
    if _installed is not None:
        return True
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("asound")
    if name is None:
        return False
    try:
        library = ctypes.CDLL(name)
        handler = _Handler(_on_message)
        library.snd_lib_error_set_handler(handler)
    except (OSError, AttributeError) as error:
        log.debug("alsa-lib's messages stay on the terminal: %s", error)
        return False
    _installed = handler
    return True
