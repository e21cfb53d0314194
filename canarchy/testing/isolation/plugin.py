"""canarchy's hermetic pytest plugin: load it with ``-p canarchy.testing.isolation.plugin``.

Named with ``-p`` (in ``addopts``), its session layer starts in
``pytest_load_initial_conftests``, before any conftest is imported; loaded
by a conftest's ``pytest_plugins`` only, in ``pytest_configure``. The layers,
their requirements and tests: ``docs/design/test-isolation.md``; the options
an adopting project sets: ``docs/adopting.md``.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import itertools
import logging
import os
import re
import stat
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import bytecode as _bytecode
from canarchy.testing.isolation import containment as _containment
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import tempbase as _tempbase
from canarchy.testing.isolation.procstate import STATE as _STATE
from canarchy.testing.isolation import tree as _tree
from canarchy.testing.isolation.sandbox import HOME_VARIABLES, Sandbox
from canarchy.testing.isolation.seal import Seal
from canarchy.testing.isolation.settings import Settings, add_options

MARKERS = {
    "integration": "uses the real environment and a real CAN bus; deselected unless -m names it",
    "real_bus": "may open a real CAN bus (the guard stands down); the home stays isolated; "
                "deselected unless -m names it",
    "real_home": "sees the operator's real home and environment; the bus guard stays on; "
                 "deselected unless -m names it",
}
#: JUnit test-suite property naming each test the plugin deselected (lanes read it, not pytest's summary).
DESELECTED_PROPERTY = "canarchy_deselected"
#: JUnit test-suite property every run under the plugin carries (what is in force): the lanes
#: refuse a report without it from a project whose configuration loads the plugin.
ISOLATION_PROPERTY = "canarchy_isolation"
#: JUnit test-case property naming each write a test made into the checkout.
CHECKOUT_WRITE_PROPERTY = "canarchy_checkout_write"
REQUIRED_MODULE = "canarchy.testing.required"

_CHILD_HOOK_DIR = str(Path(__file__).with_name("_subprocess"))
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
_BETWEEN_TESTS = "<between tests: collection or a module/class/session-scoped fixture>"
_START_UP = "<pytest start-up, before collection>"
_AT_EXIT = "<after the session: an atexit handler or a thread still running at interpreter exit>"
_CONFTESTS = "<import of the initial conftest.py files>"


class _ShutdownRecords(logging.Handler):
    """python-can's "was not properly shut down" log records (from ``BusABC.__del__``: not a warning)."""

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


@dataclass
class _Run:
    """The session layer of one pytest process."""

    settings: Settings
    sandbox: Sandbox
    started: str
    homes: list[str]
    guarded: list[str]
    containment: _containment.Report | None = None
    network_note: str = ""
    header: list[str] = field(default_factory=list)
    temp_base: str = ""
    home_before: dict | None = None
    checkout_before: dict | None = None
    writes: dict[str, str] = field(default_factory=dict)  # path -> who wrote it (access guard), for the sentinel
    opt_outs: dict[str, frozenset] = field(default_factory=dict)  # node id -> its opt-out markers at collection
    seal: Seal | None = None  # the isolation's own code and state, as the session layer left them
    problems: list[str] = field(default_factory=list)  # run-level failures, shown in the terminal summary
    finished: set[str] = field(default_factory=set)  # node ids of the tests whose teardown has run


_RUN = pytest.StashKey[_Run]()
_ACTIVE: list[Sandbox] = []


def active_sandbox() -> Sandbox | None:
    """The :class:`Sandbox` of the pytest run configured in this process, or None when the
    plugin is not active here. For helpers that must refuse to write anywhere but a disposable home."""
    return _ACTIVE[0] if _ACTIVE else None


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _markexpr(config: pytest.Config) -> str:
    """The run's ``-m`` expression. The command line's known arguments first: at the earliest
    start (``pytest_load_initial_conftests``) ``config.option`` still holds the defaults."""
    known = getattr(config, "known_args_namespace", None)
    if known is not None and getattr(known, "markexpr", None):
        return known.markexpr
    try:
        return config.getoption("markexpr", "") or ""
    except (AttributeError, ValueError):
        return ""


