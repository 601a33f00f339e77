"""A global push-to-talk key: talk while another app is in front.

Three layers, so that the logic is tested with injected key events and no display:

1. **Key specs** — what the user types in Settings: ``"F8"``, ``"ctrl+space"``, ``"right alt"``,
   ``"cmd+shift+k"``. ``parse_key_spec(text) -> KeySpec`` (``KeySpecError`` with a plain-words message
   for anything it cannot use) and ``format_key_spec(spec, platform=sys.platform) -> str`` ("Ctrl+Space",
   "Right Option" on a Mac); ``parse_key_spec(format_key_spec(spec)) == spec`` on every platform.
   A key that types text (a letter, Space, Enter…) alone or with only Shift is refused for the global key,
   since it would start talking whenever the user types it in another app; ``allow_typing_keys=True``
   accepts it (the in-window key, Space by default).
2. **The state machine** — ``TalkKeyStateMachine(spec, mode)``: fed canonical key names by
   ``press(name)`` / ``release(name)`` / ``focus_lost()``, each returning ``TalkEvent.START``,
   ``TalkEvent.STOP`` or ``None``. Hold mode talks from the press of the key (with exactly its modifiers
   held, so ``ctrl+F8`` does not fire for ``F8``) to the release of the key or of a required modifier;
   toggle mode flips on each press. Auto-repeat presses are ignored. ``focus_lost()`` — the listener
   missed events (macOS secure input, a locked screen, a restarted listener) — forgets every held key
   and, in hold mode, stops talking (a key whose release was not seen must not leave the mic open).
   The same machine serves the in-window key: the window feeds it its key events (auto-repeats included)
   and calls ``focus_lost()`` when it is deactivated.
3. **Backends** — ``HotkeyBackend`` (``start(on_press, on_release, on_lost)`` / ``stop()``), with
   ``PynputBackend`` for macOS, X11 and Windows. ``GlobalTalkKey(spec, on_talk, mode, backend)`` joins
   a backend to the state machine; ``on_talk(TalkEvent)`` is called on the backend's thread (the UI
   must hand it to its own thread, e.g. through a Qt queued signal). ``start()`` raises
   ``HotkeyUnavailable`` with the reason in words; ``stop()`` ends a talk in progress (hold mode);
   ``configure(spec, mode)`` changes the key from Settings, ending a talk in progress. A failing
   ``on_talk`` is logged and never stops the listener.

Where it works: ``global_key_support(environ=…, platform=…, mac_permissions=…) -> GlobalKeySupport``
says, in words for the Settings page, whether a global key can work here and what to do if not:

- **macOS**: pynput's event tap needs the **Input Monitoring** and **Accessibility** permissions for
  Parley (or for the terminal it was started from). ``read_mac_permissions()`` reads both
  (``IOHIDCheckAccess``, ``AXIsProcessTrusted``); the message says where to turn them on, and
  ``settings_urls`` opens the right System Settings panes. ``request_input_monitoring()`` shows the
  system's own prompt once.
- **X11**: works through pynput (the RECORD extension).
- **Wayland**: unavailable — the compositor does not show an app the keys pressed in other apps (XWayland
  only sees X11 windows' keys) — said plainly; the in-window key still works. (The desktop portal's
  GlobalShortcuts interface reports press and release and could be a later route on KDE and GNOME 48+.)
- **Windows**: works through pynput.

No Qt here; ``pynput`` is imported only by ``PynputBackend.start`` (importing it without a display fails).
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- key names

MODIFIER_FAMILIES: Final[dict[str, frozenset[str]]] = {
    "ctrl": frozenset({"ctrl", "ctrl_l", "ctrl_r"}),
    "shift": frozenset({"shift", "shift_l", "shift_r"}),
    "alt": frozenset({"alt", "alt_l", "alt_r"}),
    "alt_gr": frozenset({"alt_gr"}),
    "cmd": frozenset({"cmd", "cmd_l", "cmd_r"}),
}
MODIFIERS: Final = frozenset().union(*MODIFIER_FAMILIES.values())
_FAMILY_OF: Final = {name: family for family, names in MODIFIER_FAMILIES.items() for name in names}

NAMED_KEYS: Final = frozenset(
    {
        *(f"f{number}" for number in range(1, 25)),
        *("backspace", "caps_lock", "delete", "down", "end", "enter", "esc", "home", "left", "page_down"),
        *("page_up", "right", "space", "tab", "up", "insert", "menu", "num_lock", "pause", "print_screen"),
        *("scroll_lock", "media_play_pause", "media_volume_mute", "media_volume_down", "media_volume_up"),
        *("media_previous", "media_next"),
    }
)
CHARACTER_KEYS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789`-=[]\\;',./")
TYPING_KEYS: Final = CHARACTER_KEYS | {"space", "enter", "tab", "backspace"}
"""Keys that type or edit text: refused as a global key unless Ctrl, Alt or Cmd is held with them."""

_ALIASES: Final = {
    "control": "ctrl",
    "ctl": "ctrl",
    "option": "alt",
    "opt": "alt",
    "⌥": "alt",
    "command": "cmd",
    "super": "cmd",
    "win": "cmd",
    "windows": "cmd",
    "meta": "cmd",
    "⌘": "cmd",
    "⌃": "ctrl",
    "⇧": "shift",
    "altgr": "alt_gr",
    "alt gr": "alt_gr",
    "return": "enter",
    "escape": "esc",
    "del": "delete",
    "ins": "insert",
    "pgup": "page_up",
    "pageup": "page_up",
    "page up": "page_up",
    "pgdn": "page_down",
    "pagedown": "page_down",
    "page down": "page_down",
    "prtsc": "print_screen",
    "printscreen": "print_screen",
    "print screen": "print_screen",
    "capslock": "caps_lock",
    "caps lock": "caps_lock",
    "numlock": "num_lock",
    "scrolllock": "scroll_lock",
    "spacebar": "space",
    "plus": "+",
    "minus": "-",
    "comma": ",",
    "period": ".",
    "slash": "/",
    "backslash": "\\",
    "semicolon": ";",
    "quote": "'",
    "backquote": "`",
    "grave": "`",
}
_SIDES: Final = {"left": "_l", "l": "_l", "right": "_r", "r": "_r"}
EXAMPLES: Final = "For example: F8, ctrl+space, right alt."


class KeySpecError(ValueError):
    """A key spec Parley cannot use; ``str(error)`` says why, for the user."""


@dataclass(frozen=True)
class KeySpec:
    """One key, and the modifiers held with it. Names are canonical (see ``parse_key_spec``).

    ``key``: ``"f8"``, ``"space"``, ``"a"``, ``"alt_r"`` (a modifier may be the key itself);
    ``modifiers``: family names (``"ctrl"``: either side) or sided names (``"ctrl_r"``).
    """

    key: str
    modifiers: frozenset[str] = frozenset()


def _canonical(token: str) -> str | None:
    """One token (``"Right Alt"``, ``"ctrl"``, ``"F8"``, ``"-"``) as a canonical key name, or ``None``."""
    raw = token.strip()
    if raw.lower() in CHARACTER_KEYS or raw == "+":  # before "-" and "_" are read as word separators
        return raw.lower()
    text = " ".join(raw.lower().replace("-", " ").replace("_", " ").split())
    text = _ALIASES.get(text, text)
    if text in MODIFIERS or text in NAMED_KEYS or text in CHARACTER_KEYS or text == "+":
        return text
    words = text.split()
    joined = "_".join(words)
    if joined in MODIFIERS or joined in NAMED_KEYS:  # "page down", "caps lock", "alt r", "media next"
        return joined
    if len(words) == 2:  # "right alt", "alt right", "left_ctrl", "right option"
        for side, name in ((words[0], words[1]), (words[1], words[0])):
            base = _ALIASES.get(name, name)
            if side in _SIDES and base in MODIFIER_FAMILIES and base != "alt_gr":
                return base + _SIDES[side]
    if len(words) == 1 and len(text) > 1 and text[0] in "lr":  # "ralt", "lctrl"
        base = _ALIASES.get(text[1:], text[1:])
        if base in MODIFIER_FAMILIES and base != "alt_gr":
            return base + _SIDES[text[0]]
    return None


def parse_key_spec(text: str, *, allow_typing_keys: bool = False) -> KeySpec:
    """``"ctrl+space"`` → ``KeySpec("space", {"ctrl"})``. The last part is the key, the others its modifiers.

    Raises:
        KeySpecError: empty, an unknown key, two keys that are not modifiers, a repeated modifier, or
        (unless ``allow_typing_keys``) a key that types text without Ctrl, Alt or Cmd.
    """
    stripped = text.strip()
    if not stripped:
        raise KeySpecError(f"No key given. {EXAMPLES}")
    if stripped == "+":
        parts = ["+"]
    elif stripped.endswith("++"):  # "ctrl++": the plus key itself, with ctrl
        parts = [part.strip() for part in stripped[:-2].split("+")] + ["+"]
    else:
        parts = [part.strip() for part in stripped.split("+")]
    if any(part == "" for part in parts):
        raise KeySpecError(f"'{stripped}' has an empty part between its '+' signs. {EXAMPLES}")
    names: list[str] = []
    for part in parts:
        name = _canonical(part)
        if name is None:
            raise KeySpecError(f"'{part}' is not a key Parley knows. {EXAMPLES}")
        names.append(name)
    *modifiers, key = names
    not_modifiers = [name for name in modifiers if name not in MODIFIERS]
    if not_modifiers:
        raise KeySpecError(
            f"'{stripped}' names more than one key ({', '.join([*not_modifiers, key])}). Hold modifiers "
            f"(ctrl, shift, alt, cmd) with one key, for example ctrl+{key}."
        )
    families = [_FAMILY_OF[name] for name in modifiers]
    if key in MODIFIERS:
        families.append(_FAMILY_OF[key])
    repeated = sorted({family for family in families if families.count(family) > 1})
    if repeated:
        raise KeySpecError(f"'{stripped}' names {', '.join(repeated)} twice.")
    chord = {_FAMILY_OF[name] for name in modifiers}
    if not allow_typing_keys and key in TYPING_KEYS | {"+"} and not chord - {"shift"}:
        shown = format_key_spec(KeySpec(key, frozenset(modifiers)))
        raise KeySpecError(
            f"'{shown}' types text, so as a global key it would start talking whenever you type it in another "
            f"app. Add ctrl, alt or cmd (for example ctrl+{_display_name(key, sys.platform)}), or choose a key "
            "such as F8."
        )
    return KeySpec(key, frozenset(modifiers))


_DISPLAY_BASE: Final = {
    "ctrl": {"darwin": "Control", "default": "Ctrl"},
    "shift": {"default": "Shift"},
    "alt": {"darwin": "Option", "default": "Alt"},
    "alt_gr": {"default": "AltGr"},
    "cmd": {"darwin": "Command", "win32": "Win", "default": "Super"},
}
_DISPLAY_NAMED: Final = {
    "esc": "Esc",
    "page_up": "Page Up",
    "page_down": "Page Down",
    "caps_lock": "Caps Lock",
    "num_lock": "Num Lock",
    "scroll_lock": "Scroll Lock",
    "print_screen": "Print Screen",
    "+": "Plus",
}
_MODIFIER_ORDER: Final = ("ctrl", "alt", "alt_gr", "shift", "cmd")


def _display_name(name: str, platform: str) -> str:
    family = _FAMILY_OF.get(name)
    if family is not None:
        names = _DISPLAY_BASE[family]
        base = names.get(platform, names["default"])
        side = {"_l": "Left ", "_r": "Right "}.get(name[-2:], "") if name != family else ""
        return f"{side}{base}"
    if name in _DISPLAY_NAMED:
        return _DISPLAY_NAMED[name]
    if name in NAMED_KEYS:
        return name.upper() if name[0] == "f" and name[1:].isdigit() else name.replace("_", " ").title()
    return name.upper() if name.isalpha() else name


def format_key_spec(spec: KeySpec, *, platform: str = sys.platform) -> str:
    """``KeySpec("space", {"ctrl"})`` → ``"Ctrl+Space"``; the names each platform's keyboards use."""
    ordered = sorted(spec.modifiers, key=lambda name: (_MODIFIER_ORDER.index(_FAMILY_OF[name]), name))
    return "+".join(_display_name(name, platform) for name in [*ordered, spec.key])


