"""A ~900-position system prompt's prefill, step by step against in chunks: time, counts and drift.

``python -m tests.prefill_bench [--size tiny|structure] [--quantize 4] [--numerics fast|exact] [--frames 40]``

Sessions on the same random weights and seed, one prefilled one position per step (``prefill_chunk=1``, the
reference's), one in chunks (``--chunk``, fast mode's: run twice, the first paying for what it meets first), then
the same audio (app.bench's question, then silence). Printed: each prefill's seconds and counts
(:class:`engine.prefill.PrefillCounts`); the LLM's last hidden state after the prompt, both ways (max abs and
relative L2), and whether the ids that follow it are equal; the TTS backbone's cached keys after the prompt
(relative L2); how many of the step-by-step prompt's TTS steps sampled the codec's silence (all 31 codes; and the
share of codes that are silence's), which the chunked prefill feeds instead; then over ``--frames`` frames how many
text and function ids are equal and the first frame whose codes differ. docs/performance.md ("Prefill") and
docs/numerics.md ("Prefill in chunks") have the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import mlx.core as mx
import numpy as np

from engine import relative_l2
from engine.events import AudioChunk
from engine.hooks import NO_HOOKS, NoHooks
from engine.ops.cache import KVCache
from engine.prefill import PREFILL_CHUNK, prefill_positions
from engine.random_model import random_voicechat
from engine.session import Session

# Five tools in the base model's tool-prompt shape: a stand-in for the rendered prompt (its length is what counts).
TOOLS = [
    {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look up, in the user's words."},
                "limit": {"type": "integer", "description": "At most this many results."},
            },
            "required": ["query"],
        },
    }
    for name, description in [
        ("get_time", "The current date and time in the user's time zone."),
        ("set_timer", "Start a timer that speaks when it fires; returns its id and when it fires."),
        ("search_notes", "Search the user's notes for a phrase; returns matching titles and first lines."),
        ("read_file", "Read a text file the user named, from the folders they allowed; returns its text."),
        ("weather", "The weather forecast for a place and day; returns temperatures, rain and wind."),
    ]
]
TOOL_PROMPT = (
    "You are a helpful voice assistant. Answer in a spoken, conversational style. "
    "You can call tools. <AVAILABLE_TOOLS>" + json.dumps(TOOLS) + "</AVAILABLE_TOOLS> "
    'To call a tool, write <TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>. '
    "Tool results come back as <TOOL_RESPONSE>[...]</TOOL_RESPONSE>; tell the user what they say. " * 3
)


def prompt_of(tokenizer: Any, positions: int) -> str:
    """A system prompt whose prefill takes ``positions`` positions (its tokens, BOS and EOS) with ``tokenizer``:
    :data:`TOOL_PROMPT`, repeated as needed and cut to length."""
    text = TOOL_PROMPT
    while len(tokenizer.encode(text)) < positions:
        text += " " + TOOL_PROMPT
    ids = tokenizer.encode(text)[: positions - 2]
    prompt = str(tokenizer.decode(ids))
    assert len(tokenizer.encode(prompt)) == positions - 2, "the cut prompt re-encodes to another length"
    return prompt


def last_hidden(voicechat: Any, prompt: str, chunk: int) -> mx.array:
    """The LLM's hidden state at the prompt's last position (1, 1, D), prefilled ``chunk`` positions a forward on a
    fresh cache, as a session prefills it."""
    config, stt = voicechat.config, voicechat.model.stt_model
    ids = [config.bos_token_id, *voicechat.tokenizer.encode(prompt), config.eos_token_id]
    pads = [config.pad_token_id] * len(ids)
    embeddings = stt.embed_tokens(mx.array([ids], dtype=mx.int32))
    return prefill_positions(stt, stt.llm.make_cache(), embeddings, pads, pads, chunk=chunk).last_hidden


def compare(voicechat: Any, prompt: str, frames: int, chunk: int, seed: int = 0) -> dict[str, Any]:
    """Step by step against ``chunk`` positions a forward on ``voicechat``: the report :func:`main` prints."""
    from app.bench import bench_input

    audio = bench_input(frames)
    runs: dict[int, dict[str, Any]] = {}
    silence = voicechat.model.tts_model.codec_silence_tokens
    prompt_codes: list[mx.array] = []

    class PromptCodes(NoHooks):
        """Keeps the codes each TTS step of the step-by-step prefill samples."""

        observing = True

        def observe(self, name: str, value: Any) -> None:
            if name == "tts.output" and len(prompt_codes) < 10_000:
                prompt_codes.append(value.codes)

    cold = 0.0
    for each in (chunk, 1, chunk):  # chunked twice: the first pays for the shapes it meets first
        started = time.perf_counter()
        hooks = PromptCodes() if each == 1 else NO_HOOKS
        session = Session(voicechat, seed=seed, system_prompt=prompt, prefill_chunk=each, hooks=hooks)
        seconds = time.perf_counter() - started
        if each == 1:
            steps = len(prompt_codes)
            prompt_codes_stack = mx.concatenate(prompt_codes, axis=1)[0] if prompt_codes else mx.zeros((0, 1))
            prompt_codes.clear()
        elif each == chunk and not cold:
            cold = seconds
        layer = next(layer for layer in session.caches.tts.layers if isinstance(layer, KVCache))  # a global one
        assert layer.keys is not None
        keys = layer.keys[..., : layer.offset, :]
        mx.eval(keys)
        events = session.push(audio)
        codes = [event.codes.tolist() for event in events if isinstance(event, AudioChunk) and event.codes.size]
        runs[each] = {
            "seconds": seconds,
            "counts": session.prefill_counts,
            "keys": keys,
            "text": session.text_ids,
            "function": session.function_ids,
            "codes": codes,
        }
        session.close()
    stepwise, chunked = runs[1], runs[chunk]
    hidden = [last_hidden(voicechat, prompt, each) for each in (1, chunk)]
    stt = voicechat.model.stt_model
    ids = [tuple(int(array.item()) for array in stt.choose(state)) for state in hidden]
    first_codes = next(
        (i for i, (a, b) in enumerate(zip(stepwise["codes"], chunked["codes"], strict=True)) if a != b), None
    )
    return {
        "positions": stepwise["counts"].positions,
        "stepwise_seconds": stepwise["seconds"],
        "chunked_seconds": chunked["seconds"],
        "chunked_seconds_first": cold,
        "stepwise_counts": stepwise["counts"],
        "chunked_counts": chunked["counts"],
        "hidden_max_abs": float(mx.abs(hidden[1] - hidden[0]).max().item()),
        "hidden_relative_l2": relative_l2(hidden[1], hidden[0]),
        "hidden_identical": bool(mx.array_equal(hidden[0], hidden[1]).item()),
        "ids_after_prompt_equal": ids[0] == ids[1],
        "tts_keys_relative_l2": relative_l2(chunked["keys"], stepwise["keys"]),
        "frames": len(stepwise["codes"]),
        "text_equal": sum(a == b for a, b in zip(stepwise["text"], chunked["text"], strict=True)),
        "function_equal": sum(a == b for a, b in zip(stepwise["function"], chunked["function"], strict=True)),
        "first_codes_difference": first_codes,
        "stepwise_prompt_steps_silent": float(mx.all(prompt_codes_stack == silence, axis=-1).sum().item()) / steps,
        "stepwise_prompt_codes_silent": float(mx.mean(prompt_codes_stack == silence).item()),
        "codes_equal_fraction": float(
            np.mean([a == b for a, b in zip(stepwise["codes"], chunked["codes"], strict=True)])
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "structure", "full"])
    parser.add_argument("--quantize", type=int, default=4, help="bits, or 0 for bf16")
    parser.add_argument("--numerics", default="fast", choices=["fast", "exact"])
    parser.add_argument("--positions", type=int, default=900)
    parser.add_argument("--chunk", type=int, default=PREFILL_CHUNK)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    voicechat = random_voicechat(args.size, quantize=args.quantize or None, seed=args.seed, numerics=args.numerics)
    prompt = prompt_of(voicechat.tokenizer, args.positions)
    report = compare(voicechat, prompt, args.frames, args.chunk, args.seed)
    print(f"{args.size} q{args.quantize} {args.numerics} seed {args.seed}, chunk {args.chunk}")
    for key, value in report.items():
        print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
