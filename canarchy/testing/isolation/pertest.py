"""The plugin's per-test layer: its two autouse fixtures and the fixtures tests ask for.

``isolate_canarchy_state`` gives each test a fresh home and working directory and puts the
process state back; ``guard_operator_access`` switches the guards to the test and fails it for
what they refused. Design: ``docs/design/test-isolation.md`` (layers 2 and 3).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading

import pytest

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import bytecode as _bytecode
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import reaper as _reaper
from canarchy.testing.isolation import tree as _tree
from canarchy.testing.isolation.events import REMOVALS
from canarchy.testing.isolation.procstate import STATE as _STATE
from canarchy.testing.isolation.sandbox import HOME_VARIABLES, SandboxView, changes_since
from canarchy.testing.isolation.refusal import CHECKOUT_WRITE_PROPERTY, EXPECTED_REFUSAL_PROPERTY, REFUSED_PROPERTY
from canarchy.testing.isolation.session import _BETWEEN_TESTS, _RUN, _SHUTDOWN_RECORDS, _Run, _opt_outs_of, _set_owners



def _checked_cache(config: pytest.Config) -> list[str]:
    """The byte code the import system cached in the checkout or a read-only tree since the last
    look, each compared with a compilation of its source by this plugin's own compiler: any
    other is removed and named (a test that changed the import machinery, even if it put it
    back, could have had its own code cached where a later import runs it)."""
    cached = _access.GUARD.take_cached()
    if not cached:  # every test asks
        return []
    problems = []
    run = config.stash.get(_RUN, None)
    with _access.GUARD.exempt():
        for path in dict.fromkeys(cached):
            why = _bytecode.mismatch(path, config)
            if not why and run is not None:
                with contextlib.suppress(OSError):
                    run.settled_bytecode[path] = _bytecode.signature(os.lstat(path))
            if why:
                with contextlib.suppress(OSError):
                    os.remove(path)
                problems.append(f"canarchy test isolation: byte code cached at {path}: {why}; removed (the import "
                                "system compiled something else than the source: its machinery was changed)")
    return problems


def _unsealed(run: _Run) -> list[str]:
    """What a test or fixture changed of the isolation itself (put back), python-can's hooks included."""
    if run.seal is None:
        return []
    run.seal.extend(_guard.patched_attributes())
    found = run.seal.broken()
    if getattr(_access.GUARD._local, "busy", False):
        found.append("the access guard told this thread was exempt")
        _access.GUARD._local.busy = False
    _access.GUARD.forget_resolutions()  # nothing it remembers of directories comes from before
    return found


def _run_of(request: pytest.FixtureRequest) -> _Run:
    """The session's run; a test fails, saying why, where the plugin's fixtures are registered but the plugin
    did not start (``-p no:canarchy.testing.isolation.plugin`` after the project's own ``-p``)."""
    run = request.config.stash.get(_RUN, None)
    if run is None:
        pytest.fail(f"canarchy test isolation: {request.node.nodeid} cannot be isolated: the plugin's fixtures are "
                    "here, but the plugin did not start in this run (disabled with -p no:...?). Run the suite with "
                    "the plugin; a test that needs the operator's environment is marked integration (or real_home, "
                    "real_bus) and run with -m.", pytrace=False)
    return run


def _opts_out(request: pytest.FixtureRequest, *markers: str) -> bool:
    run = _run_of(request)
    found = run.opt_outs.get(request.node.nodeid)
    return not (_opt_outs_of(request.node) if found is None else found).isdisjoint(markers)


def scrubbed_outside_text(names: list[str], run: _Run) -> str:
    """Why ``names``, set outside any test, are gone in a test."""
    prefixes = sorted({p for p in run.settings.scrub_prefixes for name in names if name.startswith(p)})
    return (f"removed {', '.join(names)}: set outside any test (a conftest, collection or a fixture wider than a "
            f"test) under canarchy_scrub_prefixes ({' '.join(prefixes)}), which every test runs without. Set it in "
            "the test or a function-scoped fixture (monkeypatch.setenv), or take its prefix out of "
            "canarchy_scrub_prefixes")


