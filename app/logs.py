"""Logging to a rotating file in the platform's log folder (the menu's *Open log folder*)."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

from .paths import log_dir

LOG_FILE = "parley.log"


def configure_logging(folder: Path | None = None, *, level: int = logging.INFO) -> Path:
    """Send ``logging`` to ``<folder>/parley.log`` (1 MB × 5 rotated files); returns the file path.

    Falls back to stderr only when the folder cannot be created.
    """
    folder = log_dir() if folder is None else folder
    root = logging.getLogger()
    root.setLevel(level)
    path = folder / LOG_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=1 << 20, backupCount=5, encoding="utf-8"
        )
    except OSError:
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"))
    if not any(getattr(h, "baseFilename", None) == str(path) for h in root.handlers):
        root.addHandler(handler)
    return path
