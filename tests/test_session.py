"""`session save`, `session load`, `session show` (canarchy.session).

Sessions are project-local: every test changes into its own tmp_path and
checks the files that appear under ``tmp_path/.canarchy``.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from canarchy.cli import main


def run(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = main([*argv, "--json"], stdout=out)
    return code, json.loads(out.getvalue())


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A working directory of its own: sessions resolve relative to it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def state_files(root: Path) -> list[str]:
    base = root / ".canarchy"
    if not base.exists():
        return []
    return sorted(str(p.relative_to(base)) for p in base.rglob("*"))


# --- save -------------------------------------------------------------------------------------------


def test_save_writes_sorted_record_and_makes_it_active(project):
    code, env = run("session", "save", "bench-1", "--interface", "vcan0", "--dbc", "car.dbc",
                    "--capture", "runs/drive.log")
    assert code == 0, env
    assert env["command"] == "session save"
    path = project / ".canarchy" / "sessions" / "bench-1.json"
    text = path.read_text(encoding="utf-8")
    record = json.loads(text)
    assert list(record) == sorted(record)
    assert set(record) == {"name", "interface", "dbc", "capture", "saved_at"}
    assert record["name"] == "bench-1" and record["interface"] == "vcan0"
    assert record["dbc"] == "car.dbc" and record["capture"] == "runs/drive.log"
    assert record["saved_at"].endswith("Z")
    pointer = json.loads((project / ".canarchy" / "active_session.json").read_text())
    assert pointer["name"] == "bench-1"
    data = env["data"]
    assert {k: data[k] for k in record} == record
    assert data["path"] == str(path)


def test_save_without_options_stores_nulls(project):
    code, _env = run("session", "save", "plain")
    assert code == 0
    record = json.loads((project / ".canarchy" / "sessions" / "plain.json").read_text())
    assert record["interface"] is None and record["dbc"] is None and record["capture"] is None


def test_save_replaces_an_existing_record(project):
    run("session", "save", "lab", "--interface", "can0", "--dbc", "a.dbc")
    code, _env = run("session", "save", "lab", "--interface", "can1")
    assert code == 0
    record = json.loads((project / ".canarchy" / "sessions" / "lab.json").read_text())
    assert record["interface"] == "can1" and record["dbc"] is None


def test_save_interface_is_not_swallowed_by_prepare_args(project):
    # prepare_args resets args.interface; the session's channel must survive it.
    _code, env = run("session", "save", "ch", "--interface", "vcan3")
    assert env["data"]["interface"] == "vcan3"


def test_save_resolves_the_working_directory_at_call_time(tmp_path, monkeypatch):
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    assert run("session", "save", "here")[0] == 0
    monkeypatch.chdir(second)
    _code, env = run("session", "show")
    assert env["data"]["sessions"] == [] and env["data"]["active"] is None
    assert (first / ".canarchy" / "sessions" / "here.json").exists()
    assert not (second / ".canarchy").exists()


def test_save_never_writes_under_home(project):
    run("session", "save", "x", "--interface", "can0")
    assert not (Path.home() / ".canarchy").exists()


@pytest.mark.parametrize("name", ["../escape", "a/b", "a\\b", ".hidden", "..", "has space", "x" * 129, "", "é"])
def test_save_rejects_invalid_names(project, name):
    code, env = run("session", "save", name)
    assert code == 1 and env["ok"] is False
    (error,) = env["errors"]
    assert error["code"] == "INVALID_SESSION_NAME" and error["hint"]
    assert state_files(project) == []
    assert not (project.parent / "escape.json").exists()


@pytest.mark.parametrize("option", ["--interface", "--dbc", "--capture"])
def test_save_rejects_blank_fields(project, option):
    code, env = run("session", "save", "s", option, "  ")
    assert code == 1
    assert env["errors"][0]["code"] == "INVALID_ARGUMENTS"
    assert state_files(project) == []


def test_save_without_name_is_invalid_arguments(project):
    code, env = run("session", "save")
    assert code == 1 and env["errors"][0]["code"] == "INVALID_ARGUMENTS"


def test_failed_save_leaves_no_temp_file_and_keeps_the_old_record(project, monkeypatch):
    assert run("session", "save", "lab", "--interface", "can0")[0] == 0
    sessions = project / ".canarchy" / "sessions"
    before = (sessions / "lab.json").read_bytes()
    pointer_before = (project / ".canarchy" / "active_session.json").read_bytes()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    code, env = run("session", "save", "lab", "--interface", "can9")
    assert code == 1
    (error,) = env["errors"]
    assert error["code"] == "SESSION_WRITE_FAILED"
    assert "lab.json" in error["message"] and error["hint"]
    assert sorted(p.name for p in sessions.iterdir()) == ["lab.json"]
    assert (sessions / "lab.json").read_bytes() == before
    assert (project / ".canarchy" / "active_session.json").read_bytes() == pointer_before
    assert not list((project / ".canarchy").rglob("*.tmp"))


def test_failed_first_save_leaves_nothing_behind(project, monkeypatch):
    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    code, env = run("session", "save", "new")
    assert code == 1 and env["errors"][0]["code"] == "SESSION_WRITE_FAILED"
    assert [p for p in state_files(project) if p.endswith((".json", ".tmp"))] == []


def test_save_when_state_dir_is_a_file_is_write_failed(project):
    (project / ".canarchy").write_text("not a directory")
    code, env = run("session", "save", "x")
    assert code == 1 and env["errors"][0]["code"] == "SESSION_WRITE_FAILED"
    assert (project / ".canarchy").read_text() == "not a directory"


def test_save_refuses_to_overwrite_a_corrupt_record(project):
    sessions = project / ".canarchy" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "lab.json").write_text("{half", encoding="utf-8")
    code, env = run("session", "save", "lab", "--interface", "can0")
    assert code == 1
    (error,) = env["errors"]
    assert error["code"] == "SESSION_CORRUPT"
    assert str(sessions / "lab.json") in error["message"]
    assert (sessions / "lab.json").read_text() == "{half"
    assert not (project / ".canarchy" / "active_session.json").exists()


def test_save_refuses_to_overwrite_a_corrupt_pointer(project):
    state = project / ".canarchy"
    state.mkdir()
    (state / "active_session.json").write_text("[]", encoding="utf-8")
    code, env = run("session", "save", "lab")
    assert code == 1
    assert env["errors"][0]["code"] == "SESSION_CORRUPT"
    assert "active_session.json" in env["errors"][0]["message"]
    assert (state / "active_session.json").read_text() == "[]"


# --- load -------------------------------------------------------------------------------------------


def test_load_returns_record_and_switches_active(project):
    run("session", "save", "a", "--interface", "can0")
    run("session", "save", "b", "--interface", "can1")
    code, env = run("session", "load", "a")
    assert code == 0
    assert env["command"] == "session load"
    assert env["data"]["name"] == "a" and env["data"]["interface"] == "can0"
    pointer = json.loads((project / ".canarchy" / "active_session.json").read_text())
    assert pointer["name"] == "a"
    code, env = run("session", "show")
    assert env["data"]["active"]["name"] == "a"


def test_load_unknown_is_not_found_with_hint(project):
    run("session", "save", "known")
    code, env = run("session", "load", "missing")
    assert code == 1 and env["ok"] is False
    (error,) = env["errors"]
    assert error["code"] == "SESSION_NOT_FOUND"
    assert "missing" in error["message"]
    assert "session show" in error["hint"] and "known" in error["hint"]
    pointer = json.loads((project / ".canarchy" / "active_session.json").read_text())
    assert pointer["name"] == "known"


def test_load_in_empty_project_is_not_found(project):
    code, env = run("session", "load", "anything")
    assert code == 1 and env["errors"][0]["code"] == "SESSION_NOT_FOUND"
    assert state_files(project) == []


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", ".x", "a/b"])
def test_load_rejects_invalid_names(project, name):
    code, env = run("session", "load", name)
    assert code == 1 and env["errors"][0]["code"] == "INVALID_SESSION_NAME"


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2]", '{"name": "other", "interface": null, "dbc": null, "capture": null, "saved_at": "x"}',
     '{"name": "lab", "interface": 5, "dbc": null, "capture": null, "saved_at": "x"}',
     '{"name": "lab", "dbc": null, "capture": null, "saved_at": "x"}',
     '{"name": "lab", "interface": null, "dbc": null, "capture": null}'],
)
def test_load_corrupt_record_is_session_corrupt_and_changes_nothing(project, content):
    run("session", "save", "other")
    sessions = project / ".canarchy" / "sessions"
    (sessions / "lab.json").write_text(content, encoding="utf-8")
    pointer_before = (project / ".canarchy" / "active_session.json").read_bytes()
    code, env = run("session", "load", "lab")
    assert code == 1
    (error,) = env["errors"]
    assert error["code"] == "SESSION_CORRUPT"
    assert str(sessions / "lab.json") in error["message"] and error["hint"]
    assert (sessions / "lab.json").read_text() == content
    assert (project / ".canarchy" / "active_session.json").read_bytes() == pointer_before


def test_load_without_name_is_invalid_arguments(project):
    code, env = run("session", "load")
    assert code == 1 and env["errors"][0]["code"] == "INVALID_ARGUMENTS"


# --- show -------------------------------------------------------------------------------------------


def test_show_with_nothing_saved(project):
    code, env = run("session", "show")
    assert code == 0
    assert env["command"] == "session show"
    assert env["data"] == {"active": None, "sessions": [], "session_count": 0}
    assert state_files(project) == []


def test_show_active_and_saved_list(project):
    run("session", "save", "zeta")
    run("session", "save", "alpha", "--dbc", "j1939.dbc")
    code, env = run("session", "show")
    assert code == 0
    assert env["data"]["active"]["name"] == "alpha"
    assert env["data"]["active"]["dbc"] == "j1939.dbc"
    assert env["data"]["sessions"] == ["alpha", "zeta"] and env["data"]["session_count"] == 2


def test_show_lists_saved_sessions_without_active_pointer(project):
    run("session", "save", "one")
    (project / ".canarchy" / "active_session.json").unlink()
    _code, env = run("session", "show")
    assert env["data"]["active"] is None and env["data"]["sessions"] == ["one"]


def test_show_pointer_to_deleted_session_warns(project):
    run("session", "save", "gone")
    (project / ".canarchy" / "sessions" / "gone.json").unlink()
    code, env = run("session", "show")
    assert code == 0
    assert env["data"]["active"] is None
    assert any(w.startswith("SESSION_NOT_FOUND:") and "gone" in w for w in env["warnings"])


@pytest.mark.parametrize("content", ["nope", '{"name": "../x"}', '{"other": 1}'])
def test_show_corrupt_pointer_is_session_corrupt(project, content):
    state = project / ".canarchy"
    state.mkdir()
    (state / "active_session.json").write_text(content)
    code, env = run("session", "show")
    assert code == 1
    assert env["errors"][0]["code"] == "SESSION_CORRUPT"
    assert str(state / "active_session.json") in env["errors"][0]["message"]


def test_show_corrupt_active_record_is_session_corrupt(project):
    run("session", "save", "lab")
    (project / ".canarchy" / "sessions" / "lab.json").write_text("{")
    code, env = run("session", "show")
    assert code == 1 and env["errors"][0]["code"] == "SESSION_CORRUPT"


def test_show_ignores_temp_and_foreign_files(project):
    run("session", "save", "real")
    sessions = project / ".canarchy" / "sessions"
    (sessions / ".real.json.abc.tmp").write_text("{")
    (sessions / "notes.txt").write_text("x")
    _code, env = run("session", "show")
    assert env["data"]["sessions"] == ["real"]


def test_show_rejects_extra_arguments(project):
    code, env = run("session", "show", "extra")
    assert code == 1 and env["errors"][0]["code"] == "INVALID_ARGUMENTS"


def test_session_group_requires_a_subcommand(project):
    code, env = run("session")
    assert code == 1 and env["errors"][0]["code"] == "INVALID_ARGUMENTS"


def test_text_output(project):
    out = io.StringIO()
    assert main(["session", "save", "lab", "--interface", "can0"], stdout=out) == 0
    assert "active session: lab" in out.getvalue() and "interface: can0" in out.getvalue()
    out = io.StringIO()
    assert main(["session", "show"], stdout=out) == 0
    assert "saved sessions (1): lab" in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert main(["session", "load", "nope"], stdout=out, stderr=err) == 1
    assert out.getvalue() == "" and err.getvalue().startswith("error: SESSION_NOT_FOUND:")


def test_written_files_are_complete_json(project):
    run("session", "save", "lab")
    for path in (project / ".canarchy").rglob("*.json"):
        assert path.read_text().endswith("}\n")
        json.loads(path.read_text())
    assert os.listdir(project / ".canarchy" / "sessions") == ["lab.json"]
