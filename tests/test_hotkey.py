"""The global talk key (app/hotkey.py): key specs, the state machine through injected events, where it works.

The last test runs the real pynput backend against a private Xvfb server and presses keys with XTest.
"""

from __future__ import annotations

import enum
import gc
import logging
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from app.hotkey import (
    ACCESSIBILITY_URL,
    INPUT_MONITORING_URL,
    GlobalTalkKey,
    HotkeyUnavailable,
    KeySpec,
    KeySpecError,
    MacPermissions,
    PynputBackend,
    TalkEvent,
    TalkKeyStateMachine,
    TalkMode,
    format_key_spec,
    global_key_support,
    parse_key_spec,
    pynput_key_name,
)

START, STOP = TalkEvent.START, TalkEvent.STOP

# --------------------------------------------------------------------------- key specs


@pytest.mark.parametrize(
    ("text", "key", "modifiers"),
    [
        ("F8", "f8", set()),
        ("f12", "f12", set()),
        ("ctrl+space", "space", {"ctrl"}),
        ("Control + Space", "space", {"ctrl"}),
        ("right alt", "alt_r", set()),
        ("Right Option", "alt_r", set()),
        ("alt_r", "alt_r", set()),
        ("ralt", "alt_r", set()),
        ("alt right", "alt_r", set()),
        ("Left Ctrl+F1", "f1", {"ctrl_l"}),
        ("cmd+shift+K", "k", {"cmd", "shift"}),
        ("⌘+⇧+k", "k", {"cmd", "shift"}),
        ("super+f9", "f9", {"cmd"}),
        ("ctrl+shift", "shift", {"ctrl"}),
        ("AltGr", "alt_gr", set()),
        ("page down", "page_down", set()),
        ("ctrl+-", "-", {"ctrl"}),
        ("ctrl++", "+", {"ctrl"}),
        ("alt+plus", "+", {"alt"}),
        ("Media Play Pause", "media_play_pause", set()),
        ("escape", "esc", set()),
    ],
)
def test_key_specs_parse(text: str, key: str, modifiers: set[str]) -> None:
    assert parse_key_spec(text) == KeySpec(key, frozenset(modifiers))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "No key given"),
        ("   ", "No key given"),
        ("ctrl+", "empty part"),
        ("ctrl++shift", "empty part"),
        ("hyper", "'hyper' is not a key Parley knows"),
        ("ctrl+bogus", "'bogus' is not a key"),
        ("a+b", "names more than one key (a, b)"),
        ("f8+ctrl", "names more than one key"),
        ("ctrl+ctrl+x", "names ctrl twice"),
        ("ctrl+right ctrl+x", "names ctrl twice"),
        ("alt+right alt", "names alt twice"),
        ("a", "types text"),
        ("space", "types text"),
        ("shift+a", "types text"),
        ("enter", "types text"),
        ("+", "types text"),
    ],
)
def test_bad_key_specs_are_refused_in_words(text: str, message: str) -> None:
    with pytest.raises(KeySpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        parse_key_spec(text)


def test_every_error_message_gives_examples_or_a_way_out() -> None:
    for text in ("", "hyper", "a"):
        with pytest.raises(KeySpecError) as caught:
            parse_key_spec(text)
        assert "F8" in str(caught.value)


def test_typing_keys_are_accepted_for_the_in_window_key() -> None:
    assert parse_key_spec("space", allow_typing_keys=True) == KeySpec("space")
    assert parse_key_spec("ctrl+a") == KeySpec("a", frozenset({"ctrl"}))  # with ctrl it types nothing


@pytest.mark.parametrize(
    ("spec", "linux", "darwin", "win32"),
    [
        (KeySpec("f8"), "F8", "F8", "F8"),
        (KeySpec("space", frozenset({"ctrl"})), "Ctrl+Space", "Control+Space", "Ctrl+Space"),
        (KeySpec("alt_r"), "Right Alt", "Right Option", "Right Alt"),
        (KeySpec("k", frozenset({"shift", "cmd"})), "Shift+Super+K", "Shift+Command+K", "Shift+Win+K"),
        (KeySpec("f1", frozenset({"ctrl_l", "alt"})), "Left Ctrl+Alt+F1", "Left Control+Option+F1", "Left Ctrl+Alt+F1"),
        (KeySpec("page_down"), "Page Down", "Page Down", "Page Down"),
        (KeySpec("+", frozenset({"ctrl"})), "Ctrl+Plus", "Control+Plus", "Ctrl+Plus"),
        (KeySpec("alt_gr"), "AltGr", "AltGr", "AltGr"),
        (KeySpec("media_next"), "Media Next", "Media Next", "Media Next"),
    ],
)
def test_specs_are_shown_in_each_platform_words_and_read_back(
    spec: KeySpec, linux: str, darwin: str, win32: str
) -> None:
    for platform, shown in (("linux", linux), ("darwin", darwin), ("win32", win32)):
        assert format_key_spec(spec, platform=platform) == shown
        assert parse_key_spec(shown) == spec


# --------------------------------------------------------------------------- the state machine


def feed(machine: TalkKeyStateMachine, *steps: str) -> list[TalkEvent | None]:
    """``"+f8"`` presses f8, ``"-f8"`` releases it, ``"lost"`` loses focus; returns each step's event."""
    events: list[TalkEvent | None] = []
    for step in steps:
        if step == "lost":
            events.append(machine.focus_lost())
        elif step[0] == "+":
            events.append(machine.press(step[1:]))
        else:
            events.append(machine.release(step[1:]))
    return events


def test_hold_talks_from_press_to_release() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("F8"))
    assert feed(machine, "+f8", "-f8", "+f8", "-f8") == [START, STOP, START, STOP]
    assert not machine.talking


