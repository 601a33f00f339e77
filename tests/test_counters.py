"""Counts that machine load cannot move: the graph census, its CI guard, and compiled-program exactness.

The guard holds each frame's MLX primitives to the figures docs/performance.md publishes (section
"Counters", row "this build", and fast numerics' row "fast numerics, this build"), within 2 %:
a change that makes frames do more work fails here, on any machine, however busy. Timings are
printed by ``parley bench``, never asserted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from app.bench import bench_input
from app.bench_counters import HOST_CALL_FRAMES, count_frames, counters_report, host_calls
from engine import kernels_standing_in, stand_in_kernels
from engine.counters import GraphCensus, WeightUse, named_weights, python_calls
from engine.jit import check_report
from engine.model import load_voicechat
from engine.pricing import full_size_prices, weight_bytes
from engine.random_model import random_voicechat
from engine.session import Session
from engine.warming import warm_up

PERFORMANCE_DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
TOLERANCE = 0.02
COUNT_FRAMES = 80  # frames 6-70 are the early window, 71-79 steady


def published_cells(label: str) -> list[str]:
    """The cells of docs/performance.md's one table row labelled ``**label**`` (the label's cell first)."""
    rows = [line for line in PERFORMANCE_DOC.read_text().splitlines() if line.startswith(f"| **{label}**")]
    assert len(rows) == 1, f"docs/performance.md must have exactly one row labelled **{label}**"
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def published_counters(label: str = "this build") -> dict[str, float]:
    """The counters row of docs/performance.md labelled ``label`` (exact mode's "this build", or "fast numerics,
    this build"), as numbers."""
    cells = published_cells(label)
    numbers = [float(value.replace(",", "")) for cell in cells[1:5] for value in re.findall(r"[\d,.]+", cell)]
    early, steady, kernels_early, kernels_steady = numbers[:4]
    return {"early": early, "steady": steady, "kernels_early": kernels_early, "kernels_steady": kernels_steady}


def structure_model_counts(numerics: str) -> dict:
    """``parley bench --counters``'s report for the structure model at 4 bits, with the Python calls a frame."""
    voicechat = random_voicechat("structure", quantize=4, numerics=numerics)
    mx.eval(voicechat.model.parameters())
    warm_up(voicechat)
    censuses, syncs = count_frames(voicechat, bench_input(COUNT_FRAMES), seed=0)
    report = counters_report(voicechat, censuses, syncs)
    report.update(host_calls(voicechat, bench_input(HOST_CALL_FRAMES[1] + 1), seed=0))
    return report


@pytest.fixture(scope="module")
def structure_counts() -> dict:
    return structure_model_counts("exact")


@pytest.fixture(scope="module")
def fast_structure_counts() -> dict:
    return structure_model_counts("fast")


@pytest.fixture(scope="module")
def cuda_path_counts() -> Iterator[dict]:
    """Fast numerics as a CUDA GPU runs it, counted on this CPU: every kernel standing in as one primitive."""
    with kernels_standing_in():
        yield structure_model_counts("fast")


def test_the_cuda_path_stays_within_the_published_figures(cuda_path_counts: dict) -> None:
    """The frame a GPU runs in fast numerics, guarded here: its primitives and kernels (each custom kernel one), the
    weight bytes it reads at full size, its Python calls and its one host sync against docs/performance.md's row
    "CUDA's fast path, this build". These are the counts the GPU's frame time follows."""
    counts = cuda_path_counts
    published = published_counters("CUDA's fast path, this build")
    assert_within_published(counts, published)
    cells = published_cells("CUDA's fast path, this build")
    four_bit_gb = float(cells[4].split("/")[0].replace("GB", "").strip())
    calls = float(cells[5].replace(",", ""))
    measured_gb = counts["weight_bytes_per_frame"]["4"] / 1e9
    print(f"reads {measured_gb:.2f} GB a full-size 4-bit frame; {counts['python_calls_per_frame']:,.0f} Python calls")
    assert measured_gb <= four_bit_gb + 0.005, f"a 4-bit frame reads {measured_gb:.3f} GB, the row says {four_bit_gb}"
    assert counts["python_calls_per_frame"] <= calls * (1 + TOLERANCE)
    assert counts["host_syncs_per_frame"] == pytest.approx(1.0)
    # Each network's kernels are there: the stand-ins are what the frame launches.
    assert counts["steady_by_primitive"]["CustomKernel"] >= 250
    for stage in ("perception", "rnnt", "language", "tts"):
        assert counts["per_stage"][stage]["steady_by_primitive"].get("CustomKernel", 0) >= 1, stage


def test_a_stand_in_kernel_gives_its_outputs_shapes_passes_unrun_and_leaves_no_part_behind() -> None:
    """A stand-in returns outputs of the asked shapes and dtypes (zeros, or its fill), is admitted without running,
    and the parts admitted while kernels stood in are not served after."""
    from engine.kernels.admission import StandInKernel, custom_kernel, fast_part, standing_in

    stand_in_kernels()
    try:
        kernel = custom_kernel(
            "cuda", "probe", ["x"], ["y", "n"], cuda="y[0] = x[0];", metal="", stand_in_fill={"n": 7}
        )
        assert isinstance(kernel, StandInKernel)
        x = mx.arange(4, dtype=mx.float32)
        y, n = kernel(
            inputs=[x * 2], output_shapes=[(2, 3), (1,)], output_dtypes=[mx.bfloat16, mx.int32], grid=(1, 1, 1)
        )
        assert y.shape == (2, 3) and y.dtype == mx.bfloat16 and n.item() == 7
        part, used = fast_part(("probe",), "probe", lambda v: v, lambda backend: kernel, lambda: (x,))
        assert part is kernel and used
    finally:
        stand_in_kernels(False)
    assert not standing_in()
    part, used = fast_part(("probe",), "probe", lambda v: v, lambda backend: kernel, lambda: (x,))
    assert part is not kernel and not used  # this CPU runs the fallback again


def test_fast_primitives_per_frame_stay_within_the_published_figures(fast_structure_counts: dict) -> None:
    """Fast numerics on the CPU (every part its operations fallback) against docs/performance.md's fast row: guards the
    fast wiring, as the GPU's counts cannot be taken here."""
    assert_within_published(fast_structure_counts, published_counters("fast numerics, this build"))


def published_python_calls() -> dict[str, float]:
    """docs/performance.md's row **Python calls a frame, this build**: exact's and fast's counts."""
    exact, fast = (float(cell.replace(",", "")) for cell in published_cells("Python calls a frame, this build")[1:3])
    return {"exact": exact, "fast": fast}


def test_python_calls_per_frame_stay_within_the_published_figures(
    structure_counts: dict, fast_structure_counts: dict
) -> None:
    """The host's work a frame as a count: a frame is bound by the host building its graph, so a change that makes
    Python do more each frame (a walk over the model's modules did: 58,000 calls a fast frame against 7,100) fails
    here however fast this machine happens to be."""
    published = published_python_calls()
    for mode, counts in (("exact", structure_counts), ("fast", fast_structure_counts)):
        calls = counts["python_calls_per_frame"]
        print(f"{mode}: {calls:,.0f} Python calls a frame; most: {counts['python_calls_by_function']}")
        assert calls <= published[mode] * (1 + TOLERANCE), (
            f"a {mode} frame makes {calls:,.0f} Python calls, docs/performance.md says {published[mode]:,.0f}: find "
            "what added host work (python_calls_by_function names it), or measure again and update that row"
        )


def test_python_calls_counts_functions_and_builtins_by_name() -> None:
    def inner(values: list[int]) -> int:
        return len(values)

    def outer() -> None:
        for _ in range(3):
            inner(sorted([2, 1]))

    calls = python_calls(outer)
    assert calls[f"{Path(__file__).stem}.test_python_calls_counts_functions_and_builtins_by_name.<locals>.inner"] == 3
    assert calls["sorted"] == 3 and calls["len"] == 3
    assert "setprofile" not in calls  # the counter's own call is not the step's


def assert_within_published(measured: dict, published: dict[str, float]) -> None:
    print(f"counted {measured['primitives_per_frame']} primitives, {measured['kernels_per_frame']} kernels per frame")
    for window in ("early", "steady"):
        primitives = measured["primitives_per_frame"][window]
        kernels = measured["kernels_per_frame"][window]
        assert primitives <= published[window] * (1 + TOLERANCE), (
            f"{window} frames evaluate {primitives:,.0f} primitives, docs/performance.md says "
            f"{published[window]:,.0f}: find what added work, or measure again and update the counters table in "
            "docs/performance.md"
        )
        assert kernels <= published[f"kernels_{window}"] * (1 + TOLERANCE)


def test_primitives_per_frame_stay_within_the_published_figures(structure_counts: dict) -> None:
    published = published_counters()
    measured = structure_counts
    assert_within_published(measured, published)
    # The encoder runs compiled from frame 1: the first 5.6 s of a conversation are no slower path.
    early, steady = (measured["primitives_per_frame"][window] for window in ("early", "steady"))
    assert abs(early - steady) <= 0.05 * steady
    assert measured["host_syncs_per_frame"] == pytest.approx(2.0)


def test_weight_bytes_per_full_size_frame(structure_counts: dict) -> None:
    """What a full-size frame reads, priced from the full config: the LLM's quantized weights and the float32
    copies of the dense networks (about 6 GB of them), at 4 and at 8 bits."""
    four, eight = (structure_counts["weight_bytes_per_frame"][bits] for bits in ("4", "8"))
    assert 11.0e9 < four < 12.5e9
    # 8-bit stores twice the packed bits: the LLM's share grows by its 4-bit packed size (~4.4 GB).
    assert 4.0e9 < eight - four < 5.0e9
    # Where they go, per network: the parts add up to the frame, and the LLM reads the most.
    for bits, total in structure_counts["weight_bytes_per_frame"].items():
        networks = structure_counts["weight_bytes_by_network"][bits]
        assert abs(sum(networks.values()) - total) <= len(networks)
        assert next(iter(networks)) == "stt_model.llm" and networks["stt_model.llm"] > 0.4 * total
        # And per weight, most first: each network's weights add up to its share.
        weights = structure_counts["weight_bytes_by_weight"][bits]
        assert list(weights.values()) == sorted(weights.values(), reverse=True)
        llm_weights = [read for name, read in weights.items() if name.startswith("stt_model.llm.")]
        assert abs(sum(llm_weights) - networks["stt_model.llm"]) <= len(llm_weights)
    assert "tts_model.audio_codec" in structure_counts["weight_bytes_by_network"]["4"]


def test_census_counts_each_primitive_once_and_resolves_weight_views() -> None:
    weight = mx.random.normal((4, 8))
    books = mx.random.normal((3, 5, 8))
    table = mx.random.normal((10, 8))
    mx.eval(weight, books, table)
    census = GraphCensus({"weight": weight, "books": books, "table": table})
    census.begin_frame(0)
    x = mx.random.normal((1, 8))
    mx.eval(x)
    hidden = x @ weight.T  # Transpose (view) + Matmul: one whole read
    scores = x @ books[1:2].reshape(5, 8).T  # Slice + Reshape + Transpose (views) + Matmul: one codebook of three
    row = table[mx.array([2])]  # Gather: one row
    census.count("perception", [hidden])
    census.count("perception", [hidden, scores])  # the nodes behind hidden are not counted twice
    census.count("rnnt", [row])
    frame = census.end_frame()
    perception = frame.stages["perception"]
    assert perception.by_primitive["Matmul"] == 2 and perception.kernels == 2
    assert perception.primitives == 6 and frame.stages["rnnt"].kernels == 1
    assert frame.weight_uses() == Counter(
        {WeightUse("weight", "whole"): 1, WeightUse("books", "slice"): 1, WeightUse("table", "row"): 1}
    )
    census.evaluated()
    mx.eval(hidden)


def test_full_size_prices_follow_the_full_config_and_the_runtime_dtypes() -> None:
    structure = random_voicechat("structure", quantize=4)
    prices = full_size_prices(structure.model, 4)
    # A 4-bit projection of the full LLM: 4480 -> 15680 (MLP up), packed 8 values per uint32, plus scales and biases.
    up = "stt_model.llm.layers.1.mixer.up_proj"
    packed = 15680 * 4480 // 8 * 4
    groups = 15680 * (4480 // 64)
    assert prices[f"{up}.weight"].nbytes == packed
    scale_size = dict(tree_flatten(structure.model.parameters()))[f"{up}.scales"].dtype.size
    assert prices[f"{up}.scales"].nbytes == prices[f"{up}.biases"].nbytes == groups * scale_size
    # The encoder is precast to float32: 4 bytes a weight at full size (1024 x 4096 feed-forward).
    assert prices["stt_model.perception.encoder.layers.0.feed_forward1.linear1.weight"].nbytes == 1024 * 4096 * 4
    uses = Counter({WeightUse(f"{up}.weight", "whole"): 2, WeightUse("tts_model.tts_model.rvq_embs", "slice"): 31})
    rvq = prices["tts_model.tts_model.rvq_embs"]
    assert rvq.leading == 31
    assert weight_bytes(uses, prices) == 2 * packed + rvq.nbytes


def test_gathered_tables_are_priced_by_the_row_whatever_reads_them() -> None:
    """Fast numerics' MoG draw reads one drawn component's rows of two tables inside a kernel (on the CPU its
    operations gather them): the census prices each read as one row of the table, at full size one of 1,024
    components, not as the whole table."""
    from engine.weight_names import GATHER_MARK

    structure = random_voicechat("structure", quantize=4, numerics="fast")
    mx.eval(structure.model.parameters())
    head = "tts_model.tts_model.mog_head"
    names = named_weights(structure.model)
    tables = [f"{head}.proj_mus.weight{GATHER_MARK}", f"{head}.low_mat{GATHER_MARK}"]
    assert all(name in names for name in tables)
    prices = full_size_prices(structure.model, 4)
    for table, parameter in zip(tables, (f"{head}.proj_mus.weight", f"{head}.low_mat"), strict=True):
        assert prices[table].nbytes == prices[parameter].nbytes and prices[table].leading == 1024
    # The RN-T attempts' first layer reads one token's embedding row (1,025 tokens at full size).
    embedding = f"stt_model.rnnt_decoder.prediction.embed.weight{GATHER_MARK}"
    assert embedding in names and prices[embedding].leading == 1025
    # Whatever primitive reads it: a kernel's input (here a view of the table, and the table itself).
    census = GraphCensus(names)
    census.begin_frame(0)
    mus = names[tables[0]]
    census.count("tts", [mus.reshape(mus.shape[0], -1, 8)[mx.array([3])].sum(), mx.abs(names[tables[1]])])
    uses = census.end_frame().weight_uses()
    assert uses == Counter({WeightUse(tables[0], "row"): 1, WeightUse(tables[1], "row"): 1})
    assert weight_bytes(uses, prices) == (prices[tables[0]].nbytes + prices[tables[1]].nbytes) // 1024


def test_named_weights_include_stacked_projections() -> None:
    voicechat = random_voicechat("tiny", quantize=4)
    names = named_weights(voicechat.model)
    stacked = [name for name in names if name.endswith(".stacked")]
    assert stacked, "the CPU stacks projections that share an input"
    prices = full_size_prices(voicechat.model, 4)
    for name in stacked:
        assert prices[name].nbytes > 0


def test_compiled_programs_equal_their_op_by_op_form(tiny_q4: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PARLEY_COMPILE=check runs each compiled program beside its op-by-op form: on this CPU every one is
    bit-identical. (On a GPU the same check finds fused multiply-adds; see docs/numerics.md, "Exact mode on the
    GPU".)"""
    monkeypatch.setenv("PARLEY_COMPILE", "check")
    voicechat = load_voicechat(tiny_q4)  # programs are built lazily, so these are checked ones
    session = Session(voicechat, seed=0)
    samples = bench_input(24)
    for start in range(0, samples.size, 1280):
        session.push(samples[start : start + 1280])
    checks = {check.name: check for check in check_report() if check.calls}
    assert len(checks) >= 10, sorted(checks)
    assert any("_refine_ops" in name for name in checks), "the random-drawing program is checked too"
    differing = [check for check in checks.values() if check.mismatches]
    assert not differing, differing


def test_materialize_keeps_values_and_splits_fusion() -> None:
    from engine.jit import materialize

    x, y, z = (mx.array(np.random.default_rng(seed).standard_normal(64).astype(np.float32)) for seed in range(3))

    def plain(a: mx.array, b: mx.array, c: mx.array) -> mx.array:
        return a * b + c

    def stored(a: mx.array, b: mx.array, c: mx.array) -> mx.array:
        return materialize(a * b) + c

    assert mx.array_equal(mx.compile(stored)(x, y, z), plain(x, y, z)).item()
    census = GraphCensus({})
    census.begin_frame(0)
    census.count("codec", [mx.compile(plain)(x, y, z)])
    census.count("tts", [mx.compile(stored)(x, y, z)])
    frame = census.end_frame()
    assert frame.stages["codec"].kernels == 1  # one fused kernel: a GPU would contract it to an FMA
    assert frame.stages["tts"].by_primitive["Multiply"] == 1 and frame.stages["tts"].by_primitive["Add"] == 1


def test_layer_norm_written_out_equals_mlx_mean_and_var() -> None:
    from engine.networks.codec import ChannelLayerNorm

    norm = ChannelLayerNorm(48)
    norm.weight = mx.array(np.random.default_rng(1).standard_normal(48).astype(np.float32)).astype(mx.bfloat16)
    norm.bias = mx.array(np.random.default_rng(2).standard_normal(48).astype(np.float32)).astype(mx.bfloat16)
    x = mx.array(np.random.default_rng(3).standard_normal((2, 7, 48)).astype(np.float32)).astype(mx.bfloat16)
    mean, variance = mx.mean(x, axis=-1, keepdims=True), mx.var(x, axis=-1, keepdims=True)
    reference = (x - mean) * mx.rsqrt(variance + norm.eps) * norm.weight + norm.bias
    assert mx.array_equal(norm(x), reference).item()
    assert isinstance(norm, nn.Module)
