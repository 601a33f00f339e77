"""Every random draw of the speech generator, in one place.

Only EAR-TTS consumes randomness. Each MaskGIT iteration of a TTS step draws, in
this order: one uniform tensor over the mixture components for a Gumbel-max choice
(after a top-p mask), then one standard-normal latent for the Gaussian sample.
Both come from MLX's global generator (no explicit key), so a session that seeds
it with ``mx.random.seed`` reproduces the reference draw for draw. Fast numerics may make a
step's draws at once from an explicit key (:mod:`engine.kernels.step_draws`): the same draws, carried
in the TTS cache from the generator's key at the cache's first step (``TTSCache.draw_key``).
"""

from __future__ import annotations

import mlx.core as mx

from ..jit import materialize

# Guards both logarithms of the Gumbel transform against log(0) (engine.kernels.mixture_sample's kernel uses it too).
GUMBEL_EPS = 1e-8


def top_p_mask(logits: mx.array, top_p: float) -> mx.array:
    """Set to -inf every logit outside the nucleus of probability mass ``top_p``.

    Ranking components by probability, a component is kept while the mass of the
    strictly more probable ones is still below ``top_p`` (so the most probable one
    is always kept). ``top_p >= 1`` keeps everything.
    """
    if top_p >= 1.0:
        return logits
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = mx.softmax(logits.astype(mx.float32), axis=-1)
    order = mx.stop_gradient(mx.argsort(probs, axis=-1))  # ascending probability
    ranked = mx.take_along_axis(probs, order, axis=-1)
    mass_above = mx.cumsum(ranked, axis=-1, reverse=True, inclusive=False)
    keep_ranked = mass_above < top_p
    keep = mx.put_along_axis(mx.zeros_like(keep_ranked), order, keep_ranked, axis=-1)
    return mx.where(keep, logits, -float("inf"))


def draw_component(logits: mx.array, top_p: float, uniform: mx.array | None = None) -> mx.array:
    """Sample a mixture component per row of ``logits`` (..., K): top-p, then Gumbel-max.

    Draws one ``uniform(shape=logits.shape)``, unless ``uniform`` is that draw made already. Returns the
    component ids (...) as uint32.
    """
    nucleus = top_p_mask(logits, top_p)
    return gumbel_choice(nucleus, mx.random.uniform(shape=nucleus.shape) if uniform is None else uniform)


def gumbel_choice(nucleus: mx.array, uniform: mx.array) -> mx.array:
    """The component a Gumbel-max draw picks from masked logits ``nucleus``, given its ``uniform`` draw."""
    gumbel = -mx.log(-mx.log(uniform + GUMBEL_EPS) + GUMBEL_EPS)
    log_probs = mx.log(mx.softmax(nucleus.astype(mx.float32), axis=-1))
    return mx.argmax(log_probs + gumbel, axis=-1)


def guide(rows: mx.array, scale: float) -> mx.array:
    """Classifier-free guidance: the first half of ``rows`` (conditional) pushed away from the second
    (unconditional) by ``scale``, the product stored before it is added, as the reference rounds it."""
    half = rows.shape[0] // 2
    conditional, unconditional = rows[:half], rows[half:]
    return conditional + materialize(scale * (conditional - unconditional))


def draw_latent_noise(shape: tuple[int, ...]) -> mx.array:
    """Standard-normal float32 noise for the Gaussian latent sample."""
    return mx.random.normal(shape)


def gaussian_latent(mean: mx.array, log_std: mx.array, noise: mx.array, noise_scale: float) -> mx.array:
    """The latent drawn from a Gaussian of ``mean`` and ``log_std`` with standard-normal ``noise``, scaled
    (the noise term stored before it is added, as the reference rounds it)."""
    return mean + materialize(mx.exp(log_std) * noise * noise_scale)
