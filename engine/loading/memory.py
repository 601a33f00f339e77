"""Memory planning: what a conversation's state grows by, and what fits next to the weights.

Loading decides two things from these numbers: whether a checkpoint fits on this machine
at all, and whether the float32 precast copies (faster, same outputs) fit beside the
weights and the state of a whole conversation. Both use one line, :data:`MEMORY_SHARE`
of physical memory, so the model never plans to swap.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import CheckpointMemoryError
from .config import VoiceChatConfig

if TYPE_CHECKING:
    from .checkpoint import CheckpointFiles

MEMORY_SHARE = 0.85  # of physical memory, for weights and everything planned next to them
_FLOAT32_BYTES = 4


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(count: float) -> str:
    """``count`` bytes in the unit people read sizes in (MB below a gigabyte)."""
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"


def state_growth_per_frame(config: VoiceChatConfig, frames_so_far: int = 0) -> int:
    """Bytes the conversation state grows by per 80 ms frame (upper bound).

    Everything else a session holds is fixed-size (Mamba states, encoder and codec caches).
    What grows is attention history: the LLM's attention layers (one position per frame)
    and the TTS backbone at batch 2 (CFG), whose sliding-window layers stop growing once
    ``frames_so_far`` reaches their window. Keys and values are counted as float32, the
    dtype exact mode's frame steps store (a bf16 buffer is promoted to float32 at its first
    growth); fast mode stores the TTS backbone's in bf16 (:mod:`engine.numerics`), half its part.
    Buffers grow in 256-position blocks, so the measured state leads this by < 1 block.
    """
    llm = config.text_config
    attention_layers = llm.hybrid_override_pattern.count("*")
    llm_bytes = attention_layers * 2 * llm.num_key_value_heads * llm.attention_head_dim * _FLOAT32_BYTES
    tts = config.tts_config
    growing_layers = sum(
        1 for index in range(tts.num_hidden_layers) if tts.is_global_layer(index) or frames_so_far < tts.sliding_window
    )
    tts_bytes = growing_layers * 2 * 2 * tts.num_key_value_heads * tts.head_dim * _FLOAT32_BYTES
    return llm_bytes + tts_bytes


def conversation_state_bytes(config: VoiceChatConfig, seconds: float) -> int:
    """What a conversation of ``seconds`` adds to the state, frame by frame."""
    frames = round(seconds / config.frame_duration)
    return sum(state_growth_per_frame(config, frame) for frame in range(frames))


def check_fits(files: CheckpointFiles) -> None:
    """Refuse, clearly, a checkpoint whose weights alone exceed the planning line (instead of swapping).

    Counts the bytes the shard headers declare (``CheckpointFiles.nbytes``), which the header check holds equal
    to the data on disk with no two tensors sharing bytes, so a header cannot make the weights look smaller.
    """
    total = physical_memory_bytes()
    needed = files.nbytes
    if total is not None and needed > MEMORY_SHARE * total:
        raise CheckpointMemoryError(
            f"{files.root}: the checkpoint needs {format_bytes(needed)} of memory but this machine has "
            f"{format_bytes(total)}; use a smaller quantization (4-bit) or a machine with more memory"
        )


def precast_budget(files: CheckpointFiles, conversation_seconds: float) -> int | None:
    """Memory left for precast copies under the same line as :func:`check_fits` (None: unknown)."""
    total = physical_memory_bytes()
    if total is None:
        return None
    return int(MEMORY_SHARE * total) - files.nbytes - conversation_state_bytes(files.config, conversation_seconds)
