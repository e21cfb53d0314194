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
from collections.abc import Collection, Iterable, Mapping

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


def signal_at_parent_death(signum: int) -> bool:
    """Have the kernel send this process ``signum`` when its parent ends (prctl(2) ``PR_SET_PDEATHSIG``);
    False where that is not possible, or where the parent has ended already (then nothing would come)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        import ctypes

        done = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    return done and os.getppid() == parent


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_and_state(pid: int) -> tuple[int, str] | None:
    """``pid``'s parent pid and state (``R``, ``S``, ... ``Z``; proc(5) ``/proc/PID/stat``), None once
    it has gone. A process whose main thread has ended (``pthread_exit``) while another runs shows ``Z``
    there: it has the state of a thread still running (``/proc/PID/task``), ``Z`` only once all have ended."""
    fields = stat_fields(f"/proc/{pid}/stat")
    try:
        parent, state = int(fields[1]), fields[0].decode()
    except (IndexError, ValueError):
        return None
    if state == "Z":
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                running = stat_fields(f"/proc/{pid}/task/{task}/stat")[:1]
                if task != str(pid) and running and running[0] not in (b"Z", b"X"):
                    return parent, running[0].decode()
    return parent, state


def stat_fields(path: str = "/proc/self/stat") -> list[bytes]:
    """The fields of a ``stat`` file of ``/proc`` after ``(COMM)``, which may hold spaces (proc(5), from field
    3): state, parent pid, process group, session, tty_nr, ...; [] once it has gone."""
    try:
        with open(path, "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def pids() -> list[int]:
    """Every process ``/proc`` shows; [] where there is none."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _processes() -> dict[int, tuple[int, str]]:
    """Every visible process: pid -> (parent pid, state)."""
    return {pid: known for pid in pids() if (known := parent_and_state(pid)) is not None}


def children(exclude: Collection[int] = ()) -> dict[int, str]:
    """This process's children but ``exclude``, with their state."""
    me = os.getpid()
    return {pid: state for pid, (parent, state) in _processes().items() if parent == me and pid not in exclude}


def descendants(keep: Collection[int] = (), exclude: Collection[int] = ()) -> dict[int, str]:
    """Every process below this one, with its state, but those in ``keep`` (what is below them is
    included) and those in ``exclude`` with everything below them."""
    table = _processes()
    below: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        below.setdefault(parent, []).append(pid)
    found: dict[int, str] = {}
    stack = [pid for pid in below.get(os.getpid(), ()) if pid not in exclude]
    while stack:
        pid = stack.pop()
        if pid not in keep:
            found[pid] = table[pid][1]
        stack += [child for child in below.get(pid, ()) if child not in exclude and child not in found]
    return found


def this_and_above(pid: int | None = None) -> list[int]:
    """``pid`` (default this process) and the processes above it, nearest first (``/proc/PID/stat``;
    empty where there is no ``/proc``)."""
    found: list[int] = []
    pid = os.getpid() if pid is None else pid
    while pid > 0 and pid not in found and (known := parent_and_state(pid)) is not None:
        found.append(pid)
        pid = known[0]
    return found


def at_or_below(pid: int, top: int) -> bool:
    """Whether process ``pid`` is ``top`` or below it (``/proc/PID/stat``'s parents); False once it has gone."""
    return top in this_and_above(pid)


def first_outside(candidates: Iterable[int], run: int) -> str | None:
    """The first of ``candidates`` that is not in the run whose top pytest is ``run`` (where this process is below
    it; else this process's own tree), as ``pid N: COMMAND``; None if there is none. One that has gone counts
    as inside."""
    me = os.getpid()
    top = run if at_or_below(me, run) else me
    for pid in candidates:
        if not at_or_below(pid, top) and os.path.exists(f"/proc/{pid}"):
            return f"pid {pid}: {command_line(pid)}"
    return None


def group_members(group: int) -> list[int]:
    """The processes of process group ``group`` (``/proc/PID/stat``: the field after the parent's pid)."""
    wanted = [str(group).encode()]
    return [pid for pid in pids() if stat_fields(f"/proc/{pid}/stat")[2:3] == wanted]


def command_line(pid: int) -> str:
    """``pid``'s command line, for a message (``?`` once it has gone)."""
    return " ".join(a.decode(errors="replace") for a in arguments(pid) or () if a) or "?"


