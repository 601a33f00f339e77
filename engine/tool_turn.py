"""The tool loop's state inside a session while the clock is stopped (docs/tools.md).

A completed tool call stops the clock: the mic frames that arrive until the results are in keep their projected
audio here (:class:`HeldFrames`, bounded) to be replayed after the response, and each returns a silent chunk
(:func:`silent_chunk`). The injected response's audio channel is :func:`encoded_silence`. The injection itself is
:meth:`engine.session.Session._inject_tool_response`, beside the LLM and TTS steps it drives.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import mlx.core as mx
import numpy as np

from .events import AudioChunk, DeferredFramesDropped
from .hooks import NO_HOOKS
from .networks.perception import Perception

MAX_DEFERRED_FRAMES: Final = 250
"""Mic frames (20 s) kept for replay while a tool call waits for its results; older ones are dropped."""
SILENCE_EMBEDDING_FRAMES: Final = 13
"""Frames of zeros (1.04 s) perceived from a fresh state to make the audio channel of an injected position."""


def encoded_silence(perception: Perception, frame_samples: int) -> mx.array:
    """The audio channel of an injected position, "encoded silence": the projection (1, 1, D) of the last of
    :data:`SILENCE_EMBEDDING_FRAMES` frames of zeros perceived from a fresh state (speech-swift perceives 1 s of
    zero PCM). A conversation's own perception state is not touched."""
    state = perception.make_state()
    zeros = mx.zeros((frame_samples,), dtype=mx.float32)
    for _ in range(SILENCE_EMBEDDING_FRAMES):
        projected, _ = perception.step(state, zeros, NO_HOOKS)
        mx.eval(projected, *state.arrays())
    return projected


def silent_chunk(frame_index: int, samples: int, silence_codes: mx.array, sample_rate: int) -> AudioChunk:
    """A held frame's output: zero samples and the codec's silence codes, so playback and the frame clock go on."""
    codes = np.asarray(silence_codes, dtype=np.int32)
    return AudioChunk(
        frame_index=frame_index,
        samples=np.zeros(samples, dtype=np.float32),
        codes=codes,
        sample_rate=sample_rate,
        codes_raw=codes.copy(),
    )


class HeldFrames:
    """The projected audio of the mic frames held while a call waits, oldest first, at most
    :data:`MAX_DEFERRED_FRAMES` (the oldest dropped beyond, counted per wait)."""

    def __init__(self) -> None:
        self._frames: deque[mx.array] = deque()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._frames)

    def hold(self, projected: mx.array, frame_index: int) -> DeferredFramesDropped | None:
        """Keep one frame's projected audio; returns the event that says so where the oldest had to go."""
        dropped = None
        if len(self._frames) >= MAX_DEFERRED_FRAMES:
            self._frames.popleft()
            self.dropped += 1
            dropped = DeferredFramesDropped(frame_index, self.dropped)
        self._frames.append(projected)
        return dropped

    def next(self) -> mx.array:
        """The oldest held frame, taken out for replay."""
        return self._frames.popleft()

    def clear(self) -> None:
        self._frames.clear()
        self.dropped = 0
