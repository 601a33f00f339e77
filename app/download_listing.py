"""What the Hub lists for a repository, checked before any of it names something on disk.

A hostile or intercepted endpoint (``HF_ENDPOINT``, a mirror, a proxy) controls every string of the
listing, and :mod:`app.download` builds paths from them: a file's name under the target folder and a
part file named by its checksum under the state folder. So each listed file is checked here first:
its name stays inside the target (relative, ``/``-separated, no ``..``, NUL or backslash, not the
state folder under any capitalisation, no two names that differ only in case), its size is a byte
count, its checksums are hex of their exact length (sha256: 64, git blob id: 40), and it has one,
or it could not be checked at all. The download record read back from disk is checked the same way.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any, Final

STATE_DIR: Final = ".parley-download"  # inside the target folder: manifest, lock, part files
REQUIRED_FILES: Final = ("config.json", "model.safetensors.index.json")


class DownloadError(RuntimeError):
    """The download failed; the message says why in plain words. Downloaded data is kept."""


class DownloadCancelled(DownloadError):
    """The download was cancelled; downloaded data is kept and a new call resumes."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of the repository as the Hub lists it."""

    path: str  # relative, '/'-separated
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # the git object id (sha1 of "blob <size>\0" + content)

    @property
    def content_id(self) -> str:
        """Names this exact content (and its part file): a checked hex checksum, so it is always a safe file name."""
        return self.sha256 or self.blob_id or ""  # checked_file refuses a file with neither

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "blob_id": self.blob_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RemoteFile:
        """Read back a manifest entry, checked like a listing (raises ``DownloadError``)."""
        return checked_file("the download record", data["path"], data["size"], data.get("sha256"), data.get("blob_id"))


@dataclass(frozen=True)
class Listing:
    commit: str
    files: tuple[RemoteFile, ...]


def listing_from_info(repo_id: str, info: Any) -> Listing:
    """Turn ``HfApi.model_info(files_metadata=True)`` into a checked file list."""
    if not info.sha or info.siblings is None:
        raise DownloadError(f"Hugging Face sent an unexpected answer for {repo_id} (no commit or file list).")
    if not _is_hex(info.sha, 40):
        raise DownloadError(f"Hugging Face sent an unexpected answer for {repo_id} (commit {info.sha!r}).")
    files: list[RemoteFile] = []
    for sibling in info.siblings:
        lfs = sibling.lfs
        files.append(
            checked_file(repo_id, sibling.rfilename, sibling.size, lfs.sha256 if lfs else None, sibling.blob_id)
        )
    names = {remote.path for remote in files}
    folded = sorted(name.casefold() for name in names)
    if len(set(folded)) != len(folded):  # two names for one file on a case-insensitive volume (macOS, Windows)
        same = next(name for name in folded if folded.count(name) > 1)
        raise DownloadError(f"{repo_id} lists two files whose names differ only in case ({same!r}); refusing it.")
    missing = [name for name in REQUIRED_FILES if name not in names]
    if missing:
        raise DownloadError(
            f"{repo_id} does not look like an MLX checkpoint: it has no {' or '.join(missing)}. Nothing was downloaded."
        )
    return Listing(info.sha, tuple(files))


def checked_file(source: str, path: Any, size: Any, sha256: Any, blob_id: Any) -> RemoteFile:
    """One listed file, every field checked before any of it names something on disk.

    The name must stay inside the target folder (relative, ``/``-separated, no ``..``, no NUL or backslash, not
    the state folder under any capitalisation); the checksums name part files, so each must be hex of its exact
    length, and a file must have one, or it could not be checked at all. ``source`` names where the entry came
    from (the repository, or the download record) for the message.
    """
    if not is_safe_repo_path(path):
        raise DownloadError(f"{source} lists a file with an unsafe name ({path!r}); refusing to download it.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise DownloadError(f"Hugging Face did not say how large {path} in {source} is (size {size!r}).")
    for value, length, what in ((sha256, 64, "sha256 checksum"), (blob_id, 40, "git blob id")):
        if value is not None and not _is_hex(value, length):
            raise DownloadError(
                f"{source} lists {path} with a malformed {what} ({str(value)[:80]!r}, expected {length} hex "
                "digits); refusing to download it."
            )
    if not sha256 and not blob_id:
        raise DownloadError(f"{source} lists {path} without a checksum, so it could not be checked; refusing it.")
    return RemoteFile(path, size, sha256.lower() if sha256 else None, blob_id.lower() if blob_id else None)


def _is_hex(value: Any, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and all(char in string.hexdigits for char in value)


def is_safe_repo_path(path: Any) -> bool:
    if not isinstance(path, str) or not path or "\\" in path or "\0" in path or path.startswith("/"):
        return False
    parts = path.split("/")
    return all(part not in ("", ".", "..") for part in parts) and parts[0].casefold() != STATE_DIR.casefold()
