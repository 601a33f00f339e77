"""Conversation history in the app core: kept when a conversation ends and at quit, never dropped silently.

The real controller and engine worker on a tiny checkpoint, with the scripted audio device of
tests/test_controller.py; the history folder is a temporary one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from app.controller import AppController
from app.history import ConversationHistory, ConversationRecord, LoadedConversation, TranscriptLine
from app.history_keeping import replay_mix
from app.messages import ConversationStarted, Failure, FrameStats, HistorySaved, ModelLoaded, ReplayProgress
from app.settings import Settings
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, OUTPUT_FRAME_SAMPLES, OUTPUT_SAMPLE_RATE
from tests.fakes import ScriptedAudio
from tests.test_controller import frame_count, q4, wait_for


class ReplayingAudio(ScriptedAudio):
    """ScriptedAudio that also takes replays (as AudioIO does, minus the speaker)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.replays: list[tuple[np.ndarray, int]] = []
        self.replay_position: tuple[float, float] | None = None

    def start_replay(self, samples: np.ndarray, rate: int) -> float:
        self.replays.append((samples, rate))
        self.replay_position = (0.0, len(samples) / rate)
        return len(samples) / rate

    def stop_replay(self) -> None:
        self.replay_position = None


@pytest.fixture
def make(build_controller: Callable[..., AppController]) -> Callable[..., AppController]:
    """Controllers whose speaker replays, with a history folder."""
    return functools.partial(build_controller, audio=ReplayingAudio)


def talk(controller: AppController, frames: int, *, loaded: bool = False) -> list[object]:
    """Hold the talk key for ``frames`` frames (once the model has loaded), then let go."""
    if not loaded:
        wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    controller.set_talking(True)
    seen = wait_for(controller, lambda seen: frame_count(seen) >= frames)
    controller.set_talking(False)
    return seen


def test_a_conversation_is_kept_when_it_ends_with_its_transcript_audio_and_profile(make, tiny_q4: Path) -> None:
    controller = make(q4(tiny_q4))
    controller.start()
    talk(controller, 20)
    said = [(entry.role, entry.text) for entry in controller.transcript.entries]
    heard, spoken = controller.recording.snapshot()
    assert not controller.conversation_at_risk(), "saving is on: nothing to ask about"
    controller.new_conversation()
    controller.start_conversation()  # a new conversation waits for the talk key
    messages = wait_for(
        controller,
        lambda seen: (
            any(isinstance(m, HistorySaved) for m in seen) and any(isinstance(m, ConversationStarted) for m in seen)
        ),
    )
    saved = next(m for m in messages if isinstance(m, HistorySaved))
    listing = controller.history_entries()
    assert [entry.id for entry in listing.entries] == [saved.entry_id] and listing.damaged == []
    loaded = controller.load_history(saved.entry_id)
    # Everything up to the new conversation (a few more frames ran after the key was let go), in whole frames.
    assert len(loaded.user_audio) >= len(heard) >= 20 * INPUT_FRAME_SAMPLES
    assert len(loaded.user_audio) % INPUT_FRAME_SAMPLES == 0
    assert len(loaded.assistant_audio) >= len(spoken) and len(loaded.assistant_audio) % OUTPUT_FRAME_SAMPLES == 0
    np.testing.assert_allclose(loaded.user_audio[: len(heard)], heard, atol=1 / 32768)  # 16-bit WAV
    np.testing.assert_allclose(loaded.assistant_audio[: len(spoken)], spoken, atol=1 / 32768)
    kept = [(line.role, line.text) for line in loaded.transcript]
    assert len(kept) >= len(said) and all(
        role == said_role and text.startswith(said_text)
        for (role, text), (said_role, said_text) in zip(kept, said, strict=False)
    )
    profile = loaded.profile
    assert profile is not None
    (conversation,) = profile["conversations"]
    assert conversation["conversation"] == 1 and conversation["frames"] >= 20
    assert conversation["numerics"] == "exact" and conversation["model"]["quantization"] == "4-bit"
    assert "· 4-bit" in (loaded.entry.model or "") and loaded.entry.numerics == "exact", "told apart"
    assert any(isinstance(m, ConversationStarted) and m.number == 2 for m in messages)


def test_the_last_conversation_is_kept_at_quit(make, tiny_q4: Path, tmp_path: Path) -> None:
    controller = make(q4(tiny_q4))
    controller.start()
    talk(controller, 8)
    heard, _ = controller.recording.snapshot()
    controller.shutdown()  # Quit, in the middle of the conversation
    (entry,) = ConversationHistory(tmp_path / "history").entries().entries
    assert entry.duration_s >= len(heard) / INPUT_SAMPLE_RATE - 0.1
    assert "Kept the conversation" in (tmp_path / "logs" / "parley.log").read_text()


def test_with_saving_off_nothing_is_kept_and_the_window_must_ask(make, tiny_q4: Path, tmp_path: Path) -> None:
    controller = make(q4(tiny_q4, history=False))
    controller.start()
    wait_for(controller, lambda seen: any(isinstance(m, ModelLoaded) for m in seen))
    assert not controller.conversation_at_risk(), "nothing said yet: nothing to lose"
    talk(controller, 6, loaded=True)
    assert controller.conversation_at_risk()
    assert controller.save_conversation(tmp_path / "by hand")
    assert not controller.conversation_at_risk(), "saved by hand"
    controller.new_conversation()
    controller.start_conversation()  # a new conversation waits for the talk key
    wait_for(controller, lambda seen: frame_count(seen) >= 4)
    assert controller.conversation_at_risk(), "the new conversation is not saved anywhere"
    controller.apply_settings(controller.settings.with_changes(history=True))
    assert not controller.conversation_at_risk(), "saving turned on: it will be kept when it ends"
    controller.apply_settings(controller.settings.with_changes(history=False))
    controller.shutdown()
    assert not (tmp_path / "history").exists() or not any((tmp_path / "history").iterdir())


