"""CUDA sources that only a GPU builds, compiled here as C++ with CUDA's names stubbed (``g++ -fsyntax-only``):
the encoder's and the TTS backbone's chains of row products (:mod:`engine.kernels.row_chain`), the RN-T loop
(:class:`engine.kernels.greedy_attempt.GreedyLoop`) and the single-position attention's three forms over float32 and
bf16 buffers (:class:`engine.kernels.decode_attention.DecodeAttention`, its text in
:mod:`engine.kernels.decode_attention_source`), each with the parameters MLX declares for it. This catches what a
compiler catches — names, types, ``const`` and ``volatile``, a template's instantiation — before a device run does;
what the kernels compute is checked on the device, where a load admits each against the kernels or operations it
replaces."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

import engine.kernels.decode_attention as decode_attention
import engine.kernels.decode_attention_source as decode_attention_source
import engine.kernels.greedy_attempt as greedy_attempt
import engine.kernels.row_chain as row_chain
import engine.kernels.row_product as row_product
from engine.kernels.admission import TICKET_STRIDE
from engine.random_model import random_voicechat

# Just enough of CUDA for a kernel body to be C++: the names it uses, with host stand-ins.
_CUDA_STUBS = r"""
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <algorithm>
using std::max;
using std::min;
struct Index { unsigned x, y, z; };
static const Index threadIdx{}, blockIdx{}, gridDim{}, blockDim{};
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct __nv_bfloat16 { unsigned short bits; operator float() const { return 0.0f; } };
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
#define __device__
#define __forceinline__ inline
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float2 __bfloat1622float2(__nv_bfloat162 pair) { return {float(pair.x), float(pair.y)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2) { return {}; }
inline void __syncwarp() {}
inline float __bfloat162float(__nv_bfloat16 value) { return float(value); }
inline __nv_bfloat16 __float2bfloat16_rn(float) { return {}; }
inline float __int_as_float(int) { return 0.0f; }
inline float rsqrtf(float value) { return 1.0f / std::sqrt(value); }
template <typename T> T __shfl_xor_sync(unsigned, T value, int) { return value; }
inline void __syncthreads() {}
inline void __threadfence() {}
inline int atomicAdd(int* address, int value) { const int old = *address; *address += value; return old; }
inline int atomicExch(int* address, int value) { const int old = *address; *address = value; return old; }
inline long long clock64() { return 0; }
"""
_TYPES = {mx.float32: "float", mx.bfloat16: "__nv_bfloat16", mx.int32: "int"}


def _compiles(
    tmp_path: Path, name: str, body: str, parameters: list[str], template: str = "", instance: str = ""
) -> None:
    source = f"{_CUDA_STUBS}\n{template}\nvoid {name}({', '.join(parameters)}) {{\n{body}\n}}\n{instance}\n"
    path = tmp_path / f"{name}.cpp"
    path.write_text(source)
    compiler = shutil.which("g++")
    assert compiler is not None, "needs g++ (packaging/system-deps.sh installs it)"
    result = subprocess.run(
        [compiler, "-std=c++17", "-fsyntax-only", "-Wno-unknown-pragmas", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-4000:]


def _no_kernel(*args: Any, **kwargs: Any) -> None:
    return None  # the CPU cannot build a CUDA kernel: its source is what these tests read


@pytest.mark.parametrize("network", ["encoder", "backbone"])
def test_the_row_chains_sources_compile(network: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_product, "custom_kernel", _no_kernel)
    voicechat = random_voicechat("tiny", quantize=4, numerics="fast")
    model = voicechat.model
    if network == "encoder":
        encoder = model.stt_model.perception.encoder
        assert encoder.fast is not None and encoder.fast.rows is not None
        shapes = dict(encoder.fast.rows.shapes)
        runs = encoder.fast.row_runs(encoder)
    else:
        module = model.tts_model.tts_model.backbone
        parts = module.layers[0].rows
        shapes = dict(parts.shapes)
        runs = module.row_runs()
    assert runs
    for key in runs:
        products = [row_product.RowProduct("cuda", shapes[name], mx.bfloat16, mx.float32) for name, _ in key]
        links = {(step, name): (source, output) for step, (_, made) in enumerate(key) for name, source, output in made}
        parameters = []
        for step, product in enumerate(products):
            for name in product.input_names:
                if (step, name) not in links:
                    kind = "__nv_bfloat16" if name.startswith("w") else "float"
                    parameters.append(f"const {kind}* s{step}_{name}")
        parameters.append("const int* tickets")
        for step, product in enumerate(products):
            parameters.extend(f"float* s{step}_{name}" for name in product.output_names)
        _compiles(tmp_path, f"chain_{len(key)}", row_chain._chain_source(products, links), parameters)


def test_the_greedy_loop_source_compiles(tmp_path: Path) -> None:
    shape = greedy_attempt.GreedyLoopShape(640, 2, 1025, 640, 1025, "relu", round_input=True)
    dtypes = {"table": mx.bfloat16, "indices0": mx.int32, "pred_weight": mx.float32, "out_weight": mx.float32}
    dtypes.update({f"{name}{layer}": mx.bfloat16 for layer in range(shape.layers) for name in ("wx", "wh", "bias")})
    parameters = [f"const {_TYPES[dtypes.get(name, mx.float32)]}* {name}" for name in shape.inputs]
    parameters.append("const int* tickets")
    parameters += ["float* states_h", "float* states_c", "float* activated", "float* all_values", "int* all_indices"]
    names = ("H", "J", "C", "P", "LAYERS", "ATTEMPTS", "STARTED", "WARPS")
    template = f"template <{', '.join(f'int {name}' for name in names)}, typename TT, typename PWT, typename OWT>"
    instances = []
    for started in (0, 1):  # the start symbol's first attempt, and a frame's incoming token's
        values = (640, 640, 1025, shape.scores().partials, 2, 10, started, greedy_attempt.WARPS)
        arguments = ", ".join([*map(str, values), "__nv_bfloat16", "float", "float"])
        instances.append(f"template void greedy_loop<{arguments}>({', '.join(parameters)});")
    instance = "\n".join(instances)
    _compiles(tmp_path, "greedy_loop", greedy_attempt._loop_source(shape), parameters, template, instance)


@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize("form", ["read", "writing", "heads"])
@pytest.mark.parametrize("buffers", [mx.float32, mx.bfloat16])
def test_the_attention_sources_compile(form: str, buffers: mx.Dtype, merged: bool, tmp_path: Path) -> None:
    """Each form of the backbone's attention kernel over the cache buffers fast mode may hand it: float32 (the
    LLM's) and bf16 (the TTS backbone's), read through the header's overloads for the buffer's type; and each with
    its blocks merging their own shares (a ticket per group, the last block merging)."""
    stored = _TYPES[buffers]
    inputs = decode_attention_source.FORM_INPUTS[form]
    kinds = {"keys": stored, "values": stored, "bounds": "int", "at_position": "int", "tickets": "int"}
    parameters = [f"const {kinds.get(name, 'float')}* {name}" for name in [*inputs, *(["tickets"] if merged else [])]]
    parameters += ["const int* keys_shape", "float* out", *(["float* partials"] if merged else [])]
    source = decode_attention_source.attention_cuda(writing=form != "read", heads=form == "heads", merged=merged)
    names = ("HQ", "HKV", "D", "WARPS", "LANES", "ROUNDS", "CHUNK_BITS", "SLOT_SHIFT")
    names += ("SHARES", "TICKET_STRIDE") if merged else ()
    template = f"template <{', '.join(f'int {name}' for name in names)}, bool FINAL>"
    instances = []
    for final in ("true", "false"):
        values = [16, 16, 72, decode_attention.WARPS, decode_attention.LANES_PER_KEY, 4, 4095, 12]
        values += [decode_attention.MERGED_SHARES, TICKET_STRIDE] if merged else []
        arguments = ", ".join([*map(str, values), final])
        instances.append(f"template void attention<{arguments}>({', '.join(parameters)});")
    header = decode_attention_source.BUFFER_CUDA
    _compiles(tmp_path, "attention", source, parameters, f"{header}\n{template}", "\n".join(instances))


def test_the_merged_heads_check_needs_its_rope_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The merged heads form's check norms and rotates with the rope parameters it is given: without them it is
    refused where it is asked for, not when the kernel first reads them; the other forms need none."""
    monkeypatch.setattr(decode_attention, "custom_kernel", _no_kernel)
    attention = decode_attention.DecodeAttention("cuda", 16, 16, 72)
    with pytest.raises(ValueError, match="rope parameters"):
        attention.merged_kernel("heads")
    assert callable(attention.merged_kernel("heads", rope=mx.zeros((2,))))
    assert callable(attention.merged_kernel("writing")) and callable(attention.merged_kernel("read"))
