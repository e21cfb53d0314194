"""canarchy's output: the command result, events, the envelope and the one printer.

A handler returns a :class:`CommandResult` (the envelope's ``data`` and
``warnings``). A command with events opens an :class:`EventStream` with
:func:`open_stream` and emits each event as it happens; the :class:`Printer`
(made by ``canarchy.cli.main``) writes it in the requested format (``--jsonl``
lines of a stream that is not live :data:`PENDING_LINES` at a time) and
closes with the envelope, so memory does not grow with the number of events:
``--text`` one line per event then the summary, ``--jsonl`` one JSON line per
event then the envelope line, ``--json`` one envelope whose ``data.events``
is streamed through a temporary spool file. Every JSON text has sorted keys.

A reader that goes away (EPIPE) raises :class:`OutputClosed`, any other failed write
(a full disk, a file size limit) :class:`OutputFailed`; Ctrl+C or
SIGTERM inside :meth:`EventStream.stoppable` ends the stream cleanly.
Shapes and API: ``docs/design/cli.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO
from collections.abc import Callable, Iterator

from canarchy.errors import CanarchyError, one_full_stop

OUTPUT_FORMATS = ("text", "json", "jsonl")
#: Bytes of ``--json`` events kept in memory before the spool moves to a temporary file.
SPOOL_MEMORY_BYTES = 4 * 2**20
#: ``--jsonl`` lines of a stream that is not live held before they are written in one go.
PENDING_LINES = 256
#: Different channels (and flags) whose constant JSON text a frame writer keeps.
_MAX_FRAME_PARTS = 1024
_EVENT_INDENT = "\n      "  # an event's place in the indented envelope: data -> events -> item
#: A frame read from text may carry, under this key of its ``__dict__`` (not a field: equality and
#: ``repr`` ignore it), its timestamp as written in the file when that is a JSON number (digits,
#: one '.', no leading zero); :func:`frame_json_writer` writes that text: it parses to the very
#: float of ``frame.timestamp``, and saves formatting the float.
TIMESTAMP_TEXT = "_timestamp_text"


class ShownWarning(str):
    """A warning already written to stderr as the command started (the active-transmit preflight): the
    envelope keeps it; ``--text``, which says it on stderr too, does not repeat it at the end."""


@dataclass
class CommandResult:
    """What a handler returns: ``data`` (the envelope's ``data``, JSON-serialisable)
    and ``warnings`` (human-readable strings). Events go through :func:`open_stream`."""

    data: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


class OutputClosed(BaseException):
    """The reader of the output went away (a closed pipe): stop quietly.

    A ``BaseException`` (like ``KeyboardInterrupt``), so that a handler's
    ``except Exception`` does not swallow it.
    """


class OutputFailed(BaseException):
    """Writing the output failed for another reason than a closed pipe (``reason``: the
    ``OSError``, e.g. ENOSPC or EFBIG). A ``BaseException`` like :class:`OutputClosed`;
    ``canarchy.cli.main`` reports it on stderr as ``OUTPUT_WRITE_FAILED``."""

    def __init__(self, reason: OSError) -> None:
        super().__init__(reason)
        self.reason = reason


def make_event(event_type: str, payload: dict[str, Any], source: str, timestamp: float | None = None) -> dict[str, Any]:
    """One event ``{event_type, payload, source, timestamp}``; ``timestamp`` is
    seconds since the Unix epoch, now when omitted."""
    return {"event_type": event_type, "payload": payload, "source": source,
            "timestamp": time.time() if timestamp is None else timestamp}


def envelope(command: str, result: CommandResult | None, error: CanarchyError | None) -> dict[str, Any]:
    """The envelope ``{ok, command, data, warnings, errors}`` (no ``data.events``)."""
    return {
        "ok": error is None,
        "command": command,
        "data": dict(result.data) if result is not None else {},
        "warnings": [one_full_stop(text) for text in result.warnings] if result is not None else [],
        "errors": [error.to_dict()] if error is not None else [],
    }


def _not_serialisable(obj: Any) -> Any:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def json_encoder() -> Callable[[Any], str]:
    """A reusable encoder: ``encode(obj)`` is ``json.dumps(obj, sort_keys=True)``, without
    building a new encoder per call (CPython's C encoder when available)."""
    try:
        from json.encoder import c_make_encoder, encode_basestring_ascii
    except ImportError:  # pragma: no cover - only without CPython's _json
        c_make_encoder = None
    if c_make_encoder is None:  # pragma: no cover
        return json.JSONEncoder(sort_keys=True).encode
    chunks = c_make_encoder(None, _not_serialisable, encode_basestring_ascii, None, ": ", ", ", True, False, True)
    join = "".join

    def encode(obj: Any) -> str:
        return join(chunks(obj, 0))
    return encode


class EventStream:
    """Where a command's events go, as they happen (get one with :func:`open_stream`).

    :meth:`emit` writes one event in the printer's format (``keep=False``:
    counted only, as for ``--summary``); ``count`` is the number emitted;
    ``stopped_by`` is ``"SIGINT"``/``"SIGTERM"`` after :meth:`stoppable`
    caught one, else None. Raises :class:`OutputClosed` when the reader is gone.
    """

    def __init__(self, printer: Printer, source: str, *, live: bool, keep: bool, finite: bool = False) -> None:
        self.source = source
        self.finite = finite
        self.count = 0
        self.stopped_by: str | None = None
        self._printer = printer
        self._live = live
        self._keep = keep
        self._encode = printer.encode
        self._render = printer.render_event
        self._fmt = printer.fmt
        self._spool: Any = None
        self._frame_json: Any = None  # None: not tried yet; False: differs from to_payload, not used
        self._lines = printer.pending_lines
        self._batched = printer.fmt == "jsonl" and not live  # lines held, written PENDING_LINES at a time

    def emit(self, event_type: str, payload: dict[str, Any], timestamp: float | None = None,
             source: str | None = None) -> None:
        """Write one event ``{event_type, payload, source, timestamp}`` (``source``:
        the stream's unless given; ``timestamp``: now unless given)."""
        self.count += 1
        if not self._keep:
            return
        event = {"event_type": event_type, "payload": payload, "source": self.source if source is None else source,
                 "timestamp": time.time() if timestamp is None else timestamp}
        fmt = self._fmt
        if self._batched:
            self._printer.write_line(self._encode(event))
        elif fmt == "jsonl":
            self._printer.write(self._encode(event) + "\n", flush=True)
        elif fmt == "json":
            self._spool_write(self._encode(event))
        elif self._render is not None:
            line = self._render(event)
            if line is not None:
                self._printer.write(line + "\n", flush=self._live)

    def emit_frame(self, event_type: str, frame: Any) -> None:
        """:meth:`emit` of ``(event_type, frame.to_payload(), frame.timestamp)`` for a
        :class:`~canarchy.frames.CanFrame`, with its JSON written directly (about half
        the time of encoding the payload dict). The first frame of a stream is written
        both ways and compared: if they ever differ, every frame takes :meth:`emit`."""
        write = self._frame_json
        text = write(event_type, frame) if write else None
        if text is None:
            if self._fmt == "text" or not self._keep or write is False:
                self.emit(event_type, frame.to_payload(), frame.timestamp)
                return
            text = self._encode({"event_type": event_type, "payload": frame.to_payload(), "source": self.source,
                                 "timestamp": frame.timestamp})
            if write is None:
                write = frame_json_writer(self._encode, self.source)
                fast = write(event_type, frame)
                self._frame_json = write if fast is not None and json.loads(fast) == json.loads(text) else False
                if self._frame_json:
                    text = fast  # the same JSON, the timestamp as the file wrote it, like every later frame
        self.count += 1
        if self._batched:
            lines = self._lines
            lines.append(text)
            if len(lines) >= PENDING_LINES:
                self._printer.write_lines()
        elif self._fmt == "jsonl":
            self._printer.write(text + "\n", flush=True)
        else:
            self._spool_write(text)

    def _spool_write(self, text: str) -> None:
        if self._spool is None:
            self._spool = tempfile.SpooledTemporaryFile(SPOOL_MEMORY_BYTES, mode="w+", encoding="utf-8")  # noqa: SIM115 (kept open for the stream, _close() closes it)
            self._spool.write(_EVENT_INDENT + text)  # one write per event: Ctrl+C never splits one
        else:
            self._spool.write("," + _EVENT_INDENT + text)

    @contextmanager
    def stoppable(self) -> Iterator[EventStream]:
        """A block that Ctrl+C (or SIGTERM, which ``canarchy.cli.main`` turns into
        ``KeyboardInterrupt``) ends without an error: ``stopped_by`` says which; the
        code after the block reports what was done."""
        try:
            yield self
        except KeyboardInterrupt as exc:
            self.stopped_by = str(exc) if str(exc) in ("SIGTERM", "SIGINT") else "SIGINT"

    @property
    def cut_short(self) -> bool:
        """Stopped by a signal before the end of a file it reads (``finite``; not a bus, a pipe or an endless
        plan, whose end a signal is): the command exits 128 + the signal's number, and keeps no output file."""
        return self.stopped_by is not None and self.finite

    def _write_events_json(self, write: Callable[[str], None]) -> None:
        if self._spool is None:
            write("[]")
            return
        write("[")
        self._spool.seek(0)
        shutil.copyfileobj(self._spool, _Writer(write), 2**16)
        write("\n    ]")

    def _close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None


def frame_json_writer(encode: Callable[[Any], str], source: str) -> Callable[[str, Any], str | None]:
    """``write(event_type, frame)``: the JSON text of a frame event written from the frame's
    attributes: the same JSON as ``encode({event_type, payload: frame.to_payload(), source,
    timestamp})`` with sorted keys (:meth:`EventStream.emit_frame` checks that on the first
    frame), the timestamp as the file wrote it when it can (:data:`TIMESTAMP_TEXT`); None for a
    timestamp that is not a finite float (the encoder spells those)."""
    tail = f', "source": {encode(source)}, "timestamp": '
    parts: dict[tuple[Any, ...], tuple[str, str, str]] = {}
    float_repr = float.__repr__

    def write(event_type: str, frame: Any) -> str | None:
        stamp = frame.timestamp
        if stamp.__class__ is not float or stamp - stamp != 0.0:
            return None
        remote = frame.is_remote_frame
        # What is neither ID, data, DLC nor timestamp: the same for most frames of a stream.
        key = (event_type, frame.channel, frame.bitrate_switch, frame.error_state_indicator, frame.is_error_frame,
               frame.is_extended_id, frame.is_fd, remote, frame.is_rx)
        fixed = parts.get(key)
        if fixed is None:
            fixed = _frame_json_parts(encode, *key)
            if len(parts) < _MAX_FRAME_PARTS:
                parts[key] = fixed
        head, after_id, middle = fixed
        ts = frame.__dict__.get(TIMESTAMP_TEXT) or float_repr(stamp)
        data = frame.data
        return (f'{head}{frame.arbitration_id:d}{after_id}{data.hex()}", "dlc": '
                f'{frame.requested_dlc if remote else frame.len8_dlc or len(data):d}{middle}{ts}}}{tail}{ts}}}')
    return write


def _frame_json_parts(encode: Callable[[Any], str], event_type: str, channel: Any,
                      *flags: bool) -> tuple[str, str, str]:
    """The constant text of a frame event (:func:`frame_json_writer`), keys sorted: before the ID,
    between the ID and the data, between the DLC and the timestamp. ``flags``: bitrate_switch,
    error_state_indicator, is_error_frame, is_extended_id, is_fd, is_remote_frame, is_rx."""
    brs, esi, error, extended, fd, remote, rx = (encode(bool(flag)) for flag in flags)
    return (f'{{"event_type": {encode(event_type)}, "payload": {{"arbitration_id": ',
            f', "bitrate_switch": {brs}, "channel": {encode(channel)}, "data": "',
            f', "error_state_indicator": {esi}, "is_error_frame": {error}, "is_extended_id": {extended}, '
            f'"is_fd": {fd}, "is_remote_frame": {remote}, "is_rx": {rx}, "timestamp": ')


class _Writer:
    """A file-like ``write`` for :func:`shutil.copyfileobj`."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write


def open_stream(args: argparse.Namespace, source: str, *, live: bool = False, keep: bool = True,
                finite: bool = False) -> EventStream:
    """The event stream of the running command (one per command; ``data.events`` in ``--json``).

    ``source`` is the events' default source (e.g. ``"file:x.log"``,
    ``"capture:can0"``); ``live=True`` flushes each event (a bus, not a file);
    ``keep=False`` counts events without printing them (``--summary``); ``finite=True``: the events come from
    a file read to its end, which a signal can cut short (:attr:`EventStream.cut_short`).
    """
    return args.printer.stream(source, live=live, keep=keep, finite=finite)


class Printer:
    """The one printer of a command's output on ``out`` (see the module docstring).

    ``fmt``: ``text``, ``json`` or ``jsonl``; ``render_event(event) -> str | None``:
    an event's ``--text`` line; ``render_text(result) -> str``: the ``--text``
    summary (default: ``key: value`` lines). :meth:`finish` writes the end; in ``--text``
    the error or the warnings go to ``err`` (stderr), as can-utils and cantools say theirs.
    """

    def __init__(self, fmt: str, out: TextIO, command: str = "canarchy",
                 render_event: Callable[[dict[str, Any]], str | None] | None = None,
                 render_text: Callable[[CommandResult], str] | None = None, err: TextIO | None = None) -> None:
        self.fmt = fmt
        self.out = out
        self.err = err  # where --text says errors and warnings (None: sys.stderr at the time)
        self.command = command
        self.render_event = render_event
        self.render_text = render_text
        self.encode = json_encoder()
        self.events: EventStream | None = None
        #: ``--jsonl`` lines held by :meth:`write_line`, written by the next write.
        self.pending_lines: list[str] = []
        self._torn = False  # an interrupt cut a write short: the last line may be unfinished

    def stream(self, source: str, *, live: bool = False, keep: bool = True, finite: bool = False) -> EventStream:
        """The command's :class:`EventStream` (made on the first call)."""
        if self.events is None:
            self.events = EventStream(self, source, live=live, keep=keep, finite=finite)
        return self.events

    def write(self, text: str, flush: bool = False) -> None:
        """Write ``text`` to ``out``, after the lines held (``--text``: through :func:`terminal_safe`); raises
        :class:`OutputClosed` on a closed pipe, :class:`OutputFailed` on any other failed write."""
        self.write_lines()
        if self.fmt == "text":
            text = terminal_safe(text)
        try:
            self.out.write(text)
            if flush:
                self.out.flush()
        except BrokenPipeError:
            raise OutputClosed from None
        except OSError as exc:
            raise OutputFailed(exc) from None
        except KeyboardInterrupt:
            self._torn = True  # Ctrl+C or SIGTERM inside a blocked write: part of ``text`` may be out
            raise

    def write_line(self, text: str) -> None:
        """Write ``text`` and a newline with the next write, or with the :data:`PENDING_LINES` th line
        held: one write for many events (they are whole lines: Ctrl+C never splits one)."""
        self.pending_lines.append(text)
        if len(self.pending_lines) >= PENDING_LINES:
            self.write_lines()

    def write_lines(self) -> None:
        """Write the lines held by :meth:`write_line`; raises :class:`OutputClosed` on a closed pipe,
        :class:`OutputFailed` on any other failed write."""
        lines = self.pending_lines
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        try:
            self.out.write(text)
        except BrokenPipeError:
            raise OutputClosed from None
        except OSError as exc:
            raise OutputFailed(exc) from None
        except KeyboardInterrupt:
            self._torn = True
            raise
        finally:
            lines.clear()  # written, or the reader is gone: never written twice

    def finish(self, result: CommandResult | None, error: CanarchyError | None) -> None:
        """Write the end of the output: the ``--json`` envelope (with the streamed
        events), the ``--jsonl`` closing envelope line, or the ``--text`` summary
        or error. ``result`` and ``error`` None: the command was interrupted
        before it could report. Either way an interrupted command's ``data``
        says ``stopped_by`` (``SIGINT``, ``SIGTERM``)."""
        cut = ""
        try:
            if result is None and error is None:
                if self.events is None:
                    return
                result = CommandResult(data={"stopped_by": self.events.stopped_by or "SIGINT"})
            elif result is not None and self.events is not None and self.events.stopped_by \
                    and "stopped_by" not in result.data:
                # stopped inside its stoppable block (a file read, a decode): what it reports is a part
                result.data["stopped_by"] = self.events.stopped_by
                cut = f"\nstopped by {self.events.stopped_by}: the above covers only the input read before it"
            env = envelope(self.command, result, error)
            if self._torn and self.fmt != "json":
                self.write("\n")  # the closing line starts a line of its own, after what was cut short
            if self.fmt == "jsonl":
                self.write(self.encode(env) + "\n")
            elif self.fmt == "json":
                self._finish_json(env, error is None and self.events is not None and self.events._keep)
            else:
                text, said = self._text(result, error, env["warnings"], cut)
                if text:
                    self.write(text + "\n")
            self.write("", flush=True)
            if self.fmt == "text":
                self.say(said)  # after stdout, so the two streams read in order on one terminal
        finally:
            if self.events is not None:
                self.events._close()

    def _finish_json(self, env: dict[str, Any], with_events: bool) -> None:
        if not with_events:
            self.write(json.dumps(env, sort_keys=True, indent=2) + "\n")
            return
        token = f"canarchy-events-{uuid.uuid4().hex}"
        env["data"]["events"] = token
        head, tail = json.dumps(env, sort_keys=True, indent=2).split(json.dumps(token), 1)
        self.write(head)
        assert self.events is not None
        self.events._write_events_json(self.write)
        self.write(tail + "\n")

    def _text(self, result: CommandResult | None, error: CanarchyError | None, warnings: list[str],
              cut: str) -> tuple[str, str]:
        """The ``--text`` end: ``(the summary and cut (what says the read was stopped), for stdout; the error,
        or the warnings (the envelope's), for stderr)``."""
        if error is not None:
            return "", f"error: {error.code}: {error.message}\nhint: {error.hint}"
        assert result is not None
        text = (self.render_text or default_text)(result) + cut
        counts = result.data.get("warning_counts")
        said = "warnings by kind: " + ", ".join(f"{code} {count}" for code, count in counts.items()) if counts else ""
        shown = {one_full_stop(w) for w in result.warnings if isinstance(w, ShownWarning)}
        said += "".join(f"\nwarning: {w}" for w in warnings if w not in shown)
        return text, said.lstrip("\n")

    def say(self, text: str) -> None:
        """Write ``text`` (lines, escaped as :func:`terminal_safe`) to ``err``; a stderr that cannot be
        written loses them, and nothing else."""
        err = self.err if self.err is not None else sys.stderr
        if not text or err is None:
            return
        try:
            err.write(terminal_safe(text) + "\n")
            err.flush()
        except (OSError, ValueError):
            pass


#: Terminal control characters (C0 but tab and newline, DEL, C1) and the text that shows each instead.
_CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def terminal_safe(text: str) -> str:
    """``text`` with every terminal control character (C0 but tab and newline, DEL, C1) written as its escape
    (ESC as ``\\x1b``): what came from input (a channel name, a DBC's text) cannot steer the terminal."""
    return text.translate(_CONTROL_ESCAPES)  # ASCII text: CPython's fast path, under 1 ns a character


def number_text(value: Any, none: str = "-") -> str:
    """A value for ``--text``: a float exactly as JSON writes it (the shortest text that reads back as the
    same float: ``536870911.875``, never rounded), None as ``none``, anything else ``str``."""
    if isinstance(value, float):
        return repr(value)
    return none if value is None else str(value)


def default_text(result: CommandResult) -> str:
    """``key: value`` lines of ``result.data``, keys sorted, nested values as JSON."""
    lines = []
    for key in sorted(result.data):
        value = result.data[key]
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        lines.append(f"{key}: {value}")
    return "\n".join(lines)
