"""The app core's new modes: numerics (exact / fast, switched in place, advised after the speed check),
the talk key in other apps (its events reach the window's thread as messages), and hands-free (the echo
canceller handed to the streams, the state it shows).

The real controller and worker on tiny checkpoints with the scripted audio of tests/test_controller.py;
the global key's system listener is the injected ``FakeBackend`` of tests/test_hotkey.py, and, in the last
test, the real pynput listener on a private X server.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from app import controller as controller_module
from app.controller import AppController
from app.echo import EchoCanceller
from app.messages import (
    AppState,
    ConversationStarted,
    Failure,
    GlobalTalk,
    HistorySaved,
    ModelLoaded,
    Notice,
    NumericsAdvice,
    NumericsChanged,
    SpeedCheck,
    StateChanged,
)
from app.settings import Settings
from app.speed_check import numerics_advice
from app.status import HANDS_FREE
from app.worker import EngineWorker
from tests.fakes import ScriptedAudio
from tests.test_controller import frame_count, q4, wait_for
from tests.test_hotkey import FakeBackend


class EchoAwareAudio(ScriptedAudio):
    """ScriptedAudio that also takes an echo canceller, as AudioIO does."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.cancellers: list[EchoCanceller | None] = []

    def set_echo_canceller(self, canceller: EchoCanceller | None) -> None:
        self.cancellers.append(canceller)


@pytest.fixture
def make(build_controller: Callable[..., AppController]) -> Callable[..., AppController]:
    """Controllers whose audio takes an echo canceller, with a history folder."""
    return functools.partial(build_controller, audio=EchoAwareAudio)


def loaded(messages: list[object]) -> bool:
    return any(isinstance(m, ModelLoaded) for m in messages)


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize(
    ("exact", "fast", "advised"),
    [
        (1.30, 0.80, True),  # exact falls behind, fast keeps up: say so
        (1.30, 1.05, False),  # both fall behind: fast would not help
        (0.90, 0.70, False),  # exact keeps up: nothing to advise
        (1.30, 1.40, False),  # fast is slower here
        (1.00, 0.80, False),  # exactly real time keeps up
    ],
)
def test_fast_numerics_are_advised_only_when_exact_falls_behind_and_fast_keeps_up(
    exact: float, fast: float, advised: bool
) -> None:
    advice = numerics_advice(exact, fast)
    assert (advice is not None) == advised
    if advice is not None:
        assert f"{exact * 80:.0f} ms" in advice and f"{fast * 80:.0f} ms" in advice and "last digits" in advice


