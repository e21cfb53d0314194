"""The access guard: a test neither reads nor writes the operator's state.

The process's audit hook (PEP 578; :mod:`~canarchy.testing.isolation.audithook`) hands the guard each file
operation with its path before the OS sees it; the guard resolves
the path and raises :class:`OperatorStateRefused` for a read or write of a refused path and for a write under
a read-only tree outside its writable trees (writes into watched trees are recorded). Every refusal is also
recorded, so a test that catches it still fails. The hook cannot be removed: ``GUARD.enabled`` switches it.
Design and limits: ``docs/design/test-isolation.md`` ("Layer 6: the access guard"). Imports neither pytest
nor python-can.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import threading
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from canarchy.testing.isolation.events import (
    DESCRIPTOR_WALKERS, DIRECTORY, FILE_IOCTL_READS, HANDED_ENVIRONMENT, NOFOLLOW, NONE_IS_CWD, O_TMPFILE, OPEN,
    OPEN_WRITE_FLAGS, OUTRIGHT, READ, REMOVALS, SIGNALS, SPECIAL, SPECS, TREE, UNIX_SENDS, WRITE, handed_paths,
    handed_variables, makes_a_device, path_text, unix_address,
)
from canarchy.testing.isolation._child import UNKNOWN_OWNER, keep_the_hook, parent_nodeid
from canarchy.testing.isolation.descriptors import (
    descriptor_path, directory_descriptors, working_directory,
)
from canarchy.testing.isolation.interfaces import EVENTS as INTERFACE_EVENTS, interface_change
from canarchy.testing.isolation.refusal import Access, OperatorStateRefused
from canarchy.testing.isolation.listeners import port_holder_outside, unix_listener_outside
from canarchy.testing.isolation.protection import Protection, Zones, resolved_paths
from canarchy.testing.isolation.reportlog import ReportLog, append
from canarchy.testing.isolation.resolution import Resolutions
from canarchy.testing.isolation.signals import TERMINAL_EVENTS, reached, terminal_changed

ENVIRONMENT_VARIABLE = "PYTEST_CANARCHY_ACCESS"
#: The variables that start a child Python's guards and say where it reports: the run's own values only.
CHILD_VARIABLES = (ENVIRONMENT_VARIABLE, "PYTEST_CANARCHY_GUARD", "PYTEST_CANARCHY_GUARD_DIR")
REPORT_FILE = "access.jsonl"  # in report_dir: one JSON record a line, appended by child processes

_isdir, _fstat = os.path.isdir, os.fstat  # bound once: a test that patches them (to count calls) sees only its own
#: The thread-local ``busy`` while the audit hook has the guard judge an event of a thread the harness exempted
#: (:meth:`AccessGuard.exempt`): its own work, run through code that is not its own (``subprocess``).
EXEMPT_JUDGING = 2
_LINUX = sys.platform.startswith("linux")
#: The events that make a name lead elsewhere, and how a refusal says it (:meth:`AccessGuard._linked_top`).
_LINK_MAKERS = {"os.symlink": "symlink", "os.link": "hard-link to", "os.rename": "move a symlink onto"}


def _removes_nothing(zone: str, operation: str, path: str) -> bool:
    """A removal from the checkout of a path that is not there: the call fails, and a record of it would be
    taken for a removal at the test's end."""
    return zone == "watched" and operation in REMOVALS and not os.path.lexists(path)


