"""C functions that open paths, start or change processes without an audit event of CPython's, wrapped so that
the access guard (:mod:`~canarchy.testing.isolation.access`) sees them: readline's history and init files,
SQLite's ATTACH, a Tcl interpreter, multiprocessing's ``fork_exec``, ``posix_spawn``'s file actions,
``os.mkfifo``, ``os.mknod``, ``os.pidfd_open``, ``os.setpriority``, ``os.sched_set*`` and termios' setters, and a
second instance of one of those modules. The seal keeps every wrapper in place (:func:`audited_c_openers`).
Design: ``docs/design/test-isolation.md`` ("Layer 6: the access guard").
"""

from __future__ import annotations

import functools
import operator
import os
import re
import sys
import threading
from typing import Any
from collections.abc import Callable

from canarchy.testing.isolation.access import GUARD
from canarchy.testing.isolation.audithook import observe
from canarchy.testing.isolation.events import INTERPRETER_MAKERS, TERMINAL_SETTERS, regular_file_head, sqlite_file
from canarchy.testing.isolation.refusal import Access


def install() -> None:
    """Wrap each of them (once: a wrapper is marked, :func:`_replace`)."""
    _audit_readline()
    _audit_sqlite()
    _refuse_tcl()
    _refuse_host_changes()
    _audit_fork_exec()
    _audit_spawn_file_actions()
    _audit_terminal_setters()
    _audit_special_files()
    _one_instance()


