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
) -> RunResult:
    """Push 16 kHz mono ``samples`` through a new session in ``chunk_samples`` pieces, then flush."""
    from engine import FrameProfiler, Session, summarize

    profiler = FrameProfiler(sub_stages=sub_stages)
    session = Session(voicechat, system_prompt=system_prompt, seed=seed, hooks=profiler)
    events: list[Event] = []
    for start in range(0, samples.shape[0], chunk_samples):
        for event in session.push(samples[start : start + chunk_samples], sample_rate=INPUT_SAMPLE_RATE):
            events.append(event)
            if on_event is not None:
                on_event(event)
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

    result = run_audio(
        voicechat,
        samples,
        system_prompt=args.system_prompt,
        seed=args.seed,
        sub_stages=args.profile_stages,
    )
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
