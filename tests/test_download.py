"""Tests for ``app.download`` against a local imitation of the Hugging Face Hub.

``FakeHub`` is a small threaded HTTP server that answers the requests the download makes:
``GET /api/models/<repo>?blobs=True`` (what ``HfApi.model_info(files_metadata=True)`` asks for),
``GET /<repo>/resolve/<commit>/<file>`` (LFS files are redirected to a ``/cdn/`` address, as the
Hub does), honouring ``Range: bytes=N-``. Faults can be scripted per file and per request: drop
the connection, hold it open without data, or send damaged bytes. Nothing touches the network.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import random
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit

import huggingface_hub
import pytest
from huggingface_hub import constants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import download
from app.download import (
    DownloadCancelled,
    DownloadError,
    download_checkpoint,
    format_size,
    verify_download,
)
from app.messages import DownloadProgress, Failure
from app.settings import Settings

REPO = "mlx-community/Tiny-VoiceChat-4bit"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
MIB = 1024 * 1024
BODY_CHUNK = 64 * 1024


def _repo_files() -> dict[str, bytes]:
    rng = random.Random(7)
    index = {"metadata": {"total_size": 5 * MIB}, "weight_map": {"a.weight": SHARD1, "b.weight": SHARD2}}
    return {
        "config.json": json.dumps({"model_type": "nemotron_voicechat", "hidden_size": 8}).encode(),
        "model.safetensors.index.json": json.dumps(index).encode(),
        "tokenizer.json": bytes(rng.getrandbits(8) for _ in range(10_000)),
        SHARD1: rng.randbytes(4 * MIB),
        SHARD2: rng.randbytes(1 * MIB),
    }


FILES = _repo_files()
LFS = {SHARD1, SHARD2}
TOTAL = sum(len(data) for data in FILES.values())


@dataclass(frozen=True)
class Fault:
    """What the server does to one GET of a file: ``drop``/``hold`` after ``at`` bytes, or ``corrupt``."""

    kind: str
    at: int = 0


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    file: str | None  # the repository file a resolve/cdn request is for
    range: str | None


@dataclass
class FakeHub:
    files: dict[str, bytes]
    lfs: set[str]
    repo_id: str = REPO
    chunk_delay_s: float = 0.0
    ignore_range: set[str] = field(default_factory=set)  # files served whole even when a range is asked
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # ends every "hold"
    url: str = ""
    listed: dict[str, dict[str, object]] = field(default_factory=dict)  # per file: listing fields to replace
    commit: str = COMMIT  # the commit the listing names
    holding: int = 0  # connections held open without data right now

    def sibling(self, name: str) -> dict[str, object]:
        data = self.files[name]
        entry: dict[str, object] = {
            "rfilename": name,
            "size": len(data),
            "blobId": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
        }
        if name in self.lfs:
            entry["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
        for key, value in self.listed.get(name, {}).items():
            if key == "sha256":
                entry["lfs"] = {**cast(dict[str, object], entry.get("lfs") or {}), "sha256": value}
                entry["lfs"].setdefault("size", len(data))  # type: ignore[attr-defined]
                entry["lfs"].setdefault("pointerSize", 134)  # type: ignore[attr-defined]
            elif value is None:
                entry.pop(key, None)
            else:
                entry[key] = value
        return entry


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    by_sha = {hashlib.sha256(data).hexdigest(): name for name, data in hub.files.items()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            file = self._file_for(path)
            hub.requests.append(Seen("GET", path, file, self.headers.get("Range")))
            api = f"/api/models/{hub.repo_id}"
            if path == api or path.startswith(api + "/revision/"):
                body = {"id": hub.repo_id, "sha": hub.commit, "siblings": [hub.sibling(name) for name in hub.files]}
                self._send_json(200, body)
            elif path.startswith("/api/models/"):
                self._send_json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            elif file is not None and path.startswith(f"/{hub.repo_id}/resolve/{COMMIT}/") and file in hub.lfs:
                sha = hashlib.sha256(hub.files[file]).hexdigest()
                self.send_response(302)
                self.send_header("Location", f"/cdn/{sha}?filename={quote(file)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif file is not None:
                self._send_file(file)
            else:
                self._send_json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})

        def _file_for(self, path: str) -> str | None:
            prefix = f"/{hub.repo_id}/resolve/{COMMIT}/"
            if path.startswith(prefix):
                name = unquote(path[len(prefix) :])
                return name if name in hub.files else None
            if path.startswith("/cdn/"):
                return by_sha.get(path[len("/cdn/") :])
            return None

        def _send_json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _send_file(self, name: str) -> None:
            data = hub.files[name]
            scripted = hub.faults.get(name)
            fault = scripted.pop(0) if scripted else None
            if fault is not None and fault.kind == "corrupt":
                data = bytes(byte ^ 0x55 for byte in data)
            start = 0
            range_header = self.headers.get("Range")
            if range_header and name not in hub.ignore_range:
                start = int(range_header.removeprefix("bytes=").split("-")[0])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("ETag", f'"{hashlib.sha256(hub.files[name]).hexdigest()}"')
            self.end_headers()
            stop_at = fault.at if fault is not None and fault.kind in ("drop", "hold") else len(data)
            try:
                for offset in range(start, stop_at, BODY_CHUNK):
                    self.wfile.write(data[offset : min(offset + BODY_CHUNK, stop_at)])
                    if hub.chunk_delay_s:
                        time.sleep(hub.chunk_delay_s)
                self.wfile.flush()
                if stop_at < len(data):
                    if fault is not None and fault.kind == "hold":
                        hub.holding += 1
                        try:
                            hub.release.wait(10)
                        finally:
                            hub.holding -= 1
                    self.close_connection = True
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler


@pytest.fixture
def make_hub() -> Iterator[Callable[..., FakeHub]]:
    servers: list[tuple[ThreadingHTTPServer, FakeHub]] = []

    def make(files: dict[str, bytes] | None = None, lfs: set[str] | None = None) -> FakeHub:
        hub = FakeHub(dict(FILES if files is None else files), set(LFS if lfs is None else lfs))
        server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(hub))
        server.daemon_threads = True
        server.block_on_close = False
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        hub.url = f"http://127.0.0.1:{server.server_address[1]}"
        servers.append((server, hub))
        return hub

    yield make
    for server, hub in servers:
        hub.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def hub(make_hub: Callable[..., FakeHub]) -> FakeHub:
    return make_hub()


@pytest.fixture(autouse=True)
def _isolated_hub_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No token, no offline mode, no proxy for 127.0.0.1, short retry delays."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(download, "RETRY_DELAYS_S", (0.05, 0.05, 0.05))
    huggingface_hub.close_session()  # the shared client reads proxy settings when it is created
    yield
    huggingface_hub.close_session()


@dataclass
class Recorder:
    """Collects ``on_progress`` calls; ``cancel_when`` may set the cancel event from inside the callback."""

    cancel: threading.Event = field(default_factory=threading.Event)
    calls: list[tuple[float, int, int | None, str]] = field(default_factory=list)
    cancel_when: Callable[[int], bool] | None = None
    cancelled_at: float | None = None

    def __call__(self, done: int, total: int | None, message: str) -> None:
        self.calls.append((time.monotonic(), done, total, message))
        if self.cancel_when is not None and self.cancelled_at is None and self.cancel_when(done):
            self.cancelled_at = time.monotonic()
            self.cancel.set()

    @property
    def messages(self) -> list[str]:
        return [message for *_, message in self.calls]


def run(hub: FakeHub, target: Path, recorder: Recorder | None = None) -> Path:
    recorder = recorder or Recorder()
    return download_checkpoint(REPO, target, on_progress=recorder, cancel=recorder.cancel, endpoint=hub.url)


def assert_complete(target: Path) -> None:
    for name, data in FILES.items():
        assert (target / name).read_bytes() == data, name
    verify_download(target)


def cdn_ranges(hub: FakeHub, name: str) -> list[str | None]:
    """The Range header of every request that fetched bytes of ``name``."""
    return [seen.range for seen in hub.requests if seen.file == name and not _is_redirect(hub, seen)]


def _is_redirect(hub: FakeHub, seen: Seen) -> bool:
    return seen.file in hub.lfs and "/resolve/" in seen.path


def part_files(target: Path) -> list[Path]:
    return sorted((target / download.STATE_DIR / "parts").glob("*.part"))


SMALL_FILES_AND_SHARD2 = TOTAL - len(FILES[SHARD1])  # files are fetched smallest first: shard 1 comes last


# --------------------------------------------------------------------------- tests


def test_progress_is_by_bytes_throttled_monotonic_and_reaches_the_total(hub: FakeHub, tmp_path: Path) -> None:
    hub.chunk_delay_s = 0.008  # about 0.7 s for the 5 MB, so several progress reports
    recorder = Recorder()
    target = tmp_path / "model"

    assert run(hub, target, recorder) == target

    assert_complete(target)
    _, first_done, first_total, first_message = recorder.calls[0]
    assert (first_done, first_total) == (0, None) and "Contacting" in first_message
    later = recorder.calls[1:]
    assert len(later) >= 4
    assert {total for _, _, total, _ in later} == {TOTAL}
    dones = [done for _, done, _, _ in recorder.calls]
    assert dones == sorted(dones)
    assert recorder.calls[-1][1:3] == (TOTAL, TOTAL) and "complete" in recorder.calls[-1][3]
    gaps = [b[0] - a[0] for a, b in zip(recorder.calls[:-2], recorder.calls[1:-1], strict=True)]
    assert min(gaps) >= 0.09, "more than about ten reports a second"
    assert any(f"of {len(FILES)} files" in message for message in recorder.messages)
    assert not part_files(target)


def test_cancel_mid_file_keeps_the_bytes_and_a_new_call_resumes_from_there(hub: FakeHub, tmp_path: Path) -> None:
    # The server sends 1 MiB of shard 1 and then holds the connection open without data: cancel must
    # work even while no data flows.
    hub.faults[SHARD1] = [Fault("hold", at=MIB)]
    target = tmp_path / "model"
    recorder = Recorder(cancel_when=lambda done: done >= SMALL_FILES_AND_SHARD2 + MIB)

    with pytest.raises(DownloadCancelled, match="kept") as cancelled:
        run(hub, target, recorder)

    assert recorder.cancelled_at is not None
    # Cancel returned while the server still held the connection open without data (it holds for 10 s unless
    # released): cancel does not wait for the stalled read to end.
    assert hub.holding == 1, "the download returned only after the stalled connection ended"
    after_cancel = [done for when, done, _, _ in recorder.calls if when > recorder.cancelled_at]
    assert all(done <= SMALL_FILES_AND_SHARD2 + MIB for done in after_cancel), "bytes were still counted"
    assert isinstance(cancelled.value, DownloadError)
    (part,) = part_files(target)
    assert part.stat().st_size == MIB
    assert not (target / SHARD1).exists()
    with pytest.raises(DownloadError, match=SHARD1):
        verify_download(target)  # a partial download never looks installed

    hub.requests.clear()
    resumed = Recorder()
    run(hub, target, resumed)

    assert_complete(target)
    assert cdn_ranges(hub, SHARD1) == [f"bytes={MIB}-"]
    for name in FILES.keys() - {SHARD1}:
        assert cdn_ranges(hub, name) == [], f"{name} was fetched again"
    first_known = next(done for _, done, total, _ in resumed.calls if total is not None)
    assert first_known >= SMALL_FILES_AND_SHARD2 + MIB
    assert not part_files(target)


def test_second_download_into_the_same_folder_is_refused_while_one_runs(hub: FakeHub, tmp_path: Path) -> None:
    hub.faults[SHARD1] = [Fault("hold", at=MIB)]
    target = tmp_path / "model"
    holding = threading.Event()

    def note_hold(done: int) -> bool:
        if done >= SMALL_FILES_AND_SHARD2 + MIB:
            holding.set()
        return False  # the test cancels it itself, after the second call

    first = Recorder(cancel_when=note_hold)
    outcome: list[BaseException] = []

    def first_download() -> None:
        try:
            run(hub, target, first)
        except DownloadError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=first_download)
    thread.start()
    assert holding.wait(10), "the first download never reached the held connection"

    with pytest.raises(DownloadError, match="already running"):
        run(hub, target)

    first.cancel.set()
    thread.join(5)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], DownloadCancelled)


def test_dropped_and_stalled_connections_resume_where_they_stopped(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download, "STALL_TIMEOUT_S", 0.75)
    hub.faults[SHARD1] = [Fault("drop", at=3 * MIB // 2)]
    hub.faults[SHARD2] = [Fault("hold", at=MIB // 2)]
    recorder = Recorder()
    target = tmp_path / "model"

    run(hub, target, recorder)

    assert_complete(target)
    assert cdn_ranges(hub, SHARD1) == [None, f"bytes={3 * MIB // 2}-"]
    assert cdn_ranges(hub, SHARD2) == [None, f"bytes={MIB // 2}-"]
    retries = [message for message in recorder.messages if "retrying" in message]
    assert len(retries) == 2
    assert any("no data arrived" in message for message in retries)
    dones = [done for _, done, _, _ in recorder.calls]
    assert dones == sorted(dones)


def test_not_enough_disk_space_names_both_sizes_and_downloads_nothing(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = collections.namedtuple("usage", "total used free")
    free = 1_000_000
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - free, free))

    with pytest.raises(DownloadError) as error:
        run(hub, tmp_path / "model")

    required = TOTAL + max(download.DISK_MARGIN_BYTES, int(TOTAL * download.DISK_MARGIN_FRACTION))
    message = str(error.value)
    assert "Not enough disk space" in message
    assert f"needs {format_size(required)}" in message
    assert f"only {format_size(free)} is free" in message
    assert [seen.file for seen in hub.requests] == [None]  # only the listing


def test_unreachable_server_says_so(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    recorder = Recorder()

    with pytest.raises(DownloadError, match=rf"Cannot reach 127\.0\.0\.1:{port}.*offline") as error:
        download_checkpoint(
            REPO, tmp_path / "model", on_progress=recorder, cancel=recorder.cancel, endpoint=f"http://127.0.0.1:{port}"
        )

    assert not isinstance(error.value, DownloadCancelled)
    assert not any("retrying" in message for message in recorder.messages), "an unreachable host is not retried"
    assert [total for _, _, total, _ in recorder.calls] == [None]


def test_unknown_repository_is_reported_as_not_found(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="was not found"):
        download_checkpoint(
            "mlx-community/No-Such-Model",
            tmp_path / "model",
            on_progress=Recorder(),
            cancel=threading.Event(),
            endpoint=hub.url,
        )


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"config.json": b"{}", "weights.npz": b"x"}, "does not look like an MLX checkpoint"),
        ({**FILES, "../outside.txt": b"x"}, "unsafe name"),
    ],
    ids=["no-index", "path-escape"],
)
def test_unsuitable_listing_is_rejected_before_any_file(
    make_hub: Callable[..., FakeHub], tmp_path: Path, files: dict[str, bytes], expected: str
) -> None:
    hub = make_hub(files=files, lfs=set())

    with pytest.raises(DownloadError, match=expected):
        run(hub, tmp_path / "model")

    assert [seen.file for seen in hub.requests] == [None]
    assert not (tmp_path / "outside.txt").exists()


def test_truncated_file_is_detected_and_a_new_call_repairs_only_it(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "model"
    run(hub, target)
    with open(target / SHARD2, "r+b") as shard:
        shard.truncate(MIB // 2)

    with pytest.raises(DownloadError, match=rf"{SHARD2} is 524\.3 kB but should be 1\.0 MB"):
        verify_download(target)

    hub.requests.clear()
    run(hub, target)
    assert_complete(target)
    assert [seen.file for seen in hub.requests if seen.file is not None and not _is_redirect(hub, seen)] == [SHARD2]


def test_missing_weight_shard_named_by_the_index_is_detected(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "model"
    run(hub, target)
    (target / SHARD1).unlink()

    with pytest.raises(DownloadError, match=SHARD1):
        verify_download(target)


def test_damaged_file_is_fetched_once_more_then_rejected(make_hub: Callable[..., FakeHub], tmp_path: Path) -> None:
    once = make_hub()
    once.faults[SHARD2] = [Fault("corrupt")]
    run(once, tmp_path / "once")
    assert_complete(tmp_path / "once")
    assert cdn_ranges(once, SHARD2) == [None, None]

    twice = make_hub()
    twice.faults[SHARD2] = [Fault("corrupt"), Fault("corrupt")]
    with pytest.raises(DownloadError, match=f"{SHARD2} arrived damaged"):
        run(twice, tmp_path / "twice")
    assert not (tmp_path / "twice" / SHARD2).exists()
    assert not part_files(tmp_path / "twice")


def test_resume_survives_a_server_that_ignores_range_and_a_damaged_part(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "model"
    parts = target / download.STATE_DIR / "parts"
    parts.mkdir(parents=True)
    good_prefix = parts / f"{hashlib.sha256(FILES[SHARD1]).hexdigest()}.part"
    good_prefix.write_bytes(FILES[SHARD1][: MIB // 4])
    bad_prefix = parts / f"{hashlib.sha256(FILES[SHARD2]).hexdigest()}.part"
    bad_prefix.write_bytes(b"\0" * (MIB // 4))
    hub.ignore_range = {SHARD1}

    run(hub, target)

    assert_complete(target)
    assert cdn_ranges(hub, SHARD1) == [f"bytes={MIB // 4}-"]  # answered with the whole file: started over
    # The zeros were continued, failed the checksum, and the whole file was fetched again.
    assert cdn_ranges(hub, SHARD2) == [f"bytes={MIB // 4}-", None]


def test_file_already_in_place_is_checked_and_kept(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / SHARD1).write_bytes(FILES[SHARD1])  # e.g. copied from another machine

    run(hub, target)

    assert_complete(target)
    assert cdn_ranges(hub, SHARD1) == []


def test_format_size_uses_decimal_units() -> None:
    assert [format_size(n) for n in (999, 1000, 9_200_000_000, 13_900_000_000_000)] == [
        "999 bytes",
        "1.0 kB",
        "9.2 GB",
        "13.9 TB",
    ]


# --------------------------------------------------------------------------- hostile listings

ESCAPE = "../../../elsewhere/made-by-download/escaped"  # from <target>/.parley-download/parts/: the test's folder
SMALL = "tokenizer.json"  # not an LFS file: named by its blob id


def outside_target(folder: Path, target: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but outside ``target``, with its contents."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and target not in path.parents
    }


@pytest.mark.parametrize(
    ("name", "fields", "expected"),
    [
        (SMALL, {"blobId": ESCAPE}, "malformed git blob id"),
        (SHARD2, {"sha256": ESCAPE}, "malformed sha256 checksum"),
        (SHARD2, {"sha256": "ab" * 31 + "a"}, "malformed sha256 checksum"),  # 63 hex digits
        (SHARD2, {"sha256": "g" * 64}, "malformed sha256 checksum"),  # the length of one, not hex
        (SMALL, {"blobId": "a" * 39 + "/"}, "malformed git blob id"),
        (SMALL, {"blobId": "ab" * 32}, "malformed git blob id"),  # a sha256 where a sha1 belongs
        (SMALL, {"blobId": 12345}, "malformed git blob id"),
        (SMALL, {"blobId": None}, "without a checksum"),  # neither a blob id nor an LFS sha256
        (SMALL, {"size": -5}, "did not say how large"),
        (SMALL, {"size": "10000"}, "did not say how large"),
    ],
    ids=[
        "blob-id-path",
        "sha256-path",
        "sha256-short",
        "sha256-not-hex",
        "blob-id-separator",
        "blob-id-too-long",
        "blob-id-number",
        "no-checksum",
        "negative-size",
        "size-as-text",
    ],
)
def test_hostile_listing_field_is_refused_before_anything_is_written(
    make_hub: Callable[..., FakeHub], tmp_path: Path, name: str, fields: dict[str, object], expected: str
) -> None:
    hub = make_hub()
    hub.listed[name] = fields
    target = tmp_path / "model"
    users_file = tmp_path / "elsewhere" / "made-by-download" / "escaped.part"
    users_file.parent.mkdir(parents=True)
    users_file.write_bytes(b"the user's own file")
    before = outside_target(tmp_path, target)

    with pytest.raises(DownloadError, match=expected):
        run(hub, target)

    assert [seen.file for seen in hub.requests] == [None], "only the listing was asked for"
    assert outside_target(tmp_path, target) == before, "something outside the target was written or deleted"
    assert not (target / download.STATE_DIR / "parts").exists()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("weights\0.safetensors", "unsafe name"),
        (".PARLEY-DOWNLOAD/manifest.json", "unsafe name"),
        (".Parley-Download/parts/x.part", "unsafe name"),
        ("sub\\..\\..\\outside.txt", "unsafe name"),
        ("/etc/outside.txt", "unsafe name"),
        ("sub/../../outside.txt", "unsafe name"),
        ("sub//outside.txt", "unsafe name"),
        ("CONFIG.JSON", "differ only in case"),
    ],
    ids=["nul", "state-folder-upper", "state-folder-mixed", "backslashes", "absolute", "dot-dot", "empty-part", "case"],
)
def test_hostile_listed_name_is_refused(
    make_hub: Callable[..., FakeHub], tmp_path: Path, name: str, expected: str
) -> None:
    hub = make_hub(files={**FILES, name: b"x"}, lfs=set())
    target = tmp_path / "model"

    with pytest.raises(DownloadError, match=expected):
        run(hub, target)

    assert [seen.file for seen in hub.requests] == [None]
    assert outside_target(tmp_path, target) == {}


def test_hostile_commit_id_is_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.commit = "../../../evil"
    with pytest.raises(DownloadError, match="unexpected answer"):
        run(hub, tmp_path / "model")
    assert [seen.file for seen in hub.requests] == [None]


def test_a_damaged_download_record_is_ignored_not_trusted(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "model"
    run(hub, target)
    manifest_path = target / download.STATE_DIR / "manifest.json"
    record = json.loads(manifest_path.read_text())
    record["files"][0]["path"] = "../outside.txt"
    manifest_path.write_text(json.dumps(record))

    with pytest.raises(DownloadError, match="holds no record"):
        verify_download(target)


def test_a_weight_index_naming_a_shard_outside_the_folder_is_reported(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "model"
    run(hub, target)
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    index = {"weight_map": {"a.weight": "../outside.safetensors"}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))

    with pytest.raises(DownloadError, match="names a shard outside the folder"):
        verify_download(target)


def test_a_nul_in_a_listed_name_reaches_the_user_as_a_message(
    make_hub: Callable[..., FakeHub],
    build_controller: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    hub = make_hub(files={**FILES, "weights\0.bin": b"x"}, lfs=set())
    monkeypatch.setattr(download, "download_checkpoint", functools.partial(download_checkpoint, endpoint=hub.url))
    controller = build_controller(Settings(), history=False)

    controller.start_download(REPO, tmp_path / "model", download.PARLEY_FOLDER)

    failure = wait_for_failure(controller)
    assert "unsafe name" in failure.message and "weights\\x00.bin" in failure.message


def test_an_unexpected_error_in_the_download_thread_reaches_the_user(
    build_controller: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken(*args: object, **kwargs: object) -> Path:
        raise ValueError("embedded null byte")

    monkeypatch.setattr(download, "download_checkpoint", broken)
    controller = build_controller(Settings(), history=False)

    controller.start_download(REPO, tmp_path / "model", download.PARLEY_FOLDER)

    failure = wait_for_failure(controller)
    assert "failed unexpectedly" in failure.message and "embedded null byte" in failure.message


def wait_for_failure(controller: Any) -> Failure:
    seen: list[object] = []
    for _ in range(1000):  # up to about 10 s
        seen += controller.poll()
        failures = [message for message in seen if isinstance(message, Failure)]
        if failures:
            progress = [m for m in seen if isinstance(m, DownloadProgress)]
            assert progress and progress[-1].failed, "the download line says it failed"
            return failures[0]
        time.sleep(0.01)
    raise AssertionError(f"no failure reached the user; messages: {seen[-5:]}")


NAME_PARTS = st.sampled_from(
    ["a", "B", ".", "..", "", "/", "\\", "\0", ".parley-download", ".PARLEY-download", "x.part"]
)
HEX_ISH = st.text(alphabet="0123456789abcdefABCDEF./\\\0g", min_size=0, max_size=70)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.lists(NAME_PARTS, min_size=1, max_size=6).map("".join),
    sha256=st.one_of(st.none(), HEX_ISH, st.sampled_from(["ab" * 32])),
    blob_id=st.one_of(st.none(), HEX_ISH, st.sampled_from(["ab" * 20])),
)
def test_no_listing_makes_the_download_write_or_delete_outside_its_target(
    make_hub: Callable[..., FakeHub], name: str, sha256: str | None, blob_id: str | None
) -> None:
    hub = make_hub(files={"config.json": b"{}", "model.safetensors.index.json": b"{}", name: b"data" * 100}, lfs=set())
    hub.listed[name] = {"sha256": sha256, "blobId": blob_id}
    with tempfile.TemporaryDirectory() as folder:
        sandbox = Path(folder) / "a" / "b" / "c" / "d"  # deep enough that ../../.. stays in the watched folder
        target = sandbox / "model"
        (Path(folder) / "users-file.part").write_bytes(b"keep me")
        before = outside_target(Path(folder), target)
        with contextlib.suppress(DownloadError):
            run(hub, target)
        assert outside_target(Path(folder), target) == before
        for path in target.rglob("*"):
            assert path.resolve().is_relative_to(target.resolve())