# -- the -m expression ------------------------------------------------------------------

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


# -- the session layer --------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """The earliest start: before the initial conftest.py files are imported (an xdist worker
    waits for ``pytest_configure``: the controller's view of the operator arrives there)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _start(early_config, "before the initial conftests are imported")
        _set_owners(_CONFTESTS)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if _RUN not in config.stash:
        late = "in this pytest-xdist worker" if _is_worker(config) else (
            "at pytest_configure: a conftest loaded the plugin, so the top of the initial conftests ran "
            "outside it (load it with -p canarchy.testing.isolation.plugin for the earliest start)")
        _start(config, late)
    _set_owners(_START_UP)
    _check_configuration(config)


_inside = _tempbase.inside


def _git_dirs(root: str) -> list[str]:
    """The checkout's git directories (``.git``; for a linked work tree, its own and the common one)."""
    dot_git = os.path.join(root, ".git")
    if os.path.isdir(dot_git):
        return [dot_git]
    try:
        with open(dot_git, encoding="utf-8") as handle:
            first = handle.readline()
    except OSError:
        return []
    if not first.startswith("gitdir:"):
        return []
    own = os.path.normpath(os.path.join(root, first[len("gitdir:"):].strip()))
    try:
        with open(os.path.join(own, "commondir"), encoding="utf-8") as handle:
            common = os.path.normpath(os.path.join(own, handle.read().strip()))
    except OSError:
        return [own]
    return [own, common]


def _interpreter_trees() -> list[str]:
    """Where the running interpreter loads code from at start-up (prefixes, site-packages,
    the user site): a ``.pth`` file or a module planted there runs in every later Python."""
    import site

    trees = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *site.getsitepackages()}
    if site.ENABLE_USER_SITE and site.USER_SITE:
        trees.add(site.USER_SITE)
    return sorted(t for t in trees if t and os.path.dirname(t) != t)


def _containment_plan(config: pytest.Config, run: _Run, network: bool) -> _containment.Plan:
    """Covered: the operator's state; read-only: their homes, the checkout's git directories and
    the interpreter's trees; writable inside those: the checkout and the run's temporary trees
    (none of them a home: see :func:`_start`)."""
    root = str(config.rootpath)
    writable = {root, run.temp_base, str(run.sandbox.root)}
    basetemp = getattr(config.known_args_namespace, "basetemp", None)
    if basetemp:
        writable.add(os.path.abspath(basetemp))
    if not run.settings.containment:
        return _containment.Plan(writable=sorted(writable), network=network)
    homes = [h for h in run.homes if os.path.dirname(h) != h]
    read_only = [*homes, *_git_dirs(root), *_interpreter_trees()]
    return _containment.Plan(covered=run.guarded, read_only=read_only, writable=sorted(writable), network=network)


def _network_wanted(config: pytest.Config, settings: Settings, wanted: bool | None = None) -> tuple[bool, str]:
    if not (settings.network_namespace if wanted is None else wanted):
        return False, "the host's (canarchy_network_namespace is off)"
    named = [n for n in ("integration", "real_bus") if asks_for(_markexpr(config), n)]
    if named:
        return False, f"the host's (-m asks for {' and '.join(named)} tests, which use a real bus)"
    return True, ""


def _enter_containment(config: pytest.Config, run: _Run, *, network: bool | None = None,
                       mounts: bool | None = None) -> None:
    """Enter the namespaces the options ask for (once; never in an xdist worker: it inherits them)."""
    if run.containment is not None or _is_worker(config):
        return
    if mounts is not None:
        run.settings = Settings(**{**run.settings.__dict__, "containment": mounts})
    want_network, note = _network_wanted(config, run.settings, network)
    if not (run.settings.containment or want_network):
        run.network_note = note or "the host's"
        return
    with _access.GUARD.exempt():
        run.containment = _containment.enter(_containment_plan(config, run, want_network))
    run.network_note = note if not want_network else (
        "a private namespace (loopback only)" if run.containment.protection("network") and
        run.containment.protection("network").in_force else f"the host's ({run.containment.reason})")


