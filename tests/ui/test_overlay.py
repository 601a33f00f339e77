"""The frame-time overlay renders from FrameStats alone: stage bars, budget line, figures; and it toggles."""

from __future__ import annotations

from collections import Counter

from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QImage
from pytestqt.qtbot import QtBot

from tests.fakes import FakeController, make_frame_stats
from ui.app_window import MainWindow
from ui.overlay import BUDGET_COLOR, HISTORY, OTHER_COLOR, STAGE_COLORS, STAGES, FrameOverlay, format_stats, scale_for


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


def make_overlay(qtbot: QtBot, width: int = 600) -> FrameOverlay:
    overlay = FrameOverlay()
    qtbot.addWidget(overlay)
    overlay.resize(width, overlay.height())
    return overlay


def test_bars_in_every_stage_colour_and_the_budget_line(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    for index in range(HISTORY):
        overlay.add_stats(make_frame_stats(index, (8.0, 4.0, 30.0, 20.0, 6.0), other=2.0, backlog=1, underruns=3))
    image = grab(overlay)
    counts = colour_counts(image, overlay.plot_rect())
    slot = overlay.plot_rect().width() / HISTORY
    for stage in STAGES:
        minimum_ms = 4.0  # the thinnest stage: 120 bars of at least this height must be there
        expected = HISTORY * (slot - 1) * minimum_ms * overlay.plot_rect().height() / overlay.scale_ms() * 0.8
        assert counts[rgb(stage.color)] > expected, f"too few {stage.label} pixels"
    assert counts[rgb(OTHER_COLOR)] > 0, "unattributed time is drawn as 'other'"

    # The 80 ms budget line spans the plot at the right height.
    y = round(overlay.value_to_y(80.0))
    plot = overlay.plot_rect()
    row = [image.pixel(x, y) & 0xFFFFFF for x in range(int(plot.left()) + 1, int(plot.right()) - 1)]
    assert row.count(rgb(BUDGET_COLOR)) > 0.95 * len(row)
    assert overlay.accessibleDescription() == format_stats(overlay.latest)  # type: ignore[arg-type]
    assert "backlog 1" in overlay.accessibleDescription() and "underruns 3" in overlay.accessibleDescription()


def test_bar_heights_follow_the_stage_times(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    overlay.add_stats(make_frame_stats(0, (10.0, 0.0, 40.0, 0.0, 20.0)))
    image = grab(overlay)
    per_ms = overlay.plot_rect().height() / overlay.scale_ms()
    column = int(overlay.plot_rect().right()) - 2  # the newest frame is on the right
    heights = Counter(image.pixel(column, y) & 0xFFFFFF for y in range(image.height()))
    for field, ms in (("perception", 10.0), ("language", 40.0), ("codec", 20.0)):
        assert abs(heights[rgb(STAGE_COLORS[field])] - ms * per_ms) <= 2, field
    assert heights[rgb(STAGE_COLORS["rnnt"])] == 0 and heights[rgb(STAGE_COLORS["tts"])] == 0


def test_frames_over_budget_get_a_marker_and_the_scale_grows(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    overlay.add_stats(make_frame_stats(0, (10.0, 5.0, 80.0, 40.0, 10.0)))  # 145 ms
    assert overlay.scale_ms() == 160.0
    image = grab(overlay)
    column = int(overlay.plot_rect().right()) - 2
    budget_y = round(overlay.value_to_y(80.0))
    above = [y for y in range(image.height()) if image.pixel(column, y) & 0xFFFFFF == rgb(BUDGET_COLOR)]
    assert any(y < budget_y - 3 for y in above), "a missed frame has a marker above its bar"


def test_history_is_bounded(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    for index in range(HISTORY + 80):
        overlay.add_stats(make_frame_stats(index))
    assert len(overlay.frames) == HISTORY
    assert overlay.frames[0].frame_index == 80
    overlay.clear()
    assert overlay.frames == [] and overlay.latest is None


def test_empty_overlay_has_no_bars(qtbot: QtBot) -> None:
    overlay = make_overlay(qtbot)
    image = grab(overlay)
    plot = colour_counts(image, overlay.plot_rect())
    assert all(plot[rgb(stage.color)] == 0 for stage in STAGES)
    assert plot[rgb(BUDGET_COLOR)] > 0  # the budget line is there from the start
    legend = colour_counts(image)
    assert all(legend[rgb(stage.color)] > 0 for stage in STAGES), "the legend shows every stage colour"


def test_scale_steps() -> None:
    timings = [make_frame_stats(0, (10, 10, 10, 10, 10)).timing]
    assert scale_for(timings) == 120.0
    assert scale_for([make_frame_stats(0, (100, 100, 100, 100, 100)).timing]) == 800.0
    assert scale_for([]) == 120.0


def test_overlay_toggles_from_the_view_menu(window: MainWindow, fake: FakeController) -> None:
    card = window.conversation.overlay_card
    window.show_conversation()
    assert card.isVisible()
    window.actions.show_overlay.trigger()
    assert not card.isVisible()
    assert fake.settings.overlay is False
    window.actions.show_overlay.trigger()
    assert card.isVisible() and fake.settings.overlay is True


def test_window_feeds_the_overlay_from_the_pump(window: MainWindow, fake: FakeController) -> None:
    fake.queue(*(make_frame_stats(i) for i in range(10)))
    window.pump.drain()
    assert [f.frame_index for f in window.conversation.overlay.frames] == list(range(10))
