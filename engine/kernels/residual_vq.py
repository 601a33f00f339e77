"""One greedy residual-VQ step as one kernel (fast numerics).

The MaskGIT rounds pick each quantizer's code as ``argmin_e ‖e‖² − 2 z·e`` and then move
the row ``e`` from the residual ``z`` into the running sum of chosen rows. In operations
that is a product ``z·Eᵀ``, a scale-and-subtract, an argmin, a gather, a subtract, an add and
a cast — 31 times a frame. Two kernels replace them, one per backend:

* :class:`NearestCodeProduct` (CUDA) forms the distance product too, reading the codebook as
  stored (bf16 in a model loaded for fast numerics: no float32 copy, half the bytes). Its
  blocks score a share of the entries each; the last block to finish (a ticket counter the
  kernel returns to zero) picks the code among the shares' bests and writes the row's
  updates. One launch a quantizer where the product apart took two. Its dot products sum in
  another order than the library's product, so a distance may differ in its last bits: a
  numerics change, admitted when it picks the operations' codes (and so the same rows) on
  the admission inputs, and measured end to end with the rest of fast mode (docs/numerics.md, "Fast
  numerics").
* :class:`NearestCode` (Metal) leaves the product to MLX and does the rest with the same
  arithmetic: ``‖e‖² − 2·(z·e)`` rounds once either way (doubling is exact), ties go to the
  lowest index as MLX's argmin does, and the row is copied, subtracted and added exactly —
  bit-identical to the operations, and admitted only if it is. The last-block pattern rests on a
  device-scope fence between one threadgroup's writes and another's reads, which no Mac here
  could test, so the product stays apart there. (On CUDA, a product-inside kernel that is not
  admitted leaves the operations.)

Both take the operations' arguments (:func:`nearest_code_ops`, the fallback the CPU runs).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .admission import TICKET_STRIDE, custom_kernel, kernel_tickets

THREADS = 256

# A warp's (best, index) pairs reduced to the least distance in every lane, ties to the lower entry (MLX's argmin).
_WARP_ARGMIN_CUDA = """
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffff, best, offset);
        const int other_index = __shfl_xor_sync(0xffffffff, index, offset);
        if (other < best || (other == best && other_index < index)) {
            best = other;
            index = other_index;
        }
    }
"""

# A block's share of the distance product against the row's ``query`` (each warp every WARPS-th entry of the
# share), reduced to the block's best in thread 0, which goes on inside its ``if``: the lines the one-quantizer and
# the round kernels share.
_SHARE_BEST_CUDA = """\
    float best = __int_as_float(0x7f800000);  // +infinity
    int index = C;
    #pragma unroll
    for (int k = 0; k < PER_WARP; ++k) {
        const int j = share * CODES_PER_BLOCK + k * WARPS + warp;  // rising: a tie keeps the lower entry
        const BT* entry = book + static_cast<size_t>(j) * L;
        float dot = 0.0f;
        #pragma unroll
        for (int i = 0; i < PER_LANE; ++i) dot += query[i] * static_cast<float>(entry[lane + 32 * i]);
        for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffff, dot, offset);
        const float distance = static_cast<float>(norms[j]) - 2.0f * dot;
        if (distance < best) {
            best = distance;
            index = j;
        }
    }
    if (lane == 0) {
        warp_best[warp] = best;
        warp_index[warp] = index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < WARPS; ++w) {
            if (warp_best[w] < best || (warp_best[w] == best && warp_index[w] < index)) {
                best = warp_best[w];
                index = warp_index[w];
            }
        }
"""

_NEAREST_CUDA = (
    """
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
"""
    + _WARP_ARGMIN_CUDA
    + """    if (tid % 32 == 0) {
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
)

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