def _start(config: pytest.Config, where: str) -> None:
    """Move this process into the disposable session home behind the guards (once)."""
    settings = Settings.from_config(config)
    operator_env = config.workerinput["canarchy_operator_env"] if _is_worker(config) else dict(os.environ)
    account_home = _tempbase.account_database_home()
    homes = _access.operator_homes(operator_env, account_home)
    guarded = settings.guarded_under(homes)
    if not _is_worker(config):
        _refuse_inherited_descriptors(guarded)
        if os.path.realpath(config.rootpath) in homes:
            raise pytest.UsageError(
                f"canarchy test isolation: the rootdir is the operator's home ({config.rootpath}): the checkout "
                "is writable and the home is not. Run pytest from the project (its pytest.ini, pyproject.toml "
                "or tox.ini sets the rootdir), or pass --rootdir.")
    temp_base, temp_note = _tempbase.temp_base([*((h, "the operator's home") for h in homes),
                                                (str(config.rootpath), "the checkout")])
    sandbox = Sandbox(operator_env, temp_base, scrub_prefixes=settings.scrub_prefixes,
                      scan_packages=settings.scan_packages, account_home=account_home)
    atexit.register(sandbox.cleanup)  # also when pytest stops before pytest_unconfigure (a refused conftest)
    run = _Run(settings, sandbox, where, homes, guarded, temp_base=temp_base)
    if temp_note:
        run.header.append(temp_note)
    config.stash[_RUN] = run
    _ACTIVE[:] = [sandbox]
    if not _is_worker(config):
        run.home_before = _guarded_manifest(run)  # before the containment hides the real files
    _enter_containment(config, run)
    protection = _access.default_protection(operator_env, account_home, cwd=str(config.invocation_params.dir))
    protection = _access.Protection(
        refused=tuple(dict.fromkeys([*protection.refused, *run.guarded])), read_only=protection.read_only,
        writable=(*protection.writable, str(sandbox.root)), watched=(str(config.rootpath),))
    _access.GUARD.configure(protection)
    _access.GUARD.report_dir = sandbox.refusal_dir
    _access.GUARD.owner = _START_UP
    _STATE.expected_python_can = sandbox.python_can_expected
    _access.observe("os.putenv", _STATE.on_putenv)
    _access.observe("os.unsetenv", _STATE.on_unsetenv)
    _access.install()
    _access.GUARD.enabled = True
    pythonpath = [_CHILD_HOOK_DIR, _PACKAGE_PARENT]
    if operator_env.get("PYTHONPATH"):
        pythonpath.append(operator_env["PYTHONPATH"])
    sandbox.enter_session({
        # an xdist worker's own identity (PYTEST_XDIST_WORKER, ...) is not the controller's
        **{k: v for k, v in os.environ.items() if k.startswith("PYTEST_XDIST_")},
        **({"TMPDIR": temp_base} if temp_note else {}),
        **_access.GUARD.to_environment(),
        "PYTEST_CANARCHY_GUARD": "1",
        "PYTEST_CANARCHY_GUARD_DIR": str(sandbox.refusal_dir),
        "PYTHONPATH": os.pathsep.join(pythonpath),
    })
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    _STATE.changed_between_tests()  # the session's own environment is not a test's doing
    _guard.GUARD.owner = _START_UP
    _guard.GUARD.report_dir = sandbox.refusal_dir
    _guard.GUARD.enabled = True
    _access.GUARD.thread_owners = _guard.GUARD.thread_owners  # one map of left-running threads, read by both
    _guard.install()
    _guard.after_import("can.interface", sandbox.scrub_python_can)
    logging.getLogger("can.bus").addHandler(_SHUTDOWN_RECORDS)
    _access._import_writers()  # taken now, before any test could replace them
    run.seal = _seal()


_UNSEALED = {"canarchy.testing.isolation.containment", "canarchy.testing.isolation.seal",
             "canarchy.testing.isolation._child"}


