"""``parley drift``: how far fast numerics drift from exact, network by network and end to end.

Two loads of the same random weights, one per numerics mode (see engine.numerics), are
compared on several seeds:

* **teacher-forced, per network**: an exact session records every network's inputs (the
  LLM's fused input embeddings, the TTS step's previous codes and text id, the codec's
  codes); each mode's network then runs on exactly those inputs, with fresh caches, so the
  difference is that network's own. Reported: relative L2 and max-abs of both LLM heads'
  logits, agreement of their greedy ids and the KL divergence of their softmax; relative
  L2 of the TTS hidden states and agreement of its codes (both replays draw the same
  random numbers); the codec waveform's SNR in dB.
* **free-running**: a whole session in each mode on the same input; the first frame whose
  text id, function id or codes differ (None: none differed).

Random weights make the logits flatter than real ones, so greedy agreement measured here is
a pessimistic figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from engine import relative_l2
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE

from .bench import bench_input


@dataclass
class Recording:
    """Every network input of one exact session, in order (prompt prefill included)."""

    llm_inputs: list[mx.array] = field(default_factory=list)
    tts_inputs: list[tuple[mx.array, mx.array | None, int]] = field(default_factory=list)
    codec_codes: list[mx.array] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)
    function_ids: list[int] = field(default_factory=list)
    codes: list[list[int]] = field(default_factory=list)
    prompt_steps: int = 0  # the first LLM inputs are the system prompt's prefill


def _run(voicechat: Any, samples: np.ndarray, seed: int, record: bool, system_prompt: str = "") -> Recording:
    from engine import NO_HOOKS, NoHooks, Session
    from engine.events import AudioChunk

    recording = Recording()

    class Recorder(NoHooks):
        """Hooks that keep the networks' inputs (evaluated as they are seen) and time nothing."""

        observing = True

        def observe(self, name: str, value: Any) -> None:
            if name == "language.input":
                mx.eval(value)
                recording.llm_inputs.append(value)
            elif name == "tts.input":
                code, code_sum, text_id = value
                mx.eval(code, *([] if code_sum is None else [code_sum]))
                recording.tts_inputs.append((code, code_sum, text_id))
            elif name == "codec.codes":
                mx.eval(value)
                recording.codec_codes.append(value)

    # The hooks are given to the constructor, so that they see the system prompt's prefill too.
    session = Session(voicechat, seed=seed, system_prompt=system_prompt, hooks=Recorder() if record else NO_HOOKS)
    recording.prompt_steps = session.prompt_steps
    for start in range(0, samples.size, INPUT_FRAME_SAMPLES):
        for event in session.push(samples[start : start + INPUT_FRAME_SAMPLES], INPUT_SAMPLE_RATE):
            if isinstance(event, AudioChunk):
                recording.codes.append(event.codes.tolist())
    recording.text_ids, recording.function_ids = session.text_ids, session.function_ids
    session.close()
    return recording


def _kl(expected_logits: mx.array, actual_logits: mx.array) -> float:
    p = mx.softmax(expected_logits.astype(mx.float32), axis=-1)
    log_p = mx.log(mx.maximum(p, 1e-30))
    log_q = mx.log(mx.maximum(mx.softmax(actual_logits.astype(mx.float32), axis=-1), 1e-30))
    return _number(mx.sum(p * (log_p - log_q)))


def _number(value: mx.array) -> float:
    """A one-element array's value on the host."""
    item = value.item()
    assert isinstance(item, int | float), item
    return float(item)


def _llm_replay(voicechat: Any, inputs: list[mx.array], prompt_steps: int = 0) -> list[tuple[mx.array, mx.array]]:
    """Both heads' logits for each recorded input position after the first ``prompt_steps``, through a fresh
    cache. The prefill steps are evaluated as the session evaluates them, the caches only (their logits are
    never read), so that the replay runs what a session runs."""
    stt = voicechat.model.stt_model
    cache = stt.llm.make_cache()
    logits = []
    for index, fused in enumerate(inputs):
        hidden = stt.llm(fused, cache)
        if index < prompt_steps:
            mx.eval(cache.arrays())
            continue
        last = hidden[:, -1]
        pair = (stt.lm_head(last), stt.function_head(last))
        mx.eval(pair, cache.arrays())
        logits.append(pair)
    return logits


def _tts_replay(voicechat: Any, inputs: list[tuple[mx.array, mx.array | None, int]], seed: int) -> list[Any]:
    """Each recorded TTS step through a fresh, speaker-prompted cache, drawing seeded random numbers."""
    from engine import TTSInput, speaker_prompt

    tts = voicechat.model.tts_model.tts_model
    cache = tts.make_cache()
    tts.warmup(speaker_prompt(voicechat), cache, voicechat.characters)
    results = []
    for index, (code, code_sum, text_id) in enumerate(inputs):
        mx.random.seed(seed * 100_003 + index)
        cache.draw_key = None  # fast mode's carried key would miss the reseed: draw from the generator, as exact does
        token = mx.array([[text_id]], dtype=mx.int32)
        result = tts.step(cache, TTSInput(code, token, voicechat.characters, code_sum, text_id=text_id))
        mx.eval(result.codes, result.hidden, cache.arrays())
        results.append(result)
    return results


