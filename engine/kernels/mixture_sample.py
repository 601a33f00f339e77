"""The MoG head's draw after its projections, as one kernel (fast numerics).

Each MaskGIT round draws a component from the guided row's mixture logits (top-p, then Gumbel-max
with one uniform draw), projects the row to that component's low-rank mean, lifts it by the
component's basis and draws the latent around it with one normal draw (:mod:`engine.ops.sampling`).
As operations that is a softmax, a sort, a cumulative sum, a scatter, a second softmax, the Gumbel
transform, an argmax, two gathers and two products with their views, and the Gaussian's scale and
noise: about forty primitives a round, five rounds a frame. :class:`MixtureSample` does it in one
launch of one block; the two draws stay MLX's (:func:`engine.ops.sampling.draw_latent_noise` and
``mx.random.uniform``, in the reference's order), made before the launch.

The guided row itself comes from the row product before it (``RowProductShape.guided``), which
multiplies it by the three projections; this kernel takes that product's summed rows and forms the
guided row again from them (its norm and mix: two rows of the hidden width, cheap) rather than have
the product write it out.

Arithmetic: float32 like the reference, with sums in another order. The nucleus keeps a component
while the probability of those ranked above it is below ``top_p``, as the reference's ascending sort
and reversed exclusive cumulative sum decide it (equal probabilities ranked by index, a stable
sort's order); the kernel sums each component's mass above directly. A component whose mass above
lands within rounding of ``top_p``, or two Gumbel scores within rounding of each other, can go the
other way: the draw, not its arithmetic, then differs, as on another machine.
:func:`mixture_sample_ops` — the reference's operations — is the fallback that the CPU runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from ..jit import materialize
from ..ops.sampling import GUMBEL_EPS, gaussian_latent, guide, gumbel_choice, top_p_mask
from .admission import custom_kernel, kernel_constants
from .source import CUDA, METAL, Dialect

THREADS = 256  # one block of 8 warps (1,024 threads need more registers than an H200 block has)
INPUTS = ("logits", "residual", "log_std", "hidden", "final_scale", "uniform", "noise", "mus", "low_mat", "params")


@dataclass(frozen=True)
class MixtureSampleShape:
    """``components`` mixture components, a ``latent``-wide Gaussian with ``low_rank`` means, a ``width``-wide
    hidden row; the sampling constants of the model's config."""

    components: int
    latent: int
    low_rank: int
    width: int
    eps: float
    guidance: float
    top_p: float
    min_log_std: float
    noise_scale: float

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p < 1.0:
            raise ValueError(f"the kernel draws from a nucleus: top_p in (0, 1), not {self.top_p}")
        if self.guidance <= 0.0:
            raise ValueError(f"the kernel mixes a guided row: guidance > 0, not {self.guidance}")


def low_rank_mean(component: mx.array, rows: mx.array, mus: mx.array, low_mat: mx.array, low_rank: int) -> mx.array:
    """The mean (rows, latent) of the drawn ``component`` (rows,) for ``rows``: only that component's rows of the
    mean projection ``mus`` (``proj_mus.weight``) are read, then lifted by its basis ``low_mat``."""
    mean_projection = mus.reshape(low_mat.shape[0], low_rank, -1)[component]
    low_mean = (mean_projection @ rows[..., None]).squeeze(-1)
    return (low_mat[component] @ low_mean[..., None]).squeeze(-1)


def gaussian_of(
    mean: mx.array, residual: mx.array, log_std_raw: mx.array, min_log_std: float
) -> tuple[mx.array, mx.array]:
    """The Gaussian's centre and log std from the component's ``mean``, the ``residual`` projection and the raw
    log std (floored at ``min_log_std``)."""
    log_std = mx.maximum(log_std_raw, min_log_std)
    return materialize(mean * mx.exp(log_std)) + residual, log_std


def guided_row(hidden: mx.array, final_scale: mx.array, eps: float, guidance: float) -> mx.array:
    """The MoG head's final norm of its two summed rows (conditional, unconditional), mixed into one by
    classifier-free guidance: the reference's operations."""
    return guide(mx.fast.rms_norm(hidden, final_scale, eps), guidance)