def test_the_speed_check_measures_fast_numerics_then_puts_exact_back(
    make, tiny_q4: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[str] = []

    def timed(self: EngineWorker, voicechat: object) -> float:  # this machine: exact 104 ms, fast 64 ms a frame
        measured.append(voicechat.numerics)  # type: ignore[attr-defined]
        return {"exact": 1.3, "fast": 0.8}[voicechat.numerics]  # type: ignore[attr-defined]

    monkeypatch.setattr(EngineWorker, "_measure_speed", timed)
    controller = make(q4(tiny_q4))
    controller.start()
    messages = wait_for(controller, loaded)
    assert measured == ["exact", "fast"]
    assert [m.realtime_factor for m in messages if isinstance(m, SpeedCheck)] == [1.3]
    (advice,) = [m for m in messages if isinstance(m, NumericsAdvice)]
    assert (advice.exact_rtf, advice.fast_rtf) == (1.3, 0.8)
    model = next(m for m in messages if isinstance(m, ModelLoaded))
    assert model.checkpoint["numerics"] == "exact", "measured, then put back: the user decides"
    assert controller.worker._voicechat is not None and controller.worker._voicechat.numerics == "exact"
    assert controller.settings.numerics == "exact"


def test_no_advice_when_fast_would_not_keep_up_either(make, tiny_q4: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EngineWorker, "_measure_speed", lambda self, vc: {"exact": 1.5, "fast": 1.2}[vc.numerics])
    controller = make(q4(tiny_q4))
    controller.start()
    messages = wait_for(controller, loaded)
    assert not [m for m in messages if isinstance(m, NumericsAdvice)]
    assert controller.worker._voicechat is not None and controller.worker._voicechat.numerics == "exact"


def test_a_model_loads_with_the_numerics_chosen(make, tiny_q4: Path) -> None:
    controller = make(q4(tiny_q4, numerics="fast"))
    controller.start()
    messages = wait_for(controller, loaded)
    model = next(m for m in messages if isinstance(m, ModelLoaded))
    assert model.checkpoint["numerics"] == "fast" and "fused_mamba_step" in model.checkpoint["fast_changes"]
    assert controller.diagnostics()["Numerics"] == "fast"


def test_switching_numerics_is_in_place_starts_over_and_is_recorded(make, tiny_q4: Path, tmp_path: Path) -> None:
    controller = make(q4(tiny_q4))
    controller.start()
    wait_for(controller, loaded)
    controller.set_talking(True)
    wait_for(controller, lambda seen: frame_count(seen) >= 6)
    controller.set_talking(False)
    voicechat = controller.worker._voicechat

    controller.apply_settings(controller.settings.with_changes(numerics="fast"))
    messages = wait_for(controller, lambda seen: any(isinstance(m, NumericsChanged) for m in seen))
    controller.set_talking(True)  # like a model switch, the next conversation waits for the talk key
    controller.set_talking(False)
    messages += wait_for(
        controller, lambda seen: any(isinstance(m, ConversationStarted) and m.number == 2 for m in seen)
    )
    messages += wait_for(controller, lambda seen: frame_count(seen) >= 4)
    (changed,) = [m for m in messages if isinstance(m, NumericsChanged)]
    assert changed.numerics == "fast"
    assert not [m for m in messages if isinstance(m, ModelLoaded)], "no reload"
    assert AppState.LOADING not in [m.state for m in messages if isinstance(m, StateChanged)]
    assert controller.worker._voicechat is voicechat and voicechat is not None and voicechat.numerics == "fast"
    started = next(m for m in messages if isinstance(m, ConversationStarted))
    assert started.model.checkpoint["numerics"] == "fast"
    assert json.loads((tmp_path / "settings.json").read_text())["numerics"] == "fast", "kept for the next launch"

    paths = controller.export_profile(tmp_path / "profile.json")
    profile = json.loads(paths[0].read_text())
    numerics = [c["numerics"] for c in profile["conversations"]]
    assert numerics == ["exact", "fast"], "each conversation says how it was computed"
    kept = next(m for m in messages if isinstance(m, HistorySaved))  # conversation 1, as it ran
    entry = controller.load_history(kept.entry_id)
    assert entry.profile is not None and entry.profile["conversations"][0]["numerics"] == "exact"
    assert "Numerics switched to fast" in (tmp_path / "logs" / "parley.log").read_text()


# --------------------------------------------------------------------------- the talk key in other apps


def test_the_global_key_reaches_the_window_thread_as_messages(make) -> None:
    backend = FakeBackend()
    controller = make(Settings(global_talk_key_enabled=True, global_talk_key="F8"), hotkey_backend=lambda: backend)
    controller.start()
    assert controller.global_key_active
    listener = threading.Thread(target=lambda: (backend.press("f8"), backend.release("f8")))  # the system's thread
    listener.start()
    listener.join()
    messages = wait_for(controller, lambda seen: sum(isinstance(m, GlobalTalk) for m in seen) >= 2)
    assert [m.start for m in messages if isinstance(m, GlobalTalk)] == [True, False]
    backend.press("space")  # not the talk key
    assert not [m for m in controller.poll() if isinstance(m, GlobalTalk)]

    controller.apply_settings(controller.settings.with_changes(hands_free=True))  # hands-free: each press toggles
    backend.press("f8")
    backend.release("f8")
    backend.press("f8")
    messages = wait_for(controller, lambda seen: sum(isinstance(m, GlobalTalk) for m in seen) >= 2)
    assert [m.start for m in messages if isinstance(m, GlobalTalk)] == [True, False]

    controller.apply_settings(controller.settings.with_changes(global_talk_key_enabled=False))
    assert backend.stops == 1 and not controller.global_key_active


def test_an_unusable_global_key_is_said_in_words_and_the_window_key_stays(make) -> None:
    controller = make(Settings(global_talk_key_enabled=True, global_talk_key="a"), hotkey_backend=FakeBackend)
    controller.start()
    failure = next(m for m in controller.poll() if isinstance(m, Failure))
    assert "types text" in failure.message and not controller.global_key_active

    wayland = FakeBackend(unavailable="A global talk key is not available under Wayland: …")
    other = make(Settings(global_talk_key_enabled=True), hotkey_backend=lambda: wayland)
    other.start()
    notice = next(m for m in other.poll() if isinstance(m, Notice))
    assert "Wayland" in notice.message and "still works in Parley's window" in notice.message


@pytest.mark.gui
def test_the_global_key_works_through_the_app_on_x11(make, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from tests.test_hotkey import private_x_server

    with private_x_server() as display:
        monkeypatch.setenv("DISPLAY", display)
        monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
        monkeypatch.setenv("XDG_SESSION_TYPE", "x11")
        controller = make(Settings(global_talk_key_enabled=True, global_talk_key="ctrl+f9"))
        controller.start()  # the real pynput listener
        assert controller.global_key_active
        from pynput.keyboard import Controller, Key  # the X server exists now

        keyboard = Controller()  # XTest: as from the hardware, into no window of Parley's
        try:
            keyboard.press(Key.ctrl)
            keyboard.press(Key.f9)
            messages = wait_for(controller, lambda seen: any(isinstance(m, GlobalTalk) for m in seen), timeout=10)
            keyboard.release(Key.f9)
            keyboard.release(Key.ctrl)
            messages += wait_for(
                controller, lambda seen: any(isinstance(m, GlobalTalk) and not m.start for m in seen), timeout=10
            )
        finally:
            controller.apply_settings(controller.settings.with_changes(global_talk_key_enabled=False))
            keyboard.press(Key.shift)  # pynput's X11 listener ends at the next key event
            keyboard.release(Key.shift)
            del keyboard
            gc.collect()
        # Keys pressed right after the listener starts are now and then delivered twice (tests/test_hotkey.py):
        # each copy is a whole start and stop.
        starts = [m.start for m in messages if isinstance(m, GlobalTalk)]
        assert starts[:2] == [True, False] and starts == [True, False] * (len(starts) // 2), starts


# --------------------------------------------------------------------------- hands-free


def test_hands_free_hands_the_streams_a_canceller_and_the_state_says_so(make, tiny_q4: Path) -> None:
    controller = make(q4(tiny_q4, hands_free=True))
    controller.start()
    wait_for(controller, loaded)
    (canceller,) = controller.audio.cancellers
    assert isinstance(canceller, EchoCanceller)
    controller.set_talking(True)  # the microphone opens
    messages = wait_for(controller, lambda seen: frame_count(seen) >= 3)
    status = [m for m in messages if isinstance(m, StateChanged)][-1]
    assert status.state in (AppState.LISTENING, AppState.SPEAKING) and status.detail == HANDS_FREE
    assert controller.diagnostics()["Hands-free"].startswith("on:")
    stats = [m for m in messages if getattr(m, "echo", None) is not None]
    assert stats, "frame stats carry the canceller's figures in hands-free"
    # The scripted streams never run the canceller, so drive it here: 0.5 s of microphone while the speaker
    # plays, then 0.5 s with nothing played. The overlay's share must be what the canceller measured: half.
    canceller.feed_playback(np.full(22_050, 0.1, np.float32), rate=22_050, dac_time=100.0)
    canceller.clean_capture(np.zeros(8_000, np.float32), adc_time=100.2)
    canceller.clean_capture(np.zeros(8_000, np.float32), adc_time=102.0)
    assert (canceller.stats.blocks, canceller.stats.reference_blocks) == (100, 50)
    echoed = wait_for(controller, lambda seen: any(getattr(m, "echo", None) is not None for m in seen))
    summary = [m for m in echoed if getattr(m, "echo", None) is not None][-1].echo  # type: ignore[attr-defined]
    assert summary.reference_share == pytest.approx(0.5) and summary.cost_ms_per_frame > 0.0

    controller.apply_settings(controller.settings.with_changes(hands_free=False))
    assert controller.audio.cancellers == [canceller, None]
    controller.poll()
    assert controller.status.detail != HANDS_FREE


def test_hands_free_without_echo_cancellation_falls_back_to_push_to_talk(make, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "Echo cancellation is not available on this computer (no wheel). Use headphones or push-to-talk."
    monkeypatch.setattr(controller_module, "echo_cancellation_unavailable", lambda: reason)
    controller = make(Settings(hands_free=True))
    controller.start()
    failure = next(m for m in controller.poll() if isinstance(m, Failure))
    assert failure.message.startswith(reason) and "Hands-free is off" in failure.message
    assert not controller.settings.hands_free and controller.audio.cancellers == []
    assert controller.hands_free_unavailable() == reason
