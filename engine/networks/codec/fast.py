"""The codec's fast form: its decoder blocks' streaming convolution and norm as one kernel, and its
dequantization's sum as one kernel (each where admitted against its operations on this device).

:func:`codec_fast` builds it for a :class:`engine.kernels.plan.FastPlan`;
:meth:`engine.networks.codec.Codec.use_numerics` keeps it in the codec's one ``fast`` slot, and the codec's step
branches on that slot (:meth:`CodecFast.streams`, :meth:`CodecFast.decoder_step`, :attr:`CodecFast.code_sum`).
Both kernels are bit for bit their operations (admitted with tolerance 0), so fast mode's codec is exact mode's
but for the number of launches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from ...kernels.admission import fast_part
from ...kernels.code_sum import CodeSum, code_sum_ops, code_sum_samples
from ...kernels.conv_norm import ConvNorm, conv_norm_ops, conv_norm_samples
from ...kernels.conv_norm import variants_for as conv_norm_variants
from ..parameters import parameter_leaves

if TYPE_CHECKING:
    from ...kernels.plan import FastPlan

# The codec's modules, named for the reader: this module imports nothing of engine.networks.codec.codec, which
# imports it (Codec.use_numerics), so that the two make no import circle.
Codec = Any  # engine.networks.codec.codec.Codec
CodecDecoder = Any  # engine.networks.codec.codec.CodecDecoder
ConvNeXtBlock = Any  # engine.networks.codec.codec.ConvNeXtBlock

ConvNormPart = Callable[..., tuple[mx.array, mx.array]]
CodeSumPart = Callable[[mx.array, mx.array, mx.array], mx.array]


@dataclass(frozen=True)
class CodecFast:
    """Fast numerics' parts of one codec: ``conv_norm`` (every decoder block's streaming convolution and norm,
    :class:`engine.kernels.conv_norm.ConvNorm` or its operations) and ``code_sum`` (the dequantization,
    :class:`engine.kernels.code_sum.CodeSum` or its operations); None where a GPU's kernel was not admitted (the
    compiled step's operations, as in exact mode). Hashable: the codec keys its compiled steps by it."""

    conv_norm: ConvNormPart | None = None
    code_sum: CodeSumPart | None = None

    def streams(self, latents: mx.array) -> bool:
        """Whether :meth:`decoder_step` runs the decoder on ``latents (B, T, D)``: one frame of one stream."""
        return self.conv_norm is not None and latents.shape[:2] == (1, 1)

    def decoder_step(
        self, decoder: CodecDecoder, latents: mx.array, histories: list[mx.array]
    ) -> tuple[mx.array, list[mx.array]]:
        """``decoder`` (:class:`engine.networks.codec.CodecDecoder`) for one frame of one stream, its ConvNeXt
        blocks through :meth:`block_step`."""
        outputs: tuple[mx.array, list[mx.array]] = decoder(latents, histories, self.block_step)
        return outputs

    def block_step(self, block: ConvNeXtBlock, inputs: mx.array, history: mx.array) -> tuple[mx.array, mx.array]:
        """One stream's ``inputs (1, T, C)`` through ``block`` with its ``history (1, kernel - 1, C)``: the
        convolution and norm through :attr:`conv_norm`, then the block's own pointwise convolutions (on a GPU a
        matrix product in their place takes another kernel and rounds differently: the teacher-forced waveform fell
        to 34 dB SNR on the H200), all in the stream's own shape (no views)."""
        assert self.conv_norm is not None
        normed, history = self.conv_norm(
            inputs, history, block.dwconv.weight, block.dwconv.bias, block.norm.weight, block.norm.bias
        )
        return inputs + block.pwconv2(nn.gelu(block.pwconv1(normed))), history


def codec_fast(codec: Codec, plan: FastPlan | None) -> tuple[CodecFast | None, dict[str, bool]]:
    """``codec``'s fast form for ``plan`` (None for exact mode, or where no part is in use) and which of its parts
    run as kernels (``codec_conv_norm``, ``codec_code_sum``)."""
    if plan is None:
        return None, {}
    changes: dict[str, bool] = {}
    blocks = codec.decoder.blocks
    conv_norm: ConvNormPart | None = None
    dtype = codec.activation_dtype()
    eps = {block.norm.eps for block in blocks}
    taps = {block.dwconv.weight.shape[1] for block in blocks}
    # The kernel rounds in the activations' dtype, which is every block parameter's dtype as published.
    uniform = all(value.dtype == dtype for block in blocks for _, value in parameter_leaves(block))
    if blocks and uniform and len(eps) == len(taps) == 1:
        (norm_eps,), (kernel_size,) = eps, taps
        # The first variant whose outputs are the operations' bits on this device (engine.kernels.conv_norm).
        for variant in conv_norm_variants(plan.backend):
            conv_norm, changes["codec_conv_norm"] = fast_part(
                ("codec_conv_norm", norm_eps, kernel_size, dtype, variant),
                f"codec convolution and norm ({variant.label})",
                functools.partial(conv_norm_ops, eps=norm_eps),
                functools.partial(ConvNorm, eps=norm_eps, dtype=dtype, variant=variant),
                functools.partial(_conv_norm_samples, codec.decoder.stream_shapes(), kernel_size, dtype),
                tolerance=0.0,  # on inputs whose convolution sums are exact: the operations' bits, or not used
            )
            if changes["codec_conv_norm"]:
                break
        if plan.on_gpu and not changes["codec_conv_norm"]:
            conv_norm = None  # the compiled step's operations, as in exact mode
    quantizers, table_dtype = len(codec.prvq.mus_list), codec.prvq.mus_list[0].dtype
    size, width = codec.prvq.mus_list[0].shape
    code_sum: CodeSumPart | None
    code_sum, changes["codec_code_sum"] = fast_part(
        ("codec_code_sum", table_dtype),
        "codec dequantization",
        code_sum_ops,
        CodeSum,
        functools.partial(code_sum_samples, quantizers, size, width, table_dtype),
        tolerance=0.0,  # bit-identical to the operations, or not used
    )
    if plan.on_gpu and not changes["codec_code_sum"]:
        code_sum = None
    if conv_norm is None and code_sum is None:
        return None, changes
    return CodecFast(conv_norm, code_sum), changes


def _conv_norm_samples(shapes: list[tuple[int, int]], taps: int, dtype: mx.Dtype) -> list[tuple[Any, ...]]:
    """The codec kernel's admission inputs at each decoder stage's shape (see
    :func:`engine.kernels.conv_norm.conv_norm_samples`)."""
    return [conv_norm_samples(positions, channels, taps, dtype) for positions, channels in shapes]
