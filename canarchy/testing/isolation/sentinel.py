"""The sentinel: the checkout and the operator's state looked at before and after the run, and what changed.

Each look compares the manifests of :mod:`~canarchy.testing.isolation.tree` and names the writer the access
guard saw; the last look, after pytest's work, also stops what was left running and ends the process when
it finds anything. Design: ``docs/design/test-isolation.md`` ("Layer 5: the sentinel").
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import pytest

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import descriptors as _descriptors
from canarchy.testing.isolation import bytecode as _bytecode
from canarchy.testing.isolation import checkout as _checkout
from canarchy.testing.isolation import containment as _containment
from canarchy.testing.isolation import gitlisting as _git
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import listeners as _listeners
from canarchy.testing.isolation import loadable as _loadable
from canarchy.testing.isolation import reaper as _reaper
from canarchy.testing.isolation import tree as _tree
from canarchy.testing.isolation.exits import _REAL_EXIT
from canarchy.testing.isolation.refusal import Access
from canarchy.testing.isolation.pertest import _remember_writes, unseen_writes
from canarchy.testing.isolation.plan import _pytest_s_own_trees
from canarchy.testing.isolation.session import _SESSION_END, _START_UP, _guarded_manifest, _Run


def _refused(owner: str | None = None) -> list[str]:
    """The messages of both guards' refusals (``owner``'s only, when given), taken."""
    return ([r.message() for r in _guard.GUARD.take_refusals(owner)]
            + [a.message() for a in _access.GUARD.take_refusals(owner)])


def _list_ignored(run: _Run, config: pytest.Config) -> None:
    """Start git listing what it ignores under the rootdir (once); ``run.ignored()`` reads it."""
    if run.ignored is None:
        with _access.GUARD.exempt():
            run.ignored = functools.cache(functools.partial(_git.read_ignored, _git.ignored_listing(
                config.rootpath, run.sandbox.tool_env)))


def _own_outputs(run: _Run, config: pytest.Config) -> frozenset[str]:
    """The run's own reports, relative to the rootdir: pytest's ``--junitxml`` and what
    :data:`~canarchy.testing.isolation.tree.OWN_OUTPUT_VARIABLE` names, and pytest's own trees (its cache,
    ``--basetemp``), each with the directories it is in (made for it during the run, and one at a top of
    ``sys.path`` is recorded). The sentinel leaves them out."""
    root = os.path.realpath(config.rootpath)
    named = [getattr(config.option, "xmlpath", None),
             *run.sandbox.operator_env.get(_tree.OWN_OUTPUT_VARIABLE, "").split(os.pathsep)]
    full = [os.path.realpath(os.path.join(config.invocation_params.dir, p)) for p in named if p]
    own = set()
    for path in [*full, *map(os.path.realpath, _pytest_s_own_trees(config))]:
        while path.startswith(root + os.sep):
            own.add(os.path.relpath(path, root))
            path = os.path.dirname(path)
    return frozenset(own)


def _checkout_manifest(run: _Run, root: Path) -> dict:
    """The checkout as git sees it (what differs from its index, and the untracked files it does
    not ignore), git run with the operator's environment but the scrubbed variables (their global configuration:
    ``safe.directory``, ``core.excludesFile``); and, ignored or not, what a later run loads unasked or imports
    at the top of the checkout and of ``run.search_dirs`` and git's rules in each directory of its view."""
    state = _checkout.checkout_state(root, env=run.sandbox.tool_env, search_dirs=run.search_dirs,
                                     previous=run.checkout_before)
    for path in run.own_outputs:
        if not os.path.islink(root / path):  # a link made there has the next run write where it leads
            state.pop(path, None)
    return state


def _search_dirs(root: Path) -> tuple[str, ...]:
    """The directories under ``root`` on ``sys.path`` now (a ``src`` layout's, the tests'), relative."""
    top = os.path.realpath(root)
    found = (os.path.realpath(entry or os.curdir) for entry in sys.path if isinstance(entry, str))
    return tuple(dict.fromkeys(os.path.relpath(d, top) for d in found if d.startswith(top + os.sep)))


