"""Where Parley finds its resources and keeps its files, the same way from source and from a bundle."""

from __future__ import annotations

import sys
from pathlib import Path

import platformdirs

APP_NAME = "Parley"


def is_frozen() -> bool:
    """True inside a PyInstaller bundle."""
    return bool(getattr(sys, "frozen", False))


def resource_path(*parts: str) -> Path:
    """A file under ``assets/``: next to the sources in development, inside the bundle when frozen."""
    if is_frozen():
        root = Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent))
    else:
        root = Path(__file__).resolve().parent.parent
    return root.joinpath("assets", *parts)


def data_dir() -> Path:
    """Per-user data (downloaded and generated checkpoints)."""
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def log_dir() -> Path:
    return Path(platformdirs.user_log_dir(APP_NAME, appauthor=False))


def demo_checkpoint_dir() -> Path:
    return data_dir() / "demo-checkpoint"
