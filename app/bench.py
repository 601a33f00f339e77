"""``parley bench``: frame-time benchmark of the streaming session, optionally against mlx-vlm.

Runs the session on a checkpoint folder or on seeded random weights made in memory
(``--random tiny|full``: the exact tensors ``make-checkpoint`` would write, without the
multi-GB write), feeding a spoken question followed by silence in 80 ms frames. With
``--compare mlx-vlm`` the reference port's own streaming session runs on the same
weights in the same process, alternating with ours round by round, and the discrete
outputs of both are compared frame by frame. With ``--numerics fast --compare exact`` the
same model runs fast and exact numerics in alternating rounds (switched in place).

Reported per run: per-stage p50/p95, the realtime factor, host syncs per frame, peak
memory, and frame-time windows — cold (0–5), early steady state (6–70), past the
attention window (71+), and late (700–750, when the run is long enough).
"""

from __future__ import annotations

import json
import time
import wave
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine import RANDOM_SIZES
from engine.timeline import FRAME_MS, FRAME_SECONDS, INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE, STAGES

from .bench_counters import HOST_CALL_FRAMES, count_frames, counters_report, format_counters, host_calls
from .paths import resource_path

FRAME = INPUT_FRAME_SAMPLES
WINDOWS = {"cold": (0, 5), "early": (6, 70), "steady": (71, None), "late": (700, 750)}
# --compare: the reference port on the same weights, or (with --numerics fast) this engine in exact mode.
COMPARISONS = ("mlx-vlm", "exact")


def question_audio() -> np.ndarray:
    """The bundled espeak-ng question, 16 kHz mono float32 (read without audio libraries)."""
    with wave.open(str(resource_path("speech", "question-16k.wav")), "rb") as stream:
        if stream.getframerate() != INPUT_SAMPLE_RATE or stream.getnchannels() != 1 or stream.getsampwidth() != 2:
            raise ValueError("the bundled question must be 16 kHz mono 16-bit")
        raw = stream.readframes(stream.getnframes())
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def bench_input(frames: int, *, speech_every: int | None = None) -> np.ndarray:
    """``frames`` × 1280 samples: the question, then silence; with ``speech_every``, the question
    is asked again every that many frames (long runs keep hearing speech)."""
    question = question_audio()
    samples = np.zeros(frames * FRAME, dtype=np.float32)
    starts = range(0, frames, speech_every) if speech_every else (0,)
    for start in starts:
        speech = question[: (frames - start) * FRAME]
        samples[start * FRAME : start * FRAME + speech.shape[0]] = speech
    return samples


@dataclass
class RunRecord:
    """One pass over the input by one implementation."""

    label: str
    totals_ms: list[float]
    stages_ms: dict[str, list[float]]
    host_syncs: list[int]
    peak_memory_bytes: int
    text_ids: list[int]
    function_ids: list[int]
    codes: list[list[int]]
    sub_stages: dict[str, list[float]] = field(default_factory=dict)
    sub_stage_evaluation: dict[str, list[float]] = field(default_factory=dict)  # of each, the evaluation's part
    waveforms: list[np.ndarray] = field(default_factory=list)  # each frame's 1764 output samples
    state_bytes: list[int] = field(default_factory=list)  # the session's caches after each frame
    active_bytes: list[int] = field(default_factory=list)  # all memory MLX holds after each frame


def _stats(values: list[float]) -> dict[str, float]:
    from engine import percentile

    if not values:
        return {}
    return {
        "mean_ms": sum(values) / len(values),
        "p50_ms": percentile(values, 0.5),
        "p95_ms": percentile(values, 0.95),
        "max_ms": max(values),
    }


def curve_point(
    totals_ms: list[float], state_bytes: list[int], active_bytes: list[int], start: int, end: int
) -> dict[str, float]:
    """Frame time over frames ``start``–``end`` and the memory held after the last of them."""
    point = {"start_frame": start, "end_frame": end, "minutes": end * FRAME_SECONDS / 60}
    point.update(_stats(totals_ms[start:end]))
    if state_bytes:
        point["state_gb"] = state_bytes[end - 1] / 1e9
        point["active_gb"] = active_bytes[end - 1] / 1e9
    return point


