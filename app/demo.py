"""The demo checkpoint: a tiny random-weight model generated on first use.

It lets Parley start and run the whole pipeline (microphone to speaker) on any machine
without downloading 9 GB; it makes noise, not speech (the worker plays it attenuated).
It is generated into the user data folder rather than shipped, and written to a
temporary folder first so an interrupted generation never looks finished.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .paths import demo_checkpoint_dir
from .variants import DEMO

DEMO_SEED = 0
DEMO_QUANTIZATION = DEMO.bits
_COMPLETE_MARKER = ".parley-demo-complete"


def demo_is_ready(path: Path | None = None) -> bool:
    path = demo_checkpoint_dir() if path is None else path
    return (path / _COMPLETE_MARKER).is_file()


def ensure_demo_checkpoint(path: Path | None = None) -> Path:
    """Generate the demo checkpoint if it is missing or incomplete; returns its folder.

    Uses MLX: call it on the thread that owns MLX.
    """
    from engine import make_checkpoint

    path = demo_checkpoint_dir() if path is None else path
    if demo_is_ready(path):
        return path
    staging = path.with_name(path.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    make_checkpoint(staging, size="tiny", quantize=DEMO_QUANTIZATION, seed=DEMO_SEED)
    (staging / _COMPLETE_MARKER).write_text("tiny random-weight demo checkpoint; produces no real speech\n")
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(path)
    return path


def is_demo_checkpoint(path: Path) -> bool:
    return (Path(path) / _COMPLETE_MARKER).is_file()
