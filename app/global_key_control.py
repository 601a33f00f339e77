"""The talk key that works while other apps are in front: started, reconfigured and stopped from the settings.

Qt-free. The key's events arrive on the listener's thread and are only posted, as ``GlobalTalk`` messages, so
the window's talk control handles them on its own thread like the in-window key. In hands-free the key toggles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .hotkey import GlobalTalkKey, HotkeyBackend, HotkeyUnavailable, KeySpecError, TalkEvent, TalkMode, parse_key_spec
from .messages import Failure, GlobalTalk, Notice
from .settings import Settings

log = logging.getLogger(__name__)


class GlobalKeyControl:
    """Owns the ``GlobalTalkKey`` (if any) and keeps it in step with the settings."""

    def __init__(self, post: Callable[[object], None], backend: Callable[[], HotkeyBackend] | None = None) -> None:
        self._post = post
        self._backend = backend
        self._key: GlobalTalkKey | None = None

    @property
    def active(self) -> bool:
        return self._key is not None and self._key.running

    def configure(self, settings: Settings) -> None:
        if not settings.global_talk_key_enabled:
            self.stop()
            return
        try:
            spec = parse_key_spec(settings.global_talk_key)
        except KeySpecError as exc:
            self.stop()
            self._post(Failure(f"The talk key for other apps cannot be used: {exc}"))
            return
        mode = TalkMode.TOGGLE if settings.talk_mode == "toggle" or settings.hands_free else TalkMode.HOLD
        if self._key is not None:
            self._key.configure(spec, mode)
            log.info("Global talk key: %s (%s)", settings.global_talk_key, mode.value)
            return
        backend = self._backend() if self._backend is not None else None
        key = GlobalTalkKey(spec, self._talk, mode=mode, backend=backend)
        try:
            key.start()
        except HotkeyUnavailable as exc:
            log.warning("Global talk key unavailable: %s", exc)
            self._post(Notice(f"{exc} The talk key still works in Parley's window."))
            return
        self._key = key
        log.info("Global talk key: %s (%s)", settings.global_talk_key, mode.value)

    def stop(self) -> None:
        key, self._key = self._key, None
        if key is not None:
            key.stop()

    def _talk(self, event: TalkEvent) -> None:
        # On the key listener's thread: only the queue is touched here.
        self._post(GlobalTalk(event is TalkEvent.START))
