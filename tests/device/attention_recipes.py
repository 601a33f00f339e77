"""The attention kernel's CUDA launches, recorded here on the CPU, for ``attention_cupy.py`` to run on a GPU without
MLX (the device's own CuPy builds them): a check of the kernels' arithmetic that needs one short device call and no
MLX wheel.

For the TTS backbone's layout (16 heads of 72, batch 2, norming and rotating its heads) and the LLM's (32 over 8 of
128), each form (reading as stored, writing the new position, making its heads) over float32 and bf16 buffers, plain
and merging its shares, on the admission's cases (one of them past a block's keys): :class:`DecodeAttention` is made
for ``"cuda"`` with MLX's ``cuda_kernel`` replaced by a recorder, so each launch is recorded as this build makes it
(source, constants, grid, block, inputs), and the fallback's results are kept as the expected ones. The kernel's
source is wrapped as MLX's CUDA backend wraps it (``mlx/backend/cuda/custom_kernel.cpp``: inputs, shapes, outputs,
the template values as constants), a shape passed as a device array.

The key and value buffers (up to 57 MB each) travel as seeds: both sides draw them with NumPy's PCG64 and round to
bf16 the same way. Run: ``python tests/device/attention_recipes.py .attn-cases`` (then carry ``.attn-cases``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from seeded_buffers import drawn  # a sibling script, shared with attention_cupy.py (which has no MLX)

import engine.kernels.decode_attention as decode_attention
from engine.kernels.admission import KERNEL_TOLERANCE
from engine.kernels.decode_attention import (
    DecodeAttention,
    NormRope,
    decode_attention_heads_ops,
    decode_attention_heads_samples,
    decode_attention_ops,
    decode_attention_samples,
    decode_attention_writing_ops,
    decode_attention_writing_samples,
)

BASE, EPS = 1_000_000.0, 1e-6
LARGE = 1 << 20  # bytes: arrays this large travel as seeds
_CUDA_TYPES = {mx.float32: "float", mx.bfloat16: "__nv_bfloat16", mx.int32: "int"}
_NAMES = {mx.float32: "float32", mx.bfloat16: "bfloat16", mx.int32: "int32"}


def as_numpy(array: mx.array) -> np.ndarray:
    """``array``'s values; bf16 as its bits (uint16)."""
    if array.dtype == mx.bfloat16:
        return np.array(array.view(mx.uint16))
    return np.array(array)


