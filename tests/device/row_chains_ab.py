"""This build's launches joined against the same steps launched apart, alternating rounds in one process.

Run on the lent GPU from the repository root (``bash tests/device/h200.sh setup rowchainsab``): the full-size 4-bit
random model, loaded for fast numerics. "joined" is fast mode where the load admitted them: the encoder's and the
TTS backbone's runs of row products as one launch each (:class:`engine.kernels.row_chain.RowChain`: from a layer's
output projection to the next layer's q/k/v projections, its blocks meeting at a barrier between products) and the RN-T
loop's attempts as one launch (:class:`engine.kernels.greedy_attempt.GreedyLoop`); "apart" is the same products and
attempts one launch each; "chains" and "loop" join only the one or the other, so that each lever's share of the
difference shows. Prints what the load admitted, each round's median and mean frame, and whether "joined" and
"apart" produced the same text ids, codes and waveforms (they should be equal: the same arithmetic in the same
order).
"""

from __future__ import annotations

import dataclasses
import functools

from traced_ab import warmed_alternating_rounds  # a sibling script

from engine.kernels.row_chain import ChainBook
from engine.loading.random_checkpoint import random_voicechat


def main() -> None:
    voicechat = random_voicechat("full", quantize=4, numerics="fast")
    print("fast changes in use:", voicechat.fast_changes, flush=True)
    encoder = voicechat.model.stt_model.perception.encoder
    backbone = voicechat.model.tts_model.tts_model.backbone
    predictors = [module for _, module in voicechat.model.named_modules() if type(module).__name__ == "RNNTPredictor"]
    networks = (encoder, backbone)  # MLX modules are dicts, so not keys
    books = [dict(network.row_chains.chains) for network in networks]
    for network, chains in zip(networks, books, strict=True):
        print(f"{type(network).__name__} chains admitted, by steps:", sorted(len(key) for key in chains), flush=True)
    loops = [predictor.attempt_parts for predictor in predictors]
    print("RN-T loop in one launch:", [parts is not None and parts.loop is not None for parts in loops])
    # Made once, so that each way keeps its compiled loops (engine.networks.rnnt.GreedyPrograms keys them by the parts).
    apart = [parts and dataclasses.replace(parts, loop=None) for parts in loops]
    joined_books = [ChainBook(chains=chains) for chains in books]
    apart_books = [ChainBook() for _ in books]

    def joined(chains: bool, loop: bool) -> dict[str, object]:
        for network, joined_book, apart_book in zip(networks, joined_books, apart_books, strict=True):
            network.row_chains = joined_book if chains else apart_book
        for predictor, parts, parts_apart in zip(predictors, loops, apart, strict=True):
            predictor.use_attempt_parts(parts if loop else parts_apart)
        return {}

    ways = {"joined": (True, True), "apart": (False, False), "chains": (True, False), "loop": (False, True)}
    warmed_alternating_rounds(voicechat, {name: functools.partial(joined, *way) for name, way in ways.items()})


if __name__ == "__main__":
    main()
