"""What the access guard protects, for whom, and in which zone a resolved path falls.

:class:`Protection` lists the protected paths; :func:`default_protection` is the operator's (their homes,
python-can's configuration files, the environments their processes started with); :class:`Zones` is a
protection compiled for the audit hook. Imports neither pytest nor python-can.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from collections.abc import Iterable, Mapping

from canarchy.testing.isolation.listeners import unix_table
from canarchy.testing.isolation.loadable import is_start_up_code
from canarchy.testing.isolation.reaper import at_or_below, first_outside, group_members, stat_fields, this_and_above
from canarchy.testing.isolation.tree import OPERATOR_STATE, VERSION_CONTROL_NAMES

# python-can's configuration files, from ``CONFIG_FILES`` in can/util.py (python-can 4.6): "~/can.conf"
# everywhere; "/etc/can.conf", "~/.can" and "~/.canrc" on Linux and macOS; "can.ini" (in the current
# directory) and "%APPDATA%\can.ini" on Windows. All are refused on every OS.
PYTHON_CAN_SYSTEM_FILES = ("/etc/can.conf",)
#: Device nodes through which a CAN adapter is reached without a network interface, so that no network
#: namespace stops it: serial and USB-serial ports (python-can's slcan, serial, seeedstudio and robotell
#: interfaces open them through pyserial; a shell can write to one), udev's links to them, raw USB devices
#: (its gs_usb, cantact and usb2can interfaces, through libusb), PEAK's character-device driver, Kvaser's
#: (linuxcan: ``leaf``, ``mhydra``), can4linux's and esd's (``can*``), Bluetooth serial ports (an ELM327 or
#: OBDLink dongle), the UARTs of boards' systems on chip (Jetson, i.MX, OMAP, Zynq; Exynos' are ttyS*), and macOS's
#: serial ports. Glob patterns.
CAN_ADAPTER_DEVICES = ("/dev/ttyS*", "/dev/ttyUSB*", "/dev/ttyACM*", "/dev/ttyAMA*", "/dev/serial", "/dev/bus/usb",
                       "/dev/pcan*", "/dev/leaf*", "/dev/mhydra*", "/dev/can*", "/dev/rfcomm*", "/dev/ttyTHS*",
                       "/dev/ttymxc*", "/dev/ttyLP*", "/dev/ttyO[0-9]*", "/dev/ttyPS*", "/dev/cu.*",
                       "/dev/tty.*")
#: The kernel's settings, read-only in the mount view: a root run that writes them acts outside every namespace
#: (``kernel.core_pattern`` names a program the kernel runs as root in the initial namespaces at the next
#: crash; ``kernel.modprobe``, sysfs's ``uevent_helper`` alike; ``/proc/sysrq-trigger`` reboots the machine).
#: :func:`kernel_settings` adds the rest of ``/proc``'s.
KERNEL_SETTINGS = ("/proc/sys", "/proc/sysrq-trigger", "/sys")
#: Device nodes of the kernel's that a write changes for every process (``/dev/kmsg``: a line in the kernel's
#: log, which no one can take back): covered in the mount view, since a read-only mount does not stop a write
#: to a device node; read-only to the access guard.
KERNEL_DEVICES = ("/dev/kmsg",)
#: The kernel's lists of keys (keyrings(7)): ``/proc/keys`` shows the serial number of each key the process may
#: view, the operator's user keyring among them, and with it C code links that keyring into its own and reads
#: or changes it. Covered in the mount view.
KEY_LISTS = ("/proc/keys", "/proc/key-users")
#: Inside those, the settings of the run's own namespaces, which stay writable: the network namespace's
#: (``/proc/sys/net`` shows the writer's) and the user namespace's limits (``/proc/sys/user``).
NAMESPACE_SETTINGS = ("/proc/sys/net", "/proc/sys/user")
#: The entries at the top of ``/proc`` that are no kernel setting: processes' (links to one, and ``net``, a
#: link to the reader's network namespace's).
_PROC_OWN = ("self", "thread-self", "net")
#: A process's own ``/proc`` entry, as a protection names it: each process that compiles the protection
#: (:class:`Zones`: pytest, a child the guard reaches) reads it as its own, never resolved to one pid.
OWN_PROC = "/proc/self"


def kernel_settings(proc: str = "/proc") -> tuple[str, ...]:
    """:data:`KERNEL_SETTINGS` and every other entry at the top of ``proc`` that is not a process's: each
    directory, and each file its owner may write (``/proc/irq``'s interrupt affinities, ``/proc/bus/pci``'s
    configuration space, ``/proc/mtrr``); proc(5). One listing of ``proc``; empty of it where there is none."""
    found = []
    try:
        with os.scandir(proc) as entries:
            for entry in entries:
                if entry.name.isdigit() or entry.name in _PROC_OWN or entry.is_symlink():
                    continue
                path = f"{proc}/{entry.name}"
                if path not in KERNEL_SETTINGS and (entry.is_dir() or entry.stat().st_mode & 0o222):
                    found.append(path)
    except OSError:
        pass
    return (*KERNEL_SETTINGS, *sorted(found))
PYTHON_CAN_INI = "can.ini"
# canarchy's project state in a working directory: its sessions (``canarchy.session``: ./.canarchy/sessions).
PROJECT_STATE = ".canarchy"
_WINDOWS = os.name == "nt"
_SEP = os.sep


@dataclass(frozen=True)
class Protection:
    """What the guard protects (paths; :meth:`.access.AccessGuard.configure` resolves them).

    ``refused``: no read, no write (a directory covers everything under it, a
    file only itself); ``read_only``: trees where writes are refused;
    ``writable``: trees where writes are allowed; ``watched``: trees where
    writes are allowed and recorded, except under a path component named in
    ``unwatched_names``. Where trees nest, the innermost decides (for one
    root: watched, writable, read-only); ``refused`` always wins. Python's byte
    code (``__pycache__``) may be written in a watched or read-only tree only by
    the import system caching what it compiled (:func:`_written_by_an_import`);
    any other such write is refused (zone ``bytecode``); so is any write there of what a later run
    loads unasked (:func:`~canarchy.testing.isolation.loadable.is_start_up_code`, zone ``start-up code``), and
    of version control's own files (:data:`~canarchy.testing.isolation.tree.VERSION_CONTROL_NAMES`, zone
    ``version control``) except under a prefix of ``staging`` (resolved paths: pytest's cache is made in a
    ``pytest-cache-files-*`` directory, with a ``.gitignore``, then renamed).
    """

    refused: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    watched: tuple[str, ...] = ()
    unwatched_names: tuple[str, ...] = ()
    staging: tuple[str, ...] = ()


#: The homes of whoever started a lane (``os.pathsep``-separated), whose runs' HOME is the lane's own: set by
#: the lanes (``canarchy.testing.lanes.env.build_env``, which imports nothing of the plugin: the name is written
#: there too).
OPERATOR_HOMES_VARIABLE = "PYTEST_CANARCHY_OPERATOR_HOMES"


def operator_homes(environ: Mapping[str, str], account_home: str | None) -> list[str]:
    """The operator's homes, resolved, each once: HOME, USERPROFILE, the account database's home (they differ
    when a shell moved HOME: a container's or a CI job's) and those :data:`OPERATOR_HOMES_VARIABLE` names."""
    homes: list[str] = []
    handed = environ.get(OPERATOR_HOMES_VARIABLE, "").split(os.pathsep)
    for home in (environ.get("HOME"), environ.get("USERPROFILE"), account_home, *handed):
        if home:
            resolved = normcase(os.path.realpath(home))
            if resolved not in homes:
                homes.append(resolved)
    return homes


def home_state(homes: Iterable[str]) -> list[str]:
    """The operator-state names (``tree.OPERATOR_STATE``) in each of ``homes``: refused whatever the settings."""
    return [os.path.join(home, name) for home in homes for name in OPERATOR_STATE]


def default_protection(environ: Mapping[str, str], account_home: str | None, *,
                       cwd: str | None = None, temp: str | None = None) -> Protection:
    """The default :class:`Protection` for an operator whose environment is
    ``environ`` (the one pytest started with) and whose account database home
    is ``account_home`` (:func:`.tempbase.account_database_home`).

    Refused: in each home the operator-state names (``tree.OPERATOR_STATE``) and
    ``AppData/Roaming/can.ini``;
    ``%APPDATA%/can.ini``, ``/etc/can.conf``, ``can.ini`` and ``.canarchy`` (canarchy's
    sessions) in ``cwd`` (the operator's working directory, default the current one), and every file in
    python-can's ``CONFIG_FILES`` when it is imported, and the environments this process and those
    above it started with (:func:`start_up_environments`). Read-only: each home
    but ``/``, the kernel's settings and ``/proc`` (each process's files: the run reaches none outside it).
    Writable: ``temp``, the run's temporary directory (default ``tempfile.gettempdir()``; a ``TMPDIR`` in a home
    or the checkout is no temporary directory of the run's: :func:`.tempbase.temp_base`), the run's own
    namespaces' settings, this process's ``/proc`` entry. The caller adds the sandbox (writable) and the
    checkout (watched).
    """
    homes = operator_homes(environ, account_home)
    refused = home_state(homes)
    refused += [os.path.join(home, "AppData", "Roaming", PYTHON_CAN_INI) for home in homes]
    if environ.get("APPDATA"):
        refused.append(os.path.join(environ["APPDATA"], PYTHON_CAN_INI))
    refused += PYTHON_CAN_SYSTEM_FILES
    refused.append(os.path.join(cwd or os.getcwd(), PYTHON_CAN_INI))
    refused.append(os.path.join(cwd or os.getcwd(), PROJECT_STATE))
    for name in getattr(sys.modules.get("can.util"), "CONFIG_FILES", None) or ():
        if isinstance(name, str) and name.startswith("~"):
            refused += [home + name[1:] for home in homes]
        elif isinstance(name, str) and name:
            refused.append(name)
    refused += start_up_environments()
    # /proc whole: a process's own files too (``oom_score_adj``, ``coredump_filter``, ``autogroup`` of the shell
    # that started pytest), but for this process's
    read_only = [home for home in homes if os.path.dirname(home) != home] + ["/proc", *(
        k for k in KERNEL_SETTINGS if not k.startswith("/proc/")), *KERNEL_DEVICES]
    return Protection(refused=_unique(refused), read_only=tuple(read_only),
                      writable=(temp or tempfile.gettempdir(), *NAMESPACE_SETTINGS, OWN_PROC))


def can_adapter_devices(patterns: Iterable[str] = CAN_ADAPTER_DEVICES) -> list[str]:
    """The device nodes (and directories of them) of ``patterns`` present now, sorted; found by name, none
    opened."""
    return sorted({path for pattern in patterns for path in glob.glob(pattern)})


def operator_terminals() -> list[str]:
    """The device nodes of the terminal pytest was started on (its standard streams', its controlling one's), sorted:
    a setting changed there (no echo, raw mode, a non-blocking description) stays after pytest exits, and what is
    typed into it (``TIOCSTI``) the operator's shell runs. Not ``/dev/tty``: that names each process's own
    controlling terminal, and pytest gives the operator's up (``procstate.give_up_the_terminal``), so a process a
    test starts finds none there (ENXIO), as a program asking for a password expects. Call it before that."""
    found = set()
    for fd in (0, 1, 2):
        try:
            found.add(os.ttyname(fd))
        except (OSError, AttributeError):  # not a terminal; Windows: no ttyname
            pass
    return sorted(found | set(controlling_terminal()))


def controlling_terminal(stat_file: str = "/proc/self/stat") -> list[str]:
    """The device nodes of this process's controlling terminal (proc(5): ``tty_nr``, the 7th field of
    ``/proc/self/stat``; ``ttyname`` of ``/dev/tty`` answers ``/dev/tty``), sorted; [] for none, or no ``/proc``."""
    try:
        number = int(stat_fields(stat_file)[4])
    except (ValueError, IndexError):
        return []
    if not number:
        return []
    # the kernel's encoding (new_encode_dev): the major in bits 8-19, the minor in bits 0-7 and 20-31
    device = os.makedev((number >> 8) & 0xFFF, (number & 0xFF) | ((number >> 12) & 0xFFF00))
    found = []
    for path in (*glob.glob("/dev/pts/[0-9]*"), *glob.glob("/dev/tty?*"), "/dev/console"):
        try:
            if os.stat(path).st_rdev == device:
                found.append(path)
        except OSError:
            continue
    return sorted(found)


def unix_sockets(table: str = "/proc/net/unix") -> list[str]:
    """The absolute names of the Unix-domain sockets bound now in this network namespace, each once, sorted:
    every daemon reachable through the file system, whatever its name (a terminal multiplexer's server, D-Bus,
    a container engine, an X server, an SSH agent, a database). Abstract names (``@...``) and relative ones are
    left out; none where there is no such table (:func:`~.listeners.unix_table`)."""
    return sorted({os.fsdecode(name) for name, _inode in unix_table(table) if name[:1] == b"/"})


def start_up_environments(pid: int | None = None) -> list[str]:
    """Where Linux shows the environment a process was started with (``/proc/PID/environ``;
    ``/proc/PID/task``, where ``/proc/thread-self/environ`` leads; ``/proc/PID/mem``, which holds
    it), for ``pid`` (default this process) and every process above it: the operator's
    environment, whatever ``os.environ`` holds now; and the command line of each process above it
    (``/proc/PID/cmdline``, readable by any process: ``sh -c 'CAN_CHANNEL=can0 pytest | tee log'``,
    ``sudo VAR=value pytest`` and ``env VAR=value`` name the operator's variables there). Nothing where
    there is no ``/proc``."""
    chain = this_and_above(pid)
    return ([f"/proc/{p}/{name}" for p in chain for name in ("environ", "task", "mem")]
            + [f"/proc/{p}/cmdline" for p in chain[1:]])


#: What holds the environment a process was started with: ``/proc/PID/environ`` and ``/proc/PID/mem``, a thread's too.
_PROCESS_ENVIRONMENT = re.compile(r"/proc/(\d+)/(?:task/\d+/)?(?:environ|mem)")


def outside_process_environment(path: str) -> str | None:
    """The ``/proc/PID`` of ``path`` (resolved) when it is where Linux shows the starting environment of a
    process neither this one nor below it (a sibling of pytest: a daemon the operator started beside it, the
    other end of ``pytest | tee``), else None. Any such process may hold the operator's variables; this one's
    own and those it started hold the run's."""
    found = _PROCESS_ENVIRONMENT.fullmatch(path)
    if found is None or at_or_below(int(found[1]), os.getpid()):
        return None
    return f"/proc/{found[1]}"  # gone, or not ours to see: refused as any other's


def signalled_outside(event: str, target: int, run: int) -> str | None:
    """What a signal would reach outside the run, in words, else None: ``event`` is ``os.kill`` (``target``: a
    pid; 0 this process's group; -1 every process the user may signal; -N group N), ``os.killpg`` (a group; 0
    this process's) or ``os.pidfd_open`` (a pid, for ``signal.pidfd_send_signal``). Inside the run: ``run``
    (the run's top pytest: the controller of pytest-xdist workers, the subreaper of what its tests detach) and
    what is below it, where this process is among them; else this process and what is below it. A process of
    the operator's (the shell that started pytest, the other end of ``pytest | tee``, a daemon beside it) is
    outside: nothing of the run may end or stop it."""
    if event == "os.kill" and target == -1:
        return "every process the user may signal (pid -1)"
    if event != "os.killpg" and target > 0:
        return first_outside([target], run)
    return first_outside(group_members(os.getpgrp() if target == 0 else abs(target)), run)


def normcase(path: str) -> str:
    return os.path.normcase(path) if _WINDOWS else path


def _with_sep(root: str) -> str:
    return root if root.endswith(_SEP) else root + _SEP


def _parents(path: str) -> list[str]:
    """Every directory above ``path`` (resolved), the root included."""
    out = []
    parent = os.path.dirname(path)
    while parent and parent != path:
        out.append(parent)
        path, parent = parent, os.path.dirname(parent)
    return out


def _unique(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


def resolved_paths(paths: Iterable[str]) -> tuple[str, ...]:
    """Each of ``paths`` resolved, once; :data:`OWN_PROC` stays as it is (each process reads it as its own)."""
    return _unique(p if p == OWN_PROC else normcase(os.path.realpath(os.fspath(p))) for p in paths if p)


def import_writers() -> frozenset:
    """The code of the import system's functions that compile a module and cache its byte code:
    CPython's ``SourceLoader.get_code`` and, once pytest is imported, its assertion-rewriting
    hook's ``exec_module``. Taken from the objects as they are when first asked (the plugin asks
    at start-up, before any test; the seal keeps those objects in place)."""
    global _IMPORT_WRITERS
    if _IMPORT_WRITERS is None or len(_IMPORT_WRITERS) < 2:
        codes = set(_IMPORT_WRITERS or ())
        external = sys.modules.get("_frozen_importlib_external")
        if external is not None:
            codes.add(external.SourceLoader.__dict__["get_code"].__code__)
        rewrite = sys.modules.get("_pytest.assertion.rewrite")
        if rewrite is not None:
            codes.add(rewrite.AssertionRewritingHook.__dict__["exec_module"].__code__)
        _IMPORT_WRITERS = frozenset(codes)
    return _IMPORT_WRITERS


_IMPORT_WRITERS: frozenset | None = None


def _written_by_an_import() -> bool:
    """Whether one of :func:`_import_writers` is on this thread's stack (byte code being cached by an import)."""
    writers = import_writers()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in writers:
            return True
        frame = frame.f_back
    return False


def _is_bytecode(path: str) -> bool:
    """A ``__pycache__`` directory, a byte-code file (or its temporary file) in one, or a byte-code
    file anywhere else (a sourceless module: an import runs it as it finds it)."""
    if path.endswith((".pyc", ".pyo")):
        return True
    if "__pycache__" not in path:
        return False
    parent, name = os.path.split(path)
    return name == "__pycache__" or (os.path.basename(parent) == "__pycache__" and ".pyc" in name)


def _in_version_control(tree: tuple[str, str], trees: list[tuple[str, str]]) -> bool:
    """Whether ``tree`` is a writable one that lies in version control's own files of a watched or read-only
    tree around it (``-o cache_dir=.git``, a ``--basetemp`` under ``.git``): such a tree is no exception."""
    root, zone = tree
    return zone == "writable" and any(
        kind != "writable" and root.startswith(_with_sep(outer))
        and not VERSION_CONTROL_NAMES.isdisjoint(root[len(_with_sep(outer)):].split(_SEP))
        for outer, kind in trees)


class Zones:
    """A :class:`Protection` compiled for the hook: resolved roots, prefixes, innermost first."""

    __slots__ = (
        "holding",
        "prefixes",
        "refused",
        "refused_order",
        "refused_prefixes",
        "roots",
        "staging",
        "trees",
        "unwatched",
        "writable_tops",
    )

    def __init__(self, protection: Protection) -> None:
        self.refused_order = protection.refused
        self.refused = frozenset(protection.refused)
        self.refused_prefixes = tuple(_with_sep(r) for r in protection.refused)
        # the directories above a refused path: a descriptor of one reaches it by a relative path
        self.holding = {a: r for r in reversed(protection.refused) for a in _parents(r)}
        trees = [(root, "watched") for root in protection.watched]
        trees += [(f"/proc/{os.getpid()}" if root == OWN_PROC else root, "writable") for root in protection.writable]
        trees += [(root, "read-only") for root in protection.read_only]
        trees.sort(key=lambda tree: len(tree[0]), reverse=True)  # stable: for one root, watched, writable, read-only
        trees = [tree for tree in trees if not _in_version_control(tree, trees)]
        self.trees = tuple((root, _with_sep(root), zone) for root, zone in trees)
        self.roots = self.refused | {root for root, _ in trees}
        self.prefixes = tuple(_with_sep(root) for root in self.roots)
        self.unwatched = frozenset(protection.unwatched_names)
        self.staging = tuple(protection.staging)
        #: where a link made would have pytest, the tools and the next run (which resolves them) write elsewhere
        self.writable_tops = frozenset(root for root, _, zone in self.trees if zone == "writable")

    # radon D by design: the audit hook's per-event path, one function to spare calls (docs/benchmarks.md, 5)
    def verdict(self, path: str, write: bool, tree: bool) -> tuple[str, str] | None:
        """``(zone, root)`` when ``path`` (resolved) is refused or its write is watched, else None.

        ``tree``: the operation reaches everything below ``path`` too."""
        own = None
        if path.startswith("/proc/") and not write and (process := outside_process_environment(path)):
            return "refused", process
        if path in self.roots or path.startswith(self.prefixes):
            if path in self.refused or path.startswith(self.refused_prefixes):
                return "refused", next(r for r in self.refused_order if path == r or path.startswith(_with_sep(r)))
            if write:
                own = self._write_verdict(path)
        if not tree:
            return own
        below = _with_sep(path)
        for root in self.refused_order:
            if root.startswith(below):
                return "refused", root
        if not write or (own is not None and own[0] == "read-only"):
            return own
        for zone in ("read-only", "watched"):
            if own is not None and zone == "watched":
                break
            for root, _, kind in self.trees:
                if kind == zone and root.startswith(below):
                    return zone, root
        return own

    def descriptor_verdict(self, path: str) -> tuple[str, str] | None:
        """``(zone, root)`` when a descriptor of the directory ``path`` (resolved) would reach, by relative
        paths the guard cannot judge (``dir_fd``), a refused path or a tree where writes are judged."""
        if path in self.holding:
            return "refused", self.holding[path]
        below = _with_sep(path)
        for root, _, zone in self.trees:
            if zone != "writable" and root.startswith(below):
                return "descriptor", root
        for root, prefix, zone in self.trees:  # innermost first
            if path == root or path.startswith(prefix):
                return None if zone == "writable" else ("descriptor", root)
        return None

    def _write_verdict(self, path: str) -> tuple[str, str] | None:
        for root, prefix, zone in self.trees:  # innermost first
            if path != root and not path.startswith(prefix):
                continue
            if zone == "writable":
                return None
            if _is_bytecode(path):  # the import system's cache; anything else written there runs at an import
                return ("cached", root) if _written_by_an_import() else ("bytecode", root)
            parts = path[len(prefix):].split(_SEP)
            if any(map(is_start_up_code, parts)):
                return "start-up code", root  # the next run loads it, outside any isolation
            if not VERSION_CONTROL_NAMES.isdisjoint(parts) and not path.startswith(self.staging):
                return "version control", root  # the next git runs it, or stops showing a path
            if zone == "watched" and self.unwatched and not self.unwatched.isdisjoint(path[len(prefix):].split(_SEP)):
                return None
            return zone, root
        return None
