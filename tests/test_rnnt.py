"""RNN-T head: greedy decoding rules (blank, max_symbols cap, specials, deltas) and checkpoint names."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map

from engine.hooks import NoHooks
from engine.kernels.greedy_attempt import JointRowShape, LSTMStepShape, joint_row_ops
from engine.kernels.plan import FastPlan
from engine.loading.checkpoint import load_into, read_runtime_weights
from engine.loading.config import JointConfig, PredictorConfig
from engine.loading.tokenizer import RNNTVocabulary
from engine.networks.rnnt import (
    UNROLLED_ATTEMPTS,
    LSTMState,
    RNNTFast,
    RNNTJoint,
    RNNTPredictor,
    RNNTState,
    Transducer,
    first_pass_attempts,
    next_first_pass,
    rnnt_commit,
    rnnt_decode,
    rnnt_propose,
    rnnt_step,
)

PIECES = ["<unk>", "\u2581a", "b", "c", "\u2581d", "<en-US>"]
BLANK = len(PIECES)
ENCODER_WIDTH = 4


class CountingPredictor(RNNTPredictor):
    """Counts prediction-network runs: one per symbol attempt, i.e. one host readback each."""

    def __init__(self, config: PredictorConfig) -> None:
        super().__init__(config)
        self.calls = 0

    def __call__(self, token: mx.array | None, state: LSTMState | None) -> tuple[mx.array, LSTMState]:
        self.calls += 1
        return super().__call__(token, state)


def _modules(seed: int = 0) -> tuple[CountingPredictor, RNNTJoint]:
    mx.random.seed(seed)
    predictor = CountingPredictor(PredictorConfig(pred_hidden=8, pred_rnn_layers=2, vocab_size=len(PIECES)))
    joint = RNNTJoint(JointConfig(joint_hidden=8, encoder_hidden=ENCODER_WIDTH, pred_hidden=8, num_classes=len(PIECES)))
    return predictor, joint


def force_symbol(joint: RNNTJoint, token: int) -> None:
    """Make ``token`` the argmax whatever the inputs, by zeroing the output weights (also used by the soak test)."""
    out = joint.joint_net[2]
    out.weight = mx.zeros_like(out.weight)
    bias = np.full(out.bias.shape[0], -30.0, dtype=np.float32)
    bias[token] = 30.0
    out.bias = mx.array(bias).astype(out.bias.dtype)


def _frames(count: int, seed: int = 3) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((1, count, ENCODER_WIDTH)).astype(np.float32))


VOCABULARY = RNNTVocabulary(PIECES)


class CountingReads(NoHooks):
    """Hooks that count the host readbacks a frame makes through them."""

    def __init__(self) -> None:
        self.reads = 0

    def read_back(self, array: mx.array) -> object:
        self.reads += 1
        return array.tolist()


def _step(predictor: RNNTPredictor, joint: RNNTJoint, state, frame: mx.array, max_symbols: int = 10):
    return rnnt_step(predictor, joint, state, frame, blank_id=BLANK, max_symbols=max_symbols, vocabulary=VOCABULARY)


def test_blank_everywhere_emits_nothing_with_one_attempt_per_frame() -> None:
    predictor, joint = _modules()
    force_symbol(joint, BLANK)
    state = RNNTState(BLANK)
    frames = _frames(5)
    for index in range(5):
        assert _step(predictor, joint, state, frames[:, index : index + 1]) is None
    assert predictor.calls == 5
    assert state.tokens == [] and state.hidden is None and state.last_token == BLANK and state.arrays() == []

    predictor.calls = 0
    text = rnnt_decode(predictor, joint, frames, 5, blank_id=BLANK, max_symbols=10, vocabulary=VOCABULARY)
    assert text == "" and predictor.calls == 5


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_max_symbols_caps_every_frame(max_symbols: int) -> None:
    predictor, joint = _modules()
    force_symbol(joint, 2)  # "b", never blank
    state = RNNTState(BLANK)
    frames = _frames(4)
    for index in range(4):
        update = _step(predictor, joint, state, frames[:, index : index + 1], max_symbols)
        assert update == ("b" * max_symbols, "b" * max_symbols * (index + 1))
    # The cap ends the frame without a further attempt (and readback).
    assert predictor.calls == 4 * max_symbols
    assert state.tokens == [2] * 4 * max_symbols

    predictor.calls = 0
    text = rnnt_decode(predictor, joint, frames, 4, blank_id=BLANK, max_symbols=max_symbols, vocabulary=VOCABULARY)
    assert text == "b" * 4 * max_symbols
    assert predictor.calls == 4 * max_symbols


def test_readback_callback_fires_once_per_attempt() -> None:
    predictor, joint = _modules(seed=6)
    frames = _frames(12, seed=11) * 3.0
    hooks = CountingReads()
    state = RNNTState(BLANK)
    for index in range(12):
        rnnt_step(
            predictor,
            joint,
            state,
            frames[:, index : index + 1],
            blank_id=BLANK,
            max_symbols=4,
            vocabulary=VOCABULARY,
            hooks=hooks,
        )
    assert hooks.reads == predictor.calls > 12
    hooks.reads = 0
    predictor.calls = 0
    rnnt_decode(
        predictor,
        joint,
        frames,
        12,
        blank_id=BLANK,
        max_symbols=4,
        vocabulary=VOCABULARY,
        hooks=hooks,
    )
    assert hooks.reads == predictor.calls > 12


def test_offline_decode_stops_at_length() -> None:
    predictor, joint = _modules()
    force_symbol(joint, 3)
    text = rnnt_decode(predictor, joint, _frames(6), 2, blank_id=BLANK, max_symbols=2, vocabulary=VOCABULARY)
    assert text == "cccc"


@pytest.mark.parametrize("special", [0, 5])
def test_special_symbols_advance_the_predictor_but_not_the_text(special: int) -> None:
    predictor, joint = _modules()
    force_symbol(joint, special)
    state = RNNTState(BLANK)
    assert _step(predictor, joint, state, _frames(1), max_symbols=2) is None
    assert state.tokens == [] and state.text == ""
    assert state.last_token == special
    assert state.hidden is not None
    h, c = state.hidden
    assert h.shape == c.shape == (2, 1, 8)
    assert h.dtype == c.dtype == mx.float32  # cast to the encoder frame's dtype
    assert len(state.arrays()) == 2


def test_transcript_deltas() -> None:
    predictor, joint = _modules()
    state = RNNTState(BLANK)
    frames = _frames(3)
    force_symbol(joint, 1)  # "▁a": the leading space is stripped from the transcript
    assert _step(predictor, joint, state, frames[:, :1], max_symbols=1) == ("a", "a")
    force_symbol(joint, 4)  # "▁d"
    assert _step(predictor, joint, state, frames[:, 1:2], max_symbols=1) == (" d", "a d")
    # When the old text is not a prefix of the new one, the delta is the whole transcript.
    state.text = "zz"
    force_symbol(joint, 2)
    assert _step(predictor, joint, state, frames[:, 2:3], max_symbols=1) == ("a db", "a db")
    assert state.tokens == [1, 4, 2]


class CountingVocabulary(RNNTVocabulary):
    """Counts the tokens it is asked to decode."""

    decoded_tokens = 0

    def decode(self, token_ids: Iterable[int]) -> str:
        ids = list(token_ids)
        self.decoded_tokens += len(ids)
        return super().decode(ids)


def test_transcript_cost_does_not_grow_with_the_conversation() -> None:
    """Each kept token is decoded once (not the whole history every frame), and the text is unchanged."""
    predictor, joint = _modules()
    vocabulary = CountingVocabulary(PIECES)
    state = RNNTState(BLANK)
    frames = _frames(1)
    pattern = [1, 2, 5, 4, 3, 0]  # words, a language tag and <unk> (skipped), leading "▁" stripped
    for index in range(60):
        force_symbol(joint, pattern[index % len(pattern)])
        rnnt_step(predictor, joint, state, frames, blank_id=BLANK, max_symbols=1, vocabulary=vocabulary)
    assert vocabulary.decoded_tokens == len(state.tokens) == 60 * 4 // 6
    assert state.text == RNNTVocabulary(PIECES).decode(state.tokens).strip()
    assert state.text.startswith("ab dc ab dc")


def test_streaming_steps_equal_offline_decode() -> None:
    predictor, joint = _modules(seed=6)
    frames = _frames(40, seed=11) * 3.0  # random weights and frames: a mix of blanks, emissions and caps
    state = RNNTState(BLANK)
    emitted_per_frame = []
    for index in range(40):
        before = len(state.tokens)
        _step(predictor, joint, state, frames[:, index : index + 1], max_symbols=4)
        mx.eval(*state.arrays())
        emitted_per_frame.append(len(state.tokens) - before)
    assert {0, 4} < set(emitted_per_frame)  # blank-only frames, capped frames, and frames in between
    assert len(set(state.tokens)) >= 3
    offline = rnnt_decode(predictor, joint, frames, 40, blank_id=BLANK, max_symbols=4, vocabulary=VOCABULARY)
    assert offline == state.text


def test_empty_vocabulary_does_nothing() -> None:
    predictor, joint = _modules()
    force_symbol(joint, 2)
    state = RNNTState(BLANK)
    empty = RNNTVocabulary([])
    assert rnnt_step(predictor, joint, state, _frames(1), blank_id=BLANK, max_symbols=3, vocabulary=empty) is None
    assert rnnt_decode(predictor, joint, _frames(2), 2, blank_id=BLANK, max_symbols=3, vocabulary=empty) == ""
    assert predictor.calls == 0


def test_modules_load_the_checkpoint_keys(tiny_bf16: Path) -> None:
    files, weights, quantized = read_runtime_weights(tiny_bf16)
    config = files.config.audio_config
    predictor, joint = RNNTPredictor(config.decoder), RNNTJoint(config.joint)
    load_into(predictor, weights, quantized, "stt_model.rnnt_decoder.")  # strict: names and shapes must match
    load_into(joint, weights, quantized, "stt_model.rnnt_joint.")
    assert predictor.prediction["embed"].weight.shape == (config.decoder.vocab_size + 1, config.decoder.pred_hidden)
    assert joint.joint_net[2].weight.shape == (config.joint.num_classes + 1, config.joint.joint_hidden)
    assert mx.array_equal(joint.joint_net[2].bias, weights["stt_model.rnnt_joint.joint_net.2.bias"])


def _device_frame(
    predictor: RNNTPredictor,
    joint: RNNTJoint,
    state: RNNTState,
    frame: mx.array,
    attempts: int,
    max_symbols: int,
    readbacks: list[int],
) -> tuple[tuple[str, str] | None, list[int]]:
    """The session's way through one frame: propose ``attempts`` on the device, read back, commit.
    Returns the transcript update and the first pass's symbols; each extra readback appends to ``readbacks``."""
    proposal = rnnt_propose(predictor, joint, state, frame, blank_id=BLANK, attempts=attempts)
    symbols = proposal.symbols.tolist()
    hooks = CountingReads()
    update = rnnt_commit(
        predictor,
        joint,
        state,
        frame,
        proposal,
        symbols,
        blank_id=BLANK,
        max_symbols=max_symbols,
        vocabulary=VOCABULARY,
        hooks=hooks,
    )
    readbacks.extend([1] * hooks.reads)
    return update, symbols