def _ignored_code(run: _Run, config: pytest.Config, candidates: list[Path]) -> str | None:
    """The first of ``candidates`` (paths pytest would import) that exists where git ignores it, relative to the
    rootdir; None when there is none, or git gives no view."""
    if run.ignored is None:
        return None
    with _access.GUARD.exempt():
        known = run.ignored()
    if known is None:
        return None
    files, directories = known
    for candidate in candidates:
        try:
            rel = candidate.relative_to(config.rootpath).as_posix()
        except ValueError:
            continue
        if rel in files or (rel.startswith(directories) and os.path.lexists(candidate)):
            return rel
    return None


def _ignored_code_message(rel: str, outcome: str) -> str:
    return (f"canarchy test isolation: {rel} is code pytest would import from where git ignores it, so no sentinel "
            f"sees it change (a process could plant it there for the next run unseen); {outcome}. Stop ignoring it "
            f"in git, or keep pytest out of it: --ignore={rel} in addopts (a generated module, such as a _version.py "
            "under --doctest-modules), norecursedirs or testpaths (a directory).")


def _changes(run: _Run, config: pytest.Config, who: str) -> list[str]:
    """What changed of the operator's state and of the checkout since the last look, naming the
    writer where the access guard saw it; the states seen now become the baselines of the next look."""
    lines = []
    with _access.GUARD.exempt():
        if run.home_before is not None:
            # what the mount view made unreachable: its covers checked; everything else guarded: compared
            now = _guarded_manifest(run)
            diff = _tree.changes(run.home_before, now)
            diff += _covers_broken(run.containment) if run.unreached else []
            run.home_before = now
            if diff:
                lines.append(f"{who} changed the operator's state:")
                lines.extend(f"  {line}" + _writer(run, line) for line in diff)
        if run.checkout_before is not None:
            now = _checkout_manifest(run, config.rootpath)
            forged = _settle_bytecode(run, run.checkout_before, now, config)
            diff, run.checkout_before = _tree.changes(run.checkout_before, now), now
            if diff or forged:
                lines.append(f"{who} changed the checkout ({config.rootpath}):")
                lines.extend(f"  {line}" + _writer(run, line, config.rootpath) for line in diff)
                lines.extend(forged)
            hidden = _hidden_writes(run, config)
            if hidden:
                lines.append(f"{who} left in the checkout, where git does not show it (ignored, or in a repository "
                             "of its own), so no sentinel sees it and a later run may load it:")
                lines.extend(hidden)
    return lines


def _hidden_writes(run: _Run, config: pytest.Config) -> list[str]:
    """What the access guard saw written into the checkout outside a test's own body (at collection, by a
    fixture of a wider scope, by a thread a test left running) and git does not show: each test's own are
    its teardown's (:func:`~canarchy.testing.isolation.pertest._hidden_leftovers`); pytest's and its plugins'
    at their start-up and at the session's end (pytest-benchmark's ``.benchmarks``, a coverage data file) are
    the operator's tooling's. Each path is named once."""
    root = os.path.realpath(config.rootpath)
    written = {os.path.relpath(path, root): owner for path, owner in run.writes.items()
               if owner not in (_START_UP, _SESSION_END) and path not in run.hidden_named
               and os.path.relpath(path, root) not in run.own_outputs}
    found = unseen_writes(run, config, [os.path.join(root, rel) for rel in written])
    return [f"  {rel} (written by {written[rel]})" for rel in found]


