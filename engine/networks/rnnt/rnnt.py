"""RNN-T head: the user transcript decoded from the (pre-projection) encoder frames.

Auxiliary only — nothing here feeds the LLM. The prediction network embeds the last
emitted token (a zero vector at the start, when the last token is blank) and runs a
stacked LSTM; the joint adds Linear(encoder frame) and Linear(prediction), applies
the activation and scores ``vocab + 1`` classes (the last is blank).

Decoding is greedy: per encoder frame, keep emitting argmax tokens until blank or
``max_symbols`` emissions. Two equivalent implementations:

- :func:`rnnt_step` (and the offline :func:`rnnt_decode`) branch on the host, as the
  reference does: one host readback per symbol attempt.
- :func:`rnnt_propose` / :func:`rnnt_commit`, which the streaming session uses, unroll
  the first :data:`UNROLLED_ATTEMPTS` attempts on the device and mask every attempt after
  the first blank, so a frame needs no readback of its own: the session reads the
  proposed symbols together with the LLM's ids. Only when every unrolled attempt emitted
  a symbol does :func:`rnnt_commit` unroll the remaining attempts (up to ``max_symbols``)
  and read them back: one more readback, on the rare frame that emits two symbols or more.
  While frames keep emitting that much, :func:`next_first_pass` unrolls every attempt in
  the first pass instead, so such a run of frames needs no extra readback either.
  The attempts actually taken run exactly the operations the host loop runs, on the same
  values, so the tokens are the same: on rows (:func:`_greedy_rows`: the frame's encoder
  projection once, the LSTM state per layer, no per-attempt views), which a matrix product
  computes with the same kernel as the host loop's one-row 3-D inputs. Exact mode stores the
  cell update's products before they are added, as the host loop does; fast numerics leaves
  them to fuse on a GPU.

:class:`Transducer` is the RN-T as one streaming network (``make_state``, ``step(state, encoded, hooks)``) over the
predictor and joint the checkpoint keeps apart; its fast form is the predictor's (:mod:`.fast`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import mlx.core as mx
import mlx.nn as nn

from ...hooks import NO_HOOKS, FrameHooks
from ...jit import jit, materialize
from ...kernels.greedy_attempt import AttemptParts, lstm_cell
from ...loading.config import JointConfig, PredictorConfig
from ...loading.tokenizer import RNNTVocabulary
from ...streaming import arrays_nbytes
from ...weight_names import GATHER_MARK
from ..linear import Linear
from .fast import RNNTFast, greedy_rows_by_attempt, rnnt_fast

if TYPE_CHECKING:
    from ...kernels.plan import FastPlan

LSTMState = tuple[mx.array, mx.array]

# Attempts unrolled on the device in a frame's first pass. A frame that emits nothing needs one attempt
# and one that emits a symbol needs two (the second sees blank); unrolling all ``max_symbols`` (10)
# would run ten predictor and joint passes every frame for the rare frame that emits more.
UNROLLED_ATTEMPTS = 2


def _lstm(layer: nn.LSTM, x: mx.array, hidden: mx.array | None, cell: mx.array | None) -> tuple[mx.array, mx.array]:
    """``nn.LSTM.__call__``, operation for operation, with the cell update's two products stored before they are
    added (compiled on a GPU, ``f * c + i * g`` would otherwise become a fused multiply-add)."""
    bias = getattr(layer, "bias", None)
    x = x @ layer.Wx.T if bias is None else mx.addmm(bias, x, layer.Wx.T)
    all_hidden, all_cell = [], []
    for index in range(x.shape[-2]):
        hidden, cell = lstm_cell(x[..., index, :], hidden, cell, layer.Wh, materialize)
        all_cell.append(cell)
        all_hidden.append(hidden)
    return mx.stack(all_hidden, axis=-2), mx.stack(all_cell, axis=-2)


def _as_is(x: mx.array) -> mx.array:
    return x


class _StackedLSTM(nn.Module):
    """``lstm``: one ``nn.LSTM`` per layer; the state is ``(h, c)``, each ``(layers, batch, hidden)``."""

    def __init__(self, size: int, layers: int) -> None:
        super().__init__()
        self.lstm = [nn.LSTM(size, size) for _ in range(layers)]

    def step_rows(
        self,
        x: mx.array,
        hidden: list[mx.array] | None,
        cell: list[mx.array] | None,
        keep: Callable[[mx.array], mx.array] = materialize,
    ) -> tuple[list[mx.array], list[mx.array]]:
        """One token's row ``x`` (1, D) through the layers, the state a row per layer (None at the start):
        the same operations as :meth:`__call__` without its transposes, slices and stacks; ``keep`` holds
        the cell update's products apart (:func:`engine.jit.materialize`, as :meth:`__call__` does) or
        lets them fuse (fast numerics)."""
        new_hidden, new_cell = [], []
        for index, layer in enumerate(self.lstm):
            bias = getattr(layer, "bias", None)
            gates = x @ layer.Wx.T if bias is None else mx.addmm(bias, x, layer.Wx.T)
            layer_hidden, layer_cell = (None, None) if hidden is None or cell is None else (hidden[index], cell[index])
            x, c = lstm_cell(gates, layer_hidden, layer_cell, layer.Wh, keep)
            new_hidden.append(x)
            new_cell.append(c)
        return new_hidden, new_cell

    def __call__(self, x: mx.array, state: LSTMState | None) -> tuple[mx.array, LSTMState]:
        # Same layout as the reference: (B, L, D) is swapped to (L, B, D) before the
        # layers (for the one-token, batch-one steps used here this is a no-op reshape).
        x = mx.transpose(x, (1, 0, 2))
        hidden: list[mx.array | None] = [None] * len(self.lstm) if state is None else list(state[0])
        cell: list[mx.array | None] = [None] * len(self.lstm) if state is None else list(state[1])
        last_hidden, last_cell = [], []
        for index, layer in enumerate(self.lstm):
            x, cells = _lstm(layer, x, hidden[index], cell[index])
            last_hidden.append(x[-1])
            last_cell.append(cells[-1])
        return mx.transpose(x, (1, 0, 2)), (mx.stack(last_hidden, axis=0), mx.stack(last_cell, axis=0))


class RNNTPredictor(nn.Module):
    """Prediction network (``stt_model.rnnt_decoder``): ``prediction.embed`` and ``prediction.dec_rnn.lstm.{k}``."""

    # The embedding as the attempts' first-layer kernel reads it: a table of rows it picks itself (named for the
    # census, which prices each read as one row); set with the attempt parts, an instance attribute outside the
    # parameters (a module takes the arrays it holds for those).
    _embedding_table: tuple[mx.array, ...] = ()
    # Fast numerics' form (engine.networks.rnnt.fast): the streaming greedy loop lets the cell update fuse
    # (_greedy_rows), and runs an attempt as a few kernels where they were admitted (greedy_rows_by_attempt).
    fast: RNNTFast | None

    def use_numerics(self, plan: FastPlan | None, joint: RNNTJoint | None) -> dict[str, bool]:
        """Take fast numerics' form for ``plan`` with ``joint`` (None: exact mode, the reference's operations; no
        joint: the cell update left to fuse, no attempt parts); returns which of its parts run as kernels
        (:func:`engine.networks.rnnt.fast.rnnt_fast`)."""
        fast, changes = rnnt_fast(self, joint, plan)
        self.use_fast(fast)
        return changes

    def use_fast(self, fast: RNNTFast | None) -> None:
        """Run the streaming loop in ``fast`` (None: exact mode's operations), the one slot the loop reads."""
        self.fast = fast
        table: tuple[mx.array, ...] = ()
        if fast is not None and fast.parts is not None:
            weight = self.prediction["embed"].weight
            table = (weight.reshape(weight.shape[0], 1, -1),)  # a view: no copy
            mx.eval(table)
        object.__setattr__(self, "_embedding_table", table)  # not a parameter (a module takes arrays as those)

    @property
    def fused_cell(self) -> bool:
        """Whether the streaming loop lets the LSTM cell update's products fuse (fast numerics)."""
        return self.fast is not None

    @property
    def attempt_parts(self) -> AttemptParts | None:
        """The parts the streaming loop runs each attempt as (:func:`engine.networks.rnnt.fast.greedy_rows_by_attempt`),
        or None for its operations."""
        return None if self.fast is None else self.fast.parts

    @property
    def embedding_table(self) -> mx.array | None:
        """The table the attempts' first layer reads one token's row of, while attempt parts are in use."""
        return self._embedding_table[0] if self._embedding_table else None

    def weight_views(self) -> dict[str, mx.array]:
        """The embedding table the attempts' kernel gathers rows of, named for :func:`engine.counters.named_weights`."""
        table = self.embedding_table
        return {} if table is None else {f"prediction.embed.weight{GATHER_MARK}": table}

    def table_rows(self) -> dict[str, int]:
        """Rows of the table :meth:`weight_views` names (one per token), for pricing it at full size."""
        return {f"prediction.embed.weight{GATHER_MARK}": self.prediction["embed"].weight.shape[0]}

    @functools.cached_property
    def programs(self) -> GreedyPrograms:
        """The compiled unrolled greedy loops over this predictor."""
        return GreedyPrograms(self)

    def __init__(self, config: PredictorConfig) -> None:
        super().__init__()
        self.fast = None
        self.hidden_size = config.pred_hidden
        rows = config.vocab_size + 1 if config.blank_as_pad else config.vocab_size
        self.prediction = {
            "embed": nn.Embedding(rows, config.pred_hidden),
            "dec_rnn": _StackedLSTM(config.pred_hidden, config.pred_rnn_layers),
        }

    def __call__(self, token: mx.array | None, state: LSTMState | None) -> tuple[mx.array, LSTMState]:
        """``token`` (B, 1) int32, or None for the start symbol → ``(output (B, 1, hidden), (h, c))``."""
        if token is not None:
            embedded = self.prediction["embed"](token)
        else:
            batch = 1 if state is None else state[0].shape[1]
            embedded = mx.zeros((batch, 1, self.hidden_size))
        stepped: tuple[mx.array, LSTMState] = self.prediction["dec_rnn"](embedded, state)
        return stepped


class RNNTJoint(nn.Module):
    """Joint network (``stt_model.rnnt_joint``): ``enc``, ``pred``, ``joint_net = [activation, identity, Linear]``."""

    def __init__(self, config: JointConfig) -> None:
        super().__init__()
        activations = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}
        name = config.activation.lower()
        if name not in activations:
            raise ValueError(f"unsupported RNN-T joint activation {config.activation!r}")
        self.activation_name = name
        self.enc = Linear(config.encoder_hidden, config.joint_hidden)
        self.pred = Linear(config.pred_hidden, config.joint_hidden)
        self.joint_net = [activations[name](), nn.Identity(), Linear(config.joint_hidden, config.num_classes + 1)]

    def rows(self, projected: mx.array, prediction: mx.array) -> mx.array:
        """Logits ``(1, classes + 1)`` for one frame's ``enc`` projection ``projected`` (1, joint) and one
        prediction row (1, pred): :meth:`__call__`'s operations without its broadcast axes."""
        x = projected + self.pred(prediction)
        for layer in self.joint_net:
            x = layer(x)
        return x

    def __call__(self, encoded: mx.array, prediction: mx.array) -> mx.array:
        """``(B, T, enc)`` × ``(B, U, pred)`` → logits ``(B, T, U, classes + 1)``."""
        x = mx.expand_dims(self.enc(encoded), 2) + mx.expand_dims(self.pred(prediction), 1)
        for layer in self.joint_net:
            x = layer(x)
        return x