def test_a_failed_save_is_reported_and_later_conversations_are_asked_about(make, tiny_q4: Path, tmp_path: Path) -> None:
    (tmp_path / "history").write_text("a file where the history folder should be")
    controller = make(q4(tiny_q4))
    controller.start()
    talk(controller, 6)
    controller.new_conversation()
    controller.start_conversation()  # a new conversation waits for the talk key
    messages = wait_for(controller, lambda seen: any(isinstance(m, Failure) for m in seen))
    failure = next(m for m in messages if isinstance(m, Failure))
    assert str(tmp_path / "history") in failure.message and "Save Conversation" in failure.message
    wait_for(controller, lambda seen: frame_count(seen) >= 3)  # the next conversation runs (it heard silence)
    assert controller.conversation_at_risk(), "saving does not work: dropping it needs the user's word"
    (tmp_path / "history").unlink()  # fixed: the next save works, and then nothing is at risk
    controller.new_conversation()
    wait_for(controller, lambda seen: any(isinstance(m, HistorySaved) for m in seen))
    assert not controller.conversation_at_risk()


def test_a_damaged_entry_is_listed_apart_and_the_others_stay_readable(make, tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path / "history")
    for words in ("first", "second", "third"):
        record = ConversationRecord(
            datetime.now(UTC),
            [TranscriptLine("user", 0.0, words)],
            np.zeros(1600, np.float32),
            np.zeros(2205, np.float32),
        )
        history.save(record)
        time.sleep(1.05)  # entries are named by the second they started
    middle = history.entries().entries[1]
    (middle.path / "user.wav").write_bytes(b"RIFF")  # truncated
    controller = make(Settings())
    listing = controller.history_entries()
    assert [entry.first_words for entry in listing.entries] == ["third", "first"]
    (damaged,) = listing.damaged
    assert damaged.id == middle.id and "user.wav" in damaged.reason
    for entry in listing.entries:
        assert controller.load_history(entry.id).transcript[0].text == entry.first_words


def test_replay_plays_both_sides_as_they_happened(make, tmp_path: Path) -> None:
    user = (0.25 * np.sin(2 * np.pi * 200 * np.arange(INPUT_SAMPLE_RATE) / INPUT_SAMPLE_RATE)).astype(np.float32)
    assistant = np.zeros(OUTPUT_SAMPLE_RATE * 2, np.float32)
    assistant[OUTPUT_SAMPLE_RATE:] = 0.5  # the assistant answers after the user's second
    history = ConversationHistory(tmp_path / "history")
    entry = history.save(ConversationRecord(datetime.now(UTC), [], user, assistant))
    assert entry is not None
    controller = make(Settings())
    controller.start()
    duration = controller.replay_history(entry.id)
    assert duration == pytest.approx(2.0)
    ((samples, rate),) = controller.audio.replays
    assert rate == OUTPUT_SAMPLE_RATE and len(samples) == len(assistant)
    first, second = samples[:OUTPUT_SAMPLE_RATE], samples[OUTPUT_SAMPLE_RATE:]
    assert np.abs(first).max() == pytest.approx(0.25, abs=0.01), "the user's side, resampled"
    assert np.abs(second - 0.5).max() < 0.01, "then the assistant's"
    progress = [
        m
        for m in wait_for(controller, lambda seen: any(isinstance(m, ReplayProgress) for m in seen))
        if isinstance(m, ReplayProgress)
    ]
    assert progress[0].entry_id == entry.id and progress[0].duration_s == pytest.approx(2.0)
    controller.stop_replay()
    assert any(isinstance(m, ReplayProgress) and m.entry_id is None for m in controller.poll())


def test_replay_mix_puts_both_sides_on_one_timeline() -> None:
    user = np.full(INPUT_SAMPLE_RATE // 2, 0.1, np.float32)
    assistant = np.full(OUTPUT_SAMPLE_RATE, 0.95, np.float32)
    from app.history import HistoryEntry

    entry = HistoryEntry("x", Path("x"), datetime.now(UTC), 1.0, "", 0, False)
    loaded = LoadedConversation(entry, [], user, INPUT_SAMPLE_RATE, assistant, OUTPUT_SAMPLE_RATE, None)
    mixed = replay_mix(loaded, OUTPUT_SAMPLE_RATE)
    assert len(mixed) == OUTPUT_SAMPLE_RATE
    middle = mixed[1000 : OUTPUT_SAMPLE_RATE // 2 - 1000]
    assert np.allclose(middle, 1.0, atol=1e-3), "summed, then clipped to full scale"
    assert np.allclose(mixed[OUTPUT_SAMPLE_RATE // 2 + 1000 :], 0.95, atol=1e-3)


def test_replay_without_a_speaker_says_so(make, tmp_path: Path) -> None:
    from app.audio.devices import NO_SPEAKER, AudioUnavailable

    def no_audio(*args: object, **kwargs: object) -> ReplayingAudio:
        raise AudioUnavailable(NO_SPEAKER)

    history = ConversationHistory(tmp_path / "history")
    entry = history.save(ConversationRecord(datetime.now(UTC), [], np.zeros(160, np.float32), np.zeros(0, np.float32)))
    assert entry is not None
    controller = make(Settings(), audio_factory=no_audio)  # the history folder above is the controller's
    controller.start()
    with pytest.raises(RuntimeError, match="no speaker"):
        controller.replay_history(entry.id)
    controller.shutdown()
    assert not any(isinstance(m, FrameStats) for m in controller.poll())
