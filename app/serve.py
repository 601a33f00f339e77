"""``parley serve``: Parley's engine behind mlx-vlm's ``/v1/realtime`` WebSocket API, one conversation at a time.

Three parts, each with one job:

* :class:`EngineThread`, the one thread that owns MLX (as ``app.worker`` is for the window): it prepares the
  device, loads the checkpoint, and runs every session call. The event loop hands it jobs and awaits their
  results, so the loop never waits on the model and keeps answering pings, errors and refused clients.
* :class:`RealtimeServer`, the asyncio side (the ``websockets`` library): the handshake (the path, the token),
  the one-conversation reservation, and each connection's messages (``app.realtime_events`` parses and builds
  them). A connection that breaks, however it breaks, ends its session, writes its profile log and frees the
  server for the next client.
* :func:`serve_command`, the command line's entry.

A conversation is opened by ``session.update`` (its system prompt prefilled, its numerics switched in place on
the loaded model); another ``session.update`` before the first audio opens it again with the new settings,
after it is refused. ``input_audio_buffer.commit`` or ``response.cancel`` end it, and the server closes the
connection (as mlx-vlm does). Its frame timings go to a profile log in the app's export format (JSON, CSV and
Chrome trace, ``app.export.export_profile``), in the app's log folder unless ``--profile-dir`` says otherwise.

Access: 127.0.0.1 by default. Any other address needs a token (``--token`` or ``PARLEY_SERVE_TOKEN``), which a
client presents as ``Authorization: Bearer <token>`` or, where it cannot set headers (a browser), as the
``token`` query parameter; a wrong or missing token is refused in the handshake with HTTP 401.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from engine.errors import AudioInputError, ContextLimitError, SessionClosedError
from engine.events import Event, FrameTiming
from engine.timeline import CONVERSATION_FRAMES, FRAME_SECONDS, INPUT_FRAME_SAMPLES

from . import realtime_events as protocol
from .engine_port import MLXEngine
from .realtime_events import (
    DEFAULT_HOST,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PORT,
    PATH,
    TOKEN_ENV,
    ProtocolError,
    SessionConfig,
)

if TYPE_CHECKING:
    from engine import Session, VoiceChat

log = logging.getLogger(__name__)

BUSY_CLOSE = 1013  # "try again later", as mlx-vlm closes a refused second client

T = TypeVar("T")


class ServeError(ValueError):
    """The server cannot start as asked; the message says why."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- the engine thread


@dataclass
class _Job:
    run: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


def _finish(future: asyncio.Future[None]) -> None:
    """Complete a stop signal (once)."""
    if not future.done():
        future.set_result(None)


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


@dataclass(frozen=True)
class OpenedSession:
    session: Session
    numerics: str
    system_prompt: str
    max_seconds: float  # the client's limit, or the server's where that is shorter
    checkpoint: dict[str, Any]  # VoiceChat.describe() as the session opened (its numerics), for the profile log


class EngineThread:
    """The one thread that runs MLX: the device, the loaded checkpoint, every session call, in order."""

    def __init__(
        self,
        model: Path,
        *,
        numerics: str = "exact",
        warm_up: bool = True,
        conversation_seconds: float = CONVERSATION_FRAMES * FRAME_SECONDS,
    ) -> None:
        """``conversation_seconds``: the longest conversation (a client may ask for less); the load keeps memory
        for one that long."""
        self._model_path = model
        self._numerics = numerics
        self._warm_up = warm_up
        self._conversation_seconds = conversation_seconds
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._failure: BaseException | None = None
        self.voicechat: VoiceChat | None = None
        self.device = ""
        self._thread = threading.Thread(target=self._run, name="parley-serve-engine", daemon=True)
        # The app's way to the engine for what it shares with the window (device, load, warm-up, numerics); sessions
        # are made from the facade, as this server needs their flush and cancel.
        self._port = MLXEngine()

    def start(self) -> None:
        """Start the thread and wait until the model is loaded (and warmed up); raises what the load raised."""
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the jobs already given, then let the model go."""
        self._jobs.put(None)
        self._stopped.wait(timeout)

    @property
    def model_name(self) -> str:
        return "" if self.voicechat is None else self.voicechat.name

    def _run(self) -> None:
        engine = self._port
        try:
            _, self.device = engine.prepare_device()
            started = time.perf_counter()
            numerics = engine.check_numerics(self._numerics)
            voicechat = engine.load(
                self._model_path, conversation_seconds=self._conversation_seconds, numerics=numerics
            )
            if self._warm_up:
                engine.warm_up(voicechat, speech=None, progress=None)
            self.voicechat = voicechat
            log.info("Loaded %s (%s numerics) in %.1f s", voicechat.name, numerics, time.perf_counter() - started)
        except BaseException as exc:  # noqa: BLE001 - reported to start(), which raises it in the caller
            self._failure = exc
        self._ready.set()
        while self._failure is None and (job := self._jobs.get()) is not None:
            try:
                value, ok = job.run(), True
            except Exception as exc:  # noqa: BLE001 - the caller's error event says what happened; the thread serves on
                value, ok = exc, False
            job.loop.call_soon_threadsafe(_settle, job.future, ok, value)
        self.voicechat = None
        self._stopped.set()
        # Parked, never returning, as app.worker's thread is: a thread that used MLX tears down MLX's per-thread
        # state as it ends, which needs the GIL; were the interpreter finalizing by then, the process would abort
        # ("terminate called without an active exception"). A parked daemon thread simply ends with the process.
        threading.Event().wait()

    async def call(self, run: Callable[[], T]) -> T:
        """Run ``run`` on the engine thread; the loop awaits it without blocking."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put(_Job(run, loop, future))
        return await future

    # the jobs (each runs on the engine thread)

    def open_session(self, config: SessionConfig) -> OpenedSession:
        from engine import FrameProfiler, Session

        voicechat = self.voicechat
        assert voicechat is not None, "start() loads the model before any connection"
        numerics = config.numerics or self._numerics
        seconds = min(config.max_seconds or self._conversation_seconds, self._conversation_seconds)
        if voicechat.numerics != numerics:
            self._port.set_numerics(voicechat, numerics)  # type: ignore[arg-type]  # checked by realtime_events
            if self._warm_up:
                self._port.warm_up(voicechat, speech=None, progress=None)
        # Every frame timed where the host waited, as ``parley run`` times it (no extra evaluation).
        session = Session(
            voicechat,
            system_prompt=config.system_prompt,
            seed=config.seed,
            max_seconds=seconds,
            hooks=FrameProfiler(),
        )
        return OpenedSession(session, numerics, session.system_prompt, seconds, voicechat.describe())


