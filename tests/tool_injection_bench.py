"""Times a tool response's injection (``Session.answer_tool_calls``) on a checkpoint: a scripted call, then answers
whose responses take about 72 tokens (NVIDIA's measured case) and the 512-token bound. Prints, asserts nothing.

    PYTHONPATH=$PWD .venv/bin/python -m tests.tool_injection_bench [--size tiny] [--numerics exact] [--repeat 3]

Random weights (engine.random_model) by default; the figures are host wall time, unpaced (docs/tools.md).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from engine.events import ToolResponseInjected
from engine.loading.tokenizer import TextTokenizer
from engine.random_model import random_voicechat
from engine.session import Session
from engine.tools import MAX_RESPONSE_TOKENS, ScriptedChannels, ToolResult, render_tool_response

CALL = '{"name":"lookup"}'


def result_of_tokens(tokenizer: TextTokenizer, tokens: int) -> ToolResult:
    """A result whose rendered response takes ``tokens`` tokens (or the fewest above, where none fits exactly)."""
    words = "the quick brown fox jumps over the lazy dog "
    for length in range(1, 5000):
        result = ToolResult("lookup", True, (words * 120)[:length])
        if len(tokenizer.encode(render_tool_response([result]))) >= tokens:
            return result
    raise RuntimeError("no result is that long")


def time_injection(size: str, numerics: str, tokens: int, repeat: int) -> tuple[int, list[float]]:
    voicechat = random_voicechat(size, numerics=numerics)  # type: ignore[arg-type]
    result = result_of_tokens(voicechat.tokenizer, tokens)
    frame = np.zeros(voicechat.config.frame_samples, dtype=np.float32)
    seconds, positions = [], 0
    for _ in range(repeat):
        script = [20, *voicechat.tokenizer.encode(CALL), 21]
        session = Session(
            voicechat, seed=0, system_prompt="", await_tool_results=True, override_ids=ScriptedChannels(script)
        )
        for _ in script:
            session.push(frame)
        injected = session.answer_tool_calls([result])[0]
        assert isinstance(injected, ToolResponseInjected)
        seconds.append(injected.seconds)
        positions = injected.positions
        session.close()
    return positions, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--numerics", default="exact")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for tokens in (72, MAX_RESPONSE_TOKENS):
        positions, seconds = time_injection(args.size, args.numerics, tokens, args.repeat)
        print(
            f"{args.size} {args.numerics}: {positions} positions ({positions - 1} response tokens + <SPECIAL_22>): "
            f"median {statistics.median(seconds):.3f} s, {1000 * statistics.median(seconds) / positions:.2f} ms per "
            f"position (runs: {', '.join(f'{s:.3f}' for s in seconds)})"
        )


if __name__ == "__main__":
    main()
