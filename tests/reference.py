"""Load the reference ports (mlx-vlm 0.7.10 and, through it, mlx-audio 0.6.2) for parity tests.

Only tests import this module. The reference packages are a test extra and are
never imported by Parley itself.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=8)
def load_reference(path: Path) -> tuple[Any, Any]:
    """``(model, processor)`` as ``mlx_vlm.load`` returns them: strict load of our checkpoint."""
    import mlx_vlm

    return mlx_vlm.load(str(path), strict=True)


def reference_session(path: Path) -> Any:
    """mlx-vlm's ``VoiceChatSession`` (offline generate + streaming factory) for a checkpoint."""
    model, processor = load_reference(path)
    return model.create_session(processor)
