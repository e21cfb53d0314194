"""Warnings as records: what went wrong reading or decoding a capture, kind by kind, in bounded memory.

A :class:`WarningRecord` is a message string with a ``code`` and ``details``: ``code`` names the
kind (``ISOTP_SEQUENCE_ERROR``, ``CANDUMP_LINE_MALFORMED`` …, listed in
``docs/decoding.md``), ``message`` is the text the envelope's ``warnings``
list carries, ``details`` the facts (``arbitration_id``, ``timestamp``,
``sequence``, ``line`` …). A :class:`WarningLog` counts every record per kind
and keeps the first :data:`MAX_PER_KIND` of each, so no kind hides another.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable

from canarchy.errors import one_full_stop

#: Records (and warning strings) kept per kind; further ones are counted only.
MAX_PER_KIND = 50


class WarningRecord(str):
    """One warning: the message itself (a ``str``, so code that handles warning
    strings keeps working), with ``code`` (its kind) and ``details``
    (JSON-serialisable facts)."""

    code: str
    details: dict[str, Any]

    def __new__(cls, code: str, message: str, **details: Any) -> WarningRecord:
        record = super().__new__(cls, one_full_stop(message))
        record.code = code
        record.details = details
        return record

    @property
    def message(self) -> str:
        """The human-readable text."""
        return str.__str__(self)

    def to_dict(self) -> dict[str, Any]:
        """``{code, message, **details}``."""
        return {**self.details, "code": self.code, "message": self.message}


class WarningLog:
    """Warnings of one read or decode: every one counted per kind, the first
    ``per_kind`` of each kept (in the order they came)."""

    def __init__(self, per_kind: int = MAX_PER_KIND) -> None:
        self.per_kind = per_kind
        self.counts: dict[str, int] = {}
        self.records: list[WarningRecord] = []

    def add(self, code: str, message: str, **details: Any) -> None:
        """Record one warning of kind ``code``."""
        self.add_record(WarningRecord(code, message, **details))

    def add_record(self, record: WarningRecord) -> None:
        """Count ``record``; keep it while its kind has room."""
        seen = self.counts.get(record.code, 0)
        self.counts[record.code] = seen + 1
        if seen < self.per_kind:
            self.records.append(record)

    def extend(self, records: Iterable[WarningRecord]) -> None:
        """:meth:`add_record` each of ``records``."""
        for record in records:
            self.add_record(record)

    def merge(self, other: WarningLog) -> None:
        """Add ``other``'s counts and its kept records, in their order (up to this log's room per kind)."""
        for record in other.records:
            self.add_record(record)
        for code, count in other.counts.items():
            kept = sum(1 for record in other.records if record.code == code)
            self.counts[code] = self.counts.get(code, 0) + count - kept

    def render(self) -> list[str]:
        """The kept messages, then one line per kind that has more than it kept."""
        lines = [record.message for record in self.records]
        for code, count in self.counts.items():
            if count > self.per_kind:
                lines.append(f"{count - self.per_kind} more {code} warning(s) not listed "
                             f"(first {self.per_kind} of {count} shown)")
        return lines

    def to_data(self) -> dict[str, Any]:
        """``{warning_counts: {code: count}, warning_records: [record dicts]}`` for a command's ``data``."""
        return {"warning_counts": dict(sorted(self.counts.items())),
                "warning_records": [record.to_dict() for record in self.records]}
