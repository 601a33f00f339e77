"""Many timeline positions at once, where nothing reads their outputs: a system prompt's prefill, a tool response's
injection.

A conversation's LLM takes one position per 80 ms frame; a prompt of ~900 tokens step by step is ~900 LLM steps and
~900 TTS steps before the first frame. Where no position's ids are read, the LLM can take the positions in chunks
(:func:`prefill_positions`: one forward of up to ``chunk`` positions, its Mamba blocks through the chunked scan, its
attention causal over the chunk and the cache), and the TTS its PAD steps as backbone passes teacher-forced to
silence (:meth:`engine.networks.tts.EarTTS.prefill`). Neither is the reference's arithmetic: exact numerics keeps one
position per step (:data:`STEPWISE`), fast numerics takes chunks of :data:`PREFILL_CHUNK`; docs/numerics.md
("Prefill in chunks") has the decision and the measured drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from .hooks import NO_HOOKS, FrameHooks
from .model import DuplexSTT
from .networks.llm import LLMCache
from .numerics import Numerics, check_numerics

PREFILL_CHUNK = 256
"""Positions per LLM forward (and per TTS backbone pass) in fast numerics' prefill: 256 prefilled 900 positions in
1.27 s on an H100, 64 in 1.93 s (docs/performance.md, "Prefill")."""

STEPWISE = 1
"""A prefill of one position per step: the reference's (exact numerics')."""


def default_prefill_chunk(numerics: Numerics) -> int:
    """The prefill's positions per forward for ``numerics``: one (the reference's steps) in exact mode, chunks of
    :data:`PREFILL_CHUNK` in fast mode."""
    return STEPWISE if check_numerics(numerics) == "exact" else PREFILL_CHUNK


@dataclass(frozen=True)
class PrefillCounts:
    """What a prefill ran: its timeline ``positions``, the LLM's forwards, the TTS backbone's passes, the TTS
    steps whose codes were sampled (MaskGIT rounds run) and the evaluations (``mx.eval``) it waited on."""

    positions: int = 0
    llm_forwards: int = 0
    tts_passes: int = 0
    tts_samples: int = 0
    evaluations: int = 0


@dataclass(frozen=True)
class PositionsResult:
    """What :func:`prefill_positions` leaves: the last position's hidden state (1, 1, D) after ``norm_f``,
    evaluated (``DuplexSTT.choose`` reads the ids that would follow), and the forwards and evaluations it ran."""

    last_hidden: mx.array
    forwards: int
    evaluations: int


def fused_positions(
    stt: DuplexSTT,
    audio_embeddings: mx.array,
    text_feedback_ids: Sequence[int],
    function_feedback_ids: Sequence[int],
) -> mx.array:
    """The LLM inputs (1, T, D) of T positions: ``E[text] + audio + w·E[function]`` per position, the operations of
    :meth:`DuplexSTT.fuse_inputs` element for element (so each position's input is the one a step would fuse)."""
    text = stt.embed_tokens(mx.array([list(text_feedback_ids)], dtype=mx.int32))
    function = stt.embed_tokens(mx.array([list(function_feedback_ids)], dtype=mx.int32))
    fused: mx.array = text + audio_embeddings + stt.function_channel_weight * function
    return fused


def forced_feedback(
    last_text_id: int, last_function_id: int, function_ids: Sequence[int], pad_id: int
) -> tuple[list[int], list[int]]:
    """The feedback ids (text, function) of T = ``len(function_ids)`` positions that force the function channel to
    carry ``function_ids`` one per position with the text channel PAD (a tool response, :func:`prefill_positions`):
    position 0 is fed back the ids last chosen before it, position t the forced f_{t−1}. The last forced id,
    f_{T−1}, is fed back by the position after these (a session's next step reads it from its id history, where the
    caller appends PAD and f_t for each position t)."""
    if not function_ids:
        raise ValueError("forced_feedback needs at least one forced id")
    text = [last_text_id, *[pad_id] * (len(function_ids) - 1)]
    function = [last_function_id, *function_ids[:-1]]
    return text, function


def prefill_positions(
    stt: DuplexSTT,
    cache: LLMCache,
    audio_embeddings: mx.array,
    text_feedback_ids: Sequence[int],
    function_feedback_ids: Sequence[int],
    *,
    chunk: int = PREFILL_CHUNK,
    hooks: FrameHooks = NO_HOOKS,
) -> PositionsResult:
    """Advance the LLM's ``cache`` by T positions whose outputs nobody reads, ``chunk`` positions per forward.

    Position t's input is ``E[text_feedback_ids[t]] + audio_embeddings[0, t] + w·E[function_feedback_ids[t]]``
    (:func:`fused_positions`): the feedback ids are the ids *fed back into* position t — what a step would have
    chosen at position t − 1 — not ids chosen at t. So to force the function channel to emit f₀ … f_{T−1} with
    the text channel PAD (a tool response: ``<TOOL_RESPONSE>[…]</TOOL_RESPONSE>`` then id 22), the caller passes
    ``function_feedback_ids = [last id chosen before, f₀, …, f_{T−2}]`` and ``text_feedback_ids = [last text id,
    PAD, …]`` (:func:`forced_feedback` makes both); f_{T−1} is fed back by the position after (the next frame's
    step). ``DuplexSTT.choose`` on the result's ``last_hidden`` gives the ids the model itself would choose at the
    last position (what the forcing overrides). A system prompt passes its
    token embeddings (``stt.embed_tokens``) as ``audio_embeddings`` and PAD on both channels.

    Touches the LLM only: the session's id histories, timeline index and the TTS are the caller's (a system
    prompt's TTS steps: :meth:`engine.networks.tts.EarTTS.prefill`). With ``chunk`` 1 every position is one step
    of the model's compiled single-position path, the reference's arithmetic; with more, each chunk is one forward
    through the multi-position path (Mamba's chunked scan, causal attention over the chunk and the cache), which
    rounds differently (docs/numerics.md, "Prefill in chunks"). The cache is evaluated after every chunk (the graph
    stays one chunk deep); ``hooks`` observe each chunk's inputs and hidden states ("language.input",
    "language.hidden", (1, L, D)) where they observe.

    Raises:
        ValueError: ``audio_embeddings`` is not (1, T, D) with T ≥ 1 and D the LLM's width, the id lists are not
            T long, or ``chunk`` < 1.
    """
    width = stt.llm.config.hidden_size
    if audio_embeddings.ndim != 3 or audio_embeddings.shape[0] != 1 or audio_embeddings.shape[2] != width:
        raise ValueError(f"audio_embeddings must be (1, T, {width}), got {tuple(audio_embeddings.shape)}")
    positions = audio_embeddings.shape[1]
    if positions < 1:
        raise ValueError("prefill_positions needs at least one position")
    if len(text_feedback_ids) != positions or len(function_feedback_ids) != positions:
        raise ValueError(
            f"{positions} positions need as many feedback ids; got {len(text_feedback_ids)} text and "
            f"{len(function_feedback_ids)} function ids"
        )
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    fused = fused_positions(stt, audio_embeddings, text_feedback_ids, function_feedback_ids)
    mx.eval(cache.arrays())  # a kernel's in-place write of the last step lands before a block reads the buffers
    forwards, evaluations = 0, 1
    last = fused[:, :0]
    for start in range(0, positions, chunk):
        inputs = fused[:, start : start + chunk]
        if hooks.observing:
            hooks.observe("language.input", inputs)
        hidden = stt.llm.step(cache, inputs)
        if hooks.observing:
            hooks.observe("language.hidden", hidden)
        forwards += 1
        last = hidden[:, -1:]
        mx.eval(last, cache.arrays())
        evaluations += 1
    return PositionsResult(last, forwards, evaluations)