class AccessGuard:
    """The process-wide guard state. One instance, :data:`GUARD`.

    ``enabled``: judge accesses (the hook consults it); ``owner``: who is
    named in a record; ``report_dir``: where a child process appends each
    record to :data:`REPORT_FILE` (read back by :meth:`take` in the parent);
    ``protection``: the resolved :class:`Protection` (set with :meth:`configure`).
    """

    def __init__(self) -> None:
        self.enabled = False
        self.owner = "<outside any test>"
        self.report_dir: Path | None = None
        self.protection = Protection()
        self._zones = Zones(self.protection)
        self._refusals: list[Access] = []
        self._watched: list[Access] = []
        self._cached: list[str] = []  # byte code the import system wrote in watched or read-only trees
        self._lock = threading.Lock()
        self._log = ReportLog(REPORT_FILE)  # the report file of report_dir, and how far it was read
        self._local = threading.local()
        self.paths = Resolutions()  # where a path leads, and what is remembered of directories
        self._memory_pid: int | None = os.getpid()  # records made in this pid stay in memory only
        self.run_pid = os.getpid()  # the run's top pytest: it and what is below it are the run (signals)
        self.terminals: frozenset[int] = frozenset()  # the operator's terminal's device numbers (signals.devices)
        self.network_namespace = 0  # the inode of the run's private network namespace, 0 where it has none
        self.thread_owners: dict[int, str] = {}  # thread id -> the test that left it running (the plugin shares one)
        self.child_variables: dict[str, str] = {}  # CHILD_VARIABLES as the run set them; empty: not judged
        #: After the sentinel's last look: called with every access recorded from then on, before it is
        #: recorded (the plugin's ends the process when the access would change what the look saw).
        self.late: Callable[[Access], None] | None = None

    # -- configuration -----------------------------------------------------------
    def configure(self, protection: Protection) -> Protection:
        """Protect ``protection`` from now on (its paths resolved now); returns the resolved one."""
        resolved = Protection(
            refused=resolved_paths(protection.refused), read_only=resolved_paths(protection.read_only),
            writable=resolved_paths(protection.writable), watched=resolved_paths(protection.watched),
            unwatched_names=tuple(protection.unwatched_names), staging=tuple(protection.staging),
        )  # fmt: skip
        self._zones = Zones(resolved)  # one assignment: the hook sees the old zones or the new ones
        self.protection = resolved
        self.forget_resolutions()
        return resolved

    def forget_resolutions(self) -> None:
        """Drop what the guard remembers of directories (their resolution, their symlinks).
        The hook does this after each operation that can make or move a link in this process."""
        self.paths.forget()

    @property
    def others_relink(self) -> bool:
        """A process was started: it may make or move links unseen by this process's hook, so nothing is remembered
        of directories until the plugin finds that no child is left (and none could have left this process)."""
        return self.paths.others_relink

    @others_relink.setter
    def others_relink(self, value: bool) -> None:
        self.paths.others_relink = value

    def process_started(self, args: tuple = ()) -> None:
        """Observer of the events of a new process (:data:`PROCESS_STARTS`): see :attr:`others_relink`."""
        self.paths.others_relink = True
        self.paths.forget()

    def to_environment(self) -> dict[str, str]:
        """The variable that gives a child process this configuration (see :func:`activate_from_environment`)."""
        document = {f.name: list(getattr(self.protection, f.name)) for f in fields(Protection)}
        document["report_dir"] = str(self.report_dir) if self.report_dir is not None else None
        document["run_pid"] = self.run_pid
        document["terminals"] = sorted(self.terminals)
        document["network_namespace"] = self.network_namespace
        return {ENVIRONMENT_VARIABLE: json.dumps(document)}

    def busy(self) -> bool:
        """Whether this thread is inside the guard's own work (judging, or :meth:`exempt`)."""
        return getattr(self._local, "busy", False)

    @contextlib.contextmanager
    def exempt(self) -> Iterator[None]:
        """Within the block, this thread's own accesses are not judged (the harness's own
        reads of the operator's state, e.g. the sentinel's hashes)."""
        local = self._local
        before, start = getattr(local, "busy", False), getattr(local, "start", None)
        local.busy, local.start = True, sys._getframe(2)  # 2: the caller of the with statement (past contextlib's)
        try:
            yield
        finally:
            local.busy, local.start = before, start

    # -- records -----------------------------------------------------------------
    def take(self, owner: str | None = None) -> tuple[list[Access], list[Access]]:
        """Return and forget ``(refusals, watched writes)`` (those of ``owner`` only, when
        given), including those child processes wrote to ``report_dir``: one look at it."""
        self._collect_reports()
        return self._forget(self._refusals, owner), self._forget(self._watched, owner)

    def take_refusals(self, owner: str | None = None) -> list[Access]:
        """Return and forget the refused accesses (as :meth:`take`)."""
        self._collect_reports()
        return self._forget(self._refusals, owner)

    def take_watched(self, owner: str | None = None) -> list[Access]:
        """Return and forget the recorded writes into watched trees (as :meth:`take`)."""
        self._collect_reports()
        return self._forget(self._watched, owner)

    def take_cached(self) -> list[str]:
        """Return and forget the paths of byte code the import system wrote, in this process,
        into watched or read-only trees (removed by the plugin after a test that changed how
        the import system compiles)."""
        if not self._cached:  # every test asks: no lock when there is nothing
            return []
        with self._lock:
            taken, self._cached[:] = list(self._cached), []
        return taken

    def _forget(self, records: list[Access], owner: str | None) -> list[Access]:
        if not records:
            return []
        with self._lock:
            taken = [r for r in records if owner is None or r.owner == owner]
            records[:] = [r for r in records if r not in taken]
        return taken

    def _collect_reports(self) -> None:
        """Move the records other processes appended to ``report_dir/access.jsonl`` into memory
        (:class:`~canarchy.testing.isolation.reportlog.ReportLog`)."""
        report_dir = self.report_dir
        if report_dir is None:
            return
        with self.exempt():  # reading the reports is not judged
            for record in self._log.read_new(report_dir):
                try:
                    access = Access(**record)
                except TypeError:
                    continue
                if access.pid != os.getpid():  # this process's own records are in memory already
                    with self._lock:
                        if access.zone == "cached":
                            self._cached.append(access.resolved)
                        else:
                            (self._refusals if access.refused else self._watched).append(access)

    def _record(self, access: Access) -> None:
        with self._lock:
            (self._refusals if access.refused else self._watched).append(access)
        if self.report_dir is not None and access.pid != self._memory_pid:
            try:  # one line, one write: lines of several processes do not mix
                append(self.report_dir, REPORT_FILE, asdict(access))
            except OSError:
                pass  # the in-memory record and the raised error still stand

    # -- the hook's work -----------------------------------------------------------
    def _audit(self, event: str, args: tuple) -> None:
        if event == "open":  # the most frequent
            self._open(args)
            return
        if event in HANDED_ENVIRONMENT:
            self._handed(event, args)
            if event not in SPECS:
                return
        spec = SPECS.get(event)
        if makes_a_device(event, args):
            self._outright("os.mknod device", args)
        if spec is None:
            if event in INTERFACE_EVENTS:  # Linux: a socket made; an ioctl (a signal's or a terminal's check sees too)
                self._interfaces(event, args)
                self._file_ioctl(event, args)
            if event in SIGNALS:
                self._signal(event, args)
                return
            if event == "socket.__new__":
                return
            if event in OUTRIGHT:
                self._outright(event, args)
                return
            for value, dir_fd, operation, flags in SPECIAL[event](args):
                self._judge(value, dir_fd, operation, flags)
            if event in UNIX_SENDS:
                self._listener(event, args)
            return
        for index, dir_fd_index, operation, flags in spec:
            self._judge(args[index], None if dir_fd_index is None else args[dir_fd_index], operation, flags)
        if event == "os.rename":
            self._moved_tree(args)
            self._moved_socket(args)
        if event in _LINK_MAKERS:
            self._linked_top(event, args)

    def _outright(self, event: str, args: tuple) -> None:
        """An event refused whatever its arguments (:data:`~.events.OUTRIGHT`)."""
        shown, operation, resolved, zone, tree = OUTRIGHT[event]
        value = event if shown is None else args[shown]
        self._refuse_or_record(Access(self._owner(), operation, str(path_text(value) or value), resolved, zone, tree,
                                      os.getpid()))

    def _signal(self, event: str, args: tuple) -> None:
        """A signal or a change to a process (:data:`~.events.SIGNALS`): refused when it would reach a
        process outside the run (:func:`~.signals.reached`); a change to the operator's terminal is refused."""
        if event in TERMINAL_EVENTS:
            changed = terminal_changed(event, args, self.terminals) if self.terminals else None
            if changed is not None:
                self._refuse_or_record(Access(self._owner(), changed[0], changed[1], "the operator's terminal",
                                              "terminal", "the operator's terminal", os.getpid()))
            if event.startswith("termios."):
                return
        found = reached(event, args, self.run_pid)
        if found is not None:
            operation, shown, outside = found
            self._refuse_or_record(Access(self._owner(), operation, shown, outside, "process",
                                          "a process outside the run", os.getpid()))

    def _interfaces(self, event: str, args: tuple) -> None:
        """A change to the host's network interfaces (:func:`~.interfaces.interface_change`): refused where the
        run has no network namespace of its own (a CAN interface taken down, its bitrate changed)."""
        if not self.network_namespace:
            change = interface_change(event, args)
            if change is not None:
                self._refuse_or_record(Access(self._owner(), change[0], change[1], "the host's network interfaces",
                                              "network", "the host's network interfaces", os.getpid()))

    def _handed(self, event: str, args: tuple) -> None:
        """The paths an environment variable hands C code or a child (:func:`~.events.handed_paths`), judged as
        the access they give, and a child's start-up hook kept (:func:`~._child.keep_the_hook`); not in the harness's
        own work (:data:`EXEMPT_JUDGING`), whose programs get its own."""
        if getattr(self._local, "busy", False) != EXEMPT_JUDGING:
            index = HANDED_ENVIRONMENT[event]
            if index is not None:  # a child started: its guard stays on its PYTHONPATH
                keep_the_hook(args[index])
            self._forged(event, args)
            for value, dir_fd, operation, flags in handed_paths(event, args):
                self._judge(value, dir_fd, operation, flags)

    def _forged(self, event: str, args: tuple) -> None:
        """One of :data:`CHILD_VARIABLES` handed on with a value other than the run's (:attr:`child_variables`):
        refused, as the child's guard would judge by other rules or report where no test looks. Left out, it is
        a hand-built environment: a known gap (docs/design/test-isolation.md, layer 6)."""
        own = self.child_variables
        for name, value in handed_variables(event, args) if own else ():
            key = path_text(name)
            if key in own and path_text(value) != own[key]:
                self._refuse_or_record(Access(self._owner(), f"hand a child process another ${key}:",
                                              str(path_text(value) or value)[:200], own[key][:200], "configuration",
                                              "the isolation's configuration of its children", os.getpid()))

    def _file_ioctl(self, event: str, args: tuple) -> None:
        """An ioctl (fd, request, argument) on a regular file's or a directory's descriptor, but one of
        :data:`~.events.FILE_IOCTL_READS`: judged as a write of what the descriptor names now (a file of the home
        made immutable through a descriptor opened to read)."""
        if event != "fcntl.ioctl" or args[1] in FILE_IOCTL_READS or args[0].__class__ is not int:
            return
        try:
            mode = _fstat(args[0]).st_mode
        except OSError:
            return
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            self._judge(args[0], None, f"change a file through ioctl {args[1]:#x} on", WRITE)

    def _listener(self, event: str, args: tuple) -> None:
        """A connect or a send to a Unix-domain socket (:data:`~.events.UNIX_SENDS`), or to a port of this host:
        refused when a process outside the run is bound there (:func:`~.listeners.unix_listener_outside`, in
        the file system or the abstract namespace; :func:`~.listeners.port_holder_outside`)."""
        if not _LINUX:
            return
        address = unix_address(args)
        if address is not None:
            outside = unix_listener_outside(address, self.run_pid, network_namespace=self.network_namespace)
            shown, what = os.fsdecode(address).replace("\0", "@"), "the Unix socket"
        else:
            outside = port_holder_outside(args[0], args[1], self.run_pid) if hasattr(args[0], "family") else None
            shown, what = f"{args[1][0]}:{args[1][1]}" if outside else "", "the port"
        if outside is not None:
            self._refuse_or_record(Access(self._owner(), f"{UNIX_SENDS[event]} {what}", shown, outside,
                                          "process", "a process outside the run", os.getpid()))

    def _open(self, args: tuple) -> None:
        """The ``open`` event: (path, mode or None for ``os.open``, flags)."""
        write = args[2] & OPEN_WRITE_FLAGS if args[2].__class__ is int else 0
        if not write and args[1].__class__ is str and args[1] not in ("r", "rb"):
            write = any(c in args[1] for c in "wax+")
        # os.open (mode None) of a directory gives a dir_fd; open() cannot (its opener is audited itself),
        # nor can O_TMPFILE (an unnamed file)
        dir_fd = args[1] is None and args[2].__class__ is int and (not O_TMPFILE or args[2] & O_TMPFILE != O_TMPFILE)
        walker = False
        if dir_fd:  # the standard library's walkers, their own code run with their own module: not as descriptors
            caller = sys._getframe(3)  # 3: _open, _audit, the hook, os.open's caller
            walker = DESCRIPTOR_WALKERS.get(caller.f_code) is caller.f_globals
            dir_fd = not walker
        operation, flags = ("open for writing", WRITE) if write else ("open for reading", READ)
        relative = args[1] is None and (text := path_text(args[0])) and not os.path.isabs(text)
        if not (walker and relative):  # a walker's relative name is under its own descriptors (below), not the cwd
            self._judge(args[0], None, operation, flags | OPEN if dir_fd else flags)
        if relative:
            # os.open: the event carries no dir_fd, so the name is judged under every directory open here
            for base in directory_descriptors():
                self._judge(os.path.join(base, text), None, operation, flags | OPEN if dir_fd else flags)

    def _moved_socket(self, args: tuple) -> None:
        """``os.rename`` (source, destination, their dir_fds) of a socket file a process outside the run is bound
        to: ``/proc/net/unix`` names it by the old name, so a connect by the new one would reach that process
        unjudged. Refused."""
        source = self._absolute(args[0], args[2]) if _LINUX else None
        try:
            if source is None or not stat.S_ISSOCK(os.lstat(source).st_mode):
                return
        except OSError:
            return
        outside = unix_listener_outside(source, self.run_pid, network_namespace=self.network_namespace)
        if outside is not None:
            self._refuse_or_record(Access(self._owner(), "move the Unix socket", source, outside, "process",
                                          "a process outside the run", os.getpid()))

    def _linked_top(self, event: str, args: tuple) -> None:
        """A link made at the top of a writable tree (:attr:`~.protection.Zones.writable_tops`), or a symlink moved
        onto one: refused, as the next run, which resolves its writable trees as it starts, would write there."""
        if event == "os.rename":
            source = self._absolute(args[0], args[2])
            if source is None or not os.path.islink(source):
                return
        target = self._absolute(args[1], args[2] if event == "os.symlink" else args[3])
        resolved = None if target is None else self.paths.resolve(target, False)
        if resolved in self._zones.writable_tops:
            self._refuse_or_record(Access(self._owner(), _LINK_MAKERS[event], target, resolved, "writable top",
                                          resolved, os.getpid()))

    def _moved_tree(self, args: tuple) -> None:
        """``os.rename`` (source, destination, their dir_fds) of a directory into a watched or read-only tree:
        each name under it is judged at its new place (the rename judged the top only; a ``.gitignore``,
        a start-up name or an ignored module inside would pass unjudged, and unrecorded)."""
        source, target = self._absolute(args[0], args[2]), self._absolute(args[1], args[3])
        if source is None or target is None or not _isdir(source) or os.path.islink(source):
            return
        if self._zones.verdict(self.paths.resolve(target, False), True, False) is None:
            return
        for top, dirs, files in os.walk(source):
            for name in dirs + files:
                moved = os.path.join(target, os.path.relpath(os.path.join(top, name), source))
                self._judge(moved, None, "rename to", WRITE | NOFOLLOW)

    @staticmethod
    def _absolute(value: Any, dir_fd: Any) -> str | None:
        """A path argument made absolute (under its ``dir_fd`` or the working directory), or None."""
        text = path_text(value)
        if text is None or os.path.isabs(text):
            return text
        try:
            base = descriptor_path(dir_fd) if dir_fd.__class__ is int and dir_fd >= 0 else working_directory()
        except OSError:
            return None
        return None if base is None else os.path.join(base, text)

    # radon D by design: the audit hook's per-event path, one function to spare calls (docs/benchmarks.md, 5)
    def _judge(self, value: Any, dir_fd: Any, operation: str, flags: int) -> None:
        text = value if value.__class__ is str else path_text(value)
        if text is None:
            if value.__class__ is int and flags & WRITE:  # os.chmod(fd), os.utime(fd): what it names now
                text = descriptor_path(value)
                flags |= NOFOLLOW
                if text is None:
                    return
            elif value is not None or not flags & NONE_IS_CWD:
                return  # a descriptor read from: opening it was judged
            else:
                text = os.curdir
        if dir_fd is not None and dir_fd.__class__ is int and dir_fd >= 0 and not os.path.isabs(text):
            base = descriptor_path(dir_fd)  # relative to a directory descriptor: under what it names now
            if base is None:
                return
            text = os.path.join(base, text)
        paths = self.paths
        resolved = None if flags & NOFOLLOW else paths.dirs.get(text)  # a directory judged before
        if resolved is None:
            try:
                if flags & DIRECTORY and os.path.isabs(text):
                    resolved = paths.directory(text)
                else:
                    resolved = paths.resolve(text, not flags & NOFOLLOW)
            except ValueError:  # a NUL in the path: the call itself fails
                return
            except OSError:  # no working directory to resolve a relative path from: refused, not let through
                self._refuse_or_record(Access(self._owner(), operation, text, text, "unresolved", text, os.getpid()))
                return
        zones = self._zones
        if flags & OPEN and (found := zones.descriptor_verdict(resolved)) is not None and _isdir(resolved):
            # os.open(dir) for a dir_fd: what is opened through it later is never judged
            self._refuse_or_record(Access(self._owner(), "open a descriptor of the directory", text, resolved,
                                          found[0], found[1], os.getpid()))
            return
        if not flags & (WRITE | TREE) and (  # a read: only the refused paths matter, and other processes' environment
                resolved not in zones.refused and not resolved.startswith(zones.refused_prefixes)
                and not resolved.startswith("/proc/")):
            return
        verdict = zones.verdict(resolved, flags & WRITE, flags & TREE)
        if verdict is None or _removes_nothing(verdict[0], operation, resolved):
            return
        if verdict[0] == "cached":
            self._note_cached(resolved)
            return
        self._refuse_or_record(Access(self._owner(), operation, text, resolved, verdict[0], verdict[1], os.getpid()))

    def _note_cached(self, path: str) -> None:
        """Byte code the import system writes: checked against its source by the plugin's own compiler,
        in pytest's process (a child reports it there: its import machinery may be a test's). After the
        sentinel's last look nothing checks it any more: it goes to :attr:`late`."""
        if self.late is not None:
            self.late(Access(self._owner(), "cache byte code at", path, path, "late",
                             "no byte code is cached after it: nothing would compare it with its source", os.getpid()))
        self._cached.append(path)
        if self.report_dir is not None and os.getpid() != self._memory_pid:
            try:
                append(self.report_dir, REPORT_FILE,
                       asdict(Access(self._owner(), "cache byte code", path, path, "cached", "", os.getpid())))
            except OSError:
                pass

    def _owner(self) -> str:
        """Who is named: the test that left this thread running after it ended, else :attr:`owner`; in a child that
        knew none as it started, what its environment says now (pytest-xdist names a worker after its start)."""
        owner = self.thread_owners.get(threading.get_ident(), self.owner) if self.thread_owners else self.owner
        if owner == UNKNOWN_OWNER:
            return parent_nodeid(os.environ.get("PYTEST_CURRENT_TEST"))
        return owner

    def refuse(self, access: Access) -> None:
        """Record ``access`` (zone other than ``watched``) and raise :class:`OperatorStateRefused`: for a
        refusal the guard's caller decides, not its zones (an ``os.exec*`` of pytest's own process)."""
        self._refuse_or_record(access)

    def _refuse_or_record(self, access: Access) -> None:
        if self.late is not None:
            self.late(access)
        self._record(access)
        if access.refused:
            raise OperatorStateRefused(access.message())


GUARD = AccessGuard()
