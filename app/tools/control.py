"""The controller's tools collaborator: the configuration file, the runner's life, the user's answers.

Qt-free; runs on the controller's thread, except :meth:`ToolControl.timer_fired` (a timer's thread) and the
listing thread, which only post. The runner is made once tools are offered (or a server's tools are listed) and
closed at quit; the worker gets it with ``SetTools`` and offers its tools from the next conversation on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from engine.timeline import OUTPUT_SAMPLE_RATE

from ..messages import Failure, TimerDone, ToolActivity, ToolResponseTiming, ToolsListed, ToolTurnHeard
from .builtin import TimerFired, chime
from .config import TOOLS_FILENAME, ToolsConfig, default_tools_path, load_tools_config, save_tools_config
from .mcp_servers import ToolFailure
from .runner import ToolRunner

if TYPE_CHECKING:
    from ..audio_port import AudioStreams
    from ..export import ConversationProfile, Transcript
    from ..status import StatusBoard
    from ..worker import EngineWorker

log = logging.getLogger(__name__)

TOOL_REPORTS: Final = (ToolActivity, ToolResponseTiming, ToolTurnHeard, TimerDone, ToolsListed)
"""What the controller hands to :meth:`ToolControl.observe`."""


class ToolControl:
    """Owns ``tools.json`` (as loaded and saved) and the ``ToolRunner``."""

    def __init__(
        self,
        path: Path | None,
        settings_path: Path | None,
        worker: EngineWorker,
        post: Callable[[object], None],
        log_folder: Path,
        board: StatusBoard,
    ) -> None:
        # Beside the settings file (tests give theirs a folder of its own), else in the config folder.
        beside = settings_path.with_name(TOOLS_FILENAME) if settings_path is not None else default_tools_path()
        self.path = path or beside
        self._worker = worker
        self._post = post
        self._log_folder = log_folder
        self._board = board
        loaded = load_tools_config(self.path)
        self.config = loaded.config
        for warning in loaded.warnings:
            post(Failure(warning))
        self.runner: ToolRunner | None = None
        self.last_frame = 0  # the latest frame reported, to place a timer's line in the transcript

    def _runner(self) -> ToolRunner:
        if self.runner is None:
            self.runner = ToolRunner(
                self.config, post=self._post, on_timer=self.timer_fired, log_folder=self._log_folder
            )
        return self.runner

    def configure(self) -> None:
        """Hand the configuration to the runner (made now if tools are offered) and the runner to the worker."""
        if self.config.offer_tools:
            self._runner().configure(self.config)
        elif self.runner is not None:
            self.runner.configure(self.config)
        from ..worker import SetTools

        self._worker.submit(SetTools(self.runner if self.config.offer_tools else None))

    def apply(self, config: ToolsConfig) -> bool:
        """Save and use ``config``; returns whether it changed (the conversation must start over to offer it)."""
        changed = config != self.config
        self.config = config
        self._save()
        if changed:
            log.info("Tools %s: %d server(s)", "offered" if config.offer_tools else "off", len(config.servers))
            self.configure()
        return changed

    def _save(self) -> None:
        try:
            save_tools_config(self.config, self.path)
        except OSError as exc:
            log.warning("Could not save the tools configuration: %s", exc)
            self._post(Failure(f"Could not save the tools configuration: {exc}"))

    def list_server_tools(self, name: str) -> None:
        """Ask server ``name`` for its tools on a thread of its own; ``ToolsListed`` or a ``Failure`` follows."""
        server = self.config.server(name)
        if server is None:
            self._post(Failure(f"There is no tool server named {name!r}."))
            return
        runner = self._runner()

        def listing() -> None:
            try:
                runner.list_tools(server)
            except ToolFailure as exc:
                self._post(Failure(f"Could not list the tools of {name!r}: {exc}."))

        threading.Thread(target=listing, name=f"parley-list-{name}", daemon=True).start()

    def keep_listed(self, listed: ToolsListed) -> None:
        """A server listed its tools: keep them (with the user's choices) in ``tools.json``."""
        server = self.config.server(listed.server)
        if server is None:
            return
        config = self.config.with_server(server.with_listed(tuple(listed.tools)))
        if config != self.config:
            self.config = config
            self._save()
            if self.runner is not None:
                self.runner.configure(config)

    def observe(
        self,
        message: object,
        transcript: Transcript,
        current: ConversationProfile | None,
        streams: AudioStreams | None,
    ) -> None:
        """Fold a tool report in: the transcript (so the history) and the profile; a fired timer chimes."""
        if isinstance(message, ToolsListed):
            self.keep_listed(message)
            return
        transcript.add(message)
        if isinstance(message, ToolActivity) and current is not None:
            current.tool_calls.append(message)
        elif isinstance(message, ToolResponseTiming) and current is not None:
            current.tool_responses.append(message)
        elif isinstance(message, ToolTurnHeard) and current is not None:
            current.tool_turns_heard.append(message)
        elif isinstance(message, TimerDone) and streams is not None:
            streams.play(chime(OUTPUT_SAMPLE_RATE))

    def answer_consent(self, request_id: int, allow: bool) -> None:
        answered = self.runner is not None and self.runner.answer_consent(request_id, allow)
        log.info("Tool call %d %s%s", request_id, "allowed" if allow else "denied", "" if answered else " (too late)")

    def timer_fired(self, fired: TimerFired) -> None:
        # On the timer's thread: only the queue is touched here.
        self._post(
            TimerDone(fired.label, fired.seconds, self.last_frame + 1 if self._board.engine.conversation else None)
        )

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
