"""How an attention kernel's warps merge their running maxima, sums and mixed values into their block's.

The same lines in the single-position attention (:mod:`engine.kernels.decode_attention_source`) and the
encoder's relative-position attention (:mod:`engine.kernels.relative_attention`), in CUDA and in Metal, with
the head width named as each kernel's source names it.
"""

from __future__ import annotations

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


def warps_merged_cuda(width: str) -> str:
    return (_WARPS_STORED_CUDA + _WARPS_COMBINED_CUDA).replace("@W@", width)


def warps_combined_cuda(width: str) -> str:
    return _WARPS_COMBINED_CUDA.replace("@W@", width)


def warps_merged_metal(width: str) -> str:
    return (_WARPS_STORED_METAL + _WARPS_COMBINED_METAL).replace("@W@", width)


def warps_combined_metal(width: str) -> str:
    return _WARPS_COMBINED_METAL.replace("@W@", width)
