"""``parley serve``: a real WebSocket client against a real server on a tiny checkpoint.

The spoken test question streamed through the server gives the same transcript, text and function deltas (ids
and all), audio codes and samples as ``parley run --dump`` on the same input; every kind of bad input is answered
with an ``error`` event or a clean close, and the next client is served all the same.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from app.audio_files import read_audio
from app.cli import main as parley
from app.realtime_events import engine_event_messages
from app.serve import BackgroundServer, EngineThread, RealtimeServer, ServeError
from engine.events import AudioChunk, FrameTiming, ToolCall
from engine.profile_log import validate_profile_log
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE
from tests.conftest import file_mode
from tests.serve_latency import QUESTION, WAIT_S, pcm16, question_pcm16, receive, send, stream_frames, summary

EXTRA_SECONDS = 1.5
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def server(tiny_q4: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    engine = EngineThread(tiny_q4)
    engine.start()
    profiles = tmp_path_factory.mktemp("serve-profiles")
    running = BackgroundServer(
        RealtimeServer(engine, port=0, token=TOKEN, profile_dir=profiles, max_message_bytes=64 * 1024)
    ).start()
    yield running
    running.stop()
    engine.stop()


@contextmanager
def open_client(server: BackgroundServer, url: str | None = None, **options: Any) -> Iterator[ClientConnection]:
    """A connection (with the token) that has received its ``session.created``."""
    options.setdefault("additional_headers", {"Authorization": f"Bearer {TOKEN}"})
    with connect(url or server.url, proxy=None, open_timeout=WAIT_S, **options) as client:
        created = receive(client)
        assert created["type"] == "session.created", created
        assert created["session"]["input_audio_format"] == {"type": "pcm16", "sample_rate": 16_000}
        yield client


def expect_error(client: ClientConnection, code: str, words: str) -> dict[str, Any]:
    message = receive(client)
    assert message["type"] == "error", message
    assert message["error"]["code"] == code, message
    assert words in message["error"]["message"], message
    assert message["event_id"].startswith("event_")
    return message


def configure(client: ClientConnection, **session: Any) -> dict[str, Any]:
    send(client, "session.update", session={"model": "mlx-community/NemotronLabs-VoiceChat-11B-4bit", **session})
    updated = receive(client)
    assert updated["type"] == "session.updated", updated
    return updated


def wait_idle(server: BackgroundServer) -> None:
    assert server.server.wait_idle(WAIT_S), "the server is still handling a connection"


def stream_audio(client: ClientConnection, frames: int) -> list[dict[str, Any]]:
    """Send ``frames`` frames of silence, one a message; the messages up to each frame's audio delta."""
    messages = []
    for _ in range(frames):
        send(client, "input_audio_buffer.append", audio=pcm16(np.zeros(INPUT_FRAME_SAMPLES, np.int16)))
        while True:
            messages.append(receive(client))
            assert messages[-1]["type"] != "error", messages[-1]
            if messages[-1]["type"] == "response.audio.delta":
                break
    return messages


def served_once(server: BackgroundServer) -> None:
    """The server still works: a new client gets a session and the first frame's audio."""
    with open_client(server) as client:
        configure(client)
        assert stream_audio(client, 1)[-1]["frame_index"] == 0
        send(client, "response.cancel")
        assert receive(client)["type"] == "response.cancelled"
    wait_idle(server)


