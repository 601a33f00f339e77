"""A census of what each frame asks MLX to evaluate: counts that machine load cannot move.

Frame *times* on a shared machine move by ±20 % between identical runs; what a frame
asks of the device does not. Before each evaluation the session hands its lazy outputs
to a :class:`GraphCensus`, which walks the graph (``mx.export_to_dot``, nothing is
evaluated) and records, per stage:

* **primitives**: every operation MLX will evaluate (a fused elementwise kernel made by
  ``mx.compile`` is one), each costing host time to dispatch;
* **kernels**: the primitives that launch work on the device, i.e. not views (reshape,
  transpose, slice, broadcast, …) or no-ops;
* **weight uses**: which model weights those primitives read, so that
  :func:`engine.pricing.weight_bytes` can price a frame at full size
  (:func:`engine.pricing.full_size_prices`, which needs the model; the census itself does not).

:func:`python_calls` counts the host's side the same way: the Python functions and builtins a frame calls.

Counts depend on the device the graph is built for: on the CPU, MLX builds the fast
kernels (``rms_norm``, ``layer_norm``, ``rope``, ``scaled_dot_product_attention``) from
ordinary operations, so a CPU count is larger than a GPU count of the same code. Compare
counts of one device with each other.
"""

from __future__ import annotations

import io
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import mlx.core as mx

from .kernels.admission import standing_in
from .weight_names import GATHER_MARK, TRANSPOSE_MARK, VIEW_MARK

# Primitives that only re-describe memory (or do nothing) and launch no kernel of their own. A reshape of a
# non-contiguous array copies; it is still counted here, as a view, because the copy depends on the layout.
VIEW_PRIMITIVES = frozenset(
    {
        "AsStrided",
        "Broadcast",
        "BroadcastAxes",
        "Copy",
        "Depends",
        "ExpandDims",
        "Flatten",
        "NumberOfElements",
        "Reshape",
        "Slice",
        "Split",
        "Squeeze",
        "StopGradient",
        "Transpose",
        "Unflatten",
    }
)

# What a GPU's custom kernel is called in its graph: a stand-in for one is counted as one (GraphCensus).
STAND_IN_PRIMITIVE = "CustomKernel"

# Primitives that read only some rows of their first input (an embedding or codebook lookup).
GATHER_PRIMITIVES = frozenset({"Gather", "GatherAxis", "GatherQMM", "GatherMM"})

_PRIMITIVE = re.compile(r'^\{ (\d+) \[label ="([^"]+)"', re.MULTILINE)
_INPUT_EDGE = re.compile(r'^"([^"]+)" -> (\d+)$', re.MULTILINE)
_OUTPUT_EDGE = re.compile(r'^(\d+) -> "([^"]+)"$', re.MULTILINE)


@dataclass(frozen=True)
class WeightUse:
    """One read of a weight by a kernel: whole, one slice along its first axis, or one gathered row."""

    name: str
    part: str  # "whole", "slice" (one along the first axis), "row" (one), or "slice_row" (one row of one slice)


@dataclass
class StageCensus:
    primitives: int = 0
    kernels: int = 0
    by_primitive: Counter[str] = field(default_factory=Counter)
    weight_uses: Counter[WeightUse] = field(default_factory=Counter)

    def add(self, other: StageCensus) -> None:
        self.primitives += other.primitives
        self.kernels += other.kernels
        self.by_primitive.update(other.by_primitive)
        self.weight_uses.update(other.weight_uses)


@dataclass
class FrameCensus:
    """What one frame evaluated, per stage."""

    frame_index: int
    stages: dict[str, StageCensus] = field(default_factory=dict)

    @property
    def primitives(self) -> int:
        return sum(stage.primitives for stage in self.stages.values())

    @property
    def kernels(self) -> int:
        return sum(stage.kernels for stage in self.stages.values())

    def weight_uses(self) -> Counter[WeightUse]:
        total: Counter[WeightUse] = Counter()
        for stage in self.stages.values():
            total.update(stage.weight_uses)
        return total


