"""Issue 51's core flows with the real app core on tiny checkpoints and a scripted audio device.

Switching is checked before anything is unloaded (a wrong folder, or a checkpoint of another variant
than its slot, leaves the loaded model and the settings as they were; a launch falls back and says
so); Stop and the idle pause put the timeline to sleep (counted in frames since the USER spoke, so a
model that talks without a break sleeps too); a model switch, New Conversation and a numerics switch
all end the conversation and wait for the talk key; random checkpoints are marked where they are made
and treated like the demo; a reply delay is only measured when the assistant had fallen silent.

Names added by the issue are imported inside the tests, so each test fails on its own on the old code.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from app.messages import (
    AppState,
    ConversationStarted,
    ConversationTime,
    Failure,
    FrameStats,
    ModelLoaded,
    NumericsChanged,
    SpeedCheck,
    StateChanged,
    TurnLatency,
)
from app.settings import Settings
from engine.events import AssistantTextDelta, AudioChunk
from engine.timeline import FRAME_SECONDS
from tests.realtime import frame_count
from tests.test_controller import wait_for

IDLE_DELAY_S = 5.0  # the shortest idle pause the settings allow


@pytest.fixture
def make_controller(build_controller):
    """Controllers over a ScriptedAudio microphone and speaker, with no history folder of their own."""
    return functools.partial(build_controller, history=False)


def loaded_models(messages: list[object]) -> list[ModelLoaded]:
    return [m for m in messages if isinstance(m, ModelLoaded)]


def states(messages: list[object]) -> list[StateChanged]:
    return [m for m in messages if isinstance(m, StateChanged)]


def settle(controller, seconds: float = 0.6) -> list[object]:
    """Everything reported within ``seconds`` (for asserting that nothing more happens)."""
    until = time.monotonic() + seconds
    return wait_for(controller, lambda _: time.monotonic() > until)


# --------------------------------------------------------------------------- 1, 2: switching is checked first


def test_a_folder_that_is_not_a_checkpoint_is_refused_before_the_loaded_model_goes(
    make_controller, tiny_q4, tiny_q8, tmp_path
):
    empty = tmp_path / "emptydir"
    empty.mkdir()
    settings = Settings(checkpoints={"4bit": tiny_q4, "8bit": tiny_q8, "bf16": empty}, active_variant="8bit")
    controller = make_controller(settings)
    controller.start()
    wait_for(controller, lambda seen: loaded_models(seen))
    saved = (tmp_path / "settings.json").read_text() if (tmp_path / "settings.json").exists() else None

    controller.switch_variant("bf16")
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    messages += settle(controller)
    (failure,) = [m for m in messages if isinstance(m, Failure)]
    assert "config.json is missing" in failure.message and "\n" not in failure.message
    assert failure.message.count(str(empty)) == 1, f"the path once: {failure.message}"
    assert failure.message.endswith("checkpoint. tiny-q8-s0 (8-bit) stays loaded.")
    assert all(s.state is not AppState.LOADING for s in states(messages)), "nothing was unloaded"
    status = controller.status
    assert status.state is AppState.READY and status.model is not None and status.model.variant.key == "8bit"
    assert controller.settings.active_variant == "8bit"
    after = (tmp_path / "settings.json").read_text() if (tmp_path / "settings.json").exists() else None
    assert after == saved, "the persisted settings are unchanged"

    # Through Settings (Save) the same check refuses it, and nothing is applied.
    from app.model_check import CheckpointRefused

    try:
        controller.apply_settings(controller.settings.with_changes(active_variant="bf16"))
    except CheckpointRefused as exc:
        assert "bf16 folder cannot be used" in str(exc)
    else:
        raise AssertionError("apply_settings took a folder that is not a checkpoint")
    assert controller.settings.active_variant == "8bit"
    assert not [m for m in settle(controller, 0.3) if isinstance(m, ModelLoaded)]


def test_a_checkpoint_in_the_wrong_slot_is_named_and_refused_not_filed_elsewhere(make_controller, tiny_q4, tiny_q8):
    controller = make_controller(Settings(checkpoints={"4bit": tiny_q4, "bf16": tiny_q8}, active_variant="4bit"))
    controller.start()
    wait_for(controller, lambda seen: loaded_models(seen))
    controller.switch_variant("bf16")
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    messages += settle(controller)
    (failure,) = [m for m in messages if isinstance(m, Failure)]
    assert "holds the 8-bit checkpoint, not bf16" in failure.message
    assert not loaded_models(messages), "the 8-bit checkpoint did not load as if it were bf16"
    assert controller.status.model is not None and controller.status.model.variant.key == "4bit"
    assert controller.settings.active_variant == "4bit"


def test_a_load_that_fails_after_its_checks_brings_the_previous_model_back(
    make_controller, tiny_q4, tiny_q8, monkeypatch
):
    import engine

    controller = make_controller(Settings(checkpoints={"4bit": tiny_q4, "8bit": tiny_q8}, active_variant="4bit"))
    controller.start()
    wait_for(controller, lambda seen: loaded_models(seen))
    real = engine.load_voicechat  # the facade, through which the worker's engine port loads

    def out_of_memory(path, **options):
        if Path(path) == tiny_q8:
            raise MemoryError("out of memory while loading the weights")
        return real(path, **options)

    monkeypatch.setattr(engine, "load_voicechat", out_of_memory)
    controller.switch_variant("8bit")  # the folder passes its checks; loading it fails (memory, say)
    messages = wait_for(controller, lambda seen: loaded_models(seen))
    from app.messages import ModelFallback

    (fallback,) = [m for m in messages if isinstance(m, ModelFallback)]
    assert "out of memory" in fallback.message and "loads again" in fallback.message
    assert loaded_models(messages)[-1].path == tiny_q4
    assert controller.status.model is not None and controller.status.model.variant.key == "4bit"
    assert controller.settings.active_variant == "4bit", "the setting follows the model that came back"


def test_a_relaunch_with_a_bad_active_folder_falls_back_to_a_working_model_and_says_so(
    make_controller, tiny_q4, tmp_path
):
    empty = tmp_path / "emptydir"
    empty.mkdir()
    settings = Settings(checkpoints={"4bit": tiny_q4, "bf16": empty}, active_variant="bf16", idle_pause=False)
    controller = make_controller(settings)
    controller.start()
    messages = wait_for(controller, lambda seen: loaded_models(seen))
    from app.messages import ModelFallback

    (fallback,) = [m for m in messages if isinstance(m, ModelFallback)]
    assert str(empty) in fallback.message and "4-bit model loads instead" in fallback.message
    assert loaded_models(messages)[-1].variant.key == "4bit"
    assert controller.settings.active_variant == "bf16", "the user's choice stays; only this launch falls back"


# --------------------------------------------------------------------------- 3: Stop, and the idle sleep


def test_stop_puts_the_conversation_to_sleep_and_nothing_unspoken_reaches_the_transcript(make_controller, tiny_q4):
    controller = make_controller(Settings(checkpoints={"4bit": tiny_q4}, active_variant="4bit", idle_pause=False))
    controller.start()
    controller.start_conversation()
    wait_for(controller, lambda seen: frame_count(seen) >= 6)
    controller.stop_speaking()
    said = [(e.role, e.text) for e in controller.transcript.entries]
    messages = wait_for(controller, lambda seen: any(s.state is AppState.PAUSED for s in states(seen)))
    asleep = next(s for s in states(messages) if s.state is AppState.PAUSED)
    assert asleep.conversation and "Stopped" in asleep.detail
    stopped_at = max(i for i, m in enumerate(messages) if isinstance(m, StateChanged) and m.state is AppState.PAUSED)
    from_frames = (AssistantTextDelta, AudioChunk, FrameStats)
    assert not [m for m in messages[: stopped_at + 1] if isinstance(m, from_frames)], "frames after Stop: dropped"
    assert [(e.role, e.text) for e in controller.transcript.entries] == said, "no text after Stop was pressed"

    settle(controller, 0.3)  # the clock's last report, where it stopped
    reads = len(controller.audio.frames_read)
    later = settle(controller)
    assert len(controller.audio.frames_read) == reads, "no frame runs after Stop"
    assert not [m for m in later if isinstance(m, (*from_frames, ConversationTime))], "the clock stands still"
    assert not controller.audio.capturing

    controller.set_talking(True)  # the talk key wakes it
    wait_for(controller, lambda seen: frame_count(seen) >= 2)


def test_the_idle_sleep_counts_frames_since_the_user_spoke_not_the_assistant(make_controller, tiny_q4):
    settings = Settings(
        checkpoints={"4bit": tiny_q4}, active_variant="4bit", idle_pause=True, idle_pause_delay_s=IDLE_DELAY_S
    )
    controller = make_controller(settings)
    controller.start()
    controller.start_conversation()
    controller.set_talking(True)
    wait_for(controller, lambda seen: sum(1 for talking, _ in controller.audio.frames_read if talking) >= 4)
    controller.set_talking(False)
    messages = wait_for(controller, lambda seen: any(s.state is AppState.PAUSED for s in states(seen)), timeout=180.0)
    asleep = next(s for s in states(messages) if s.state is AppState.PAUSED)
    assert asleep.conversation and f"Nobody has spoken for {IDLE_DELAY_S:.0f} s" in asleep.detail
    reads = [talking for talking, _ in controller.audio.frames_read]
    last_talking = max(i for i, talking in enumerate(reads) if talking)
    quiet = len(reads) - 1 - last_talking
    needed = math.ceil(IDLE_DELAY_S / FRAME_SECONDS)  # 63 frames of 80 ms
    assert needed <= quiet <= needed + 1, f"asleep after {quiet} frames without the user, expected {needed}"
    # The assistant went on producing text in those frames (random weights): it does not keep the timeline awake.
    assert [m for m in messages if isinstance(m, AssistantTextDelta)], "the test needs a talking assistant"
    read = len(controller.audio.frames_read)
    settle(controller)
    assert len(controller.audio.frames_read) == read and not controller.audio.capturing


# --------------------------------------------------------------------------- 6: every switch waits for the key


def test_new_conversation_numerics_and_model_switches_all_clear_and_wait_for_the_key(make_controller, tiny_q4, tiny_q8):
    settings = Settings(checkpoints={"4bit": tiny_q4, "8bit": tiny_q8}, active_variant="4bit", idle_pause=False)
    controller = make_controller(settings)
    controller.start()

    def talk_then(switch, done) -> list[object]:
        controller.start_conversation()
        wait_for(controller, lambda seen: frame_count(seen) >= 3)
        switch()

        # Until the old conversation is over (the new code), or another started at once (the old code's way).
        def over(seen: list[object]) -> bool:
            return not controller.status.conversation or any(isinstance(m, ConversationStarted) for m in seen)

        messages = wait_for(controller, lambda seen: done(seen) and over(seen))
        messages += settle(controller, 1.0)
        assert not [m for m in messages if isinstance(m, ConversationStarted)], "the next conversation waits"
        reads = len(controller.audio.frames_read)
        settle(controller, 0.3)
        assert len(controller.audio.frames_read) == reads, "no frame runs until the talk key"
        assert not controller.status.conversation and "talk key" in controller.status.detail
        assert controller.transcript.entries == [] and controller.recording.empty
        return messages

    seen = talk_then(controller.new_conversation, lambda seen: True)
    seen += talk_then(
        lambda: controller.apply_settings(controller.settings.with_changes(numerics="fast")),
        lambda seen: any(isinstance(m, NumericsChanged) for m in seen),
    )
    seen += talk_then(lambda: controller.switch_variant("8bit"), lambda seen: loaded_models(seen))
    assert controller.status.model is not None and controller.status.model.variant.key == "8bit"
    from app.messages import ConversationCleared  # what tells the window to drop the old conversation

    assert sum(isinstance(m, ConversationCleared) for m in seen) >= 3


# --------------------------------------------------------------------------- 8: random checkpoints


def test_a_made_checkpoint_is_marked_random_and_treated_like_the_demo(make_controller, tiny_q4):
    from app.worker import DEMO_OUTPUT_GAIN

    controller = make_controller(Settings(checkpoints={"4bit": tiny_q4}, active_variant="4bit", idle_pause=False))
    controller.start()
    messages = wait_for(controller, lambda seen: loaded_models(seen))
    controller.start_conversation()
    wait_for(controller, lambda seen: frame_count(seen) >= 12)
    played = np.concatenate(controller.audio.played)
    assert np.abs(played).max() > 0, "it plays"
    assert np.abs(played).max() <= DEMO_OUTPUT_GAIN * 1.01, "at the demo's level (26 dB down)"
    (check,) = [m for m in messages if isinstance(m, SpeedCheck)]
    assert "keeps up" not in check.verdict and "noise, not speech" in check.verdict
    (model,) = loaded_models(messages)
    assert model.variant.key == "4bit" and "noise, not speech" in model.description and model.noise
    from engine.loading.random_checkpoint import RANDOM_WEIGHTS_KEY  # the marker, where the checkpoint was made

    assert RANDOM_WEIGHTS_KEY in json.loads((tiny_q4 / "config.json").read_text())


# --------------------------------------------------------------------------- 13: the reply delay


def test_a_reply_delay_is_only_measured_when_the_assistant_had_fallen_silent(make_controller):
    controller = make_controller(Settings(idle_pause=False))
    controller._open_audio()
    audio = controller.audio

    def turn(audible_at_release: bool) -> list[TurnLatency]:
        audio.last_audible = time.monotonic() if audible_at_release else 0.0
        controller.set_talking(True)
        controller.set_talking(False)
        audio.latencies.append(0.04)  # the speaker's first audible block after the release
        return [m for m in controller.poll() if isinstance(m, TurnLatency)]

    assert turn(audible_at_release=True) == [], "still heard at release (a noise model never stops): no reply"
    (latency,) = turn(audible_at_release=False)
    assert latency.latency_s == 0.04 and latency.turns == 1


def test_the_random_marker_keeps_the_published_layout_loadable(tiny_q8: Path):
    from engine.loading.checkpoint import open_checkpoint, verify_layout

    files = open_checkpoint(tiny_q8)
    assert {bits for _, bits in verify_layout(files).values()} == {8}
