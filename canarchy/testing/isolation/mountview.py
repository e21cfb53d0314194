"""The mount view of a contained run: which paths become empty, read-only or stay writable, and mounting it.

:meth:`View.of` works it out from a :class:`~canarchy.testing.isolation.containment.Plan` at the moment of
entering; :meth:`View.apply` mounts it inside the private mount namespace. Standard library only, with
``kernel.py`` beside it: a fresh child Python loads both by path, as it loads ``containment.py``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from canarchy.testing.isolation.containment import Plan

if __package__:  # imported as a module of the package
    from canarchy.testing.isolation import kernel
    from canarchy.testing.isolation.tempbase import inside
else:  # loaded by path by containment.py, which put kernel.py and tempbase.py in sys.modules first
    kernel = sys.modules["kernel"]
    inside = sys.modules["tempbase"].inside


def _depth(path: str) -> tuple[int, str]:
    return path.rstrip("/").count("/"), path


def outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another one, shortest first."""
    kept: list[str] = []
    for path in sorted(set(paths), key=_depth):
        if not any(inside(path, k) for k in kept):
            kept.append(path)
    return kept


def _ancestors(path: str) -> list[str]:
    """The directories above ``path``, ``/`` excluded (it cannot be renamed anyway)."""
    out = []
    parent = os.path.dirname(path.rstrip("/"))
    while parent not in ("", "/"):
        out.append(parent)
        parent = os.path.dirname(parent)
    return out


