"""Building fast mode's custom kernels, and admitting each only where it matches its fallback on this device.

:func:`custom_kernel` builds a kernel from its CUDA or Metal source, under a name that changes with the source;
:func:`kernel_constants` and :func:`kernel_tickets` make the small inputs kernels read, kept out of the pool of host
memory that MLX's CUDA allocator keeps small arrays in; :func:`admit_kernel` runs a kernel and its operations
fallback on the same inputs and says whether they agree (relative L2 ≤ :data:`KERNEL_TOLERANCE`); :func:`fast_part`
makes and admits a kernel once per process and key, and gives the fallback where no kernel can run here or the kernel
did not match. Which parts fast mode asks for, and why each is safe, is docs/numerics.md.

:func:`stand_in_kernels` lets the CPU build CUDA's fast path for counting: every kernel is admitted without being run
and stands in as one ``Depends`` primitive on its inputs with outputs of the right shapes (their values meaningless),
so that a census (:mod:`engine.counters`) counts the primitives, kernels, weight reads and Python calls of a GPU's
frame on a machine without one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, cast

import mlx.core as mx

# A kernel's outputs may differ from its fallback's by float32 reordering only.
KERNEL_TOLERANCE = 1e-5

log = logging.getLogger(__name__)


# Whether kernels stand in for CUDA's on the CPU (stand_in_kernels).
_standing_in = False


def stand_in_kernels(on: bool = True) -> None:
    """Build CUDA's fast path on the CPU for counting and timing the host, not computing (before the model is loaded;
    the CPU only): the backend reads as ``"cuda"``, every kernel is a :class:`StandInKernel` and every admission passes
    unrun. Frames then launch what a GPU's would, with meaningless values: ``parley bench --stand-in-kernels``."""
    global _standing_in
    if on and mx.default_device().type == mx.gpu:
        raise ValueError("kernels stand in for CUDA's on the CPU only; this device runs the kernels themselves")
    _standing_in = on
    _PARTS.clear()


@contextlib.contextmanager
def kernels_standing_in(on: bool = True) -> Iterator[None]:
    """:func:`stand_in_kernels` for the block (nothing where ``on`` is false), switched off again after it."""
    if not on:
        yield
        return
    stand_in_kernels()
    try:
        yield
    finally:
        stand_in_kernels(False)


def standing_in() -> bool:
    """Whether kernels stand in for CUDA's (:func:`stand_in_kernels`)."""
    return _standing_in


def gpu_kernel_backend() -> str | None:
    """``"cuda"`` or ``"metal"`` when custom kernels can run on the default device (or stand in for CUDA's:
    :func:`stand_in_kernels`), else None."""
    if _standing_in:
        return "cuda"
    if mx.default_device().type != mx.gpu:
        return None
    if mx.cuda.is_available():
        return "cuda"
    if mx.metal.is_available():
        return "metal"
    return None


# MLX's CUDA allocator keeps arrays of 8 bytes or less in a pool of host memory, so a kernel reading one waits on
# PCIe (about a microsecond a read). The constants kernels read are padded past that size.
KERNEL_CONSTANT_BYTES = 16


# A kernel's ticket counters (int32 zeros that it keeps on from launch to launch) take a 128-byte line each. That
# also keeps the workspace over 8 bytes, out of the host pool above, where every block's atomic add and every poll
# of a counter would cross PCIe (measured: 35 µs more a launch for the residual-VQ step's one counter).
TICKET_STRIDE = 32


def kernel_tickets(lines: int = 1) -> mx.array:
    """A kernel's workspace of ``lines`` ticket lines (:data:`TICKET_STRIDE` int32 zeros each), evaluated."""
    tickets = mx.zeros((lines * TICKET_STRIDE,), dtype=mx.int32)
    mx.eval(tickets)
    return tickets


