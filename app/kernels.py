"""Parley's GPU kernel cache: a per-user folder that MLX compiles into, seeded from kernels shipped with Parley.

A fresh CUDA machine otherwise spends minutes compiling kernels before its first frame, and MLX's
default folder for them lives under the temporary directory, which reboots empty (engine.kernel_cache).
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine.kernel_cache import seed_kernel_cache, use_kernel_cache

from .paths import kernel_cache_dir, shipped_kernels_dir

log = logging.getLogger(__name__)


def cuda_architecture() -> str | None:
    """The CUDA GPU's architecture (``sm_90``) when MLX computes on one, else None. Compiles nothing."""
    import mlx.core as mx

    if mx.default_device().type != mx.gpu or not mx.cuda.is_available():
        return None
    architecture = mx.device_info().get("architecture")
    return str(architecture) if architecture else None


def prepare_kernel_cache(mlx_version: str, architecture: str | None) -> Path | None:
    """On a CUDA GPU (``architecture`` given), make the per-user folder MLX's kernel cache, unless one is set
    already, and add the shipped kernels for this MLX version and architecture that it lacks; returns the
    folder in effect (None elsewhere: only CUDA compiles kernels at run time). Call before the first load."""
    if architecture is None:
        return None
    try:
        folder = use_kernel_cache(kernel_cache_dir(mlx_version))
    except OSError as exc:  # an unwritable cache folder: MLX keeps its own (under the temporary directory)
        log.warning("GPU kernels are not kept between launches: %s", exc)
        return None
    shipped = shipped_kernels_dir()
    archives = sorted(shipped.glob("*.tar.gz")) if shipped.is_dir() else []
    added = seed_kernel_cache(folder, archives, mlx_version=mlx_version, architecture=architecture)
    log.info("GPU kernels cached in %s (%d files added from the kernels shipped for %s)", folder, added, architecture)
    return folder


def prepare_this_device() -> Path | None:
    """:func:`prepare_kernel_cache` for the device MLX computes on."""
    import mlx.core as mx

    return prepare_kernel_cache(str(getattr(mx, "__version__", "unknown")), cuda_architecture())
