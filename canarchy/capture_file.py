"""Reading recorded CAN traffic from capture files, one frame at a time, in memory that does not
grow with the file.

The format comes from the suffix (``.log``/``.candump``: canarchy's candump ``-l`` parser, the
layout of can-utils ``lib.c``; ``.asc``, ``.blf``, ``.trc``, ``.csv``, ``.mf4``, ``.db``: python-can's
readers; ``.jsonl``/``.json``: canarchy's own output); a trailing ``.gz`` is decompressed on the fly.
:class:`CaptureFile` yields frames; malformed lines are warnings (:mod:`canarchy.warning_log`), never
the end of the read. Errors: ``CAPTURE_SOURCE_UNAVAILABLE`` (exit 2), ``CAPTURE_FORMAT_UNSUPPORTED``
(1; also a ``.blf`` whose first container is compressed with a method python-can cannot read),
``CAPTURE_EMPTY``, ``CAPTURE_COMPRESSION_INVALID``, ``CAPTURE_FORMAT_INVALID`` (3).
Line formats, warnings and figures: docs/decoding.md.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import os
import sys
import zlib
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from canarchy.candump import (CLASSIC_HEX_LENGTHS, FD_HEX_LENGTHS, ErrorFrame, common_line, common_lines,
                              parse_candump_line)
from canarchy.errors import CanarchyError, DecodeError, TransportError, UserInputError
from canarchy.output import TIMESTAMP_TEXT
from canarchy.frames import TIMESTAMP_LIMIT, CanFrame
from canarchy.warning_log import WarningLog

CANDUMP_SUFFIXES = (".log", ".candump")
PYTHON_CAN_SUFFIXES = (".asc", ".blf", ".trc", ".csv", ".mf4", ".db")
#: canarchy's own output: ``--jsonl`` lines, a ``--json`` envelope (its ``frame``/``frame_sent`` events).
JSON_SUFFIXES = (".jsonl", ".json")
SUPPORTED_SUFFIXES = CANDUMP_SUFFIXES + PYTHON_CAN_SUFFIXES + JSON_SUFFIXES
#: Event types whose payload is a frame on the bus (``frame_planned`` of a dry run is not).
FRAME_EVENTS = frozenset({"frame", "frame_sent"})

_GZIP_MAGIC = b"\x1f\x8b"
_COMPRESSION_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
_READ_ERRORS = (OSError, EOFError, zlib.error)  # reading a file stops (a truncated .gz, a failing disk)
_MAX_SHOWN = 80  # characters of a bad line quoted in its warning
#: Lines the candump reader takes at a time (:meth:`CaptureFile._candump_batch`).
BATCH_LINES = 256
#: Characters of a candump line the reader holds (a CAN FD line has about 200): past them the line is malformed
#: and the rest of it is skipped in pieces of this size, so a file without line breaks is not held whole.
MAX_LINE = 4096
_LINE_ENDS = ("\n", "\r")
#: Characters of a ``--jsonl`` line the reader holds (a frame event has under 1,000), and of a ``--json``
#: document, which is parsed whole.
MAX_EVENT_LINE = 1 << 20
MAX_JSON_DOCUMENT = 64 << 20
#: Channel and ID pairs whose frame fields the candump reader keeps (a bounded cache).
MAX_KNOWN_IDS = 4096
#: What the candump reader keeps of a key of :data:`COMMON_LINE`: a frame's ``__dict__`` with that
#: key, and the data lengths (hex digits) such a frame can carry.
_Known = dict[str, tuple[dict[str, Any], frozenset[int]]]


class CaptureFile:
    """An open capture file: iterate it for :class:`~canarchy.frames.CanFrame` objects.

    Attributes (complete once iteration has finished):

    - ``path`` (str, as given), ``format`` (``"candump"`` or the python-can
      reader's name, e.g. ``"asc"``); ``stream``: read once as it comes (``-``, a pipe:
      see :func:`open_capture`), its lines handed out one at a time;
    - ``frame_count``: frames yielded; ``line_count``: lines read (candump only);
    - ``malformed_count``: lines (or messages) that gave no frame because they
      are damaged; ``error_frame_count``: error frames skipped;
    - ``log``: the :class:`~canarchy.warning_log.WarningLog` of the read (records
      naming the file and the line or message); :meth:`all_warnings` as strings.

    A read that ends without a single frame raises ``CAPTURE_EMPTY``,
    ``CAPTURE_COMPRESSION_INVALID`` or ``CAPTURE_FORMAT_INVALID``
    (``DecodeError``, exit 3). Iterate once: a second pass re-opens the file and
    resets the counters.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: str, stream: bool = False) -> None:
        self.path = str(path)
        self.format = fmt
        self.stream = stream
        self.frame_count = 0
        self.line_count = 0
        self.malformed_count = 0
        self.error_frame_count = 0
        self.log = WarningLog()
        self._stopped: BaseException | None = None

    def __iter__(self) -> Iterator[CanFrame]:
        self.frame_count = self.line_count = self.malformed_count = self.error_frame_count = 0
        self.log = WarningLog()
        self._stopped = None
        if self.format == "candump":
            return self._iter_candump()
        if self.format in ("jsonl", "json"):
            return self._iter_json()
        return self._iter_python_can()

    def all_warnings(self) -> list[str]:
        """The warnings of the read as strings (see :meth:`WarningLog.render`)."""
        return self.log.render()

    # -- internals ---------------------------------------------------------------------------

    def _end(self) -> None:
        """After the last frame: the error frames' record, or the error for a read without a frame."""
        if self.error_frame_count:
            self.log.add("CAPTURE_ERROR_FRAMES", f"{self.path}: {self.error_frame_count} error frame(s) "
                         "(CAN_ERR_FLAG) skipped", file=self.path, count=self.error_frame_count)
        if self.frame_count == 0 and self.error_frame_count == 0:
            raise self._no_frame()

    def _no_frame(self) -> CanarchyError:
        """The error for a read that gave no frame: why, from what the read saw."""
        first = self.log.records[0].message if self.log.records else None
        if isinstance(self._stopped, _COMPRESSION_ERRORS) and self.path.lower().endswith(".gz"):
            return compression_invalid(self.path, f"{self._stopped.__class__.__name__}: {self._stopped}")
        if self.format == "blf" and self._stopped is not None:
            from canarchy.blf import BlfCompressionUnsupported

            if isinstance(self._stopped, BlfCompressionUnsupported):
                return UserInputError("CAPTURE_FORMAT_UNSUPPORTED",
                                      f"{self.path!r} cannot be read: its {self._stopped}.",
                                      "Save the recording again uncompressed or zlib-compressed (what CANoe, CANalyzer "
                                      "and python-can write), or export it as .asc or candump -l (.log).")
        if self.malformed_count or self._stopped is not None or (not self.stream and _has_content(self.path)):
            reader = {"candump": "the candump -l", "json": "the canarchy --json", "jsonl": "the canarchy --jsonl"}.get(
                self.format, f"python-can's .{self.format}")
            return DecodeError("CAPTURE_FORMAT_INVALID",
                               f"{self.path!r} holds no CAN frame {reader} reader can read"
                               + (f" (first problem: {first})." if first else "."),
                               "A stream is read as candump -l text: pipe `candump -L` (not plain `candump`) "
                               "into canarchy, or save another format to a file and give that file."
                               if self.stream else f"Check that the file really is .{_suffix(self.path)} "
                               "(and complete), or convert it to candump -l (.log).")
        return capture_empty(self.path)

    def _open_text(self) -> io.TextIOBase:
        # Undecodable bytes become U+FFFD, which fails the line check below: a
        # warning for that line, not an exception for the whole file.
        # newline="": lines still end at LF, CRLF or CR, untranslated (split() drops the CR).
        # utf-8-sig: a byte order mark that an editor put before the first line is not part of that line.
        if self.path.lower().endswith(".gz"):
            return gzip.open(self.path, "rt", encoding="utf-8-sig", errors="replace", newline="")  # type: ignore[return-value]
        if self.path == "-":  # standard input, left open for the process
            return open(sys.stdin.fileno(), encoding="utf-8-sig", errors="replace", newline="", closefd=False)
        return open(self.path, encoding="utf-8-sig", errors="replace", newline="")

    def _iter_candump(self) -> Iterator[CanFrame]:
        try:
            handle = self._open_text()
        except OSError as exc:
            raise _unavailable(self.path, exc) from None
        known: _Known = {}
        with handle:
            batches = _line_batches(handle, 1 if self.stream else BATCH_LINES)  # a stream's frame as it comes
            try:
                for batch in batches:
                    yield from self._candump_batch(batch, known)
            except _READ_ERRORS as exc:  # e.g. a truncated .gz
                self._stopped = exc
                line = self.line_count + 1
                self.log.add("CAPTURE_READ_STOPPED", f"{self.path}:{line}: reading stopped: {exc}",
                             file=self.path, line=line)
        self._end()

    def _candump_batch(self, batch: list[str], known: _Known) -> Iterator[CanFrame]:
        """The frames of ``batch``, the next lines of the file.

        The lines of the common shape (:data:`~canarchy.candump.COMMON_LINE`) whose channel and ID ``known`` holds,
        with a data length such a frame can carry and a timestamp below
        :data:`~canarchy.frames.TIMESTAMP_LIMIT`, take the fast path: only their timestamp and data
        are converted, the other fields are those :func:`parse_candump_line` gave for the first line
        with that channel and ID. Every other line goes to :func:`parse_candump_line`
        (:meth:`_parse_line`). The frames and warnings are the same either way.
        """
        found: list[Any] = common_lines("".join(batch))
        if len(found) != len(batch):  # not every line has the common shape: look at each
            found = [None if match is None else match.groups() for match in map(common_line, batch)]
        first = self.line_count + 1
        lineno = first - 1
        frames = 0
        fromhex, new, set_ = bytes.fromhex, object.__new__, object.__setattr__
        try:
            # The reader's hot path: the frame is built here, not in a helper, to save a call per line.
            for lineno, parts in enumerate(found, first):
                key = None
                if parts is not None:
                    seconds, key, data, direction = parts
                    key += direction or ""  # the direction is a field the first line with the key fixes
                    entry = known.get(key)
                    stamp = float(seconds)
                    if entry is not None and len(data) in entry[1] and stamp < TIMESTAMP_LIMIT:
                        values = entry[0].copy()
                        values["data"] = fromhex(data)
                        values["timestamp"] = stamp
                        values[TIMESTAMP_TEXT] = seconds
                        frame = new(CanFrame)
                        set_(frame, "__dict__", values)
                        frames += 1
                        yield frame
                        continue
                frame = self._parse_line(batch[lineno - first], lineno, key, known)
                if frame is not None:
                    frames += 1
                    yield frame
        finally:
            self.line_count = lineno
            self.frame_count += frames

    def _parse_line(self, line: str, lineno: int, key: str | None, known: _Known) -> CanFrame | None:
        """:func:`parse_candump_line` of ``line``: its frame, or None (a blank line, or one counted and
        warned about). The frame of a common line is remembered under its ``key`` in ``known``."""
        try:
            if len(line) >= MAX_LINE and not line.endswith(_LINE_ENDS):  # cut by _line_batches
                raise ValueError(f"line longer than {MAX_LINE} characters")
            frame = parse_candump_line(line)
        except ErrorFrame:
            self.error_frame_count += 1
            return None
        except (ValueError, UserInputError) as exc:
            self.malformed_count += 1
            self.log.add("CANDUMP_LINE_MALFORMED", f"{self.path}:{lineno}: malformed candump line: "
                         f"{_why(exc)}: {_shown(line)}", file=self.path, line=lineno)
            return None
        if key is not None and frame is not None and len(known) < MAX_KNOWN_IDS:
            # Every line with this key has these ID fields; its data length must fit the frame.
            known[key] = (dict(frame.__dict__), FD_HEX_LENGTHS if frame.is_fd else CLASSIC_HEX_LENGTHS)
        return frame

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
                text = handle.read(MAX_JSON_DOCUMENT + 1)
                if len(text) > MAX_JSON_DOCUMENT:
                    raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED",
                                         f"{self.path!r} is a --json document over {MAX_JSON_DOCUMENT >> 20} MiB, "
                                         "and a --json document is read whole.",
                                         "Record with --jsonl (read as it streams), or convert this one: "
                                         f"`jq -c '.data.events[]' {self.path} > frames.jsonl`.")
                try:
                    document = json.loads(text)
                except ValueError as exc:
                    raise DecodeError("CAPTURE_FORMAT_INVALID", f"{self.path!r} is not a JSON document: {exc}.",
                                      "Give the output of a canarchy command run with --json.") from None
                data = document.get("data") if isinstance(document, dict) else None
                lines: Any = enumerate((data or {}).get("events") or [], 1)
                where = "event"
            else:
                lines = enumerate(BoundedLines(handle, MAX_EVENT_LINE), 1)
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
                    self.log.add("CAPTURE_EVENT_INVALID", f"{self.path}:{where} {number}: not a canarchy frame "
                                 f"event: {_why(exc)}", file=self.path, **{where: number})
                    continue
                if frame.is_error_frame:
                    self.error_frame_count += 1
                    continue
                self.frame_count += 1
                yield frame
        self._end()

    def _iter_python_can(self) -> Iterator[CanFrame]:
        """The frames of python-can's reader; what it logs while it reads a message (:mod:`canarchy.reader_log`)
        is a ``CAPTURE_READER_WARNING`` of that message, not a line on stderr."""
        from canarchy.capture_python_can import frame_of, open_reader
        from canarchy.reader_log import ReaderRecords

        reader = open_reader(self.path, self.format)
        one_based = self.format == "trc"  # python-can's TRC reader gives the file's bus number (1, 2 ...)
        index = 0

        def place(number: int) -> tuple[str, dict[str, Any]]:
            """Where message ``number`` is: its line in an .asc file (the reader's last), else its number."""
            line = getattr(reader, "line", 0)
            if line:
                return f"{self.path}:{line}", {"file": self.path, "line": line}
            return f"{self.path}: message {number}", {"file": self.path, "message_index": number}

        def logged(text: str) -> None:
            where, details = place(index + 1)
            self.log.add("CAPTURE_READER_WARNING", f"{where}: python-can's .{self.format} reader: {text}", **details)

        def malformed(number: int, line: str, exc: Exception) -> None:
            self.malformed_count += 1
            self.log.add("ASC_LINE_MALFORMED", f"{self.path}:{number}: malformed .asc line: {_why(exc)}: "
                         f"{_shown(line)}", file=self.path, line=number)

        if self.format == "asc":
            reader.on_malformed = malformed
        records = ReaderRecords(logged)
        try:
            iterator = iter(reader)
            while True:
                try:
                    with records:
                        message = next(iterator)
                except StopIteration:
                    break
                except Exception as exc:  # python-can's readers raise many types mid-file
                    self._stopped = exc
                    where, details = place(index + 1)
                    self.log.add("CAPTURE_READ_STOPPED", f"{where}: reading stopped: {exc.__class__.__name__}: {exc}",
                                 **details)
                    break
                index += 1
                if message.is_error_frame:
                    self.error_frame_count += 1
                    continue
                try:
                    frame = frame_of(message, one_based)
                except UserInputError as exc:
                    self.malformed_count += 1
                    where, details = place(index)
                    self.log.add("CAPTURE_FRAME_INVALID", f"{where}: invalid frame: {exc.message}", **details)
                    continue
                self.frame_count += 1
                yield frame
        finally:
            reader.stop()
        self._end()


