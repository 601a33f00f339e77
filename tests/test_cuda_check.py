"""``make run``'s CUDA check against recorded ``nvidia-smi`` answers (no GPU needed): which MLX build it installs,
and the one line saying why."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from app.cuda_check import QUERY, CudaVerdict, check, device_note, parse_query

if TYPE_CHECKING:
    from app.controller import AppController

ROOT = Path(__file__).resolve().parents[1]

# nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader, as machines answer it.
H100_580 = "NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n"
A100_535 = "NVIDIA A100-SXM4-80GB, 535.183.01, 8.0\n"
TWO_H200 = "NVIDIA H200, 580.95.05, 9.0\nNVIDIA H200, 580.95.05, 9.0\n"
V100_580 = "Tesla V100-SXM2-16GB, 580.65.06, 7.0\n"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
    "NVIDIA driver is installed and running.\n"
)


def answering(code: int, out: str = "", err: str = "") -> tuple[list[Sequence[str]], object]:
    calls: list[Sequence[str]] = []

    def run(command: Sequence[str]) -> tuple[int, str, str]:
        calls.append(command)
        return code, out, err

    return calls, run


def linux(code: int, out: str = "", err: str = "") -> CudaVerdict:
    calls, run = answering(code, out, err)
    verdict = check(system="Linux", run=run, environ={})  # type: ignore[arg-type]
    assert calls == [QUERY]
    return verdict


def test_h100_with_driver_580_gets_the_cuda_build() -> None:
    verdict = linux(0, H100_580)
    assert verdict.usable and verdict.pip_target == ".[cuda]"
    assert verdict.reason == "NVIDIA H100 80GB HBM3 (driver 580.65.06, compute 9.0): using MLX built for CUDA 13."


def test_a_driver_older_than_580_stays_on_the_cpu_and_says_so() -> None:
    verdict = linux(0, A100_535)
    assert not verdict.usable and verdict.pip_target == "."
    assert verdict.reason.startswith("The NVIDIA driver 535.183.01 is too old for CUDA 13 (needs 580 or newer)")


def test_two_gpus_use_the_first_and_count_the_other() -> None:
    verdict = linux(0, TWO_H200)
    assert verdict.usable and len(verdict.gpus) == 2
    assert verdict.reason == (
        "NVIDIA H200 (driver 580.95.05, compute 9.0) (and 1 more GPU; MLX uses one): using MLX built for CUDA 13."
    )


def test_a_gpu_older_than_turing_stays_on_the_cpu() -> None:
    verdict = linux(0, V100_580)
    assert not verdict.usable and "needs compute 7.5 or newer" in verdict.reason and "V100" in verdict.reason


@pytest.mark.parametrize("garbage", ["<html>502 Bad Gateway</html>\n", "NVIDIA H100, 580.65.06\n", "X, abc, 9.0\n"])
def test_garbage_output_stays_on_the_cpu(garbage: str) -> None:
    verdict = linux(0, garbage)
    assert not verdict.usable and verdict.reason.startswith("nvidia-smi's answer is unreadable (unexpected nvidia-smi")


def test_no_gpu_listed_stays_on_the_cpu() -> None:
    assert linux(0, "\n").reason == "nvidia-smi lists no NVIDIA GPU: staying on MLX's CPU build."


def test_a_failing_nvidia_smi_is_quoted() -> None:
    verdict = linux(9, "", NO_DRIVER)
    assert not verdict.usable
    assert verdict.reason == f"nvidia-smi failed (exit 9: {NO_DRIVER.strip()}): staying on MLX's CPU build."
    assert linux(6, "No devices were found\n").reason.startswith("nvidia-smi failed (exit 6: No devices were found)")


def test_missing_nvidia_smi_stays_on_the_cpu() -> None:
    def absent(command: Sequence[str]) -> tuple[int, str, str]:
        raise FileNotFoundError(command[0])

    verdict = check(system="Linux", run=absent, environ={})
    assert not verdict.usable
    assert verdict.reason == "No NVIDIA driver (nvidia-smi is not installed): staying on MLX's CPU build."


def test_macos_and_the_override_never_ask_nvidia_smi() -> None:
    calls, run = answering(0, H100_580)
    mac = check(system="Darwin", run=run, environ={})  # type: ignore[arg-type]
    assert not mac.usable and mac.reason.startswith("macOS: MLX runs on the Apple GPU through Metal")
    off = check(system="Linux", run=run, environ={"PARLEY_CUDA": "0"})  # type: ignore[arg-type]
    assert not off.usable and off.reason == "PARLEY_CUDA=0 is set: staying on MLX's CPU build."
    assert calls == []


def test_parse_query_reads_every_gpu() -> None:
    gpus = parse_query(TWO_H200)
    assert [(gpu.name, gpu.driver_branch, gpu.compute) for gpu in gpus] == [("NVIDIA H200", 580, (9, 0))] * 2


def _script(tmp_path: Path, smi: str | None) -> subprocess.CompletedProcess[str]:
    """``app/cuda_check.py --pip-target`` as make runs it, with no site packages (-S -I), and ``nvidia-smi`` on the
    PATH printing ``smi`` (or none at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\nprintf '%s' '{smi}'\n")
        fake.chmod(0o755)
    return subprocess.run(
        [sys.executable, "-S", "-I", str(ROOT / "app" / "cuda_check.py"), "--pip-target"],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def test_make_runs_the_check_without_the_venv_and_installs_what_it_says(tmp_path: Path) -> None:
    with_gpu = _script(tmp_path, H100_580)
    if sys.platform == "linux":
        assert with_gpu.stdout == ".[cuda]\n" and "NVIDIA H100 80GB HBM3" in with_gpu.stderr
    else:  # macOS: Metal, whatever nvidia-smi says
        assert with_gpu.stdout == ".\n" and with_gpu.stderr.startswith("macOS: MLX runs on the Apple GPU")
    (tmp_path / "bin" / "nvidia-smi").unlink()
    without = _script(tmp_path, None)
    assert without.stdout == ".\n" and ("nvidia-smi is not installed" in without.stderr or sys.platform != "linux")
    recipe = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", ".venv/.stamp-run"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert 'install -e "$(.venv/bin/python app/cuda_check.py --pip-target)"' in recipe


OLD_DRIVER = CudaVerdict(
    False,
    "The NVIDIA driver 535.183.01 is too old for CUDA 13 (needs 580 or newer): staying on MLX's CPU build.",
    "the NVIDIA driver 535.183.01 is too old for CUDA 13 (needs 580 or newer)",
)


@pytest.fixture
def on_linux_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[CudaVerdict], None]]:
    """Make this a Linux machine whose CUDA check says ``verdict`` (device_note's cache cleared around)."""
    import app.cuda_check

    def use(verdict: CudaVerdict) -> None:
        monkeypatch.setattr(app.cuda_check.platform, "system", lambda: "Linux")
        monkeypatch.setattr(app.cuda_check, "check", lambda: verdict)
        device_note.cache_clear()

    yield use
    device_note.cache_clear()


def test_device_note_says_why_the_cpu(on_linux_with: Callable[[CudaVerdict], None]) -> None:
    on_linux_with(OLD_DRIVER)
    assert device_note(False) == OLD_DRIVER.cause and device_note(True) is None
    on_linux_with(linux(0, H100_580))
    assert device_note(False) == (
        "MLX's CPU build is installed, but NVIDIA H100 80GB HBM3 could run the CUDA build (`make clean run`)"
    )


def test_self_test_and_about_name_the_device_and_why_the_cpu(
    on_linux_with: Callable[[CudaVerdict], None], build_controller: Callable[..., AppController]
) -> None:
    import mlx.core as mx

    from app.selftest import check_mlx
    from app.settings import Settings

    on_linux_with(OLD_DRIVER)
    on_gpu = mx.default_device().type == mx.gpu
    named = check_mlx()
    about = build_controller(Settings(), history=False).diagnostics()["Device"]
    if on_gpu:
        assert named.startswith("gpu (") and " — " not in named and about.startswith("gpu: ")
    else:
        assert named.startswith("cpu (") and named.endswith(f" — {OLD_DRIVER.cause}")
        assert about.startswith("cpu: ") and about.endswith(f" — {OLD_DRIVER.cause}")
