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
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import handover as _handover
from canarchy.testing.isolation.procstate import STATE as _STATE
from canarchy.testing.isolation.session import (_ACTIVE, _AT_EXIT, _BETWEEN_TESTS, _CONFTESTS, _RUN, _SESSION_END,
                                                _SHUTDOWN_RECORDS, _START_UP, MARKERS, _check_configuration,
                                                _opt_outs_of, _set_owners, _start,
                                                active_sandbox, require_containment)
from canarchy.testing.isolation.settings import _is_worker, _markexpr, add_options, asks_for
from canarchy.testing.isolation.exits import _the_process_ends_with
from canarchy.testing.isolation.sentinel import (_after_the_session, _after_the_verdict, _changes, _checkout_manifest,
                                                 _ignored_code, _ignored_code_message, _list_ignored, _own_outputs,
                                                 _refused, _search_dirs)
from canarchy.testing.isolation.pertest import (_checked_cache, _refusal_messages, _remember_writes, access_guard,
                                                bus_guard, canarchy_sandbox, guard_operator_access,
                                                isolate_canarchy_state, new_virtual_channel, scrubbed_outside_text,
                                                virtual_channel)
from canarchy.testing.isolation.refusal import CHECKOUT_WRITE_PROPERTY

# What a project's conftest or test imports from here; the fixtures, so that pytest registers them with the plugin.
__all__ = ["CHECKOUT_WRITE_PROPERTY", "DESELECTED_PROPERTY", "ISOLATION_PROPERTY", "ITEMS_PROPERTY", "MARKERS",
           "NOT_LOADED_PROPERTY", "REQUIRED_MODULE", "access_guard", "active_sandbox", "asks_for", "bus_guard",
           "canarchy_sandbox", "guard_operator_access", "isolate_canarchy_state", "new_virtual_channel",
           "require_containment", "virtual_channel"]

#: JUnit test-suite property naming each test the plugin deselected (lanes read it, not pytest's summary).
DESELECTED_PROPERTY = "canarchy_deselected"
#: JUnit test-suite property every run under the plugin carries (what is in force): the lanes
#: refuse a report without it from a project whose configuration loads the plugin.
ISOLATION_PROPERTY = "canarchy_isolation"
ITEMS_PROPERTY = "canarchy_items"  # how many tests the run was to run: the lanes count its cases
#: JUnit test-suite property naming each installed pytest plugin a run with autoloading off did not load.
NOT_LOADED_PROPERTY = "canarchy_plugins_not_loaded"
#: The header line that names them (the lanes read it from a run that wrote no report).
NOT_LOADED_HEADER = ("pytest plugins installed but not loaded (plugin autoloading is off; the tests and options they "
                     "bring are not in this run): ")
REQUIRED_MODULE = "canarchy.testing.required"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """The earliest start: before the initial conftest.py files are imported (an xdist worker
    waits for ``pytest_configure``: the controller's view of the operator arrives there)."""
    if not _starts_as_a_worker():
        _begin(early_config, "before the initial conftests are imported")
        _set_owners(_CONFTESTS)
        run = early_config.stash[_RUN]
        _list_ignored(run, early_config)
        found = _ignored_code(run, early_config, _initial_conftests(early_config))
        if found is not None:
            raise pytest.UsageError(_ignored_code_message(found, "refused before it was imported"))


