"""Copies of a project tree, so a lane's runs never share (or touch) the checkout.

A copy holds what the one tree manifest sees of a checkout
(:func:`canarchy.testing.isolation.tree.snapshot`): in a git work tree what git
would commit (tracked plus untracked-but-not-ignored files) and what it ignores
under the import root that an import loads (:func:`ignored_importable`),
elsewhere every file but tool environments, caches and outputs. Symlinks are
copied as links.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Iterable, Iterator, Mapping

from canarchy.fileio import write_bytes_atomic
from canarchy.testing.isolation.gitlisting import GitListing, ignored_among
from canarchy.testing.isolation.loadable import VENV_MARKER
from canarchy.testing.isolation.tree import Entry, changes, snapshot, under_skipped_dir
from canarchy.testing.lanes.runner import Run, shielded

if TYPE_CHECKING:
    from canarchy.testing.lanes.project import Project

class CopyError(OSError):
    """The tree could not be listed or copied."""


def tree_files(root: Path, project: Project | None = None) -> list[str]:
    """The relative POSIX paths a copy of ``root`` holds (sorted): files and links; with ``project``, also
    what git ignores under its import root that an import loads (:func:`ignored_importable`)."""
    entries = snapshot(root)  # git's view of a work tree, else the skip-list walk
    files = {path for path, entry in entries.items() if entry.kind in ("file", "link")}
    if project is not None:
        files.update(ignored_importable(project))
    return sorted(files)


def ignored_importable(project: Project) -> list[str]:
    """What git ignores under ``project``'s import root (:attr:`Project.source`; in a flat layout, under its
    packages where it names them) that an import can load: generated sources (hatch-vcs's ``_version.py``),
    extension modules, data files. Not byte code (``__pycache__``, ``.pyc``), tool caches, build outputs or
    virtualenvs (:data:`~canarchy.testing.isolation.tree.SKIPPED_DIRS`). [] outside a git work tree, whose
    copy holds these already. One ``git ls-files --others --ignored`` run."""
    root = project.root
    if project.source != root:
        under: list[str] | None = [project.source.relative_to(root).as_posix()]
    else:
        under = [name for p in project.packages for name in (p, f"{p}.py")] or None
    listing = GitListing.files(str(root), under, None, "--others", "--ignored", empty_ok=True)
    names = [name for batch in listing.batches() for name in batch if name]
    if not listing.ok:
        return []
    venvs = tuple(name[: -len(VENV_MARKER)] for name in names if name.endswith(f"/{VENV_MARKER}"))
    return [name for name in names
            if not name.endswith((".pyc", ".pyo")) and not (venvs and name.startswith(venvs))
            and not under_skipped_dir(name)]


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


def copy_changes(root: Path, before: Mapping[str, Entry], after: Mapping[str, Entry]) -> list[str]:
    """What changed in a copy of ``root`` from ``before`` to ``after`` (two :func:`~.tree.snapshot` results), as
    :func:`~.tree.changes` words it, less the paths git ignores in ``root``'s work tree: a tool's output (the
    ``.benchmarks`` pytest-benchmark makes as pytest starts), which the sentinel does not watch in a checkout
    either (a test's own write there fails that test: the access guard records it). Outside a work tree, or
    without git, every change."""
    differing = [path for path in before.keys() | after.keys() if before.get(path) != after.get(path)]
    if not differing:
        return []
    names = [f"{path}/" if (after.get(path) or before[path]).kind == "dir" else path for path in differing]
    ignored = {name.rstrip("/") for name in ignored_among(root, names)}
    return changes({k: v for k, v in before.items() if k not in ignored},
                   {k: v for k, v in after.items() if k not in ignored})


#: What a lane's interrupted run keeps of its reports: the logs, of what ran until the interrupt.
KEPT_WHEN_INTERRUPTED = (".log",)


def clear_reports(directory: Path, patterns: tuple[str, ...], keep: tuple[str, ...] = ()) -> None:
    """Remove the files of ``directory`` matching ``patterns`` (globs) but those whose suffix is in ``keep``: a
    lane's reports of an earlier run, which an interrupted run would otherwise leave beside its own, an old
    verdict among them; or an interrupted run's own (a JUnit report pytest finished reads as a verdict)."""
    for pattern in patterns:
        for path in directory.glob(pattern):
            if path.is_file() and not path.is_symlink() and path.suffix not in keep:
                with contextlib.suppress(OSError):
                    path.unlink()


class LaneBusy(Exception):
    """Another run of the same lane holds the checkout's reports; the message names its pid and how to wait."""


@contextlib.contextmanager
def reports_lock(directory: Path, lane: str) -> Iterator[None]:
    """Hold ``directory/.LANE.lock`` (``fcntl.flock``, exclusive) for the block, so no other run of ``lane`` in
    this checkout clears or writes its reports meanwhile; raises :class:`LaneBusy` at once if one holds it.
    The kernel releases the lock when its holder exits, however it ends; the block's end removes the file (and
    ``directory``, when it made it and it is empty). Without ``fcntl``: no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = directory / f".{lane}.lock"
    made = not directory.exists()
    while True:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory went meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LaneBusy(f"another {lane} run (pid {holder}) holds this checkout's reports ({path}); wait for it "
                           f"to end (`flock {path} true` returns then) and start this one again") from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break  # still the file at ``path``, not one its last holder removed as we opened it
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a run that opened it meanwhile sees it gone and tries again
        os.close(fd)
        if made:
            with contextlib.suppress(OSError):
                directory.rmdir()


def publish_reports(work: Path, out: Path, runs: Iterable[Run | None], problems: list[str | None] = (),
                    suffixes: tuple[str, ...] = ()) -> list:
    """Copy the reports and logs that runs on copies wrote to ``work`` (in the lane's temporary tree: the
    checkout may lie in the operator's home, which such a run may only read) to ``out`` (``suffixes``: those
    files only), and point ``runs`` there; returns ``problems`` with ``work``'s paths made ``out``'s."""
    for path in sorted(work.iterdir()):
        if path.is_file() and (not suffixes or path.suffix in suffixes):
            with path.open("rb") as report:
                write_bytes_atomic(out / path.name, report, stat.S_IMODE(os.fstat(report.fileno()).st_mode))

    def moved(path: Path | None) -> Path | None:
        return out / path.name if path is not None and path.parent == work else path

    for run in runs:
        if run is not None:
            run.log, run.junit = moved(run.log), moved(run.junit)
    return [p.replace(f"{work}{os.sep}", f"{out}{os.sep}") if p else p for p in problems]


@contextlib.contextmanager
def logs_kept_if_interrupted(work: Path, out: Path) -> Iterator[None]:
    """Within the block runs write to ``work``, published to ``out`` at its end: an interrupt (or any error)
    that leaves it first copies their logs there (:data:`KEPT_WHEN_INTERRUPTED`), what ran until then, before
    the temporary tree goes."""
    try:
        yield
    except BaseException:
        with shielded(), contextlib.suppress(OSError):
            publish_reports(work, out, (), suffixes=KEPT_WHEN_INTERRUPTED)
        raise


def remove_tree(path: str | os.PathLike[str], attempts: int = 5) -> None:
    """Remove a lane's temporary tree, to the end even when an interrupt arrives meanwhile
    (:func:`~canarchy.testing.lanes.runner.shielded`); an entry still appearing while it goes
    (a run stopped mid-write) makes it try again, up to ``attempts`` times, 0.2 s apart. Raises
    the last ``OSError`` if the tree is still there."""
    with shielded():
        for attempt in range(attempts):
            try:
                shutil.rmtree(path)
                return
            except OSError:  # FileNotFoundError too: an entry inside may vanish while the tree stays
                if not os.path.lexists(path):
                    return
                if attempt == attempts - 1:
                    raise
            time.sleep(0.2)


@contextlib.contextmanager
def temporary_tree(prefix: str) -> Iterator[str]:
    """A new directory in the temporary base, removed with :func:`remove_tree` afterwards."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        remove_tree(path)


def pythonpath(copy: Path, project: Project, extra_env: Mapping[str, str] | None = None) -> str:
    """``PYTHONPATH`` for a run on ``copy``: its import root first (its code is what runs), then
    any ``PYTHONPATH`` in ``extra_env``."""
    given = (extra_env or {}).get("PYTHONPATH")
    return os.pathsep.join([str(copy / project.source.relative_to(project.root)), *([given] if given else [])])