# --------------------------------------------------------------------------- the state machine


class TalkEvent(enum.Enum):
    START = "start"
    STOP = "stop"


class TalkMode(enum.Enum):
    HOLD = "hold"  # talk while the key is held
    TOGGLE = "toggle"  # each press starts or stops talking


def _matches(required: str, held: str) -> bool:
    """Whether the held key ``held`` is the key ``required`` names (``ctrl`` is either Ctrl)."""
    if required == held:
        return True
    return required in MODIFIER_FAMILIES and _FAMILY_OF.get(held) == required


class TalkKeyStateMachine:
    """Turns key presses and releases into talk start / stop (see the module docstring). Not thread-safe."""

    def __init__(self, spec: KeySpec, mode: TalkMode = TalkMode.HOLD) -> None:
        self.spec = spec
        self.mode = mode
        self.talking = False
        self._held: list[str] = []  # in press order

    def press(self, name: str) -> TalkEvent | None:
        if name in self._held:
            return None  # auto-repeat: the OS repeats the press while the key stays down
        self._held.append(name)
        if not _matches(self.spec.key, name) or not self._chord_exact(main=name):
            return None
        if self.mode is TalkMode.TOGGLE:
            self.talking = not self.talking
            return TalkEvent.START if self.talking else TalkEvent.STOP
        if self.talking:
            return None
        self.talking = True
        return TalkEvent.START

    def release(self, name: str) -> TalkEvent | None:
        if name not in self._held:
            return None  # pressed before we listened, or already forgotten
        self._held.remove(name)
        if self.mode is TalkMode.TOGGLE or not self.talking:
            return None
        key_released = _matches(self.spec.key, name) and not any(_matches(self.spec.key, h) for h in self._held)
        if key_released or not self._modifiers_held():
            self.talking = False
            return TalkEvent.STOP
        return None

    def focus_lost(self) -> TalkEvent | None:
        """Events were missed: forget every held key; in hold mode, stop talking."""
        self._held.clear()
        if self.mode is TalkMode.HOLD and self.talking:
            self.talking = False
            return TalkEvent.STOP
        return None

    def _modifiers_held(self) -> bool:
        return all(any(_matches(required, held) for held in self._held) for required in self.spec.modifiers)

    def _chord_exact(self, main: str) -> bool:
        """The required modifiers are held, and no other modifier is."""
        others = [held for held in self._held if held != main and held in MODIFIERS]
        if not self._modifiers_held():
            return False
        return all(any(_matches(required, held) for required in self.spec.modifiers) for held in others)


