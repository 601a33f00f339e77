"""The permissions of the files Parley writes: private for what holds the user's voice, words or logs.

Conversations (the history, Save Conversation, History → Export), exported profiles, the logs and
the settings are private to the user: files 0600 and their folders 0700, whatever the umask
(:func:`make_private`). Checkpoints and what ``parley run`` writes where it is told follow the
umask (:data:`FILE_MODE`, usually 0644), as any command-line tool's output does.
``engine.files.write_atomic`` writes through ``tempfile.mkstemp``, whose files are 0600, while
libsndfile's WAVs follow the umask, so every writer sets the mode it means explicitly. No Qt, no MLX.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from engine import write_atomic


def _read_umask() -> int:
    # os.umask can only be read by setting it; this runs once, at import, before any thread writes files.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()
FILE_MODE = 0o666 & ~UMASK
"""The mode of every file Parley writes (0644 under the usual umask 022)."""


def aside_path(path: Path) -> Path:
    """Where a damaged file is kept aside: ``<name>.corrupt``, or ``<name>.corrupt-<time>`` when that is taken, so
    that a file kept aside is never replaced."""
    aside = path.with_name(path.name + ".corrupt")
    if aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}")
    return aside


def move_aside(path: Path) -> tuple[Path | None, str]:
    """Move a damaged file to :func:`aside_path`, so that nothing the user had is lost; returns where it went (None
    where it could not be moved) and what to tell the user: "it was kept as …" or "it could not be moved aside (…)"."""
    aside = aside_path(path)
    try:
        os.replace(path, aside)
    except OSError as exc:
        return None, f"it could not be moved aside ({exc})"
    return aside, f"it was kept as {aside}"


def apply_file_mode(path: Path) -> Path:
    """Give ``path`` :data:`FILE_MODE`; returns it."""
    os.chmod(path, FILE_MODE)
    return path


def write_text_file(path: Path, text: str) -> Path:
    """Write ``text`` atomically (temporary file, then rename) with :data:`FILE_MODE`; returns the path."""
    written = write_atomic(path, text)
    return apply_file_mode(written)


PRIVATE_FILE_MODE = 0o600
"""Files that hold what the user said or what the app logged about it: recordings, transcripts, profiles, logs."""
PRIVATE_DIR_MODE = 0o700
"""Folders that hold such files (the history and each conversation in it, the log folder)."""


def make_private(path: Path) -> Path:
    """Give ``path`` (a file or a folder) its private mode, whatever the umask; returns it. Links are left alone."""
    if not path.is_symlink():
        os.chmod(path, PRIVATE_DIR_MODE if path.is_dir() else PRIVATE_FILE_MODE)
    return path


def make_private_folder(path: Path) -> Path:
    """Create ``path`` (and its parents) if needed and make it private; returns it."""
    path.mkdir(parents=True, exist_ok=True)
    return make_private(path)


def write_private_text_file(path: Path, text: str) -> Path:
    """Write ``text`` atomically, private to the user from its first byte (``mkstemp`` makes 0600); returns it."""
    return make_private(write_atomic(path, text))
