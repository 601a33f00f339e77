"""Unit tests of the Nemotron-H LLM (:mod:`engine.networks.llm`) and the Mamba-2 scan (:mod:`engine.networks.llm.ssm`).

Tolerances: the chunked scan and a step-by-step run are different float32 summation
orders of the same recurrence; on the tiny checkpoint they agree to about 1e-6 (values
up to ~4), so the bounds below are a few times the measured gaps.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.loading.config import LLMConfig
from engine.networks.llm import CausalSelfAttention, HybridBlock, LLMCache, Mamba2Mixer, MambaCache, NemotronH, ReLU2MLP
from engine.networks.llm.ssm import ssm_scan
from engine.ops.cache import KVCache

BF16, F32 = mx.bfloat16, mx.float32


def _load(path: Path) -> NemotronH:
    files, weights, quantized = read_runtime_weights(path)
    model = NemotronH(files.config.text_config)
    load_into(model, weights, quantized, prefix="stt_model.llm.")
    return model


@pytest.fixture(scope="module")
def llm(tiny_bf16: Path) -> NemotronH:
    return _load(tiny_bf16)


def _inputs(config: LLMConfig, batch: int, length: int, seed: int = 0) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((batch, length, config.hidden_size)).astype(np.float32))


def _first(model: NemotronH, kind: str) -> HybridBlock:
    return next(layer for layer in model.layers if layer.kind == kind)


def _max_abs(a: mx.array, b: mx.array) -> float:
    return mx.abs(a.astype(F32) - b.astype(F32)).max().item()


# --------------------------------------------------------------------------- selective scan


def _recurrence(
    x: np.ndarray,
    a_log: np.ndarray,
    b_mat: np.ndarray,
    c_mat: np.ndarray,
    skip: np.ndarray,
    dt_raw: np.ndarray,
    dt_bias: np.ndarray,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The Mamba-2 recurrence, position by position, in float64."""
    heads = x.shape[2]
    per_group = heads // b_mat.shape[2]
    dt = np.log1p(np.exp(dt_raw.astype(np.float64) + dt_bias))
    rates = -np.exp(a_log.astype(np.float64))
    s = state.astype(np.float64).copy()
    y = np.zeros(x.shape)
    for t in range(x.shape[1]):
        for h in range(heads):
            g = h // per_group
            decay = np.exp(rates[h] * dt[:, t, h])[:, None, None]
            s[:, h] = decay * s[:, h] + (dt[:, t, h, None] * x[:, t, h])[:, :, None] * b_mat[:, t, g][:, None, :]
            y[:, t, h] = np.einsum("bpn,bn->bp", s[:, h], c_mat[:, t, g]) + skip[h] * x[:, t, h]
    return y, s


@pytest.mark.parametrize("chunk_size", [256, 7])
def test_ssm_scan_equals_the_recurrence(chunk_size: int) -> None:
    rng = np.random.default_rng(1)
    batch, length, heads, head_dim, groups, state_size = 2, 300, 4, 3, 2, 5
    x = rng.standard_normal((batch, length, heads, head_dim)).astype(np.float32)
    b_mat = rng.standard_normal((batch, length, groups, state_size)).astype(np.float32)
    c_mat = rng.standard_normal((batch, length, groups, state_size)).astype(np.float32)
    dt_raw = rng.standard_normal((batch, length, heads)).astype(np.float32)
    a_log = (rng.standard_normal(heads) * 0.5).astype(np.float32)
    skip = rng.standard_normal(heads).astype(np.float32)
    dt_bias = (rng.standard_normal(heads) * 0.3).astype(np.float32)
    state = rng.standard_normal((batch, heads, head_dim, state_size)).astype(np.float32)

    y, final = ssm_scan(
        *(mx.array(a) for a in (x, a_log, b_mat, c_mat, skip, dt_raw, dt_bias, state)),
        time_step_limit=(0.0, float("inf")),
        chunk_size=chunk_size,
    )
    expected_y, expected_state = _recurrence(x, a_log, b_mat, c_mat, skip, dt_raw, dt_bias, state)
    assert y.dtype == F32 and final.dtype == F32 and final.shape == state.shape
    # Measured: 3.7e-6 on outputs up to ~32, 3.5e-7 on the state.
    assert np.abs(np.array(y) - expected_y).max() < 2e-5
    assert np.abs(np.array(final) - expected_state).max() < 2e-6


