"""Whether this machine can run MLX's CUDA 13 build, and if not, why not — in one line.

``make run`` runs this file with the new virtualenv's interpreter before anything is installed into it
(``python app/cuda_check.py --pip-target``): the verdict goes to stderr, and stdout says what to install,
``.[cuda]`` (MLX built for CUDA 13) or ``.`` (the CPU build). The About box and ``parley --self-test`` reuse
the verdict to say why MLX runs on the CPU. Standard library only, so it runs before the venv has packages.

What "usable" means, from ``nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader``:
Linux, at least one GPU listed, a driver of branch 580 or newer (NVIDIA's CUDA compatibility table: CUDA 13.x
runs on drivers >= 580, 13.0 GA shipped with 580.65.06; MLX's ``cuda13`` wheels bring their own CUDA 13 runtime),
and compute capability 7.5 or more on the first GPU, the one MLX uses (CUDA 13 dropped Maxwell, Pascal and
Volta). ``PARLEY_CUDA=0`` keeps the CPU build regardless.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

MIN_DRIVER = 580  # the driver branch CUDA 13 needs
MIN_COMPUTE = (7, 5)  # the oldest GPU architecture CUDA 13 builds for (Turing)
QUERY = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
CUDA_TARGET = ".[cuda]"
CPU_TARGET = "."

# Runs a command; returns (exit code, stdout, stderr). Raises FileNotFoundError when the program is absent.
Runner = Callable[[Sequence[str]], tuple[int, str, str]]


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str  # e.g. "580.65.06"
    compute: tuple[int, int]  # e.g. (9, 0)

    @property
    def driver_branch(self) -> int:
        return int(self.driver.split(".")[0])

    def describe(self) -> str:
        return f"{self.name} (driver {self.driver}, compute {self.compute[0]}.{self.compute[1]})"


@dataclass(frozen=True)
class CudaVerdict:
    usable: bool
    reason: str  # one sentence, what make run prints
    cause: str = ""  # why the CPU build, in a few words (for the About box and the self-test)
    gpus: tuple[Gpu, ...] = ()

    @property
    def pip_target(self) -> str:
        return CUDA_TARGET if self.usable else CPU_TARGET


def _cpu(cause: str, gpus: tuple[Gpu, ...] = (), advice: str = "") -> CudaVerdict:
    sentence = cause if cause.startswith("nvidia-smi") else cause[0].upper() + cause[1:]  # a command keeps its case
    reason = f"{sentence}: staying on MLX's CPU build." + (f" {advice}" if advice else "")
    return CudaVerdict(False, reason, cause, gpus)


def parse_query(text: str) -> tuple[Gpu, ...]:
    """The GPUs in ``nvidia-smi``'s CSV answer; ``ValueError`` naming the line it cannot read."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        try:
            if len(fields) != 3:
                raise ValueError(f"{len(fields)} fields")
            name, driver, compute = fields
            major, minor = (int(part) for part in compute.split("."))
            gpu = Gpu(name, driver, (major, minor))
            gpu.driver_branch  # noqa: B018  (a driver version that is not a number is garbage too)
        except ValueError as exc:
            raise ValueError(f"unexpected nvidia-smi line {line.strip()!r} ({exc})") from None
        gpus.append(gpu)
    return tuple(gpus)


def _run(command: Sequence[str]) -> tuple[int, str, str]:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=False)
    return done.returncode, done.stdout, done.stderr


def check(*, system: str | None = None, run: Runner = _run, environ: Mapping[str, str] | None = None) -> CudaVerdict:
    """The verdict for this machine (``system``, ``run`` and ``environ`` stand in for it in tests)."""
    system = platform.system() if system is None else system
    environ = os.environ if environ is None else environ
    if environ.get("PARLEY_CUDA", "").strip().lower() in ("0", "off", "no", "false"):
        return _cpu("PARLEY_CUDA=0 is set")
    if system == "Darwin":
        return CudaVerdict(False, "macOS: MLX runs on the Apple GPU through Metal; CUDA is for Linux.", "macOS")
    if system != "Linux":
        return _cpu(f"MLX's CUDA build is for Linux, not {system}")
    try:
        code, out, err = run(QUERY)
    except FileNotFoundError:
        return _cpu("no NVIDIA driver (nvidia-smi is not installed)")
    except (OSError, subprocess.SubprocessError) as exc:
        return _cpu(f"nvidia-smi could not run ({exc})")
    if code != 0:
        said = (err.strip() or out.strip()).splitlines()
        return _cpu(f"nvidia-smi failed (exit {code}: {said[0] if said else 'no message'})")
    try:
        gpus = parse_query(out)
    except ValueError as exc:
        return _cpu(f"nvidia-smi's answer is unreadable ({exc})")
    if not gpus:
        return _cpu("nvidia-smi lists no NVIDIA GPU")
    first = gpus[0]  # the GPU MLX computes on
    if first.driver_branch < MIN_DRIVER:
        return _cpu(
            f"the NVIDIA driver {first.driver} is too old for CUDA 13 (needs {MIN_DRIVER} or newer)",
            gpus,
            "Update the driver, then run `make clean run`.",
        )
    if first.compute < MIN_COMPUTE:
        need = f"{MIN_COMPUTE[0]}.{MIN_COMPUTE[1]}"
        return _cpu(f"{first.describe()} is too old for CUDA 13 (needs compute {need} or newer)", gpus)
    others = f" (and {len(gpus) - 1} more GPU{'s' if len(gpus) > 2 else ''}; MLX uses one)" if len(gpus) > 1 else ""
    return CudaVerdict(True, f"{first.describe()}{others}: using MLX built for CUDA 13.", "", gpus)


@functools.cache
def device_note(on_gpu: bool) -> str | None:
    """Why MLX computes on the CPU on this Linux machine, in a few words; None on a GPU or off Linux (checked once)."""
    if on_gpu or platform.system() != "Linux":
        return None
    verdict = check()
    if verdict.usable:
        return f"MLX's CPU build is installed, but {verdict.gpus[0].name} could run the CUDA build (`make clean run`)"
    return verdict.cause


def main(argv: Sequence[str] | None = None) -> int:
    """``--pip-target``: print what to ``pip install -e`` (the verdict goes to stderr). Otherwise print the verdict."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        verdict = check()
    except Exception as exc:  # noqa: BLE001  (make run must still install something: the CPU build, saying why)
        verdict = _cpu(f"the CUDA check failed ({exc!r})")
    if args == ["--pip-target"]:
        print(verdict.reason, file=sys.stderr)
        print(verdict.pip_target)
        return 0
    print(verdict.reason)
    return 0 if verdict.usable else 1


if __name__ == "__main__":
    sys.exit(main())
