"""EAR-TTS's streaming state (:mod:`engine.streaming`'s contract): the backbone's attention caches and fast
numerics' carried random key."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from ...ops.cache import KVCache, SlidingKVCache
from ...streaming import arrays_nbytes

# --------------------------------------------------------------------------- attention caches


LayerCache = KVCache | SlidingKVCache


@dataclass
class TTSCache:
    """Attention state of the EAR-TTS backbone (one KV cache per layer), and fast numerics' random key."""

    layers: list[LayerCache]
    # Fast numerics' random key, where a step's draws are made at once (EarTTS.step_draws): the key after the
    # last step's splits, carried here because MLX's global generator takes no key from outside. None until the
    # first such step, which starts from the global generator's key, as drawing one by one would.
    draw_key: mx.array | None = None
    # Fast numerics only: how much a step spends less while the machine falls behind (EarTTS.ECONOMY_LEVELS; set by
    # engine.session.Session.set_economy, 0 the full step). Exact numerics refuses any other level.
    economy: int = 0

    @property
    def offset(self) -> int:
        """Positions processed so far (speaker prompt included)."""
        return self.layers[0].offset if self.layers else 0

    def arrays(self) -> list[mx.array]:
        """Every array the cache holds, to evaluate once per frame."""
        arrays = [array for layer in self.layers for array in layer.arrays()]
        return arrays if self.draw_key is None else [*arrays, self.draw_key]

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())
