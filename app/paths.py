"""Where Parley finds its resources and keeps its files, the same way from source and from a bundle.

One home for every location (the README's "Files: where things live" lists the same):
settings in :func:`config_dir`, downloaded and generated checkpoints under :func:`data_dir`,
the rotating log and the crash log in :func:`log_dir`, compiled GPU kernels in :func:`kernel_cache_dir`.
"""

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


def config_dir() -> Path:
    """Per-user settings (``~/.config/Parley``, ``~/Library/Application Support/Parley``)."""
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    """Per-user data (downloaded and generated checkpoints): ``~/.local/share/Parley``."""
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    """Where downloaded checkpoints go unless the user picks another folder."""
    return data_dir() / "models"


def log_dir() -> Path:
    """The rotating log and the crash log (``~/.local/state/Parley/log``, ``~/Library/Logs/Parley``)."""
    return Path(platformdirs.user_log_dir(APP_NAME, appauthor=False))


def kernel_cache_dir(mlx_version: str) -> Path:
    """The GPU kernels MLX compiles, kept across launches and reboots (engine.kernel_cache), per MLX version:
    ``~/.cache/Parley/kernels/mlx-<version>``, ``~/Library/Caches/Parley/kernels/…``."""
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)) / "kernels" / f"mlx-{mlx_version}"


def shipped_kernels_dir() -> Path:
    """Archives of kernels compiled ahead of time, one per MLX version and GPU architecture (may be empty)."""
    return resource_path("kernels")


def demo_checkpoint_dir() -> Path:
    return data_dir() / "demo-checkpoint"
