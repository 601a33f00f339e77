"""The duplex timeline's fixed numbers and the names of a frame's stages.

VoiceChat runs on a fixed clock: every 80 ms frame takes 1280 samples of 16 kHz audio in
and gives 1764 samples of 22.05 kHz speech out. A checkpoint's config repeats these
numbers (``VoiceChatConfig``), and the engine follows the config; this module is where
the rest of Parley (audio devices, the UI, benchmarks, exports) reads them. It imports
nothing, so MLX-free code can use it.
"""

from __future__ import annotations

from typing import Final

INPUT_SAMPLE_RATE: Final = 16_000
OUTPUT_SAMPLE_RATE: Final = 22_050
FRAME_SECONDS: Final = 0.08
FRAME_MS: Final = 80.0
INPUT_FRAME_SAMPLES: Final = 1280  # 80 ms at 16 kHz
OUTPUT_FRAME_SAMPLES: Final = 1764  # 80 ms at 22.05 kHz
CONVERSATION_FRAMES: Final = 7500  # 10 minutes (see docs/long-conversations.md)

STAGES: Final = ("perception", "rnnt", "language", "tts", "codec")
"""A frame's stages, in the order they run."""

LISTEN_STAGES: Final = ("perception", "rnnt", "language")
SPEAK_STAGES: Final = ("tts", "codec")
"""A frame runs in two phases, each read back once: listening (what was heard, what to say) and speaking."""


def frames_to_seconds(frames: float) -> float:
    return frames * FRAME_SECONDS
