"""Which paths each audited event touches, as the access guard judges them.

For every judged CPython audit event (PEP 578; CPython 3.11 "Audit events table"): the argument that
names a path, the one that holds a directory descriptor, the operation in words, and how the event
acts on the path (:data:`READ` ... :data:`OPEN`). Imports nothing of canarchy.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from typing import Any
from collections.abc import Callable, Iterable, Iterator

#: The operations of :data:`SPECS` that take a path out of its directory: what they removed from the checkout
#: where git does not show it (an ignored report, a built wheel) no later look can find gone.
REMOVALS = frozenset({"rmdir", "remove", "rename from", "rmtree", "move from"})
READ, WRITE, NOFOLLOW, TREE, NONE_IS_CWD, DIRECTORY, OPEN = 0, 1, 2, 4, 8, 16, 32
O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_AF_UNIX = getattr(socket, "AF_UNIX", None)
# event -> ((path argument, dir_fd argument or None, operation, flags), ...); CPython 3.11 "Audit events table".
# NOFOLLOW: the operation acts on the entry itself (a final symlink is not followed);
# TREE: it acts on everything below the path too (refused if a protected tree lies below it);
# DIRECTORY: the path names a directory (its resolution is remembered whole);
# OPEN: the event can give a descriptor of the path (os.open of a directory, os.fwalk), judged as one.
SPECS: dict[str, tuple[tuple[int, int | None, str, int], ...]] = {
    "os.listdir": ((0, None, "list", READ | NONE_IS_CWD | DIRECTORY),),
    "os.scandir": ((0, None, "list", READ | NONE_IS_CWD | DIRECTORY),),
    "os.walk": ((0, None, "walk", READ | DIRECTORY),),
    "os.fwalk": ((0, 4, "walk", READ | TREE | DIRECTORY | OPEN),),  # it hands out descriptors below the top
    "os.chdir": ((0, None, "chdir", READ | DIRECTORY),),
    "os.mkdir": ((0, 2, "mkdir", WRITE | NOFOLLOW),),
    "os.rmdir": ((0, 1, "rmdir", WRITE | NOFOLLOW),),
    "os.remove": ((0, 1, "remove", WRITE | NOFOLLOW),),
    "os.rename": ((0, 2, "rename from", WRITE | NOFOLLOW | TREE), (1, 3, "rename to", WRITE | NOFOLLOW)),
    # the source is written through the new name: a second name of one file is that file
    "os.link": ((0, 2, "hard-link from", WRITE), (1, 3, "hard-link to", WRITE | NOFOLLOW)),
    "os.symlink": ((1, 2, "symlink", WRITE | NOFOLLOW),),
    "os.truncate": ((0, None, "truncate", WRITE),),
    "os.utime": ((0, 3, "utime", WRITE),),
    "os.chmod": ((0, 2, "chmod", WRITE),),
    "os.chown": ((0, 3, "chown", WRITE),),
    "os.chflags": ((0, None, "chflags", WRITE),),
    "os.getxattr": ((0, None, "getxattr", READ),),
    "os.listxattr": ((0, None, "listxattr", READ | NONE_IS_CWD),),
    "os.setxattr": ((0, None, "setxattr", WRITE),),
    "os.removexattr": ((0, None, "removexattr", WRITE),),
    "os.startfile": ((0, None, "startfile", READ),),
    "shutil.copyfile": ((0, None, "copy from", READ), (1, None, "copy to", WRITE)),
    "shutil.copymode": ((0, None, "copy mode from", READ), (1, None, "copy mode to", WRITE)),
    "shutil.copystat": ((0, None, "copy metadata from", READ), (1, None, "copy metadata to", WRITE)),
    "shutil.copytree": ((0, None, "copy a tree from", READ), (1, None, "copy a tree to", WRITE)),
    "shutil.rmtree": ((0, 1, "rmtree", WRITE | NOFOLLOW | TREE),),  # removes by descriptor below the top
    "shutil.move": ((0, None, "move from", WRITE | NOFOLLOW | TREE), (1, None, "move to", WRITE)),
    "shutil.chown": ((0, None, "chown", WRITE),),
    "shutil.make_archive": ((0, None, "make an archive at", WRITE), (2, None, "archive", READ)),
    "shutil.unpack_archive": ((0, None, "unpack", READ), (1, None, "unpack into", WRITE | NONE_IS_CWD)),
    "pathlib.Path.glob": ((0, None, "glob", READ | DIRECTORY),),
    "pathlib.Path.rglob": ((0, None, "glob", READ | DIRECTORY),),
    "subprocess.Popen": ((2, None, "start a process in", READ | DIRECTORY),),
    # Not CPython's: raised by access.py's wrappers of C functions that open a path with no audit event
    # (readline's history and init files; SQLite's ATTACH and VACUUM INTO, through an authorizer; os.mkfifo and
    # os.mknod).
    "readline.read_history_file": ((0, None, "read history from", READ),),
    "readline.read_init_file": ((0, None, "read readline's init file", READ),),
    "readline.write_history_file": ((0, None, "write history to", WRITE),),
    "readline.append_history_file": ((0, None, "append history to", WRITE),),
    "sqlite3.attach": ((0, None, "attach the database", WRITE),),
    "sqlite3.temp_store_directory": ((0, None, "let SQLite write its temporary files in", WRITE | DIRECTORY),),
    "os.mkfifo": ((0, 2, "make a FIFO", WRITE | NOFOLLOW),),  # (path, mode, dir_fd)
    "os.mknod": ((0, 3, "make a file system node", WRITE | NOFOLLOW),),  # (path, mode, device, dir_fd)
    "_imp.create_dynamic": ((0, None, "load the extension module", READ),),  # (the spec's origin)
}
#: The audit events of a new process (CPython 3.11 "Audit events table"; ``os.exec`` replaces this one), and
#: the one the access guard's wrapper of ``_posixsubprocess.fork_exec`` raises (``multiprocessing``'s spawn and
#: forkserver start calls it directly, with no event of CPython's).
PROCESS_STARTS = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                  "_posixsubprocess.fork_exec")
# Events after which a directory may resolve differently (the resolution cache is dropped).
RELINKING = frozenset({"os.symlink", "os.rename", "os.link", "shutil.move", "shutil.copytree",
                        "shutil.unpack_archive"})
OPEN_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
Target = tuple[Any, Any, str, int]


def _glob_targets(args: tuple) -> Iterable[Target]:
    """``glob.glob/2`` (pathname, recursive, root_dir, dir_fd): the directory before the first wildcard."""
    pattern = path_text(args[0])
    if pattern is None:
        return ()
    cut = min((i for i in (pattern.find(c) for c in "*?[") if i >= 0), default=len(pattern))
    directory = os.path.dirname(pattern[:cut]) if cut < len(pattern) else pattern
    root_dir = path_text(args[2])
    if root_dir and not os.path.isabs(directory):
        directory = os.path.join(root_dir, directory)
    return ((directory or os.curdir, args[3], "glob", READ | DIRECTORY),)


_SQLITE_TRUE = frozenset({"1", "yes", "true", "on"})  # what sqlite3_uri_boolean takes for true (case aside)


def _sqlite_targets(args: tuple) -> Iterable[Target]:
    """``sqlite3.connect`` (database): a file name, or a ``file:`` URI (:func:`_sqlite_uri`); ``:memory:`` is none.
    A write unless the URI opens it read-only and SQLite then makes nothing beside it: ``immutable``, or a
    database not in WAL mode (its header's write version, byte 18, is 2 in WAL mode: SQLite's fileformat.html)."""
    database = path_text(args[0])
    if not database or database == ":memory:":
        return ()
    write = True
    if database.startswith("file:"):
        database, read_only, immutable = _sqlite_uri(database[5:])
        if database is None:
            return ()
        write = not (read_only and (immutable or not _in_wal_mode(database)))
    return ((database, None, "sqlite3.connect", WRITE if write else READ),)


def _sqlite_uri(uri: str) -> tuple[str | None, bool, bool]:
    """A ``file:`` URI's path (None: an in-memory database), whether it opens it read-only (every ``mode`` is
    ``ro``, no ``vfs``: a dot-file VFS makes its lock directory beside it) and ``immutable`` (every one true), as
    SQLite reads it: the URI ends at ``#``, the file name at an encoded NUL, parameters percent-decoded; the
    last ``mode`` counts, the first ``immutable``."""
    rest, _, query = uri.partition("#")[0].partition("?")
    if rest.startswith("//"):  # file://authority/path: the authority is "" or "localhost"
        rest = rest[2:]
        rest = rest[rest.find("/"):] if "/" in rest else ""
    options = [(_unquote(name), _unquote(value)) for name, _, value in
               (part.partition("=") for part in query.split("&") if part)]
    modes = [value for name, value in options if name == "mode"]
    if modes[-1:] == ["memory"] or rest in ("", ":memory:"):
        return None, False, False
    immutable = [value.lower() in _SQLITE_TRUE for name, value in options if name == "immutable"]
    read_only = set(modes) == {"ro"} and all(n != "vfs" for n, _ in options)
    return _unquote(rest).partition("\0")[0], read_only, bool(immutable) and all(immutable)


def sqlite_file(name: str) -> str:
    """An ATTACH file name as a path (a ``file:`` URI's path part, "" for an in-memory one; SQLite resolves a
    relative one as ``open`` does)."""
    return (_sqlite_uri(name[5:])[0] or "") if name.startswith("file:") else name


def _in_wal_mode(path: str) -> bool:
    """Whether the regular file at ``path`` is a database in WAL mode (:func:`regular_file_head`)."""
    header = regular_file_head(path, 20)
    return len(header) == 20 and header[18] == 2


def regular_file_head(path: str, size: int) -> bytes:
    """Up to ``size`` bytes from the start of the regular file at ``path``; ``b""`` for anything else, which is
    not opened (a device node's open alone can act on the device, a FIFO's waits), or where it cannot be read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return b""
    parts: list[bytes] = []
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)  # what was opened, not what the name said before
        while regular and size > 0 and (part := os.read(fd, size)):
            parts.append(part)
            size -= len(part)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(parts)


