"""canarchy's hermetic pytest plugin: load it with ``-p canarchy.testing.isolation.plugin``.

Named with ``-p`` (in ``addopts``), its session layer starts in
``pytest_load_initial_conftests``, before any conftest is imported; loaded
by a conftest's ``pytest_plugins`` only, in ``pytest_configure``. The layers,
their requirements and tests: ``docs/design/test-isolation.md``; the options
an adopting project sets: ``docs/adopting.md``.
"""

from __future__ import annotations

import ast
import functools
import logging
import os
import sys
from pathlib import Path

import pytest

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import bytecode as _bytecode
from canarchy.testing.isolation import containment as _containment
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import reaper as _reaper
from canarchy.testing.isolation.procstate import STATE as _STATE
from canarchy.testing.isolation import tree as _tree
from canarchy.testing.isolation.session import (_ACTIVE, _AT_EXIT, _BETWEEN_TESTS, _CONFTESTS, _RUN, _SESSION_END,
                                                _SHUTDOWN_RECORDS, _START_UP, MARKERS, _check_configuration,
                                                _guarded_manifest, _opt_outs_of, _Run, _set_owners, _start,
                                                active_sandbox, require_containment)
from canarchy.testing.isolation.settings import _is_worker, _markexpr, add_options, asks_for
from canarchy.testing.isolation.exits import _REAL_EXIT, _the_process_ends_with
from canarchy.testing.isolation.pertest import (CHECKOUT_WRITE_PROPERTY, _checked_cache, _refusal_messages,
                                                _remember_writes, access_guard, bus_guard, canarchy_sandbox,
                                                guard_operator_access, isolate_canarchy_state, new_virtual_channel,
                                                unseen_writes, virtual_channel)

# What a project's conftest or test imports from here; the fixtures, so that pytest registers them with the plugin.
__all__ = ["CHECKOUT_WRITE_PROPERTY", "DESELECTED_PROPERTY", "ISOLATION_PROPERTY", "MARKERS", "REQUIRED_MODULE",
           "access_guard", "active_sandbox", "asks_for", "bus_guard", "canarchy_sandbox", "guard_operator_access",
           "isolate_canarchy_state", "new_virtual_channel", "require_containment", "virtual_channel"]

