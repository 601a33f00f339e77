"""Where a download's files go: Parley's own folder, or the Hugging Face cache's layout that other tools read.

:mod:`app.download` fetches, resumes and checks the bytes; a layout only says where each stage of a file lives.

``ParleyFolder`` (``<target>/``)
    The checkpoint's files under their own names; the manifest, the lock and part files in
    ``<target>/.parley-download/``. A file takes its name only once it checks out.

``HubCache`` (``<cache>/models--<org>--<name>/``, as ``huggingface_hub`` writes it)
    ``blobs/<sha256 or git blob id>`` holds each file's content; ``snapshots/<commit>/<name>`` is a relative link
    to ``../../blobs/<id>``; ``refs/main`` holds the commit. A file is fetched into ``blobs/<id>.incomplete`` (the
    name huggingface_hub gives a blob being downloaded, and ``scan_cache_dir`` reports as an incomplete file) and
    gets its snapshot link only once it checks out, so a snapshot never links to a partial file. ``refs/main`` is
    written last. While a blob is fetched, the lock huggingface_hub takes for it (``.locks/models--…/<id>.lock``)
    is held, so ``hf download`` of the same model waits rather than fetching it twice, and Parley waits for it
    likewise. The manifest and lock sit in ``models--…/.parley-download/``, which ``scan_cache_dir`` does not
    look at and ``hf cache rm`` removes with the repository. mlx-vlm, mlx-audio, ``hf download`` and
    :mod:`app.hf_cache` all find the result.

No Qt, no network.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from .download_listing import STATE_DIR, DownloadError, RemoteFile

log = logging.getLogger(__name__)

HUB_CACHE: Final = "hf-cache"
PARLEY_FOLDER: Final = "parley"
DOWNLOAD_LAYOUTS: Final = (HUB_CACHE, PARLEY_FOLDER)  # the first is the default (see README "Getting the model")

MANIFEST_VERSION: Final = 1
INCOMPLETE_SUFFIX: Final = ".incomplete"  # huggingface_hub's name for a blob being downloaded
_REPO_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class Manifest:
    """What was listed and which files are verified on disk: ``<state dir>/manifest.json``."""

    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]
    verified: dict[str, str] = field(default_factory=dict)  # path -> content id of the checked copy

    @staticmethod
    def path_in(state_dir: Path) -> Path:
        return state_dir / "manifest.json"

    @classmethod
    def load(cls, state_dir: Path) -> Manifest | None:
        try:
            data = json.loads(cls.path_in(state_dir).read_text(encoding="utf-8"))
            if data.get("version") != MANIFEST_VERSION:
                return None
            return cls(
                repo_id=str(data["repo_id"]),
                commit=str(data["commit"]),
                files=tuple(RemoteFile.from_json(item) for item in data["files"]),
                verified={str(k): str(v) for k, v in data["verified"].items()},
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, DownloadError) as exc:
            log.warning("Ignoring unreadable download manifest in %s: %s", state_dir, exc)
            return None

    def save(self, state_dir: Path) -> None:
        """Write atomically, so a crash never leaves a half-written manifest."""
        data = {
            "version": MANIFEST_VERSION,
            "repo_id": self.repo_id,
            "commit": self.commit,
            "files": [remote.to_json() for remote in self.files],
            "verified": self.verified,
        }
        _write_atomically(self.path_in(state_dir), json.dumps(data, indent=1))


class Layout(Protocol):
    """Where one download's files live, stage by stage."""

    @property
    def state_dir(self) -> Path: ...  # manifest and lock; its disk is the one checked for space

    def checkpoint_dir(self, commit: str) -> Path: ...  # the folder to load: every file under its own name

    def part_path(self, remote: RemoteFile) -> Path: ...  # where the bytes arrive, resumable

    def stored_path(self, remote: RemoteFile) -> Path: ...  # where the checked content lives

    def link(self, remote: RemoteFile, commit: str) -> None: ...  # make the stored content visible by its name

    def stale_parts(self, wanted: set[Path]) -> list[Path]: ...  # part files nothing listed can resume

    def lock_path(self, remote: RemoteFile) -> Path | None: ...  # a lock other programs take for this file

    def publish(self, commit: str) -> None: ...  # the download is complete and checked


