"""Atomic writes: the target is whole or untouched, and no temp file is left."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import json
import os

import pytest

from canarchy import fileio


def test_write_json_atomic_replaces_whole_file(tmp_path):
    target = tmp_path / "doc.json"
    fileio.write_json_atomic(target, {"b": 1, "a": 2})
    assert target.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    fileio.write_json_atomic(target, {"c": 3})
    assert json.loads(target.read_text()) == {"c": 3}
    assert os.listdir(tmp_path) == ["doc.json"]


def test_failed_write_leaves_the_target_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "doc.json"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", broken_replace)
    with pytest.raises(OSError):
        fileio.write_text_atomic(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["doc.json"]


def test_missing_directory_raises(tmp_path):
    with pytest.raises(OSError):
        fileio.write_bytes_atomic(tmp_path / "nope" / "x", b"1")


class _BreaksAfter:
    """A binary stream that gives ``blocks`` blocks of 64 KiB, then fails as a vanished source would."""

    def __init__(self, blocks: int):
        self.blocks = blocks

    def read(self, size: int = -1) -> bytes:
        if self.blocks == 0:
            raise OSError(5, "Input/output error")
        self.blocks -= 1
        return b"x" * 65536


def test_a_stream_is_copied_whole_or_not_at_all(tmp_path):
    """A report a lane publishes is copied from its run's file in blocks: a copy that fails midway
    leaves the earlier report whole, and a finished one is the source's bytes."""
    target = tmp_path / "unit.xml"
    target.write_text("old")
    with pytest.raises(OSError):
        fileio.write_bytes_atomic(target, _BreaksAfter(3))
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["unit.xml"]
    source = tmp_path / "run.xml"
    source.write_bytes(bytes(range(256)) * 1000)
    with source.open("rb") as stream:
        fileio.write_bytes_atomic(target, stream, 0o644)
    assert target.read_bytes() == source.read_bytes() and target.stat().st_mode & 0o777 == 0o644


def test_a_symlink_stays_and_its_target_is_replaced_keeping_its_permissions(tmp_path):
    """As ``open(path, "w")`` and a shell's ``>``: the write goes where the link leads (a link in a chain too);
    the replaced file's permission bits stay; a new file is 0o600; an explicit mode wins."""
    target = tmp_path / "real" / "doc.json"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o640)
    (tmp_path / "first").symlink_to(target)
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "first")
    fileio.write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o640
    assert os.listdir(target.parent) == ["doc.json"]
    fileio.write_text_atomic(tmp_path / "fresh.json", "x")
    assert (tmp_path / "fresh.json").stat().st_mode & 0o777 == 0o600
    fileio.write_text_atomic(link, "newer", 0o644)
    assert target.stat().st_mode & 0o777 == 0o644
