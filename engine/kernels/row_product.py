"""A few float32 rows through a dense projection, with the norm before it and the gate after it, as one
kernel (fast numerics).

A streaming step multiplies one or two rows (the encoder's newest frame; the two guidance rows of the
TTS backbone and the MoG head) by each dense weight. MLX runs such a sublayer as an RMS norm, one
product per weight, and the residual adds and activation between them: half a dozen primitives, each
costing host time on a GPU whatever its arithmetic, and each product reads the float32 copy of a bf16 weight
(:mod:`engine.loading.precast`). :class:`RowProduct` does a whole run in one launch:

* **prologue** — ``"none"``: the rows as given; ``"norm"``: ``rms_norm(x) · s`` (a Gemma norm's
  ``1 + w`` as ``s``); ``"residual_norm"``: first ``h = x + rms_norm(r) · s_r`` (the previous
  sublayer's post-norm and residual add, which it also writes out as ``hidden``), then ``rms_norm(h) · s``;
  ``"layer_norm"``: ``layer_norm(x) · s + b``; ``"layer_norm_twice"``: first ``h = layer_norm(x) · s_p + b_p``
  (the previous layer's output norm, which it also writes out as ``hidden``), then ``layer_norm(h) · s + b``;
  ``"conv_norm"``: ``x`` is the ``taps − 1`` cached rows of a
  window whose newest row comes apart (``newest``), and the one row is ``silu(layer_norm(depthwise_conv(window))
  · s + b)`` (the tail of a Conformer convolution module); it also writes the window's last ``taps − 1`` rows
  as ``next_window`` (the next frame's cache), as it reads them;
* **products** — one to three weights sharing the input (a layer's q, k and v), each written as its
  own output; weights in bf16 (read directly, widened as they are multiplied) or float32;
* **epilogue** — ``"gelu_gate"``: two weights ``g`` and ``u``, written as ``gelu_tanh(x·gᵀ) · (x·uᵀ)``
  (a Gemma MLP's gate and up projections); ``"glu"``: one weight of ``2n`` rows, written as
  ``a · sigmoid(b)`` of its two halves; ``"silu"``: ``silu(x·wᵀ)``; ``"residual"``: ``base + f · (x·wᵀ)``
  (a sublayer's residual add, ``f`` ½ for a Conformer's half-step feed-forward).

Each warp computes one output column's dot products for every row, reading the contiguous weight
row 16 bytes per lane; for a long input (the MLP's down projection) :attr:`RowProductShape.split`
warps share a column, each summing a slice, so that enough warps stream the weight. Every block
repeats the cheap norm of its input rows in threadgroup memory.

Arithmetic: float32 throughout like the reference, each sum in another order (relative L2 about
1e-7 against a float32 computation). :func:`row_product_ops` is the operations fallback — exactly
the reference's operations — that the CPU runs. The kernel is admitted against it computed on the
CPU (:func:`engine.kernels.admission.admit_kernel`): MLX's CUDA backend multiplies several float32 rows with
reduced-precision (TF32) inputs, about 2e-4 from float32, so that the kernel is closer to the
reference's float32 arithmetic than exact mode on the same GPU is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from ..ops.sampling import guide
from .admission import custom_kernel, kernel_constants
from .row_product_source import _CUDA_BODY, _CUDA_LOAD, _CUDA_PROLOGUES, _METAL_BODY, _METAL_PROLOGUES

Prologue = Literal["none", "norm", "residual_norm", "layer_norm", "layer_norm_twice", "conv_norm"]
PROLOGUES: tuple[Prologue, ...] = ("none", "norm", "residual_norm", "layer_norm", "layer_norm_twice", "conv_norm")
Epilogue = Literal["none", "gelu_gate", "glu", "silu", "residual"]
EPILOGUES: tuple[Epilogue, ...] = ("none", "gelu_gate", "glu", "silu", "residual")  # the kernels' EPILOGUE codes
# The inputs each prologue and epilogue reads besides the rows and the weights, in call order.
PROLOGUE_INPUTS: dict[Prologue, tuple[str, ...]] = {
    "none": (),
    "norm": ("norm_scale",),
    "residual_norm": ("norm_scale", "residual", "residual_scale"),
    "layer_norm": ("norm_scale", "norm_bias"),
    "layer_norm_twice": ("norm_scale", "norm_bias", "prior_scale", "prior_bias"),
    "conv_norm": ("norm_scale", "norm_bias", "depthwise", "newest"),
}
EPILOGUE_INPUTS: dict[Epilogue, tuple[str, ...]] = {"residual": ("base",)}

# Warps (simdgroups) per block; each computes one output column (or a slice of its sum: split).
WARPS = 8
# Elements of a weight row one lane reads at a time (16 bytes of bf16).
CHUNK = 8
# The normed input rows live in threadgroup memory: 32 KB on Apple GPUs.
SHARED_BYTES = 32 * 1024


@dataclass(frozen=True)
class RowProductShape:
    """What one kernel instance computes: ``rows`` rows of ``width`` inputs into ``outputs`` columns per
    weight (``"gelu_gate"``: two weights, one output; ``"glu"``: one weight, half its rows out). A
    ``"conv_norm"`` prologue reads a window of ``taps`` rows (cached rows and the newest) for its one row and
    writes the window's last ``taps − 1`` rows after the outputs; ``"residual"`` adds ``factor``
    times the product to its base. With ``value_heads`` the last output comes as ``(rows, value_heads, 1,
    n / value_heads)``, one position's heads as an attention cache stores them (the same memory as its rows,
    with no view to make). ``guided``: the two normed rows, conditional and unconditional, become the one row
    ``c + g·(c − u)`` (classifier-free guidance, ``g`` given at the call) before the products."""

    rows: int
    width: int
    outputs: tuple[int, ...]
    prologue: Prologue
    epilogue: Epilogue = "none"
    taps: int = 0
    factor: float = 1.0
    value_heads: int = 0
    guided: bool = False

    def __post_init__(self) -> None:
        if self.prologue not in PROLOGUES:
            raise ValueError(f"prologue must be one of {PROLOGUES}, not {self.prologue!r}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, not {self.epilogue!r}")
        weights = {"gelu_gate": 2, "glu": 1, "silu": 1, "residual": 1}.get(self.epilogue)
        if not 1 <= len(self.outputs) <= 3 or (weights is not None and len(self.outputs) != weights):
            raise ValueError(f"{self.epilogue} takes {weights or 'one to three'} weights, not {len(self.outputs)}")
        if self.epilogue == "gelu_gate" and self.outputs[0] != self.outputs[1]:
            raise ValueError(f"gate and up weights differ in size: {self.outputs}")
        if self.epilogue == "glu" and self.outputs[0] % 2:
            raise ValueError(f"a GLU weight needs an even number of rows, not {self.outputs[0]}")
        if (self.prologue == "conv_norm") != (self.taps > 0) or (self.taps and self.rows != 1):
            raise ValueError("a conv_norm prologue makes one row from a window of taps > 0 rows")
        if self.value_heads and (self.epilogue != "none" or self.outputs[-1] % self.value_heads):
            raise ValueError(f"{self.value_heads} heads do not split the last of the outputs {self.outputs}")
        mixable = self.prologue in ("norm", "residual_norm") and self.rows == 2 and self.epilogue == "none"
        mixable = mixable and not self.value_heads  # its outputs are one row
        if self.guided and not mixable:
            raise ValueError("guidance mixes two normed rows (conditional, unconditional) into the one it multiplies")

    @property
    def output_rows(self) -> int:
        """Rows each output has: one for a guided product, else ``rows``."""
        return 1 if self.guided else self.rows

    @property
    def columns(self) -> int:
        """Output columns the warps share out."""
        if self.epilogue == "gelu_gate":
            return self.outputs[0]
        return self.outputs[0] // 2 if self.epilogue == "glu" else sum(self.outputs)

    @property
    def output_widths(self) -> tuple[int, ...]:
        """The width of each output (before the ``hidden`` rows of a ``"residual_norm"`` prologue)."""
        return (self.columns,) if self.epilogue in ("gelu_gate", "glu") else self.outputs

    @property
    def input_rows(self) -> int:
        """Rows of the input ``x``: the window's cached rows for ``"conv_norm"``, else ``rows``."""
        return self.taps - 1 if self.prologue == "conv_norm" else self.rows

    @property
    def split(self) -> int:
        """Warps that share one column's sum, each over a slice of the input: enough that a long input
        (the MLP's down projection) still spreads over many warps, while each slice keeps a few 16-byte
        reads per lane."""
        chunks = self.width // CHUNK
        return next(count for count in (8, 4, 2, 1) if count == 1 or chunks // count >= 4 * 32)


def row_product_ops(
    x: mx.array,
    weights: tuple[mx.array, ...],
    norm_scale: mx.array | None = None,
    residual: mx.array | None = None,
    residual_scale: mx.array | None = None,
    norm_bias: mx.array | None = None,
    depthwise: mx.array | None = None,
    base: mx.array | None = None,
    newest: mx.array | None = None,
    prior_scale: mx.array | None = None,
    prior_bias: mx.array | None = None,
    *,
    eps: float = 1e-6,
    epilogue: Epilogue = "none",
    factor: float = 1.0,
    value_heads: int = 0,
    guidance: float | None = None,
) -> tuple[mx.array, ...]:
    """The reference's operations for :class:`RowProduct` (its fallback).

    ``x`` (rows, width) float32 — for a depthwise convolution (``depthwise`` ``(width, taps, 1)``), the cached
    ``(taps − 1, width)`` rows of the window it convolves, whose newest row is ``newest``, before a layer norm
    and SiLU; ``weights`` each (n, width), or a pointwise convolution's ``(n, 1, width)``; ``norm_scale``
    applies an RMS norm first (a layer norm with
    ``norm_bias``; ``residual`` and ``residual_scale`` add ``rms_norm(residual) · residual_scale`` to ``x``
    before it). Returns one output per weight (one for a gate or GLU; the last split into ``value_heads``
    heads, see :class:`RowProductShape`), then the summed rows when a residual was added, or the window's last
    ``taps − 1`` rows after a depthwise convolution. ``guidance`` mixes the two normed rows into one first.
    """
    passed_on = None  # the summed rows, or the next window
    if depthwise is not None:
        assert norm_scale is not None and norm_bias is not None and newest is not None
        window = mx.concatenate([x, newest], axis=0)
        convolved = mx.conv1d(mx.expand_dims(window, 0), depthwise, groups=x.shape[-1])[0]
        x = nn.silu(mx.fast.layer_norm(convolved, norm_scale, norm_bias, eps))
        passed_on = window[1:]
    elif residual is not None:
        assert residual_scale is not None and norm_scale is not None
        passed_on = x + mx.fast.rms_norm(residual, residual_scale, eps)
        x = mx.fast.rms_norm(passed_on, norm_scale, eps)
    elif prior_scale is not None:
        passed_on = mx.fast.layer_norm(x, prior_scale, prior_bias, eps)
        x = mx.fast.layer_norm(passed_on, norm_scale, norm_bias, eps)
    elif norm_bias is not None:
        x = mx.fast.layer_norm(x, norm_scale, norm_bias, eps)
    elif norm_scale is not None:
        x = mx.fast.rms_norm(x, norm_scale, eps)
    if guidance is not None:  # the MoG head's guidance, as the reference mixes the normed rows
        x = guide(x, guidance)
    products = [x @ (weight if weight.ndim == 2 else weight.reshape(weight.shape[0], -1)).T for weight in weights]
    if epilogue == "gelu_gate":
        outputs = [_gelu_tanh_ops(products[0]) * products[1]]
    elif epilogue == "glu":
        outputs = [nn.glu(products[0], axis=-1)]
    elif epilogue == "silu":
        outputs = [nn.silu(products[0])]
    elif epilogue == "residual":
        assert base is not None
        outputs = [base + factor * products[0]]
    else:
        outputs = products
    if value_heads:
        outputs[-1] = outputs[-1].reshape(outputs[-1].shape[0], value_heads, 1, -1)
    return (*outputs, passed_on) if passed_on is not None else tuple(outputs)


def _gelu_tanh_ops(x: mx.array) -> mx.array:
    gelu: mx.array = nn.gelu_approx(x)  # MLX leaves its activations unannotated
    return gelu


def _source(
    body: str,
    prologues: dict[str, str],
    shape: RowProductShape,
    weight_dtype: mx.Dtype,
    metal: bool,
    *,
    chained: bool = False,
) -> str:
    """The kernel source for ``shape``: unused weights and outputs point at the first ones (never reached).
    ``chained`` (CUDA): the body of one step of a chain (:mod:`engine.kernels.row_chain`), which runs it for each
    ``block`` in turn and keeps the normed rows in one array of its own."""
    weights = len(shape.outputs)
    shared = "threadgroup" if metal else "__shared__ __align__(16)"
    uses_rows = shape.prologue != "none"  # the products read the normed rows (a chain keeps them itself)
    single = shape.epilogue in ("gelu_gate", "glu")  # one output
    source = (
        body.replace("@PROLOGUE@", prologues[shape.prologue] + (prologues["guidance"] if shape.guided else ""))
        .replace("@ROWS_MEMORY@", f"{shared} float rows[ROWS * K];" if uses_rows and not chained else "")
        .replace("@INPUT@", "rows" if uses_rows else "x")
        .replace("@W1@", "w1" if weights > 1 else "w0")
        .replace("@W2@", "w2" if weights > 2 else "w0")
        .replace("@SECOND@", "w1" if shape.epilogue == "gelu_gate" else "w0")
        .replace("@Y1@", "y1" if weights > 1 and not single else "y0")
        .replace("@Y2@", "y2" if weights > 2 else "y0")
        .replace("@BASE@", "base" if shape.epilogue == "residual" else "y0")
    )
    if not metal:
        source = source.replace("@LOAD@", _CUDA_LOAD[weight_dtype])
        if not chained:
            source = "    const int block = blockIdx.x;" + source
    return source


class RowProduct:
    """One :class:`RowProductShape` as a kernel on CUDA or Metal (float32 rows, bf16 or float32 weights)."""

    def __init__(
        self,
        backend: str,
        shape: RowProductShape,
        weight_dtype: mx.Dtype,
        scale_dtype: mx.Dtype,
        *,
        warps: int = WARPS,
    ) -> None:
        if warps % shape.split or not 1 <= warps <= 32:
            raise ValueError(f"{warps} warps per block cannot share columns {shape.split} ways")
        if shape.width % CHUNK:
            raise ValueError(f"the input width {shape.width} is not a multiple of {CHUNK}")
        if weight_dtype not in _CUDA_LOAD:
            raise ValueError(f"weights in {weight_dtype} are not read by the kernel")
        if shape.prologue != "none" and shape.rows * shape.width * 4 > SHARED_BYTES:
            raise ValueError(f"{shape.rows} normed rows of {shape.width} do not fit in threadgroup memory")
        self.shape = shape
        self.warps = warps  # a tuning knob: tests/device/fast_kernels.py times the choices
        self._weight_dtype = weight_dtype
        self._scale_dtype = scale_dtype
        weights = [f"w{index}" for index in range(len(shape.outputs))]
        extra = [*PROLOGUE_INPUTS[shape.prologue], *EPILOGUE_INPUTS.get(shape.epilogue, ())]
        self._inputs = ["x", *weights, *extra, "params"]
        outputs = [f"y{index}" for index in range(len(shape.output_widths))]
        passed_on = {"residual_norm": ["hidden"], "layer_norm_twice": ["hidden"], "conv_norm": ["next_window"]}.get(
            shape.prologue, []
        )
        self._outputs = [*outputs, *passed_on]
        epilogue = "" if shape.epilogue == "none" else f"_{shape.epilogue}"
        self._kernel = custom_kernel(
            backend,
            f"parley_row_product_{shape.prologue}{epilogue}_{len(shape.outputs)}",
            self._inputs,
            self._outputs,
            cuda=_source(_CUDA_BODY, _CUDA_PROLOGUES, shape, weight_dtype, metal=False),
            metal=_source(_METAL_BODY, _METAL_PROLOGUES, shape, weight_dtype, metal=True),
        )
        self._params: dict[tuple[float, float | None], mx.array] = {}

    def __call__(
        self,
        x: mx.array,
        weights: tuple[mx.array, ...],
        norm_scale: mx.array | None = None,
        residual: mx.array | None = None,
        residual_scale: mx.array | None = None,
        norm_bias: mx.array | None = None,
        depthwise: mx.array | None = None,
        base: mx.array | None = None,
        newest: mx.array | None = None,
        prior_scale: mx.array | None = None,
        prior_bias: mx.array | None = None,
        *,
        eps: float = 1e-6,
        guidance: float | None = None,
    ) -> tuple[mx.array, ...]:
        """:func:`row_product_ops`'s computation (the epilogue and its factor are the shape's; ``guidance``, the
        scale of a guided shape's mix)."""
        named: dict[str, Any] = {"x": x, "norm_scale": norm_scale, "residual": residual}
        named.update({"residual_scale": residual_scale, "norm_bias": norm_bias, "depthwise": depthwise})
        named.update({"base": base, "newest": newest, "prior_scale": prior_scale, "prior_bias": prior_bias})
        named.update({f"w{index}": weight for index, weight in enumerate(weights)})
        launch = self.launch(named, eps=eps, guidance=guidance)
        results = self._kernel(
            inputs=launch.inputs,
            template=self.template,
            grid=(self.blocks * self.warps * 32, 1, 1),
            threadgroup=(self.warps * 32, 1, 1),
            output_shapes=launch.output_shapes,
            output_dtypes=[mx.float32] * len(launch.output_shapes),
        )
        return tuple(results)

    @property
    def input_names(self) -> list[str]:
        """The kernel's inputs, in order."""
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        """The kernel's outputs, in order."""
        return list(self._outputs)

    def chained_source(self) -> str:
        """The CUDA body a chain's step runs (:mod:`engine.kernels.row_chain`)."""
        return _source(_CUDA_BODY, _CUDA_PROLOGUES, self.shape, self._weight_dtype, metal=False, chained=True)

    def launch(self, named: dict[str, Any], *, eps: float, guidance: float | None) -> RowLaunch:
        """What a launch on the arrays ``named`` (by input name; the weights as ``w0``…) takes."""
        shape = self.shape
        if shape.guided != (guidance is not None):
            raise ValueError("a guided row product takes a guidance scale, and only it")
        if (eps, guidance) not in self._params:
            # The gelu's sqrt(2/π) as the reference's float32 constant (``math.sqrt(2 / math.pi)`` rounded once).
            constants = [eps, math.sqrt(2 / math.pi), shape.factor, guidance or 0.0]
            self._params[eps, guidance] = kernel_constants(*constants)
        named = {**named, "params": self._params[eps, guidance]}
        out_shapes: list[tuple[int, ...]] = [(shape.output_rows, size) for size in shape.output_widths]
        if shape.value_heads:
            out_shapes[-1] = (shape.rows, shape.value_heads, 1, shape.output_widths[-1] // shape.value_heads)
        if shape.prologue in ("residual_norm", "layer_norm_twice"):
            out_shapes.append((shape.rows, shape.width))
        elif shape.prologue == "conv_norm":
            out_shapes.append((shape.taps - 1, shape.width))
        return RowLaunch(inputs=[named[name] for name in self._inputs], output_shapes=out_shapes)

    @property
    def template(self) -> list[tuple[str, Any]]:
        """The kernel's template constants and types."""
        shape = self.shape
        sizes = [*shape.outputs, 0, 0][:3]
        return [
            ("ROWS", shape.rows),
            ("K", shape.width),
            ("N0", sizes[0]),
            ("N1", sizes[1]),
            ("N2", sizes[2]),
            ("COLUMNS", shape.columns),
            ("SPLIT", shape.split),
            ("EPILOGUE", EPILOGUES.index(shape.epilogue)),
            ("TAPS", max(shape.taps, 1)),
            ("GUIDED", int(shape.guided)),
            ("WARPS", self.warps),
            ("WT", self._weight_dtype),
            ("ST", self._scale_dtype),
        ]

    @property
    def blocks(self) -> int:
        """Blocks of a launch: one per :attr:`warps` // split columns."""
        return -(-self.shape.columns // (self.warps // self.shape.split))


@dataclass(frozen=True)
class RowLaunch:
    """One :class:`RowProduct` launch's inputs, in order, and output shapes."""

    inputs: list[Any]
    output_shapes: list[tuple[int, ...]]


def row_product_samples(shape: RowProductShape, weight_dtype: mx.Dtype, scale_dtype: mx.Dtype) -> tuple[Any, ...]:
    """Random inputs for admitting a :class:`RowProduct` against :func:`row_product_ops` (in its call order)."""
    keys = mx.random.split(mx.random.key(61), 9)
    x = mx.random.normal((shape.input_rows, shape.width), key=keys[0])
    weights = tuple(
        (mx.random.normal((size, shape.width), key=key) / math.sqrt(shape.width)).astype(weight_dtype)
        for size, key in zip(shape.outputs, mx.random.split(keys[1], len(shape.outputs)), strict=True)
    )
    named: dict[str, mx.array] = {}
    inputs = PROLOGUE_INPUTS[shape.prologue]
    if "norm_scale" in inputs:
        named["norm_scale"] = (1.0 + 0.1 * mx.random.normal((shape.width,), key=keys[2])).astype(scale_dtype)
    if "residual" in inputs:
        named["residual"] = 3.0 * mx.random.normal((shape.rows, shape.width), key=keys[3])
        named["residual_scale"] = (1.0 + 0.1 * mx.random.normal((shape.width,), key=keys[4])).astype(scale_dtype)
    if "norm_bias" in inputs:
        named["norm_bias"] = (0.1 * mx.random.normal((shape.width,), key=keys[5])).astype(scale_dtype)
    if "depthwise" in inputs:
        taps = mx.random.normal((shape.width, shape.taps, 1), key=keys[6]) / math.sqrt(shape.taps)
        named["depthwise"] = taps.astype(scale_dtype)
    if "newest" in inputs:
        named["newest"] = mx.random.normal((1, shape.width), key=keys[8])
    if "prior_scale" in inputs:  # around other values than the second norm's
        named["prior_scale"] = (0.5 + 0.2 * mx.random.normal((shape.width,), key=keys[4])).astype(scale_dtype)
        named["prior_bias"] = (0.3 * mx.random.normal((shape.width,), key=keys[3])).astype(scale_dtype)
    if shape.epilogue == "residual":
        named["base"] = mx.random.normal((shape.rows, shape.columns), key=keys[7])
    order = (
        "norm_scale",
        "residual",
        "residual_scale",
        "norm_bias",
        "depthwise",
        "base",
        "newest",
        "prior_scale",
        "prior_bias",
    )
    return (x, weights, *(named.get(name) for name in order))
