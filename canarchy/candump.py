"""One candump ``-l`` log line as a frame, in the layout can-utils writes (``lib.c``).

``(seconds) channel ID#DATA``: a 3-digit (11-bit) or 8-digit (29-bit) ID, ``ID##F`` and the data for CAN FD
(``F``: the flags digit), ``ID#R`` with an optional DLC for a remote frame (``R3``; ``R8_9`` .. ``R8_F``, a
raw DLC above 8); ``ID#<8 bytes>_9`` .. ``_F``: a data frame's raw DLC; ``CAN_ERR_FLAG`` in the ID marks an
error frame. Flag values: ``linux/can.h``.
:data:`COMMON_LINE` is the shape most lines have, which the capture reader batches (:mod:`canarchy.capture_file`).
"""

from __future__ import annotations

import re

from canarchy.frames import CAN_FD_DLCS, MAX_EXTENDED_ID, MAX_STANDARD_ID, CanFrame, checked_timestamp
from canarchy.output import TIMESTAMP_TEXT

_CAN_ERR_FLAG = 0x20000000  # linux/can.h: the ID marks an error frame
_CANFD_BRS = 0x01  # linux/can.h: bit rate switch
_CANFD_ESI = 0x02  # linux/can.h: error state indicator
_HEX_TEXT = "0123456789abcdefABCDEF"
_HEX_DIGITS = frozenset(_HEX_TEXT)
_RAW_DLC_DIGITS = frozenset("9ABCDEFabcdef")  # a Classical CAN DLC above 8 (ISO 11898-1: 8 data bytes)
_TIMESTAMP_CHARS = "0123456789."  # str.strip(chars) leaves what is not one of these
_FD_LENGTHS = frozenset(CAN_FD_DLCS)
CLASSIC_HEX_LENGTHS = frozenset(range(0, 17, 2))  # hex digits of 0..8 bytes
FD_HEX_LENGTHS = frozenset(2 * n for n in CAN_FD_DLCS)
_HEX = "[0-9A-Fa-f]"
#: The common candump line: ``(seconds) channel ID#HEX`` or ``(seconds) channel ID##FHEX``, maybe with
#: `` R``/`` T``, the seconds a JSON number. Groups: the seconds, ``"channel ID#"`` (``"channel ID##F"``
#: for CAN FD: everything that fixes the frame's ID fields), the data's hex digits and the direction letter
#: (``R`` received, ``T`` sent; empty when absent: received).
COMMON_LINE = rf"\(((?:0|[1-9][0-9]*)\.[0-9]+)\) (\S+ {_HEX}{{3,8}}#(?:#{_HEX})?)({_HEX}*)(?: ([RTrt]))?\r?"
common_lines = re.compile(rf"^{COMMON_LINE}$", re.MULTILINE).findall
common_line = re.compile(rf"{COMMON_LINE}\n?").fullmatch
#: Data with can-utils' separators: an optional '.' before each byte, then a '.' or a raw DLC (``_9``) may end it.
_DOTTED = re.compile(rf"(?:\.?{_HEX}{{2}})*(?:\.|_{_HEX})?").fullmatch


class ErrorFrame(Exception):
    """A candump error frame: counted, not a CAN data frame."""


# radon D by design: one branch per candump -l field, inline for speed; the reader sends it the first line of
# each channel and ID and every line of another shape (capture_file.CaptureFile._candump_batch)
def parse_candump_line(line: str) -> CanFrame | None:
    """Parse one candump ``-l`` line into a frame; None for a blank line.

    Raises ``ValueError`` (why it is malformed) or ``UserInputError``
    ``INVALID_FRAME`` (an ID or payload that no CAN frame can carry). An error
    frame (CAN_ERR_FLAG in the ID) raises :class:`ErrorFrame`, which the
    capture reader counts.
    """
    fields = line.split()
    try:
        stamp, channel, body = fields
    except ValueError:
        count = len(fields)
        if count == 0:
            return None
        if count != 4 or fields[3] not in ("R", "T", "r", "t"):
            raise ValueError(f"expected '(timestamp) channel ID#DATA', got {count} field(s)") from None
        stamp, channel, body = fields[0], fields[1], fields[2]
        is_rx = fields[3] in ("R", "r")
    else:
        is_rx = True
    seconds, timestamp = _stamp(stamp)
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
    if ident.strip(_HEX_TEXT):
        raise ValueError(f"ID {ident!r} is not hex")
    can_id = int(ident, 16)
    fd = False
    flags = 0
    raw_dlc = 0
    if data:
        head = data[0]
        if head == "#":  # CAN FD: one hex flags digit, then the data
            if len(data) < 2 or data[1] not in _HEX_DIGITS:
                raise ValueError("CAN FD frame without a flags digit after '##'")
            fd = True
            flags = int(data[1], 16)
            data = data[2:]
        elif head == "R" or head == "r":
            return _remote_frame(can_id, extended, timestamp, channel, data[1:], is_rx)
        if "." in data:  # can-utils' optional separator before a byte (DE.AD.BE.EF), as canplayer reads it
            data = _undotted(data)
        if not fd and data[-2:-1] == "_":  # can-utils' raw DLC 9..F of a data frame of 8 bytes: 1122334455667788_9
            data, raw_dlc = _raw_dlc(data)
        try:
            # The fields hold no whitespace, so fromhex takes exactly pairs of hex digits.
            payload = bytes.fromhex(data)
        except ValueError:
            what = "CAN FD data" if fd else "data"
            if data.strip(_HEX_TEXT):  # a character that is not a hex digit (strip stops at it)
                raise ValueError(f"{what} {data!r} holds a character that is not a hex digit") from None
            raise ValueError(f"{what} {data!r} is not an even number of hex digits") from None
    else:
        payload = b""
    if extended:
        if can_id & _CAN_ERR_FLAG:
            raise ErrorFrame
        valid = can_id <= MAX_EXTENDED_ID
    else:
        valid = can_id <= MAX_STANDARD_ID
    brs, esi = bool(flags & _CANFD_BRS), bool(flags & _CANFD_ESI)
    if not valid or (len(payload) > 8 and (not fd or len(payload) not in _FD_LENGTHS)):
        return CanFrame(can_id, payload, extended, fd, False, timestamp, channel, brs, esi, is_rx=is_rx)  # raises
    # Checked above with CanFrame's own limits: build it without checking again (a third of the time).
    frame = _new(CanFrame)
    _set(frame, "__dict__", {"arbitration_id": can_id, "data": payload, "is_extended_id": extended, "is_fd": fd,
                             "is_remote_frame": False, "timestamp": timestamp, "channel": channel,
                             "bitrate_switch": brs, "error_state_indicator": esi, "is_error_frame": False,
                             "requested_dlc": 0, "is_rx": is_rx, "len8_dlc": raw_dlc,
                             TIMESTAMP_TEXT: seconds if _json_number(seconds) else None})
    return frame