@dataclass(frozen=True)
class ParleyFolder:
    target: Path

    @property
    def state_dir(self) -> Path:
        return self.target / STATE_DIR

    def checkpoint_dir(self, commit: str) -> Path:
        return self.target

    def part_path(self, remote: RemoteFile) -> Path:
        return self.state_dir / "parts" / f"{remote.content_id}.part"

    def stored_path(self, remote: RemoteFile) -> Path:
        return self.target / remote.path

    def link(self, remote: RemoteFile, commit: str) -> None:
        pass  # the stored file already has its name

    def stale_parts(self, wanted: set[Path]) -> list[Path]:
        parts = self.state_dir / "parts"
        return [path for path in parts.iterdir() if path not in wanted] if parts.is_dir() else []

    def lock_path(self, remote: RemoteFile) -> Path | None:
        return None  # the folder's own lock (in the state folder) is the only one

    def publish(self, commit: str) -> None:
        pass


@dataclass(frozen=True)
class HubCache:
    cache_dir: Path
    repo_id: str

    def __post_init__(self) -> None:
        if not _REPO_ID.fullmatch(self.repo_id) or ".." in self.repo_id or "--" in self.repo_id:
            raise DownloadError(f"{self.repo_id!r} is not a repository name the Hugging Face cache can hold.")

    @property
    def repo_dir(self) -> Path:
        return self.cache_dir / f"models--{self.repo_id.replace('/', '--')}"

    @property
    def state_dir(self) -> Path:
        return self.repo_dir / STATE_DIR

    def checkpoint_dir(self, commit: str) -> Path:
        return self.repo_dir / "snapshots" / commit

    def part_path(self, remote: RemoteFile) -> Path:
        return self.repo_dir / "blobs" / f"{remote.content_id}{INCOMPLETE_SUFFIX}"

    def stored_path(self, remote: RemoteFile) -> Path:
        return self.repo_dir / "blobs" / remote.content_id

    def link(self, remote: RemoteFile, commit: str) -> None:
        """``snapshots/<commit>/<name>`` -> ``../../blobs/<id>`` (relative, so a moved cache still works)."""
        link = self.checkpoint_dir(commit) / remote.path
        link.parent.mkdir(parents=True, exist_ok=True)
        relative = os.path.relpath(self.stored_path(remote), link.parent)
        if link.is_symlink() and os.readlink(link) == relative:
            return
        staged = link.with_name(f".{link.name}.parley-link")
        staged.unlink(missing_ok=True)
        staged.symlink_to(relative)
        os.replace(staged, link)  # a link, or an older file in its place, is swapped in one step

    def stale_parts(self, wanted: set[Path]) -> list[Path]:
        return []  # another tool's ``.incomplete`` blobs are its own: never deleted here

    def lock_path(self, remote: RemoteFile) -> Path | None:
        """``<cache>/.locks/models--…/<id>.lock``: the lock ``hf_hub_download`` holds while it writes that blob."""
        return self.cache_dir / ".locks" / self.repo_dir.name / f"{remote.content_id}.lock"

    def publish(self, commit: str) -> None:
        refs = self.repo_dir / "refs"
        refs.mkdir(parents=True, exist_ok=True)
        _write_atomically(refs / "main", commit)  # no newline, as huggingface_hub writes it


def unfinished_files(snapshot: Path) -> tuple[str, ...]:
    """The files a Parley download into the Hugging Face cache listed for ``snapshot`` that it does not hold yet.

    Empty when no Parley download record names this revision (another tool's snapshot) or nothing is missing.
    """
    repo_dir = snapshot.parent.parent
    manifest = Manifest.load(repo_dir / STATE_DIR)
    if manifest is None or manifest.commit != snapshot.name:
        return ()
    return tuple(remote.path for remote in manifest.files if not (snapshot / remote.path).is_file())


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