def test_ssm_scan_from_zero_state_and_clamp() -> None:
    """``state=None`` equals an explicit zero state; ``time_step_limit`` clamps dt."""
    rng = np.random.default_rng(2)
    args = [
        mx.array(rng.standard_normal(shape).astype(np.float32))
        for shape in ((1, 9, 2, 3), (2,), (1, 9, 1, 4), (1, 9, 1, 4), (2,), (1, 9, 2), (2,))
    ]
    y_none, s_none = ssm_scan(*args, None, (0.0, float("inf")))
    y_zero, s_zero = ssm_scan(*args, mx.zeros((1, 2, 3, 4)), (0.0, float("inf")))
    assert mx.array_equal(y_none, y_zero).item() and mx.array_equal(s_none, s_zero).item()
    # With dt clamped to exactly 0 nothing enters the state and y is the skip term alone.
    y_off, s_off = ssm_scan(*args, None, (0.0, 0.0))
    assert mx.array_equal(s_off, mx.zeros_like(s_off)).item()
    assert mx.allclose(y_off, args[0] * args[4].reshape(1, 1, 2, 1)).item()
    with pytest.raises(ValueError):
        ssm_scan(args[0][:, :0], *args[1:], None, (0.0, float("inf")))


# --------------------------------------------------------------------------- Mamba mixer


def test_mamba_stepwise_equals_whole_sequence(llm: NemotronH) -> None:
    mixer = _first(llm, "M").mixer
    assert isinstance(mixer, Mamba2Mixer)
    x = _inputs(llm.config, batch=1, length=300)  # two scan chunks in the whole-sequence call

    whole_cache = MambaCache()
    whole = mixer(x, whole_cache)
    step_cache = MambaCache()
    steps = mx.concatenate([mixer(x[:, t : t + 1], step_cache) for t in range(x.shape[1])], axis=1)
    split_cache = MambaCache()
    split = mx.concatenate([mixer(x[:, :100], split_cache), mixer(x[:, 100:], split_cache)], axis=1)
    mx.eval(whole, steps, split, whole_cache.arrays(), step_cache.arrays(), split_cache.arrays())

    # Measured 7.2e-7 (outputs up to ~4) and 6e-8 on the state.
    assert _max_abs(whole, steps) < 5e-6
    assert _max_abs(whole, split) < 5e-6
    assert whole_cache.ssm_state is not None and step_cache.ssm_state is not None
    assert _max_abs(whole_cache.ssm_state, step_cache.ssm_state) < 1e-6
    # The convolution window is the last K-1 inputs, whatever the call pattern.
    assert mx.array_equal(whole_cache.conv_state, step_cache.conv_state).item()
    assert mx.array_equal(whole_cache.conv_state, split_cache.conv_state).item()
    # Uncached, the sequence starts from zero state: the same ops as the first cached call.
    assert mx.array_equal(mixer(x), whole).item()


def test_mamba_state_carries_information(llm: NemotronH) -> None:
    """A different history changes the next output: the cache is really read."""
    mixer = _first(llm, "M").mixer
    x = _inputs(llm.config, batch=1, length=6)
    cache_a, cache_b = MambaCache(), MambaCache()
    mixer(x[:, :5], cache_a)
    mixer(x[:, :5] * 0.5, cache_b)
    assert _max_abs(mixer(x[:, 5:], cache_a), mixer(x[:, 5:], cache_b)) > 1e-3


# --------------------------------------------------------------------------- attention and its cache


def test_cached_attention_equals_full_causal_pass(llm: NemotronH) -> None:
    attention = _first(llm, "*").mixer
    assert isinstance(attention, CausalSelfAttention)
    x = _inputs(llm.config, batch=1, length=300)
    full = attention(x, "causal", None)
    step_cache = KVCache()
    steps = mx.concatenate([attention(x[:, t : t + 1], None, step_cache) for t in range(x.shape[1])], axis=1)
    block_cache = KVCache()
    blocks = mx.concatenate(
        [attention(x[:, :7], "causal", block_cache), attention(x[:, 7:], "causal", block_cache)], axis=1
    )
    # Measured bit-identical on this CPU: masked scores contribute exact zeros.
    assert _max_abs(full, steps) == 0.0
    assert _max_abs(full, blocks) == 0.0
    assert step_cache.offset == block_cache.offset == 300


