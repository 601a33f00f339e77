"""tools.json (app/tools/config.py): one schema for the app and the CLI, loaded without ever failing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.tools.config import (
    ServerConfig,
    ToolEntry,
    ToolsConfig,
    ToolsConfigError,
    load_tools_config,
    save_tools_config,
)
from tests.conftest import file_mode


def sample() -> ToolsConfig:
    notes = ServerConfig(
        "notes",
        ("uvx", "mcp-server-notes"),
        env={"NOTES_DIR": "/home/me/notes"},
        timeout_s=10.0,
        tools=(ToolEntry("read_note", "Read a note.", read_only=True), ToolEntry("delete_note", consent="never")),
    )
    remote = ServerConfig("remote", url="http://localhost:8000/mcp", enabled=False)
    return ToolsConfig(True, {"set_timer": ToolEntry("set_timer", enabled=False, consent="always")}, (notes, remote))


def test_a_configuration_survives_the_file_and_the_file_is_private(tmp_path: Path, permissive_umask) -> None:
    path = save_tools_config(sample(), tmp_path / "tools.json")
    assert file_mode(path) == 0o600, "env may hold a server's secrets"
    loaded = load_tools_config(path)
    assert loaded.warnings == () and loaded.config == sample()
    data = json.loads(path.read_text())
    assert data["format"] == "parley-tools/1" and data["servers"][1] == {
        "name": "remote",
        "url": "http://localhost:8000/mcp",
        "env": {},
        "enabled": False,
        "timeout_s": 15.0,
        "tools": {},
    }
    notes = loaded.config.server("notes")
    assert (
        notes is not None and notes.tool("read_note").policy == "always" and notes.tool("delete_note").policy == "never"
    )
    assert notes.where == "uvx mcp-server-notes"


def test_no_file_is_tools_off_and_a_broken_one_is_set_aside(tmp_path: Path) -> None:
    assert load_tools_config(tmp_path / "absent.json").config == ToolsConfig()
    broken = tmp_path / "tools.json"
    broken.write_text("{not json")
    loaded = load_tools_config(broken)
    assert loaded.config == ToolsConfig() and "tools are off" in loaded.warnings[0]
    assert (tmp_path / "tools.json.corrupt").read_text() == "{not json" and not broken.exists()
    broken.write_text("[]")  # broken again: the file kept aside before is not replaced
    assert "tools are off" in load_tools_config(broken).warnings[0]
    (again,) = tmp_path.glob("tools.json.corrupt-*")
    assert again.read_text() == "[]" and (tmp_path / "tools.json.corrupt").read_text() == "{not json"


def test_a_bad_entry_is_left_out_with_a_warning_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    data = sample().to_dict()
    data["servers"] += [
        {"name": "both", "command": ["x"], "url": "http://y"},
        {"name": "notes", "command": ["again"]},
        {"name": "slow", "command": ["x"], "timeout_s": 1e9},
    ]
    data["builtin"]["current_time"] = {"consent": "sometimes"}
    path.write_text(json.dumps(data))
    loaded = load_tools_config(path)
    assert [s.name for s in loaded.config.servers] == ["notes", "remote"]
    text = " | ".join(loaded.warnings)
    assert "either a command or a URL" in text and "name 'notes' is taken" in text and "timeout_s" in text
    assert "builtin 'current_time'" in text and "sometimes" in text
    assert loaded.config.builtin["set_timer"].enabled is False


def test_listing_again_keeps_the_users_choices() -> None:
    server = sample().server("notes")
    assert server is not None
    relisted = server.with_listed((ToolEntry("delete_note", "Delete."), ToolEntry("new_tool", "New.")))
    assert [(t.name, t.consent, t.description) for t in relisted.tools] == [
        ("delete_note", "never", "Delete."),
        ("new_tool", None, "New."),
    ]


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: ToolEntry("bad name"), "plain ASCII name"),
        (lambda: ToolEntry("x", consent="maybe"), "consent"),
        (lambda: ServerConfig("s", url="ftp://x"), "http"),
        (lambda: ServerConfig("s", ("x",), env={"1BAD": "v"}), "env"),
    ],
)
def test_values_are_checked(make, problem: str) -> None:
    with pytest.raises(ToolsConfigError, match=problem):
        make()