#: The events of a connect or a send to a Unix-domain socket, and what the refusal of one says: it reaches the
#: process bound there, whatever its name (the access guard refuses one outside the run).
UNIX_SENDS = {"socket.connect": "connect to", "socket.sendto": "send to", "socket.sendmsg": "send to"}


def unix_address(args: tuple) -> str | bytes | None:
    """A Unix-domain socket's address of a ``socket.connect``/``sendto``/``sendmsg`` event (socket, address):
    a path or an abstract name (its first byte NUL; a bytes-like one as the bytes it holds now), else None (an
    address of another family, none)."""
    address = args[1]
    if isinstance(address, (bytearray, memoryview)):
        address = bytes(address)
    if isinstance(address, (str, bytes)) and address and getattr(args[0], "family", None) == _AF_UNIX:
        return address
    return None


def _unix_socket(operation: str, flags: int) -> Callable[[tuple], Iterable[Target]]:
    """``socket.bind``, ``socket.connect``, ``socket.sendto``, ``socket.sendmsg`` (socket, address): a Unix
    socket's file (not the abstract namespace; a bytes-like address as the bytes it holds now). A connect or a
    send reaches the process listening there (the operator's daemon): judged as a write of its file."""
    def targets(args: tuple) -> Iterable[Target]:
        address = args[1]
        if isinstance(address, (bytearray, memoryview)):
            address = bytes(address)
        if isinstance(address, (str, bytes)) and address and address[:1] not in ("\0", b"\0"):
            return ((address, None, operation, flags),)
        return ()
    return targets


