"""What differs between the CUDA and the Metal source of one kernel, for kernels written once for both.

A kernel body is written once as a Python f-string over a :class:`Dialect`: the thread and block indices
(``local``, ``block``, ``warp``, ``lane``; a warp is 32 lanes on both), shared memory, barriers, warp sums,
math functions and conversions. :data:`CUDA` fills it for ``mx.fast.cuda_kernel``, :data:`METAL` for
``mx.fast.metal_kernel`` (:func:`engine.kernels.admission.custom_kernel` takes both sources).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """One backend's spelling of what a kernel body uses."""

    metal: bool
    header: str  # declares ``local`` (thread in block), ``block``, ``warp`` and ``lane``
    shared: str
    device: str  # the address space of a pointer into an input
    barrier: str
    exp: str
    log: str
    tanh: str
    rsqrt: str
    negative_infinity: str

    def warp_sum(self, name: str) -> str:
        if self.metal:
            return f"{name} = metal::simd_sum({name});"
        return f"for (int o = 16; o > 0; o /= 2) {name} += __shfl_xor_sync(0xffffffff, {name}, o);"

    def warp_max(self, name: str) -> str:
        if self.metal:
            return f"{name} = metal::simd_max({name});"
        return f"for (int o = 16; o > 0; o /= 2) {name} = fmaxf({name}, __shfl_xor_sync(0xffffffff, {name}, o));"

    def shuffle_xor(self, name: str, offset: str) -> str:
        if self.metal:
            return f"metal::simd_shuffle_xor({name}, ushort({offset}))"
        return f"__shfl_xor_sync(0xffffffff, {name}, {offset})"

    def block_reduce(self, value: str, target: str, combine: str) -> str:
        """Reduce every thread's ``value`` over the block into ``target`` (an lvalue in shared memory, read by
        every thread after it); ``combine`` is "sum" or "max". Needs ``scratch``, a shared float per warp
        (``THREADS / 32``)."""
        warp_reduce = self.warp_sum(value) if combine == "sum" else self.warp_max(value)
        merge = "total += scratch[w];" if combine == "sum" else "total = total > scratch[w] ? total : scratch[w];"
        return f"""
    {warp_reduce}
    if (lane == 0) scratch[warp] = {value};
    {self.barrier}
    if (local == 0) {{
        float total = scratch[0];
        for (int w = 1; w < THREADS / 32; ++w) {merge}
        {target} = total;
    }}
    {self.barrier}
"""

    def round_bf16(self, name: str) -> str:
        """``name`` rounded to bf16 (to nearest, ties to even) and widened back."""
        if self.metal:
            return f"static_cast<float>(static_cast<bfloat16_t>({name}))"
        return f"__bfloat162float(__float2bfloat16_rn({name}))"


_INDICES = "const int warp = local / 32; const int lane = local % 32;"

CUDA = Dialect(
    metal=False,
    header=f"const int local = threadIdx.x; const int block = blockIdx.x; {_INDICES}",
    shared="__shared__",
    device="",
    barrier="__syncthreads();",
    exp="expf",
    log="logf",
    tanh="tanhf",
    rsqrt="rsqrtf",
    negative_infinity="(-__int_as_float(0x7f800000))",
)
METAL = Dialect(
    metal=True,
    header="const int local = int(thread_position_in_threadgroup.x);"
    f" const int block = int(threadgroup_position_in_grid.x); {_INDICES}",
    shared="threadgroup",
    device="device ",
    barrier="threadgroup_barrier(metal::mem_flags::mem_threadgroup);",
    exp="metal::precise::exp",
    log="metal::precise::log",
    tanh="metal::precise::tanh",
    rsqrt="metal::precise::rsqrt",
    negative_infinity="(-INFINITY)",
)


# A barrier of every block of a launch (CUDA), for kernels whose persistent blocks run several steps in turn, each
# step reading what the one before wrote: a counter and a generation on a ticket line (an int32 input ``tickets``
# from :func:`engine.kernels.admission.kernel_tickets`, zero at first, which the kernel keeps on from launch to launch),
# the last block to arrive putting the counter back to zero and moving the generation on, the others waiting for it to
# move. A launch has few blocks, all resident together on any GPU; a wait is bounded all the same (about a second),
# so that a device that could not run them together returns wrong values, which admission refuses, instead of
# hanging. The fences on both sides make every block's writes before the barrier visible to every block's reads
# after it. Needs ``local`` (the thread in its block) and :data:`GRID_BARRIER_STATE_CUDA` declared before.
GRID_BARRIER_STATE_CUDA = """
    constexpr long long SPIN_LIMIT = 1LL << 31;  // clock cycles, about a second
    int* arrivals = const_cast<int*>(tickets);
    volatile int* generation = arrivals + 1;
"""
GRID_BARRIER_CUDA = """
    __syncthreads();
    if (local == 0) {
        const int seen = *generation;
        __threadfence();  // the block's writes are visible to every block before its arrival is
        if (atomicAdd(arrivals, 1) == gridDim.x - 1) {
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
"""


def block_turns(count: str, body: str) -> str:
    """``body`` for the blocks ``block`` = 0 … ``count`` − 1 in turn over a launch's persistent blocks (CUDA), with a
    block barrier between turns, since the next turn reuses the shared memory."""
    return f"""
    for (int block = blockIdx.x; block < {count}; block += gridDim.x) {{
        {body}
        __syncthreads();
    }}
"""
