"""Where a run's temporary files go: never inside an operator's home or the checkout.

Writing temporary files into a home is writing into the home; a project made
under a temporary directory inside the checkout would find the checkout's
configuration. Used by the plugin (the test run's ``TMPDIR``) and the lanes
(their homes and ``TMPDIR``); the account database's home is here for
the same reason. Standard library only: the nox sessions load
this file by path.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

#: Tried in order when the caller's temporary directory is unusable.
CANDIDATES = ("/tmp", "/var/tmp", "/dev/shm")


def account_database_home() -> str | None:
    """The home of this process's account in the account database
    (``pwd.getpwuid(os.getuid()).pw_dir``): where ``~`` goes when HOME is
    unset. None where there is no such database (Windows)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError, OSError):
        return None


def inside(path: str, tree: str) -> bool:
    """Whether ``path`` is ``tree`` or below it (both already resolved)."""
    return path == tree or path.startswith(tree.rstrip(os.sep) + os.sep)


def temp_base(avoid: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """``(directory, note)``: ``tempfile.gettempdir()`` unless it lies inside one
    of ``avoid``'s ``(path, what it is)`` trees, else the first of
    :data:`CANDIDATES` that is writable and inside none. ``note`` is "" when the
    caller's directory is kept, else a sentence saying why it was not."""
    own = os.path.realpath(tempfile.gettempdir())
    trees = [(os.path.realpath(path), what) for path, what in avoid]
    where = next((what for tree, what in trees if inside(own, tree)), None)
    if where is None:
        return own, ""
    for candidate in CANDIDATES:
        real = os.path.realpath(candidate)
        if (os.path.isdir(real) and os.access(real, os.W_OK | os.X_OK)
                and not any(inside(real, tree) for tree, _ in trees)):
            return real, f"TMPDIR {own} is in {where}: the run's temporary files go to {real}"
    return own, f"TMPDIR {own} is in {where} and no other temporary directory is writable"


def outside_project(project_root: str | os.PathLike[str]) -> tuple[str, str]:
    """:func:`temp_base` avoiding ``project_root`` and this account's homes (``HOME``, the
    account database's): where a lane puts its homes and its runs' ``TMPDIR``."""
    homes = {os.path.expanduser("~"), account_database_home()} - {"", None}
    return temp_base([(os.fspath(project_root), "the project"),
                      *((home, "the operator's home") for home in sorted(homes))])


#: In a run's temporary root: who made it, ``"PID START PIDNS"`` (its start in clock ticks since boot and its PID
#: namespace's inode, so a pid reused, or one of another namespace sharing the directory, is never taken for it).
RUN_MARK = "made-by"


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot: ``/proc/PID/stat`` field 22, proc(5)).
    Raises ``OSError`` (``FileNotFoundError``: no such process) or ``IndexError``."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[19].decode()


def _process_identity(pid: int) -> str | None:
    """``"PID START PIDNS"`` of a live process (Linux), or None: gone, or not knowable here."""
    try:
        return f"{pid} {_started(pid)} {os.stat('/proc/self/ns/pid').st_ino}"
    except (OSError, IndexError):
        return None


def _gone(pid: int, start: str) -> bool:
    """Whether the process ``pid`` that started at ``start`` is gone: no such pid, or another process now has it.
    A process this one may not look at (``/proc`` mounted with ``hidepid``) is not gone."""
    try:
        return _started(pid) != start
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False


def mark_run(root: str | os.PathLike[str]) -> None:
    """Write :data:`RUN_MARK` into ``root``, a temporary root this process made (nothing where /proc is missing)."""
    identity = _process_identity(os.getpid())
    if identity is not None:
        with open(os.path.join(root, RUN_MARK), "w", encoding="ascii") as handle:
            handle.write(identity)


def sweep_stale_runs(parent: str, prefix: str, beside: tuple[str, ...] = ()) -> list[str]:
    """Remove the temporary roots ``parent/prefix*`` (``tempfile.mkdtemp``'s names: the prefix and eight letters,
    digits or underscores) whose :data:`RUN_MARK` names a process of this PID namespace that is gone (a run killed
    before its own cleanup: a lane's second Ctrl+C), each with what the run kept beside it (its name followed by
    one of ``beside``); returns them. A root without a mark, of another namespace, or whose process lives, is
    left."""
    import shutil

    here = _process_identity(os.getpid())
    if here is None:
        return []
    namespace, removed = here.split()[2], []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(prefix) and len(e.name) == len(prefix) + 8
                   and e.name[len(prefix):].replace("_", "a").isalnum() and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(os.path.join(entry.path, RUN_MARK), encoding="ascii") as handle:
                pid, start, mark_namespace = handle.read().split()
        except (OSError, ValueError):
            continue
        if mark_namespace == namespace and _gone(int(pid), start):
            for path in (entry.path, *(entry.path + suffix for suffix in beside)):
                shutil.rmtree(path, ignore_errors=True)
            removed.append(entry.path)
    return removed
