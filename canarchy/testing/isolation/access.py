"""The access guard: a test neither reads nor writes the operator's state.

A CPython audit hook (PEP 578) sees each file operation with its path before the OS does; the guard resolves
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
import tempfile
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping

from canarchy.testing.isolation.reaper import parent_and_state
from canarchy.testing.isolation.tree import OPERATOR_STATE, is_start_up_code
from canarchy.testing.isolation.reportlog import ReportLog, append

ENVIRONMENT_VARIABLE = "PYTEST_CANARCHY_ACCESS"
REPORT_FILE = "access.jsonl"  # in report_dir: one JSON record a line, appended by child processes
# python-can's configuration files, from ``CONFIG_FILES`` in can/util.py (python-can 4.6): "~/can.conf"
# everywhere; "/etc/can.conf", "~/.can" and "~/.canrc" on Linux and macOS; "can.ini" (in the current
# directory) and "%APPDATA%\can.ini" on Windows. All are refused on every OS.
PYTHON_CAN_SYSTEM_FILES = ("/etc/can.conf",)
PYTHON_CAN_INI = "can.ini"

FIXES = (
    "use the test's own home: Path.home() in a test is a fresh, empty directory "
    "(the canarchy_sandbox fixture has the session's homes)",
    "write to pytest's tmp_path (or tmp_path_factory)",
    "if the test must see the operator's real home, mark it @pytest.mark.real_home and run it with -m real_home",
)
# The file system calls the guard makes itself, bound once: a test that patches os.scandir or
# os.lstat (to count calls) sees only its own, and cannot steer the guard.
_scandir, _lstat, _realpath, _isdir, _getcwd = os.scandir, os.lstat, os.path.realpath, os.path.isdir, os.getcwd
_WINDOWS = os.name == "nt"
_SEP = os.sep
_FOLD_CASE = sys.platform in ("win32", "darwin")  # file systems that ignore case by default
_CACHED = 4096  # directories remembered, and entries listed per directory, at most
_UNSCANNED: Any = object()


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
    resolved, the ``zone`` that decided (``"refused"``, ``"read-only"``,
    ``"bytecode"``, ``"start-up code"`` or ``"watched"``), the protected ``tree`` (or file) it fell in, and the pid."""

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
        where = "" if self.pid == os.getpid() else f" (in child process {self.pid})"
        if self.zone == "watched":
            return (f"canarchy test isolation: {self.owner} changed the checkout{where}: {self.operation} "
                    f"{self.path!r} (resolved: {self.resolved}, under {self.tree}). "
                    "Tests work on copies (tmp_path), never on the working tree.")
        what = {"refused": "the environment the operator started this process or one above it with"
                if self.tree.startswith("/proc/") else "the operator's own state",
                "bytecode": "byte code not written by the import system, where an import would later run it "
                            "(outside any isolation)",
                "start-up code": "code or configuration a later Python or pytest run loads without being asked "
                                 "(a distribution's metadata and entry points, a .pth file, sitecustomize, "
                                 "a conftest or pytest configuration), outside any isolation"}.get(
            self.zone, "a write under the operator's home, outside the checkout and the temporary directories")
        fixes = "\n".join(f"  {i}. {fix}" for i, fix in enumerate(FIXES, 1))
        return (f"canarchy test isolation: {self.owner} tried to {self.operation} {self.path!r}{where}: "
                f"{what} ({self.tree}; resolved: {self.resolved}). Refused. Ways to fix it:\n{fixes}")


@dataclass(frozen=True)
class Protection:
    """What the guard protects (paths; :meth:`AccessGuard.configure` resolves them).

    ``refused``: no read, no write (a directory covers everything under it, a
    file only itself); ``read_only``: trees where writes are refused;
    ``writable``: trees where writes are allowed; ``watched``: trees where
    writes are allowed and recorded, except under a path component named in
    ``unwatched_names``. Where trees nest, the innermost decides (for one
    root: watched, writable, read-only); ``refused`` always wins. Python's byte
    code (``__pycache__``) may be written in a watched or read-only tree only by
    the import system caching what it compiled (:func:`_written_by_an_import`);
    any other such write is refused (zone ``bytecode``); so is any write there of what a later run
    loads unasked (:func:`~canarchy.testing.isolation.tree.is_start_up_code`, zone ``start-up code``).
    """

    refused: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    watched: tuple[str, ...] = ()
    unwatched_names: tuple[str, ...] = ()