def open_capture(path: str | os.PathLike[str], *, stream: bool = False) -> CaptureFile:
    """Check ``path`` and return a :class:`CaptureFile` ready to iterate.

    ``stream=True`` (a command that reads the recording once): ``-`` (standard input), a path under
    ``/dev/`` (``/dev/stdin``, ``/dev/fd/N``) or a pipe is read as it comes, as candump ``-l`` text
    (``.jsonl`` when a pipe's name ends so); any other suffix on a stream is ``CAPTURE_FORMAT_UNSUPPORTED``.
    Without it such a source is ``CAPTURE_SOURCE_UNAVAILABLE`` with how to save it first.

    The format comes from the suffix (see the module docstring). Raises
    ``TransportError`` ``CAPTURE_SOURCE_UNAVAILABLE`` (exit 2) when the file
    is missing, a directory or unreadable (checked first), then
    ``UserInputError`` ``CAPTURE_FORMAT_UNSUPPORTED`` (exit 1) for an unknown
    suffix or a missing reader, then ``DecodeError`` (exit 3) ``CAPTURE_EMPTY``
    (zero bytes) or ``CAPTURE_COMPRESSION_INVALID`` (a ``.gz`` without the gzip
    signature, or whose start does not decompress). Only the start is read.
    """
    text = str(path)
    target = Path(text)
    if stream and (text == "-" or text.startswith("/dev/") or (target.exists() and not target.is_file()
                                                                and not target.is_dir())):
        return CaptureFile(text, _stream_format(text), stream=True)
    if not target.is_file():
        raise _not_a_file(text, target)
    if not os.access(target, os.R_OK):
        raise TransportError("CAPTURE_SOURCE_UNAVAILABLE", f"Capture file {text!r} is not readable.",
                             "Check the file's permissions.")
    fmt = capture_format(text)
    if fmt == "mf4" and importlib.util.find_spec("asammdf") is None:
        raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED", f"Reading .mf4 files needs the asammdf package: {text!r}.",
                             "Install it (pip install asammdf), or export the recording as .blf, .asc or .log.")
    try:
        with open(target, "rb") as handle:
            head = handle.read(2)
    except OSError as exc:
        raise _unavailable(text, exc) from None
    if not head:
        raise capture_empty(text)
    if text.lower().endswith(".gz"):
        if head != _GZIP_MAGIC:
            raise compression_invalid(text, f"it does not start with the gzip signature 1F 8B (it starts {head.hex()})")
        try:
            with gzip.open(target, "rb") as handle:
                if not handle.read(1):
                    raise capture_empty(text)
        except _COMPRESSION_ERRORS as exc:
            raise compression_invalid(text, f"{exc.__class__.__name__}: {exc}") from None
    return CaptureFile(text, fmt)


