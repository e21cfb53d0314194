"""The one tree manifest: what is in a directory tree, by metadata, at a cost flat in what the user has.

:func:`snapshot` maps relative POSIX paths to :class:`Entry` from one ``lstat`` per entry (no file opened, no
symlink followed), walking a checkout as git sees it (:mod:`~canarchy.testing.isolation.checkout`: the
sentinel's cheaper view of a git checkout); :func:`changes` compares two snapshots, :func:`content_differences`
two trees byte for byte (SHA-256). An entry that vanishes is left out; a directory that cannot be listed is
recorded with ``error`` set. Design: ``docs/design/test-isolation.md`` ("Layer 5: the sentinel").
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from typing import NamedTuple
from collections.abc import Iterable, Mapping

from canarchy.testing.isolation.gitlisting import GitListing
from canarchy.testing.isolation.loadable import VENV_MARKER, VERSION_CONTROL_DIRS

#: The operator's canarchy and python-can state under a home (``snapshot(home, only=OPERATOR_STATE)``).
OPERATOR_STATE = (".canarchy", ".canrc", "can.conf", ".can")

#: Directories under the rootdir where test tools keep their caches (hypothesis's example database, in
#: the working directory): writable for the guard, left out by the sentinel's walk outside git.
TOOL_CACHES = (".hypothesis",)

#: Directory names the ``os.scandir`` walk of a checkout leaves out (with all under them):
#: version-control data, tool environments and caches, build and lane outputs. Also left
#: out: ``*.egg-info`` and any directory holding ``pyvenv.cfg`` (a virtualenv, whatever its name).
SKIPPED_DIRS = frozenset({
    *VERSION_CONTROL_DIRS, ".nox", ".tox", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules",
    "build", "dist", "reports", *TOOL_CACHES,
})
SKIPPED_SUFFIXES = (".egg-info",)

#: Version control's own files: what the operator's next ``git`` or ``hg`` runs (hooks, ``core.fsmonitor``; a
#: ``.git`` directory or file nested anywhere makes a repository of its own) and what hides a path from it
#: (the access guard's zone ``version control``).
VERSION_CONTROL_NAMES = frozenset({".git", ".gitignore", ".gitattributes", ".gitmodules", ".hg", ".hgignore"})
#: What, in any directory of a work tree, tells git what to leave out of its view (and how to filter what it shows).
GIT_RULES = (".gitignore", ".gitattributes")

#: Set by whoever runs pytest (the lanes): files of the run's own that it writes into the checkout while
#: pytest runs (its log), absolute, separated by ``os.pathsep``; the sentinel leaves them out.
OWN_OUTPUT_VARIABLE = "PYTEST_CANARCHY_OWN_OUTPUT"

#: ``Entry.note`` of a tracked path in :func:`~.checkout.checkout_state`: its metadata differs from git's index.
TRACKED = "tracked"
#: How :func:`changes` says it of a path the run made so: a touch (``os.utime``, ``chmod``) counts.
INDEX_DIFFERS = "its content, time, mode or inode now differs from what git's index recorded"

#: ``walk`` values of :func:`snapshot`.
CHECKOUT, SKIP_LIST, WHOLE = "checkout", "skip-list", "whole"
WALKS = (CHECKOUT, SKIP_LIST, WHOLE)

BLOCK_SIZE = 1 << 20


class Entry(NamedTuple):
    """One path: ``kind`` ``file``/``dir``/``link``/``other``; ``size`` in bytes (a link: its
    target's length; a directory: 0); ``mtime_ns``/``ctime_ns`` (0 for a directory, whose times
    move with every entry made in it, watched or not; ``ctime_ns`` 0 for a file with more than one
    hard link, whose ctime moves whenever another link to it is made or removed anywhere); ``inode``;
    ``mode`` (``st_mode``); ``target`` (a link's); ``error`` (why a directory could not be listed, else "");
    ``note``: :data:`TRACKED` in :func:`~.checkout.checkout_state` for a tracked path (kind ``missing`` if deleted)."""

    kind: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    mode: int
    target: str = ""
    error: str = ""
    note: str = ""


_new = tuple.__new__  # builds an Entry without NamedTuple's per-call argument handling


def _entry(st: os.stat_result, path: str, note: str = "") -> Entry:
    mode = st.st_mode
    if stat.S_ISREG(mode):  # a file linked elsewhere too (uv's cache) changes ctime with every link made or gone
        ctime = st.st_ctime_ns if st.st_nlink == 1 else 0
        return _new(Entry, ("file", st.st_size, st.st_mtime_ns, ctime, st.st_ino, mode, "", "", note))
    if stat.S_ISDIR(mode):
        return _new(Entry, ("dir", 0, 0, 0, st.st_ino, mode, "", "", note))
    if stat.S_ISLNK(mode):
        target = os.readlink(path)
        return Entry("link", len(target), st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode, target, note=note)
    return Entry("other", 0, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode, note=note)


def _error(exc: OSError) -> str:
    return f"cannot list: {exc.strerror or exc}"


def _record(out: dict[str, Entry], rel: str, path: str, note: str = "") -> Entry | None:
    """``lstat`` one path into ``out``; None (and nothing recorded) if it is gone."""
    try:
        st = os.lstat(path)
        entry = _entry(st, path, note)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # e.g. no search permission on a parent
        entry = Entry("other", 0, 0, 0, 0, 0, error=f"cannot stat: {exc.strerror or exc}", note=note)
    out[rel] = entry
    return entry


# radon D by design: the sentinel's walk of every entry, one function to spare calls (docs/benchmarks.md, 7)
def _scan(out: dict[str, Entry], root: str, start: str, skip: bool) -> None:
    """Walk the directory ``start`` (relative to ``root``, "" for root itself) into ``out``."""
    stack = [start]
    while stack:
        rel = stack.pop()
        path = os.path.join(root, rel) if rel else root
        try:
            with os.scandir(path) as it:
                children = list(it)
        except (FileNotFoundError, NotADirectoryError):
            out.pop(rel, None)  # gone (or replaced) since its parent was listed
            continue
        except OSError as exc:
            key = rel or "."
            out[key] = out.get(key, Entry("dir", 0, 0, 0, 0, 0))._replace(error=_error(exc))
            continue
        if skip and rel and any(child.name == VENV_MARKER for child in children):
            out.pop(rel, None)  # a virtualenv
            continue
        prefix = rel + "/" if rel else ""
        for child in children:
            name = child.name
            if skip and (name in SKIPPED_DIRS or name.endswith(SKIPPED_SUFFIXES)):
                try:
                    if child.is_dir(follow_symlinks=False):
                        continue
                except OSError:
                    continue
            try:
                entry = _entry(child.stat(follow_symlinks=False), child.path)
            except (FileNotFoundError, NotADirectoryError):
                continue  # vanished since the directory was listed
            except OSError as exc:
                entry = Entry("other", 0, 0, 0, 0, 0, error=f"cannot stat: {exc.strerror or exc}")
            out[prefix + name] = entry
            if entry.kind == "dir":
                stack.append(prefix + name)


def _from_git(out: dict[str, Entry], root: str, listing: GitListing | list[str], note: str = "",
              parents: bool = True) -> bool:
    """``lstat`` each path git lists (or has listed: a list) (with ``parents``, every directory above one too);
    the hot loop, kept flat. A listed path that is gone is left out, or with ``note`` recorded as kind
    ``missing`` (a tracked file deleted in the work tree). False, ``out`` emptied, when git gave no view."""
    prefix = os.path.join(root, "")
    lstat, new, file_type, regular = os.lstat, _new, stat.S_IFMT(0o177777), stat.S_IFREG
    dirs: set[str] = set()
    streamed = isinstance(listing, GitListing)
    for names in listing.batches() if streamed else [listing]:
        for name in names:
            try:
                st = lstat(prefix + name)
            except (FileNotFoundError, NotADirectoryError):
                if note:
                    out[name] = new(Entry, ("missing", 0, 0, 0, 0, 0, "", "", note))
                continue  # tracked but deleted in the work tree, or gone since git listed it
            except OSError:
                _record(out, name, prefix + name, note)
                continue
            mode = st.st_mode
            if mode & file_type == regular:
                ctime = st.st_ctime_ns if st.st_nlink == 1 else 0  # as _entry: not moved by links elsewhere
                out[name] = new(Entry, ("file", st.st_size, st.st_mtime_ns, ctime, st.st_ino, mode, "", "", note))
            else:  # a link, a submodule, an untracked nested repository ("name/")
                _record(out, name.rstrip("/"), prefix + name.rstrip("/"), note)
        if parents:
            dirs.update(name.rstrip("/").rpartition("/")[0] for name in names)
    if streamed and not listing.ok:
        out.clear()
        return False
    for name in list(dirs):
        parent = name.rpartition("/")[0]
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    dirs.discard("")
    for name in dirs:
        _record(out, name, prefix + name)
    return True


def snapshot(root: str | os.PathLike[str], *, only: Iterable[str] | None = None, walk: str | None = None,
             env: Mapping[str, str] | None = None) -> dict[str, Entry]:
    """``{relative POSIX path: Entry}`` for what is under ``root`` (``root`` itself not included).

    ``walk``: ``"checkout"`` (default without ``only``): as git sees it when ``root`` is in a git
    work tree (tracked plus untracked files not ignored, ``git ls-files --cached --others`` run with ``env``;
    git does not open an ignored directory, measured with strace, git 2.39), else the
    ``"skip-list"`` walk, ``os.scandir`` minus :data:`SKIPPED_DIRS`, ``*.egg-info`` and virtualenvs;
    ``"whole"`` (default with ``only``): everything. ``only``: just these names (relative paths) under
    ``root``, e.g. :data:`OPERATOR_STATE` under a home. A missing ``root`` gives ``{}``.
    """
    walk = walk or (WHOLE if only is not None else CHECKOUT)
    if walk not in WALKS:
        raise ValueError(f"walk must be one of {', '.join(WALKS)}, not {walk!r}")
    base = os.fspath(root)
    names = None if only is None else [os.fspath(n).strip("/") for n in only]
    out: dict[str, Entry] = {}
    if walk == CHECKOUT and _from_git(out, base, GitListing.files(base, names, env, "--cached", "--others")):
        return out
    skip = walk != WHOLE
    if names is None:
        _scan(out, base, "", skip)
        return out
    for name in names:
        entry = _record(out, name, os.path.join(base, name))
        if entry is not None and entry.kind == "dir":
            _scan(out, base, name, skip)
    return out


def unseen(root: str | os.PathLike[str], paths: Iterable[str], env: Mapping[str, str] | None = None) -> list[str]:
    """Those of ``paths`` (relative to ``root``) that :func:`~.checkout.checkout_state` leaves out: in a git work tree
    what git ignores or does not list (a nested repository's files, an empty directory); elsewhere what lies
    under a skipped directory (:data:`SKIPPED_DIRS`, ``*.egg-info``)."""
    paths = list(dict.fromkeys(paths))
    if not paths:
        return []
    listing = GitListing.files(os.fspath(root), paths, env, "--cached", "--others", empty_ok=True)
    listed = {name.rstrip("/") for batch in listing.batches() for name in batch}
    if listing.ok:
        return [p for p in paths if p not in listed and not any(n.startswith(p + "/") for n in listed)]
    return [p for p in paths if under_skipped_dir(p, os.sep)]


def under_skipped_dir(path: str, sep: str = "/") -> bool:
    """Whether a directory of the relative ``path`` is one the walk skips (:data:`SKIPPED_DIRS`, ``*.egg-info``)."""
    return any(part in SKIPPED_DIRS or part.endswith(SKIPPED_SUFFIXES) for part in path.split(sep)[:-1])


def _what(old: Entry, new: Entry, metadata: bool = True) -> str:
    if old.kind != new.kind:
        return f"{old.kind} -> {new.kind}"
    if old.target != new.target:
        return f"link target {old.target} -> {new.target}"
    reasons = []
    if old.error != new.error:
        reasons.append(new.error or "listable again")
    if old.size != new.size:
        reasons.append(f"size {old.size} -> {new.size}")
    if not metadata:
        return "; ".join(reasons)
    if stat.S_IMODE(old.mode) != stat.S_IMODE(new.mode):
        reasons.append(f"mode {stat.S_IMODE(old.mode):o} -> {stat.S_IMODE(new.mode):o}")
    if old.inode != new.inode:
        reasons.append("replaced (new inode)")
    return "; ".join(reasons) or "content or metadata"


def changes(before: Mapping[str, Entry], after: Mapping[str, Entry]) -> list[str]:
    """Lines ``added: p``, ``removed: p``, ``changed: p (what)`` in path order; [] when nothing changed."""
    if before == after:
        return []
    lines = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if new is not None and new.kind == "missing":
            lines.append(f"removed: {path}")
        elif old is None:
            lines.append(f"changed: {path} ({INDEX_DIFFERS})" if new.note else f"added: {path}")
        elif new is None:
            lines.append(f"changed: {path} (matches git's index again)" if old.note else f"removed: {path}")
        else:
            lines.append(f"changed: {path} ({_what(old, new)})")
    return lines


def content_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a regular file's bytes, read in :data:`BLOCK_SIZE` blocks.
    Raises ``OSError`` (also for a FIFO, device or directory, which is never read)."""
    digest = hashlib.sha256()
    buffer = bytearray(BLOCK_SIZE)
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with open(fd, "rb", buffering=0) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        while n := fh.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def content_differences(tree_a: str | os.PathLike[str], tree_b: str | os.PathLike[str], *,
                        only: Iterable[str] | None = None) -> list[str]:
    """What keeps ``tree_b`` from being a byte-identical copy of ``tree_a``, as :func:`changes`
    lines (``added``: only in ``tree_b``); [] when identical. Both are walked whole (or just
    ``only``); kinds, link targets and sizes are compared, and the content of files of equal size.
    """
    names = None if only is None else list(only)
    a = snapshot(tree_a, only=names, walk=WHOLE)
    b = snapshot(tree_b, only=names, walk=WHOLE)
    lines = []
    for path in sorted(a.keys() | b.keys()):
        old, new = a.get(path), b.get(path)
        if old is None:
            lines.append(f"added: {path}")
        elif new is None:
            lines.append(f"removed: {path}")
        elif what := _what(old, new, metadata=False):
            lines.append(f"changed: {path} ({what})")
        elif old.kind == "file":
            try:
                same = content_digest(os.path.join(tree_a, path)) == content_digest(os.path.join(tree_b, path))
            except OSError as exc:
                lines.append(f"changed: {path} (cannot read: {exc.strerror or exc})")
                continue
            if not same:
                lines.append(f"changed: {path} (content)")
    return lines
