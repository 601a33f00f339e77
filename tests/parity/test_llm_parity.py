"""Parity of :class:`engine.networks.llm.NemotronH` with the reference ``model.stt_model.llm`` (mlx-vlm 0.7.10).

Both models are loaded from the same tiny seeded checkpoint and driven with the same
input embeddings and their own caches. Hidden states must be bit-identical at every
call (max-abs 0.0), with the same dtype, and the reference heads must pick the same
text and function tokens from both. The sequences cover what the session feeds:
bf16 system-prompt embeddings (the bf16 repo's ``embed_tokens`` rows) followed by
float32 audio-frame inputs, long enough for the attention caches to cross the
256-slot growth; float32 from the first step; and multi-token calls (including one
longer than the 256-position scan chunk and ones that grow a cache mid-block).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.networks.llm import LLMCache, MambaCache, NemotronH
from engine.ops.cache import KVCache
from tests.conftest import PARITY_CHECKPOINTS, CheckpointFactory, parity_id
from tests.reference import load_reference

pytestmark = pytest.mark.parity

# A segment is (input dtype, positions per call, number of calls).
Segment = tuple[mx.Dtype, int, int]
BF16, F32 = mx.bfloat16, mx.float32

SCENARIOS: dict[str, list[Segment]] = {
    # The bf16-repo session: 12 prompt steps, then audio frames past the 256-slot growth.
    "bf16-prompt-then-f32-steps": [(BF16, 1, 12), (F32, 1, 284)],
    # Quantized repos (f32 embeddings) and sessions without a prompt.
    "f32-steps": [(F32, 1, 40)],
    # Multi-token calls from an f32 start: a 300-position block spans two scan chunks and
    # grows the KV buffer from an offset that is not a multiple of 256.
    "f32-multi-token": [(F32, 5, 1), (F32, 1, 2), (F32, 300, 1), (F32, 1, 1), (F32, 17, 1), (F32, 1, 1)],
    # The prompt as one bf16 block, then f32 blocks and steps: a 256-position block at offset 19
    # grows the bf16 buffer (cut to 19) to an f32 one of 275 slots; the next step grows it again.
    "bf16-prompt-block-then-mixed": [(BF16, 12, 1), (F32, 1, 3), (F32, 4, 1), (F32, 256, 1), (F32, 1, 10)],
}

PROMPT_IDS = [1, *range(100, 110), 2]  # BOS, ten ids, EOS


def _load_ours(path: Path) -> NemotronH:
    files, weights, quantized = read_runtime_weights(path)
    model = NemotronH(files.config.text_config)
    load_into(model, weights, quantized, prefix="stt_model.llm.")
    return model


def _reference_cache_arrays(caches: Sequence[Any]) -> list[mx.array]:
    arrays: list[mx.array] = []
    for cache in caches:
        if hasattr(cache, "keys"):
            arrays += [a for a in (cache.keys, cache.values) if a is not None]
        else:
            arrays += [a for a in cache.cache if a is not None]
    return arrays


class _Inputs:
    """Seeded input embeddings: prompt rows of ``embed_tokens`` (as bf16) or fused f32 frame inputs."""

    def __init__(self, reference: Any, seed: int) -> None:
        self.embed = reference.stt_model.embed_tokens
        self.width = int(reference.stt_model.llm.norm_f.weight.shape[0])
        self.vocab = int(reference.stt_model.lm_head.weight.shape[0])
        self.rng = np.random.default_rng(seed)
        self.prompt_position = 0

    def make(self, dtype: mx.Dtype, length: int) -> mx.array:
        if dtype == BF16:
            ids = [PROMPT_IDS[(self.prompt_position + i) % len(PROMPT_IDS)] for i in range(length)]
            self.prompt_position += length
            # The bf16 repo's rows are bf16 already; the quantized repos' f32 rows are rounded
            # so that every checkpoint exercises the bf16 prefill path.
            return self.embed(mx.array([ids])).astype(BF16)
        # E[text] + audio + 2·E[function], the LLM input of an audio frame (float32).
        text = mx.array(self.rng.integers(0, self.vocab, size=(1, length)))
        function = mx.array(self.rng.integers(0, self.vocab, size=(1, length)))
        audio = mx.array(self.rng.standard_normal((1, length, self.width)).astype(np.float32) * 0.5)
        fused = (self.embed(text) + audio) + 2.0 * self.embed(function)
        assert fused.dtype == F32
        return fused


def _compare_caches(ours: LLMCache, reference_caches: Sequence[Any]) -> None:
    stateful = [layer for layer in ours.layers if layer is not None]
    assert len(stateful) == len(reference_caches)
    for mine, theirs in zip(stateful, reference_caches, strict=True):
        if isinstance(mine, KVCache):
            assert mine.offset == theirs.offset
            assert mine.keys is not None and mine.values is not None
            assert mine.keys.dtype == theirs.keys.dtype and mine.keys.shape == theirs.keys.shape
            assert mine.values.dtype == theirs.values.dtype
            assert mx.array_equal(mine.keys[..., : mine.offset, :], theirs.keys[..., : theirs.offset, :]).item()
            assert mx.array_equal(mine.values[..., : mine.offset, :], theirs.values[..., : theirs.offset, :]).item()
        else:
            assert isinstance(mine, MambaCache)
            for own_state, reference_state in ((mine.conv_state, theirs[0]), (mine.ssm_state, theirs[1])):
                assert own_state is not None
                assert own_state.dtype == reference_state.dtype and own_state.shape == reference_state.shape
                assert mx.array_equal(own_state, reference_state).item()


@pytest.mark.parametrize("checkpoint", PARITY_CHECKPOINTS, ids=parity_id)
def test_llm_matches_reference(checkpoint_factory: CheckpointFactory, checkpoint: tuple[int | None, int]) -> None:
    quantize, seed = checkpoint
    path = checkpoint_factory(quantize, seed)
    reference, _ = load_reference(path)
    reference_llm = reference.stt_model.llm
    heads = (reference.stt_model.lm_head, reference.stt_model.function_head)
    ours = _load_ours(path)

    for name, segments in SCENARIOS.items():
        inputs = _Inputs(reference, seed=seed * 100 + len(name))
        own_cache = ours.make_cache()
        reference_cache = reference.stt_model.make_cache()
        worst, calls, positions = 0.0, 0, 0
        for dtype, length, repeats in segments:
            for _ in range(repeats):
                x = inputs.make(dtype, length)
                expected = reference_llm(inputs_embeds=x, cache=reference_cache)
                got = ours(x, own_cache)
                mx.eval(expected, got, own_cache.arrays(), _reference_cache_arrays(reference_cache))
                assert got.dtype == expected.dtype and got.shape == expected.shape == x.shape
                difference = mx.abs(got.astype(F32) - expected.astype(F32)).max().item()
                assert difference == 0.0, f"{name}, call {calls} ({dtype}, L={length}): max-abs {difference}"
                worst = max(worst, difference)
                for head in heads:
                    assert np.array_equal(np.array(mx.argmax(head(got), -1)), np.array(mx.argmax(head(expected), -1)))
                calls += 1
                positions += length
        assert own_cache.position == positions
        _compare_caches(own_cache, reference_cache)
        print(f"llm parity {parity_id(checkpoint)} {name}: {calls} calls, {positions} positions, max-abs {worst}")


@pytest.mark.parametrize("checkpoint", PARITY_CHECKPOINTS, ids=parity_id)
def test_llm_without_cache_matches_reference(
    checkpoint_factory: CheckpointFactory, checkpoint: tuple[int | None, int]
) -> None:
    """A whole sequence in one uncached call (zero conv/SSM start, plain causal mask)."""
    quantize, seed = checkpoint
    path = checkpoint_factory(quantize, seed)
    reference, _ = load_reference(path)
    ours = _load_ours(path)
    inputs = _Inputs(reference, seed=seed)
    for dtype, length in ((BF16, 12), (F32, 40), (F32, 1)):
        x = inputs.make(dtype, length)
        expected = reference.stt_model.llm(inputs_embeds=x)
        got = ours(x)
        assert got.dtype == expected.dtype and got.shape == x.shape
        worst = mx.abs(got.astype(F32) - expected.astype(F32)).max().item()
        print(f"llm parity {parity_id(checkpoint)} no-cache {dtype} L={length}: max-abs {worst}")
        assert worst == 0.0