def _settle_bytecode(run: _Run, before: dict, now: dict, config: pytest.Config) -> list[str]:
    """Byte code in a ``__pycache__`` that came, changed or went since ``before`` is no change when it is
    the compilation of its source (the import system's, or pytest's assertion rewrite: every first run
    writes it). Any other (a shell child's copy, a forged header) is removed, left out of both states and
    returned as a line: a later import would run it. Compiles only what changed, and not what the per-test
    check already compared and nothing changed since (``run.settled_bytecode``)."""
    root = os.path.realpath(config.rootpath)
    for rel in [r for r in before.keys() - now.keys() if r.endswith(".pyc") and "__pycache__/" in r]:
        del before[rel]
    forged = []
    for rel, entry in list(now.items()):
        if before.get(rel) == entry or not rel.endswith(".pyc") or "__pycache__/" not in rel:
            continue
        path = os.path.join(root, rel)
        why = None if run.settled_bytecode.get(path) == _bytecode.signature(entry) else _bytecode.mismatch(path, config)
        if why is None:
            before[rel] = entry
            continue
        try:
            os.remove(path)
            done = "removed"
        except OSError as exc:
            done = f"not removed: {exc.strerror or exc}"
        before.pop(rel, None)
        del now[rel]
        forged.append(f"  byte code at {rel}: {why}; {done} (the next import of its module would have run it)"
                      + _written_by(run, str(config.rootpath / rel)))
    return forged


def _after_the_session(run: _Run, config: pytest.Config, cut_short: str | None = None) -> None:
    """The sentinel's last look, when pytest is the program, at the end of ``pytest_unconfigure``: the
    processes left running are stopped, and what was refused or changed since the session's end is
    printed and ends the process with exit code 1. ``cut_short``: the look taken early, because something
    called ``os._exit`` before the run ended."""
    lines = run.last_lines  # shared with _after_the_verdict, should something end the process during this look
    lines += [cut_short] if cut_short else []
    lines += _mounts_made_during_the_run(run)  # first: one over /proc/PID hides a process from what follows
    helpers = _multiprocessing_helpers()
    lines += [f"left running after the session, stopped now: {line}"
              for line in _reaper.stop_children(keep=helpers, owners=run.process_owners)]
    if helpers and not cut_short:
        _end_helpers_at_exit(run, helpers)
    lines += _refused()
    _remember_writes(run, _access.GUARD.take_watched())
    lines += _left_open_for_writing(run, config)
    lines += _changes(run, config, "the run, until it was cut short," if cut_short else
                      "after the session, a plugin, a thread or a process left running")
    if not lines:
        return
    sys.stdout.flush()
    when = "the run was cut short" if cut_short else "after the session (pytest had returned)"
    capture = config.pluginmanager.getplugin("capturemanager")
    if cut_short and capture is not None:  # a test's os._exit: its output is captured, this is not
        capture.suspend_global_capture(in_=False)
    status = run.exit_status or 1  # pytest's own, where it failed already (2: interrupted)
    sys.stderr.write(f"\ncanarchy isolation sentinel, {when}:\n" + "\n".join(lines)
                     + f"\nthe run fails (exit code {status})\n")
    sys.stderr.flush()
    run.sandbox.cleanup()
    _REAL_EXIT(status)


def _left_open_for_writing(run: _Run, config: pytest.Config) -> list[str]:
    """Descriptors of this process still open for writing on a file in the checkout (not its standard streams,
    not the run's own reports, not a file already removed: pytest's capture in a ``TMPDIR`` there), each named
    with the test that opened it: what is written through them later (a buffer flushed at exit, a thread's
    ``os.write``) raises no audit event. Naming one fails the run, which ends at once (``os._exit``): nothing is
    flushed or written after."""
    root = os.path.realpath(config.rootpath)
    found = []
    for fd, status in sorted(_descriptors.open_descriptors()):
        path = _descriptors.descriptor_path(fd) or "?"
        if fd > 2 and status.st_nlink and path.startswith(root + os.sep) and _descriptors.opened_for_writing(fd) and (
                rel := os.path.relpath(path, root)) not in run.own_outputs:
            owner = run.writes.get(path)
            found.append(f"left open for writing in the checkout: {rel}" + (f" (opened by {owner})" if owner else ""))
    return found