def kernel_constants(*values: float) -> mx.array:
    """``values`` as a float32 kernel input kept out of that host pool: zeros follow them up to
    :data:`KERNEL_CONSTANT_BYTES` (kernels and fallbacks read the leading entries only)."""
    padding = max(0, KERNEL_CONSTANT_BYTES // 4 - len(values))
    return mx.array([*values, *[0.0] * padding], dtype=mx.float32)


# A custom kernel as MLX builds it: called with ``inputs``, ``template``, ``grid``, ``threadgroup``,
# ``output_shapes`` and ``output_dtypes``, it returns its outputs.
Kernel = Callable[..., list[mx.array]]


class StandInKernel:
    """A kernel's place in the graph without its arithmetic (:func:`stand_in_kernels`): called as MLX's kernels are,
    it returns arrays of the asked shapes and dtypes through one ``Depends`` primitive on every input, so that what
    the kernel reads counts and what reads its outputs follows it. Outputs are zeros, or ``fill``'s value by output
    name where a zero would send the frame down a path a GPU's seldom takes."""

    def __init__(self, name: str, outputs: list[str], fill: dict[str, float] | None = None) -> None:
        self.name = name
        self._outputs = outputs
        self._fill = fill or {}
        self._constants: dict[tuple[str, tuple[int, ...], mx.Dtype], mx.array] = {}

    def __call__(
        self, *, inputs: list[mx.array], output_shapes: list[Any], output_dtypes: list[mx.Dtype], **_: Any
    ) -> list[mx.array]:
        placeholders = [
            self._constant(name, tuple(shape), dtype)
            for name, shape, dtype in zip(self._outputs, output_shapes, output_dtypes, strict=True)
        ]
        return list(mx.depends(placeholders, list(inputs)))

    def _constant(self, name: str, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
        """An evaluated constant per output (made once, so that it adds no primitive of its own)."""
        key = (name, shape, dtype)
        if key not in self._constants:
            self._constants[key] = mx.full(shape, self._fill.get(name, 0), dtype=dtype)
            mx.eval(self._constants[key])
        return self._constants[key]


def custom_kernel(
    backend: str,
    name: str,
    inputs: list[str],
    outputs: list[str],
    *,
    cuda: str,
    metal: str,
    cuda_header: str = "",
    stand_in_fill: dict[str, float] | None = None,
) -> Kernel:
    """MLX's custom kernel ``name`` for ``backend`` (``"cuda"`` or ``"metal"``), from that backend's source
    (on CUDA after ``cuda_header``: functions the body calls); a :class:`StandInKernel` while kernels stand in
    (``stand_in_fill``: its outputs' values by name, where not zero).

    The name MLX sees ends in a hash of the source: MLX caches compiled kernels by name (on CUDA in a
    folder that outlives the process), so a kernel whose source changed with an update of Parley must
    not meet the old build under the same name."""
    source = {"cuda": cuda, "metal": metal}.get(backend)
    if source is None:
        raise ValueError(f"no {name} kernel for {backend!r}")
    header = cuda_header if backend == "cuda" else ""
    versioned = f"{name}_{hashlib.sha256((header + source).encode()).hexdigest()[:12]}"
    if _standing_in:
        return StandInKernel(versioned, outputs, stand_in_fill)
    if backend == "cuda":
        kernel = mx.fast.cuda_kernel(
            name=versioned, input_names=inputs, output_names=outputs, source=source, header=header
        )
    else:
        kernel = mx.fast.metal_kernel(name=versioned, input_names=inputs, output_names=outputs, source=source)
    return cast(Kernel, kernel)  # MLX's stubs call the kernel object an ``object``


def relative_l2(actual: mx.array, expected: mx.array) -> float:
    """``‖actual − expected‖ / ‖expected‖`` in float32 (0 when both are zero)."""
    difference = mx.sqrt(mx.sum(mx.square(actual.astype(mx.float32) - expected.astype(mx.float32))))
    scale = mx.sqrt(mx.sum(mx.square(expected.astype(mx.float32))))
    difference_value, scale_value = cast(float, difference.item()), cast(float, scale.item())  # float32 scalars
    return difference_value / scale_value if scale_value else difference_value


def admit_kernel(
    name: str,
    kernel: Callable[..., Any],
    fallback: Callable[..., Any],
    inputs: tuple[Any, ...],
    tolerance: float = KERNEL_TOLERANCE,
    reference_device: mx.Device | mx.DeviceType | None = None,
) -> bool:
    """Run ``kernel`` and ``fallback`` on ``inputs``; True when every output agrees within ``tolerance``
    (relative L2; with 0, bit for bit). A kernel that fails to build or run, or disagrees, is not used
    (and the log says why). Either may return one array or a tuple of them. ``reference_device`` runs
    the fallback there (the CPU, for products that MLX's CUDA backend takes in reduced precision). While kernels
    stand in (:func:`stand_in_kernels`) every kernel passes, unrun."""
    if _standing_in:
        return True
    try:
        got = _outputs(kernel(*inputs))
        if reference_device is None:
            want = _outputs(fallback(*inputs))
        else:
            with mx.stream(reference_device):
                want = _outputs(fallback(*inputs))
                mx.eval(want)
        mx.eval(got, want)
        if tolerance == 0:
            # Unequal outputs count as their relative L2 (so that the log tells reordering from a wrong result),
            # and as infinite where that rounds to 0.
            errors = [
                0.0 if mx.array_equal(a, b).item() else relative_l2(a, b) or float("inf")
                for a, b in zip(got, want, strict=True)
            ]
        else:
            errors = [relative_l2(a, b) for a, b in zip(got, want, strict=True)]
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot run on this device is simply not used
        log.warning("the %s kernel is not used: it failed on this device (%s)", name, exc)
        return False
    worst = max(errors)
    if not worst <= tolerance:
        differing = [index for index, error in enumerate(errors) if not error <= tolerance]
        log.warning(
            "the %s kernel is not used: it differs from its fallback by %.3g (bound %g; outputs %s of %d)",
            name,
            worst,
            tolerance,
            differing,
            len(errors),
        )
        return False
    log.info("the %s kernel matches its fallback on this device (relative L2 %.2g)", name, worst)
    return True


def _outputs(result: Any) -> tuple[mx.array, ...]:
    return (result,) if isinstance(result, mx.array) else tuple(result)


# Fast mode's parts, made and admitted once per process and layer shape: a model switched back and forth
# gets the same objects again, so the programs compiled around them are reused (see engine.networks.llm,
# engine.networks.tts).
_PARTS: dict[tuple[Any, ...], tuple[Callable[..., Any], bool]] = {}


def fast_part(
    key: tuple[Any, ...],
    name: str,
    fallback: Callable[..., Any],
    make_kernel: Callable[[str], Callable[..., Any]],
    sample: Callable[[], tuple[Any, ...] | list[tuple[Any, ...]]],
    tolerance: float = KERNEL_TOLERANCE,
    reference_device: mx.Device | mx.DeviceType | None = None,
) -> tuple[Callable[..., Any], bool]:
    """The kernel for ``key`` on this device if it was admitted against ``fallback`` (on every input of
    ``sample``: one tuple of inputs, or a list of them; the fallback run on ``reference_device`` if
    given), else the fallback."""
    backend = gpu_kernel_backend()
    full_key = (*key, backend)
    if full_key not in _PARTS:
        part, used = fallback, False
        if backend is not None:
            try:
                kernel = make_kernel(backend)
            except ValueError as exc:
                log.info("no %s kernel for this shape (%s)", name, exc)
            else:
                samples = sample()
                cases = samples if isinstance(samples, list) else [samples]
                if all(admit_kernel(name, kernel, fallback, inputs, tolerance, reference_device) for inputs in cases):
                    part, used = kernel, True
        _PARTS[full_key] = (part, used)
    return _PARTS[full_key]