# --------------------------------------------------------------------------- where it works


@dataclass(frozen=True)
class MacPermissions:
    input_monitoring: bool | None  # None: this macOS does not say (before 10.15)
    accessibility: bool


@dataclass(frozen=True)
class GlobalKeySupport:
    """Whether a global key can work here, in words for the Settings page."""

    available: bool
    session: str  # "macos" | "x11" | "wayland" | "windows" | "none"
    message: str
    settings_urls: tuple[str, ...] = ()  # System Settings panes that grant what is missing (macOS)


INPUT_MONITORING_URL: Final = "x-apple.systempreferences:com.apple.preference.security?Privacy_ListenEvent"
ACCESSIBILITY_URL: Final = "x-apple.systempreferences:com.apple.preference.security?Privacy_Accessibility"
WAYLAND_MESSAGE: Final = (
    "A global talk key is not available under Wayland: the desktop does not let an app see keys pressed in "
    "other apps. Hold the talk key in Parley's window instead (or log in to an X11 session)."
)


def global_key_support(
    *,
    environ: Mapping[str, str] | None = None,
    platform: str | None = None,
    mac_permissions: Callable[[], MacPermissions] | None = None,
) -> GlobalKeySupport:
    """Whether a global talk key can work in this session (everything injectable, for tests)."""
    env = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if platform == "darwin":
        permissions = (mac_permissions or read_mac_permissions)()
        missing = []
        urls = []
        if permissions.input_monitoring is False:
            missing.append("Input Monitoring")
            urls.append(INPUT_MONITORING_URL)
        if not permissions.accessibility:
            missing.append("Accessibility")
            urls.append(ACCESSIBILITY_URL)
        if not missing:
            return GlobalKeySupport(True, "macos", "The talk key works while other apps are in front.")
        panes = " and ".join(missing)
        return GlobalKeySupport(
            False,
            "macos",
            f"To use the talk key while other apps are in front, Parley needs the {panes} permission. Open "
            f"System Settings → Privacy & Security → {missing[0]}, turn on Parley"
            + (" (then do the same under Accessibility)" if len(missing) == 2 else "")
            + ", then quit and reopen Parley. If you start Parley from Terminal, turn it on for Terminal instead.",
            tuple(urls),
        )
    if platform == "win32":
        return GlobalKeySupport(True, "windows", "The talk key works while other apps are in front.")
    if env.get("XDG_SESSION_TYPE", "").lower() == "wayland" or env.get("WAYLAND_DISPLAY"):
        return GlobalKeySupport(False, "wayland", WAYLAND_MESSAGE)
    if env.get("DISPLAY"):
        return GlobalKeySupport(True, "x11", "The talk key works while other apps are in front.")
    return GlobalKeySupport(
        False,
        "none",
        "A global talk key needs a graphical desktop session, and none was found (DISPLAY is not set).",
    )