def operator_homes(environ: Mapping[str, str], account_home: str | None) -> list[str]:
    """The operator's homes, resolved, each once: HOME, USERPROFILE and the
    account database's home (they differ when a shell moved HOME)."""
    homes: list[str] = []
    for home in (environ.get("HOME"), environ.get("USERPROFILE"), account_home):
        if home:
            resolved = _normcase(os.path.realpath(home))
            if resolved not in homes:
                homes.append(resolved)
    return homes


def default_protection(environ: Mapping[str, str], account_home: str | None, *,
                       cwd: str | None = None) -> Protection:
    """The default :class:`Protection` for an operator whose environment is
    ``environ`` (the one pytest started with) and whose account database home
    is ``account_home`` (:func:`.tempbase.account_database_home`).

    Refused: in each home the operator-state names (``tree.OPERATOR_STATE``) and
    ``AppData/Roaming/can.ini``;
    ``%APPDATA%/can.ini``, ``/etc/can.conf``, ``can.ini`` in ``cwd`` (the
    operator's working directory, default the current one), and every file in
    python-can's ``CONFIG_FILES`` when it is imported, and the environments this process and those
    above it started with (:func:`start_up_environments`). Read-only: each home
    but ``/``. Writable: the temporary directory. The caller adds the
    sandbox (writable) and the checkout (watched).
    """
    homes = operator_homes(environ, account_home)
    refused = [os.path.join(home, name) for home in homes for name in OPERATOR_STATE]
    refused += [os.path.join(home, "AppData", "Roaming", PYTHON_CAN_INI) for home in homes]
    if environ.get("APPDATA"):
        refused.append(os.path.join(environ["APPDATA"], PYTHON_CAN_INI))
    refused += PYTHON_CAN_SYSTEM_FILES
    refused.append(os.path.join(cwd or os.getcwd(), PYTHON_CAN_INI))
    for name in getattr(sys.modules.get("can.util"), "CONFIG_FILES", None) or ():
        if isinstance(name, str) and name.startswith("~"):
            refused += [home + name[1:] for home in homes]
        elif isinstance(name, str) and name:
            refused.append(name)
    refused += start_up_environments()
    read_only = [home for home in homes if os.path.dirname(home) != home]
    return Protection(refused=_unique(refused), read_only=tuple(read_only), writable=(tempfile.gettempdir(),))


def start_up_environments(pid: int | None = None) -> list[str]:
    """Where Linux shows the environment a process was started with (``/proc/PID/environ``;
    ``/proc/PID/task``, where ``/proc/thread-self/environ`` leads; ``/proc/PID/mem``, which holds
    it), for ``pid`` (default this process) and every process above it: the operator's
    environment, whatever ``os.environ`` holds now. Nothing where there is no ``/proc``."""
    return [f"/proc/{p}/{name}" for p in this_and_above(pid) for name in ("environ", "task", "mem")]


def this_and_above(pid: int | None = None) -> list[int]:
    """``pid`` (default this process) and the processes above it, nearest first (``/proc/PID/stat``;
    empty where there is no ``/proc``)."""
    found: list[int] = []
    pid = os.getpid() if pid is None else pid
    while pid > 0 and pid not in found and (known := parent_and_state(pid)) is not None:
        found.append(pid)
        pid = known[0]
    return found


# -- judging --------------------------------------------------------------------------

