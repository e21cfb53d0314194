"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file canarchy writes for a user (fuzz findings, sessions, config
changes) goes through :func:`write_bytes_atomic`: a temp file in the same
directory, written and fsynced, then ``os.replace`` over the target and an
fsync of the directory where the platform allows it. On any failure the temp
file is removed and the target is left as it was.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO


def write_failure_hint(exc: OSError | None, where: str) -> str:
    """What to do about a failed write to ``where`` (words: "the disk that standard output is redirected
    to", "the directory"), by the ``OSError``'s errno (``None``: the stream is closed)."""
    code = None if exc is None else exc.errno
    if code == errno.ENOSPC:
        return f"The disk of {where} is full: free space, or write elsewhere."
    if code == errno.EFBIG:
        return "The file passed the file size limit (ulimit -f): raise it, or write less (--count)."
    if code in (None, errno.EBADF):
        return f"{where[0].upper()}{where[1:]} is closed: run the command with it open (not `>&-`)."
    return f"Check that {where} exists and is writable."


def write_bytes_atomic(path: Path, data: bytes | BinaryIO, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (bytes, or a binary file read to its end in blocks) atomically.
    The directory must exist.

    ``mode``: permission bits for the new file (default: those of mkstemp, 0o600).
    Raises ``OSError`` (the target is then unchanged and no temp file is left).
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, bytes):
                handle.write(data)
            else:
                shutil.copyfileobj(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise
    _fsync_directory(path.parent)


def write_text_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """:func:`write_bytes_atomic` for UTF-8 text (newlines written as given)."""
    write_bytes_atomic(path, text.encode("utf-8"), mode)


def write_json_atomic(path: Path, document: Any) -> None:
    """:func:`write_bytes_atomic` for a JSON document (sorted keys, 2-space indent, final newline)."""
    write_text_atomic(path, json.dumps(document, sort_keys=True, indent=2) + "\n")


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable where the platform allows fsync on a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