def _threads(pid: int) -> list[str]:
    """The thread ids of ``pid`` now (its own among them)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _hidden(processes: tuple[int, ...]) -> list[str]:
    """What each of ``processes`` (the calling one first) shows any process of its start-up environment: its
    ``environ`` and its ``mem``, for the first and each of its threads now; for those above it, their
    ``cmdline`` too (``env VAR=value pytest``, ``sh -c 'VAR=value ...'`` name variables there), and their
    whole ``task`` directory, so that a thread one of them starts later shows nothing there. Each thread now
    also by its own ``/proc/TID``, which ``/proc`` does not list but opens."""
    first, above = processes[:1], processes[1:]
    shown = {pid: ("environ", "mem") if pid in first else ("environ", "mem", "cmdline") for pid in processes}
    threads = {pid: _threads(pid) for pid in processes}
    return ([f"/proc/{pid}/{where}{name}" for pid in first for where in ("", *(f"task/{tid}/" for tid in threads[pid]))
             for name in shown[pid]]
            + [f"/proc/{pid}/{name}" for pid in above for name in (*shown[pid], "task")]
            + [f"/proc/{tid}/{name}" for pid in processes for tid in threads[pid] if tid != str(pid)
               for name in (*shown[pid], *(("task",) if pid in above else ()))])


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _nearest_existing(path: str) -> str:
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return parent


@dataclass
class View:
    """The mount view worked out from a plan at the moment of entering.

    ``layers``: (path, writable) shallowest first, so that where trees nest
    the deepest one decides; at the same path the writable one does."""

    covers: list[str] = field(default_factory=list)          # existing: made empty
    sockets: list[str] = field(default_factory=list)         # bound by a process outside: made empty files
    hidden: list[str] = field(default_factory=list)          # the processes' /proc files: made empty
    pins: list[str] = field(default_factory=list)            # ancestors of read-only trees: mount points
    uncreatable: list[str] = field(default_factory=list)     # missing: a read-only tree holds their parent
    fresh: list[str] = field(default_factory=list)           # a new, empty file system mounted there
    layers: list[tuple[str, bool]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, plan: Plan) -> View:
        view = cls()
        parents = {}
        for path in plan.covered:
            target = os.path.realpath(path)  # a symlink: what it resolves to
            if os.path.exists(target):
                view.covers.append(target)
            else:
                parents[str(path)] = _nearest_existing(target)
        trees = {os.path.realpath(p) for p in plan.read_only if os.path.lexists(p)} | set(parents.values())
        view._add_layers(trees, {os.path.realpath(p) for p in plan.writable if os.path.isdir(p)})
        view.sockets = sorted({path for path in (os.path.realpath(p) for p in plan.sockets) if _is_socket(path)})
        view.hidden = _hidden(plan.processes)
        view.pins = sorted({a for tree in view.read_only for a in _ancestors(tree)} - set(view.read_only), key=_depth)
        for path, parent in parents.items():
            tree, writable_there = view.decides(parent)
            if writable_there:
                view.problems.append(f"{path} can be created: {tree} is writable")
            else:
                view.uncreatable.append(path)
        return view

    def _add_layers(self, read_only: set[str], writable: set[str]) -> None:
        """Shallowest first, and only where a layer changes what the ones above it decide."""
        layers = sorted([(t, False) for t in read_only] + [(w, True) for w in writable],
                        key=lambda layer: (_depth(layer[0]), layer[1]))
        for path, kind in layers:
            if self.decides(path)[1] is not kind and (not kind or self.decides(path)[0] is not None):
                self.layers.append((path, kind))

    def decides(self, path: str) -> tuple[str | None, bool]:
        """The deepest layer holding ``path`` and whether it is writable (None, True: no layer)."""
        for tree, writable in reversed(self.layers):
            if inside(path, tree):
                return tree, writable
        return None, True

    @property
    def read_only(self) -> list[str]:
        return [path for path, writable in self.layers if not writable]

    @property
    def writable(self) -> list[str]:
        return [path for path, writable in self.layers if writable]

    def apply(self) -> None:
        """Mount it (in a private mount namespace, with capabilities there).
        A path that cannot be done is recorded in ``problems``; the rest is done."""
        clones = {path: self._try(path, kernel._open_tree, path) for path in self.writable}  # as they are now
        for path in self.pins:  # a mount point cannot be renamed (EBUSY): no moving a home's parent aside
            self._try(path, kernel.mount, path, path, None, kernel.MS_BIND | kernel.MS_REC)
        for path, writable in self.layers:
            if not writable:
                self._try(path, self._read_only, path)
            elif clones[path] is not None:
                self._try(path, kernel._move_mount, clones[path], path)
                os.close(clones[path])
        if self.covers or self.hidden or self.sockets:
            self._try("covers", self._cover_all)

    def _try(self, path: str, action, *args):
        try:
            return action(*args)
        except OSError as exc:
            self.problems.append(f"{path}: {exc.strerror or exc}")
            return None

    @staticmethod
    def _read_only(path: str) -> None:
        kernel.mount(path, path, None, kernel.MS_BIND | kernel.MS_REC)
        kernel.mount_setattr(path, kernel.MOUNT_ATTR_RDONLY, recursive=True)

    def _cover_all(self) -> None:
        staging = kernel._new_fs("tmpfs")  # detached: an empty directory and an empty file to clone
        try:
            # modes that let the owner past the permission check, so a write meets EROFS
            os.mkdir("empty-dir", 0o755, dir_fd=staging)
            os.close(os.open("empty-file", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=staging))
            for path in self.hidden:
                with contextlib.suppress(OSError):  # a thread or process that has ended since
                    self._cover(staging, path)
            for path in (*self.covers, *self.sockets):
                try:
                    self._cover(staging, path)
                except FileNotFoundError:  # gone since the view was worked out: a terminal closed, a socket removed
                    pass
                except OSError as exc:
                    self.problems.append(f"{path}: {exc.strerror or exc}")
        finally:
            os.close(staging)

    @staticmethod
    def _cover(staging: int, path: str) -> None:
        source = "empty-dir" if os.path.isdir(path) else "empty-file"
        tree = kernel._open_tree(source, dirfd=staging, recursive=False)
        try:
            kernel.mount_setattr("", kernel.MOUNT_ATTR_RDONLY | kernel.MOUNT_ATTR_NOSUID | kernel.MOUNT_ATTR_NODEV
                                 | kernel.MOUNT_ATTR_NOEXEC, dirfd=tree)
            kernel._move_mount(tree, path)
        finally:
            os.close(tree)

    def detail(self) -> str:
        pids = sorted({int(path.split("/")[2]) for path in self.hidden})
        devices = [path for path in self.covers if path.startswith("/dev/")]
        files = [path for path in self.covers if path not in devices]
        parts = [f"empty, read-only: {', '.join(files)}" if files else "",
                 f"a fresh tmpfs: {', '.join(self.fresh)}" if self.fresh else "",
                 f"device nodes empty, read-only: {len(devices)} under /dev" if devices else "",
                 f"start-up environment hidden: processes {', '.join(map(str, pids))}" if pids else "",
                 f"sockets of processes outside empty: {len(self.sockets)}" if self.sockets else "",
                 f"absent, cannot be created: {', '.join(self.uncreatable)}" if self.uncreatable else "",
                 f"read-only: {', '.join(self.read_only)}" if self.read_only else "",
                 f"cannot be moved: {', '.join(self.pins)}" if self.pins else "",
                 f"writable inside: {', '.join(self.writable)}" if self.writable else ""]
        return "; ".join(p for p in parts if p) or "nothing to cover"
