"""The frame-time overlay: both phases of every frame, the exact stages of sampled frames, figures and tooltips."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QColor, QImage
from pytestqt.qtbot import QtBot

from app.messages import TurnLatency
from tests.fakes import FakeController, make_frame_stats
from ui.app_window import MainWindow
from ui.overlay import (
    BUDGET_COLOR,
    EXACT_MARK_COLOR,
    HISTORY,
    OTHER_COLOR,
    PHASE_COLORS,
    PHASES,
    STAGE_COLORS,
    STAGES,
    WAITING,
    FrameOverlay,
    describe_frame,
    figures,
    format_stats,
    scale_for,
)


def grab(overlay: FrameOverlay) -> QImage:
    return overlay.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)


def colour_counts(image: QImage, area: QRectF | None = None) -> Counter[int]:
    """Pixels per colour, in ``area`` (default: the whole image)."""
    area = QRectF(image.rect()) if area is None else area
    counts: Counter[int] = Counter()
    for y in range(int(area.top()), int(area.bottom())):
        for x in range(int(area.left()), int(area.right())):
            counts[image.pixel(x, y) & 0xFFFFFF] += 1
    return counts


def rgb(name: str) -> int:
    return QColor(name).rgb() & 0xFFFFFF


def make_overlay(qtbot: QtBot, width: int = 820) -> FrameOverlay:
    overlay = FrameOverlay()
    qtbot.addWidget(overlay)
    overlay.resize(width, overlay.height())
    return overlay


def test_every_frame_shows_both_phases_other_time_and_the_budget_line(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    for index in range(HISTORY):
        overlay.add_stats(make_frame_stats(index, (8.0, 4.0, 30.0, 20.0, 6.0), other=2.0, backlog=1, underruns=3))
    image = grab(overlay)
    counts = colour_counts(image, overlay.plot_rect())
    slot = overlay.plot_rect().width() / HISTORY
    per_ms = overlay.plot_rect().height() / overlay.scale_ms()
    for phase, ms in zip(PHASES, (42.0, 26.0), strict=True):
        expected = HISTORY * (slot - 1) * ms * per_ms * 0.8
        assert counts[rgb(phase.color)] > expected, f"too few {phase.label} pixels"
    assert counts[rgb(OTHER_COLOR)] > 0, "time after the codec is drawn as 'other'"

    # The 80 ms budget line spans the plot at the right height.
    y = round(overlay.value_to_y(80.0))
    plot = overlay.plot_rect()
    row = [image.pixel(x, y) & 0xFFFFFF for x in range(int(plot.left()) + 1, int(plot.right()) - 1)]
    assert row.count(rgb(BUDGET_COLOR)) > 0.95 * len(row)
    assert overlay.accessibleDescription() == format_stats(overlay.latest)  # type: ignore[arg-type]
    assert "backlog 1" in overlay.accessibleDescription() and "underruns 3" in overlay.accessibleDescription()
    assert "lost 0.0 s" in overlay.accessibleDescription()


def test_bar_heights_follow_the_phase_times(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    overlay.add_stats(make_frame_stats(0, (10.0, 0.0, 40.0, 0.0, 20.0)))  # listening 50 ms, speaking 20 ms
    image = grab(overlay)
    per_ms = overlay.plot_rect().height() / overlay.scale_ms()
    column = int(overlay.plot_rect().right()) - 2  # the newest frame is on the right
    heights = Counter(image.pixel(column, y) & 0xFFFFFF for y in range(image.height()))
    assert abs(heights[rgb(PHASE_COLORS["listening"])] - 50.0 * per_ms) <= 2
    assert abs(heights[rgb(PHASE_COLORS["speaking"])] - 20.0 * per_ms) <= 2


def test_only_frames_timed_stage_by_stage_feed_the_exact_panel(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    for index in range(60):
        # Host-timed frames bill the device work to the phase's last stage; these numbers must not reach the panel.
        overlay.add_stats(make_frame_stats(index, (1.0, 0.1, 40.0, 1.0, 20.0)))
    assert overlay.exact_stages() == {}
    panel = colour_counts(grab(overlay), overlay.panel_rect())
    assert all(panel[rgb(stage.color)] == 0 for stage in STAGES), "no exact frame yet: no stage bars"

    for index, perception in ((60, 20.0), (85, 24.0), (110, 22.0)):
        overlay.add_stats(make_frame_stats(index, (perception, 1.0, 17.0, 14.0, 6.0), mode="device"))
    overlay.add_stats(make_frame_stats(111, (1.0, 0.1, 40.0, 1.0, 20.0)))
    exact = overlay.exact_stages()
    assert exact == {"perception": 22.0, "rnnt": 1.0, "language": 17.0, "tts": 14.0, "codec": 6.0}  # medians
    image = grab(overlay)
    panel = colour_counts(image, overlay.panel_rect())
    assert all(panel[rgb(stage.color)] > 0 for stage in STAGES), "every stage has its bar in the panel"
    marks = colour_counts(image, QRectF(overlay.plot_rect().left(), overlay.plot_rect().bottom(), 10_000, 6))
    assert marks[rgb(EXACT_MARK_COLOR)] >= 3 * 2, "a dot under each exactly timed bar"
    overlay.clear()
    assert overlay.exact_stages() == {}


def test_every_figure_bar_and_legend_entry_explains_itself(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    overlay.add_stats(make_frame_stats(0, (22.0, 1.0, 17.0, 14.0, 6.0), other=1.5, mode="device"))
    overlay.add_stats(make_frame_stats(1, (4.0, 0.2, 36.0, 4.0, 24.0), other=1.0, lost_s=0.4))
    overlay.set_latency(TurnLatency(0.52, 0.48, 0.61, 3))
    grab(overlay)  # painting places the hover areas
    shown = figures(overlay.latest, overlay.latency)  # type: ignore[arg-type]
    assert [f.text.split()[0] for f in shown] == ["p50", "p95", "RTF", "reply", "backlog", "lost", "underruns"]
    assert "0.48 s" in shown[3].text and "95th percentile 0.61 s" in shown[3].meaning and "3 turns" in shown[3].meaning
    assert shown[5].text == "lost 0.4 s" and shown[5].role == "danger"
    tips = {text for _, text in overlay._tips}
    for figure in shown:
        assert figure.meaning in tips, f"no tooltip for {figure.text}"
    for phase in PHASES:
        assert any(text.startswith(f"{phase.label}: ") for text in tips), f"no legend tooltip for {phase.label}"
    assert any(text.startswith("Other: host work after the codec") for text in tips)
    for stage in STAGES:
        assert any(text.startswith(f"{stage.label}: ") for text in tips), f"no panel tooltip for {stage.label}"

    plot = overlay.plot_rect()
    newest = overlay.tooltip_at(QPointF(plot.right() - 2, plot.bottom() - 3))
    assert newest == describe_frame(overlay.frames[-1]) and "Timed per phase" in newest
    slot = plot.width() / HISTORY
    sampled = overlay.tooltip_at(QPointF(plot.right() - slot * 1.5, plot.bottom() - 3))
    assert "Timed stage by stage" in sampled and "Perception 22.0 ms" in sampled
    assert overlay.tooltip_at(QPointF(plot.left() + 2, plot.bottom() - 3)) == "", "no frame there yet"


def test_history_is_bounded(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    for index in range(HISTORY + 80):
        overlay.add_stats(make_frame_stats(index))
    assert len(overlay.frames) == HISTORY
    assert overlay.frames[0].frame_index == 80
    overlay.clear()
    assert overlay.frames == [] and overlay.latest is None


def test_empty_overlay_says_why_and_shows_the_legend(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    assert overlay.accessibleDescription() == WAITING
    image = grab(overlay)
    plot = colour_counts(image, overlay.plot_rect())
    assert all(plot[rgb(phase.color)] == 0 for phase in PHASES)
    assert plot[rgb(BUDGET_COLOR)] > 0  # the budget line is there from the start
    legend = colour_counts(image)
    assert all(legend[rgb(phase.color)] > 0 for phase in PHASES), "the legend shows every phase colour"
    overlay.set_waiting_text("No frames: there is no microphone or speaker to use")
    assert overlay.accessibleDescription() == "No frames: there is no microphone or speaker to use"


def test_the_underruns_figure_says_how_much_of_their_delay_was_won_back() -> None:
    stats = dataclasses.replace(make_frame_stats(0, underruns=2), output_skipped_s=0.32)
    (underruns,) = [figure for figure in figures(stats) if figure.text.startswith("underruns")]
    assert underruns.text == "underruns 2" and underruns.role == "warning"
    assert "0.3 s of silence between turns skipped" in underruns.meaning


def test_scale_steps() -> None:
    timings = [make_frame_stats(0, (10, 10, 10, 10, 10)).timing]
    assert scale_for(timings) == 120.0
    assert scale_for([make_frame_stats(0, (100, 100, 100, 100, 100)).timing]) == 800.0
    assert scale_for([]) == 120.0


def test_overlay_toggles_from_the_view_menu(window: MainWindow, fake: FakeController) -> None:
    card = window.conversation.overlay_card
    window.show_conversation()
    assert card.isVisible()
    window.menu_actions.show_overlay.trigger()
    assert not card.isVisible()
    assert fake.settings.overlay is False
    window.menu_actions.show_overlay.trigger()
    assert card.isVisible() and fake.settings.overlay is True


def test_window_feeds_the_overlay_from_the_pump(window: MainWindow, fake: FakeController) -> None:
    fake.queue(*(make_frame_stats(i) for i in range(10)), TurnLatency(0.4, 0.4, 0.4, 1))
    window.pump.drain()
    overlay = window.conversation.overlay
    assert [f.frame_index for f in overlay.frames] == list(range(10))
    assert "reply 0.40 s" in overlay.accessibleDescription()
    assert STAGE_COLORS.keys() == {stage.field for stage in STAGES}


def test_hands_free_adds_the_echo_cancellers_figure(qtbot: QtBot, tmp_path: Path) -> None:
    from dataclasses import replace

    from app.messages import EchoSummary

    overlay = make_overlay(qtbot)
    overlay.add_stats(make_frame_stats(0))
    assert not [f for f in figures(overlay.latest) if f.text.startswith("echo")], "push to talk: no echo figure"  # type: ignore[arg-type]
    overlay.add_stats(replace(make_frame_stats(1), echo=EchoSummary(1.4, 1.0, 12)))
    grab(overlay)
    echo = figures(overlay.latest)[-1]  # type: ignore[arg-type]
    assert echo.text == "echo 1.4 ms" and echo.role == "text" and "100%" in echo.meaning
    assert echo.meaning in {text for _, text in overlay._tips}, "it explains itself on hover"
    overlay.add_stats(replace(make_frame_stats(2), echo=EchoSummary(1.4, 0.6, 12)))
    assert figures(overlay.latest)[-1].role == "warning", "the speaker's signal was missing"  # type: ignore[arg-type]
    overlay.grab().save(str(tmp_path / "overlay-hands-free.png"))


def test_the_overlay_says_when_the_voice_economises_to_keep_up(qtbot: QtBot) -> None:
    import os

    overlay = make_overlay(qtbot)
    for index in range(40):
        overlay.add_stats(make_frame_stats(index, (8.0, 4.0, 50.0, 30.0, 6.0), other=2.0, backlog=3))
    assert not [f for f in figures(overlay.latest) if "economy" in f.text]  # type: ignore[arg-type]
    overlay.add_stats(
        dataclasses.replace(make_frame_stats(40, (8.0, 4.0, 50.0, 30.0, 6.0), backlog=3), economy_level=2)
    )
    (economy,) = [f for f in figures(overlay.latest) if "economy" in f.text]  # type: ignore[arg-type]
    assert economy.text == "voice economy 2" and economy.role == "warning"
    assert "no guidance" in economy.meaning and "2 s of quick frames" in economy.meaning
    assert "voice economy 2" in overlay.accessibleDescription()
    shots = Path(os.environ.get("PARLEY_SHOTS", "")) if os.environ.get("PARLEY_SHOTS") else None
    if shots is not None:
        overlay.resize(1000, overlay.height())
        overlay.grab().save(str(shots / "overlay-voice-economy.png"))
