"""Runs of row products in one launch (fast numerics, CUDA).

A streaming step runs row products back to back with nothing else between them: an encoder layer's output
projection, convolution module and second feed-forward, then the next layer's first feed-forward and its
query, key and value projections — eight kernels, until the attention reads them. Each is a launch, and on a
GPU a launch costs the host more than a one-row product costs the GPU. :class:`RowChain` runs such a run in
one launch: each step's own source (:meth:`engine.kernels.row_product.RowProduct.chained_source`) for one of the step's
blocks is a task, which the launch's blocks take in order from a counter, and a task waits until the step
before it is done, since a step reads what the steps before it wrote — no block need be resident beside
another for that to finish (:func:`_chain_source`). The same arithmetic in the same order as the steps one
launch each: admitted only bit for bit against them.

:class:`RowSequence` gathers the calls. Code that runs a layer through its row parts adds each call and gets
:class:`Link` s to its outputs, which later calls take as inputs, and asks for arrays where something else
reads them (the attention): the run gathered until then goes as one chain where one was admitted for its
structure (:func:`run_key`), else as its parts one launch each (on the CPU: their operations), in the order
added, with the same results either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from .admission import TICKET_STRIDE, custom_kernel, kernel_tickets
from .row_product import RowProduct, RowProductShape

RowPart = Callable[..., tuple[mx.array, ...]]

# Blocks of a chain's launch (at most; none need be resident beside another): as many as a product's launch has.
CHAIN_BLOCKS = 512
# CUDA's names of the dtypes a step's template takes.
_CUDA_TYPES = {mx.float32: "float", mx.bfloat16: "__nv_bfloat16", mx.float16: "__half"}


@dataclass(frozen=True)
class Link:
    """Output ``output`` of step ``step`` of run ``run`` of a :class:`RowSequence`."""

    run: int
    step: int
    output: int


@dataclass(frozen=True)
class RowCall:
    """One step of a run: the part it calls (``name``), its input rows ``x``, its weights and its other inputs
    by keyword — each input an array, or a :class:`Link` to an earlier step of the same run."""

    name: str
    part: RowPart
    x: mx.array | Link
    weights: tuple[mx.array, ...]
    inputs: tuple[tuple[str, mx.array | Link], ...]

    def links(self) -> tuple[tuple[str, int, int], ...]:
        """Which inputs earlier steps write: (input name, step, output)."""
        named = (("x", self.x), *self.inputs)
        return tuple((name, value.step, value.output) for name, value in named if isinstance(value, Link))


def run_key(calls: Sequence[RowCall]) -> tuple[tuple[str, tuple[tuple[str, int, int], ...]], ...]:
    """A run's structure — each step's part and which of its inputs earlier steps write — which a chain is
    built for."""
    return tuple((call.name, call.links()) for call in calls)


def output_count(shape: RowProductShape) -> int:
    """Outputs a row product of ``shape`` returns (its products', then the rows its prologue passes on)."""
    passes_on = shape.prologue in ("residual_norm", "layer_norm_twice", "conv_norm")
    return len(shape.output_widths) + int(passes_on)


def run_steps(calls: Sequence[RowCall]) -> list[tuple[mx.array, ...]]:
    """A run's parts one call each, in order (a chain's fallback and reference)."""
    results: list[tuple[mx.array, ...]] = []

    def value(item: mx.array | Link) -> mx.array:
        return results[item.step][item.output] if isinstance(item, Link) else item

    for call in calls:
        inputs = {name: value(item) for name, item in call.inputs}
        results.append(tuple(call.part(value(call.x), call.weights, **inputs)))
    return results


Chain = Callable[[Sequence[RowCall]], list[tuple[mx.array, ...]]]


@dataclass
class ChainBook:
    """A network's chains: those admitted, by :func:`run_key` (none on the CPU), and, while a load looks for
    its runs, every run's calls (``runs``)."""

    chains: dict[tuple[Any, ...], Chain] = field(default_factory=dict)
    runs: list[list[RowCall]] | None = None


def find_runs(holder: Any, step: Callable[[], Any]) -> dict[tuple[Any, ...], list[RowCall]]:
    """The runs of row products ``step()`` gathers through ``holder``'s book (its ``row_chains``, set aside for
    one op-by-op step and put back), one of each structure (:func:`run_key`) with more than one step, as their
    calls: what chains are built and admitted for."""
    book, holder.row_chains = holder.row_chains, ChainBook(runs=[])
    try:
        mx.eval(step())
        runs = holder.row_chains.runs or []
    finally:
        holder.row_chains = book
    return {run_key(calls): calls for calls in runs if len(calls) > 1}


class RowSequence:
    """Row-product calls gathered into runs (see the module docstring). ``shapes``: each part's name and shape;
    ``book``: the chains to run the runs as, and where to record them."""

    def __init__(self, shapes: Sequence[tuple[str, RowProductShape]], book: ChainBook | None = None) -> None:
        self._outputs = {name: output_count(shape) for name, shape in shapes}
        self._book = book or ChainBook()
        self._calls: list[RowCall] = []
        self._results: list[list[tuple[mx.array, ...]]] = []

    def add(
        self, name: str, part: RowPart, x: mx.array | Link, weights: tuple[mx.array, ...], **inputs: Any
    ) -> tuple[Link, ...]:
        """Gather ``part(x, weights, **inputs)`` (``name``: the part's name in its parts); returns links to its
        outputs. Inputs may link to any earlier call, and ``None`` inputs are left out."""
        run = len(self._results)
        x = self._current(x)
        named = tuple((key, self._current(item)) for key, item in inputs.items() if item is not None)
        self._calls.append(RowCall(name, part, x, tuple(weights), named))
        step = len(self._calls) - 1
        return tuple(Link(run, step, output) for output in range(self._outputs[name]))

    def arrays(self, *values: mx.array | Link) -> tuple[mx.array, ...]:
        """``values`` as arrays: the gathered run goes first if any of them is its output."""
        if any(isinstance(value, Link) and value.run == len(self._results) for value in values):
            self._run()
        return tuple(self._array(value) for value in values)

    def _current(self, value: mx.array | Link) -> mx.array | Link:
        """An input for the gathered run: a link into it stays a link, one into an earlier run is its array."""
        if isinstance(value, Link) and value.run < len(self._results):
            return self._array(value)
        return value

    def _array(self, value: mx.array | Link) -> mx.array:
        return self._results[value.run][value.step][value.output] if isinstance(value, Link) else value

    def _run(self) -> None:
        calls, self._calls = self._calls, []
        if self._book.runs is not None:
            self._book.runs.append(calls)
        chain = self._book.chains.get(run_key(calls))
        self._results.append(chain(calls) if chain is not None else run_steps(calls))


class RowChain:
    """One run's structure (:func:`run_key`) as a CUDA kernel of its steps' row products (``products``, each
    with the ``eps`` and guidance of its part)."""

    def __init__(
        self,
        backend: str,
        key: tuple[Any, ...],
        products: Sequence[RowProduct],
        settings: Sequence[tuple[float, float | None]],
    ) -> None:
        if backend != "cuda":
            raise ValueError(f"row products stay one launch each on {backend!r}")
        if len({product.warps for product in products}) != 1:
            raise ValueError("a chain's steps share its blocks: their row products need one number of warps")
        self.key = key
        self._products = list(products)
        self._settings = list(settings)
        links = {(step, name): (source, output) for step, (_, made) in enumerate(key) for name, source, output in made}
        self._inputs: list[tuple[int, str]] = [
            (step, name)
            for step, product in enumerate(products)
            for name in product.input_names
            if (step, name) not in links
        ]
        self._outputs = [(step, name) for step, product in enumerate(products) for name in product.output_names]
        self._blocks = min(max(product.blocks for product in products), CHAIN_BLOCKS)
        self._kernel = custom_kernel(
            backend,
            "parley_row_chain",
            [*(f"s{step}_{name}" for step, name in self._inputs), "tickets"],
            [f"s{step}_{name}" for step, name in self._outputs],
            cuda=_chain_source(self._products, links),
            metal="",
        )
        self._tickets = kernel_tickets(-(-(len(products) + 2) // TICKET_STRIDE))  # see _chain_source

    def __call__(self, calls: Sequence[RowCall]) -> list[tuple[mx.array, ...]]:
        if run_key(calls) != self.key:
            raise ValueError("these calls are not the run this chain was built for")
        inputs: dict[tuple[int, str], Any] = {}
        shapes: list[tuple[int, ...]] = []
        counts: list[int] = []
        for step, (call, product, (eps, guidance)) in enumerate(
            zip(calls, self._products, self._settings, strict=True)
        ):
            named: dict[str, Any] = {"x": call.x, **dict(call.inputs)}
            named.update({f"w{index}": weight for index, weight in enumerate(call.weights)})
            launch = product.launch(named, eps=eps, guidance=guidance)
            inputs.update({(step, name): array for name, array in zip(product.input_names, launch.inputs, strict=True)})
            shapes.extend(launch.output_shapes)
            counts.append(len(launch.output_shapes))
        threads = self._products[0].warps * 32
        results = self._kernel(
            inputs=[*(inputs[key] for key in self._inputs), self._tickets],
            template=[],
            grid=(self._blocks * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=shapes,
            output_dtypes=[mx.float32] * len(shapes),
        )
        by_step: list[tuple[mx.array, ...]] = []
        for count in counts:
            by_step.append(tuple(results[:count]))
            results = results[count:]
        return by_step


def _chain_source(products: Sequence[RowProduct], links: Mapping[tuple[int, str], tuple[int, int]]) -> str:
    """The steps as tasks — step by step, each step's blocks in order — that the launch's blocks take from a
    counter in that order. A task waits until every block of the step before it is done (and so, by the same
    rule, every step before that): the tasks it waits for were all taken before it, by blocks already running,
    which wait only for tasks taken earlier still, so the launch needs no block to be resident beside another
    (a wait is bounded all the same). Each step runs in a scope of its own: its template's constants and types,
    its inputs and outputs under the names its body reads (an input an earlier step writes, as that step's
    output), then its body for the task's block. The normed rows (threadgroup memory) are one array for all
    steps, as large as the largest step's. The last block out puts the counters back to zero for the next
    launch. Counters (``tickets``): the next task, the blocks out, then each step's blocks done."""
    steps, starts, total = [], [], 0
    for step, product in enumerate(products):
        starts.append(total)
        total += product.blocks
        lines = []
        for name, value in product.template:
            if isinstance(value, mx.Dtype):
                lines.append(f"using {name} = {_CUDA_TYPES[value]};")
            else:
                lines.append(f"constexpr int {name} = {int(value)};")
        for name in product.input_names:
            link = links.get((step, name))
            if link is None:
                lines.append(f"const auto* {name} = s{step}_{name};")
            else:
                source, output = link
                lines.append(f"const float* {name} = s{source}_{products[source].output_names[output]};")
        lines.extend(f"float* {name} = s{step}_{name};" for name in product.output_names)
        declarations = "\n        ".join(lines)
        steps.append(f"if (step == {step}) {{\n        {declarations}\n{product.chained_source()}\n    }}")
    normed = [product.shape.rows * product.shape.width for product in products if product.shape.prologue != "none"]
    which = "".join(f"step = task < {start} ? step : {index}; " for index, start in enumerate(starts))
    # Blocks of the step before the task's (a chain has two steps or more).
    needed = "".join(f"step == {index + 1} ? {product.blocks} : " for index, product in enumerate(products[:-1]))
    return f"""
    constexpr long long SPIN_LIMIT = 1LL << 31;  // clock cycles, about a second
    const int local = threadIdx.x;
    int* counters = const_cast<int*>(tickets);
    __shared__ int taken;
    __shared__ __align__(16) float rows[{max(normed or [1])}];
    while (true) {{
        if (local == 0) taken = atomicAdd(counters, 1);
        __syncthreads();
        const int task = taken;
        __syncthreads();
        if (task >= {total}) break;
        int step = 0;
        {which}
        const int starts[{len(starts)}] = {{{", ".join(map(str, starts))}}};
        const int block = task - starts[step];
        if (step > 0 && local == 0) {{
            const volatile int* done = counters + 2 + step - 1;
            const int needed = {needed}0;
            const long long start = clock64();
            while (*done < needed && clock64() - start < SPIN_LIMIT) {{
            }}
            __threadfence();
        }}
        __syncthreads();
    {" else ".join(steps)}
        __syncthreads();
        if (local == 0) {{
            __threadfence();  // the block's outputs are visible to every block before its count is
            atomicAdd(counters + 2 + step, 1);
        }}
    }}
    if (local == 0) {{
        __threadfence();
        if (atomicAdd(counters + 1, 1) == gridDim.x - 1) {{
            for (int c = 0; c < {len(products) + 2}; ++c) atomicExch(counters + c, 0);
            __threadfence();
        }}
    }}
"""