def _not_a_file(text: str, target: Path) -> TransportError:
    """``CAPTURE_SOURCE_UNAVAILABLE`` for a path that is no regular file: a directory, a stream given to a
    command that reads a recording more than once, or nothing."""
    if target.is_dir():
        what, hint = "is a directory", "Give the recording's file, not its directory."
    elif target.exists() or text == "-":
        what = "is standard input" if text == "-" else "is not a regular file (a pipe, a device or a socket)"
        hint = ("This command reads a recording more than once: save the stream first, e.g. "
                "`candump -L can0 > drive.log`, and give that file (`capture --file -` and the decode commands "
                "read candump -l text from a pipe as it comes).")
    else:
        what, hint = "does not exist", ("Check the path (relative paths start at the current directory) and that "
                                        "the file was copied completely.")
    return TransportError("CAPTURE_SOURCE_UNAVAILABLE", f"Capture file {text!r} {what}.", hint)


def _stream_format(path: str) -> str:
    """The reader of a stream: ``"candump"`` (a name without a capture suffix too: ``-``, ``/dev/stdin``)
    or ``"jsonl"``; ``CAPTURE_FORMAT_UNSUPPORTED`` for a suffix that needs a file (or a ``.gz``)."""
    name = Path(path).name.lower()
    if path == "-" or not (name.endswith(".gz") or Path(name).suffix in SUPPORTED_SUFFIXES):
        return "candump"
    fmt = capture_format(path)
    if fmt in ("candump", "jsonl") and not name.endswith(".gz"):
        return fmt
    raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED",
                         f"{path!r} is a stream, and canarchy reads a stream only as candump -l text or "
                         f"canarchy --jsonl, not .{_suffix(path)}{'.gz' if name.endswith('.gz') else ''}.",
                         "Save it to a file and give that file, or pipe the text in: e.g. "
                         "`zcat drive.log.gz | canarchy capture --file -`.")


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


