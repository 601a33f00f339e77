"""Files that hold one thing: no module of the engine or the app grows past the bound (issue 50).

A file this long has usually taken on a second responsibility; split it where the responsibilities part (see
docs/architecture.md for where each kind of change goes), not at a line number.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOST_LINES = 800


def test_no_module_in_the_engine_or_the_app_is_over_the_bound() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in ("engine", "app")
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    assert len(sizes) > 50, "the walk found the modules"
    over = {name: lines for name, lines in sizes.items() if lines > MOST_LINES}
    assert not over, f"modules over {MOST_LINES} lines: {over}"
