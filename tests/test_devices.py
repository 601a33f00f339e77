"""The sound devices as a user meets them, with the real app core and window on PulseAudio's virtual devices.

The lists and the status bar name the sound server's devices by their descriptions, and the microphone is
open only while a conversation reads it: not on the welcome page, not once the conversation has ended.
Set ``PARLEY_SHOTS`` to a folder to keep screenshots of the status bar and the device lists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.audio.devices import refresh_devices
from app.controller import AppController
from app.settings import load_settings
from tests.pulse import MIC, MIC_DESCRIPTION, MIC_FEED_DESCRIPTION, SPEAKER_DESCRIPTION, PulseServer, virtual_devices
from ui.app_window import MainWindow

pytestmark = [pytest.mark.audio, pytest.mark.gui]


@pytest.fixture
def pulse() -> Iterator[PulseServer]:
    with virtual_devices() as server:
        refresh_devices()
        yield server


def capture_streams(pulse: PulseServer) -> list[str]:
    """The source of each client's recording stream now (module-remap-source's own stream left out)."""
    sources = {line.split()[0]: line.split()[1] for line in pulse.pactl("list", "short", "sources").splitlines()}
    streams = [line.split() for line in pulse.pactl("list", "short", "source-outputs").splitlines()]
    return [sources[fields[1]] for fields in streams if fields[2] != "-"]


def shot(widget: object, name: str) -> None:
    folder = os.environ.get("PARLEY_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        widget.grab().save(str(Path(folder) / name))  # type: ignore[attr-defined]


def test_devices_are_named_by_the_sound_server_and_the_microphone_opens_only_for_a_conversation(
    pulse: PulseServer, qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    settings, _ = load_settings()
    controller = AppController(settings)
    controller.worker.max_conversation_s = 2.4  # the conversation ends by itself, as a long one does
    window = MainWindow(controller)
    qtbot.addWidget(window)
    try:
        window.show()
        window.start()
        qtbot.waitUntil(lambda: window.status.model is not None, timeout=300_000)
        qtbot.wait(1000)
        assert window.pages.currentWidget() is window.first_run, "the welcome page"
        assert capture_streams(pulse) == [], "nothing listens on the welcome page"
        expected = f"Mic: {MIC_DESCRIPTION}  ·  Speaker: {SPEAKER_DESCRIPTION}"
        assert window.device_label.text() == expected
        shot(window, "status-bar-devices.png")

        dialog = window.open_settings()
        dialog.tabs.setCurrentIndex(1)  # Audio: the lists fill when it opens
        qtbot.waitUntil(lambda: dialog.output_combo.count() == 3, timeout=10_000)
        microphones = [dialog.input_combo.itemText(i) for i in range(dialog.input_combo.count())]
        speakers = [dialog.output_combo.itemText(i) for i in range(dialog.output_combo.count())]
        assert microphones == ["System default", MIC_DESCRIPTION]
        assert speakers[0] == "System default"
        assert sorted(speakers[1:]) == sorted([SPEAKER_DESCRIPTION, MIC_FEED_DESCRIPTION])
        shot(dialog, "settings-devices.png")
        dialog.output_combo.showPopup()
        qtbot.wait(200)
        shot(dialog.output_combo.view().window(), "settings-speaker-list.png")
        dialog.output_combo.hidePopup()
        dialog.reject()
        assert capture_streams(pulse) == [], "refreshing the lists opens no microphone"

        controller.set_talking(True)  # the talk key: the conversation starts and reads the microphone
        qtbot.waitUntil(lambda: capture_streams(pulse) == [MIC], timeout=10_000)
        qtbot.waitUntil(lambda: window.status.conversation, timeout=10_000)
        controller.set_talking(False)
        # At its length limit the conversation ends: the microphone closes with it.
        qtbot.waitUntil(lambda: not window.status.conversation, timeout=60_000)
        qtbot.waitUntil(lambda: capture_streams(pulse) == [], timeout=10_000)
        assert window.device_label.text() == expected, "a closed microphone is still the one in use"

        controller.set_talking(True)  # the next conversation opens it again ...
        qtbot.waitUntil(lambda: capture_streams(pulse) == [MIC], timeout=10_000)
        controller.set_talking(False)
        controller.stop_speaking()  # ... and Stop, which puts the conversation to sleep, closes it
        qtbot.waitUntil(lambda: capture_streams(pulse) == [], timeout=10_000)
    finally:
        window.close()
        controller.shutdown()
    assert capture_streams(pulse) == []


_STARVE = """
import sys, time
from tests.pulse import virtual_devices
with virtual_devices():
    if sys.argv[1] == "parley":
        from app.audio.devices import _sounddevice
        sd = _sounddevice()
    else:
        import sounddevice as sd
    def late(outdata, frames, time_info, status):  # every block far too late: the speaker starves
        outdata.fill(0.0)
        time.sleep(0.15)
    stream = sd.OutputStream(device="pulse", samplerate=44100, channels=1, latency=0.02, blocksize=256, callback=late)
    stream.start()
    time.sleep(1.5)
    stream.close()
    if sys.argv[1] == "parley":
        from app.audio.alsa import xruns
        print("underruns", xruns["underrun"])
"""


@pytest.mark.audio
def test_alsa_lib_messages_go_to_the_log_not_the_terminal() -> None:
    import subprocess
    import sys

    def starve(how: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", _STARVE, how]
        root = Path(__file__).parents[1]
        return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120, check=True)

    plain = starve("plain")
    assert "ALSA lib pcm.c" in plain.stderr and "underrun occurred" in plain.stderr, "the speaker starved"
    parley = starve("parley")
    print(f"\nstarved speaker: {plain.stderr.count('underrun occurred')} ALSA lines on a plain stderr; {parley.stdout}")
    assert "ALSA lib" not in parley.stderr
    assert int(parley.stdout.split()[-1]) >= 1, "the underruns are counted"
