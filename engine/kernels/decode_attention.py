"""One query position attending over a key/value cache buffer, as one kernel (fast numerics).

The TTS backbone's heads are 72 wide, outside the sizes MLX's fused attention kernels
take, so on CUDA ``mx.fast.scaled_dot_product_attention`` falls back to a scale, a
transpose, two matrix products and a softmax — and the cache is first sliced to its
filled prefix and the result transposed back to rows. For one query position per row
that is about a dozen primitives a layer, each costing host time. :class:`DecodeAttention`
does the same in one kernel (two beyond :data:`KEYS_PER_BLOCK` filled positions, where
blocks share the keys and a second kernel merges their shares): it reads the cache buffer
as stored (no slice; a count says how many leading positions are filled) and writes the
mixed values straight as rows ``(B, heads·D)``, the layout the output projection takes.

On CUDA a second form, :meth:`DecodeAttention.attend_writing`, also stores the new position: it takes the new
key and value as inputs, reads them there at their slot, and one block per key head writes them into the cache
buffers it was given, where the traced backbone step scattered them first (two primitives a layer fewer). The
buffers are written in place behind MLX's back, which takes a kernel's inputs for unchanged: the caller keeps
them (and nothing else reads them) and hands them over contiguous, so that MLX passes them as they are.

On CUDA each form also merges its blocks' shares itself where admitted (``merged_forms``): each block stores its
share and takes a ticket of its (row, head) group's, and the last block to take one merges the group's shares with
the merging kernel's own lines, in the same order, and puts the ticket back to zero. Past 2,048 keys (a conversation
older than 2 minutes 44 seconds) that is one launch a layer where two were: 28 primitives a frame fewer in the
backbone and 4 in the LLM, and no merging kernel's fixed cost.

Layout: :data:`LANES_PER_KEY` lanes read a key together, each every fourth pair of its floats (so a
key's lanes read neighbouring bytes and a warp eight keys side by side), and a warp issues the loads
of :data:`KEYS_PER_STEP` keys and their values before it scores them; on the H200 this took 21–41 %
less GPU time than a warp a key, from 7,500 down to 200 positions (docs/numerics.md, "TTS backbone").

Buffers: float32 (the LLM's caches) or bf16 (fast mode's TTS backbone caches,
:data:`engine.numerics.BACKBONE_CACHE_DTYPE`), each value widened to float32 as it is read; the writing forms
score the new position as the buffer stores it (a bf16 buffer's value rounded to nearest even), so the result
is the fallback's over the written buffers.

Arithmetic: float32 throughout like the reference, with the softmax computed online (a running
maximum and sum per run of keys a lane group reads, merged across the warp, the block and then the
blocks) — the same quantity as the reference's ``softmax(q·Kᵀ·scale)·V``, its sums taken in another
order. Keys are read in buffer order; a sliding-window ring buffer that has wrapped is therefore
read rotated, as the reference also reads it. :func:`decode_attention_ops` is the operations fallback (the
reference's own arithmetic, which the CPU runs) and what the kernel is admitted against
(:func:`engine.kernels.admission.admit_kernel`).
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from ..ops.cache import stored
from .admission import TICKET_STRIDE, custom_kernel, kernel_constants, kernel_tickets

# Warps (simdgroups) per block: each reads its own run of the block's share of keys, then they merge.
WARPS = 8
# Keys per block at most: a longer cache is shared evenly among several blocks per head (key_shares), whose
# shares a second kernel merges.
KEYS_PER_BLOCK = 2048
# Blocks' shares the merging kernel loads at once (into shared memory).
MERGED_SHARES = 32
# Lanes that read one key together, each a slice of it (a warp reads 32 / LANES_PER_KEY keys side by side).
LANES_PER_KEY = 4
# Neighbouring keys a warp reads and scores at once (their loads all in flight together).
KEYS_PER_STEP = 32
# The kernels' bounds are two int32s, ``[count, chunk | slot << SLOT_SHIFT]``: the filled count, the keys a block
# takes (at most KEYS_PER_BLOCK) and the slot a writing launch fills. Eight bytes, so that MLX's CUDA allocator
# keeps them in its host-side pool, which a GPU reads in place; a larger array made on the host each frame would
# be unified memory that moves to the GPU and back every frame.
SLOT_SHIFT = 12
CHUNK_BITS = (1 << SLOT_SHIFT) - 1
MAX_SLOT = (1 << (31 - SLOT_SHIFT)) - 1

# Each warp's running maximum, sum and mixed values, merged into its block's (the block's mixed values
# are left in ``mixed``, their scale in ``top`` and ``total``): the same lines in the single-query
# attention kernels, with the head width named as the kernel's source names it. The warps' shares are
# stored first (lane ``d % 32`` holds value ``d`` where a warp reads one key at a time), then combined.
_WARPS_STORED_CUDA = """    if (lane == 0) {
        warp_max[warp] = running_max;
        warp_sum[warp] = running_sum;
    }
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        if (d < @W@) warp_acc[warp * @W@ + d] = acc[i];
    }
"""

_WARPS_COMBINED_CUDA = """    __syncthreads();
    if (threadIdx.x < @W@) {
        const int d = threadIdx.x;
        float top = -__int_as_float(0x7f800000);
        for (int w = 0; w < WARPS; ++w) top = fmaxf(top, warp_max[w]);
        float total = 0.0f;
        float mixed = 0.0f;
        for (int w = 0; w < WARPS; ++w) {
            if (warp_sum[w] > 0.0f) {
                const float factor = expf(warp_max[w] - top);
                total += warp_sum[w] * factor;
                mixed += warp_acc[w * @W@ + d] * factor;
            }
        }
"""

_WARPS_STORED_METAL = """    if (lane == 0) {
        warp_max[warp] = running_max;
        warp_sum[warp] = running_sum;
    }
    for (int i = 0; i < PER_LANE; ++i) {
        const uint d = lane + 32 * i;
        if (d < @W@) warp_acc[warp * @W@ + d] = acc[i];
    }
"""

_WARPS_COMBINED_METAL = """    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (local < @W@) {
        float top = -INFINITY;
        for (int w = 0; w < WARPS; ++w) top = metal::max(top, warp_max[w]);
        float total = 0.0f;
        float mixed = 0.0f;
        for (int w = 0; w < WARPS; ++w) {
            if (warp_sum[w] > 0.0f) {
                const float factor = metal::exp(warp_max[w] - top);
                total += warp_sum[w] * factor;
                mixed += warp_acc[w * @W@ + local] * factor;
            }
        }
"""


# The backbone attention's warps, each merged into its first LANES lanes (a slice of the head each, in pairs),
# stored for the block's merge: the same lines in both languages (the loop unrolled where CUDA is told to).
_SLOTS_STORED = """    if (lane == 0) {
        warp_max[warp] = running_max;
        warp_sum[warp] = running_sum;
    }
    if (lane < LANES) {
@UNROLL@        for (int j = 0; j < PAIRS; ++j) {
            warp_acc[warp * D + 2 * (j * LANES + part)] = acc[2 * j];
            warp_acc[warp * D + 2 * (j * LANES + part) + 1] = acc[2 * j + 1];
        }
    }
"""


def _warps_merged_cuda(width: str) -> str:
    return (_WARPS_STORED_CUDA + _WARPS_COMBINED_CUDA).replace("@W@", width)


def _warps_combined_cuda(width: str) -> str:
    return _WARPS_COMBINED_CUDA.replace("@W@", width)


def _warps_merged_metal(width: str) -> str:
    return (_WARPS_STORED_METAL + _WARPS_COMBINED_METAL).replace("@W@", width)


def _warps_combined_metal(width: str) -> str:
    return _WARPS_COMBINED_METAL.replace("@W@", width)


_ATTENTION_CUDA = (
    """
    constexpr int SLICE = D / LANES;  // a key's floats one lane reads (and the values' it mixes)
    constexpr int PAIRS = SLICE / 2;  // as pairs, interleaved: a key's LANES lanes read 8·LANES neighbouring bytes
    constexpr int AT_ONCE = 32 / LANES;  // keys a warp reads side by side
    constexpr int SPAN = AT_ONCE * ROUNDS;  // keys a warp takes per pass
    __shared__ float warp_max[WARPS];
    __shared__ float warp_sum[WARPS];
    __shared__ float warp_acc[WARPS * D];
    const int count = bounds[0];
    const int chunk = bounds[1] & CHUNK_BITS;
    const int splits = (count + chunk - 1) / chunk;
    const int group = blockIdx.x / splits;  // (row, query head)
    const int split = blockIdx.x % splits;
    const int head = group % HQ;
    const int row = group / HQ;
    const int kv_head = head / (HQ / HKV);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int part = lane % LANES;  // which pairs of its keys this lane reads: part, part + LANES, …
    const int slot = lane / LANES;  // which of the keys read side by side
    const int capacity = keys_shape[2];
    const int first = split * chunk;
    const int last = min(count, first + chunk);
@PROLOGUE@    const float2* query = reinterpret_cast<const float2*>(@QUERY@) + part;
    const size_t base = (static_cast<size_t>(row) * HKV + kv_head) * capacity * D + 2 * part;
@WRITTEN@    const float query_scale = scale[0];  // read once (see the encoder's kernel below)
    float q[SLICE];
    float acc[SLICE];
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
        const float2 pair = query[j * LANES];
        q[2 * j] = pair.x * query_scale;
        q[2 * j + 1] = pair.y * query_scale;
        acc[2 * j] = 0.0f;
        acc[2 * j + 1] = 0.0f;
    }
    // Each slot keeps its own running maximum and sum (the same in its LANES lanes) over the keys it reads.
    float running_max = -__int_as_float(0x7f800000);  // -infinity
    float running_sum = 0.0f;
    for (int start = first + warp * SPAN; start < last; start += WARPS * SPAN) {
        // Every load of the pass is issued before the first is used: the warp waits on memory once per pass.
        float2 key_part[ROUNDS][PAIRS];
        float2 value_part[ROUNDS][PAIRS];
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            const int position = start + r * AT_ONCE + slot;
            const bool inside = position < last;
            const size_t row_at = base + static_cast<size_t>(position) * D;
#pragma unroll
            for (int j = 0; j < PAIRS; ++j) {
                if (!inside) {
                    key_part[r][j] = make_float2(0.0f, 0.0f);
                    value_part[r][j] = make_float2(0.0f, 0.0f);
                }@FRESH@ else {
                    key_part[r][j] = parley_pair(keys + row_at + 2 * LANES * j);
                    value_part[r][j] = parley_pair(values + row_at + 2 * LANES * j);
                }
            }
        }
        float score[ROUNDS];
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            score[r] = 0.0f;
#pragma unroll
            for (int j = 0; j < PAIRS; ++j) {
                score[r] += q[2 * j] * key_part[r][j].x + q[2 * j + 1] * key_part[r][j].y;
            }
        }
