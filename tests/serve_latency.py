"""What ``parley serve`` adds to each frame, measured: a WebSocket client streams the spoken test question.

``python -m tests.serve_latency --model FOLDER [--numerics exact|fast] [--repeat N]``

The server (app/serve.py) runs in this process on a free loopback port, over the checkpoint in ``FOLDER``. The
client sends one 80 ms frame per ``input_audio_buffer.append`` and waits for that frame's
``response.audio.delta`` before sending the next; the round trip less the frame's own time in the engine (the
delta's ``engine_ms``, the session's frame timing) is what the server adds: base64 and JSON both ways, the
WebSocket, the event loop and the hand-over to the engine thread and back. docs/performance.md ("parley
serve") has the figures. tests/test_serve.py streams the question through :func:`stream_frames` too.
"""

from __future__ import annotations

import argparse
import base64
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from websockets.sync.client import ClientConnection, connect

from app.paths import resource_path
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE

QUESTION = resource_path("speech", "question-16k.wav")  # the spoken test question, 16 kHz PCM16
WAIT_S = 120.0  # how long the client waits for a message before giving up (a hang guard)
WARM_FRAMES = 5  # the first frames warm the client and the loop; left out of the figures


def question_pcm16(extra_seconds: float) -> np.ndarray:
    """The test question as int16 at 16 kHz, then ``extra_seconds`` of silence for the answer."""
    question, rate = soundfile.read(QUESTION, dtype="int16")
    assert rate == INPUT_SAMPLE_RATE, f"{QUESTION} is {rate} Hz"
    return np.concatenate([question, np.zeros(round(extra_seconds * INPUT_SAMPLE_RATE), np.int16)])


def receive(client: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(client.recv(timeout=WAIT_S))
    return message


def send(client: ClientConnection, kind: str, **fields: Any) -> None:
    client.send(json.dumps({"type": kind, **fields}))


def pcm16(samples: np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, dtype="<i2").tobytes()).decode("ascii")


def stream_frames(client: ClientConnection, pcm: np.ndarray) -> tuple[list[dict[str, Any]], list[float]]:
    """Send ``pcm`` a frame a message, each answered before the next goes, then commit and read to
    ``response.done``. Returns every message received and, per whole frame, the milliseconds the server added
    (round trip less ``engine_ms``). An ``error`` event raises."""
    messages: list[dict[str, Any]] = []
    added_ms: list[float] = []

    def take() -> dict[str, Any]:
        message = receive(client)
        if message["type"] == "error":
            raise RuntimeError(f"the server answered {message}")
        messages.append(message)
        return message

    for index, start in enumerate(range(0, pcm.shape[0], INPUT_FRAME_SAMPLES)):
        chunk = pcm[start : start + INPUT_FRAME_SAMPLES]
        sent = time.perf_counter()
        send(client, "input_audio_buffer.append", audio=pcm16(chunk), sample_rate=INPUT_SAMPLE_RATE)
        if chunk.shape[0] < INPUT_FRAME_SAMPLES:
            break  # the last partial frame is padded by the commit
        while (message := take())["type"] != "response.audio.delta":
            pass
        if message["frame_index"] != index:
            raise RuntimeError(f"frame {index}'s audio came as frame {message['frame_index']}")
        added_ms.append((time.perf_counter() - sent) * 1000.0 - message["engine_ms"])
    send(client, "input_audio_buffer.commit")
    while take()["type"] != "response.done":
        pass
    return messages, added_ms


def summary(messages: list[dict[str, Any]], added_ms: list[float]) -> str:
    added = np.array(added_ms[WARM_FRAMES:])
    engine = np.array([m["engine_ms"] for m in messages if m.get("engine_ms") is not None][WARM_FRAMES:])
    return (
        f"server's added latency per frame over {added.size} frames: median {np.median(added):.2f} ms, "
        f"p95 {np.percentile(added, 95):.2f} ms, max {added.max():.2f} ms "
        f"(engine alone: median {np.median(engine):.2f} ms a frame)"
    )


def main() -> None:
    from app.serve import BackgroundServer, EngineThread, RealtimeServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    parser.add_argument("--numerics", choices=("exact", "fast"), default="exact")
    parser.add_argument("--extra-seconds", type=float, default=3.0, help="silence after the question")
    parser.add_argument("--repeat", type=int, default=1, help="conversations, one after another")
    args = parser.parse_args()

    engine = EngineThread(args.model, numerics=args.numerics)
    engine.start()
    server = BackgroundServer(
        RealtimeServer(engine, port=0, profile_dir=Path(tempfile.mkdtemp(prefix="parley-serve-")))
    ).start()
    print(f"{engine.model_name} ({args.numerics}) on {engine.device}, {server.url}")
    try:
        for _ in range(args.repeat):
            with connect(server.url, proxy=None, open_timeout=WAIT_S) as client:
                receive(client)  # session.created
                send(client, "session.update", session={"numerics": args.numerics})
                receive(client)  # session.updated
                print(summary(*stream_frames(client, question_pcm16(args.extra_seconds))))
    finally:
        server.stop()
        engine.stop()


if __name__ == "__main__":
    main()
