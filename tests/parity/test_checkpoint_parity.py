"""The generated checkpoints load in mlx-vlm 0.7.10 with its strict loader, to the very weights we load."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from engine.loading.checkpoint import read_runtime_weights
from tests.conftest import PARITY_CHECKPOINTS, parity_id
from tests.reference import load_reference

pytestmark = pytest.mark.parity


@pytest.mark.parametrize("params", PARITY_CHECKPOINTS, ids=parity_id)
def test_reference_strict_load_matches_our_runtime_weights(checkpoint_factory, params):
    root = checkpoint_factory(*params)
    model, processor = load_reference(root)  # mlx_vlm.load(..., strict=True) raises on any mismatch
    reference = dict(tree_flatten(model.parameters()))
    _, ours, quantized = read_runtime_weights(root)
    assert set(ours) == set(reference)
    for name, value in reference.items():
        assert ours[name].dtype == value.dtype, name
        assert mx.array_equal(ours[name], value).item(), name
    quantize = params[0]
    assert bool(quantized) == (quantize is not None)
    tokenizer = getattr(processor, "tokenizer", processor)
    vocab = tokenizer.get_vocab()
    assert sum(1 for token in vocab if len(token) == 1) == 256
