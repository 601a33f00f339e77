"""The MoG head's draw kernel on this GPU: how often it draws what its operations draw, and time per call.

Run on the device (never in CI; the CPU runs the operations): ``python3 tests/device/mog_draw.py [DRAWS]``.
Full-size shapes (1,024 components, a 512-wide latent, rank 64, hidden 1,152) and the model's sampling
constants. Each draw gets fresh random inputs (logits spread as :func:`mixture_sample_samples` makes them,
scaled by a factor that varies the nucleus' size); the kernel's latent is compared with its operations' on
the CPU: the same component gives a latent within float32 rounding, another component a different latent.
Then the guided projections' row product against its operations, and both kernels' time per call.
"""

from __future__ import annotations

import sys

import mlx.core as mx
from fast_kernels import per_call_us  # a sibling script (run as tests/device/mog_draw.py)

from engine.kernels.admission import gpu_kernel_backend, relative_l2
from engine.kernels.mixture_sample import MixtureSample, MixtureSampleShape, mixture_sample_ops, mixture_sample_samples
from engine.kernels.row_product import RowProduct, RowProductShape, row_product_ops, row_product_samples
from engine.loading.config import MoGConfig, TTSConfig

DRAWS = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def main() -> None:
    backend = gpu_kernel_backend()
    if backend is None:
        print("no GPU kernels here")
        return
    tts, mog = TTSConfig(), MoGConfig()
    shape = MixtureSampleShape(
        mog.num_predictions,
        tts.latent_size,
        mog.low_rank,
        tts.hidden_size,
        mog.eps,
        tts.guidance_scale,
        tts.top_p,
        mog.min_log_std,
        tts.noise_scale,
    )
    kernel = MixtureSample(backend, shape)
    base = list(mixture_sample_samples(shape, mx.float32))
    same, errors = 0, []
    for draw in range(DRAWS):
        keys = mx.random.split(mx.random.key(1000 + draw), 3)
        inputs = list(base)
        inputs[0] = (0.5 + 3.0 * draw / DRAWS) * mx.random.normal(base[0].shape, key=keys[0])
        inputs[3] = 3.0 * mx.random.normal(base[3].shape, key=keys[1])
        inputs[5] = mx.random.uniform(shape=base[5].shape, key=keys[2])
        got = kernel(*inputs)
        with mx.stream(mx.cpu):
            want = mixture_sample_ops(*inputs, shape=shape)
            mx.eval(want)
        error = relative_l2(got, want)
        errors.append(error)
        same += error <= 1e-5
    print(
        f"MoG draw: {same}/{DRAWS} draws within 1e-5 of the operations' (worst of those "
        f"{max((e for e in errors if e <= 1e-5), default=float('nan')):.2e}); {kernel(*base).shape} per call "
        f"{per_call_us(kernel, tuple(base)):.1f} µs (with its sync)"
    )
    product = RowProductShape(
        2, tts.hidden_size, (mog.num_predictions, tts.latent_size, 1), "residual_norm", guided=True
    )
    guided = RowProduct(backend, product, mx.float32, mx.float32)
    inputs = row_product_samples(product, mx.float32, mx.float32)
    got = guided(*inputs, eps=mog.eps, guidance=tts.guidance_scale)
    with mx.stream(mx.cpu):
        want = row_product_ops(*inputs, eps=mog.eps, guidance=tts.guidance_scale)
        mx.eval(want)
    worst = max(relative_l2(a, b) for a, b in zip(got, want, strict=True))
    timed = per_call_us(lambda *a: guided(*a, eps=mog.eps, guidance=tts.guidance_scale), inputs)
    print(f"guided projections row product: relative L2 {worst:.2e} to the CPU's operations; {timed:.1f} µs a call")


if __name__ == "__main__":
    main()
