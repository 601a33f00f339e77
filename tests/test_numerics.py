"""Fast numerics: the fused Mamba-2 step against the exact step, kernel admission, and drift bounds.

The bounds are the README's ("Fast numerics"), with their reasons: fast mode only reorders
float32 sums (the fused Mamba-2 step), so per-network differences stay at float32 rounding
(relative L2 ~1e-6 measured, CPU and H200); the bounds allow a hundred times that, which a
real change of arithmetic (a reduced-precision product, a dropped term) would exceed by
orders of magnitude.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import pytest

from app.drift import measure_drift
from engine.llm import Mamba2Mixer
from engine.numerics import admit_kernel, apply_numerics, check_numerics, relative_l2
from engine.random_checkpoint import random_voicechat
from engine.ssm import fused_step_ops, silu_gate, ssm_scan

LOGITS_RELATIVE_L2 = 1e-4
TTS_HIDDEN_RELATIVE_L2 = 1e-4
KL_MAX = 1e-5
ARGMAX_AGREEMENT = 0.99
WAVEFORM_SNR_DB = 40.0


def _mixer_inputs(mixer: Mamba2Mixer, seed: int) -> tuple[mx.array, ...]:
    keys = mx.random.split(mx.random.key(seed), 4)
    heads, head_dim, state_size = mixer.num_heads, mixer.head_dim, mixer.state_size
    return (
        mx.random.normal((mixer.conv_dim,), key=keys[0]),
        mx.random.normal((heads,), key=keys[1]),
        mx.random.normal((heads * head_dim,), key=keys[2]),
        mixer.dt_bias.astype(mx.float32),
        mixer.A_log,
        mixer.D.astype(mx.float32),
        0.1 * mx.random.normal((1, heads, head_dim, state_size), key=keys[3]),
        mx.array([mixer.dt_min, mixer.dt_max], dtype=mx.float32),
    )


def _exact_step(mixer: Mamba2Mixer, *inputs: mx.array) -> tuple[mx.array, mx.array]:
    """The exact mode's operations for the same step (engine.llm.Mamba2Mixer.__call__ after its convolution)."""
    mixed, dt_raw, gate, dt_bias, a_log, skip, state, limits = inputs
    inner, width = mixer.inner_size, mixer.n_groups * mixer.state_size
    head_inputs, b_mat, c_mat = mx.split(mixed, [inner, inner + width])
    y, new_state = ssm_scan(
        head_inputs.reshape(1, 1, mixer.num_heads, mixer.head_dim),
        a_log,
        b_mat.reshape(1, 1, mixer.n_groups, mixer.state_size),
        c_mat.reshape(1, 1, mixer.n_groups, mixer.state_size),
        skip,
        dt_raw.reshape(1, 1, -1),
        dt_bias,
        state,
        (float(limits[0].item()), float(limits[1].item())),
    )
    return silu_gate(gate, y.reshape(inner)), new_state


@pytest.mark.parametrize("size", ["tiny", "structure"])
def test_fused_step_fallback_computes_the_exact_step(size: str) -> None:
    voicechat = random_voicechat(size, quantize=4)  # type: ignore[arg-type]
    mixer = next(m for _, m in voicechat.model.named_modules() if isinstance(m, Mamba2Mixer))
    for seed in range(3):
        inputs = _mixer_inputs(mixer, seed)
        fast = fused_step_ops(*inputs, groups=mixer.n_groups)
        exact = _exact_step(mixer, *inputs)
        for got, want in zip(fast, exact, strict=True):
            assert got.shape == want.shape
            assert relative_l2(got, want) < 1e-6  # the same quantity, summed in another order


def test_admit_kernel_takes_a_matching_kernel_and_refuses_others() -> None:
    voicechat = random_voicechat("tiny", quantize=4)
    mixer = next(m for _, m in voicechat.model.named_modules() if isinstance(m, Mamba2Mixer))
    fallback = functools.partial(fused_step_ops, groups=mixer.n_groups)
    inputs = _mixer_inputs(mixer, 7)
    assert admit_kernel("exact step", functools.partial(_exact_step, mixer), fallback, inputs)

    def wrong(*args: mx.array) -> tuple[mx.array, mx.array]:
        y, state = fallback(*args)
        return y * 1.001, state  # a 0.1 % error is far beyond reordering

    def broken(*args: mx.array) -> tuple[mx.array, mx.array]:
        raise RuntimeError("kernel failed to compile")

    assert not admit_kernel("wrong step", wrong, fallback, inputs)
    assert not admit_kernel("broken step", broken, fallback, inputs)


def test_fast_mode_is_recorded_and_exact_mode_changes_nothing() -> None:
    fast = random_voicechat("tiny", quantize=4, numerics="fast")
    assert fast.describe()["numerics"] == "fast"
    assert set(fast.fast_changes) == {"fused_mamba_step"}
    mixers = [m for _, m in fast.model.named_modules() if isinstance(m, Mamba2Mixer)]
    assert mixers and all(m.fast_step is not None for m in mixers)
    assert not fast.fast_changes["fused_mamba_step"], "the CPU runs the fallback, not a kernel"
    exact = random_voicechat("tiny", quantize=4)
    assert apply_numerics(exact.model, "exact") == {} and exact.describe()["numerics"] == "exact"
    assert all(m.fast_step is None for _, m in exact.model.named_modules() if isinstance(m, Mamba2Mixer))
    with pytest.raises(ValueError, match="numerics must be one of exact, fast"):
        check_numerics("quick")


def test_a_loaded_model_switches_numerics_in_place() -> None:
    from engine.numerics import set_numerics

    voicechat = random_voicechat("tiny", quantize=4)
    mixers = [m for _, m in voicechat.model.named_modules() if isinstance(m, Mamba2Mixer)]
    set_numerics(voicechat, "fast")
    assert voicechat.numerics == "fast" and all(m.fast_step is not None for m in mixers)
    set_numerics(voicechat, "exact")
    assert voicechat.numerics == "exact" and voicechat.fast_changes == {}
    assert all(m.fast_step is None for m in mixers)


def test_drift_of_fast_numerics_stays_within_the_bounds() -> None:
    report = measure_drift(size="tiny", quantize=4, seeds=[0, 1], frames=30, out=lambda line: None)
    for result in report["seeds"]:
        for head in ("text", "function"):
            llm = result["llm"][head]
            assert llm["relative_l2_max"] <= LOGITS_RELATIVE_L2, (head, llm)
            assert llm["kl_max"] <= KL_MAX, (head, llm)
            assert llm["argmax_agreement"] >= ARGMAX_AGREEMENT, (head, llm)
        assert result["tts"]["hidden_relative_l2_max"] <= TTS_HIDDEN_RELATIVE_L2
        assert result["codec"]["snr_db"] >= WAVEFORM_SNR_DB
        # The drift is real (this is not exact mode under another name) but too small to change any output.
        assert result["llm"]["text"]["relative_l2_max"] > 0.0
        free = result["free_running"]
        assert free["first_text_difference"] is None and free["first_codes_difference"] is None, free
