"""The UI layer never imports MLX or sounddevice (it talks to them only through the controller)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ui_modules_do_not_import_mlx_or_sounddevice() -> None:
    modules = sorted(f"ui.{path.stem}" for path in (ROOT / "ui").glob("*.py") if path.stem not in ("__init__", "main"))
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlx', 'sounddevice'}))\n"
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
    assert len(modules) > 15