def curve(record: RunRecord, every: int) -> list[dict[str, float]]:
    """Frame time and memory per block of ``every`` frames (the long-conversation curve)."""
    return [
        curve_point(record.totals_ms, record.state_bytes, record.active_bytes, start, start + every)
        for start in range(0, len(record.totals_ms) - every + 1, every)
    ]


def summarize_run(record: RunRecord, curve_every: int | None = None) -> dict[str, Any]:
    totals = record.totals_ms
    windows = {}
    for name, (start, end) in WINDOWS.items():
        part = totals[start : end if end is None else end + 1]
        if part and (end is None or len(totals) > end):
            windows[name] = _stats(part)
    steady = totals[6:] or totals
    mean = sum(steady) / len(steady)
    p50 = _stats(steady)["p50_ms"]
    longest = max(range(len(totals)), key=totals.__getitem__)
    return {
        "label": record.label,
        "frames": len(totals),
        "realtime_factor": mean / FRAME_MS,
        "total": _stats(steady),
        "windows": windows,
        "stages": {name: _stats(values[6:] or values) for name, values in record.stages_ms.items()},
        "sub_stages": {name: _stats(values[6:] or values) for name, values in record.sub_stages.items()},
        "sub_stage_evaluation": {
            name: _stats(values[6:] or values) for name, values in record.sub_stage_evaluation.items()
        },
        "host_syncs_per_frame": (sum(record.host_syncs[6:]) / len(record.host_syncs[6:]))
        if record.host_syncs[6:]
        else None,
        "peak_memory_gb": record.peak_memory_bytes / 1e9,
        # Stalls: every frame after loading counts, the cold ones too.
        "longest_frame": {"index": longest, "ms": totals[longest]},
        "frames_over_twice_p50": sum(1 for value in totals if value > 2 * p50),
        "curve": curve(record, curve_every) if curve_every else [],
    }


def format_point(point: dict[str, float]) -> str:
    return (
        f"  {point['minutes']:5.2f} min (frames {point['start_frame']}-{point['end_frame']}): "
        f"p50 {point['p50_ms']:.2f} ms, p95 {point['p95_ms']:.2f} ms, "
        f"conversation state {point['state_gb'] * 1e3:.1f} MB, MLX memory {point['active_gb']:.3f} GB"
    )


def run_ours(
    voicechat: Any,
    samples: np.ndarray,
    *,
    seed: int,
    sub_stages: bool,
    progress_every: int | None = None,
    history: int = 0,
    out: Callable[[str], None] = print,
) -> RunRecord:
    """One pass of our session; with ``progress_every``, each curve block is printed as it
    completes (a long run that is cut short still leaves its curve so far); with ``history``,
    the conversation is aged by that many frames after its first frame."""
    import mlx.core as mx

    from engine import FrameProfiler, Session
    from engine.events import AudioChunk, FrameTiming

    mx.synchronize()
    mx.reset_peak_memory()
    session = Session(voicechat, seed=seed, hooks=FrameProfiler(sub_stages=sub_stages))
    totals: list[float] = []
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    subs: dict[str, list[float]] = {}
    sub_evaluations: dict[str, list[float]] = {}
    syncs: list[int] = []
    codes: list[list[int]] = []
    waveforms: list[np.ndarray] = []
    state_bytes: list[int] = []
    active_bytes: list[int] = []
    for start in range(0, samples.shape[0], FRAME):
        began = time.perf_counter()
        events = session.push(samples[start : start + FRAME], INPUT_SAMPLE_RATE)
        totals.append((time.perf_counter() - began) * 1000.0)
        if history and start == 0:
            session.age(history, seed=seed)
        state_bytes.append(session.state_nbytes)
        active_bytes.append(mx.get_active_memory())
        for event in events:
            if isinstance(event, FrameTiming):
                for name in stages:
                    stages[name].append(event.stage_ms(name))
                for name, value in event.sub_stages.items():
                    subs.setdefault(name, []).append(value)
                for name, value in event.sub_stage_evaluation.items():
                    sub_evaluations.setdefault(name, []).append(value)
                syncs.append(event.host_syncs)
            elif isinstance(event, AudioChunk):
                codes.append(event.codes.tolist())
                waveforms.append(event.samples)
        if progress_every and len(totals) % progress_every == 0:
            done = len(totals)
            point = format_point(curve_point(totals, state_bytes, active_bytes, done - progress_every, done))
            split = {**stages, **subs}
            medians = ", ".join(
                f"{name} {_stats(values[-progress_every:])['p50_ms']:.2f}" for name, values in split.items() if values
            )
            out(f"so far:{point}; stage p50 (ms): {medians}")
    record = RunRecord(
        "parley",
        totals,
        stages,
        syncs,
        mx.get_peak_memory(),
        session.text_ids,
        session.function_ids,
        codes,
        sub_stages=subs,
        sub_stage_evaluation=sub_evaluations,
        waveforms=waveforms,
        state_bytes=state_bytes,
        active_bytes=active_bytes,
    )
    session.close()
    return record


