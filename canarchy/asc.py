"""Vector ASC files through python-can's reader and writer, with the recording's start time kept.

An ASC file holds offsets from the ``Begin Triggerblock`` line's date, which has milliseconds (what CANoe
writes: ``Mon Oct 25 19:00:55.020 2021``, local time). python-can 4.6 reads offsets only by default, writes
the milliseconds without leading zeros (``55.20`` for 20 ms) and starts the offsets at the first frame's
full timestamp, so its own files read back up to a second off. Here the writer puts the start at the first
frame's whole millisecond, zero-padded (the offsets keep the microseconds), and the reader reads absolute
times, taking a millisecond field of one or two digits as python-can's unpadded one.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from can.io.asc import ASCReader, ASCWriter

_SHORT_MILLISECONDS = re.compile(r"(:\d\d)\.(\d{1,2})(?=\s)")


#: The lines of an ASC file's header (python-can 4.6's ``ASCReader._extract_header``): what its loop reads on.
_HEADER_LINE = re.compile(r"(date\s|base\s+(hex|dec)|//|(no)?\s*internal\s+events\s+logged)", re.IGNORECASE)


class _Lines:
    """A text file's lines, of which the last one read can be put back (:attr:`back`)."""

    def __init__(self, file: Any) -> None:
        self.file, self.back, self.last = file, None, None

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        if self.back is not None:
            line, self.back = self.back, None
            return line
        self.last = next(self.file)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


class AscReader(ASCReader):
    """python-can's reader, timestamps in seconds since the epoch (from the trigger block's local date), a DLC
    above 8 of Classical CAN as the DLC field says (python-can 4.6 reads ``r a`` as 0 and ``d 9`` as 12), and
    the line that ends the header read as a line of the file (python-can 4.6 drops it: the first frame of a
    file without ``Begin Triggerblock`` or ``internal events logged``, or the trigger block's own line)."""

    def __init__(self, file: Any, **kwargs: Any) -> None:
        super().__init__(file, relative_timestamp=False, **kwargs)
        self.file = _Lines(self.file)

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
