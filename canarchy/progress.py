"""Live reporting of a long active run: its events as they happen, and a progress line.

:class:`ActiveRun` emits each event at once (``--jsonl``: one line, flushed)
or keeps it for the envelope, and owns a :class:`Progress` line: shown on
stderr only when stderr is a terminal (``isatty()``), so a pipe or a log file
gets nothing and scripts see only the output. The line is redrawn in place
(carriage return, erase to end of line) at most ``interval`` seconds apart
and erased at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

#: Seconds between two redraws.
DEFAULT_INTERVAL = 0.25


class Progress:
    """``update(text)`` redraws the line (throttled; ``force=True`` always);
    ``close()`` erases it. ``active``: false when the stream is not a terminal,
    and then every call does nothing. Use as a context manager."""

    def __init__(self, stream: TextIO | None = None, interval: float | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        try:
            self.active = bool(isatty and isatty())
        except (OSError, ValueError):  # a closed or odd stream
            self.active = False
        self.interval = DEFAULT_INTERVAL if interval is None else interval
        self._last = float("-inf")
        self._shown = False

    def update(self, text: str, force: bool = False) -> None:
        if not self.active:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        self._write("\r\x1b[K" + text)
        self._shown = True

    def close(self) -> None:
        if self.active and self._shown:
            self._write("\r\x1b[K")
            self._shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: the run goes on without it
            self.active = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def rate(count: int, elapsed: float) -> str:
    """``"12.3/s"``: ``count`` per second over ``elapsed`` seconds (``"-/s"`` before any time passed)."""
    return f"{count / elapsed:.1f}/s" if elapsed > 0 else "-/s"


class ActiveRun:
    """One active command's reporting: ``emit(event_type, payload, timestamp=None)`` streams an
    event as it happens (:func:`canarchy.output.open_stream`, flushed at once); ``progress`` is the
    terminal line; :meth:`result` closes it and builds the :class:`canarchy.output.CommandResult`."""

    def __init__(self, args: argparse.Namespace, source: str) -> None:
        from canarchy.output import open_stream

        self.source = source
        self.stream = open_stream(args, source, live=True)
        self.emit = self.stream.emit
        self.progress = Progress()
        self.started = time.monotonic()

    @property
    def count(self) -> int:
        """Events emitted."""
        return self.stream.count

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def result(self, data: dict[str, Any], warnings: list[str]) -> Any:
        """The command's result: ``data`` with ``elapsed_s``."""
        from canarchy.output import CommandResult

        self.progress.close()
        data.setdefault("elapsed_s", round(self.elapsed(), 3))
        return CommandResult(data=data, warnings=warnings)