#pragma unroll
        for (int offset = 1; offset < LANES; offset *= 2) {
#pragma unroll
            for (int r = 0; r < ROUNDS; ++r) score[r] += __shfl_xor_sync(0xffffffff, score[r], offset);
        }
        float new_max = running_max;
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            if (start + r * AT_ONCE + slot < last) new_max = fmaxf(new_max, score[r]);
        }
        // A slot past the last key keeps its maximum (perhaps still -infinity): nothing to rescale.
        const float rescale = new_max == running_max ? 1.0f : expf(running_max - new_max);
        running_sum *= rescale;
#pragma unroll
        for (int j = 0; j < SLICE; ++j) acc[j] *= rescale;
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            if (start + r * AT_ONCE + slot < last) {
                const float weight = expf(score[r] - new_max);
                running_sum += weight;
#pragma unroll
                for (int j = 0; j < PAIRS; ++j) {
                    acc[2 * j] += weight * value_part[r][j].x;
                    acc[2 * j + 1] += weight * value_part[r][j].y;
                }
            }
        }
        running_max = new_max;
    }
    // The warp's slots merged pairwise (lanes of the same slice meet), so that its first LANES lanes hold them all.
#pragma unroll
    for (int offset = LANES; offset < 32; offset *= 2) {
        const float other_max = __shfl_xor_sync(0xffffffff, running_max, offset);
        const float other_sum = __shfl_xor_sync(0xffffffff, running_sum, offset);
        const float top = fmaxf(running_max, other_max);
        const float mine = running_sum > 0.0f ? expf(running_max - top) : 0.0f;
        const float theirs = other_sum > 0.0f ? expf(other_max - top) : 0.0f;
        running_sum = running_sum * mine + other_sum * theirs;
#pragma unroll
        for (int j = 0; j < SLICE; ++j) acc[j] = acc[j] * mine + __shfl_xor_sync(0xffffffff, acc[j], offset) * theirs;
        running_max = top;
    }
"""
    + _SLOTS_STORED.replace("@UNROLL@", "#pragma unroll\n")
    + _warps_combined_cuda("D")
    + """        if (FINAL) {
            out[static_cast<size_t>(group) * D + d] = mixed / total;
        } else {  // this block's share: its mixed values (not yet divided), its maximum and its sum
            float* partial = @SHARES_OUT@ + static_cast<size_t>(blockIdx.x) * (D + 2);
            partial[d] = mixed;
            if (d == 0) {
                partial[D] = top;
                partial[D + 1] = total;
            }
        }
    }
@WRITE@@MERGED@"""
)

# The writing forms' load of the new position from its own inputs (float32), as the buffers store it (a bf16 buffer
# rounded): the value a block reading it back from the buffers would see.
_FRESH = """ else if (position == written) {
                    key_part[r][j] = parley_as_stored(reinterpret_cast<const float2*>(@FRESH_KEY@)[j * LANES], keys);
                    value_part[r][j] =
                        parley_as_stored(reinterpret_cast<const float2*>(new_values + fresh)[j * LANES], values);
                }"""

# The attention kernels read cache buffers of float32 or bf16 (fast mode's TTS backbone stores bf16): a pair of a
# buffer's neighbouring values as floats, a float pair as the buffer stores it, and a float stored into it (bf16
# rounded to nearest even, as MLX converts). Overloads on the buffer's type, which MLX declares by the input's dtype.
_BUFFER_CUDA = """
__device__ __forceinline__ float2 parley_pair(const float* at) { return *reinterpret_cast<const float2*>(at); }
__device__ __forceinline__ float2 parley_pair(const __nv_bfloat16* at) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
}
__device__ __forceinline__ float2 parley_as_stored(float2 pair, const float*) { return pair; }
__device__ __forceinline__ float2 parley_as_stored(float2 pair, const __nv_bfloat16*) {
    return __bfloat1622float2(__float22bfloat162_rn(pair));
}
__device__ __forceinline__ void parley_store(const float* at, float value) { *const_cast<float*>(at) = value; }
__device__ __forceinline__ void parley_store(const __nv_bfloat16* at, float value) {
    *const_cast<__nv_bfloat16*>(at) = __float2bfloat16_rn(value);
}
"""

# The attention kernel reading its buffers as stored, or (writing) reading the new position's key and value from
# their own inputs and writing them into the buffers at their slot: one block per key head (the first split of its
# first query head) writes them; no block of the launch reads that slot from the buffers, so none waits for it.
_READ_AS_STORED = {
    "@PROLOGUE@": "",
    "@QUERY@": "queries + static_cast<size_t>(group) * D",
    "@WRITTEN@": "",
    "@FRESH@": "",
    "@WRITE@": "",
}
_WRITING = {
    "@PROLOGUE@": "",
    "@QUERY@": "queries + static_cast<size_t>(group) * D",
    "@WRITTEN@": """    const int written = bounds[1] >> SLOT_SHIFT;  // the new position's slot
    const size_t fresh = (static_cast<size_t>(row) * HKV + kv_head) * D + 2 * part;
""",
    "@FRESH@": _FRESH.replace("@FRESH_KEY@", "new_keys + fresh"),
    "@WRITE@": """    if (split == 0 && head % (HQ / HKV) == 0) {
        // Into the buffers as given (MLX hands a kernel its inputs read-only; the cache keeps these buffers).
        const size_t head_start = static_cast<size_t>(row) * HKV + kv_head;
        const size_t at = (head_start * capacity + written) * D;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            parley_store(keys + at + d, new_keys[head_start * D + d]);
            parley_store(values + at + d, new_values[head_start * D + d]);
        }
    }
