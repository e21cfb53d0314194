"""canarchy's hermetic pytest plugin.

Activate it explicitly in a conftest.py::

    pytest_plugins = ["canarchy.testing.isolation.plugin"]

Layers (``docs/design/test-isolation.md``):

1. Session (``pytest_configure``, before collection imports any test module):
   the process moves into a disposable session home, ``CANARCHY_*`` and
   python-can's ``CAN_*`` variables are removed, children inherit the bus
   guard (PYTHONPATH hook), and the bus guard is on. Collection, import-time
   constants and module/class/session-scoped fixtures all see this.
2. Per test (``isolate_canarchy_state``, autouse): a fresh, empty home and
   working directory, the variables removed again, import-time paths
   re-pointed, ``can.rc`` emptied; everything restored afterwards, so what a
   test sets in ``os.environ`` does not reach the next one.
3. Bus guard (``forbid_real_can_bus``, autouse): only python-can's
   ``virtual`` interface; a refusal fails the test even if it was caught; a
   bus left open fails the test.
4. Markers: ``integration`` (real environment and real bus), ``real_bus``
   (guard off, home isolated), ``real_home`` (the operator's home and
   environment, guard on); each deselected unless the ``-m`` expression
   names it, so a plain ``pytest`` touches nothing of the operator's.
5. Network (``canarchy_network_namespace = true`` in the ini file; Linux,
   root): the session moves into a private network namespace holding only
   ``lo`` before anything else runs, so even a child process the guard
   cannot reach finds no CAN interface (``canarchy.testing.isolation.network``).
6. Sentinel: the operator's canarchy/python-can state (from the first
   configure hook) and the checkout (from session start, after every plugin
   has set up) are hashed and compared after the run; any change fails it.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from pathlib import Path

import pytest

from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import network as _network
from canarchy.testing.isolation.sandbox import (
    CHECKOUT_IGNORED,
    OPERATOR_STATE,
    EnvironmentSnapshot,
    Sandbox,
    apply_environment,
    manifest,
    manifest_diff,
)

MARKERS = {
    "integration": "uses the real environment and a real CAN bus; deselected unless -m names it",
    "real_bus": "may open a real CAN bus (the guard stands down); the home stays isolated; "
                "deselected unless -m names it",
    "real_home": "sees the operator's real home and environment; the bus guard stays on; "
                 "deselected unless -m names it",
}
_CHILD_HOOK_DIR = str(Path(__file__).with_name("_subprocess"))
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
_SANDBOX = pytest.StashKey[Sandbox]()
_SENTINEL = pytest.StashKey[dict]()
_BETWEEN_TESTS = "<between tests: collection or a module/class/session-scoped fixture>"


class _ShutdownRecords(logging.Handler):
    """Collects python-can's "was not properly shut down" log records
    (a log record from ``BusABC.__del__``, not a warning)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "was not properly shut down" in message:
            self.messages.append(message)

    def take(self) -> list[str]:
        taken, self.messages = self.messages, []
        return taken


_SHUTDOWN_RECORDS = _ShutdownRecords()


_ACTIVE: list[Sandbox] = []


def active_sandbox() -> Sandbox | None:
    """The :class:`Sandbox` of the pytest run configured in this process, or
    None when the plugin is not active here (not loaded, disabled with
    ``-p no:``, or the run is over). For helpers that must refuse to write
    anywhere but a disposable home."""
    return _ACTIVE[0] if _ACTIVE else None


def _sandbox(config: pytest.Config) -> Sandbox:
    return config.stash[_SANDBOX]


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# -- session layer ------------------------------------------------------------------

NETWORK_INI = "canarchy_network_namespace"
_NETWORK = pytest.StashKey[tuple]()  # (entered, header note)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        NETWORK_INI, type="bool", default=False,
        help="canarchy: run the session in a private network namespace holding only loopback "
             "(Linux, root; skipped when -m names integration or real_bus)",
    )  # fmt: skip