def test_auto_repeat_is_ignored() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("F8"))
    assert feed(machine, "+f8", "+f8", "+f8", "+f8", "-f8") == [START, None, None, None, STOP]


def test_a_combo_needs_its_modifiers_first_and_stops_when_one_is_let_go() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("ctrl+space"))
    assert feed(machine, "+space", "-space") == [None, None]  # space alone
    assert feed(machine, "+space", "+ctrl_l", "-space", "-ctrl_l") == [None, None, None, None]  # wrong order
    assert feed(machine, "+ctrl_r", "+space", "-ctrl_r", "-space") == [None, START, STOP, None]  # either ctrl


def test_a_sided_modifier_must_be_that_side() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("right ctrl+f1"))
    assert feed(machine, "+ctrl_l", "+f1", "-f1", "-ctrl_l") == [None, None, None, None]
    assert feed(machine, "+ctrl_r", "+f1", "-f1", "-ctrl_r") == [None, START, STOP, None]


def test_extra_modifiers_mean_another_shortcut() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("F8"))
    assert feed(machine, "+shift", "+f8", "-f8", "-shift") == [None, None, None, None]
    combo = TalkKeyStateMachine(parse_key_spec("ctrl+f8"))
    assert feed(combo, "+ctrl", "+alt", "+f8") == [None, None, None]


def test_a_modifier_pressed_while_talking_keeps_the_talk_going() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("F8"))
    assert feed(machine, "+f8", "+shift", "-shift", "-f8") == [START, None, None, STOP]


def test_a_lone_modifier_can_be_the_talk_key() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("right alt"))
    assert feed(machine, "+alt_r", "+alt_r", "-alt_r") == [START, None, STOP]
    assert feed(machine, "+alt_l", "-alt_l") == [None, None]
    assert feed(machine, "+ctrl", "+alt_r", "-alt_r", "-ctrl") == [None, None, None, None]


def test_focus_loss_stops_a_held_talk_and_forgets_held_keys() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("ctrl+f8"))
    assert feed(machine, "+ctrl", "+f8", "lost") == [None, START, STOP]
    assert feed(machine, "-f8", "-ctrl") == [None, None]  # releases of forgotten keys do nothing
    assert feed(machine, "+ctrl", "+f8", "-f8") == [None, START, STOP]  # and it works again
    assert feed(machine, "lost") == [None]


def test_a_release_never_seen_pressed_is_ignored() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("F8"))
    assert feed(machine, "-f8", "-ctrl", "+f8", "-f8") == [None, None, START, STOP]


def test_toggle_flips_on_each_press() -> None:
    machine = TalkKeyStateMachine(parse_key_spec("F8"), TalkMode.TOGGLE)
    assert feed(machine, "+f8", "+f8", "-f8", "+f8", "-f8") == [START, None, None, STOP, None]
    assert feed(machine, "+f8", "lost") == [START, None]  # a toggled talk survives missed events
    assert machine.talking
    assert feed(machine, "+f8") == [STOP]  # the held key was forgotten, so this press counts