# --- internals --------------------------------------------------------------------------------


class BoundedLines:
    """The lines of a text ``handle``, each at most ``limit`` characters: a longer one is cut there, without its
    line end (the rest is read and dropped, in pieces of ``limit``), so a file without line breaks is never held
    whole and a reader sees the cut line as malformed. Iterable, with ``readline`` (whose ``size`` is not taken);
    other attributes (``close``, ``name``) are the handle's."""

    def __init__(self, handle: Any, limit: int = MAX_LINE) -> None:
        self._handle, self._limit = handle, limit

    def readline(self, size: int = -1) -> str:
        limit, readline = self._limit, self._handle.readline
        line = readline(limit)
        if len(line) == limit and not line.endswith(_LINE_ENDS):
            rest = line
            while len(rest) == limit and not rest.endswith(_LINE_ENDS):
                rest = readline(limit)
        return line

    def __iter__(self) -> BoundedLines:
        return self

    def __next__(self) -> str:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def _line_batches(handle: io.TextIOBase, size: int) -> Iterator[list[str]]:
    """The lines of ``handle`` (:class:`BoundedLines`) in lists of ``size`` (the last one shorter). When
    reading fails, the lines read before the failure come first, then the error."""
    batch: list[str] = []
    try:
        for line in BoundedLines(handle):
            batch.append(line)
            if len(batch) == size:
                yield batch
                batch = []
    except _READ_ERRORS:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def _why(exc: Exception) -> str:
    """Why a line or event is malformed, in words, with no full stop (a ``: line`` follows)."""
    if isinstance(exc, UserInputError):
        return exc.message.rstrip(".")
    text = str(exc)
    if text.startswith("could not convert string to float"):
        return "timestamp is not a number"
    if text.startswith("invalid literal for int()"):
        return "not a hex number" if "base 16" in text or "base" not in text else "not a number"
    if text.startswith(("not enough values to unpack", "string index out of range")):
        return "fields missing"
    return text


