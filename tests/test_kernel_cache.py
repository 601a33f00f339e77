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
    assert os.environ[KERNEL_CACHE_SETTING] == str(tmp_path / "default") and (tmp_path / "default").is_dir()


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

    assert kernels.prepare_kernel_cache(VERSION, None) is None  # the CPU and Metal compile nothing at run time
    assert KERNEL_CACHE_SETTING not in os.environ
    folder = kernels.prepare_kernel_cache(VERSION, ARCH)
    assert folder == paths.kernel_cache_dir(VERSION) == tmp_path / "xdg-cache" / "Parley" / "kernels" / "mlx-0.32.4"
    assert os.environ[KERNEL_CACHE_SETTING] == str(folder) and cached_kernels(folder) == 2


def test_an_unwritable_cache_folder_leaves_mlx_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KERNEL_CACHE_SETTING, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setattr(kernels, "kernel_cache_dir", lambda version: blocker / "kernels")
    assert kernels.prepare_kernel_cache(VERSION, ARCH) is None
    assert KERNEL_CACHE_SETTING not in os.environ
