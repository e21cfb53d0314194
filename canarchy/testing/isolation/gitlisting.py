"""git, run for what it lists under a work tree: its files, what it ignores.

Each listing is read as git writes it, with git's metadata comparison fixed here rather than by the
operator's configuration, and without the variables that would point git at another repository.
Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator, Mapping

GIT_TIMEOUT_S = 120.0
# Variables that would make git look somewhere other than the work tree around ``root``.
_GIT_LOCATION = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")


class GitListing:
    """A NUL-separated path listing of ``git -C root ARGS`` (``ls-files``, ``diff-files``), read
    as it is written (so the caller stats paths while git still looks for more). After
    :meth:`batches` is exhausted, ``ok`` says whether git gave a view of ``root`` (with
    ``empty_ok``, an empty listing is one). How metadata is compared is fixed here, not by the
    operator's configuration (``core.checkStat``, ``core.trustctime``)."""

    def __init__(self, root: str, args: list[str], env: Mapping[str, str] | None, empty_ok: bool = False) -> None:
        self.argv = ["git", "-c", "core.fsmonitor=false", "-c", "core.checkStat=default", "-c", "core.trustctime=true",
                     "-C", root, *args]
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k not in _GIT_LOCATION}
        self.env["GIT_NO_REPLACE_OBJECTS"] = "1"  # refs/replace/ would let a commit stand for another
        self.empty_ok = empty_ok
        self.ok = False
        self._proc: subprocess.Popen | None = None

    def start(self) -> GitListing:
        """Start git now (so several listings run at once); :meth:`batches` reads it."""
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, env=self.env)
            except OSError:  # no git
                pass
        return self

    def close(self) -> None:
        """End git if it still runs (its listing unread) and reap it: a listing given up on leaves no
        process behind, which Python would report as a ``ResourceWarning`` in whatever test runs then."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    @classmethod
    def files(cls, root: str, only: list[str] | None, env: Mapping[str, str] | None,
              *which: str, empty_ok: bool | None = None) -> GitListing:
        """``git ls-files -z WHICH --exclude-standard [-- ONLY]`` (``--cached``, ``--others``); an empty
        listing is a view unless ``--cached`` is asked for (``empty_ok`` decides where given)."""
        args = ["ls-files", "-z", *which, "--exclude-standard"]
        if only is not None:
            args += ["--", *(f":(literal){name}" for name in only)]
        return cls(root, args, env, empty_ok="--cached" not in which if empty_ok is None else empty_ok)

    def text(self) -> str | None:
        """Everything git wrote, when it exits 0 (within :data:`GIT_TIMEOUT_S`); else None."""
        proc = self.start()._proc
        if proc is None:
            return None
        try:
            out, _ = proc.communicate(timeout=GIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
        return os.fsdecode(out) if proc.returncode == 0 else None

    def batches(self) -> Iterator[list[str]]:
        proc = self.start()._proc
        if proc is None:
            return
        watchdog = threading.Timer(GIT_TIMEOUT_S, proc.kill)
        watchdog.daemon = True
        watchdog.start()
        listed, rest = False, b""
        try:
            assert proc.stdout is not None
            while chunk := proc.stdout.read1(1 << 16):
                *parts, rest = (rest + chunk).split(b"\0")
                if parts:
                    listed = True
                    yield os.fsdecode(b"\0".join(parts)).split("\0")
            self.ok = proc.wait() == 0 and (listed or self.empty_ok) and not rest
        finally:
            watchdog.cancel()
            self.close()


def ignored_listing(root: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> GitListing:
    """What git ignores under ``root``, started now (read it with :func:`read_ignored`): ``git ls-files --others
    --ignored --directory``, which names a wholly ignored directory once and does not look inside it."""
    return GitListing.files(os.fspath(root), None, env, "--others", "--ignored", "--directory", empty_ok=True).start()


def read_ignored(listing: GitListing) -> tuple[frozenset[str], tuple[str, ...]] | None:
    """The ignored files and the ignored directories (each with a trailing ``/``) of :func:`ignored_listing`,
    relative with ``/``; None where git gives no view."""
    names = [name for batch in listing.batches() for name in batch]
    if not listing.ok:
        return None
    return frozenset(n for n in names if not n.endswith("/")), tuple(n for n in names if n.endswith("/"))


def ignored(root: str | os.PathLike[str], path: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether git ignores ``path`` (under ``root``; it need not exist): False for a tracked path, outside
    a work tree, or without git."""
    rel = os.path.relpath(path, root)
    return rel in ignored_among(root, [rel], env)


def ignored_among(root: str | os.PathLike[str], paths: list[str], env: Mapping[str, str] | None = None) -> set[str]:
    """Which of ``paths`` (relative to ``root``; a trailing ``/`` marks a directory, for a rule such as
    ``build/``; they need not exist) git ignores: none of a tracked path, outside a work tree, or without git.
    One ``git check-ignore --stdin``, run as the listings are (:class:`GitListing`'s command and environment)."""
    if not paths:
        return set()
    git = GitListing(os.fspath(root), ["check-ignore", "--stdin", "-z"], env)
    try:
        done = subprocess.run(git.argv, input=os.fsencode("\0".join(paths) + "\0"), capture_output=True,
                              env=git.env, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):  # no git
        return set()
    if done.returncode not in (0, 1):  # 1: none ignored; 128: no work tree
        return set()
    return {name for name in os.fsdecode(done.stdout).split("\0") if name}
