"""The streaming contract every network of the pipeline follows, one 80 ms frame at a time.

A network holds weights only. Its per-conversation state is an explicit object that the network makes
(``make_state()``) and the session owns; one frame is ``step(state, x, hooks)``, which advances ``state`` in place
and returns the frame's output. Every state lists its arrays (what an evaluation must reach, what a census counts)
and their size. Starting a conversation over is making new states. This module imports nothing from the engine but
the hooks it names.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from .hooks import FrameHooks

StateT = TypeVar("StateT", bound="StreamState")
InputT = TypeVar("InputT", contravariant=True)
OutputT = TypeVar("OutputT", covariant=True)


class StreamState(Protocol):
    """A network's state for one conversation."""

    def arrays(self) -> list[Any]:
        """Every array the state holds, so that evaluating them runs every write made into it."""
        ...

    def nbytes(self) -> int:
        """The bytes those arrays take."""
        ...


def arrays_nbytes(arrays: list[Any]) -> int:
    """The bytes of ``arrays``, for states that are only their arrays."""
    return sum(int(array.nbytes) for array in arrays)


class Streamer(Protocol[StateT, InputT, OutputT]):
    """A network that runs one frame at a time."""

    def make_state(self) -> StateT: ...

    def step(self, state: StateT, x: InputT, hooks: FrameHooks) -> OutputT: ...