_READ, _WRITE, _NOFOLLOW, _TREE, _NONE_IS_CWD, _DIRECTORY, _OPEN = 0, 1, 2, 4, 8, 16, 32
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
# event -> ((path argument, dir_fd argument or None, operation, flags), ...); CPython 3.11 "Audit events table".
# _NOFOLLOW: the operation acts on the entry itself (a final symlink is not followed);
# _TREE: it acts on everything below the path too (refused if a protected tree lies below it);
# _DIRECTORY: the path names a directory (its resolution is remembered whole).
_SPECS: dict[str, tuple[tuple[int, int | None, str, int], ...]] = {
    "os.listdir": ((0, None, "list", _READ | _NONE_IS_CWD | _DIRECTORY),),
    "os.scandir": ((0, None, "list", _READ | _NONE_IS_CWD | _DIRECTORY),),
    "os.walk": ((0, None, "walk", _READ | _DIRECTORY),),
    "os.fwalk": ((0, 4, "walk", _READ | _TREE | _DIRECTORY),),  # it lists by descriptor below the top
    "os.chdir": ((0, None, "chdir", _READ | _DIRECTORY),),
    "os.mkdir": ((0, 2, "mkdir", _WRITE | _NOFOLLOW),),
    "os.rmdir": ((0, 1, "rmdir", _WRITE | _NOFOLLOW),),
    "os.remove": ((0, 1, "remove", _WRITE | _NOFOLLOW),),
    "os.rename": ((0, 2, "rename from", _WRITE | _NOFOLLOW | _TREE), (1, 3, "rename to", _WRITE | _NOFOLLOW)),
    "os.link": ((0, 2, "hard-link from", _READ), (1, 3, "hard-link to", _WRITE | _NOFOLLOW)),
    "os.symlink": ((1, 2, "symlink", _WRITE | _NOFOLLOW),),
    "os.truncate": ((0, None, "truncate", _WRITE),),
    "os.utime": ((0, 3, "utime", _WRITE),),
    "os.chmod": ((0, 2, "chmod", _WRITE),),
    "os.chown": ((0, 3, "chown", _WRITE),),
    "os.chflags": ((0, None, "chflags", _WRITE),),
    "os.getxattr": ((0, None, "getxattr", _READ),),
    "os.listxattr": ((0, None, "listxattr", _READ | _NONE_IS_CWD),),
    "os.setxattr": ((0, None, "setxattr", _WRITE),),
    "os.removexattr": ((0, None, "removexattr", _WRITE),),
    "os.startfile": ((0, None, "startfile", _READ),),
    "shutil.copyfile": ((0, None, "copy from", _READ), (1, None, "copy to", _WRITE)),
    "shutil.copymode": ((0, None, "copy mode from", _READ), (1, None, "copy mode to", _WRITE)),
    "shutil.copystat": ((0, None, "copy metadata from", _READ), (1, None, "copy metadata to", _WRITE)),
    "shutil.copytree": ((0, None, "copy a tree from", _READ), (1, None, "copy a tree to", _WRITE)),
    "shutil.rmtree": ((0, 1, "rmtree", _WRITE | _NOFOLLOW | _TREE),),  # removes by descriptor below the top
    "shutil.move": ((0, None, "move from", _WRITE | _NOFOLLOW | _TREE), (1, None, "move to", _WRITE)),
    "shutil.chown": ((0, None, "chown", _WRITE),),
    "shutil.make_archive": ((0, None, "make an archive at", _WRITE), (2, None, "archive", _READ)),
    "shutil.unpack_archive": ((0, None, "unpack", _READ), (1, None, "unpack into", _WRITE | _NONE_IS_CWD)),
    "pathlib.Path.glob": ((0, None, "glob", _READ | _DIRECTORY),),
    "pathlib.Path.rglob": ((0, None, "glob", _READ | _DIRECTORY),),
    "subprocess.Popen": ((2, None, "start a process in", _READ | _DIRECTORY),),
}
# Events after which a directory may resolve differently (the resolution cache is dropped).
_RELINKING = frozenset({"os.symlink", "os.rename", "os.link", "shutil.move", "shutil.copytree",
                        "shutil.unpack_archive"})
_OPEN_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_Target = tuple[Any, Any, str, int]