def mixture_sample_ops(
    logits: mx.array,
    residual: mx.array,
    log_std: mx.array,
    hidden: mx.array,
    final_scale: mx.array,
    uniform: mx.array,
    noise: mx.array,
    mus: mx.array,
    low_mat: mx.array,
    *,
    shape: MixtureSampleShape,
) -> mx.array:
    """:class:`MixtureSample`'s computation as the reference's operations (its fallback): the latent (1, latent).
    ``mus`` and ``low_mat`` come as tables of one row per component (``(K, R·H)``, ``(K, L·R)``)."""
    component = gumbel_choice(top_p_mask(logits, shape.top_p), uniform)
    row = guided_row(hidden, final_scale, shape.eps, shape.guidance)
    basis = low_mat.reshape(shape.components, shape.latent, shape.low_rank)
    mean = low_rank_mean(component, row, mus, basis, shape.low_rank)
    centre, log_std = gaussian_of(mean, residual, log_std, shape.min_log_std)
    return gaussian_latent(centre, log_std, noise, shape.noise_scale)


def _source(d: Dialect) -> str:
    return f"""
    {d.header}
    {d.shared} float z[K];
    {d.shared} float p[K];
    {d.shared} float row[H];
    {d.shared} float low[R];
    {d.shared} float scratch[THREADS / 32];
    {d.shared} float stats[6];
    {d.shared} int best_index[THREADS / 32];
    // Softmax of the guided row's logits.
    float top = {d.negative_infinity};
    for (int j = local; j < K; j += THREADS) {{
        z[j] = logits[j];
        top = top > z[j] ? top : z[j];
    }}
    {d.block_reduce("top", "stats[0]", "max")}
    float mass = 0.0f;
    for (int j = local; j < K; j += THREADS) {{
        p[j] = {d.exp}(z[j] - stats[0]);
        mass += p[j];
    }}
    {d.block_reduce("mass", "stats[1]", "sum")}
    for (int j = local; j < K; j += THREADS) p[j] = p[j] / stats[1];
    {d.barrier}
    // The nucleus: a component stays while the mass ranked above it (more probable, or as probable and later,
    // as a stable ascending sort ranks it) is below top_p. Its log probability renormalized over the nucleus
    // comes next, from the same maximum (the most probable component always stays).
    // Each thread ranks its OWN components together, one read of p[k] for all of them (each sum still taken
    // in k's order).
    constexpr int OWN = (K + THREADS - 1) / THREADS;
    float own[OWN];
    float above[OWN];
    for (int i = 0; i < OWN; ++i) {{
        const int j = local + i * THREADS;
        own[i] = j < K ? p[j] : 0.0f;
        above[i] = 0.0f;
    }}
    for (int k = 0; k < K; ++k) {{
        const float other = p[k];
        for (int i = 0; i < OWN; ++i) {{
            const int j = local + i * THREADS;
            if (other > own[i] || (other == own[i] && k > j)) above[i] += other;
        }}
    }}
    float kept = 0.0f;
    for (int i = 0; i < OWN; ++i) {{
        const int j = local + i * THREADS;
        if (j < K) {{
            const float e = above[i] < params[2] ? {d.exp}(z[j] - stats[0]) : 0.0f;
            z[j] = e;
            kept += e;
        }}
    }}
    {d.block_reduce("kept", "stats[2]", "sum")}
    // Gumbel-max over the nucleus' log probabilities: the first index among equal scores.
    float best = {d.negative_infinity};
    int at = K;
    for (int j = local; j < K; j += THREADS) {{
        const float gumbel = -{d.log}(-{d.log}(uniform[j] + {GUMBEL_EPS!r}f) + {GUMBEL_EPS!r}f);
        const float score = {d.log}(z[j] / stats[2]) + gumbel;
        if (score > best || at == K) {{ best = score; at = j; }}
    }}
    for (int o = 16; o > 0; o /= 2) {{
        const float other = {d.shuffle_xor("best", "o")};
        const int other_at = {d.shuffle_xor("at", "o")};
        if (other > best || (other == best && other_at < at)) {{ best = other; at = other_at; }}
    }}
    if (lane == 0) {{ scratch[warp] = best; best_index[warp] = at; }}
    {d.barrier}
    if (local == 0) {{
        float winner = scratch[0];
        int chosen = best_index[0];
        for (int w = 1; w < THREADS / 32; ++w) {{
            if (scratch[w] > winner || (scratch[w] == winner && best_index[w] < chosen)) {{
                winner = scratch[w];
                chosen = best_index[w];
            }}
        }}
        stats[3] = static_cast<float>(chosen);
    }}
    // The guided row: the final norm of both summed rows, then the mix.
    float squares0 = 0.0f;
    float squares1 = 0.0f;
    for (int i = local; i < H; i += THREADS) {{
        squares0 += hidden[i] * hidden[i];
        squares1 += hidden[H + i] * hidden[H + i];
    }}
    {d.block_reduce("squares0", "stats[4]", "sum")}
    {d.block_reduce("squares1", "stats[5]", "sum")}
    const float inverse0 = {d.rsqrt}(stats[4] / H + params[0]);
    const float inverse1 = {d.rsqrt}(stats[5] / H + params[0]);
    for (int i = local; i < H; i += THREADS) {{
        const float s = static_cast<float>(final_scale[i]);
        const float conditional = s * (hidden[i] * inverse0);
        const float unconditional = s * (hidden[H + i] * inverse1);
        row[i] = conditional + params[1] * (conditional - unconditional);
    }}
    {d.barrier}
    // The component's low-rank mean: a warp per rank.
    const int component = static_cast<int>(stats[3]);
    for (int r = warp; r < R; r += THREADS / 32) {{
        const {d.device}MT* basis = mus + (static_cast<size_t>(component) * R + r) * H;
        float sum = 0.0f;
        for (int i = lane; i < H; i += 32) sum += static_cast<float>(basis[i]) * row[i];
        {d.warp_sum("sum")}
        if (lane == 0) low[r] = sum;
    }}
    {d.barrier}
    // Lifted by the component's basis, scaled, shifted, and the latent drawn around it.
    const float log_std_value = log_std[0] > params[3] ? log_std[0] : params[3];
    const float scale = {d.exp}(log_std_value);
    for (int l = local; l < L; l += THREADS) {{
        const {d.device}MT* lift = low_mat + (static_cast<size_t>(component) * L + l) * R;
        float mean = 0.0f;
        for (int r = 0; r < R; ++r) mean += static_cast<float>(lift[r]) * low[r];
        const float centre = mean * scale + residual[l];
        latent[l] = centre + scale * noise[l] * params[4];
    }}
"""


