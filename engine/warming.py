"""Warming a loaded model: every per-frame program traced and compiled once, before a conversation needs it."""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from .model import VoiceChat
from .networks.rnnt import RNNTState, first_pass_attempts, rnnt_propose
from .prefill import default_prefill_chunk
from .session import Session

WARMING_SENTENCE = "A system prompt that only warms the programs up. "


def warming_prompt(voicechat: VoiceChat, tokens: int) -> str:
    """A throwaway system prompt of at least ``tokens`` tokens."""
    text = WARMING_SENTENCE
    while len(voicechat.tokenizer.encode(text)) < tokens:
        text += WARMING_SENTENCE
    return text


def warm_up(
    voicechat: VoiceChat,
    *,
    speech: np.ndarray | None = None,
    progress: Callable[[float], None] | None = None,
    system_prompt: str | None = None,
) -> float:
    """Trace and compile every per-frame program once, so no conversation frame pays for it.

    Runs a throwaway session over ``speech`` (16 kHz; silence if None), so the paths that
    speech takes (RN-T emissions, the text tokens it leads to) are traced too, then the
    programs that only start later: the Conformer stack for every attention cache length up
    to full (frame 71 on) and the RN-T loop after its first emission. On CUDA the session
    runs past frame 71 as well: MLX replays each new sequence of kernels as a CUDA graph it
    must first build, which would otherwise stall the first frame that takes a new path.
    In fast numerics, a throwaway session traces the chunked prefill's programs on ``system_prompt`` (the one
    conversations will open with: its own shapes), or where it is None or blank on a stand-in a chunk and a half long.
    ``progress`` receives the fraction done (0 … 1) as it goes; compiling kernels, not
    tracing, is what takes long on a fresh machine. Returns the seconds spent. Outputs of
    later sessions are unaffected.
    """
    started = time.perf_counter()
    report = progress if progress is not None else (lambda fraction: None)
    config = voicechat.config
    frame = config.frame_samples
    left = config.audio_config.encoder.left_context
    frames = left + 3 if mx.cuda.is_available() else 3
    audio = np.zeros(frames * frame, dtype=np.float32)
    if speech is not None:
        clip = np.asarray(speech, dtype=np.float32)[: audio.size]
        audio[: clip.size] = clip
        frames = max(frames, -(-clip.size // frame))
    steps = frames + left + 2
    session = Session(voicechat, seed=0)
    for index in range(frames):
        session.push(audio[index * frame : (index + 1) * frame])
        report((index + 1) / steps)
    perception = voicechat.model.stt_model.perception
    d_model = config.audio_config.encoder.d_model
    encoded = session.caches.perception.attention[0]
    outputs = perception.encoder.trace_stream(mx.float32 if encoded is None else encoded.dtype)
    for index, output in enumerate(outputs):
        mx.eval(output)
        report((frames + index + 1) / steps)
    outputs = []
    stt = voicechat.model.stt_model
    if len(voicechat.rnnt_vocabulary):
        started_state = RNNTState(last_token=0, hidden=session.caches.rnnt.hidden)
        if started_state.hidden is None:
            hidden_size = config.audio_config.decoder.pred_hidden
            layers = config.audio_config.decoder.pred_rnn_layers
            zeros = mx.zeros((layers, 1, hidden_size))
            started_state.hidden = (zeros, zeros)
        # After the first emission: the usual first pass, the rest of a frame that emits more, and the full pass.
        first = first_pass_attempts(config.audio_config.max_symbols)
        for attempts in {first, config.audio_config.max_symbols - first, config.audio_config.max_symbols} - {0}:
            proposal = rnnt_propose(
                stt.rnnt_decoder,
                stt.rnnt_joint,
                started_state,
                mx.zeros((1, 1, d_model)),
                blank_id=config.rnnt_blank_id,
                attempts=attempts,
            )
            outputs.append(proposal.symbols)
    mx.eval(outputs)
    session.close()
    chunk = default_prefill_chunk(voicechat.numerics)
    if chunk > 1:
        # Fast numerics run a system prompt (and a tool response) in chunks: their programs are traced here too,
        # over whole chunks and a part of one, so that the first prompted conversation does not stall on them
        # (23 s for an H100's first 900-position prompt against 1.9 s the second time: docs/performance.md).
        prompt = system_prompt if system_prompt and system_prompt.strip() else warming_prompt(voicechat, chunk * 3 // 2)
        Session(voicechat, seed=0, system_prompt=prompt).close()
    report(1.0)
    return time.perf_counter() - started
