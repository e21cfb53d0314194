"""Vector ASC files through python-can's reader and writer, with the recording's start time kept.

An ASC file holds offsets from the ``Begin Triggerblock`` line's date, which has milliseconds (what CANoe
writes: ``Mon Oct 25 19:00:55.020 2021``, local time). python-can 4.6 reads offsets only by default, writes
the milliseconds without leading zeros (``55.20`` for 20 ms) and starts the offsets at the first frame's
full timestamp, so its own files read back up to a second off. Here the writer puts the start at the first
frame's whole millisecond, zero-padded (the offsets keep the microseconds), and the reader reads absolute
times, taking a millisecond field of one or two digits as python-can's unpadded one, and the times of a
file whose header says ``timestamps relative`` as deltas to the previous event (python-can reads them as
offsets from the start).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from can import Message

from can.io.asc import ASC_MESSAGE_REGEX, ASC_TRIGGER_REGEX, ASCReader, ASCWriter

_SHORT_MILLISECONDS = re.compile(r"(:\d\d)\.(\d{1,2})(?=\s)")


#: The lines of an ASC file's header (python-can 4.6's ``ASCReader._extract_header``): what its loop reads on.
_HEADER_LINE = re.compile(r"(date\s|base\s+(hex|dec)|//|(no)?\s*internal\s+events\s+logged)", re.IGNORECASE)
#: An event line: its time in seconds, then the event.
_EVENT = re.compile(r"(\d+\.\d+)\s+(.*)")
#: The other lines an ASC file holds: a trigger block's start (without a date) or end, the header's lines.
_OTHER_LINE = re.compile(rf"(begin|end)\s+triggerblock\b|{_HEADER_LINE.pattern}", re.IGNORECASE)
#: An event that is a CAN frame however damaged: a bus number, then an ID (hex or decimal digits, ``x``
#: for 29 bits). Other events (``Start of measurement``, ``1  Statistic:``, ``CAN 1 Status:``, ``SV:``, other
#: buses' frames ...) are skipped, as python-can does.
_FRAME_EVENT = re.compile(r"\d+\s+[0-9a-f]+x?(\s|$)", re.IGNORECASE)


class _Lines:
    """A text file's lines, of which the last one read can be put back (:attr:`back`); :attr:`number`:
    the number of the line last read (from 1)."""

    def __init__(self, file: Any) -> None:
        self.file, self.back, self.last, self.number = file, None, None, 0

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        if self.back is not None:
            line, self.back = self.back, None
            return line
        self.last = next(self.file)
        self.number += 1
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


class AscReader(ASCReader):
    """python-can's reader, timestamps in seconds since the epoch (from the trigger block's local date), a DLC
    above 8 of Classical CAN as the DLC field says (python-can 4.6 reads ``r a`` as 0 and ``d 9`` as 12), and
    the line that ends the header read as a line of the file (python-can 4.6 drops it: the first frame of a
    file without ``Begin Triggerblock`` or ``internal events logged``, or the trigger block's own line), and
    the times of ``timestamps relative`` added up (:meth:`__iter__`)."""

    def __init__(self, file: Any, **kwargs: Any) -> None:
        super().__init__(file, relative_timestamp=False, **kwargs)
        self.file = _Lines(self.file)
        #: The number of the line last read (from 1): a message's line while it is handed out.
        self.line = 0
        #: Called with the number, the text and the error of each malformed line (skipped either way).
        self.on_malformed: Callable[[int, str, Exception], None] | None = None

    def __iter__(self) -> Iterator[Message]:
        """python-can 4.6's loop, with each event's time as the header says: ``timestamps relative`` (each
        time the delta to the previous event, whatever its kind) summed up from the trigger block's start;
        python-can takes every time as an offset from that start. A line that is no header, comment, trigger
        block or event line, and a frame event python-can's parsers reject, go to :attr:`on_malformed`
        (python-can skips both without a word, and a frame it cannot parse ends its read)."""
        self._extract_header()
        relative = self.timestamps_format == "relative"
        clock = 0.0
        for raw in self.file:
            self.line = self.file.number
            line = raw.strip()
            trigger = ASC_TRIGGER_REGEX.match(line)
            if trigger:
                self.start_time = self._datetime_to_timestamp(trigger["datetime_string"])
                clock = 0.0
                continue
            event = _EVENT.match(line)
            if event is None:
                if line and not _OTHER_LINE.match(line):
                    self._malformed(raw, ValueError("not a header, comment, frame or event line"))
                continue
            offset = float(event[1])
            if relative:
                clock += offset
                offset = clock
            if ASC_MESSAGE_REGEX.match(line) or _FRAME_EVENT.match(event[2]):
                try:
                    message = self._frame(event[2], offset)
                except (ValueError, IndexError) as exc:  # python-can's frame parsers
                    self._malformed(raw, exc)
                    continue
                yield message
        self.stop()

    def _malformed(self, line: str, exc: Exception) -> None:
        if self.on_malformed is not None:
            self.on_malformed(self.line, line, exc)

    def _frame(self, event: str, offset: float) -> Message:
        """The message of a frame event (``1  123  Rx  d 2 11 22``, ``CANFD  1 Rx ...``) at ``offset``."""
        channel, rest = event.split(None, 1)
        fields: dict[str, Any] = {"timestamp": offset + self.start_time}
        if channel == "CANFD":
            fields["is_fd"] = True
            return self._process_fd_can_frame(rest, fields)
        fields["channel"] = int(channel) - 1  # as python-can: bus 1 is channel 0
        return self._process_classic_can_frame(rest, fields)

    def _extract_header(self) -> None:
        super()._extract_header()
        last = self.file.last
        if last is not None and not _HEADER_LINE.match(last.strip()):
            self.file.back = last

    def _process_classic_can_frame(self, line: str, msg_kwargs: dict[str, Any]) -> Any:
        message = super()._process_classic_can_frame(line, msg_kwargs)
        fields = line.split(None, 4)
        if len(fields) > 3 and fields[2].lower() in ("r", "d"):
            try:
                dlc = int(fields[3], self._converted_base)
            except ValueError:
                return message
            if 8 < dlc <= 15:
                message.dlc = dlc
        return message

    @staticmethod
    def _datetime_to_timestamp(datetime_string: str) -> float:
        padded = _SHORT_MILLISECONDS.sub(lambda m: f"{m[1]}.{m[2].zfill(3)}", datetime_string)
        return ASCReader._datetime_to_timestamp(padded)


class AscWriter(ASCWriter):
    """python-can's writer with the trigger block at the first frame's millisecond, written with 3 digits, and an
    event stamped before that at offset 0 (python-can writes its absolute time as the offset: decades later)."""

    def _format_header_datetime(self, dt: datetime) -> str:
        return dt.strftime(self.FORMAT_DATE.format(f"{dt.microsecond // 1000:03d}"))

    def log_event(self, message: str, timestamp: float | None = None) -> None:
        if not self.header_written and timestamp:
            start = int(timestamp * 1000) / 1000  # whole milliseconds: what the header can say
            self.file.write(f"Begin Triggerblock {self._format_header_datetime(datetime.fromtimestamp(start))}\n")
            self.header_written = True
            self.started = self.last_timestamp = start
            super().log_event("Start of measurement", start)
        if timestamp is not None and timestamp < self.started:
            timestamp = self.started
        super().log_event(message, timestamp)
