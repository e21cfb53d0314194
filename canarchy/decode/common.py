"""What the decoders share: value ranges and ID helpers (warnings: :mod:`canarchy.warning_log`).

Units: arbitration IDs are integers; ``hex_id`` writes them as ``0x7E8`` (11-bit)
or ``0x18FEF100`` (29-bit). PGN from a 29-bit ID: SAE J1939-21.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable

#: Distinct unknown arbitration IDs listed in a summary; the rest are counted.
MAX_UNKNOWN_IDS = 256


def hex_id(can_id: int, extended: bool) -> str:
    """``0x%03X`` for an 11-bit ID, ``0x%08X`` for a 29-bit one."""
    return f"0x{can_id:08X}" if extended else f"0x{can_id:03X}"


class ValueRange:
    """Count, min, max, first and last value of one series (bounded memory). ``first``/``last``: the values as
    given; ``min``/``max``: over the numbers among them, or over the ``number`` given with a value (a signal's
    named value: the number it stands for), so a series of names and numbers has one numeric range."""

    __slots__ = ("count", "first", "last", "max", "min")

    def __init__(self) -> None:
        self.count = 0
        self.min: Any = None
        self.max: Any = None
        self.first: Any = None
        self.last: Any = None

    def add(self, value: Any, number: Any = None) -> None:
        self.count += 1
        self.last = value
        if self.count == 1:
            self.first = value
        if number is not None:
            value = number
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            if self.min is None or value < self.min:
                self.min = value
            if self.max is None or value > self.max:
                self.max = value

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "min": self.min, "max": self.max, "first": self.first, "last": self.last}


def j1939_pgn(can_id: int) -> int:
    """PGN of a 29-bit ID (SAE J1939-21): PDU1 (PF < 240) drops the destination byte."""
    pgn = (can_id >> 8) & 0x3FFFF
    return pgn & 0x3FF00 if (pgn >> 8) & 0xFF < 240 else pgn


def isotp_counts(reassemblers: Iterable[Any]) -> dict[str, dict[str, int]]:
    """``{hex id: {complete, dropped, incomplete}}`` of ISO-TP reassemblers
    (:class:`canarchy.isotp.IsoTpReassembler`)."""
    return {f"0x{m.arbitration_id:X}": {"complete": m.complete_count, "dropped": m.dropped_count,
                                        "incomplete": m.incomplete_count}
            for m in sorted(reassemblers, key=lambda m: m.arbitration_id)}