@dataclass
class RNNTState:
    """Greedy decoding state: last emitted token (blank at the start), LSTM state, kept tokens, transcript.

    ``decoded`` is the decode of every kept token before stripping: the vocabulary decodes
    token by token, so it grows by the new tokens' decode and the per-frame cost stays
    constant (re-decoding the whole history, as the reference does, grows with the
    conversation: ~10 ms per frame after 3 minutes at full size).
    """

    last_token: int
    hidden: LSTMState | None = None
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    decoded: str = ""

    def arrays(self) -> list[mx.array]:
        """The LSTM state, for the session's per-frame evaluation."""
        return [] if self.hidden is None else list(self.hidden)

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())


def _best_symbol(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    frame: mx.array,
    last_token: int,
    hidden: LSTMState | None,
    blank_id: int,
    hooks: FrameHooks,
) -> tuple[int, LSTMState]:
    """Argmax class for one encoder frame after ``last_token``, and the LSTM state that token would give."""
    token = None if last_token == blank_id else mx.array([[last_token]], dtype=mx.int32)
    prediction, proposed = predictor(token, hidden)
    logits = joint(frame, prediction.astype(frame.dtype))
    return int(hooks.read_back(mx.argmax(logits))), proposed  # host readback: the loop branches on it


def rnnt_step(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    state: RNNTState,
    encoded: mx.array,
    *,
    blank_id: int,
    max_symbols: int,
    vocabulary: RNNTVocabulary,
    hooks: FrameHooks = NO_HOOKS,
) -> tuple[str, str] | None:
    """Greedy-decode one encoder frame ``(1, 1, d_model)``; return ``(delta, transcript)`` if the transcript changed.

    ``delta`` is the text added since the last change, or the whole transcript when
    the old text is not a prefix of the new one. Returns None (and does nothing) for
    an empty vocabulary, as the reference session does. Every host readback goes through
    ``hooks.read_back`` (e.g. to count synchronisations).
    """
    if len(vocabulary) == 0:
        return None
    kept_before = len(state.tokens)
    _emit_on_host(predictor, joint, state, encoded, blank_id, max_symbols, vocabulary, hooks)
    return _update_transcript(state, kept_before, vocabulary)


