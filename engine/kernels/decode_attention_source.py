"""The single-position attention kernel's CUDA and Metal sources, which
:class:`engine.kernels.decode_attention.DecodeAttention` builds: the attention reading its buffers as stored,
writing the new position too, or making its query and key heads as well, each also as the form whose blocks merge
their own shares; and the kernel that merges blocks' shares. :mod:`engine.kernels.decode_attention` describes the
layout and the arithmetic.
"""

from __future__ import annotations

from .norm_rope import ONE_HEAD_CUDA
from .warp_merge import warps_combined_cuda, warps_combined_metal

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
    + warps_combined_cuda("D")
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
BUFFER_CUDA = """
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
    + ONE_HEAD_CUDA.replace("@NORMED@", "head_normed[warp]").replace("@TARGET@", "rotated[warp]")
    + """    }
    __syncthreads();
""",
    "@QUERY@": "rotated[0]",
    "@FRESH@": _FRESH.replace("@FRESH_KEY@", "rotated[1] + 2 * part"),
    "@WRITE@": _WRITING["@WRITE@"].replace("new_keys[head_start * D + d]", "rotated[1][d]"),
}
assert _HEADS["@WRITE@"] != _WRITING["@WRITE@"]


def attention_cuda(writing: bool, heads: bool = False, merged: bool = False) -> str:
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

MERGE_CUDA = """
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

ATTENTION_METAL = (
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
    + warps_combined_metal("D")
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

MERGE_METAL = """
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
FORM_INPUTS = {"read": _INPUTS, "writing": _WRITING_INPUTS, "heads": _HEADS_INPUTS}
