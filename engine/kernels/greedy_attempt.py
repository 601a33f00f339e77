"""One RN-T greedy attempt in four launches (fast numerics).

Each attempt of the streaming greedy loop (:func:`engine.networks.rnnt.rnnt._greedy_rows`) embeds the last
token, steps the prediction network's LSTM layers, adds the joint's prediction projection to the
frame's encoder projection, applies the activation, scores every class and takes the argmax,
then selects the state to carry: about 28 primitives an attempt, and random weights reach the
loop's cap of ten attempts every frame. Here an attempt is one launch per LSTM layer and two for
the joint:

* :class:`LSTMStep` — one LSTM layer for one row: the input product, the recurrent product, the
  gates and the cell update, one warp per unit (its four gate rows of both weights). The first
  layer's input is the embedding row of a token it picks itself from the previous attempt's
  partial argmaxes (``"embedding"``), or the zero row of the start symbol (``"zero"``); later
  layers take the layer below's new hidden row (``"row"``).
* :class:`JointRow` — one row through a joint projection, one warp per output: the prediction
  projection added to the encoder projection and activated (``"activation"``), or the class
  scores reduced to one ``(max, first index)`` pair per block of :data:`WARPS` classes
  (``"partials"``), which the next attempt's first layer and the loop's end finish.

On CUDA, :class:`GreedyLoop` runs every attempt of a frame in one launch: the kernels above, their own
sources, run in turn by persistent blocks meeting at a bounded barrier after each (the same arithmetic in the
same order; :func:`greedy_loop_ops`, the parts one attempt at a time, is its fallback and reference).

An attempt after one that emitted starts from that attempt's state; one after a blank is
masked out by the loop's end, whatever it computed, so no attempt selects a state: the loop's
end picks the state of the last emission once (:func:`engine.networks.rnnt.fast.greedy_rows_by_attempt`).

Arithmetic: float32 like the reference, each sum in another order. The reference multiplies the
bf16 embedding row by the bf16 input weights in bf16 (the sum rounded to bf16 once, with the
bias); the kernel rounds the same sum once too (``round_input``), so a gate differs from the
reference's only where reordering moves the float32 sum across a bf16 rounding boundary. The
operations fallbacks (:func:`lstm_step_ops`, :func:`joint_row_ops`) are the reference's
operations, which the CPU runs: there the loop's tokens and states are exact mode's bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from .admission import custom_kernel, kernel_tickets
from .source import CUDA, GRID_BARRIER_CUDA, GRID_BARRIER_STATE_CUDA, METAL, Dialect, block_turns

# Warps (simdgroups) per block; one LSTM unit or one output column each.
WARPS = 8

LSTMInput = Literal["zero", "embedding", "row"]
LSTM_INPUTS: tuple[LSTMInput, ...] = ("zero", "embedding", "row")
JointEpilogue = Literal["activation", "partials"]
JOINT_EPILOGUES: tuple[JointEpilogue, ...] = ("activation", "partials")
# The joint's activations (``JointConfig.activation``), as operations and as kernel code of ``z``.
ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {"relu": nn.relu, "sigmoid": mx.sigmoid, "tanh": mx.tanh}


def lstm_cell(
    gates: mx.array,
    hidden: mx.array | None,
    cell: mx.array | None,
    recurrent: mx.array,
    keep: Callable[[mx.array], mx.array],
) -> tuple[mx.array, mx.array]:
    """One step of an LSTM layer (``nn.LSTM``'s operations) from its input projection ``gates``, the state
    ``hidden``/``cell`` (None at the start) and the recurrent weight ``recurrent`` (``Wh``); ``keep`` holds
    the cell update's products apart (:func:`engine.jit.materialize`) or lets them fuse."""
    if hidden is not None:
        gates = mx.addmm(gates, hidden, recurrent.T)
    i, f, g, o = mx.split(gates, 4, axis=-1)
    i, f, g, o = mx.sigmoid(i), mx.sigmoid(f), mx.tanh(g), mx.sigmoid(o)
    cell = i * g if cell is None else keep(f * cell) + keep(i * g)
    return o * mx.tanh(cell), cell


def chosen_token(values: mx.array, indices: mx.array) -> mx.array:
    """The argmax ``(1,)`` of a row from its partials: the first block's index among the largest maxima."""
    return mx.take(indices, mx.argmax(values, axis=0, keepdims=True))


@dataclass(frozen=True)
class LSTMStepShape:
    """One LSTM layer's step for one row: ``width`` inputs, ``hidden`` units. ``"embedding"`` reads the
    row of a ``partials``-pair argmax from the table; ``round_input`` rounds the input product (with the
    bias) to bf16, as the reference's bf16 product does."""

    input: LSTMInput
    width: int
    hidden: int
    partials: int = 0
    round_input: bool = False

    def __post_init__(self) -> None:
        if self.input not in LSTM_INPUTS:
            raise ValueError(f"an LSTM step's input must be one of {LSTM_INPUTS}, not {self.input!r}")
        if (self.input == "embedding") != (self.partials > 0):
            raise ValueError("an embedding input is chosen from partials > 0, and only it")

    @property
    def inputs(self) -> tuple[str, ...]:
        """The kernel's (and the fallback's) inputs, in call order."""
        leading = {"zero": (), "embedding": ("table", "values", "indices"), "row": ("x",)}[self.input]
        return (*leading, "hidden", "cell", "wx", "wh", "bias")


def lstm_step_ops(*inputs: mx.array, shape: LSTMStepShape) -> tuple[mx.array, mx.array]:
    """:class:`LSTMStep`'s computation as the reference's operations (its fallback): the new hidden and cell
    rows ``(1, hidden)``. A ``"zero"`` step is the start symbol's, with no state (its ``hidden`` and
    ``cell`` inputs, zero rows for the kernel, are not read)."""
    named = dict(zip(shape.inputs, inputs, strict=True))
    wx, bias = named["wx"], named["bias"]
    if shape.input == "embedding":
        # The table as given, or viewed as one (1, width) row per token (engine.networks.rnnt's embedding_table).
        x = named["table"].reshape(-1, shape.width)[chosen_token(named["values"], named["indices"])]
        state: tuple[mx.array | None, mx.array | None] = (named["hidden"], named["cell"])
    elif shape.input == "row":
        x, state = named["x"], (named["hidden"], named["cell"])
    else:
        x, state = mx.zeros((1, shape.width)), (None, None)
    gates = mx.addmm(bias, x, wx.T)
    return lstm_cell(gates, *state, named["wh"], lambda product: product)


@dataclass(frozen=True)
class JointRowShape:
    """One row of ``width`` through a joint projection of ``outputs`` columns: ``"activation"`` writes
    ``activation(base + (x·Wᵀ + b))``; ``"partials"`` writes, per block of :data:`WARPS` columns of
    ``x·Wᵀ + b``, the largest value and its first index."""

    width: int
    outputs: int
    epilogue: JointEpilogue
    activation: str = "relu"

    def __post_init__(self) -> None:
        if self.epilogue not in JOINT_EPILOGUES:
            raise ValueError(f"a joint row's epilogue must be one of {JOINT_EPILOGUES}, not {self.epilogue!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"no kernel for the activation {self.activation!r}")

    @property
    def partials(self) -> int:
        """Blocks, and so ``(max, index)`` pairs, of a ``"partials"`` row."""
        return -(-self.outputs // WARPS)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("x", "weight", "bias", "base") if self.epilogue == "activation" else ("x", "weight", "bias")


def joint_row_ops(*inputs: mx.array, shape: JointRowShape) -> mx.array | tuple[mx.array, mx.array]:
    """:class:`JointRow`'s computation as the reference's operations (its fallback)."""
    named = dict(zip(shape.inputs, inputs, strict=True))
    product = mx.addmm(named["bias"], named["x"], named["weight"].T)
    if shape.epilogue == "activation":
        return ACTIVATIONS[shape.activation](named["base"] + product)
    blocks = shape.partials
    padded = mx.pad(product[0], (0, blocks * WARPS - shape.outputs), constant_values=-math.inf)
    scores = padded.reshape(blocks, WARPS)
    first = mx.arange(blocks, dtype=mx.int32) * WARPS
    return mx.max(scores, axis=1), first + mx.argmax(scores, axis=1).astype(mx.int32)


# --------------------------------------------------------------------------- kernels (CUDA and Metal)


def _lstm_body(shape: LSTMStepShape, d: Dialect, *, pairs: str = "P", produced: str = "") -> str:
    """An LSTM step's source for the block ``block`` (no header, no early return, so that a loop may run it
    for several blocks in turn): ``pairs`` partials are finished, and ``produced`` qualifies the row that a
    ``"row"`` step reads (``"volatile "`` where another block wrote it in the same launch)."""
    sigmoid = "1.0f / (1.0f + {exp}(-{x}))"
    choose = ""
    if shape.input == "embedding":
        # Every block finishes the previous attempt's argmax (a few dozen pairs; first index among equals).
        choose = f"""
    {d.shared} int chosen[1];
    if (local == 0) {{
        float best = values[0];
        int token = indices[0];
        for (int p = 1; p < {pairs}; ++p) {{
            if (values[p] > best) {{ best = values[p]; token = indices[p]; }}
        }}
        chosen[0] = token;
    }}
    {d.barrier}
"""
    source_row = {
        "zero": "",
        "embedding": f"const {d.device}TT* in = table + static_cast<size_t>(chosen[0]) * D;",
        "row": f"const {d.device}{produced}float* in = x;",
    }[shape.input]
    input_product = (
        ""
        if shape.input == "zero"
        else f"""
        {source_row}
        for (int k = lane; k < D; k += 32) {{
            const float v = static_cast<float>(in[k]);
            for (int g = 0; g < 4; ++g) ax[g] += v * static_cast<float>(wx[static_cast<size_t>(g * H + unit) * D + k]);
        }}
"""
    )
    # The start symbol has no state: no recurrent product, and the cell starts at zero.
    recurrent = (
        ""
        if shape.input == "zero"
        else """
        for (int k = lane; k < H; k += 32) {
            const float v = hidden[k];
            for (int g = 0; g < 4; ++g) ah[g] += v * static_cast<float>(wh[static_cast<size_t>(g * H + unit) * H + k]);
        }
"""
    )
    rounded = d.round_bf16("a") if shape.round_input else "a"
    previous_cell = "0.0f" if shape.input == "zero" else "cell[unit]"
    return f"""
    {choose}
    const int unit = block * WARPS + warp;
    if (unit < H) {{
        float ax[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        float ah[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        {input_product}
        {recurrent}
        for (int g = 0; g < 4; ++g) {{
            {d.warp_sum("ax[g]")}
            {d.warp_sum("ah[g]")}
        }}
        if (lane == 0) {{
            float gate[4];
            for (int g = 0; g < 4; ++g) {{
                const float a = ax[g] + static_cast<float>(bias[g * H + unit]);
                gate[g] = {rounded} + ah[g];
            }}
            const float input_gate = {sigmoid.format(exp=d.exp, x="gate[0]")};
            const float forget_gate = {sigmoid.format(exp=d.exp, x="gate[1]")};
            const float candidate = {d.tanh}(gate[2]);
            const float output_gate = {sigmoid.format(exp=d.exp, x="gate[3]")};
            const float c = forget_gate * {previous_cell} + input_gate * candidate;
            cell_out[unit] = c;
            hidden_out[unit] = output_gate * {d.tanh}(c);
        }}
    }}
"""


def _lstm_source(shape: LSTMStepShape, d: Dialect) -> str:
    return d.header + _lstm_body(shape, d)


def _joint_body(shape: JointRowShape, d: Dialect) -> str:
    """A joint row's source for the block ``block`` (no header, no early return)."""
    activate = {
        "relu": "z > 0.0f ? z : 0.0f",
        "sigmoid": f"1.0f / (1.0f + {d.exp}(-z))",
        "tanh": f"{d.tanh}(z)",
    }[shape.activation]
    if shape.epilogue == "activation":
        epilogue = f"""
    if (lane == 0 && column < N) {{
        const float z = base[column] + (acc + static_cast<float>(bias[column]));
        y[column] = {activate};
    }}
"""
    else:
        epilogue = f"""
    if (lane == 0) scores[warp] = column < N ? acc + static_cast<float>(bias[column]) : {d.negative_infinity};
    {d.barrier}
    if (local == 0) {{
        float best = scores[0];
        int at = 0;
        for (int w = 1; w < WARPS; ++w) {{
            if (scores[w] > best) {{ best = scores[w]; at = w; }}
        }}
        values[block] = best;
        indices[block] = block * WARPS + at;
    }}
"""
    scores = f"{d.shared} float scores[WARPS];" if shape.epilogue == "partials" else ""
    return f"""
    {scores}
    const int column = block * WARPS + warp;
    float acc = 0.0f;
    if (column < N) {{
        const {d.device}WT* row = weight + static_cast<size_t>(column) * K;
        for (int k = lane; k < K; k += 32) acc += x[k] * static_cast<float>(row[k]);
    }}
    {d.warp_sum("acc")}
    {epilogue}
"""


def _joint_source(shape: JointRowShape, d: Dialect) -> str:
    return d.header + _joint_body(shape, d)


class LSTMStep:
    """One :class:`LSTMStepShape` as a kernel on CUDA or Metal: float32 rows and state; the table, weights
    and bias in their own dtypes (read as they are, widened as they are multiplied)."""

    def __init__(self, backend: str, shape: LSTMStepShape) -> None:
        self.shape = shape
        self._kernel = custom_kernel(
            backend,
            f"parley_lstm_step_{shape.input}",
            list(shape.inputs),
            ["hidden_out", "cell_out"],
            cuda=_lstm_source(shape, CUDA),
            metal=_lstm_source(shape, METAL),
        )

    def __call__(self, *inputs: mx.array) -> tuple[mx.array, mx.array]:
        shape = self.shape
        named = dict(zip(shape.inputs, inputs, strict=True))
        table = named.get("table", named["wx"])
        hidden, cell = self._kernel(
            inputs=list(inputs),
            template=[
                ("D", shape.width),
                ("H", shape.hidden),
                ("P", max(shape.partials, 1)),
                ("WARPS", WARPS),
                ("TT", table.dtype),
            ],
            grid=(-(-shape.hidden // WARPS) * WARPS * 32, 1, 1),
            threadgroup=(WARPS * 32, 1, 1),
            output_shapes=[(1, shape.hidden), (1, shape.hidden)],
            output_dtypes=[mx.float32, mx.float32],
        )
        return hidden, cell


class JointRow:
    """One :class:`JointRowShape` as a kernel on CUDA or Metal: a float32 row; the weight and bias in their
    own dtypes."""

    def __init__(self, backend: str, shape: JointRowShape) -> None:
        self.shape = shape
        outputs = ["y"] if shape.epilogue == "activation" else ["values", "indices"]
        self._kernel = custom_kernel(
            backend,
            f"parley_joint_row_{shape.epilogue}_{shape.activation}",
            list(shape.inputs),
            outputs,
            cuda=_joint_source(shape, CUDA),
            metal=_joint_source(shape, METAL),
        )

    def __call__(self, *inputs: mx.array) -> mx.array | tuple[mx.array, mx.array]:
        shape = self.shape
        weight = inputs[1]
        if shape.epilogue == "activation":
            output_shapes: list[tuple[int, ...]] = [(1, shape.outputs)]
            output_dtypes = [mx.float32]
        else:
            output_shapes, output_dtypes = [(shape.partials,), (shape.partials,)], [mx.float32, mx.int32]
        results = self._kernel(
            inputs=list(inputs),
            template=[("K", shape.width), ("N", shape.outputs), ("WARPS", WARPS), ("WT", weight.dtype)],
            grid=(shape.partials * WARPS * 32, 1, 1),
            threadgroup=(WARPS * 32, 1, 1),
            output_shapes=output_shapes,
            output_dtypes=output_dtypes,
        )
        return results[0] if shape.epilogue == "activation" else (results[0], results[1])


# --------------------------------------------------------------------------- the whole loop in one launch (CUDA)


@dataclass(frozen=True)
class GreedyLoopShape:
    """A frame's greedy attempts: ``layers`` LSTM layers of ``hidden`` units over a ``vocabulary``-row
    embedding table, a joint of ``joint`` hidden columns scoring ``classes`` classes; ``round_input`` as in
    :class:`LSTMStepShape`."""

    hidden: int
    layers: int
    vocabulary: int
    joint: int
    classes: int
    activation: str = "relu"
    round_input: bool = False

    def steps(self) -> dict[str, LSTMStepShape]:
        """The LSTM steps of an attempt, named as :class:`AttemptParts` names them."""
        width, partials = self.hidden, self.scores().partials
        return {
            "start": LSTMStepShape("zero", width, width),
            "resume": LSTMStepShape("embedding", width, width, partials=1, round_input=self.round_input),
            "chosen": LSTMStepShape("embedding", width, width, partials=partials, round_input=self.round_input),
            "upper": LSTMStepShape("row", width, width),
        }

    def scores(self) -> JointRowShape:
        return JointRowShape(self.joint, self.classes, "partials", self.activation)

    def joint_row(self) -> JointRowShape:
        return JointRowShape(self.hidden, self.joint, "activation", self.activation)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The arrays the loop takes after ``started`` and ``attempts``, in call order: the table, the frame's
        incoming token as one partial pair, the incoming state ``(layers, 1, hidden)``, each layer's weights,
        the joint's prediction projection, the frame's encoder projection and the class projection."""
        layers = [f"{name}{index}" for index in range(self.layers) for name in ("wx", "wh", "bias")]
        incoming = ("table", "values0", "indices0", "hidden0", "cell0")
        return (*incoming, *layers, "pred_weight", "pred_bias", "base", "out_weight", "out_bias")


def greedy_loop_ops(
    parts: AttemptParts, started: bool, attempts: int, *inputs: mx.array, shape: GreedyLoopShape
) -> tuple[mx.array, ...]:
    """The loop as ``parts``, an attempt at a time (:class:`GreedyLoop`'s fallback, and its reference where
    ``parts`` are the admitted kernels): every attempt's state after the incoming one ``(attempts + 1, layers,
    hidden)`` for the hidden and the cell rows, each attempt's activated joint row ``(attempts, joint)``, and
    its partial maxima and their indices ``(attempts, partials)``. A frame that has not started reads no
    incoming state (the start symbol's attempt)."""
    named = dict(zip(shape.inputs, inputs, strict=True))
    table, values, indices = named["table"], named["values0"], named["indices0"]
    state_h = mx.split(named["hidden0"].reshape(shape.layers, shape.hidden), shape.layers)
    state_c = mx.split(named["cell0"].reshape(shape.layers, shape.hidden), shape.layers)
    states_h, states_c = [*state_h], [*state_c]
    activated_rows, all_values, all_indices = [], [], []
    for attempt in range(attempts):
        row = None
        for index in range(shape.layers):
            weights = (state_h[index], state_c[index], *(named[f"{name}{index}"] for name in ("wx", "wh", "bias")))
            if index > 0:
                row, cell = parts.upper(row, *weights)
            elif attempt == 0 and not started:
                row, cell = parts.start(*weights)
            else:
                first = parts.resume if attempt == 0 else parts.chosen
                row, cell = first(table, values, indices, *weights)
            state_h[index], state_c[index] = row, cell
        states_h.extend(state_h)
        states_c.extend(state_c)
        activated = parts.joint_hidden(row, named["pred_weight"], named["pred_bias"], named["base"])
        values, indices = parts.joint_partials(activated, named["out_weight"], named["out_bias"])
        activated_rows.append(activated)
        all_values.append(values)
        all_indices.append(indices)
    # Joined, not stacked: a stack adds a view per input.
    size = (attempts + 1, shape.layers, shape.hidden)
    return (
        mx.concatenate(states_h).reshape(size),
        mx.concatenate(states_c).reshape(size),
        mx.concatenate(activated_rows).reshape(attempts, shape.joint),
        mx.concatenate(all_values).reshape(attempts, -1),
        mx.concatenate(all_indices).reshape(attempts, -1),
    )


def _loop_source(shape: GreedyLoopShape) -> str:
    """Every attempt of a frame in one launch: each LSTM layer, the activated joint row and the class scores'
    partials as the one-attempt kernels compute them (their sources, a block's share at a time), the launch's
    blocks meeting at a barrier after each step. Rows another block wrote are read ``volatile`` (past the
    non-coherent L1 cache)."""
    d, steps = CUDA, shape.steps()
    per_layer = []
    for index in range(shape.layers):
        state = f"""
        constexpr int D = H;
        const auto* wx = wx{index};
        const auto* wh = wh{index};
        const auto* bias = bias{index};
        const volatile float* hidden = a == 0 ? hidden0 + {index} * H : states_h + (a * LAYERS + {index}) * H;
        const volatile float* cell = a == 0 ? cell0 + {index} * H : states_c + (a * LAYERS + {index}) * H;
        float* hidden_out = states_h + ((a + 1) * LAYERS + {index}) * H;
        float* cell_out = states_c + ((a + 1) * LAYERS + {index}) * H;
"""
        if index > 0:
            step = f"""
        const volatile float* x = states_h + ((a + 1) * LAYERS + {index - 1}) * H;
        {block_turns("UNIT_BLOCKS", _lstm_body(steps["upper"], d, produced="volatile "))}
"""
        else:
            step = f"""
        if (a == 0 && !STARTED) {{
            {block_turns("UNIT_BLOCKS", _lstm_body(steps["start"], d))}
        }} else if (a == 0) {{
            const volatile float* values = values0;
            const volatile int* indices = indices0;
            {block_turns("UNIT_BLOCKS", _lstm_body(steps["resume"], d, pairs="1"))}
        }} else {{
            const volatile float* values = all_values + (a - 1) * P;
            const volatile int* indices = all_indices + (a - 1) * P;
            {block_turns("UNIT_BLOCKS", _lstm_body(steps["chosen"], d))}
        }}
"""
        per_layer.append(f"{{{state}{step}}}{GRID_BARRIER_CUDA}")
    return f"""
    constexpr int UNIT_BLOCKS = (H + WARPS - 1) / WARPS;
    const int local = threadIdx.x;
    const int warp = local / 32;
    const int lane = local % 32;
    {GRID_BARRIER_STATE_CUDA}
    // The incoming state as the states' first row (read from the inputs by the first attempt).
    for (int i = blockIdx.x * WARPS * 32 + local; i < LAYERS * H; i += gridDim.x * WARPS * 32) {{
        states_h[i] = hidden0[i];
        states_c[i] = cell0[i];
    }}
    for (int a = 0; a < ATTEMPTS; ++a) {{
        {"".join(per_layer)}
        {{
            constexpr int K = H;
            constexpr int N = J;
            using WT = PWT;
            const volatile float* x = states_h + ((a + 1) * LAYERS + LAYERS - 1) * H;
            const auto* weight = pred_weight;
            const auto* bias = pred_bias;
            float* y = activated + a * J;
            {block_turns("(J + WARPS - 1) / WARPS", _joint_body(shape.joint_row(), d))}
        }}
        {GRID_BARRIER_CUDA}
        {{
            constexpr int K = J;
            constexpr int N = C;
            using WT = OWT;
            const volatile float* x = activated + a * J;
            const auto* weight = out_weight;
            const auto* bias = out_bias;
            float* values = all_values + a * P;
            int* indices = all_indices + a * P;
            {block_turns("P", _joint_body(shape.scores(), d))}
        }}
        if (a + 1 < ATTEMPTS) {{
            {GRID_BARRIER_CUDA}
        }}
    }}
"""


class GreedyLoop:
    """A frame's greedy attempts (:func:`greedy_loop_ops`) as one CUDA launch: the one-attempt kernels' sources
    run in turn by persistent blocks that meet at a bounded grid barrier, so the same arithmetic in the same
    order (admitted bit for bit against those kernels) in one launch where they take four an attempt."""

    def __init__(self, backend: str, shape: GreedyLoopShape) -> None:
        if backend != "cuda":
            raise ValueError(f"the attempts stay one launch each on {backend!r}")
        self.shape = shape
        self._kernel = custom_kernel(
            backend,
            "parley_greedy_loop",
            [*shape.inputs, "tickets"],
            ["states_h", "states_c", "activated", "all_values", "all_indices"],
            cuda=_loop_source(shape),
            metal="",
            # Standing in, every attempt picks the blank (the joint's last class): a frame of silence, as most are.
            stand_in_fill={"all_indices": shape.classes - 1},
        )
        # The barrier's arrivals and generation, on a ticket line: as an array of 8 bytes it would live on the host.
        self._tickets = kernel_tickets()

    def __call__(self, started: bool, attempts: int, *inputs: mx.array) -> tuple[mx.array, ...]:
        shape = self.shape
        named = dict(zip(shape.inputs, inputs, strict=True))
        partials = shape.scores().partials
        size = (attempts + 1, shape.layers, shape.hidden)
        return tuple(
            self._kernel(
                inputs=[*inputs, self._tickets],
                template=[
                    ("H", shape.hidden),
                    ("J", shape.joint),
                    ("C", shape.classes),
                    ("P", partials),
                    ("LAYERS", shape.layers),
                    ("ATTEMPTS", attempts),
                    ("STARTED", int(started)),
                    ("WARPS", WARPS),
                    ("TT", named["table"].dtype),
                    ("PWT", named["pred_weight"].dtype),
                    ("OWT", named["out_weight"].dtype),
                ],
                grid=(-(-max(shape.hidden, shape.joint) // WARPS) * WARPS * 32, 1, 1),
                threadgroup=(WARPS * 32, 1, 1),
                output_shapes=[size, size, (attempts, shape.joint), (attempts, partials), (attempts, partials)],
                output_dtypes=[mx.float32, mx.float32, mx.float32, mx.float32, mx.int32],
            )
        )


# --------------------------------------------------------------------------- admission samples


def _grid(shape: tuple[int, ...], key: mx.array, dtype: mx.Dtype) -> mx.array:
    """Multiples of 1/8 in [-1, 1]: exact in bf16, and their products' sums exact in float32 in any order,
    so that a bf16 rounding of such a sum is the same whichever order summed it."""
    return (mx.random.randint(-8, 9, shape, key=key).astype(mx.float32) / 8).astype(dtype)


def lstm_step_samples(
    shape: LSTMStepShape, vocabulary: int, table_dtype: mx.Dtype, weight_dtype: mx.Dtype, bias_dtype: mx.Dtype
) -> tuple[mx.array, ...]:
    """Inputs for admitting an :class:`LSTMStep` against :func:`lstm_step_ops` (in call order). A rounded
    input product gets grid values (:func:`_grid`), so that both round the same sum."""
    keys = mx.random.split(mx.random.key(73), 9)
    four = 4 * shape.hidden

    def values(size: tuple[int, ...], key: mx.array, dtype: mx.Dtype, scale: float) -> mx.array:
        if shape.round_input:
            return _grid(size, key, dtype)
        return (scale * mx.random.normal(size, key=key)).astype(dtype)

    named = {
        "table": values((vocabulary, shape.width), keys[0], table_dtype, 1.0),
        "values": mx.random.normal((max(shape.partials, 1),), key=keys[1]),
        "indices": mx.random.randint(0, vocabulary, (max(shape.partials, 1),), key=keys[2]).astype(mx.int32),
        "x": mx.random.normal((1, shape.width), key=keys[3]),
        "hidden": 0.5 * mx.random.normal((1, shape.hidden), key=keys[4]),
        "cell": mx.random.normal((1, shape.hidden), key=keys[5]),
        "wx": values((four, shape.width), keys[6], weight_dtype, 1 / math.sqrt(shape.width)),
        "wh": (mx.random.normal((four, shape.hidden), key=keys[7]) / math.sqrt(shape.hidden)).astype(weight_dtype),
        "bias": values((four,), keys[8], bias_dtype, 0.1),
    }
    if shape.input == "zero":
        named["hidden"], named["cell"] = mx.zeros((1, shape.hidden)), mx.zeros((1, shape.hidden))
    return tuple(named[name] for name in shape.inputs)


def joint_row_samples(shape: JointRowShape, weight_dtype: mx.Dtype, bias_dtype: mx.Dtype) -> tuple[mx.array, ...]:
    """Inputs for admitting a :class:`JointRow` against :func:`joint_row_ops` (in call order)."""
    keys = mx.random.split(mx.random.key(79), 4)
    named: dict[str, Any] = {
        "x": mx.random.normal((1, shape.width), key=keys[0]),
        "weight": (mx.random.normal((shape.outputs, shape.width), key=keys[1]) / math.sqrt(shape.width)).astype(
            weight_dtype
        ),
        "bias": (0.1 * mx.random.normal((shape.outputs,), key=keys[2])).astype(bias_dtype),
        "base": mx.random.normal((1, shape.outputs), key=keys[3]),
    }
    return tuple(named[name] for name in shape.inputs)


def greedy_loop_samples(shape: GreedyLoopShape, *dtypes: mx.Dtype) -> list[tuple[Any, ...]]:
    """Inputs for admitting a :class:`GreedyLoop` against :func:`greedy_loop_ops` (in call order): a frame that
    has started and one that has not, three attempts each (the first attempt's two forms and the later one).
    ``dtypes``: the table's, the LSTM weights' and biases', and the prediction and class projections' weights'
    and biases'."""
    table_dtype, weight_dtype, bias_dtype, pred_dtype, pred_bias_dtype, out_dtype, out_bias_dtype = dtypes
    step = shape.steps()["chosen"]
    table, _, indices, hidden, cell, wx, wh, bias = lstm_step_samples(
        step, shape.vocabulary, table_dtype, weight_dtype, bias_dtype
    )
    keys = mx.random.split(mx.random.key(83), 2 * shape.layers)
    layers: list[mx.array] = []
    for index in range(shape.layers):
        if index == 0:
            layers.extend((wx, wh, bias))
        else:
            upper = (mx.random.normal(wx.shape, key=keys[2 * index]) / math.sqrt(shape.hidden)).astype(weight_dtype)
            layers.extend((upper, wh, (0.1 * mx.random.normal(bias.shape, key=keys[2 * index + 1])).astype(bias_dtype)))
    incoming_h = mx.concatenate([hidden] * shape.layers).reshape(shape.layers, 1, shape.hidden)
    incoming_c = mx.concatenate([cell] * shape.layers).reshape(shape.layers, 1, shape.hidden)
    _, pred_weight, pred_bias, base = joint_row_samples(shape.joint_row(), pred_dtype, pred_bias_dtype)
    _, out_weight, out_bias = joint_row_samples(shape.scores(), out_dtype, out_bias_dtype)
    arrays = (table, mx.zeros((1,)), indices[:1], incoming_h, incoming_c, *layers)
    joint = (pred_weight, pred_bias, base, out_weight, out_bias)
    zeros = mx.zeros(incoming_h.shape)
    return [(True, 3, *arrays, *joint), (False, 3, *arrays[:3], zeros, zeros, *layers, *joint)]


@dataclass(frozen=True)
class AttemptParts:
    """One attempt's parts (each the kernel where admitted, else its operations fallback), made by
    :func:`engine.numerics.apply_numerics`; :func:`engine.networks.rnnt.fast.greedy_rows_by_attempt` runs them."""

    start: Callable[..., tuple[mx.array, mx.array]]  # the first layer from the start symbol ("zero")
    resume: Callable[..., tuple[mx.array, mx.array]]  # the first layer from the frame's incoming token (one pair)
    chosen: Callable[..., tuple[mx.array, mx.array]]  # the first layer from the previous attempt's partials
    upper: Callable[..., tuple[mx.array, mx.array]]  # a layer above the first ("row")
    joint_hidden: Callable[..., mx.array]
    joint_partials: Callable[..., tuple[mx.array, mx.array]]
    loop_shape: GreedyLoopShape  # the layout the parts take
    # Every attempt of a frame in one launch (:class:`GreedyLoop`, where admitted), else None: the parts above
    # an attempt at a time (:func:`greedy_loop_ops`).
    loop: Callable[..., tuple[mx.array, ...]] | None = None