def _stamp(stamp: str) -> tuple[str, float]:
    """``(its text, seconds)`` of ``(1700000000.123456)``; ``ValueError`` if malformed, ``UserInputError`` past
    the year 9999 (:func:`checked_timestamp`)."""
    if stamp[0] != "(" or stamp[-1] != ")":
        raise ValueError("timestamp is not in parentheses")
    seconds = stamp[1:-1]
    if seconds.strip(_TIMESTAMP_CHARS):  # anything but digits and '.' is left; float() alone takes 'nan', '1e3'
        raise ValueError(f"timestamp {seconds!r} is not seconds.microseconds")
    try:
        timestamp = float(seconds)
    except ValueError:  # '', '.', '1.2.3'
        raise ValueError(f"timestamp {seconds!r} is not seconds.microseconds") from None
    return seconds, checked_timestamp(timestamp)


def _undotted(data: str) -> str:
    """``data`` without its '.' separators, each of which may stand before a byte (and at the end), as in
    can-utils' ``parse_canframe`` (``lib.c``), which canplayer and log2asc read logs with; ``ValueError`` for
    one inside a byte or two in a row."""
    if not _DOTTED(data):
        raise ValueError(f"data {data!r} has a '.' that is not between two bytes")
    return data.replace(".", "")


def _raw_dlc(data: str) -> tuple[str, int]:
    """``(the data digits, the raw DLC)`` of ``1122334455667788_9``; ``ValueError`` unless 8 bytes and 9..F."""
    if len(data) != 18 or data[-1] not in _RAW_DLC_DIGITS:
        raise ValueError(f"data {data!r}: a raw DLC (_9 .. _F) follows 8 data bytes")
    return data[:-2], int(data[-1], 16)


def _json_number(seconds: str) -> bool:
    """True when ``seconds`` (digits and at most one '.', as the parser checked) is a JSON number:
    no '.' at either end, no leading zero before another digit."""
    first = seconds[0]
    return first != "." and seconds[-1] != "." and (first != "0" or seconds[1:2] in (".", ""))


def _remote_frame(can_id: int, extended: bool, timestamp: float, channel: str, rest: str, is_rx: bool) -> CanFrame:
    if rest[1:2] == "_" and len(rest) == 3:  # can-utils' raw DLC 9..F of a remote frame of length 8: R8_9 .. R8_F
        if rest[0] != "8" or rest[2] not in _RAW_DLC_DIGITS:
            raise ValueError(f"remote frame DLC {rest!r}: a raw DLC is 8_9 .. 8_F")
        rest = rest[2]
    elif rest and (len(rest) != 1 or rest not in _HEX_DIGITS):  # R0 .. R8; R9 .. RF read as the raw DLC
        raise ValueError(f"remote frame DLC {rest!r} is not one hex digit (or 8_9 .. 8_F)")
    if extended and can_id & _CAN_ERR_FLAG:
        raise ErrorFrame
    return CanFrame(can_id, b"", extended, False, True, timestamp, channel, requested_dlc=int(rest, 16) if rest else 0,
                    is_rx=is_rx)


_new = object.__new__
_set = object.__setattr__
#: The fields :func:`parse_candump_line` sets, which must be all of CanFrame's (tests/test_capture_file.py checks).
CHECKED_FRAME_FIELDS = ("arbitration_id", "data", "is_extended_id", "is_fd", "is_remote_frame", "timestamp", "channel",
                        "bitrate_switch", "error_state_indicator", "is_error_frame", "requested_dlc", "is_rx",
                        "len8_dlc")
