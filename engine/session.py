"""A streaming VoiceChat conversation: PCM in, aligned events out, one 80 ms frame at a time.

The session owns every piece of state (front end, encoder, RNN-T, LLM, TTS and codec
caches, the token histories and the RNG seed) and knows the stage order; the networks
it drives are stateless. Per frame:

1. perception: 1280 samples -> log-mel -> cache-aware FastConformer -> projection;
2. RNN-T: greedy user transcript on the encoder frame (auxiliary; nothing reads it back);
3. language: ``E[prev text] + projected audio + 2·E[prev function]`` -> Nemotron-H ->
   greedy text and function ids;
4. TTS: EAR-TTS step conditioned on the text id (timeline step 0 emits silence codes);
5. codec: 31 codes -> 1764 samples at 22.05 kHz.

Outputs are numerically identical to mlx-vlm 0.7.10's streaming session driven the same
way (system-prompt prefill, timeline-0 silence, EOS resets the fed-back code to silence).
Two deliberate additions: :meth:`Session.flush` also emits the codec's final 8 samples,
which the reference drops, and input is validated more strictly (see :meth:`push`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import numpy as np

from .errors import AudioInputError, ContextLimitError, SessionClosedError, ToolLoopError
from .events import (
    AssistantTextDelta,
    AudioChunk,
    Cancelled,
    Done,
    Event,
    FunctionDelta,
    ToolCall,
    ToolResponseInjected,
    UserTranscriptDelta,
)
from .hooks import NO_HOOKS, FrameHooks, Probe
from .loading.tokenizer import StreamingDetokenizer
from .model import VoiceChat
from .networks.codec import CodecState, replace_control_codes
from .networks.llm import LLMCache
from .networks.perception import PerceptionState
from .networks.rnnt import (
    RNNTProposal,
    RNNTState,
    Transducer,
    first_pass_attempts,
    next_first_pass,
)
from .networks.tts import ECONOMY_LEVELS, SpeakerPrompt, TTSCache, TTSInput, build_speaker_prompt
from .ops.cache import KVCache, SlidingKVCache
from .prefill import PrefillCounts, default_prefill_chunk, forced_feedback, prefill_positions
from .tool_turn import HeldFrames, encoded_silence, silent_chunk
from .tools import ToolCallParser, ToolResult, tool_response_ids

IdOverride = Callable[[int, int], tuple[int, int]]
"""``(text_id, function_id) -> (text_id, function_id)``: replaces a frame's greedy ids (a test seam)."""


@dataclass
class SessionCaches:
    """All state that carries from one frame to the next (besides the token histories)."""

    perception: PerceptionState
    rnnt: RNNTState
    language: LLMCache
    tts: TTSCache
    codec: CodecState
    previous_code: mx.array  # (1, 1, 31) codes fed back into the next TTS step
    previous_code_sum: mx.array | None = None  # their codebook-vector sum, when the TTS produced them

    def arrays(self) -> list[mx.array]:
        out = [*self.perception.arrays(), *self.language.arrays(), *self.tts.arrays(), *self.codec.arrays()]
        out.append(self.previous_code)
        if self.previous_code_sum is not None:
            out.append(self.previous_code_sum)
        return out


def speaker_prompt(voicechat: VoiceChat) -> SpeakerPrompt:
    """The Aria warm-up prompt of the TTS: codec codes of silence plus the stored speaker latent.

    Made once per loaded model and numerics mode, then kept (a few kilobytes): encoding the silence holds about
    0.9 GB of the codec encoder's activations at full size while it runs (H200,
    ``tests/device/peak_probe.py``, in git history),
    which every conversation's start would otherwise add to its peak memory, for the same codes each time."""
    prompts = voicechat.speaker_prompts
    if voicechat.numerics not in prompts:
        speech = voicechat.model.tts_model
        frames = speech.audio_prompt_latents.Aria.shape[1] + 1
        silence = mx.zeros((1, 1, frames * voicechat.config.output_frame_samples), dtype=mx.float32)
        codes = speech.audio_codec.encode(silence).transpose(0, 2, 1)  # (1, frames, Q)
        prompt = build_speaker_prompt(
            codes, speech.audio_prompt_latents.Aria, voicechat.config.tts_config, voicechat.config.pad_token_id
        )
        mx.eval(prompt.codes, prompt.subword_ids, prompt.subword_mask, prompt.audio_mask, prompt.latent)
        prompts[voicechat.numerics] = prompt
    prompt_for_numerics: SpeakerPrompt = prompts[voicechat.numerics]
    return prompt_for_numerics


