"""The command line's syntax for IDs, frames and filters, as can-utils writes them.

Arbitration IDs are hex, ``0x`` optional: 3 digits 11-bit, 8 digits 29-bit, other widths 11-bit up to 0x7FF
and 29-bit above (:func:`parse_arbitration_id`); frames are cansend's ``ID#DATA`` (``lib.c`` of can-utils;
``123#R4`` remote, ``123##1DEADBEEF`` CAN FD, flags BRS 0x1, ESI 0x2) (:func:`parse_frame`); filters are
candump's ``ID:MASK`` / ``ID~MASK`` (:func:`parse_filter`). Examples: ``docs/record-and-replay.md``. Errors:
``UserInputError`` ``INVALID_FRAME`` / ``INVALID_FRAME_DATA`` / ``INVALID_FILTER`` (exit 1).
"""

from __future__ import annotations

from canarchy.errors import UserInputError
from canarchy.frames import CAN_FD_DLCS, MAX_EXTENDED_ID, MAX_STANDARD_ID, CanFrame, FrameFilter, can_id_text

_HEX = frozenset("0123456789abcdefABCDEF")
_CANFD_BRS = 0x1  # linux/can.h
_CANFD_ESI = 0x2
_CAN_EFF_FLAG, _CAN_RTR_FLAG = 0x80000000, 0x40000000  # linux/can.h: the flags of candump's filter masks
_ID_HINT = ("Write the ID in hex as can-utils do: 3 digits for an 11-bit ID (123, 7E0), 8 for a 29-bit one "
            "(18FEF100, 00000123); 0x7E0 works too.")
_FRAME_HINT = ("Use cansend's syntax: 123#DEADBEEF, 18FEF100#00FF (29-bit), 123#R or 123#R4 (remote), "
               "123##1DEADBEEF (CAN FD; flags digit: 1 = BRS, 2 = ESI).")


def _digits(text: str) -> str:
    raw = text.strip()
    return raw[2:] if raw[:2].lower() == "0x" else raw


def parse_arbitration_id(text: str) -> tuple[int, bool]:
    """``(arbitration_id, is_extended_id)`` of a hex ID (see the module docstring).

    Raises ``UserInputError`` ``INVALID_FRAME``: not hex, 3 digits above 0x7FF, or above 0x1FFFFFFF.
    """
    digits = _digits(str(text))
    if not digits or not _HEX.issuperset(digits):
        raise UserInputError("INVALID_FRAME", f"Arbitration ID {text!r} is not hex.", _ID_HINT)
    value = int(digits, 16)
    if len(digits) == 8:
        extended = True
    elif len(digits) == 3 and value > MAX_STANDARD_ID:
        raise UserInputError("INVALID_FRAME", f"Arbitration ID {text!r} (0x{value:X}) does not fit 11 bits.",
                             f"Write 8 digits for a 29-bit ID: {value:08X}.")
    else:
        extended = value > MAX_STANDARD_ID
    if value > MAX_EXTENDED_ID:
        raise UserInputError("INVALID_FRAME", f"Arbitration ID {text!r} (0x{value:X}) exceeds 0x1FFFFFFF.", _ID_HINT)
    return value, extended


def id_notes(text: str) -> list[str]:
    """Warnings for an ID whose reading may surprise: all decimal digits (read as hex, which
    canarchy before 0.2 read as decimal), or a width other than 3 or 8 above 0x7FF."""
    digits = _digits(str(text))
    notes = []
    if str(text).strip()[:2].lower() != "0x" and digits.isdigit():
        decimal = int(digits, 10)
        also = f"; decimal {decimal} is 0x{decimal:X}" if decimal <= MAX_EXTENDED_ID else ""
        notes.append(f"arbitration ID {text} is read as hex 0x{int(digits, 16):X}, as in cansend and candump{also} "
                     "(canarchy used to read a bare ID as decimal)")
    if len(digits) not in (3, 8) and _HEX.issuperset(digits) and digits and int(digits, 16) > MAX_STANDARD_ID:
        notes.append(f"arbitration ID {text} has {len(digits)} hex digits and is above 0x7FF: sent as the 29-bit "
                     f"ID {int(digits, 16):08X} (8 digits say so without this note)")
    return notes


