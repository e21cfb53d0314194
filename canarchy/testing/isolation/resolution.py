"""Where a path leads: the path the OS would reach, as the access guard judges it.

Every directory is resolved (``realpath``) and, while it is an existing directory reached with no link followed,
remembered; the final component is followed when it is a symlink, known from one listing of its directory. What
a process outside this one may change unseen (``others_relink``) is asked of the file system each time. Design:
``docs/design/test-isolation.md`` ("Layer 6: the access guard"). Imports neither pytest nor python-can.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any

from canarchy.testing.isolation.descriptors import working_directory
from canarchy.testing.isolation.protection import normcase

# The file system calls made here, bound once: a test that patches os.scandir or os.lstat (to count calls)
# sees only its own, and cannot steer the guard.
_scandir, _lstat, _realpath, _isdir = os.scandir, os.lstat, os.path.realpath, os.path.isdir
_normpath = os.path.normpath
_WINDOWS = os.name == "nt"
_SEP = os.sep
_FOLD_CASE = sys.platform in ("win32", "darwin")  # file systems that ignore case by default
_CACHED = 4096  # directories remembered, and entries listed per directory, at most
_UNSCANNED: Any = object()


class Resolutions:
    """What the guard remembers of directories, and the resolution that uses it.

    ``dirs``: directory as given -> resolved, for existing directories; ``links``: resolved directory -> the
    names of its symlinks (None: not listed); ``others_relink``: a process was started that may make or move
    links unseen by this process's hook, so nothing is remembered until the plugin finds no child left.
    """

    def __init__(self) -> None:
        self.dirs: dict[str, str] = {}
        self.links: dict[str, frozenset[str] | None] = {}
        self.others_relink = False

    def forget(self) -> None:
        """Drop what is remembered (after each operation that can make or move a link in this process)."""
        self.dirs.clear()
        self.links.clear()

    def resolve(self, text: str, follow: bool) -> str:
        """The path the OS would reach: every directory resolved (remembered while it is an
        existing directory), then the final component, followed when ``follow`` and a symlink."""
        if _WINDOWS or text[:1] != _SEP:
            text = text if os.path.isabs(text) else os.path.join(working_directory(), text)  # not abspath: folds '..'
            head, name = os.path.split(text)
        else:
            cut = text.rfind(_SEP)
            head, name = text[:cut] or _SEP, text[cut + 1:]
        if not name or name == os.curdir or name == os.pardir:
            return self.directory(text) if follow else normcase(_realpath(text))
        directory = self.dirs.get(head)
        if directory is None:
            directory = self.directory(head)
        path = directory + name if directory.endswith(_SEP) else directory + _SEP + name
        if follow:
            links = self.links.get(directory, _UNSCANNED)
            if links is _UNSCANNED:
                links = self._scan_links(directory)
            if links is None:  # not listed: ask the file system
                try:
                    if stat.S_ISLNK(_lstat(path).st_mode):
                        path = normcase(_realpath(path))
                except OSError:
                    pass
            elif (name.casefold() if _FOLD_CASE else name) in links:
                path = normcase(_realpath(path))
        return path

    def directory(self, text: str) -> str:
        """``realpath(text)``, remembered when it is an existing directory reached with no link followed: a
        link's target can move with no audit event (``/proc/self/cwd`` on a chdir, ``/proc/self/fd/N`` on a
        dup2, ``/dev/fd``, a link to either), and a magic link cannot be told from another one cheaply."""
        resolved = normcase(_realpath(text))
        if not self.others_relink and resolved == normcase(_normpath(text)) and _isdir(resolved):
            if len(self.dirs) >= _CACHED:
                self.dirs.clear()
            self.dirs[text] = resolved
        return resolved

    def _scan_links(self, directory: str) -> frozenset[str] | None:
        """The names of the symlinks in ``directory`` (one listing, remembered), or None
        when it cannot be listed or is too large to remember."""
        if self.others_relink:
            return None  # each name asked of the file system, when it is judged
        names = []
        try:
            with _scandir(directory) as entries:
                for count, entry in enumerate(entries):
                    if count >= _CACHED:
                        return None
                    if entry.is_symlink():
                        names.append(entry.name.casefold() if _FOLD_CASE else entry.name)
        except OSError:
            return None
        if len(self.links) >= _CACHED:
            self.links.clear()
        links = self.links[directory] = frozenset(names)
        return links
