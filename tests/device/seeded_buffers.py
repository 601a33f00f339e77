"""Buffers drawn from a seed the same way here and on a device without MLX (NumPy's PCG64; bf16 as its bits), so that
``attention_recipes.py`` can record launches over buffers too large to carry and ``attention_cupy.py`` redraw them."""

from __future__ import annotations

import numpy as np


def drawn(seed: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Standard normal float32 for ``seed``, or (``dtype`` "bfloat16") its bf16 bits, rounded to nearest even."""
    values = np.random.Generator(np.random.PCG64(seed)).standard_normal(shape).astype(np.float32)
    if dtype == "float32":
        return values
    bits = values.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