# --------------------------------------------------------------------------- GlobalTalkKey with an injected backend


@dataclass
class FakeBackend:
    """A backend the test drives: ``press("f8")`` is a key event from the system."""

    unavailable: str | None = None
    callbacks: tuple[Callable[[str], None], Callable[[str], None], Callable[[], None]] | None = None
    stops: int = 0
    log: list[str] = field(default_factory=list)

    def start(
        self, on_press: Callable[[str], None], on_release: Callable[[str], None], on_lost: Callable[[], None]
    ) -> None:
        if self.unavailable:
            raise HotkeyUnavailable(self.unavailable)
        self.callbacks = (on_press, on_release, on_lost)

    def stop(self) -> None:
        self.stops += 1

    def press(self, name: str) -> None:
        assert self.callbacks is not None
        self.callbacks[0](name)

    def release(self, name: str) -> None:
        assert self.callbacks is not None
        self.callbacks[1](name)

    def lose(self) -> None:
        assert self.callbacks is not None
        self.callbacks[2]()


def test_the_global_key_reports_talk_start_and_stop() -> None:
    backend, events = FakeBackend(), []
    key = GlobalTalkKey(parse_key_spec("ctrl+f8"), events.append, backend=backend)
    key.start()
    backend.press("ctrl")
    backend.press("f8")
    assert events == [START] and key.talking
    backend.lose()
    assert events == [START, STOP]
    backend.press("ctrl")
    backend.press("f8")
    key.stop()  # closing the listener mid-talk stops the talk
    assert events == [START, STOP, START, STOP] and backend.stops == 1 and not key.running


def test_changing_the_key_mid_talk_stops_the_talk() -> None:
    backend, events = FakeBackend(), []
    key = GlobalTalkKey(parse_key_spec("f8"), events.append, backend=backend, mode=TalkMode.TOGGLE)
    key.start()
    backend.press("f8")
    key.configure(parse_key_spec("f9"))
    assert events == [START, STOP]
    backend.release("f8")
    backend.press("f8")
    backend.press("f9")
    assert events == [START, STOP, START]  # f8 no longer talks; f9 does, still in toggle mode