#: JUnit test-suite property naming each test the plugin deselected (lanes read it, not pytest's summary).
DESELECTED_PROPERTY = "canarchy_deselected"
#: JUnit test-suite property every run under the plugin carries (what is in force): the lanes
#: refuse a report without it from a project whose configuration loads the plugin.
ISOLATION_PROPERTY = "canarchy_isolation"
REQUIRED_MODULE = "canarchy.testing.required"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """The earliest start: before the initial conftest.py files are imported (an xdist worker
    waits for ``pytest_configure``: the controller's view of the operator arrives there)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _begin(early_config, "before the initial conftests are imported")
        _set_owners(_CONFTESTS)
        run = early_config.stash[_RUN]
        _list_ignored(run, early_config)
        found = _ignored_code(run, early_config, _initial_conftests(early_config))
        if found is not None:
            raise pytest.UsageError(_ignored_code_message(found, "refused before it was imported"))


def _initial_conftests(config: pytest.Config) -> list[Path]:
    """The conftests pytest imports before collection (``_pytest.config.PytestPluginManager._try_load_conftest``):
    under each directory the run starts from (its arguments, else ``testpaths``, else the invocation directory),
    its ``conftest.py``, those of the directories above it up to the rootdir, and ``test*/conftest.py``."""
    here = config.invocation_params.dir
    named = [a.split("::")[0] for a in config.args if not a.startswith("-")] if config.args else []
    anchors = [here / a for a in named] or [here / p for p in config.getini("testpaths")] or [here]
    found: list[Path] = []
    for anchor in anchors:
        anchor = anchor if anchor.is_dir() else anchor.parent
        found += [d / "conftest.py" for d in (anchor, *anchor.parents) if d.is_relative_to(config.rootpath)]
        found += sorted(anchor.glob("test*/conftest.py"))
    return list(dict.fromkeys(found))


def _begin(config: pytest.Config, where: str) -> None:
    _start(config, where)
    run = config.stash[_RUN]
    run.last_look = functools.partial(_after_the_session, run, config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if _RUN not in config.stash:
        late = "in this pytest-xdist worker" if _is_worker(config) else (
            "at pytest_configure: a conftest loaded the plugin, so the top of the initial conftests ran "
            "outside it (load it with -p canarchy.testing.isolation.plugin for the earliest start)")
        _begin(config, late)
    _set_owners(_START_UP)
    _check_configuration(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: hand each worker the operator's environment (the controller's own is scrubbed)."""
    node.workerinput["canarchy_operator_env"] = node.config.stash[_RUN].sandbox.operator_env


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The end of pytest's work. When pytest is the program, the sentinel's last look, then the guard
    stays on until the process ends, and what would still change anything ends it (:func:`_after_the_verdict`)."""
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    if _the_process_ends_with(config):
        _guard.GUARD.owner = _access.GUARD.owner = _AT_EXIT
        _guard.GUARD.report_dir = _access.GUARD.report_dir = None
        run.sandbox.cleanup()
        _ACTIVE.clear()
        look, run.last_look = run.last_look, None
        sys.dont_write_bytecode = True  # nothing compares byte code with its source from now on
        _access.GUARD.late = functools.partial(_after_the_verdict, run, config)  # during the look too
        if look is not None:
            look()  # exits 1 when it finds anything
        return
    _guard.GUARD.enabled = False
    _guard.GUARD.report_dir = None
    _access.GUARD.enabled = False
    _access.GUARD.report_dir = None
    logging.getLogger("can.bus").removeHandler(_SHUTDOWN_RECORDS)
    _STATE.quietly_apply(run.sandbox.operator_env)
    run.sandbox.restore_python_can()
    run.sandbox.cleanup()
    _ACTIVE.clear()


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(_RUN, None)
    if run is None:
        return []
    lines = [f"canarchy isolation: session layer started {run.started}",
             f"canarchy isolation: network: {run.network_note or 'the host’s'}",
             "canarchy isolation: access guard: refuses reads and writes of the operator's state "
             f"({len(run.guarded)} paths) and writes under {', '.join(run.homes) or 'no home'}"]
    if run.containment is not None:
        lines += run.containment.header_lines()
    elif not _is_worker(config):
        lines.append("canarchy isolation: containment: off (canarchy_containment is false)")
    return lines + [f"canarchy isolation: {note}" for note in run.header]


def _refused(owner: str | None = None) -> list[str]:
    """The messages of both guards' refusals (``owner``'s only, when given), taken."""
    return ([r.message() for r in _guard.GUARD.take_refusals(owner)]
            + [a.message() for a in _access.GUARD.take_refusals(owner)])


def pytest_collectstart(collector: pytest.Collector) -> None:
    _set_owners(f"<collection of {collector.nodeid or 'the session'}>")


def _imports_required(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return True  # pytest reports a module it cannot read itself
    return any(isinstance(node, ast.Import) and any(a.name == REQUIRED_MODULE for a in node.names)
               for node in tree.body)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A refusal made while a module is collected (module-level code) fails that module's
    collection with the guard's message; with ``canarchy_require_import``, so does a test
    module that does not import :data:`REQUIRED_MODULE`."""
    owner = f"<collection of {collector.nodeid or 'the session'}>"
    _set_owners(owner)
    report = yield
    messages = _refused(owner)
    run = collector.config.stash.get(_RUN, None)
    if (run is not None and run.settings.require_import and isinstance(collector, pytest.Module)
            and not _imports_required(collector.path)):
        messages.append(f"{collector.nodeid} does not import {REQUIRED_MODULE} (canarchy_require_import is on): "
                        f"add `import {REQUIRED_MODULE}  # noqa: F401` at its top, so it cannot run without "
                        "the isolation")
    if messages and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = "\n".join(messages)
    return report


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect every test carrying an opt-out marker (:data:`MARKERS`) unless the ``-m``
    expression asks for each of the opt-out markers it carries (:func:`asks_for`): a plain
    ``pytest`` runs only tests that touch nothing of the operator's. Last, after the hooks that mark
    tests; each kept test's opt-outs are frozen here (one added later changes nothing, and is named)."""
    _set_owners(_BETWEEN_TESTS)
    markexpr = _markexpr(config)
    asked = {name for name in MARKERS if asks_for(markexpr, name)}
    kept, dropped, frozen = [], [], {}
    for item in items:
        outs = _opt_outs_of(item)
        if outs <= asked:
            kept.append(item)
            frozen[item.nodeid] = outs
        else:
            dropped.append(item)
    run = config.stash.get(_RUN, None)
    if run is not None:
        run.opt_outs = frozen
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        _junit_suite_properties(config, [(DESELECTED_PROPERTY, item.nodeid) for item in dropped])


