"""What fast mode may use on this device: the plan each network turns into its own fast form.

:mod:`engine.numerics` decides the policy and builds one :class:`FastPlan`; every network's ``use_numerics(plan)``
(``None`` for exact mode) admits the kernels it wants through :func:`engine.kernels.admission.fast_part` and keeps
its fast form in one slot of its own. The plan sits here, below the networks, so that they can read it without
importing the policy above them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .admission import gpu_kernel_backend


@dataclass(frozen=True)
class FastPlan:
    """Fast mode's choices for one model on this device.

    ``backend`` is the custom-kernel backend (``"cuda"``, ``"metal"``) or ``None`` where only the operations
    fallbacks run (the CPU). ``release`` lets exact mode drop the copies and programs fast mode made.
    ``rnnt_loop`` builds a frame's RN-T attempts as one launch on CUDA. ``backbone_cache_dtype`` is what the TTS
    backbone's caches store keys and values in. ``characters`` is the model's character table, from which fast mode
    on CUDA reads a token's text conditioning.
    """

    backend: str | None
    release: bool = True
    rnnt_loop: bool = True
    backbone_cache_dtype: mx.Dtype = mx.bfloat16
    characters: Any = None

    @property
    def on_gpu(self) -> bool:
        return self.backend is not None

    @classmethod
    def for_this_device(cls, **choices: Any) -> FastPlan:
        return cls(backend=gpu_kernel_backend(), **choices)