def _replace(modules: tuple, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``name`` in each of ``modules`` (the first holds the C function) with ``make(real)``, marked
    ``_canarchy_audited`` so that it is done once; nothing when the first has no ``name``."""
    real = getattr(modules[0], name, None)
    if real is None or getattr(real, "_canarchy_audited", False):
        return
    wrapper = make(real)
    wrapper._canarchy_audited = True  # type: ignore[attr-defined]
    for module in modules:
        setattr(module, name, wrapper)


#: readline's functions that open a file in C (GNU readline), and which argument names it (its default: ``~/.history``).
_READLINE_FILES = {"read_history_file": 0, "write_history_file": 0, "append_history_file": 1}
#: ... and those that read init files: the one named, and each that one ``$include``s (:func:`_judge_init_files`).
_READLINE_INIT = ("read_init_file", "parse_and_bind")
#: A line that makes readline read another init file (GNU readline's bind.c: ``$include`` in any case after blanks,
#: then blanks; the rest of the line is the file's name, ``~`` expanded).
_INCLUDE = re.compile(r"^[ \t]*\$include[ \t]+(.*)$", re.IGNORECASE | re.MULTILINE)
#: How many init files, and bytes of one, a call may have readline read: past that, it is refused unjudged.
_INIT_FILES, _INIT_FILE_BYTES = 64, 1 << 20


def _audit_readline() -> None:
    """Replace readline's file functions with ones that raise an audit event (``readline.NAME``, the path)
    first; the seal keeps them in place (:func:`audited_c_openers`)."""
    try:
        import readline
    except ImportError:  # not built (Windows), or no terminal library
        return
    for name, index in _READLINE_FILES.items():
        _replace((readline,), name, functools.partial(_audited_file_function, event=f"readline.{name}", index=index))
    for name in _READLINE_INIT:
        _replace((readline,), name, functools.partial(_audited_init_function, name=name))


def _audited_init_function(real: Callable, name: str) -> Callable:
    """``readline.read_init_file`` (a file; none: the last one read, ``$INPUTRC`` or ``~/.inputrc``) or
    ``readline.parse_and_bind`` (a line), judging first each init file that readline would read for it."""
    last: list[str] = []

    def audited(*args: Any) -> Any:
        if name == "parse_and_bind":
            _judge_init_files([], args[0] if args and isinstance(args[0], str) else "")
        elif args and args[0] is not None:
            args = (converted(args[0]), *args[1:])
            path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else str(args[0])
            _judge_init_files([path], "")
            last[:] = [path]
        else:
            _judge_init_files([*last, os.environ.get("INPUTRC") or os.path.expanduser("~/.inputrc")], "")
        return real(*args)

    return audited


def _judge_init_files(paths: list[str], line: str) -> None:
    """Raise ``readline.read_init_file`` for each of ``paths`` and each file an ``$include`` in ``line`` or in
    those files names, nested (each file read here once, a regular file only: readline reads them after)."""
    pending, seen = [*paths, *_included(line)], set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        sys.audit("readline.read_init_file", path)
        text = regular_file_head(path, _INIT_FILE_BYTES + 1)
        if (len(seen) > _INIT_FILES or len(text) > _INIT_FILE_BYTES) and GUARD.enabled:
            GUARD.refuse(Access(GUARD._owner(), "have readline read init files past what is judged", path, path,
                                "unjudged", f"{_INIT_FILES} files of {_INIT_FILE_BYTES} bytes", os.getpid()))
        pending += _included(text.decode("utf-8", "surrogateescape"))


def _included(text: str) -> list[str]:
    return [os.path.expanduser(name) for name in _INCLUDE.findall(text) if name]


def converted(value: Any) -> Any:
    """A path argument as the C function will read it: an ``os.PathLike``'s ``__fspath__`` asked once, here, so
    that the wrapper judges and passes on the same text (asked again, it could name another file); a str, bytes,
    descriptor or anything else as it is (the C function refuses what it cannot take)."""
    if isinstance(value, (str, bytes, int)) or value is None:
        return value
    try:
        return os.fspath(value)
    except TypeError:
        return value


def _audited_file_function(real: Callable, event: str, index: int) -> Callable:
    """``real`` raising ``event`` with its path argument (position ``index``; none: readline's ``~/.history``)
    first. Only positional arguments, as readline's own take: nothing a caller passes changes the event. The
    path is converted once (:func:`converted`): what is judged is what ``real`` opens."""

    def audited(*args: Any) -> Any:
        if len(args) > index and args[index] is not None:
            args = (*args[:index], converted(args[index]), *args[index + 1:])
            path = args[index]
        else:
            path = os.path.expanduser("~/.history")
        sys.audit(event, path)
        return real(*args)

    return audited


def _raising(event: str, label: str | None = None) -> Callable[[Callable], Callable]:
    """``make`` for :func:`_replace`: a function that raises ``event`` first (with ``label``, else its own
    positional arguments), for the guard to refuse outright (:data:`~.events.OUTRIGHT`), then calls the real one."""
    def wrap(real: Callable) -> Callable:
        def refused(*args: Any, **kwargs: Any) -> Any:
            sys.audit(event, *((label,) if label is not None else args))
            return real(*args, **kwargs)
        return refused
    return wrap


def _refuse_tcl() -> None:
    """Replace ``_tkinter.create`` (what ``tkinter.Tk`` and ``tkinter.Tcl`` call) with one that raises
    ``_tkinter.create``, refused: a Tcl interpreter opens files (``open``, ``source``) and starts processes
    (``exec``) in C, with no audit event."""
    try:
        import _tkinter
    except ImportError:  # built without Tcl/Tk
        return
    _replace((_tkinter,), "create", _raising("_tkinter.create", "_tkinter.create"))


def _refuse_interpreters(module: Any, short: str) -> None:
    """Replace, in ``module`` (made as ``short``, a key of :data:`~.events.INTERPRETER_MAKERS`), each function
    that makes a Python sub-interpreter with one that raises ``interpreter.new``, refused: what a
    sub-interpreter's code does passes no audit hook of this interpreter's (PEP 578)."""
    for name in INTERPRETER_MAKERS[short]:
        _replace((module,), name, _raising("interpreter.new", f"{short}.{name}"))


def _refuse_host_changes() -> None:
    """Replace ``time.clock_settime`` and ``time.clock_settime_ns`` with ones that raise their names (clock,
    time), refused: the clock is the host's, shared with the operator, and CPython raises no audit event
    for them (``socket.sethostname`` has one)."""
    import time

    for name in ("clock_settime", "clock_settime_ns"):
        _replace((time,), name, _raising(f"time.{name}"))


_SQLITE_ATTACH = 24  # SQLite's authorizer action code for ATTACH, also what VACUUM INTO does (sqlite3.h)
_SQLITE_PRAGMA = 19  # its action code for PRAGMA: the pragma's name, then its argument (sqlite3.h)
#: The pragmas that name a directory SQLite then writes its files in (deprecated, still obeyed; SQLite's pragma.html)
_SQLITE_DIRECTORY_PRAGMAS = frozenset({"temp_store_directory", "data_store_directory"})


def _audit_sqlite() -> None:
    """Replace ``sqlite3.connect`` (and ``_sqlite3.connect`` under it) with one that gives each connection an
    authorizer raising ``sqlite3.attach`` (the file name) before SQLite opens a file for ATTACH or VACUUM INTO
    and ``sqlite3.temp_store_directory`` (the directory) before a pragma points SQLite's own files elsewhere
    (its C code; no audit event). A connection made otherwise (``sqlite3.Connection(...)``) is refused at its
    ``sqlite3.connect/handle`` event, which comes before it could take an authorizer (CPython 3.11)."""
    try:
        import _sqlite3
        import sqlite3
        from sqlite3 import dbapi2
    except ImportError:
        return

    def authorizing(real: Callable) -> Callable:
        def connect(*args: Any, **kwargs: Any) -> Any:
            _SQLITE.making = True
            try:
                connection = real(*args, **kwargs)
            finally:
                _SQLITE.making = False
            connection.set_authorizer(_attach_authorizer)
            return connection
        return connect

    _replace((_sqlite3, sqlite3, dbapi2), "connect", authorizing)
    observe("sqlite3.connect/handle", _refuse_a_bare_connection)


_SQLITE = threading.local()  # making: inside the wrapper's own call of the real connect


def _refuse_a_bare_connection(args: tuple) -> None:
    if GUARD.enabled and not getattr(_SQLITE, "making", False) and not GUARD.busy():
        GUARD.refuse(Access(GUARD._owner(), "make a SQLite connection past sqlite3.connect:", repr(args[0]),
                            repr(args[0]), "unjudged", "sqlite3.Connection", os.getpid()))


def _attach_authorizer(action: int, name: Any, argument: Any = None, *rest: Any) -> int:
    if action == _SQLITE_PRAGMA and argument and str(name).lower() in _SQLITE_DIRECTORY_PRAGMAS:
        sys.audit("sqlite3.temp_store_directory", argument)  # a refusal raises: SQLite denies the statement
    elif action == _SQLITE_ATTACH and name and name != ":memory:":
        sys.audit("sqlite3.attach", sqlite_file(name))  # a refusal raises: SQLite denies the statement
    elif action == _SQLITE_ATTACH and not name and GUARD.enabled and not GUARD.busy():
        # a bound parameter or an expression ('' too): SQLite names the file only as the statement runs
        GUARD.refuse(Access(GUARD._owner(), "attach a database SQLite names only as it runs", "ATTACH <expression>",
                            "ATTACH <expression>", "unjudged", "sqlite3.Connection", os.getpid()))
    return 0  # SQLITE_OK


def _audit_fork_exec() -> None:
    """Replace ``_posixsubprocess.fork_exec`` with one that raises ``_posixsubprocess.fork_exec`` (the program)
    first: ``multiprocessing.util.spawnv_passfds`` (the spawn and forkserver starts) calls it with no audit
    event, and the guard must know when another process may change what it remembers (:attr:`others_relink`)."""
    try:
        import _posixsubprocess
    except ImportError:  # Windows
        return

    def auditing(real: Callable) -> Callable:
        def fork_exec(*args: Any) -> Any:
            sys.audit("_posixsubprocess.fork_exec", args[0] if args else None)  # (args, executables, ...)
            return real(*args)
        return fork_exec

    _replace((_posixsubprocess,), "fork_exec", auditing)


_SPAWNS = ("posix_spawn", "posix_spawnp")


def _audit_spawn_file_actions() -> None:
    """Replace ``os.posix_spawn`` and ``os.posix_spawnp`` with ones that raise ``open`` (path, None, flags) for
    each ``POSIX_SPAWN_OPEN`` of their ``file_actions`` first: the child opens those paths before it runs, and
    CPython's ``os.posix_spawn`` event does not carry them."""
    try:
        import posix
    except ImportError:  # Windows
        return

    def auditing(real: Callable) -> Callable:
        def spawn(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("file_actions") is not None:  # read once: the actions judged are the actions passed on
                kwargs["file_actions"] = actions = [_plain_action(action) for action in kwargs["file_actions"]]
                for action in actions:
                    if isinstance(action, tuple) and len(action) >= 4 and action[0] == os.POSIX_SPAWN_OPEN:
                        sys.audit("open", action[2], None, action[3])
            return real(*args, **kwargs)
        return spawn

    for name in _SPAWNS:
        _replace((posix, os), name, auditing)


def _plain_action(action: Any) -> Any:
    """A ``posix_spawn`` file action as C reads it, in plain values: a tuple's own items (a subclass's
    ``__getitem__`` is not what C reads), its tag and an open's flags as ints (asked once), an open's path
    :func:`converted`. Anything else as it is: ``posix_spawn`` refuses it."""
    if not isinstance(action, tuple):
        return action
    items = tuple.__getitem__(action, slice(None))
    try:
        items = (operator.index(items[0]), *items[1:])
        if items[0] == os.POSIX_SPAWN_OPEN and len(items) >= 4:
            items = (*items[:2], converted(items[2]), operator.index(items[3]), *items[4:])
    except (TypeError, IndexError):
        pass
    return items


#: The functions that make a file with no audit event of CPython's: name -> their parameters after the path, with
#: their defaults (``os.mkfifo(path, mode=0o666, *, dir_fd=None)``, ``os.mknod(path, mode=0o600, device=0, *,
#: dir_fd=None)``). Their event (``os.NAME``) carries them all, positionally: :data:`events.SPECS` reads the path
#: and the ``dir_fd``.
_MAKERS = {"mkfifo": (("mode", 0o666), ("dir_fd", None)), "mknod": (("mode", 0o600), ("device", 0), ("dir_fd", None))}


def _audit_special_files() -> None:
    """Replace ``os.mkfifo`` and ``os.mknod`` with ones that raise ``os.mkfifo``/``os.mknod`` (the path, the
    other arguments, the ``dir_fd``) first: each makes an entry in the file system (a FIFO, a device node, a
    regular file) and CPython raises no audit event for them; ``os.pidfd_open`` and ``os.chroot`` alike."""
    try:
        import posix
    except ImportError:  # Windows
        return

    def auditing(name: str) -> Callable[[Callable], Callable]:
        def wrap(real: Callable) -> Callable:
            def make(path: Any, *args: Any, **kwargs: Any) -> Any:
                path = converted(path)  # once: the path judged is the path made
                if kwargs.get("dir_fd") is not None:
                    kwargs["dir_fd"] = operator.index(kwargs["dir_fd"])
                rest = [kwargs.get(key, args[i] if i < len(args) else default)
                        for i, (key, default) in enumerate(_MAKERS[name])]
                sys.audit(f"os.{name}", path, *rest)
                return real(path, *args, **kwargs)
            return make
        return wrap

    for name in _MAKERS:
        _replace((posix, os), name, auditing(name))

    def pidfd(real: Callable) -> Callable:
        def pidfd_open(pid: Any, *args: Any, **kwargs: Any) -> Any:
            pid = operator.index(pid)  # once, an int: an int subclass or an __index__ is not what is judged
            sys.audit("os.pidfd_open", pid)  # the descriptor signal.pidfd_send_signal sends through
            return real(pid, *args, **kwargs)
        return pidfd_open

    _replace((posix, os), "pidfd_open", pidfd)

    def rooting(real: Callable) -> Callable:
        def chroot(path: Any) -> Any:
            path = converted(path)  # once: the path judged is the root set
            sys.audit("os.chroot", path)  # no event of CPython's: every path after it names another file
            return real(path)
        return chroot

    _replace((posix, os), "chroot", rooting)

    def changing(name: str, integers: int, count: int) -> Callable[[Callable], Callable]:
        def wrap(real: Callable) -> Callable:
            def change(*args: Any) -> Any:  # positional only, as the C function's own
                if len(args) == count:  # else the C function refuses them
                    args = (*(operator.index(a) for a in args[:integers]), *args[integers:])
                    sys.audit(f"os.{name}", *args)
                return real(*args)
            return change
        return wrap

    for name, (integers, count) in _PROCESS_CHANGES.items():  # the process it changes: judged as a signal's
        _replace((posix, os), name, changing(name, integers, count))


def _audit_terminal_setters() -> None:
    """Replace termios' setters (:data:`~.events.TERMINAL_SETTERS`) with ones that raise ``termios.NAME`` (the
    descriptor, asked of a file object once, then the other arguments) first: each changes a terminal, the
    operator's too, and CPython raises no audit event for them."""
    try:
        import termios
    except ImportError:  # Windows
        return

    def auditing(name: str) -> Callable[[Callable], Callable]:
        def wrap(real: Callable) -> Callable:
            def change(fd: Any, *args: Any) -> Any:  # positional only, as the C function's own
                fd = fd if isinstance(fd, int) else fd.fileno()  # once: the descriptor judged is the one changed
                sys.audit(f"termios.{name}", fd, *args)
                return real(fd, *args)
            return change
        return wrap

    for name in TERMINAL_SETTERS:
        _replace((termios,), name, auditing(name))


#: The functions that change another process with no audit event of CPython's: name -> (how many leading
#: arguments are integers (asked once, :func:`converted`'s reason), how many arguments it takes):
#: ``os.setpriority(which, who, priority)``, ``os.sched_setaffinity(pid, mask)``, ``os.sched_setscheduler(pid,
#: policy, param)``, ``os.sched_setparam(pid, param)``.
_PROCESS_CHANGES = {"setpriority": (3, 3), "sched_setaffinity": (1, 2), "sched_setscheduler": (2, 3),
                    "sched_setparam": (1, 2)}


#: The modules whose C functions :func:`install` wrapped, by name: one instance each (:func:`_one_instance`).
_WRAPPED = ("readline", "_sqlite3", "_tkinter", "_posixsubprocess", "posix", "termios", "time", "_imp")


def _one_instance() -> None:
    """A second instance of a module whose C functions are wrapped (``importlib.util.module_from_spec``) would
    hold them unwrapped (a copy of the module's first dictionary, or a fresh one): ``_imp``'s
    ``create_dynamic`` and ``create_builtin``, which make every extension and built-in module, give back
    the wrapped instance (``_imp``'s own too, so the creators cannot be had unwrapped from a copy of it).
    ``create_dynamic`` raises ``_imp.create_dynamic`` (the file) before the loader opens it: a spec made for
    any path (``importlib.util.spec_from_file_location``) reaches it past the import system's listing."""
    import _imp

    instances = {name: sys.modules[name] for name in (*_WRAPPED, *INTERPRETER_MAKERS) if name in sys.modules}
    for name in INTERPRETER_MAKERS.keys() & instances.keys():  # (instances: not sys.modules, which a test can empty)
        _refuse_interpreters(instances[name], name)

    def reusing(real: Callable, loads: bool = False) -> Callable:
        def create(spec: Any, *args: Any) -> Any:
            # the C loader finds PyInit_<last part of the name>: "anything.readline" makes a readline too
            short = str(getattr(spec, "name", "")).rpartition(".")[2]
            existing = instances.get(short)
            if existing is not None:
                return existing
            if loads:  # the dynamic loader opens the file in C: no open event (a spec made for any path)
                sys.audit("_imp.create_dynamic", getattr(spec, "origin", None))
            module = real(spec, *args)
            if short in INTERPRETER_MAKERS:  # wrapped when first made, and kept: the only instance
                _refuse_interpreters(module, short)
                instances[short] = module
            return module
        return create

    _replace((_imp,), "create_dynamic", functools.partial(reusing, loads=True))
    _replace((_imp,), "create_builtin", reusing)


def audited_c_openers() -> list[tuple[object, str]]:
    """What :func:`install` replaced, for the seal: ``(module, name)`` pairs."""
    import _imp

    readline, sqlite3 = sys.modules.get("readline"), sys.modules.get("sqlite3")
    found = [(readline, name) for name in (*_READLINE_FILES, *_READLINE_INIT)
             if readline is not None and hasattr(readline, name)]
    if sqlite3 is not None:
        found += [(sqlite3, "connect"), (sqlite3.dbapi2, "connect"), (sys.modules["_sqlite3"], "connect")]
    if "_tkinter" in sys.modules:
        found.append((sys.modules["_tkinter"], "create"))
    found += [(sys.modules["_posixsubprocess"], "fork_exec")] if "_posixsubprocess" in sys.modules else []
    found += [(module, name) for module in (os, sys.modules.get("posix")) if module is not None
              for name in (*_SPAWNS, *_MAKERS, "pidfd_open", "chroot", *_PROCESS_CHANGES) if hasattr(module, name)]
    termios = sys.modules.get("termios")
    found += [(termios, name) for name in TERMINAL_SETTERS if termios is not None and hasattr(termios, name)]
    found += [(sys.modules["time"], name) for name in ("clock_settime", "clock_settime_ns")
              if hasattr(sys.modules["time"], name)]
    found += [(sys.modules[module], name) for module, names in INTERPRETER_MAKERS.items() if module in sys.modules
              for name in names if hasattr(sys.modules[module], name)]
    return [*found, (_imp, "create_dynamic"), (_imp, "create_builtin")]
