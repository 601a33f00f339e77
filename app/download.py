"""Download a published checkpoint from the Hugging Face Hub, with byte progress, cancel and resume.

``download_checkpoint`` lists the repository through ``huggingface_hub`` (so ``HF_ENDPOINT``,
``HF_TOKEN``, ``HF_HUB_OFFLINE`` and its error types all apply), then fetches each file itself
from the Hub's ``resolve`` URL with HTTP ``Range`` requests into a part file: under
``<target>/.parley-download/`` in Parley's folder, or ``blobs/<id>.incomplete`` in the Hugging Face cache's layout
(:mod:`app.download_layout` says where each stage of a file lives in each). ``hf_hub_download`` is not used for the
bytes because in
huggingface_hub 2.4 it writes every attempt to a fresh temporary file and deletes it on any
failure, so an interrupted 5 GB shard would start again from zero.

What a user can rely on
    - Free disk space is checked against what is still missing (plus a margin) before anything
      is fetched.
    - Cancel stops within about 0.1 s, also in the middle of a file or while the connection is
      stalled; everything downloaded so far is kept.
    - Calling again resumes: finished files are not fetched again and a partly downloaded file
      continues from its last byte.
    - Dropped connections and stalls (no data for ``STALL_TIMEOUT_S``) are retried from where
      they stopped, and reported, never silent.
    - Every file is checked against the repository's checksum (LFS sha256, or the git blob id)
      before it takes its final name; a damaged file is fetched once more, then rejected.
    - Nothing from the listing reaches the disk unchecked, so a hostile or intercepted endpoint
      cannot write or delete outside the target: names stay inside it (no ``..``, NUL, backslash,
      or the state folder under any capitalisation), checksums (which name the part files) are hex
      of their exact length, and a file listed without any checksum is refused
      (:mod:`app.download_listing`).
    - The finished folder is checked again by :func:`verify_download`: every listed file is
      present with its listed size, so a truncated file never looks installed.

Concurrency contract
    ``download_checkpoint`` blocks; call it on a plain background thread (not the UI thread and
    not the MLX thread). ``on_progress`` is called on that same thread, at most about ten times a
    second, plus once at the start, once when a retry is scheduled and once at the end. ``cancel``
    may be set from any thread. Internally, the listing request and each HTTP response body are
    read on short-lived daemon threads that only hand data over through a queue; files are written
    by the calling thread alone. A lock file in the target folder refuses a second concurrent
    download into the same folder, also from another process.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, TypeVar, cast
from urllib.parse import urlsplit

import httpx2
from huggingface_hub import HfApi, constants, get_session, hf_hub_url, hf_raise_for_status
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError
from huggingface_hub.utils._headers import build_hf_headers  # huggingface_hub.utils re-exports it lazily (untyped)

from .download_layout import HUB_CACHE, PARLEY_FOLDER, HubCache, Layout, Manifest, ParleyFolder
from .download_listing import (
    REQUIRED_FILES,
    STATE_DIR,
    DownloadCancelled,
    DownloadError,
    Listing,
    RemoteFile,
    is_safe_repo_path,
    listing_from_info,
)

__all__ = [
    "HUB_CACHE",
    "PARLEY_FOLDER",
    "STATE_DIR",
    "DownloadCancelled",
    "DownloadError",
    "download_checkpoint",
    "format_size",
    "verify_download",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

DISK_MARGIN_BYTES: Final = 500_000_000  # free space to leave beyond what the download needs ...
DISK_MARGIN_FRACTION: Final = 0.02  # ... or this share of it, whichever is larger

PROGRESS_INTERVAL_S: Final = 0.1
STALL_TIMEOUT_S: float = 30.0  # no data for this long: drop the connection and resume on a new one
RETRY_DELAYS_S: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)  # between attempts after a network failure
WAITING_NOTICE_S: Final = 3.0  # after this long without data, say so in the progress message
LISTING_TIMEOUT_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 15.0

_POLL_S: Final = 0.05  # how often blocked waits look at the cancel event
_QUEUE_CHUNKS: Final = 64  # body chunks buffered between the network thread and the writer
_HASH_BLOCK: Final = 8 * 1024 * 1024
_RETRY_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})


def format_size(n_bytes: int) -> str:
    """A byte count in decimal units, as file managers show it ("9.2 GB", "512 MB")."""
    if n_bytes < 1000:
        return f"{n_bytes} bytes"
    value = float(n_bytes)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 999.95 or unit == "TB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def download_checkpoint(
    repo_id: str,
    target: Path,
    *,
    on_progress: Callable[[int, int | None, str], None],
    cancel: threading.Event,
    endpoint: str | None = None,
    layout: str = PARLEY_FOLDER,
) -> Path:
    """Download every file of the model repository ``repo_id`` and return the folder that holds the checkpoint.

    With ``layout`` ``PARLEY_FOLDER`` the files go into ``target`` itself (returned); with ``HUB_CACHE``
    ``target`` is a Hugging Face cache folder (``app.hf_cache.hub_cache_dir()``) and the files go into its
    ``models--…`` layout (:mod:`app.download_layout`); the snapshot folder is returned.

    ``on_progress(done_bytes, total_bytes, message)`` reports bytes (``total_bytes`` is ``None``
    until the repository has been listed); ``done_bytes`` only goes down when a file must be
    fetched again from its start (the server ignored the byte range, or the file arrived damaged).
    Raises :class:`DownloadCancelled` when ``cancel`` is set and :class:`DownloadError` on any
    failure; in both cases what was downloaded is kept and calling again continues from there.
    ``endpoint`` overrides the Hub address (``HF_ENDPOINT``).
    """
    target = Path(target).expanduser()
    if layout == HUB_CACHE:
        where: Layout = HubCache(target, repo_id)
    elif layout == PARLEY_FOLDER:
        where = ParleyFolder(target)
    else:
        raise ValueError(f"unknown download layout {layout!r}")
    download = _Download(repo_id, target, where, _Progress(on_progress), cancel, endpoint)
    try:
        return download.run()
    except OSError as exc:
        raise download.disk_error(exc) from exc


def verify_download(target: Path, state_dir: Path | None = None) -> None:
    """Check that ``target`` holds a complete download; raise :class:`DownloadError` naming what is wrong.

    Uses the file list recorded when the download started (in ``state_dir``, by default
    ``<target>/.parley-download``; for a snapshot in the Hugging Face cache, its repository's), so it
    needs no network and reads no file contents: every listed file must exist with its listed size,
    ``config.json`` and ``model.safetensors.index.json`` must exist, and every shard the index names
    must be present.
    """
    target = Path(target).expanduser()
    if state_dir is None:
        in_cache = target.parent.name == "snapshots" and not (target / STATE_DIR).is_dir()
        state_dir = target.parent.parent / STATE_DIR if in_cache else target / STATE_DIR
    manifest = Manifest.load(state_dir)
    if manifest is None:
        raise DownloadError(f"{target} holds no record of a download, so it cannot be checked. Download it again.")
    if state_dir != target / STATE_DIR and manifest.commit != target.name:
        raise DownloadError(f"{target} is not the revision last downloaded ({manifest.commit[:7]}). Download it again.")
    problems: list[str] = []
    listed = {remote.path for remote in manifest.files}
    for remote in manifest.files:
        path = target / remote.path
        if not path.is_file():
            problems.append(f"{remote.path} is missing")
        elif (size := path.stat().st_size) != remote.size:
            problems.append(f"{remote.path} is {format_size(size)} but should be {format_size(remote.size)}")
    for name in REQUIRED_FILES:
        if name not in listed and not (target / name).is_file():
            problems.append(f"{name} is missing")
    index_path = target / "model.safetensors.index.json"
    if index_path.is_file():
        problems.extend(_index_problems(target, index_path))
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise DownloadError(f"The model in {target} is incomplete: {shown}. Download it again to repair it.")


def _index_problems(target: Path, index_path: Path) -> list[str]:
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted({str(name) for name in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return ["model.safetensors.index.json is not a valid weight index"]
    unsafe = [shard for shard in shards if not is_safe_repo_path(shard)]
    if unsafe:
        return [f"the weight index names a shard outside the folder ({unsafe[0]!r})"]
    return [f"{shard} (named in the weight index) is missing" for shard in shards if not (target / shard).is_file()]


# --------------------------------------------------------------------------- on-disk state


@contextlib.contextmanager
def _exclusive_lock(path: Path, target: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DownloadError(f"Another download into {target} is already running.") from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class _Checksum:
    """Incremental check of a file against the checksum the Hub lists for it."""

    def __init__(self, remote: RemoteFile) -> None:
        self._remote = remote
        self._hasher: Any = None
        self.reset()

    @staticmethod
    def available(remote: RemoteFile) -> bool:
        return bool(remote.sha256 or remote.blob_id)

    def reset(self) -> None:
        if self._remote.sha256:
            self._hasher = hashlib.sha256()
        else:
            self._hasher = hashlib.sha1(usedforsecurity=False)
            self._hasher.update(f"blob {self._remote.size}\0".encode())

    def update(self, data: bytes) -> None:
        self._hasher.update(data)

    def matches(self) -> bool:
        expected = self._remote.sha256 or self._remote.blob_id
        return bool(self._hasher.hexdigest() == expected)


# --------------------------------------------------------------------------- progress


class _Progress:
    """Byte counts and a message, passed on at most every ``PROGRESS_INTERVAL_S`` unless forced."""

    def __init__(self, callback: Callable[[int, int | None, str], None]) -> None:
        self._callback = callback
        self.done = 0
        self.total: int | None = None
        self.message = ""
        self._last_sent = -float("inf")

    def report(self, message: str | None = None, *, force: bool = False) -> None:
        if message is not None:
            self.message = message
        now = time.monotonic()
        if force or now - self._last_sent >= PROGRESS_INTERVAL_S:
            self._last_sent = now
            self._callback(self.done, self.total, self.message)


# --------------------------------------------------------------------------- HTTP body reader


class _Stalled(Exception):
    """No data arrived for ``STALL_TIMEOUT_S``."""


class _EndedEarly(Exception):
    """The server ended the response before the whole file arrived."""


@dataclass(frozen=True)
class _Head:
    status: int
    content_range: str | None
    content_length: int | None


_END: Final = object()


class _BodyReader:
    """One HTTP GET whose body is read on a daemon thread and handed over through a bounded queue.

    The consumer waits in short steps, so it notices ``cancel`` and stalls promptly even while the
    socket read blocks; an abandoned reader thread writes nothing and ends at its own read timeout.
    """

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self._items: queue.Queue[object] = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self._stop = threading.Event()
        timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=max(2 * STALL_TIMEOUT_S, 1.0))
        thread = threading.Thread(
            target=self._read, args=(url, headers, timeout), name="parley-download-reader", daemon=True
        )
        thread.start()

    def _read(self, url: str, headers: dict[str, str], timeout: httpx2.Timeout) -> None:
        try:
            with get_session().stream("GET", url, headers=headers, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    hf_raise_for_status(response)
                length = response.headers.get("Content-Length")
                self._put(
                    _Head(
                        response.status_code,
                        response.headers.get("Content-Range"),
                        int(length) if length and length.isdigit() else None,
                    )
                )
                for chunk in response.iter_bytes():
                    if self._stop.is_set():
                        return
                    if chunk:
                        self._put(chunk)
            self._put(_END)
        except Exception as exc:  # noqa: BLE001 -- handed to the consumer, which decides whether to retry
            self._put(exc)

    def _put(self, item: object) -> None:
        while not self._stop.is_set():
            try:
                self._items.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def next(self, cancel: threading.Event, on_idle: Callable[[float], None]) -> object:
        """The next ``_Head``, body chunk or ``_END``; re-raises the reader's exception."""
        started = time.monotonic()
        while True:
            if cancel.is_set():
                raise _CancelRequested
            try:
                item = self._items.get(timeout=_POLL_S)
            except queue.Empty:
                idle = time.monotonic() - started
                if idle >= STALL_TIMEOUT_S:
                    raise _Stalled(f"no data arrived for {STALL_TIMEOUT_S:g} s") from None
                on_idle(idle)
                continue
            if isinstance(item, Exception):
                raise item
            return item

    def close(self) -> None:
        self._stop.set()


class _CancelRequested(Exception):
    """Internal: ``cancel`` was set; turned into :class:`DownloadCancelled` with the kept byte count."""


# --------------------------------------------------------------------------- the download


class _Download:
    """One call of :func:`download_checkpoint`."""

    def __init__(
        self,
        repo_id: str,
        target: Path,
        layout: Layout,
        progress: _Progress,
        cancel: threading.Event,
        endpoint: str | None,
    ) -> None:
        self.repo_id = repo_id
        self.target = target  # what the user chose: the folder, or the Hugging Face cache
        self.layout = layout
        self.state_dir = layout.state_dir
        self.progress = progress
        self.cancel = cancel
        self.endpoint = endpoint
        self.commit = ""  # pinned by the listing, so every file comes from the same revision
        self.headers = build_hf_headers(library_name="parley")
        self.headers["Accept-Encoding"] = "identity"  # byte ranges must address the file itself

    def run(self) -> Path:
        try:
            return self._run()
        except _CancelRequested:
            raise DownloadCancelled(
                f"Download cancelled. {format_size(self.progress.done)} downloaded so far is kept; "
                "download again to continue where it stopped."
            ) from None

    def _run(self) -> Path:
        self._check_cancel()
        self.progress.report("Contacting Hugging Face…", force=True)
        listing = self._fetch_listing()
        self.commit = listing.commit
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(self.state_dir / "lock", self.target):
            manifest = self._start_manifest(listing)
            self._remove_stale_parts(listing)
            pending = [remote for remote in listing.files if not self._is_verified(manifest, remote)]
            self.progress.total = sum(remote.size for remote in listing.files)
            self.progress.done = self.progress.total - sum(remote.size for remote in pending)
            self.progress.done += sum(self._part_size(remote) for remote in pending)
            self._check_disk_space(pending)
            count = len(listing.files)
            finished = count - len(pending)
            for remote in sorted(pending, key=lambda item: item.size):  # small files first
                position = f"{finished + 1} of {count} files"
                with self._file_lock(remote):
                    if not self._adopt_existing(remote, position):
                        self._fetch_file(remote, position)
                self.layout.link(remote, self.commit)
                manifest.verified[remote.path] = remote.content_id
                manifest.save(self.state_dir)
                finished += 1
            with contextlib.suppress(OSError):
                (self.state_dir / "parts").rmdir()  # only when empty
            checkpoint = self.layout.checkpoint_dir(self.commit)
            verify_download(checkpoint, self.state_dir)
            self.layout.publish(self.commit)
        self.progress.report(f"Download complete ({count} of {count} files)", force=True)
        return checkpoint

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise _CancelRequested

    @contextlib.contextmanager
    def _file_lock(self, remote: RemoteFile) -> Iterator[None]:
        """Hold the lock other programs take for ``remote``'s content (the Hugging Face cache's), waiting for it."""
        path = self.layout.lock_path(remote)
        if path is None:
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as handle:
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    self.progress.report(f"Waiting for another program that is downloading {remote.path} now")
                    if self.cancel.wait(_POLL_S):
                        raise _CancelRequested from None
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    # ---- listing

    def _fetch_listing(self) -> Listing:
        api = HfApi(endpoint=self.endpoint, library_name="parley")
        try:
            info = self._call_cancellable(
                lambda: api.model_info(self.repo_id, files_metadata=True, timeout=LISTING_TIMEOUT_S)
            )
        except RepositoryNotFoundError:
            raise DownloadError(
                f"The model {self.repo_id} was not found on Hugging Face. Check the name; a private "
                "repository also needs a login token (HF_TOKEN)."
            ) from None
        except GatedRepoError:
            raise DownloadError(
                f"{self.repo_id} requires accepting its terms on huggingface.co and a login token (HF_TOKEN)."
            ) from None
        except OfflineModeIsEnabled:
            raise DownloadError(
                "Hugging Face offline mode is on (HF_HUB_OFFLINE is set), so nothing can be downloaded."
            ) from None
        except httpx2.TransportError as exc:
            raise self._network_error(exc) from exc
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            raise DownloadError(
                f"Hugging Face answered with an error (HTTP {status}) when asked for {self.repo_id}. Try again later."
            ) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise DownloadError(f"Hugging Face sent an unexpected answer for {self.repo_id} ({exc}).") from exc
        return listing_from_info(self.repo_id, info)

    def _call_cancellable(self, function: Callable[[], _T]) -> _T:
        """Run a blocking call on a daemon thread so that cancel is noticed while it waits."""
        results: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)

        def call() -> None:
            try:
                results.put((True, function()))
            except Exception as exc:  # noqa: BLE001 -- re-raised on the calling thread
                results.put((False, exc))

        threading.Thread(target=call, name="parley-download-listing", daemon=True).start()
        while True:
            self._check_cancel()
            try:
                ok, value = results.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if ok:
                return cast(_T, value)
            raise value

    def _network_error(self, exc: Exception) -> DownloadError:
        host = urlsplit(self.endpoint or constants.ENDPOINT).netloc
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return DownloadError(
                f"The secure connection to {host} could not be verified (certificate error). A proxy or firewall "
                f"may be intercepting it. ({text})"
            )
        if isinstance(exc, httpx2.TimeoutException):
            return DownloadError(f"{host} did not answer in time. Check your internet connection and try again.")
        return DownloadError(
            f"Cannot reach {host}: you seem to be offline or the server is unreachable ({text or type(exc).__name__})."
            " Anything already downloaded is kept; try again when you are online."
        )

    # ---- local state

    def _start_manifest(self, listing: Listing) -> Manifest:
        old = Manifest.load(self.state_dir)
        verified: dict[str, str] = {}
        if old is not None and old.repo_id == self.repo_id:
            current = {remote.path: remote.content_id for remote in listing.files}
            verified = {path: cid for path, cid in old.verified.items() if current.get(path) == cid}
        manifest = Manifest(self.repo_id, listing.commit, listing.files, verified)
        manifest.save(self.state_dir)
        return manifest

    def _is_verified(self, manifest: Manifest, remote: RemoteFile) -> bool:
        path = self.layout.checkpoint_dir(self.commit) / remote.path
        return (
            manifest.verified.get(remote.path) == remote.content_id
            and path.is_file()
            and path.stat().st_size == remote.size
        )

    def _part_path(self, remote: RemoteFile) -> Path:
        return self.layout.part_path(remote)

    def _stored(self, remote: RemoteFile) -> bool:
        path = self.layout.stored_path(remote)
        return path.is_file() and path.stat().st_size == remote.size

    def _part_size(self, remote: RemoteFile) -> int:
        try:
            return min(self._part_path(remote).stat().st_size, remote.size)
        except FileNotFoundError:
            return 0

    def _remove_stale_parts(self, listing: Listing) -> None:
        """Part files of content the repository no longer lists can never be resumed."""
        for path in self.layout.stale_parts({self._part_path(remote) for remote in listing.files}):
            path.unlink(missing_ok=True)

    def _check_disk_space(self, pending: list[RemoteFile]) -> None:
        # A file already stored with its size (a blob another tool fetched, say) is checked, not fetched.
        needed = sum(remote.size - self._part_size(remote) for remote in pending if not self._stored(remote))
        if needed <= 0:
            return
        required = needed + max(DISK_MARGIN_BYTES, int(needed * DISK_MARGIN_FRACTION))
        free = shutil.disk_usage(self.state_dir).free
        if free < required:
            raise DownloadError(
                f"Not enough disk space for {self.repo_id}: it needs {format_size(required)} "
                f"({format_size(needed)} still to download plus a safety margin), but only {format_size(free)} "
                f"is free at {self.target}. Free up {format_size(required - free)} or choose another folder."
            )

    def disk_error(self, exc: OSError) -> DownloadError:
        kept = f"{format_size(self.progress.done)} downloaded so far is kept"
        if exc.errno == errno.ENOSPC:
            return DownloadError(f"The disk holding {self.target} is full. {kept}; free up space and download again.")
        return DownloadError(f"Cannot write the model to {self.target}: {exc.strerror or exc}. {kept}.")

    # ---- files

    def _adopt_existing(self, remote: RemoteFile, position: str) -> bool:
        """Keep a file already in place with the right size (an earlier, unrecorded download, or a blob another
        tool put in the Hugging Face cache) if it checks out."""
        path = self.layout.stored_path(remote)
        if not (_Checksum.available(remote) and path.is_file() and path.stat().st_size == remote.size):
            return False
        checksum = _Checksum(remote)
        self._hash_file(path, remote.size, checksum, f"Checking {remote.path} already in the folder ({position})")
        if not checksum.matches():
            return False
        self.progress.done += remote.size
        return True

    def _fetch_file(self, remote: RemoteFile, position: str) -> None:
        part = self._part_path(remote)
        part.parent.mkdir(parents=True, exist_ok=True)
        checksum = _Checksum(remote) if _Checksum.available(remote) else None
        for attempt in (1, 2):
            self._fill_part(remote, part, checksum, position)
            if checksum is None or checksum.matches():
                break
            part.unlink()
            self.progress.done -= remote.size
            if attempt == 2:
                raise DownloadError(
                    f"{remote.path} arrived damaged twice (its checksum does not match the repository), so it "
                    "was discarded. Check your connection and download again."
                )
            log.warning("%s arrived damaged; fetching it again", remote.path)
            checksum.reset()
        destination = self.layout.stored_path(remote)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, destination)

    def _fill_part(self, remote: RemoteFile, part: Path, checksum: _Checksum | None, position: str) -> None:
        """Append to ``part`` until it holds ``remote.size`` bytes, resuming after failures."""
        with open(part, "ab") as out:
            offset = os.fstat(out.fileno()).st_size
            if offset > remote.size:  # cannot happen unless the file was tampered with
                self.progress.done -= remote.size
                out.truncate(0)
                offset = 0
            if offset and checksum is not None:
                self._hash_file(part, offset, checksum, f"Checking the part of {remote.path} already downloaded")
            url = hf_hub_url(self.repo_id, remote.path, revision=self.commit, endpoint=self.endpoint)
            message = f"Downloading {remote.path} ({position})"
            failures = 0
            while offset < remote.size:
                self._check_cancel()
                self.progress.report(message)
                before = offset
                try:
                    offset = self._stream_into(url, out, remote, offset, checksum, message)
                except (httpx2.TransportError, _Stalled, _EndedEarly, HfHubHTTPError) as exc:
                    out.flush()  # the next request resumes after the last byte actually in the file
                    offset = os.fstat(out.fileno()).st_size
                    if isinstance(exc, HfHubHTTPError) and not _is_retryable_status(exc):
                        raise self._refused(remote, exc) from exc
                    failures = 1 if offset > before else failures + 1
                    if failures > len(RETRY_DELAYS_S):
                        raise DownloadError(
                            f"The download of {remote.path} was interrupted: {_describe(exc)}. "
                            f"{format_size(self.progress.done)} downloaded so far is kept; "
                            "download again to continue where it stopped."
                        ) from exc
                    delay = RETRY_DELAYS_S[failures - 1]
                    self.progress.report(
                        f"Connection problem ({_describe(exc)}); retrying in {delay:g} s "
                        f"(attempt {failures} of {len(RETRY_DELAYS_S)})",
                        force=True,
                    )
                    if self.cancel.wait(delay):
                        raise _CancelRequested from None
            out.flush()
            os.fsync(out.fileno())

    def _stream_into(
        self,
        url: str,
        out: IO[bytes],
        remote: RemoteFile,
        offset: int,
        checksum: _Checksum | None,
        message: str,
    ) -> int:
        """One HTTP request for the bytes from ``offset``; returns the new offset. Raises on failure."""
        headers = dict(self.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        reader = _BodyReader(url, headers)

        def on_idle(idle: float) -> None:
            if idle >= WAITING_NOTICE_S:
                self.progress.report(f"{message}: waiting for the server ({idle:.0f} s without data)")
            else:
                self.progress.report(message)

        try:
            head = reader.next(self.cancel, on_idle)
            if not isinstance(head, _Head):
                raise _EndedEarly("the server sent no answer")
            if offset and not _resumes_at(head, offset):
                # The server sends the whole file instead of the missing range: start over.
                out.truncate(0)
                self.progress.done -= offset
                offset = 0
                if checksum is not None:
                    checksum.reset()
            announced = _announced_size(head)
            if announced is not None and announced != remote.size:
                raise DownloadError(
                    f"The server sends {remote.path} as {format_size(announced)}, but the repository lists "
                    f"{format_size(remote.size)}. Try again later."
                )
            while True:
                item = reader.next(self.cancel, on_idle)
                if item is _END:
                    break
                assert isinstance(item, bytes)  # the reader queues only _Head, bytes and _END
                if offset + len(item) > remote.size:
                    raise DownloadError(f"The server sent more data for {remote.path} than the repository lists.")
                out.write(item)
                if checksum is not None:
                    checksum.update(item)
                offset += len(item)
                self.progress.done += len(item)
                self.progress.report(message)
        finally:
            reader.close()
        if offset < remote.size:
            raise _EndedEarly("the server closed the connection early")
        return offset

    def _hash_file(self, path: Path, length: int, checksum: _Checksum, message: str) -> None:
        self.progress.report(message)
        remaining = length
        with open(path, "rb") as source:
            while remaining > 0:
                self._check_cancel()
                block = source.read(min(_HASH_BLOCK, remaining))
                if not block:
                    break
                checksum.update(block)
                remaining -= len(block)
                self.progress.report()

    def _refused(self, remote: RemoteFile, exc: HfHubHTTPError) -> DownloadError:
        status = exc.response.status_code if exc.response is not None else "?"
        return DownloadError(
            f"Hugging Face refused to send {remote.path} (HTTP {status}). "
            f"{format_size(self.progress.done)} downloaded so far is kept."
        )


def _is_retryable_status(exc: HfHubHTTPError) -> bool:
    return exc.response is not None and exc.response.status_code in _RETRY_STATUS


def _resumes_at(head: _Head, offset: int) -> bool:
    """Whether a response to ``Range: bytes=<offset>-`` really continues at ``offset``."""
    if head.status != 206 or not head.content_range:
        return False
    try:
        unit, _, span = head.content_range.partition(" ")
        return unit == "bytes" and int(span.split("-", 1)[0]) == offset
    except ValueError:
        return False


def _announced_size(head: _Head) -> int | None:
    """The full file size the response announces, if it does."""
    if head.status == 206 and head.content_range:
        total = head.content_range.rsplit("/", 1)[-1]
        return int(total) if total.isdigit() else None
    if head.status == 200:
        return head.content_length
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return f"HTTP {exc.response.status_code}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