def _shown(line: str) -> str:
    text = line.rstrip("\r\n")
    return repr(text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...")


def capture_empty(path: str) -> DecodeError:
    """``CAPTURE_EMPTY`` (exit 3): the capture holds nothing (zero bytes, or only blank lines)."""
    return DecodeError("CAPTURE_EMPTY", f"Capture file {path!r} is empty: it holds no CAN frame.",
                       "Check that the recording ran (and was copied completely); nothing here can be read.")


def compression_invalid(path: str, why: str) -> DecodeError:
    """``CAPTURE_COMPRESSION_INVALID`` (exit 3): a ``.gz`` that does not decompress."""
    return DecodeError("CAPTURE_COMPRESSION_INVALID", f"{path!r} is not a gzip file: {why}.",
                       "Check the file: a name ending in .gz must be gzip-compressed "
                       f"(rename it to .{_suffix(path)} if it is not compressed).")


def _suffix(path: str) -> str:
    name = Path(path).name.lower()
    return Path(name[:-3] if name.endswith(".gz") else name).suffix[1:] or "log"


def _has_content(path: str, limit: int = 2**20) -> bool:
    """True when the first ``limit`` bytes (decompressed) hold anything but whitespace."""
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            return bool(handle.read(limit).strip())
    except (OSError, EOFError, zlib.error):
        return True


def _unavailable(path: str, exc: OSError) -> TransportError:
    return TransportError("CAPTURE_SOURCE_UNAVAILABLE",
                          f"Capture file {path!r} cannot be opened: {exc.strerror or exc}.",
                          "Check the path and the file's permissions.")
