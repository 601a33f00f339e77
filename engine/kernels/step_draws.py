"""A TTS step's random draws as one kernel (fast numerics).

Each MaskGIT round draws a uniform tensor (the component's Gumbel-max) and a standard-normal one (the latent's
noise) from MLX's global generator (:mod:`engine.ops.sampling`). As operations each draw is a key split (MLX's
``RandomBits`` on the key, a ``Split`` and two ``Reshape`` views), its bits (a second ``RandomBits``) and their
conversion (one fused kernel when compiled): six primitives a draw, ten draws a step at full size. The draws
depend on nothing but the generator's key, so :class:`StepDraws` makes them all in one launch: the chain of
splits, every draw's bits by the same threefry-2x32 hash and counter layout as ``RandomBits``, the conversions
as MLX's ``uniform`` and ``normal`` form them, and the key the last split leaves, which the next step starts from
(the TTS cache carries it, ``engine.networks.tts.TTSCache.draw_key``: MLX's Python API cannot set the global generator's
key). Its results are the operations' bit for bit (the divisions are by a power of two, the normal's
product with the range is exact, and ``erfinvf`` is the library's own), and it is used only where the
admission sees that. CUDA only: MLX's Metal backend has its own ``erfinv``, which no Mac here could check a
copy of, so a Mac keeps the operations.

:func:`step_draws_ops` — the library's draws, each from an explicit key split the way its global generator
splits — is the fallback that the CPU runs: the same values as drawing one by one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import mlx.core as mx

from .admission import custom_kernel

THREADS = 256

DrawKind = Literal["uniform", "normal"]


@dataclass(frozen=True)
class Draw:
    """One draw of a step: ``kind`` over ``shape``, float32."""

    kind: DrawKind
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def step_draws_ops(key: mx.array, plan: Sequence[Draw]) -> tuple[mx.array, ...]:
    """``(the key after the last split, *the draws)``: each draw from the second half of a split of the key, the
    first half carried on, as MLX's global generator draws (the fallback of :class:`StepDraws`)."""
    draws = []
    for draw in plan:
        halves = mx.random.split(key)
        key, subkey = halves[0], halves[1]
        if draw.kind == "uniform":
            draws.append(mx.random.uniform(shape=draw.shape, key=subkey))
        else:
            draws.append(mx.random.normal(draw.shape, key=subkey))
    return (key, *draws)


# MLX's RandomBits hash: threefry-2x32 with 20 rounds over (key, counter), in place on (x, y).
_THREEFRY_CUDA = """
    auto threefry = [](uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1, uint32_t& x, uint32_t& y) {
        const uint32_t schedule[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
        const uint32_t rotations[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
        x = c0 + schedule[0];
        y = c1 + schedule[1];
        for (int i = 0; i < 5; ++i) {
            for (int r = 0; r < 4; ++r) {
                const uint32_t rotation = rotations[i % 2][r];
                x += y;
                y = (y << rotation) | (y >> (32 - rotation));
                y ^= x;
            }
            x += schedule[(i + 1) % 3];
            y += schedule[(i + 2) % 3] + i + 1;
        }
    };
"""

# A uint32's uniform in [0, 1) as MLX's ``uniform`` forms it (divided by UINT32_MAX as a float, 2^32, and
# clamped below one); a normal as ``normal`` forms it from the uniform over [nextafter(-1, 0), 1) (range 2.0):
# erfinv of 2u + low, times sqrt(2) as a float32.
_CONVERT_CUDA = """
    auto uniform_of = [](uint32_t bits) {
        const float u = static_cast<float>(bits) / 4294967296.0f;
        const float below_one = __int_as_float(0x3f7fffff);
        return u < below_one ? u : below_one;
    };
    auto normal_of = [&](uint32_t bits) {
        const float low = __int_as_float(0xbf7fffff);
        return __int_as_float(0x3fb504f3) * erfinvf(2.0f * uniform_of(bits) + low);  // float(sqrt(2))
    };
"""


def _draw_source(index: int, draw: Draw) -> str:
    """The block's loop writing draw ``index``: RandomBits' layout for one key, a hash per pair of elements
    ``(i, i + G)`` (the last alone, counter ``(i, 0)``, when the count is odd)."""
    convert = "uniform_of" if draw.kind == "uniform" else "normal_of"
    size = draw.size
    half, odd = size // 2, size % 2
    pairs = half + odd
    return f"""
    for (int i = threadIdx.x; i < {pairs}; i += THREADS) {{
        const bool alone = {odd} && i == {half};
        uint32_t x, y;
        threefry(subkeys[{2 * index}], subkeys[{2 * index + 1}], i, alone ? 0u : i + {pairs}, x, y);
        draw_{index}[i] = {convert}(x);
        if (!alone) draw_{index}[i + {pairs}] = {convert}(y);
    }}
"""