def _junit_suite_properties(config: pytest.Config, properties: list[tuple[str, str]]) -> None:
    """Add ``<property>`` elements to the run's JUnit report, if ``--junitxml`` writes one."""
    try:
        from _pytest.junitxml import xml_key  # the report's LogXML; not public API, hence the guard
    except ImportError:  # pragma: no cover - a pytest that moved it: the report just lacks them
        return
    xml = config.stash.get(xml_key, None)
    if xml is not None:
        for name, value in properties:
            xml.add_global_property(name, value)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Name the fixture in a refusal made while a wider-scoped fixture is set up; a refusal that
    failed the set-up is reported with the test that needed the fixture, and only there."""
    if fixturedef.scope == "function":
        return (yield)
    previous = _guard.GUARD.owner
    item = getattr(request, "_pyfuncitem", None)  # the test that needed the fixture
    needed_by = f", set up for {item.nodeid}" if item is not None else ""
    owner = f"{fixturedef.scope}-scoped fixture {fixturedef.argname!r}{needed_by}"
    # Finalizers run last-in first-out: these two bracket the fixture's own teardown.
    fixturedef.addfinalizer(lambda: _set_owners(_BETWEEN_TESTS))
    _set_owners(owner)
    try:
        return (yield)
    except BaseException as failed:
        # The set-up failed: pytest reports it with the test that needed the fixture. What the guards
        # refused meanwhile is part of that report (a note where the error is another), not the next test's.
        for message in _refused(owner):
            if message not in str(failed):
                failed.add_note(message)
        raise
    finally:
        fixturedef.addfinalizer(lambda: _set_owners(owner.replace(", set up for", " (teardown), set up for")
                                                    if needed_by else f"{owner} (teardown)"))
        _set_owners(previous)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Each test's opt-outs as the deselection left them (none for a test added after it): a hook that
    marks a test later, or a test that marks a later one, changes nothing."""
    run = session.config.stash.get(_RUN, None)
    if run is not None:
        run.opt_outs = {item.nodeid: run.opt_outs.get(item.nodeid, frozenset()) for item in session.items}


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The checkout's baseline, once pytest and every installed plugin have set up (their own
    working files are the operator's tooling); collection, fixtures and tests come after."""
    run = session.config.stash.get(_RUN, None)
    if run is not None:
        _list_ignored(run, session.config)  # an xdist worker's: its own start comes after the initial conftests
    if run is not None and not _is_worker(session.config):
        with _access.GUARD.exempt():
            run.search_dirs = _search_dirs(session.config.rootpath)
            run.own_outputs = _own_outputs(run, session.config)
            run.checkout_before = _checkout_manifest(run, session.config.rootpath)
        _junit_suite_properties(session.config, [(ISOLATION_PROPERTY, "; ".join(
            line.removeprefix("canarchy isolation: ") for line in pytest_report_header(session.config)))])
        _set_owners(_BETWEEN_TESTS)


def _list_ignored(run: _Run, config: pytest.Config) -> None:
    """Start git listing what it ignores under the rootdir (once); ``run.ignored()`` reads it."""
    if run.ignored is None:
        with _access.GUARD.exempt():
            run.ignored = functools.cache(functools.partial(_tree.read_ignored, _tree.ignored_listing(
                config.rootpath, run.sandbox.operator_env)))


def _own_outputs(run: _Run, config: pytest.Config) -> frozenset[str]:
    """The run's own reports, relative to the rootdir: pytest's ``--junitxml`` and what
    :data:`~canarchy.testing.isolation.tree.OWN_OUTPUT_VARIABLE` names. The sentinel leaves them out."""
    root = os.path.realpath(config.rootpath)
    named = [getattr(config.option, "xmlpath", None),
             *run.sandbox.operator_env.get(_tree.OWN_OUTPUT_VARIABLE, "").split(os.pathsep)]
    full = (os.path.realpath(os.path.join(config.invocation_params.dir, p)) for p in named if p)
    return frozenset(os.path.relpath(p, root) for p in full if p.startswith(root + os.sep))


def _checkout_manifest(run: _Run, root: Path) -> dict:
    """The checkout as git sees it (what differs from its index, and the untracked files it does
    not ignore), git run with the operator's environment (their global configuration:
    ``safe.directory``, ``core.excludesFile``); and what a later run loads unasked at the top of
    the checkout and of ``run.search_dirs``, ignored or not."""
    state = _tree.checkout_state(root, env=run.sandbox.operator_env, search_dirs=run.search_dirs)
    for path in run.own_outputs:
        state.pop(path, None)
    return state


def _search_dirs(root: Path) -> tuple[str, ...]:
    """The directories under ``root`` on ``sys.path`` now (a ``src`` layout's, the tests'), relative."""
    top = os.path.realpath(root)
    found = (os.path.realpath(entry or os.curdir) for entry in sys.path if isinstance(entry, str))
    return tuple(dict.fromkeys(os.path.relpath(d, top) for d in found if d.startswith(top + os.sep)))