# The distance product inside: a block scores CODES_PER_BLOCK entries, each of its warps every WARPS-th one (each
# lane PER_LANE of an entry's L values, interleaved, so that a warp's loads are contiguous). ``tickets`` is a
# workspace of zeros the kernel leaves as it found it: each block takes a ticket after publishing its best,
# and the block that takes the last one reduces the bests, writes the row's code and updates, and puts the
# ticket count back to zero for the next launch.
_NEAREST_PRODUCT_CUDA = (
    """
    constexpr int WARPS = THREADS / 32;
    constexpr int PER_LANE = L / 32;
    constexpr int PER_WARP = CODES_PER_BLOCK / WARPS;
    __shared__ float warp_best[WARPS];
    __shared__ int warp_index[WARPS];
    __shared__ int chosen_index;
    __shared__ bool last_block;
    const int row = blockIdx.y;
    const int share = blockIdx.x;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const float* z = residual + static_cast<size_t>(row) * L;
    float query[PER_LANE];
    #pragma unroll
    for (int i = 0; i < PER_LANE; ++i) query[i] = z[lane + 32 * i];
"""
    + _SHARE_BEST_CUDA
    + """        share_best[row * SHARES + share] = best;
        share_index[row * SHARES + share] = index;
        __threadfence();  // the share's best is visible to every block before its ticket is
        int* row_ticket = const_cast<int*>(tickets) + row * TICKET_STRIDE;
        last_block = atomicAdd(row_ticket, 1) == SHARES - 1;
    }
    __syncthreads();
    if (!last_block) return;
    if (warp == 0) {
        const volatile float* bests = share_best + row * SHARES;
        const volatile int* indices = share_index + row * SHARES;
        best = __int_as_float(0x7f800000);
        index = C;
        for (int s = lane; s < SHARES; s += 32) {
            if (bests[s] < best || (bests[s] == best && indices[s] < index)) {
                best = bests[s];
                index = indices[s];
            }
        }
"""
    + _WARP_ARGMIN_CUDA
    + """        if (lane == 0) {
            chosen_index = index;
            code[row] = index;
            const_cast<int*>(tickets)[row * TICKET_STRIDE] = 0;
        }
    }
    __syncthreads();
    // No entry chosen (every distance NaN): the code is C, one past the codebook, and nothing is read past it.
    const bool chosen_one = chosen_index < C;
    const size_t chosen = static_cast<size_t>(chosen_one ? chosen_index : 0) * L;
    for (int d = threadIdx.x; d < L; d += THREADS) {
        const size_t at = static_cast<size_t>(row) * L + d;
        const float entry = chosen_one ? static_cast<float>(book[chosen + d]) : 0.0f;
        residual_out[at] = residual[at] - entry;
        chosen_sum_out[at] = chosen_sum[at] + entry;
    }
"""
)

_PRODUCT_INPUTS = ["residual", "book", "norms", "chosen_sum", "tickets"]
_PRODUCT_OUTPUTS = ["code", "residual_out", "chosen_sum_out", "share_best", "share_index"]
CODES_PER_BLOCK = 32


