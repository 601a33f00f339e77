"""A newcomer's first launch, measured at the virtual speaker (PulseAudio) with the real app core and window.

Left untouched, the first launch generates and loads the demo, and stays silent. "Try the
demo" starts it: its noise reaches the speaker quietly, under the limiter's ceiling. Mute
silences it; the volume and mute are remembered for the next launch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pytestqt.qtbot import QtBot

from app.audio.devices import refresh_devices
from app.audio.output import OUTPUT_CEILING
from app.controller import AppController
from app.messages import AppState
from app.settings import load_settings
from tests.pulse import PulseServer, virtual_devices
from ui.app_window import MainWindow

pytestmark = [pytest.mark.audio, pytest.mark.gui]

SILENT_PEAK = 1e-4  # -80 dBFS: a 16-bit sink's quantisation is 3e-5


@pytest.fixture
def pulse() -> Iterator[PulseServer]:
    with virtual_devices() as server:
        refresh_devices()
        yield server


def dbfs(value: float) -> float:
    return 20.0 * np.log10(max(value, 1e-10))


def test_an_untouched_first_launch_is_silent_and_the_demo_plays_quietly_when_chosen(
    pulse: PulseServer, qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    settings, warning = load_settings()
    assert warning is None and settings.active_checkpoint is None, "a first launch: nothing configured"
    controller = AppController(settings)
    window = MainWindow(controller)
    qtbot.addWidget(window)
    try:
        with pulse.record_speaker() as untouched:
            window.show()
            window.start()
            qtbot.waitUntil(lambda: window.status.model is not None, timeout=300_000)
            qtbot.wait(2500)  # ready and waiting: still nothing may play
        status = window.status
        assert status.state is AppState.READY and status.model.variant.demo and not status.conversation
        assert window.pages.currentWidget() is window.first_run and window.first_run.start_button.isVisible()
        assert window.first_run.start_button.text() == "Try the demo"
        peak = float(np.abs(untouched.samples).max())
        print(f"\nuntouched first launch: {untouched.samples.size / 22_050:.1f} s recorded, peak {dbfs(peak):.1f} dBFS")
        assert untouched.samples.size > 22_050, "the recording covers the launch"
        assert peak < SILENT_PEAK, f"the untouched first launch played sound (peak {dbfs(peak):.1f} dBFS)"

        with pulse.record_speaker() as demo:
            window.first_run.start_button.click()  # "Try the demo"
            qtbot.waitUntil(lambda: window.status.conversation, timeout=10_000)
            qtbot.wait(3000)
        samples = demo.samples[demo.samples.size // 3 :]  # past the start
        peak, rms = float(np.abs(samples).max()), float(np.sqrt(np.mean(samples**2)))
        print(f"the demo at the default volume: peak {dbfs(peak):.1f} dBFS, RMS {dbfs(rms):.1f} dBFS")
        assert window.header.demo_badge.isVisible() and "noise" in window.header.demo_badge.text()
        assert rms > 10 ** (-70 / 20), "the demo is heard"
        assert peak <= OUTPUT_CEILING + 1e-3, "never above the limiter's ceiling"
        assert rms < 10 ** (-30 / 20), "comfortably quiet (the issue measured -8.7 dBFS RMS)"

        volume = window.conversation.volume
        volume.slider.setValue(30)
        volume.mute_button.click()
        qtbot.wait(500)  # what the sound server already holds still plays out
        with pulse.record_speaker() as muted:
            qtbot.wait(1500)
        assert float(np.abs(muted.samples).max()) < SILENT_PEAK, "muted: nothing reaches the speaker"
        assert window.status.conversation, "muting does not stop the conversation"
        qtbot.waitUntil(lambda: load_settings().settings.muted, timeout=5000)
        saved = json.loads((tmp_path / "xdg_config_home" / "Parley" / "settings.json").read_text())
        assert saved["volume"] == pytest.approx(0.3) and saved["muted"] is True, "remembered for the next launch"
    finally:
        window.pump.stop()
        window.close()
        controller.shutdown()