def test_streamed_question_gives_parley_runs_ids_codes_and_samples(
    server: BackgroundServer, tiny_q4: Path, tmp_path: Path
) -> None:
    dump = tmp_path / "dump"
    run = ["run", "--model", str(tiny_q4), "--audio", str(QUESTION), "--extra-seconds", str(EXTRA_SECONDS)]
    assert parley([*run, "--dump", str(dump)]) == 0
    pcm = question_pcm16(EXTRA_SECONDS)
    question = pcm[: -round(EXTRA_SECONDS * INPUT_SAMPLE_RATE)]
    # The same input: what parley run read from the file is the PCM16 the client sends, as the server decodes it.
    np.testing.assert_array_equal(read_audio(QUESTION).samples, question.astype(np.float32) / 32768.0)

    with open_client(server) as client:
        updated = configure(client)
        session_id = updated["session"]["id"]
        assert updated["session"]["numerics"] == "exact"
        assert updated["session"]["output_audio_format"] == {"type": "pcm16", "sample_rate": 22_050}
        messages, added_ms = stream_frames(client, pcm)
        with pytest.raises(ConnectionClosed) as closed:
            client.recv(timeout=WAIT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000, "the server ends the conversation"
    served_once(server)  # at once: a client who saw the answer end finds the server free

    expected = [json.loads(line) for line in (dump / "events.jsonl").read_text().splitlines()]

    def of_kind(kind: str, *keys: str) -> list[tuple[Any, ...]]:
        return [tuple(record[key] for key in keys) for record in expected if record["kind"] == kind]

    def received(kind: str, *keys: str) -> list[tuple[Any, ...]]:
        return [tuple(message[key] for key in keys) for message in messages if message["type"] == kind]

    text = received("response.text.delta", "frame_index", "token_id", "delta", "text")
    function = received("response.function.delta", "frame_index", "token_id", "delta", "text")
    heard = received("conversation.item.input_audio_transcription.delta", "frame_index", "delta", "transcript")
    audio = [message for message in messages if message["type"] == "response.audio.delta"]
    print(f"received {len(text)} text, {len(function)} function, {len(heard)} transcript and {len(audio)} audio deltas")
    assert text and function and heard and len(audio) == len(of_kind("AudioChunk", "frame_index"))
    assert text == of_kind("AssistantTextDelta", "frame_index", "token_id", "delta", "text")
    assert function == of_kind("FunctionDelta", "frame_index", "token_id", "delta", "text")
    assert heard == of_kind("UserTranscriptDelta", "frame_index", "delta", "text")
    text_ids, function_ids = np.load(dump / "text_ids.npy"), np.load(dump / "function_ids.npy")
    assert all(text_ids[frame] == token for frame, token, *_ in text)
    assert all(function_ids[frame] == token for frame, token, *_ in function)
    assert [(m["frame_index"], m["audio_codes"]) for m in audio] == of_kind("AudioChunk", "frame_index", "codes")
    assert np.array_equal(
        np.array([m["audio_codes"] for m in audio if m["audio_codes"]]), np.load(dump / "audio_codes.npy")
    )
    assert all(m["sample_rate"] == 22_050 and m["format"] == "pcm16" and m["channels"] == 1 for m in audio)
    samples = b"".join(base64.b64decode(m["delta"]) for m in audio)
    # mlx-vlm's PCM16: clipped, times 32767, rounded.
    expected_pcm = np.round(np.clip(np.load(dump / "waveform.npy"), -1.0, 1.0) * 32767.0).astype("<i2")
    assert np.array_equal(np.frombuffer(samples, "<i2"), expected_pcm), "the answer's samples are parley run's"
    assert received("response.done", "frame_index") == of_kind("Done", "frame_index")

    print(summary(messages, added_ms))

    [profile] = [path for path in server.server.profiles_written if path.name.endswith(f"{session_id}.json")]
    log = json.loads(profile.read_text())
    assert validate_profile_log(log) == [], "the connection's profile log follows the app's export schema"
    assert len(log["frames"]) == len(of_kind("FrameTiming", "frame_index"))
    assert log["conversations"][0]["settings"]["server"] == "parley serve"
    for suffix in (".csv", ".trace.json"):
        assert profile.with_name(profile.name.removesuffix(".json") + suffix).exists()
    assert file_mode(profile) == 0o600, "it holds what was said: private, as the app's logs"


def test_each_bad_input_gets_an_error_and_the_conversation_goes_on(server: BackgroundServer) -> None:
    with open_client(server) as client:
        client.send("{not json")
        expect_error(client, "invalid_request", "must be a JSON object")
        client.send("[1, 2]")
        expect_error(client, "invalid_request", "must be a JSON object")
        client.send(b"\x00\x01")
        expect_error(client, "invalid_request", "send JSON text messages")
        send(client, "conversation.item.create")
        expect_error(client, "invalid_request", "unsupported event type 'conversation.item.create'")
        send(client, "input_audio_buffer.append", audio=pcm16(np.zeros(160, np.int16)))
        expect_error(client, "invalid_request", "send session.update before audio")
        send(client, "session.update", session={"numerics": "turbo"})
        expect_error(client, "invalid_request", "session.numerics must be one of exact, fast")
        send(client, "session.update", session={"input_audio_format": {"type": "g711_ulaw", "sample_rate": 8000}})
        expect_error(client, "invalid_audio", "must be pcm16")
        send(client, "session.update", session={"seed": "zero"})
        expect_error(client, "invalid_request", "session.seed must be an integer")

        # Settings are free until the first audio: the last session.update before it is the one in force.
        updated = configure(client, numerics="fast", system_prompt="Answer briefly.", seed=3)["session"]
        assert (updated["numerics"], updated["system_prompt"], updated["seed"]) == ("fast", "Answer briefly.", 3)
        updated = configure(client)["session"]
        assert (updated["numerics"], updated["seed"]) == ("exact", 0)

        frame = np.zeros(INPUT_FRAME_SAMPLES, np.int16)
        bad_audio = [
            ({"audio": pcm16(frame), "sample_rate": 8000}, "expected 16000 Hz audio, received 8000 Hz"),
            ({"audio": pcm16(frame), "sample_rate": "16000"}, "sample_rate must be an integer"),
            ({"audio": pcm16(frame), "format": "float32"}, "must be pcm16, not 'float32'"),
            ({"audio": "!!not base64!!"}, "valid base64 PCM16"),
            ({"audio": base64.b64encode(b"\x00\x01\x02").decode()}, "even number of bytes"),
            ({"audio": 12}, "must be a base64 string"),
            ({"audio": ""}, "empty audio chunk"),
            ({}, "needs audio"),
        ]
        for fields, words in bad_audio:
            send(client, "input_audio_buffer.append", **fields)
            expect_error(client, "invalid_audio", words)

        # Nothing bad was consumed: the first good frame is frame 0.
        send(client, "input_audio_buffer.append", audio=pcm16(frame))
        while (message := receive(client))["type"] != "response.audio.delta":
            assert message["type"] != "error", message
        assert message["frame_index"] == 0 and len(base64.b64decode(message["delta"])) == 2 * 1764
        send(client, "session.update", session={"numerics": "fast"})
        expect_error(client, "invalid_request", "cannot be reconfigured after its first audio")
        send(client, "session.ping")
        assert receive(client)["type"] == "session.pong"
        send(client, "response.cancel")
        assert receive(client)["type"] == "response.cancelled"
    wait_idle(server)
    served_once(server)


def test_a_conversation_stops_at_its_length_limit(server: BackgroundServer) -> None:
    with open_client(server) as client:
        assert configure(client, max_streaming_seconds=10_000)["session"]["max_streaming_seconds"] == 600, (
            "a client may ask for less than the server's limit, not more"
        )
        assert configure(client, max_streaming_seconds=0.16)["session"]["max_streaming_seconds"] == 0.16
        frames = [message for message in stream_audio(client, 2) if message["type"] == "response.audio.delta"]
        assert [message["frame_index"] for message in frames] == [0, 1]
        send(client, "input_audio_buffer.append", audio=pcm16(np.zeros(INPUT_FRAME_SAMPLES, np.int16)))
        expect_error(client, "conversation_limit", "reached its 0.16 s limit")
        send(client, "response.cancel")
        assert receive(client)["type"] == "response.cancelled"
    wait_idle(server)


def test_tool_calls_and_frame_times_in_the_protocol() -> None:
    """What the tiny checkpoint never says: a complete tool call, parsed or not, and each frame's engine time."""
    timing = FrameTiming(frame_index=4, start_ms=0.0, stages_ms={}, total_ms=12.5, host_syncs=1)
    audio = AudioChunk(4, np.full(1764, 0.5, np.float32), np.arange(31, dtype=np.int32))
    call = ToolCall(4, '{"name": "get_weather", "arguments": {"city": "Paris"}}', "get_weather", {"city": "Paris"})
    broken = ToolCall(4, "{oops", error="not JSON")
    messages = engine_event_messages([call, broken, audio, timing])
    assert [m["type"] for m in messages] == ["response.function_call_arguments.done"] * 2 + ["response.audio.delta"]
    assert (messages[0]["name"], json.loads(messages[0]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert (messages[1]["arguments"], messages[1]["error"], messages[1]["raw"]) == (None, "not JSON", "{oops")
    assert messages[2]["engine_ms"] == 12.5 and messages[2]["audio_codes"] == list(range(31))
    assert np.all(np.frombuffer(base64.b64decode(messages[2]["delta"]), "<i2") == round(0.5 * 32767))


def test_a_second_client_is_refused_while_one_converses(server: BackgroundServer) -> None:
    with open_client(server) as first:
        configure(first)
        with connect(server.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, proxy=None) as second:
            expect_error(second, "server_busy", "one at a time")
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=WAIT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        send(first, "session.ping")
        assert receive(first)["type"] == "session.pong", "the first conversation goes on"
    wait_idle(server)
    served_once(server)


def test_the_loop_answers_while_the_engine_is_busy(server: BackgroundServer) -> None:
    """The engine thread held on a job: the event loop still greets, answers pings and refuses bad input."""
    release = threading.Event()
    held = asyncio.run_coroutine_threadsafe(server.server.engine.call(release.wait), server.loop)
    try:
        with open_client(server) as client:
            send(client, "session.ping")
            assert receive(client)["type"] == "session.pong"
            client.send("{not json")
            expect_error(client, "invalid_request", "must be a JSON object")
        wait_idle(server)
        assert not held.done(), "all of it was answered while the engine was still busy"
    finally:
        release.set()
    assert held.result(timeout=WAIT_S) is True
    served_once(server)


def test_an_oversize_message_closes_that_connection_only(server: BackgroundServer) -> None:
    with open_client(server, max_size=None) as client:
        configure(client)
        send(client, "input_audio_buffer.append", audio=pcm16(np.zeros(64 * 1024, np.int16)))  # 171 KB > 64 KiB
        with pytest.raises(ConnectionClosed) as closed:
            client.recv(timeout=WAIT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # "message too big"
    wait_idle(server)
    served_once(server)


def _masked_text_frame_header(length: int) -> bytes:
    """A client text frame's header announcing ``length`` bytes (RFC 6455: FIN, opcode 1, masked, 64-bit length)."""
    return struct.pack("!BBQ", 0x81, 0x80 | 127, length) + os.urandom(4)


def test_a_client_that_vanishes_mid_frame_or_mid_answer_frees_the_server(server: BackgroundServer) -> None:
    # Mid-frame: part of a WebSocket frame, then the socket is gone.
    with open_client(server) as client:
        configure(client)
        client.socket.sendall(_masked_text_frame_header(4000) + b"x" * 100)
        client.socket.shutdown(socket.SHUT_RDWR)
    wait_idle(server)
    # Mid-answer: 1.2 s of audio sent (under the 64 KiB limit), and the socket gone while the engine works on it.
    with open_client(server) as client:
        configure(client)
        send(client, "input_audio_buffer.append", audio=pcm16(np.zeros(15 * INPUT_FRAME_SAMPLES, np.int16)))
        client.socket.shutdown(socket.SHUT_RDWR)
    wait_idle(server)
    served_once(server)


def test_the_token_is_checked_in_the_handshake(server: BackgroundServer) -> None:
    for headers, url in (({}, server.url), ({"Authorization": "Bearer wrong"}, server.url)):
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=headers, proxy=None)
        assert refused.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as missing:
        connect(server.url.replace("/v1/realtime", "/v1/other"), proxy=None)
    assert missing.value.response.status_code == 404
    with open_client(server, f"{server.url}?token={TOKEN}", additional_headers={}):
        pass  # the token as a query parameter (browsers cannot set headers)
    wait_idle(server)


def test_the_parley_serve_command_serves_until_sigterm(tiny_q4: Path, tmp_path: Path) -> None:
    """The command itself, in a process of its own: it says where it serves, serves, and stops on SIGTERM."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": str(Path(__file__).parents[1])}
    command = [sys.executable, "-m", "app.cli", "serve", "--model", str(tiny_q4), "--port", "0", "--no-warm-up"]
    process = subprocess.Popen(
        [*command, "--profile-dir", str(tmp_path / "profiles")], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        lines = []
        while not (served := re.search(r"on (ws://127\.0\.0\.1:\d+/v1/realtime)", lines[-1] if lines else "")):
            line = process.stdout.readline()
            assert line, f"parley serve ended before serving: {lines}"
            lines.append(line)
        with connect(served.group(1), proxy=None, open_timeout=WAIT_S) as client:
            assert receive(client)["type"] == "session.created"
            configure(client)
            frames = [m for m in stream_audio(client, 3) if m["type"] == "response.audio.delta"]
            assert [m["frame_index"] for m in frames] == [0, 1, 2]
            send(client, "input_audio_buffer.commit")
            while receive(client)["type"] != "response.done":
                pass
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0 and rest.strip().endswith("stopped"), rest
    assert len(list((tmp_path / "profiles").glob("serve-profile-*.json"))) == 2  # the log and its trace
    logged = re.search(r"log: (\S+)", lines[0])
    assert logged is not None and Path(logged.group(1)).name == "parley.log", lines[0]
    assert Path(logged.group(1)).exists(), "it logs where the app logs (XDG_STATE_HOME here)"


def test_another_address_needs_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = EngineThread(tmp_path)  # never started: the address is refused before anything loads
    with pytest.raises(ServeError, match="give a token"):
        RealtimeServer(engine, host="0.0.0.0")
    RealtimeServer(engine, host="0.0.0.0", token="t")
    RealtimeServer(engine, host="::1")
    monkeypatch.delenv("PARLEY_SERVE_TOKEN", raising=False)
    assert parley(["serve", "--model", str(tmp_path), "--host", "192.168.1.20"]) == 2
    assert "give a token (--token or PARLEY_SERVE_TOKEN)" in capsys.readouterr().err
