"""Admitting row products and their chains for a network's fast form (shared by the encoder's and the TTS's).

:func:`row_product_part` admits one :class:`engine.kernels.row_product.RowProduct` against its operations,
:func:`row_product_parts` a network's named set of them, and :func:`row_chains` a network's runs of them as
:class:`engine.kernels.row_chain.RowChain` s (CUDA). :func:`kernel_weight_dtype` says which dtype the kernels read a
network's weights in. Each network's ``fast`` module calls these from its ``use_numerics``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from .admission import admit_kernel, fast_part
from .row_chain import ChainBook, RowCall, RowChain, run_steps
from .row_product import RowProduct, RowProductShape, row_product_ops, row_product_samples

log = logging.getLogger(__name__)


def kernel_weight_dtype(linears: list[Any], on_gpu: bool) -> mx.Dtype | None:
    """bf16 — what the row-product kernels read — on a GPU when every weight of ``linears`` is a bf16 value
    (as stored, or a float32 copy that :mod:`engine.loading.precast` made of one), so a bf16 copy loses nothing;
    otherwise None (the weights as they are: the CPU's fallbacks read them so)."""
    if not on_gpu:
        return None
    weights = [linear.weight for linear in linears]
    same = [mx.array_equal(weight.astype(mx.bfloat16).astype(weight.dtype), weight) for weight in weights]
    mx.eval(same)
    return mx.bfloat16 if all(bool(flag.item()) for flag in same) else None


def row_product_part(
    shape: RowProductShape,
    weight_dtype: mx.Dtype,
    scale_dtype: mx.Dtype,
    eps: float,
    name: str,
    guidance: float | None = None,
) -> tuple[Callable[..., Any], bool]:
    """The row product for ``shape`` (a guided one mixes its rows by ``guidance``): the kernel where admitted, else
    the operations fallback; the flag says which."""
    return fast_part(
        ("row_product", shape, weight_dtype, scale_dtype, eps, guidance),
        name,
        functools.partial(
            row_product_ops,
            eps=eps,
            epilogue=shape.epilogue,
            factor=shape.factor,
            value_heads=shape.value_heads,
            guidance=guidance,
        ),
        lambda backend: functools.partial(
            RowProduct(backend, shape, weight_dtype, scale_dtype), eps=eps, guidance=guidance
        ),
        lambda: row_product_samples(shape, weight_dtype, scale_dtype),
        # MLX's CUDA backend multiplies several float32 rows in reduced precision (TF32 inputs): the
        # kernel, which does not, is held to a float32 reference computed on the CPU.
        reference_device=mx.cpu,
    )


def row_product_parts(
    network: str,
    shapes: dict[str, RowProductShape],
    weight_dtype: mx.Dtype,
    scale_dtype: mx.Dtype,
    eps: dict[str, float],
) -> tuple[dict[str, Callable[..., Any]], bool]:
    """:func:`row_product_part` for each of a network's named ``shapes`` (with its norm's ``eps``); the flag
    says whether every one is a kernel."""
    parts: dict[str, Callable[..., Any]] = {}
    every = True
    for name, shape in shapes.items():
        label = f"{network} {name.replace('_', ' ')} row product"
        parts[name], used = row_product_part(shape, weight_dtype, scale_dtype, eps[name], label)
        every = every and used
    return parts, every


def row_chains(network: str, runs: dict[tuple[Any, ...], list[RowCall]], backend: str) -> tuple[ChainBook, bool]:
    """A network's runs of row products (its ``row_runs()``: the calls of one step, on its own weights) as one
    launch each on ``backend`` (:class:`engine.kernels.row_chain.RowChain`), each admitted bit for bit against its steps
    one launch each. The flag says whether every run is a chain."""
    chains: dict[tuple[Any, ...], Any] = {}
    every = bool(runs)
    for key, calls in runs.items():
        parts = [call.part for call in calls]
        if not all(isinstance(part, functools.partial) and isinstance(part.func, RowProduct) for part in parts):
            every = False
            continue
        products = [part.func for part in parts]  # type: ignore[attr-defined]
        settings = [(part.keywords["eps"], part.keywords.get("guidance")) for part in parts]  # type: ignore[attr-defined]
        try:
            chain = RowChain(backend, key, products, settings)
        except ValueError as exc:
            log.info("no %s row chain of %d steps (%s)", network, len(calls), exc)
            every = False
            continue
        flat = lambda run, made=chain: [array for outputs in made(run) for array in outputs]  # noqa: E731
        reference = lambda run: [array for outputs in run_steps(run) for array in outputs]  # noqa: E731
        if admit_kernel(f"{network} row chain of {len(calls)}", flat, reference, (calls,), tolerance=0.0):
            chains[key] = chain
        else:
            every = False
    return ChainBook(chains=chains), every
