"""VoiceChat checkpoints already in the Hugging Face cache, found where mlx-vlm, mlx-audio or ``hf download`` put them.

The cache is scanned with ``huggingface_hub.scan_cache_dir``, in the folder huggingface_hub itself resolves
(``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``~/.cache/huggingface/hub``; read once, when huggingface_hub is
first imported, as every other tool reads it). Each snapshot (one revision of a repository) that is a VoiceChat
checkpoint — its config says so, or its repository's name does — becomes one :class:`CachedCheckpoint`: its
quantization (read from the snapshot's config by the engine's reader), size and revision, and whether it is
complete. A snapshot is complete when the files a checkpoint folder holds are all there (config, tokenizer, the
shard index and every shard it lists) and the engine's header check passes (no truncated shard, every tensor of
the layout present) and a Parley download into the cache that listed it has every file in place; otherwise the
entry says what is missing and is never offered as ready. A complete one is
used in place: the model settings get the snapshot folder, nothing is copied. No Qt; MLX only inside the header
check (imported when a listing is made, never at import).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from app.download_layout import unfinished_files
from app.variants import Variant, variant_for_checkpoint, variant_for_repo

log = logging.getLogger(__name__)

# The files every checkpoint folder holds, whatever its weights (engine.loading.checkpoint reads them).
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
NAME_MARK = "voicechat"  # a repository named like this is listed even when its config is what is missing


@dataclass(frozen=True)
class CachedCheckpoint:
    """One revision of a VoiceChat repository in the cache."""

    repo_id: str  # e.g. "mlx-community/NemotronLabs-VoiceChat-11B-4bit"
    revision: str  # the commit hash (the snapshot folder's name)
    refs: tuple[str, ...]  # branches and tags pointing at it, e.g. ("main",)
    path: Path  # the snapshot folder: what the model settings get
    size_bytes: int  # the blobs this revision links to
    variant: Variant | None  # what its config's quantization makes it; None when unknown or not offered
    missing: tuple[str, ...] = ()  # files (or tensors) a complete checkpoint has and this one lacks
    problem: str | None = None  # why it cannot be used although its files are there

    @property
    def ready(self) -> bool:
        return not self.missing and self.problem is None and self.variant is not None

    @property
    def quantization(self) -> str:
        """In words: "4-bit", "8-bit", "bf16", or "unknown" (no readable config)."""
        return self.variant.label if self.variant is not None else "unknown"

    @property
    def size_text(self) -> str:
        return human_size(self.size_bytes)

    @property
    def revision_text(self) -> str:
        """The short commit hash, with the refs naming it: "3f2a9c1 (main)"."""
        short = self.revision[:7]
        return f"{short} ({', '.join(self.refs)})" if self.refs else short

    @property
    def why_not_ready(self) -> str:
        """One line saying why it is not offered (empty when ready)."""
        if self.missing:
            more = len(self.missing) - 3
            shown = ", ".join(self.missing[:3]) + (f" and {more} more" if more > 0 else "")
            return f"Incomplete: missing {shown}."
        if self.problem is not None:
            return self.problem
        return ""


@dataclass(frozen=True)
class CacheListing:
    """What a scan found, and where it looked."""

    cache_dir: Path
    checkpoints: tuple[CachedCheckpoint, ...]
    offline: bool  # HF_HUB_OFFLINE is set: the cache is the only source
    note: str | None = None  # the cache folder does not exist, or could not be read

    @property
    def ready(self) -> tuple[CachedCheckpoint, ...]:
        return tuple(entry for entry in self.checkpoints if entry.ready)


def human_size(count: int) -> str:
    if count >= 1 << 30:
        return f"{count / (1 << 30):.1f} GB"
    if count >= 1 << 20:
        return f"{count / (1 << 20):.1f} MB"
    return f"{count / 1024:.0f} KB"


def hub_cache_dir() -> Path:
    """The cache folder huggingface_hub uses in this process (HF_HUB_CACHE / HF_HOME, resolved by it)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, as huggingface_hub reads it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def list_cached_checkpoints(cache_dir: Path | None = None) -> CacheListing:
    """Every VoiceChat snapshot in the cache (``cache_dir``, else huggingface_hub's), what ``main`` names first."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    folder = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    offline = hub_offline()
    try:
        scan = scan_cache_dir(folder)
    except CacheNotFound:
        return CacheListing(folder, (), offline, f"There is no Hugging Face cache at {folder}.")
    except (OSError, ValueError) as exc:
        return CacheListing(folder, (), offline, f"The Hugging Face cache at {folder} cannot be read: {exc}")
    found: list[CachedCheckpoint] = []
    for repo in sorted(scan.repos, key=lambda repo: repo.repo_id):
        if repo.repo_type != "model":
            continue
        # The revision a branch or tag names (what the other tools load) first, then the newest.
        for revision in sorted(repo.revisions, key=lambda rev: (not rev.refs, -rev.last_modified, rev.commit_hash)):
            entry = _describe(repo.repo_id, revision.commit_hash, tuple(sorted(revision.refs)), revision.snapshot_path)
            if entry is not None:
                found.append(_with_size(entry, revision.size_on_disk))
    # A repository whose snapshot links to a deleted blob fails the scan as a whole ("corrupted"); a VoiceChat one
    # is still listed, as incomplete, so the user learns why it is not offered.
    for warning in scan.warnings:
        found.extend(_damaged(folder, str(warning)))
    return CacheListing(folder, tuple(found), offline)


def _with_size(entry: CachedCheckpoint, size: int) -> CachedCheckpoint:
    return CachedCheckpoint(
        entry.repo_id, entry.revision, entry.refs, entry.path, size, entry.variant, entry.missing, entry.problem
    )


def _describe(repo_id: str, revision: str, refs: tuple[str, ...], snapshot: Path) -> CachedCheckpoint | None:
    """The entry for one snapshot, or None when it is not a VoiceChat checkpoint."""
    from engine import read_config
    from engine.errors import CheckpointError

    named = NAME_MARK in repo_id.lower() or variant_for_repo(repo_id) is not None
    config_file = snapshot / CONFIG_FILE
    if not config_file.is_file():
        if not named:
            return None
        return CachedCheckpoint(repo_id, revision, refs, snapshot, 0, None, _missing_files(snapshot))
    try:
        config, _raw = read_config(snapshot)
    except CheckpointError as exc:
        if not named:
            return None  # another model's snapshot
        return CachedCheckpoint(repo_id, revision, refs, snapshot, 0, None, (), str(exc))
    try:
        offered: Variant | None = variant_for_checkpoint(config.quantization_bits)
    except ValueError:
        offered = None
    missing = _missing_files(snapshot)
    problem = None
    if offered is None:
        problem = f"Quantized to {config.quantization_bits} bits; Parley runs the 4-bit, 8-bit and bf16 checkpoints."
    elif not missing:
        problem = _header_problem(snapshot)
    return CachedCheckpoint(repo_id, revision, refs, snapshot, 0, offered, missing, problem)


def _missing_files(snapshot: Path) -> tuple[str, ...]:
    """The checkpoint files absent from ``snapshot`` (a dangling link counts as absent), and those a Parley download
    into the cache listed for this revision and has not finished (it links a file only once it checks out)."""
    missing = [name for name in (CONFIG_FILE, TOKENIZER_FILE) if not (snapshot / name).is_file()]
    missing.extend(name for name in unfinished_files(snapshot) if name not in missing)
    index = snapshot / INDEX_FILE
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return (*missing, f"{INDEX_FILE} (unreadable)")
        missing.extend(name for name in shards if not (snapshot / name).is_file())
    elif not (snapshot / SINGLE_FILE).is_file():
        # The published repositories are sharded: without the index the shard list is unknown.
        missing.append(INDEX_FILE)
    return tuple(dict.fromkeys(missing))  # each once, in the order found


def _header_problem(snapshot: Path) -> str | None:
    """The engine's own check of the shard headers against the layout: truncation, missing tensors."""
    from engine import open_checkpoint, verify_layout
    from engine.errors import CheckpointError

    try:
        verify_layout(open_checkpoint(snapshot))
    except CheckpointError as exc:
        return f"Incomplete or damaged: {exc}"
    return None


def _damaged(cache_dir: Path, warning: str) -> list[CachedCheckpoint]:
    """Entries for a VoiceChat repository the scan rejected (``warning`` names its folder)."""
    entries: list[CachedCheckpoint] = []
    for repo_path in sorted(cache_dir.resolve().glob("models--*")):  # the scan names resolved paths
        if NAME_MARK not in repo_path.name.lower() or str(repo_path) not in warning:
            continue
        repo_id = repo_path.name.removeprefix("models--").replace("--", "/")
        snapshots = repo_path / "snapshots"
        for snapshot in sorted(snapshots.iterdir()) if snapshots.is_dir() else []:
            if not snapshot.is_dir():
                continue
            size = sum(path.stat().st_size for path in snapshot.rglob("*") if path.is_file())
            entry = _describe(repo_id, snapshot.name, (), snapshot)
            if entry is not None:
                entries.append(_with_size(entry, size))
        log.warning("Hugging Face cache entry %s is damaged: %s", repo_path, warning)
    return entries
