"""What the two guards raise and record when they refuse, and the message that names the test.

The bus guard's :class:`Refusal` and the access guard's :class:`Access` each say who tried what, where
(a child process, if not this one), and the ways to fix it. Standard library only: child Pythons load it
with the guards.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

#: What the plugin records in a test's JUnit case (``user_properties``), for the lanes to read: a write into
#: the checkout, and a refusal that failed the test (the parity lane fails on one even when both twins were
#: refused alike, e.g. through a route to the home that only a serial run has, such as ``site.USER_BASE``).
CHECKOUT_WRITE_PROPERTY = "canarchy_checkout_write"
REFUSED_PROPERTY = "canarchy_refused"
#: A refusal the test expected and took (the ``bus_guard``/``access_guard`` fixtures): kept in its report.
EXPECTED_REFUSAL_PROPERTY = "canarchy_refused_expected"

BUS_FIXES = (
    'use interface="virtual" with a channel of its own (the `virtual_channel` fixture)',
    "patch PythonCanBackend._open_bus (or build the transport) so the test never opens a bus",
    "use the offline scaffold backend (CANARCHY_TRANSPORT_BACKEND=scaffold)",
    "if the test needs a real bus, mark it @pytest.mark.integration (or real_bus) and run it with -m integration",
)
ACCESS_FIXES = (
    "use the test's own home: Path.home() in a test is a fresh, empty directory "
    "(the canarchy_sandbox fixture has the session's homes)",
    "write to pytest's tmp_path (or tmp_path_factory)",
    "if the test must see the operator's real home, mark it @pytest.mark.real_home and run it with -m real_home",
)

PROCESS_FIXES = (
    "start what the test signals or talks to inside the test (a subprocess, a server on a port or a socket of its "
    "own) and stop it there",
    "if the test must reach what runs outside it, mark it @pytest.mark.integration and run it with -m integration",
)
NETWORK_FIXES = (
    "set canarchy_network_namespace = true: the run then has a network namespace of its own, holding only "
    "loopback, whose interfaces a test may change",
    "if the test must change the host's interfaces, mark it @pytest.mark.integration and run it with -m integration",
)
INTERPRETER_FIXES = (
    "run that code in a child Python (subprocess, multiprocessing), which the guard follows",
    "if the test must start a sub-interpreter, mark it @pytest.mark.real_home and run it with -m real_home",
)
HOST_FIXES = (
    "give the code under test the name or the time to use (a parameter, a fake clock) instead of changing the host's",
    "if the test must change the host, mark it @pytest.mark.integration and run it with -m integration",
)
ROOT_FIXES = (
    "pass the code under test the directory to work under (a tmp_path) instead of changing the process's root",
)
CONFIGURATION_FIXES = (
    "start the child with the run's environment (env=None, or dict(os.environ, ...) with the isolation's own "
    "PYTEST_CANARCHY_* variables as they are)",
    "if the test is about the isolation itself, run it in a child pytest of its own (pytester.runpytest_subprocess)",
)
TERMINAL_FIXES = (
    "give the code under test a terminal of the test's own (pty.openpty()) and pass it that descriptor",
    "start a child with stdin=subprocess.DEVNULL and its output captured, not on pytest's streams",
)
#: The nodes of a terminal the operator types into (a pseudo-terminal, a virtual console, the console, each
#: process's own ``/dev/tty``); a serial line (``ttyS``, ``ttyUSB``, ``ttyACM``) is a CAN adapter's.
_TERMINAL_NODE = re.compile(r"/dev/(pts/[0-9]+|tty[0-9]*|console)")


def _numbered(fixes: tuple[str, ...]) -> str:
    return "\n".join(f"  {i}. {fix}" for i, fix in enumerate(fixes, 1))


def _where(pid: int) -> str:
    return "" if pid == os.getpid() else f" (in child process {pid})"


class RealCanBusRefused(AssertionError):
    """A test tried to open a CAN interface other than python-can's in-process ``virtual`` bus.

    An ``AssertionError`` so that pytest reports it as a test failure; product
    code that catches it does not hide it: the guard has recorded it (:mod:`~canarchy.testing.isolation.guard`).
    """


#: What a refusal of a real bus says after the test's name.
REAL_BUS_REFUSED = "tried to open a real CAN bus"

@dataclass(frozen=True)
class Refusal:
    """One refused attempt: the test node id, the interface, the channel and
    the route it took (``"by-name"``, ``"class"``, ``"init"`` or ``"socket"``)."""

    nodeid: str
    interface: str
    channel: str
    route: str
    pid: int

    def message(self) -> str:
        """The refusal text: names the test, interface and channel, and lists the fixes."""
        return (
            f"canarchy test isolation: {self.nodeid} {REAL_BUS_REFUSED}{_where(self.pid)}: "
            f"interface={self.interface!r}, channel={self.channel!r}.\n"
            f"Unit tests may use only python-can's in-process 'virtual' interface. Ways to fix it:\n"
            f"{_numbered(BUS_FIXES)}"
        )


class OperatorStateRefused(AssertionError):
    """A test tried to read or write the operator's state.

    An ``AssertionError``, not an ``OSError``: product code that handles a
    missing file must not take it for one. Code that catches ``Exception``
    does not hide it either: the refusal is recorded.
    """


@dataclass(frozen=True)
class Access:
    """One judged access: who (``owner``: a node id, ``"<collection of ...>"``
    or a fixture), what (``operation``, in words), the path as given and as
    resolved, the ``zone`` that decided (``"refused"``, ``"read-only"``, ``"bytecode"``, ``"start-up code"``,
    ``"version control"``, ``"descriptor"``, ``"exec"``, ``"process"``, ``"interpreter"``, ``"host"``,
    ``"configuration"``, ``"writable top"``, ``"unjudged"``, ``"unresolved"``, ``"late"`` or ``"watched"``), the
    protected ``tree`` (or file) it fell in, and the pid."""

    owner: str
    operation: str
    path: str
    resolved: str
    zone: str
    tree: str
    pid: int

    @property
    def refused(self) -> bool:
        return self.zone != "watched"

    def message(self) -> str:
        """Names the owner, the operation and the path; lists the ways to fix it."""
        where = _where(self.pid)
        if self.zone == "watched":
            return (f"canarchy test isolation: {self.owner} changed the checkout{where}: {self.operation} "
                    f"{self.path!r} (resolved: {self.resolved}, under {self.tree}). "
                    "Tests work on copies (tmp_path), never on the working tree.")
        if self.zone == "late":
            return (f"canarchy test isolation: {self.owner} tried to {self.operation} {self.path!r}{where} after the "
                    f"sentinel's last look ({self.tree or 'the run had its verdict'}). Refused.")
        terminal = self.zone == "terminal" or _TERMINAL_NODE.fullmatch(self.tree) is not None
        what = {"refused": "the environment the operator started this process or one above it with (or the "
                "command line of one above it, or the environment of another process outside the run)"
                if self.tree.startswith("/proc/") else "the operator's terminal" if terminal
                else "a CAN adapter's device node (real hardware)" if self.tree.startswith("/dev/")
                else "the operator's own state",
                "bytecode": "byte code not written by the import system, where an import would later run it "
                            "(outside any isolation)",
                "start-up code": "code or configuration a later Python or pytest run loads without being asked "
                                 "(a distribution's metadata and entry points, a .pth file, sitecustomize, "
                                 "a conftest or pytest configuration), or a tool of the project's runs from "
                                 "it (uv, pyenv, pdb, nox, pip, pre-commit, direnv, an editor), outside any "
                                 "isolation",
                "version control": "version control's own files (hooks and configuration the operator's next git "
                                   "command runs, a nested repository, or rules that hide a path from git "
                                   "and from the sentinel)",
                "unjudged": "a way to open files the guard could not judge (SQLite's ATTACH and VACUUM INTO on a "
                            "connection without the guard's authorizer, or whose file SQLite names only as it runs; "
                            "a Tcl interpreter's open, source and exec)",
                "exec": "the pytest process itself (os.exec* replaces it: the sentinel's last look would never "
                        "run, and the run's exit status would be the new program's)",
                "root": "the process's root directory (after os.chroot every path names another file than the one "
                        "the guard judges, the operator's state among them)",
                "process": "a process outside the run (the operator's: the shell that started pytest, the other "
                           "end of a pipe, a program beside it, a daemon listening on a Unix socket or a port), "
                           "which a signal would end or stop, a change to its resource limits, nice level or CPUs "
                           "starve or end, and what is sent to its socket make act outside every isolation",
                "interpreter": "a Python sub-interpreter, whose code passes audit hooks of its own (PEP 578), none "
                               "of the guard's: what it opened, wrote or signalled would go unjudged",
                "host": "the host itself, which the run shares with the operator and every program on the machine "
                        "(its name, its clock, its devices: no namespace of the run's own holds them)",
                "network": "the host's network interfaces (a CAN interface among them: up or down, its bitrate, "
                           "its addresses and routes), which the run shares with the operator: it has no network "
                           "namespace of its own",
                "terminal": "the terminal pytest was started on: a setting changed there stays after pytest "
                            "exits, and what is typed into it (TIOCSTI) the operator's shell runs",
                "writable top": "the top of a tree pytest, the test tools or the run write as their own (a cache, "
                                "a temporary directory): a link made there would have them, and the next run, "
                                "write where it leads",
                "descriptor": "a descriptor of a directory where writes are judged: what is opened through it "
                              "by a relative path (dir_fd) could not be",
                "configuration": "the isolation's own configuration of the processes a test starts (the rules their "
                                 "guard judges by, where it reports): a child given other values would judge by "
                                 "other rules, or report where no test looks",
                "unresolved": "a path whose target cannot be named (relative to a working directory that was "
                              "removed, with no /proc to name it, or through a link the guard may not read): "
                              "where it leads cannot be judged"}.get(
            self.zone, "a tree the run may only read: the operator's home (outside the checkout and the temporary "
                       "directories), or where a later Python loads code from (a virtual environment in the "
                       "checkout)")
        fixes = (TERMINAL_FIXES if terminal else BUS_FIXES if self.tree.startswith("/dev/")
                 else ROOT_FIXES if self.zone == "root" else NETWORK_FIXES if self.zone == "network"
                 else INTERPRETER_FIXES if self.zone == "interpreter" else HOST_FIXES if self.zone == "host"
                 else PROCESS_FIXES if self.zone in ("process", "exec")
                 else CONFIGURATION_FIXES if self.zone == "configuration" else ACCESS_FIXES)
        return (f"canarchy test isolation: {self.owner} tried to {self.operation} {self.path!r}{where}: "
                f"{what} ({self.tree}; resolved: {self.resolved}). Refused. Ways to fix it:\n{_numbered(fixes)}")