def _kv(length: int, dtype: mx.Dtype, seed: int) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((1, 2, length, 4)).astype(np.float32)).astype(dtype)


def test_attention_cache_dtype_and_growth() -> None:
    cache = KVCache()
    assert cache.capacity == 0 and cache.arrays() == []

    # bf16 keys allocate a bf16 buffer of one growth step.
    first = _kv(1, BF16, 0)
    keys, values = cache.update(first, first * 2)
    assert cache.keys is not None and cache.keys.dtype == BF16 and cache.values is not None
    assert cache.capacity == 256 and cache.offset == 1 and keys.shape == (1, 2, 1, 4)

    # Later float32 keys are rounded into the bf16 buffer, and attention reads them as bf16.
    stored = []
    for t in range(255):
        step = _kv(1, F32, t + 1)
        keys, values = cache.update(step, step)
        stored.append(step)
    assert cache.capacity == 256 and cache.offset == 256 and keys.dtype == BF16
    assert mx.array_equal(keys[..., 1:, :], mx.concatenate(stored, axis=2).astype(BF16)).item()

    # A float32 step that needs more room promotes the whole buffer to float32 (old values exact).
    before = keys
    last = _kv(1, F32, 999)
    keys, values = cache.update(last, last)
    assert cache.keys.dtype == F32 and cache.values.dtype == F32 and cache.capacity == 512
    assert cache.offset == 257 and keys.shape == (1, 2, 257, 4)
    assert mx.array_equal(keys[..., :256, :], before.astype(F32)).item()
    assert mx.array_equal(keys[..., 256:, :], last).item()
    assert values.dtype == F32 and mx.array_equal(values[..., 256:, :], last).item()
    assert len(cache.arrays()) == 2


def test_attention_cache_block_growth_cuts_to_offset() -> None:
    cache = KVCache()
    cache.update(_kv(5, F32, 0), _kv(5, F32, 1))
    assert cache.capacity == 256
    # 5 + 300 > 256: the buffer is cut to the 5 used slots and extended by two steps.
    block = _kv(300, BF16, 2)
    keys, _ = cache.update(block, block)
    assert cache.capacity == 5 + 512 and cache.offset == 305
    assert cache.keys is not None and cache.keys.dtype == F32  # f32 buffer; bf16 zeros widen to it
    assert mx.array_equal(keys[..., 5:, :], block.astype(F32)).item()
    # A float32 first step makes a float32 buffer that stores bf16 keys exactly.
    fresh = KVCache()
    fresh.update(_kv(1, F32, 3), _kv(1, F32, 3))
    keys, _ = fresh.update(_kv(2, BF16, 4), _kv(2, BF16, 4))
    assert keys.dtype == F32 and fresh.capacity == 256


# --------------------------------------------------------------------------- blocks and model


@pytest.mark.parametrize("kind", ["M", "*", "-"])
def test_block_shapes_and_finiteness(llm: NemotronH, kind: str) -> None:
    config = llm.config
    block = _first(llm, kind)
    expected_mixer = {"M": Mamba2Mixer, "*": CausalSelfAttention, "-": ReLU2MLP}[kind]
    assert isinstance(block.mixer, expected_mixer) and isinstance(block.norm, nn.RMSNorm)
    x = _inputs(config, batch=2, length=5)
    cache = {"M": MambaCache(), "*": KVCache(), "-": None}[kind]
    for inputs, mask in ((x, "causal"), (x[:, :1], None)):
        out = block(inputs, mask, cache)
        assert out.shape == inputs.shape and out.dtype == F32
        assert mx.all(mx.isfinite(out)).item()
        assert _max_abs(out, inputs) > 0.0  # the mixer contributes
    if isinstance(cache, MambaCache):
        assert cache.conv_state is not None and cache.ssm_state is not None
        assert cache.conv_state.shape == (2, config.conv_kernel - 1, config.mamba_conv_dim)
        assert cache.ssm_state.shape == (2, config.mamba_num_heads, config.mamba_head_dim, config.ssm_state_size)
        assert cache.ssm_state.dtype == F32
    elif isinstance(cache, KVCache):
        assert cache.offset == 6 and cache.keys is not None
        assert cache.keys.shape == (2, config.num_key_value_heads, 256, config.attention_head_dim)


