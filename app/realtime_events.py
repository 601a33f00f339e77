"""The events of ``parley serve``'s realtime API: mlx-vlm 0.7.10's ``/v1/realtime`` protocol, parsed and built.

Names and payloads follow mlx-vlm's VoiceChat server (``mlx_vlm/server/realtime.py``) so that its clients work
unchanged; what Parley adds is marked "Parley" below, always as extra fields or events a client may ignore.

Client → server (JSON text messages):

* ``session.update`` ``{"session": {...}}``: ``system_prompt`` (or OpenAI's ``instructions``), ``seed``,
  ``max_streaming_seconds``, ``model`` (accepted and ignored: the server runs the checkpoint it was started
  with), ``input_audio_format`` (only PCM16 at 16 kHz), and, Parley, ``numerics`` ("exact" or "fast"). Other
  keys are ignored, as OpenAI-Realtime clients send many.
* ``input_audio_buffer.append`` ``{"audio": base64 little-endian PCM16 mono, "sample_rate": 16000}``.
* ``input_audio_buffer.commit`` (end of input: the partial frame is padded and the answer finishes),
  ``response.cancel`` / ``session.cancel``, ``session.ping``.

Server → client: ``session.created``, ``session.updated``, ``input_audio_buffer.committed``,
``conversation.item.input_audio_transcription.delta``, ``response.text.delta``, ``response.function.delta``,
``response.audio.delta`` (base64 PCM16 at 22.05 kHz, its ``audio_codes``; Parley: ``engine_ms``, the frame's
time in the engine), Parley's ``response.function_call_arguments.done`` (a complete tool call, named as in
OpenAI's Realtime API), ``response.done``, ``response.cancelled``, ``session.pong`` and ``error``
``{"error": {"code", "message"}}``. Every server event carries an ``event_id``.

No MLX and no I/O here: this module turns messages into requests and engine events into messages.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import uuid
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from engine.events import (
    AssistantTextDelta,
    AudioChunk,
    Cancelled,
    Done,
    Event,
    FrameTiming,
    FunctionDelta,
    ToolCall,
    UserTranscriptDelta,
)
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

PATH: Final = "/v1/realtime"
DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8080  # mlx-vlm's server default, so its clients' URLs work unchanged
DEFAULT_MAX_MESSAGE_BYTES: Final = 4 * 2**20  # about 49 s of base64 PCM16 in one message
TOKEN_ENV: Final = "PARLEY_SERVE_TOKEN"
NUMERICS: Final = ("exact", "fast")  # engine.numerics.NUMERICS, without importing MLX
AUDIO_FORMAT: Final = "pcm16"

# error codes: mlx-vlm's, and Parley's more specific ones for the same shape
INVALID_REQUEST: Final = "invalid_request"  # mlx-vlm: malformed or unsupported client events
INVALID_AUDIO: Final = "invalid_audio"  # Parley: audio that is not base64 PCM16 mono at 16 kHz
SERVER_BUSY: Final = "server_busy"  # mlx-vlm: another conversation is active
SESSION_INIT_FAILED: Final = "session_initialization_failed"  # mlx-vlm
INFERENCE_ERROR: Final = "inference_error"  # mlx-vlm: the engine failed on a frame
CONVERSATION_LIMIT: Final = "conversation_limit"  # Parley: max_streaming_seconds reached


class ProtocolError(Exception):
    """A client event the server cannot take; becomes an ``error`` event with ``code`` and the message."""

    def __init__(self, message: str, code: str = INVALID_REQUEST) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SessionConfig:
    """What ``session.update`` may set (None: the server's default)."""

    system_prompt: str | None = None
    seed: int = 0
    max_seconds: float | None = None
    numerics: str | None = None


@dataclass(frozen=True)
class UpdateSession:
    config: SessionConfig
    model: str | None  # what the client asked for (the server runs its own)


@dataclass(frozen=True)
class AppendAudio:
    samples: np.ndarray  # float32 mono at 16 kHz, PCM16 / 32768 as mlx-vlm decodes it


@dataclass(frozen=True)
class Commit:
    pass


@dataclass(frozen=True)
class Cancel:
    pass


@dataclass(frozen=True)
class Ping:
    pass


ClientRequest = UpdateSession | AppendAudio | Commit | Cancel | Ping


# --------------------------------------------------------------------------- audio


def pcm16_to_float(value: Any) -> np.ndarray:
    """Base64 little-endian PCM16 as float32 in [-1, 1) (``/ 32768``, as mlx-vlm decodes it)."""
    if not isinstance(value, str):
        raise ProtocolError(f"audio must be a base64 string, received {type(value).__name__}", INVALID_AUDIO)
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError("audio must be valid base64 PCM16", INVALID_AUDIO) from exc
    if len(raw) % 2:
        raise ProtocolError(f"PCM16 audio must contain an even number of bytes, received {len(raw)}", INVALID_AUDIO)
    if not raw:
        raise ProtocolError("received an empty audio chunk", INVALID_AUDIO)
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples as little-endian PCM16 (clipped, ``* 32767`` and rounded, as mlx-vlm encodes them)."""
    values = np.nan_to_num(np.asarray(samples, dtype=np.float32), posinf=1.0, neginf=-1.0)
    return np.round(np.clip(values, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def _check_format(value: Any) -> None:
    """``input_audio_format`` as mlx-vlm reports it (``{"type": "pcm16", "sample_rate": 16000}``) or OpenAI's
    string (``"pcm16"``); anything else is refused rather than misread."""
    if isinstance(value, str):
        kind, rate = value, INPUT_SAMPLE_RATE
    elif isinstance(value, dict):
        kind, rate = value.get("type", AUDIO_FORMAT), value.get("sample_rate", INPUT_SAMPLE_RATE)
    else:
        raise ProtocolError("input_audio_format must be an object or a string", INVALID_AUDIO)
    if kind != AUDIO_FORMAT:
        raise ProtocolError(f"input audio must be pcm16, not {kind!r}", INVALID_AUDIO)
    if rate != INPUT_SAMPLE_RATE:
        raise ProtocolError(f"expected {INPUT_SAMPLE_RATE} Hz audio, received {rate!r} Hz", INVALID_AUDIO)


# --------------------------------------------------------------------------- client events


def _optional(session: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = session.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ProtocolError(f"session.{key} must be {what}, received {json.dumps(value)[:80]}")
    return value


def _session_update(message: dict[str, Any]) -> UpdateSession:
    session = message.get("session") or {}
    if not isinstance(session, dict):
        raise ProtocolError("session.update.session must be an object")
    prompt = _optional(session, "system_prompt", str, "a string")
    instructions = _optional(session, "instructions", str, "a string")
    if prompt is not None and instructions is not None and prompt != instructions:
        raise ProtocolError("session.system_prompt and session.instructions differ: send one of them")
    seed = _optional(session, "seed", int, "an integer")
    seconds = _optional(session, "max_streaming_seconds", (int, float), "a number of seconds")
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise ProtocolError(f"session.max_streaming_seconds must be positive, received {seconds}")
    numerics = _optional(session, "numerics", str, "a string")
    if numerics is not None and numerics not in NUMERICS:
        raise ProtocolError(f"session.numerics must be one of {', '.join(NUMERICS)}, received {numerics!r}")
    if session.get("input_audio_format") is not None:
        _check_format(session["input_audio_format"])
    model = session.get("model")
    config = SessionConfig(
        system_prompt=prompt if prompt is not None else instructions,
        seed=0 if seed is None else seed,
        max_seconds=None if seconds is None else float(seconds),
        numerics=numerics,
    )
    return UpdateSession(config, model if isinstance(model, str) else None)


def _append(message: dict[str, Any]) -> AppendAudio:
    rate = message.get("sample_rate", INPUT_SAMPLE_RATE)
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise ProtocolError(f"sample_rate must be an integer, received {json.dumps(rate)[:80]}", INVALID_AUDIO)
    if rate != INPUT_SAMPLE_RATE:
        raise ProtocolError(f"expected {INPUT_SAMPLE_RATE} Hz audio, received {rate} Hz", INVALID_AUDIO)
    kind = message.get("format", AUDIO_FORMAT)
    if kind != AUDIO_FORMAT:
        raise ProtocolError(f"input audio must be pcm16, not {kind!r}", INVALID_AUDIO)
    if "audio" not in message:
        raise ProtocolError("input_audio_buffer.append needs audio (base64 PCM16)", INVALID_AUDIO)
    return AppendAudio(pcm16_to_float(message["audio"]))


def parse_client_event(data: str | bytes) -> ClientRequest:
    """One client message as a request, or :class:`ProtocolError` saying what is wrong with it."""
    if isinstance(data, bytes):
        raise ProtocolError("send JSON text messages; audio goes base64-encoded in input_audio_buffer.append")
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"message must be a JSON object ({exc})") from exc
    if not isinstance(message, dict):
        raise ProtocolError("message must be a JSON object")
    kind = message.get("type", "")
    if kind == "session.update":
        return _session_update(message)
    if kind == "input_audio_buffer.append":
        return _append(message)
    if kind == "input_audio_buffer.commit":
        return Commit()
    if kind in ("response.cancel", "session.cancel"):
        return Cancel()
    if kind == "session.ping":
        return Ping()
    raise ProtocolError(f"unsupported event type {kind!r}")


# --------------------------------------------------------------------------- server events


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"event_id": new_id("event"), "type": kind, **fields}


def json_text(message: dict[str, Any]) -> str:
    return json.dumps(message)


def error_event(message: str, code: str = INVALID_REQUEST) -> dict[str, Any]:
    return server_event("error", error={"code": code, "message": message})


def _formats(input_rate: int = INPUT_SAMPLE_RATE, output_rate: int = OUTPUT_SAMPLE_RATE) -> dict[str, Any]:
    return {
        "input_audio_format": {"type": AUDIO_FORMAT, "sample_rate": input_rate},
        "output_audio_format": {"type": AUDIO_FORMAT, "sample_rate": output_rate},
    }


def session_created(session_id: str) -> dict[str, Any]:
    return server_event("session.created", session={"id": session_id, "state": "configuring", **_formats()})


def session_updated(
    session_id: str, model: str, *, numerics: str, seed: int, system_prompt: str, max_seconds: float
) -> dict[str, Any]:
    """The conversation as it runs: mlx-vlm's fields, then Parley's (what is in force, defaults filled in)."""
    session = {
        "id": session_id,
        "state": "ready",
        "model": model,
        "frame_samples": INPUT_FRAME_SAMPLES,
        **_formats(),
        # Parley: what the conversation runs with
        "numerics": numerics,
        "seed": seed,
        "system_prompt": system_prompt,
        "max_streaming_seconds": max_seconds,
    }
    return server_event("session.updated", session=session)


def engine_event_messages(events: list[Event]) -> list[dict[str, Any]]:
    """The client's events for one push's engine events, in their order (frame timings are not sent; each
    frame's own becomes its audio delta's ``engine_ms``)."""
    engine_ms = {event.frame_index: event.total_ms for event in events if isinstance(event, FrameTiming)}
    messages = []
    for event in events:
        message = _engine_event_message(event, engine_ms)
        if message is not None:
            messages.append(message)
    return messages


def _engine_event_message(event: Event, engine_ms: dict[int, float]) -> dict[str, Any] | None:
    frame = {"frame_index": event.frame_index}
    if isinstance(event, UserTranscriptDelta):
        kind = "conversation.item.input_audio_transcription.delta"
        return server_event(kind, **frame, delta=event.delta, transcript=event.text)
    if isinstance(event, AssistantTextDelta):
        return server_event("response.text.delta", **frame, token_id=event.token_id, delta=event.delta, text=event.text)
    if isinstance(event, FunctionDelta):
        kind = "response.function.delta"
        return server_event(kind, **frame, token_id=event.token_id, delta=event.delta, text=event.text)
    if isinstance(event, ToolCall):
        arguments = None if event.arguments is None else json.dumps(event.arguments)
        return server_event(
            "response.function_call_arguments.done",
            **frame,
            call_id=f"call_{event.frame_index}",
            name=event.name,
            arguments=arguments,
            raw=event.raw,
            error=event.error,
        )
    if isinstance(event, AudioChunk):
        return server_event(
            "response.audio.delta",
            **frame,
            delta=base64.b64encode(float_to_pcm16(event.samples)).decode("ascii"),
            format=AUDIO_FORMAT,
            sample_rate=event.sample_rate,
            channels=1,
            audio_codes=event.codes.tolist(),
            engine_ms=engine_ms.get(event.frame_index),  # None for the codec's tail after the last frame
        )
    if isinstance(event, Done):
        return server_event("response.done", **frame)
    if isinstance(event, Cancelled):
        return server_event("response.cancelled", **frame)
    return None  # FrameTiming: in the audio delta and the profile log