@pytest.hookimpl(tryfirst=True, specname="pytest_make_collect_report")
def pytest_make_collect_report_refusing_ignored_code(collector: pytest.Collector) -> pytest.CollectReport | None:
    """A directory whose ``conftest.py`` git ignores, or a Python module git ignores (or one an ``__init__.py``
    git ignores would run first, as its package), is not collected: a failed collection, named. What collection
    imports from there is code no sentinel sees change, so a process could plant it for the next run unseen
    (an ignored directory holding no conftest or test module, ``htmlcov/``, generated code, is no error)."""
    run = collector.config.stash.get(_RUN, None)
    path = getattr(collector, "path", None)
    if run is None or path is None or isinstance(collector, pytest.Session):
        return None
    if isinstance(collector, pytest.Directory):
        candidates = [path / "conftest.py"]
    elif isinstance(collector, pytest.Module):
        candidates = [path, *(parent / "__init__.py" for parent in path.parents
                              if parent.is_relative_to(collector.config.rootpath))]
    else:
        return None
    found = _ignored_code(run, collector.config, candidates)
    return None if found is None else pytest.CollectReport(collector.nodeid, "failed", _ignored_code_message(
        found, "not collected"), [])


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
            "in git, or keep pytest out of it (norecursedirs, testpaths, the arguments).")


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """After the last test (and the session-scoped fixtures it tore down), what is written is pytest's and its
    plugins' session end (reports, a coverage data file), named so."""
    try:
        return (yield)
    finally:
        if session.config.stash.get(_RUN, None) is not None:
            _set_owners(_SESSION_END)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture (session scope included) is torn down: fail the run if a refusal is
    pending, or the operator's state or the checkout changed (naming the writer where the
    access guard saw it)."""
    config = session.config
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    lines = run.problems
    refused, watched = _access.GUARD.take()
    pending = _refusal_messages(run, _guard.GUARD.take_refusals(), refused) + _checked_cache(config)
    _remember_writes(run, watched)
    if pending:
        lines.append("attempts refused outside any test (collection, fixtures, start-up):")
        lines.extend(pending)
    lines += _changes(run, config, "the test run")
    if lines:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    run.exit_status = int(session.exitstatus)
    if _is_worker(config):  # pytest-xdist sends workeroutput after every sessionfinish: the controller reports
        config.workeroutput[_WORKER_OUTPUT] = {"problems": list(lines), "writes": dict(run.writes)}


_WORKER_OUTPUT = "canarchy_isolation"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, in the controller: a worker's run-level problems (a refusal after its test had
    ended, one outside any test) fail the run here, and its writes name their writers for the sentinel."""
    run = node.config.stash.get(_RUN, None)
    sent = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT)
    if run is None or not sent:
        return
    for path, owner in sent["writes"].items():
        run.writes.setdefault(path, owner)
    if sent["problems"]:
        worker = node.workerinput.get("workerid", "?") if hasattr(node, "workerinput") else "?"
        run.problems.append(f"in pytest-xdist worker {worker}:")
        run.problems.extend(sent["problems"])


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
            _settle_bytecode(run, run.checkout_before, now, config)
            diff, run.checkout_before = _tree.changes(run.checkout_before, now), now
            if diff:
                lines.append(f"{who} changed the checkout ({config.rootpath}):")
                lines.extend(f"  {line}" + _writer(run, line, config.rootpath) for line in diff)
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


def _settle_bytecode(run: _Run, before: dict, now: dict, config: pytest.Config) -> None:
    """Byte code in a ``__pycache__`` that came, changed or went since ``before`` is no change when it is
    the compilation of its source (the import system's, or pytest's assertion rewrite: every first run
    writes it); any other is (a shell child's copy, a forged header). Compiles only what changed, and
    not what the per-test check already compared and nothing changed since (``run.settled_bytecode``)."""
    root = os.path.realpath(config.rootpath)
    for rel in [r for r in before.keys() - now.keys() if r.endswith(".pyc") and "__pycache__/" in r]:
        del before[rel]
    for rel, entry in now.items():
        if before.get(rel) == entry or not rel.endswith(".pyc") or "__pycache__/" not in rel:
            continue
        path = os.path.join(root, rel)
        if run.settled_bytecode.get(path) == _bytecode.signature(entry) or _bytecode.mismatch(path, config) is None:
            before[rel] = entry


