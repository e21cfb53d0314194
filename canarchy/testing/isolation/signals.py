"""What a signal, or a change to another process, reaches: read from its audit event's arguments.

The events are :data:`~canarchy.testing.isolation.events.SIGNALS`; the access guard refuses what
:func:`reached` finds outside the run (:func:`~canarchy.testing.isolation.protection.signalled_outside`).
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any
from collections.abc import Iterable

from canarchy.testing.isolation.events import TERMINAL_SETTERS
from canarchy.testing.isolation.protection import signalled_outside

try:
    import fcntl
    import termios
except ImportError:  # Windows
    fcntl = termios = None  # type: ignore[assignment]


def reached(event: str, args: tuple, run_pid: int) -> tuple[str, str, str] | None:
    """``(operation, target as shown, what it reaches)`` for ``os.kill``/``os.killpg`` (target, signal;
    signal 0 sends none), ``os.pidfd_open`` (pid) or a change to a process that would reach a process
    outside the run whose top pytest is ``run_pid``; None for one that reaches none."""
    if event not in _SENDERS:
        changed = _process_change(event, args)
        if changed is None:  # resource.prlimit that asks only
            return None
        event, target, operation = changed
        if target is None or target.__class__ is str:  # every process of a user (the operator's shell
            # among them), or an owner the guard cannot read
            shown = f"user {args[1] or os.getuid()}" if target is None else f"descriptor {args[0]}"
            return operation, shown, target or "every process of the user"
    elif (event != "os.pidfd_open" and args[1] == 0) or args[0].__class__ is not int:
        return None
    else:
        target = args[0]
        operation = ("open a descriptor to signal" if event == "os.pidfd_open"
                     else f"send signal {args[1]} with {event} to")
    if target.__class__ is not int:
        return None
    outside = signalled_outside(event, target, run_pid)
    if outside is None:
        return None
    shown = f"process group {abs(target) or os.getpgrp()}" if event == "os.killpg" or target <= 0 else f"pid {target}"
    return operation, shown, outside


_SENDERS = frozenset({"os.kill", "os.killpg", "os.pidfd_open"})  # the signals themselves, of SIGNALS
#: The changes to a process (:data:`~.events.SIGNALS` but :data:`_SENDERS`), and what the refusal says.
_CHANGES = {"resource.prlimit": "set a resource limit of", "os.sched_setaffinity": "change the CPUs of",
            "os.sched_setscheduler": "change the scheduling of", "os.sched_setparam": "change the scheduling of"}


#: Descriptor owners (fcntl(2) ``F_SETOWN``, ``F_SETOWN_EX``; on sockets the ``FIOSETOWN`` and ``SIOCSPGRP``
#: ioctls, Linux): the process or group the kernel sends SIGIO, or the signal ``F_SETSIG`` names (SIGKILL, SIGSTOP),
#: whenever the descriptor is ready (``O_ASYNC``), a lease is broken or a watched directory changes.
_F_SETOWN = getattr(fcntl, "F_SETOWN", None) if fcntl is not None else None
_LINUX = sys.platform.startswith("linux")
_F_SETOWN_EX = 15 if _LINUX else None  # struct f_owner_ex {int type; pid_t pid;}
_F_OWNER_TID, _F_OWNER_PGRP = 0, 2
_OWNER_IOCTLS = (0x8901, 0x8902) if _LINUX else ()  # FIOSETOWN, SIOCSPGRP: a pointer to an int
_OWNER = "make the owner of a descriptor (sent SIGIO, or the signal F_SETSIG names, when it is ready)"


def _owner_change(event: str, args: tuple) -> tuple[str, int | str, str] | None:
    """``fcntl.fcntl`` and ``fcntl.ioctl`` (fd, command, argument) that make a process or group the owner of
    a descriptor: ``(event, target, operation)`` as :func:`_process_change`; None for any other command and
    for no owner (0). CPython raises the event with the argument as given, before it converts it: an owner in
    anything but an ``int`` (``F_SETOWN``) or bytes (the structures) could convert to another value than
    the guard reads (an ``__index__``, a buffer changed meanwhile, an address of memory): refused as unread."""
    command, argument = args[1], args[2]
    if event == "fcntl.fcntl" and command == _F_SETOWN and _F_SETOWN is not None:
        if argument.__class__ is not int:
            return event, "an owner the guard cannot read (not an int)", _OWNER
        owner = argument
    elif (event == "fcntl.fcntl" and command == _F_SETOWN_EX and _F_SETOWN_EX is not None) or (
            event == "fcntl.ioctl" and command in _OWNER_IOCTLS):
        owner = _owner_in_structure(event, argument)
        if owner is None or owner.__class__ is str:
            return None if owner is None else (event, owner, _OWNER)
    else:
        return None
    if owner == 0:
        return None
    return ("os.pidfd_open", owner, _OWNER) if owner > 0 else ("os.killpg", -owner, _OWNER)


def _owner_in_structure(event: str, argument: Any) -> int | str | None:
    """The owner an ``F_SETOWN_EX`` structure (``fcntl.fcntl``: type, pid) or an owner ioctl's int
    (``fcntl.ioctl``) names: a pid, minus a group; None for a thread of this process; a str (why) for an
    argument that is no bytes of the size (an address, or a buffer that may change)."""
    raw = argument.encode() if isinstance(argument, str) else argument
    size = 8 if event == "fcntl.fcntl" else 4
    if not isinstance(raw, bytes) or len(raw) < size:
        return "an owner the guard cannot read (not bytes: an address, or a buffer that may change)"
    if event == "fcntl.ioctl":
        return int.from_bytes(raw[:4], sys.byteorder, signed=True)
    kind = int.from_bytes(raw[:4], sys.byteorder, signed=True)
    owner = int.from_bytes(raw[4:8], sys.byteorder, signed=True)
    if kind == _F_OWNER_TID and os.path.exists(f"/proc/self/task/{owner}"):
        return None  # a thread of this process
    return -owner if kind == _F_OWNER_PGRP else owner


def _process_change(event: str, args: tuple) -> tuple[str, int | str | None, str] | None:
    """For a change to a process: ``(event, target, operation)`` judged as :func:`~.protection.signalled_outside`
    judges a pid (``os.pidfd_open``) or a group (``os.killpg``); 0 names this process (its group); target None
    is every process of a user, a str what the guard cannot read (refused). None for ``resource.prlimit`` that
    sets nothing, and for an ``fcntl`` command that makes no owner."""
    if event in ("fcntl.fcntl", "fcntl.ioctl"):
        return _owner_change(event, args) if len(args) >= 3 else None
    if event == "os.setpriority":  # (which, who, priority)
        operation = "change the nice level of"
        if args[0] == os.PRIO_PGRP:
            return "os.killpg", args[1], operation
        if args[0] == os.PRIO_USER:
            return "os.setpriority", None, operation
        return "os.pidfd_open", args[1] or os.getpid(), operation
    if event == "resource.prlimit" and (len(args) < 3 or args[2] is None):
        return None
    return "os.pidfd_open", args[0] or os.getpid(), _CHANGES[event]


#: The events of a change to a terminal: ``fcntl.ioctl`` (fd, request, argument) but a request that only reads
#: (:data:`_TERMINAL_READS`), ``fcntl.fcntl`` (fd, ``F_SETFL``: flags of the description the operator's shell
#: shares) and :mod:`termios`' setters (fd, ...; no event of CPython's: raised by c_openers' wrappers).
TERMINAL_EVENTS = frozenset({"fcntl.ioctl", "fcntl.fcntl", *(f"termios.{name}" for name in TERMINAL_SETTERS)})
_TERMINAL_READS = frozenset(getattr(termios, name) for name in (
    "TCGETS", "TCGETA", "TIOCGWINSZ", "TIOCGPGRP", "TIOCGSID", "FIONREAD", "TIOCINQ", "TIOCOUTQ", "TIOCMGET",
    "TIOCGETD", "TIOCGSERIAL", "TIOCGSOFTCAR", "TIOCGLCKTRMIOS", "TIOCGICOUNT", "FIOCLEX", "FIONCLEX")
    if termios is not None and hasattr(termios, name))


def devices(paths: Iterable[str]) -> frozenset[int]:
    """The device numbers (``st_rdev``) of the character devices among ``paths``."""
    found = set()
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(status.st_mode):
            found.add(status.st_rdev)
    return frozenset(found)


def terminal_changed(event: str, args: tuple, terminals: frozenset[int]) -> tuple[str, str] | None:
    """``(operation, descriptor as shown)`` for an event of :data:`TERMINAL_EVENTS` that changes one of
    ``terminals`` (device numbers, :func:`devices`) through a descriptor; None for any other."""
    if (event == "fcntl.ioctl" and args[1] in _TERMINAL_READS) or (
            event == "fcntl.fcntl" and args[1] != getattr(fcntl, "F_SETFL", None)):
        return None
    fd = args[0]
    try:
        fd = fd if fd.__class__ is int else fd.fileno()
        status = os.fstat(fd)
    except (AttributeError, TypeError, ValueError, OSError):
        return None  # the C function refuses it too
    if not stat.S_ISCHR(status.st_mode) or status.st_rdev not in terminals:
        return None
    how = event.partition(".")[2] + (f" {args[1]:#x}" if event.startswith("fcntl.") and args[1].__class__ is int
                                     else "")
    return f"change the terminal ({how}) through", f"descriptor {fd}"