def _after_the_verdict(run: _Run, config: pytest.Config, access: Access) -> None:
    """``GUARD.late`` after the last look: an access that would change what the look saw (a refusal, a
    process started, an ``os._exit`` with another status, a write into the checkout git does not ignore)
    ends the process at once with exit code 1, named. A file git ignores at the top of the rootdir (a coverage
    data file) passes, but not one below it (a virtualenv's ``bin/activate``) nor what an import runs (an
    extension module: git ignores ``*.so``, and one runs ahead of its ``.py``)."""
    root = os.path.realpath(config.rootpath)
    if access.zone == "watched" and os.path.dirname(access.resolved) == root and not access.resolved.endswith(
            _loadable.IMPORTABLE_SUFFIXES) and _git.ignored(root, access.resolved, run.sandbox.tool_env):
        return
    sys.stdout.flush()
    found = "".join(f"{line}\n" for line in run.last_lines)  # what the last look had found, if it was under way
    sys.stderr.write(f"\ncanarchy isolation sentinel, after the session (after its last look):\n{found}"
                     f"{access.message()}\nthe run fails (exit code 1)\n")
    sys.stderr.flush()
    _REAL_EXIT(1)


def _mounts_made_during_the_run(run: _Run) -> list[str]:
    """The mounts a test's process made in the run's mount view (its caps there allow new mounts on top of
    the locked ones), each detached now and named: a tmpfs over ``/proc/PID`` hides that process from the
    last look, one over ``/proc`` or this process's entry hides them all (then detached until the table
    reads as procfs's again). Nothing without the mount view."""
    start = run.mounts_at_start
    if start is None:
        return []
    lines: list[str] = []
    now = _containment.mount_table(run.proc_device)
    for point in (f"/proc/{os.getpid()}", "/proc") * 4:
        if now is not None:
            break
        try:
            _containment.kernel.umount2(point, _containment.kernel.MNT_DETACH)
        except OSError:
            continue
        lines.append(f"a mount made during the run, removed: one over {point} (it hid the mount table)")
        now = _containment.mount_table(run.proc_device)
    if now is None:
        return [*lines, "the mount table cannot be read: /proc stays mounted over, so no process can be trusted"]
    added = sorted(((point, kind) for mount, (point, kind) in now.items() if mount not in start),
                   key=lambda entry: -entry[0].count("/"))  # the deepest first
    for point, kind in added:
        try:
            _containment.kernel.umount2(point, _containment.kernel.MNT_DETACH)
            done = "removed"
        except OSError as exc:
            done = f"not removed: {exc.strerror}"
        lines.append(f"a mount made during the run, {done}: {kind} on {point}")
    return lines


def _multiprocessing_helpers() -> set[int]:
    """The processes ``multiprocessing`` keeps until the interpreter exits (its resource tracker and
    forkserver end when their pipe closes, at exit): not left running by a test. What a forkserver
    started is (``multiprocessing.resource_tracker``, ``multiprocessing.forkserver``; CPython 3.11).
    The pids come from ``multiprocessing``'s own state, which a test can set: one counts only when it is
    a child of this process running that module's ``main`` as ``multiprocessing`` starts it (``-c``) and
    holding the other end of the pipe ``multiprocessing`` keeps for it (and :func:`_end_helpers_at_exit`
    checks that it ends when that pipe closes)."""
    helpers = set()
    for module, holder, pid_name, fd_name in _HELPER_PIPES:
        state = getattr(sys.modules.get(module), holder, None)
        pid, fd = getattr(state, pid_name, None), getattr(state, fd_name, None)
        if isinstance(pid, int) and isinstance(fd, int) and _runs_the_main_of(pid, module) \
                and _holds_the_other_end(pid, fd):
            helpers.add(pid)
    return helpers


def _holds_the_other_end(pid: int, fd: int) -> bool:
    """Whether process ``pid`` has open the pipe that this process's ``fd`` is an end of (Linux: the
    ``pipe:[INODE]`` links under ``/proc/PID/fd``): the helper ``multiprocessing`` started reads it."""
    try:
        pipe = os.readlink(f"/proc/self/fd/{fd}")
        return pipe.startswith("pipe:") and pipe in _listeners.descriptor_links(pid)
    except OSError:
        return False