def test_a_failing_handler_does_not_break_the_listener(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend()
    calls = []

    def handler(event: TalkEvent) -> None:
        calls.append(event)
        raise RuntimeError("the UI is gone")

    key = GlobalTalkKey(parse_key_spec("f8"), handler, backend=backend)
    key.start()
    with caplog.at_level(logging.ERROR, logger="app.hotkey"):
        backend.press("f8")
        backend.release("f8")
    assert calls == [START, STOP]
    assert "handler failed" in caplog.text


def test_an_unavailable_backend_says_why() -> None:
    key = GlobalTalkKey(parse_key_spec("f8"), print, backend=FakeBackend(unavailable="not here"))
    with pytest.raises(HotkeyUnavailable, match="not here"):
        key.start()
    assert not key.running


# --------------------------------------------------------------------------- where it works


def test_wayland_is_detected_and_explained() -> None:
    for env in ({"XDG_SESSION_TYPE": "wayland", "DISPLAY": ":0"}, {"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}):
        support = global_key_support(environ=env, platform="linux")
        assert not support.available and support.session == "wayland"
        assert "not available under Wayland" in support.message and "Parley's window" in support.message


def test_x11_works_and_no_desktop_is_explained() -> None:
    assert global_key_support(environ={"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11"}, platform="linux").available
    headless = global_key_support(environ={}, platform="linux")
    assert not headless.available and headless.session == "none" and "DISPLAY" in headless.message


def test_windows_works() -> None:
    assert global_key_support(environ={}, platform="win32").available


@pytest.mark.parametrize(
    ("permissions", "available", "named", "urls"),
    [
        (MacPermissions(True, True), True, [], ()),
        (MacPermissions(None, True), True, [], ()),  # before macOS 10.15 there is no Input Monitoring
        (MacPermissions(False, True), False, ["Input Monitoring"], (INPUT_MONITORING_URL,)),
        (MacPermissions(True, False), False, ["Accessibility"], (ACCESSIBILITY_URL,)),
        (
            MacPermissions(False, False),
            False,
            ["Input Monitoring", "Accessibility"],
            (INPUT_MONITORING_URL, ACCESSIBILITY_URL),
        ),
    ],
)
def test_missing_mac_permissions_are_named_with_how_to_grant_them(
    permissions: MacPermissions, available: bool, named: list[str], urls: tuple[str, ...]
) -> None:
    support = global_key_support(environ={}, platform="darwin", mac_permissions=lambda: permissions)
    assert support.available is available and support.session == "macos"
    assert support.settings_urls == urls
    for name in named:
        assert name in support.message
    if not available:
        assert "System Settings → Privacy & Security" in support.message and "reopen Parley" in support.message


def test_the_pynput_backend_refuses_wayland_before_touching_pynput(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    with pytest.raises(HotkeyUnavailable, match="Wayland"):
        PynputBackend().start(print, print, print)


class FakePynputKey(enum.Enum):
    """Stands in for pynput's ``Key`` enum (importing pynput needs a display)."""

    f8 = 1
    alt_r = 2
    media_next = 3
    space = 4
    num_lock = 5


@dataclass
class FakeKeyCode:
    char: str | None = None
    vk: int | None = None


@pytest.mark.parametrize(
    ("key", "name"),
    [
        (FakePynputKey.f8, "f8"),
        (FakePynputKey.alt_r, "alt_r"),
        (FakePynputKey.media_next, "media_next"),
        (FakePynputKey.space, "space"),
        (FakeKeyCode("a"), "a"),
        (FakeKeyCode("A"), "a"),
        (FakeKeyCode("\x01"), "a"),  # ctrl+a as a control character
        (FakeKeyCode(" "), "space"),
        (FakeKeyCode("\r"), "enter"),
        (FakeKeyCode("-"), "-"),
        (FakeKeyCode("é"), None),
        (FakeKeyCode(None, vk=65), None),
    ],
)
def test_pynput_keys_get_canonical_names(key: object, name: str | None) -> None:
    assert pynput_key_name(key) == name


# --------------------------------------------------------------------------- the real backend on X11


@contextmanager
def private_x_server() -> Iterator[str]:
    read_end, write_end = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_end), "-screen", "0", "640x480x24", "-nolisten", "tcp"],
        pass_fds=(write_end,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 10.0)
        number = os.read(read_end, 16).decode().strip() if ready else ""
        if not number:
            raise RuntimeError(f"Xvfb did not start (exit code {server.poll()}); packaging/system-deps.sh test")
        yield f":{number}"
    finally:
        os.close(read_end)
        server.terminate()
        server.wait(10)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.gui
def test_the_pynput_backend_hears_keys_pressed_anywhere_on_x11(monkeypatch: pytest.MonkeyPatch) -> None:
    with private_x_server() as display:
        monkeypatch.setenv("DISPLAY", display)
        monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
        monkeypatch.setenv("XDG_SESSION_TYPE", "x11")
        events: list[TalkEvent] = []
        key = GlobalTalkKey(parse_key_spec("ctrl+f8"), events.append)
        key.start()
        from pynput.keyboard import Controller, Key, Listener  # the X server now exists

        keyboard = Controller()  # XTest: key events as from the hardware, into no window of ours
        try:
            keyboard.press(Key.ctrl)
            keyboard.press(Key.f8)
            wait_for(lambda: events[:1] == [START])
            keyboard.release(Key.f8)
            keyboard.release(Key.ctrl)
            wait_for(lambda: events[1:2] == [STOP])
            keyboard.press(Key.f8)  # f8 alone is another shortcut: no talk
            keyboard.release(Key.f8)
            time.sleep(0.3)  # the listener hears it within milliseconds
        finally:
            key.stop()
            # pynput's X11 listener ends at the next key event; what it sees then must reach nobody.
            keyboard.press(Key.ctrl)
            keyboard.press(Key.f8)
            keyboard.release(Key.f8)
            keyboard.release(Key.ctrl)
            wait_for(lambda: not [t for t in threading.enumerate() if isinstance(t, Listener)])
            del keyboard
            gc.collect()  # close the controller's display connection before the server goes
        # Keys pressed right after the listener starts are now and then delivered twice, a whole burst again
        # milliseconds later (about one run in eight: pynput reports the listener ready before it enables X's
        # record context). Each copy is a complete start and stop, never a stray start.
        assert events[:2] == [START, STOP] and events == [START, STOP] * (len(events) // 2), events
        assert not key.talking
