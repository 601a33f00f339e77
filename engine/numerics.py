"""Numerics modes: ``exact`` (the reference's arithmetic, bit for bit) and ``fast`` (a written decision).

Exact mode keeps the reference port's decomposition of every network into MLX operations,
so outputs equal mlx-vlm 0.7.10's bit for bit on the CPU and the GPU (README, "Exact on
the GPU"); a frame then stays several thousand operations, and on a GPU each costs host
time whatever the arithmetic. Fast mode changes the arithmetic where that buys speed, and
nowhere else. The change, what differs from the reference, and why it is safe:

* **A fused Mamba-2 step** (:class:`engine.ssm.FusedStep`): the state update, its readout
  ``C·S``, the skip term and the output gate of one position run as one kernel per layer
  (``mx.fast.cuda_kernel`` / ``mx.fast.metal_kernel``) instead of about forty operations.
  The kernel sums ``C·S`` over the state in its own order and reads the new state once,
  where the reference sums ``(C·B)·dt·x`` and ``C·S_old`` separately: the same quantity,
  rounded differently, in float32 throughout as the reference. A kernel is used only after
  it matched its operations fallback (:func:`engine.ssm.fused_step_ops`, the same arithmetic)
  on this device at load (:func:`admit_kernel`); otherwise, and on the CPU, the fallback runs.

Tried and rejected: stacking the projections that share an input on the GPU too (exact mode
stacks them on the CPU only). On CUDA the taller products take another library path with
reduced-precision inputs — the TTS hidden states moved by 6e-4 (relative L2) and free-running
codes parted from exact within 24–36 frames — and the speaking phase got slower, not faster
(README, "Fast numerics"). Also not kept: a kernel reading bf16 projection weights directly; it
matched MLX's product for one row, but MLX's float32 product of several rows on CUDA is less
precise than its own dot products (2e-4 apart), and it was no faster per call.

Bounds, measured and guarded in CI (``tests/test_numerics.py``), are in the README's
"Fast numerics" section, with the drift each change causes. Random weights make the
logits flatter than real ones, so the argmax agreement measured on them is a pessimistic
figure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import mlx.core as mx

Numerics = Literal["exact", "fast"]
NUMERICS: tuple[Numerics, ...] = ("exact", "fast")

# A kernel's outputs may differ from its fallback's by float32 reordering only.
KERNEL_TOLERANCE = 1e-5

log = logging.getLogger(__name__)


def check_numerics(value: str) -> Numerics:
    if value not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}; got {value!r}")
    return value  # type: ignore[return-value]


def gpu_kernel_backend() -> str | None:
    """``"cuda"`` or ``"metal"`` when custom kernels can run on the default device, else None."""
    if mx.default_device().type != mx.gpu:
        return None
    if mx.cuda.is_available():
        return "cuda"
    if mx.metal.is_available():
        return "metal"
    return None


def relative_l2(actual: mx.array, expected: mx.array) -> float:
    """``‖actual − expected‖ / ‖expected‖`` in float32 (0 when both are zero)."""
    difference = mx.sqrt(mx.sum(mx.square(actual.astype(mx.float32) - expected.astype(mx.float32))))
    scale = mx.sqrt(mx.sum(mx.square(expected.astype(mx.float32))))
    difference_value, scale_value = difference.item(), scale.item()
    return difference_value / scale_value if scale_value else difference_value


def admit_kernel(
    name: str,
    kernel: Callable[..., tuple[mx.array, ...]],
    fallback: Callable[..., tuple[mx.array, ...]],
    inputs: tuple[mx.array, ...],
    tolerance: float = KERNEL_TOLERANCE,
) -> bool:
    """Run ``kernel`` and ``fallback`` on ``inputs``; True when every output agrees within ``tolerance``
    (relative L2). A kernel that fails to build or run, or disagrees, is not used (and the log says why)."""
    try:
        got = kernel(*inputs)
        want = fallback(*inputs)
        mx.eval(got, want)
        errors = [relative_l2(a, b) for a, b in zip(got, want, strict=True)]
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot run on this device is simply not used
        log.warning("the %s kernel is not used: it failed on this device (%s)", name, exc)
        return False
    worst = max(errors)
    if not worst <= tolerance:
        log.warning(
            "the %s kernel is not used: it differs from its fallback by %.3g (bound %g)", name, worst, tolerance
        )
        return False
    log.info("the %s kernel matches its fallback on this device (relative L2 %.2g)", name, worst)
    return True


def apply_numerics(model: object, numerics: Numerics) -> dict[str, bool]:
    """Prepare a loaded model for ``numerics``; returns which of fast mode's changes are in use.

    Exact mode runs the reference's operations (undoing fast mode on a model that had it).
    Fast mode gives each Mamba-2 mixer the fused step: the kernel where it matched its fallback
    on this device, else the fallback (the same arithmetic as operations; always so on the CPU).
    Either way the weights are untouched, so a loaded model switches in place.
    """
    import functools

    from .llm import Mamba2Mixer
    from .ssm import FusedStep, fused_step_ops

    if check_numerics(numerics) == "exact":
        for _, module in model.named_modules():  # type: ignore[attr-defined]
            if isinstance(module, Mamba2Mixer):
                module.use_fast_step(None)
        return {}
    mixers = [module for _, module in model.named_modules() if isinstance(module, Mamba2Mixer)]  # type: ignore[attr-defined]
    kernel_used = False
    if mixers:
        first = mixers[0]
        fallback = functools.partial(fused_step_ops, groups=first.n_groups)
        step: Callable[..., tuple[mx.array, mx.array]] = fallback
        backend = gpu_kernel_backend()
        if backend is not None:
            kernel = FusedStep(backend, first.num_heads, first.head_dim, first.n_groups, first.state_size)
            if admit_kernel("Mamba-2 step", kernel, fallback, _step_sample(first)):
                step, kernel_used = kernel, True
        for mixer in mixers:
            mixer.use_fast_step(step)
    return {"fused_mamba_step": kernel_used}


def _step_sample(mixer: object) -> tuple[mx.array, ...]:
    """Random inputs of one mixer's step, with its own parameters (for admitting the kernel)."""
    key = mx.random.key(1234)
    keys = mx.random.split(key, 4)
    heads, head_dim = mixer.num_heads, mixer.head_dim  # type: ignore[attr-defined]
    conv_dim = mixer.conv_dim  # type: ignore[attr-defined]
    limits = mx.array([mixer.dt_min, mixer.dt_max], dtype=mx.float32)  # type: ignore[attr-defined]
    return (
        mx.random.normal((conv_dim,), key=keys[0]),
        mx.random.normal((heads,), key=keys[1]),
        mx.random.normal((heads * head_dim,), key=keys[2]),
        mixer.dt_bias.astype(mx.float32),  # type: ignore[attr-defined]
        mixer.A_log,  # type: ignore[attr-defined]
        mixer.D.astype(mx.float32),  # type: ignore[attr-defined]
        0.1 * mx.random.normal((1, heads, head_dim, mixer.state_size), key=keys[3]),  # type: ignore[attr-defined]
        limits,
    )


def set_numerics(voicechat: object, numerics: Numerics) -> None:
    """Switch a loaded :class:`engine.model.VoiceChat` to ``numerics`` in place (sessions opened after it use it)."""
    voicechat.fast_changes = apply_numerics(voicechat.model, numerics)  # type: ignore[attr-defined]
    voicechat.numerics = numerics  # type: ignore[attr-defined]
