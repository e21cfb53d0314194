"""The processes a run leaves behind: this process as their subreaper, and stopping them.

Linux only (``prctl(PR_SET_CHILD_SUBREAPER)``, ``<linux/prctl.h>``; prctl(2)): a process whose parent
ends is re-parented to the nearest subreaper above it instead of init, so a process a test detached
(a new session, a double fork) stays this process's child, listed in ``/proc/PID/stat`` (field 4, the
parent's pid). Elsewhere nothing is adopted and nothing is found. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Collection

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _processes() -> dict[int, tuple[int, str]]:
    """Every visible process: pid -> (parent pid, state: ``R``, ``S``, ... ``Z``; proc(5))."""
    found = {}
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:  # "PID (COMM) STATE PPID ..."
                    fields = handle.read().rsplit(b")", 1)[1].split()
                found[int(entry.name)] = (int(fields[1]), fields[0].decode())
            except (OSError, IndexError, ValueError):
                continue
    return found


def children(exclude: Collection[int] = ()) -> dict[int, str]:
    """This process's children but ``exclude``, with their state."""
    me = os.getpid()
    return {pid: state for pid, (parent, state) in _processes().items() if parent == me and pid not in exclude}


def descendants(keep: Collection[int] = ()) -> dict[int, str]:
    """Every process below this one, with its state, but those in ``keep`` (their own descendants
    are included)."""
    below: dict[int, list[int]] = {}
    table = _processes()
    for pid, (parent, _) in table.items():
        below.setdefault(parent, []).append(pid)
    found, stack = {}, list(below.get(os.getpid(), ()))
    while stack:
        pid = stack.pop()
        if pid in found or pid not in table:
            continue
        if pid not in keep:
            found[pid] = table[pid][1]
        stack += below.get(pid, ())
    return found


def command_line(pid: int) -> str:
    """``pid``'s command line, for a message (``?`` once it has gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return " ".join(a.decode(errors="replace") for a in handle.read().split(b"\0") if a) or "?"
    except OSError:
        return "?"


def stop_children(exclude: Collection[int] = (), grace: float = 1.0, *, keep: Collection[int] = (),
                  rounds: int = 50) -> list[str]:
    """End every process below this one still running but ``exclude`` (with what is below it) and
    ``keep`` (left running, what is below it not): SIGTERM to all of them at once (to the process
    group too of one that leads its own), SIGKILL after ``grace`` s; reap this process's children,
    those that had ended already too. Again while any is left (a process adopted meanwhile), at most
    ``rounds`` times. Returns ``"pid N: COMMAND"`` for each one that was running."""
    stopped: list[str] = []
    seen: set[int] = set()
    excluded = set(exclude)
    for _ in range(rounds):
        excluded |= {pid for pid in descendants(keep) if _below(pid, excluded)}
        running = [pid for pid, state in descendants(keep).items() if state != "Z" and pid not in excluded]
        stopped += [f"pid {pid}: {command_line(pid)}" for pid in running if pid not in seen]
        seen.update(running)
        unreaped = excluded | set(keep)
        _end(running, grace, unreaped)
        for pid in children(unreaped):
            _reaped(pid)
        if not any(state != "Z" for pid, state in descendants(keep).items() if pid not in excluded):
            break
    return stopped


def _end(running: list[int], grace: float, unreaped: set[int]) -> None:
    """SIGTERM ``running`` (and the process group of each that leads its own), SIGKILL what is left
    after ``grace`` s; meanwhile reap this process's children but ``unreaped``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != os.getpgrp():
                    os.killpg(group, sig)
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while running and time.monotonic() < deadline:
            for pid in children(unreaped):
                _reaped(pid)
            running = [pid for pid in running if _alive(pid)]
            if running:
                time.sleep(0.02)
        if not running:
            return


def _below(pid: int, ancestors: Collection[int]) -> bool:
    """Whether ``pid`` or a process above it is in ``ancestors``."""
    while pid > 1:
        if pid in ancestors:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _reaped(pid: int) -> bool:
    """Reap ``pid`` if it has ended; True once it is gone."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True
