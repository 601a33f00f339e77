"""Runs the attention launches that ``attention_recipes.py`` recorded, on this GPU through CuPy (no MLX needed),
and compares each case with the fallback's results recorded on the CPU.

Per case: the worst relative L2 over its outputs (the admission's bound applies), a written buffer's other positions
as drawn, and for the forms merging their shares: every ticket back at zero after the launch, the launch run again
giving the same bits (the tickets were reset), and the outputs bit for bit those of the plain form's two launches.
Exits 1 when a case fails. Run on the device: ``python3 tests/device/attention_cupy.py .attn-cases``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np
from seeded_buffers import drawn  # the sibling the recording drew its buffers with


def as_float(values: Any, dtype: str) -> np.ndarray:
    host = cp.asnumpy(values) if isinstance(values, cp.ndarray) else values
    if dtype == "bfloat16":
        return (host.astype(np.uint32) << 16).view(np.float32)
    return host.astype(np.float32)


def relative_l2(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.linalg.norm(want.astype(np.float64)))
    error = float(np.linalg.norm(got.astype(np.float64) - want.astype(np.float64)))
    return error / scale if scale else error


class Runner:
    def __init__(self, folder: Path) -> None:
        manifest = json.loads((folder / "cases.json").read_text())
        self.tolerance: float = manifest["tolerance"]
        self.launches: list[dict[str, Any]] = manifest["launches"]
        self.cases: list[dict[str, Any]] = manifest["cases"]
        self.arrays = np.load(folder / "arrays.npz")
        self._drawn: dict[str, np.ndarray] = {}
        self._kernels: dict[str, Any] = {}

    def drawn(self, recipe: dict[str, Any]) -> np.ndarray:
        key = json.dumps(recipe, sort_keys=True)
        if key not in self._drawn:
            values = drawn(recipe["seed"], tuple(recipe["shape"]), recipe["dtype"])
            if hashlib.sha256(values.tobytes()).hexdigest() != recipe["sha256"]:
                raise RuntimeError(f"this NumPy draws seed {recipe['seed']} otherwise than the recording's")
            self._drawn[key] = values
        return self._drawn[key]

    def kernel(self, launch: dict[str, Any]) -> Any:
        source = launch["source"]
        if source not in self._kernels:
            # NVRTC without MLX's headers may not know size_t; this typedef names the type it is, so it cannot clash.
            module = cp.RawModule(code="typedef decltype(sizeof(0)) size_t;\n" + source, options=("-std=c++17",))
            self._kernels[source] = module.get_function(launch["name"])
        return self._kernels[source]

    def run(self, indices: list[int], tickets: dict[int, cp.ndarray]) -> tuple[list[list[Any]], list[list[Any]]]:
        """The launches in order, on fresh copies of their inputs (a writing launch writes its buffers); each
        launch's tickets are kept in ``tickets`` across runs, as a layer's are across frames."""
        inputs_of: list[list[Any]] = []
        outputs_of: list[list[Any]] = []
        for index in indices:
            launch = self.launches[index]
            arguments, inputs, outputs = [], [], []
            for spec in launch["args"]:
                if spec["kind"] == "output":
                    value = cp.zeros(tuple(spec["shape"]), dtype=np.float32 if spec["dtype"] == "float32" else np.int32)
                    outputs.append(value)
                elif spec["kind"] == "shape":
                    value = cp.asarray(self.arrays[spec["array"]])
                elif "from_launch" in spec:
                    value = outputs_of[indices.index(spec["from_launch"])][spec["output"]]
                elif "drawn" in spec:
                    value = cp.asarray(self.drawn(spec["drawn"]))
                elif spec["name"] == "tickets":
                    value = tickets.setdefault(index, cp.asarray(self.arrays[spec["array"]]))
                else:
                    value = cp.asarray(self.arrays[spec["array"]])
                if spec["kind"] == "input":
                    inputs.append(value)
                arguments.append(value)
            self.kernel(launch)(tuple(launch["blocks"]), tuple(launch["threads"]), tuple(arguments))
            inputs_of.append(inputs)
            outputs_of.append(outputs)
        cp.cuda.Device().synchronize()
        return inputs_of, outputs_of

    def results(self, case: dict[str, Any], tickets: dict[int, cp.ndarray]) -> tuple[list[np.ndarray], list[str]]:
        """The case's launches run; its results as float32 (a written buffer: its slot), and what else is wrong."""
        indices = case["launches"]
        inputs_of, outputs_of = self.run(indices, tickets)
        values, problems = [], []
        for result in case["results"]:
            if "output_of" in result:
                values.append(cp.asnumpy(outputs_of[indices.index(result["output_of"])][result["output"]]))
                continue
            specs = [spec for spec in self.launches[result["input_of"]]["args"] if spec["kind"] == "input"]
            recipe = specs[result["input"]]["drawn"]
            written = cp.asnumpy(inputs_of[indices.index(result["input_of"])][result["input"]])
            slot = result["slot"]
            if not np.array_equal(np.delete(written, slot, axis=2), np.delete(self.drawn(recipe), slot, axis=2)):
                problems.append("a buffer changed outside its slot")
            values.append(as_float(written[:, :, slot, :], recipe["dtype"]))
        return values, problems

    def check(self, case: dict[str, Any], plain: list[np.ndarray] | None) -> tuple[bool, str, list[np.ndarray]]:
        tickets: dict[int, cp.ndarray] = {}
        got, problems = self.results(case, tickets)
        worst = max(relative_l2(a, self.arrays[r["expected"]]) for a, r in zip(got, case["results"], strict=True))
        if not worst <= self.tolerance:
            problems.append(f"beyond the bound {self.tolerance:g}")
        notes = []
        if case["merged"]:
            if any(int(cp.count_nonzero(line)) for line in tickets.values()):
                problems.append("tickets left set")
            again, _ = self.results(case, tickets)
            if not all(np.array_equal(a, b) for a, b in zip(again, got, strict=True)):
                problems.append("a second launch differs (tickets not reset?)")
            if plain is not None:
                same = all(np.array_equal(a, b) for a, b in zip(got, plain, strict=True))
                notes.append(f"bit for bit the plain form: {same}")
        return not problems, "; ".join([f"rel-L2 {worst:.2e}", *notes, *problems]), got


def main(folder: Path) -> int:
    started = time.monotonic()
    runner = Runner(folder)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: {len(runner.cases)} cases", flush=True)
    failed = 0
    plain: list[np.ndarray] | None = None  # the plain form's results of the case before (each case comes plain first)
    for case in runner.cases:
        try:
            ok, note, got = runner.check(case, plain if case["merged"] else None)
        except Exception as exc:  # noqa: BLE001 - a case that cannot build or run is reported, and the rest go on
            ok, note, got = False, f"{type(exc).__name__}: {str(exc)[:2000]}", None
        plain = got
        failed += not ok
        kind = "merged" if case["merged"] else "plain"
        print(f"{'ok  ' if ok else 'FAIL'} {case['case']}, {kind}: {note}", flush=True)
    print(f"{len(runner.cases) - failed} of {len(runner.cases)} cases pass ({time.monotonic() - started:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".attn-cases")))
