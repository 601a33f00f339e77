"""The themes make state visible: a disabled checkbox looks disabled, and standard buttons carry no glyph that the
dark theme would hide (About's Close showed a dark "X" on the dark button under X11)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QCheckBox, QLabel, QWidget
from pytestqt.qtbot import QtBot

from ui.theme import DARK, LIGHT, ThemeColors, apply_theme


def _luminance(widget: QWidget) -> np.ndarray:
    """Each pixel's luminance (0..255) in ``widget``'s rendering."""
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
    width, height, stride = image.width(), image.height(), image.bytesPerLine()
    pixels = np.frombuffer(image.constBits(), dtype=np.uint8, count=stride * height)
    rgb = pixels.reshape(height, stride)[:, : width * 3].reshape(height, width, 3).astype(float)
    return rgb @ np.array([0.2126, 0.7152, 0.0722])


@pytest.mark.parametrize("theme", [DARK, LIGHT], ids=["dark", "light"])
def test_a_disabled_checkbox_looks_disabled(qtbot: QtBot, theme: ThemeColors) -> None:
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    apply_theme(app, theme.name)
    try:
        enabled, disabled = QCheckBox("Hands-free"), QCheckBox("Hands-free")
        enabled.setChecked(True)
        disabled.setChecked(True)
        disabled.setEnabled(False)
        muted = QLabel("Hands-free")
        muted.setProperty("role", "muted")  # secondary text that is still enabled
        for widget in (enabled, disabled, muted):
            qtbot.addWidget(widget)
            widget.show()
        # The text's extreme pixel: the brightest on the dark theme, the darkest on the light one.
        ink = np.max if theme is DARK else np.min
        text, off, secondary = (float(ink(_luminance(w))) for w in (enabled, disabled, muted))
        print(f"\n{theme.name}: text luminance enabled {text:.0f}, disabled {off:.0f}, muted label {secondary:.0f}")
        # A disabled control's text stands further back than even enabled secondary text.
        assert abs(off - secondary) > 30 and abs(off - text) > abs(secondary - text)
    finally:
        apply_theme(app, "light")


_CLOSE_ICON = """
from PySide6.QtWidgets import QApplication, QDialogButtonBox
from ui.about import AboutDialog
from ui.theme import apply_theme
app = QApplication([])
apply_theme(app, "dark")
about = AboutDialog({"Parley": "test"})
about.show()
close = about.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Close)
print("icon" if not close.icon().isNull() else "no icon")
"""


def test_abouts_close_button_has_no_glyph_to_vanish_on_the_dark_theme_under_x11() -> None:
    runner = shutil.which("xvfb-run")
    assert runner is not None, "this test needs Xvfb (apt install xvfb): the platform's icons show only on X11"
    result = subprocess.run(
        [runner, "-a", sys.executable, "-c", _CLOSE_ICON],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "QT_QPA_PLATFORM": "xcb"},
    )
    assert result.stdout.strip().splitlines()[-1] == "no icon"
