"""The report log child processes append to and their parent pytest reads (isolation/reportlog.py)."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import os

from canarchy.testing.isolation.reportlog import ReportLog, append


def test_each_look_returns_only_what_was_appended_since_the_last(tmp_path):
    log = ReportLog("x.jsonl")
    assert log.read_new(tmp_path) == []  # made empty on the first look
    append(tmp_path, "x.jsonl", {"n": 1})
    append(tmp_path, "x.jsonl", {"n": 2})
    assert log.read_new(tmp_path) == [{"n": 1}, {"n": 2}]
    assert log.read_new(tmp_path) == []
    append(tmp_path, "x.jsonl", {"n": 3})
    assert log.read_new(str(tmp_path)) == [{"n": 3}], "the same directory given as a string reads on"


def test_a_line_still_being_written_waits_and_a_broken_one_is_skipped(tmp_path):
    log = ReportLog("x.jsonl")
    log.read_new(tmp_path)
    fd = os.open(tmp_path / "x.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b'not json\n[1]\n{"n": ')
        assert log.read_new(tmp_path) == []
        os.write(fd, b'4}\n')
    finally:
        os.close(fd)
    assert log.read_new(tmp_path) == [{"n": 4}]


def test_a_directory_that_appears_later_is_read_then(tmp_path):
    log, directory = ReportLog("x.jsonl"), tmp_path / "later"
    assert log.read_new(directory) == [] and log.fd is None
    directory.mkdir()
    append(directory, "x.jsonl", {"n": 5})
    assert log.read_new(directory) == [{"n": 5}]
    log.close()


def test_a_removed_replaced_or_emptied_file_cannot_hide_a_later_record(tmp_path):
    """A test that deletes, renames over or empties the report file (its sandbox is writable)
    before a child appends: the parent still reads the child's record. (Emptied: when the
    file is then shorter than what was read; see docs/design/test-isolation.md.)"""
    log = ReportLog("x.jsonl")
    append(tmp_path, "x.jsonl", {"n": 1, "pad": "x" * 40})
    assert log.read_new(tmp_path) == [{"n": 1, "pad": "x" * 40}]
    (tmp_path / "x.jsonl").unlink()
    append(tmp_path, "x.jsonl", {"n": 2, "pad": "x" * 40})  # a new file at the path
    assert log.read_new(tmp_path) == [{"n": 2, "pad": "x" * 40}]
    (tmp_path / "x.jsonl").write_text("")  # emptied in place
    append(tmp_path, "x.jsonl", {"n": 3})
    assert log.read_new(tmp_path) == [{"n": 3}]
    (tmp_path / "other.jsonl").write_text("")
    os.replace(tmp_path / "other.jsonl", tmp_path / "x.jsonl")  # replaced
    append(tmp_path, "x.jsonl", {"n": 4})
    assert log.read_new(tmp_path) == [{"n": 4}]
    log.close()


def test_bytes_left_before_a_record_do_not_spoil_it(tmp_path):
    """A test that writes a stray byte into the file before its child appends a record."""
    log = ReportLog("x.jsonl")
    log.read_new(tmp_path)
    with open(tmp_path / "x.jsonl", "ab") as fh:
        fh.write(b"x")
    append(tmp_path, "x.jsonl", {"n": 6})
    assert log.read_new(tmp_path) == [{"n": 6}]
    log.close()