# --------------------------------------------------------------------------- one connection


@dataclass
class _Conversation:
    """One connection's state, on the event loop."""

    id: str = field(default_factory=lambda: protocol.new_id("sess"))
    opened: OpenedSession | None = None
    config: SessionConfig | None = None
    heard_audio: bool = False
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    clock_s: float = field(default_factory=time.monotonic)
    timings: list[FrameTiming] = field(default_factory=list)


class RealtimeServer:
    """The WebSocket side: one conversation at a time on one :class:`EngineThread`."""

    def __init__(
        self,
        engine: EngineThread,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        profile_dir: Path | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if not is_loopback(host) and not token:
            raise ServeError(
                f"serving on {host} lets other machines in: give a token (--token or {TOKEN_ENV}), "
                "or serve on 127.0.0.1"
            )
        if max_message_bytes < 4096:
            raise ServeError("--max-message-bytes must be at least 4096")
        self.engine = engine
        self.host, self.port = host, port
        self._token = token or None
        self._profile_dir = profile_dir
        self._max_message_bytes = max_message_bytes
        self._active: str | None = None  # the conversation holding the engine (only the loop touches it)
        self._handlers = threading.Condition()
        self.connections_open = 0  # connections whose handler runs, refused ones included (wait_idle waits on it)
        self.profiles_written: list[Path] = []

    # ------------------------------------------------------------ running

    async def run(self, stop: asyncio.Future[None], ready: Callable[[int], None] | None = None) -> None:
        """Serve until ``stop`` completes; ``ready`` receives the bound port (useful with port 0)."""
        async with serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._check_request,
            max_size=self._max_message_bytes,
            compression=None,  # base64 audio barely compresses; deflating it would only add latency
        ) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            log.info("Serving %s on ws://%s:%d%s", self.engine.model_name, self.host, self.port, PATH)
            if ready is not None:
                ready(self.port)
            await stop

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Wait (from another thread) until every connection has been handled to its end (its session closed, its
        profile written); False if ``timeout`` seconds pass first."""
        with self._handlers:
            return self._handlers.wait_for(lambda: self.connections_open == 0, timeout)

    # ------------------------------------------------------------ the handshake

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if url.path != PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"Parley serves the realtime API at {PATH}\n")
        if self._token is None:
            return None
        offered = ""
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("bearer "):
            offered = header[len("bearer ") :].strip()
        else:
            offered = parse_qs(url.query).get("token", [""])[0]
        if not hmac.compare_digest(offered.encode(), self._token.encode()):
            return connection.respond(
                HTTPStatus.UNAUTHORIZED, "a token is required: Authorization: Bearer <token> or ?token=<token>\n"
            )
        return None

    # ------------------------------------------------------------ a connection

    async def _handle(self, connection: ServerConnection) -> None:
        with self._handlers:
            self.connections_open += 1
        try:
            await self._converse(connection)
        finally:
            with self._handlers:
                self.connections_open -= 1
                self._handlers.notify_all()

    async def _converse(self, connection: ServerConnection) -> None:
        conversation = _Conversation()
        if self._active is not None:
            log.info("Refused a client from %s: conversation %s is active", connection.remote_address, self._active)
            busy = "another realtime conversation is active: this server runs one at a time"
            await self._send(connection, protocol.error_event(busy, protocol.SERVER_BUSY))
            await connection.close(BUSY_CLOSE, "busy")
            return
        self._active = conversation.id
        log.info("Conversation %s: a client from %s", conversation.id, connection.remote_address)
        try:
            await self._send(connection, protocol.session_created(conversation.id))
            async for message in connection:
                if not await self._on_message(connection, conversation, message):
                    break
        except ConnectionClosed as closed:  # the client went away, or sent a message over the size limit
            log.info("Conversation %s: connection closed (%s)", conversation.id, closed)
        finally:
            # Free for the next client at once: its session opens on the engine thread after this one's close (the
            # thread runs its jobs in order), so a client who has seen the answer end may reconnect straight away.
            self._active = None
            await self._end(conversation)
        await connection.close()  # committed or cancelled: the server ends the conversation (as mlx-vlm does)

    async def _send(self, connection: ServerConnection, message: dict[str, Any]) -> None:
        await connection.send(protocol.json_text(message))

    async def _on_message(self, connection: ServerConnection, conversation: _Conversation, data: str | bytes) -> bool:
        """Answer one client message; False when the conversation is over (committed or cancelled)."""
        try:
            request = protocol.parse_client_event(data)
            if isinstance(request, protocol.Ping):
                await self._send(connection, protocol.server_event("session.pong"))
            elif isinstance(request, protocol.UpdateSession):
                await self._update(connection, conversation, request)
            elif conversation.opened is None:
                raise ProtocolError("send session.update before audio")
            elif isinstance(request, protocol.AppendAudio):
                await self._append(connection, conversation, request.samples)
            elif isinstance(request, protocol.Commit):
                await self._send(connection, protocol.server_event("input_audio_buffer.committed"))
                await self._stream(connection, conversation, conversation.opened.session.flush)
                return False
            else:  # Cancel
                await self._stream(connection, conversation, conversation.opened.session.cancel)
                return False
        except ProtocolError as exc:
            await self._send(connection, protocol.error_event(str(exc), exc.code))
        return True

    async def _update(
        self, connection: ServerConnection, conversation: _Conversation, request: protocol.UpdateSession
    ) -> None:
        if conversation.heard_audio:
            raise ProtocolError("the active session cannot be reconfigured after its first audio")
        previous = conversation.opened
        conversation.opened = None
        if previous is not None:
            await self.engine.call(previous.session.close)
        try:
            opened = await self.engine.call(lambda: self.engine.open_session(request.config))
        except Exception as exc:
            log.exception("Conversation %s: session.update failed", conversation.id)
            raise ProtocolError(str(exc), protocol.SESSION_INIT_FAILED) from exc
        conversation.opened, conversation.config = opened, request.config
        model = self.engine.model_name
        await self._send(
            connection,
            protocol.session_updated(
                conversation.id,
                model,
                numerics=opened.numerics,
                seed=request.config.seed,
                system_prompt=opened.system_prompt,
                max_seconds=opened.max_seconds,
            ),
        )

    async def _append(self, connection: ServerConnection, conversation: _Conversation, samples: np.ndarray) -> None:
        """Push one frame's worth at a time, sending each frame's events as it finishes (as mlx-vlm does), so a
        long message does not hold back every answer until its end."""
        assert conversation.opened is not None
        session = conversation.opened.session
        conversation.heard_audio = True
        for start in range(0, samples.shape[0], INPUT_FRAME_SAMPLES):
            chunk = samples[start : start + INPUT_FRAME_SAMPLES]
            await self._stream(connection, conversation, lambda chunk=chunk: session.push(chunk))  # type: ignore[misc]

    async def _stream(
        self, connection: ServerConnection, conversation: _Conversation, step: Callable[[], list[Event]]
    ) -> None:
        """Run one session call on the engine thread and send its events."""
        try:
            events = await self.engine.call(step)
        except AudioInputError as exc:
            raise ProtocolError(str(exc), protocol.INVALID_AUDIO) from exc
        except ContextLimitError as exc:
            raise ProtocolError(str(exc), protocol.CONVERSATION_LIMIT) from exc
        except SessionClosedError as exc:
            raise ProtocolError(str(exc)) from exc
        except Exception as exc:
            log.exception("Conversation %s: the engine failed", conversation.id)
            raise ProtocolError(f"the engine failed: {exc}", protocol.INFERENCE_ERROR) from exc
        conversation.timings += [event for event in events if isinstance(event, FrameTiming)]
        for message in protocol.engine_event_messages(events):
            await self._send(connection, message)

    async def _end(self, conversation: _Conversation) -> None:
        """Close the session on the engine thread and write its profile log (never raises: the next client must
        find the server as it was)."""
        opened = conversation.opened
        if opened is not None:
            try:
                await self.engine.call(opened.session.close)
            except Exception:
                log.exception("Conversation %s: closing its session failed", conversation.id)
        if not conversation.timings:
            return
        try:
            written = await asyncio.to_thread(self._write_profile, conversation)
        except Exception:
            log.exception("Conversation %s: its profile log could not be written", conversation.id)
            return
        self.profiles_written += written
        log.info("Conversation %s: %d frames, profile in %s", conversation.id, len(conversation.timings), written[0])

    def _write_profile(self, conversation: _Conversation) -> list[Path]:
        """The conversation's frames as the app's *Export profile…* writes them (JSON, CSV, Chrome trace)."""
        from .export import SessionProfile, export_profile
        from .files import make_private_folder
        from .paths import log_dir

        opened, config = conversation.opened, conversation.config
        assert opened is not None and config is not None, "a conversation with frames was opened"
        checkpoint = opened.checkpoint
        bits = checkpoint.get("quantization_bits")
        settings = {
            "server": "parley serve",
            "seed": config.seed,
            "system_prompt": opened.system_prompt,
            "max_streaming_seconds": opened.max_seconds,
        }
        profile = SessionProfile()
        record = profile.begin(
            1, "bf16" if bits is None else f"{bits}bit", checkpoint, model=str(checkpoint["name"]), settings=settings
        )
        record.started, record.clock_s, record.timings = (
            conversation.started,
            conversation.clock_s,
            conversation.timings,
        )
        folder = self._profile_dir if self._profile_dir is not None else log_dir()
        make_private_folder(folder)
        stamp = conversation.started.strftime("%Y%m%d-%H%M%S")
        return export_profile(folder / f"serve-profile-{stamp}-{conversation.id}.json", profile)


# --------------------------------------------------------------------------- running it


class BackgroundServer:
    """A :class:`RealtimeServer` on its own event loop in a thread (tests, and embedding the server)."""

    def __init__(self, server: RealtimeServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._stop: asyncio.Future[None] | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="parley-serve-loop", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._stop = self.loop.create_future()
        try:
            self.loop.run_until_complete(self.server.run(self._stop, ready=lambda port: self._started.set()))
        except BaseException as exc:  # noqa: BLE001 - raised again by start(), in the caller's thread
            self._failure = exc
            self._started.set()

    def start(self) -> BackgroundServer:
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise self._failure
        return self

    @property
    def url(self) -> str:
        return f"ws://{self.server.host}:{self.server.port}{PATH}"

    def stop(self) -> None:
        stop = self._stop
        if stop is not None:
            self.loop.call_soon_threadsafe(_finish, stop)
        self._thread.join(timeout=30)


def _say(line: str) -> None:
    print(line, flush=True)  # at once, also into a pipe: a supervisor waits for the "serving" line


def serve_command(args: Any, out: Callable[[str], None] = _say) -> int:
    """The body of ``parley serve``: load the model, then serve until SIGINT (Ctrl+C) or SIGTERM."""
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not args.max_seconds > 0:
        raise ServeError("--max-seconds must be positive")
    engine = EngineThread(
        args.model, numerics=args.numerics, warm_up=not args.no_warm_up, conversation_seconds=args.max_seconds
    )
    # Checked before the load, so a refused address costs no time.
    server = RealtimeServer(
        engine,
        host=args.host,
        port=args.port,
        token=token,
        profile_dir=args.profile_dir,
        max_message_bytes=args.max_message_bytes,
    )
    from .logs import configure_logging

    # Conversations, refusals and errors with their tracebacks: into the app's log file, and onto the console.
    log_file = configure_logging()
    console = logging.StreamHandler()
    console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(console)
    out(f"loading {args.model} ({args.numerics} numerics); log: {log_file}")
    engine.start()
    folder = args.profile_dir if args.profile_dir is not None else "the app's log folder"

    def ready(port: int) -> None:
        out(
            f"serving {engine.model_name} on ws://{args.host}:{port}{PATH} ({engine.device}); "
            f"one conversation at a time; profile logs in {folder}; Ctrl+C stops"
        )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop: asyncio.Future[None] = loop.create_future()
        for signum in (signal.SIGINT, signal.SIGTERM):  # Ctrl+C, or a service manager: open conversations end cleanly
            loop.add_signal_handler(signum, _finish, stop)
        await server.run(stop, ready=ready)
        out("stopped")

    try:
        asyncio.run(main())
    except OSError as exc:  # the port is taken, or the address is not this machine's
        raise ServeError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    finally:
        engine.stop()
    return 0
