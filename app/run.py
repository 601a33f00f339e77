"""``parley run``: stream an audio file through a session as the realtime app does, frame by frame."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.events import (
    AssistantTextDelta,
    AudioChunk,
    Event,
    FrameTiming,
    FunctionDelta,
    ToolCall,
    UserTranscriptDelta,
)
from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE

from .audio_files import read_audio, write_wav
from .files import apply_file_mode
from .messages import ConsentRequest, ToolActivity
from .tools.runner import OfferedTool, ToolRunner, model_specs, tool_results


@dataclass
class RunResult:
    """Everything a run produced, frame-aligned."""

    events: list[Event]
    text_ids: np.ndarray  # int32 (frames,)
    function_ids: np.ndarray  # int32 (frames,)
    audio_codes: np.ndarray  # int32 (frames, 31), as sent to the codec
    audio_codes_raw: np.ndarray  # int32 (frames, 31), as the TTS produced them
    waveform: np.ndarray  # float32, every audio event concatenated (incl. the codec tail)
    sample_rate: int
    user_transcript: str
    assistant_text: str
    function_text: str
    tool_calls: list[ToolCall]
    timings: list[FrameTiming]
    summary: dict[str, Any]
    tool_activities: list[ToolActivity] = field(default_factory=list)  # the answers the model heard (--tools)
    notes: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    checkpoint: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def run_audio(
    voicechat: Any,
    samples: np.ndarray,
    *,
    system_prompt: str | None = None,
    seed: int = 0,
    chunk_samples: int = INPUT_FRAME_SAMPLES,
    sub_stages: bool = False,
    drop_first: int = 5,
    on_event: Callable[[Event], None] | None = None,
    tools: ToolRunner | None = None,
    on_tool: Callable[[ToolActivity], None] | None = None,
) -> RunResult:
    """Push 16 kHz mono ``samples`` through a new session in ``chunk_samples`` pieces, then flush.

    With ``tools`` (a runner whose configuration offers tools), the system prompt offers them and each call is
    answered through the runner before the next piece is pushed (a file has no clock to keep: the model hears
    back at the same frame on every run); ``on_tool`` hears each answer.
    """
    from engine import FrameProfiler, Session, render_tool_prompt, summarize

    offered: list[OfferedTool] = []
    if tools is not None:
        offered, _ = tools.offered()
        if offered:
            system_prompt = render_tool_prompt(system_prompt or "", model_specs(offered))
    profiler = FrameProfiler(sub_stages=sub_stages)
    session = Session(
        voicechat, system_prompt=system_prompt, seed=seed, hooks=profiler, await_tool_results=bool(offered)
    )
    events: list[Event] = []
    activities: list[ToolActivity] = []

    def take(new: list[Event]) -> None:
        for event in new:
            events.append(event)
            if on_event is not None:
                on_event(event)
        calls = [event for event in new if isinstance(event, ToolCall)]
        if tools is not None and calls and session.awaiting_tool_results:
            answers = tools.run(calls, offered).result()  # bounded by the runner's timeouts
            answers = answers[: len(session.pending_tool_calls)]
            for answer in answers:
                activities.append(answer)
                if on_tool is not None:
                    on_tool(answer)
            take(session.answer_tool_calls(tool_results(answers)))

    for start in range(0, samples.shape[0], chunk_samples):
        take(session.push(samples[start : start + chunk_samples], sample_rate=INPUT_SAMPLE_RATE))
    for event in session.flush():
        events.append(event)
        if on_event is not None:
            on_event(event)

    frames = [e for e in events if isinstance(e, AudioChunk) and e.codes.size]
    timings = [e for e in events if isinstance(e, FrameTiming)]
    user = [e for e in events if isinstance(e, UserTranscriptDelta)]
    text = [e for e in events if isinstance(e, AssistantTextDelta)]
    function = [e for e in events if isinstance(e, FunctionDelta)]
    audio = [e.samples for e in events if isinstance(e, AudioChunk)]
    return RunResult(
        events=events,
        text_ids=np.array(session.text_ids, dtype=np.int32),
        function_ids=np.array(session.function_ids, dtype=np.int32),
        audio_codes=np.stack([e.codes for e in frames]).astype(np.int32),
        audio_codes_raw=np.stack([e.codes_raw if e.codes_raw is not None else e.codes for e in frames]).astype(
            np.int32
        ),
        waveform=np.concatenate(audio).astype(np.float32) if audio else np.zeros(0, np.float32),
        sample_rate=session.output_sample_rate,
        user_transcript=user[-1].text if user else "",
        assistant_text=text[-1].text if text else "",
        function_text=function[-1].text if function else "",
        tool_calls=[e for e in events if isinstance(e, ToolCall)],
        tool_activities=activities,
        timings=timings,
        summary=summarize(timings, drop_first=drop_first),
        settings={
            "seed": seed,
            "system_prompt": session.system_prompt,
            "chunk_samples": chunk_samples,
            "sub_stages": sub_stages,
        },
    )


def _event_record(event: Event) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": type(event).__name__}
    for key, value in asdict(event).items():
        if key == "samples":
            record["num_samples"] = int(value.shape[0])
        elif isinstance(value, np.ndarray):
            record[key] = value.tolist()
        else:
            record[key] = value
    return record


def write_dump(result: RunResult, folder: Path) -> list[Path]:
    """The ``--dump`` folder: frame-aligned arrays, every event, and a summary."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "text_ids.npy": result.text_ids,
        "function_ids.npy": result.function_ids,
        "audio_codes.npy": result.audio_codes,
        "audio_codes_raw.npy": result.audio_codes_raw,
        "waveform.npy": result.waveform,
    }
    written = []
    for name, array in arrays.items():
        np.save(folder / name, array)
        written.append(folder / name)
    with (folder / "events.jsonl").open("w", encoding="utf-8") as stream:
        for event in result.events:
            stream.write(json.dumps(_event_record(event)) + "\n")
    summary = {
        "frames": int(result.text_ids.shape[0]),
        "sample_rate": result.sample_rate,
        "waveform_samples": int(result.waveform.shape[0]),
        "user_transcript": result.user_transcript,
        "assistant_text": result.assistant_text,
        "function_text": result.function_text,
        "tool_calls": [asdict(call) for call in result.tool_calls],
        "checkpoint": result.checkpoint,
        "settings": result.settings,
        "input_notes": result.notes,
        "profile": result.summary,
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    written += [folder / "events.jsonl", folder / "summary.json"]
    return written


def _tool_runner(path: Path | None, out: Callable[[str], None]) -> ToolRunner | None:
    """The runner of ``--tools PATH`` (a ``tools.json``), or None. ``parley run`` cannot ask: a tool whose consent
    is "ask" is denied, and says so."""
    if path is None:
        return None
    from .tools.config import load_tools_config

    loaded = load_tools_config(path)
    for warning in loaded.warnings:
        out(f"tools: {warning}")
    if not loaded.config.offer_tools:
        out(f"tools: {path} does not offer tools (offer_tools is false)")
        return None
    holder: list[ToolRunner] = []

    def post(message: object) -> None:
        if isinstance(message, ConsentRequest) and holder:
            out(
                f"tools: {message.tool} asks for consent; parley run cannot ask, so it is denied "
                "(consent 'always' runs it)"
            )
            holder[0].answer_consent(message.request_id, False)

    holder.append(ToolRunner(loaded.config, post=post))
    return holder[0]


def run_command(args: Any, out: Callable[[str], None] = print) -> int:
    """The body of ``parley run``; returns the exit code."""
    from engine import build_profile_log, load_voicechat, write_profile_log

    audio = read_audio(args.audio)
    for note in audio.notes:
        out(f"input: {note}")
    extra = np.zeros(round(args.extra_seconds * INPUT_SAMPLE_RATE), dtype=np.float32)
    samples = np.concatenate([audio.samples, extra])
    started = time.perf_counter()
    voicechat = load_voicechat(args.model, numerics=getattr(args, "numerics", "exact"))
    load_seconds = time.perf_counter() - started
    bits = voicechat.quantization_bits
    out(f"model: {voicechat.name} ({'bf16' if bits is None else f'{bits}-bit'}), loaded in {load_seconds:.1f} s")
    # The session pads the last partial frame (Session.flush), so it counts: the same number the profile holds.
    frames = -(-samples.shape[0] // INPUT_FRAME_SAMPLES)
    out(f"input: {audio.seconds:.2f} s + {args.extra_seconds:g} s of silence = {frames} frames")

    runner = _tool_runner(getattr(args, "tools", None), out)
    try:
        result = run_audio(
            voicechat,
            samples,
            system_prompt=args.system_prompt,
            seed=args.seed,
            sub_stages=args.profile_stages,
            tools=runner,
            on_tool=lambda a: out(
                f"[tool] {a.tool or '(unreadable call)'}: {a.decision}; {'ok' if a.ok else 'failed'}: {a.content}"
            ),
        )
    finally:
        if runner is not None:
            runner.close()
    result.notes, result.load_seconds, result.checkpoint = audio.notes, load_seconds, voicechat.describe()

    out(f"[user] {result.user_transcript}")
    out(f"[assistant] {result.assistant_text}")
    if result.function_text:
        out(f"[function] {result.function_text}")
    for call in result.tool_calls:
        if call.error is None:
            out(f"[tool call] {call.name}({json.dumps(call.arguments)})")
        else:
            out(f"[tool call] unparsed ({call.error}): {call.raw}")
    if args.output_audio:
        write_wav(args.output_audio, result.waveform, result.sample_rate)
        out(f"wrote {args.output_audio} ({result.waveform.shape[0] / result.sample_rate:.2f} s at 22.05 kHz)")
    if args.dump:
        write_dump(result, Path(args.dump))
        out(f"wrote {args.dump}/")
    if args.profile_json:
        log = build_profile_log(result.timings, checkpoint=result.checkpoint, settings=result.settings)
        apply_file_mode(write_profile_log(log, args.profile_json))
        out(f"wrote {args.profile_json}")
    if args.profile or args.profile_stages:
        out(json.dumps(result.summary, indent=2))
    return 0
