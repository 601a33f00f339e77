"""Fast numerics' kernels on this GPU: admitted or not, their difference from the fallback, and time per call.

    python3 tests/device/fast_kernels.py [quantized|draws|heads]   (bash tests/device/harness.sh setup fastkernels)

On the device only (the CPU has no kernels); with no argument, everything below, else that part alone.
Full-size shapes: the TTS backbone's 16 heads of 72 at batch 2 over 300, 2,000 and 7,500 cached
positions, one residual-VQ step over 1,024 entries of 512 (float32 and bf16 codebooks), and the backbone
layer's row products (two rows of 1,152, q/k/v 3 × 1,152, MLP 4,608) and the encoder's (one row of 1,024,
feed-forward 4,096; its six sublayers) reading bf16 weights, checked against
the CPU's float32 operations (beside MLX's own GPU products, which take reduced-precision inputs) and
timed against MLX's operations on the float32 copies exact mode reads. Then the LLM's quantized one-row
products (4 and 8 bits, group 64) against MLX's ``quantized_matmul``, timed over distinct weights (more
than the GPU's 50 MB L2 cache holds), with the bandwidth each reaches (``quantized``). Then a step's ten random
draws in one kernel against the library's one by one (``draws``), and the backbone's attention making its own
query and key heads against the heads kernel and the writing attention apart (``heads``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from engine.kernels.admission import admit_kernel, custom_kernel, gpu_kernel_backend, relative_l2
from engine.kernels.decode_attention import (
    DecodeAttention,
    decode_attention_heads_ops,
    decode_attention_heads_samples,
    decode_attention_ops,
    decode_attention_sample,
)
from engine.kernels.norm_rope import NormRope, norm_rope_ops, norm_rope_samples
from engine.kernels.quantized_product import (
    QuantizedRowProduct,
    QuantizedRowShape,
    RowRole,
    quantized_row_ops,
    quantized_row_samples,
)
from engine.kernels.residual_vq import NearestCode, NearestCodeProduct, nearest_code_ops, nearest_code_sample
from engine.kernels.row_product import RowProduct, RowProductShape, row_product_ops, row_product_samples
from engine.kernels.step_draws import (
    Draw,
    KeySkip,
    StepDraws,
    key_skip_samples,
    skip_key_ops,
    step_draws_ops,
    step_draws_samples,
)
from engine.random_model import random_voicechat


def per_call_us(function: Callable[..., Any], inputs: tuple[Any, ...], calls: int = 200) -> float:
    for _ in range(10):
        mx.eval(function(*inputs))
    started = time.perf_counter()
    for _ in range(calls):
        mx.eval(function(*inputs))
    return (time.perf_counter() - started) / calls * 1e6


def queued_us(function: Callable[..., Any], inputs: tuple[Any, ...], calls: int = 200) -> float:
    """Time per call with the calls queued and evaluated together, as a frame runs them (no sync each)."""
    for _ in range(3):
        mx.eval([function(*inputs) for _ in range(20)])
    started = time.perf_counter()
    mx.eval([function(*inputs) for _ in range(calls)])
    return (time.perf_counter() - started) / calls * 1e6


def outputs(result: Any) -> tuple[mx.array, ...]:
    return (result,) if isinstance(result, mx.array) else tuple(result)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    backend = gpu_kernel_backend()
    print("backend", backend)
    if backend is None:
        raise SystemExit("no GPU kernels on this device")
    if sys.argv[1:] == ["quantized"]:
        quantized_rows(backend)
        return
    if sys.argv[1:] == ["draws"]:
        step_draws(backend)
        key_skip(backend)
        return
    if sys.argv[1:] == ["heads"]:
        attention_heads(backend)
        return
    model = random_voicechat("structure", quantize=4, numerics="fast")
    print("fast changes in use on the structure model:", model.fast_changes)

    attention = DecodeAttention(backend, 16, 16, 72)
    for capacity, count in ((256, 200), (512, 300), (2048, 2000), (7680, 7500)):
        inputs = decode_attention_sample(16, 16, 72, capacity, count)
        got, want = attention(*inputs), decode_attention_ops(*inputs)
        admitted = admit_kernel("attention", attention, decode_attention_ops, inputs)
        print(
            f"attention over {count} of {capacity}: admitted {admitted}, relative L2 {relative_l2(got, want):.2e}, "
            f"max abs {mx.abs(got - want).max().item():.2e}; kernel {per_call_us(attention, inputs):.1f} us, "
            f"operations {per_call_us(decode_attention_ops, inputs):.1f} us per call"
        )

    rope = NormRope(backend, 16, 16, 72, 1e-6, 1_000_000.0)
    fallback = functools.partial(norm_rope_ops, query_heads=16, kv_heads=16, eps=1e-6, base=1_000_000.0)
    for position in (3, 1500, 7500, 30000):
        inputs = (*norm_rope_samples(16, 16, 72, mx.bfloat16)[0][:4], mx.array(position))
        got, want = rope(*inputs), fallback(*inputs)
        print(
            f"query and key heads at position {position}: relative L2 "
            f"{max(relative_l2(g, w) for g, w in zip(got, want, strict=True)):.2e}; "
            f"kernel {per_call_us(rope, inputs):.1f} us, operations {per_call_us(fallback, inputs):.1f} us per call"
        )

    steps = [("product apart", NearestCode(backend))]
    if backend == "cuda":
        steps.append(("product inside", NearestCodeProduct(backend)))
    for dtype, norms_dtype in ((mx.float32, mx.bfloat16), (mx.float32, mx.float32), (mx.bfloat16, mx.bfloat16)):
        inputs = nearest_code_sample(1024, 512, dtype, norms_dtype)
        want_codes = nearest_code_ops(*inputs)[0]
        for label, nearest in steps:
            got_codes = outputs(nearest(*inputs))[0]
            admitted = admit_kernel("nearest", nearest, nearest_code_ops, inputs, 0.0)
            print(
                f"residual-VQ step ({label}), {dtype} codebook, {norms_dtype} norms: admitted (bit for bit) "
                f"{admitted}, codes {got_codes.tolist()} against {want_codes.tolist()}; "
                f"kernel {per_call_us(nearest, inputs):.1f} us, "
                f"operations {per_call_us(nearest_code_ops, inputs):.1f} us per call"
            )
    # The product inside against the operations on many residuals: codes agree, and the distances' last bits.
    if backend == "cuda":
        product = NearestCodeProduct(backend)
        _, book, book_transposed, norms, _ = nearest_code_sample(1024, 512, mx.bfloat16)
        noisy = mx.random.normal((256, 512), key=mx.random.key(11)) * 2.0
        sums = mx.zeros((256, 512))
        got, want = (
            product(noisy, book, book_transposed, norms, sums),
            nearest_code_ops(noisy, book, book_transposed, norms, sums),
        )
        agree = mx.sum(got[0] == want[0]).item()
        print(f"residual-VQ step (product inside), 256 random residuals: {agree}/256 codes as the operations'")

    # MLX's floor for a custom kernel: one thread copying one float.
    copy = custom_kernel(backend, "parley_copy", ["x"], ["y"], cuda="y[0] = x[0];", metal="y[0] = x[0];")
    single = mx.ones((1,))

    def copy_one(x: mx.array) -> mx.array:
        return copy(inputs=[x], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)], output_dtypes=[x.dtype])[0]

    print(
        f"one-float custom kernel: {per_call_us(copy_one, (single,)):.1f} us per call with its sync, "
        f"{queued_us(copy_one, (single,)):.1f} us queued"
    )
    for shape in (
        RowProductShape(2, 1152, (1152, 1152, 1152), "norm"),
        RowProductShape(2, 1152, (1152, 1152, 1152), "residual_norm"),
        RowProductShape(2, 1152, (1152,), "none"),
        RowProductShape(2, 1152, (4608, 4608), "residual_norm", "gelu_gate"),
        RowProductShape(2, 4608, (1152,), "none"),
        # The encoder layer's six (engine.numerics._conformer_row_parts).
        RowProductShape(1, 1024, (4096,), "layer_norm", "silu"),
        RowProductShape(1, 4096, (1024,), "none", "residual", factor=0.5),
        RowProductShape(1, 1024, (1024, 1024, 1024), "layer_norm"),
        RowProductShape(1, 1024, (1024,), "none", "residual"),
        RowProductShape(1, 1024, (2048,), "layer_norm", "glu"),
        RowProductShape(1, 1024, (1024,), "conv_norm", "residual", taps=9),
    ):
        product = functools.partial(RowProduct(backend, shape, mx.bfloat16, mx.bfloat16), eps=1e-6)
        fallback = functools.partial(row_product_ops, eps=1e-6, epilogue=shape.epilogue, factor=shape.factor)
        inputs = row_product_samples(shape, mx.bfloat16, mx.bfloat16)
        float32_inputs = (inputs[0], tuple(weight.astype(mx.float32) for weight in inputs[1]), *inputs[2:])
        mx.eval(inputs, float32_inputs)
        with mx.stream(mx.cpu):
            reference = outputs(fallback(*float32_inputs))
            mx.eval(reference)
        got, on_gpu = outputs(product(*inputs)), outputs(fallback(*float32_inputs))
        admitted = admit_kernel("row product", product, fallback, inputs, reference_device=mx.cpu)
        print(
            f"row product {shape}: admitted {admitted}; relative L2 to the CPU's float32 operations: kernel "
            f"{worst_l2(got, reference):.2e}, MLX's operations on this GPU {worst_l2(on_gpu, reference):.2e}; "
            f"operations (float32 weights) {per_call_us(fallback, float32_inputs):.1f} us per call with its sync, "
            f"{queued_us(fallback, float32_inputs):.1f} us queued"
        )
        for warps in (4, 8, 16, 32):
            if warps % shape.split:
                continue
            variant = functools.partial(RowProduct(backend, shape, mx.bfloat16, mx.bfloat16, warps=warps), eps=1e-6)
            error = worst_l2(outputs(variant(*inputs)), reference)
            synced, queued = per_call_us(variant, inputs), queued_us(variant, inputs)
            print(
                f"  kernel, {warps} warps per block (bf16 weights): {error:.1e}, "
                f"{synced:.1f} us with its sync, {queued:.1f} us queued"
            )
    quantized_rows(backend)
    step_draws(backend)
    key_skip(backend)
    attention_heads(backend)


def step_draws(backend: str) -> None:
    """A full-size step's ten draws (five rounds of a uniform over 1,024 components and a normal over 512)
    made at once, against the library's draws one by one: admitted or not, bit for bit over many keys (each
    draw and the key handed on), and time per call."""
    plan = (Draw("uniform", (1, 1024)), Draw("normal", (1, 512))) * 5
    try:
        kernel = StepDraws(backend, plan)
    except ValueError as exc:
        print(f"step draws: no kernel ({exc})")
        return
    fallback = functools.partial(step_draws_ops, plan=plan)
    admitted = all(admit_kernel("step draws", kernel, fallback, inputs, 0.0) for inputs in step_draws_samples())
    keys = mx.random.randint(0, 2**31 - 1, (200, 2), key=mx.random.key(5)).astype(mx.uint32) * 2 + 1
    equal = 0
    for index in range(keys.shape[0]):
        got, want = kernel(keys[index]), fallback(keys[index])
        equal += all(mx.array_equal(g, w).item() for g, w in zip(got, want, strict=True))
    inputs = (step_draws_samples()[0][0],)
    print(
        f"step draws (ten, full size): admitted (bit for bit) {admitted}; {equal}/{keys.shape[0]} random keys "
        f"give the library's draws and next key bit for bit; kernel {per_call_us(kernel, inputs):.1f} us, "
        f"operations {per_call_us(fallback, inputs):.1f} us per call"
    )


def key_skip(backend: str) -> None:
    """A 900-position prompt's skipped draws (9,000 splits) in one launch against the library's splits one by one:
    admitted or not, the same key, and the time of each."""
    kernel = KeySkip(backend)
    admitted = all(admit_kernel("key skip", kernel, skip_key_ops, inputs, 0.0) for inputs in key_skip_samples())
    inputs = (mx.random.key(7), mx.array([9_000], dtype=mx.uint32))
    same = mx.array_equal(kernel(*inputs), skip_key_ops(*inputs)).item()
    print(
        f"key skip: admitted (bit for bit) {admitted}; 9,000 splits give the library's key: {same}; kernel "
        f"{per_call_us(kernel, inputs):.1f} us, operations {per_call_us(skip_key_ops, inputs, calls=3):.1f} us per call"
    )


def attention_heads(backend: str) -> None:
    """The TTS backbone's attention kernel making its own query and key heads (the writing form): admitted
    against the operations or not, whether it gives the two-kernel form's outputs and written key bit for bit (the
    heads kernel, then the writing attention), and time per call of each form."""
    base, eps = 1_000_000.0, 1e-6
    attention = DecodeAttention(backend, 16, 16, 72)
    rope = NormRope(backend, 16, 16, 72, eps, base)
    fallback = functools.partial(decode_attention_heads_ops, query_heads=16, kv_heads=16, eps=eps, base=base)
    folded = attention.heads_kernel(rope.params)

    def heads_apart(*inputs: Any) -> tuple[mx.array, ...]:
        q_rows, k_rows, new_values, q_scale, k_scale, position, key_buffer, value_buffer, count, slot, scale = inputs
        queries, keys = rope(q_rows, k_rows, q_scale, k_scale, position)
        return attention.writing_check(queries, keys, new_values, key_buffer, value_buffer, count, slot, scale)

    for inputs in decode_attention_heads_samples(16, 16, 72, mx.bfloat16):
        admitted = admit_kernel("attention with heads", folded, fallback, inputs)
        got, apart = folded(*inputs), heads_apart(*inputs)
        same = all(mx.array_equal(a, b).item() for a, b in zip(got, apart, strict=True))
        print(
            f"attention with heads over {inputs[8]} (slot {inputs[9]}): admitted {admitted}, relative L2 to the "
            f"operations {worst_l2(outputs(got), outputs(fallback(*inputs))):.2e}, outputs and buffers bit for bit "
            f"those of the two kernels {same}; inside {per_call_us(folded, inputs):.1f} us, "
            f"apart {per_call_us(heads_apart, inputs):.1f} us per call (each with copies of the buffers)"
        )


def quantized_rows(backend: str) -> None:
    """The LLM's quantized products for one row, plain and in their blocks' roles (the residual add, the squared
    ReLU, the Mamba mixer's gated norm finished from the step's partial sums, and the chained step's residual add
    with the next block's norm): admitted or not, and time and
    bandwidth per call, queued as a frame queues them, over distinct weights so that the L2 cache does not
    serve them."""
    # The full model's projections: Mamba in and out, the MLP's up and down, the heads; then the fused ones
    # (the Mamba norm's 8 groups of 1,280, summed by the step in 640 runs of 16 rows).
    plain = ((4480, 22656), (10240, 4480), (4480, 15680), (15680, 4480), (4480, 131072))
    mamba_out = RowRole("residual", "group_norm", norm_groups=8, norm_partials=640)
    # The chained step's last projections, each also writing the next block's norm (eps 1e-5, the checkpoint's).
    mamba_chained = dataclasses.replace(mamba_out, epilogue="residual_norm", next_eps=1e-5)
    chained = RowRole("residual_norm", next_eps=1e-5)
    fused = (
        (10240, 4480, mamba_out),
        (4480, 15680, RowRole("relu2")),
        (15680, 4480, RowRole("residual")),
        (10240, 4480, mamba_chained),
        (15680, 4480, chained),
        (4096, 4480, chained),
    )
    for bits in (4, 8):
        for width, outputs_, role in [(*pair, RowRole()) for pair in plain] + list(fused):
            shape = QuantizedRowShape(width, outputs_, bits, 64, role)
            fallback = functools.partial(quantized_row_ops, group_size=64, bits=bits, role=role)
            kernel = QuantizedRowProduct(backend, shape)
            first = quantized_row_samples(shape, mx.bfloat16)
            copies = max(2, 400_000_000 // (width * outputs_ * bits // 8))
            samples = [first]
            for _ in range(1, copies):
                _, weight, scales, biases, *_ = quantized_row_samples(shape, mx.bfloat16)
                samples.append((first[0], weight, scales, biases, *first[4:]))
            mx.eval(samples)
            admitted = admit_kernel("quantized row", kernel, fallback, first)
            error = worst_l2(outputs(kernel(*first)), outputs(fallback(*first)))
            nbytes = sum(array.nbytes for array in first[1:4])
            timings = []
            for function in (kernel, fallback):
                for _ in range(3):
                    mx.eval([function(*inputs) for inputs in samples])
                started = time.perf_counter()
                rounds = max(1, 200 // copies)
                for _ in range(rounds):
                    mx.eval([function(*inputs) for inputs in samples])
                timings.append((time.perf_counter() - started) / (rounds * copies) * 1e6)
            parts = "".join(f" {part}" for part in (role.prologue, role.epilogue) if part != "none")
            print(
                f"quantized row {bits}-bit {width}->{outputs_}{parts} (split {kernel.split}, sets {kernel.sets}): "
                f"admitted {admitted}, relative L2 to MLX {error:.1e}; kernel {timings[0]:.1f} us "
                f"({nbytes / timings[0] / 1e3:.0f} GB/s), MLX {timings[1]:.1f} us ({nbytes / timings[1] / 1e3:.0f}"
                f" GB/s) per call, queued over {copies} distinct weights"
            )


def worst_l2(got: tuple[mx.array, ...], want: tuple[mx.array, ...]) -> float:
    return max(relative_l2(g, w) for g, w in zip(got, want, strict=True))


if __name__ == "__main__":
    main()
