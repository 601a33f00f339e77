"""Check a checkpoint folder before anything is unloaded: what it really holds, and whether it fits its slot.

A switch (Settings, the first-run page, a finished download, the launch) first reads the
folder's config and tensor headers with the engine's own checks
(``engine.loading.checkpoint.open_checkpoint`` and ``verify_layout``: config present and
valid, every tensor where the layout says, the quantization the tensors really hold). Only
a folder that passes is handed to the worker, so a wrong folder leaves the loaded model
and the settings as they were. Headers only: no tensor data is read, so this takes
milliseconds even for the 22 GB bf16 checkpoint. No Qt; MLX is imported (by the engine's
checker) but not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .demo import is_demo_checkpoint
from .variants import Variant, variant, variant_for_checkpoint


class CheckpointRefused(ValueError):
    """A folder that cannot be used (for that slot); the message is one line, naming the path once."""


@dataclass(frozen=True)
class CheckedCheckpoint:
    """A folder that passed: what it holds."""

    path: Path
    variant: Variant  # from the stored tensors' quantization (or the demo marker)
    random_weights: bool  # written by ``parley make-checkpoint``: noise, not speech

    @property
    def demo(self) -> bool:
        return self.variant.demo


def check_checkpoint(path: Path, slot: str | None = None) -> CheckedCheckpoint:
    """What the folder ``path`` holds, checked for the variant slot ``slot`` ("4bit", "8bit", "bf16"; None: any).

    Raises:
        CheckpointRefused: the folder is missing, is not a VoiceChat checkpoint, is damaged, holds a quantization
            Parley does not know, or holds another variant than ``slot``.
    """
    from engine import has_random_weights, open_checkpoint, verify_layout
    from engine.errors import CheckpointError

    path = Path(path).expanduser()
    if not path.is_dir():
        raise CheckpointRefused(f"{path} does not exist." if not path.exists() else f"{path} is not a folder.")
    try:
        files = open_checkpoint(path)
        quantized = verify_layout(files)
    except CheckpointError as exc:
        raise CheckpointRefused(_naming_path_once(str(exc), path)) from exc
    bits = {bits for _, bits in quantized.values()}
    held_bits = bits.pop() if len(bits) == 1 else None  # as engine.model.VoiceChat.quantization_bits counts them
    demo = is_demo_checkpoint(path)
    try:
        held = variant_for_checkpoint(held_bits, demo=demo)
    except ValueError:
        raise CheckpointRefused(
            f"{path} holds a {held_bits}-bit checkpoint; Parley uses the 4-bit, 8-bit and bf16 ones."
        ) from None
    if slot is not None and not demo and held.key != slot:
        wanted = variant(slot)
        raise CheckpointRefused(
            f"{path} holds the {held.label} checkpoint, not {wanted.label}: set it as the {held.label} folder."
        )
    return CheckedCheckpoint(path, held, has_random_weights(files.raw_config))


def _naming_path_once(message: str, path: Path) -> str:
    """The engine's message names the file (``…/config.json: …``); say that, and add the folder only if absent."""
    message = message.strip()
    return message if str(path) in message else f"{path}: {message}"