def _payload(text: str, whole: str, limit: int) -> bytes:
    compact = text.replace(".", "")
    if len(compact) % 2 or not _HEX.issuperset(compact):
        raise UserInputError("INVALID_FRAME_DATA", f"Frame {whole!r}: data {text!r} is not whole hex bytes.",
                             _FRAME_HINT)
    data = bytes.fromhex(compact)
    if len(data) > limit:
        raise UserInputError("INVALID_FRAME_DATA", f"Frame {whole!r} has {len(data)} data bytes; at most {limit}.",
                             _FRAME_HINT)
    return data


def parse_frame(text: str, channel: str | None = None) -> CanFrame:
    """The frame of cansend's ``ID#DATA`` syntax (see the module docstring).

    Raises ``UserInputError`` ``INVALID_FRAME`` (ID, remote DLC, an FD length
    that does not exist) or ``INVALID_FRAME_DATA`` (data).
    """
    whole = text.strip()
    ident, sep, rest = whole.partition("#")
    if not sep:
        raise UserInputError("INVALID_FRAME", f"Frame {text!r} has no '#' between ID and data.", _FRAME_HINT)
    if len(ident) not in (3, 8) or not _HEX.issuperset(ident):
        raise UserInputError("INVALID_FRAME", f"Frame {text!r}: ID {ident!r} must be 3 hex digits (11-bit) or 8 "
                             "(29-bit), as in cansend.", _FRAME_HINT)
    arbitration_id, extended = parse_arbitration_id(ident)
    if rest[:1] == "#":  # CAN FD
        flags_digit = rest[1:2]
        if not flags_digit or flags_digit not in _HEX:
            raise UserInputError("INVALID_FRAME", f"Frame {text!r}: a CAN FD frame needs a flags digit after '##'.",
                                 _FRAME_HINT)
        flags = int(flags_digit, 16)
        data = _payload(rest[2:], whole, 64)
        if len(data) not in CAN_FD_DLCS:
            raise UserInputError("INVALID_FRAME_DATA", f"Frame {text!r}: {len(data)} bytes is not a CAN FD length "
                                 f"{CAN_FD_DLCS} (ISO 11898-1).", "Pad the data to the next CAN FD length.")
        return CanFrame(arbitration_id, data, extended, True, channel=channel,
                        bitrate_switch=bool(flags & _CANFD_BRS), error_state_indicator=bool(flags & _CANFD_ESI))
    if rest[:1] in ("R", "r"):
        dlc_digit = rest[1:]
        if dlc_digit and (len(dlc_digit) != 1 or not dlc_digit.isdigit() or int(dlc_digit) > 8):
            raw = "; a raw DLC above 8 (R8_9 .. R8_F) is read from recordings, not sent: python-can carries 0..8" \
                if dlc_digit[:2] == "8_" or dlc_digit in tuple("9ABCDEFabcdef") else ""
            raise UserInputError("INVALID_FRAME", f"Frame {text!r}: remote frame DLC {dlc_digit!r} is not 0..8{raw}.",
                                 _FRAME_HINT)
        return CanFrame(arbitration_id, b"", extended, is_remote_frame=True, channel=channel,
                        requested_dlc=int(dlc_digit or 0))
    if rest[-2:-1] == "_":
        raise UserInputError("INVALID_FRAME", f"Frame {text!r}: a raw DLC above 8 (1122334455667788_9 .. _F) is read "
                             "from recordings, not sent: python-can carries a DLC of 0..8.", _FRAME_HINT)
    return CanFrame(arbitration_id, _payload(rest, whole, 8), extended, channel=channel)


