"""Per-arbitration-ID statistics of a frame stream (a recording, a replay), in bounded memory.

:class:`CaptureStats` takes frames one at a time (:meth:`CaptureStats.feed`)
and keeps, per arbitration ID (11-bit and 29-bit counted apart): the frame
count, first and last timestamp, the DLCs seen, the channels, the last data
and the shortest gap, for the first :data:`MAX_IDS` distinct IDs; the frames
of any other are counted apart (``unlisted_frame_count``), so memory is
bounded whatever the capture holds (a fuzzed or random-ID capture has nearly
one ID a frame). Times are seconds (capture timestamps); a rate is frames per
second over the ID's own span (first to last frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from canarchy.frames import CanFrame, can_id_text

#: Distinct arbitration IDs a summary keeps statistics of: the first seen (twice the 11-bit IDs).
MAX_IDS = 4096


@dataclass
class IdStats:
    """One arbitration ID: ``count``, ``first``/``last`` timestamps, ``dlcs`` seen,
    ``channels``, ``last_data``, ``min_gap`` (shortest time between two of its frames)."""

    arbitration_id: int
    is_extended_id: bool
    count: int = 0
    first: float = 0.0
    last: float = 0.0
    min_gap: float | None = None
    last_data: bytes = b""
    dlcs: set[int] = field(default_factory=set)
    channels: set[str] = field(default_factory=set)

    @property
    def period(self) -> float | None:
        """Mean time between two frames (s); None below two frames or over no time."""
        if self.count < 2 or self.last <= self.first:
            return None
        return (self.last - self.first) / (self.count - 1)

    @property
    def rate(self) -> float | None:
        """Frames per second (1 / :attr:`period`)."""
        period = self.period
        return None if period is None else 1.0 / period

    def to_dict(self, start: float) -> dict[str, Any]:
        """JSON form; ``first_s``/``last_s`` relative to ``start`` (the capture's first frame)."""
        return {
            "arbitration_id": self.arbitration_id,
            "id": can_id_text(self.arbitration_id, self.is_extended_id),
            "is_extended_id": self.is_extended_id,
            "count": self.count,
            "first_s": round(self.first - start, 6),
            "last_s": round(self.last - start, 6),
            "period_s": None if self.period is None else round(self.period, 6),
            "rate_hz": None if self.rate is None else round(self.rate, 3),
            "min_gap_s": None if self.min_gap is None else round(self.min_gap, 6),
            "dlcs": sorted(self.dlcs),
            "channels": sorted(self.channels),
            "last_data": self.last_data.hex(),
        }


class CaptureStats:
    """Feed frames in order; read ``frame_count``, ``start``, ``end`` and :meth:`ids`."""

    def __init__(self) -> None:
        self.frame_count = 0
        self.start: float | None = None
        self.end: float | None = None
        self._ids: dict[tuple[int, bool], IdStats] = {}
        #: Frames of IDs past the first :data:`MAX_IDS`, counted in :attr:`frame_count` but not per ID.
        self.unlisted_frame_count = 0

    def feed(self, frame: CanFrame) -> IdStats | None:
        """Count one frame; return its ID's statistics (None for an ID past the first :data:`MAX_IDS`)."""
        self.frame_count += 1
        stamp = frame.timestamp
        if self.start is None:
            self.start = stamp
        self.end = stamp if self.end is None else max(self.end, stamp)
        key = (frame.arbitration_id, frame.is_extended_id)
        stats = self._ids.get(key)
        if stats is None:
            if len(self._ids) >= MAX_IDS:
                self.unlisted_frame_count += 1
                return None
            stats = self._ids[key] = IdStats(frame.arbitration_id, frame.is_extended_id, first=stamp, last=stamp)
        elif stamp >= stats.last:
            gap = stamp - stats.last
            stats.min_gap = gap if stats.min_gap is None else min(stats.min_gap, gap)
        stats.count += 1
        stats.last = max(stats.last, stamp)
        stats.last_data = bytes(frame.data)
        stats.dlcs.add(frame.dlc)
        if frame.channel:
            stats.channels.add(frame.channel)
        return stats

    @property
    def duration(self) -> float:
        """Seconds from the first frame to the last (0 for fewer than two)."""
        return 0.0 if self.start is None or self.end is None else self.end - self.start

    def ids(self) -> list[IdStats]:
        """Every ID listed, 11-bit before 29-bit, each group by ID."""
        return [self._ids[key] for key in sorted(self._ids, key=lambda k: (k[1], k[0]))]

    def to_dict(self) -> dict[str, Any]:
        """``{frame_count, id_count, unlisted_frame_count, start, duration_s, ids: [IdStats.to_dict ...]}``
        (``id_count``: the IDs listed)."""
        start = 0.0 if self.start is None else self.start
        return {"frame_count": self.frame_count, "id_count": len(self._ids),
                "unlisted_frame_count": self.unlisted_frame_count, "start": self.start,
                "duration_s": round(self.duration, 6), "ids": [stats.to_dict(start) for stats in self.ids()]}


def render_ids(data: dict[str, Any]) -> str:
    """Text of a :meth:`CaptureStats.to_dict` (plus ``file``): one line per ID, candump notation."""
    unlisted = data.get("unlisted_frame_count") or 0
    lines = [f"{data.get('file') or 'frames'}: {data['frame_count']} frames, {data['id_count']} IDs "
             f"over {data['duration_s']:.3f} s" + (f" ({unlisted} frames of further IDs not listed)" if unlisted
                                                  else ""),
             f"  {'ID':>8}  {'count':>7}  {'rate':>9}  {'period':>10}  DLC   last data"]
    for row in data["ids"]:
        rate = "-" if row["rate_hz"] is None else f"{row['rate_hz']:.2f} Hz"
        period = "-" if row["period_s"] is None else f"{row['period_s'] * 1000:.1f} ms"
        dlcs = ",".join(str(d) for d in row["dlcs"])
        lines.append(f"  {row['id']:>8}  {row['count']:>7}  {rate:>9}  {period:>10}  {dlcs:<4}  "
                     f"{row['last_data'].upper()}")
    return "\n".join(lines)