def _glob_targets(args: tuple) -> Iterable[_Target]:
    """``glob.glob/2`` (pathname, recursive, root_dir, dir_fd): the directory before the first wildcard."""
    pattern = _text(args[0])
    if pattern is None:
        return ()
    cut = min((i for i in (pattern.find(c) for c in "*?[") if i >= 0), default=len(pattern))
    directory = os.path.dirname(pattern[:cut]) if cut < len(pattern) else pattern
    root_dir = _text(args[2])
    if root_dir and not os.path.isabs(directory):
        directory = os.path.join(root_dir, directory)
    return ((directory or os.curdir, args[3], "glob", _READ | _DIRECTORY),)


def _sqlite_targets(args: tuple) -> Iterable[_Target]:
    """``sqlite3.connect`` (database): a file name, or a ``file:`` URI (``mode=ro`` reads, ``mode=memory`` is none)."""
    database = _text(args[0])
    if not database or database == ":memory:":
        return ()
    write = True
    if database.startswith("file:"):
        rest, _, query = database[5:].partition("?")
        rest = rest.partition("#")[0]
        if rest.startswith("//"):  # file://authority/path: the authority is "" or "localhost"
            rest = rest[2:]
            rest = rest[rest.find("/"):] if "/" in rest else ""
        options = dict(part.partition("=")[::2] for part in query.split("&") if part)
        if options.get("mode") == "memory" or rest in ("", ":memory:"):
            return ()
        write = options.get("mode") != "ro"
        database = _unquote(rest)
    return ((database, None, "sqlite3.connect", _WRITE if write else _READ),)


def _bind_targets(args: tuple) -> Iterable[_Target]:
    """``socket.bind`` (socket, address): a Unix socket's file (not the abstract namespace)."""
    address = args[1]
    if isinstance(address, (str, bytes)) and address and address[:1] not in ("\0", b"\0"):
        return ((address, None, "bind a Unix socket at", _WRITE | _NOFOLLOW),)
    return ()


_SPECIAL: dict[str, Callable[[tuple], Iterable[_Target]]] = {
    "glob.glob/2": _glob_targets,
    "sqlite3.connect": _sqlite_targets,
    "socket.bind": _bind_targets,
}
JUDGED_EVENTS = frozenset(_SPECS) | frozenset(_SPECIAL) | {"open"}


