"""Every file Parley writes gets the same permissions: what the user's umask allows (usually 0644).

``engine.files.write_atomic`` writes through ``tempfile.mkstemp``, whose files are private
(0600), while the WAVs libsndfile writes follow the umask: exported profiles, transcripts,
settings and WAVs must not differ. No Qt, no MLX.
"""

from __future__ import annotations

import os
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


def apply_file_mode(path: Path) -> Path:
    """Give ``path`` :data:`FILE_MODE`; returns it."""
    os.chmod(path, FILE_MODE)
    return path


def write_text_file(path: Path, text: str) -> Path:
    """Write ``text`` atomically (temporary file, then rename) with :data:`FILE_MODE`; returns the path."""
    written = write_atomic(path, text)
    return apply_file_mode(written)