class MixtureSample:
    """:func:`mixture_sample_ops` as one kernel (one block) on CUDA or Metal; the means' weights in their own
    dtype, everything else float32."""

    def __init__(self, backend: str, shape: MixtureSampleShape) -> None:
        self.shape = shape
        self._kernel = custom_kernel(
            backend, "parley_mixture_sample", list(INPUTS), ["latent"], cuda=_source(CUDA), metal=_source(METAL)
        )
        constants = [shape.eps, shape.guidance, shape.top_p, shape.min_log_std, shape.noise_scale]
        self._params = kernel_constants(*constants)

    def __call__(self, *inputs: mx.array) -> mx.array:
        shape = self.shape
        (latent,) = self._kernel(
            inputs=[*inputs, self._params],
            template=[
                ("K", shape.components),
                ("L", shape.latent),
                ("R", shape.low_rank),
                ("H", shape.width),
                ("THREADS", THREADS),
                ("MT", inputs[7].dtype),
            ],
            grid=(THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(1, shape.latent)],
            output_dtypes=[mx.float32],
        )
        return latent


def mixture_sample_samples(shape: MixtureSampleShape, means_dtype: mx.Dtype) -> tuple[mx.array, ...]:
    """Inputs for admitting a :class:`MixtureSample` against :func:`mixture_sample_ops` (in call order): logits
    spread enough that the nucleus leaves some components out."""
    keys = mx.random.split(mx.random.key(83), 9)
    components, latent, rank, width = shape.components, shape.latent, shape.low_rank, shape.width
    return (
        2.0 * mx.random.normal((1, components), key=keys[0]),
        mx.random.normal((1, latent), key=keys[1]),
        0.5 * mx.random.normal((1, 1), key=keys[2]),
        3.0 * mx.random.normal((2, width), key=keys[3]),
        1.0 + 0.1 * mx.random.normal((width,), key=keys[4]),
        mx.random.uniform(shape=(1, components), key=keys[5]),
        mx.random.normal((1, latent), key=keys[6]),
        (mx.random.normal((components, rank * width), key=keys[7]) / math.sqrt(width)).astype(means_dtype),
        (mx.random.normal((components, latent * rank), key=keys[8]) / math.sqrt(rank)).astype(means_dtype),
    )
