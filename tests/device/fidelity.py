"""Fast numerics against exact on the GPU, on tiny random checkpoints in the published layout.

    python3 tests/device/fidelity.py cases [QUANT ...]          the six cases: bf16, 4-bit, 8-bit × no prompt, prompt
    python3 tests/device/fidelity.py unlisted [QUANT ...]       the same with the caches' in-place writes unlisted
    python3 tests/device/fidelity.py bisect QUANT PROMPT        one case with each group of fast parts left out

QUANT is none, 4 or 8; PROMPT is prompt or none. ``cases`` prints, per case, the teacher-forced agreement of the
LLM's greedy text and function ids (every LLM step, the system prompt's prefill included, fed exact mode's inputs)
and of the TTS codes, and the free-running first differences (``parley drift``'s measures, app/drift.py). The
issue's bound: text and function ids teacher-forced equal in at least 99 % of frames in every case; a case under
it ends the line with PARTS. ``bisect`` reruns one case with each group of fast mode's parts held back (their
fallbacks run, as where a kernel is not admitted), so that the group whose absence restores agreement is the one
that parts them. ``unlisted`` runs the cases as the build before issue 46's fix did: an attention kernel's write
into its cache's buffers not listed among the cache's arrays (engine.ops.cache), so that a system prompt's prefill,
which reads no last hidden state, loses the last attention block's writes where that block ends the stack.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import mlx.core as mx

import engine.kernels.admission as admission
import engine.kernels.row_parts as row_parts
import engine.model  # noqa: F401  (every network and its fast form imported: the names _rebind points are bound)
import engine.networks.tts.fast as tts_fast
import engine.numerics as numerics
from app.bench import bench_input
from app.drift import _first_difference, _llm_replay, _run, drift_for_seed
from engine.kernels.admission import relative_l2
from engine.numerics import set_numerics
from engine.random_model import random_voicechat

PROMPT = "Be concise and answer in one sentence."
FRAMES = 61
SEED = 0
BOUND = 0.99

# Groups of fast parts, by the first entry of their key in engine.kernels.admission.fast_part (and three changes made
# outside it: the row chains, the condition table, the backbone caches' dtype).
GROUPS: dict[str, tuple[str, ...]] = {
    "quantized rows": ("quantized_row",),
    "Mamba step": ("mamba",),
    "LLM attention": ("llm_attention_writing", "llm_attention_writing_merged"),
    "the LLM's three": ("quantized_row", "mamba", "llm_attention_writing", "llm_attention_writing_merged"),
    "encoder": ("relative", "relative_window", "row_product", "row_chains"),
    "condition table": ("condition_table",),
    "bf16 caches": ("bf16_cache",),
    "TTS and codec kernels": (
        "attention",
        "attention_merged",
        "attention_writing",
        "attention_writing_merged",
        "attention_heads",
        "attention_heads_merged",
        "norm_rope",
        "residual_vq",
        "residual_vq_round",
        "step_draws",
        "codec_conv_norm",
        "codec_code_sum",
        "lstm_step",
        "joint_row",
        "greedy_loop",
    ),
}

HELD: set[str] = set()

_fast_part = admission.fast_part
_row_chains = row_parts.row_chains
_use_condition_table = tts_fast.use_condition_table
_cache_dtype = numerics.BACKBONE_CACHE_DTYPE


def _held_fast_part(key: tuple[Any, ...], name: str, fallback: Any, *args: Any, **kwargs: Any) -> Any:
    if key[0] in HELD:
        return fallback, False
    return _fast_part(key, name, fallback, *args, **kwargs)


def _held_row_chains(network: str, runs: Any, backend: str) -> Any:
    if "row_chains" in HELD:
        from engine.kernels.row_chain import ChainBook

        return ChainBook(), False
    return _row_chains(network, runs, backend)


def _held_condition_table(tts: Any, characters: Any, size: int) -> bool:
    return False if "condition_table" in HELD else _use_condition_table(tts, characters, size)


def _rebind(original: Any, replacement: Any) -> None:
    """Point every engine module's name for ``original`` (each imported the function by name) at ``replacement``."""
    for module in [module for name, module in sys.modules.items() if name.startswith("engine")]:
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, replacement)


_rebind(_fast_part, _held_fast_part)
_rebind(_row_chains, _held_row_chains)
_rebind(_use_condition_table, _held_condition_table)


def hold(names: tuple[str, ...]) -> None:
    HELD.clear()
    HELD.update(names)
    numerics.BACKBONE_CACHE_DTYPE = mx.float32 if "bf16_cache" in HELD else _cache_dtype


def unlist_writes() -> None:
    """The caches as they were before issue 46's fix: a kernel's in-place write not among their arrays."""
    from engine.ops.cache import KVCache, SlidingKVCache

    for cache_type in (KVCache, SlidingKVCache):
        listed = cache_type.advance

        def advance(self: Any, keys: mx.array, values: mx.array, written_by: Any = None, listed: Any = listed) -> None:
            listed(self, keys, values)

        cache_type.advance = advance  # type: ignore[method-assign]