def read_mac_permissions() -> MacPermissions:
    """Input Monitoring (``IOHIDCheckAccess``) and Accessibility (``AXIsProcessTrusted``) for this process."""
    import ctypes

    iokit = ctypes.cdll.LoadLibrary("/System/Library/Frameworks/IOKit.framework/IOKit")
    services = ctypes.cdll.LoadLibrary("/System/Library/Frameworks/ApplicationServices.framework/ApplicationServices")
    services.AXIsProcessTrusted.restype = ctypes.c_bool
    input_monitoring: bool | None = None
    check = getattr(iokit, "IOHIDCheckAccess", None)  # macOS 10.15+
    if check is not None:
        check.restype = ctypes.c_uint
        check.argtypes = [ctypes.c_uint]
        k_request_listen_event, k_access_granted = 1, 0
        input_monitoring = check(k_request_listen_event) == k_access_granted
    return MacPermissions(input_monitoring=input_monitoring, accessibility=bool(services.AXIsProcessTrusted()))


def request_input_monitoring() -> bool:
    """macOS: show the system's Input Monitoring prompt (once per app); ``True`` when already granted."""
    import ctypes

    iokit = ctypes.cdll.LoadLibrary("/System/Library/Frameworks/IOKit.framework/IOKit")
    request = iokit.IOHIDRequestAccess
    request.restype = ctypes.c_bool
    request.argtypes = [ctypes.c_uint]
    return bool(request(1))