def _source(plan: Sequence[Draw]) -> str:
    draws = "".join(_draw_source(index, draw) for index, draw in enumerate(plan))
    return f"""
    {_THREEFRY_CUDA}
    {_CONVERT_CUDA}
    __shared__ uint32_t subkeys[{2 * len(plan)}];
    if (threadIdx.x == 0) {{
        // split(key): RandomBits of 4 words with counters (0, 2) and (1, 3); words 0-1 are the next key,
        // words 2-3 the draw's.
        uint32_t k0 = key[0], k1 = key[1];
        for (int d = 0; d < {len(plan)}; ++d) {{
            uint32_t a0, a1, b0, b1;
            threefry(k0, k1, 0u, 2u, a0, a1);
            threefry(k0, k1, 1u, 3u, b0, b1);
            subkeys[2 * d] = a1;
            subkeys[2 * d + 1] = b1;
            k0 = a0;
            k1 = b0;
        }}
        key_out[0] = k0;
        key_out[1] = k1;
    }}
    __syncthreads();
    {draws}
"""


class StepDraws:
    """:func:`step_draws_ops` for one ``plan`` as one kernel of one block (CUDA; see the module's docstring)."""

    def __init__(self, backend: str, plan: Sequence[Draw]) -> None:
        if backend != "cuda":
            raise ValueError(f"the step's draws stay the library's on {backend!r}")
        if not plan:
            raise ValueError("a plan of no draws")
        self.plan = tuple(plan)
        self._kernel = custom_kernel(
            backend,
            "parley_step_draws",
            ["key"],
            ["key_out", *(f"draw_{index}" for index in range(len(self.plan)))],
            cuda=_source(self.plan),
            metal="",
        )

    def __call__(self, key: mx.array) -> tuple[mx.array, ...]:
        return tuple(
            self._kernel(
                inputs=[key],
                template=[("THREADS", THREADS)],
                grid=(THREADS, 1, 1),
                threadgroup=(THREADS, 1, 1),
                output_shapes=[(2,), *(draw.shape for draw in self.plan)],
                output_dtypes=[mx.uint32, *(mx.float32 for _ in self.plan)],
            )
        )


def skip_key_ops(key: mx.array, splits: mx.array) -> mx.array:
    """The key ``splits`` (a uint32 scalar array, read on the host) splits of ``key`` leave, each taking the first half
    as MLX's global generator does (the fallback of :class:`KeySkip`)."""
    for _ in range(int(cast(int, splits.item()))):  # a uint32 scalar: item() gives an int
        key = mx.random.split(key)[0]
    return key


_SKIP_SOURCE = f"""
    {_THREEFRY_CUDA}
    // split(key), ``splits`` times, keeping words 0-1 (the next key): one thread, as the chain is sequential.
    uint32_t k0 = key[0], k1 = key[1];
    const uint32_t count = splits[0];
    for (uint32_t s = 0; s < count; ++s) {{
        uint32_t a0, a1, b0, b1;
        threefry(k0, k1, 0u, 2u, a0, a1);
        threefry(k0, k1, 1u, 3u, b0, b1);
        k0 = a0;
        k1 = b0;
    }}
    key_out[0] = k0;
    key_out[1] = k1;
"""


class KeySkip:
    """:func:`skip_key_ops` as one kernel of one thread (CUDA): a fast prefill's skipped draws move the generator
    on by thousands of splits (about 9,000 for a 900-position prompt), each an operation's launch or more, where
    this is one launch (``engine.networks.tts.EarTTS.skip_draws``)."""

    def __init__(self, backend: str) -> None:
        if backend != "cuda":
            raise ValueError(f"the key's splits stay the library's on {backend!r}")
        self._kernel = custom_kernel(
            backend, "parley_key_skip", ["key", "splits"], ["key_out"], cuda=_SKIP_SOURCE, metal=""
        )

    def __call__(self, key: mx.array, splits: mx.array) -> mx.array:
        (key_out,) = self._kernel(
            inputs=[key, splits],
            grid=(1, 1, 1),
            threadgroup=(1, 1, 1),
            output_shapes=[(2,)],
            output_dtypes=[mx.uint32],
        )
        return key_out


def key_skip_samples() -> list[tuple[mx.array, mx.array]]:
    """Keys and split counts for admitting :class:`KeySkip` against :func:`skip_key_ops`."""
    counts = (0, 1, 37)
    return [(key, mx.array([count], dtype=mx.uint32)) for (key,) in step_draws_samples() for count in counts]


def step_draws_samples() -> list[tuple[mx.array]]:
    """Keys for admitting a :class:`StepDraws` against :func:`step_draws_ops`: the seeds' keys a session starts
    from, and keys with high bits set (the hash's additions wrap)."""
    return [
        (mx.random.key(0),),
        (mx.random.key(1234),),
        (mx.array([0xFFFFFFFF, 0x89ABCDEF], dtype=mx.uint32),),
    ]