def format_frame(frame: CanFrame) -> str:
    """``frame`` in cansend's syntax (the body of a candump ``-l`` line): ``123#DEADBEEF``."""
    ident = can_id_text(frame.arbitration_id, frame.is_extended_id)
    if frame.is_remote_frame:
        dlc = frame.requested_dlc
        return f"{ident}#R{dlc or ''}" if dlc <= 8 else f"{ident}#R8_{dlc:X}"  # can-utils' raw DLC: R8_9 .. R8_F
    if frame.is_fd:
        flags = (_CANFD_BRS if frame.bitrate_switch else 0) | (_CANFD_ESI if frame.error_state_indicator else 0)
        return f"{ident}##{flags:X}{frame.data.hex().upper()}"
    raw = f"_{frame.len8_dlc:X}" if frame.len8_dlc else ""  # can-utils' raw DLC 9..F of 8 data bytes
    return f"{ident}#{frame.data.hex().upper()}{raw}"


def parse_filter(text: str) -> FrameFilter:
    """A candump filter ``ID:MASK``, ``ID~MASK`` or ``~ID:MASK`` (hex; see the module docstring).

    Raises ``UserInputError`` ``INVALID_FILTER``.
    """
    raw = text.strip()
    inverse = raw.startswith("~")
    body = raw[1:] if inverse else raw
    sep = ":" if ":" in body else "~"
    ident, found, mask = body.partition(sep)
    hint = ("Write ID:MASK in hex as candump does, e.g. 7E0:7F0 (IDs 0x7E0-0x7EF), 18DAF100:1FFFFF00, "
            "123:C00007FF (no remote frames); ID~MASK passes every other frame.")
    if sep == "~" and found:
        if inverse:  # ~ID~MASK
            found = ""
        inverse = True
    if not found or not ident or not mask:
        raise UserInputError("INVALID_FILTER", f"Filter {text!r} is not ID:MASK or ID~MASK.", hint)
    try:
        can_id, extended = parse_arbitration_id(ident)
    except UserInputError as exc:
        raise UserInputError("INVALID_FILTER", f"Filter {text!r}: {exc.message}", hint) from None
    mask_digits = _digits(mask)
    if not _HEX.issuperset(mask_digits) or not mask_digits or int(mask_digits, 16) > 0xFFFFFFFF:
        raise UserInputError("INVALID_FILTER", f"Filter {text!r}: mask {mask!r} is not hex up to FFFFFFFF.", hint)
    value = int(mask_digits, 16)  # candump's flags in the mask (linux/can.h; CAN_ERR_FLAG is cleared, as candump does)
    return FrameFilter(can_id, value & MAX_EXTENDED_ID, extended, inverse,
                       remote=False if value & _CAN_RTR_FLAG else None, width_in_mask=bool(value & _CAN_EFF_FLAG))


def frame_line(payload: dict) -> str:
    """One frame payload (:meth:`CanFrame.to_payload`) as candump prints it with ``-ta``:
    ``(1700000000.123456)  can0  123   [4]  DE AD BE EF``; a CAN FD length as ``[12]``
    followed by ``FD`` and ``BRS``/``ESI``; ``remote request``; ``ERRORFRAME``; a raw DLC 9..F of
    Classical CAN as ``{9}`` (candump ``-8``)."""
    ident = can_id_text(payload["arbitration_id"], payload["is_extended_id"])
    dlc = payload["dlc"]
    head = f"({payload['timestamp']:.6f})  {payload.get('channel') or '-'}  {ident}"
    if payload.get("is_remote_frame"):
        return f"{head}   {{{dlc:X}}}  remote request" if dlc > 8 else f"{head}   [{dlc}]  remote request"
    data = bytes.fromhex(payload["data"])
    body = " ".join(f"{b:02X}" for b in data)
    if dlc > 8 and not payload.get("is_fd"):  # a raw DLC 9..F: as candump -8 prints it
        return f"{head}   {{{dlc:X}}}  {body}"
    if payload.get("is_fd"):
        marks = " ".join(["FD"] + [m for m, key in (("BRS", "bitrate_switch"), ("ESI", "error_state_indicator"))
                                   if payload.get(key)])
        line = f"{head}  [{dlc:02d}]  {body}  {marks}"
    else:
        line = f"{head}   [{dlc}]  {body}"
    return f"{line}  ERRORFRAME" if payload.get("is_error_frame") else line.rstrip()
