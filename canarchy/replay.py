"""Replaying a recording onto a bus with its original timing (as can-utils' ``canplayer``
and python-can's ``can.player`` do).

:func:`schedule` gives frame *i* of pass *k* the slot ``start + (pass_offset(k) + gap-capped (t_i - t_0)) /
speed``, in seconds (a gap longer than ``skip`` counts as ``skip``; a frame stamped before the latest one
so far goes out right after the previous frame; a pass follows the last at once), reading the recording
again for each pass. :func:`play` sends each frame no earlier than its slot (a late one at once, without
moving the schedule) and reports how late it was, ``late_s``. See ``docs/record-and-replay.md``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Iterator

from canarchy.frames import CanFrame


@dataclass(frozen=True)
class Slot:
    """One planned send: ``index`` (0.. over the whole replay), ``loop`` (0..), ``offset_s``
    (seconds after the start, at ``speed``), the recorded ``frame``."""

    index: int
    loop: int
    offset_s: float
    frame: CanFrame


def schedule(passes: Callable[[], Iterable[CanFrame]], *, speed: float = 1.0, loops: int | None = 1,
             skip: float | None = None) -> Iterator[Slot]:
    """Yield the slots of ``loops`` passes (None: forever) over ``passes()`` (a new
    iterable of the recording's frames per call). See the module docstring."""
    index = 0
    elapsed = 0.0  # recording seconds before the current pass
    loop = 0
    while loops is None or loop < loops:
        previous: float | None = None
        position = elapsed
        empty = True
        for frame in passes():
            empty = False
            stamp = frame.timestamp
            if previous is None:
                previous = stamp
            elif stamp > previous:
                # ``previous`` is the latest timestamp so far, not the last frame's: a frame stamped earlier
                # goes out at once, and the next ones keep their own slots (canplayer, python-can's
                # MessageSync) instead of each step back delaying the rest of the recording.
                gap = stamp - previous
                position += gap if skip is None else min(gap, skip)
                previous = stamp
            yield Slot(index, loop, position / speed, frame)
            index += 1
        if empty:
            return
        elapsed = position
        loop += 1


@dataclass(frozen=True)
class Sent:
    """A slot as sent: ``due_at`` (its time, s since the epoch: the start's wall-clock time plus
    its offset), ``sent_at`` (s since the epoch) and ``late_s`` (after its time, >= 0)."""

    slot: Slot
    sent_at: float
    late_s: float
    due_at: float = 0.0


def play(slots: Iterable[Slot], send: Callable[[CanFrame], None], *,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Iterator[Sent]:
    """Send each slot's frame at ``start + offset_s`` (``start``: the first call of ``clock``)
    or later, in order; yield a :class:`Sent` after each send. Raises what ``send`` raises."""
    start = clock()
    start_wall = time.time()
    for slot in slots:
        due = start + slot.offset_s
        wait = due - clock()
        while wait > 0:
            sleep(wait)
            wait = due - clock()
        sent_at = time.time()
        send(slot.frame)
        yield Sent(slot, sent_at, max(0.0, -wait), start_wall + slot.offset_s)
