"""Writing captured frames to a log file through python-can's writers (chosen by suffix from a fixed
table: ``.log`` candump, ``.asc``, ``.blf``, ``.trc``, ``.csv``; the text ones also gzipped, ``.log.gz``), frame by
frame. A ``.log`` frame's line
is canarchy's (:func:`_candump_line`; python-can's moves frames in time and drops raw DLCs), an error
frame's python-can's.

The file is written under a temporary name beside the target and renamed by
:meth:`CaptureWriter.close`: the target appears complete or not at all. What a format cannot hold
is said in :meth:`CaptureWriter.warnings`. Errors: ``CAPTURE_FORMAT_UNSUPPORTED``,
``CAPTURE_OUTPUT_EXISTS`` (exit 1), ``CAPTURE_WRITE_FAILED`` (exit 2). Details: docs/record-and-replay.md.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from canarchy.errors import TransportError, UserInputError
from canarchy.fileio import PendingFile, write_failure_hint
from canarchy.frame_syntax import format_frame
from canarchy.frames import CanFrame, to_message

WRITER_SUFFIXES = (".log", ".asc", ".blf", ".trc", ".csv")


def _writer_class(suffix: str) -> Any:
    if suffix == ".log":
        from can.io.canutils import CanutilsLogWriter as writer
    elif suffix == ".asc":
        from canarchy.asc import AscWriter as writer
    elif suffix == ".blf":
        from can.io.blf import BLFWriter as writer
    elif suffix == ".trc":
        from can.io.trc import TRCWriter as writer
    else:
        from can.io.csv import CSVWriter as writer
    return writer


def _failed(path: Path, exc: BaseException) -> TransportError:
    """``CAPTURE_WRITE_FAILED`` for ``exc``, with a hint for its cause: an ``OSError`` (by errno), or
    anything else the writer raised (a value the format cannot hold)."""
    if not isinstance(exc, OSError):
        fmt = "".join(path.suffixes[-2:]).lower() if path.suffix.lower() == ".gz" else path.suffix.lower()
        return TransportError("CAPTURE_WRITE_FAILED",
                              f"Cannot write {str(path)!r}: the {fmt} writer refused a frame: "
                              f"{exc.__class__.__name__}: {exc}.",
                              f"A frame holds a value that a {fmt} file cannot (such as a timestamp past the year "
                              "9999); write .log or --jsonl instead, or fix the recording.")
    return TransportError("CAPTURE_WRITE_FAILED", f"Cannot write {str(path)!r}: {exc.strerror or exc}.",
                          write_failure_hint(exc, f"the directory {str(path.parent)!r}"))


#: Channels whose merges :meth:`CaptureWriter.write` keeps track of (past them, a new channel's go unseen).
MAX_CHANNELS = 256


@functools.lru_cache(maxsize=MAX_CHANNELS)
def _written_channel(fmt: str, channel: str | None) -> str:
    """``channel`` as python-can's writer of format ``fmt`` writes it: ``.log`` ``canN`` for a number N and
    ``vcan0`` for none, ``.csv`` nothing, the others its number + 1 (1 without one)."""
    if fmt == "csv":
        return ""
    if fmt == "log":
        if channel is None:
            return "vcan0"
        return f"can{channel}" if channel.isdigit() else channel
    from can.util import channel2int

    number = channel2int(channel)
    return str(1 if number is None else number + 1)


def _candump_line(frame: CanFrame) -> str:
    """``frame`` as a candump ``-l`` line, its own timestamp and raw DLC kept (python-can 4.6's writer moves a
    frame stamped before the previous one to that one's time and drops a DLC above 8)."""
    return (f"({frame.timestamp:f}) {_written_channel('log', frame.channel)} {format_frame(frame)} "
            f"{'R' if frame.is_rx else 'T'}\n")


class CaptureWriter:
    """An open capture log (see the module docstring): :meth:`write` each frame, then :meth:`close`.

    ``path``: the target; ``format``: its suffix without the dot; ``frame_count``: frames written.
    """

    def __init__(self, path: str | os.PathLike[str], overwrite: bool = False) -> None:
        self.path = Path(path)
        compressed = self.path.suffix.lower() == ".gz"  # gzip, as python-can's Logger writes and canarchy reads
        suffix = (Path(self.path.stem) if compressed else self.path).suffix.lower()
        if suffix not in WRITER_SUFFIXES or (compressed and suffix == ".blf"):
            raise UserInputError("CAPTURE_FORMAT_UNSUPPORTED",
                                 f"--output {str(path)!r}: canarchy writes {', '.join(WRITER_SUFFIXES)} (the text "
                                 f"formats also .gz), not {''.join(self.path.suffixes[-2:]) or '(no suffix)'!r}.",
                                 "Name the file .log (candump -l), .asc, .blf, .trc or .csv, or .log.gz, .asc.gz, "
                                 ".trc.gz, .csv.gz (a .blf file compresses itself); --jsonl > FILE keeps canarchy's "
                                 "own events.")
        if self.path.exists() and not overwrite:
            raise UserInputError("CAPTURE_OUTPUT_EXISTS", f"--output {str(path)!r} exists.",
                                 "Choose another name, or add --overwrite to replace it when the capture ends.")
        if self.path.is_dir():
            raise UserInputError("CAPTURE_OUTPUT_EXISTS", f"--output {str(path)!r} is a directory.",
                                 "Give a file name, e.g. drive.log.")
        self.format = suffix[1:]
        self.frame_count = 0
        self._not_written = 0
        self._degraded = 0
        self._direction_lost = 0  # sent frames (is_rx false) written where the format has no direction
        self._channels: dict[str, str | None] = {}  # each channel as the file writes it: the first channel seen
        self._merged: dict[str, list[str | None]] = {}  # the same, for those written for two channels or more
        self._merged_frames = 0
        self._start: float | None = None  # .asc/.blf: the file's start, the first frame's whole millisecond
        self._before_start = 0  # frames stamped before it, which those files write at their start
        writer_class = _writer_class(suffix)
        self._pending: PendingFile | None = None
        try:
            umask = os.umask(0)
            os.umask(umask)
            # through a symlink, keeping a replaced file's bits, else as an ordinary new file's: as `>` writes
            self._pending = PendingFile(self.path, suffix=f".part{suffix}{'.gz' if compressed else ''}",
                                        new_mode=0o666 & ~umask)
            os.close(self._pending.fd)
            target: Any = self._pending.temp
            if compressed:
                import gzip

                target = gzip.open(target, "wt", encoding="utf-8")  # noqa: SIM115 - the writer closes it in stop()
            try:
                self._writer = writer_class(target)
            except BaseException:
                if compressed:
                    target.close()
                raise
            if hasattr(self._writer, "filepath"):  # python-can's TRC writer names its file in the header
                self._writer.filepath = str(self.path.resolve())
        except OSError as exc:
            self._discard()
            raise _failed(self.path, exc) from None
        self._closed = False

    def write(self, frame: CanFrame) -> None:
        """Append one frame (its own timestamp and channel). Raises ``CAPTURE_WRITE_FAILED``."""
        if self.format == "trc" and (frame.is_fd or frame.is_remote_frame):
            self._not_written += 1
            return
        if self.format == "csv" and frame.is_fd:
            self._degraded += 1
        if self.format == "csv" and not frame.is_rx:
            self._direction_lost += 1
        self._note_channel(frame.channel)
        if self.format in ("asc", "blf"):
            if self._start is None:
                self._start = int(frame.timestamp * 1000) / 1000  # as both writers count
            elif frame.timestamp < self._start:
                self._before_start += 1
        try:
            if self.format == "log" and not frame.is_error_frame:
                self._writer.file.write(_candump_line(frame))
            else:
                self._writer.on_message_received(to_message(frame, stamped=True))
        except Exception as exc:  # an OSError, or a value the format cannot hold (ValueError, OverflowError ...)
            self.close(keep=False)
            raise _failed(self.path, exc) from None
        self.frame_count += 1

    def _note_channel(self, channel: str | None) -> None:
        """Count a frame whose channel the file writes as another channel's (``can0`` and ``vcan0`` are
        both channel 1 of an ``.asc`` file; a ``.csv`` file has no channel)."""
        written = _written_channel(self.format, channel)
        if written not in self._channels:
            if len(self._channels) < MAX_CHANNELS:
                self._channels[written] = channel
            return
        first = self._channels[written]
        if first != channel:
            self._merged_frames += 1
            names = self._merged.setdefault(written, [first])
            if channel not in names and len(names) < 8:
                names.append(channel)

    def warnings(self) -> list[str]:
        """What the format could not hold of the frames written so far (see the module docstring)."""
        notes = []
        if self._not_written:
            notes.append(f"{self.path}: {self._not_written} CAN FD or remote frame(s) not written: python-can's "
                         "TRC writer cannot log them (use .log, .asc or .blf)")
        if self._degraded:
            notes.append(f"{self.path}: the CAN FD flags (FD, BRS, ESI) of {self._degraded} frame(s) are not in a "
                         ".csv file (use .blf or .asc to keep them)")
        if self._direction_lost:
            notes.append(f"{self.path}: {self._direction_lost} frame(s) were sent (T), which a .csv file cannot say: "
                         "they read back as received (use .log, .asc or .blf to keep it)")
        if self._before_start:
            notes.append(f"{self.path}: {self._before_start} frame(s) stamped before the first one are written at "
                         f"the file's start, {self._start:.3f}: a .{self.format} file holds times after its start "
                         "(use .log to keep them)")
        if self._merged_frames:
            groups = "; ".join(", ".join("none" if c is None else c for c in names)
                               + ("" if self.format == "csv" else f" as {written}")
                               for written, names in list(self._merged.items())[:8])
            how = {"csv": "has no channel", "log": "writes a number N as canN and no channel as vcan0"}.get(
                self.format, "numbers its channels by the digits of their names (1 without one)")
            notes.append(f"{self.path}: channels {groups}: a .{self.format} file {how}, so which of them "
                         f"{self._merged_frames} frame(s) were on is lost"
                         + ("" if self.format == "log" else " (.log keeps channel names)"))
        return notes

    def close(self, keep: bool = True) -> None:
        """Finish the file and rename it to the target (``keep=False``: remove it, whatever finishing it
        raised). Idempotent. Raises ``CAPTURE_WRITE_FAILED`` when the file cannot be finished (python-can
        writes some formats' headers only now); the temporary file is then removed too."""
        if self._closed:
            return
        self._closed = True
        replaced = False
        try:
            try:
                self._writer.stop()
            finally:
                handle = getattr(self._writer, "file", None)
                if handle is not None and not handle.closed:  # stop() failed before closing it
                    handle.close()
            if keep and self._pending is not None:
                self._pending.commit()
                replaced = True
        except Exception as exc:
            if keep:
                raise _failed(self.path, exc) from None
        finally:
            if not replaced:
                self._discard()

    def _discard(self) -> None:
        if self._pending is not None:
            self._pending.discard()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
