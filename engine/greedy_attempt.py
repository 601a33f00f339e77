"""One RN-T greedy attempt in four launches (fast numerics).

Each attempt of the streaming greedy loop (:func:`engine.rnnt._greedy_rows`) embeds the last
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

An attempt after one that emitted starts from that attempt's state; one after a blank is
masked out by the loop's end, whatever it computed, so no attempt selects a state: the loop's
end picks the state of the last emission once (:func:`engine.rnnt._greedy_rows_by_attempt`).

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

from .kernel_source import CUDA, METAL, Dialect
from .numerics import custom_kernel

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
        # The table as given, or viewed as one (1, width) row per token (engine.rnnt's embedding_table).
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


def _lstm_source(shape: LSTMStepShape, d: Dialect) -> str:
    sigmoid = "1.0f / (1.0f + {exp}(-{x}))"
    choose = ""
    if shape.input == "embedding":
        # Every block finishes the previous attempt's argmax (a few dozen pairs; first index among equals).
        choose = f"""
    {d.shared} int chosen[1];
    if (local == 0) {{
        float best = values[0];
        int token = indices[0];
        for (int p = 1; p < P; ++p) {{
            if (values[p] > best) {{ best = values[p]; token = indices[p]; }}
        }}
        chosen[0] = token;
    }}
    {d.barrier}
"""
    source_row = {
        "zero": "",
        "embedding": f"const {d.device}TT* in = table + static_cast<size_t>(chosen[0]) * D;",
        "row": f"const {d.device}float* in = x;",
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
    {d.header}
    {choose}
    const int unit = block * WARPS + warp;
    if (unit >= H) return;
    float ax[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    float ah[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    {input_product}
    {recurrent}
    for (int g = 0; g < 4; ++g) {{
        {d.warp_sum("ax[g]")}
        {d.warp_sum("ah[g]")}
    }}
    if (lane != 0) return;
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
"""


def _joint_source(shape: JointRowShape, d: Dialect) -> str:
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
    {d.header}
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


@dataclass(frozen=True)
class AttemptParts:
    """One attempt's parts (each the kernel where admitted, else its operations fallback), made by
    :func:`engine.numerics.apply_numerics`; :func:`engine.rnnt._greedy_rows_by_attempt` runs them."""

    start: Callable[..., tuple[mx.array, mx.array]]  # the first layer from the start symbol ("zero")
    resume: Callable[..., tuple[mx.array, mx.array]]  # the first layer from the frame's incoming token (one pair)
    chosen: Callable[..., tuple[mx.array, mx.array]]  # the first layer from the previous attempt's partials
    upper: Callable[..., tuple[mx.array, mx.array]]  # a layer above the first ("row")
    joint_hidden: Callable[..., mx.array]
    joint_partials: Callable[..., tuple[mx.array, mx.array]]