def _dlopen_targets(args: tuple) -> Iterable[Target]:
    """``ctypes.dlopen`` (name): a path, read by the dynamic loader; a bare name (no ``/``) is looked up in the
    loader's own directories, not the working directory, and ``None`` is the program itself."""
    name = path_text(args[0])
    if name and os.sep in name:
        return ((name, None, "load the shared library", READ),)
    return ()


#: Variables whose directory C code, or a child, writes in: SQLite's temporary files (``SQLITE_TMPDIR``, then
#: ``TMPDIR``: SQLite's os_unix.c), a child Python's ``tempfile`` (``TMPDIR``, ``TEMP``, ``TMP``).
WRITING_VARIABLES = frozenset({"SQLITE_TMPDIR", "TMPDIR", "TEMP", "TMP"})


def _handed_paths(variables: Iterable[tuple[Any, Any]]) -> Iterator[Target]:
    """The absolute paths ``(name, value)`` pairs hand to C code or a child that differ from this process's
    environment (each value whole, less a leading ``:`` as ``TZ`` takes a file, and each ``os.pathsep``-separated
    part): a write of a directory for :data:`WRITING_VARIABLES`, else a read (refused only of the operator's
    state: ``INPUTRC``, ``TZ``, a ``CAN_CONFIG`` file)."""
    for name, value in variables:
        key, text = path_text(name), path_text(value)
        if not key or not text or os.environ.get(key) == text:
            continue
        operation = f"hand ${key} to C code or a child, naming"
        flags = WRITE | DIRECTORY if key in WRITING_VARIABLES else READ
        for part in dict.fromkeys((text.removeprefix(":"), *text.split(os.pathsep))):
            if os.path.isabs(part):
                yield part, None, operation, flags


