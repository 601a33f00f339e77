"""engine.networks.linear: a transposed weight made once gives nn.Linear's bits with one primitive fewer per call."""

from __future__ import annotations

import io

import mlx.core as mx
import mlx.nn as nn

from engine.counters import GraphCensus, named_weights
from engine.networks.linear import TRANSPOSED, Linear, prepare_transposed_weights


def primitives(array: mx.array, *inputs: mx.array) -> list[str]:
    """The primitives of ``array``'s unevaluated graph (``inputs`` are named first and are not counted)."""
    buffer = io.StringIO()
    mx.export_to_dot(buffer, *inputs, array)
    return [line.split('label ="')[1].split('"')[0] for line in buffer.getvalue().splitlines() if 'label ="' in line]


def layer_pair(bias: bool) -> tuple[nn.Linear, Linear]:
    mx.random.seed(3)
    plain = nn.Linear(48, 40, bias=bias)
    ours = Linear(48, 40, bias=bias)
    ours.update(plain.parameters())
    mx.eval(plain.parameters(), ours.parameters())
    return plain, ours


def test_prepared_layer_gives_the_same_bits_without_a_transpose() -> None:
    x = mx.random.normal((1, 3, 48))
    mx.eval(x)
    for bias in (False, True):
        plain, ours = layer_pair(bias)
        assert "Transpose" in primitives(ours(x), x), "unprepared, it transposes per call like nn.Linear"
        assert prepare_transposed_weights(ours) == 1
        graph = primitives(ours(x), x)
        assert "Transpose" not in graph, graph
        for rows in (x, x.reshape(3, 48)):
            assert mx.array_equal(ours(rows), plain(rows)).item(), f"bias={bias}, shape {rows.shape}"


def test_a_replaced_weight_is_never_read_through_a_stale_view() -> None:
    plain, ours = layer_pair(bias=False)
    prepare_transposed_weights(ours)
    replaced = mx.random.normal(ours.weight.shape)
    ours.weight = replaced
    plain.weight = replaced
    x = mx.random.normal((2, 48))
    assert mx.array_equal(ours(x), plain(x)).item()
    assert ours.weight_views() == {}, "the stale view is not offered to the census either"
    prepare_transposed_weights(ours)
    assert "Transpose" not in primitives(ours(x), x) and mx.array_equal(ours(x), plain(x)).item()


def test_quantized_layers_are_left_alone_and_the_census_prices_the_view_as_its_weight() -> None:
    model = nn.Sequential(Linear(64, 64, bias=False), Linear(64, 64, bias=False))
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda path, _: path == "layers.1")
    mx.eval(model.parameters())
    assert prepare_transposed_weights(model) == 1, "only the dense layer has a transpose to prepare"
    named = named_weights(model)
    assert f"layers.0.{TRANSPOSED}" in named
    census = GraphCensus(named)
    census.begin_frame(0)
    census.count("stage", [model(mx.ones((1, 64)))])
    uses = census.end_frame().weight_uses()
    assert {(use.name, use.part) for use in uses} >= {("layers.0.weight", "whole")}
    assert not any(TRANSPOSED in use.name for use in uses), "a view is reported as the weight it reads"