def _starts_as_a_worker() -> bool:
    """Whether this pytest is a pytest-xdist worker starting: ``PYTEST_XDIST_WORKER`` set, in a process that
    execnet's gateway runs (a worker's code arrives through it). A pytest a test starts in a worker inherits
    the variable and is a run of its own, to be isolated from its start."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and "execnet.gateway_base" in sys.modules


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
    run = config.stash[_RUN]
    if not _is_worker(config):
        run.plugins_not_loaded = _plugins_not_loaded(config)
        if run.plugins_not_loaded:
            run.header.append(NOT_LOADED_HEADER + ", ".join(run.plugins_not_loaded))


def _plugins_not_loaded(config: pytest.Config) -> list[str]:
    """With plugin autoloading off (``--disable-plugin-autoload``, ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``, as in every
    lane), each installed distribution with a ``pytest11`` entry point none of which the run loaded or blocked
    (``-p NAME``, ``-p no:NAME``), as ``DIST (-p NAME)``: a plugin that collects files of its own (YAML cases)
    would leave them out of the run without a word. Empty when autoloading is on."""
    if not (getattr(config.known_args_namespace, "disable_plugin_autoload", False)
            or os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")):
        return []
    from importlib import metadata

    names: dict[str, list[str]] = {}
    for entry in metadata.entry_points(group="pytest11"):
        names.setdefault(entry.dist.name if entry.dist is not None else entry.name, []).append(entry.name)
    manager = config.pluginmanager
    return [f"{dist} (-p {entries[0]})" for dist, entries in sorted(names.items())
            if not any(manager.has_plugin(name) or manager.is_blocked(name) for name in entries)]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: hand each worker the operator's environment (the controller's own is scrubbed) and terminal
    (a worker has none to find: the controller gave it up, and the containment covers its node), and the
    session's environment as the controller entered it (what conftests set since is told apart by it)."""
    run = node.config.stash[_RUN]
    # by a file the guard refuses to all but the harness: workerinput is a dict any conftest hook can read
    node.workerinput[_handover.WORKERINPUT_KEY] = _handover.write_for(run.sandbox, node.gateway.id)
    node.workerinput["canarchy_session_env"] = run.sandbox.session_env
    node.workerinput["canarchy_terminals"] = [list(run.terminals), sorted(_access.GUARD.terminals)]
    node.workerinput["canarchy_network_namespace"] = _access.GUARD.network_namespace


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The end of pytest's work. When pytest is the program, the sentinel's last look, then the guard
    stays on until the process ends, and what would still change anything ends it (:func:`_after_the_verdict`).
    A pytest-xdist worker's process ends with it too: its guards stay on (what its ``atexit`` handlers and
    finalizers do is judged) and the operator's variables stay out; the controller's sentinel looks last."""
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    _handover.remove(run.sandbox)
    if _the_process_ends_with(config) or _is_worker(config):
        _guard.GUARD.owner = _access.GUARD.owner = _AT_EXIT
        _guard.GUARD.report_dir = _access.GUARD.report_dir = None
        run.sandbox.cleanup()
        _ACTIVE.clear()
        if _is_worker(config):
            return
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
    if session.items:  # none in pytest-xdist's controller: its workers collect
        _junit_suite_properties(session.config, [(ITEMS_PROPERTY, str(len(session.items)))])


_ITEMS_NOTED = pytest.StashKey[bool]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """pytest-xdist, in the controller: how many tests the run is to run (each worker collects them all), once."""
    if not node.config.stash.get(_ITEMS_NOTED, False):
        node.config.stash[_ITEMS_NOTED] = True
        _junit_suite_properties(node.config, [(ITEMS_PROPERTY, str(len(ids)))])


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
            line.removeprefix("canarchy isolation: ") for line in pytest_report_header(session.config))),
            *((NOT_LOADED_PROPERTY, name) for name in run.plugins_not_loaded)])
        _set_owners(_BETWEEN_TESTS)


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


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """After the last test (and the session-scoped fixtures it tore down), what is written is pytest's and its
    plugins' session end (reports, a coverage data file), named so."""
    try:
        return (yield)
    finally:
        if session.config.stash.get(_RUN, None) is not None:
            _set_owners(_SESSION_END)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Count the failed reports of this process's tests (setup, call, teardown): pytest decides its exit status
    by ``session.testsfailed``, which a test can set back to 0 after a refusal."""
    report = yield
    run = item.config.stash.get(_RUN, None)
    if report.failed and run is not None:
        run.failed_reports += 1
    return report


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
    if run.failed_reports and session.exitstatus == pytest.ExitCode.OK:
        lines.append(f"{run.failed_reports} test report(s) failed, yet pytest counted no failure "
                     "(session.testsfailed): a test set its count back")
    if lines:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    run.exit_status = int(session.exitstatus)
    if _is_worker(config):  # pytest-xdist sends workeroutput after every sessionfinish: the controller reports
        config.workeroutput[_WORKER_OUTPUT] = {"problems": list(lines), "writes": dict(run.writes),
                                               "scrubbed": dict(run.scrubbed_outside)}


_WORKER_OUTPUT = "canarchy_isolation"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, in the controller: a worker's run-level problems (a refusal after its test had
    ended, one outside any test) fail the run here, its writes name their writers for the sentinel, and the
    summary names the scrubbed variables it found set outside any test."""
    run = node.config.stash.get(_RUN, None)
    sent = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT)
    if run is None or not sent:
        return
    for path, owner in sent["writes"].items():
        run.writes.setdefault(path, owner)
    for name, test in sent.get("scrubbed", {}).items():
        run.scrubbed_outside.setdefault(name, test)
    if sent["problems"]:
        worker = node.workerinput.get("workerid", "?") if hasattr(node, "workerinput") else "?"
        run.problems.append(f"in pytest-xdist worker {worker}:")
        run.problems.extend(sent["problems"])


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(_RUN, None)
    if run is not None and run.scrubbed_outside:
        terminalreporter.section("canarchy isolation: scrubbed variables set outside any test", yellow=True)
        by_test: dict[str, list[str]] = {}
        for name, test in run.scrubbed_outside.items():
            by_test.setdefault(test, []).append(name)
        for test, names in by_test.items():
            terminalreporter.write_line(f"before {test}: {scrubbed_outside_text(names, run)}")
    if run is not None and run.problems:
        terminalreporter.section("canarchy isolation sentinel", red=True, bold=True)
        for line in run.problems:
            terminalreporter.write_line(line)
