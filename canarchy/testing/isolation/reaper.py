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


def children(exclude: Collection[int] = ()) -> dict[int, str]:
    """This process's children but ``exclude``, with their state (``R``, ``S``, ... ``Z``, proc(5))."""
    me = str(os.getpid()).encode()
    found = {}
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) in exclude:
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:  # "PID (COMM) STATE PPID ..."
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 1 and fields[1] == me:
                found[int(entry.name)] = fields[0].decode()
    return found


def command_line(pid: int) -> str:
    """``pid``'s command line, for a message (``?`` once it has gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return " ".join(a.decode(errors="replace") for a in handle.read().split(b"\0") if a) or "?"
    except OSError:
        return "?"


def stop_children(exclude: Collection[int] = (), grace: float = 1.0) -> list[str]:
    """End every child still running but ``exclude`` (its process group too when it leads one of its
    own; SIGTERM, then SIGKILL after ``grace`` s) and reap it, and what it leaves adopted in turn; reap
    children that had ended already. Returns ``"pid N: COMMAND"`` for each one that was running."""
    stopped: list[str] = []
    for _ in range(5):  # a stopped process may leave children of its own, adopted in turn
        found = children(exclude)
        running = [pid for pid, state in found.items() if state != "Z"]
        stopped += [f"pid {pid}: {command_line(pid)}" for pid in running]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in running:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    group = os.getpgid(pid)
                    if group != os.getpgrp():
                        os.killpg(group, sig)
                    os.kill(pid, sig)
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
            while running and time.monotonic() < deadline:
                running = [pid for pid in running if not _reaped(pid)]
                if running:
                    time.sleep(0.02)
            if not running:
                break
        for pid in found:
            _reaped(pid)
        if not running and not children(exclude):
            break
    return stopped


def _reaped(pid: int) -> bool:
    """Reap ``pid`` if it has ended; True once it is gone."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True
