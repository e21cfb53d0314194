"""Argument parsing helpers shared by command modules."""

from __future__ import annotations

from canarchy.errors import UserInputError


def parse_int(text: str, code: str, what: str, lo: int, hi: int, hint: str) -> int:
    """Parse a decimal or ``0x`` hex integer within ``lo..hi``.

    Raises ``UserInputError(code)`` naming ``what`` when it does not parse or is out of range.
    """
    raw = str(text).strip()
    try:
        value = int(raw, 16) if raw.lower().startswith("0x") else int(raw, 10)
    except ValueError:
        raise UserInputError(code, f"{what} {text!r} is not a decimal or 0x-hex integer.", hint) from None
    if not lo <= value <= hi:
        raise UserInputError(code, f"{what} {text!r} is outside {lo}..{hi} (0x{lo:X}..0x{hi:X}).", hint)
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
        raise UserInputError("INVALID_FRAME_DATA", f"Payload {text!r} has {len(data)} bytes; at most {max_bytes}.", hint)
    return data


def parse_arbitration_id(text: str) -> tuple[int, bool]:
    """Parse an arbitration ID (``0x123`` or ``291``); > 0x7FF means a 29-bit (extended) ID.

    Returns ``(arbitration_id, is_extended_id)``. Raises ``UserInputError``
    ``INVALID_FRAME`` when it does not parse or exceeds 0x1FFFFFFF.
    """
    value = parse_int(text, "INVALID_FRAME", "Arbitration ID", 0, 0x1FFFFFFF,
                      "Use 0x000-0x7FF for 11-bit IDs or up to 0x1FFFFFFF for 29-bit IDs.")
    return value, value > 0x7FF
