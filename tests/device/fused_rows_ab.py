"""Fast numerics with and without the LLM blocks' fused quantized rows, alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup fusedab``): the full-size
4-bit random model loaded for fast numerics; "fused" runs each block's residual add, the MLP's squared ReLU
and the Mamba mixer's gated norm inside its projections' kernels, "unfused" runs them as operations around the
plain quantized rows. Each
variant keeps its own compiled programs, so that both are warm before the rounds.
"""

from __future__ import annotations

import statistics

from app.bench import bench_input, question_audio, run_ours
from engine.loading.random_checkpoint import random_weights
from engine.loading.tokenizer import TextTokenizer
from engine.model import assemble_voicechat
from engine.session import warm_up


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
    fused_layers = [layer for layer in llm.layers if layer.fused_rows]
    print(f"{len(fused_layers)} of {len(llm.layers)} blocks fused")
    programs = {True: ({}, {}), False: ({}, {})}

    def use(fused: bool) -> None:
        for layer in fused_layers:
            layer.fused_rows = fused
        # A trace holds the block form it was traced with: each variant keeps its own programs.
        llm.__dict__["_segment_sets"], llm.__dict__["_residual_programs"] = programs[fused]

    for fused in (True, False):
        use(fused)
        warm_up(voicechat, speech=question_audio())
    samples = bench_input(100)
    results: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(3):
        for fused in (True, False):
            use(fused)
            record = run_ours(voicechat, samples, seed=0, sub_stages=False)
            p50 = statistics.median(record.totals_ms)
            results[fused].append(p50)
            name = "fused" if fused else "unfused"
            print(f"round {round_ + 1} {name}: p50 {p50:.2f} ms, mean {statistics.mean(record.totals_ms):.2f} ms")
    for fused in (True, False):
        print(f"{'fused' if fused else 'unfused'} p50 per round: {', '.join(f'{v:.2f}' for v in results[fused])}")


if __name__ == "__main__":
    main()