def arguments(pid: int) -> list[bytes] | None:
    """``pid``'s arguments (``/proc/PID/cmdline``, split at each NUL: the last is ``b""``), None once it has gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return None


def stop_children(exclude: Collection[int] = (), grace: float = 1.0, *, keep: Collection[int] = (),
                  rounds: int = 50, owners: Mapping[int, str] | None = None) -> list[str]:
    """End every process below this one still running but ``exclude`` (with what is below it) and
    ``keep`` (left running, what is below it not): SIGTERM to all of them at once (to the process
    group too of one that leads its own), SIGKILL after ``grace`` s; reap this process's children,
    those that had ended already too. Again while any is left (a process adopted meanwhile), at most
    ``rounds`` times. Returns ``"pid N: COMMAND"`` for each one that was running, with ``" (left
    running by OWNER)"`` where ``owners`` names the pid or an ancestor of it.

    A process that forks and exits over and over is at a new pid by the time a look at ``/proc`` ends,
    and a look can miss it altogether; its generations, each adopted here as its parent exits, end as
    this process's children. So each process found gets SIGSTOP at once (SIGCONT with its SIGTERM), and the
    look ends only after three rounds in a row that found nothing running and reaped no child; from the second
    round on, the process group of each child that ended is killed too (one in a group of its own that a look
    missed). A process that never stopped starting new ones by the last round is said as such."""
    stopped: list[str] = []
    spared = {*exclude, *keep}
    owners = owners or {}
    quiet = 0
    for number in range(rounds):
        running = [pid for pid, state in descendants(keep, exclude).items() if state != "Z"]
        _freeze(running)  # before its command line is read: one that forks and exits would be gone by then
        for pid in running:
            owner = _owner(pid, owners)
            line = f"pid {pid}: {command_line(pid)}" + (f" (left running by {owner})" if owner else "")
            if line not in stopped:
                stopped.append(line)
        _end(running, grace if not number else 0.0)  # a round after the first: it forks on, no grace
        ended = children(spared)
        if number:  # an ended child's process group, where it is not this one's: where its last fork went on
            _kill_groups(ended, spared)
        reaped = [pid for pid in ended if _gone(pid)]  # what ended meanwhile, or before
        quiet = 0 if running or reaped else quiet + 1
        if quiet == 3 or (quiet and not number):  # nothing at the first look: nothing left, the usual case
            return stopped
        time.sleep(0.005 * quiet)
    stopped.append(f"processes below pid {os.getpid()} kept starting new ones for {rounds} rounds of stopping: "
                   "some may still run")
    return stopped


def _kill_groups(pids: Collection[int], spared: Collection[int]) -> None:
    """SIGKILL the process group of each of ``pids`` (an ended child's too: its group outlives it) that is
    neither this process's group nor one a ``spared`` process is in, and holds only processes below this one
    (:func:`_ours`)."""
    mine = {os.getpgrp()}
    for pid in spared:
        with contextlib.suppress(OSError):
            mine.add(os.getpgid(pid))
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    for group in groups - mine:
        if _ours(group):
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)


def _ours(group: int) -> bool:
    """Whether every process of process group ``group`` is below this one: a test may have put a child in a
    group of the operator's (``Popen(process_group=...)``), which no signal of the run's may reach."""
    me = os.getpid()
    return all(pid != me and at_or_below(pid, me) for pid in group_members(group))


def _freeze(pids: list[int]) -> None:
    """SIGSTOP ``pids`` at once, before any can start another (SIGKILL still ends a stopped process)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)


def _owner(pid: int, owners: Mapping[int, str]) -> str | None:
    """``owners``' name for ``pid`` or for its nearest ancestor below this process that has one."""
    me, seen = os.getpid(), set()
    while pid not in owners and pid != me and pid not in seen and (known := parent_and_state(pid)) is not None:
        seen.add(pid)
        pid = known[0]
    return owners.get(pid)


def _end(running: list[int], grace: float) -> None:
    """SIGTERM ``running`` (and the process group of each that is in another group than this process's, where
    that group is the run's alone: :func:`_ours`), then SIGCONT (a stopped one
    acts on it), SIGKILL what is left after ``grace`` s; reap those that are this process's children."""
    mine, ours = os.getpgrp(), {}  # group -> whether it is the run's alone
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != mine and group not in ours:
                    ours[group] = _ours(group)  # once a group: a look at every process of /proc
                if group != mine and ours[group]:
                    os.killpg(group, sig)
                os.kill(pid, sig)
                if sig == signal.SIGTERM:
                    os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while running and time.monotonic() < deadline:
            running = [pid for pid in running if not _gone(pid)]
            if running:
                time.sleep(0.02)
        if not running:
            return


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (reaped here when it is this process's child)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:  # another's child: ended once it is a zombie or gone
        known = parent_and_state(pid)
        return known is None or known[1] == "Z"
