"""Issue 51's core flows as the window shows them (scripted controller): a stale error goes when a model
loads, a switch leaves no stale conversation behind, Stop and the idle pause read as asleep, random
weights are labelled as noise, and the first launch tells one story.

Names added by the issue are imported inside the tests, so each fails on its own on the old code.
"""

from __future__ import annotations

from pathlib import Path

from app.messages import (
    AppState,
    ConversationStarted,
    ConversationTime,
    EngineState,
    Failure,
    ModelLoaded,
    SpeedCheck,
)
from app.settings import Settings
from app.variants import Q4
from engine.events import AssistantTextDelta
from tests.fakes import FakeController, make_frame_stats
from tests.ui.conftest import WindowFactory
from ui.app_window import MainWindow


def test_a_stale_error_banner_goes_when_a_model_loads_fine(window: MainWindow, fake: FakeController) -> None:
    window.banners.clear()
    fake.queue(Failure("Not switched to bf16: /m/emptydir/config.json: config.json is missing"))
    window.pump.drain()
    assert [b.kind for b in window.banners.banners()] == ["error"]
    fake.switch_variant("4bit")
    window.pump.drain()
    assert [b for b in window.banners.banners() if b.kind == "error"] == [], "the error is stale once a model loads"


def test_a_launch_fallback_is_said_and_stays_said(window: MainWindow, fake: FakeController) -> None:
    from app.messages import ModelFallback

    window.banners.clear()
    fake.queue(
        ModelFallback("The bf16 folder cannot be used: /m/emptydir does not exist. The 4-bit model loads instead")
    )
    fake.switch_variant("4bit")
    window.pump.drain()
    (banner,) = [b for b in window.banners.banners() if b.kind != "info"]  # beside the speed check's
    assert banner.kind == "warning" and "4-bit model loads instead" in banner.text()


def test_new_conversation_leaves_no_stale_window(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    model = window.status.model
    assert model is not None
    fake.queue(
        ConversationStarted(1, model),
        EngineState(AppState.READY, conversation=True),
        make_frame_stats(0, underruns=7),
        AssistantTextDelta(0, 5, "Hello", "Hello"),
        ConversationTime(40.0, 440.0),
    )
    window.pump.drain()
    assert window.conversation.transcript.entries() and window.conversation.overlay.latest is not None
    assert window.header.time_chip.isVisible()

    fake.new_conversation()  # as the real worker: the old conversation ends, the next waits for the key
    window.pump.drain()
    assert window.conversation.transcript.entries() == []
    assert window.conversation.overlay.latest is None and window.conversation.overlay.frames == []
    assert not window.header.time_chip.isVisible()
    assert window.indicator.text() == "Ready" and "talk key" in window.indicator.detail()


def test_a_model_switch_from_settings_leaves_no_stale_window(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    model = window.status.model
    assert model is not None
    fake.queue(ConversationStarted(1, model), make_frame_stats(0, underruns=7), ConversationTime(8.0, 472.0))
    window.pump.drain()
    dialog = window.open_settings()
    dialog.model_page.variant_buttons["8bit"].click()
    dialog.accept()
    window.pump.drain()
    assert window.conversation.overlay.latest is None and not window.header.time_chip.isVisible()
    assert window.header.model_chip.text().endswith("8-bit")


def test_after_stop_the_window_says_the_conversation_sleeps(window: MainWindow, fake: FakeController) -> None:
    window.show_conversation()
    fake.start_conversation()
    window.pump.drain()
    window.menu_actions.stop_speaking.trigger()
    window.pump.drain()
    assert fake.calls_to("stop_speaking") == [()]
    assert window.indicator.text() == "Asleep"
    assert window.conversation.talk.button.isEnabled(), "the talk key wakes it"


def test_random_weights_are_labelled_as_noise(make_window: WindowFactory, model_dirs: dict[str, Path]) -> None:
    fake = FakeController(Settings(checkpoints=dict(model_dirs), active_variant="4bit"))
    window = make_window(fake)
    window.show_conversation()
    path = model_dirs["4bit"]
    fake.queue(
        SpeedCheck(0.2, "This checkpoint has random weights (noise, not speech); a frame takes 20 % of its 80 ms."),
        ModelLoaded("tiny4", path, Q4, random_weights=True),  # type: ignore[call-arg]
        EngineState(AppState.READY),
    )
    window.pump.drain()
    assert "noise, not speech" in window.header.model_chip.text()
    assert "noise, not speech" in window.conversation.speaker_meter.caption.text()


def test_first_launch_with_the_demo_tells_one_story(make_window: WindowFactory, tmp_path: Path) -> None:
    fake = FakeController(Settings(), log_dir=tmp_path / "logs")
    window = make_window(fake)
    page = window.first_run
    page.demo_button.click()
    window.pump.drain()
    words = f"{page.title.text()} {page.subtitle.text()}"
    assert page.status_title.text() == "Demo ready — noise, not speech" and page.download_card.isVisible()
    assert "all set" not in words and "The model is loaded" not in words, words
    assert "noise, not speech" in words


def test_the_model_hint_points_where_a_model_is_got(make_window: WindowFactory, model_dirs: dict[str, Path]) -> None:
    fake = FakeController(Settings(checkpoints={"4bit": model_dirs["4bit"]}, active_variant="4bit"))
    window = make_window(fake)
    page = window.open_settings().model_page
    page.variant_buttons["bf16"].click()
    assert "File → Get a Model" in page.variant_status.text() and "first-run screen" not in page.variant_status.text()
    assert window.menu_actions.get_model.text().replace("&", "") == "Get a Model…"
