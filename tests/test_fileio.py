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
