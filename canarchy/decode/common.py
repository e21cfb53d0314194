"""What the decoders share: bounded warning logs, value ranges, ID helpers.

Units: arbitration IDs are integers; ``hex_id`` writes them as ``0x7E8`` (11-bit)
or ``0x18FEF100`` (29-bit). PGN from a 29-bit ID: SAE J1939-21.
"""

from __future__ import annotations

from typing import Any, Iterable

#: Warning strings kept per decoder; further ones are counted only.
MAX_WARNINGS = 50
#: Distinct unknown arbitration IDs listed in a summary; the rest are counted.
MAX_UNKNOWN_IDS = 256


class WarningLog:
    """A bounded list of warning strings: the first :data:`MAX_WARNINGS` kept, the rest counted."""

    def __init__(self, limit: int = MAX_WARNINGS) -> None:
        self.limit = limit
        self.items: list[str] = []
        self.dropped = 0

    def add(self, text: str) -> None:
        """Keep ``text`` if there is room, else count it."""
        if len(self.items) < self.limit:
            self.items.append(text)
        else:
            self.dropped += 1

    def extend(self, texts: Iterable[str]) -> None:
        """:meth:`add` each of ``texts``."""
        for text in texts:
            self.add(text)

    def render(self) -> list[str]:
        """The kept warnings, plus one line counting the dropped ones."""
        if not self.dropped:
            return list(self.items)
        return self.items + [f"{self.dropped} more warning(s) not listed (first {self.limit} shown)"]


def hex_id(can_id: int, extended: bool) -> str:
    """``0x%03X`` for an 11-bit ID, ``0x%08X`` for a 29-bit one."""
    return f"0x{can_id:08X}" if extended else f"0x{can_id:03X}"


class ValueRange:
    """Count, min, max, first and last value of one series (bounded memory; min/max of numbers only)."""

    __slots__ = ("count", "min", "max", "first", "last")

    def __init__(self) -> None:
        self.count = 0
        self.min: Any = None
        self.max: Any = None
        self.first: Any = None
        self.last: Any = None

    def add(self, value: Any) -> None:
        self.count += 1
        self.last = value
        if self.count == 1:
            self.first = value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
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