def _emit_on_host(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    state: RNNTState,
    encoded: mx.array,
    blank_id: int,
    attempts: int,
    vocabulary: RNNTVocabulary,
    hooks: FrameHooks,
) -> None:
    """The greedy loop for one frame: emit argmax symbols until blank or ``attempts`` emissions."""
    emitted = 0
    while emitted < attempts:
        symbol, proposed = _best_symbol(predictor, joint, encoded, state.last_token, state.hidden, blank_id, hooks)
        if symbol == blank_id:
            break
        state.last_token = symbol
        state.hidden = (proposed[0].astype(encoded.dtype), proposed[1].astype(encoded.dtype))
        if not vocabulary.is_special(symbol):
            state.tokens.append(symbol)
        emitted += 1


def _update_transcript(state: RNNTState, kept_before: int, vocabulary: RNNTVocabulary) -> tuple[str, str] | None:
    """Extend the transcript if this frame kept tokens; returns ``(delta, transcript)`` then."""
    if len(state.tokens) == kept_before:
        return None
    state.decoded += vocabulary.decode(state.tokens[kept_before:])
    updated = state.decoded.strip()
    delta = updated[len(state.text) :] if updated.startswith(state.text) else updated
    state.text = updated
    return delta, updated


@dataclass
class RNNTProposal:
    """One frame's greedy decoding, built on the device and not yet adopted."""

    symbols: mx.array  # (attempts,) int32: emitted ids in order, then -1
    last_token: mx.array  # (1, 1) int32, the last emitted id (unchanged if none)
    hidden: LSTMState  # the LSTM state after the last emission


