"""VoiceChat checkpoints in the Hugging Face cache: a fake cache in the real layout (``models--org--name/{blobs,
refs,snapshots/<revision>/}``, snapshot files linking to content-addressed blobs) is listed with quantization, size and
revision; incomplete snapshots say what they lack and are never ready; a ready one loads in place."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.hf_cache import CacheListing, list_cached_checkpoints
from app.messages import ModelLoaded
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
Q4_REPO = "mlx-community/NemotronLabs-VoiceChat-11B-4bit"
Q8_REPO = "mlx-community/NemotronLabs-VoiceChat-11B-8bit"
OLD, NEW = "a" * 40, "b" * 40


def add_snapshot(
    cache: Path,
    repo_id: str,
    revision: str,
    source: Path,
    *,
    refs: tuple[str, ...] = ("main",),
    skip: tuple[str, ...] = (),
) -> Path:
    """Put the files of ``source`` (but ``skip``) into ``cache`` as huggingface_hub does: blobs named by their hash,
    the snapshot's files relative links to them, each ref a file holding the revision."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.name in skip:
            continue
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        (snapshot / path.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    for ref in refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(revision)
    return snapshot


def blob_bytes(snapshot: Path) -> int:
    return sum(path.resolve().stat().st_size for path in snapshot.iterdir() if path.exists())


def shard_names(checkpoint: Path) -> list[str]:
    return sorted(path.name for path in checkpoint.glob("*.safetensors"))


@pytest.fixture
def fake_cache(tmp_path: Path, tiny_q4: Path, tiny_q8: Path) -> Path:
    """Two revisions of the 4-bit repository (both complete), an 8-bit one lacking its tokenizer and its last
    shard (a partial blob beside: a download under way), and another model that is not VoiceChat."""
    cache = tmp_path / "hub"
    add_snapshot(cache, Q4_REPO, OLD, tiny_q4, refs=())
    add_snapshot(cache, Q4_REPO, NEW, tiny_q4, refs=("main",))
    partial = add_snapshot(cache, Q8_REPO, OLD, tiny_q8, skip=("tokenizer.json", shard_names(tiny_q8)[-1]))
    (partial.parents[1] / "blobs" / "0123abcd.incomplete").write_bytes(b"\0" * 100)
    other = tmp_path / "whisper"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    (other / "model.safetensors").write_bytes(b"\0" * 64)
    add_snapshot(cache, "openai/whisper-tiny", OLD, other)
    return cache


def test_fake_cache_lists_each_voicechat_revision_with_quantization_size_and_what_is_missing(
    fake_cache: Path, tiny_q8: Path
) -> None:
    listing = list_cached_checkpoints(fake_cache)
    assert listing.note is None and listing.cache_dir == fake_cache
    found = {(entry.repo_id, entry.revision): entry for entry in listing.checkpoints}
    assert set(found) == {(Q4_REPO, OLD), (Q4_REPO, NEW), (Q8_REPO, OLD)}  # not the whisper model
    assert [entry.revision for entry in listing.checkpoints if entry.repo_id == Q4_REPO] == [NEW, OLD]  # main's first

    new, old, partial = found[(Q4_REPO, NEW)], found[(Q4_REPO, OLD)], found[(Q8_REPO, OLD)]
    for entry in (new, old):
        assert entry.ready and entry.quantization == "4-bit" and entry.variant is not None
        assert entry.variant.key == "4bit"
        assert entry.size_bytes == blob_bytes(entry.path) > 0
        assert entry.path == fake_cache / "models--mlx-community--NemotronLabs-VoiceChat-11B-4bit" / "snapshots" / (
            entry.revision
        )
    assert new.refs == ("main",) and new.revision_text == "bbbbbbb (main)"
    assert old.refs == () and old.revision_text == "aaaaaaa"

    assert not partial.ready and partial.quantization == "8-bit"
    assert partial.missing == ("tokenizer.json", shard_names(tiny_q8)[-1])
    assert partial.why_not_ready == f"Incomplete: missing tokenizer.json, {shard_names(tiny_q8)[-1]}."
    assert listing.ready == (new, old)


def test_a_truncated_shard_is_not_offered(tmp_path: Path, tiny_q4: Path) -> None:
    cache = tmp_path / "hub"
    snapshot = add_snapshot(cache, Q4_REPO, NEW, tiny_q4)
    shard = snapshot / shard_names(tiny_q4)[0]
    blob = shard.resolve()
    blob.write_bytes(blob.read_bytes()[:-1000])  # cut short, as an interrupted copy leaves it
    (entry,) = list_cached_checkpoints(cache).checkpoints
    assert not entry.ready and entry.missing == ()
    assert entry.problem is not None and "truncated" in entry.problem and shard.name in entry.problem


def test_a_snapshot_whose_blob_was_deleted_is_listed_as_incomplete(tmp_path: Path, tiny_q4: Path) -> None:
    # huggingface_hub's scan rejects the whole repository for a dangling link; it is still listed, as incomplete.
    cache = tmp_path / "hub"
    snapshot = add_snapshot(cache, Q4_REPO, NEW, tiny_q4)
    (snapshot / "tokenizer.json").resolve().unlink()
    link = tmp_path / "linked-hub"  # a cache reached through a link, as a moved HF_HOME often is
    link.symlink_to(cache)
    assert list_cached_checkpoints(link).checkpoints == list_cached_checkpoints(cache).checkpoints
    (entry,) = list_cached_checkpoints(cache).checkpoints
    assert not entry.ready and entry.missing == ("tokenizer.json",) and entry.quantization == "4-bit"


def test_no_cache_folder_is_said_not_failed(tmp_path: Path) -> None:
    listing = list_cached_checkpoints(tmp_path / "nowhere")
    assert listing.checkpoints == () and listing.note == f"There is no Hugging Face cache at {tmp_path / 'nowhere'}."


def _listing_in_subprocess(env: dict[str, str]) -> dict[str, object]:
    code = (
        "import json\nfrom app.hf_cache import list_cached_checkpoints\nlisting = list_cached_checkpoints()\n"
        "print(json.dumps({'dir': str(listing.cache_dir), 'offline': listing.offline,"
        " 'found': [[e.repo_id, e.revision, e.ready] for e in listing.checkpoints]}))\n"
    )
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(result.stdout.splitlines()[-1])


def test_hf_home_hf_hub_cache_and_offline_are_honoured(tmp_path: Path, tiny_q4: Path) -> None:
    add_snapshot(tmp_path / "home" / "hub", Q4_REPO, NEW, tiny_q4)
    add_snapshot(tmp_path / "elsewhere", Q8_REPO, OLD, tiny_q4)
    by_home = _listing_in_subprocess({"HF_HOME": str(tmp_path / "home")})
    assert by_home == {"dir": str(tmp_path / "home" / "hub"), "offline": False, "found": [[Q4_REPO, NEW, True]]}
    # HF_HUB_CACHE wins over HF_HOME, as in huggingface_hub; HF_HUB_OFFLINE is reported.
    by_cache = _listing_in_subprocess(
        {"HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "elsewhere"), "HF_HUB_OFFLINE": "1"}
    )
    assert by_cache == {"dir": str(tmp_path / "elsewhere"), "offline": True, "found": [[Q8_REPO, OLD, True]]}


def test_a_cached_checkpoint_loads_in_place(
    build_controller, fake_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(fake_cache))
    controller = build_controller(Settings(idle_pause=False), history=False)
    controller.start()
    listing: CacheListing = controller.cached_checkpoints()
    assert listing.cache_dir == fake_cache
    chosen = next(entry for entry in listing.ready if entry.refs == ("main",))
    before = sorted(path.name for path in tmp_path.iterdir())
    controller.use_checkpoint(chosen.path)
    seen: list[object] = []
    deadline = time.monotonic() + 120
    while not any(isinstance(message, ModelLoaded) for message in seen) and time.monotonic() < deadline:
        seen += controller.poll()
        time.sleep(0.01)
    loaded = next(message for message in seen if isinstance(message, ModelLoaded))
    assert loaded.variant.key == "4bit" and loaded.path == chosen.path
    assert controller.settings.checkpoint_for("4bit") == chosen.path and controller.settings.active_variant == "4bit"
    # In place: the snapshot still holds only its links, and nothing was copied beside the cache.
    assert all(path.is_symlink() for path in chosen.path.iterdir())
    assert {path.name for path in tmp_path.iterdir()} - set(before) <= {"settings.json", "logs"}