class Reference:
    """mlx-vlm 0.7.10's model and streaming session on the same weights (benchmark and cross-check only)."""

    def __init__(
        self, raw_config: dict[str, Any], weights: dict[str, Any], quantized: dict[str, tuple[int, int]], tokenizer: Any
    ) -> None:
        from mlx_vlm.models.nemotron_voicechat import Model, ModelConfig
        from mlx_vlm.models.nemotron_voicechat.session import VoiceChatSession

        from engine import load_into

        self.model = Model(ModelConfig.from_dict(raw_config))
        load_into(self.model, weights, quantized)
        self.session_factory = VoiceChatSession(self.model, tokenizer)

    def run(self, samples: np.ndarray, *, seed: int) -> RunRecord:
        import mlx.core as mx

        mx.synchronize()
        mx.reset_peak_memory()
        session = self.session_factory.create_streaming_session(seed=seed, profile=True)
        totals: list[float] = []
        codes: list[list[int]] = []
        waveforms: list[np.ndarray] = []
        for start in range(0, samples.shape[0], FRAME):
            began = time.perf_counter()
            events = session.push_audio(mx.array(samples[start : start + FRAME]), sample_rate=INPUT_SAMPLE_RATE)
            totals.append((time.perf_counter() - began) * 1000.0)
            audio = [event for event in events if event.kind == "audio"]
            codes += [np.array(event.audio_codes).astype(int).tolist() for event in audio]
            waveforms += [np.array(event.samples, dtype=np.float32) for event in audio]
        stages = {name: [getattr(frame, f"{name}_ms") for frame in session.profile.frames] for name in STAGES}
        prompt_steps = len(session._text_tokens) - len(codes)
        return RunRecord(
            "mlx-vlm",
            totals,
            stages,
            [],
            mx.get_peak_memory(),
            session._text_tokens[prompt_steps:],
            session._function_tokens[prompt_steps:],
            codes,
            waveforms=waveforms,
        )


def _parameter_arrays(model: Any) -> list[Any]:
    from mlx.utils import tree_flatten

    leaves: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return [value for _, value in leaves]


def weights_gb(model: Any) -> float:
    """Bytes of a model's parameters (slices of a stacked weight add up to the stacked weight)."""
    return sum(int(value.nbytes) for value in _parameter_arrays(model)) / 1e9


def exclusive_weights_gb(model: Any, other: Any) -> float:
    """Bytes of ``model``'s parameters that ``other`` does not hold as well (the same array object: both
    loaded from one set of weights), e.g. a copy made in one model's own dtype or layout."""
    shared = {id(value) for value in _parameter_arrays(other)}
    return sum(int(value.nbytes) for value in _parameter_arrays(model) if id(value) not in shared) / 1e9


def mlx_version() -> str:
    import mlx.core as mx

    return str(getattr(mx, "__version__", "unknown"))


WAVEFORM_TOLERANCE = 1e-5
"""Largest per-sample difference from the reference that still counts as the same waveform."""


