"""python-can's log records during a read of a recording, as warnings of that read.

python-can's readers log what they skip or doubt (``can.io.blf``: an object header version it does not
know; ``can.io.asc``: a CAN FD DLC that does not match the data length) through :mod:`logging`. With no
handler configured, Python prints such a record bare on stderr, outside canarchy's output. While a
:class:`ReaderRecords` is installed (``with``), the ``can.io`` loggers' records of WARNING and above from
the installing thread go to its callback instead, and none reaches stderr.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

#: The logger of python-can's readers and writers (``can.io.asc``, ``can.io.blf`` ...).
LOGGER = "can.io"


class ReaderRecords(logging.Handler):
    """Hands each ``can.io`` record of this thread's read to ``add`` (its message text)."""

    def __init__(self, add: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.add = add
        self.thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.add(record.getMessage())

    def __enter__(self) -> ReaderRecords:
        logging.getLogger(LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger(LOGGER).removeHandler(self)
