"""The live frame-time overlay: where each 80 ms frame's time went, and what the user feels.

Every frame runs in two phases: *listening* (perception, RN-T and the language model: what
was heard, what to say) and *speaking* (TTS and codec: the next 80 ms of voice). Exact
numerics reads each phase back from the device once; fast numerics reads the frame back
once, at its end, so there the device's listening work lands in speaking. The chart draws
both phases of every recent frame as a stacked bar against the 80 ms budget, plus "other":
host work after the codec (decoding text, parsing tool calls, handing audio over). Within a phase, device time
lands in the stage that waited for it, so per-stage times of ordinary frames would
mislead; one frame in N is therefore timed stage by stage (``timing_mode == "device"``,
evaluated at every stage boundary), and the panel on the right shows those exact stage
times (the median of the last few such frames). Those frames get a dot under their bar.

The figures (p50, p95, realtime factor, reply delay, backlog, lost microphone audio,
underruns) come from the latest ``FrameStats`` and ``TurnLatency``; every figure, bar,
stage and legend entry has a tooltip saying what it means. Main thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from statistics import median
from typing import Final, NamedTuple

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QHelpEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from app.messages import FrameStats, TurnLatency
from engine.events import FrameTiming
from engine.timeline import FRAME_MS, LISTEN_STAGES, SPEAK_STAGES
from engine.timeline import STAGES as STAGE_ORDER

from .theme import colors


class Stage(NamedTuple):
    field: str  # the stage's name in FrameTiming.stages_ms
    label: str
    color: str
    meaning: str


class Phase(NamedTuple):
    name: str
    label: str
    stages: tuple[str, ...]
    color: str
    meaning: str


# Okabe–Ito colours: distinguishable with the common colour-vision deficiencies, in light and dark.
_STAGE_LOOK: Final = {
    "perception": ("Perception", "#56b4e9", "streaming log-mel and the FastConformer encoder"),
    "rnnt": ("RN-T", "#e69f00", "the RN-T decoder that transcribes what you say"),
    "language": ("Language", "#0072b2", "the language model choosing the next text and tool tokens"),
    "tts": ("TTS", "#cc79a7", "the speech model turning text into audio codes"),
    "codec": ("Codec", "#009e73", f"the codec turning audio codes into {FRAME_MS:.0f} ms of sound"),
}
STAGES: Final = tuple(Stage(name, *_STAGE_LOOK[name]) for name in STAGE_ORDER)  # the engine's stages, in its order
STAGE_COLORS: Final = {stage.field: stage.color for stage in STAGES}
PHASES: Final = (
    Phase(
        "listening",
        "Listening",
        LISTEN_STAGES,
        "#0072b2",
        "perception + RN-T + language model: hearing the frame and deciding what to say",
    ),
    Phase(
        "speaking", "Speaking", SPEAK_STAGES, "#009e73", f"TTS + codec: making the next {FRAME_MS:.0f} ms of the voice"
    ),
)
PHASE_COLORS: Final = {phase.name: phase.color for phase in PHASES}
OTHER_COLOR: Final = "#9a9a9a"
OTHER_MEANING: Final = "host work after the codec: decoding text, parsing tool calls, handing audio to the speaker"
BUDGET_COLOR: Final = "#d55e00"
EXACT_MARK_COLOR: Final = "#6a3d9a"
BUDGET_MS: Final = FRAME_MS
HISTORY: Final = 120
EXACT_WINDOW: Final = 5  # exact frames behind the stage panel's medians
SCALES_MS: Final = (120.0, 160.0, 240.0, 400.0, 800.0, 1600.0)
WAITING: Final = "Waiting for frames — they appear once a conversation runs"

_PAD: Final = 12.0
_HEADER_H: Final = 22.0
_LEGEND_H: Final = 20.0
_AXIS_W: Final = 40.0
_PANEL_W: Final = 190.0
_MARK_H: Final = 5.0


def phase_ms(timing: FrameTiming, phase: Phase) -> float:
    return sum(timing.stage_ms(name) for name in phase.stages)


def other_ms(timing: FrameTiming) -> float:
    """Frame time not in any stage: host work after the codec (text decoding, tool-call parsing, audio hand-off)."""
    return max(0.0, timing.total_ms - sum(timing.stage_ms(s.field) for s in STAGES))


def scale_for(frames: Sequence[FrameTiming]) -> float:
    """The smallest fixed y range that holds the slowest frame shown."""
    worst = max((f.total_ms for f in frames), default=0.0)
    for scale in SCALES_MS:
        if worst <= scale * 0.95:
            return scale
    return SCALES_MS[-1]


class Figure(NamedTuple):
    text: str
    role: str  # the theme colour it is drawn in (warnings stand out)
    meaning: str  # its tooltip


def figures(stats: FrameStats, latency: TurnLatency | None = None) -> list[Figure]:
    """The header figures, each with its colour role and what it means."""
    reply = (
        Figure(
            f"reply {latency.p50_s:.2f} s",
            "warning" if latency.p50_s > 1.0 else "text",
            f"The delay you feel: from releasing the talk key to the assistant's first audible sound. "
            f"This conversation: median {latency.p50_s:.2f} s, 95th percentile {latency.p95_s:.2f} s, "
            f"last {latency.latency_s:.2f} s, over {latency.turns} turn{'s' if latency.turns != 1 else ''}.",
        )
        if latency is not None
        else Figure(
            "reply –",
            "text",
            "The delay you feel: from releasing the talk key to the assistant's first audible sound. "
            "Measured from your first turn on.",
        )
    )
    shown = [
        Figure(
            f"p50 {stats.p50_ms:.1f} ms",
            "text",
            f"Median time the engine took per frame over the last 100 frames. A frame is {FRAME_MS:.0f} ms of "
            "audio, so below that the engine keeps up with real time.",
        ),
        Figure(
            f"p95 {stats.p95_ms:.1f} ms",
            "danger" if stats.p95_ms > BUDGET_MS else "text",
            f"95th percentile of the frame time over the last 100 frames: the slow frames. Above {FRAME_MS:.0f} ms "
            "some frames finish late.",
        ),
        Figure(
            f"RTF {stats.realtime_factor:.2f}",
            "danger" if stats.realtime_factor > 1.0 else "text",
            f"Realtime factor: mean frame time ÷ {FRAME_MS:.0f} ms over the last 100 frames. Below 1.00 the engine "
            "keeps up; above, it falls behind.",
        ),
        reply,
        Figure(
            f"backlog {stats.backlog_frames}",
            "warning" if stats.backlog_frames > 2 else "text",
            f"Microphone frames ({FRAME_MS:.0f} ms each) waiting for the engine now. More than 2 means it is "
            "falling behind and answers come late.",
        ),
        Figure(
            f"lost {stats.input_lost_s:.1f} s",
            "danger" if stats.input_lost_s > 0 else "text",
            "Microphone audio dropped in this conversation because the engine fell too far behind "
            "(0.0 s: nothing you said was lost).",
        ),
        Figure(
            f"underruns {stats.output_underruns}",
            "warning" if stats.output_underruns else "text",
            "Times in this conversation the speaker ran out of the assistant's audio and played silence: the "
            "engine was late for playback, or a busy computer fed the sound device too late, and what followed "
            "came that much later. "
            f"{stats.output_skipped_s:.1f} s of silence between turns skipped since, to win the delay back.",
        ),
    ]
    if stats.economy_level:  # keeping up (Settings → Model): the voice spends less per frame while behind
        shown.append(
            Figure(
                f"voice economy {stats.economy_level}",
                "warning",
                f"Frames fell behind the {FRAME_MS:.0f} ms budget, so fast mode's voice spends less per frame: "
                + (
                    "fewer refinement samples"
                    if stats.economy_level == 1
                    else "fewer refinement samples and no guidance"
                )
                + ". The words are the same; the voice may sound a little different. It returns to full quality "
                "after 2 s of quick frames (Settings → Model → Keep up when slow).",
            )
        )
    echo = stats.echo
    if echo is not None:  # hands-free
        missing = echo.reference_share < 0.95
        shown.append(
            Figure(
                f"echo {echo.cost_ms_per_frame:.1f} ms",
                "warning" if missing else "text",
                "Hands-free: echo cancellation removes the assistant's voice from the microphone before the engine "
                f"hears it. It takes {echo.cost_ms_per_frame:.1f} ms of each frame; the speaker's signal was there "
                f"for {echo.reference_share:.0%} of the microphone (below 95 % the assistant may hear itself); "
                f"{echo.drift_corrections} samples of clock drift corrected.",
            )
        )
    return shown


def format_stats(stats: FrameStats, latency: TurnLatency | None = None) -> str:
    """The figures line, e.g. ``"p50 42.0 ms · p95 61.5 ms · RTF 0.53 · reply – · backlog 0 · …"``."""
    return " · ".join(figure.text for figure in figures(stats, latency))


def describe_frame(timing: FrameTiming) -> str:
    """A bar's tooltip: the frame's total, phases and, for an exact frame, every stage."""
    parts = [f"{phase.label.lower()} {phase_ms(timing, phase):.1f} ms" for phase in PHASES]
    parts.append(f"other {other_ms(timing):.1f} ms")
    text = f"Frame {timing.frame_index}: {timing.total_ms:.1f} ms — " + ", ".join(parts) + "."
    if timing.timing_mode == "device":
        stages = ", ".join(f"{stage.label} {timing.stage_ms(stage.field):.1f} ms" for stage in STAGES)
        text += f"\nTimed stage by stage ({timing.host_syncs} host syncs): {stages}."
    else:
        text += f"\nTimed per phase ({timing.host_syncs} host syncs): device time lands in the phase that waited."
    return text


class FrameOverlay(QWidget):
    """Per-frame phase bars, the exact per-stage panel, the budget line, a legend and the live figures."""

    def __init__(self, parent: QWidget | None = None, history: int = HISTORY) -> None:
        super().__init__(parent)
        self._frames: deque[FrameTiming] = deque(maxlen=history)
        self._exact: deque[FrameTiming] = deque(maxlen=EXACT_WINDOW)
        self._history = history
        self._latest: FrameStats | None = None
        self._latency: TurnLatency | None = None
        self._waiting = WAITING
        self._tips: list[tuple[QRectF, str]] = []  # hover areas of the figures, legend and panel, from the last paint
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(190)
        self.setMinimumWidth(560)
        self.setMouseTracking(True)
        self.setAccessibleName("Frame time overlay")
        self.setAccessibleDescription(self._waiting)

    def sizeHint(self) -> QSize:
        return QSize(820, 190)

    @property
    def frames(self) -> list[FrameTiming]:
        return list(self._frames)

    @property
    def latest(self) -> FrameStats | None:
        return self._latest

    @property
    def latency(self) -> TurnLatency | None:
        return self._latency

    @property
    def waiting_text(self) -> str:
        return self._waiting

    @property
    def _exact_every(self) -> str:
        return str(self._latest.exact_every) if self._latest is not None else "N"

    def _exact_title(self) -> str:
        # "Stage times", not "exact": exact and fast are the numerics modes' names.
        return "Stage times" if self._latest is None else f"Stage times · 1 in {self._exact_every}"

    def add_stats(self, stats: FrameStats) -> None:
        """Add one processed frame (the chart's only input)."""
        self._frames.append(stats.timing)
        if stats.timing.timing_mode == "device":
            self._exact.append(stats.timing)
        self._latest = stats
        self.setAccessibleDescription(format_stats(stats, self._latency))
        self.update()

    def set_latency(self, latency: TurnLatency) -> None:
        self._latency = latency
        if self._latest is not None:
            self.setAccessibleDescription(format_stats(self._latest, latency))
        self.update()

    def set_waiting_text(self, text: str) -> None:
        """What the empty chart says (why no frames run: no conversation yet, no sound device, loading…)."""
        self._waiting = text
        if self._latest is None:
            self.setAccessibleDescription(text)
        self.update()

    def clear(self) -> None:
        """A new conversation: its frames, counters and reply delays start from nothing."""
        self._frames.clear()
        self._exact.clear()
        self._latest = None
        self._latency = None
        self.setAccessibleDescription(self._waiting)
        self.update()

    def exact_stages(self) -> dict[str, float]:
        """Median per-stage milliseconds of the last exactly timed frames (empty before the first)."""
        if not self._exact:
            return {}
        return {stage.field: median(f.stage_ms(stage.field) for f in self._exact) for stage in STAGES}

    # -- geometry (public so tests and tooltips can locate things) -------------------------------------------------

    def plot_rect(self) -> QRectF:
        top = _PAD + _HEADER_H + 6
        bottom = self.height() - _PAD - _LEGEND_H - 6 - _MARK_H
        width = self.width() - 2 * _PAD - _AXIS_W - _PANEL_W - 12
        return QRectF(_PAD + _AXIS_W, top, max(40.0, width), max(10.0, bottom - top))

    def panel_rect(self) -> QRectF:
        plot = self.plot_rect()
        return QRectF(plot.right() + 12, plot.top(), _PANEL_W, plot.height() + _MARK_H)

    def scale_ms(self) -> float:
        return scale_for(self._frames)

    def value_to_y(self, ms: float) -> float:
        plot = self.plot_rect()
        return plot.bottom() - plot.height() * min(ms, self.scale_ms()) / self.scale_ms()

    def frame_at(self, x: float) -> FrameTiming | None:
        """The frame whose bar covers ``x``, if any."""
        plot = self.plot_rect()
        if not self._frames or not plot.left() <= x < plot.right():
            return None
        slot = int((x - plot.left()) / (plot.width() / self._history))
        index = slot - (self._history - len(self._frames))
        return self._frames[index] if 0 <= index < len(self._frames) else None

    # -- tooltips --------------------------------------------------------------------------------------------------

    def tooltip_at(self, point: QPointF) -> str:
        """What the overlay explains at ``point`` (empty where there is nothing to explain)."""
        for area, text in self._tips:
            if area.contains(point):
                return text
        plot = self.plot_rect()
        if plot.top() <= point.y() <= plot.bottom() + _MARK_H:
            frame = self.frame_at(point.x())
            if frame is not None:
                return describe_frame(frame)
        return ""

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            assert isinstance(event, QHelpEvent)
            text = self.tooltip_at(QPointF(event.pos()))
            if text:
                QToolTip.showText(event.globalPos(), text, self)
            else:
                QToolTip.hideText()
                event.ignore()
            return True
        return super().event(event)

    # -- painting --------------------------------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:
        theme = colors()
        self._tips = []
        painter = QPainter(self)
        plot = self.plot_rect()
        painter.fillRect(plot, theme.qcolor("plot_bg"))
        self._paint_grid(painter, plot)
        self._paint_bars(painter, plot)
        self._paint_budget(painter, plot)
        self._paint_panel(painter)
        self._paint_header(painter)
        self._paint_legend(painter)
        painter.end()

    def _small_font(self, bold: bool = False) -> QFont:
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, self.font().pointSizeF() - 1.5))
        small.setBold(bold)
        return small

    def _paint_grid(self, painter: QPainter, plot: QRectF) -> None:
        theme = colors()
        scale = self.scale_ms()
        step = 40.0 if scale <= 240 else 100.0 if scale <= 400 else 200.0 if scale <= 800 else 400.0
        small = self._small_font()
        painter.setFont(small)
        metrics = QFontMetricsF(small)
        value = 0.0
        while value <= scale + 0.01:
            y = round(self.value_to_y(value)) + 0.5
            painter.setPen(QPen(theme.qcolor("grid"), 1))
            painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            if abs(value - BUDGET_MS) > step / 3:  # the budget line carries its own label
                painter.setPen(theme.qcolor("muted"))
                label = f"{value:.0f}"
                painter.drawText(
                    QPointF(plot.left() - 6 - metrics.horizontalAdvance(label), y + metrics.capHeight() / 2), label
                )
            value += step

    def _paint_bars(self, painter: QPainter, plot: QRectF) -> None:
        theme = colors()
        if not self._frames:
            painter.setPen(theme.qcolor("muted"))
            flags = Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap
            painter.drawText(plot.adjusted(8, 0, -8, 0), int(flags), self._waiting)
            return
        slot = plot.width() / self._history
        gap = 1.0 if slot >= 3.0 else 0.0
        scale = self.scale_ms()
        per_ms = plot.height() / scale
        first_slot = self._history - len(self._frames)  # newest frame on the right
        phase_colors = [QColor(phase.color) for phase in PHASES]
        other = QColor(OTHER_COLOR)
        exact_mark = QColor(EXACT_MARK_COLOR)
        for index, timing in enumerate(self._frames):
            left = round(plot.left() + (first_slot + index) * slot)
            right = round(plot.left() + (first_slot + index + 1) * slot - gap)
            width = max(1, right - left)
            base = plot.bottom()
            parts = [(phase_ms(timing, phase), phase_colors[i]) for i, phase in enumerate(PHASES)]
            parts.append((other_ms(timing), other))
            for ms, colour in parts:
                if ms <= 0 or base <= plot.top():
                    continue
                top = max(plot.top(), base - ms * per_ms)
                y0, y1 = round(top), round(base)
                if y1 > y0:
                    painter.fillRect(int(left), y0, int(width), y1 - y0, colour)
                base = top
            if timing.total_ms > BUDGET_MS:  # a missed deadline: a marker above the bar
                marker_y = max(plot.top(), plot.bottom() - min(timing.total_ms, scale) * per_ms) - 5
                painter.fillRect(int(left), round(max(plot.top() - 4, marker_y)), int(width), 3, QColor(BUDGET_COLOR))
            if timing.timing_mode == "device":  # timed stage by stage: a dot under the bar
                painter.fillRect(int(left), round(plot.bottom() + 2), max(2, int(width)), 3, exact_mark)

    def _paint_budget(self, painter: QPainter, plot: QRectF) -> None:
        y = round(self.value_to_y(BUDGET_MS))
        painter.fillRect(QRectF(plot.left(), y - 1, plot.width(), 2), QColor(BUDGET_COLOR))
        small = self._small_font(bold=True)
        painter.setFont(small)
        metrics = QFontMetricsF(small)
        painter.setPen(QColor(BUDGET_COLOR))
        label = f"{BUDGET_MS:.0f} ms"
        painter.drawText(
            QPointF(plot.left() - 6 - metrics.horizontalAdvance(label), y + metrics.capHeight() / 2), label
        )
        self._tips.append(
            (
                QRectF(plot.left(), y - 3, plot.width(), 6),
                f"The budget: a frame is {FRAME_MS:.0f} ms of audio. Bars above the line finished late.",
            )
        )

    def _paint_panel(self, painter: QPainter) -> None:
        """Exact per-stage times: a row per stage, a bar and its milliseconds."""
        theme = colors()
        panel = self.panel_rect()
        small = self._small_font()
        bold = self._small_font(bold=True)
        painter.setFont(bold)
        painter.setPen(theme.qcolor("text"))
        title = self._exact_title()
        painter.drawText(QRectF(panel.left(), panel.top() - 2, panel.width(), 16), Qt.AlignmentFlag.AlignLeft, title)
        meaning = (
            f"Each stage's own time, from frames timed stage by stage: one frame in {self._exact_every} is "
            "evaluated at every stage boundary (3 extra host syncs on that frame; marked with a dot under its bar). "
            f"Median of the last {EXACT_WINDOW} such frames."
        )
        self._tips.append((QRectF(panel.left(), panel.top() - 2, panel.width(), 16), meaning))
        stages = self.exact_stages()
        row_h = (panel.height() - 16) / len(STAGES)
        scale = max(max(stages.values(), default=0.0), 1.0)
        label_w = 70.0
        value_w = 52.0
        painter.setFont(small)
        for row, stage in enumerate(STAGES):
            y = panel.top() + 16 + row * row_h
            area = QRectF(panel.left(), y, panel.width(), row_h)
            painter.setPen(theme.qcolor("muted"))
            painter.drawText(QRectF(area.left(), y, label_w, row_h), Qt.AlignmentFlag.AlignVCenter, stage.label)
            ms = stages.get(stage.field)
            bar_room = area.width() - label_w - value_w
            bar_h = max(4.0, row_h * 0.5)
            track = QRectF(area.left() + label_w, y + (row_h - bar_h) / 2, bar_room, bar_h)
            painter.fillRect(track, theme.qcolor("plot_bg"))
            if ms is not None and ms > 0:
                painter.fillRect(QRectF(track.left(), track.top(), bar_room * ms / scale, bar_h), QColor(stage.color))
            text = "–" if ms is None else f"{ms:.1f} ms"
            painter.setPen(theme.qcolor("text"))
            painter.drawText(
                QRectF(area.right() - value_w, y, value_w, row_h),
                Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight,
                text,
            )
            phase = next(phase.label.lower() for phase in PHASES if stage.field in phase.stages)
            self._tips.append((area, f"{stage.label}: {stage.meaning} (part of {phase}). {meaning}"))

    def _paint_header(self, painter: QPainter) -> None:
        theme = colors()
        header = QRectF(_PAD, _PAD, self.width() - 2 * _PAD, _HEADER_H)
        x = header.right()
        if self._latest is not None:
            painter.setFont(self.font())
            metrics = QFontMetricsF(self.font())
            # Right-aligned figures, drawn right to left so each can carry its own warning colour.
            for figure in reversed(figures(self._latest, self._latency)):
                width = metrics.horizontalAdvance(figure.text)
                area = QRectF(x - width, header.top(), width, header.height())
                painter.setPen(theme.qcolor(figure.role))
                painter.drawText(area, Qt.AlignmentFlag.AlignVCenter, figure.text)
                self._tips.append((area.adjusted(-6, 0, 6, 0), figure.meaning))
                x -= width + 14
        title_font = QFont(self.font())
        title_font.setBold(True)
        painter.setFont(title_font)
        painter.setPen(theme.qcolor("text"))
        room = x - header.left() - 8
        metrics = QFontMetricsF(title_font)
        title = f"Frame time · last {self._history} frames"
        if metrics.horizontalAdvance(title) > room:
            title = metrics.elidedText("Frame time", Qt.TextElideMode.ElideRight, max(0.0, room))
        painter.drawText(header, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title)

    def _paint_legend(self, painter: QPainter) -> None:
        theme = colors()
        small = self._small_font()
        painter.setFont(small)
        metrics = QFontMetricsF(small)
        y = self.height() - _PAD - _LEGEND_H
        x = _PAD + _AXIS_W
        entries: list[tuple[str, QColor, str, bool]] = [
            (phase.label, QColor(phase.color), f"{phase.label}: {phase.meaning}.", False) for phase in PHASES
        ]
        entries.append(("Other", QColor(OTHER_COLOR), f"Other: {OTHER_MEANING}.", False))
        entries.append(
            (
                "timed by stage",
                QColor(EXACT_MARK_COLOR),
                f"A dot under a bar: that frame was timed stage by stage (one in {self._exact_every}); "
                "its stages feed the panel on the right.",
                True,
            )
        )
        for label, colour, meaning, is_mark in entries:
            start = x
            if is_mark:
                painter.fillRect(QRectF(x, y + _LEGEND_H / 2 - 1.5, 10, 3), colour)
            else:
                painter.fillRect(QRectF(x, y + _LEGEND_H / 2 - 5, 10, 10), colour)
            x += 14
            painter.setPen(theme.qcolor("muted"))
            width = metrics.horizontalAdvance(label)
            painter.drawText(QRectF(x, y, width + 2, _LEGEND_H), Qt.AlignmentFlag.AlignVCenter, label)
            x += width + 14
            self._tips.append((QRectF(start, y, x - start, _LEGEND_H), meaning))
        start = x
        painter.fillRect(QRectF(x, y + _LEGEND_H / 2 - 1, 16, 2), QColor(BUDGET_COLOR))
        x += 20
        painter.setPen(theme.qcolor("muted"))
        label = f"{BUDGET_MS:.0f} ms budget"
        painter.drawText(
            QRectF(x, y, metrics.horizontalAdvance(label) + 2, _LEGEND_H), Qt.AlignmentFlag.AlignVCenter, label
        )
        x += metrics.horizontalAdvance(label)
        self._tips.append(
            (
                QRectF(start, y, x - start, _LEGEND_H),
                f"The budget: each frame is {FRAME_MS:.0f} ms of audio, so it must take less to keep up.",
            )
        )
