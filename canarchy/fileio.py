"""Atomic file writes, and bounded reads of the files read whole.

Every file canarchy writes for a user (fuzz findings, sessions, config
changes, capture logs) is a :class:`PendingFile`: a temp file beside the
target (a symbolic link's target), written, then ``os.replace`` over it and an
fsync of the directory where the platform allows it. On any failure the temp
file is removed and the target is left as it was. Every file canarchy reads
whole (``config.toml``, a simulator profile, a signal database) goes through
:func:`read_small_bytes` (:func:`read_small_text`): a regular file of bounded size.
"""

from __future__ import annotations

import codecs
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


#: The largest configuration-sized file read whole, in bytes.
SMALL_FILE_LIMIT = 1 << 20


class UnreadableFile(Exception):
    """Why a file read whole cannot be: ``reason`` (words after the path, no full stop) and ``hint``."""

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def read_small_text(path: Path, limit: int = SMALL_FILE_LIMIT) -> str | None:
    """The UTF-8 text of the file at ``path`` (:func:`read_small_bytes`; a leading byte order mark dropped, line
    ends kept), or None when nothing is there. Raises :class:`UnreadableFile`, also for bytes that are not UTF-8."""
    data = read_small_bytes(path, limit)
    if data is None:
        return None
    try:
        return data.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02X} at offset {exc.start})",
                             f"Re-save {path} as UTF-8.") from None


def read_small_bytes(path: Path, limit: int = SMALL_FILE_LIMIT) -> bytes | None:
    """The bytes of the file at ``path``, or None when nothing is there.

    Raises :class:`UnreadableFile` for a dangling symbolic link, a loop of them, something other than a
    regular file (a pipe is never waited on), a file over ``limit`` bytes, or a file that cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if os.path.islink(path):
            raise UnreadableFile(f"is a symbolic link to {os.readlink(path)}, which does not exist",
                                 f"Point {path} at the file, or remove the link.") from None
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableFile("is a loop of symbolic links", f"Point {path} at a file.") from None
        if exc.errno == errno.ENOTDIR:
            raise UnreadableFile("cannot be read: a directory on its path is a file",
                                 f"Move that file aside; {Path(path).parent} must be a directory.") from None
        raise UnreadableFile(f"cannot be read: {exc.strerror}", f"Check the permissions of {path}.") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a pipe, a device or a socket)"
        raise UnreadableFile(f"is {what}", f"Make {path} a regular file, or move it aside.")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise UnreadableFile(f"cannot be read: {exc.strerror}", f"Check the disk {path} is on.") from None
    if len(data) > limit:
        raise UnreadableFile(f"is larger than {limit} bytes, more than such a file ever needs",
                             f"Check that {path} is the right file, or move it aside.")
    return data