def named_weights(model: object) -> dict[str, mx.array]:
    """Every array a frame may read as a weight, by parameter name.

    Besides the parameters, projections stacked into one matrix (:mod:`engine.networks.fused`) are
    named ``<module>.stacked``: the stacked matrix is what the product reads. Views of a
    parameter that a module keeps ready (``weight_views()``) are named after it: a slice
    (the TTS codebooks) ``<parameter>#<index>``, priced as one slice of it, a transposed
    weight (:mod:`engine.networks.linear`) ``<parameter>@T``, priced as all of it, a copy in another
    dtype (fast numerics' bf16 copies) ``<parameter>%``, priced as all of it in the copy's dtype,
    and a table a kernel gathers rows of ``<parameter>[]``, priced as one row of the table per read
    (the module's ``table_rows()`` say how many rows each table has).
    """
    from mlx.utils import tree_flatten

    named = dict(tree_flatten(model.parameters()))  # type: ignore[attr-defined]
    for path, module in model.named_modules():  # type: ignore[attr-defined]
        stacked = getattr(module, "stacked", None)
        if stacked is not None:
            named[f"{path}.stacked"] = stacked.weight
            named[f"{path}.stacked{TRANSPOSE_MARK}"] = stacked.transposed
        views = getattr(module, "weight_views", None)
        if callable(views):
            for name, array in views().items():
                named[f"{path}.{name}"] = array
    return named


class GraphCensus:
    """Counts the not-yet-evaluated graph behind the arrays it is shown, once per node.

    Call :meth:`count` at each stage boundary with the stage's outputs (nodes counted for an
    earlier stage of the same frame are not counted again), and :meth:`evaluated` after each
    evaluation (the graph before it is gone, and its nodes' ids may be reused).
    """

    def __init__(self, weights: Mapping[str, mx.array]) -> None:
        # While kernels stand in for CUDA's (engine.kernels.admission), each is one Depends primitive: a kernel.
        self._stand_ins = standing_in()
        # Weights go first into every export, so MLX names them "A", "B", … in this order (a keyword
        # argument per weight would name them directly, but a call takes at most 1024 keywords).
        self._weight_arrays = list(weights.values())
        self._weight_names = {_dot_name(index): name for index, name in enumerate(weights)}
        buffer = io.StringIO()
        mx.export_to_dot(buffer, *self._weight_arrays)
        sources = sum(1 for line in buffer.getvalue().splitlines() if line.startswith("{ rank=source;"))
        if sources != len(self._weight_arrays):
            raise ValueError(
                f"{len(self._weight_arrays)} weights make {sources} graph inputs: some weight is listed twice "
                "or is not yet evaluated"
            )
        self._seen: set[str] = set()
        self._frame = FrameCensus(-1)

    def begin_frame(self, frame_index: int) -> None:
        self._frame = FrameCensus(frame_index)
        self._seen.clear()

    def count(self, stage: str, arrays: Iterable[mx.array]) -> None:
        outputs = [array for array in arrays if isinstance(array, mx.array)]
        if not outputs:
            return
        buffer = io.StringIO()
        mx.export_to_dot(buffer, *self._weight_arrays, *outputs)
        census = self._parse(buffer.getvalue())
        self._frame.stages.setdefault(stage, StageCensus()).add(census)

    def evaluated(self) -> None:
        self._seen.clear()

    def end_frame(self) -> FrameCensus:
        return self._frame

    def _parse(self, dot: str) -> StageCensus:
        census = StageCensus()
        inputs: dict[str, list[str]] = {}  # primitive node id -> input array names, in order
        # The export's lines, as MLX's graph_utils.cpp writes them:
        #   { 1234 [label ="Matmul", shape=rectangle]; }    a primitive node
        #   "A" -> 1234                                      an input of that primitive
        #   1234 -> "B"                                      an output of it
        kinds = dict(_PRIMITIVE.findall(dot))
        for array, node in _INPUT_EDGE.findall(dot):
            inputs.setdefault(node, []).append(array)
        produced_by = {array: node for node, array in _OUTPUT_EDGE.findall(dot)}

        # A view of a weight is still that weight (a codebook sliced out of a stack of them, say).
        # A transposed view reads what it was made from.
        bases = {dot: name.removesuffix(TRANSPOSE_MARK) for dot, name in self._weight_names.items()}
        origin: dict[str, tuple[str, str]] = {
            dot: (base.partition(VIEW_MARK)[0], "slice" if VIEW_MARK in base else "whole")
            for dot, base in bases.items()
        }
        origin.update({dot: (name, "row") for dot, name in self._weight_names.items() if name.endswith(GATHER_MARK)})
        for node, name in kinds.items():
            if node in self._seen:
                continue
            self._seen.add(node)
            if self._stand_ins and name == "Depends":
                name = kinds[node] = STAND_IN_PRIMITIVE
            census.primitives += 1
            census.by_primitive[_family(name)] += 1
            if name in VIEW_PRIMITIVES:
                continue
            census.kernels += 1
            for position, array in enumerate(inputs.get(node, ())):
                source = _weight_origin(array, origin, kinds, inputs, produced_by)
                if source is None:
                    continue
                weight, part = source
                if name in GATHER_PRIMITIVES and position == 0:
                    part = "slice_row" if part == "slice" else "row"
                census.weight_uses[WeightUse(weight, part)] += 1
        return census