def _seal() -> Seal:
    """Every module of the isolation but those used only at entry, the guards' configuration,
    and the guards themselves (an attribute of their own would hide a method)."""
    modules = [m for name, m in sorted(sys.modules.items())
               if name.startswith("canarchy.testing.isolation.") and name not in _UNSEALED and m is not None]
    attributes = [(_access.GUARD, "protection"), (_access.GUARD, "_zones"), (_access.GUARD, "report_dir"),
                  (_guard.GUARD, "report_dir"), *_import_machinery()]
    seal = Seal(modules, attributes, instances=[_access.GUARD, _guard.GUARD])
    seal.extend(_guard_state(), contents=False)
    zones = _access.GUARD._zones  # made once by configure; its tables never change afterwards
    seal.extend([(zones, "__class__"), *((zones, name) for name in type(zones).__slots__)])
    return seal


def _guard_state() -> list[tuple[object, str]]:
    """The guards' own state by identity: their class (a subclass could override a method) and
    every attribute but the two that change per test (``enabled``, ``owner``)."""
    pairs: list[tuple[object, str]] = []
    for guard in (_access.GUARD, _guard.GUARD):
        pairs.append((guard, "__class__"))
        pairs += [(guard, name) for name in vars(guard) if name not in ("enabled", "owner")]
    return pairs


def _import_machinery() -> list[tuple[object, str]]:
    """What decides the byte code an import caches (compiling, rewriting, marshalling, writing):
    a test that replaced one could have the import system cache its own code in the checkout."""
    import builtins
    import marshal

    external = sys.modules["_frozen_importlib_external"]
    found = [(builtins, "compile"), (marshal, "dumps"), (ast, "parse"), (external, "_write_atomic"),
             (external, "_code_to_timestamp_pyc"), (external, "_code_to_hash_pyc"),
             (external.SourceLoader, "get_code"), (external.SourceLoader, "source_to_code"),
             (external.SourceFileLoader, "set_data"), (external.SourceFileLoader, "_cache_bytecode")]
    rewrite = sys.modules.get("_pytest.assertion.rewrite")
    if rewrite is not None:
        found += [(rewrite, name) for name in ("rewrite_asserts", "_rewrite_test", "_write_pyc")
                  if hasattr(rewrite, name)]
        found.append((rewrite.AssertionRewritingHook, "exec_module"))
    return found


def _checked_cache(config: pytest.Config) -> list[str]:
    """The byte code the import system cached in the checkout or a read-only tree since the last
    look, each compared with a compilation of its source by this plugin's own compiler: any
    other is removed and named (a test that changed the import machinery, even if it put it
    back, could have had its own code cached where a later import runs it)."""
    problems = []
    with _access.GUARD.exempt():
        for path in dict.fromkeys(_access.GUARD.take_cached()):
            why = _bytecode.mismatch(path, config)
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


def _refuse_inherited_descriptors(guarded: list[str]) -> None:
    """Refuse a run started with a directory descriptor open (paths resolved through it pass by
    the containment's view and the access guard) or one open on the operator's state."""
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return
    found = []
    for name in names:
        try:
            fd = int(name)
            mode = os.fstat(fd).st_mode
        except (ValueError, OSError):  # the listing's own descriptor, closed by now
            continue
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            target = "?"
        if stat.S_ISDIR(mode):
            found.append(f"descriptor {fd} is open on the directory {target}")
        elif any(_inside(target, g) for g in guarded):
            found.append(f"descriptor {fd} is open on {target}, the operator's own state")
    if found:
        raise pytest.UsageError(
            "canarchy test isolation: pytest was started with a descriptor its protections cannot see "
            "through (files opened through it pass by the containment's view and the access guard): "
            + "; ".join(found) + ". Start pytest without it (in a shell, `exec N<&-` closes descriptor N).")


def _guarded_manifest(run: _Run) -> dict:
    """The operator's guarded paths (as the sentinel compares them), keyed by path."""
    found: dict = {}
    with _access.GUARD.exempt():
        for path in run.guarded:
            base, name = os.path.split(path)
            found.update({os.path.join(base, k): v for k, v in _tree.snapshot(base, only=[name]).items()})
    return found


