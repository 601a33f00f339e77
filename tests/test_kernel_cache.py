"""The GPU kernel cache: MLX pointed at a per-user folder, seeded from shipped kernels (engine.kernel_cache,
app.kernels). No GPU here: the folder and archive handling is what is tested; the device harness measures what
seeding saves a fresh machine (tests/device)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from app import kernels, paths
from engine.kernel_cache import (
    KERNEL_CACHE_SETTING,
    archive_name,
    cached_kernels,
    pack_kernel_cache,
    seed_kernel_cache,
    use_kernel_cache,
)

VERSION, ARCH = "0.32.4", "sm_90"


def _kernel_files(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        for suffix in (".cu", ".ptx", ".txt"):
            (folder / f"{name}{suffix}").write_text(f"{name}{suffix} contents")


def test_a_packed_cache_seeds_an_empty_one_and_keeps_what_is_there(tmp_path: Path) -> None:
    built = tmp_path / "built"
    _kernel_files(built, ["parley_quantized_row_4bit_0123456789ab", "gather_uint32_uint32_1"])
    (built / "notes.md").write_text("not a kernel")
    archive = pack_kernel_cache(built, tmp_path / "shipped", mlx_version=VERSION, architecture=ARCH)
    assert archive.name == archive_name(VERSION, ARCH) == "mlx-0.32.4-sm_90.tar.gz"

    cache = tmp_path / "cache"
    _kernel_files(cache, ["gather_uint32_uint32_1"])
    (cache / "gather_uint32_uint32_1.ptx").write_text("compiled here")
    added = seed_kernel_cache(cache, [archive], mlx_version=VERSION, architecture=ARCH)
    assert added == 3  # the quantized row's three files; the gather's were there
    assert (cache / "gather_uint32_uint32_1.ptx").read_text() == "compiled here"
    assert (cache / "parley_quantized_row_4bit_0123456789ab.ptx").read_text().endswith(".ptx contents")
    assert not (cache / "notes.md").exists() and cached_kernels(cache) == 2
    assert not list(cache.glob(".*partial"))
    assert seed_kernel_cache(cache, [archive], mlx_version=VERSION, architecture=ARCH) == 0


def test_an_archive_for_another_version_or_architecture_is_not_taken(tmp_path: Path) -> None:
    built = tmp_path / "built"
    _kernel_files(built, ["k"])
    archive = pack_kernel_cache(built, tmp_path / "shipped", mlx_version=VERSION, architecture="sm_80")
    cache = tmp_path / "cache"
    assert seed_kernel_cache(cache, [archive], mlx_version=VERSION, architecture=ARCH) == 0
    assert seed_kernel_cache(cache, [archive], mlx_version="0.33.0", architecture="sm_80") == 0
    assert cached_kernels(cache) == 0


def _archive_with(tmp_path: Path, members: dict[str, bytes]) -> Path:
    archive = tmp_path / archive_name(VERSION, ARCH)
    with tarfile.open(archive, "w:gz") as bundle:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data))
    return archive


def test_only_kernel_files_of_the_archive_s_ptx_folder_are_taken(tmp_path: Path) -> None:
    archive = _archive_with(
        tmp_path,
        {
            "ptx/ok.ptx": b"kept",
            "ptx/../../escape.ptx": b"no",
            "/ptx/absolute.so": b"no",
            "other/k.ptx": b"no",
            "ptx/script.sh": b"no",
        },
    )
    cache = tmp_path / "deep" / "cache"
    assert seed_kernel_cache(cache, [archive], mlx_version=VERSION, architecture=ARCH) == 1
    assert sorted(path.name for path in cache.iterdir()) == ["ok.ptx"]
    assert not (tmp_path / "escape.ptx").exists() and not (tmp_path / "deep" / "escape.ptx").exists()


def test_a_damaged_archive_adds_what_it_can_and_raises_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = _archive_with(tmp_path, {f"ptx/k{i}.ptx": os.urandom(4096) for i in range(8)})
    damaged = good.read_bytes()[: len(good.read_bytes()) // 2]
    good.write_bytes(damaged)
    cache = tmp_path / "cache"
    added = seed_kernel_cache(cache, [good], mlx_version=VERSION, architecture=ARCH)
    assert added < 8 and cached_kernels(cache) == added
    assert "could not be read whole" in caplog.text


def test_the_setting_already_made_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KERNEL_CACHE_SETTING, str(tmp_path / "chosen"))
    assert use_kernel_cache(tmp_path / "default") == tmp_path / "chosen"
    assert not (tmp_path / "default").exists()
    monkeypatch.delenv(KERNEL_CACHE_SETTING)
    assert use_kernel_cache(tmp_path / "default") == tmp_path / "default"
    assert os.environ[KERNEL_CACHE_SETTING] == str(tmp_path / "default")
    assert not (tmp_path / "default").exists()  # only a setting: MLX makes the folder when it compiles


def test_parley_keeps_kernels_in_the_user_cache_seeded_from_its_shipped_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KERNEL_CACHE_SETTING, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    shipped = tmp_path / "assets-kernels"
    built = tmp_path / "built"
    _kernel_files(built, ["a", "b"])
    pack_kernel_cache(built, shipped, mlx_version=VERSION, architecture=ARCH)
    monkeypatch.setattr(kernels, "shipped_kernels_dir", lambda: shipped)

    folder = paths.kernel_cache_dir(VERSION)
    assert folder == tmp_path / "xdg-cache" / "Parley" / "kernels" / "mlx-0.32.4"
    # No CUDA GPU: the setting is made (the CPU and Metal never read it), nothing is seeded or created.
    assert kernels.prepare_kernel_cache(VERSION, None) is None
    assert os.environ[KERNEL_CACHE_SETTING] == str(folder) and not folder.exists()
    assert kernels.prepare_kernel_cache(VERSION, ARCH) == folder
    assert cached_kernels(folder) == 2


def test_the_entry_points_point_mlx_at_the_cache_before_asking_for_a_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLX fixes its kernel folder the first time it looks for it, which may be when its device starts: on an H100
    a cache set after the device was queried was never read (every kernel compiled again). So the setting comes
    before the first device query, in the CLI and the GUI alike."""
    monkeypatch.delenv(KERNEL_CACHE_SETTING, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    order: list[str] = []

    def architecture() -> None:
        order.append(f"device asked with the setting {os.environ.get(KERNEL_CACHE_SETTING)}")

    monkeypatch.setattr(kernels, "cuda_architecture", architecture)
    kernels.prepare_this_device()
    assert order == [f"device asked with the setting {paths.kernel_cache_dir(kernels.mlx_version())}"]


def test_an_unwritable_cache_folder_is_logged_and_seeds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(KERNEL_CACHE_SETTING, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would go")
    shipped = tmp_path / "shipped"
    _kernel_files(tmp_path / "built", ["a"])
    pack_kernel_cache(tmp_path / "built", shipped, mlx_version=VERSION, architecture=ARCH)
    monkeypatch.setattr(kernels, "shipped_kernels_dir", lambda: shipped)
    monkeypatch.setattr(kernels, "kernel_cache_dir", lambda version: blocker / "kernels")
    assert kernels.prepare_kernel_cache(VERSION, ARCH) is None
    assert "not kept between launches" in caplog.text
