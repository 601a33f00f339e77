"""The ``parley`` entry point: the app window, or a command-line subcommand.

Subcommands (``make-checkpoint``, ``run``, ``bench``, ``--self-test``) run without
importing Qt, so they work on machines with no display.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from app.cli import build_parser, run_command
    from app.kernels import point_kernel_cache

    point_kernel_cache()  # before anything asks MLX for a device (app.kernels)

    args = build_parser().parse_args(argv)
    if args.command is not None or args.self_test:
        return run_command(args)
    from ui.app_window import run_gui  # Qt is imported only on this path

    return run_gui()


if __name__ == "__main__":
    sys.exit(main())
