"""This build's launches joined against the same steps launched apart, alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup rowchainsab``): the full-size 4-bit
random model, loaded for fast numerics. "joined" is fast mode where the load admitted them: the encoder's and the
TTS backbone's runs of row products as one launch each (:class:`engine.row_chain.RowChain`: from a layer's output
projection to the next layer's q/k/v projections, its blocks meeting at a barrier between products) and the RN-T
loop's attempts as one launch (:class:`engine.greedy_attempt.GreedyLoop`); "apart" is the same products and
attempts one launch each. Prints what the load admitted, each round's median and mean frame, and whether the two
produced the same text ids, codes and waveforms (they should be equal: the same arithmetic in the same order).
"""

from __future__ import annotations

import dataclasses

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.random_checkpoint import random_voicechat
from engine.row_chain import ChainBook


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    print("fast changes in use:", voicechat.fast_changes, flush=True)
    encoder = voicechat.model.stt_model.perception.encoder
    backbone = voicechat.model.tts_model.tts_model.backbone
    predictors = [module for _, module in voicechat.model.named_modules() if type(module).__name__ == "RNNTPredictor"]
    books = {network: dict(network.row_chains.chains) for network in (encoder, backbone)}
    for network, chains in books.items():
        print(f"{type(network).__name__} chains admitted, by steps:", sorted(len(key) for key in chains), flush=True)
    loops = {predictor: predictor.attempt_parts for predictor in predictors}
    print("RN-T loop in one launch:", [parts is not None and parts.loop is not None for parts in loops.values()])
    # Made once, so that each way keeps its compiled loops (engine.rnnt.GreedyPrograms keys them by the parts).
    apart = {predictor: parts and dataclasses.replace(parts, loop=None) for predictor, parts in loops.items()}
    joined_books = {network: ChainBook(chains=chains) for network, chains in books.items()}
    apart_books = {network: ChainBook() for network in books}

    def joined(on: bool) -> dict[str, object]:
        for network in books:
            network.row_chains = joined_books[network] if on else apart_books[network]
        for predictor, parts in loops.items():
            predictor.use_attempt_parts(parts if on else apart[predictor])
        return {}

    warmed_alternating_rounds(voicechat, {"joined": lambda: joined(True), "apart": lambda: joined(False)})


if __name__ == "__main__":
    main()
