"""Records child processes hand to their parent pytest: one JSON object a line, appended to a file.

Each guard has its file in the run's report directory. A child appends a record with one ``write``
in append mode (lines of several processes do not mix); the parent keeps the file open and reads on
from where it stopped, so a look at a file nothing was added to costs one ``fstat``.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

# Bound once: a test that replaces os.pread or json.loads (and leaves it so) cannot keep its children's
# records from the parent; the seal keeps these globals in place.
_open, _write, _close, _pread, _fstat = os.open, os.write, os.close, os.pread, os.fstat
_dumps, _loads = json.dumps, json.loads


def append(directory: Any, name: str, record: dict) -> None:
    """Append ``record`` as one line to ``directory/name``, starting a line of its own (bytes a
    test left without a newline end up on a line before it, not in it). Raises ``OSError``."""
    fd = _open(os.path.join(directory, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        _write(fd, ("\n" + _dumps(record) + "\n").encode("utf-8"))
    finally:
        _close(fd)


class ReportLog:
    """The reading end of one report file: :meth:`read_new` returns the records added since the last call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.directory: Any = None
        self.fd: int | None = None
        self.offset = 0

    def read_new(self, directory: Any) -> list[dict]:
        """The complete records appended to ``directory/name`` since the last look (a line still
        being written waits); none when the file cannot be opened (tried again at the next look).
        A file removed or replaced since is opened again; one now shorter than what was read is
        read from its start."""
        if directory is None:
            return []
        if self.fd is None or (directory is not self.directory
                               and os.fspath(directory) != os.fspath(self.directory)):
            self._open(directory)
        self.directory = directory  # the same directory given again: read on where we were
        if self.fd is None:
            return []
        try:
            size, links = self._size()
            if links == 0:  # removed (or renamed over): the records go to the file now at the path
                self._open(directory)
                if self.fd is None:
                    return []
                size, links = self._size()
            if size < self.offset:  # emptied in place
                self.offset = 0
            if size == self.offset:
                return []
            new = _pread(self.fd, size - self.offset, self.offset)
        except OSError:
            return []
        complete = new[:new.rfind(b"\n") + 1]
        self.offset += len(complete)
        records = []
        for line in complete.splitlines():
            try:
                record = _loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def _size(self) -> tuple[int, int]:
        st = _fstat(self.fd)  # type: ignore[arg-type]
        return st.st_size, st.st_nlink

    def _open(self, directory: Any) -> None:
        self.close()
        path = os.path.join(directory, self.name)
        try:
            _close(_open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
            self.fd = _open(path, os.O_RDONLY)
        except OSError:  # no report directory (yet)
            self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                _close(self.fd)
        self.fd, self.offset = None, 0
