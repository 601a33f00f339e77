"""The worker reaches the engine only through its port: here the fake, so its own rules run in milliseconds.

With :class:`app.engine_port.FakeEngine` no model is loaded and no MLX runs: what is checked is the worker's part —
loading through the port, the speed check's conversation, one frame in N timed stage by stage (the profiler's
policy, passed through the port, not a switch the worker flips), a failing frame contained, a bad folder reported.
"""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest

from app.audio_port import AudioPort
from app.engine_port import EnginePort, FakeEngine, FakeModel, MLXEngine
from app.messages import AppState, EngineInfo, EngineState, Failure, FrameStats, ModelLoaded, SpeedCheck
from app.worker import EngineWorker, Load, NewConversation, SetKeepUp, StartConversation
from engine.events import AssistantTextDelta
from tests.fakes import ScriptedAudio


class Harness:
    """An EngineWorker over a FakeEngine and a scripted microphone that is always talking."""

    def __init__(self, engine: FakeEngine, *, exact_every: int = 3, speed_check: bool = True) -> None:
        self.messages: queue.Queue[object] = queue.Queue()
        streams = ScriptedAudio()
        streams.talking = True
        self.engine = engine
        self.worker = EngineWorker(
            emit=self.messages.put_nowait,
            audio=AudioPort(streams),
            exact_every=exact_every,
            speed_check=speed_check,
            engine=engine,
        )
        self.seen: list[object] = []

    def until(self, kind: type, count: int = 1) -> list[object]:
        """Messages up to the ``count``-th of ``kind`` (all kept in ``seen``)."""
        got: list[object] = []
        while len([m for m in got if isinstance(m, kind)]) < count:
            message = self.messages.get(timeout=30)
            got.append(message)
            self.seen.append(message)
        return got


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(engine: FakeEngine, **options: object) -> Harness:
        made.append(Harness(engine, **options))  # type: ignore[arg-type]
        made[-1].worker.start()
        return made[-1]

    yield make
    for one in made:
        one.worker.stop()


def test_the_worker_loads_checks_speed_and_times_one_frame_in_n_through_its_port(harness, tmp_path: Path) -> None:
    engine = FakeEngine(frame_ms=20.0, word_every=4)
    run = harness(engine, exact_every=3)
    run.worker.submit(Load(tmp_path, system_prompt="Be brief."))
    loaded = run.until(ModelLoaded)
    assert engine.loads == [tmp_path] and engine.warm_ups == 1
    assert engine.warmed_prompts == ["Be brief."]  # the conversations' prompt, so its prefill is traced at load
    assert any(isinstance(m, EngineInfo) and m.device == "cpu: fake engine" for m in run.seen)
    speed = next(m for m in loaded if isinstance(m, SpeedCheck))
    assert speed.realtime_factor == pytest.approx(20.0 / 80.0) and "keeps up easily" in speed.verdict
    # The speed check ran a conversation of its own, with the checkpoint's default prompt and no stage timing.
    check = engine.conversations[0]
    assert check.closed and check.system_prompt is None and check.stage_timing_every == 0

    run.worker.submit(StartConversation())
    stats = [m for m in run.until(FrameStats, 9) if isinstance(m, FrameStats)]
    conversation = engine.conversations[-1]
    assert conversation.system_prompt == "Be brief." and conversation.stage_timing_every == 3
    assert [s.timing.timing_mode for s in stats] == ["device", "host", "host"] * 3
    assert all(s.exact_every == 3 for s in stats)
    words = [m for m in run.seen if isinstance(m, AssistantTextDelta)]
    assert [w.frame_index for w in words] == [3, 7]


def test_a_failing_frame_is_reported_and_a_new_conversation_recovers(harness, tmp_path: Path) -> None:
    engine = FakeEngine()
    run = harness(engine, speed_check=False)
    run.worker.submit(Load(tmp_path))
    run.until(ModelLoaded)
    run.worker.submit(StartConversation())
    run.until(FrameStats, 2)
    engine.fail_next_push = RuntimeError("boom")
    failure = next(m for m in run.until(Failure) if isinstance(m, Failure))
    assert "boom" in failure.message and "Traceback" in failure.details
    assert engine.conversations[-1].closed
    run.worker.submit(NewConversation())  # a new conversation waits for the talk key, as after a load
    run.worker.submit(StartConversation())
    frames = [m for m in run.until(FrameStats, 2) if isinstance(m, FrameStats)]
    assert [f.timing.frame_index for f in frames] == [0, 1], "a fresh conversation, from its first frame"


