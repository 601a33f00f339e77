"""One greedy residual-VQ step after its distance product, as one kernel (fast numerics).

The MaskGIT rounds pick each quantizer's code as ``argmin_e ‖e‖² − 2 z·e`` and then move
the row ``e`` from the residual ``z`` into the running sum of chosen rows. After the
product ``z·Eᵀ`` that is a scale-and-subtract, an argmin, a gather, a subtract, an add and
a cast — five or six primitives, 31 times a frame. :class:`NearestCode` does them in one
kernel per quantizer, with the same arithmetic: ``‖e‖² − 2·(z·e)`` rounds once either way
(doubling is exact), ties go to the lowest index as MLX's argmin does, and the row is
copied, subtracted and added exactly. Its result is therefore bit-identical to the
operations (:func:`nearest_code_ops`, the fallback the CPU runs), and the kernel is
admitted only if it is (tolerance 0, :func:`engine.numerics.admit_kernel`).
"""

from __future__ import annotations

import mlx.core as mx

from .numerics import custom_kernel

THREADS = 256

_NEAREST_CUDA = """
    __shared__ float best_values[THREADS / 32];
    __shared__ int best_indices[THREADS / 32];
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const float* row_scores = scores + static_cast<size_t>(row) * C;
    float best = __int_as_float(0x7f800000);  // +infinity
    int index = C;
    for (int j = tid; j < C; j += THREADS) {
        const float distance = static_cast<float>(norms[j]) - 2.0f * row_scores[j];
        if (distance < best) {
            best = distance;
            index = j;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffff, best, offset);
        const int other_index = __shfl_xor_sync(0xffffffff, index, offset);
        if (other < best || (other == best && other_index < index)) {
            best = other;
            index = other_index;
        }
    }
    if (tid % 32 == 0) {
        best_values[tid / 32] = best;
        best_indices[tid / 32] = index;
    }
    __syncthreads();
    best = best_values[0];
    index = best_indices[0];
    for (int w = 1; w < THREADS / 32; ++w) {
        if (best_values[w] < best || (best_values[w] == best && best_indices[w] < index)) {
            best = best_values[w];
            index = best_indices[w];
        }
    }
    if (tid == 0) code[row] = index;
    const size_t chosen = static_cast<size_t>(index) * L;
    for (int d = tid; d < L; d += THREADS) {
        const size_t at = static_cast<size_t>(row) * L + d;
        const float entry = static_cast<float>(book[chosen + d]);
        residual_out[at] = residual[at] - entry;
        chosen_sum_out[at] = chosen_sum[at] + entry;
    }
"""

_NEAREST_METAL = """
    threadgroup float best_values[THREADS / 32];
    threadgroup int best_indices[THREADS / 32];
    const uint row = threadgroup_position_in_grid.x;
    const uint tid = thread_position_in_threadgroup.x;
    const uint lane = thread_index_in_simdgroup;
    const uint warp = simdgroup_index_in_threadgroup;
    const uint scores_at = row * C;
    float best = INFINITY;
    int index = C;
    for (int j = int(tid); j < C; j += THREADS) {
        const float distance = static_cast<float>(norms[j]) - 2.0f * scores[scores_at + j];
        if (distance < best) {
            best = distance;
            index = j;
        }
    }
    for (ushort offset = 16; offset > 0; offset /= 2) {
        const float other = metal::simd_shuffle_xor(best, offset);
        const int other_index = metal::simd_shuffle_xor(index, offset);
        if (other < best || (other == best && other_index < index)) {
            best = other;
            index = other_index;
        }
    }
    if (lane == 0) {
        best_values[warp] = best;
        best_indices[warp] = index;
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    best = best_values[0];
    index = best_indices[0];
    for (int w = 1; w < THREADS / 32; ++w) {
        if (best_values[w] < best || (best_values[w] == best && best_indices[w] < index)) {
            best = best_values[w];
            index = best_indices[w];
        }
    }
    if (tid == 0) code[row] = index;
    const uint chosen = uint(index) * L;
    for (int d = int(tid); d < L; d += THREADS) {
        const uint at = row * L + uint(d);
        const float entry = static_cast<float>(book[chosen + uint(d)]);
        residual_out[at] = residual[at] - entry;
        chosen_sum_out[at] = chosen_sum[at] + entry;
    }
"""

_INPUTS = ["scores", "norms", "book", "residual", "chosen_sum"]
_OUTPUTS = ["code", "residual_out", "chosen_sum_out"]


def nearest_code_ops(
    scores: mx.array, norms: mx.array, book: mx.array, residual: mx.array, chosen_sum: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """The exact arithmetic of one quantizer's greedy step: the kernel's fallback.

    ``scores`` (T, C) is ``residual @ bookᵀ``, ``norms`` (C,) each entry's ‖e‖², ``book`` (C, L),
    ``residual`` and ``chosen_sum`` (T, L). Returns the codes (T, 1) int32 (a column of the frame's
    (T, Q) codes, joined without reshaping), the residual after the chosen rows are taken out, and the
    sum after they are added in.
    """
    chosen = mx.argmin(norms - 2.0 * scores, axis=-1, keepdims=True)
    row = book[chosen.reshape(-1)]
    return chosen.astype(mx.int32), residual - row, chosen_sum + row


class NearestCode:
    """The greedy residual-VQ step kernel, on CUDA or Metal: float32 scores and residuals; the codebook and
    its norms float32 or bf16 (widened exactly, as the operations promote them)."""

    def __init__(self, backend: str) -> None:
        self._kernel = custom_kernel(
            backend, "parley_nearest_code", _INPUTS, _OUTPUTS, cuda=_NEAREST_CUDA, metal=_NEAREST_METAL
        )

    def __call__(
        self, scores: mx.array, norms: mx.array, book: mx.array, residual: mx.array, chosen_sum: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        rows, entries = scores.shape
        width = book.shape[1]
        code, residual_out, chosen_sum_out = self._kernel(
            inputs=[scores, norms, book, residual, chosen_sum],
            # The dtypes name the kernel too: its source is generated for its inputs' types.
            template=[("C", entries), ("L", width), ("THREADS", THREADS), ("BT", book.dtype), ("NT", norms.dtype)],
            grid=(rows * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(rows, 1), (rows, width), (rows, width)],
            output_dtypes=[mx.int32, mx.float32, mx.float32],
        )
        return code, residual_out, chosen_sum_out


def nearest_code_sample(
    entries: int, width: int, dtype: mx.Dtype = mx.float32, norms_dtype: mx.Dtype | None = None
) -> tuple[mx.array, ...]:
    """Random inputs for admitting the kernel, with a tie (two equal entries) among the nearest. The codebook
    is in ``dtype``, its norms in ``norms_dtype`` (default: the same), summed from the codebook rounded to
    that type as the TTS derives them; the products and residuals are float32, as in the MaskGIT rounds."""
    keys = mx.random.split(mx.random.key(2468), 3)
    source = mx.random.normal((entries, width), key=keys[0]).astype(norms_dtype or dtype)
    source = mx.concatenate([source[:1], source[:1], source[2:]], axis=0)  # entries 0 and 1 tie
    norms = mx.sum(source * source, axis=-1)
    book = source.astype(dtype)
    residual = mx.concatenate([book[:1] + 0.01 * mx.random.normal((1, width), key=keys[1]), book[5:6]], axis=0)
    residual = residual.astype(mx.float32)
    chosen_sum = mx.random.normal((2, width), key=keys[2])
    return (residual @ book.T, norms, book, residual, chosen_sum)
