"""One checkpoint download at a time, on its own thread, reported through the controller's queue.

Qt-free. The thread only posts: ``DownloadProgress`` as it goes and once when it stops (cancelled, failed or
finished), ``Failure`` when it failed, and ``AdoptCheckpoint`` when a known variant finished (the controller
then checks and loads it on its own thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .messages import DownloadProgress, Failure
from .model_switch import AdoptCheckpoint
from .variants import variant_for_repo

log = logging.getLogger(__name__)


class DownloadRunner:
    """Starts and cancels the download thread; the caller's thread calls it, the thread only posts."""

    def __init__(self, post: Callable[[object], None]) -> None:
        self._post = post
        self._download: tuple[threading.Thread, threading.Event] | None = None

    def start(self, repo_id: str, target: Path, layout: str) -> None:
        from .download import DownloadCancelled, DownloadError, download_checkpoint

        if self._download is not None and self._download[0].is_alive():
            self._post(Failure("A download is already running."))
            return
        cancel = threading.Event()
        last = DownloadProgress(repo_id, 0, None)  # bytes done and total, to report what was kept when it stops
        log.info("Downloading %s to %s (%s layout)", repo_id, target, layout)

        def progress(done: int, total: int | None, message: str) -> None:
            nonlocal last
            last = DownloadProgress(repo_id, done, total, message)
            self._post(last)

        def run() -> None:
            try:
                path = download_checkpoint(repo_id, Path(target), on_progress=progress, cancel=cancel, layout=layout)
            except DownloadCancelled:
                log.info("Download of %s cancelled", repo_id)
                self._post(replace(last, message="Download cancelled; it resumes where it stopped."))
                return
            except DownloadError as exc:
                log.warning("Download of %s failed: %s", repo_id, exc)
                self._post(replace(last, message=str(exc), failed=True))
                self._post(Failure(str(exc)))
                return
            except Exception as exc:  # a bug or an input nobody foresaw: the user must hear of it, not a dead thread
                log.exception("Download of %s failed unexpectedly", repo_id)
                text = f"The download of {repo_id} failed unexpectedly ({type(exc).__name__}: {exc}). What was "
                text += "downloaded so far is kept; the log has the details."
                self._post(replace(last, message=text, failed=True))
                self._post(Failure(text))
                return
            self._post(replace(last, message="Download complete", finished=True))
            downloaded = variant_for_repo(repo_id)
            if downloaded is not None:
                self._post(AdoptCheckpoint(downloaded.key, path))

        thread = threading.Thread(target=run, name="parley-download", daemon=True)
        self._download = (thread, cancel)
        thread.start()

    def cancel(self) -> None:
        if self._download is not None:
            self._download[1].set()