def rnnt_propose(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    state: RNNTState,
    encoded: mx.array,
    *,
    blank_id: int,
    attempts: int,
) -> RNNTProposal:
    """The first ``attempts`` attempts of :func:`rnnt_step`'s loop from ``state``, unrolled on the device
    (no host readback); :func:`rnnt_commit` adopts them and finishes the frame."""
    started = state.last_token != blank_id  # host-known: has any symbol been emitted yet?
    program = predictor.programs.get(joint, started, blank_id, attempts)
    last = mx.array([[state.last_token]], dtype=mx.int32)
    if started:
        assert state.hidden is not None
        symbols, last, hidden_h, hidden_c = program(encoded, last, *state.hidden)
    else:
        symbols, last, hidden_h, hidden_c = program(encoded, last)
    return RNNTProposal(symbols, last, (hidden_h, hidden_c))


def first_pass_attempts(max_symbols: int) -> int:
    """Attempts the session unrolls in a frame's first pass, usually."""
    return min(max_symbols, UNROLLED_ATTEMPTS)


def next_first_pass(symbols: list[int], max_symbols: int) -> int:
    """Attempts to unroll in the next frame's first pass, given this frame's first-pass ``symbols``.

    A frame that emitted at least the usual first pass's worth is likely followed by another
    (speech comes in bursts; a model can emit its cap every frame): then all ``max_symbols``
    attempts are unrolled, which is the same work as the usual pass plus the rest, without
    the second readback. The usual pass returns once a frame emits less. The tokens are the
    same either way.
    """
    usual = first_pass_attempts(max_symbols)
    emitted = sum(1 for symbol in symbols if symbol >= 0)
    return max_symbols if emitted >= usual else usual