#: Where ``multiprocessing`` keeps each helper's pid and its end of the helper's pipe (CPython 3.11-3.13).
_HELPER_PIPES = (("multiprocessing.resource_tracker", "_resource_tracker", "_pid", "_fd"),
                 ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid", "_forkserver_alive_fd"))
#: How long a helper has to end once its pipe is closed (a real one ends within milliseconds).
HELPER_GRACE_S = 2.0


def _end_helpers_at_exit(run: _Run, helpers: set[int]) -> None:
    """At exit, after ``multiprocessing``'s own exit function (moved behind this check, which runs it first),
    close this process's end of each helper's pipe, as the process's end would: a real helper then ends
    within :data:`HELPER_GRACE_S`. One that does not, or a process it left behind (adopted by this one,
    the subreaper), only looked like a helper (its pid set in ``multiprocessing``'s state by a test): it is
    stopped and named, and the run fails, before it can act once the run has ended."""
    import atexit

    util = sys.modules.get("multiprocessing.util")
    exit_function = getattr(util, "_exit_function", None)
    if exit_function is not None:
        atexit.unregister(exit_function)

    def check() -> None:
        if exit_function is not None:
            exit_function()
        for module, holder, pid_name, fd_name in _HELPER_PIPES:
            state = getattr(sys.modules.get(module), holder, None)
            if getattr(state, pid_name, None) in helpers and isinstance(getattr(state, fd_name, None), int):
                try:
                    os.close(getattr(state, fd_name))
                except OSError:
                    pass
                setattr(state, fd_name, None)
        deadline = time.monotonic() + HELPER_GRACE_S
        waiting = set(helpers)
        while waiting and time.monotonic() < deadline:
            waiting = {pid for pid in waiting if not _reaper._gone(pid)}
            if waiting:
                time.sleep(0.01)
        left = _reaper.stop_children(owners=run.process_owners)
        if not left:
            return
        sys.stdout.flush()
        sys.stderr.write("\ncanarchy isolation sentinel, at exit (after multiprocessing's own exit):\n"
                         + "".join(f"left running as if multiprocessing's helper, stopped now: {line}\n"
                                   for line in left) + "the run fails (exit code 1)\n")
        sys.stderr.flush()
        _REAL_EXIT(1)

    atexit.register(check)


def _runs_the_main_of(pid: int, module: str) -> bool:
    """Whether ``pid`` is a child of this process started as ``python [flags] -c 'from MODULE import main;...'``."""
    if (_reaper.parent_and_state(pid) or (0, ""))[0] != os.getpid():
        return False
    argv = _reaper.arguments(pid) or []
    code = argv[argv.index(b"-c") + 1] if b"-c" in argv[:-1] else b""
    return code.startswith(f"from {module} import main;".encode())


def _covers_broken(report: _containment.Report) -> list[str]:
    """Under the containment the operator's state is out of reach: only check that each cover
    is still an empty view and each missing path still missing (metadata, nothing read)."""
    broken = []
    for path in report.covered:
        try:
            empty = not os.listdir(path) if os.path.isdir(path) else os.stat(path).st_size == 0
        except OSError:
            empty = False
        if not empty:
            broken.append(f"changed: {path} (its empty read-only cover is gone)")
    broken += [f"added: {path} (it could not be created under the containment)" for path in report.uncreatable
               if os.path.lexists(path)]
    return broken


def _writer(run: _Run, line: str, root: Path | None = None) -> str:
    """`` (written by OWNER)`` for the path of a change ``line`` (relative to ``root`` when given), or ""."""
    path = line.split(":", 1)[1].strip().split(" (", 1)[0]
    return _written_by(run, str(root / path) if root is not None else path)


def _written_by(run: _Run, full: str) -> str:
    owner = run.writes.get(full) or next((o for p, o in run.writes.items() if p.startswith(full + os.sep)), None)
    return f" (written by {owner})" if owner else ""
