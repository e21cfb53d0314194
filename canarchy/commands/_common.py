"""Argument parsing helpers shared by command modules."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from typing import Any

from canarchy.errors import UserInputError


class StopSignals:
    """A context manager for long-running commands (``web serve``, ``simulate ecu``).

    Within the block, SIGINT and SIGTERM are noted in ``name`` (e.g.
    ``"SIGTERM"``) instead of interrupting, so the command can stop cleanly and
    still report; ``wait(timeout)`` returns True as soon as one has arrived.
    The previous handlers come back afterwards. Only the main thread can
    install signal handlers: elsewhere (an in-process test) it installs nothing
    and ``wait`` only waits.

    The handler takes no lock: it runs between two bytecodes of the main
    thread, which may hold the lock a ``threading.Event`` would take, and would
    then wait for itself for ever (CPython issue 126434). It writes a byte to a
    pipe that ``wait`` selects on instead.
    """

    def __init__(self) -> None:
        self.name: str | None = None
        self._pipe: tuple[int, int] | None = None
        self._saved: dict[int, Any] = {}

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.name = signal.Signals(signum).name
        if self._pipe is not None:
            with contextlib.suppress(OSError):  # full (a byte is already there) or closed
                os.write(self._pipe[1], b"\0")

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a stop signal; True once one has arrived."""
        if self.name is None:
            if self._pipe is None:
                time.sleep(timeout)
            else:
                select.select([self._pipe[0]], [], [], timeout)  # a signal before this wakes it at once
        return self.name is not None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._pipe = os.pipe()
            os.set_blocking(self._pipe[1], False)
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._saved[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved.clear()
        pipe, self._pipe = self._pipe, None
        for fd in pipe or ():
            os.close(fd)


#: The longest wait for a reply an active command takes, in seconds (ISO 14229-2's P2*server_max is 5 s).
MAX_TIMEOUT_S = 60.0


def parse_int(text: str, code: str, what: str, lo: int, hi: int, hint: str) -> int:
    """Parse a decimal or ``0x`` hex integer within ``lo..hi``.

    Raises ``UserInputError(code)`` naming ``what`` when it does not parse or is out of range.
    """
    raw = str(text).strip()
    try:
        value = int(raw, 16) if raw.lower().startswith("0x") else int(raw, 10)
    except ValueError:
        raise UserInputError(code, f"{what} {text!r} is not a decimal or 0x-hex integer.", hint) from None
    if not lo <= value <= hi:  # in hex too where it was written in hex
        span = f"{lo}..{hi}" + (f" (0x{lo:X}..0x{hi:X})" if raw.lower().startswith("0x") else "")
        raise UserInputError(code, f"{what} {text!r} is outside {span}.", hint)
    return value


def parse_hex_data(text: str, max_bytes: int = 64) -> bytes:
    """Parse a payload written as hex (``"0210"``, ``"02 10"``, ``"02:10"``, ``"0x0210"``).

    Raises ``UserInputError`` ``INVALID_FRAME_DATA`` on odd length, a non-hex
    digit, or more than ``max_bytes`` bytes.
    """
    raw = str(text).strip()
    if raw.lower().startswith("0x"):
        raw = raw[2:]
    compact = raw.replace(" ", "").replace(":", "").replace(".", "")
    hint = "Write the payload as an even number of hex digits, e.g. 0210 or 02:10."
    try:
        data = bytes.fromhex(compact)
    except ValueError:
        raise UserInputError("INVALID_FRAME_DATA", f"Payload {text!r} is not valid hex.", hint) from None
    if len(data) > max_bytes:
        raise UserInputError("INVALID_FRAME_DATA", f"Payload {text!r} has {len(data)} bytes; at most {max_bytes}.",
                             hint)
    return data


def parse_arbitration_id(text: str) -> tuple[int, bool]:
    """Parse an arbitration ID in **hex** as can-utils do (``7E0``, ``0x7E0``, ``18FEF100``):
    8 digits are a 29-bit ID, 3 digits an 11-bit one, other widths 29-bit above 0x7FF.

    Returns ``(arbitration_id, is_extended_id)``. Raises ``UserInputError``
    ``INVALID_FRAME`` (see :func:`canarchy.frame_syntax.parse_arbitration_id`).
    """
    from canarchy.frame_syntax import parse_arbitration_id as parse

    return parse(text)