def _check_configuration(config: pytest.Config) -> None:
    """Name a pytest configuration that shadows the project's own (a stray pytest.ini, tox.ini or
    setup.cfg section) in the header, and refuse it when it loses the plugin's settings."""
    run = config.stash[_RUN]
    inipath = config.inipath
    if inipath is None:
        return
    for directory in (inipath.parent, *inipath.parent.parents):
        own = directory / "pyproject.toml"
        if own == inipath:
            return
        if own.is_file():
            try:
                import tomllib

                table = tomllib.loads(own.read_text(encoding="utf-8")).get("tool", {}).get("pytest", {}).get(
                    "ini_options")
            except (OSError, ValueError):
                return
            if not table:
                continue
            run.header.append(f"configuration: {inipath} shadows {own}'s [tool.pytest.ini_options]")
            lost = sorted(k for k in table if k.startswith("canarchy_") and config.getini(k) != table[k])
            addopts = " ".join(table.get("addopts", []) if isinstance(table.get("addopts"), list)
                               else [str(table.get("addopts", ""))])
            if "canarchy.testing.isolation.plugin" in addopts and "canarchy.testing.isolation.plugin" not in " ".join(
                    config.getini("addopts")):
                lost.append("addopts (-p canarchy.testing.isolation.plugin)")
            if lost:
                raise pytest.UsageError(
                    f"{inipath} shadows the project's configuration in {own} and loses canarchy's isolation "
                    f"settings ({', '.join(lost)}): remove the stray file, or give it the same settings")
            return


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: hand each worker the operator's environment (the controller's own is scrubbed)."""
    node.workerinput["canarchy_operator_env"] = node.config.stash[_RUN].sandbox.operator_env


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    if _the_process_ends_with(config):  # what runs until the interpreter exits is still refused
        _guard.GUARD.owner = _access.GUARD.owner = _AT_EXIT
        _guard.GUARD.report_dir = _access.GUARD.report_dir = None
        run.sandbox.cleanup()
        _ACTIVE.clear()
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


def _the_process_ends_with(config: pytest.Config) -> bool:
    """Whether this pytest is the program (``pytest ...``, ``python -m pytest ...``), not a
    ``pytest.main()`` called by code that goes on afterwards (which gets its world back)."""
    return (os.path.basename(sys.argv[0]) in ("pytest", "py.test", "__main__.py")
            and list(config.invocation_params.args) == sys.argv[1:])


def require_containment(config: pytest.Config) -> None:
    """For a project's conftest.py (``pytest_configure``): enter the containment and the
    private network namespace even when the ini options were lost (``-c`` naming another
    configuration file). A no-op where they are in force already, in xdist workers, when
    ``-m`` asks for tests that use a real bus (for the network), and where the machine does
    not allow it (the header says why)."""
    run = config.stash.get(_RUN, None)
    if run is not None:
        _enter_containment(config, run, network=True, mounts=True)


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


# -- collection ------------------------------------------------------------------------

def _set_owners(owner: str) -> None:
    _guard.GUARD.owner = owner
    _access.GUARD.owner = owner


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
    messages = [r.message() for r in _guard.GUARD.take_refusals(owner)]
    messages += [a.message() for a in _access.GUARD.take_refusals(owner)]
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect every test carrying an opt-out marker (:data:`MARKERS`) unless the ``-m``
    expression asks for each of the opt-out markers it carries (:func:`asks_for`): a plain
    ``pytest`` runs only tests that touch nothing of the operator's."""
    _set_owners(_BETWEEN_TESTS)
    markexpr = _markexpr(config)
    asked = {name for name in MARKERS if asks_for(markexpr, name)}
    kept, dropped = [], []
    for item in items:
        (dropped if not _opt_outs_of(item) <= asked else kept).append(item)
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
    """Name the fixture in a refusal made while a wider-scoped fixture is set up."""
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
    finally:
        fixturedef.addfinalizer(lambda: _set_owners(owner.replace(", set up for", " (teardown), set up for")
                                                    if needed_by else f"{owner} (teardown)"))
        _set_owners(previous)


# -- per test ------------------------------------------------------------------------------

