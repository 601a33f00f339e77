"""Where MLX keeps the GPU kernels it compiles, and how a shipped set of them seeds that place.

On CUDA, MLX compiles each kernel with NVRTC the first time a process needs it (seconds each, about a
hundred for Parley's model: minutes before a fresh machine's first frame) and caches the
result as files in ``MLX_PTX_CACHE_DIR``, by default a folder under the temporary directory, which a
reboot or a temp cleaner empties. Parley points it at a per-user cache folder instead
(:func:`use_kernel_cache`), so only the first launch on a machine compiles, and it can seed that
folder from an archive of kernels compiled elsewhere for the same MLX version and GPU architecture
(:func:`seed_kernel_cache`; :func:`pack_kernel_cache` makes one), so that not even the first does.

A kernel's cache name is MLX's name for it, which for Parley's own kernels ends in a hash of their
source (:func:`engine.kernels.admission.custom_kernel`), so a cached file never stands for another source.
Only file names are taken from an archive, never its paths, and existing files are kept.
No MLX import here: the setting must be in place before MLX's first compile.
"""

from __future__ import annotations

import logging
import os
import re
import tarfile
from collections.abc import Iterable
from pathlib import Path

KERNEL_CACHE_SETTING = "MLX_PTX_CACHE_DIR"
# The top folder of an archive's members: what MLX's own cache folder is called.
ARCHIVE_FOLDER = "ptx"
# A file MLX writes there: a kernel's source (.cu), its PTX, its kernel names (.txt), a cubin; nothing else is taken.
_KERNEL_FILE = re.compile(r"^[\w.+-]+\.(cu|ptx|txt|cubin)$")

log = logging.getLogger(__name__)


def archive_name(mlx_version: str, architecture: str) -> str:
    """The file name of an archive of kernels for ``mlx_version`` on ``architecture`` (``sm_90``)."""
    return f"mlx-{mlx_version}-{architecture}.tar.gz"


def use_kernel_cache(folder: Path) -> Path:
    """Make ``folder`` MLX's kernel cache unless :data:`KERNEL_CACHE_SETTING` already names one (a user's or a
    benchmark's own choice wins); returns the folder in effect. MLX reads the setting once, the first time it
    looks for its cache, which may be as early as its device's start: call this before anything asks MLX for a
    device (on a GPU measured so: set after the device was queried, it was not used)."""
    chosen = os.environ.get(KERNEL_CACHE_SETTING)
    if chosen:
        return Path(chosen)
    os.environ[KERNEL_CACHE_SETTING] = str(folder)
    return folder


def seed_kernel_cache(cache: Path, archives: Iterable[Path], *, mlx_version: str, architecture: str) -> int:
    """Copy into ``cache`` the kernels of the archive among ``archives`` made for ``mlx_version`` on
    ``architecture`` (by its name, :func:`archive_name`) that ``cache`` lacks; returns how many files (a kernel
    has several: source, PTX, names) were added. A
    damaged archive adds what it can and is logged, never raised: compiling is the fallback."""
    wanted = archive_name(mlx_version, architecture)
    archive = next((path for path in archives if path.name == wanted and path.is_file()), None)
    if archive is None:
        return 0
    cache.mkdir(parents=True, exist_ok=True)
    added = 0
    try:
        with tarfile.open(archive, "r:gz") as bundle:
            for member in bundle:
                folder, _, name = member.name.rpartition("/")
                if not member.isfile() or folder.rpartition("/")[2] != ARCHIVE_FOLDER or not _KERNEL_FILE.match(name):
                    continue
                target = cache / name
                if target.exists():
                    continue
                source = bundle.extractfile(member)
                if source is None:
                    continue
                partial = target.with_name(f".{name}.partial")
                partial.write_bytes(source.read())
                partial.replace(target)  # whole or absent: MLX may read the folder from another process
                added += 1
    except (OSError, tarfile.TarError, EOFError) as exc:
        log.warning("the kernel archive %s could not be read whole (%s): %d files taken from it", archive, exc, added)
        return added
    log.info("kernel cache %s: %d files added from %s", cache, added, archive.name)
    return added


def pack_kernel_cache(cache: Path, out_folder: Path, *, mlx_version: str, architecture: str) -> Path:
    """Write the kernels in ``cache`` as an archive :func:`seed_kernel_cache` takes; returns its path."""
    out_folder.mkdir(parents=True, exist_ok=True)
    archive = out_folder / archive_name(mlx_version, architecture)
    with tarfile.open(archive, "w:gz") as bundle:
        for path in sorted(cache.iterdir()):
            if path.is_file() and _KERNEL_FILE.match(path.name):
                bundle.add(path, arcname=f"{ARCHIVE_FOLDER}/{path.name}")
    return archive


def cached_kernels(cache: Path, suffixes: frozenset[str] = frozenset({".ptx", ".cubin"})) -> int:
    """Kernels in ``cache`` and below: their files with one of ``suffixes`` (on CUDA a kernel's PTX or cubin; the
    CPU's fused kernels are ``.so`` files)."""
    if not cache.is_dir():
        return 0
    return sum(1 for path in cache.rglob("*") if path.suffix in suffixes)
