"""python-can's readers as a capture source: the reader for a suffix's format, and each message it
yields as a :class:`~canarchy.frames.CanFrame`. Imported by :class:`~canarchy.capture_file.CaptureFile` only
when it reads such a file: importing python-can takes longer than a whole command that does not need it
(docs/benchmarks.md, "Command start-up").
"""

from __future__ import annotations

import gzip
from typing import Any

from canarchy.capture_file import _COMPRESSION_ERRORS, BoundedLines, _unavailable, compression_invalid
from canarchy.errors import DecodeError, UserInputError
from canarchy.frames import CAN_FD_DLCS, CanFrame, checked_timestamp


def open_reader(path: str, fmt: str) -> Any:
    """Open python-can's reader for ``fmt`` on ``path`` (a ``.gz`` decompressed as it is read).

    The class is picked from a fixed table, not through ``can.LogReader``, so an
    installed python-can reader plugin cannot take over a suffix.
    """
    try:
        if fmt == "asc":
            from canarchy.asc import AscReader as reader_class
        elif fmt == "blf":
            from canarchy.blf import BlfReader as reader_class
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
        if issubclass(reader_class, TextIOMessageReader):  # lines bounded: a file without line breaks is not held
            opened = gzip.open(path, "rt", errors="replace") if gz else open(path, errors="replace")  # noqa: SIM115
            return _constructed(reader_class, BoundedLines(opened))  # the reader owns it and closes it
        if gz:
            return _constructed(reader_class, gzip.open(path, "rb"))
        return _constructed(reader_class, path)
    except ImportError as exc:  # a reader's optional dependency
        raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED", f"Reading .{fmt} needs a package that is missing: {exc}.",
                             "For MF4 files: pip install asammdf.") from None
    except _COMPRESSION_ERRORS as exc:
        raise compression_invalid(path, f"{exc.__class__.__name__}: {exc}") from None
    except OSError as exc:
        raise _unavailable(path, exc) from None
    except Exception as exc:  # the reader rejected the header
        raise DecodeError("CAPTURE_FORMAT_INVALID",
                          f"{path!r} is not a valid .{fmt} file: {exc.__class__.__name__}: {exc}.",
                          f"Check that the file really is .{fmt} (and complete), "
                          "or convert it to candump -l (.log).") from None


def _constructed(reader_class: type, source: Any) -> Any:
    """``reader_class(source)``, with what it opened closed when it rejects the file: python-can's readers open
    the file before they read its header, and leave it open when the header is bad."""
    reader = reader_class.__new__(reader_class)
    try:
        reader.__init__(source)
    except BaseException:
        for opened in (getattr(reader, "file", None), source):
            if hasattr(opened, "close"):
                opened.close()
        raise
    return reader


def _data_of(message: Any, fd: bool) -> bytes:
    """The data bytes of a python-can data frame; ``UserInputError`` when it holds fewer than its DLC says."""
    data = bytes(message.data or b"")
    dlc = message.dlc
    if isinstance(dlc, int) and len(data) < (dlc if fd else min(dlc, 8)):
        raise UserInputError("INVALID_FRAME", f"its DLC says {dlc} data byte(s), it holds {len(data)}",
                             "Check the line in the file: data bytes are missing.")
    return data


def frame_of(message: Any, one_based: bool = False) -> CanFrame:
    """The frame of a python-can message. CAN FD has no remote frames: python-can's ASC reader reports a
    CAN FD frame without data as ``is_remote_frame`` (and ``is_fd``), which is that frame. A payload
    longer than 8 bytes of a CAN FD length is a CAN FD frame: a python-can CSV file has no FD flag.
    ``one_based``: the message's channel is the file's number (bus 1 = channel 0, as python-can's ASC and
    BLF readers and writers count). A message holding fewer data bytes than its DLC says (an ``.asc`` line
    ``d 2 33``) raises ``UserInputError`` ``INVALID_FRAME``."""
    channel = message.channel
    if one_based and isinstance(channel, int) and channel > 0:
        channel -= 1
    channel = None if channel is None else str(channel)
    timestamp = checked_timestamp(float(message.timestamp))
    fd = bool(message.is_fd)
    if message.is_remote_frame and not fd:
        return CanFrame(message.arbitration_id, b"", message.is_extended_id, False, True, timestamp, channel,
                        requested_dlc=message.dlc, is_rx=bool(message.is_rx))
    data = b"" if message.is_remote_frame else _data_of(message, fd)
    if not fd and len(data) > 8 and len(data) in CAN_FD_DLCS:
        fd = True
    raw = message.dlc if not fd and len(data) == 8 and 8 < message.dlc <= 15 else 0  # a raw DLC (BLF, ASC)
    return CanFrame(message.arbitration_id, data, message.is_extended_id, fd, False, timestamp, channel,
                    bool(fd and message.bitrate_switch), bool(fd and message.error_state_indicator),
                    is_rx=bool(message.is_rx), len8_dlc=raw)