def _opt_outs_of(item: pytest.Item) -> frozenset:
    """The opt-out markers (:data:`MARKERS`) an item carries now."""
    return frozenset(m.name for m in item.iter_markers() if m.name in MARKERS)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Each test's opt-outs as collection left them: a test cannot change a later test's."""
    run = session.config.stash.get(_RUN, None)
    if run is not None:
        run.opt_outs = {item.nodeid: _opt_outs_of(item) for item in session.items}


def _opts_out(request: pytest.FixtureRequest, *markers: str) -> bool:
    run: _Run = request.config.stash[_RUN]
    found = run.opt_outs.get(request.node.nodeid)
    return not (_opt_outs_of(request.node) if found is None else found).isdisjoint(markers)


@pytest.fixture(autouse=True)
def isolate_canarchy_state(request: pytest.FixtureRequest):
    """Autouse, function scope: a fresh, empty home and working directory (or the rootdir, with
    ``canarchy_test_cwd = rootdir``); import-time paths re-pointed; afterwards every variable,
    signal handler, the umask and python-can's globals put back as they were, and a test that
    left one changed in a way it should not (``os.putenv``, a replaced ``os.environ``, a handler)
    fails, named. Stands down (the operator's environment and home) for ``integration`` and
    ``real_home`` tests. Yields the test's home directory."""
    run: _Run = request.config.stash[_RUN]
    sandbox = run.sandbox
    cwd_before = os.getcwd()
    dirs = None
    frozen = run.opt_outs.get(request.node.nodeid)
    changed = frozen is not None and _opt_outs_of(request.node) != frozen
    for key in _STATE.changed_between_tests():  # left by collection or a wider-scoped fixture
        if key.startswith(run.settings.scrub_prefixes):
            _STATE.quietly(key, None)
    if _opts_out(request, "integration", "real_home"):
        env = dict(sandbox.operator_env)
        keep = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_") if _opts_out(request, "integration") else (
            "PYTEST_CURRENT_TEST", "PYTEST_XDIST_", "PYTEST_CANARCHY_", "PYTHONPATH")
        env.update({k: v for k, v in os.environ.items() if k.startswith(keep)})
        _STATE.quietly_apply(env)
        sandbox.rebase(sandbox.real_home)
        sandbox.restore_python_can()
        home = sandbox.real_home
    else:
        # Judged like the test's own code (not exempt): a test can replace what these call.
        home, cwd = dirs = sandbox.new_test_dirs()
        os.chdir(cwd if run.settings.test_cwd == "empty" else request.config.rootpath)
        for key, value in sandbox.home_environment(home).items():
            _STATE.quietly(key, value)
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
        os.chdir(cwd_before)
        if dirs is None:
            _STATE.quietly_apply({**sandbox.session_env, **{k: v for k, v in os.environ.items()
                                                            if k == "PYTEST_CURRENT_TEST"}})
        else:
            for key in HOME_VARIABLES:
                _STATE.quietly(key, sandbox.session_env.get(key))
        sandbox.rebase(sandbox.session_home)
        sandbox.scrub_python_can()
        if dirs is not None:
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
    run: _Run = request.config.stash[_RUN]
    bus, files = _guard.GUARD, _access.GUARD
    nodeid = request.node.nodeid
    _fail_for_what_came_before(run, nodeid, request.config)
    bus_down, files_down = _opts_out(request, "integration", "real_bus"), _opts_out(request, "integration", "real_home")
    _set_owners(nodeid)
    bus.enabled, files.enabled = not bus_down, not files_down
    run.finished.discard(nodeid)  # a test run again in the session (a rerun plugin) is running now
    threads_before = {t.ident for t in _THREADS()}
    try:
        yield bus
    finally:
        switched = [name for name, g, down in (("bus", bus, bus_down), ("access", files, files_down))
                    if not g.enabled and not down]
        bus.enabled = files.enabled = True
        _set_owners(_BETWEEN_TESTS)
        _own_left_threads(nodeid, threads_before)
    try:
        _fail_for_what_the_test_did(request, run, bus_down, files_down, switched)
    finally:
        run.finished.add(nodeid)  # from now on, what is refused in its name is late


_THREADS = threading.enumerate  # taken at import: a test that replaced it could hide its threads