class Recorder:
    """Stands in for ``mx.fast.cuda_kernel``: records each launch and hands back zeros of the output shapes."""

    def __init__(self) -> None:
        self.launches: list[dict[str, Any]] = []
        self.arrays: dict[str, np.ndarray] = {}  # small inputs, by content hash
        self.seeds: dict[str, dict[str, Any]] = {}  # large inputs' content hash -> how to draw them
        self._outputs: dict[int, tuple[int, int]] = {}  # id of a handed-back output -> (launch, output)
        self._inputs: dict[int, tuple[int, int]] = {}  # id of an input array -> (launch, input)
        self._alive: list[mx.array] = []  # keeps the ids above from being reused

    def drawn_array(self, seed: int, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
        values = drawn(seed, shape, _NAMES[dtype])
        array = mx.array(values.view(np.uint16) if dtype == mx.bfloat16 else values)
        array = array.view(mx.bfloat16) if dtype == mx.bfloat16 else array
        recipe = {"seed": seed, "shape": list(shape), "dtype": _NAMES[dtype]}
        self.seeds[self._hash(as_numpy(array))] = {**recipe, "sha256": hashlib.sha256(values.tobytes()).hexdigest()}
        return array

    @staticmethod
    def _hash(values: np.ndarray) -> str:
        return hashlib.sha256(values.tobytes() + str(values.shape).encode() + values.dtype.str.encode()).hexdigest()

    def kernel(self, name: str, input_names: list[str], output_names: list[str], source: str, header: str) -> Any:
        def launch(
            *,
            inputs: list[mx.array],
            template: list[tuple[str, Any]],
            grid: tuple[int, int, int],
            threadgroup: tuple[int, int, int],
            output_shapes: list[tuple[int, ...]],
            output_dtypes: list[mx.Dtype],
        ) -> list[mx.array]:
            index = len(self.launches)
            arguments, parameters = [], []
            for position, (input_name, array) in enumerate(zip(input_names, inputs, strict=True)):
                parameters.append(f"const {_CUDA_TYPES[array.dtype]}* {input_name}")
                arguments.append({"kind": "input", "name": input_name, **self._argument(array)})
                self._inputs[id(array)] = (index, position)
                self._alive.append(array)
                if f"{input_name}_shape" in source:  # MLX passes a Shape by value; a device array reads the same
                    parameters.append(f"const int* {input_name}_shape")
                    arguments.append({"kind": "shape", "array": self._keep(np.array(array.shape, dtype=np.int32))})
            outputs = [mx.zeros(shape, dtype=dtype) for shape, dtype in zip(output_shapes, output_dtypes, strict=True)]
            for position, (output_name, output) in enumerate(zip(output_names, outputs, strict=True)):
                parameters.append(f"{_CUDA_TYPES[output.dtype]}* {output_name}")
                arguments.append({"kind": "output", "shape": list(output.shape), "dtype": _NAMES[output.dtype]})
                self._outputs[id(output)] = (index, position)
                self._alive.append(output)
            constants = "".join(
                f"  constexpr {'bool' if isinstance(value, bool) else 'int'} {key} = "
                f"{str(value).lower() if isinstance(value, bool) else value};\n"
                for key, value in template
            )
            kernel_source = (
                "#include <cuda_bf16.h>\n"
                f"{header}\n"
                f'extern "C" __global__ void {name}(\n    {", ".join(parameters)}) {{\n{constants}\n{source}\n}}\n'
            )
            blocks = [-(-g // t) for g, t in zip(grid, threadgroup, strict=True)]
            self.launches.append(
                {
                    "name": name,
                    "source": kernel_source,
                    "blocks": blocks,
                    "threads": list(threadgroup),
                    "args": arguments,
                }
            )
            return outputs

        return launch

    def _keep(self, values: np.ndarray) -> str:
        key = self._hash(values)
        self.arrays.setdefault(key, values)
        return key

    def _argument(self, array: mx.array) -> dict[str, Any]:
        if id(array) in self._outputs:
            launch, output = self._outputs[id(array)]
            return {"from_launch": launch, "output": output}
        values = as_numpy(array)
        key = self._hash(values)
        if values.nbytes >= LARGE:
            if key not in self.seeds:
                raise ValueError(f"a {values.shape} input is too large to travel and was not drawn from a seed")
            return {"drawn": self.seeds[key]}
        return {"array": self._keep(values), "dtype": _NAMES[array.dtype]}

    def result(self, array: mx.array) -> dict[str, Any]:
        """Where the device finds ``array`` once the launches have run: an output, or a buffer a launch wrote."""
        if id(array) in self._outputs:
            launch, output = self._outputs[id(array)]
            return {"output_of": launch, "output": output}
        launch, position = self._inputs[id(array)]
        return {"input_of": launch, "input": position}


def main(folder: Path) -> None:
    recorder = Recorder()

    def record(backend: str, name: str, inputs: list[str], outputs: list[str], **sources: str) -> Any:
        return recorder.kernel(name, inputs, outputs, sources["cuda"], sources.get("cuda_header", ""))

    decode_attention.custom_kernel = record  # type: ignore[assignment]
    cases = []
    for layout, heads in (("backbone", (16, 16, 72)), ("LLM", (32, 8, 128))):
        attention = DecodeAttention("cuda", *heads)
        rope = NormRope("cuda", heads[0], heads[1], heads[2], EPS, BASE) if layout == "backbone" else None
        for buffers in (mx.float32, mx.bfloat16):
            forms: dict[str, tuple[Any, list[tuple[Any, ...]], int]] = {
                "read": (decode_attention_ops, decode_attention_samples(*heads, buffers), 1),
                "writing": (decode_attention_writing_ops, decode_attention_writing_samples(*heads, buffers), 3),
            }
            if rope is not None:
                heads_ops = functools.partial(
                    decode_attention_heads_ops, query_heads=heads[0], kv_heads=heads[1], eps=EPS, base=BASE
                )
                forms["heads"] = (heads_ops, decode_attention_heads_samples(*heads, mx.bfloat16, buffers), 6)
            for form, (fallback, samples, buffer_at) in forms.items():
                for number, sample in enumerate(samples):
                    # The buffers redrawn from seeds (they are too large to travel); the rest as the admission has it.
                    sample = list(sample)
                    for offset in (0, 1):
                        shape = tuple(sample[buffer_at + offset].shape)
                        sample[buffer_at + offset] = recorder.drawn_array(100 * number + offset, shape, buffers)
                    count = next(value for value in sample if isinstance(value, int))
                    slot = sample[buffer_at + 3] if form != "read" else None
                    expected = fallback(*sample)
                    expected = (expected,) if isinstance(expected, mx.array) else tuple(expected)
                    for merged in (False, True):
                        first = len(recorder.launches)
                        if form == "read":
                            got = attention.attend_bounded(
                                *sample[:3], attention.bounds(count), attention.splits(count), sample[4], merge=merged
                            )
                            got = (got,)
                        elif form == "writing":
                            got = attention.writing_check(*sample, merge=merged)
                        else:
                            got = attention.heads_check(*sample, rope=rope.params, merge=merged)  # type: ignore[union-attr]
                        results = []
                        for index, (array, want) in enumerate(zip(got, expected, strict=True)):
                            want_values = np.array(want.astype(mx.float32))
                            where = recorder.result(array)
                            if index:  # a written buffer: its slot's rows (the rest must be as drawn)
                                where["slot"] = slot
                                want_values = want_values[:, :, slot, :]
                            where["expected"] = recorder._keep(np.ascontiguousarray(want_values))
                            results.append(where)
                        cases.append(
                            {
                                "case": f"{layout} {form}, {_NAMES[buffers]} buffers, {count} filled "
                                f"({attention.splits(count)} blocks a head)",
                                "merged": merged and attention.splits(count) > 1,
                                "launches": list(range(first, len(recorder.launches))),
                                "results": results,
                            }
                        )
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"tolerance": KERNEL_TOLERANCE, "launches": recorder.launches, "cases": cases}
    (folder / "cases.json").write_text(json.dumps(manifest))
    np.savez_compressed(folder / "arrays.npz", **recorder.arrays)
    print(f"{len(cases)} cases, {len(recorder.launches)} launches, {len(recorder.arrays)} arrays in {folder}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".attn-cases"))