""",
}


# One head's Gemma RMS norm and RoPE by one warp (``source`` its D values, ``is_query`` which scale), the normed
# values staged in @NORMED@[d] and the rotated ones written to @TARGET@[d]: the heads kernel's lines, which the
# attention that makes its own heads (``_HEADS``) runs too, so that both compute the same bits.
_ONE_HEAD_CUDA = """    float head_values[PER_LANE];
    float squares = 0.0f;
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        head_values[i] = d < D ? source[d] : 0.0f;
        squares += head_values[i] * head_values[i];
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        squares += __shfl_xor_sync(0xffffffff, squares, offset);
    }
    const float normalizer = rsqrtf(squares / D + params[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        if (d < D) {
            const float gain = static_cast<float>(is_query ? q_scale[d] : k_scale[d]);
            @NORMED@[d] = gain * (head_values[i] * normalizer);
        }
    }
    __syncwarp();
    const float at = static_cast<float>(at_position[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        if (d < D) {
            const int pair = d < HALF ? d : d - HALF;
            const float inv_freq = exp2f(-(static_cast<float>(pair) / static_cast<float>(HALF)) * params[1]);
            const float theta = at * inv_freq;
            const float cosine = cosf(theta);
            const float sine = sinf(theta);
            const float x1 = @NORMED@[pair];
            const float x2 = @NORMED@[pair + HALF];
            @TARGET@[d] = d < HALF ? x1 * cosine - x2 * sine : x1 * sine + x2 * cosine;
        }
    }
"""

# The writing kernel with the query and key heads' norms and rotations inside (:meth:`DecodeAttention.attend_heads`):
# it reads the q and k projections' rows, and before anything else its warp 0 norms and rotates the block's query
# head and its warp 1 the new key of the block's key head, each as the norm-and-rotate kernel (:class:`NormRope`)
# does for one head, into shared memory, where the block reads them as it read its queries and the new key.
_HEADS = {
    **_WRITING,
    "@PROLOGUE@": """    constexpr int PER_LANE = (D + 31) / 32;
    constexpr int HALF = D / 2;
    __shared__ float head_normed[2][D];
    __shared__ __align__(16) float rotated[2][D];  // the query head, then the new key
    if (warp < 2) {
        const bool is_query = warp == 0;
        const float* source = is_query ? q_rows + (static_cast<size_t>(row) * HQ + head) * D
                                       : k_rows + (static_cast<size_t>(row) * HKV + kv_head) * D;
"""
    + _ONE_HEAD_CUDA.replace("@NORMED@", "head_normed[warp]").replace("@TARGET@", "rotated[warp]")
    + """    }
    __syncthreads();
""",
    "@QUERY@": "rotated[0]",
    "@FRESH@": _FRESH.replace("@FRESH_KEY@", "rotated[1] + 2 * part"),
    "@WRITE@": _WRITING["@WRITE@"].replace("new_keys[head_start * D + d]", "rotated[1][d]"),
}
assert _HEADS["@WRITE@"] != _WRITING["@WRITE@"]


def _attention_cuda(writing: bool, heads: bool = False, merged: bool = False) -> str:
    """The attention kernel's CUDA source: reading its buffers as stored, ``writing`` the new position too, or making
    its ``heads`` as well; ``merged``, its blocks merging their shares themselves (``_MERGED_TAIL_CUDA``)."""
    source = _ATTENTION_CUDA
    for placeholder, text in (_HEADS if heads else _WRITING if writing else _READ_AS_STORED).items():
        source = source.replace(placeholder, text)
    source = source.replace("@SHARES_OUT@", "partials" if merged else "out")
    return source.replace("@MERGED@", _MERGED_TAIL_CUDA if merged else "")


# A (row, head) group's blocks' shares merged into its mixed values (``partial`` its first share, ``group`` and
# ``splits`` as the attention kernel's): the merging kernel's body, and the attention kernel's last block's where it
# merges the shares itself.
_MERGE_BODY_CUDA = """
    constexpr int STRIDE = D + 2;
    __shared__ float shares[SHARES * STRIDE];
    const int d = threadIdx.x;
    @PARTIAL@ partial = partials + static_cast<size_t>(group) * splits * STRIDE;
    float top = -__int_as_float(0x7f800000);
    float total = 0.0f;
    float mixed = 0.0f;
    // SHARES blocks' shares at a time, loaded by the whole block at once (one share a load was a wait a share).
    for (int begin = 0; begin < splits; begin += SHARES) {
        const int taken = min(SHARES, splits - begin);
        __syncthreads();
#pragma unroll 4
        for (int i = threadIdx.x; i < taken * STRIDE; i += blockDim.x) shares[i] = partial[begin * STRIDE + i];
        __syncthreads();
        if (d < D) {
            float new_top = top;
            for (int s = 0; s < taken; ++s) new_top = fmaxf(new_top, shares[s * STRIDE + D]);
            const float rescale = expf(top - new_top);  // every share has a key: new_top is finite
            total *= rescale;
            mixed *= rescale;
            for (int s = 0; s < taken; ++s) {
                const float factor = expf(shares[s * STRIDE + D] - new_top);
                total += shares[s * STRIDE + D + 1] * factor;
                mixed += shares[s * STRIDE + d] * factor;
            }
            top = new_top;
        }
    }
    if (d < D) out[static_cast<size_t>(group) * D + d] = mixed / total;
"""

_MERGE_CUDA = """
    const int count = bounds[0];
    const int chunk = bounds[1] & CHUNK_BITS;
    const int splits = (count + chunk - 1) / chunk;
    const int group = blockIdx.x;""" + _MERGE_BODY_CUDA.replace("@PARTIAL@", "const float*")

# The attention kernel's blocks merging their own shares (``merged``): each block stores its share in ``partials``
# and takes a ticket of its group's; the block that takes the last one merges the group's shares (as the merging
# kernel would, reading them past the cache, which the other blocks wrote) and puts the ticket count back to zero for
# the next launch. One launch where two were, past KEYS_PER_BLOCK keys.
_MERGED_TAIL_CUDA = (
    """    if (!FINAL) {
        __shared__ bool last_block;
        __threadfence();  // this block's share is visible to every block before its ticket is
        __syncthreads();
        if (threadIdx.x == 0) {
            last_block = atomicAdd(const_cast<int*>(tickets) + group * TICKET_STRIDE, 1) == splits - 1;
        }
        __syncthreads();
        if (last_block) {
            __threadfence();
            {"""
    + _MERGE_BODY_CUDA.replace("@PARTIAL@", "const volatile float*")
    + """            }
            if (threadIdx.x == 0) const_cast<int*>(tickets)[group * TICKET_STRIDE] = 0;
        }
    }
"""
)

_ATTENTION_METAL = (
    """
    constexpr int SLICE = D / LANES;  // as the CUDA source
    constexpr int PAIRS = SLICE / 2;
    constexpr int AT_ONCE = 32 / LANES;
    constexpr int SPAN = AT_ONCE * ROUNDS;
    threadgroup float warp_max[WARPS];
    threadgroup float warp_sum[WARPS];
    threadgroup float warp_acc[WARPS * D];
    const int count = bounds[0];
    const int chunk = bounds[1] & CHUNK_BITS;
    const int splits = (count + chunk - 1) / chunk;
    const int block = int(threadgroup_position_in_grid.x);
    const int group = block / splits;
    const int split = block % splits;
    const int head = group % HQ;
    const int row = group / HQ;
    const int kv_head = head / (HQ / HKV);
    const uint local = thread_position_in_threadgroup.x;
    const uint warp = simdgroup_index_in_threadgroup;
    const uint lane = thread_index_in_simdgroup;
    const uint part = lane % LANES;
    const int slot = int(lane / LANES);
    const int capacity = keys_shape[2];
    const int first = split * chunk;
    const int last = metal::min(count, first + chunk);
    const uint query = uint(group) * D + 2 * part;
    const uint base = (uint(row) * HKV + uint(kv_head)) * uint(capacity) * D + 2 * part;
    float q[SLICE];
    float acc[SLICE];
    for (int j = 0; j < PAIRS; ++j) {
        q[2 * j] = queries[query + 2 * LANES * j] * scale[0];
        q[2 * j + 1] = queries[query + 2 * LANES * j + 1] * scale[0];
        acc[2 * j] = 0.0f;
        acc[2 * j + 1] = 0.0f;
    }
    float running_max = -INFINITY;
    float running_sum = 0.0f;
    for (int start = first + int(warp) * SPAN; start < last; start += WARPS * SPAN) {
        float2 key_part[ROUNDS][PAIRS];
        float2 value_part[ROUNDS][PAIRS];
        for (int r = 0; r < ROUNDS; ++r) {
            const int position = start + r * AT_ONCE + slot;
            const bool inside = position < last;
            const uint at = base + uint(position) * D;
            for (int j = 0; j < PAIRS; ++j) {
                const uint pair = at + 2 * LANES * j;
                // float() reads a bf16 buffer (fast mode's TTS backbone stores bf16) as a float32 one.
                key_part[r][j] = inside ? float2(float(keys[pair]), float(keys[pair + 1])) : float2(0.0f);
                value_part[r][j] = inside ? float2(float(values[pair]), float(values[pair + 1])) : float2(0.0f);
            }
        }
        float score[ROUNDS];
        for (int r = 0; r < ROUNDS; ++r) {
            score[r] = 0.0f;
            for (int j = 0; j < PAIRS; ++j) score[r] += q[2 * j] * key_part[r][j].x + q[2 * j + 1] * key_part[r][j].y;
        }
        for (ushort offset = 1; offset < LANES; offset *= 2) {
            for (int r = 0; r < ROUNDS; ++r) score[r] += metal::simd_shuffle_xor(score[r], offset);
        }
        float new_max = running_max;
        for (int r = 0; r < ROUNDS; ++r) {
            if (start + r * AT_ONCE + slot < last) new_max = metal::max(new_max, score[r]);
        }
        const float rescale = new_max == running_max ? 1.0f : metal::exp(running_max - new_max);
        running_sum *= rescale;
        for (int j = 0; j < SLICE; ++j) acc[j] *= rescale;
        for (int r = 0; r < ROUNDS; ++r) {
            if (start + r * AT_ONCE + slot < last) {
                const float weight = metal::exp(score[r] - new_max);
                running_sum += weight;
                for (int j = 0; j < PAIRS; ++j) {
                    acc[2 * j] += weight * value_part[r][j].x;
                    acc[2 * j + 1] += weight * value_part[r][j].y;
                }
            }
        }
        running_max = new_max;
    }
    for (ushort offset = LANES; offset < 32; offset *= 2) {
        const float other_max = metal::simd_shuffle_xor(running_max, offset);
        const float other_sum = metal::simd_shuffle_xor(running_sum, offset);
        const float top = metal::max(running_max, other_max);
        const float mine = running_sum > 0.0f ? metal::exp(running_max - top) : 0.0f;
        const float theirs = other_sum > 0.0f ? metal::exp(other_max - top) : 0.0f;
        running_sum = running_sum * mine + other_sum * theirs;
        for (int j = 0; j < SLICE; ++j) acc[j] = acc[j] * mine + metal::simd_shuffle_xor(acc[j], offset) * theirs;
        running_max = top;
    }
"""
    + _SLOTS_STORED.replace("@UNROLL@", "")
    + _warps_combined_metal("D")
    + """        if (FINAL) {
            out[uint(group) * D + local] = mixed / total;
        } else {
            const uint partial = uint(block) * (D + 2);
            out[partial + local] = mixed;
            if (local == 0) {
                out[partial + D] = top;
                out[partial + D + 1] = total;
            }
        }
    }
"""
)

_MERGE_METAL = """
    constexpr int STRIDE = D + 2;
    threadgroup float shares[SHARES * STRIDE];
    const int count = bounds[0];
    const int chunk = bounds[1] & CHUNK_BITS;
    const int splits = (count + chunk - 1) / chunk;
    const uint group = threadgroup_position_in_grid.x;
    const uint d = thread_position_in_threadgroup.x;
    const uint threads = threads_per_threadgroup.x;
    const uint start = group * uint(splits) * STRIDE;
    float top = -INFINITY;
    float total = 0.0f;
    float mixed = 0.0f;
    for (int begin = 0; begin < splits; begin += SHARES) {  // as the CUDA source
        const int taken = metal::min(SHARES, splits - begin);
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        for (uint i = d; i < uint(taken * STRIDE); i += threads) shares[i] = partials[start + uint(begin * STRIDE) + i];
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        if (d < D) {
            float new_top = top;
            for (int s = 0; s < taken; ++s) new_top = metal::max(new_top, shares[s * STRIDE + D]);
            const float rescale = metal::exp(top - new_top);
            total *= rescale;
            mixed *= rescale;
            for (int s = 0; s < taken; ++s) {
                const float factor = metal::exp(shares[s * STRIDE + D] - new_top);
                total += shares[s * STRIDE + D + 1] * factor;
                mixed += shares[s * STRIDE + d] * factor;
            }
            top = new_top;
        }
    }
    if (d < D) out[group * D + d] = mixed / total;
"""

_INPUTS = ["queries", "keys", "values", "bounds", "scale"]
_WRITING_INPUTS = ["queries", "new_keys", "new_values", "keys", "values", "bounds", "scale"]
_HEADS_INPUTS = [
    "q_rows",
    "k_rows",
    "new_values",
    "q_scale",
    "k_scale",
    "at_position",
    "params",
    "keys",
    "values",
    "bounds",
    "scale",
]

# Each form's inputs (a form merging its shares takes ``tickets`` too).
_FORM_INPUTS = {"read": _INPUTS, "writing": _WRITING_INPUTS, "heads": _HEADS_INPUTS}


def decode_attention_ops(queries: mx.array, keys: mx.array, values: mx.array, count: int, scale: float) -> mx.array:
    """The reference's arithmetic for one query position: the kernel's fallback.

    ``queries`` (B, Hq, 1, D); ``keys``/``values`` (B, Hkv, capacity, D) cache buffers of
    which the first ``count`` positions are filled, read in the queries' dtype (float32 arithmetic over bf16
    buffers). Returns the mixed values as rows (B, Hq·D).
    """
    keys, values = stored(keys[..., :count, :], queries.dtype), stored(values[..., :count, :], queries.dtype)
    mixed = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale)
    return mixed.transpose(0, 2, 1, 3).reshape(queries.shape[0], -1)


def decode_attention_writing_ops(
    queries: mx.array,
    new_keys: mx.array,
    new_values: mx.array,
    key_buffer: mx.array,
    value_buffer: mx.array,
    count: int,
    slot: int,
    scale: float,
) -> tuple[mx.array, mx.array, mx.array]:
    """:func:`decode_attention_ops` after the new position's ``new_keys``/``new_values`` (B, Hkv, 1, D) are written
    at ``slot`` of the buffers (a scatter, as the traced backbone step writes them); returns the mixed rows and
    the written buffers — what :meth:`DecodeAttention.attend_writing` computes and leaves in its buffers."""
    index = mx.full(new_keys.shape, slot, dtype=mx.int32)
    key_buffer = mx.put_along_axis(key_buffer, index, stored(new_keys, key_buffer.dtype), axis=2)
    value_buffer = mx.put_along_axis(value_buffer, index, stored(new_values, value_buffer.dtype), axis=2)
    return decode_attention_ops(queries, key_buffer, value_buffer, count, scale), key_buffer, value_buffer


def decode_attention_heads_ops(
    q_rows: mx.array,
    k_rows: mx.array,
    new_values: mx.array,
    q_scale: mx.array,
    k_scale: mx.array,
    position: mx.array,
    key_buffer: mx.array,
    value_buffer: mx.array,
    count: int,
    slot: int,
    scale: float,
    *,
    query_heads: int,
    kv_heads: int,
    eps: float,
    base: float,
) -> tuple[mx.array, mx.array, mx.array]:
    """:func:`norm_rope_ops` then :func:`decode_attention_writing_ops`: what :meth:`DecodeAttention.attend_heads`
    computes from the projections' rows, and the buffers it leaves written."""
    queries, keys = norm_rope_ops(
        q_rows, k_rows, q_scale, k_scale, position, query_heads=query_heads, kv_heads=kv_heads, eps=eps, base=base
    )
    return decode_attention_writing_ops(queries, keys, new_values, key_buffer, value_buffer, count, slot, scale)