_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def asks_for(markexpr: str, marker: str) -> bool:
    """Whether the ``-m`` expression ``markexpr`` asks for ``marker``: names it outside an odd
    number of ``not``. ``"integration"``, ``"real_bus or uds"`` and ``"not (uds and not
    real_bus)"`` ask for theirs; ``"uds"``, ``"not integration"`` and ``""`` do not. Follows
    pytest's ``-m`` grammar (``or``/``and``/``not``, parentheses, ``name(key=value)``); an
    expression that does not parse (pytest reports it) asks for a marker it contains as a word.
    """
    tokens = _TOKEN.findall(markexpr)
    position = 0
    found = False

    def atom(positive: bool) -> None:
        nonlocal position, found
        if position >= len(tokens):
            raise SyntaxError
        token = tokens[position]
        position += 1
        if token == "not":
            atom(not positive)
        elif token == "(":
            expression(positive)
            if position >= len(tokens) or tokens[position] != ")":
                raise SyntaxError
            position += 1
        elif token in (")", "and", "or"):
            raise SyntaxError
        else:
            name, _, arguments = token.partition("(")
            found = found or (positive and name == marker)
            if arguments or (position < len(tokens) and tokens[position] == "("):  # name(key=value, ...)
                depth = 1 if arguments else 0
                while position < len(tokens) and (depth or tokens[position] == "("):
                    depth += {"(": 1, ")": -1}.get(tokens[position], 0)
                    position += 1

    def expression(positive: bool) -> None:
        nonlocal position
        atom(positive)
        while position < len(tokens) and tokens[position] in ("and", "or"):
            position += 1
            atom(positive)

    try:
        expression(True)
        if position != len(tokens):
            raise SyntaxError
    except SyntaxError:
        return re.search(rf"(?<![\w.]){re.escape(marker)}(?![\w.])", markexpr) is not None
    return found


def _private_network(config: pytest.Config, wanted: bool | None = None) -> None:
    """Enter a private network namespace if ``wanted`` (default: the ini
    option) and the run does not select tests that use a real bus; keep the
    header note (and whether it was entered) in the config's stash."""
    if not (config.getini(NETWORK_INI) if wanted is None else wanted):
        entered, note = False, f"the host's ({NETWORK_INI} is off)"
    elif named := [n for n in ("integration", "real_bus") if asks_for(config.getoption("markexpr", "") or "", n)]:
        entered, note = False, f"the host's (-m asks for {' and '.join(named)} tests, which use a real bus)"
    else:
        entered, note = _network.enter_private_network()
    config.stash[_NETWORK] = (entered, note)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if not _is_worker(config):  # xdist workers start later, inside it
        _private_network(config)
    operator_env = config.workerinput.get("canarchy_operator_env") if _is_worker(config) else None
    sandbox = Sandbox(operator_env)
    _ACTIVE[:] = [sandbox]
    config.stash[_SANDBOX] = sandbox
    if not _is_worker(config):
        config.stash[_SENTINEL] = {"home": manifest(sandbox.real_home, OPERATOR_STATE)}
    pythonpath = [_CHILD_HOOK_DIR, _PACKAGE_PARENT]
    if sandbox.operator_env.get("PYTHONPATH"):
        pythonpath.append(sandbox.operator_env["PYTHONPATH"])
    sandbox.enter_session({
        # an xdist worker's own identity (PYTEST_XDIST_WORKER, ...) is not the controller's
        **{k: v for k, v in os.environ.items() if k.startswith("PYTEST_XDIST_")},
        "PYTEST_CANARCHY_GUARD": "1",
        "PYTEST_CANARCHY_GUARD_DIR": str(sandbox.refusal_dir),
        "PYTHONPATH": os.pathsep.join(pythonpath),
    })
    _guard.GUARD.owner = _BETWEEN_TESTS
    _guard.GUARD.report_dir = sandbox.refusal_dir
    _guard.GUARD.enabled = True
    _guard.install()
    _guard.after_import("can.interface", sandbox.scrub_python_can)
    logging.getLogger("can.bus").addHandler(_SHUTDOWN_RECORDS)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: hand each worker the operator's environment (the
    controller's own was already scrubbed)."""
    node.workerinput["canarchy_operator_env"] = _sandbox(node.config).operator_env


def pytest_unconfigure(config: pytest.Config) -> None:
    sandbox = config.stash.get(_SANDBOX, None)
    if sandbox is None:
        return
    _guard.GUARD.enabled = False
    _guard.GUARD.report_dir = None
    logging.getLogger("can.bus").removeHandler(_SHUTDOWN_RECORDS)
    apply_environment(sandbox.operator_env)
    sandbox.restore_python_can()
    sandbox.cleanup()
    _ACTIVE.clear()


def require_private_network(config: pytest.Config) -> None:
    """For a project's conftest.py (``pytest_configure``): enter the private
    network namespace even when the ini option was lost (``-c`` naming another
    configuration file). A no-op when the run is already in one, when ``-m``
    asks for tests that use a real bus, in xdist workers (they inherit it), and
    where the machine does not allow it (the header says why)."""
    if _is_worker(config) or config.stash.get(_NETWORK, (False, ""))[0]:
        return
    _private_network(config, wanted=True)


def pytest_report_header(config: pytest.Config) -> str | None:
    network = config.stash.get(_NETWORK, None)
    return f"canarchy isolation: network: {network[1]}" if network is not None else None