def test_a_folder_that_is_not_a_checkpoint_is_reported_and_nothing_is_loaded(harness, tmp_path: Path) -> None:
    engine = FakeEngine()
    run = harness(engine)
    run.worker.submit(Load(tmp_path / "missing"))
    failure = next(m for m in run.until(Failure) if isinstance(m, Failure))
    assert "no checkpoint folder" in failure.message
    states = [m for m in run.until(EngineState) if isinstance(m, EngineState)]
    assert states[-1].state is AppState.NO_MODEL and engine.loads == [] and engine.conversations == []


def test_both_engines_are_ports_and_the_real_one_refuses_a_model_it_did_not_load(tmp_path: Path) -> None:
    ports: list[EnginePort] = [MLXEngine(), FakeEngine()]
    assert all(callable(port.start_conversation) for port in ports)
    with pytest.raises(TypeError, match="FakeModel"):
        MLXEngine().start_conversation(FakeModel(tmp_path), system_prompt=None, max_seconds=None)
    with pytest.raises(ValueError, match="exact, fast"):
        FakeEngine().check_numerics("quick")
    partial = FakeEngine().start_conversation(FakeModel(tmp_path), system_prompt=None, max_seconds=None)
    assert partial.push(np.zeros(100, np.float32), 16_000) == [], "less than a frame completes none"


def run_frames(run: Harness, count: int) -> list[FrameStats]:
    return [m for m in run.until(FrameStats, count) if isinstance(m, FrameStats)]


def test_keeping_up_spends_less_while_frames_are_slow_and_comes_back_once_they_are_quick(
    harness, tmp_path: Path
) -> None:
    engine = FakeEngine(frame_ms=100.0)
    run = harness(engine, speed_check=False)
    run.worker.submit(SetKeepUp(True))
    run.worker.submit(Load(tmp_path, numerics="fast"))
    run.until(ModelLoaded)
    run.worker.submit(StartConversation())
    slow = run_frames(run, 8)
    conversation = engine.conversations[-1]
    # Set after frame 0 (100 ms: behind) for frame 1 on; no further by default (guidance stays).
    assert conversation.economy_levels == [(1, 1)]
    assert [s.economy_level for s in slow] == [1] * 8  # the level the next frame runs at
    engine.frame_ms = 30.0  # the machine catches up
    quick = run_frames(run, 80)
    assert [level for _, level in conversation.economy_levels] == [1, 0]
    back = [s.timing.frame_index for s in quick if s.economy_level == 0]
    assert back and all(s.economy_level == 0 for s in quick if s.timing.frame_index >= back[0])

    run.worker.submit(SetKeepUp(False))  # off again: nothing more changes, however slow
    run_frames(run, 3)  # the command is taken between two frames
    before = list(conversation.economy_levels)
    engine.frame_ms = 150.0
    assert all(s.economy_level == 0 for s in run_frames(run, 8))
    assert conversation.economy_levels == before


def test_keeping_up_never_touches_exact_numerics_nor_a_user_who_did_not_opt_in(harness, tmp_path: Path) -> None:
    engine = FakeEngine(frame_ms=120.0)
    run = harness(engine, speed_check=False)
    run.worker.submit(SetKeepUp(True))
    run.worker.submit(Load(tmp_path, numerics="exact"))
    run.until(ModelLoaded)
    run.worker.submit(StartConversation())
    assert all(s.economy_level == 0 for s in run_frames(run, 10))
    assert engine.conversations[-1].economy_levels == []

    opted_out = FakeEngine(frame_ms=120.0)
    run = harness(opted_out, speed_check=False)
    run.worker.submit(Load(tmp_path, numerics="fast"))
    run.until(ModelLoaded)
    run.worker.submit(StartConversation())
    assert all(s.economy_level == 0 for s in run_frames(run, 10))
    assert opted_out.conversations[-1].economy_levels == []
    with pytest.raises(ValueError, match="exact numerics never"):
        FakeEngine().start_conversation(FakeModel(tmp_path), system_prompt=None, max_seconds=None).set_economy(1)
