"""The RN-T head (the user's transcript): its math (:mod:`.rnnt`) and its fast form (:mod:`.fast`)."""

from .fast import RNNT_LOOP_SETTING, RNNTFast, rnnt_loop_wanted
from .rnnt import (
    UNROLLED_ATTEMPTS,
    GreedyPrograms,
    LSTMState,
    RNNTJoint,
    RNNTPredictor,
    RNNTProposal,
    RNNTState,
    Transducer,
    first_pass_attempts,
    next_first_pass,
    rnnt_commit,
    rnnt_decode,
    rnnt_propose,
    rnnt_step,
)

__all__ = [
    "RNNT_LOOP_SETTING",
    "UNROLLED_ATTEMPTS",
    "GreedyPrograms",
    "LSTMState",
    "RNNTFast",
    "RNNTJoint",
    "RNNTPredictor",
    "RNNTProposal",
    "RNNTState",
    "Transducer",
    "first_pass_attempts",
    "next_first_pass",
    "rnnt_commit",
    "rnnt_decode",
    "rnnt_loop_wanted",
    "rnnt_propose",
    "rnnt_step",
]