def pytest_collectstart(collector: pytest.Collector) -> None:
    _guard.GUARD.owner = f"<collection of {collector.nodeid or 'the session'}>"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A bus opened while a module is collected (module-level code) makes that
    module's collection fail with the guard's message, instead of surfacing
    later on whichever test runs first."""
    owner = f"<collection of {collector.nodeid or 'the session'}>"
    _guard.GUARD.owner = owner
    report = yield
    refusals = _guard.GUARD.take_refusals(owner)
    if refusals and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = "\n".join(r.message() for r in refusals)
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect every test carrying an opt-out marker (``integration``,
    ``real_bus``, ``real_home``: each reaches the operator's bus or home)
    unless the ``-m`` expression asks for each of the opt-out markers it
    carries (:func:`asks_for`): ``-m uds`` and ``-m "not integration"``
    keep them all out; ``-m integration`` lets the integration tests in, and
    a test marked both ``real_home`` and ``real_bus`` runs only when the
    expression asks for both (pytest's own ``-m`` filtering then applies as
    usual). A plain ``pytest`` therefore runs only tests that touch nothing of
    the operator's."""
    _guard.GUARD.owner = _BETWEEN_TESTS
    markexpr = config.getoption("markexpr", "") or ""
    asked = {name for name in MARKERS if asks_for(markexpr, name)}
    kept, dropped = [], []
    for item in items:
        (dropped if not _opt_outs_of(item) <= asked else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        _junit_suite_properties(config, [(DESELECTED_PROPERTY, item.nodeid) for item in dropped])


#: JUnit test-suite property naming each test the plugin deselected (lanes read it, not pytest's summary).
DESELECTED_PROPERTY = "canarchy_deselected"


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
    """Name the fixture in a refusal made while a wider-scoped fixture is set up."""
    if fixturedef.scope != "function":
        previous = _guard.GUARD.owner
        item = getattr(request, "_pyfuncitem", None)  # the test that needed the fixture
        needed_by = f", set up for {item.nodeid}" if item is not None else ""
        _guard.GUARD.owner = f"{fixturedef.scope}-scoped fixture {fixturedef.argname!r}{needed_by}"
        try:
            return (yield)
        finally:
            _guard.GUARD.owner = previous
    return (yield)


# -- per-test layers ----------------------------------------------------------------

_OPT_OUTS = pytest.StashKey[frozenset]()


def _opt_outs_of(item: pytest.Item) -> frozenset:
    """The opt-out markers (:data:`MARKERS`) an item carries, looked up once
    (at collection) and kept in its stash for the per-test fixtures."""
    found = item.stash.get(_OPT_OUTS, None)
    if found is None:
        found = item.stash[_OPT_OUTS] = frozenset(m.name for m in item.iter_markers() if m.name in MARKERS)
    return found


def _opts_out(request: pytest.FixtureRequest, *markers: str) -> bool:
    """Whether the test carries any of the opt-out ``markers``."""
    return not _opt_outs_of(request.node).isdisjoint(markers)


@pytest.fixture(autouse=True)
def isolate_canarchy_state(request: pytest.FixtureRequest):
    """Autouse, function scope: give the test a fresh, empty home and working
    directory; remove ``CANARCHY_*``/``CAN_*``; re-point import-time paths;
    empty ``can.rc``. Afterwards the environment, working directory and paths
    are put back as they were, so nothing a test sets reaches the next test.

    Stands down (the operator's environment and home) for ``integration`` and
    ``real_home`` tests. Yields the test's home directory.
    """
    sandbox = _sandbox(request.config)
    before = EnvironmentSnapshot()
    cwd_before = os.getcwd()
    dirs = None
    if _opts_out(request, "integration", "real_home"):
        env = dict(sandbox.operator_env)
        if not _opts_out(request, "integration"):
            env.update({k: v for k, v in os.environ.items() if k.startswith("PYTEST_CANARCHY_") or k == "PYTHONPATH"})
        apply_environment(env)
        sandbox.rebase(sandbox.real_home)
        sandbox.restore_python_can()
        home = sandbox.real_home
    else:
        home, cwd = dirs = sandbox.new_test_dirs()
        before.scrub()
        os.environ.update(sandbox.home_environment(home))
        sandbox.rebase(home)
        sandbox.scrub_python_can()
        os.chdir(cwd)
    try:
        yield home
    finally:
        os.chdir(cwd_before)
        before.restore()
        sandbox.rebase(sandbox.session_home)
        sandbox.scrub_python_can()
        if dirs is not None:
            sandbox.release_test_dirs(*dirs)


@pytest.fixture(autouse=True)
def forbid_real_can_bus(request: pytest.FixtureRequest):
    """Autouse, function scope: refuse every python-can bus but ``virtual``
    while the test runs, and fail the test at teardown if it tried to open
    one (even if the error was caught), left a bus open, or python-can logged
    "was not properly shut down". Stands down for ``integration`` and
    ``real_bus`` tests. Yields the guard (see the ``bus_guard`` fixture).
    """
    guard = _guard.GUARD
    nodeid = request.node.nodeid
    earlier = guard.take_refusals()
    guard.take_unclosed()
    _SHUTDOWN_RECORDS.take()
    if earlier:
        pytest.fail(_report("before this test, outside any test", earlier, [], []), pytrace=False)
    stand_down = _opts_out(request, "integration", "real_bus")
    guard.owner = nodeid
    guard.enabled = not stand_down
    try:
        yield guard
    finally:
        guard.enabled = True
        guard.owner = _BETWEEN_TESTS
    refusals = guard.take_refusals()
    unclosed = guard.take_unclosed()
    for bus in unclosed:
        bus.shutdown()
    records = _SHUTDOWN_RECORDS.take()
    if stand_down:
        return
    if refusals or unclosed or records:
        pytest.fail(_report(nodeid, refusals, unclosed, records), pytrace=False)


def _report(nodeid: str, refusals: list, unclosed: list, records: list[str]) -> str:
    parts = []
    if refusals:
        parts.append(f"{len(refusals)} real CAN bus attempt(s) refused (the error may have been caught):")
        parts.extend(r.message() for r in refusals)
    if unclosed:
        parts.append(f"{nodeid} left {len(unclosed)} python-can bus(es) open: "
                     + ", ".join(f"{type(b).__name__}({getattr(b, 'channel_info', '?')})" for b in unclosed)
                     + ". Shut each bus down (`with bus:` or bus.shutdown()).")
    if records:
        parts.append(f"python-can logged during {nodeid}: " + "; ".join(records))
    return "\n".join(parts)


@pytest.fixture
def bus_guard():
    """The bus guard. ``bus_guard.take_refusals()`` returns (and clears) the
    refusals recorded so far, for tests that expect one."""
    return _guard.GUARD


_virtual_channels = itertools.count(1)


def new_virtual_channel() -> str:
    """A python-can ``virtual`` channel name not handed out before in this run
    (the pid keeps xdist workers apart)."""
    return f"canarchy-test-{os.getpid()}-{next(_virtual_channels)}"


@pytest.fixture
def virtual_channel() -> str:
    """A python-can ``virtual`` channel name no other test uses (str)."""
    return new_virtual_channel()


@pytest.fixture(scope="session")
def canarchy_sandbox(request: pytest.FixtureRequest) -> Sandbox:
    """The session's :class:`~canarchy.testing.isolation.sandbox.Sandbox` (root, homes, operator env)."""
    return _sandbox(request.config)


# -- the sentinel -------------------------------------------------------------------

def _take_sentinel(config: pytest.Config, sandbox: Sandbox) -> dict:
    return {
        "home": manifest(sandbox.real_home, OPERATOR_STATE),
        "checkout": manifest(config.rootpath, None, CHECKOUT_IGNORED),
    }


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The checkout's baseline, once pytest and every installed plugin have
    set up: a third-party plugin's own working files made at start-up (e.g.
    pytest-benchmark's ``.benchmarks/`` in the working directory) are the
    operator's tooling, not the run's. Collection, fixtures and tests all come
    after this point, so everything they write is still compared."""
    before = session.config.stash.get(_SENTINEL, None)
    if before is not None:
        before["checkout"] = manifest(session.config.rootpath, None, CHECKOUT_IGNORED)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture (session scope included) is torn down: fail the run
    if the operator's state or the checkout changed, or a refusal is pending."""
    config = session.config
    lines = []
    pending = _guard.GUARD.take_refusals()
    if pending:
        lines.append("real CAN bus attempts outside any test (collection or session fixtures):")
        lines.extend(r.message() for r in pending)
    before = config.stash.get(_SENTINEL, None)
    if before is not None:
        sandbox = _sandbox(config)
        after = _take_sentinel(config, sandbox)
        for label, where in (("home", f"the operator's home ({sandbox.real_home})"),
                             ("checkout", f"the checkout ({config.rootpath})")):
            if label not in before:  # the session never started
                continue
            diff = manifest_diff(before[label], after[label])
            if diff:
                lines.append(f"the test run changed {where}:")
                lines.extend(f"  {line}" for line in diff)
    if lines:
        config.stash[_SENTINEL_FAILURE] = lines
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_SENTINEL_FAILURE = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(_SENTINEL_FAILURE, None)
    if lines:
        terminalreporter.section("canarchy isolation sentinel", red=True, bold=True)
        for line in lines:
            terminalreporter.write_line(line)
