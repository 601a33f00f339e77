"""Codec behaviour on the tiny checkpoint: streaming vs offline, chunking, cache, flush, control codes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.networks.codec import CODEC_PREFIX, Codec, CodecState, replace_control_codes
from engine.networks.codec.codec import _overlap_norm

SAMPLES = 1764


@pytest.fixture(scope="module")
def codec(tiny_bf16) -> Codec:
    files, weights, quantized = read_runtime_weights(tiny_bf16)
    model = Codec(files.config.codec_config)
    load_into(model, weights, quantized, CODEC_PREFIX)
    return model


def _random_codes(codec: Codec, batch: int, frames: int, seed: int) -> mx.array:
    rng = np.random.default_rng(seed)
    shape = (batch, codec.config.num_quantizers, frames)
    return mx.array(rng.integers(0, codec.config.codebook_size, shape).astype(np.int32))


def _stream(codec: Codec, codes: mx.array, chunks: list[int], cache: CodecState | None = None) -> np.ndarray:
    cache = cache or codec.make_state(codes.shape[0])
    pieces, start = [], 0
    for size in chunks:
        samples = codec.step(cache, codes[:, :, start : start + size])
        mx.eval(samples, *cache.arrays())
        pieces.append(np.asarray(samples))
        start += size
    assert start == codes.shape[2]
    return np.concatenate(pieces, axis=1)


def test_step_emits_1764_float32_samples_per_frame(codec: Codec) -> None:
    cache = codec.make_state(2)
    codes = _random_codes(codec, 2, 4, seed=0)
    one = codec.step(cache, codes[:, :, :1])
    three = codec.step(cache, codes[:, :, 1:])
    assert one.shape == (2, SAMPLES) and one.dtype == mx.float32
    assert three.shape == (2, 3 * SAMPLES) and three.dtype == mx.float32
    assert codec.decode(codes).shape == (2, 4 * SAMPLES)
    assert codec.decode(codes).dtype == mx.float32
    assert codec.delay == 8 and codec.samples_per_frame == SAMPLES


def test_cache_shapes_and_dtype(codec: Codec) -> None:
    cache = codec.make_state(2)
    # Decoder stages run widest first: 4x, 2x, 1x base channels (tiny: 32, 16, 8).
    widths = [32] * 3 + [16] * 3 + [8] * 3
    assert [tuple(a.shape) for a in cache.block_inputs] == [(2, 6, width) for width in widths]
    assert cache.spectrum_real.shape == cache.spectrum_imag.shape == (2, 4, 9)
    assert all(a.dtype == mx.bfloat16 for a in cache.arrays())  # the decoder's activation dtype
    assert len(cache.arrays()) == 11
    assert cache.nbytes() == sum(a.nbytes for a in cache.arrays()) == 2 * 2 * (6 * 3 * (32 + 16 + 8) + 2 * 4 * 9)
    assert all(not mx.any(a).item() for a in cache.arrays())
    codec.step(cache, _random_codes(codec, 2, 2, seed=1))
    assert [tuple(a.shape) for a in cache.block_inputs] == [(2, 6, width) for width in widths]
    assert cache.spectrum_real.shape == (2, 4, 9)
    assert all(a.dtype == mx.bfloat16 for a in cache.arrays())
    assert mx.any(cache.spectrum_real).item()


def test_chunking_does_not_change_the_stream(codec: Codec) -> None:
    codes = _random_codes(codec, 1, 10, seed=2)
    frame_by_frame = _stream(codec, codes, [1] * 10)
    mixed = _stream(codec, codes, [3, 1, 4, 2])
    at_once = _stream(codec, codes, [10])
    assert frame_by_frame.shape == (1, 10 * SAMPLES)
    assert np.array_equal(frame_by_frame, mixed)
    assert np.array_equal(frame_by_frame, at_once)


def test_stream_is_offline_delayed_by_8_samples_and_flush_completes_it(codec: Codec) -> None:
    frames = 12
    codes = _random_codes(codec, 2, frames, seed=3)
    offline = np.asarray(codec.decode(codes))
    cache = codec.make_state(2)
    stream = _stream(codec, codes, [1] * frames, cache)
    before = cache.arrays()
    tail = codec.flush(cache)
    assert tail.shape == (2, 8) and tail.dtype == mx.float32
    assert all(a is b for a, b in zip(before, cache.arrays(), strict=True))  # flush leaves the cache alone

    # Bit for bit from offline sample 6 on, through the flushed tail to the very end.
    assert np.array_equal(stream[:, 14:], offline[:, 6:-8])
    assert np.array_equal(np.asarray(tail), offline[:, -8:])
    complete = np.concatenate([stream, np.asarray(tail)], axis=1)
    assert complete.shape == (2, frames * SAMPLES + 8)
    assert np.array_equal(complete[:, 14:], offline[:, 6:])

    # The pre-roll: two samples covered only by the zero frames, then the six the offline decode trims.
    assert np.all(stream[:, :2] == 0.0)
    assert np.any(stream[:, 2:8] != 0.0)
    # Offline samples 0..5 are divided by a partial window-square sum, the stream by the full one.
    offline_norm = np.asarray(_overlap_norm(16, 4, frames * 441)).reshape(-1)[6:12]
    stream_norm = np.asarray(_overlap_norm(16, 4, 445)).reshape(-1)[14:20]
    np.testing.assert_allclose(stream_norm, 1.5, rtol=1e-6)  # Σw² over 4 frames; float32 rounding aside
    assert np.all(offline_norm < stream_norm)
    np.testing.assert_allclose(stream[:, 8:14] * stream_norm, offline[:, :6] * offline_norm, rtol=1e-5, atol=1e-7)


def test_flush_of_an_empty_stream_is_silent(codec: Codec) -> None:
    tail = codec.flush(codec.make_state(1))
    assert tail.shape == (1, 8)
    assert not mx.any(tail).item()


def test_replace_control_codes() -> None:
    control = mx.array([130, 129, 128], dtype=mx.int64)
    silence = mx.array([5, 6, 7], dtype=mx.int64)
    codes = mx.array([[[128, 1, 129], [2, 130, 127], [131, 0, 128]]], dtype=mx.int32)  # (B, T, Q)
    cleaned = replace_control_codes(codes, control, silence)
    assert cleaned.dtype == mx.int32
    assert cleaned.tolist() == [[[5, 1, 7], [2, 6, 127], [131, 0, 7]]]
    by_quantizer = replace_control_codes(codes.transpose(0, 2, 1), control, silence, quantizer_axis=1)
    assert by_quantizer.transpose(0, 2, 1).tolist() == cleaned.tolist()


def test_encode_shapes(codec: Codec) -> None:
    rng = np.random.default_rng(4)
    waveform = mx.array(rng.standard_normal((2, 1, 3 * SAMPLES + 500)).astype(np.float32) * 0.1)
    codes = codec.encode(waveform)
    assert codes.shape == (2, 31, 3) and codes.dtype == mx.int32
    assert int(mx.max(codes).item()) < codec.config.codebook_size and int(mx.min(codes).item()) >= 0
    assert mx.array_equal(codec.encode(waveform[:, 0, :]), codes).item()
    with pytest.raises(ValueError, match="mono"):
        codec.encode(mx.zeros((1, 2, SAMPLES)))


def test_construction_draws_no_random_numbers() -> None:
    from engine.loading.config import CodecConfig

    mx.random.seed(123)
    expected = mx.random.uniform(shape=(4,))
    mx.random.seed(123)
    Codec(CodecConfig(base_channels=8, latent_dim=32, codebook_size=128))
    assert mx.array_equal(mx.random.uniform(shape=(4,)), expected).item()


def test_dequantize_reads_one_stacked_table_and_follows_a_reload(codec: Codec) -> None:
    """The codebook rows come from one stacked table, in one gather: the same bits as a gather per codebook
    summed in quantizer order (the reference's form), for fewer quantizers than the codec has too; a
    replaced codebook (a reload) is seen at once."""
    prvq = codec.prvq

    def reference(codes: mx.array) -> mx.array:
        latents = prvq.mus_list[0][codes[:, 0, :]]
        for quantizer in range(1, codes.shape[1]):
            latents = latents + prvq.mus_list[quantizer][codes[:, quantizer, :]]
        return latents

    for quantizers in (len(prvq.mus_list), 3):
        codes = _random_codes(codec, 2, 4, seed=quantizers)[:, :quantizers, :]
        assert mx.array_equal(prvq.decode(codes), reference(codes)).item()
    table = prvq.codebook_table().table
    assert table.shape == (len(prvq.mus_list) * prvq.mus_list[0].shape[0], prvq.mus_list[0].shape[1])
    original = prvq.mus_list[1]
    codes = _random_codes(codec, 1, 2, seed=9)
    try:
        prvq.mus_list[1] = original + 1.0
        assert mx.array_equal(prvq.decode(codes), reference(codes)).item()
        assert prvq.codebook_table().table is not table
    finally:
        prvq.mus_list[1] = original
    assert mx.array_equal(prvq.decode(codes), reference(codes)).item()


def test_fast_numerics_streams_exact_bits_on_rows_with_a_program_per_part(codec: Codec) -> None:
    """Fast numerics runs the decoder's blocks on rows through their convolution-and-norm part (on the CPU its
    operations fallback, exact mode's own operations), then their own pointwise convolutions, and the
    dequantization through its code-sum part: the same waveform bit for bit, and switching back to exact keeps
    both compiled steps apart."""
    from engine.kernels.code_sum import code_sum_ops
    from engine.numerics import apply_numerics

    codes = _random_codes(codec, 1, 5, seed=7)
    exact = _stream(codec, codes, [1] * 5)
    try:
        changes = apply_numerics(codec, "fast")
        assert changes == {"codec_conv_norm": False, "codec_code_sum": False}  # no kernel on the CPU
        assert codec.fast is not None and codec.fast.conv_norm is not None
        assert codec.fast.code_sum is code_sum_ops  # the CPU's: the operations
        fast = _stream(codec, codes, [1] * 5)
    finally:
        apply_numerics(codec, "exact")
    assert codec.fast is None
    assert np.array_equal(fast, exact)
    assert np.array_equal(_stream(codec, codes, [1] * 5), exact)
    assert len(codec._compiled_steps) == 2 and None in codec._compiled_steps  # exact's step and fast's


def test_use_numerics_sets_the_codec_s_one_fast_slot_and_sub_stages_reach_its_hooks(codec: Codec) -> None:
    """The codec takes its fast form from a plan itself (None: exact mode), and a step whose hooks time
    sub-stages runs op by op, closing each of its three parts with its output: the same samples."""
    from engine.hooks import NoHooks
    from engine.kernels.plan import FastPlan

    class Watching(NoHooks):
        sub_stages = True

        def __init__(self) -> None:
            self.closed: list[str] = []

        def sub_stage(self, name: str, *arrays: object) -> None:
            self.closed.append(name)

    codes = _random_codes(codec, 1, 1, seed=8)
    plain = codec.step(codec.make_state(), codes)
    watching = Watching()
    watched = codec.step(codec.make_state(), codes, watching)
    assert watching.closed == ["codec.dequantize", "codec.decoder", "codec.istft"]
    assert mx.array_equal(plain, watched).item()
    try:
        assert codec.use_numerics(FastPlan(backend=None)) == {"codec_conv_norm": False, "codec_code_sum": False}
        assert codec.fast is not None
        fast = codec.step(codec.make_state(), codes)
    finally:
        assert codec.use_numerics(None) == {}
    assert codec.fast is None
    assert mx.array_equal(fast, plain).item()


def test_conv_norm_admission_sample_makes_every_sum_exact() -> None:
    """The kernel is admitted against its operations bit for bit on these inputs (engine.kernels.conv_norm): each
    position's convolution plus bias is a sixteenth of at most 15/16 and the channels cancel in pairs, so
    any order of summing in float32 gives the same mean (zero) and the same sum of squares (in bf16, the
    squares' partial sums round: there the sample checks the order of MLX's row sum too)."""
    from engine.kernels.conv_norm import conv_norm_samples

    for positions, channels in ((9, 32), (63, 16)):
        rows, history, weight, bias, _, _ = conv_norm_samples(positions, channels, 7, mx.bfloat16)
        padded = mx.concatenate([history, rows], axis=1)
        hidden = np.asarray((mx.conv1d(padded, weight, groups=channels) + bias).astype(mx.float32))[0]
        sixteenths = hidden * 16
        assert np.array_equal(sixteenths, np.round(sixteenths)) and np.abs(hidden).max() <= 15 / 16
        assert np.abs(hidden).max() > 0 and np.all(hidden.sum(axis=-1) == 0)
    with pytest.raises(ValueError, match="even"):
        conv_norm_samples(9, 15, 7, mx.bfloat16)


def test_conv_norm_sums_as_mlx_cuda_row_sum_launches_and_tries_its_variant_first() -> None:
    """The kernel's channel sums follow MLX 0.32's CUDA ``row_reduce_simple`` launch (engine.kernels.conv_norm): 16
    bytes a lane a pass (eight bf16 values, four float32), ``ceil(ceil(C / reads) / 32) / 4`` warps clamped to 1..32, so
    one warp for the codec's bf16 widths; and admission tries MLX's CUDA source's variant first (bf16 adds,
    float rsqrt), every variant on CUDA, the distinct Metal sources on Metal, one where no kernel runs."""
    from engine.kernels.conv_norm import VARIANTS, ConvNormVariant, mlx_row_sum_plan, variants_for

    plans = {channels: mlx_row_sum_plan(channels, mx.bfloat16) for channels in (384, 768, 1536, 1792, 1800, 4096)}
    assert {channels: (plan.reads, plan.warps, plan.full, plan.tail) for channels, plan in plans.items()} == {
        384: (8, 1, 1, True),  # 256 values, then 128 more and 128 zeros
        768: (8, 1, 3, False),
        1536: (8, 1, 6, False),
        1792: (8, 1, 7, False),
        1800: (8, 2, 3, True),
        4096: (8, 4, 4, False),
    }
    assert plans[384].threads == 32 and mlx_row_sum_plan(8, mx.bfloat16).warps == 1
    assert mlx_row_sum_plan(1 << 20, mx.bfloat16).warps == 32
    float_plan = mlx_row_sum_plan(1536, mx.float32)
    assert (float_plan.reads, float_plan.warps, float_plan.full, float_plan.tail) == (4, 3, 4, False)
    assert VARIANTS[0] == ConvNormVariant("dtype", "float") and len(set(VARIANTS)) == 6
    assert variants_for("cuda") == VARIANTS and variants_for(None) == VARIANTS[:1]
    metal = variants_for("metal")
    assert metal[0] == VARIANTS[0] and {variant.rsqrt for variant in metal} == {"float", "divide_sqrt", "intrinsic"}
    assert len(metal) == 3


def test_conv_norm_cuda_source_adds_in_the_variants_accumulator() -> None:
    """The CUDA source's row sums add in the activations' type for the "dtype" accumulator (bf16 adds, as MLX's
    ``Sum`` with ``U = T``) and in float32 for the other; the Metal source's sums do not depend on it."""
    from engine.kernels.conv_norm import VARIANTS, _source
    from engine.kernels.source import CUDA, METAL

    for variant in VARIANTS:
        source = _source(CUDA, 1e-6, mx.bfloat16, variant)
        declared = "DT" if variant.accumulator == "dtype" else "float"
        assert f"{declared} sum = static_cast<{declared}>(0.0f);" in source
        assert f"{declared} squares = static_cast<{declared}>(0.0f);" in source
        assert source.count("__shfl_xor_sync") == 4  # each sum's warp butterfly and its across-warps one
        twin = next(other for other in VARIANTS if other.rsqrt == variant.rsqrt and other != variant)
        assert _source(METAL, 1e-6, mx.bfloat16, variant) == _source(METAL, 1e-6, mx.bfloat16, twin)


def test_code_sum_operations_add_each_codebooks_row_in_quantizer_order() -> None:
    """The kernel's fallback on its admission inputs (engine.kernels.code_sum): one frame's codes within each
    codebook, the stacked table and each codebook's first row; the operations sum exactly those rows in
    quantizer order."""
    from engine.kernels.code_sum import code_sum_ops, code_sum_samples

    codes, table, offsets = code_sum_samples(4, 16, 8, mx.bfloat16)
    assert codes.shape == (1, 4, 1) and table.shape == (64, 8) and offsets.reshape(-1).tolist() == [0, 16, 32, 48]
    assert int(codes.min().item()) >= 0 and int(codes.max().item()) < 16
    rows = [table[int(codes[0, q, 0].item()) + 16 * q] for q in range(4)]
    expected = ((rows[0] + rows[1]) + rows[2]) + rows[3]
    assert mx.array_equal(code_sum_ops(codes, table, offsets)[0, 0], expected).item()
