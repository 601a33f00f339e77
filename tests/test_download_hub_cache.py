"""Downloads into the Hugging Face cache's layout, against the local fake Hub of ``tests/test_download.py``.

A tiny real checkpoint is served; the download must land as huggingface_hub would put it (``blobs/<hash>``,
``snapshots/<commit>/<name>`` relative links, ``refs/main``), so that :mod:`app.hf_cache` and
``huggingface_hub.scan_cache_dir`` both find it complete; an interrupted one must look incomplete to both, and a
new call must resume it from its last byte.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from app.download import HUB_CACHE, DownloadCancelled, DownloadError, download_checkpoint, verify_download
from app.download_layout import HubCache
from app.hf_cache import list_cached_checkpoints
from tests.test_download import (  # noqa: F401 -- the fake Hub's fixtures, used by name
    COMMIT,
    REPO,
    FakeHub,
    Fault,
    Recorder,
    _isolated_hub_client,
    cdn_ranges,
    make_hub,
)

REPO_DIR = "models--mlx-community--Tiny-VoiceChat-4bit"


@pytest.fixture
def served(tiny_q4: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(tiny_q4.iterdir()) if path.is_file()}


@pytest.fixture
def tiny_hub(make_hub: Callable[..., FakeHub], served: dict[str, bytes]) -> FakeHub:  # noqa: F811 -- the fixture
    return make_hub(files=served, lfs={name for name in served if name.endswith(".safetensors")})


def content_id(hub: FakeHub, name: str) -> str:
    data = hub.files[name]
    if name in hub.lfs:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def download(hub: FakeHub, cache: Path, recorder: Recorder | None = None) -> Path:
    recorder = recorder or Recorder()
    return download_checkpoint(
        REPO, cache, on_progress=recorder, cancel=recorder.cancel, endpoint=hub.url, layout=HUB_CACHE
    )


def largest(hub: FakeHub) -> str:
    return max(hub.files, key=lambda name: len(hub.files[name]))


def test_a_download_into_the_cache_is_laid_out_as_huggingface_hub_does_and_found_complete(
    tiny_hub: FakeHub, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"

    snapshot = download(tiny_hub, cache)

    repo = cache / REPO_DIR
    assert snapshot == repo / "snapshots" / COMMIT
    assert (repo / "refs" / "main").read_text() == COMMIT
    for name, data in tiny_hub.files.items():
        link = snapshot / name
        blob_name = content_id(tiny_hub, name)
        assert link.is_symlink() and os.readlink(link) == f"../../blobs/{blob_name}", name
        assert link.read_bytes() == data and (repo / "blobs" / blob_name).is_file()
    assert not list((repo / "blobs").glob("*.incomplete"))
    verify_download(snapshot)  # finds the record in the repository's folder by itself

    scan = scan_cache_dir(cache)
    assert scan.warnings == [] and scan.incomplete_files == frozenset()
    (cached_repo,) = scan.repos
    (revision,) = cached_repo.revisions
    assert (cached_repo.repo_id, revision.commit_hash, revision.refs) == (REPO, COMMIT, frozenset({"main"}))
    assert {file.file_name for file in revision.files} == set(tiny_hub.files)
    assert revision.size_on_disk == sum(len(data) for data in tiny_hub.files.values())

    listing = list_cached_checkpoints(cache)
    (entry,) = listing.checkpoints
    assert entry.ready, entry.why_not_ready
    assert (entry.repo_id, entry.revision, entry.refs, entry.path) == (REPO, COMMIT, ("main",), snapshot)
    assert entry.quantization == "4-bit"


def test_an_interrupted_download_looks_incomplete_everywhere_and_resumes_from_its_last_byte(
    tiny_hub: FakeHub, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    shard = largest(tiny_hub)
    stop_at = len(tiny_hub.files[shard]) // 2
    tiny_hub.faults[shard] = [Fault("hold", at=stop_at)]  # half the largest file, then the connection stalls
    before_shard = sum(len(data) for name, data in tiny_hub.files.items() if name != shard)
    recorder = Recorder(cancel_when=lambda done: done >= before_shard + stop_at)

    with pytest.raises(DownloadCancelled):
        download(tiny_hub, cache, recorder)

    repo = cache / REPO_DIR
    snapshot = repo / "snapshots" / COMMIT
    partial = repo / "blobs" / f"{content_id(tiny_hub, shard)}.incomplete"
    assert partial.stat().st_size == stop_at  # huggingface_hub's name for a blob being downloaded
    assert not (snapshot / shard).exists() and not (repo / "refs" / "main").exists()
    with pytest.raises(DownloadError, match=shard):
        verify_download(snapshot)

    (entry,) = list_cached_checkpoints(cache).checkpoints
    assert not entry.ready and entry.missing == (shard,)
    assert entry.why_not_ready == f"Incomplete: missing {shard}."
    scan = scan_cache_dir(cache)
    assert {info.file_path for info in scan.incomplete_files} == {partial.resolve()}
    (revision,) = next(iter(scan.repos)).revisions
    assert shard not in {file.file_name for file in revision.files} and revision.refs == frozenset()

    tiny_hub.requests.clear()
    assert download(tiny_hub, cache) == snapshot

    assert cdn_ranges(tiny_hub, shard) == [f"bytes={stop_at}-"]
    for name in tiny_hub.files.keys() - {shard}:
        assert cdn_ranges(tiny_hub, name) == [], f"{name} was fetched again"
    assert (snapshot / shard).read_bytes() == tiny_hub.files[shard] and not partial.exists()
    (entry,) = list_cached_checkpoints(cache).checkpoints
    assert entry.ready and entry.refs == ("main",)
    assert scan_cache_dir(cache).incomplete_files == frozenset()


def test_a_file_the_download_listed_but_has_not_linked_keeps_the_snapshot_incomplete(
    tiny_hub: FakeHub, tmp_path: Path
) -> None:
    # The record names every file of the revision, so a snapshot lacking one that the checkpoint check itself does
    # not look for (not config, tokenizer or a shard) is still not offered.
    snapshot = download(tiny_hub, tmp_path / "hub")
    extra = sorted(set(tiny_hub.files) - {"config.json", "tokenizer.json", "model.safetensors.index.json"})
    extra = [name for name in extra if not name.endswith(".safetensors")]
    assert extra, f"the tiny checkpoint has only the checked files: {sorted(tiny_hub.files)}"
    (snapshot / extra[0]).unlink()
    (entry,) = list_cached_checkpoints(tmp_path / "hub").checkpoints
    assert not entry.ready and entry.missing == (extra[0],)


def test_a_blob_another_tool_already_downloaded_is_checked_and_linked_not_fetched(
    tiny_hub: FakeHub, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    shard = largest(tiny_hub)
    blob = cache / REPO_DIR / "blobs" / content_id(tiny_hub, shard)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(tiny_hub.files[shard])

    snapshot = download(tiny_hub, cache)

    assert cdn_ranges(tiny_hub, shard) == []
    assert (snapshot / shard).resolve() == blob.resolve()


def test_the_disk_space_check_also_guards_the_cache(
    tiny_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    checked: list[Path] = []

    def no_space(path: Path) -> shutil._ntuple_diskusage:  # type: ignore[name-defined]
        checked.append(Path(path))
        return shutil._ntuple_diskusage(10**9, 10**9, 1000)  # type: ignore[attr-defined]

    monkeypatch.setattr(shutil, "disk_usage", no_space)
    with pytest.raises(DownloadError, match="Not enough disk space"):
        download(tiny_hub, tmp_path / "hub")
    assert checked == [tmp_path / "hub" / REPO_DIR / ".parley-download"]
    assert not (tmp_path / "hub" / REPO_DIR / "blobs").exists()  # nothing fetched


def test_a_repository_name_that_cannot_be_a_cache_folder_is_refused(tmp_path: Path) -> None:
    for bad in ("../x", "org/../../x", "org--x/y", "org/x/y", "/abs"):
        with pytest.raises(DownloadError, match="not a repository name"):
            HubCache(tmp_path, bad)


def test_a_blob_huggingface_hub_is_downloading_is_waited_for_under_its_own_lock(
    tiny_hub: FakeHub, tmp_path: Path
) -> None:
    import threading

    from huggingface_hub.utils import WeakFileLock

    cache = tmp_path / "hub"
    shard = largest(tiny_hub)
    lock = cache / ".locks" / REPO_DIR / f"{content_id(tiny_hub, shard)}.lock"  # where hf_hub_download locks it
    lock.parent.mkdir(parents=True)
    recorder = Recorder()
    result: list[object] = []
    with WeakFileLock(lock):
        worker = threading.Thread(target=lambda: result.append(download(tiny_hub, cache, recorder)), daemon=True)
        worker.start()
        for _ in range(400):  # up to about 20 s
            if any("Waiting for another program" in message for message in recorder.messages):
                break
            worker.join(0.05)
        assert any(f"Waiting for another program that is downloading {shard}" in m for m in recorder.messages)
        assert cdn_ranges(tiny_hub, shard) == [] and worker.is_alive()
    worker.join(30)
    assert result == [cache / REPO_DIR / "snapshots" / COMMIT]
    assert (cache / REPO_DIR / "snapshots" / COMMIT / shard).read_bytes() == tiny_hub.files[shard]