def decode_attention_heads_samples(
    query_heads: int, kv_heads: int, head_dim: int, scale_dtype: mx.Dtype, buffer_dtype: mx.Dtype = mx.float32
) -> list[tuple[Any, ...]]:
    """Random inputs for admitting :meth:`DecodeAttention.attend_heads` (:func:`decode_attention_heads_ops`'
    arguments): the writing kernel's cases (:func:`decode_attention_writing_samples`) with projection rows for
    the heads, at an early and a late position."""
    samples = []
    for index, case in enumerate(decode_attention_writing_samples(query_heads, kv_heads, head_dim, buffer_dtype)):
        _, _, new_values, key_buffer, value_buffer, count, slot, scale = case
        q_rows, k_rows, q_scale, k_scale, position = norm_rope_samples(query_heads, kv_heads, head_dim, scale_dtype)[
            index % 2
        ]
        samples.append(
            (q_rows, k_rows, new_values, q_scale, k_scale, position, key_buffer, value_buffer, count, slot, scale)
        )
    return samples


def bounds_words(count: int, chunk: int, slot: int) -> list[int]:
    """The kernels' two bounds words: ``[count, chunk | slot << SLOT_SHIFT]`` (see :data:`SLOT_SHIFT`)."""
    if not 0 < chunk <= CHUNK_BITS:
        raise ValueError(f"{chunk} keys a block do not fit the bounds' {SLOT_SHIFT} bits")
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(f"slot {slot} is past the bounds' {MAX_SLOT}")
    return [count, chunk | slot << SLOT_SHIFT]


