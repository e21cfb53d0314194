"""The sentinel's view of a git checkout: what a run could have changed there, at a cost that grows with what
changed. :func:`checkout_state` gives ``{relative POSIX path: Entry}`` (:mod:`~canarchy.testing.isolation.tree`'s
entries, compared with its :func:`~canarchy.testing.isolation.tree.changes`). Design:
``docs/design/test-isolation.md`` ("Layer 5: the sentinel").
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple
from collections.abc import Iterable, Mapping

from canarchy.testing.isolation.gitlisting import GitListing
from canarchy.testing.isolation.loadable import (IMPORTABLE_SUFFIXES, NEVER_CODE, is_module, is_start_up_code,
                                                 site_packages, virtual_environments)
from canarchy.testing.isolation.tree import GIT_RULES, TRACKED, Entry, _from_git, _record, _scan


class CheckoutState(dict):
    """:func:`checkout_state`'s ``{relative POSIX path: Entry}``; ``tracked``: git's view of the index it was
    taken with (:class:`TrackedView`; None outside git), which the next state of the same checkout reuses while
    the index file is unchanged."""

    tracked: TrackedView | None = None


class TrackedView(NamedTuple):
    """What ``git ls-files -v --cached`` said of the index of ``git_dir`` (one stat ``index`` of the index file
    before it ran: device, inode, size, mtime, ctime; None without one) for the work tree at ``root``: whether it
    lists any path, the directories holding one, the paths flagged (:data:`_FLAGGED`: ``(flag, path)``) and
    the Python sources."""

    root: str
    git_dir: str
    index: tuple[int, ...] | None
    any: bool
    directories: frozenset[str]
    flagged: tuple[tuple[str, str], ...]
    sources: tuple[str, ...]


def checkout_state(root: str | os.PathLike[str], env: Mapping[str, str] | None = None,
                   search_dirs: Iterable[str] = (), previous: CheckoutState | None = None) -> CheckoutState:
    """What a run could have changed in a checkout, at a cost that grows with what changed, not
    with the checkout: in a git work tree, the tracked paths whose metadata differs from git's
    index (``git diff-files``, which compares size, times, inode and mode in C and opens no file),
    noted :data:`TRACKED`, and the untracked files git does not ignore; no directory entries.
    Elsewhere (no git, ``root`` not in a work tree or wholly ignored) :func:`snapshot`'s
    skip-list walk. In both, what a later run loads unasked or imports (:func:`_loadable_code`) at the top
    of ``root`` and of ``search_dirs`` (directories under it where a later run looks for code: ``sys.path``'s)
    and in their packages, ignored by git or not; in a work tree also what tells git to leave a path out
    (:func:`_git_rules`) in every directory of its view. Two states compare with :func:`changes`; git runs with
    ``env``. ``previous``: an earlier state of this checkout, whose listing of the index is reused when the
    index file's metadata has not changed since (:func:`_tracked_view`)."""
    base = os.fspath(root)
    out = CheckoutState()
    changed = GitListing(base, ["diff-files", "-z", "--name-only", "--relative"], env, empty_ok=True).start()
    repository = GitListing(base, ["rev-parse", "--absolute-git-dir", "--revs-only", "HEAD"], env).start()
    staged = GitListing(base, ["diff-index", "--cached", "-z", "--name-only", "--relative", "HEAD"], env).start()
    untracked = GitListing.files(base, None, env, "--others").start()
    try:
        described = repository.text()
        out.tracked = tracked = _tracked_view(base, env, described, previous)
        ok = _from_git(out, base, changed, TRACKED, parents=False)
        ok = ok and tracked is not None and _from_git(out, base, untracked, parents=False)
        if not (ok and (out or tracked.any)):
            out.clear()
            _scan(out, base, "", True)
            names = [rel for rel in list(out) if rel.endswith(PYTHON_SOURCES)]
        else:
            names = list(dict.fromkeys([*tracked.sources, *(rel for rel in out if rel.endswith(PYTHON_SOURCES))]))
            if described:
                _git_rules(out, base, tracked.directories)
                _git_state(out, base, described, staged.text(), tracked.flagged)
        _loadable_code(out, base, search_dirs)
        _cached_beside_sources(out, base, names)
    finally:
        for listing in (changed, repository, staged, untracked):
            listing.close()  # a listing left unread (outside a work tree) ends here, its git process reaped
    return out


def _index_key(git_dir: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(os.path.join(git_dir, "index"))
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _tracked_view(root: str, env: Mapping[str, str] | None, described: str | None,
                  previous: CheckoutState | None) -> TrackedView | None:
    """``previous``'s view of the index when it is of this work tree and git directory and the index file's
    metadata is unchanged (git writes a new index file, renamed into place, for every change to it); else
    ``git ls-files -z -v --cached`` run now, after the index file was looked at. None where git gives no view."""
    git_dir = (described or "").partition("\n")[0]
    key = _index_key(git_dir) if git_dir else None
    before = getattr(previous, "tracked", None)
    if key is not None and before is not None and (before.root, before.git_dir, before.index) == (root, git_dir, key):
        return before
    listed = GitListing(root, ["ls-files", "-z", "-v", "--cached"], env).text()
    if listed is None:
        return None
    entries = "\0" + listed  # each entry after a NUL: a pattern led by one is scanned for at C speed
    return TrackedView(root, git_dir, key, bool(listed), frozenset(_LISTED_DIRECTORY.findall(listed)),
                       tuple(_FLAGGED.findall(entries)), tuple(_SOURCE.findall(entries)))


#: The suffixes of the sources an import may have cached byte code of (:func:`checkout_state`).
PYTHON_SOURCES = (".py", ".pyw")


def _cached_beside_sources(out: dict[str, Entry], root: str, sources: Iterable[str]) -> None:
    """Add the byte code in the ``__pycache__`` beside each of ``sources`` (paths relative to ``root``) that
    :func:`_loadable_code` has not: a directory of code that is no regular package (a namespace package, a
    directory a child Python finds on its ``PYTHONPATH``) is imported from too, and git ignores what is
    cached there. One ``scandir`` per directory."""
    seen = {key.rpartition("/")[0] for key in out if key.endswith(".pyc")}
    for rel in sorted({name.rpartition("/")[0] for name in sources if name}):
        cache = f"{rel}/__pycache__" if rel else "__pycache__"
        if cache not in seen:
            _cached_code(out, cache, os.path.join(root, cache))


#: A repository's files a later git command runs or takes its rules from (hooks, ``core.fsmonitor``, what it
#: ignores, which files it leaves out, where its common directory is, which commit stands for another), under
#: its git directory; a directory with every file in it.
GIT_RUNS = ("config", "config.worktree", "commondir", "hooks", "info/exclude", "info/attributes",
            "info/sparse-checkout", "info/grafts", "refs/replace", "packed-refs")
# In ``ls-files -z -v`` output with a NUL put before it (every entry, the last too, then ends in one):
_FLAGGED = re.compile(r"\0([a-zS]) ([^\0]*)")  # lowercase: assume-unchanged; S: skip-worktree
_SUFFIXES = "|".join(map(re.escape, PYTHON_SOURCES))
_SOURCE = re.compile(rf"\0. ([^\0]*(?:{_SUFFIXES}))(?=\0)")  # a listed path of Python source
_LISTED_DIRECTORY = re.compile(r"(?:^|\0). ([^\0]*)/[^\0/]*")  # ls-files -v: the directory of a path in one


def _git_rules(out: dict[str, Entry], root: str, listed_dirs: Iterable[str]) -> None:
    """Add to ``out`` each :data:`GIT_RULES` file, ignored by git or not, in the directories of git's view: each
    directory holding a tracked path (``listed_dirs``) or a path already in ``out`` (listed by git), those above
    it, ``root`` itself. A rule planted there (``*``, in a ``.gitignore`` that so hides itself too) takes what it
    names out of git's view and so out of the rest of the state. One ``lstat`` per name and directory."""
    parents = {name.rstrip("/").rpartition("/")[0] for name in out}
    parents.update(listed_dirs)
    dirs = {""}
    for parent in parents:
        while parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    for rel in dirs:
        for name in GIT_RULES:
            path = f"{rel}/{name}" if rel else name
            if path not in out:
                _record(out, path, os.path.join(root, path))


def _git_state(out: dict[str, Entry], root: str, repository: str, staged: str | None,
               flagged: Iterable[tuple[str, str]]) -> None:
    """Add to ``out`` what the git view above cannot show changed, as a shell child changes it: ``HEAD``'s
    commit (key ``.git:HEAD``, the commit as the entry's target), each path staged in the index against it
    (``.git:staged/PATH``), so that ``git add`` or ``git commit`` in the checkout does not make a change
    vanish, and each path git is told not to look at (``.git:flag/PATH``: ``update-index --assume-unchanged``
    or ``--skip-worktree``); the work tree's ``.git`` itself (a file naming the git directory, in a worktree);
    and :data:`GIT_RUNS` by metadata (keys relative to ``root``)."""
    lines = repository.splitlines()
    git_dir = lines[0]
    head = lines[1] if len(lines) > 1 else ""
    out[".git:HEAD"] = Entry("other", 0, 0, 0, 0, 0, target=head)
    for name in (staged or "").split("\0"):
        if name:
            out[f".git:staged/{name}"] = Entry("other", 0, 0, 0, 0, 0, target="staged")
    for flag, name in flagged:
        out[f".git:flag/{name}"] = Entry("other", 0, 0, 0, 0, 0, target=flag)
    _record(out, ".git", os.path.join(root, ".git"))
    prefix = os.path.relpath(git_dir, root).replace(os.sep, "/")
    for name in GIT_RUNS:
        entry = _record(out, f"{prefix}/{name}", os.path.join(git_dir, name))
        if entry is not None and entry.kind == "dir":
            _scan(out, root, f"{prefix}/{name}", False)


def _loadable_code(out: dict[str, Entry], root: str, search_dirs: Iterable[str]) -> None:
    """Add to ``out`` what a later run loads unasked or imports, ignored by git or not: at the top of ``root``
    and of each of ``search_dirs`` (relative to it), what
    :func:`~canarchy.testing.isolation.loadable.is_start_up_code` names, a directory with all under it, and
    every entry an import finds a module in (:func:`~canarchy.testing.isolation.loadable.is_module`: a module,
    a directory, which may be a namespace package, by its own metadata only); there and in every regular
    package below, what an import runs besides source
    (:data:`~canarchy.testing.isolation.loadable.IMPORTABLE_SUFFIXES`: git ignores ``*.py[cod]`` and ``*.so``)
    and the ``__pycache__``'s byte code; and in every package, every entry (a ``.gitignore`` of its own hides a
    shadowing subpackage from git). At the top of the ``site-packages`` of each virtual environment in the
    checkout that is not among ``search_dirs`` (one a later ``nox -R`` or ``.venv/bin/python`` starts), the same
    but its packages. One ``scandir`` per top, package and ``__pycache__``, one ``lstat`` per entry of a package
    and per module at a top."""
    tops = list(dict.fromkeys(["", *search_dirs]))
    sites = [site for venv in virtual_environments(root) for site in site_packages(root, venv) if site not in tops]
    pending = [(site, None) for site in sites] + [(top, True) for top in reversed(tops)]
    while pending:
        rel, top = pending.pop()  # top: True at a top, False in a package, None at a site-packages of no search
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                children = list(it)
        except OSError:
            continue
        prefix = rel + "/" if rel else ""
        for child in children:
            if _loadable_entry(out, root, child, prefix + child.name, top):
                pending.append((prefix + child.name, False))


def _loadable_entry(out: dict[str, Entry], root: str, child: os.DirEntry[str], path: str, top: bool | None) -> bool:
    """Record ``child`` (at ``path``) for :func:`_loadable_code` if a later run may load it; True when it is a
    package to look into."""
    name = child.name
    if (top is not False and is_start_up_code(name)) or name.endswith(IMPORTABLE_SUFFIXES):
        if path not in out and (entry := _record(out, path, child.path)) and entry.kind == "dir":
            _scan(out, root, path, False)
        return False
    if name == "__pycache__":
        _cached_code(out, path, child.path)
        return False
    # a package by whatever name (``build``, ``dist``, ``reports`` too: ``python -m build`` runs one)
    package = name not in NEVER_CODE and child.is_dir(follow_symlinks=False) and os.path.isfile(
        os.path.join(child.path, "__init__.py"))
    # in a package, everything: git may be told to hide a part; at a top, what an import finds there
    if path not in out and (top is False or is_module(name, child.is_dir())):
        _record(out, path, child.path)
    return package and top is not None


def _cached_code(out: dict[str, Entry], rel: str, path: str) -> None:
    try:
        with os.scandir(path) as it:
            for child in it:
                if child.name.endswith(".pyc"):
                    _record(out, f"{rel}/{child.name}", child.path)
    except OSError:
        pass
