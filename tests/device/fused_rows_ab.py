"""Fast numerics with the LLM blocks' quantized rows in three forms, alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup fusedab``): the full-size
4-bit random model loaded for fast numerics. "unfused" runs every block as operations around the plain
quantized rows; "fused" runs each block's residual add, the MLP's squared ReLU and the Mamba mixer's gated
norm inside its projections' kernels; "fused+norms" also norms each block's input inside its first kernels,
from the partial sums of squares the block before wrote (what fast mode runs on CUDA). Each form keeps its
own compiled programs, so that all are warm before the rounds.
"""

from __future__ import annotations

import statistics
from typing import Any

from app.bench import bench_input, question_audio, run_ours
from engine import numerics
from engine.model import assemble_voicechat
from engine.random_checkpoint import random_weights
from engine.session import warm_up
from engine.tokenizer import TextTokenizer

FORMS = ("unfused", "fused", "fused+norms")


def main() -> None:
    _, config, weights, quantized, raw_tokenizer, nbytes = random_weights("full", quantize=4, seed=0)
    voicechat = assemble_voicechat(
        config,
        weights,
        quantized,
        TextTokenizer(raw_tokenizer, "random"),
        name="full-q4",
        nbytes=nbytes,
        numerics="fast",
    )
    llm = voicechat.model.stt_model.llm
    programs: dict[str, tuple[dict[Any, Any], dict[Any, Any]]] = {form: ({}, {}) for form in FORMS}

    def use(form: str) -> None:
        carrying = form == "fused+norms"
        numerics._norms_move_into_kernels = lambda: carrying  # type: ignore[attr-defined]
        numerics.apply_numerics(voicechat.model, "fast")
        if form == "unfused":
            for layer in llm.layers:
                layer.fused_rows = False
        # A trace holds the block form it was traced with: each form keeps its own programs.
        llm.__dict__["_segment_sets"], llm.__dict__["_residual_programs"] = programs[form]

    for form in FORMS:
        use(form)
        fused = sum(layer.fused_rows for layer in llm.layers)
        print(f"{form}: {fused} of {len(llm.layers)} blocks fused, partial sums carried {llm._carries_squares}")
        warm_up(voicechat, speech=question_audio())
    samples = bench_input(100)
    results: dict[str, list[float]] = {form: [] for form in FORMS}
    for round_ in range(3):
        for form in FORMS:
            use(form)
            record = run_ours(voicechat, samples, seed=0, sub_stages=False)
            p50 = statistics.median(record.totals_ms)
            results[form].append(p50)
            print(f"round {round_ + 1} {form}: p50 {p50:.2f} ms, mean {statistics.mean(record.totals_ms):.2f} ms")
    for form in FORMS:
        print(f"{form} p50 per round: {', '.join(f'{value:.2f}' for value in results[form])}")


if __name__ == "__main__":
    main()