def _codec_replay(voicechat: Any, codes: list[mx.array]) -> np.ndarray:
    codec = voicechat.model.tts_model.audio_codec
    cache = codec.make_state()
    pieces = []
    for clean in codes:
        samples = codec.step(cache, clean.transpose(0, 2, 1))[0]
        mx.eval(samples, cache.arrays())
        pieces.append(np.array(samples, dtype=np.float64))
    return np.concatenate(pieces) if pieces else np.zeros(0)


def _first_difference(a: list[Any], b: list[Any]) -> int | None:
    return next((index for index, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def drift_for_seed(exact: Any, fast: Any, frames: int, seed: int, system_prompt: str = "") -> dict[str, Any]:
    """Fast against exact on one seed's weights (loaded in both modes): teacher-forced per network, the system
    prompt's prefill steps included, and free-running."""
    samples = bench_input(frames)
    recorded = _run(exact, samples, seed, record=True, system_prompt=system_prompt)
    free = _run(fast, samples, seed, record=False, system_prompt=system_prompt)

    exact_logits = _llm_replay(exact, recorded.llm_inputs, recorded.prompt_steps)
    fast_logits = _llm_replay(fast, recorded.llm_inputs, recorded.prompt_steps)
    llm: dict[str, Any] = {}
    for head, name in ((0, "text"), (1, "function")):
        pairs = [(e[head], f[head]) for e, f in zip(exact_logits, fast_logits, strict=True)]
        llm[name] = {
            "relative_l2_max": max(relative_l2(f, e) for e, f in pairs),
            "max_abs": max(_number(mx.abs(f - e).max()) for e, f in pairs),
            "argmax_agreement": sum(_number(mx.argmax(e)) == _number(mx.argmax(f)) for e, f in pairs) / len(pairs),
            "kl_mean": sum(_kl(e, f) for e, f in pairs) / len(pairs),
            "kl_max": max(_kl(e, f) for e, f in pairs),
        }

    exact_tts = _tts_replay(exact, recorded.tts_inputs, seed)
    fast_tts = _tts_replay(fast, recorded.tts_inputs, seed)
    tts = {
        "hidden_relative_l2_max": max(
            relative_l2(f.hidden, e.hidden) for e, f in zip(exact_tts, fast_tts, strict=True)
        ),
        "codes_agreement": sum(
            bool(mx.array_equal(e.codes, f.codes).item()) for e, f in zip(exact_tts, fast_tts, strict=True)
        )
        / max(len(exact_tts), 1),
    }

    want = _codec_replay(exact, recorded.codec_codes)
    got = _codec_replay(fast, recorded.codec_codes)
    noise = float(np.sum((got - want) ** 2))
    signal = float(np.sum(want**2))
    codec = {"snr_db": math.inf if noise == 0 else 10 * math.log10(signal / noise)}

    free_running = {
        "frames": len(recorded.codes),
        "first_text_difference": _first_difference(recorded.text_ids, free.text_ids),
        "first_function_difference": _first_difference(recorded.function_ids, free.function_ids),
        "first_codes_difference": _first_difference(recorded.codes, free.codes),
    }
    return {"seed": seed, "llm": llm, "tts": tts, "codec": codec, "free_running": free_running}


def measure_drift(
    *, size: str, quantize: int | None, seeds: list[int], frames: int, system_prompt: str = "", out: Any = print
) -> dict[str, Any]:
    """Per seed, load that seed's random weights in both modes and measure drift (each session prefilled with
    ``system_prompt``, if any); returns the report."""
    from engine import random_voicechat

    report: dict[str, Any] = {
        "size": size,
        "quantize": quantize,
        "frames": frames,
        "system_prompt": system_prompt,
        "device": str(mx.default_device()),
        "seeds": [],
    }
    for seed in seeds:
        exact = random_voicechat(size, quantize=quantize, seed=seed, numerics="exact")  # type: ignore[arg-type]
        fast = random_voicechat(size, quantize=quantize, seed=seed, numerics="fast")  # type: ignore[arg-type]
        mx.eval(exact.model.parameters(), fast.model.parameters())
        report["fast_changes"] = fast.fast_changes
        out(f"seed {seed}: fast changes in use on {mx.default_device()}: {fast.fast_changes}")
        result = drift_for_seed(exact, fast, frames, seed, system_prompt)
        report["seeds"].append(result)
        out(format_seed(result))
    return report


def format_seed(result: dict[str, Any]) -> str:
    llm, tts, free = result["llm"], result["tts"], result["free_running"]
    text, function = llm["text"], llm["function"]
    return (
        f"seed {result['seed']}: LLM logits rel-L2 {text['relative_l2_max']:.2e} / {function['relative_l2_max']:.2e} "
        f"(text / function), max-abs {text['max_abs']:.2e} / {function['max_abs']:.2e}, argmax agreement "
        f"{text['argmax_agreement']:.1%} / {function['argmax_agreement']:.1%}, KL max {text['kl_max']:.2e}; "
        f"TTS hidden rel-L2 {tts['hidden_relative_l2_max']:.2e}, codes {tts['codes_agreement']:.1%}; "
        f"codec SNR {result['codec']['snr_db']:.1f} dB; free-running first difference: text "
        f"{free['first_text_difference']}, function {free['first_function_difference']}, codes "
        f"{free['first_codes_difference']} (of {free['frames']} frames)"
    )