#: The events that hand C code or a child an environment, and the argument holding it: ``os.putenv`` (key, value),
#: what later C code of this process and every child started without one is given; ``subprocess.Popen``
#: (executable, args, cwd, env), ``os.posix_spawn`` (path, argv, env), ``os.exec`` (path, args, env), ``os.spawn``
#: (mode, path, args, env); None: this process's own.
HANDED_ENVIRONMENT = {"os.putenv": None, "subprocess.Popen": 3, "os.posix_spawn": 2, "os.exec": 2, "os.spawn": 3}


def handed_variables(event: str, args: tuple) -> Iterable[tuple[Any, Any]]:
    """The ``(name, value)`` pairs an event of :data:`HANDED_ENVIRONMENT` hands on (names and values as given)."""
    index = HANDED_ENVIRONMENT[event]
    if index is None:
        return [args]
    env = args[index]
    return env.items() if env is not None and hasattr(env, "items") else ()


def handed_paths(event: str, args: tuple) -> Iterable[Target]:
    """The paths an event of :data:`HANDED_ENVIRONMENT` hands on (:func:`_handed_paths`)."""
    return _handed_paths(handed_variables(event, args))


SPECIAL: dict[str, Callable[[tuple], Iterable[Target]]] = {
    "glob.glob/2": _glob_targets,
    "sqlite3.connect": _sqlite_targets,
    "socket.bind": _unix_socket("bind a Unix socket at", WRITE | NOFOLLOW),
    "socket.connect": _unix_socket("connect to the Unix socket at", WRITE),
    "socket.sendto": _unix_socket("send to the Unix socket at", WRITE),
    "socket.sendmsg": _unix_socket("send to the Unix socket at", WRITE),
    "ctypes.dlopen": _dlopen_targets,
}
#: termios' functions that change a terminal (c_openers wraps them to raise ``termios.NAME``).
TERMINAL_SETTERS = ("tcsetattr", "tcsendbreak", "tcflush", "tcflow", "tcsetwinsize")
#: The events of a signal sent (CPython's ``os.kill`` (pid, signal) and ``os.killpg`` (group, signal)) or of a
#: process's descriptor taken to send one with (``os.pidfd_open`` (pid): no event of CPython's; raised by
#: :mod:`~canarchy.testing.isolation.c_openers`' wrapper): judged by their target, not by a path.
SIGNALS = frozenset({"os.kill", "os.killpg", "os.pidfd_open", *(
    #: ... and of a change to another process, which ends, starves or slows it as a signal would: its resource
    #: limits (CPython's ``resource.prlimit`` (pid, resource, limits; None asks only): a CPU limit below the time
    #: it used sends it SIGXCPU), its nice level (``os.setpriority`` (which, who, priority)), its CPUs and
    #: scheduling (``os.sched_setaffinity``, ``os.sched_setscheduler``, ``os.sched_setparam`` (pid, ...)); the
    #: ``os.`` ones raise no event of CPython's: raised by c_openers' wrappers)
    "resource.prlimit", "os.setpriority", "os.sched_setaffinity", "os.sched_setscheduler", "os.sched_setparam",
    #: ... and of a process or group made the owner of a descriptor (CPython's ``fcntl.fcntl`` ``F_SETOWN``,
    #: ``F_SETOWN_EX``, ``fcntl.ioctl`` ``FIOSETOWN``/``SIOCSPGRP`` (fd, command, argument)): the kernel signals
    #: it (SIGIO, or what ``F_SETSIG`` names: SIGKILL, SIGSTOP) each time the descriptor is ready
    "fcntl.fcntl", "fcntl.ioctl",
    #: ... and of a change to a terminal (termios' setters, no event of CPython's: raised by c_openers' wrappers;
    #: those two fcntl events too): refused on the operator's terminal (:func:`~.signals.terminal_changed`)
    *(f"termios.{name}" for name in TERMINAL_SETTERS))})
#: The ``fcntl.ioctl`` requests on a file's or a directory's descriptor that only read it, or change the descriptor
#: alone (linux/fs.h, asm-generic/ioctls.h): FS_IOC_GETFLAGS and GETVERSION (and their 32-bit forms),
#: FS_IOC_FSGETXATTR, FS_IOC_FIEMAP, FS_IOC_GETFSLABEL, FIBMAP, FIGETBSZ, FIONREAD, FIOQSIZE, FIONBIO, FIOCLEX,
#: FIONCLEX, FIOASYNC. Any other is judged a write of what the descriptor names: FS_IOC_SETFLAGS (immutable,
#: append-only), FS_IOC_FSSETXATTR and FS_IOC_ENABLE_VERITY change a file through a descriptor opened to read.
FILE_IOCTL_READS = frozenset({0x80086601, 0x80046601, 0x80087601, 0x80047601, 0x801C581F, 0xC020660B, 0x81009431,
                              0x1, 0x2, 0x541B, 0x5460, 0x5421, 0x5451, 0x5450, 0x5452})
