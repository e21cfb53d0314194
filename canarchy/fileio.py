"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file canarchy writes for a user (fuzz findings, sessions, config
changes, capture logs) is a :class:`PendingFile`: a temp file beside the
target (a symbolic link's target), written, then ``os.replace`` over it and an
fsync of the directory where the platform allows it. On any failure the temp
file is removed and the target is left as it was.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
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


class PendingFile:
    """A temporary file, beside where ``path`` leads, that becomes that file on :meth:`commit` or goes on
    :meth:`discard`: a reader sees the old file or the new one, never half of one.

    ``path`` is followed through symbolic links, as ``open(path, "w")`` and a shell's ``>`` follow them: the
    link stays, its target is replaced. Permission bits: ``mode``; by default those of the file it replaces,
    else ``new_mode`` (default 0o600, mkstemp's). ``temp``: the temporary file's path; ``fd``: its open
    descriptor, the caller's to use or close. Raises ``OSError`` (no temporary file is then left).
    """

    def __init__(self, path: str | os.PathLike[str], suffix: str = ".tmp", mode: int | None = None,
                 new_mode: int = 0o600) -> None:
        self.target = Path(os.path.realpath(path))
        self.fd, self.temp = tempfile.mkstemp(prefix=f".{self.target.name}.", suffix=suffix, dir=self.target.parent)
        try:
            if mode is None:
                try:
                    mode = stat.S_IMODE(os.stat(self.target).st_mode)
                except FileNotFoundError:
                    mode = new_mode
            os.fchmod(self.fd, mode)
        except BaseException:
            os.close(self.fd)
            self.discard()
            raise

    def commit(self) -> None:
        """Rename the temporary file over the target (then make the rename durable where the platform allows).
        Raises ``OSError``; the caller then discards."""
        os.replace(self.temp, self.target)
        _fsync_directory(self.target.parent)

    def discard(self) -> None:
        """Remove the temporary file, if it is still there."""
        try:
            os.unlink(self.temp)
        except OSError:
            pass


def write_bytes_atomic(path: Path, data: bytes | BinaryIO, mode: int | None = None) -> None:
    """Replace ``path`` (through symbolic links) with ``data`` (bytes, or a binary file read to its end in blocks)
    atomically, as :class:`PendingFile` says. The directory must exist.

    ``mode``: the file's permission bits (default: the replaced file's, else 0o600). Raises ``OSError`` (the
    target is then unchanged and no temp file is left).
    """
    pending = PendingFile(path, mode=mode)
    try:
        with os.fdopen(pending.fd, "wb") as handle:
            if isinstance(data, bytes):
                handle.write(data)
            else:
                shutil.copyfileobj(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        pending.commit()
    except BaseException:
        pending.discard()
        raise


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
