"""Reading recorded CAN traffic from capture files, one frame at a time.

Formats, chosen by the file's suffix (a trailing ``.gz`` is decompressed on
the fly):

===========================  ==========================================================
suffix                       reader
===========================  ==========================================================
``.log``, ``.candump``       canarchy's own candump ``-l`` parser (no python-can import)
``.asc``                     python-can ``ASCReader`` (Vector ASCII)
``.blf``                     python-can ``BLFReader`` (Vector binary logging format)
``.trc``                     python-can ``TRCReader`` (PEAK trace)
``.csv``                     python-can ``CSVReader`` (python-can's own CSV layout)
``.mf4``                     python-can ``MF4Reader`` (ASAM MDF 4; needs ``asammdf``)
``.db``                      python-can ``SqliteReader`` (python-can's SQLite layout)
``.jsonl``, ``.json``        canarchy's own ``--jsonl`` / ``--json`` output (``frame``, ``frame_sent`` events)
===========================  ==========================================================

candump ``-l`` lines (can-utils ``lib.c``; the layout python-can's
``CanutilsLogReader`` reads too)::

    (1635188455.020850) can0 18F00E00#821639C4FFFFFFFF     classic; 8 hex digits = 29-bit ID
    (1641469561.949700) can0 79B#022101FFFFFFFFFF          classic; 3 hex digits = 11-bit ID
    (1700000000.000000) can1 123##1A1B2C3D4E5F60718        CAN FD: '##', one flags digit, data
    (1700000000.000000) can0 123#R                         remote frame (RTR), DLC 0
    (1700000000.000000) can0 123#R4                        remote frame with DLC 4

An optional trailing `` R``/`` T`` (received/transmitted) is accepted and
ignored. Blank lines are skipped. candump error frames (CAN_ERR_FLAG,
0x20000000, set in an 8-digit ID) are not CAN frames: they are counted and
reported as one warning, not yielded.

Streaming: :class:`CaptureFile` is an iterable that reads line by line (or
message by message); it never holds the file in memory. Warnings are kept up
to :data:`MAX_WARNINGS`; beyond that only counted, so memory stays flat
whatever the file holds.

Errors (raised by :func:`open_capture`, before any frame is read):

- ``CAPTURE_SOURCE_UNAVAILABLE`` (:class:`~canarchy.errors.TransportError`,
  exit 2): the file does not exist, is a directory, or cannot be opened. A
  capture file stands in for a bus, so a source that cannot be opened is a
  transport error, like ``TRANSPORT_UNAVAILABLE`` for a channel.
- ``CAPTURE_FORMAT_UNSUPPORTED`` (:class:`~canarchy.errors.UserInputError`,
  exit 1): the suffix is none of the above, or the reader it needs is missing
  (``.mf4`` without ``asammdf``).
- ``CAPTURE_FORMAT_INVALID`` (:class:`~canarchy.errors.DecodeError`, exit 3):
  python-can's reader rejects the file outright (e.g. a ``.blf`` without a BLF
  header). Damage found later, mid-file, ends the read with a warning.

Malformed candump lines never raise: each gives a warning
``"<file>:<line>: malformed candump line: <why>: <text>"`` and the read goes on.
"""

from __future__ import annotations

import gzip
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from canarchy.errors import DecodeError, TransportError, UserInputError
from canarchy.transport import CanFrame

CANDUMP_SUFFIXES = (".log", ".candump")
PYTHON_CAN_SUFFIXES = (".asc", ".blf", ".trc", ".csv", ".mf4", ".db")
#: canarchy's own output: ``--jsonl`` lines, a ``--json`` envelope (its ``frame``/``frame_sent`` events).
JSON_SUFFIXES = (".jsonl", ".json")
SUPPORTED_SUFFIXES = CANDUMP_SUFFIXES + PYTHON_CAN_SUFFIXES + JSON_SUFFIXES
#: Event types whose payload is a frame on the bus (``frame_planned`` of a dry run is not).
FRAME_EVENTS = frozenset({"frame", "frame_sent"})

