"""The bundle's entry script: what the ``parley`` console script runs (``ui.main:main``)."""

from __future__ import annotations

import multiprocessing
import sys

from ui.main import main

if __name__ == "__main__":
    # Nothing in Parley starts processes, but a library that does would re-run the app in each
    # child of a frozen build without this.
    multiprocessing.freeze_support()
    sys.exit(main())