def _quantize(value: str) -> int | None:
    return None if value in ("none", "bf16") else int(value)


def _label(quantize: int | None, prompt: str) -> str:
    return f"{'bf16' if quantize is None else f'{quantize}-bit'}, {'prompt' if prompt else 'no prompt'}"


def _first_parting(exact_logits: list[Any], fast_logits: list[Any]) -> tuple[float, float, int | None, float]:
    """Teacher-forced text and function agreement, the first step whose ids part, and the largest rel-L2 of the
    text logits."""
    text = function = 0
    first = None
    worst = 0.0
    for step, (e, f) in enumerate(zip(exact_logits, fast_logits, strict=True)):
        same_text = mx.argmax(e[0]).item() == mx.argmax(f[0]).item()
        same_function = mx.argmax(e[1]).item() == mx.argmax(f[1]).item()
        text += same_text
        function += same_function
        if first is None and not (same_text and same_function):
            first = step
        worst = max(worst, relative_l2(f[0], e[0]))
    steps = max(len(exact_logits), 1)
    return text / steps, function / steps, first, worst


def cases(quantizations: list[int | None]) -> bool:
    """Each quantization's two cases; True when every one keeps the bound."""
    kept = True
    for quantize in quantizations:
        exact = random_voicechat("tiny", quantize=quantize, seed=SEED, numerics="exact")  # type: ignore[arg-type]
        fast = random_voicechat("tiny", quantize=quantize, seed=SEED, numerics="fast")  # type: ignore[arg-type]
        print(f"{_label(quantize, '')}: fast parts in use {fast.fast_changes}", flush=True)
        for prompt in ("", PROMPT):
            result = drift_for_seed(exact, fast, FRAMES, SEED, prompt)
            llm, tts, free = result["llm"], result["tts"], result["free_running"]
            text, function = llm["text"]["argmax_agreement"], llm["function"]["argmax_agreement"]
            ok = text >= BOUND and function >= BOUND
            kept = kept and ok
            print(
                f"case {_label(quantize, prompt)}: teacher-forced text {text:.1%}, function {function:.1%}, "
                f"logits rel-L2 {llm['text']['relative_l2_max']:.2e}; TTS hidden rel-L2 "
                f"{tts['hidden_relative_l2_max']:.2e}, codes {tts['codes_agreement']:.1%}; free-running first "
                f"difference text {free['first_text_difference']}, function {free['first_function_difference']}, "
                f"codes {free['first_codes_difference']} of {free['frames']}" + ("" if ok else "  PARTS"),
                flush=True,
            )
    return kept


def bisect(quantize: int | None, prompt: str) -> None:
    samples = bench_input(FRAMES)
    exact = random_voicechat("tiny", quantize=quantize, seed=SEED, numerics="exact")  # type: ignore[arg-type]
    recorded = _run(exact, samples, SEED, record=True, system_prompt=prompt)
    exact_logits = _llm_replay(exact, recorded.llm_inputs, recorded.prompt_steps)
    fast = random_voicechat("tiny", quantize=quantize, seed=SEED, numerics="exact")  # type: ignore[arg-type]
    print(f"{_label(quantize, prompt)}: {len(recorded.llm_inputs)} LLM steps", flush=True)
    for name, names in (("nothing", ()), *GROUPS.items()):
        hold(names)
        set_numerics(fast, "fast")
        fast_logits = _llm_replay(fast, recorded.llm_inputs, recorded.prompt_steps)
        text, function, first, worst = _first_parting(exact_logits, fast_logits)
        free = _run(fast, samples, SEED, record=False, system_prompt=prompt)
        free_text = _first_difference(recorded.text_ids, free.text_ids)
        free_codes = _first_difference(recorded.codes, free.codes)
        in_use = sorted(change for change, used in fast.fast_changes.items() if used)
        print(
            f"held back {name}: teacher-forced text {text:.1%}, function {function:.1%}, first parting step {first}, "
            f"text logits rel-L2 max {worst:.2e}; free-running text parts at {free_text}, codes at {free_codes}; "
            f"in use: {' '.join(in_use)}",
            flush=True,
        )
    hold(())


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    print(f"mlx {mx.__version__} on {mx.default_device()}", flush=True)
    if argv[:1] in (["cases"], ["unlisted"]):
        if argv[0] == "unlisted":
            unlist_writes()
        quantizations = [_quantize(value) for value in argv[1:]] or [None, 4, 8]
        return 0 if cases(quantizations) else 1
    if argv[:1] == ["bisect"] and len(argv) == 3:
        bisect(_quantize(argv[1]), PROMPT if argv[2] == "prompt" else "")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
