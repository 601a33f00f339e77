"""Logging to a rotating file in the platform's log folder (the menu's *Open log folder*), and crash capture.

``configure_logging`` sends ``logging`` to ``parley.log`` (INFO and up: loads, switches,
conversations, exports, device changes, and errors with their tracebacks).
``install_crash_handlers`` makes sure nothing that goes wrong only reaches stderr, which a
windowed app throws away: ``faulthandler`` writes fatal errors (segfaults, aborts, with
every thread's stack) to ``crash.log``, and uncaught exceptions, on the main thread
(``sys.excepthook``, which Qt also calls for exceptions in slots) or any other
(``threading.excepthook``), go to the log with their traceback and to a callback that
shows them to the user.

The logs quote what was said (transcripts, device names, errors), so they are private: the log folder
is 0700 and every log file, rotated ones included, 0600, whatever the umask.
"""

from __future__ import annotations

import faulthandler
import io
import logging
import logging.handlers
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

from .files import make_private, make_private_folder
from .paths import log_dir

if TYPE_CHECKING:
    from .echo import EchoCanceller
    from .messages import FrameStats

LOG_FILE = "parley.log"
CRASH_FILE = "crash.log"

log = logging.getLogger("parley.crash")


def configure_logging(folder: Path | None = None, *, level: int = logging.INFO) -> Path:
    """Send ``logging`` to ``<folder>/parley.log`` (1 MB × 5 rotated files); returns the file path.

    Falls back to stderr only when the folder cannot be created.
    """
    folder = log_dir() if folder is None else folder
    root = logging.getLogger()
    root.setLevel(level)
    path = folder / LOG_FILE
    if any(getattr(h, "baseFilename", None) == str(path) for h in root.handlers):
        return path
    try:
        make_private_folder(folder)
        handler: logging.Handler = _PrivateRotatingFileHandler(path, maxBytes=1 << 20, backupCount=5, encoding="utf-8")
        for existing in folder.iterdir():  # logs an older version left readable
            make_private(existing)
    except OSError:
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"))
    root.addHandler(handler)
    return path


class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """Every file it opens (the first and each one after a rollover) is made private before a line is written."""

    def _open(self) -> io.TextIOWrapper:
        stream = super()._open()
        make_private(Path(self.baseFilename))
        return stream


CrashReport = Callable[[str, str], None]
"""Receives a one-line message and the traceback of an uncaught exception."""


class CrashHandlers:
    """Installed crash capture; ``uninstall()`` puts back what was there before."""

    def __init__(self, folder: Path, report: CrashReport) -> None:
        self.crash_file = folder / CRASH_FILE
        self._report = report
        self._previous_excepthook = sys.excepthook
        self._previous_threading_hook = threading.excepthook
        self._fault_stream: IO[str] | None = None
        self._fault_was_enabled = faulthandler.is_enabled()

    def install(self) -> CrashHandlers:
        try:
            make_private_folder(self.crash_file.parent)
            # Kept open for the life of the process: faulthandler writes to it from a dying process.
            self._fault_stream = open(self.crash_file, "a", encoding="utf-8")  # noqa: SIM115
            make_private(self.crash_file)
            faulthandler.enable(file=self._fault_stream, all_threads=True)
        except OSError:
            log.warning("Could not open %s for fatal-error reports", self.crash_file, exc_info=True)
        sys.excepthook = self._excepthook
        threading.excepthook = self._threading_hook
        return self

    def uninstall(self) -> None:
        sys.excepthook = self._previous_excepthook
        threading.excepthook = self._previous_threading_hook
        if self._fault_stream is not None:
            if self._fault_was_enabled:
                faulthandler.enable(file=sys.stderr)
            else:
                faulthandler.disable()
            self._fault_stream.close()
            self._fault_stream = None

    def _excepthook(self, kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            self._previous_excepthook(kind, value, trace)
            return
        self._handle("the main thread", kind, value, trace)

    def _threading_hook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "a thread"
        self._handle(f"the thread '{name}'", args.exc_type, args.exc_value, args.exc_traceback)

    def _handle(
        self, where: str, kind: type[BaseException], value: BaseException | None, trace: TracebackType | None
    ) -> None:
        details = "".join(traceback.format_exception(kind, value, trace))
        message = f"Unexpected error in {where}: {kind.__name__}: {value}"
        log.error("%s\n%s", message, details)
        try:
            self._report(message, details)
        except Exception:  # the report must never raise from inside an exception hook
            log.exception("Could not report an uncaught exception")


def install_crash_handlers(report: CrashReport, folder: Path | None = None) -> CrashHandlers:
    """Capture fatal errors to ``crash.log`` and uncaught exceptions to the log and ``report``."""
    return CrashHandlers(log_dir() if folder is None else folder, report).install()


def log_conversation_figures(stats: FrameStats | None, echo: EchoCanceller | None) -> None:
    """At a conversation's end: what the audio lost, and (in hands-free) what echo cancellation did."""
    log = logging.getLogger("app.controller")
    if stats is not None and (stats.output_underruns or stats.input_lost_s):
        log.info(
            "The speaker ran out of the assistant's audio %d times (%.2f s of silence skipped to catch up); "
            "%.2f s of microphone audio lost",
            stats.output_underruns,
            stats.output_skipped_s,
            stats.input_lost_s,
        )
    if echo is not None:
        figures = echo.stats
        log.info(
            "Echo cancellation: %d blocks, reference present for %d, missing for %d; %d samples of drift "
            "corrected, %d resyncs, %d playback samples dropped, reference lead %.0f ms, %.0f µs per block",
            figures.blocks,
            figures.reference_blocks,
            figures.reference_missing_blocks,
            figures.drift_corrections,
            figures.resyncs,
            figures.playback_dropped,
            figures.reference_lead_s * 1000.0,
            figures.cost_per_block_s * 1e6,
        )