#: At most this many warning strings are kept per file; the rest are counted.
MAX_WARNINGS = 50

_CAN_ERR_FLAG = 0x20000000  # linux/can.h: the ID marks an error frame
_CANFD_BRS = 0x01  # linux/can.h: bit rate switch
_CANFD_ESI = 0x02  # linux/can.h: error state indicator
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_MAX_SHOWN = 80  # characters of a bad line quoted in its warning


@dataclass(frozen=True)
class RemoteCanFrame(CanFrame):
    """A remote (RTR) frame: no data bytes, but a requested DLC (0..15) of its own.

    ``dlc`` and :meth:`to_payload` report ``requested_dlc``; everything else is a
    :class:`~canarchy.transport.CanFrame` with ``is_remote_frame`` true.
    """

    requested_dlc: int = 0

    @property
    def dlc(self) -> int:  # type: ignore[override]
        """The DLC the remote frame asks for (ISO 11898-1: a remote frame carries no data)."""
        return self.requested_dlc


class CaptureFile:
    """An open capture file: iterate it for :class:`~canarchy.transport.CanFrame` objects.

    Attributes (complete once iteration has finished):

    - ``path`` (str, as given), ``format`` (``"candump"`` or the python-can
      reader's name, e.g. ``"asc"``);
    - ``frame_count``: frames yielded; ``line_count``: lines read (candump only);
    - ``malformed_count``: lines (or messages) that gave no frame because they
      are damaged; ``error_frame_count``: error frames skipped;
    - ``warnings``: at most :data:`MAX_WARNINGS` strings, each naming the file
      and the line (or message index); see :meth:`all_warnings`.

    Iterate once: a second pass re-opens the file and resets the counters.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: str) -> None:
        self.path = str(path)
        self.format = fmt
        self.frame_count = 0
        self.line_count = 0
        self.malformed_count = 0
        self.error_frame_count = 0
        self.warnings: list[str] = []
        self._dropped_warnings = 0

    def __iter__(self) -> Iterator[CanFrame]:
        self.frame_count = self.line_count = self.malformed_count = self.error_frame_count = 0
        self.warnings = []
        self._dropped_warnings = 0
        if self.format == "candump":
            return self._iter_candump()
        if self.format in ("jsonl", "json"):
            return self._iter_json()
        return self._iter_python_can()

    def all_warnings(self) -> list[str]:
        """``warnings`` plus summaries: skipped error frames and warnings not listed."""
        out = list(self.warnings)
        if self.error_frame_count:
            out.append(f"{self.path}: {self.error_frame_count} error frame(s) (CAN_ERR_FLAG) skipped")
        if self._dropped_warnings:
            out.append(f"{self.path}: {self._dropped_warnings} more warning(s) not listed "
                       f"(first {MAX_WARNINGS} shown; {self.malformed_count} malformed in all)")
        return out

    # -- internals ---------------------------------------------------------------------------

    def _warn(self, text: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(text)
        else:
            self._dropped_warnings += 1

    def _open_text(self) -> io.TextIOBase:
        # Undecodable bytes become U+FFFD, which fails the line check below: a
        # warning for that line, not an exception for the whole file.
        if self.path.lower().endswith(".gz"):
            return gzip.open(self.path, "rt", encoding="utf-8", errors="replace", newline=None)  # type: ignore[return-value]
        return open(self.path, "r", encoding="utf-8", errors="replace", newline=None)

    def _iter_candump(self) -> Iterator[CanFrame]:
        parse = parse_candump_line
        try:
            handle = self._open_text()
        except OSError as exc:
            raise _unavailable(self.path, exc) from None
        with handle:
            lineno = 0
            try:
                for lineno, line in enumerate(handle, 1):
                    try:
                        frame = parse(line)
                    except _ErrorFrame:
                        self.error_frame_count += 1
                        continue
                    except (ValueError, UserInputError) as exc:
                        self.malformed_count += 1
                        self._warn(f"{self.path}:{lineno}: malformed candump line: {_why(exc)}: "
                                   f"{_shown(line)}")
                        continue
                    if frame is None:
                        continue
                    self.frame_count += 1
                    yield frame
            except (OSError, EOFError) as exc:  # e.g. a truncated .gz
                self._warn(f"{self.path}:{lineno + 1}: reading stopped: {exc}")
            finally:
                self.line_count = lineno

    def _iter_json(self) -> Iterator[CanFrame]:
        """Frames of canarchy's own output: each ``--jsonl`` line (a ``--json`` file: its
        ``data.events``) whose ``event_type`` is in :data:`FRAME_EVENTS`. Other events and the
        closing envelope are skipped; a line that is not JSON or a payload that is no frame is a
        warning. ``.json`` is parsed whole (``--jsonl`` streams: prefer it for long recordings)."""
        import json

        try:
            handle = self._open_text()
        except OSError as exc:
            raise _unavailable(self.path, exc) from None
        with handle:
            if self.format == "json":
                try:
                    document = json.load(handle)
                except ValueError as exc:
                    raise DecodeError("CAPTURE_FORMAT_INVALID", f"{self.path!r} is not a JSON document: {exc}.",
                                      "Give the output of a canarchy command run with --json.") from None
                data = document.get("data") if isinstance(document, dict) else None
                lines: Any = enumerate((data or {}).get("events") or [], 1)
                where = "event"
            else:
                lines = enumerate(handle, 1)
                where = "line"
            for number, item in lines:
                self.line_count = number
                try:
                    event = json.loads(item) if isinstance(item, str) else item
                    if not isinstance(event, dict) or event.get("event_type") not in FRAME_EVENTS:
                        continue  # the envelope, another kind of event, a blank line
                    frame = CanFrame.from_payload(event["payload"])
                except (ValueError, KeyError, TypeError, AttributeError, UserInputError) as exc:
                    if isinstance(item, str) and not item.strip():
                        continue
                    self.malformed_count += 1
                    self._warn(f"{self.path}:{where} {number}: not a canarchy frame event: {_why(exc)}")
                    continue
                if frame.is_error_frame:
                    self.error_frame_count += 1
                    continue
                self.frame_count += 1
                yield frame

    def _iter_python_can(self) -> Iterator[CanFrame]:
        reader = _python_can_reader(self.path, self.format)
        index = 0
        try:
            iterator = iter(reader)
            while True:
                try:
                    message = next(iterator)
                except StopIteration:
                    break
                except Exception as exc:  # python-can's readers raise many types mid-file
                    self._warn(f"{self.path}: message {index + 1}: reading stopped: "
                               f"{exc.__class__.__name__}: {exc}")
                    break
                index += 1
                if message.is_error_frame:
                    self.error_frame_count += 1
                    continue
                try:
                    frame = _from_message(message)
                except UserInputError as exc:
                    self.malformed_count += 1
                    self._warn(f"{self.path}: message {index}: invalid frame: {exc.message}")
                    continue
                self.frame_count += 1
                yield frame
        finally:
            reader.stop()


def open_capture(path: str | os.PathLike[str]) -> CaptureFile:
    """Check ``path`` and return a :class:`CaptureFile` ready to iterate.

    The format comes from the suffix (see the module docstring). Raises
    ``TransportError`` ``CAPTURE_SOURCE_UNAVAILABLE`` (exit 2) when the file
    is missing, a directory or unreadable (checked first), then
    ``UserInputError`` ``CAPTURE_FORMAT_UNSUPPORTED`` (exit 1) for an unknown
    suffix. Nothing is read yet.
    """
    text = str(path)
    target = Path(text)
    if not target.is_file():
        what = "is a directory" if target.is_dir() else "does not exist"
        raise TransportError(
            "CAPTURE_SOURCE_UNAVAILABLE",
            f"Capture file {text!r} {what}.",
            "Check the path (relative paths start at the current directory) and that the file was copied completely.",
        )
    if not os.access(target, os.R_OK):
        raise TransportError("CAPTURE_SOURCE_UNAVAILABLE", f"Capture file {text!r} is not readable.",
                             "Check the file's permissions.")
    return CaptureFile(text, capture_format(text))


def capture_format(path: str) -> str:
    """The reader a path needs: ``"candump"`` or a python-can suffix without the dot (``"asc"``, ``"blf"`` ...).

    Raises ``UserInputError`` ``CAPTURE_FORMAT_UNSUPPORTED`` for any other suffix.
    """
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    if suffix in CANDUMP_SUFFIXES:
        return "candump"
    if suffix in PYTHON_CAN_SUFFIXES or suffix in JSON_SUFFIXES:
        return suffix[1:]
    raise UserInputError(
        "CAPTURE_FORMAT_UNSUPPORTED",
        f"Capture file {path!r} has suffix {suffix or '(none)'!r}, which canarchy cannot read.",
        "Supported: " + ", ".join(SUPPORTED_SUFFIXES) + " (each optionally .gz). "
        "A candump -l log with another name: rename it to .log.",
    )


def parse_candump_line(line: str) -> CanFrame | None:
    """Parse one candump ``-l`` line into a frame; None for a blank line.

    Raises ``ValueError`` (why it is malformed) or ``UserInputError``
    ``INVALID_FRAME`` (an ID or payload that no CAN frame can carry). An error
    frame (CAN_ERR_FLAG in the ID) raises the private ``_ErrorFrame``, which
    :class:`CaptureFile` counts.
    """
    fields = line.split()
    count = len(fields)
    if count != 3:
        if count == 0:
            return None
        if count != 4 or fields[3] not in ("R", "T", "r", "t"):
            raise ValueError(f"expected '(timestamp) channel ID#DATA', got {count} field(s)")
    stamp, channel, body = fields[0], fields[1], fields[2]
    if stamp[0] != "(" or stamp[-1] != ")":
        raise ValueError("timestamp is not in parentheses")
    seconds = stamp[1:-1]
    if not seconds.replace(".", "", 1).isdigit():  # float() would take 'nan', '-1', '1_0'
        raise ValueError(f"timestamp {seconds!r} is not seconds.microseconds")
    timestamp = float(seconds)
    ident, sep, data = body.partition("#")
    if not sep:
        raise ValueError("no '#' between ID and data")
    width = len(ident)
    if width == 3:
        extended = False
    elif width == 8:
        extended = True
    else:
        raise ValueError(f"ID {ident!r} has {width} hex digits (3 = 11-bit, 8 = 29-bit)")
    if not _HEX_DIGITS.issuperset(ident):
        raise ValueError(f"ID {ident!r} is not hex")
    can_id = int(ident, 16)
    if extended and can_id & _CAN_ERR_FLAG:
        raise _ErrorFrame
    if not data:
        return CanFrame(can_id, b"", extended, False, False, timestamp, channel)
    head = data[0]
    if head == "#":  # CAN FD: one hex flags digit, then the data
        if len(data) < 2 or data[1] not in _HEX_DIGITS:
            raise ValueError("CAN FD frame without a flags digit after '##'")
        payload = data[2:]
        if not _HEX_DIGITS.issuperset(payload) or len(payload) % 2:
            raise ValueError(f"CAN FD data {payload!r} is not an even number of hex digits")
        flags = int(data[1], 16)
        return CanFrame(can_id, bytes.fromhex(payload), extended, True, False, timestamp, channel,
                        bitrate_switch=bool(flags & _CANFD_BRS), error_state_indicator=bool(flags & _CANFD_ESI))
    if head in "Rr":
        rest = data[1:]
        if rest and (len(rest) != 1 or rest not in _HEX_DIGITS):  # can-utils: one hex digit, 0..F
            raise ValueError(f"remote frame DLC {rest!r} is not one hex digit")
        dlc = int(rest, 16) if rest else 0
        return RemoteCanFrame(can_id, b"", extended, False, True, timestamp, channel, requested_dlc=dlc)
    if len(data) % 2 or not _HEX_DIGITS.issuperset(data):
        raise ValueError(f"data {data!r} is not an even number of hex digits")
    return CanFrame(can_id, bytes.fromhex(data), extended, False, False, timestamp, channel)


def iter_frames(path: str | os.PathLike[str]) -> Iterator[CanFrame]:
    """Shortcut: the frames of ``path`` (warnings dropped). Raises as :func:`open_capture`."""
    yield from open_capture(path)


# --- internals --------------------------------------------------------------------------------


class _ErrorFrame(Exception):
    """A candump error frame: counted, not a CAN data frame."""


def _why(exc: Exception) -> str:
    if isinstance(exc, UserInputError):
        return exc.message
    text = str(exc)
    if text.startswith("could not convert string to float"):
        return "timestamp is not a number"
    if text.startswith("invalid literal for int()"):
        return "not a hex number"
    return text


def _shown(line: str) -> str:
    text = line.rstrip("\r\n")
    return repr(text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...")


def _unavailable(path: str, exc: OSError) -> TransportError:
    return TransportError("CAPTURE_SOURCE_UNAVAILABLE", f"Capture file {path!r} cannot be opened: {exc.strerror or exc}.",
                          "Check the path and the file's permissions.")


def _python_can_reader(path: str, fmt: str) -> Any:
    """Open python-can's reader for ``fmt`` (imported here: ``import can`` costs ~0.6 s).

    The class is picked from a fixed table, not through ``can.LogReader``, so an
    installed python-can reader plugin cannot take over a suffix.
    """
    try:
        if fmt == "asc":
            from can.io.asc import ASCReader as reader_class
        elif fmt == "blf":
            from can.io.blf import BLFReader as reader_class
        elif fmt == "trc":
            from can.io.trc import TRCReader as reader_class
        elif fmt == "csv":
            from can.io.csv import CSVReader as reader_class
        elif fmt == "db":
            from can.io.sqlite import SqliteReader as reader_class
        else:
            from can.io.mf4 import MF4Reader as reader_class
        from can.io.generic import TextIOMessageReader
    except ImportError as exc:  # pragma: no cover - python-can is a dependency
        raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED", f"No reader for .{fmt} files: {exc}.",
                             "Reinstall canarchy with its dependencies (python-can).") from None
    gz = path.lower().endswith(".gz")
    if gz and fmt in ("db", "mf4"):
        raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED", f"Compressed .{fmt} files cannot be read: {path!r}.",
                             f"Decompress it first (gunzip) and read the .{fmt} file.")
    try:
        if gz:
            text = issubclass(reader_class, TextIOMessageReader)
            handle = gzip.open(path, "rt" if text else "rb")
            return reader_class(handle)
        return reader_class(path)
    except ImportError as exc:  # MF4Reader without asammdf
        raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED", f"Reading .{fmt} needs a package that is missing: {exc}.",
                             "For MF4 files: pip install asammdf.") from None
    except OSError as exc:
        raise _unavailable(path, exc) from None
    except Exception as exc:  # the reader rejected the header
        raise DecodeError("CAPTURE_FORMAT_INVALID",
                          f"{path!r} is not a valid .{fmt} file: {exc.__class__.__name__}: {exc}.",
                          f"Check that the file really is .{fmt} (and complete), or convert it to candump -l (.log).") from None


def _from_message(message: Any) -> CanFrame:
    channel = message.channel
    channel = None if channel is None else str(channel)
    timestamp = float(message.timestamp)
    if message.is_remote_frame:
        return RemoteCanFrame(message.arbitration_id, b"", message.is_extended_id, False, True, timestamp, channel,
                              requested_dlc=message.dlc)
    data = bytes(message.data or b"")
    fd = bool(message.is_fd)
    return CanFrame(message.arbitration_id, data, message.is_extended_id, fd, False, timestamp, channel,
                    bitrate_switch=fd and bool(message.bitrate_switch),
                    error_state_indicator=fd and bool(message.error_state_indicator))
