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
