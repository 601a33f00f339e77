"""``parley run`` says as many frames as its profile counts, and writes files like the app does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.cli import main as parley
from app.files import FILE_MODE
from engine.profile_log import validate_profile_log


def test_the_printed_frame_count_is_the_profiles(
    tiny_q4: Path, question_wav: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile, answer = tmp_path / "profile.json", tmp_path / "answer.wav"
    command = ["run", "--model", str(tiny_q4), "--audio", str(question_wav), "--extra-seconds", "0.5"]
    assert parley([*command, "--profile-json", str(profile), "--output-audio", str(answer)]) == 0
    printed = re.search(r"= (\d+) frames", capsys.readouterr().out)
    assert printed is not None
    log = json.loads(profile.read_text())
    assert validate_profile_log(log) == [], "the offline run's profile follows the app's schema"
    frames = log["frames"]
    print(f"printed {printed.group(1)} frames; the profile holds {len(frames)}")
    assert int(printed.group(1)) == len(frames)
    assert profile.stat().st_mode & 0o777 == answer.stat().st_mode & 0o777 == FILE_MODE
