"""What a process's descriptors name: the path each is open on now, those it holds, which were opened for
writing, and the working directory once removed (Linux ``/proc/self``; macOS ``F_GETPATH`` and ``/dev/fd``).
Standard library only.
"""

from __future__ import annotations

import os
import stat
import sys

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

# Taken at import: a test that replaces one of these in os steers nothing here.
_readlink, _fstat, _listdir, _getcwd = os.readlink, os.fstat, os.listdir, os.getcwd
_F_GETPATH = getattr(fcntl, "F_GETPATH", None) if fcntl is not None else None  # macOS
_FD_DIR = "/proc/self/fd"  # Linux: each open descriptor as a link to what it names
_CWD_LINK = "/proc/self/cwd"  # Linux: the working directory, named even once removed
_DELETED = " (deleted)"  # what Linux's /proc puts after the path of what was removed while held
_LINUX = sys.platform.startswith("linux")
_SEP = os.sep


def descriptor_path(fd: int) -> str | None:
    """The absolute path descriptor ``fd`` names now (Linux ``/proc/self/fd``, macOS ``F_GETPATH``), or None."""
    try:
        if _F_GETPATH is not None:
            return os.fsdecode(fcntl.fcntl(fd, _F_GETPATH, bytes(1024)).rstrip(b"\0"))
        path = _readlink(f"{_FD_DIR}/{fd}")
    except (OSError, ValueError):
        return None
    return path if path[:1] == _SEP else None  # "socket:[...]", "anon_inode:..." name no path


def working_directory() -> str:
    """The working directory, also once removed: Linux still resolves ``..`` from it, to its parent, and names
    it in ``/proc/self/cwd`` with :data:`_DELETED` after its path. ``OSError`` where it cannot be named."""
    try:
        return _getcwd()
    except FileNotFoundError:
        link = _readlink(_CWD_LINK)
        if not link.endswith(_DELETED):
            raise
        return link[:-len(_DELETED)]


def directory_descriptors() -> list[str]:
    """The paths of the directories this process holds open descriptors of (Linux; elsewhere none), ``/proc``'s
    too: a name under ``/proc/PID/fd`` is a file already open, reopened with new flags."""
    return [path for fd, status in open_descriptors() if stat.S_ISDIR(status.st_mode) and (
        path := descriptor_path(fd))]


def open_descriptors() -> list[tuple[int, os.stat_result]]:
    """Each descriptor this process holds open, and the status of what it is open on (Linux ``/proc/self/fd``,
    macOS ``/dev/fd``; elsewhere none)."""
    try:
        names = _listdir(_FD_DIR if _LINUX else "/dev/fd")
    except OSError:
        return []
    found = []
    for name in names:
        try:
            fd = int(name)
            found.append((fd, _fstat(fd)))
        except (OSError, ValueError):  # the listing's own descriptor, closed by now
            continue
    return found


def opened_for_writing(fd: int) -> bool:
    """Whether descriptor ``fd`` was opened for writing (``fcntl(F_GETFL)``; False where it cannot say)."""
    try:
        return fcntl is not None and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
    except OSError:
        return False
