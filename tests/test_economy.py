"""Fast mode's TTS economy levels (``Session.set_economy``): what exact mode refuses, what a level keeps of the full
step (the backbone's state, the random stream), and what it saves, counted by the graph census (never timed)."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from app.bench import bench_input
from engine import FrameProfiler, GraphCensus, Session, kernels_standing_in, named_weights
from engine.counters import StageCensus, WeightUse
from engine.networks.tts import ECONOMY_LEVELS, TTSInput
from engine.pricing import full_size_prices, weight_bytes
from engine.random_model import random_voicechat
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE
from engine.warming import warm_up

FRAMES = 14
TTS = "tts_model.tts_model."
# Weights a MaskGIT round reads once per MoG sample it draws (level 0 draws five, levels 1 and 2 two), on the CPU's
# graph.
PER_SAMPLE = (
    f"{TTS}embed_code.weight",
    f"{TTS}mog_head.proj_logits.weight",
    f"{TTS}mog_head.proj_else.weight",
    f"{TTS}mog_head.proj_logs.weight",
)


@pytest.fixture(scope="module")
def fast_tiny() -> object:
    voicechat = random_voicechat("tiny", quantize=4, numerics="fast")
    mx.eval(voicechat.model.parameters())
    warm_up(voicechat)
    return voicechat


def run(voicechat: object, schedule: dict[int, int], frames: int = FRAMES, hooks: object = None) -> Session:
    """A session through ``frames`` frames of the test question, the level set before each frame ``schedule`` names;
    returns it open, with ``codes`` (frames, 31) attached."""
    session = Session(voicechat, seed=0) if hooks is None else Session(voicechat, seed=0, hooks=hooks)  # type: ignore[arg-type]
    samples = bench_input(frames)
    codes = []
    for index in range(frames):
        if index in schedule:
            session.set_economy(schedule[index])
        session.push(samples[index * INPUT_FRAME_SAMPLES : (index + 1) * INPUT_FRAME_SAMPLES], INPUT_SAMPLE_RATE)
        codes.append(np.array(session.caches.previous_code).reshape(-1))
    session.codes = np.stack(codes)  # type: ignore[attr-defined]
    return session


def test_exact_numerics_refuses_any_economy(tiny_q4: object) -> None:
    from engine.model import load_voicechat

    voicechat = load_voicechat(tiny_q4, numerics="exact")  # type: ignore[arg-type]
    session = Session(voicechat, seed=0)
    session.set_economy(0)  # the full step is what exact runs anyway
    with pytest.raises(ValueError, match="exact numerics never"):
        session.set_economy(1)
    assert session.economy == 0
    # Nor can the TTS state be set behind the session's back.
    tts = voicechat.model.tts_model.tts_model
    session.caches.tts.economy = 2
    step = TTSInput(session.caches.previous_code, mx.array([[0]]), voicechat.characters)
    with pytest.raises(ValueError, match="exact numerics never"):
        tts.step(session.caches.tts, step)


def test_levels_outside_the_table_are_refused(fast_tiny: object) -> None:
    session = Session(fast_tiny, seed=0)  # type: ignore[arg-type]
    for level in (-1, 3, 1.5):
        with pytest.raises(ValueError, match="economy level must be one of"):
            session.set_economy(level)  # type: ignore[arg-type]
    assert ECONOMY_LEVELS == (0, 1, 2) and session.economy == 0


@pytest.mark.parametrize("level", [1, 2])
def test_a_level_changes_the_voice_but_keeps_the_full_steps_state_and_random_stream(
    fast_tiny: object, level: int
) -> None:
    full = run(fast_tiny, {})
    economised = run(fast_tiny, {4: level, 10: 0})
    assert np.array_equal(full.codes[:4], economised.codes[:4])  # type: ignore[attr-defined]
    assert not np.array_equal(full.codes[4:10], economised.codes[4:10]), "the level changed nothing"  # type: ignore[attr-defined]
    codebook = fast_tiny.config.tts_config.codebook_size  # type: ignore[attr-defined]
    spent_less = economised.codes[4:10]  # type: ignore[attr-defined]
    assert spent_less.min() >= 0 and spent_less.max() < codebook  # real codes, no mask code left
    # The backbone ran both rows every frame: its caches hold the same positions; the draws of the skipped rounds
    # were made all the same: the random key is the full step's, so back at 0 the draws are the full step's.
    assert economised.caches.tts.offset == full.caches.tts.offset
    assert full.caches.tts.draw_key is not None
    assert np.array_equal(np.array(economised.caches.tts.draw_key), np.array(full.caches.tts.draw_key))
    assert economised.economy == 0


def tts_census(voicechat: object, level: int) -> StageCensus:
    """The TTS stage of the last of a few frames at ``level``."""
    profiler = FrameProfiler(census=GraphCensus(named_weights(voicechat.model)))  # type: ignore[attr-defined]
    run(voicechat, {0: level}, frames=6, hooks=profiler)
    assert profiler.last_census is not None
    return profiler.last_census.stages["tts"]


def test_the_census_counts_what_each_level_saves(fast_tiny: object) -> None:
    full, fewer, unguided = (tts_census(fast_tiny, level) for level in (0, 1, 2))
    print(
        "TTS stage per frame (CPU, tiny): primitives / kernels",
        [(census.primitives, census.kernels) for census in (full, fewer, unguided)],
    )
    # Two MoG samples of five: each per-sample weight is read three times less (embed_code also embeds the previous
    # frame's codes, once); every other weight as often as before.
    for name in PER_SAMPLE:
        use = WeightUse(name, "whole")
        assert full.weight_uses[use] - fewer.weight_uses[use] == 3, name
    # Without guidance the head's draw takes its operations (its kernel is built for the guided pair of rows), which
    # read the three projections stacked: still two samples.
    embed = WeightUse(f"{TTS}embed_code.weight", "whole")
    assert unguided.weight_uses[embed] == fewer.weight_uses[embed]
    others = Counter({use: n for use, n in full.weight_uses.items() if use.name not in PER_SAMPLE})
    fewer_others = Counter({use: n for use, n in fewer.weight_uses.items() if use.name not in PER_SAMPLE})
    mixture_tables = {use for use in others if "[]" in use.name}  # the drawn component's rows: one gather a sample
    assert {use: n for use, n in fewer_others.items() if use not in mixture_tables} == {
        use: n for use, n in others.items() if use not in mixture_tables
    }
    # The counts docs/numerics.md gives ("Keeping up"), on this device's graph.
    assert (full.primitives - fewer.primitives, full.kernels - fewer.kernels) == (237, 204)
    assert (full.primitives - unguided.primitives, full.kernels - unguided.kernels) == (257, 216)


def test_on_a_gpus_graph_level_one_launches_fewer_kernels_and_reads_fewer_bytes() -> None:
    """The same levels as a CUDA GPU's frame has them (kernels standing in, engine.stand_in_kernels): level 1 drops
    three MaskGIT rounds' MoG samples, so fewer launches and fewer bytes; level 2 leaves the draw's kernel (built for
    the guided pair of rows) for its operations, so more launches: why the policy stops at level 1."""
    with kernels_standing_in():
        voicechat = random_voicechat("tiny", quantize=4, numerics="fast")
        mx.eval(voicechat.model.parameters())
        warm_up(voicechat)
        prices = full_size_prices(voicechat.model, 4)  # type: ignore[attr-defined]
        full, fewer, unguided = (tts_census(voicechat, level) for level in (0, 1, 2))
    read = [weight_bytes(census.weight_uses, prices) for census in (full, fewer, unguided)]
    print("TTS stage per frame (CUDA's graph, tiny): kernels", [c.kernels for c in (full, fewer, unguided)], read)
    assert full.by_primitive["CustomKernel"] > fewer.by_primitive["CustomKernel"] > 0
    assert fewer.kernels < full.kernels < unguided.kernels
    assert read[1] < 0.9 * read[0]  # level 1 reads at least a tenth less of the TTS stage's weights
