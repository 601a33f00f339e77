"""Hands-free: whether the user is speaking, for ducking and for Stop (:class:`UserVoice`).

While the assistant is silent, a voice in the cleaned microphone is the user. While it talks, the raw microphone
must be well above the echo the room explains: the speaker's recent level times the room's echo gap. The cleaned
microphone cannot tell then: before AEC3 has learnt the room its residual is the assistant's own echo (the assistant
would duck itself), and its suppressor holds the user's voice down while the assistant talks until it has learnt
the room (with headphones or no echo at all, until it has seen there is none), so hands-free would not duck. The
echo gap is learnt from frames in which the speaker plays steadily and the user is quiet, quick to rise (an echo is
never taken for the user) and slow to fall (1 dB a frame: a dropout in the microphone is not a quieter room);
until then it is taken as 0 dB (the microphone hears the speaker as loud as it plays). The speaker's level is
what it really plays, after ducking, so ducking lowers the echo it explains with it and never keeps itself on.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

USER_VOICE_RMS: Final = 10.0 ** (-42.0 / 20.0)
"""A microphone frame this loud (RMS) may be the user (AEC3's residual stays near -65 dBFS once converged and under
-50 dBFS before: docs/echo.md)."""
USER_VOICE_HOLD_S: Final = 0.5  # ducking holds this long after the user's last loud frame
ABOVE_ECHO_DB: Final = 6.0  # the raw microphone this much above the echo the room explains is the user
SPEAKER_RELEASE_S: Final = 0.5  # the speaker's level falls by 1/e in this time: the echo's delay and tail
SPEAKER_AUDIBLE_DB: Final = -60.0  # below this the speaker explains no echo (and teaches the gap nothing)
ECHO_GAP_FLOOR_DB: Final = -80.0
GAP_RISE: Final = 0.5  # per quiet frame, the share of a louder echo the gap takes on
GAP_FALL_DB: Final = 1.0  # and at most this much towards a quieter one (a dropout in the microphone is no room)
STEADY_DB: Final = 6.0  # the speaker plays steadily while its last block is this close to its recent level


def _db(level: float) -> float:
    return 20.0 * math.log10(max(level, 1e-10))


def _rms(samples: np.ndarray) -> float:
    return math.sqrt(float(np.dot(samples, samples)) / len(samples)) if len(samples) else 0.0


class UserVoice:
    """The speaker's recent level (from the output callback) and the microphone's frames (from the engine's
    thread) in, "the user is speaking" out. Plain floats shared between the two threads: one writer each."""

    def __init__(self) -> None:
        self.speaker_level = 0.0  # RMS envelope of what the speaker played
        self.speaker_block = 0.0  # RMS of its last block
        self.echo_gap_db = 0.0  # the echo at the microphone against the speaker; 0 dB until learnt (cautious)
        self.until = 0.0  # the user spoke until then (``time.monotonic()``)

    def heard_speaker(self, block: np.ndarray, rate: int) -> None:
        """A block the speaker plays (output callback: allocates nothing)."""
        held = self.speaker_level * math.exp(-len(block) / (rate * SPEAKER_RELEASE_S))
        self.speaker_block = _rms(block)
        self.speaker_level = max(self.speaker_block, held)

    def judge(self, raw: np.ndarray, cleaned: np.ndarray, now: float) -> bool:
        """Whether this microphone frame (as captured, and as cleaned) carries the user's voice."""
        speaker_db = _db(self.speaker_level)
        if speaker_db <= SPEAKER_AUDIBLE_DB:
            speaking = _rms(cleaned) > USER_VOICE_RMS
        else:
            raw_rms = _rms(raw)
            above_echo = _db(raw_rms) - (speaker_db + self.echo_gap_db)
            speaking = raw_rms > USER_VOICE_RMS and above_echo > ABOVE_ECHO_DB
            if not speaking and _db(self.speaker_block) > speaker_db - STEADY_DB:  # the assistant alone, steady
                measured = max(_db(raw_rms) - speaker_db, ECHO_GAP_FLOOR_DB)
                if measured > self.echo_gap_db:
                    self.echo_gap_db += GAP_RISE * (measured - self.echo_gap_db)
                else:
                    self.echo_gap_db -= min(GAP_FALL_DB, self.echo_gap_db - measured)
        if speaking:
            self.until = now + USER_VOICE_HOLD_S
        return speaking

    def speaking(self, now: float) -> bool:
        return now < self.until

    def reset(self) -> None:
        """Another room (the devices changed): learn its echo again."""
        self.echo_gap_db = 0.0
        self.until = 0.0