def _dot_name(index: int) -> str:
    """The name MLX's graph export gives the ``index``-th array it names: A … Z, AA, AB, …"""
    letters = []
    number = index + 1
    while number > 0:
        letters.append(chr(ord("A") + (number - 1) % 26))
        number = (number - 1) // 26
    return "".join(reversed(letters))


def _family(name: str) -> str:
    """Fused kernels are named after every operation they fuse; count them as one family."""
    return "Compiled" if name.startswith("Compiled") else name


def _weight_origin(
    array: str,
    origin: dict[str, tuple[str, str]],
    kinds: Mapping[str, str],
    inputs: Mapping[str, list[str]],
    produced_by: Mapping[str, str],
) -> tuple[str, str] | None:
    """The weight ``array`` is (a view of), with ``"slice"`` once a slice is taken; None for other arrays."""
    if array in origin:
        return origin[array]
    trail: list[str] = []
    current = array
    found: tuple[str, str] | None = None
    while True:
        node = produced_by.get(current)
        if node is None or kinds.get(node) not in VIEW_PRIMITIVES or not inputs.get(node):
            break
        trail.append(current)
        current = inputs[node][0]
        if current in origin:
            found = origin[current]
            break
    if found is None:
        return None
    weight, part = found
    for view in reversed(trail):
        if kinds[produced_by[view]] in ("Slice", "Split") and part == "whole":
            part = "slice"
        origin[view] = (weight, part)
    return origin[array]


def python_calls(step: Callable[[], object]) -> Counter[str]:
    """Every Python function and builtin that ``step()`` calls on this thread, by name, with how often.

    A fast frame is bound by the host building its graph while the device waits, so the host's work matters as much
    as the device's; as a count it does not move with the machine's load. (A walk over the LLM's 344 modules, left
    in its step by a refactor, made about 51,000 of the 52,700 calls of a GPU's fast frame: docs/performance.md.)
    """
    calls: Counter[str] = Counter()

    def record(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            calls[f"{Path(code.co_filename).stem}.{code.co_qualname}"] += 1
        elif event == "c_call":
            calls[getattr(arg, "__qualname__", type(arg).__name__)] += 1

    previous = sys.getprofile()
    sys.setprofile(record)
    try:
        step()
    finally:
        sys.setprofile(previous)
    calls["setprofile"] -= 1  # the call that ended the count
    return +calls  # without names whose count fell to zero
