"""Nemotron-H's streaming state: one entry per block (:mod:`engine.streaming`'s contract), and the block kinds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import mlx.core as mx

from ...ops.cache import KVCache
from ...streaming import arrays_nbytes

MAMBA: Literal["M"] = "M"
ATTENTION: Literal["*"] = "*"
MLP: Literal["-"] = "-"
BLOCK_KINDS = (MAMBA, ATTENTION, MLP)


@dataclass(eq=False)
class MambaCache:
    """Recurrent state of one Mamba block.

    ``conv_state`` (B, K-1, conv_dim): the last K-1 inputs of the causal depthwise
    convolution. ``ssm_state`` (B, H, head_dim, N), float32: the scan state. Both are
    ``None`` until the first call, which (like the reference) starts from zeros; the
    convolution window then takes the dtype of the inputs it was last fed.
    """

    conv_state: mx.array | None = None
    ssm_state: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.conv_state, self.ssm_state) if a is not None]

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())


LayerCache = MambaCache | KVCache | None


@dataclass(eq=False)
class LLMCache:
    """All streaming state of :class:`NemotronH`: one entry per block (``None`` for MLP blocks)."""

    layers: list[LayerCache] = field(default_factory=list)
    position: int = 0  # positions consumed so far

    def arrays(self) -> list[mx.array]:
        """Every array the next call reads; evaluate these once per frame."""
        return [array for layer in self.layers if layer is not None for array in layer.arrays()]

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())