def key_shares(count: int, keys_per_block: int) -> tuple[int, int]:
    """How :class:`DecodeAttention` shares ``count`` keys among blocks: ``(blocks, keys a block)``. A block per
    ``keys_per_block`` keys or part of them (so the launch changes shape only where the count passes a multiple
    of it), the keys shared evenly among them, the last block taking what is left. The kernels count their
    blocks from the second number, as ``ceil(count / keys a block)``, which is the first."""
    blocks = -(-count // keys_per_block)
    return blocks, -(-count // blocks)


class DecodeAttention:
    """The single-position attention kernel for one head layout, on CUDA or Metal: float32 queries over cache
    buffers of float32 or bf16 (MLX builds a kernel per dtype; each is admitted on buffers of its own).

    Up to :data:`KEYS_PER_BLOCK` filled positions, one block per head computes the result (one
    kernel); beyond, each block takes a share of the keys and a second kernel merges the shares — or, on CUDA
    for the forms in :attr:`merged_forms` (each admitted on this device), the head's last block to finish
    merges them in the same launch.
    """

    def __init__(
        self,
        backend: str,
        query_heads: int,
        kv_heads: int,
        head_dim: int,
        keys_per_step: int = KEYS_PER_STEP,
        keys_per_block: int = KEYS_PER_BLOCK,
        lanes_per_key: int = LANES_PER_KEY,
    ) -> None:
        if query_heads % kv_heads:
            raise ValueError(f"no decode attention for {query_heads} query heads over {kv_heads} key heads")
        if head_dim > 32 * WARPS:
            raise ValueError(f"head size {head_dim} exceeds the kernel's {32 * WARPS} threads per head")
        if 32 % lanes_per_key or head_dim % (2 * lanes_per_key):
            raise ValueError(f"{lanes_per_key} lanes a key do not split a warp and heads of {head_dim} into pairs")
        if keys_per_step % (32 // lanes_per_key):
            raise ValueError(f"{keys_per_step} keys a step are not whole rows of {32 // lanes_per_key} keys")
        self.query_heads, self.kv_heads, self.head_dim = query_heads, kv_heads, head_dim
        self.keys_per_step, self.keys_per_block, self.lanes_per_key = keys_per_step, keys_per_block, lanes_per_key
        # The filled length and the scale go in as arrays (a template value would compile a kernel per
        # length); the arrays of the last few lengths are kept, since every layer of a kind shares one.
        self._bounds: dict[tuple[int, int], mx.array] = {}
        self._scales: dict[float, mx.array] = {}
        if keys_per_block > CHUNK_BITS:
            raise ValueError(f"{keys_per_block} keys a block do not fit the bounds' {SLOT_SHIFT} bits")
        # The kernel's forms (reading its buffers as stored; on CUDA also writing the new position, and making the
        # heads too), each also as the form whose blocks merge their own shares (CUDA), by (form, merged).
        self._forms: dict[tuple[str, bool], Any] = {}
        for form, inputs in _FORM_INPUTS.items():
            if form != "read" and backend != "cuda":
                continue
            name = "parley_decode_attention" + ("" if form == "read" else f"_{form}")
            for merged in (False, True) if backend == "cuda" else (False,):
                self._forms[(form, merged)] = custom_kernel(
                    backend,
                    name + ("_merged" if merged else ""),
                    [*inputs, "tickets"] if merged else inputs,
                    ["out", "partials"] if merged else ["out"],
                    cuda=_attention_cuda(form != "read", heads=form == "heads", merged=merged),
                    metal=_ATTENTION_METAL if form == "read" and not merged else "",
                    cuda_header=_BUFFER_CUDA,
                )
        # The forms whose blocks merge their shares themselves past KEYS_PER_BLOCK keys (set once admitted on this
        # device), and their tickets (a line per (row, head) group, by the launch's groups).
        self.merged_forms: frozenset[str] = frozenset()
        self._tickets: dict[int, mx.array] = {}
        # Whether the traced backbone step lets the kernel write the new position (set once admitted on this device).
        self.writes_cache = False
        self._merge = custom_kernel(
            backend,
            "parley_decode_attention_merge",
            ["partials", "bounds"],
            ["out"],
            cuda=_MERGE_CUDA,
            metal=_MERGE_METAL,
        )

    def __call__(self, queries: mx.array, keys: mx.array, values: mx.array, count: int, scale: float) -> mx.array:
        """:func:`decode_attention_ops`'s result, computed by the kernel."""
        return self.attend_bounded(queries, keys, values, self.bounds(count), self.splits(count), scale)

    def splits(self, count: int) -> int:
        """Blocks per head for ``count`` filled positions: the launch's shape (a traced call's depends on it)."""
        return key_shares(count, self.keys_per_block)[0]

    def chunk(self, count: int) -> int:
        """Keys each block takes (:func:`key_shares`)."""
        return key_shares(count, self.keys_per_block)[1]

    def bounds(self, count: int, slot: int = 0) -> mx.array:
        """The kernels' view of ``count`` (and of the ``slot`` a writing launch fills), an array: as an input of a
        traced call it varies without a retrace."""
        key = (count, slot)
        if key not in self._bounds:
            if len(self._bounds) >= 4:
                self._bounds.clear()
            self._bounds[key] = mx.array(bounds_words(count, self.chunk(count), slot), dtype=mx.int32)
        return self._bounds[key]

    def attend_bounded(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        bounds: mx.array,
        splits: int,
        scale: float,
        merge: bool | None = None,
    ) -> mx.array:
        """:meth:`__call__` with the count as :meth:`bounds` made it and :meth:`splits` of that count (``merge``: see
        :meth:`_launch`)."""
        return self._launch("read", [queries, keys, values], bounds, splits, scale, merge=merge)

    def attend_writing(
        self,
        queries: mx.array,
        new_keys: mx.array,
        new_values: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        bounds: mx.array,
        splits: int,
        scale: float,
        position_axis: bool = False,
        merge: bool | None = None,
    ) -> mx.array:
        """:meth:`attend_bounded` over buffers whose slot (:meth:`bounds`' ``slot``) the launch fills itself with
        ``new_keys``/``new_values`` (B, Hkv, 1, D) — in the given buffers, which MLX takes for unchanged: the
        caller's cache must keep them, contiguous (a copy MLX made of a strided view would take the write), and
        no other reader may expect them unwritten. One launch where a scatter per buffer and the attention took
        three (CUDA only). The kernel reads the queries, keys and values by their memory alone, so one position's
        rows (B, 1, heads·D) may stand for its heads; ``position_axis`` returns the mixed rows as (B, 1, Hq·D)."""
        self._require("writing")
        inputs = [queries, new_keys, new_values, key_buffer, value_buffer]
        return self._launch("writing", inputs, bounds, splits, scale, position_axis, merge)

    def attend_heads(
        self,
        q_rows: mx.array,
        k_rows: mx.array,
        new_values: mx.array,
        q_scale: mx.array,
        k_scale: mx.array,
        position: mx.array,
        rope: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        bounds: mx.array,
        splits: int,
        scale: float,
        merge: bool | None = None,
    ) -> mx.array:
        """:meth:`attend_writing` from the q and k projections' rows (B, H·D): the launch norms and rotates the query
        and key heads itself, as :class:`NormRope` would at ``position`` with its ``rope`` parameters (eps, log2 of
        the base), and writes the new key so made. One launch where the heads and the attention took two (CUDA)."""
        self._require("heads")
        inputs = [q_rows, k_rows, new_values, q_scale, k_scale, position, rope, key_buffer, value_buffer]
        return self._launch("heads", inputs, bounds, splits, scale, merge=merge)

    def heads_kernel(self, rope: mx.array) -> Any:
        """:meth:`heads_check` with the ``rope`` parameters, where this backend has the kernel (else ValueError)."""
        self._require("heads")
        return functools.partial(self.heads_check, rope=rope)

    def merged_kernel(self, form: str, rope: mx.array | None = None) -> Any:
        """The check of ``form`` (``"read"``, ``"writing"`` or ``"heads"``, with its ``rope`` parameters) whose blocks
        merge their own shares, for admitting it against that form's fallback; ValueError where this backend has
        no such kernel (CUDA only)."""
        self._require(form, merged=True)
        if form == "read":
            return lambda queries, keys, values, count, scale: self.attend_bounded(
                queries, keys, values, self.bounds(count), self.splits(count), scale, merge=True
            )
        if form == "writing":
            return functools.partial(self.writing_check, merge=True)
        return functools.partial(self.heads_check, rope=rope, merge=True)

    def _require(self, form: str, merged: bool = False) -> None:
        if (form, merged) not in self._forms:
            raise ValueError(f"the attention kernel's {form} form{' merging its shares' if merged else ''} is CUDA's")

    def heads_check(
        self,
        q_rows: mx.array,
        k_rows: mx.array,
        new_values: mx.array,
        q_scale: mx.array,
        k_scale: mx.array,
        position: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        count: int,
        slot: int,
        scale: float,
        *,
        rope: mx.array,
        merge: bool | None = None,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:meth:`attend_heads` on copies of the buffers, returned written: :func:`decode_attention_heads_ops`'s
        signature and results, for admitting the kernel against it."""
        key_buffer, value_buffer = key_buffer * 1.0, value_buffer * 1.0  # fresh buffers (× 1 keeps every bit)
        mixed = self.attend_heads(
            q_rows,
            k_rows,
            new_values,
            q_scale,
            k_scale,
            position,
            rope,
            key_buffer,
            value_buffer,
            self.bounds(count, slot),
            self.splits(count),
            scale,
            merge,
        )
        mx.eval(mixed)  # the buffers hold the write once the launch has run
        return mixed, key_buffer, value_buffer

    def writing_kernel(self) -> Any:
        """:meth:`writing_check`, where this backend has the writing kernel (else ValueError)."""
        self._require("writing")
        return self.writing_check

    def writing_check(
        self,
        queries: mx.array,
        new_keys: mx.array,
        new_values: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        count: int,
        slot: int,
        scale: float,
        merge: bool | None = None,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:meth:`attend_writing` on copies of the buffers, returned written: :func:`decode_attention_writing_ops`'s
        signature and results, for admitting the kernel against it."""
        key_buffer, value_buffer = key_buffer * 1.0, value_buffer * 1.0  # fresh buffers (× 1 keeps every bit)
        bounds, splits = self.bounds(count, slot), self.splits(count)
        mixed = self.attend_writing(
            queries, new_keys, new_values, key_buffer, value_buffer, bounds, splits, scale, merge=merge
        )
        mx.eval(mixed)  # the buffers hold the write once the launch has run
        return mixed, key_buffer, value_buffer

    def _launch(
        self,
        form: str,
        inputs: list[mx.array],
        bounds: mx.array,
        splits: int,
        scale: float,
        position_axis: bool = False,
        merge: bool | None = None,
    ) -> mx.array:
        """Launch ``form`` over ``inputs``: one block per (row, head) group, or past one block's keys ``splits`` a
        group, whose shares its last block merges (``merge``; by default where :attr:`merged_forms` has the form) or
        a second kernel does."""
        if scale not in self._scales:
            self._scales[scale] = kernel_constants(scale)
        batch, width = inputs[0].shape[0], self.query_heads * self.head_dim
        rows = (batch, 1, width) if position_axis else (batch, width)
        groups = batch * self.query_heads
        final = splits == 1
        merged = not final and (form in self.merged_forms if merge is None else merge)
        threads = 32 * WARPS
        template: list[tuple[str, Any]] = [
            ("HQ", self.query_heads),
            ("HKV", self.kv_heads),
            ("D", self.head_dim),
            ("WARPS", WARPS),
            ("LANES", self.lanes_per_key),
            ("ROUNDS", self.keys_per_step * self.lanes_per_key // 32),
            ("FINAL", final),
            ("CHUNK_BITS", CHUNK_BITS),
            ("SLOT_SHIFT", SLOT_SHIFT),
        ]
        shares = (groups * splits, self.head_dim + 2)
        if merged:
            if groups not in self._tickets:
                self._tickets[groups] = kernel_tickets(groups)  # each group's counter on a line of its own
            out, _ = self._forms[(form, True)](
                inputs=[*inputs, bounds, self._scales[scale], self._tickets[groups]],
                template=[*template, ("SHARES", MERGED_SHARES), ("TICKET_STRIDE", TICKET_STRIDE)],
                grid=(groups * splits * threads, 1, 1),
                threadgroup=(threads, 1, 1),
                output_shapes=[rows, shares],
                output_dtypes=[mx.float32, mx.float32],
            )
            return out
        (out,) = self._forms[(form, False)](
            inputs=[*inputs, bounds, self._scales[scale]],
            template=template,
            grid=(groups * splits * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[rows if final else shares],
            output_dtypes=[mx.float32],
        )
        if final:
            return out
        merge_threads = 32 * WARPS
        (merged_rows,) = self._merge(
            inputs=[out, bounds],
            template=[("D", self.head_dim), ("SHARES", MERGED_SHARES), ("CHUNK_BITS", CHUNK_BITS)],
            grid=(groups * merge_threads, 1, 1),
            threadgroup=(merge_threads, 1, 1),
            output_shapes=[rows],
            output_dtypes=[mx.float32],
        )
        return merged_rows


def decode_attention_samples(
    query_heads: int, kv_heads: int, head_dim: int, buffer_dtype: mx.Dtype = mx.float32
) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the kernel, two rows over partly filled buffers of ``buffer_dtype``: one
    block's worth of keys, and enough for several blocks and the merge."""
    return [
        decode_attention_sample(query_heads, kv_heads, head_dim, capacity=256, count=237, buffer_dtype=buffer_dtype),
        decode_attention_sample(
            query_heads,
            kv_heads,
            head_dim,
            capacity=3 * KEYS_PER_BLOCK,
            count=2 * KEYS_PER_BLOCK + 5,
            buffer_dtype=buffer_dtype,
        ),
    ]


def decode_attention_writing_samples(
    query_heads: int, kv_heads: int, head_dim: int, buffer_dtype: mx.Dtype = mx.float32
) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the writing kernel (:func:`decode_attention_writing_ops`' arguments): the new
    position at the end of the filled part, inside a wrapped ring buffer, and past a block's share of keys; the
    buffers of ``buffer_dtype``, the new position float32 (a bf16 buffer stores it rounded)."""
    cases = ((256, 237, 236), (512, 512, 100), (3 * KEYS_PER_BLOCK, 2 * KEYS_PER_BLOCK + 5, 2 * KEYS_PER_BLOCK + 4))
    samples = []
    for capacity, count, slot in cases:
        queries, key_buffer, value_buffer, _, scale = decode_attention_sample(
            query_heads, kv_heads, head_dim, capacity, count, buffer_dtype
        )
        fresh = mx.random.split(mx.random.key(slot), 2)
        new_keys = mx.random.normal((2, kv_heads, 1, head_dim), key=fresh[0])
        new_values = mx.random.normal((2, kv_heads, 1, head_dim), key=fresh[1])
        samples.append((queries, new_keys, new_values, key_buffer, value_buffer, count, slot, scale))
    return samples


def decode_attention_sample(
    query_heads: int, kv_heads: int, head_dim: int, capacity: int, count: int, buffer_dtype: mx.Dtype = mx.float32
) -> tuple[mx.array, mx.array, mx.array, int, float]:
    """Random inputs: two rows, a buffer of ``capacity`` positions of which ``count`` are filled."""
    keys = mx.random.split(mx.random.key(4321), 3)
    return (
        mx.random.normal((2, query_heads, 1, head_dim), key=keys[0]),
        mx.random.normal((2, kv_heads, capacity, head_dim), key=keys[1]).astype(buffer_dtype),
        mx.random.normal((2, kv_heads, capacity, head_dim), key=keys[2]).astype(buffer_dtype),
        count,
        head_dim**-0.5,
    )


# --------------------------------------------------------------------------- the encoder's relative-position attention

# One query row over a key window, relative positions: ``@COUNT@`` keys, key/value j read by ``@KEY@`` /
# ``@VALUE@`` and passed on by ``@KEEP_KEY@`` / ``@KEEP_VALUE@`` (the window form writes the window out).
_RELATIVE_CUDA_TEMPLATE = (
    """
    constexpr int PER_LANE = (HD + 31) / 32;
    constexpr int WIDTH = H * HD;
    __shared__ float warp_max[WARPS];
    __shared__ float warp_sum[WARPS];
    __shared__ float warp_acc[WARPS * HD];
    const int head = blockIdx.x;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int count = @COUNT@;
    float content_query[PER_LANE];
    float position_query[PER_LANE];
    float acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + 32 * i;
        const int column = head * HD + d;
        content_query[i] = d < HD ? query[column] + static_cast<float>(bias_u[column]) : 0.0f;
        position_query[i] = d < HD ? query[column] + static_cast<float>(bias_v[column]) : 0.0f;
        acc[i] = 0.0f;
    }
    // Read once: a one-float array lives where MLX's CUDA allocator puts arrays of 8 bytes or less, in unified
    // memory on the host, and the loop's stores (the window form's) would have it read again every key.
    const float score_scale = scale[0];
    float running_max = -__int_as_float(0x7f800000);  // -infinity
    float running_sum = 0.0f;
    for (int j = warp; j < count; j += WARPS) {
        float score = 0.0f;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = lane + 32 * i;
            const size_t at = static_cast<size_t>(j) * WIDTH + head * HD + d;
            if (d < HD) {
                const float key = @KEY@;
                score += content_query[i] * key + position_query[i] * positions[at];
                @KEEP_KEY@
            }
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            score += __shfl_xor_sync(0xffffffff, score, offset);
        }
        score *= score_scale;
        const float new_max = fmaxf(running_max, score);
        const float rescale = expf(running_max - new_max);
        const float weight = expf(score - new_max);
        running_sum = running_sum * rescale + weight;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = lane + 32 * i;
            const size_t at = static_cast<size_t>(j) * WIDTH + head * HD + d;
            if (d < HD) {
                const float value = @VALUE@;
                acc[i] = acc[i] * rescale + weight * value;
                @KEEP_VALUE@
            }
        }
        running_max = new_max;
    }
"""
    + _warps_merged_cuda("HD")
    + """        out[head * HD + d] = mixed / total;
    }
"""
)

_RELATIVE_METAL_TEMPLATE = (
    """
    constexpr int PER_LANE = (HD + 31) / 32;
    constexpr int WIDTH = H * HD;
    threadgroup float warp_max[WARPS];
    threadgroup float warp_sum[WARPS];
    threadgroup float warp_acc[WARPS * HD];
    const int head = int(threadgroup_position_in_grid.x);
    const uint local = thread_position_in_threadgroup.x;
    const uint warp = simdgroup_index_in_threadgroup;
    const uint lane = thread_index_in_simdgroup;
    const int count = @COUNT@;
    float content_query[PER_LANE];
    float position_query[PER_LANE];
    float acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = int(lane) + 32 * i;
        const int column = head * HD + d;
        content_query[i] = d < HD ? query[column] + static_cast<float>(bias_u[column]) : 0.0f;
        position_query[i] = d < HD ? query[column] + static_cast<float>(bias_v[column]) : 0.0f;
        acc[i] = 0.0f;
    }
    const float score_scale = scale[0];
    float running_max = -INFINITY;
    float running_sum = 0.0f;
    for (int j = int(warp); j < count; j += WARPS) {
        float score = 0.0f;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = int(lane) + 32 * i;
            const uint at = uint(j) * WIDTH + uint(head * HD + d);
            if (d < HD) {
                const float key = @KEY@;
                score += content_query[i] * key + position_query[i] * positions[at];
                @KEEP_KEY@
            }
        }
        score = metal::simd_sum(score) * score_scale;
        const float new_max = metal::max(running_max, score);
        const float rescale = metal::exp(running_max - new_max);
        const float weight = metal::exp(score - new_max);
        running_sum = running_sum * rescale + weight;
        for (int i = 0; i < PER_LANE; ++i) {
            const int d = int(lane) + 32 * i;
            const uint at = uint(j) * WIDTH + uint(head * HD + d);
            if (d < HD) {
                const float value = @VALUE@;
                acc[i] = acc[i] * rescale + weight * value;
                @KEEP_VALUE@
            }
        }
        running_max = new_max;
    }
"""
    + _warps_merged_metal("HD")
    + """        out[uint(head * HD) + local] = mixed / total;
    }