class Session:
    """One conversation on a loaded :class:`VoiceChat`.

    Args:
        voicechat: the loaded checkpoint.
        system_prompt: prefilled before the first frame (one LLM position per token, BOS and EOS).
        seed: seeds MLX's random generator, which only the TTS sampler draws from.
        max_seconds: refuse frames beyond this much audio with :class:`ContextLimitError`.
        hooks: whoever watches the frames (:class:`engine.hooks.FrameHooks`), the system prompt's prefill
            included: told of every stage boundary, launch, wait and read-back, and shown each network's
            inputs and outputs where it observes ("language.input", "language.hidden", "tts.input" (previous
            codes, their sum, text id), "tts.output", "codec.codes", "codec.samples"; lazy arrays; a chunked
            prefill shows the LLM's per chunk and no TTS step). A frame
            emits the :class:`FrameTiming` the hooks' ``end_frame`` returns (a
            :class:`engine.profiler.FrameProfiler` times each frame; the default, :data:`NO_HOOKS`, none).
        await_tool_results: whether a completed tool call stops the clock until :meth:`answer_tool_calls` answers
            it (set it where the system prompt offers tools: :func:`engine.tools.render_tool_prompt`). False, the
            default, is the reference's behaviour: calls are reported and the conversation goes on.
        override_ids: replaces each frame's greedy (text, function) ids before the session adopts them
            (:class:`engine.tools.ScriptedChannels` scripts a tool call on random weights); None, the default,
            changes nothing. With it the TTS takes the text id on the host (so it speaks the adopted one).

    Tool calls (docs/tools.md), with ``await_tool_results``: a call completed on the function channel stops the
    clock. From the frame whose events hold its :class:`ToolCall` (s), :attr:`awaiting_tool_results` is true: the
    LLM and TTS stand still, each mic frame still runs perception and the RN-T (the user's transcript keeps
    coming) and returns a silent :class:`AudioChunk`, and its audio-channel embedding is kept for replay.
    :meth:`answer_tool_calls` injects the results, replays those frames and lets the clock run again.
        prefill_chunk: the system prompt's positions per forward (:mod:`engine.prefill`): 1 steps it as the
            reference does; more runs the LLM in chunks and the TTS teacher-forced to silence (docs/numerics.md,
            "Prefill in chunks"). None: the numerics' default (1 in exact mode, 256 in fast).
    """

    def __init__(
        self,
        voicechat: VoiceChat,
        *,
        system_prompt: str | None = None,
        seed: int = 0,
        max_seconds: float | None = None,
        hooks: FrameHooks = NO_HOOKS,
        await_tool_results: bool = False,
        override_ids: IdOverride | None = None,
        prefill_chunk: int | None = None,
    ) -> None:
        if max_seconds is not None and max_seconds <= 0:
            raise ValueError(f"max_seconds must be positive, got {max_seconds}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        # Positions per forward of the system prompt's prefill: 1 is the reference's steps (engine.prefill).
        self.prefill_chunk = default_prefill_chunk(voicechat.numerics) if prefill_chunk is None else prefill_chunk
        self.voicechat = voicechat
        self.config = voicechat.config
        model = voicechat.model
        self._stt = model.stt_model
        self._speech = model.tts_model
        self.frame_samples = self.config.frame_samples
        self.max_frames = None if max_seconds is None else int(max_seconds / self.config.frame_duration)
        self.system_prompt = self.config.default_system_prompt if system_prompt is None else system_prompt
        self.seed = seed
        self._hooks = hooks

        self._pending = np.zeros(0, dtype=np.float32)
        self._closed = False
        self._frame_index = 0
        self._timeline_index = 0
        self._rnnt_attempts = first_pass_attempts(self.config.audio_config.max_symbols)
        self._text_ids: list[int] = []
        self._function_ids: list[int] = []
        special = self.config.special_text_ids
        self._text = StreamingDetokenizer(voicechat.tokenizer, special)
        self._function = StreamingDetokenizer(voicechat.tokenizer, special)
        self._tools = ToolCallParser(voicechat.tokenizer)
        self.await_tool_results = await_tool_results
        self._override_ids = override_ids
        self._pending_calls: tuple[ToolCall, ...] = ()
        self._held = HeldFrames()  # the projected audio of the mic frames held while a call waits
        self._silence_codes = self._speech.codec_silence_tokens[None, None, :]

        mx.random.seed(seed)
        tts = self._speech.tts_model
        tts_cache = tts.make_state()
        previous_code = tts.warmup(speaker_prompt(voicechat), tts_cache, voicechat.characters)
        self.caches = SessionCaches(
            perception=self._stt.perception.make_state(),
            rnnt=self._rnnt.make_state(),
            language=self._stt.llm.make_state(),
            tts=tts_cache,
            codec=self._speech.audio_codec.make_state(),
            previous_code=previous_code,
        )
        self._prefill(self.system_prompt)
        mx.eval(self.caches.arrays())
        if await_tool_results:
            _ = self._silence_embedding  # made now, so the first tool turn does not pay for it

    # ------------------------------------------------------------------ properties

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def frame_index(self) -> int:
        """Number of audio frames processed so far."""
        return self._frame_index

    @property
    def state_nbytes(self) -> int:
        """Bytes held by this conversation's caches; grows by :func:`engine.loading.memory.state_growth_per_frame` per
        frame."""
        return sum(array.nbytes for array in self.caches.arrays())

    @property
    def input_sample_rate(self) -> int:
        return self.config.input_sample_rate

    @property
    def output_sample_rate(self) -> int:
        return self.config.output_sample_rate

    @property
    def prompt_steps(self) -> int:
        """LLM steps the system prompt's prefill took (its tokens, BOS and EOS; 0 without a prompt)."""
        return self._prompt_steps

    @property
    def text_ids(self) -> list[int]:
        """Text-channel ids of every timeline position after the prompt: each stepped audio frame, and each
        position of an injected tool response (PAD). Frames held while a call waits take no position."""
        return self._text_ids[self._prompt_steps :]

    @property
    def function_ids(self) -> list[int]:
        """Function-channel ids of the same positions as :attr:`text_ids` (an injected response's forced ids)."""
        return self._function_ids[self._prompt_steps :]

    @property
    def awaiting_tool_results(self) -> bool:
        """True from the frame whose events hold the completing :class:`ToolCall` (s) until
        :meth:`answer_tool_calls` answers them: the clock is stopped."""
        return bool(self._pending_calls) and not self._closed

    @property
    def pending_tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls waiting for results, in the order :meth:`answer_tool_calls` takes their results."""
        return self._pending_calls if not self._closed else ()

    # ------------------------------------------------------------------ setup

    def _prefill(self, prompt: str) -> None:
        """The system prompt's positions before the first frame (spec §3.6): each prompt token in the audio
        channel's place, both output channels PAD, the TTS stepping on PAD from timeline 1. One position per step
        (the reference's) where :attr:`prefill_chunk` is 1, else in chunks (:mod:`engine.prefill`)."""
        self._prompt_steps = 0
        self.prefill_counts = PrefillCounts()
        if not prompt.strip():
            return
        ids = [self.config.bos_token_id, *self.voicechat.tokenizer.encode(prompt), self.config.eos_token_id]
        embeddings = self._stt.embed_tokens(mx.array([ids], dtype=mx.int32))
        if self.prefill_chunk > 1:
            self._prefill_chunked(embeddings)
            return
        for index in range(len(ids)):
            # The prompt token takes the audio channel's place; both output channels stay PAD.
            self._forced_position(embeddings[:, index : index + 1], self.config.pad_token_id)
        steps = self._prompt_steps = len(ids)
        self.prefill_counts = PrefillCounts(steps, steps, steps - 1, steps - 1, steps)

    def _forced_position(self, audio_embedding: mx.array, function_id: int) -> None:
        """One timeline position whose outputs are forced, stepped as the reference steps a prompt token: the LLM on
        ``audio_embedding`` in the audio channel's place (its heads unread), the text channel PAD, the function
        channel ``function_id``, the TTS a step on PAD; evaluated before the next."""
        pad = self.config.pad_token_id
        self._language_step(audio_embedding, generate=False)
        self._text_ids.append(pad)
        self._function_ids.append(function_id)
        self._tts_step(pad)
        self._timeline_index += 1
        mx.eval(self.caches.arrays())

    def _prefill_chunked(self, embeddings: mx.array) -> None:
        """:meth:`_prefill` in chunks of :attr:`prefill_chunk` positions (:meth:`_prefill_positions`), both
        channels PAD throughout."""
        pad, positions = self.config.pad_token_id, embeddings.shape[1]
        padding = [pad] * positions
        self.prefill_counts = self._prefill_positions(embeddings, padding, padding, padding, padding)
        self._prompt_steps = positions

    def _prefill_positions(
        self,
        audio: mx.array,
        text_feedback: list[int],
        function_feedback: list[int],
        text_ids: list[int],
        function_ids: list[int],
    ) -> PrefillCounts:
        """T = ``audio.shape[1]`` timeline positions whose outputs nobody reads, in chunks of
        :attr:`prefill_chunk`: the LLM's forwards on ``audio`` in the audio channel's place and the feedback ids
        given (:func:`engine.prefill.prefill_positions`), then the TTS's PAD steps teacher-forced to silence, only
        the last one sampled (:meth:`engine.networks.tts.EarTTS.prefill`); ``text_ids`` and ``function_ids`` (the
        positions' outputs) join the id histories. Returns what ran."""
        pad, positions, caches = self.config.pad_token_id, audio.shape[1], self.caches
        language = prefill_positions(
            self._stt,
            caches.language,
            audio,
            text_feedback,
            function_feedback,
            chunk=self.prefill_chunk,
            hooks=self._hooks,
        )
        tts_passes = tts_samples = 0
        steps = positions - 1 if self._timeline_index == 0 else positions  # timeline 0 runs no TTS
        if steps > 0:
            tts_input = TTSInput(
                caches.previous_code,
                mx.array([[pad]], dtype=mx.int32),
                self.voicechat.characters,
                caches.previous_code_sum,
                text_id=pad,
            )
            result, tts_passes = self._speech.tts_model.prefill(
                caches.tts, tts_input, steps, self._silence_codes, chunk=self.prefill_chunk
            )
            caches.previous_code, caches.previous_code_sum = result.codes, result.code_sum
            tts_samples = 1
        mx.eval(caches.arrays())
        self._text_ids.extend(text_ids)
        self._function_ids.extend(function_ids)
        self._timeline_index += positions
        return PrefillCounts(
            positions, language.forwards, tts_passes, tts_samples, language.evaluations + tts_passes + 1
        )

    # ------------------------------------------------------------------ one timeline step

    def _language_step(
        self, audio_embedding: mx.array, *, generate: bool, probe: Probe | None = None
    ) -> tuple[mx.array, mx.array] | None:
        pad = self.config.pad_token_id
        first = self._timeline_index == 0
        previous_text = pad if first else self._text_ids[-1]
        previous_function = pad if first else self._function_ids[-1]
        fused = self._stt.fuse_inputs(previous_text, audio_embedding, previous_function)
        if probe is not None:
            probe("language.fusion", fused)
        if self._hooks.observing:
            self._hooks.observe("language.input", fused)
        hidden = self._stt.llm.step(self.caches.language, fused)
        if self._hooks.observing:
            self._hooks.observe("language.hidden", hidden)
        if probe is not None:
            probe("language.llm", hidden)
        if not generate:
            return None
        ids = self._stt.choose(hidden)
        if probe is not None:
            probe("language.heads", *ids)
        return ids

    def _tts_step(self, text_id: int, probe: Probe | None = None) -> mx.array:
        """Advance EAR-TTS by one step; returns this step's codes (1, 1, Q)."""
        if self._timeline_index == 0:
            return self._silence_codes
        caches = self.caches
        if text_id == self.config.eos_token_id:
            caches.previous_code = mx.broadcast_to(self._silence_codes, caches.previous_code.shape)
            caches.previous_code_sum = None
        token = mx.array([[text_id]], dtype=mx.int32)
        if self._hooks.observing:
            self._hooks.observe("tts.input", (caches.previous_code, caches.previous_code_sum, text_id))
        tts_input = TTSInput(
            caches.previous_code, token, self.voicechat.characters, caches.previous_code_sum, text_id=text_id
        )
        # The hooks close the TTS's sub-stages where a probe is asked for (no launch otherwise: as before).
        hooks = self._hooks if probe is not None else NO_HOOKS
        result = self._speech.tts_model.step(caches.tts, tts_input, hooks)
        caches.previous_code, caches.previous_code_sum = result.codes, result.code_sum
        if self._hooks.observing:
            self._hooks.observe("tts.output", result)
        return result.codes

    @property
    def _tts_spells_on_device(self) -> bool:
        """Whether this frame's TTS takes the text id on the device (one sync a frame): in fast numerics, unless
        the hooks watch the networks' inputs on the host (observe) or time every sub-stage."""
        tts = self._speech.tts_model
        return tts.takes_text_on_device and not self._hooks.observing and not self._hooks.sub_stages

    def _tts_step_on_device(self, text_array: mx.array) -> mx.array:
        """:meth:`_tts_step` for a text id (1,) still on the device: the end-of-speech rule as a select and the
        token's conditioning spelled on the device (:meth:`engine.networks.tts.EarTTS.condition_on_device`)."""
        if self._timeline_index == 0:
            return self._silence_codes
        caches, tts = self.caches, self._speech.tts_model
        token = text_array.reshape(1, 1).astype(mx.int32)
        ends = (token == self.config.eos_token_id)[..., None]
        previous_code = mx.where(ends, self._silence_codes, caches.previous_code)
        previous_code_sum = caches.previous_code_sum
        if previous_code_sum is not None:
            # What the host form recomputes from the silence codes after an end of speech: the same sum.
            previous_code_sum = mx.where(ends, self._silence_code_sum, previous_code_sum)
        spelling = self.voicechat.characters.on_device(self._stt.text_vocabulary_size)
        condition = tts.condition_on_device(token, spelling)
        tts_input = TTSInput(previous_code, token, self.voicechat.characters, previous_code_sum, condition=condition)
        result = tts.step(caches.tts, tts_input, self._hooks)
        caches.previous_code, caches.previous_code_sum = result.codes, result.code_sum
        return result.codes

    @functools.cached_property
    def _rnnt(self) -> Transducer:
        """The RN-T over this model's predictor and joint, for its vocabulary."""
        return Transducer(
            self._stt.rnnt_decoder,
            self._stt.rnnt_joint,
            blank_id=self.config.rnnt_blank_id,
            max_symbols=self.config.audio_config.max_symbols,
            vocabulary=self.voicechat.rnnt_vocabulary,
        )

    @functools.cached_property
    def _silence_code_sum(self) -> mx.array:
        tts = self._speech.tts_model
        total = tts.code_sum(self._silence_codes)
        mx.eval(total)
        return total

    def _adopt_ids(
        self,
        text_array: mx.array,
        function_array: mx.array,
        encoded: mx.array | None,
        proposal: RNNTProposal | None,
        events: list[Event],
    ) -> tuple[int, int]:
        """Read the frame's text and function ids (evaluated) and commit its RN-T proposal, whose transcript
        delta, if any, joins ``events``."""
        # Both are int32 scalars: ``item()`` gives an int (MLX's stub also allows float and complex).
        text_id, function_id = int(cast(int, text_array.item())), int(cast(int, function_array.item()))
        if self._override_ids is not None:
            text_id, function_id = self._override_ids(text_id, function_id)
        self._text_ids.append(text_id)
        self._function_ids.append(function_id)
        if proposal is not None and encoded is not None:
            self._commit_transcript(encoded, proposal, events)
        return text_id, function_id

    def _commit_transcript(self, encoded: mx.array, proposal: RNNTProposal, events: list[Event]) -> None:
        """Commit the frame's (evaluated) RN-T proposal; its transcript delta, if any, joins ``events``."""
        symbols = cast(list[int], proposal.symbols.tolist())  # (attempts,) int32
        self._rnnt_attempts = next_first_pass(symbols, self.config.audio_config.max_symbols)
        transcript = self._rnnt.commit(self.caches.rnnt, encoded, proposal, symbols, self._hooks)
        if transcript is not None:
            events.append(UserTranscriptDelta(self._frame_index, *transcript))

    def _step_frame(self, frame: np.ndarray) -> list[Event]:
        if self.max_frames is not None and self._frame_index >= self.max_frames:
            raise ContextLimitError(
                f"the conversation reached its {round(self.max_frames * self.config.frame_duration, 2):g} s limit; "
                "start a new conversation"
            )
        if self._pending_calls:
            return self._hold_frame(frame)
        self._hooks.begin_frame(self._frame_index)
        projected, encoded, proposal = self._perceive(frame)
        events = self._respond(projected, encoded, proposal)
        self._frame_index += 1
        return events

    def _perceive(self, frame: np.ndarray) -> tuple[mx.array, mx.array, RNNTProposal | None]:
        """Phase 1's first half: perception and the RN-T's proposal (launched, not read back)."""
        hooks, caches = self._hooks, self.caches
        projected, encoded = self._stt.perception.step(caches.perception, mx.array(frame), hooks)
        perceived = (projected, encoded, *caches.perception.arrays())
        hooks.stage("perception", *perceived)
        # The device starts on each part as soon as its graph is built, while the host builds the next one.
        hooks.launch(*perceived)
        proposal = None
        if len(self.voicechat.rnnt_vocabulary):
            proposal = self._rnnt.propose(caches.rnnt, encoded, self._rnnt_attempts)
        rnnt_outputs = [proposal.symbols, proposal.last_token, *proposal.hidden] if proposal else []
        hooks.launch_part(*rnnt_outputs)
        hooks.stage("rnnt", *rnnt_outputs)
        return projected, encoded, proposal

    def _respond(self, projected: mx.array, encoded: mx.array | None, proposal: RNNTProposal | None) -> list[Event]:
        """The rest of a frame on ``projected`` (the audio channel): the LLM, the TTS and the codec; returns the
        frame's events and ends it with the hooks. A replayed frame comes with no RN-T ``proposal``."""
        hooks, caches, config = self._hooks, self.caches, self.config
        events: list[Event] = []
        probe = hooks.sub_stage if hooks.sub_stages else None
        text_array, function_array = self._language_step(projected, generate=True, probe=probe)  # type: ignore[misc]
        hooks.launch(text_array, function_array, *caches.language.arrays())
        phase_one = [
            text_array,
            function_array,
            *([proposal.symbols] if proposal else []),
            *caches.perception.arrays(),
            *caches.language.arrays(),
        ]
        one_sync = self._tts_spells_on_device and self._override_ids is None
        if one_sync:
            # Fast numerics: the TTS takes the text id on the device, so the frame is built to its end while the
            # device computes, and the ids are read with the samples.
            hooks.stage("language", text_array, function_array, *caches.language.arrays())
            codes = self._tts_step_on_device(text_array)
        else:
            hooks.sync(*phase_one)
            text_id, function_id = self._adopt_ids(text_array, function_array, encoded, proposal, events)
            hooks.stage("language")
            # Phase 2 — the TTS step needs the text id on the host (its character lookup), then the codec.
            codes = self._tts_step(text_id, probe)
        self._timeline_index += 1
        spoken = (codes, *caches.tts.arrays())
        hooks.stage("tts", *spoken)
        hooks.launch(*spoken)
        clean = replace_control_codes(codes, self._speech.control_codes, self._speech.codec_silence_tokens)
        if hooks.observing:
            hooks.observe("codec.codes", clean)
        samples = self._speech.audio_codec.step(caches.codec, clean.transpose(0, 2, 1), hooks)[0]
        if hooks.observing:
            hooks.observe("codec.samples", samples)
        hooks.sync(
            samples,
            clean,
            codes,
            *caches.tts.arrays(),
            *caches.codec.arrays(),
            caches.previous_code,
            *([caches.previous_code_sum] if caches.previous_code_sum is not None else []),
            *(phase_one if one_sync else []),
        )
        if one_sync:
            text_id, function_id = self._adopt_ids(text_array, function_array, encoded, proposal, events)
        hooks.stage("codec")

        text_update = self._text.append(text_id)
        if text_update is not None:
            events.append(AssistantTextDelta(self._frame_index, text_id, *text_update))
        function_update = self._function.append(function_id)
        if function_update is not None:
            events.append(FunctionDelta(self._frame_index, function_id, *function_update))
        calls = self._tools.push(function_id, self._frame_index, ignored=config.special_text_ids)
        events.extend(calls)
        if self._tools.ended_call and self.await_tool_results:
            self._pending_calls = tuple(calls)  # the clock stops from the next frame
        if samples.shape[0] != config.output_frame_samples:
            raise RuntimeError(f"codec returned {samples.shape[0]} samples, expected {config.output_frame_samples}")
        events.append(
            AudioChunk(
                frame_index=self._frame_index,
                samples=np.array(samples, dtype=np.float32),
                codes=np.array(clean[0, 0], dtype=np.int32),
                sample_rate=config.output_sample_rate,
                codes_raw=np.array(codes[0, 0], dtype=np.int32),
            )
        )
        timing = hooks.end_frame()
        if timing is not None:
            events.append(timing)
        return events

    # ------------------------------------------------------------------ the tool loop (docs/tools.md)

    def _hold_frame(self, frame: np.ndarray) -> list[Event]:
        """A mic frame while tool results are awaited (the clock stopped): perception and the RN-T run (the
        user's transcript keeps coming), the projected audio waits for replay (at most
        :data:`engine.tool_turn.MAX_DEFERRED_FRAMES`, the oldest dropped beyond), and the frame's audio is silence."""
        hooks, config = self._hooks, self.config
        hooks.begin_frame(self._frame_index)
        events: list[Event] = []
        projected, encoded, proposal = self._perceive(frame)
        hooks.sync(projected, *([proposal.symbols] if proposal else []), *self.caches.perception.arrays())
        if proposal is not None:
            self._commit_transcript(encoded, proposal, events)
        dropped = self._held.hold(projected, self._frame_index)
        if dropped is not None:
            events.append(dropped)
        silence = self._speech.codec_silence_tokens
        events.append(silent_chunk(self._frame_index, config.output_frame_samples, silence, config.output_sample_rate))
        timing = hooks.end_frame()
        if timing is not None:
            events.append(timing)
        self._frame_index += 1
        return events

    @functools.cached_property
    def _silence_embedding(self) -> mx.array:
        return encoded_silence(self._stt.perception, self.frame_samples)

    def _inject_tool_response(self, token_ids: Sequence[int]) -> int:
        """Force a tool response into the function channel, the training layout's insertion: the clock stopped,
        one timeline position per id, unpaced. At each position:

        * function channel: the forced id is the position's output, fed back as a generated id would be, so
          position t's input carries the id forced at t-1 (the first carries the call's last id, ``<SPECIAL_21>``,
          and the frame after the response carries ``<SPECIAL_22>``);
        * text channel: PAD is the output, so every input after the first carries ``E[PAD]`` (the first carries
          the last frame's text id, as any position does);
        * audio channel: encoded silence (:func:`engine.tool_turn.encoded_silence`);
        * the TTS steps with PAD, as in the prompt's prefill; no audio comes out and the codec stands still.

        Where :attr:`prefill_chunk` is above 1 (fast numerics) the positions run in chunks, as the prompt's do
        (:meth:`_prefill_positions`: the same inputs, the TTS teacher-forced to silence); else one by one. Returns
        the LLM's forwards.
        """
        pad, silence = self.config.pad_token_id, self._silence_embedding
        if self.prefill_chunk > 1:
            text, function = forced_feedback(self._text_ids[-1], self._function_ids[-1], token_ids, pad)
            audio = mx.broadcast_to(silence, (1, len(token_ids), silence.shape[-1]))
            counts = self._prefill_positions(audio, text, function, [pad] * len(token_ids), list(token_ids))
            return counts.llm_forwards
        for token_id in token_ids:
            self._forced_position(silence, token_id)
        return len(token_ids)

    def answer_tool_calls(self, results: Sequence[ToolResult]) -> list[Event]:
        """Give the model the results of :attr:`pending_tool_calls`, one per call in their order, and let the
        clock run again.

        The results are rendered (:func:`engine.tools.tool_response_ids`: at most 512 tokens, then
        ``<SPECIAL_22>``) and injected (:meth:`_inject_tool_response`); then the mic frames held meanwhile are
        replayed in order as ordinary frames on the resume frame's index (their text, function, audio and timing
        events; their transcript came live). Returns :class:`ToolResponseInjected`, then the replayed frames'
        events. A replayed frame that completes a new call stops the clock again; the frames after it stay held.

        Raises:
            ToolLoopError: no call is pending, not one result per pending call, or a result that is not a
                :class:`ToolResult` of text (nothing is injected; the calls stay pending).
            SessionClosedError: the session was flushed, cancelled or closed.
        """
        if self._closed:
            raise SessionClosedError("this conversation has ended; start a new one")
        pending = self._pending_calls
        if not pending:
            raise ToolLoopError("no tool call is waiting for results")
        if len(results) != len(pending):
            raise ToolLoopError(f"{len(pending)} tool call(s) are waiting for results; received {len(results)}")
        for result in results:
            if not isinstance(result, ToolResult):
                raise ToolLoopError(f"a tool result must be a ToolResult, received {type(result).__name__}")
            if not (isinstance(result.tool, str) and isinstance(result.ok, bool) and isinstance(result.content, str)):
                raise ToolLoopError(f"a tool result needs a str tool, a bool ok and a str content: {result!r}")
        token_ids = tool_response_ids(results, self.voicechat.tokenizer)
        started = time.perf_counter()
        forwards = self._inject_tool_response(token_ids)
        seconds = time.perf_counter() - started
        self._pending_calls, self._held.dropped = (), 0
        replayed: list[Event] = []
        count = 0
        while len(self._held) and not self._pending_calls:
            projected = self._held.next()
            self._hooks.begin_frame(self._frame_index)
            replayed.extend(self._respond(projected, None, None))
            count += 1
        injected = ToolResponseInjected(self._frame_index, len(token_ids), tuple(token_ids), seconds, count, forwards)
        return [injected, *replayed]

    # ------------------------------------------------------------------ public API

    def _validate(self, samples: Any, sample_rate: int | None) -> np.ndarray:
        if self._closed:
            raise SessionClosedError("this conversation has ended; start a new one")
        rate = self.config.input_sample_rate if sample_rate is None else sample_rate
        if rate != self.config.input_sample_rate:
            raise AudioInputError(f"expected {self.config.input_sample_rate} Hz audio, received {rate} Hz")
        chunk = np.asarray(samples)
        if chunk.ndim == 2 and 1 in chunk.shape:
            chunk = chunk.reshape(-1)
        if chunk.ndim != 1:
            raise AudioInputError(f"expected mono audio, received an array of shape {chunk.shape}")
        if chunk.size == 0:
            raise AudioInputError("received an empty audio chunk")
        if not np.issubdtype(chunk.dtype, np.floating) and not np.issubdtype(chunk.dtype, np.integer):
            raise AudioInputError(f"audio samples must be numbers, received {chunk.dtype}")
        chunk = chunk.astype(np.float32, copy=False)
        if not np.isfinite(chunk).all():
            raise AudioInputError("audio contains NaN or infinite samples")
        return chunk

    def push(self, samples: Any, sample_rate: int | None = None) -> list[Event]:
        """Feed mono float PCM of any length; returns the events of every frame it completes.

        Raises:
            AudioInputError: wrong sample rate, more than one channel, empty, or NaN/Inf samples
                (nothing is consumed; the session stays usable).
            ContextLimitError: the session's length limit is reached.
            SessionClosedError: the session was flushed, cancelled or closed.
        """
        chunk = self._validate(samples, sample_rate)
        self._pending = np.concatenate([self._pending, chunk])
        events: list[Event] = []
        while self._pending.shape[0] >= self.frame_samples:
            frame, self._pending = self._pending[: self.frame_samples], self._pending[self.frame_samples :]
            events.extend(self._step_frame(frame))
        return events

    def flush(self) -> list[Event]:
        """End the input: zero-pad and process the partial frame, emit the codec's tail, then ``Done``."""
        if self._closed:
            return []
        events: list[Event] = []
        if self._pending.shape[0]:
            frame = np.zeros(self.frame_samples, dtype=np.float32)
            frame[: self._pending.shape[0]] = self._pending
            self._pending = np.zeros(0, dtype=np.float32)
            events.extend(self._step_frame(frame))
        tail = self._speech.audio_codec.flush(self.caches.codec)[0]
        events.append(
            AudioChunk(
                frame_index=self._frame_index,
                samples=np.array(tail, dtype=np.float32),
                codes=np.zeros(0, dtype=np.int32),
                sample_rate=self.config.output_sample_rate,
            )
        )
        events.append(Done(self._frame_index))
        self._closed = True
        self._pending_calls = ()
        self._held.clear()
        return events

    def cancel(self) -> list[Event]:
        """Stop now: drop buffered input; no further output."""
        if self._closed:
            return []
        self._closed = True
        self._pending = np.zeros(0, dtype=np.float32)
        self._pending_calls = ()
        self._held.clear()
        return [Cancelled(self._frame_index)]

    def close(self) -> None:
        """Release the caches (the conversation cannot continue afterwards)."""
        self._closed = True
        self._pending = np.zeros(0, dtype=np.float32)
        self._pending_calls = ()
        self._held.clear()

    def set_economy(self, level: int) -> None:
        """Fast numerics only: from the next frame on, the TTS spends less per frame at ``level`` (0 the full step;
        :data:`engine.networks.tts.ECONOMY_LEVELS`; docs/numerics.md "Keeping up"). Exact numerics refuses any
        level but 0 with ``ValueError``: it never changes its numbers."""
        if level not in ECONOMY_LEVELS:
            raise ValueError(f"economy level must be one of {ECONOMY_LEVELS}; got {level!r}")
        if level and self._speech.tts_model.fast is None:
            raise ValueError("exact numerics never spends less per frame; switch to fast numerics first")
        self.caches.tts.economy = level

    @property
    def economy(self) -> int:
        """The TTS's economy level (:meth:`set_economy`)."""
        return self.caches.tts.economy

    def age(self, positions: int, *, seed: int = 0) -> None:
        """Make the conversation ``positions`` frames older: every attention cache that grows (the LLM's and the
        TTS backbone's) gains that many random positions (:meth:`engine.ops.cache.KVCache.age`), as
        ``parley bench --history`` needs to time an old conversation's frames. For timing only: what the model
        says afterwards is not meaningful (nor the reference's)."""
        key = mx.random.key(seed)
        for layer in [*self.caches.language.layers, *self.caches.tts.layers]:
            if isinstance(layer, KVCache | SlidingKVCache):
                layer.age(positions, key=key)
        self.caches.language.position += positions
        mx.eval(self.caches.arrays())