def _greedy_rows(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    encoded: mx.array,
    last: mx.array,
    hidden: LSTMState | None,
    *,
    started: bool,
    blank_id: int,
    max_symbols: int,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """``max_symbols`` attempts of the host loop unrolled, each masked out after the first blank: the emitted
    ids (-1 after the blank), the last emitted id (1, 1) and the LSTM state after the last emission.

    The attempts run on rows: the frame's ``enc`` projection is made once instead of at every attempt, the
    LSTM state is kept per layer (joined once, at the end), and tokens stay (1,), so that no attempt
    reshapes, squeezes or stacks. The products are the host loop's (a one-row 3-D input is multiplied as
    its row); on the CPU the tokens and states are the host loop's bit for bit, and with the cell update's
    products stored apart (exact mode) on a GPU too."""
    embed, rnn = predictor.prediction["embed"], predictor.prediction["dec_rnn"]
    keep = _as_is if predictor.fused_cell else materialize
    projected = joint.enc(encoded.reshape(1, -1))
    layers, width = len(rnn.lstm), predictor.hidden_size
    # Tokens as (1,) and states as one (1, width) row per layer throughout, so that no attempt reshapes them.
    # MLX's stub types ``mx.split`` as returning one array; it returns the list of parts.
    state_h = None if hidden is None else cast(list[mx.array], mx.split(hidden[0].reshape(layers, width), layers))
    state_c = None if hidden is None else cast(list[mx.array], mx.split(hidden[1].reshape(layers, width), layers))
    last = last.reshape(1)
    active: mx.array | None = None
    symbols = []
    for attempt in range(max_symbols):
        # Until the first emission the predictor sees the start symbol and no state, as in the host loop.
        fresh = attempt == 0 and not started
        if fresh:
            proposed_h, proposed_c = rnn.step_rows(mx.zeros((1, width)), None, None, keep)
        else:
            proposed_h, proposed_c = rnn.step_rows(embed(last), state_h, state_c, keep)
        logits = joint.rows(projected, proposed_h[-1].astype(encoded.dtype))
        best = mx.argmax(logits, axis=-1).astype(mx.int32)
        emitted = best != blank_id if active is None else active & (best != blank_id)
        symbols.append(mx.where(emitted, best, -1))
        proposed_h = [row.astype(encoded.dtype) for row in proposed_h]
        proposed_c = [row.astype(encoded.dtype) for row in proposed_c]
        if state_h is None or state_c is None:
            state_h, state_c = proposed_h, proposed_c  # masked out by the caller when nothing was emitted
        else:
            state_h = [mx.where(emitted, new, old) for new, old in zip(proposed_h, state_h, strict=True)]
            state_c = [mx.where(emitted, new, old) for new, old in zip(proposed_c, state_c, strict=True)]
        last = mx.where(emitted, best, last)
        active = emitted
    assert state_h is not None and state_c is not None
    states = (mx.concatenate(state_h).reshape(layers, 1, width), mx.concatenate(state_c).reshape(layers, 1, width))
    return mx.concatenate(symbols), last.reshape(1, 1), *states


class GreedyPrograms:
    """Compiled unrolled greedy loops, one per (joint, started, blank, cap, fused cell, attempt parts); built on
    first use."""

    def __init__(self, predictor: RNNTPredictor) -> None:
        self._predictor = predictor
        self._programs: dict[tuple[int, bool, int, int, bool, int], Callable[..., tuple[mx.array, ...]]] = {}

    def get(
        self, joint: RNNTJoint, started: bool, blank_id: int, max_symbols: int
    ) -> Callable[..., tuple[mx.array, ...]]:
        parts = self._predictor.attempt_parts
        key = (id(joint), started, blank_id, max_symbols, self._predictor.fused_cell, id(parts))
        if key not in self._programs:
            predictor = self._predictor

            def program(encoded: mx.array, last: mx.array, *hidden: mx.array) -> tuple[mx.array, ...]:
                state = (hidden[0], hidden[1]) if hidden else None
                # The attempts' kernels take float32 rows (the encoder's output in every published checkpoint).
                loop = (
                    _greedy_rows
                    if parts is None or encoded.dtype != mx.float32
                    else functools.partial(greedy_rows_by_attempt, parts)
                )
                return loop(
                    predictor,
                    joint,
                    encoded,
                    last,
                    state,
                    started=started,
                    blank_id=blank_id,
                    max_symbols=max_symbols,
                )

            self._programs[key] = jit(program)
        return self._programs[key]


def rnnt_commit(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    state: RNNTState,
    encoded: mx.array,
    proposal: RNNTProposal,
    symbols: list[int],
    *,
    blank_id: int,
    max_symbols: int,
    vocabulary: RNNTVocabulary,
    hooks: FrameHooks = NO_HOOKS,
) -> tuple[str, str] | None:
    """Adopt a proposal whose ``symbols`` were read back, and finish the frame's greedy loop.

    If every proposed attempt emitted, the frame is not done: the remaining attempts (up to
    ``max_symbols`` emissions in all) are unrolled from the new state and read back, which is
    one more readback (through ``hooks.read_back``, e.g. a profiler that counts it). Returns
    ``(delta, transcript)`` if the transcript changed, exactly as :func:`rnnt_step` does.
    """
    kept_before = len(state.tokens)
    _adopt(state, symbols, proposal.hidden, vocabulary)
    if all(symbol >= 0 for symbol in symbols) and len(symbols) < max_symbols:
        rest = rnnt_propose(predictor, joint, state, encoded, blank_id=blank_id, attempts=max_symbols - len(symbols))
        more = hooks.read_back(rest.symbols)
        _adopt(state, more, rest.hidden, vocabulary)
    return _update_transcript(state, kept_before, vocabulary)


def _adopt(state: RNNTState, symbols: list[int], hidden: LSTMState, vocabulary: RNNTVocabulary) -> None:
    """Take the emitted symbols of a read-back proposal (``-1`` marks attempts after the blank)."""
    emitted = [symbol for symbol in symbols if symbol >= 0]
    if not emitted:
        return
    state.last_token = emitted[-1]
    state.hidden = hidden
    state.tokens.extend(symbol for symbol in emitted if not vocabulary.is_special(symbol))


def rnnt_decode(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    encoded: mx.array,
    length: int,
    *,
    blank_id: int,
    max_symbols: int,
    vocabulary: RNNTVocabulary,
    hooks: FrameHooks = NO_HOOKS,
) -> str:
    """Offline greedy transcript of the first ``length`` frames of ``encoded`` ``(1, T, d_model)``.

    An empty vocabulary gives an empty string (the reference returns None there).
    """
    if len(vocabulary) == 0:
        return ""
    last_token, hidden = blank_id, None
    kept: list[int] = []
    time, emitted = 0, 0
    while time < length:
        frame = encoded[:, time : time + 1]
        symbol, proposed = _best_symbol(predictor, joint, frame, last_token, hidden, blank_id, hooks)
        if symbol == blank_id:
            time, emitted = time + 1, 0
            continue
        last_token = symbol
        hidden = (proposed[0].astype(encoded.dtype), proposed[1].astype(encoded.dtype))
        if not vocabulary.is_special(symbol):
            kept.append(symbol)
        emitted += 1
        if emitted >= max_symbols:
            time, emitted = time + 1, 0
    return vocabulary.decode(kept).strip()


class Transducer:
    """The RN-T as one streaming network over the checkpoint's predictor and joint, for one vocabulary.

    A frame's greedy decoding is naturally two calls, which the session keeps apart: :meth:`propose` builds the
    first attempts on the device with the frame's other networks (no readback of its own), and :meth:`commit`
    adopts them once the session has read them back with the LLM's ids, finishing the rare frame that emits
    more. :meth:`step` is the two in one, the :class:`engine.streaming.Streamer` contract, for a caller with
    nothing to read back alongside.
    """

    def __init__(
        self,
        predictor: RNNTPredictor,
        joint: RNNTJoint,
        *,
        blank_id: int,
        max_symbols: int,
        vocabulary: RNNTVocabulary,
    ) -> None:
        self.predictor = predictor
        self.joint = joint
        self.blank_id = blank_id
        self.max_symbols = max_symbols
        self.vocabulary = vocabulary

    def make_state(self) -> RNNTState:
        """Start state: no token emitted yet."""
        return RNNTState(last_token=self.blank_id)

    def propose(self, state: RNNTState, encoded: mx.array, attempts: int) -> RNNTProposal:
        """:func:`rnnt_propose`: the frame's first ``attempts`` attempts, unrolled on the device."""
        return rnnt_propose(self.predictor, self.joint, state, encoded, blank_id=self.blank_id, attempts=attempts)

    def commit(
        self,
        state: RNNTState,
        encoded: mx.array,
        proposal: RNNTProposal,
        symbols: list[int],
        hooks: FrameHooks = NO_HOOKS,
    ) -> tuple[str, str] | None:
        """:func:`rnnt_commit`: adopt ``proposal`` (its ``symbols`` read back) and finish the frame."""
        return rnnt_commit(
            self.predictor,
            self.joint,
            state,
            encoded,
            proposal,
            symbols,
            blank_id=self.blank_id,
            max_symbols=self.max_symbols,
            vocabulary=self.vocabulary,
            hooks=hooks,
        )

    def step(self, state: RNNTState, encoded: mx.array, hooks: FrameHooks = NO_HOOKS) -> tuple[str, str] | None:
        """Decode one encoder frame ``(1, 1, d_model)``: ``(delta, transcript)`` if the transcript changed (None
        for an empty vocabulary, as the reference session does)."""
        if len(self.vocabulary) == 0:
            return None
        proposal = self.propose(state, encoded, first_pass_attempts(self.max_symbols))
        return self.commit(state, encoded, proposal, hooks.read_back(proposal.symbols), hooks)