def _scrub_what_was_set_outside(request: pytest.FixtureRequest, run: _Run) -> None:
    """Remove the scrubbed variables set since the last test (by collection, a conftest, a wider-scoped
    fixture), naming each in this test's report and in the run's summary: a removal nobody asked for is a
    puzzle otherwise."""
    scrubbed = sorted(key for key in _STATE.changed_between_tests() if key.startswith(run.settings.scrub_prefixes))
    if not scrubbed:
        return
    removed = [key for key in scrubbed if key in os.environ]
    _STATE.quietly(dict.fromkeys(scrubbed))
    if removed:
        request.node.add_report_section("setup", "canarchy isolation", scrubbed_outside_text(removed, run))
        for key in removed:
            run.scrubbed_outside.setdefault(key, request.node.nodeid)


@pytest.fixture(autouse=True)
def isolate_canarchy_state(request: pytest.FixtureRequest):
    """Autouse, function scope: a fresh, empty home and working directory (or the rootdir, with
    ``canarchy_test_cwd = rootdir``); import-time paths re-pointed; afterwards every variable,
    signal handler, the umask and python-can's globals put back as they were, and a test that
    left one changed in a way it should not (``os.putenv``, a replaced ``os.environ``, a handler)
    fails, named. Stands down (the operator's environment and home) for ``integration`` and
    ``real_home`` tests. Yields the test's home directory."""
    run = _run_of(request)
    sandbox = run.sandbox
    cwd_before = os.getcwd()
    dirs = None
    frozen = run.opt_outs.get(request.node.nodeid)
    changed = frozen is not None and _opt_outs_of(request.node) != frozen
    _scrub_what_was_set_outside(request, run)
    if _opts_out(request, "integration", "real_home"):
        between = dict(os.environ)  # the session's, with what conftests and wider fixtures set since
        env = dict(sandbox.operator_env)
        keep = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_") if _opts_out(request, "integration") else (
            "PYTEST_CURRENT_TEST", "PYTEST_XDIST_", "PYTEST_CANARCHY_", "PYTHONPATH")
        env.update({k: v for k, v in between.items() if k.startswith(keep)})
        # what they set, as under plain pytest
        env.update({k: v for k, v in changes_since(sandbox.session_env, between).items() if v is not None})
        _STATE.quietly_apply(env)
        sandbox.rebase(sandbox.real_home)
        sandbox.restore_python_can()
        home = sandbox.real_home
    else:
        # Judged like the test's own code (not exempt): a test can replace what these call.
        home, cwd = dirs = sandbox.new_test_dirs()
        with _access.GUARD.exempt():
            _CHDIR(cwd if run.settings.test_cwd == "empty" else request.config.rootpath)
        _STATE.quietly(sandbox.home_environment(home))
        sandbox.rebase(home)
        sandbox.scrub_python_can()
    _STATE.begin()
    try:
        if changed:
            pytest.fail(f"canarchy test isolation: the opt-out markers of {request.node.nodeid} changed after "
                        f"collection (now {sorted(_opt_outs_of(request.node))}, collected with {sorted(frozen)}): "
                        "it runs as collected", pytrace=False)
        stuck = sandbox.take_stuck()
        if stuck:
            pytest.fail("canarchy test isolation: import-time paths under the operator's home that cannot be "
                        "re-pointed into the test's home (seen while setting up "
                        f"{request.node.nodeid}):\n" + "\n".join(f"  {s.name} = {s.value!r}: {s.reason}"
                                                               for s in stuck), pytrace=False)
        yield home
    finally:
        problems = _STATE.finish()
        with _access.GUARD.exempt():
            _CHDIR(cwd_before)
        if dirs is None:
            _STATE.quietly_apply({**between, **{k: v for k, v in os.environ.items() if k == "PYTEST_CURRENT_TEST"}})
        else:
            _STATE.quietly({key: sandbox.session_env.get(key) for key in HOME_VARIABLES})
        sandbox.rebase(sandbox.session_home)
        sandbox.scrub_python_can()
        if dirs is not None:
            with _access.GUARD.exempt():  # its own directories; a function a test replaced is still judged
                sandbox.release_test_dirs(*dirs)
    if problems:
        pytest.fail(f"canarchy test isolation: {request.node.nodeid} " + "; ".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def guard_operator_access(request: pytest.FixtureRequest):
    """Autouse, function scope: while the test runs, refuse every python-can bus but
    ``virtual`` and every read or write of the operator's state, at the moment of the
    attempt; at teardown fail the test for a refusal (even one the code under test caught),
    a bus it left open, or python-can's "was not properly shut down". A bus still open from
    outside the test (collection, import, a wider-scoped fixture) fails its setup and is shut
    down. The test's writes into the checkout are recorded in the JUnit report. The bus
    guard stands down for ``integration`` and ``real_bus`` tests, the access guard for
    ``integration`` and ``real_home`` tests. Yields the bus guard (see ``bus_guard``)."""
    run = _run_of(request)
    bus, files = _guard.GUARD, _access.GUARD
    nodeid = request.node.nodeid
    _fail_for_what_came_before(run, nodeid, request.config)
    bus_down, files_down = _opts_out(request, "integration", "real_bus"), _opts_out(request, "integration", "real_home")
    _set_owners(nodeid)
    bus.enabled, files.enabled = not bus_down, not files_down
    run.finished.discard(nodeid)  # a test run again in the session (a rerun plugin) is running now
    threads_before = set(_THREADS())  # the thread objects: an ended thread's id goes to the next one started
    plugins_before = _PLUGINS(request.config.pluginmanager)
    try:
        yield bus
    finally:
        switched = [name for name, g, down in (("bus", bus, bus_down), ("access", files, files_down))
                    if not g.enabled and not down]
        bus.enabled = files.enabled = True
        _set_owners(_BETWEEN_TESTS)
        _own_left_threads(nodeid, threads_before)
        _own_left_processes(run, nodeid)
        plugins = _unregister_left_plugins(request.config.pluginmanager, plugins_before)
    try:
        _fail_for_what_the_test_did(request, run, bus_down, files_down, switched, plugins)
    finally:
        run.finished.add(nodeid)  # from now on, what is refused in its name is late


def _own_left_processes(run: _Run, nodeid: str) -> None:
    """Name ``nodeid`` for each process below pytest still running at its end that no earlier test
    left (what the last look stops is named after it). One /proc scan, only while a process of the
    run may be alive (:attr:`~canarchy.testing.isolation.access.AccessGuard.others_relink`); when
    none is, no other process is left to make or move a link, and the access guard is told so."""
    if run.subreaper and _access.GUARD.others_relink:
        with _access.GUARD.exempt():
            running = _reaper.descendants()
        run.process_owners = {pid: run.process_owners.get(pid, nodeid) for pid in running}
        _access.GUARD.others_relink = bool(running)


_PLUGINS = pytest.PytestPluginManager.get_plugins  # taken at import: a test that replaced it could hide its plugin


def _unregister_left_plugins(manager: pytest.PytestPluginManager, before: set) -> list[str]:
    """The names of the pytest plugins registered since ``before`` and still registered, each unregistered now:
    a plugin a test left registered runs its hooks after it (in later tests, at the session's end), where no
    test's isolation is in force and what it does is named after nobody."""
    left = []
    for plugin in _PLUGINS(manager) - before:
        left.append(manager.get_name(plugin) or repr(plugin))
        manager.unregister(plugin)
    return sorted(left)


_CHDIR = os.chdir  # taken at import: the fixture's own moves are not judged, and a test cannot replace them
_THREADS = threading.enumerate  # taken at import: a test that replaced it could hide its threads


def _own_left_threads(nodeid: str, before: set[threading.Thread]) -> None:
    """Name ``nodeid`` in what a thread it started and left running does later (not the test that
    runs then); forget the threads that have ended. Threads are compared as objects: the id of
    one that ended (a timer of the plugin's, another test's) is reused by the next thread started.
    Both guards read the one map (``thread_owners``: id -> node id)."""
    alive = set(_THREADS())
    owners, threads = _guard.GUARD.thread_owners, _guard.GUARD.left_threads
    for ident in [i for i, thread in threads.items() if thread not in alive]:
        del owners[ident], threads[ident]
    for thread in alive - before:
        if thread.ident is not None and thread.ident not in owners:
            owners[thread.ident], threads[thread.ident] = nodeid, thread


def _refusal_messages(run: _Run, bus_refusals: list, accesses: list) -> list[str]:
    """The messages of both guards' refusals that fail the current test or phase. Those owned by a
    test that has ended (a thread or process it left running) go to the run's problems instead,
    naming that test."""
    now = []
    owned = [(r.nodeid, r.message()) for r in bus_refusals] + [(a.owner, a.message()) for a in accesses]
    for owner, message in owned:
        if owner in run.finished:
            if _LATE not in run.problems:
                run.problems.append(_LATE)
            run.problems.append(message)
        else:
            now.append(message)
    return now


_LATE = ("attempts refused after their test had ended, by a thread or process it left running "
         "(each names that test):")


def _fail_for_what_came_before(run: _Run, nodeid: str, config: pytest.Config) -> None:
    """Fail the setup of ``nodeid`` for what happened outside any test since the last one:
    refusals, a change to the isolation itself, a python-can bus still open (shut down here)."""
    bus, files = _guard.GUARD, _access.GUARD
    earlier = _refusal_messages(run, bus.take_refusals(), files.take_refusals())
    off = [f"{name} guard switched off" for name, g in (("bus", bus), ("access", files)) if not g.enabled]
    tampered = _unsealed(run) + off
    earlier += _checked_cache(config)
    if tampered:
        earlier.append("the isolation's own code or state was changed (put back): " + "; ".join(tampered))
    _remember_writes(run, files.take_watched())
    stale = bus.take_unclosed()
    for open_bus, _owner in stale:
        open_bus.shutdown()
    _SHUTDOWN_RECORDS.take()
    if earlier or stale:
        lines = [f"before {nodeid}, outside any test:", *earlier]
        lines += [f"a python-can bus {type(b).__name__}({getattr(b, 'channel_info', '?')}) opened by {owner} was "
                  f"still open when {nodeid} started: shut it down where it was opened (it is shut down now, "
                  "so none of its frames reach this test)" for b, owner in stale]
        pytest.fail("\n".join(lines), pytrace=False)


def _fail_for_what_the_test_did(request: pytest.FixtureRequest, run: _Run, bus_down: bool, files_down: bool,
                                switched: list[str], plugins: list[str] = ()) -> None:
    """Fail the test for its refusals (caught or not), a change to the isolation, a bus it left
    open, python-can's "not properly shut down" or pytest ``plugins`` it left registered; record its writes
    into the checkout."""
    bus, files = _guard.GUARD, _access.GUARD
    nodeid = request.node.nodeid
    tampered = _unsealed(run) + [f"{name} guard switched off" for name in switched]
    refused, watched = files.take()
    refusals = _refusal_messages(run, bus.take_refusals(), refused)
    refusals += _checked_cache(request.config)
    _remember_writes(run, watched)
    own = [access for access in watched if access.owner == nodeid]
    for access in own:
        request.node.user_properties.append((CHECKOUT_WRITE_PROPERTY, f"{access.operation} {access.resolved}"))
    hidden = _hidden_leftovers(run, request.config, own)
    removed = _hidden_removals(run, request.config, own)
    unclosed = bus.take_unclosed()
    for open_bus, _owner in unclosed:
        open_bus.shutdown()
    records = _SHUTDOWN_RECORDS.take()
    if bus_down and files_down and not tampered and not plugins:
        return
    if bus_down:
        unclosed, records = [], []
    for message in refusals:
        request.node.user_properties.append((REFUSED_PROPERTY, message.splitlines()[0] if message else message))
    if refusals or unclosed or records or tampered or hidden or removed or plugins:
        pytest.fail(_report(nodeid, refusals, [b for b, _ in unclosed], records, tampered, hidden, removed, plugins),
                    pytrace=False)


def _remember_writes(run: _Run, watched: list) -> None:
    for access in watched:
        run.writes.setdefault(access.resolved, access.owner)


def _hidden_leftovers(run: _Run, config: pytest.Config, writes: list) -> list[str]:
    """What a test wrote into the checkout and left where the sentinel cannot see it (relative to the
    rootdir): a path git ignores or does not list (:func:`~canarchy.testing.isolation.tree.unseen`)."""
    return unseen_writes(run, config, [a.resolved for a in writes])


def _hidden_removals(run: _Run, config: pytest.Config, writes: list) -> list[str]:
    """What a test removed from the checkout that it had not written itself, where git does not show it
    (an ignored report, a built wheel, ``.coverage``), relative to the rootdir: no later look finds it gone."""
    root = os.path.realpath(config.rootpath)
    written, removed = set(), []
    for access in writes:
        if access.operation not in REMOVALS:
            written.add(access.resolved)
        elif access.resolved not in written and not os.path.lexists(access.resolved):
            removed.append(os.path.relpath(access.resolved, root))
    return _not_shown(run, root, removed)


def _not_shown(run: _Run, root: str, paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to ``root``) git does not show (:func:`~canarchy.testing.isolation.tree.unseen`)."""
    if not paths:
        return []
    with _access.GUARD.exempt():
        return _tree.unseen(root, paths, run.sandbox.tool_env)


def unseen_writes(run: _Run, config: pytest.Config, paths: list[str]) -> list[str]:
    """Those of ``paths`` (written, resolved) that are in the checkout, still there and not shown by git,
    relative to the rootdir; remembered in ``run.hidden_named`` (the session's end names no path twice)."""
    if not paths:
        return []
    root = os.path.realpath(config.rootpath)
    left = [os.path.relpath(p, root) for p in paths if p.startswith(root + os.sep) and os.path.lexists(p)]
    found = _not_shown(run, root, left)
    run.hidden_named.update(os.path.join(root, rel) for rel in found)
    return found


def _report(nodeid: str, refusals: list[str], unclosed: list, records: list[str], tampered: list[str],
            hidden: list[str] = (), removed: list[str] = (), plugins: list[str] = ()) -> str:
    parts = []
    if plugins:
        parts.append(f"canarchy test isolation: {nodeid} left pytest plugin(s) registered: {', '.join(plugins)}: "
                     "their hooks would run after it (in later tests, at the session's end), outside any test's "
                     "isolation and named after nobody; unregistered now. Unregister a plugin where the test "
                     "registered it (or in a fixture's teardown).")
    if tampered:
        parts.append(f"canarchy test isolation: {nodeid} changed the isolation's own code or state (put back for "
                     "the tests after it): " + "; ".join(tampered))
    if refusals:
        parts.append(f"{len(refusals)} attempt(s) refused (the error may have been caught):")
        parts.extend(refusals)
    if unclosed:
        parts.append(f"{nodeid} left {len(unclosed)} python-can bus(es) open: "
                     + ", ".join(f"{type(b).__name__}({getattr(b, 'channel_info', '?')})" for b in unclosed)
                     + ". Shut each bus down (`with bus:` or bus.shutdown()).")
    if records:
        parts.append(f"python-can logged during {nodeid}: " + "; ".join(records))
    if hidden:
        parts.append(f"canarchy test isolation: {nodeid} left in the checkout, where git does not show it (ignored, "
                     "or in a repository of its own), so no sentinel sees it and a later run may load it: "
                     + ", ".join(hidden) + ". Remove it; tests write to tmp_path, never into the working tree.")
    if removed:
        parts.append(f"canarchy test isolation: {nodeid} removed from the checkout what git does not show (ignored, "
                     "or not yet added), so no later look finds it gone: " + ", ".join(removed)
                     + ". Tests write to tmp_path, never into the working tree.")
    return "\n".join(parts)


class ExpectedRefusals:
    """What a test that expects a refusal is given of a guard: :meth:`take_refusals`, nothing else (the
    records of writes into the checkout, the switch and the configuration stay the plugin's)."""

    __slots__ = ("_node", "_take")

    def __init__(self, take, node: pytest.Item) -> None:
        self._take, self._node = take, node

    def take_refusals(self, nodeid: str | None = None) -> list:
        """This test's refusals so far, which then no longer fail it (``nodeid``: this test's id, or
        None); each stays in its JUnit report as an ``EXPECTED_REFUSAL_PROPERTY`` property."""
        if nodeid not in (None, self._node.nodeid):
            raise ValueError(f"{self._node.nodeid} may take its own refusals only, not those of {nodeid}")
        taken = self._take(self._node.nodeid)
        self._node.user_properties += [(EXPECTED_REFUSAL_PROPERTY, r.message().splitlines()[0]) for r in taken]
        return taken


@pytest.fixture
def bus_guard(request: pytest.FixtureRequest) -> ExpectedRefusals:
    """The bus guard's refusals of this test: ``bus_guard.take_refusals()``, for a test that expects one."""
    return ExpectedRefusals(_guard.GUARD.take_refusals, request.node)


@pytest.fixture
def access_guard(request: pytest.FixtureRequest) -> ExpectedRefusals:
    """The access guard's refusals of this test: ``access_guard.take_refusals()``, for a test that expects one."""
    return ExpectedRefusals(_access.GUARD.take_refusals, request.node)


_virtual_channels = itertools.count(1)


def new_virtual_channel() -> str:
    """A python-can ``virtual`` channel name not handed out before in this run (the pid keeps
    xdist workers apart)."""
    return f"canarchy-test-{os.getpid()}-{next(_virtual_channels)}"


@pytest.fixture
def virtual_channel() -> str:
    """A python-can ``virtual`` channel name no other test uses (str)."""
    return new_virtual_channel()


@pytest.fixture(scope="session")
def canarchy_sandbox(request: pytest.FixtureRequest) -> SandboxView:
    """The session's :class:`~canarchy.testing.isolation.sandbox.SandboxView` (its root, the homes)."""
    return SandboxView(_run_of(request).sandbox)