#: The events refused whatever their arguments: each reaches past every path the guard judges. event -> (the
#: argument shown, or None for the event's name; the operation; what it reaches, in short; the zone; in words).
#: ``os.chroot`` (path; c_openers' wrapper): every path after it names another file. ``cpython.PyInterpreterState_New``
#: (CPython's, no arguments) and ``interpreter.new`` (the function; c_openers' wrappers of those that make a
#: sub-interpreter, :data:`INTERPRETER_MAKERS`): a sub-interpreter has audit hooks of its own (PEP 578), none of
#: this guard's. ``_tkinter.create`` (c_openers' wrapper): a Tcl interpreter opens files and starts processes in C.
#: ``socket.sethostname`` (name; CPython's) and ``time.clock_settime``, ``time.clock_settime_ns`` (clock, time;
#: c_openers' wrappers): the host's name and clock, which the run shares with the operator (no namespace of its
#: own holds them); a device node made (``os.mknod``, c_openers' wrapper).
OUTRIGHT: dict[str, tuple[int | None, str, str, str, str]] = {
    "os.chroot": (0, "chroot to", "/", "root", "the root directory"),
    "cpython.PyInterpreterState_New": (None, "start a Python sub-interpreter:", "a sub-interpreter", "interpreter",
                                       "a sub-interpreter's audit hooks"),
    "interpreter.new": (0, "start a Python sub-interpreter with", "a sub-interpreter", "interpreter",
                        "a sub-interpreter's audit hooks"),
    "_tkinter.create": (None, "start a Tcl interpreter:", "_tkinter.create", "unjudged", "tkinter"),
    "socket.sethostname": (0, "change the host's name to", "the host's name", "host", "the host's name"),
    "time.clock_settime": (0, "set the system clock", "the host's clock", "host", "the host's clock"),
    "time.clock_settime_ns": (0, "set the system clock", "the host's clock", "host", "the host's clock"),
    # os.mknod of a character or block device (:func:`makes_a_device`): a second name of a device of the host's
    # (a CAN adapter's serial port, a disk) where the guard judges the name, not the device
    "os.mknod device": (0, "make a device node at", "a device of the host", "host", "the host's devices"),
}


def makes_a_device(event: str, args: tuple) -> bool:
    """Whether ``os.mknod`` (path, mode, device, dir_fd) makes a character or block device."""
    try:
        return event == "os.mknod" and stat.S_IFMT(int(args[1])) in (stat.S_IFCHR, stat.S_IFBLK)
    except (TypeError, ValueError, IndexError):
        return False
#: The functions that make a Python sub-interpreter, by module (CPython 3.11-3.13: ``_xxsubinterpreters.create``,
#: ``_interpreters.create``; the C API's test modules: ``run_in_subinterp``, ``run_in_subinterp_with_config``,
#: ``interpreter_create``, ``create_interpreter``): c_openers wraps each to raise ``interpreter.new``.
INTERPRETER_MAKERS = {"_xxsubinterpreters": ("create",), "_interpreters": ("create",),
                      "_testcapi": ("run_in_subinterp", "run_in_subinterp_with_config"),
                      "_testinternalcapi": ("run_in_subinterp_with_config", "interpreter_create",
                                            "create_interpreter")}
JUDGED_EVENTS = frozenset(SPECS) | frozenset(SPECIAL) | SIGNALS | frozenset(HANDED_ENVIRONMENT) | frozenset(
    OUTRIGHT) | {"open", "socket.__new__"}
#: The code of the standard library's walkers that open directories by descriptor below a top already judged
#: whole (``shutil.rmtree``: a write of the tree; ``os.fwalk``: its top judged as a descriptor) and keep those
#: descriptors to themselves, or hand them only to the caller of a judged ``fwalk``: code -> the globals it runs
#: with (its module's; a function made of that code with other globals is not the walker). An ``open`` event
#: carries no ``dir_fd``: their opens are not judged as descriptors (what is done under them is, by name).
DESCRIPTOR_WALKERS: dict[Any, dict] = {
    function.__code__: vars(module) for module, names in (
        (shutil, ("rmtree", "_rmtree_safe_fd", "_rmtree_safe_fd_step")), (os, ("_fwalk",)))
    for function in (getattr(module, name, None) for name in names) if function is not None}


def path_text(value: Any) -> str | None:
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
