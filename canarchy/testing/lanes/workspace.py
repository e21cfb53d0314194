"""Copies of a project tree, so a lane's runs never share (or touch) the checkout.

A copy holds what git would commit: tracked plus untracked-but-not-ignored
files (``git ls-files -co --exclude-standard``); outside a git work tree, every
file but the directories :data:`NOT_COPIED` names and any directory holding
a ``pyvenv.cfg`` (a virtualenv). Symlinks are copied as links.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from canarchy.testing.lanes.project import Project

#: Directories never copied from a tree that is not a git work tree.
NOT_COPIED = frozenset({
    ".git", ".hg", ".svn", ".nox", ".tox", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache",
    ".ruff_cache", "node_modules", "build", "dist", "reports",
})


class CopyError(OSError):
    """The tree could not be listed or copied."""


def tree_files(root: Path) -> list[str]:
    """The relative POSIX paths a copy of ``root`` holds (sorted)."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    if proc is not None and proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == root.resolve():
        try:
            listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
                                    capture_output=True, check=True, timeout=120)
        except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise CopyError(f"{root}: cannot list the files of the git work tree ({exc})") from None
        return sorted({n for n in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if n})
    return _walk(root)


def _walk(root: Path) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in NOT_COPIED and not d.endswith(".egg-info")
                       and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))]
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
        for name in list(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


def copy_tree(root: Path, dest: Path, files: list[str] | None = None) -> int:
    """Copy ``files`` (default :func:`tree_files`) of ``root`` into ``dest``; returns how many."""
    copied = 0
    for name in tree_files(root) if files is None else files:
        src = root / name
        if not src.is_symlink() and not src.exists():
            continue  # tracked but deleted in the work tree: the copy mirrors the work tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        elif src.is_file():
            shutil.copy2(src, target)
        else:
            continue  # a submodule: not part of the copy
        copied += 1
    if not (dest / "pyproject.toml").is_file() and (root / "pyproject.toml").is_file():
        raise CopyError(f"{root}: pyproject.toml was not copied ({copied} files)")
    return copied


def pythonpath(copy: Path, project: Project, extra_env: Mapping[str, str] | None = None) -> str:
    """``PYTHONPATH`` for a run on ``copy``: its import root first (its code is what runs), then
    any ``PYTHONPATH`` in ``extra_env``."""
    given = (extra_env or {}).get("PYTHONPATH")
    return os.pathsep.join([str(copy / project.source.relative_to(project.root)), *([given] if given else [])])