"""
)


def _relative_source(template: str, window: bool) -> str:
    """The relative attention kernel over given keys and values, or (``window``) over a window made of the
    cached ``key_history``/``value_history`` rows from row ``DROP`` on and the newest ``new_key``/``new_value``
    row, which it also writes out as ``next_keys``/``next_values`` (the next frame's cache)."""
    if not window:
        parts = {"@COUNT@": "keys_shape[0]", "@KEY@": "keys[at]", "@VALUE@": "values[at]"}
        parts.update({"@KEEP_KEY@": "", "@KEEP_VALUE@": ""})
    else:
        newest = "j == count - 1 ? new_{0}[at - static_cast<size_t>(j) * WIDTH] : {0}_history[at + DROP * WIDTH]"
        parts = {
            "@COUNT@": "key_history_shape[0] - DROP + 1",
            "@KEY@": newest.format("key"),
            "@VALUE@": newest.format("value"),
            "@KEEP_KEY@": "next_keys[at] = key;",
            "@KEEP_VALUE@": "next_values[at] = value;",
        }
    for placeholder, text in parts.items():
        template = template.replace(placeholder, text)
    return template


_RELATIVE_CUDA = _relative_source(_RELATIVE_CUDA_TEMPLATE, window=False)
_RELATIVE_METAL = _relative_source(_RELATIVE_METAL_TEMPLATE, window=False)
_RELATIVE_WINDOW_CUDA = _relative_source(_RELATIVE_CUDA_TEMPLATE, window=True)
_RELATIVE_WINDOW_METAL = _relative_source(_RELATIVE_METAL_TEMPLATE, window=True)

_RELATIVE_INPUTS = ["query", "keys", "values", "positions", "bias_u", "bias_v", "scale"]
_RELATIVE_WINDOW_INPUTS = [
    "query",
    "key_history",
    "new_key",
    "value_history",
    "new_value",
    "positions",
    "bias_u",
    "bias_v",
    "scale",
]
# Warps per head for the encoder's short key window (at most 71 keys): on the H200 a window took 19.5 µs a call
# at 16 against 36.5 at 4, and 32 gained under a microsecond more with twice the threads (docs/numerics.md, "Encoder").
RELATIVE_WARPS = 16


class RelativeDecodeAttention:
    """One query row of the encoder's relative-position attention as one kernel, on CUDA or Metal (float32
    rows; the biases float32 or bf16). Each head's block scores every key with ``(q+u)·k + (q+v)·p`` (the
    content and position terms summed together, then scaled), softmaxes online and mixes the values.

    Inputs as :func:`engine.networks.encoder.attend_relative`, its fallback: one query row (1, H·hd), key and value
    rows (T, H·hd), the projected relative-position rows (2T−1, H·hd) of which row j belongs to key j for
    the newest query (the relative shift leaves a single query's scores in place), the biases (H, hd)."""

    def __init__(self, backend: str, heads: int, head_dim: int, warps: int = RELATIVE_WARPS) -> None:
        if head_dim > 32 * warps:
            raise ValueError(f"head size {head_dim} exceeds the kernel's {32 * warps} threads per head")
        self.heads, self.head_dim, self.warps = heads, head_dim, warps
        self._scales: dict[float, mx.array] = {}
        self._kernel = custom_kernel(
            backend,
            "parley_relative_attention",
            _RELATIVE_INPUTS,
            ["out"],
            cuda=_RELATIVE_CUDA,
            metal=_RELATIVE_METAL,
        )
        self._window_kernel = custom_kernel(
            backend,
            "parley_relative_attention_window",
            _RELATIVE_WINDOW_INPUTS,
            ["out", "next_keys", "next_values"],
            cuda=_RELATIVE_WINDOW_CUDA,
            metal=_RELATIVE_WINDOW_METAL,
        )

    def __call__(
        self,
        query: mx.array,
        keys: mx.array,
        values: mx.array,
        positions: mx.array,
        bias_u: mx.array,
        bias_v: mx.array,
        scale: float,
    ) -> mx.array:
        threads = 32 * self.warps
        (out,) = self._kernel(
            inputs=[query, keys, values, positions, bias_u, bias_v, self._scale(scale)],
            template=[("H", self.heads), ("HD", self.head_dim), ("WARPS", self.warps), ("BT", bias_u.dtype)],
            grid=(self.heads * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[(1, self.heads * self.head_dim)],
            output_dtypes=[mx.float32],
        )
        return out

    def window(
        self,
        query: mx.array,
        key_history: mx.array,
        new_key: mx.array,
        value_history: mx.array,
        new_value: mx.array,
        positions: mx.array,
        bias_u: mx.array,
        bias_v: mx.array,
        scale: float,
        drop: int,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:func:`engine.networks.encoder.attend_relative_window`'s result: the attention over the cached rows from
        ``drop`` on and the newest row, and that window of keys and values (written as they are read)."""
        threads = 32 * self.warps
        count = key_history.shape[0] - drop + 1
        width = self.heads * self.head_dim
        inputs = [query, key_history, new_key, value_history, new_value, positions, bias_u, bias_v]
        out, next_keys, next_values = self._window_kernel(
            inputs=[*inputs, self._scale(scale)],
            template=[
                ("H", self.heads),
                ("HD", self.head_dim),
                ("WARPS", self.warps),
                ("BT", bias_u.dtype),
                ("DROP", drop),
            ],
            grid=(self.heads * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[(1, width), (count, width), (count, width)],
            output_dtypes=[mx.float32] * 3,
        )
        return out, next_keys, next_values

    def _scale(self, scale: float) -> mx.array:
        if scale not in self._scales:
            self._scales[scale] = kernel_constants(scale)
        return self._scales[scale]


def relative_window_samples(heads: int, head_dim: int, bias_dtype: mx.Dtype = mx.float32) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the window kernel: a full window (71 cached rows, the oldest dropped) and a
    filling one (8 cached rows, none dropped), each with the newest row apart."""
    samples: list[tuple[Any, ...]] = []
    for query, keys, values, positions, bias_u, bias_v, scale in relative_attention_samples(
        heads, head_dim, bias_dtype
    ):
        drop = 1 if keys.shape[0] == 71 else 0
        extra = mx.random.normal((drop, keys.shape[1]), key=mx.random.key(7))
        key_history = mx.concatenate([extra, keys[:-1]]) if drop else keys[:-1]
        value_history = mx.concatenate([-extra, values[:-1]]) if drop else values[:-1]
        samples.append(
            (query, key_history, keys[-1:], value_history, values[-1:], positions, bias_u, bias_v, scale, drop)
        )
    return samples


def relative_attention_samples(heads: int, head_dim: int, bias_dtype: mx.Dtype = mx.float32) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the kernel: a full window of 71 keys and a filling one of 9 (the biases in
    ``bias_dtype``, as the model stores them)."""
    width = heads * head_dim
    samples: list[tuple[Any, ...]] = []
    for count in (71, 9):
        keys = mx.random.split(mx.random.key(97 + count), 6)
        samples.append(
            (
                mx.random.normal((1, width), key=keys[0]),
                mx.random.normal((count, width), key=keys[1]),
                mx.random.normal((count, width), key=keys[2]),
                mx.random.normal((2 * count - 1, width), key=keys[3]),
                (0.1 * mx.random.normal((heads, head_dim), key=keys[4])).astype(bias_dtype),
                (0.1 * mx.random.normal((heads, head_dim), key=keys[5])).astype(bias_dtype),
                head_dim**-0.5,
            )
        )
    return samples


# --------------------------------------------------------------------------- the TTS backbone's query and key heads

_NORM_ROPE_CUDA = """
    constexpr int PER_LANE = (D + 31) / 32;
    constexpr int HALF = D / 2;
    __shared__ float normed[NORM_WARPS][D];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int head_row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;  // one warp per (row, head)
    if (head_row >= q_rows_shape[0] * (HQ + HKV)) return;
    const int row = head_row / (HQ + HKV);
    const int head = head_row % (HQ + HKV);
    const bool is_query = head < HQ;
    const float* source = is_query ? q_rows + (static_cast<size_t>(row) * HQ + head) * D
                                   : k_rows + (static_cast<size_t>(row) * HKV + head - HQ) * D;
    float* target = is_query ? queries + (static_cast<size_t>(row) * HQ + head) * D
                             : keys + (static_cast<size_t>(row) * HKV + head - HQ) * D;
""" + _ONE_HEAD_CUDA.replace("@NORMED@", "normed[warp]").replace("@TARGET@", "target")

_NORM_ROPE_METAL = """
    constexpr int PER_LANE = (D + 31) / 32;
    constexpr int HALF = D / 2;
    threadgroup float normed[NORM_WARPS][D];
    const uint warp = simdgroup_index_in_threadgroup;
    const uint lane = thread_index_in_simdgroup;
    const int head_row = int(thread_position_in_grid.x / 32);  // one simdgroup per (row, head)
    if (head_row >= q_rows_shape[0] * (HQ + HKV)) return;
    const int row = head_row / (HQ + HKV);
    const int head = head_row % (HQ + HKV);
    const bool is_query = head < HQ;
    const uint source = is_query ? uint(row * HQ + head) * D : uint(row * HKV + head - HQ) * D;
    float values[PER_LANE];
    float squares = 0.0f;
    for (int i = 0; i < PER_LANE; ++i) {
        const uint d = lane + 32 * i;
        values[i] = d < D ? (is_query ? q_rows[source + d] : k_rows[source + d]) : 0.0f;
        squares += values[i] * values[i];
    }
    squares = metal::simd_sum(squares);
    const float normalizer = metal::rsqrt(squares / D + params[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const uint d = lane + 32 * i;
        if (d < D) {
            const float scale = static_cast<float>(is_query ? q_scale[d] : k_scale[d]);
            normed[warp][d] = scale * (values[i] * normalizer);
        }
    }
    metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup);
    const float position = static_cast<float>(at_position[0]);
    for (int i = 0; i < PER_LANE; ++i) {
        const uint d = lane + 32 * i;
        if (d < D) {
            const uint pair = d < HALF ? d : d - HALF;
            const float inv_freq = metal::exp2(-(static_cast<float>(pair) / static_cast<float>(HALF)) * params[1]);
            const float theta = position * inv_freq;
            const float cosine = metal::precise::cos(theta);
            const float sine = metal::precise::sin(theta);
            const float x1 = normed[warp][pair];
            const float x2 = normed[warp][pair + HALF];
            const float rotated = d < HALF ? x1 * cosine - x2 * sine : x1 * sine + x2 * cosine;
            if (is_query) {
                queries[source + d] = rotated;
            } else {
                keys[source + d] = rotated;
            }
        }
    }
"""

_NORM_ROPE_INPUTS = ["q_rows", "k_rows", "q_scale", "k_scale", "at_position", "params"]
# Warps per block of the norm-and-rotate kernel (one per head).
NORM_WARPS = 4


def norm_rope_ops(
    q_rows: mx.array,
    k_rows: mx.array,
    q_scale: mx.array,
    k_scale: mx.array,
    offset: mx.array,
    *,
    query_heads: int,
    kv_heads: int,
    eps: float,
    base: float,
) -> tuple[mx.array, mx.array]:
    """The TTS attention's query and key heads for one position, as the reference computes them: rows
    (B, H·D) split into heads (B, H, 1, D), RMS-normalized with the scales ``q_scale``/``k_scale`` (the
    Gemma norms' ``1 + w``) and rotated by RoPE at ``offset`` (a scalar int32 array). The kernel's fallback."""
    batch = q_rows.shape[0]
    queries = q_rows.reshape(batch, -1, query_heads, q_scale.shape[0]).transpose(0, 2, 1, 3)
    keys = k_rows.reshape(batch, -1, kv_heads, k_scale.shape[0]).transpose(0, 2, 1, 3)
    queries = mx.fast.rms_norm(queries, q_scale, eps)
    keys = mx.fast.rms_norm(keys, k_scale, eps)
    dims = q_scale.shape[0]
    return (
        mx.fast.rope(queries, dims, traditional=False, base=base, scale=1.0, offset=offset),
        mx.fast.rope(keys, dims, traditional=False, base=base, scale=1.0, offset=offset),
    )


class NormRope:
    """The query and key heads of one TTS attention step as one kernel, on CUDA or Metal (float32 rows).

    One warp per (row, head) sums the squares, scales, and rotates each pair ``(i, i + D/2)`` by the
    angle ``offset · 2^(−i/(D/2)·log2 base)`` — MLX's own RoPE formula, so the angles match its kernel's.
    """

    def __init__(self, backend: str, query_heads: int, kv_heads: int, head_dim: int, eps: float, base: float) -> None:
        import numpy as np

        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head size, not {head_dim}")
        self.query_heads, self.kv_heads, self.head_dim = query_heads, kv_heads, head_dim
        # eps and log2(base): MLX passes log2(base) to its RoPE kernel as a float32 computed from a float32 base.
        # :meth:`DecodeAttention.attend_heads` reads the same parameters.
        self.params = kernel_constants(eps, float(np.log2(np.float32(base))))
        self._kernel = custom_kernel(
            backend,
            "parley_norm_rope",
            _NORM_ROPE_INPUTS,
            ["queries", "keys"],
            cuda=_NORM_ROPE_CUDA,
            metal=_NORM_ROPE_METAL,
        )

    def __call__(
        self, q_rows: mx.array, k_rows: mx.array, q_scale: mx.array, k_scale: mx.array, offset: mx.array
    ) -> tuple[mx.array, mx.array]:
        batch = q_rows.shape[0]
        warps = batch * (self.query_heads + self.kv_heads)
        queries, keys = self._kernel(
            inputs=[q_rows, k_rows, q_scale, k_scale, offset, self.params],
            template=[
                ("HQ", self.query_heads),
                ("HKV", self.kv_heads),
                ("D", self.head_dim),
                ("NORM_WARPS", NORM_WARPS),
                ("ST", q_scale.dtype),
            ],
            grid=(-(-warps // NORM_WARPS) * NORM_WARPS * 32, 1, 1),
            threadgroup=(NORM_WARPS * 32, 1, 1),
            output_shapes=[(batch, self.query_heads, 1, self.head_dim), (batch, self.kv_heads, 1, self.head_dim)],
            output_dtypes=[mx.float32, mx.float32],
        )
        return queries, keys


def norm_rope_samples(query_heads: int, kv_heads: int, head_dim: int, scale_dtype: mx.Dtype) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the kernel: two rows at an early and a late position."""
    keys = mx.random.split(mx.random.key(55), 4)
    q_rows = mx.random.normal((2, query_heads * head_dim), key=keys[0])
    k_rows = mx.random.normal((2, kv_heads * head_dim), key=keys[1])
    q_scale = (1.0 + 0.1 * mx.random.normal((head_dim,), key=keys[2])).astype(scale_dtype)
    k_scale = (1.0 + 0.1 * mx.random.normal((head_dim,), key=keys[3])).astype(scale_dtype)
    return [(q_rows, k_rows, q_scale, k_scale, mx.array(position)) for position in (3, 1500)]