# --------------------------------------------------------------------------- backends


class HotkeyUnavailable(RuntimeError):
    """A global key cannot run here; ``str(error)`` is the plain-words reason (``GlobalKeySupport.message``)."""


KeyCallback = Callable[[str], None]


class HotkeyBackend(Protocol):
    """Delivers every key press and release in the session as canonical key names."""

    def start(self, on_press: KeyCallback, on_release: KeyCallback, on_lost: Callable[[], None]) -> None:
        """Start listening (raises ``HotkeyUnavailable``); callbacks come on the backend's own thread."""
        ...

    def stop(self) -> None: ...


_CONTROL_CHARACTERS: Final = {" ": "space", "\t": "tab", "\r": "enter", "\n": "enter", "\x08": "backspace"}


def pynput_key_name(key: Any) -> str | None:
    """A pynput ``Key`` or ``KeyCode`` as a canonical name (``None`` for keys a spec cannot name)."""
    name = getattr(key, "name", None)
    if isinstance(name, str) and hasattr(key, "value"):  # a pynput Key (an enum member)
        return name if name in MODIFIERS or name in NAMED_KEYS else None
    char = getattr(key, "char", None)
    if isinstance(char, str) and len(char) == 1:
        if char in _CONTROL_CHARACTERS:
            return _CONTROL_CHARACTERS[char]
        if "\x01" <= char <= "\x1a":  # Ctrl held: some platforms report the control character
            return chr(ord(char) + 96)
        lowered = char.lower()
        return lowered if lowered in CHARACTER_KEYS or lowered == "+" else None
    return None


