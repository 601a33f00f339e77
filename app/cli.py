"""The ``parley`` command line: every subcommand except the GUI itself.

``parley`` with no subcommand opens the window (``ui.main`` handles that and hands
everything else to :func:`run_command`), so nothing here imports Qt.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.bench import COMPARISONS
from app.realtime_events import DEFAULT_HOST, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PORT, PATH, TOKEN_ENV
from app.tools.config import default_tools_path
from engine import RANDOM_SIZES
from engine.timeline import CONVERSATION_FRAMES, FRAME_SECONDS

NUMERICS = ("exact", "fast")  # engine.numerics.NUMERICS, without importing MLX to build the parser
NUMERICS_HELP = (
    "exact: the reference's arithmetic, bit for bit (default); fast: fused GPU kernels reading bf16 weights, "
    "slightly different rounding (docs/numerics.md)"
)


def _quantize_arg(value: str) -> int | None:
    if value.lower() in ("none", "bf16", "0"):
        return None
    if value in ("4", "8"):
        return int(value)
    raise argparse.ArgumentTypeError("quantize must be none, 4 or 8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parley",
        description="Push-to-talk voice assistant running NemotronLabs VoiceChat 11B on MLX. "
        "Without a command, opens the app window.",
    )
    parser.add_argument("--self-test", action="store_true", help="run the pipeline on the demo checkpoint and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    make = commands.add_parser(
        "make-checkpoint",
        help="write a random-weight checkpoint in the published layout",
        description="Write a seeded random-weight VoiceChat checkpoint in the exact layout of "
        "mlx-community/NemotronLabs-VoiceChat-11B-{bf16,8bit,4bit}.",
    )
    make.add_argument("out", type=Path, help="target folder (must be empty or absent)")
    make.add_argument("--size", choices=RANDOM_SIZES, default="tiny")
    make.add_argument("--quantize", type=_quantize_arg, default=None, metavar="{none,4,8}")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--overwrite", action="store_true", help="replace a non-empty target folder")

    run = commands.add_parser(
        "run",
        help="stream an audio file through the model and print what it said",
        description="Stream an audio file through a session in 80 ms frames, as the app does, and print the "
        "user transcript, the assistant's text and tool calls.",
    )
    run.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    run.add_argument("--audio", required=True, type=Path, help="input audio (any rate/channels; resampled)")
    run.add_argument("--system-prompt", default=None)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--extra-seconds", type=float, default=3.0, help="silence appended so the model can answer")
    run.add_argument("--profile", action="store_true", help="print the profile summary as JSON")
    run.add_argument("--profile-stages", action="store_true", help="time sub-stages too (forces extra evaluation)")
    run.add_argument("--profile-json", type=Path, help="write the session profile log (JSON)")
    run.add_argument("--output-audio", type=Path, help="write the 22.05 kHz answer as WAV")
    run.add_argument("--dump", type=Path, help="write frame-aligned ids, codes, waveform and events to a folder")
    run.add_argument("--numerics", choices=NUMERICS, default="exact", help=NUMERICS_HELP)
    run.add_argument(
        "--tools",
        type=Path,
        nargs="?",
        const=default_tools_path(),
        metavar="TOOLS_JSON",
        help="offer the tools of this tools.json (without a path: the app's, in its config folder) and answer the "
        "model's calls through them; 'ask' consent is denied here (nobody to ask)",
    )

    bench = commands.add_parser(
        "bench",
        help="measure frame times (optionally side by side with mlx-vlm)",
        description="Benchmark the streaming session frame by frame on a checkpoint folder or on seeded random "
        "weights made in memory.",
    )
    source = bench.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, help="checkpoint folder")
    source.add_argument(
        "--random",
        choices=RANDOM_SIZES,
        help="random weights made in memory (structure: full layer counts, tiny widths; for --counters)",
    )
    bench.add_argument("--quantize", type=_quantize_arg, default=4, metavar="{none,4,8}", help="with --random")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--frames", type=int, default=100, help="80 ms frames per run (speech, then silence)")
    bench.add_argument("--rounds", type=int, default=1, help="alternating rounds (best round is reported)")
    bench.add_argument(
        "--compare",
        choices=COMPARISONS,
        help="also run, alternating round by round in this process: mlx-vlm (the reference port on the same "
        "weights) or exact (with --numerics fast: the same model switched to exact numerics)",
    )
    bench.add_argument("--sub-stages", action="store_true", help="time sub-stages (forces extra evaluation)")
    bench.add_argument(
        "--curve-every", type=int, metavar="N", help="report frame time and memory per block of N frames (long runs)"
    )
    bench.add_argument("--speech-every", type=int, metavar="N", help="ask the question again every N frames")
    bench.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="N",
        help="after the first frame, age the conversation by N frames of random attention history "
        "(times a late frame without running the whole conversation; outputs are not meaningful)",
    )
    bench.add_argument(
        "--counters",
        action="store_true",
        help="count what each frame evaluates (primitives, kernels, host syncs, weight bytes at full size) "
        "instead of timing it; without --model or --random, on --random structure",
    )
    bench.add_argument("--numerics", choices=NUMERICS, default="exact", help=NUMERICS_HELP)
    bench.add_argument(
        "--stand-in-kernels",
        action="store_true",
        help="with --numerics fast on a CPU: run a CUDA GPU's frame, each custom kernel standing in as one primitive "
        "(values meaningless): with --counters what it launches and reads, else the host's time for it here",
    )
    bench.add_argument("--json", type=Path, help="write the full report as JSON")

    drift = commands.add_parser(
        "drift",
        help="measure how far fast numerics drift from exact (per network and end to end)",
        description="Load seeded random weights in both numerics modes and compare them: teacher-forced per "
        "network (LLM logits, TTS hidden states and codes, codec waveform) and free-running.",
    )
    drift.add_argument("--random", choices=RANDOM_SIZES, default="tiny", help="random weights made in memory")
    drift.add_argument("--quantize", type=_quantize_arg, default=4, metavar="{none,4,8}")
    drift.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="weight and sampling seeds")
    drift.add_argument("--frames", type=int, default=60, help="80 ms frames per seed (speech, then silence)")
    drift.add_argument("--system-prompt", default="", help="prefilled before the first frame in both modes")
    drift.add_argument("--json", type=Path, help="write the report as JSON")

    serve = commands.add_parser(
        "serve",
        help=f"serve the model over mlx-vlm's realtime WebSocket API ({PATH})",
        description=f"Serve a checkpoint over a local realtime WebSocket API that speaks mlx-vlm's {PATH} "
        "events (PCM16 in at 16 kHz, out at 22.05 kHz), one conversation at a time.",
    )
    serve.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    serve.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (not loopback: needs --token)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (0: any free port)")
    serve.add_argument(
        "--token",
        default=None,
        help=f"required of clients (Authorization: Bearer TOKEN, or ?token=TOKEN); default: ${TOKEN_ENV}",
    )
    serve.add_argument(
        "--numerics",
        choices=NUMERICS,
        default="exact",
        help=NUMERICS_HELP + "; session.update may choose per conversation",
    )
    serve.add_argument(
        "--profile-dir", type=Path, help="where each conversation's profile log goes (default: the app's log folder)"
    )
    serve.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="larger client messages close the connection (code 1009)",
    )
    serve.add_argument(
        "--max-seconds",
        type=float,
        default=CONVERSATION_FRAMES * FRAME_SECONDS,
        help="the longest conversation (session.update's max_streaming_seconds may ask for less)",
    )
    serve.add_argument("--no-warm-up", action="store_true", help="skip tracing the per-frame programs at start")
    return parser


def _make_checkpoint(args: argparse.Namespace) -> int:
    from engine import make_checkpoint

    path = make_checkpoint(
        args.out,
        size=args.size,
        quantize=args.quantize,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=lambda message: print(message, flush=True),
    )
    total = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    print(
        f"{path}: {args.size} checkpoint, {'bf16' if args.quantize is None else f'{args.quantize}-bit'}, "
        f"seed {args.seed}, {total / 1e9:.3f} GB of weights"
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    from .run import run_command as run_file

    if args.extra_seconds < 0:
        raise ValueError("--extra-seconds must not be negative")
    return run_file(args)


def _bench(args: argparse.Namespace) -> int:
    from .bench import bench, write_report

    if args.model is None and args.random is None:
        if not args.counters:
            raise ValueError("say what to benchmark: --model FOLDER or --random tiny|structure|full")
        args.random = "structure"
    if args.frames < 8 or args.rounds < 1:
        raise ValueError("--frames must be at least 8 and --rounds at least 1")
    if args.history < 0:
        raise ValueError("--history must not be negative")
    for option in ("curve_every", "speech_every"):
        value = getattr(args, option)
        if value is not None and not 1 <= value <= args.frames:
            raise ValueError(f"--{option.replace('_', '-')} must be between 1 and --frames ({args.frames})")
    report = bench(
        model=args.model,
        random_size=args.random,
        quantize=args.quantize,
        seed=args.seed,
        frames=args.frames,
        rounds=args.rounds,
        compare=args.compare,
        sub_stages=args.sub_stages,
        curve_every=args.curve_every,
        speech_every=args.speech_every,
        history=args.history,
        counters=args.counters,
        numerics=args.numerics,
        stand_in_kernels=args.stand_in_kernels,
    )
    if args.json:
        write_report(report, args.json)
        print(f"wrote {args.json}")
    return 0


def _drift(args: argparse.Namespace) -> int:
    from .bench import write_report
    from .drift import measure_drift

    if args.frames < 8:
        raise ValueError("--frames must be at least 8")
    report = measure_drift(
        size=args.random,
        quantize=args.quantize,
        seeds=args.seeds,
        frames=args.frames,
        system_prompt=args.system_prompt,
    )
    if args.json:
        write_report(report, args.json)
        print(f"wrote {args.json}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .serve import serve_command

    return serve_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed non-GUI command; returns the process exit code."""
    from engine.errors import EngineError

    from .audio_files import AudioFileError

    if args.self_test:
        from .selftest import self_test_command

        return self_test_command()
    handlers = {"make-checkpoint": _make_checkpoint, "run": _run, "bench": _bench, "drift": _drift, "serve": _serve}
    handler = handlers.get(args.command)
    if handler is None:
        raise SystemExit(f"parley: unknown command {args.command!r}")
    if args.command != "make-checkpoint":
        from .kernels import prepare_this_device

        prepare_this_device()  # before the first load compiles anything (on CUDA)
    try:
        return handler(args)
    except FileExistsError as exc:
        print(f"parley: {exc} (use --overwrite to replace it)", file=sys.stderr)
        return 2
    except (EngineError, AudioFileError, ValueError) as exc:  # app.serve.ServeError is a ValueError
        print(f"parley: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 2
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
