"""Conversation history (app/history.py): saving, listing, loading, exporting, pruning, damage, atomicity."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from app import history as history_module
from app.history import (
    DIR_MODE,
    ConversationHistory,
    ConversationRecord,
    HistoryError,
    TranscriptLine,
    default_history_dir,
)
from tests.conftest import file_mode

T0 = datetime(2026, 11, 30, 20, 15, 0, tzinfo=UTC)


def record(
    started: datetime = T0, seconds: float = 1.0, words: str = "What is the capital of France?", *, profile: bool = True
) -> ConversationRecord:
    rng = np.random.default_rng(int(started.timestamp()))
    return ConversationRecord(
        started=started,
        transcript=[
            TranscriptLine("user", 0.25, words),
            TranscriptLine("assistant", 0.5 * seconds, "Paris."),
            TranscriptLine("tool call", 0.8 * seconds, "weather(city='Paris')"),
        ],
        user_audio=(rng.standard_normal(int(16_000 * seconds)) * 0.1).astype(np.float32),
        assistant_audio=(rng.standard_normal(int(22_050 * seconds)) * 0.1).astype(np.float32),
        profile={"schema": "parley-profile/1", "frames": [{"index": 0, "total_ms": 41.5}]} if profile else None,
    )


def test_default_folder_is_under_the_user_data_folder() -> None:
    from app.paths import data_dir

    assert default_history_dir() == data_dir() / "history"


def test_a_saved_conversation_is_listed_and_loads_back(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path / "history")
    saved = record(seconds=3.0)
    entry = history.save(saved)
    assert entry is not None
    assert entry.started == T0
    assert entry.duration_s == pytest.approx(3.0)
    assert entry.first_words == "What is the capital of France?"
    assert entry.has_profile
    listing = history.entries()
    assert [e.id for e in listing.entries] == [entry.id] and not listing.damaged

    loaded = history.load(entry.id)
    assert loaded.transcript == list(saved.transcript)
    assert (loaded.user_rate, loaded.assistant_rate) == (16_000, 22_050)
    np.testing.assert_allclose(loaded.user_audio, saved.user_audio, atol=1 / 32768 + 1e-7)  # 16-bit WAV
    np.testing.assert_allclose(loaded.assistant_audio, saved.assistant_audio, atol=1 / 32768 + 1e-7)
    assert loaded.profile == saved.profile
    transcript = (entry.path / "transcript.md").read_text(encoding="utf-8")
    assert "**[00:00.25] user:** What is the capital of France?" in transcript


@pytest.mark.usefixtures("permissive_umask")
def test_the_history_is_private_whatever_the_umask(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path / "history")
    entry = history.save(record())
    assert entry is not None
    assert file_mode(tmp_path / "history") == file_mode(entry.path) == DIR_MODE == 0o700
    names = {path.name for path in entry.path.iterdir()}
    assert names == {"conversation.json", "user.wav", "assistant.wav", "transcript.md", "profile.json"}
    for path in entry.path.iterdir():
        assert file_mode(path) == 0o600, path.name


def test_a_history_left_readable_by_an_older_version_is_made_private_when_opened(tmp_path: Path) -> None:
    entry = ConversationHistory(tmp_path / "history").save(record())
    assert entry is not None
    for path in (tmp_path / "history", entry.path):
        path.chmod(0o755)
    for path in entry.path.iterdir():
        path.chmod(0o644)

    ConversationHistory(tmp_path / "history")

    assert file_mode(tmp_path / "history") == file_mode(entry.path) == 0o700
    assert {file_mode(path) for path in entry.path.iterdir()} == {0o600}


def test_newest_first_with_date_duration_and_first_words(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path)
    long_question = "Tell me " + "more and more " * 10 + "about Paris"
    history.save(record(T0, 1.0, "first"))
    history.save(record(T0 + timedelta(hours=2), 2.0, long_question, profile=False))
    history.save(record(T0 + timedelta(minutes=5), 1.5, "second"))
    entries = history.entries().entries
    assert [e.first_words for e in entries][1:] == ["second", "first"]
    assert [e.started for e in entries] == [T0 + timedelta(hours=2), T0 + timedelta(minutes=5), T0]
    assert [e.duration_s for e in entries] == pytest.approx([2.0, 1.5, 1.0])
    assert entries[0].first_words.endswith("…") and len(entries[0].first_words) <= 81
    assert long_question.startswith(entries[0].first_words[:-1])
    assert not entries[0].has_profile


def test_saving_off_or_nothing_to_save_writes_nothing(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path / "history", enabled=False)
    assert history.save(record()) is None
    assert not (tmp_path / "history").exists()
    history.enabled = True
    empty = ConversationRecord(T0, [], np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert history.save(empty) is None
    assert history.entries().entries == []


def test_the_oldest_are_pruned_beyond_the_size_cap(tmp_path: Path) -> None:
    one = ConversationHistory(tmp_path / "probe")
    probe = one.save(record())
    assert probe is not None
    size = probe.size_bytes
    history = ConversationHistory(tmp_path / "history", max_bytes=3 * size + size // 2)  # room for three
    ids = []
    for minute in range(5):
        entry = history.save(record(T0 + timedelta(minutes=minute)))
        assert entry is not None
        ids.append(entry.id)
    assert [e.id for e in history.entries().entries] == ids[:1:-1]  # the newest three, newest first
    assert history.total_bytes() <= history.max_bytes

    history.max_bytes = size // 2  # smaller than one conversation: prune() empties the history
    assert history.prune() == ids[2:]
    assert history.entries().entries == []


def test_the_conversation_just_saved_is_kept_even_when_alone_it_is_over_the_cap(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path, max_bytes=1000)
    history.save(record(T0))
    newest = history.save(record(T0 + timedelta(minutes=1)))
    assert newest is not None
    assert [e.id for e in history.entries().entries] == [newest.id]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate-manifest", "conversation.json: damaged"),
        ("remove-manifest", "conversation.json: missing"),
        ("remove-wav", "user.wav: missing"),
        ("truncate-wav", "assistant.wav: "),
        ("foreign-manifest", "not a Parley conversation"),
        ("manifest-without-transcript", "incomplete"),
    ],
)
def test_a_damaged_entry_is_skipped_with_a_warning_and_the_others_stay_readable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str, reason: str
) -> None:
    history = ConversationHistory(tmp_path)
    older = history.save(record(T0))
    broken = history.save(record(T0 + timedelta(minutes=1)))
    newer = history.save(record(T0 + timedelta(minutes=2)))
    assert older and broken and newer
    manifest = broken.path / "conversation.json"
    if damage == "truncate-manifest":
        manifest.write_bytes(manifest.read_bytes()[:40])
    elif damage == "remove-manifest":
        manifest.unlink()
    elif damage == "remove-wav":
        (broken.path / "user.wav").unlink()
    elif damage == "truncate-wav":
        wav = broken.path / "assistant.wav"
        wav.write_bytes(wav.read_bytes()[:1000])
    elif damage == "foreign-manifest":
        manifest.write_text(json.dumps({"format": "something-else/9"}))
    else:
        content = json.loads(manifest.read_text())
        del content["transcript"]
        manifest.write_text(json.dumps(content))

    with caplog.at_level(logging.WARNING, logger="app.history"):
        listing = history.entries()
    assert [e.id for e in listing.entries] == [newer.id, older.id]
    assert [d.id for d in listing.damaged] == [broken.id]
    assert reason in listing.damaged[0].reason
    assert any("damaged history entry" in message for message in caplog.messages)
    assert history.load(newer.id).transcript  # the others load
    with pytest.raises(HistoryError, match=reason.split(":")[0]):
        history.load(broken.id)
    with pytest.raises(HistoryError):
        history.export(broken.id, tmp_path / "export")
    history.delete(broken.id)  # a damaged entry can still be removed
    assert not history.entries().damaged


def set_field(manifest: dict[str, object], key: str, value: object) -> None:
    manifest[key] = value


HOSTILE_MANIFESTS = {
    "started as a number": (lambda m: set_field(m, "started", 20261130), "started is missing or not text"),
    "started not a date": (lambda m: set_field(m, "started", "yesterday"), "started is not a date"),
    "duration as text": (lambda m: set_field(m, "duration_s", "3 s"), "duration_s is missing"),
    "duration of 400 digits": (lambda m: set_field(m, "duration_s", 10**400), "duration_s is missing"),
    "files as a list": (lambda m: set_field(m, "files", ["user.wav"]), "files is missing or not an object"),
    "file name outside the entry": (
        lambda m: set_field(m, "files", {**m["files"], "../../secret": 10}),  # type: ignore[dict-item]
        "which is not a file name in the entry",
    ),
    "file name with NUL": (
        lambda m: set_field(m, "files", {**m["files"], "user\0.wav": 10}),  # type: ignore[dict-item]
        "which is not a file name in the entry",
    ),
    "size as text": (
        lambda m: set_field(m, "files", {**m["files"], "user.wav": "46 MB"}),  # type: ignore[dict-item]
        "the size of user.wav is not a byte count",
    ),
    "transcript line not an object": (lambda m: set_field(m, "transcript", ["hello"]), "transcript line 1"),
    "transcript time as text": (
        lambda m: set_field(m, "transcript", [{"role": "user", "seconds": "0.25", "text": "hi"}]),
        "transcript line 1",
    ),
}


@pytest.mark.parametrize("damage", HOSTILE_MANIFESTS, ids=list(HOSTILE_MANIFESTS))
def test_a_manifest_with_a_hostile_field_is_listed_as_damaged_and_hides_nothing(tmp_path: Path, damage: str) -> None:
    edit, reason = HOSTILE_MANIFESTS[damage]
    history = ConversationHistory(tmp_path)
    older = history.save(record(T0))
    broken = history.save(record(T0 + timedelta(minutes=1)))
    newer = history.save(record(T0 + timedelta(minutes=2)))
    assert older and broken and newer
    manifest_path = broken.path / "conversation.json"
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    kept = json.dumps(manifest)
    manifest_path.write_text(kept)

    listing = history.entries()

    assert [e.id for e in listing.entries] == [newer.id, older.id]
    assert [d.id for d in listing.damaged] == [broken.id] and reason in listing.damaged[0].reason
    assert manifest_path.read_text() == kept, "the damaged manifest is kept as it was"
    with pytest.raises(HistoryError, match="incomplete"):
        history.load(broken.id)


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe garbage", b"[" * 100_000 + b"]" * 100_000, b'{"duration_s": ' + b"9" * 5000 + b"}", b"null"],
    ids=["not-utf8", "nested-100000-deep", "5000-digit-number", "null"],
)
def test_a_garbage_manifest_is_listed_as_damaged_and_hides_nothing(tmp_path: Path, content: bytes) -> None:
    history = ConversationHistory(tmp_path)
    good = history.save(record(T0))
    broken = history.save(record(T0 + timedelta(minutes=1)))
    assert good and broken
    (broken.path / "conversation.json").write_bytes(content)

    listing = history.entries()

    assert [e.id for e in listing.entries] == [good.id]
    assert [d.id for d in listing.damaged] == [broken.id]
    assert (broken.path / "conversation.json").read_bytes() == content


def test_a_manifest_without_first_words_is_listed_with_them_from_its_transcript(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path)
    entry = history.save(record(T0, words="Where is the Louvre?"))
    assert entry is not None
    manifest_path = entry.path / "conversation.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["first_words"]
    manifest_path.write_text(json.dumps(manifest))

    listing = history.entries()

    assert [(e.id, e.first_words) for e in listing.entries] == [(entry.id, "Where is the Louvre?")]
    assert not listing.damaged


def test_an_interrupted_save_leaves_no_entry_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = ConversationHistory(tmp_path)
    kept = history.save(record(T0))
    assert kept is not None
    import soundfile

    real_write = soundfile.write
    calls = []

    def write_then_fail(path: str, *args: object, **kwargs: object) -> None:
        calls.append(path)
        if len(calls) == 2:  # the user's WAV is written, then the disk fills up
            raise OSError(28, "No space left on device")
        real_write(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(soundfile, "write", write_then_fail)
    with pytest.raises(HistoryError, match="No space left on device"):
        history.save(record(T0 + timedelta(minutes=1)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.id]  # no entry, no partial folder
    assert [e.id for e in history.entries().entries] == [kept.id]


def test_a_save_killed_before_its_rename_is_invisible_and_cleaned_up_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = ConversationHistory(tmp_path)

    class Killed(BaseException):
        """The process dies: no exception handler of ours would run for SIGKILL, so simulate none."""

    real_rename = os.rename

    def die_at_commit(source: str | Path, target: str | Path) -> None:
        raise Killed

    monkeypatch.setattr(os, "rename", die_at_commit)
    monkeypatch.setattr(history_module.shutil, "rmtree", lambda *args, **kwargs: None)  # nothing cleans up
    with pytest.raises(Killed):
        history.save(record(T0))
    monkeypatch.undo()
    assert os.rename is real_rename
    partials = [p for p in tmp_path.iterdir() if p.name.startswith(".partial-")]
    assert len(partials) == 1 and (partials[0] / "conversation.json").exists()  # fully written, not committed
    assert history.entries().entries == [] and history.entries().damaged == []

    history.prune()
    assert partials[0].exists()  # too recent: it could be a save in progress
    old = partials[0].stat().st_mtime - history_module.STALE_PARTIAL_S - 60
    os.utime(partials[0], (old, old))
    history.prune()
    assert not partials[0].exists()


def test_export_copies_one_entry_into_a_new_folder(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path / "history")
    entry = history.save(record())
    assert entry is not None
    destination = tmp_path / "Desktop"
    first = history.export(entry.id, destination)
    second = history.export(entry.id, destination)
    assert {p.name for p in first} == {"user.wav", "assistant.wav", "transcript.md", "profile.json"}
    assert first[0].parent != second[0].parent and second[0].parent.name.endswith("(2)")
    for path in first:
        assert path.read_bytes() == (entry.path / path.name).read_bytes()
        assert file_mode(path) == 0o600  # an export holds the same recordings: private too
    assert file_mode(first[0].parent) == 0o700
    assert not [p for p in destination.iterdir() if p.name.startswith(".")]


def test_ids_cannot_reach_outside_the_history_folder(tmp_path: Path) -> None:
    history = ConversationHistory(tmp_path / "history")
    (tmp_path / "precious").mkdir()
    for bad in ("../precious", "..", "/etc", "20261130-201500-zzzzzz"):
        with pytest.raises(HistoryError):
            history.delete(bad)
    assert (tmp_path / "precious").exists()


def test_an_unwritable_folder_is_an_error_in_words(tmp_path: Path) -> None:
    blocker = tmp_path / "history"
    blocker.write_text("a file where the folder should be")
    history = ConversationHistory(blocker)
    with pytest.raises(HistoryError, match="Could not create the history folder"):
        history.save(record())