def nearest_code_ops(
    residual: mx.array, book: mx.array, book_transposed: mx.array, norms: mx.array, chosen_sum: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """The exact arithmetic of one quantizer's greedy step: the kernels' fallback.

    ``residual`` and ``chosen_sum`` are (T, L) float32, ``book`` (C, L) and ``book_transposed`` its view
    ``book.T`` (made once: the product reads it), ``norms`` (C,) each entry's ‖e‖². A bf16 codebook is
    widened where it meets the float32 residual, exactly, so it gives what its float32 copy gives. Returns
    the codes (T, 1) int32 (a column of the frame's (T, Q) codes, joined without reshaping), the residual
    after the chosen rows are taken out, and the sum after they are added in.
    """
    scores = residual @ book_transposed
    chosen = mx.argmin(norms - 2.0 * scores, axis=-1, keepdims=True)
    row = book[chosen.reshape(-1)]
    return chosen.astype(mx.int32), residual - row, chosen_sum + row


class NearestCode:
    """The greedy residual-VQ step after MLX's distance product, on CUDA or Metal: float32 residuals; the
    codebook and its norms float32 or bf16 (widened exactly, as the operations promote them)."""

    def __init__(self, backend: str) -> None:
        self._kernel = custom_kernel(
            backend, "parley_nearest_code", _INPUTS, _OUTPUTS, cuda=_NEAREST_CUDA, metal=_NEAREST_METAL
        )

    def __call__(
        self, residual: mx.array, book: mx.array, book_transposed: mx.array, norms: mx.array, chosen_sum: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        scores = residual @ book_transposed
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


class NearestCodeProduct:
    """The greedy residual-VQ step with its distance product, on CUDA (see the module's docstring): float32
    residuals; the codebook and its norms float32 or bf16, read as stored. ``book_transposed`` is not read."""

    def __init__(self, backend: str) -> None:
        if backend != "cuda":
            raise ValueError(f"the distance product stays apart on {backend!r}")
        self._kernel = custom_kernel(
            backend,
            "parley_nearest_code_product",
            _PRODUCT_INPUTS,
            _PRODUCT_OUTPUTS,
            cuda=_NEAREST_PRODUCT_CUDA,
            metal="",
        )
        self._tickets: dict[int, mx.array] = {}  # rows → the kernel's workspace of zeros, a ticket line a row

    def __call__(
        self, residual: mx.array, book: mx.array, book_transposed: mx.array, norms: mx.array, chosen_sum: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        rows, width = residual.shape
        entries = book.shape[0]
        shares = product_shares(entries, width)
        code, residual_out, chosen_sum_out, _, _ = self._kernel(
            inputs=[residual, book, norms, chosen_sum, self._workspace(rows)],
            template=[
                ("C", entries),
                ("L", width),
                ("THREADS", THREADS),
                ("CODES_PER_BLOCK", CODES_PER_BLOCK),
                ("SHARES", shares),
                ("TICKET_STRIDE", TICKET_STRIDE),
                ("BT", book.dtype),
                ("NT", norms.dtype),
            ],
            grid=(shares * THREADS, rows, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(rows, 1), (rows, width), (rows, width), (rows, shares), (rows, shares)],
            output_dtypes=[mx.int32, mx.float32, mx.float32, mx.float32, mx.int32],
        )
        return code, residual_out, chosen_sum_out

    def _workspace(self, rows: int) -> mx.array:
        if rows not in self._tickets:
            self._tickets[rows] = kernel_tickets(rows)  # each row's counter on a line of its own
        return self._tickets[rows]


# One round of quantizers in one launch: the blocks of a row keep its residual and running sum in registers (each
# lane its PER_LANE values, in every warp alike), score their entries against it as the one-quantizer kernel does,
# publish their bests and meet at a barrier of the row's blocks; every block then picks the code from the same
# bests in the same order, so all agree, and moves the chosen row out of its copy of the residual and into the sum.
# The barrier is a counter and a generation on the row's ticket line: the last block to arrive puts the counter back
# to zero and moves the generation on, the others wait for it to move. The row's SHARES blocks are few against any
# GPU's (32 at full size), so they are all resident together; a wait is bounded all the same, so that a device that
# could not run them together returns wrong codes (which admission refuses) instead of hanging.
_ROUND_PRODUCT_CUDA = (
    """
    constexpr int WARPS = THREADS / 32;
    constexpr int PER_LANE = L / 32;
    constexpr int PER_WARP = CODES_PER_BLOCK / WARPS;
    constexpr long long SPIN_LIMIT = 1LL << 31;  // clock cycles, about a second
    __shared__ float warp_best[WARPS];
    __shared__ int warp_index[WARPS];
    __shared__ int chosen_index;
    const BT* books[COUNT] = {@BOOKS@};
    const NT* entry_norms[COUNT] = {@NORMS@};
    const int row = blockIdx.y;
    const int share = blockIdx.x;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    int* arrivals = const_cast<int*>(tickets) + row * TICKET_STRIDE;
    volatile int* generation = arrivals + 1;
    float query[PER_LANE];
    float total[PER_LANE];
    #pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        query[i] = residual[static_cast<size_t>(row) * L + lane + 32 * i];
        total[i] = chosen_sum[static_cast<size_t>(row) * L + lane + 32 * i];
    }
    for (int q = 0; q < COUNT; ++q) {
        const BT* book = books[q];
        const NT* norms = entry_norms[q];
"""
    + _SHARE_BEST_CUDA
    + """            share_best[(row * COUNT + q) * SHARES + share] = best;
            share_index[(row * COUNT + q) * SHARES + share] = index;
            const int seen = *generation;
            __threadfence();  // the share's best is visible to every block before its arrival is
            if (atomicAdd(arrivals, 1) == SHARES - 1) {
                atomicExch(arrivals, 0);
                __threadfence();
                atomicAdd(arrivals + 1, 1);
            } else {
                const long long start = clock64();
                while (*generation == seen && clock64() - start < SPIN_LIMIT) {
                }
            }
            __threadfence();
        }
        __syncthreads();
        if (warp == 0) {
            const volatile float* bests = share_best + (row * COUNT + q) * SHARES;
            const volatile int* indices = share_index + (row * COUNT + q) * SHARES;
            best = __int_as_float(0x7f800000);
            index = C;
            for (int s = lane; s < SHARES; s += 32) {
                if (bests[s] < best || (bests[s] == best && indices[s] < index)) {
                    best = bests[s];
                    index = indices[s];
                }
            }
"""
    + _WARP_ARGMIN_CUDA
    + """            if (lane == 0) {
                chosen_index = index;
                if (share == 0) code[row * COUNT + q] = index;
            }
        }
        __syncthreads();
        // No entry chosen (every distance NaN): the code is C, one past the codebook, and nothing is read past it.
        const bool chosen_one = chosen_index < C;
        const size_t chosen = static_cast<size_t>(chosen_one ? chosen_index : 0) * L;
        #pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const float entry = chosen_one ? static_cast<float>(book[chosen + lane + 32 * i]) : 0.0f;
            query[i] = query[i] - entry;
            total[i] = total[i] + entry;
        }
        __syncthreads();  // chosen_index and the warps' bests are the next quantizer's
    }
    if (share == 0 && warp == 0) {
        #pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            residual_out[static_cast<size_t>(row) * L + lane + 32 * i] = query[i];
            chosen_sum_out[static_cast<size_t>(row) * L + lane + 32 * i] = total[i];
        }
    }
"""
)


def round_product_source(count: int) -> str:
    """:data:`_ROUND_PRODUCT_CUDA` for ``count`` quantizers, whose codebooks and norms come in as inputs apart."""
    return _ROUND_PRODUCT_CUDA.replace("@BOOKS@", ", ".join(f"book_{q}" for q in range(count))).replace(
        "@NORMS@", ", ".join(f"norms_{q}" for q in range(count))
    )


def nearest_codes_ops(
    residual: mx.array,
    books: list[mx.array],
    books_transposed: list[mx.array],
    norms: list[mx.array],
    chosen_sum: mx.array,
) -> tuple[mx.array, mx.array, mx.array]:
    """:func:`nearest_code_ops` for several quantizers in order (a MaskGIT round's): their codes (T, count) joined,
    the residual after the last and the running sum. The round kernel's fallback."""
    codes = []
    for book, transposed, book_norms in zip(books, books_transposed, norms, strict=True):
        code, residual, chosen_sum = nearest_code_ops(residual, book, transposed, book_norms, chosen_sum)
        codes.append(code)
    return mx.concatenate(codes, axis=-1), residual, chosen_sum


class NearestRoundProduct:
    """:class:`NearestCodeProduct` for a round's ``count`` quantizers, one after another, in one launch (CUDA):
    the same arithmetic in the same order (the residual and the running sum kept in registers between the
    quantizers, where the launches apart stored and read them back), so the same codes and rows bit for bit."""

    def __init__(self, backend: str, count: int) -> None:
        if backend != "cuda":
            raise ValueError(f"the distance product stays apart on {backend!r}")
        if count < 2:
            raise ValueError("a round of one quantizer is NearestCodeProduct's")
        self.count = count
        books = [f"book_{q}" for q in range(count)]
        norms = [f"norms_{q}" for q in range(count)]
        self._kernel = custom_kernel(
            backend,
            "parley_nearest_round_product",
            ["residual", "chosen_sum", "tickets", *books, *norms],
            _PRODUCT_OUTPUTS,
            cuda=round_product_source(count),
            metal="",
        )
        self._tickets: dict[int, mx.array] = {}  # rows → the barrier's lines: arrivals and generation, a row each

    def __call__(
        self,
        residual: mx.array,
        books: list[mx.array],
        books_transposed: list[mx.array],
        norms: list[mx.array],
        chosen_sum: mx.array,
    ) -> tuple[mx.array, mx.array, mx.array]:
        if len(books) != self.count or len(norms) != self.count:
            raise ValueError(f"a round of {self.count} quantizers takes {self.count} codebooks, got {len(books)}")
        rows, width = residual.shape
        entries = books[0].shape[0]
        shares = product_shares(entries, width)
        if rows not in self._tickets:
            self._tickets[rows] = kernel_tickets(rows)
        code, residual_out, chosen_sum_out, _, _ = self._kernel(
            inputs=[residual, chosen_sum, self._tickets[rows], *books, *norms],
            template=[
                ("C", entries),
                ("L", width),
                ("COUNT", self.count),
                ("THREADS", THREADS),
                ("CODES_PER_BLOCK", CODES_PER_BLOCK),
                ("SHARES", shares),
                ("TICKET_STRIDE", TICKET_STRIDE),
                ("BT", books[0].dtype),
                ("NT", norms[0].dtype),
            ],
            grid=(shares * THREADS, rows, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(rows, self.count), (rows, width), (rows, width), *[(rows * self.count, shares)] * 2],
            output_dtypes=[mx.int32, mx.float32, mx.float32, mx.float32, mx.int32],
        )
        return code, residual_out, chosen_sum_out


def nearest_round_sample(
    count: int, entries: int, width: int, dtype: mx.Dtype = mx.float32, norms_dtype: mx.Dtype | None = None
) -> tuple[Any, ...]:
    """Random inputs for admitting the round kernel: :func:`nearest_code_sample`'s first codebook (a tie among the
    nearest entries) and ``count - 1`` more, the next residual near an entry of each, as the rounds' are."""
    residual, book, transposed, norms, chosen_sum = nearest_code_sample(entries, width, dtype, norms_dtype)
    books, transposed_books, all_norms = [book], [transposed], [norms]
    for quantizer in range(1, count):
        source = mx.random.normal((entries, width), key=mx.random.key(1357 + quantizer)).astype(norms_dtype or dtype)
        all_norms.append(mx.sum(source * source, axis=-1))
        books.append(source.astype(dtype))
        transposed_books.append(books[-1].T)
    mx.eval(books, transposed_books, all_norms)
    return (residual, books, transposed_books, all_norms, chosen_sum)


def product_shares(entries: int, width: int) -> int:
    """The blocks a row's step takes with the product inside (:class:`NearestCodeProduct`), each scoring
    :data:`CODES_PER_BLOCK` entries with a warp's lanes reading an entry's ``width`` values in turns of 32;
    a codebook that does not tile so is refused (the step then stays the operations)."""
    if entries % CODES_PER_BLOCK or width % 32:
        raise ValueError(f"a {entries}×{width} codebook does not tile {CODES_PER_BLOCK} entries and 32 lanes a block")
    return entries // CODES_PER_BLOCK


def nearest_code_step(backend: str) -> NearestCode | NearestCodeProduct:
    """The step kernel for ``backend``: the distance product inside on CUDA, apart on Metal."""
    return NearestCodeProduct(backend) if reads_stored_codebook(backend) else NearestCode(backend)


def reads_stored_codebook(backend: str | None) -> bool:
    """Whether fast mode's residual-VQ step on ``backend`` reads the codebook as stored (its kernel forms the
    distance product), so that a model loaded for fast numerics keeps it in bf16. Elsewhere the product is
    MLX's, which would widen a bf16 codebook at every call: there the float32 copy is kept."""
    return backend == "cuda"


def nearest_code_sample(
    entries: int, width: int, dtype: mx.Dtype = mx.float32, norms_dtype: mx.Dtype | None = None
) -> tuple[mx.array, ...]:
    """Random inputs for admitting the kernels, with a tie (two equal entries) among the nearest. The codebook
    is in ``dtype``, its norms in ``norms_dtype`` (default: the same), summed from the codebook rounded to
    that type as the TTS derives them; the residuals are float32, as in the MaskGIT rounds."""
    keys = mx.random.split(mx.random.key(2468), 3)
    source = mx.random.normal((entries, width), key=keys[0]).astype(norms_dtype or dtype)
    source = mx.concatenate([source[:1], source[:1], source[2:]], axis=0)  # entries 0 and 1 tie
    norms = mx.sum(source * source, axis=-1)
    book = source.astype(dtype)
    residual = mx.concatenate([book[:1] + 0.01 * mx.random.normal((1, width), key=keys[1]), book[5:6]], axis=0)
    residual = residual.astype(mx.float32)
    chosen_sum = mx.random.normal((2, width), key=keys[2])
    book_transposed = book.T
    mx.eval(book_transposed)
    return (residual, book, book_transposed, norms, chosen_sum)
