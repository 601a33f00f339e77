"""Parley's GPU kernel cache: a per-user folder that MLX compiles into, seeded from kernels shipped with Parley.

A fresh CUDA machine otherwise spends minutes compiling kernels before its first frame, and MLX's
default folder for them lives under the temporary directory, which reboots empty (engine.kernel_cache).
MLX fixes its folder the first time it looks for it, so the entry points point it here before anything
asks MLX for a device (:func:`point_kernel_cache`); the worker then seeds it (:func:`prepare_this_device`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine import seed_kernel_cache, use_kernel_cache

from .paths import kernel_cache_dir, shipped_kernels_dir

log = logging.getLogger(__name__)


def mlx_version() -> str:
    """MLX's version from its package metadata, without starting its device (else from the module)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlx")
    except PackageNotFoundError:  # a bundle may carry no metadata
        import mlx.core as mx

        return str(getattr(mx, "__version__", "unknown"))


def cuda_architecture() -> str | None:
    """The CUDA GPU's architecture (``sm_90``) when MLX computes on one, else None. Compiles nothing."""
    import mlx.core as mx

    if mx.default_device().type != mx.gpu or not mx.cuda.is_available():
        return None
    architecture = mx.device_info().get("architecture")
    return str(architecture) if architecture else None


def point_kernel_cache(version: str | None = None) -> Path:
    """Make the per-user folder MLX's kernel cache for MLX ``version`` (this one's by default), unless one is set
    already; returns the folder in effect. Only a setting: nothing is created (MLX makes the folder when it
    compiles, and other backends never read it). Call before anything asks MLX for a device."""
    return use_kernel_cache(kernel_cache_dir(version or mlx_version()))


def prepare_kernel_cache(version: str, architecture: str | None) -> Path | None:
    """:func:`point_kernel_cache`, then :func:`seed_shipped_kernels`."""
    return seed_shipped_kernels(point_kernel_cache(version), version, architecture)


def seed_shipped_kernels(folder: Path, version: str, architecture: str | None) -> Path | None:
    """On a CUDA GPU (``architecture`` given), add to ``folder`` the shipped kernels for this MLX version and
    architecture that it lacks; returns the folder (None where kernels are not kept: no CUDA GPU, or a folder that
    cannot be written, where MLX keeps its own)."""
    if architecture is None:
        return None
    shipped = shipped_kernels_dir()
    archives = sorted(shipped.glob("*.tar.gz")) if shipped.is_dir() else []
    try:
        added = seed_kernel_cache(folder, archives, mlx_version=version, architecture=architecture)
    except OSError as exc:
        log.warning("GPU kernels are not kept between launches: %s", exc)
        return None
    log.info("GPU kernels cached in %s (%d files added from the kernels shipped for %s)", folder, added, architecture)
    return folder


def prepare_this_device() -> Path | None:
    """:func:`prepare_kernel_cache` for the device MLX computes on: the setting made before the device is asked."""
    version = mlx_version()
    folder = point_kernel_cache(version)
    return seed_shipped_kernels(folder, version, cuda_architecture())
