"""Layouts of two bandwidth-bound kernels on this GPU, side by side in one process: admitted or not, and
time per call queued as a frame queues them, with the bandwidth each reaches.

Run on the device (never in CI): ``python3 tests/device/kernel_layouts.py``.

- The TTS backbone's single-position attention (16 heads of 72, two rows) over 200, 2,000 and 7,500
  cached positions, with 2 or 4 lanes reading a key together, 16 or 32 keys a warp reads at once
  (``keys_per_step``) and 128 to 2,048 keys a block (``keys_per_block``), each call over its own layer's
  buffers, as the backbone's 28 layers run (a ten-minute conversation reads 7,500): the kernels' GPU time
  from CUPTI's records (PyTorch's profiler), the attention's and the merge's apart, and the host's queued
  time. ``python3 tests/device/kernel_layouts.py attention [BEFORE.py]``: this only; with another build's
  ``engine/kernels/decode_attention.py`` (``git show REV:engine/kernels/decode_attention.py > tests/device/…``), its
  default layout first, for the same measurement.
- The LLM's 4-bit quantized one-row products with 4, 8 or 16 columns a warp and at most 4, 8 or 16
  warps a block, over distinct weights (more than the GPU's 50 MB L2 cache holds). ``… quantized``: this only.
- The residual-VQ steps of a frame, the distance product apart or inside the step's kernel: ``… residualvq``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import mlx.core as mx

from engine.kernels.admission import admit_kernel, custom_kernel, gpu_kernel_backend, relative_l2
from engine.kernels.decode_attention import DecodeAttention, decode_attention_ops, decode_attention_sample
from engine.kernels.quantized_product import (
    QuantizedRowProduct,
    QuantizedRowShape,
    quantized_row_ops,
    quantized_row_samples,
)
from engine.kernels.residual_vq import NearestCode, NearestCodeProduct, nearest_code_ops

LAYERS = 28
# (lanes a key, keys a warp reads at once, keys a block takes) for the attention.
ATTENTION_LAYOUTS = ((4, 32, 2048), (4, 32, 1024), (4, 16, 512), (2, 32, 2048), (4, 16, 128))
# Rounds over all layouts in turn: GPU time of one kernel moves ±20 % between runs, so each layout's median.
ROUNDS = 3


def queued_us(function: Callable[..., Any], samples: Sequence[tuple[Any, ...]], calls: int = 112) -> float:
    """Microseconds per call, ``calls`` calls cycling over ``samples`` queued and evaluated together."""
    for _ in range(2):
        mx.eval([function(*samples[i % len(samples)]) for i in range(len(samples))])
    started = time.perf_counter()
    mx.eval([function(*samples[i % len(samples)]) for i in range(calls)])
    return (time.perf_counter() - started) / calls * 1e6


def kernel_us(
    function: Callable[..., Any], samples: Sequence[tuple[Any, ...]], calls: int = 112, ours: str = "attention"
) -> dict[str, float]:
    """GPU microseconds per call by kernel (CUPTI's records), ``calls`` calls cycling over ``samples``: the
    merge, Parley's other kernels (named ``ours``) and MLX's (``other``)."""
    import torch  # the device's; only this measurement needs it
    from torch.profiler import ProfilerActivity, profile

    mx.eval([function(*samples[i % len(samples)]) for i in range(len(samples))])
    mx.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        mx.eval([function(*samples[i % len(samples)]) for i in range(calls)])
        mx.synchronize()
    times: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = "merge" if "merge" in event.name else ours if "parley" in event.name else "other"
            times[name] += event.time_range.elapsed_us() / calls
    return dict(times)


def attention_steps(backend: str, before: ModuleType | None) -> None:
    for capacity, count in ((256, 200), (2048, 2000), (7680, 7500)):
        first = decode_attention_sample(16, 16, 72, capacity, count)
        samples = [first]
        for layer in range(1, LAYERS):
            keys = mx.random.split(mx.random.key(layer), 2)
            keys_, values_ = (mx.random.normal(first[1].shape, key=key) for key in keys)
            samples.append((first[0], keys_, values_, *first[3:]))
        mx.eval(samples)
        nbytes = 2 * first[1][..., :count, :].nbytes
        kernels: list[tuple[str, Callable[..., Any]]] = []
        if before is not None:
            kernels.append(("before", before.DecodeAttention(backend, 16, 16, 72)))
        for lanes, step, per_block in ATTENTION_LAYOUTS:
            kernel = DecodeAttention(
                backend, 16, 16, 72, keys_per_step=step, keys_per_block=per_block, lanes_per_key=lanes
            )
            name = f"{lanes} lanes, {step} keys a step, {per_block} a block"
            kernels.append((f"{name}: {kernel.splits(count)} blocks a head of {kernel.chunk(count)}", kernel))
        print(f"attention over {count} ({nbytes / 1e6:.1f} MB a call):", flush=True)
        timed: dict[str, list[dict[str, float]]] = defaultdict(list)
        for name, kernel in kernels:
            admitted = admit_kernel("attention", kernel, decode_attention_ops, first)
            error = relative_l2(kernel(*first), decode_attention_ops(*first))
            print(f"  {name}: {'ok' if admitted else 'NOT ADMITTED'} {error:.1e}", flush=True)
        for _ in range(ROUNDS):
            for name, kernel in kernels:
                timed[name].append(kernel_us(kernel, samples))
        for name, kernel in kernels:
            runs = sorted(timed[name], key=lambda gpu: gpu.get("attention", 0.0) + gpu.get("merge", 0.0))
            middle = runs[len(runs) // 2]
            total = middle.get("attention", 0.0) + middle.get("merge", 0.0)
            each = ", ".join(f"{gpu.get('attention', 0.0) + gpu.get('merge', 0.0):.1f}" for gpu in timed[name])
            print(
                f"  {name}: GPU median {total:.1f} us (attention {middle.get('attention', 0.0):.1f}, merge "
                f"{middle.get('merge', 0.0):.1f}; {nbytes / total / 1e3:.0f} GB/s; rounds {each}); "
                f"queued {queued_us(kernel, samples):.1f} us",
                flush=True,
            )
        print(f"  operations: queued {queued_us(decode_attention_ops, samples):.1f} us", flush=True)


def load_before(path: str, name: str) -> ModuleType:
    """Another build's module, inside the engine package (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def quantized_layouts(backend: str) -> None:
    shapes = ((4480, 22656), (10240, 4480), (4480, 15680), (15680, 4480))
    layouts = ((8, 8), (4, 8), (4, 16), (8, 4), (8, 16), (16, 8))
    for width, outputs in shapes:
        base = QuantizedRowShape(width, outputs, 4, 64)
        first = quantized_row_samples(base, mx.bfloat16)
        copies = max(2, 400_000_000 // (width * outputs // 2))
        samples = [first]
        for _ in range(1, copies):
            _, weight, scales, biases, *_ = quantized_row_samples(base, mx.bfloat16)
            samples.append((first[0], weight, scales, biases, *first[4:]))
        mx.eval(samples)
        fallback = functools.partial(quantized_row_ops, group_size=64, bits=4)
        nbytes = sum(array.nbytes for array in first[1:4])
        line = [f"quantized 4-bit {width}->{outputs}:"]
        for columns, max_warps in layouts:
            shape = QuantizedRowShape(width, outputs, 4, 64, columns=columns, max_warps=max_warps)
            kernel = QuantizedRowProduct(backend, shape)
            admitted = admit_kernel("quantized row", kernel, fallback, first)
            took = queued_us(kernel, samples, calls=4 * copies)
            line.append(
                f"{columns}x{max_warps} (split {kernel.split}, sets {kernel.sets}) "
                f"{'ok' if admitted else 'NOT ADMITTED'} {took:.1f} us ({nbytes / took / 1e3:.0f} GB/s);"
            )
        line.append(f"MLX {queued_us(fallback, samples, calls=4 * copies):.1f} us")
        print(" ".join(line), flush=True)


def residual_vq_steps(backend: str) -> None:
    """A frame's 31 residual-VQ steps chained as the MaskGIT rounds chain them, on bf16 codebooks as a model
    loaded for fast holds them (124 distinct ones, beyond the L2 cache): the operations, the product apart
    (MLX's product, then the step kernel) and the product inside (one kernel a step). GPU time per frame's
    steps from CUPTI's records and the host's queued time, medians of alternating rounds; and whether the
    product inside picks the operations' codes."""
    count, quantizers = 124, 31
    keys = mx.random.split(mx.random.key(100), count + 1)
    books = [mx.random.normal((1024, 512), key=keys[i]).astype(mx.bfloat16) for i in range(count)]
    transposed = [book.T for book in books]
    norms = [mx.sum(book * book, axis=-1) for book in books]
    residual = mx.random.normal((1, 512), key=keys[count]) * 4.0
    mx.eval(books, transposed, norms, residual)

    def frame(step: Callable[..., Any], first: int) -> list[mx.array]:
        latent, total, codes = residual, mx.zeros((1, 512)), []
        for quantizer in range(quantizers):
            at = (first + quantizer) % count
            code, latent, total = step(latent, books[at], transposed[at], norms[at], total)
            codes.append(code)
        return [mx.concatenate(codes, axis=-1), latent, total]

    steps: list[tuple[str, Callable[..., Any]]] = [("operations", nearest_code_ops), ("apart", NearestCode(backend))]
    if backend == "cuda":
        steps.append(("inside", NearestCodeProduct(backend)))
    firsts = range(0, count, quantizers)
    want = [frame(nearest_code_ops, first) for first in firsts]
    for label, step in steps[1:]:
        got = [frame(step, first) for first in firsts]
        same = all(mx.array_equal(g[0], w[0]).item() for g, w in zip(got, want, strict=True))
        worst = max(relative_l2(g[2], w[2]) for g, w in zip(got, want, strict=True))
        print(f"residual VQ ({label}): codes as the operations' in {len(want)} frames: {same}; sums {worst:.1e}")
    if backend == "cuda":
        steps.extend(residual_vq_probes())
    gpu: dict[str, list[float]] = defaultdict(list)
    host: dict[str, list[float]] = defaultdict(list)
    parts: dict[str, dict[str, float]] = {}
    for _ in range(ROUNDS):
        for label, step in steps:
            samples = [(step, first) for first in firsts]
            parts[label] = kernel_us(frame, samples, calls=8, ours="step")
            gpu[label].append(sum(parts[label].values()))
            host[label].append(queued_us(frame, samples, calls=8))
    for label, _ in steps:
        split = ", ".join(f"{name} {took:.1f}" for name, took in sorted(parts[label].items()))
        print(
            f"residual VQ ({label}): {sorted(gpu[label])[ROUNDS // 2]:.1f} us GPU ({split}), "
            f"{sorted(host[label])[ROUNDS // 2]:.1f} us queued per frame's {quantizers} steps (medians of {ROUNDS})",
            flush=True,
        )


class _ProbeStep:
    """A variant of the product-inside kernel's source, for timing only (its results are not checked)."""

    def __init__(self, source: str, inputs: list[str], outputs: list[str], init: bool, tickets: int = 32) -> None:
        self.kernel = custom_kernel("cuda", "parley_probe", inputs, outputs, cuda=source, metal="")
        self.inputs, self.outputs, self.init = inputs, outputs, init
        self.tickets = mx.zeros((tickets,), dtype=mx.int32)
        mx.eval(self.tickets)

    def __call__(self, residual: mx.array, book: mx.array, _: mx.array, norms: mx.array, total: mx.array) -> Any:
        arrays = {"residual": residual, "book": book, "norms": norms, "chosen_sum": total, "tickets": self.tickets}
        shapes = {"code": (1, 1), "residual_out": (1, 512), "chosen_sum_out": (1, 512), "share_best": (1, 32)}
        shapes.update({"share_index": (1, 32), "tickets_out": (32,)})
        types = {"code": mx.int32, "share_index": mx.int32, "tickets_out": mx.int32}
        template = [("C", 1024), ("L", 512), ("THREADS", 256), ("CODES_PER_BLOCK", 32), ("SHARES", 32)]
        template.append(("TICKET_STRIDE", 32))
        result = self.kernel(
            inputs=[arrays[name] for name in self.inputs],
            template=[*template, ("BT", book.dtype), ("NT", norms.dtype)],
            grid=(32 * 256, 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[shapes[name] for name in self.outputs],
            output_dtypes=[types.get(name, mx.float32) for name in self.outputs],
            init_value=0 if self.init else None,
        )
        return result[0], result[1], result[2]


def residual_vq_probes() -> list[tuple[str, Callable[..., Any]]]:
    """Where the product-inside kernel's time goes: its tickets as a zero-filled output instead of an input
    it resets, its blocks' products alone (no tickets, no last block), 16-byte loads of the codebook, and its
    tickets in 4 bytes (which MLX's CUDA allocator serves from unified memory on the host)."""
    from engine.kernels.residual_vq import _NEAREST_PRODUCT_CUDA as source

    inputs = ["residual", "book", "norms", "chosen_sum", "tickets"]
    outputs = ["code", "residual_out", "chosen_sum_out", "share_best", "share_index"]
    filled = source.replace("const_cast<int*>(tickets)[row * TICKET_STRIDE] = 0;", "").replace(
        "int* row_ticket = const_cast<int*>(tickets) + row * TICKET_STRIDE;", "int* row_ticket = tickets_out;"
    )
    alone = source[: source.index("        __threadfence();")] + "    }\n"
    vector = source.replace(
        "for (int i = 0; i < PER_LANE; ++i) query[i] = z[lane + 32 * i];",
        "for (int i = 0; i < PER_LANE; ++i) query[i] = z[(i / 8) * 256 + lane * 8 + i % 8];",
    ).replace(
        "for (int i = 0; i < PER_LANE; ++i) dot += query[i] * static_cast<float>(entry[lane + 32 * i]);",
        "for (int h = 0; h < PER_LANE / 8; ++h) {\n"
        "            const uint4 packed = reinterpret_cast<const uint4*>(entry)[lane + 32 * h];\n"
        "            const __nv_bfloat16* eight = reinterpret_cast<const __nv_bfloat16*>(&packed);\n"
        "            #pragma unroll\n"
        "            for (int e = 0; e < 8; ++e) dot += query[h * 8 + e] * __bfloat162float(eight[e]);\n"
        "        }",
    )
    return [
        ("tickets filled", _ProbeStep(filled, inputs[:4], [*outputs, "tickets_out"], init=True)),
        ("products alone", _ProbeStep(alone, inputs[:4], outputs, init=False)),
        ("16-byte loads", _ProbeStep(vector, inputs, outputs, init=False)),
        ("tickets on the host", _ProbeStep(source, inputs, outputs, init=False, tickets=1)),
    ]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    backend = gpu_kernel_backend()
    if backend is None:
        raise SystemExit("no GPU kernels on this device")
    if sys.argv[1:2] == ["residualvq"]:
        residual_vq_steps(backend)
        return
    if sys.argv[1:2] != ["quantized"]:
        before = load_before(sys.argv[2], "engine.decode_attention_before") if sys.argv[2:] else None
        attention_steps(backend, before)
    if sys.argv[1:2] != ["attention"]:
        quantized_layouts(backend)


if __name__ == "__main__":
    main()