def _own_left_threads(nodeid: str, before: set[int | None]) -> None:
    """Name ``nodeid`` in what a thread it started and left running does later (not the test that
    runs then); forget the threads that have ended (their ids are reused). Both guards read the
    one map (``thread_owners``)."""
    alive = {t.ident for t in _THREADS()}
    owners = _guard.GUARD.thread_owners
    for ident in [i for i in owners if i not in alive]:
        del owners[ident]
    owners.update((ident, nodeid) for ident in alive if ident not in before and ident not in owners)


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
                                switched: list[str]) -> None:
    """Fail the test for its refusals (caught or not), a change to the isolation, a bus it left
    open or python-can's "not properly shut down"; record its writes into the checkout."""
    bus, files = _guard.GUARD, _access.GUARD
    nodeid = request.node.nodeid
    tampered = _unsealed(run) + [f"{name} guard switched off" for name in switched]
    refused, watched = files.take()
    refusals = _refusal_messages(run, bus.take_refusals(), refused)
    refusals += _checked_cache(request.config)
    _remember_writes(run, watched)
    for access in watched:
        if access.owner == nodeid:
            request.node.user_properties.append((CHECKOUT_WRITE_PROPERTY, f"{access.operation} {access.resolved}"))
    unclosed = bus.take_unclosed()
    for open_bus, _owner in unclosed:
        open_bus.shutdown()
    records = _SHUTDOWN_RECORDS.take()
    if bus_down and files_down and not tampered:
        return
    if bus_down:
        unclosed, records = [], []
    if refusals or unclosed or records or tampered:
        pytest.fail(_report(nodeid, refusals, [b for b, _ in unclosed], records, tampered), pytrace=False)


def _remember_writes(run: _Run, watched: list) -> None:
    for access in watched:
        run.writes.setdefault(access.resolved, access.owner)


def _report(nodeid: str, refusals: list[str], unclosed: list, records: list[str], tampered: list[str]) -> str:
    parts = []
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
    return "\n".join(parts)


@pytest.fixture
def bus_guard():
    """The bus guard. ``bus_guard.take_refusals()`` returns (and clears) the refusals recorded
    so far, for tests that expect one."""
    return _guard.GUARD


@pytest.fixture
def access_guard():
    """The access guard. ``access_guard.take_refusals()`` returns (and clears) its refusals."""
    return _access.GUARD


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
def canarchy_sandbox(request: pytest.FixtureRequest) -> Sandbox:
    """The session's :class:`~canarchy.testing.isolation.sandbox.Sandbox` (root, homes, operator env)."""
    return request.config.stash[_RUN].sandbox


# -- the sentinel --------------------------------------------------------------------------

@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The checkout's baseline, once pytest and every installed plugin have set up (their own
    working files are the operator's tooling); collection, fixtures and tests come after."""
    run = session.config.stash.get(_RUN, None)
    if run is not None and not _is_worker(session.config):
        with _access.GUARD.exempt():
            run.checkout_before = _checkout_manifest(session.config.rootpath, run.sandbox.operator_env)
        _junit_suite_properties(session.config, [(ISOLATION_PROPERTY, "; ".join(
            line.removeprefix("canarchy isolation: ") for line in pytest_report_header(session.config)))])
        _set_owners(_BETWEEN_TESTS)


def _checkout_manifest(root: Path, operator_env: dict) -> dict:
    """The checkout as git sees it (what differs from its index, and the untracked files it does
    not ignore), git run with the operator's environment (their global configuration:
    ``safe.directory``, ``core.excludesFile``)."""
    return _tree.checkout_state(root, env=operator_env)


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
    with _access.GUARD.exempt():
        if run.home_before is not None:
            view = run.containment.protection("mount view") if run.containment is not None else None
            diff = _covers_broken(run.containment) if view is not None and view.in_force else \
                _tree.changes(run.home_before, _guarded_manifest(run))
            if diff:
                lines.append("the test run changed the operator's state:")
                lines.extend(f"  {line}" + _writer(run, line) for line in diff)
        if run.checkout_before is not None:
            diff = _tree.changes(run.checkout_before, _checkout_manifest(config.rootpath, run.sandbox.operator_env))
            if diff:
                lines.append(f"the test run changed the checkout ({config.rootpath}):")
                lines.extend(f"  {line}" + _writer(run, line, config.rootpath) for line in diff)
    if lines:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
