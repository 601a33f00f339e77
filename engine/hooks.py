"""What the session tells whoever watches a frame: the one way instrumentation reaches the engine.

The session takes one :class:`FrameHooks` and passes it down; networks call it at their boundaries and import
nothing else of profiling or counting. :data:`NO_HOOKS`, the default, does nothing, so an unwatched frame runs the
same graph as a watched one and pays nothing for the calls. The profiler (:mod:`engine.profiler`) is one
implementation; a drift recording or a test can be another. This module imports nothing from the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .events import FrameTiming

# A sub-stage probe, ``probe(name, *arrays)``: :meth:`FrameHooks.sub_stage` handed on alone (None: no probing).
# What networks took before they took the hooks; the network refactor of issue 50 retires it.
Probe = Callable[..., None]


class FrameHooks(Protocol):
    """The calls a frame makes to whoever watches it.

    ``stage`` closes one of :data:`engine.timeline.STAGES`; ``sub_stage`` closes a finer part inside a network
    (called only where ``sub_stages`` is true, since closing one may evaluate its arrays); ``launch`` and
    ``launch_part`` may start the device on arrays without waiting; ``sync`` and ``read_back`` are the frame's
    own waits for the device, which a watcher may count; ``observe`` sees a network's inputs and outputs on the
    host (called only where ``observing`` is true: a watcher that observes changes what a frame may fuse).
    ``begin_frame`` and ``end_frame`` bracket one frame (only the session calls them); ``end_frame`` returns the
    frame's timing, which the session emits among the frame's events, or None for a watcher that keeps none.
    """

    @property
    def sub_stages(self) -> bool: ...

    @property
    def observing(self) -> bool: ...

    def stage(self, name: str, *arrays: Any) -> None: ...

    def sub_stage(self, name: str, *arrays: Any) -> None: ...

    def launch(self, *arrays: Any) -> None: ...

    def launch_part(self, *arrays: Any) -> None: ...

    def sync(self, *arrays: Any) -> None: ...

    def read_back(self, array: Any) -> Any: ...

    def observe(self, name: str, value: Any) -> None: ...

    def begin_frame(self, frame_index: int) -> None: ...

    def end_frame(self) -> FrameTiming | None: ...


class NoHooks:
    """Watches nothing: waits are plain evaluations, launches and marks do nothing."""

    sub_stages = False
    observing = False

    def stage(self, name: str, *arrays: Any) -> None:
        pass

    def sub_stage(self, name: str, *arrays: Any) -> None:
        pass

    def launch(self, *arrays: Any) -> None:
        pass

    def launch_part(self, *arrays: Any) -> None:
        pass

    def sync(self, *arrays: Any) -> None:
        import mlx.core as mx  # here, so that importing this module needs no MLX

        mx.eval(*arrays)

    def read_back(self, array: Any) -> Any:
        return array.tolist()

    def observe(self, name: str, value: Any) -> None:
        pass

    def begin_frame(self, frame_index: int) -> None:
        pass

    def end_frame(self) -> FrameTiming | None:
        return None


NO_HOOKS: FrameHooks = NoHooks()
