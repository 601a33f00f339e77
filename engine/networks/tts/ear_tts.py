"""EAR-TTS: the speech-token generator (one frame of 31 codec codes per text token).

Per step the previous frame's codes are embedded (sum of their RVQ codebook
vectors, then ``embed_code``), the current text token is embedded by the
character-aware subword encoder (:mod:`engine.networks.subword`), and both are fused by a
gated projection. A Gemma-3 decoder runs that one position at batch 2 for
classifier-free guidance (row 0 conditioned on the text, row 1 on ``null_emb``),
and a MaskGIT-style loop fills the 31 codes in five rounds: a mixture-of-Gaussians
head predicts a latent, which greedy residual VQ turns into the next codes.

All float work after the code embedding is float32 (the bf16 weights promote), as
in the reference port. Streaming state (:mod:`engine.streaming`) lives in a :class:`TTSCache` from
:meth:`EarTTS.make_state`; :meth:`EarTTS.step` makes one frame from a :class:`TTSInput`. Fast numerics' forms
are :mod:`.fast`'s, chosen by :meth:`EarTTS.use_numerics`. Parameter attribute names follow the checkpoint keys
under ``tts_model.tts_model.``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn

from ...hooks import NO_HOOKS, FrameHooks
from ...jit import jit
from ...kernels.plan import FastPlan
from ...kernels.residual_vq import nearest_code_ops
from ...kernels.step_draws import Draw
from ...loading.config import TTSConfig
from ...ops.cache import KVCache, SlidingKVCache
from ...weight_names import TRANSPOSE_MARK, VIEW_MARK
from ..linear import Linear
from .backbone import GUIDED_ROWS, Backbone
from .fast import TTSFast, bind
from .mixture import MixtureHead
from .state import TTSCache
from .subword import CharacterTable, CharAwareSubwordEncoder, DeviceSpelling, FloatRMSNorm

# Text tokens whose conditioning is memoised (about 4.6 KB each at full size).
_CONDITION_MEMO_SIZE = 8192

# How much a fast step spends less while the machine falls behind (TTSCache.economy, set through
# engine.session.Session.set_economy; docs/numerics.md "Keeping up"): 0 the full step; 1 the MoG head samples a
# latent for the first ECONOMY_SAMPLED_ROUNDS MaskGIT rounds only, and the later rounds' quantizers are fitted to the
# last latent drawn (greedy residual VQ goes on from its residual); 2 that, with classifier-free guidance off: the
# MoG head runs on the text-conditioned row alone. The backbone still runs both rows, so its caches stay those of
# the full step and a step back at 0 continues as if nothing had been skipped; where a step's draws are made at once
# (EarTTS.step_draws) the skipped rounds' draws are still made and left unused, so the random stream stays the full
# step's too.
ECONOMY_LEVELS = (0, 1, 2)
ECONOMY_SAMPLED_ROUNDS = 2

# --------------------------------------------------------------------------- fusion


class GatedFusion(nn.Module):
    """``norm(σ(rs) · (σ(g) ⊙ audio_proj(audio / Q) + (1 − σ(g)) ⊙ text_proj(text)))``."""

    def __init__(self, hidden_size: int, num_codebooks: int, eps: float) -> None:
        super().__init__()
        self.num_codebooks = num_codebooks
        self.audio_proj = Linear(hidden_size, hidden_size)
        self.text_proj = Linear(hidden_size, hidden_size)
        self.gate = mx.zeros((hidden_size,))
        self.residual_scale = mx.array(0.5)
        self.final_norm = FloatRMSNorm(hidden_size, eps)

    def __call__(self, audio: mx.array, text: mx.array) -> mx.array:
        audio = self.audio_proj(audio / self.num_codebooks)
        text = self.text_proj(text)
        # The sigmoids run in the parameter dtype and are then cast to the activations'.
        gate = mx.sigmoid(self.gate).astype(audio.dtype)
        scale = mx.sigmoid(self.residual_scale).astype(audio.dtype)
        return self.final_norm(scale * (gate * audio + (1.0 - gate) * text))


# --------------------------------------------------------------------------- speaker prompt


@dataclass(frozen=True)
class SpeakerPrompt:
    """Inputs of the warm-up pass that conditions the TTS on the built-in speaker.

    ``codes`` (1, P, Q): codec codes of silence with the mask code at frame 0 and at
    the last frame; ``subword_ids`` (1, P): PAD everywhere, ``subword_mask`` true on
    the last two positions; ``audio_mask`` true on the last position only (the BOS
    frame); ``latent`` (1, P, H): the speaker latent that replaces the code embedding
    before the BOS frame.
    """

    codes: mx.array
    subword_ids: mx.array
    subword_mask: mx.array
    audio_mask: mx.array
    latent: mx.array


def build_speaker_prompt(
    silence_codes: mx.array, aria_latent: mx.array, config: TTSConfig, pad_id: int
) -> SpeakerPrompt:
    """Assemble the speaker prompt from the codec codes of P + 1 frames of zeros (1, P + 1, Q).

    ``aria_latent`` (1, P, H) is ``tts_model.audio_prompt_latents.Aria``; P = 37.
    """
    frames = aria_latent.shape[1]
    expected = (1, frames + 1, config.num_quantizers)
    if tuple(silence_codes.shape) != expected:
        raise ValueError(f"silence codes have shape {tuple(silence_codes.shape)}, expected {expected}")
    masked_frame = mx.full((1, 1, config.num_quantizers), config.mask_code, dtype=mx.int32)
    codes = mx.concatenate([masked_frame, silence_codes[:, 1 : frames - 1].astype(mx.int32), masked_frame], axis=1)
    position = mx.arange(frames)[None, :]
    return SpeakerPrompt(
        codes=codes,
        subword_ids=mx.full((1, frames), pad_id, dtype=mx.int32),
        subword_mask=position >= frames - 2,
        audio_mask=position == frames - 1,
        latent=aria_latent[:1],
    )


# --------------------------------------------------------------------------- EAR-TTS


@dataclass(frozen=True)
class TTSInput:
    """One TTS frame's input: the previous frame's codes (1, 1, Q) and the text token (1, 1), with the model's
    ``characters``. ``previous_code_sum``, when given, is the previous step's ``code_sum`` — the sum of
    ``previous_code``'s codebook vectors, which the code embedding would recompute. ``text_id``, when given, is
    ``text_token``'s value, known on the host: the token's conditioning is then looked up in (or added to) a
    per-token memo, with no readback. ``condition``, when given, is the token's guided conditioning already built
    (:meth:`EarTTS.condition_on_device`), and ``text_token`` is not read."""

    previous_code: mx.array
    text_token: mx.array
    characters: CharacterTable
    previous_code_sum: mx.array | None = None
    text_id: int | None = None
    condition: mx.array | None = None


@dataclass(frozen=True)
class TTSStepResult:
    """One generated frame: ``codes`` (1, 1, Q) int32 in [0, codebook_size), ``hidden`` (2, 1, H) float32,
    and ``code_sum`` (1, 1, latent) float32, the sum of the codes' codebook vectors (the next step's input)."""

    codes: mx.array
    hidden: mx.array
    code_sum: mx.array


@dataclass(frozen=True)
class RefinementRound:
    """One non-empty MaskGIT round: quantizers [start, start + count) are filled."""

    start: int
    count: int


def refinement_plan(config: TTSConfig) -> tuple[RefinementRound, ...]:
    """The non-empty rounds of the cosine-cubed schedule ((0, 1), (1, 1), (2, 3), (5, 4), (9, 22) at full size)."""
    rounds: list[RefinementRound] = []
    start = 0
    for count in config.refinement_counts:
        if count:
            rounds.append(RefinementRound(start, count))
            start += count
    return tuple(rounds)


class EarTTS(nn.Module):
    """The EAR-TTS network (checkpoint prefix ``tts_model.tts_model.``)."""

    def __init__(self, config: TTSConfig) -> None:
        super().__init__()
        self.config = config
        self.plan = refinement_plan(config)
        self.backbone = Backbone(config)
        self.bos_emb = mx.zeros((config.hidden_size,))
        self.null_emb = mx.zeros((config.hidden_size,))
        self.embed_code = Linear(config.latent_size, config.hidden_size, bias=False)
        self.embed_subword = CharAwareSubwordEncoder(config.character_encoder, config.hidden_size)
        self.gated_fusion_audio_text = GatedFusion(config.hidden_size, config.num_quantizers, config.rms_norm_eps)
        # Projects reference-audio embeddings into speaker prompts (voice cloning); unused with the built-in latent.
        self.audio_prompt_projection_W = mx.zeros((config.hidden_size, config.hidden_size))
        self.mog_head = MixtureHead(config.hidden_size, config.latent_size, config.mog_head)
        self.rvq_embs = mx.zeros((config.num_quantizers, config.codebook_size, config.latent_size))
        # Fast numerics' form as bound (engine.networks.tts.fast), set by use_numerics; None in exact mode.
        self.fast: TTSFast | None = None

    def use_numerics(
        self, plan: FastPlan | None, *, release: bool = True, vocabulary_size: int | None = None
    ) -> dict[str, bool]:
        """Run fast numerics' forms for ``plan`` (None: exact mode's operations; with ``release`` the programs
        traced with the row products' bf16 copies and the conditioning tables go too); returns which of fast mode's
        changes to the TTS run as kernels (:func:`.fast.bind`; ``vocabulary_size``: the text vocabulary a
        conditioning table would cover)."""
        self.fast, changes = bind(self, plan, vocabulary_size=vocabulary_size)
        if plan is None and release:
            self.forget_row_programs()
            self.forget_condition_tables()  # exact mode never reads them
        return changes

    @property
    def takes_text_on_device(self) -> bool:
        """Whether a frame may hand this TTS its text id on the device (fast numerics: one sync a frame,
        :meth:`condition_on_device`), rather than read back to the host."""
        return self.fast is not None

    @property
    def nearest_code(self) -> Callable[..., tuple[mx.array, mx.array, mx.array]]:
        """One quantizer's greedy step after its product: the operations, or fast numerics' kernel."""
        return nearest_code_ops if self.fast is None else self.fast.nearest

    @property
    def nearest_rounds(self) -> dict[int, Callable[..., tuple[mx.array, mx.array, mx.array]]]:
        """Fast numerics on CUDA: a round's quantizers in one launch, by the round's count."""
        return {} if self.fast is None else self.fast.rounds

    @property
    def step_draws(self) -> Callable[[mx.array], tuple[mx.array, ...]] | None:
        """Fast numerics: a step's draws made at once from the generator's key, or None (one by one)."""
        return None if self.fast is None else self.fast.draws

    def draw_plan(self) -> tuple[Draw, ...]:
        """The draws of a step's MaskGIT rounds, in order: per round the component's uniform over the guided
        row's mixture logits, then the latent's normal noise."""
        head = self.mog_head
        rows = 1 if self.config.guidance_scale > 0.0 else GUIDED_ROWS  # guidance mixes the two rows into one
        round_draws = (Draw("uniform", (rows, head.num_components)), Draw("normal", (rows, head.latent_size)))
        return round_draws * len(self.plan)

    def make_state(self) -> TTSCache:
        """The streaming contract's state (:mod:`engine.streaming`): :meth:`make_cache`."""
        return self.make_cache()

    def make_cache(self) -> TTSCache:
        """Fresh attention state: unbounded caches on global layers, sliding-window caches elsewhere, storing
        the dtype fast numerics asks for (:attr:`.fast.TTSFast.cache_dtype`; the reference's in exact mode)."""
        window = self.config.sliding_window
        dtype = None if self.fast is None else self.fast.cache_dtype
        return TTSCache(
            layers=[
                KVCache(dtype=dtype) if is_global else SlidingKVCache(window=window, dtype=dtype)
                for is_global in self.backbone.global_layers
            ]
        )

    # ----------------------------------------------------------------- embeddings

    def _codebook_sum(self, columns: list[mx.array]) -> mx.array:
        """Σ_q rvq_embs[q, code_q] in float32, in quantizer order; the mask code adds zero."""
        mask_code = self.config.mask_code
        total = mx.zeros((*columns[0].shape, self.config.latent_size))
        for quantizer, column in enumerate(columns):
            known = column < mask_code
            rows = self.codebooks[quantizer][mx.where(known, column, 0)]
            total = total + mx.where(known[..., None], rows, 0.0)
        return total

    def code_sum(self, codes: mx.array) -> mx.array:
        """(B, T, Q) codes → (B, T, latent) float32: the sum of their codebook vectors."""
        return self._codebook_sum([codes[..., quantizer] for quantizer in range(self.config.num_quantizers)])

    def embed_codes(self, codes: mx.array) -> mx.array:
        """(B, T, Q) codes → (B, T, H) float32 code embeddings."""
        return self.embed_code(self.code_sum(codes))

    def _guided_condition(self, subword_ids: mx.array, subword_mask: mx.array, chars: CharacterTable) -> mx.array:
        """Text conditioning (1, T) → (2, T, H): row 0 the text, row 1 the learned null embedding."""
        return self._guided(self.embed_subword(subword_ids, subword_mask, chars))

    def _guided(self, text: mx.array) -> mx.array:
        """Text conditioning (1, T, H) → (2, T, H): the null embedding's row joined after it."""
        return mx.concatenate([text, mx.broadcast_to(self.null_emb, text.shape)], axis=0)

    def _token_condition(self, token_id: int, chars: CharacterTable) -> mx.array:
        """The guided conditioning (2, 1, H) of one text token, computed once per token id.

        It depends only on the id (and the weights), so a memo returns the very same
        values; a conversation repeats few tokens (PAD most of all), so most frames skip
        the character encoder entirely.
        """
        memo = self._condition_memo
        condition = memo.get(token_id)
        if condition is None:
            token = mx.array([[token_id]], dtype=mx.int32)
            condition = self._guided_condition(token, mx.ones(token.shape, dtype=mx.bool_), chars)
            if len(memo) >= _CONDITION_MEMO_SIZE:
                memo.pop(next(iter(memo)))
            memo[token_id] = condition
        return condition

    @functools.cached_property
    def _condition_memo(self) -> dict[int, mx.array]:
        return {}  # token id -> conditioning; in the instance __dict__, outside the parameter tree

    def condition_on_device(self, text_token: mx.array, spelling: DeviceSpelling) -> mx.array:
        """The guided conditioning (2, 1, H) of a text token (1, 1) that stays on the device (fast numerics).

        Read from the vocabulary's table where one is in use for ``spelling``'s size (:meth:`use_condition_table`),
        else spelled from ``spelling`` and encoded every step (no memo: the id is not known on the host), as one
        compiled program; see :meth:`CharAwareSubwordEncoder.encode_on_device` for how it differs from
        :meth:`_token_condition`."""
        table = self._condition_tables.get(spelling.lengths.shape[0])
        if table is not None:
            return self._guided(table[text_token.reshape(-1)].reshape(*text_token.shape, -1))
        return self._device_condition(text_token, spelling.char_ids, spelling.lengths)

    def use_condition_table(self, table: mx.array | None, size: int) -> None:
        """Read a token's text conditioning from ``table`` (V, H) — every token's, made at load
        (:meth:`CharAwareSubwordEncoder.encode_vocabulary`) — for spellings of ``size`` tokens; None: encode it
        every step again."""
        if table is None:
            self._condition_tables.pop(size, None)
        else:
            self._condition_tables[size] = table

    def has_condition_table(self, size: int) -> bool:
        """Whether :meth:`condition_on_device` reads a table for spellings of ``size`` tokens."""
        return size in self._condition_tables

    def forget_condition_tables(self) -> None:
        """Let every table of :meth:`use_condition_table` go."""
        self._condition_tables.clear()

    @functools.cached_property
    def _condition_tables(self) -> dict[int, mx.array]:
        return {}  # vocabulary size -> table; in the instance __dict__, outside the parameter tree

    @functools.cached_property
    def _device_condition(self) -> Callable[[mx.array, mx.array, mx.array], mx.array]:
        # The character encoder's weights are bf16 in either numerics mode (engine.loading.precast), so one trace
        # serves.
        def condition(text_token: mx.array, char_ids: mx.array, lengths: mx.array) -> mx.array:
            spelling = DeviceSpelling(char_ids=char_ids, lengths=lengths)
            return self._guided(self.embed_subword.encode_on_device(text_token, spelling))

        return jit(condition)

    # ----------------------------------------------------------------- warm-up and step

    def warmup(self, prompt: SpeakerPrompt, cache: TTSCache, chars: CharacterTable) -> mx.array:
        """Run the speaker prompt through the backbone to fill ``cache``; returns the first previous code (1, 1, Q).

        The prompt's codes enter shifted right by one frame (code 0 first). Positions
        before the BOS frame (the first audio-mask position) take the speaker latent
        instead of their code embedding; the BOS frame adds ``bos_emb``.
        """
        codes = prompt.codes
        shifted = mx.concatenate([mx.zeros_like(codes[:, :1]), codes[:, :-1]], axis=1)
        audio = self.embed_codes(shifted)
        audio_before = mx.concatenate([mx.zeros_like(prompt.audio_mask[:, :1]), prompt.audio_mask[:, :-1]], axis=1)
        bos = prompt.audio_mask & ~audio_before
        before_bos = mx.cumsum(bos.astype(mx.int32), axis=1) == 0
        audio = mx.where(before_bos[..., None], prompt.latent.astype(audio.dtype), audio)
        audio = audio + bos[..., None] * self.bos_emb
        guided_audio = mx.concatenate([audio, audio], axis=0)
        inputs = self.gated_fusion_audio_text(
            guided_audio, self._guided_condition(prompt.subword_ids, prompt.subword_mask, chars)
        )
        self.backbone(inputs, cache.layers)  # the hidden states of the prompt are not needed
        return codes[:, -1:]

    def step(self, state: TTSCache, x: TTSInput, hooks: FrameHooks = NO_HOOKS) -> TTSStepResult:
        """Generate one frame of codes from the previous frame's codes (1, 1, Q) and the text token (1, 1)
        (:class:`TTSInput`), advancing ``state``.

        Where ``hooks`` times sub-stages, each part is closed at its boundary and the rounds run op by op (a
        compiled call cannot be split); the backbone's output is launched (``hooks.launch_part``) before the
        MaskGIT rounds are built. With neither ``text_id`` nor ``condition``, reads the token id on the host (see
        :func:`engine.networks.tts.subword.spell_tokens`). Draws one uniform and one normal tensor per refinement
        round from the global RNG — or, with :attr:`step_draws`, the same draws at once from ``state.draw_key``,
        which then moves on.
        """
        previous_code, text_token, chars = x.previous_code, x.text_token, x.characters
        previous_code_sum, text_id, condition = x.previous_code_sum, x.text_id, x.condition
        probe = hooks.sub_stage if hooks.sub_stages else None
        cache = state
        economy = state.economy
        if economy not in ECONOMY_LEVELS:
            raise ValueError(f"TTS economy level must be one of {ECONOMY_LEVELS}; got {economy!r}")
        if economy and self.fast is None:
            raise ValueError("exact numerics never spends less per frame: its TTS economy level must be 0")
        if previous_code_sum is None:
            previous_code_sum = self.code_sum(previous_code)
        audio = self.embed_code(previous_code_sum)
        guided_audio = mx.concatenate([audio, audio], axis=0)
        if probe is not None:
            probe("tts.embed", guided_audio)
        if condition is None and text_id is not None:
            condition = self._token_condition(text_id, chars)
        elif condition is None:
            condition = self._guided_condition(text_token, mx.ones(text_token.shape, dtype=mx.bool_), chars)
        if probe is not None:
            probe("tts.condition", condition)
        fused = self.gated_fusion_audio_text(guided_audio, condition)
        if probe is not None:
            probe("tts.fusion", fused)
        hidden = self.backbone(fused, cache.layers)
        if probe is not None:
            probe("tts.backbone", hidden)
        hooks.launch_part(hidden)
        draw_key = None
        if self.step_draws is not None and hidden.shape[1] == 1:
            # MLX's stub types the generator state as object; it is the list holding the key array.
            draw_key = cache.draw_key if cache.draw_key is not None else cast(list[mx.array], mx.random.state)[0]
        # Probing times every round, which needs the op-by-op form (a compiled call cannot be split).
        if probe is None:
            codes, code_sum, next_key = self._refine(hidden, draw_key, economy)
        elif draw_key is None:
            (codes, code_sum), next_key = self._refine_ops(hidden, probe, economy=economy), None
        else:
            codes, code_sum, next_key = self._refine_drawn(hidden, draw_key, probe, economy)
        if next_key is not None:
            cache.draw_key = next_key
        return TTSStepResult(codes=codes, hidden=hidden, code_sum=code_sum)

    def prefill(
        self, state: TTSCache, x: TTSInput, steps: int, fill_code: mx.array, *, chunk: int
    ) -> tuple[TTSStepResult, int]:
        """``steps`` steps on one text token (``x.text_id``: a prompt's PAD) as backbone passes of up to ``chunk``
        positions, advancing ``state`` as many positions; returns the last step's result and the passes run.

        Not the reference's arithmetic (fast numerics' prefill, docs/numerics.md "Prefill in chunks"): the steps are
        teacher-forced — the first takes ``x.previous_code`` (or its sum), every later one ``fill_code`` (1, 1, Q),
        the codec's silence, where a step-by-step run takes the codes the step before sampled — so only the last
        step samples codes. The draws of the steps before it are skipped over (:meth:`skip_draws`): the generator
        is where ``steps`` steps leave it, and the last step draws what a step-by-step run's last step draws.
        """
        if steps < 1 or chunk < 1:
            raise ValueError(f"a prefill takes at least one step in chunks of at least one, got {steps}, {chunk}")
        if x.text_id is None:
            raise ValueError("a prefill's text token must be known on the host (TTSInput.text_id)")
        condition = self._token_condition(x.text_id, x.characters)  # (2, 1, H)
        first_sum = self.code_sum(x.previous_code) if x.previous_code_sum is None else x.previous_code_sum
        fill_sum = self.code_sum(fill_code)
        hidden: mx.array | None = None
        passes = 0
        for start in range(0, steps, chunk):
            length = min(chunk, steps - start)
            sums = mx.broadcast_to(fill_sum, (1, length, fill_sum.shape[-1]))
            if start == 0:
                sums = mx.concatenate([first_sum, sums[:, 1:]], axis=1)
            audio = self.embed_code(sums)
            guided_condition = mx.broadcast_to(condition, (condition.shape[0], length, condition.shape[-1]))
            fused = self.gated_fusion_audio_text(mx.concatenate([audio, audio], axis=0), guided_condition)
            hidden = self.backbone(fused, state.layers)
            passes += 1
            mx.eval(hidden[:, -1:], state.arrays())  # a chunk's graph at a time
        assert hidden is not None
        self.skip_draws(state, steps - 1)
        last = hidden[:, -1:]
        draw_key = None
        if self.step_draws is not None:
            draw_key = state.draw_key if state.draw_key is not None else cast(list[mx.array], mx.random.state)[0]
        codes, code_sum, next_key = self._refine(last, draw_key)
        if next_key is not None:
            state.draw_key = next_key
        return TTSStepResult(codes=codes, hidden=last, code_sum=code_sum), passes

    def skip_draws(self, state: TTSCache, steps: int) -> None:
        """Move the random generator on past ``steps`` steps' draws without drawing them: the key splits only
        (:meth:`draw_plan`'s draws each split it once), on ``state.draw_key`` where a step's draws are made at once
        (:attr:`step_draws`; on CUDA all the splits in one launch, ``engine.kernels.step_draws.KeySkip``), else on
        MLX's global generator."""
        splits = steps * len(self.draw_plan())
        if self.step_draws is not None and self.fast is not None:
            key = state.draw_key if state.draw_key is not None else cast(list[mx.array], mx.random.state)[0]
            state.draw_key = self.fast.skip_key(key, mx.array([splits], dtype=mx.uint32))
            return
        for _ in range(splits):
            mx.random.uniform(shape=(1,))  # each keyless draw splits the global key once; never read

    # ----------------------------------------------------------------- code generation

    def generate_codes(self, hidden: mx.array) -> mx.array:
        """Guided hidden states (2, T, H) → codes (1, T, Q) int32, refined round by round."""
        return self._refine(hidden)[0]

    @property
    def codebooks(self) -> list[mx.array]:
        """``rvq_embs[q]`` for each quantizer, as views of the stored tensor (no copy).

        Indexing the stack with ``q`` inside a frame would gather (copy) a whole codebook each
        time, 31 times a frame; these are the same values, sliced once per stored tensor (so
        again after a precast replaces it).
        """
        return self._codebook_views()[0]

    @property
    def codebooks_transposed(self) -> list[mx.array]:
        """``rvq_embs[q].T`` for each quantizer: views too, made once (see :mod:`engine.networks.linear`)."""
        return self._codebook_views()[1]

    def _codebook_views(self) -> tuple[list[mx.array], list[mx.array]]:
        source, books, transposed = self._codebook_store.get("views", (None, [], []))
        if source is not self.rvq_embs:
            books = [self.rvq_embs[q : q + 1].squeeze(0) for q in range(self.rvq_embs.shape[0])]
            transposed = [book.T for book in books]
            mx.eval(books, transposed)
            self._codebook_store["views"] = (self.rvq_embs, books, transposed)
        return books, transposed

    def weight_views(self) -> dict[str, mx.array]:
        """The codebook views, named for :func:`engine.counters.named_weights`."""
        books, transposed = self._codebook_views()
        named = {f"rvq_embs{VIEW_MARK}{quantizer}": book for quantizer, book in enumerate(books)}
        named.update({f"rvq_embs{VIEW_MARK}{q}{TRANSPOSE_MARK}": book for q, book in enumerate(transposed)})
        return named

    @functools.cached_property
    def _codebook_store(self) -> dict[str, tuple[mx.array | None, list[mx.array], list[mx.array]]]:
        return {}  # in the instance __dict__, outside the parameter tree

    @functools.cached_property
    def codebook_norms(self) -> list[mx.array]:
        """‖e‖² of every codebook entry, summed in the codebook dtype exactly as the per-call form does."""
        norms = [mx.sum(book * book, axis=-1) for book in self.rvq_embs]
        mx.eval(norms)
        return norms

    @functools.cached_property
    def _compiled_refines(self) -> dict[Any, Callable[..., Any]]:
        return {}  # one program per residual-VQ step and MoG row parts in use (a trace holds those it was traced with)

    def forget_row_programs(self) -> None:
        """Drop the programs traced with row products (the MaskGIT rounds', the backbone's steps): they hold
        the weights' bf16 copies."""
        programs = self._compiled_refines
        for key in [key for key in programs if key[1] is not None]:
            del programs[key]
        self.backbone._traced_steps.clear()

    def _refine(
        self, hidden: mx.array, draw_key: mx.array | None = None, economy: int = 0
    ) -> tuple[mx.array, mx.array, mx.array | None]:
        """:meth:`_refine_ops` compiled for one position (drawing from the global generator, or with ``draw_key``
        through :meth:`_refine_drawn`), one program per economy level; also returns the key after the draws (None
        without ``draw_key``)."""
        if hidden.shape[1] != 1:
            return (*self._refine_ops(hidden, economy=economy), None)
        programs = self._compiled_refines
        rounds = tuple(sorted(self.nearest_rounds.items(), key=lambda item: item[0]))
        key = (self.nearest_code, rounds, self.mog_head.rows, None if draw_key is None else self.step_draws, economy)
        if key not in programs:
            # The full step's program is the method itself, as before economy levels existed.
            ops = self._refine_ops if economy == 0 else functools.partial(self._refine_ops, economy=economy)
            drawn = self._refine_drawn if economy == 0 else functools.partial(self._refine_drawn, economy=economy)
            programs[key] = jit(ops, draws_random=True) if draw_key is None else jit(drawn)
        if draw_key is None:
            drawn_globally: tuple[mx.array, mx.array] = programs[key](hidden)
            return (*drawn_globally, None)
        drawn_with_key: tuple[mx.array, mx.array, mx.array] = programs[key](hidden, draw_key)
        return drawn_with_key

    def _refine_drawn(
        self, hidden: mx.array, draw_key: mx.array, probe: Callable[..., None] | None = None, economy: int = 0
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:meth:`_refine_ops` on the draws :attr:`step_draws` makes at once from ``draw_key``; also returns the
        key after them."""
        assert self.step_draws is not None
        next_key, *draws = self.step_draws(draw_key)
        codes, code_sum = self._refine_ops(hidden, probe, tuple(draws), economy)
        return codes, code_sum, next_key

    def _refine_ops(
        self,
        hidden: mx.array,
        probe: Callable[..., None] | None = None,
        draws: tuple[mx.array, ...] | None = None,
        economy: int = 0,
    ) -> tuple[mx.array, mx.array]:
        """The MaskGIT rounds: codes (1, T, Q) and the float32 sum of their codebook vectors. ``draws``, when
        given, are the rounds' draws made already (:meth:`draw_plan`), else each round draws its own. ``economy``
        (:data:`ECONOMY_LEVELS`) skips the MoG head's samples after the first rounds, and at 2 its guidance.

        Quantizers are filled in order, so the code embedding of a round — the sum over
        every quantizer with unfilled ones adding zero — is the running sum of the rows
        chosen so far; it is carried instead of recomputed. Adding the zeros would not
        change a single bit, so this is the reference's arithmetic.
        """
        config = self.config
        # The rounds run on rows (T, ·) rather than (1, T, ·): a matrix product of a 3-D input is
        # flattened to rows and unflattened again around the same kernel, two views per product.
        _, length, width = hidden.shape
        rows = hidden.reshape(-1, width)
        columns: list[mx.array | None] = [
            mx.full((length, 1), config.mask_code, dtype=mx.int32)
        ] * config.num_quantizers
        chosen_sum = mx.zeros((length, config.latent_size))
        norms = self.codebook_norms
        nearest, nearest_rounds = self.nearest_code, self.nearest_rounds
        if rows.dtype != mx.float32:
            nearest, nearest_rounds = nearest_code_ops, {}  # the kernels take float32 residuals
        sampled = len(self.plan) if economy == 0 else ECONOMY_SAMPLED_ROUNDS
        guidance_scale = config.guidance_scale
        unguided = economy >= 2 and guidance_scale > 0.0
        if unguided:
            rows, guidance_scale = rows[:length], 0.0  # the text-conditioned row(s) alone
        for number, round_ in enumerate(self.plan, start=1):
            if number <= sampled:
                embedded = self.embed_code(chosen_sum)
                if length == 1 or unguided:  # the same adds, broadcast over both rows (or the one): no join
                    features = embedded + rows
                else:
                    features = mx.concatenate([embedded + rows[:length], embedded + rows[length:]], axis=0)
                round_draws = None if draws is None else (draws[2 * number - 2], draws[2 * number - 1])
                latent = self.mog_head.sample_latent(
                    features, guidance_scale, config.top_p, config.noise_scale, round_draws
                )
                if probe is not None:
                    probe(f"tts.mog.{number}", latent)
            # ‖e‖² − 2 z·e ranks entries like ‖z − e‖² (engine.kernels.residual_vq).
            quantizers = slice(round_.start, round_.start + round_.count)
            round_kernel = nearest_rounds.get(round_.count)
            if round_kernel is not None:  # the round's codes as one block of columns, in its first column's place
                columns[quantizers] = [None] * round_.count
                columns[round_.start], latent, chosen_sum = round_kernel(
                    latent,
                    self.codebooks[quantizers],
                    self.codebooks_transposed[quantizers],
                    norms[quantizers],
                    chosen_sum,
                )
            else:
                for quantizer in range(quantizers.start, quantizers.stop):
                    book, transposed = self.codebooks[quantizer], self.codebooks_transposed[quantizer]
                    columns[quantizer], latent, chosen_sum = nearest(
                        latent, book, transposed, norms[quantizer], chosen_sum
                    )
            if probe is not None:
                probe(f"tts.rvq.{number}", chosen_sum, *[column for column in columns if column is not None])
        filled = [column for column in columns if column is not None]
        return mx.expand_dims(mx.concatenate(filled, axis=-1), 0), mx.expand_dims(chosen_sum, 0)