def _pynput_keyboard() -> Any:
    """``pynput.keyboard``, imported on first use: its import connects to the display and fails without one."""
    if TYPE_CHECKING:  # pynput ships no type information; the plain import below stays visible to PyInstaller
        keyboard: Any = None
    else:
        import pynput.keyboard as keyboard
    return keyboard


class PynputBackend:
    """macOS, X11 and Windows through pynput's keyboard listener (listen only: keys still reach other apps)."""

    def __init__(self) -> None:
        self._listener: Any = None
        self._active: object | None = None  # the running listener's token: a stopped one's events are dropped

    def start(self, on_press: KeyCallback, on_release: KeyCallback, on_lost: Callable[[], None]) -> None:
        support = global_key_support()
        if not support.available:
            raise HotkeyUnavailable(support.message)
        try:
            keyboard = _pynput_keyboard()
        except ImportError as error:  # no X server reachable, or pynput missing
            raise HotkeyUnavailable(f"A global talk key is not available here ({error}).") from error
        token = object()

        def pressed(key: Any) -> None:
            name = pynput_key_name(key)
            if name is not None and self._active is token:
                on_press(name)

        def released(key: Any) -> None:
            name = pynput_key_name(key)
            if name is not None and self._active is token:
                on_release(name)

        listener = keyboard.Listener(on_press=pressed, on_release=released)
        listener.start()
        listener.wait()  # until the platform hook is in place
        if sys.platform == "darwin" and not getattr(listener, "IS_TRUSTED", True):
            listener.stop()
            raise HotkeyUnavailable(global_key_support(mac_permissions=lambda: MacPermissions(None, False)).message)
        self._listener, self._active = listener, token

    def stop(self) -> None:
        listener, self._listener, self._active = self._listener, None, None
        if listener is not None:
            # No join: pynput's X11 listener only notices the stop at the next key event (its thread is a
            # daemon, and the token above keeps that last event from reaching anyone).
            listener.stop()


class GlobalTalkKey:
    """A backend joined to a ``TalkKeyStateMachine``; ``on_talk`` gets START / STOP on the backend's thread."""

    def __init__(
        self,
        spec: KeySpec,
        on_talk: Callable[[TalkEvent], None],
        *,
        mode: TalkMode = TalkMode.HOLD,
        backend: HotkeyBackend | None = None,
    ) -> None:
        self._machine = TalkKeyStateMachine(spec, mode)
        self._on_talk = on_talk
        self._backend: HotkeyBackend = backend if backend is not None else PynputBackend()
        self._lock = threading.Lock()
        self._running = False

    @property
    def talking(self) -> bool:
        return self._machine.talking

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        """Start listening. Raises ``HotkeyUnavailable`` with the reason, in words."""
        if self._running:
            return
        self._backend.start(self._pressed, self._released, self._lost)
        self._running = True

    def stop(self) -> None:
        """Stop listening; a talk in progress (hold mode) stops."""
        if not self._running:
            return
        self._backend.stop()
        self._running = False
        self._emit(self._machine.focus_lost)

    def configure(self, spec: KeySpec, mode: TalkMode | None = None) -> None:
        """A new key or mode from Settings; a talk in progress stops first."""
        with self._lock:
            event = self._machine.focus_lost()
            if event is None and self._machine.talking:
                self._machine.talking = False
                event = TalkEvent.STOP
            self._machine = TalkKeyStateMachine(spec, mode or self._machine.mode)
        if event is not None:
            self._on_talk(event)

    def _pressed(self, name: str) -> None:
        self._emit(lambda: self._machine.press(name))

    def _released(self, name: str) -> None:
        self._emit(lambda: self._machine.release(name))

    def _lost(self) -> None:
        self._emit(self._machine.focus_lost)

    def _emit(self, step: Callable[[], TalkEvent | None]) -> None:
        with self._lock:
            event = step()
        if event is not None:
            try:
                self._on_talk(event)
            except Exception:  # a failing handler must not kill the listener thread
                log.exception("The talk key's handler failed")