def agreement(ours: RunRecord, ref: RunRecord) -> dict[str, Any]:
    """How many frames have identical outputs: ids and codes equal, and the waveform within
    :data:`WAVEFORM_TOLERANCE` of the reference's."""
    frames = min(len(ours.codes), len(ref.codes))

    def same(a: list[Any], b: list[Any]) -> list[bool]:
        return [x == y for x, y in zip(a[:frames], b[:frames], strict=True)]

    text, function, codes = (
        same(ours.text_ids, ref.text_ids),
        same(ours.function_ids, ref.function_ids),
        same(ours.codes, ref.codes),
    )
    waves = min(len(ours.waveforms), len(ref.waveforms), frames)
    differences = [float(np.max(np.abs(ours.waveforms[i] - ref.waveforms[i]))) for i in range(waves)]
    waveform = [difference <= WAVEFORM_TOLERANCE for difference in differences]
    identical = [all(flags) for flags in zip(text, function, codes, waveform, strict=False)]
    first_diff = next((i for i in range(frames) if ours.codes[i] != ref.codes[i]), None)
    return {
        "frames": frames,
        "text_ids_identical": sum(text),
        "function_ids_identical": sum(function),
        "codes_identical": sum(codes),
        "waveform_identical": sum(waveform),
        "waveform_max_abs": max(differences, default=None),
        "frames_identical": sum(identical),
        "first_code_difference": first_diff,
    }


def compiled_kernels() -> int | None:
    """Kernels MLX has compiled and cached on this machine so far (its JIT cache's files); None if unknown.

    On a GPU these are the fused and generated kernels NVRTC compiles (the minutes a fresh machine
    spends before its first frame); on the CPU, the fused kernels built with the C++ compiler.
    """
    import os
    import tempfile

    import mlx.core as mx

    from engine import KERNEL_CACHE_SETTING, cached_kernels

    kind = "ptx" if mx.default_device().type == mx.gpu else "cpu"
    folder = os.environ.get(KERNEL_CACHE_SETTING) if kind == "ptx" else None
    root = Path(folder) if folder else Path(tempfile.gettempdir()) / "mlx" / mlx_version() / kind
    if not root.is_dir():
        return None
    return cached_kernels(root) if kind == "ptx" else cached_kernels(root, frozenset({".so"}))


