"""The encoder's window attention kernel with more warps a head, on the lent GPU (never in CI).

Run from the repository root:
- ``python3 tests/device/relative_warps.py kernel`` (``bash tests/device/h200.sh setup relwarps``): for 4, 8, 16
  and 32 warps a head, the full-size window kernel (8 heads of 128, 70 cached rows and the newest) admitted or
  not, its relative L2 to the operations and to the 4-warp kernel, and its time per call, each call synced and
  24 calls queued as a frame's layers run;
- ``python3 tests/device/relative_warps.py frame A B`` (``setup relwarpsab``): the full-size 4-bit model in fast
  numerics with the window kernel of A warps against B, alternating rounds in one process (the encoder keys its
  traced programs by the kernels, so each form keeps its own).
"""

from __future__ import annotations

import sys

import mlx.core as mx
from fast_kernels import per_call_us, queued_us  # sibling scripts
from traced_ab import warmed_alternating_rounds

from engine.kernels.admission import admit_kernel, gpu_kernel_backend, relative_l2
from engine.kernels.decode_attention import RelativeDecodeAttention, relative_window_samples
from engine.loading.random_checkpoint import random_voicechat
from engine.networks.encoder import RelativePositionAttention, attend_relative_window

HEADS, HEAD_DIM = 8, 128
WARPS = (4, 8, 16, 32)


def kernel_sweep(backend: str) -> None:
    """Prints each warps count's line, then the fastest admitted count queued with bf16 biases (as stored)."""
    queued: dict[int, float] = {}
    for bias_dtype in (mx.bfloat16, mx.float32):
        samples = relative_window_samples(HEADS, HEAD_DIM, bias_dtype)
        full = samples[0]  # 71 keys, the oldest cached row dropped: every steady frame's window
        want = attend_relative_window(*full)
        baseline: tuple[mx.array, ...] | None = None
        for warps in WARPS:
            window = RelativeDecodeAttention(backend, HEADS, HEAD_DIM, warps).window
            admitted = all(
                admit_kernel(f"window {warps} warps", window, attend_relative_window, sample) for sample in samples
            )
            got = window(*full)
            baseline = baseline or got
            per_call_queued = queued_us(window, full, 24 * 20)
            if admitted and bias_dtype == mx.bfloat16:
                queued[warps] = per_call_queued
            print(
                f"window kernel, {warps} warps a head, biases {bias_dtype}: admitted {admitted}, relative L2 to the "
                f"operations {max(relative_l2(g, w) for g, w in zip(got, want, strict=True)):.2e}, "
                f"to 4 warps {relative_l2(got[0], baseline[0]):.2e}; {per_call_us(window, full):.1f} us a call "
                f"synced, {per_call_queued:.1f} us a call queued",
                flush=True,
            )
    if queued:
        print(f"fastest queued: {min(queued, key=queued.__getitem__)} warps")


def frame_ab(backend: str, first: int, second: int) -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    modules = [module for _, module in voicechat.model.named_modules()]
    relatives = [module for module in modules if isinstance(module, RelativePositionAttention)]
    in_use = sum(module.fast_window is not None for module in relatives)
    print(f"window kernel in {in_use} of {len(relatives)} layers; fast changes {voicechat.fast_changes}")
    heads, head_dim = relatives[0].heads, relatives[0].head_dim
    kernels = {warps: RelativeDecodeAttention(backend, heads, head_dim, warps) for warps in (first, second)}

    def switch(warps: int) -> dict[str, object]:
        for module in relatives:
            module.fast_attention, module.fast_window = kernels[warps], kernels[warps].window
        return {}

    warmed_alternating_rounds(
        voicechat, {f"{first} warps": lambda: switch(first), f"{second} warps": lambda: switch(second)}
    )


def main() -> None:
    backend = gpu_kernel_backend()
    if backend is None:
        raise SystemExit("no GPU kernels on this device")
    if sys.argv[1:2] == ["frame"]:
        frame_ab(backend, int(sys.argv[2]), int(sys.argv[3]))
    else:
        kernel_sweep(backend)


if __name__ == "__main__":
    main()