def _after_the_session(run: _Run, config: pytest.Config, cut_short: str | None = None) -> None:
    """The sentinel's last look, when pytest is the program, at the end of ``pytest_unconfigure``: the
    processes left running are stopped, and what was refused or changed since the session's end is
    printed and ends the process with exit code 1. ``cut_short``: the look taken early, because something
    called ``os._exit`` before the run ended."""
    lines = run.last_lines  # shared with _after_the_verdict, should something end the process during this look
    lines += [cut_short] if cut_short else []
    lines += [f"left running after the session, stopped now: {line}"
              for line in _reaper.stop_children(keep=_multiprocessing_helpers(), owners=run.process_owners)]
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
    sys.stderr.write(f"\ncanarchy isolation sentinel, {when}:\n" + "\n".join(lines) + "\nthe run fails (exit code 1)\n")
    sys.stderr.flush()
    run.sandbox.cleanup()
    _REAL_EXIT(run.exit_status or 1)


def _left_open_for_writing(run: _Run, config: pytest.Config) -> list[str]:
    """Descriptors of this process still open for writing on a file in the checkout (not its standard streams,
    not the run's own reports), each named with the test that opened it (Linux: ``/proc/self/fdinfo``): what
    is written through them later (a buffer flushed at exit, a thread's ``os.write``) raises no audit event.
    Naming one fails the run, which ends at once (``os._exit``): nothing is flushed or written after."""
    root = os.path.realpath(config.rootpath)
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    found = []
    for fd in sorted(int(n) for n in names if n.isdigit() and int(n) > 2):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as info:
                flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
        except (OSError, ValueError):
            continue
        rel = os.path.relpath(path, root)
        if flags & 3 and path.startswith(root + os.sep) and rel not in run.own_outputs:  # O_WRONLY, O_RDWR
            owner = run.writes.get(path)
            found.append(f"left open for writing in the checkout: {rel}" + (f" (opened by {owner})" if owner else ""))
    return found


def _after_the_verdict(run: _Run, config: pytest.Config, access: _access.Access) -> None:
    """``GUARD.late`` after the last look: an access that would change what the look saw (a refusal, a
    process started, an ``os._exit`` with another status, a write into the checkout git does not ignore)
    ends the process at once with exit code 1, named. A file git ignores at the top of the rootdir (a coverage
    data file) passes, but not one below it (a virtualenv's ``bin/activate``) nor what an import runs (an
    extension module: git ignores ``*.so``, and one runs ahead of its ``.py``)."""
    root = os.path.realpath(config.rootpath)
    if access.zone == "watched" and os.path.dirname(access.resolved) == root and not access.resolved.endswith(
            _tree.IMPORTABLE_SUFFIXES) and _tree.ignored(root, access.resolved, run.sandbox.operator_env):
        return
    sys.stdout.flush()
    found = "".join(f"{line}\n" for line in run.last_lines)  # what the last look had found, if it was under way
    sys.stderr.write(f"\ncanarchy isolation sentinel, after the session (after its last look):\n{found}"
                     f"{access.message()}\nthe run fails (exit code 1)\n")
    sys.stderr.flush()
    _REAL_EXIT(1)


def _multiprocessing_helpers() -> set[int]:
    """The processes ``multiprocessing`` keeps until the interpreter exits (its resource tracker and
    forkserver end when their pipe closes, at exit): not left running by a test. What a forkserver
    started is (``multiprocessing.resource_tracker``, ``multiprocessing.forkserver``; CPython 3.11).
    The pids come from ``multiprocessing``'s own state, which a test can set: one counts only when it is
    a child of this process running that module's ``main`` as ``multiprocessing`` starts it (``-c``)."""
    helpers = set()
    for module, holder, name in (("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
                                 ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid")):
        pid = getattr(getattr(sys.modules.get(module), holder, None), name, None)
        if isinstance(pid, int) and _runs_the_main_of(pid, module):
            helpers.add(pid)
    return helpers


def _runs_the_main_of(pid: int, module: str) -> bool:
    """Whether ``pid`` is a child of this process started as ``python [flags] -c 'from MODULE import main;...'``."""
    if (_reaper.parent_and_state(pid) or (0, ""))[0] != os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
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
    path = line.split(":", 1)[1].strip().split(" (", 1)[0]
    full = str(root / path) if root is not None else path
    owner = run.writes.get(full) or next((o for p, o in run.writes.items() if p.startswith(full + os.sep)), None)
    return f" (written by {owner})" if owner else ""


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(_RUN, None)
    if run is not None and run.problems:
        terminalreporter.section("canarchy isolation sentinel", red=True, bold=True)
        for line in run.problems:
            terminalreporter.write_line(line)