def bench(
    *,
    model: Path | None,
    random_size: str | None,
    quantize: int | None,
    seed: int,
    frames: int,
    rounds: int,
    compare: str | None,
    sub_stages: bool,
    curve_every: int | None = None,
    speech_every: int | None = None,
    history: int = 0,
    counters: bool = False,
    numerics: str = "exact",
    stand_in_kernels: bool = False,
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmark (or, with ``counters``, one counting pass instead); returns the JSON-ready report.
    ``stand_in_kernels``: run CUDA's fast path on the CPU, every kernel standing in (:func:`engine.stand_in_kernels`;
    fast numerics, no comparison): its counts, or timed, the host's time a GPU's frame costs on this machine."""
    import mlx.core as mx

    from engine import (
        check_numerics,
        check_report,
        compile_checking,
        compile_enabled,
        device_description,
        kernels_standing_in,
        set_numerics,
    )

    if compare == "exact" and numerics != "fast":
        raise ValueError("--compare exact times --numerics fast against exact; add --numerics fast")
    if stand_in_kernels and (numerics != "fast" or compare is not None):
        raise ValueError(
            "--stand-in-kernels runs CUDA's fast path with meaningless values: use --numerics fast, and no --compare"
        )
    with kernels_standing_in(stand_in_kernels):
        # Compared with exact, the model loads as exact mode loads it (float32 copies made) and switches in place,
        # so that each mode runs as fast as it can: loaded for fast, the row products' weights stay bf16, which
        # exact mode's operations would widen on every call.
        load_numerics = check_numerics("exact" if compare == "exact" else numerics)
        started = time.perf_counter()
        kernels_before = compiled_kernels()
        if model is not None:
            from engine import TextTokenizer, assemble_voicechat, read_runtime_weights

            files, weights, quantized = read_runtime_weights(model)
            raw = files.raw_config
            tokenizer = TextTokenizer.from_file(files.tokenizer_file)
            voicechat = assemble_voicechat(
                files.config,
                weights,
                quantized,
                tokenizer,
                name=files.root.name,
                source=files.root,
                nbytes=files.nbytes,
                numerics=load_numerics,
            )
        else:
            from engine import TextTokenizer, assemble_voicechat, random_weights

            size = random_size or "tiny"
            if size not in RANDOM_SIZES:
                raise ValueError(f"--random must be one of {', '.join(RANDOM_SIZES)}; got {size!r}")
            raw, config, weights, quantized, raw_tokenizer, nbytes = random_weights(size, quantize=quantize, seed=seed)
            tokenizer = TextTokenizer(raw_tokenizer, "random")
            label = f"random-{random_size}-{'bf16' if quantize is None else f'q{quantize}'}-seed{seed}"
            voicechat = assemble_voicechat(
                config, weights, quantized, tokenizer, name=label, nbytes=nbytes, numerics=load_numerics
            )
        mx.eval(voicechat.model.parameters())
        from engine import warm_up

        warm_s = warm_up(voicechat, speech=question_audio())
        if compare == "exact":
            # Fast mode's programs differ where its kernels sit: trace and compile them before the rounds too.
            set_numerics(voicechat, "fast")
            warm_s += warm_up(voicechat, speech=question_audio())
        kernels_warm = compiled_kernels()
        if counters:
            censuses, syncs = count_frames(voicechat, bench_input(frames, speech_every=speech_every), seed=seed)
            report_counters = counters_report(voicechat, censuses, syncs)
            report_counters.update(host_calls(voicechat, bench_input(HOST_CALL_FRAMES[1] + 1), seed=seed))
            report_counters["device"] = (
                "cpu, CUDA's kernels standing in" if stand_in_kernels else device_description()["type"]
            )
            counted = {
                "device": device_description(),
                "mlx_version": mlx_version(),
                "model": voicechat.describe(),
                "frames": frames,
                "seed": seed,
                "compiled": compile_enabled(),
                "counters": report_counters,
            }
            out(f"model {voicechat.name}, {frames} frames counted")
            out(format_counters(report_counters))
            return counted
        if compare not in (None, *COMPARISONS):
            raise ValueError(f"--compare supports {' and '.join(COMPARISONS)}, got {compare!r}")
        reference = Reference(raw, weights, quantized, tokenizer) if compare == "mlx-vlm" else None
        if history and compare:
            raise ValueError(
                "--history makes the outputs differ from the reference's; it cannot be used with --compare"
            )
        setup_s = time.perf_counter() - started
        out(
            f"model {voicechat.name} ({voicechat.nbytes / 1e9:.2f} GB) ready in {setup_s:.1f} s (of which compiling "
            f"{warm_s:.1f} s) on {device_description()['name']}; {frames} frames × {rounds} round(s)"
            + (f", aged by {history} frames of history after the first" if history else "")
            + (
                ", CUDA's kernels standing in: the host's time of a GPU's frame on this machine"
                if stand_in_kernels
                else ""
            )
        )

        samples = bench_input(frames, speech_every=speech_every)
        ours_runs: list[RunRecord] = []
        ref_runs: list[RunRecord] = []
        exact_runs: list[RunRecord] = []
        for round_index in range(rounds):
            ours_runs.append(
                run_ours(
                    voicechat,
                    samples,
                    seed=seed,
                    sub_stages=sub_stages,
                    progress_every=curve_every,
                    history=history,
                    out=out,
                )
            )
            out(f"round {round_index + 1}: parley p50 {_stats(ours_runs[-1].totals_ms[6:])['p50_ms']:.2f} ms")
            if reference is not None:
                ref_runs.append(reference.run(samples, seed=seed))
                out(f"round {round_index + 1}: mlx-vlm p50 {_stats(ref_runs[-1].totals_ms[6:])['p50_ms']:.2f} ms")
            if compare == "exact":
                # The same model switched in place (the weights are shared), then back for the next round.
                set_numerics(voicechat, "exact", release=False)  # fast mode's copies and programs kept for its rounds
                exact_runs.append(run_ours(voicechat, samples, seed=seed, sub_stages=sub_stages, out=out))
                set_numerics(voicechat, "fast")
                out(f"round {round_index + 1}: exact p50 {_stats(exact_runs[-1].totals_ms[6:])['p50_ms']:.2f} ms")

        best = min(ours_runs, key=lambda r: _stats(r.totals_ms[6:])["p50_ms"])
        report: dict[str, Any] = {
            "device": device_description(),
            "mlx_version": mlx_version(),
            "model": voicechat.describe(),
            "frames": frames,
            "rounds": rounds,
            "seed": seed,
            "history_frames": history,
            "kernels_standing_in": stand_in_kernels,
            "warm_up_s": warm_s,
            # Kernels compiled on this machine (JIT cache files): at start, after warm-up, after the rounds.
            # More after the rounds than after warm-up means a frame compiled a kernel: a stall.
            "compiled_kernels": {
                "at_start": kernels_before,
                "after_warm_up": kernels_warm,
                "after_runs": compiled_kernels(),
            },
            "weights_gb": weights_gb(voicechat.model),
            "parley": summarize_run(best, curve_every),
            "parley_rounds": [summarize_run(r) for r in ours_runs],
        }
        if ref_runs:
            ref_best = min(ref_runs, key=lambda r: _stats(r.totals_ms[6:])["p50_ms"])
            report["mlx_vlm"] = summarize_run(ref_best)
            report["mlx_vlm_weights_gb"] = weights_gb(reference.model) if reference is not None else None
            report["mlx_vlm_rounds"] = [summarize_run(r) for r in ref_runs]
            if reference is not None:
                # Each run's peak also counts what only the other model holds (loaded, untouched by the run; the
                # weights both were given are held once): less that, what each would peak at in a process of its own.
                report["peak_alone_gb"] = {
                    "parley": max(r.peak_memory_bytes for r in ours_runs) / 1e9
                    - exclusive_weights_gb(reference.model, voicechat.model),
                    "mlx_vlm": max(r.peak_memory_bytes for r in ref_runs) / 1e9
                    - exclusive_weights_gb(voicechat.model, reference.model),
                }
            report["speedup_p50"] = report["mlx_vlm"]["total"]["p50_ms"] / report["parley"]["total"]["p50_ms"]
            report["speedup_mean"] = report["mlx_vlm"]["total"]["mean_ms"] / report["parley"]["total"]["mean_ms"]
            report["agreement"] = agreement(best, ref_best)
        if exact_runs:
            exact_best = min(exact_runs, key=lambda r: _stats(r.totals_ms[6:])["p50_ms"])
            report["exact"] = summarize_run(exact_best)
            report["exact_rounds"] = [summarize_run(r) for r in exact_runs]
            report["speedup_vs_exact_p50"] = report["exact"]["total"]["p50_ms"] / report["parley"]["total"]["p50_ms"]
            report["speedup_vs_exact_mean"] = report["exact"]["total"]["mean_ms"] / report["parley"]["total"]["mean_ms"]
            report["agreement_with_exact"] = agreement(best, exact_best)
        if compile_checking():
            report["compile_check"] = [asdict(check) for check in check_report()]
        out(format_report(report))
        return report


def format_report(report: dict[str, Any]) -> str:
    rows = [("parley", report["parley"])]
    if "mlx_vlm" in report:
        rows.append(("mlx-vlm", report["mlx_vlm"]))
    if "exact" in report:
        rows.append(("exact", report["exact"]))
    lines = [
        f"{'':10} {'p50':>8} {'p95':>8} {'mean':>8} {'RTF':>6} {'syncs':>6} {'peak GB':>8} "
        f"{'percep':>7} {'rnnt':>7} {'lang':>7} {'tts':>7} {'codec':>7}"
    ]
    for name, run in rows:
        stages = run["stages"]
        syncs = run["host_syncs_per_frame"]
        lines.append(
            f"{name:10} {run['total']['p50_ms']:8.2f} {run['total']['p95_ms']:8.2f} {run['total']['mean_ms']:8.2f} "
            f"{run['realtime_factor']:6.3f} {syncs if syncs is None else round(syncs, 2)!s:>6} "
            f"{run['peak_memory_gb']:8.2f} " + " ".join(f"{stages[s]['p50_ms']:7.2f}" for s in STAGES)
        )
    for name, run in rows:
        windows = ", ".join(f"{w} p50 {s['p50_ms']:.2f}" for w, s in run["windows"].items())
        lines.append(f"{name} windows: {windows}")
    for key, name in (("parley_rounds", "parley"), ("mlx_vlm_rounds", "mlx-vlm"), ("exact_rounds", "exact")):
        rounds = report.get(key, [])
        if len(rounds) > 1:
            each = "; ".join(f"p50 {r['total']['p50_ms']:.2f}, mean {r['total']['mean_ms']:.2f}" for r in rounds)
            lines.append(f"{name} rounds: {each}")
    for key, name in (("parley_rounds", "parley"),):
        stalls = ", ".join(
            f"longest {r['longest_frame']['ms']:.1f} ms (frame {r['longest_frame']['index']}), "
            f"{r['frames_over_twice_p50']} over 2x p50"
            for r in report.get(key, [])
        )
        lines.append(f"{name} stalls per round: {stalls}")
    kernels = report.get("compiled_kernels", {})
    if kernels.get("after_warm_up") is not None:
        lines.append(
            f"compiled kernels cached: {kernels['at_start']} at start, {kernels['after_warm_up']} after warm-up "
            f"({report['warm_up_s']:.1f} s), {kernels['after_runs']} after the runs"
        )
    subs = report["parley"].get("sub_stages", {})
    if subs:
        evaluations = report["parley"].get("sub_stage_evaluation", {})
        lines.append(
            "parley sub-stages (mean ms, evaluated at each boundary; in parentheses the evaluation's part, "
            "the rest building the graph): "
            + ", ".join(
                f"{name} {stats['mean_ms']:.2f} ({evaluations[name]['mean_ms']:.2f})"
                if name in evaluations
                else f"{name} {stats['mean_ms']:.2f}"
                for name, stats in subs.items()
            )
        )
    lines.extend(format_point(point) for point in report["parley"].get("curve", []))
    weights = f"weights in memory: parley {report['weights_gb']:.2f} GB"
    if report.get("mlx_vlm_weights_gb") is not None:
        weights += f", mlx-vlm {report['mlx_vlm_weights_gb']:.2f} GB (peaks above count both models, loaded together)"
    lines.append(weights)
    alone = report.get("peak_alone_gb")
    if alone is not None:
        lines.append(
            f"peak memory alone (each run's peak less what only the other model holds): parley "
            f"{alone['parley']:.2f} GB, mlx-vlm {alone['mlx_vlm']:.2f} GB"
        )
    if "speedup_p50" in report:
        agree = report["agreement"]
        lines.append(
            f"speedup vs mlx-vlm: p50 {report['speedup_p50']:.2f}x, mean {report['speedup_mean']:.2f}x; identical "
            f"frames: text {agree['text_ids_identical']}/{agree['frames']}, function "
            f"{agree['function_ids_identical']}/{agree['frames']}, codes {agree['codes_identical']}/{agree['frames']}, "
            f"waveform {agree['waveform_identical']}/{agree['frames']} (max abs difference "
            f"{agree['waveform_max_abs']:.2g}); all four: {agree['frames_identical']}/{agree['frames']}"
        )
    if "speedup_vs_exact_p50" in report:
        agree = report["agreement_with_exact"]
        lines.append(
            f"fast vs exact (same process, alternating): p50 {report['speedup_vs_exact_p50']:.2f}x, mean "
            f"{report['speedup_vs_exact_mean']:.2f}x; frames equal to exact: text {agree['text_ids_identical']}/"
            f"{agree['frames']}, function {agree['function_ids_identical']}/{agree['frames']}, codes "
            f"{agree['codes_identical']}/{agree['frames']} (first difference: frame {agree['first_code_difference']}), "
            f"waveform within 1e-5 {agree['waveform_identical']}/{agree['frames']}"
        )
    checks = report.get("compile_check")
    if checks is not None:
        differing = [check for check in checks if check["mismatches"]]
        lines.append(
            f"PARLEY_COMPILE=check: {len(checks)} compiled programs run beside their op-by-op form, "
            + (
                "all bit-identical"
                if not differing
                else "differing: "
                + ", ".join(
                    f"{c['name']} ({c['mismatches']}/{c['calls']} calls, max {c['max_abs_difference']:.3g})"
                    for c in differing
                )
            )
        )
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: Path) -> None:
    from engine import write_atomic

    write_atomic(path, json.dumps(report, indent=2) + "\n")
