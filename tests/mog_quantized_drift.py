"""Measure what quantizing the MoG head's MLP would cost (the fast-mode bytes decision; docs/numerics.md).

The MLP's three layers (47.8 M weights, 96 MB in bf16) are read by each of a frame's five MaskGIT rounds: 0.48 GB
of a 4-bit frame's weight bytes. Quantizing them to 8 bits (affine, groups of 64, as the published LLM) would read
0.25 GB. This script measures what that does to the head's draw, on the full-size head with the random checkpoint's
seeded weights (``engine.loading.random_checkpoint``) and unit-normal hidden rows, the same uniform draw for both:

    .venv/bin/python tests/mog_quantized_drift.py [--bits 8] [--rows 200] [--size full]

It prints the relative L2 of the MLP's output and of the drawn component's mean and log std, and how many draws
take the same component. CPU only (about a minute); the arithmetic is the operations', not a kernel's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from engine.kernels.admission import relative_l2
from engine.loading.config import VoiceChatConfig
from engine.loading.layout import checkpoint_tensors
from engine.loading.random_checkpoint import GROUP_SIZE, Size, _WeightFactory, base_config, build_tokenizer
from engine.networks.tts import MixtureHead
from engine.ops.sampling import draw_component, guide

HEAD_PREFIX = "mog_head."


def head_weights(seed: int, size: Size = "full") -> tuple[VoiceChatConfig, dict[str, mx.array]]:
    """The random checkpoint's MoG head tensors (bf16, as stored), named as the head's parameters."""
    config = VoiceChatConfig.from_dict(base_config(size))
    factory = _WeightFactory(config, build_tokenizer(config.text_config.vocab_size, seed=seed), seed)
    weights = {}
    for spec in checkpoint_tensors(config):
        if HEAD_PREFIX in spec.source_name:
            name = spec.source_name.split(HEAD_PREFIX, 1)[1]
            weights[name] = factory.value(spec).astype(mx.bfloat16).reshape(spec.shape)
    return config, weights


def make_head(config: VoiceChatConfig, weights: dict[str, mx.array]) -> MixtureHead:
    tts = config.tts_config
    head = MixtureHead(tts.hidden_size, tts.latent_size, tts.mog_head)
    head.load_weights(list(weights.items()))
    mx.eval(head.parameters())
    return head


def quantized_copy(weights: dict[str, mx.array], bits: int) -> dict[str, mx.array]:
    """The MLP projections rounded through ``bits``-bit affine quantization (what a quantized kernel would read)."""
    rounded = {}
    for name, value in weights.items():
        if ".mlp." in name:
            packed, scales, biases = mx.quantize(value, group_size=GROUP_SIZE, bits=bits)
            value = mx.dequantize(packed, scales, biases, group_size=GROUP_SIZE, bits=bits).astype(value.dtype)
        rounded[name] = value
    return rounded


def mlp_output(head: MixtureHead, x: mx.array) -> mx.array:
    *layers, final_norm = head.mlp_stack
    for layer in layers:
        x = layer(x)
    return final_norm(x)


@dataclass(frozen=True)
class QuantizedDrift:
    """What rounding the MLP through quantization did to the head's draws (relative L2 are medians)."""

    bits: int
    draws: int
    features_l2: float
    features_l2_max: float
    same_component: int
    mean_l2: float
    log_std_l2: float

    def summary(self, seed: int) -> str:
        return (
            f"MoG MLP at {self.bits} bits (groups of {GROUP_SIZE}) against bf16, {self.draws} draws, seed {seed}: "
            f"guided features relative L2 median {self.features_l2:.2e} (max {self.features_l2_max:.2e}); "
            f"same component {self.same_component}/{self.draws}; mean relative L2 median {self.mean_l2:.2e}; "
            f"log std relative L2 median {self.log_std_l2:.2e}"
        )


def measure(bits: int, draws: int, seed: int, size: Size = "full") -> QuantizedDrift:
    """The stored head against its MLP rounded through ``bits``-bit quantization, on ``draws`` pairs of unit-normal
    hidden rows (a conditional and an unconditional one) with the same uniform draw for both."""
    config, weights = head_weights(seed, size)
    heads = (make_head(config, weights), make_head(config, quantized_copy(weights, bits)))
    tts = config.tts_config
    mx.random.seed(seed)
    features_l2, mean_l2, std_l2, same = [], [], [], 0
    for _ in range(draws):
        x = mx.random.normal((2, tts.hidden_size))
        uniform = mx.random.uniform(shape=(1, tts.mog_head.num_predictions))
        features = [guide(mlp_output(head, x), tts.guidance_scale) for head in heads]
        features_l2.append(relative_l2(*features))
        components = [
            draw_component(head.proj_logits(row), tts.top_p, uniform) for head, row in zip(heads, features, strict=True)
        ]
        same += int(components[0].item() == components[1].item())
        (mean_a, std_a), (mean_b, std_b) = (
            head.sample_gaussian(x, tts.guidance_scale, tts.top_p, uniform) for head in heads
        )
        mean_l2.append(relative_l2(mean_a, mean_b))
        std_l2.append(relative_l2(std_a, std_b))
    return QuantizedDrift(
        bits,
        draws,
        float(np.median(features_l2)),
        max(features_l2),
        same,
        float(np.median(mean_l2)),
        float(np.median(std_l2)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", type=int, default=8, choices=(4, 8))
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", default="full", choices=("tiny", "structure", "full"))
    args = parser.parse_args()
    print(measure(args.bits, args.rows, args.seed, args.size).summary(args.seed))


if __name__ == "__main__":
    main()