@pytest.mark.parametrize("fused_cell", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("max_symbols", [1, 2, 5])
def test_device_proposal_then_commit_equals_the_host_loop(max_symbols: int, fused_cell: bool) -> None:
    """A short unrolled first pass, then (when it all emitted) the rest unrolled and read back: same as rnnt_step.
    The unrolled loop runs on rows (the same products, no per-attempt views); with the cell update's products
    stored apart (exact mode) or left to fuse on a GPU (fast numerics) it gives the host loop's tokens and LSTM
    states, bit for bit, on the CPU."""
    host_predictor, joint = _modules(seed=4)  # frames that end at once and frames that run to the cap
    device_predictor, _ = _modules(seed=4)
    device_predictor.use_fast(RNNTFast() if fused_cell else None)
    assert device_predictor.fused_cell == fused_cell
    frames = _frames(40, seed=11)
    host, device = RNNTState(BLANK), RNNTState(BLANK)
    continued = finished_on_device = 0
    readbacks: list[int] = []
    for index in range(40):
        frame = frames[:, index : index + 1]
        expected = _step(host_predictor, joint, host, frame, max_symbols)
        attempts = first_pass_attempts(max_symbols)
        readbacks_before = len(readbacks)
        update, symbols = _device_frame(device_predictor, joint, device, frame, attempts, max_symbols, readbacks)
        assert len(symbols) == attempts == min(max_symbols, UNROLLED_ATTEMPTS)
        assert update == expected, f"frame {index}"
        assert (device.tokens, device.text, device.last_token) == (host.tokens, host.text, host.last_token)
        if host.hidden is not None:
            assert device.hidden is not None
            assert all(mx.array_equal(a, b).item() for a, b in zip(device.hidden, host.hidden, strict=True))
        if len(readbacks) > readbacks_before:
            assert len(readbacks) == readbacks_before + 1, "the rest of a frame costs one readback"
            continued += 1
        else:
            finished_on_device += 1
    # Both paths were exercised (unless the unrolled attempts already cover max_symbols).
    assert finished_on_device > 0
    assert continued > 0 or max_symbols <= UNROLLED_ATTEMPTS


def test_next_first_pass_unrolls_everything_while_frames_keep_emitting() -> None:
    assert next_first_pass([-1, -1], 10) == 2  # nothing emitted
    assert next_first_pass([7, -1], 10) == 2  # one symbol: the usual pass covered it
    assert next_first_pass([7, 8], 10) == 10  # the usual pass ran out: unroll everything next time
    assert next_first_pass([7, 8, 9] + [-1] * 7, 10) == 10  # still emitting two or more: stay
    assert next_first_pass([7] + [-1] * 9, 10) == 2  # back to the usual pass
    assert next_first_pass([7], 1) == 1


def test_adaptive_first_pass_equals_the_host_loop_with_fewer_readbacks() -> None:
    """The session's policy (next_first_pass) over frames that emit in bursts: same tokens as rnnt_step,
    and a run of busy frames costs one extra readback, not one per frame."""
    host_predictor, joint = _modules(seed=4)
    device_predictor, _ = _modules(seed=4)
    frames = _frames(60, seed=11)
    max_symbols = 5
    host, device = RNNTState(BLANK), RNNTState(BLANK)
    readbacks: list[int] = []
    attempts = first_pass_attempts(max_symbols)
    used = set()
    busy_frames = 0
    for index in range(60):
        frame = frames[:, index : index + 1]
        expected = _step(host_predictor, joint, host, frame, max_symbols)
        used.add(attempts)
        kept_before = len(device.tokens)
        update, symbols = _device_frame(device_predictor, joint, device, frame, attempts, max_symbols, readbacks)
        assert update == expected, f"frame {index}"
        assert (device.tokens, device.last_token) == (host.tokens, host.last_token)
        busy_frames += len(device.tokens) - kept_before >= UNROLLED_ATTEMPTS
        attempts = next_first_pass(symbols, max_symbols)
    assert used == {UNROLLED_ATTEMPTS, max_symbols}  # both passes were exercised
    assert 0 < len(readbacks) < busy_frames


@pytest.mark.parametrize("lstm_dtype", [mx.float32, mx.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("by_attempt", [False, True], ids=["rows", "by_attempt"])
def test_fast_loop_keeps_the_state_of_the_last_emission(by_attempt: bool, lstm_dtype: mx.Dtype) -> None:
    """Fast numerics' greedy loop (the cell update left to fuse; with ``by_attempt``, each attempt as the
    parts of engine.kernels.greedy_attempt, their operations on the CPU) against exact mode's, on a joint that the
    prediction network steers (so frames also stop after one to four emissions, with the state of the last
    emission kept, not the blank attempt's): the same symbols and LSTM states, bit for bit, on the CPU. The
    bf16 case stores the embedding and LSTM weights as the checkpoints do (a bf16 input product)."""
    exact_predictor, joint = _modules(seed=29)
    rows_predictor, _ = _modules(seed=29)
    for predictor in (exact_predictor, rows_predictor):
        predictor.update(tree_map(lambda array: array.astype(lstm_dtype), predictor.parameters()))
    if by_attempt:
        changes = rows_predictor.use_numerics(FastPlan(backend=None), joint)
        assert changes == {"rnnt_attempts": False, "rnnt_loop": False}  # the CPU runs the operations
        assert rows_predictor.attempt_parts is not None and rows_predictor.fused_cell
        assert rows_predictor.embedding_table is not None  # the table the first layer reads rows of
    else:
        assert rows_predictor.use_numerics(FastPlan(backend=None), None) == {}  # no joint: no attempt parts
        assert rows_predictor.attempt_parts is None and rows_predictor.fused_cell
    joint.pred.weight = joint.pred.weight * 10.0
    frames = _frames(30, seed=11)
    exact, rows = RNNTState(BLANK), RNNTState(BLANK)
    stopped_early = 0
    for index in range(30):
        frame = frames[:, index : index + 1]
        _, symbols = _device_frame(exact_predictor, joint, exact, frame, 5, 5, [])
        _, rows_symbols = _device_frame(rows_predictor, joint, rows, frame, 5, 5, [])
        assert rows_symbols == symbols, f"frame {index}"
        assert (rows.tokens, rows.last_token) == (exact.tokens, exact.last_token)
        if exact.hidden is not None:
            assert rows.hidden is not None
            assert all(mx.array_equal(a, b).item() for a, b in zip(rows.hidden, exact.hidden, strict=True))
        stopped_early += 0 < sum(symbol >= 0 for symbol in symbols) < 5
    assert stopped_early >= 3


@pytest.mark.parametrize("outputs", [5, 8, 13])
def test_joint_partials_finish_to_the_first_argmax(outputs: int) -> None:
    """The joint's class scores as one (max, first index) pair per block of classes (the attempt kernel's
    output, here its operations): the first largest pair's index is the scores' argmax, ties included, and a
    short last block is padded so that it never wins by its padding."""
    rng = np.random.default_rng(outputs)
    x = mx.array(rng.standard_normal((1, 6)).astype(np.float32))
    weight = mx.array(rng.standard_normal((outputs, 6)).astype(np.float32))
    bias = mx.array(rng.standard_normal(outputs).astype(np.float32))
    shape = JointRowShape(6, outputs, "partials")
    for tie in (None, (1, outputs - 1)):
        if tie is not None:  # two classes with the same, largest score: the lower index wins
            weight = mx.zeros_like(weight)
            bias = mx.array(np.where(np.isin(np.arange(outputs), tie), 5.0, -1.0).astype(np.float32))
        values, indices = joint_row_ops(x, weight, bias, shape=shape)
        assert values.shape == indices.shape == (shape.partials,) and indices.dtype == mx.int32
        scores = mx.addmm(bias, x, weight.T)
        expected = int(mx.argmax(scores).item())
        assert int(indices[int(mx.argmax(values).item())].item()) == expected
        assert tie is None or expected == tie[0]
        assert all(0 <= index < outputs for index in indices.tolist())


def test_attempt_shapes_reject_what_the_kernels_do_not_take() -> None:
    with pytest.raises(ValueError, match="embedding input is chosen from partials"):
        LSTMStepShape("embedding", 8, 8)
    with pytest.raises(ValueError, match="embedding input is chosen from partials"):
        LSTMStepShape("row", 8, 8, partials=3)
    with pytest.raises(ValueError, match="input must be one of"):
        LSTMStepShape("token", 8, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no kernel for the activation"):
        JointRowShape(8, 8, "activation", "gelu")


def test_transducer_steps_a_frame_as_propose_then_commit_and_states_declare_their_arrays() -> None:
    """The RN-T's contract step (propose, read back, commit) gives the host loop's transcript, tokens and LSTM
    states frame by frame; its state lists its arrays and their bytes; exact mode's use_numerics clears the
    predictor's one fast slot."""
    host_predictor, joint = _modules(seed=4)
    predictor, _ = _modules(seed=4)
    rnnt = Transducer(predictor, joint, blank_id=BLANK, max_symbols=5, vocabulary=VOCABULARY)
    host, state = RNNTState(BLANK), rnnt.make_state()
    assert state.last_token == BLANK and state.arrays() == [] and state.nbytes() == 0
    frames = _frames(20, seed=11)
    hooks = CountingReads()
    for index in range(20):
        frame = frames[:, index : index + 1]
        assert rnnt.step(state, frame, hooks) == _step(host_predictor, joint, host, frame, 5), f"frame {index}"
        assert (state.tokens, state.last_token) == (host.tokens, host.last_token)
    assert host.hidden is not None and state.hidden is not None
    assert all(mx.array_equal(a, b).item() for a, b in zip(state.hidden, host.hidden, strict=True))
    assert state.nbytes() == sum(array.nbytes for array in host.hidden) > 0
    assert 20 <= hooks.reads < 40  # one read a frame, a second on a frame whose first pass all emitted
    predictor.use_numerics(FastPlan(backend=None), joint)
    assert predictor.fast is not None
    assert predictor.use_numerics(None, joint) == {}
    assert predictor.fast is None and predictor.attempt_parts is None and predictor.embedding_table is None