def test_make_cache_structure(llm: NemotronH) -> None:
    cache = llm.make_cache()
    assert isinstance(cache, LLMCache) and cache.arrays() == [] and cache.position == 0
    kinds = {"M": MambaCache, "*": KVCache}
    for kind, entry in zip(llm.config.hybrid_override_pattern, cache.layers, strict=True):
        assert entry is None if kind == "-" else isinstance(entry, kinds[kind])
    out = llm(_inputs(llm.config, batch=1, length=3), cache)
    assert out.shape == (1, 3, llm.config.hidden_size) and cache.position == 3
    pattern = llm.config.hybrid_override_pattern
    assert len(cache.arrays()) == 2 * (pattern.count("M") + pattern.count("*"))
    with pytest.raises(ValueError):
        llm(out, LLMCache(cache.layers[:-1]))


def test_model_stepwise_equals_whole_sequence(llm: NemotronH) -> None:
    x = _inputs(llm.config, batch=1, length=300)
    whole = llm(x)
    cache = llm.make_cache()
    steps = []
    for t in range(x.shape[1]):
        steps.append(llm(x[:, t : t + 1], cache))
        mx.eval(steps[-1], cache.arrays())  # as the session does once per frame
    # Measured 2.3e-6 on hidden states up to ~3.7 (the Mamba scan's summation order).
    assert _max_abs(whole, mx.concatenate(steps, axis=1)) < 2e-5
    assert mx.all(mx.isfinite(whole)).item()


def test_batch_rows_are_independent(llm: NemotronH) -> None:
    x = _inputs(llm.config, batch=2, length=30)
    both = llm(x, llm.make_cache())
    rows = [llm(x[i : i + 1], llm.make_cache()) for i in range(2)]
    # Measured bit-identical on this CPU.
    assert _max_abs(both, mx.concatenate(rows, axis=0)) == 0.0


def test_quantized_checkpoint_loads_and_runs(tiny_q4: Path) -> None:
    model = _load(tiny_q4)
    mamba = _first(model, "M").mixer
    attention = _first(model, "*").mixer
    mlp = _first(model, "-").mixer
    assert isinstance(mamba, Mamba2Mixer) and isinstance(attention, CausalSelfAttention)
    assert isinstance(mlp, ReLU2MLP)
    for linear in (mamba.in_proj, mamba.out_proj, attention.q_proj, attention.o_proj, mlp.up_proj, mlp.down_proj):
        assert isinstance(linear, nn.QuantizedLinear) and linear.bits == 4
    assert isinstance(mamba.conv1d, nn.Conv1d)  # never quantized
    cache = model.make_cache()
    for length in (4, 1):
        out = model(_inputs(model.config, batch=1, length=length), cache)
        assert out.shape == (1, length, model.config.hidden_size) and mx.all(mx.isfinite(out)).item()


def test_unknown_block_type_is_rejected(llm: NemotronH) -> None:
    with pytest.raises(ValueError, match="block type"):
        HybridBlock(llm.config, "E")


def test_single_position_scan_equals_the_general_chunk() -> None:
    """The one-position fast path leaves out only identities: same values as the chunked form."""
    from engine.networks.llm.ssm import _scan_chunk, _scan_single

    batch, heads, head_dim, groups, state_size = 1, 8, 16, 2, 16
    dt_x = mx.random.normal((batch, 1, heads, head_dim))
    dt_a = -mx.abs(mx.random.normal((batch, 1, heads)))
    b_mat = mx.random.normal((batch, 1, groups, state_size))
    c_mat = mx.random.normal((batch, 1, groups, state_size))
    state = mx.random.normal((batch, heads, head_dim, state_size))
    for initial in (None, state):
        general = _scan_chunk(dt_x, dt_a, b_mat, c_mat, initial, mx.float32)
        single = _scan_single(dt_x, dt_a, b_mat, c_mat, initial, mx.float32)
        for a, b in zip(general, single, strict=True):
            assert a.shape == b.shape
            assert mx.array_equal(a, b).item()