def _text(value: Any) -> str | None:
    """A path argument as text: str, bytes or os.PathLike; None for a descriptor, None or anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return os.fsdecode(value)
    if value is None or isinstance(value, int):
        return None
    try:
        value = os.fspath(value)
    except TypeError:
        return None
    return os.fsdecode(value) if isinstance(value, bytes) else value


def _unquote(text: str) -> str:
    """Percent-decoding of a URI path (RFC 3986), as UTF-8."""
    if "%" not in text:
        return text
    head, *rest = text.split("%")
    out = bytearray(head.encode())
    for part in rest:
        try:
            out += bytes([int(part[:2], 16)]) + part[2:].encode()
        except ValueError:
            out += b"%" + part.encode()
    return out.decode("utf-8", "surrogateescape")


def _normcase(path: str) -> str:
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


def _resolved(paths: Iterable[str]) -> tuple[str, ...]:
    return _unique(_normcase(os.path.realpath(os.fspath(p))) for p in paths if p)


def _import_writers() -> frozenset:
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
    writers = _import_writers()
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


class _Zones:
    """A :class:`Protection` compiled for the hook: resolved roots, prefixes, innermost first."""

    __slots__ = (
        "holding",
        "prefixes",
        "refused",
        "refused_order",
        "refused_prefixes",
        "roots",
        "trees",
        "unwatched",
    )

    def __init__(self, protection: Protection) -> None:
        self.refused_order = protection.refused
        self.refused = frozenset(protection.refused)
        self.refused_prefixes = tuple(_with_sep(r) for r in protection.refused)
        # the directories above a refused path: a descriptor of one reaches it by a relative path
        self.holding = {a: r for r in reversed(protection.refused) for a in _parents(r)}
        trees = [(root, "watched") for root in protection.watched]
        trees += [(root, "writable") for root in protection.writable]
        trees += [(root, "read-only") for root in protection.read_only]
        trees.sort(key=lambda tree: len(tree[0]), reverse=True)  # stable: for one root, watched, writable, read-only
        self.trees = tuple((root, _with_sep(root), zone) for root, zone in trees)
        self.roots = self.refused | {root for root, _ in trees}
        self.prefixes = tuple(_with_sep(root) for root in self.roots)
        self.unwatched = frozenset(protection.unwatched_names)

    # radon D by design: the audit hook's per-event path, one function to spare calls (docs/benchmarks.md, 5)
    def verdict(self, path: str, write: bool, tree: bool) -> tuple[str, str] | None:
        """``(zone, root)`` when ``path`` (resolved) is refused or its write is watched, else None.

        ``tree``: the operation reaches everything below ``path`` too."""
        own = None
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

    def _write_verdict(self, path: str) -> tuple[str, str] | None:
        for root, prefix, zone in self.trees:  # innermost first
            if path != root and not path.startswith(prefix):
                continue
            if zone == "writable":
                return None
            if _is_bytecode(path):  # the import system's cache; anything else written there runs at an import
                return ("cached", root) if _written_by_an_import() else ("bytecode", root)
            if any(map(is_start_up_code, path[len(prefix):].split(_SEP))):
                return "start-up code", root  # the next run loads it, outside any isolation
            if zone == "watched" and self.unwatched and not self.unwatched.isdisjoint(path[len(prefix):].split(_SEP)):
                return None
            return zone, root
        return None


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
        self._zones = _Zones(self.protection)
        self._refusals: list[Access] = []
        self._watched: list[Access] = []
        self._cached: list[str] = []  # byte code the import system wrote in watched or read-only trees
        self._lock = threading.Lock()
        self._log = ReportLog(REPORT_FILE)  # the report file of report_dir, and how far it was read
        self._local = threading.local()
        self._dirs: dict[str, str] = {}  # directory as given -> resolved, for existing directories
        self._links: dict[str, frozenset[str] | None] = {}  # resolved directory -> its symlinks' names
        self._memory_pid: int | None = os.getpid()  # records made in this pid stay in memory only
        self.thread_owners: dict[int, str] = {}  # thread id -> the test that left it running (the plugin shares one)

    # -- configuration -----------------------------------------------------------
    def configure(self, protection: Protection) -> Protection:
        """Protect ``protection`` from now on (its paths resolved now); returns the resolved one."""
        resolved = Protection(
            refused=_resolved(protection.refused), read_only=_resolved(protection.read_only),
            writable=_resolved(protection.writable), watched=_resolved(protection.watched),
            unwatched_names=tuple(protection.unwatched_names),
        )  # fmt: skip
        self._zones = _Zones(resolved)  # one assignment: the hook sees the old zones or the new ones
        self.protection = resolved
        self.forget_resolutions()
        return resolved

    def forget_resolutions(self) -> None:
        """Drop what the guard remembers of directories (their resolution, their symlinks).
        The hook does this after each operation that can make or move a link in this process."""
        self._dirs.clear()
        self._links.clear()

    def to_environment(self) -> dict[str, str]:
        """The variable that gives a child process this configuration (see :func:`activate_from_environment`)."""
        document = {f.name: list(getattr(self.protection, f.name)) for f in fields(Protection)}
        document["report_dir"] = str(self.report_dir) if self.report_dir is not None else None
        return {ENVIRONMENT_VARIABLE: json.dumps(document)}

    @contextlib.contextmanager
    def exempt(self) -> Iterator[None]:
        """Within the block, this thread's own accesses are not judged (the harness's own
        reads of the operator's state, e.g. the sentinel's hashes)."""
        local = self._local
        before = getattr(local, "busy", False)
        local.busy = True
        try:
            yield
        finally:
            local.busy = before

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
        local = self._local
        before, local.busy = getattr(local, "busy", False), True  # reading the reports is not judged
        try:
            for record in self._log.read_new(report_dir):
                try:
                    access = Access(**record)
                except TypeError:
                    continue
                if access.pid != os.getpid():  # this process's own records are in memory already
                    with self._lock:
                        (self._refusals if access.refused else self._watched).append(access)
        finally:
            local.busy = before

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
        if event == "open":  # the most frequent: (path, mode or None, flags)
            write = args[2] & _OPEN_WRITE_FLAGS if args[2].__class__ is int else 0
            if not write and args[1].__class__ is str and args[1] not in ("r", "rb"):
                write = any(c in args[1] for c in "wax+")
            # os.open (mode None) of a directory gives a dir_fd; open() cannot (its opener is audited itself),
            # nor can O_TMPFILE (an unnamed file)
            dir_fd = args[1] is None and args[2].__class__ is int and (
                not _O_TMPFILE or args[2] & _O_TMPFILE != _O_TMPFILE)
            self._judge(args[0], None, "open for writing" if write else "open for reading",
                        (_OPEN if dir_fd else 0) | (_WRITE if write else _READ))
            return
        spec = _SPECS.get(event)
        if spec is None:
            for value, dir_fd, operation, flags in _SPECIAL[event](args):
                self._judge(value, dir_fd, operation, flags)
            return
        for index, dir_fd_index, operation, flags in spec:
            self._judge(args[index], None if dir_fd_index is None else args[dir_fd_index], operation, flags)

    # radon D by design: the audit hook's per-event path, one function to spare calls (docs/benchmarks.md, 5)
    def _judge(self, value: Any, dir_fd: Any, operation: str, flags: int) -> None:
        text = value if value.__class__ is str else _text(value)
        if text is None:
            if value is not None or not flags & _NONE_IS_CWD:
                return  # a file descriptor: nothing to judge
            text = os.curdir
        if dir_fd is not None and dir_fd.__class__ is int and dir_fd >= 0 and not os.path.isabs(text):
            return  # relative to a directory descriptor: cannot be judged
        resolved = None if flags & _NOFOLLOW else self._dirs.get(text)  # a directory judged before
        if resolved is None:
            try:
                if flags & _DIRECTORY and os.path.isabs(text):
                    resolved = self._directory(text)
                else:
                    resolved = self._resolve(text, not flags & _NOFOLLOW)
            except (OSError, ValueError):
                return
        zones = self._zones
        if flags & _OPEN and resolved in zones.holding and _isdir(resolved):
            # os.open(dir) for a dir_fd: what is opened through it later is never judged
            self._refuse_or_record(Access(self._owner(), "open a descriptor of the directory", text, resolved,
                                          "refused", zones.holding[resolved], os.getpid()))
            return
        if not flags & (_WRITE | _TREE) and (  # a read: only the refused paths matter
                resolved not in zones.refused and not resolved.startswith(zones.refused_prefixes)):
            return
        verdict = zones.verdict(resolved, flags & _WRITE, flags & _TREE)
        if verdict is None:
            return
        if verdict[0] == "cached":
            self._cached.append(resolved)
            return
        self._refuse_or_record(Access(self._owner(), operation, text, resolved, verdict[0], verdict[1], os.getpid()))

    def _owner(self) -> str:
        """Who is named: the test that left this thread running after it ended, else :attr:`owner`."""
        return self.thread_owners.get(threading.get_ident(), self.owner) if self.thread_owners else self.owner

    def _refuse_or_record(self, access: Access) -> None:
        self._record(access)
        if access.refused:
            raise OperatorStateRefused(access.message())

    def _resolve(self, text: str, follow: bool) -> str:
        """The path the OS would reach: every directory resolved (cached while it is an
        existing directory), then the final component, followed when ``follow`` and a symlink."""
        dirs = self._dirs
        if _WINDOWS or text[:1] != _SEP:
            text = text if os.path.isabs(text) else os.path.join(_getcwd(), text)  # not abspath: it folds '..'
            head, name = os.path.split(text)
        else:
            cut = text.rfind(_SEP)
            head, name = text[:cut] or _SEP, text[cut + 1:]
        if not name or name == os.curdir or name == os.pardir:
            return self._directory(text) if follow else _normcase(_realpath(text))
        directory = dirs.get(head)
        if directory is None:
            directory = self._directory(head)
        path = directory + name if directory.endswith(_SEP) else directory + _SEP + name
        if follow:
            links = self._links.get(directory, _UNSCANNED)
            if links is _UNSCANNED:
                links = self._scan_links(directory)
            if links is None:  # not listed: ask the file system
                try:
                    if stat.S_ISLNK(_lstat(path).st_mode):
                        path = _normcase(_realpath(path))
                except OSError:
                    pass
            elif (name.casefold() if _FOLD_CASE else name) in links:
                path = _normcase(_realpath(path))
        return path

    def _directory(self, text: str) -> str:
        """``realpath(text)``, remembered when it is an existing directory."""
        resolved = _normcase(_realpath(text))
        if _isdir(resolved):
            if len(self._dirs) >= _CACHED:
                self._dirs.clear()
            self._dirs[text] = resolved
        return resolved

    def _scan_links(self, directory: str) -> frozenset[str] | None:
        """The names of the symlinks in ``directory`` (one listing, remembered), or None
        when it cannot be listed or is too large to remember."""
        names = []
        try:
            with _scandir(directory) as entries:
                for count, entry in enumerate(entries):
                    if count >= _CACHED:
                        return None
                    if entry.is_symlink():
                        names.append(entry.name.casefold() if _FOLD_CASE else entry.name)
        except OSError:
            return None
        if len(self._links) >= _CACHED:
            self._links.clear()
        links = self._links[directory] = frozenset(names)
        return links


GUARD = AccessGuard()


#: Other watchers of audit events, sharing the one hook (an audit hook costs on every event of
#: the process): event -> callbacks ``callback(args)``, called whether or not the guard is enabled.
_OBSERVERS: dict[str, list[Callable[[tuple], None]]] = {}
_EVENTS: set[str] = set(JUDGED_EVENTS)


def observe(event: str, callback: Callable[[tuple], None]) -> None:
    """Call ``callback(args)`` on every ``event`` from now on (once :func:`install` has run);
    a callback already registered for ``event`` is not added twice."""
    callbacks = _OBSERVERS.setdefault(event, [])
    if callback not in callbacks:
        callbacks.append(callback)
    _EVENTS.add(event)


def _make_hook(guard: AccessGuard) -> Callable[[str, tuple], None]:
    events = _EVENTS
    observers = _OBSERVERS
    relinking = _RELINKING
    local = guard._local
    audit = guard._audit
    forget = guard.forget_resolutions

    def hook(event: str, args: tuple) -> None:
        if event not in events:  # the fast path: every audited event of the process comes here
            return
        watchers = observers.get(event)
        if watchers is not None:
            for watcher in watchers:
                watcher(args)
            if event not in JUDGED_EVENTS:
                return
        if event in relinking:
            forget()
        if not guard.enabled or getattr(local, "busy", False):
            return
        local.busy = True  # what the judging itself does (a record written, a cache filled) is not judged
        try:
            audit(event, args)
        finally:
            local.busy = False

    return hook


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Add the audit hook to this process (once; idempotent). Does not enable the guard: set ``GUARD.enabled``."""
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_make_hook(GUARD))
            _installed = True


def activate_from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """In a child process: configure, install and enable :data:`GUARD` from the
    variable :meth:`AccessGuard.to_environment` made (``environ``, default
    ``os.environ``), owned by the parent's test (``PYTEST_CURRENT_TEST``).
    Returns False when the variable is absent; raises ``ValueError`` when it is
    malformed."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENVIRONMENT_VARIABLE)
    if not raw:
        return False
    try:
        document = json.loads(raw)
        protection = Protection(**{f.name: tuple(document[f.name]) for f in fields(Protection)})
        report_dir = document["report_dir"]
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} is not a configuration of the access guard: {error}") from None
    GUARD.configure(protection)
    GUARD.report_dir = Path(report_dir) if report_dir else None
    GUARD.owner = _parent_nodeid(environ.get("PYTEST_CURRENT_TEST"))
    GUARD._memory_pid = None  # every record goes to report_dir, for the parent
    GUARD.enabled = True
    install()
    return True


def _parent_nodeid(current_test: str | None) -> str:
    from canarchy.testing.isolation._child import parent_nodeid  # here: _child will import this module

    return parent_nodeid(current_test)
