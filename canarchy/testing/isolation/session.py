"""The plugin's session layer: what one pytest process enters once, before collection.

The run's state (:class:`_Run`, in ``config.stash``), the disposable session home behind both
guards, the containment and the seal over the isolation's own code; the ``-m`` expression's
opt-outs. Design: ``docs/design/test-isolation.md`` (layer 1).
"""

from __future__ import annotations

import ast
import atexit
import logging
import os
import posix
import re
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path

import pytest

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import c_openers as _c_openers
from canarchy.testing.isolation import containment as _containment
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import protection as _protection
from canarchy.testing.isolation import reaper as _reaper
from canarchy.testing.isolation import tempbase as _tempbase
from canarchy.testing.isolation.procstate import STATE as _STATE
from canarchy.testing.isolation.procstate import erase_start_up_environment as _erase_start_up_environment
from canarchy.testing.isolation import tree as _tree
from canarchy.testing.isolation.sandbox import Sandbox
from canarchy.testing.isolation.seal import Seal
from canarchy.testing.isolation.events import PROCESS_STARTS
from canarchy.testing.isolation.settings import Settings

MARKERS = {
    "integration": "uses the real environment and a real CAN bus; deselected unless -m names it",
    "real_bus": "may open a real CAN bus (the guard stands down); the home stays isolated; "
                "deselected unless -m names it",
    "real_home": "sees the operator's real home and environment; the bus guard stays on; "
                 "deselected unless -m names it",
}


_CHILD_HOOK_DIR = str(Path(__file__).with_name("_subprocess"))
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
_BETWEEN_TESTS = "<between tests: collection or a module/class/session-scoped fixture>"
_SESSION_END = "<the session's end: pytest and its plugins>"
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
    unreached: frozenset[str] = frozenset()  # guarded paths the mount view made unreachable (_unreached)
    network_note: str = ""
    header: list[str] = field(default_factory=list)
    temp_base: str = ""
    home_before: dict | None = None
    checkout_before: dict | None = None
    search_dirs: tuple[str, ...] = ()  # under the checkout, on sys.path at the session's start (the sentinel)
    writes: dict[str, str] = field(default_factory=dict)  # path -> who wrote it (access guard), for the sentinel
    settled_bytecode: dict[str, tuple] = field(default_factory=dict)  # cached byte code compared: path -> signature
    hidden_named: set[str] = field(default_factory=set)  # written paths git does not show, already named
    ignored: Callable[[], tuple[frozenset[str], tuple[str, ...]] | None] | None = None  # git's, read at first use
    own_outputs: frozenset[str] = frozenset()  # the run's own reports in the checkout: not the sentinel's business
    opt_outs: dict[str, frozenset] = field(default_factory=dict)  # node id -> its opt-out markers at collection
    seal: Seal | None = None  # the isolation's own code and state, as the session layer left them
    problems: list[str] = field(default_factory=list)  # run-level failures, shown in the terminal summary
    finished: set[str] = field(default_factory=set)  # node ids of the tests whose teardown has run
    subreaper: bool = False  # this process adopts its descendants whose parent ended (so none is out of sight)
    process_owners: dict[int, str] = field(default_factory=dict)  # pid -> the test at whose end it was running
    last_look: Callable[[str], None] | None = None  # that look with a reason, for an os._exit before the end
    last_lines: list[str] = field(default_factory=list)  # what the last look has found so far
    exit_status: int = 0  # the session's, as the sentinel left it


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


def _interpreter_trees(root: str) -> list[str]:
    """Where the running interpreter loads code from at start-up (prefixes, site-packages,
    the user site), and the virtual environments in the checkout ``root`` (a later ``nox -R``
    or ``.venv/bin/python`` starts them): a ``.pth`` file or a module planted there runs in
    every later Python."""
    import site

    trees = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *site.getsitepackages()}
    if site.ENABLE_USER_SITE and site.USER_SITE:
        trees.add(site.USER_SITE)
    trees.update(os.path.join(root, venv) for venv in _tree.virtual_environments(root))
    return sorted(t for t in trees if t and os.path.dirname(t) != t)


def _code_trees_beside(config: pytest.Config, operator_env: dict, temp_base: str) -> list[str]:
    """The checkout's virtual environments that hold neither the checkout nor a temporary directory of the run:
    those the guard makes read-only. The running interpreter's trees are not among them (a lane runs projects
    and writes its reports inside its own environment, ``.nox/ENV/tmp``); the containment covers those."""
    root = str(config.rootpath)
    held = [os.path.abspath(h) for h in (root, temp_base, tempfile.gettempdir(), operator_env.get("TMPDIR")) if h]
    venvs = [os.path.join(root, venv) for venv in _tree.virtual_environments(root)]
    return [t for t in venvs if not any(_containment._inside(h, t) for h in held)]


def _pytest_cache_dir(config: pytest.Config) -> str | None:
    """pytest's cache directory (``cache_dir``, relative to the rootdir), None without its cache plugin."""
    if not config.pluginmanager.has_plugin("cacheprovider"):
        return None
    return os.path.join(config.rootpath, os.path.expandvars(os.path.expanduser(str(config.getini("cache_dir")))))


def _pytest_s_own_trees(config: pytest.Config) -> list[str]:
    """Where pytest and the test tools write, inside the checkout or not: pytest's cache directory (it writes
    a ``.gitignore`` of its own there), ``--basetemp``, the tools' caches under the rootdir
    (:data:`~canarchy.testing.isolation.tree.TOOL_CACHES`)."""
    trees = [os.path.join(config.rootpath, name) for name in _tree.TOOL_CACHES]
    cache_dir = _pytest_cache_dir(config)
    if cache_dir is not None:
        trees.append(cache_dir)
    basetemp = getattr(config.known_args_namespace, "basetemp", None)
    if basetemp:
        trees.append(os.path.abspath(basetemp))
    return trees


def _pytest_s_staging(config: pytest.Config) -> tuple[str, ...]:
    """Where pytest stages its cache directory before renaming it into place (pytest 9:
    ``pytest-cache-files-*`` beside it), as a resolved path prefix."""
    cache_dir = _pytest_cache_dir(config)
    return () if cache_dir is None else (
        os.path.join(os.path.realpath(os.path.dirname(cache_dir)), "pytest-cache-files-"),)


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
        return _containment.Plan(writable=sorted(writable), network=network, mounts=False)
    homes = [h for h in run.homes if os.path.dirname(h) != h]
    code = _interpreter_trees(root)
    if basetemp:  # pytest removes and remakes it: no writable view inside a read-only tree survives that
        held = [t for t in code if _containment._inside(os.path.abspath(basetemp), t)]
        code = [t for t in code if t not in held]
        run.header += [f"containment: {t} stays writable to other processes: --basetemp is inside it" for t in held]
    read_only = [*homes, *_git_dirs(root), *code]
    return _containment.Plan(covered=run.guarded, read_only=read_only, writable=sorted(writable), network=network,
                             processes=tuple(_protection.this_and_above()))


def _unreached(run: _Run) -> frozenset[str]:
    """The guarded paths the mount view made unreachable: under an empty read-only cover, or absent and
    not creatable (the path or where it resolves to). Empty when the mount view is not in force."""
    report = run.containment
    view = report.protection("mount view") if report is not None else None
    if view is None or not view.in_force:
        return frozenset()
    shut = [*report.covered, *report.uncreatable]
    return frozenset(path for path in run.guarded
                     if any(_containment._inside(p, s) for p in (path, os.path.realpath(path)) for s in shut))


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
        run.unreached = _unreached(run)
    if run.home_before is not None:
        run.home_before = _reachable(run, run.home_before)
    if not run.settings.containment:
        run.header.append("containment: mount view: off (canarchy_containment is false): the operator's state "
                          "stays reachable to the processes a test starts; the sentinel compares it after the run")
    run.network_note = note if not want_network else (
        "a private namespace (loopback only)" if run.containment.protection("network") and
        run.containment.protection("network").in_force else f"the host's ({run.containment.reason})")


_REAL_EXIT = os._exit


def _guard_the_exit(run: _Run) -> None:
    """When pytest is the program, nothing in its process ends it before the sentinel's last look with a
    status of its own choosing: ``os._exit`` (a test's, a thread's) takes that look first (``run.last_look``,
    which fails the run), and ``os.exec*`` of this process is refused. After the look (``GUARD.late`` set),
    ``os._exit`` with another status than pytest's, and the start of a process, go to ``GUARD.late``."""
    pid = os.getpid()
    guard = _access.GUARD

    def _exit(status: int) -> None:
        if os.getpid() == pid and run.last_look is not None:
            look, run.last_look = run.last_look, None
            try:
                look(f"os._exit({status!r}) called by {guard.owner} before the run had ended")
            finally:
                _REAL_EXIT(status or 1)  # the look exits itself; this only when it raised
        if os.getpid() == pid and guard.late is not None and status != run.exit_status:
            call = f"os._exit({status!r})"
            guard.late(_access.Access(guard.owner, "call", call, call, "late",
                                      f"the run's exit status is pytest's, {run.exit_status}", pid))
        _REAL_EXIT(status)

    def _exec(args: tuple) -> None:
        if os.getpid() == pid:
            path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else repr(args[0])
            guard.refuse(_access.Access(guard.owner, "replace the pytest process with", path,
                                        path, "exec", "os.exec*", pid))

    def _start_late(args: tuple) -> None:  # a process started after the look: the reaper has stopped the others
        if guard.late is not None and os.getpid() == pid and not guard.busy():
            what = " ".join(repr(a) for a in args if isinstance(a, (str, bytes, list, tuple)))[:200] or "a fork"
            guard.late(_access.Access(guard.owner, "start a process", what, what, "late", "", pid))

    os._exit = posix._exit = _exit
    _access.observe("os.exec", _exec)
    for event in PROCESS_STARTS:
        _access.observe(event, _start_late)


class _ExitHandler:
    """An atexit handler a test registered: it runs with the guards' owner naming that test, so what it
    tries after the session is named after it. Equal to the function it wraps (``atexit.unregister``)."""

    def __init__(self, func: Callable, owner: str) -> None:
        self.func, self.owner = func, f"<after the session: an atexit handler {owner} registered>"

    def __call__(self, *args, **kwargs):
        before = _guard.GUARD.owner, _access.GUARD.owner
        _guard.GUARD.owner = _access.GUARD.owner = self.owner
        try:
            return self.func(*args, **kwargs)
        finally:
            _guard.GUARD.owner, _access.GUARD.owner = before

    def __eq__(self, other: object) -> bool:
        return other is self or other == self.func

    __hash__ = None  # type: ignore[assignment]


def _name_exit_handlers() -> None:
    """Wrap ``atexit.register`` (the seal keeps the wrapper): a handler registered while a test or a
    fixture owns the guards runs as :class:`_ExitHandler`; the isolation's own and pytest's stay as they are."""
    real = atexit.register

    def register(func: Callable, /, *args, **kwargs) -> Callable:
        owner = _access.GUARD.owner
        real(func if owner.startswith("<") else _ExitHandler(func, owner), *args, **kwargs)
        return func

    atexit.register = register


def _the_process_ends_with(config: pytest.Config) -> bool:
    """Whether this pytest is the program (``pytest ...``, ``python -m pytest ...``), not a
    ``pytest.main()`` called by code that goes on afterwards (which gets its world back)."""
    return (os.path.basename(sys.argv[0]) in ("pytest", "py.test", "__main__.py")
            and list(config.invocation_params.args) == sys.argv[1:])


def _start(config: pytest.Config, where: str) -> None:
    """Move this process into the disposable session home behind the guards (once)."""
    settings = Settings.from_config(config)
    operator_env = config.workerinput["canarchy_operator_env"] if _is_worker(config) else dict(os.environ)
    account_home = _tempbase.account_database_home()
    homes = _protection.operator_homes(operator_env, account_home)
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
        if _the_process_ends_with(config):  # what a test detaches stays a child, stopped at exit
            run.subreaper = _reaper.become_subreaper()
            _guard_the_exit(run)
            _name_exit_handlers()
    # A child that is not Python reads /proc/PID/environ with no guard: erase what it shows
    # (before the containment covers the file this reads to find it).
    if not _erase_start_up_environment():
        run.header.append("the environment pytest was started with stays in /proc/PID/environ (not found in "
                          "its memory): a child that is not Python can read it there")
    _enter_containment(config, run)
    protection = _protection.default_protection(operator_env, account_home, cwd=str(config.invocation_params.dir))
    protection = _protection.Protection(
        refused=tuple(dict.fromkeys([*protection.refused, *run.guarded])),
        read_only=(*protection.read_only, *_code_trees_beside(config, operator_env, temp_base)),
        writable=(*protection.writable, str(sandbox.root), *_pytest_s_own_trees(config)),
        watched=(str(config.rootpath),), staging=_pytest_s_staging(config))
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
    _protection.import_writers()  # taken now, before any test could replace them
    run.seal = _seal()


_UNSEALED = {"canarchy.testing.isolation.containment", "canarchy.testing.isolation.seal",
             "canarchy.testing.isolation._child"}


def _seal() -> Seal:
    """Every module of the isolation but those used only at entry, the guards' configuration,
    and the guards themselves (an attribute of their own would hide a method)."""
    modules = [m for name, m in sorted(sys.modules.items())
               if name.startswith("canarchy.testing.isolation.") and name not in _UNSEALED and m is not None]
    attributes = [(_access.GUARD, "protection"), (_access.GUARD, "_zones"), (_access.GUARD, "report_dir"),
                  (_guard.GUARD, "report_dir"), (os, "_exit"), (posix, "_exit"), (atexit, "register"),
                  *_import_machinery(),
                  *_c_openers.audited_c_openers()]
    seal = Seal(modules, attributes, instances=[_access.GUARD, _guard.GUARD])
    seal.extend(_guard_state(), contents=False)
    zones = _access.GUARD._zones  # made once by configure; its tables never change afterwards
    seal.extend([(zones, "__class__"), *((zones, name) for name in type(zones).__slots__)])
    return seal


def _guard_state() -> list[tuple[object, str]]:
    """The guards' own state by identity: their class (a subclass could override a method) and
    every attribute but those that change in a test (``enabled``, ``owner``, ``others_relink``)."""
    pairs: list[tuple[object, str]] = []
    for guard in (_access.GUARD, _guard.GUARD):
        pairs.append((guard, "__class__"))
        pairs += [(guard, name) for name in vars(guard) if name not in ("enabled", "owner", "others_relink")]
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
    """The operator's guarded paths the sentinel compares (:func:`_reachable`), keyed by path."""
    found: dict = {}
    with _access.GUARD.exempt():
        for path in run.guarded:
            base, name = os.path.split(path)
            found.update({os.path.join(base, k): v for k, v in _tree.snapshot(base, only=[name]).items()})
    return _reachable(run, found)


def _reachable(run: _Run, manifest: dict) -> dict:
    """``manifest`` without what lies under a path the mount view made unreachable: the sentinel
    checks the containment's covers of those instead (``plugin._covers_broken``)."""
    return {path: entry for path, entry in manifest.items()
            if not any(_containment._inside(path, shut) for shut in run.unreached)}


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


def require_containment(config: pytest.Config) -> None:
    """For a project's conftest.py (``pytest_configure``): enter the containment and the
    private network namespace even when the ini options were lost (``-c`` naming another
    configuration file). A no-op where they are in force already, in xdist workers, when
    ``-m`` asks for tests that use a real bus (for the network), and where the machine does
    not allow it (the header says why). An option the operator set with ``-o`` is theirs: it
    stands (the header says what is off)."""
    run = config.stash.get(_RUN, None)
    if run is not None:
        told = {item.split("=", 1)[0].strip() for item in getattr(config.option, "override_ini", None) or ()}
        _enter_containment(config, run, network=None if "canarchy_network_namespace" in told else True,
                           mounts=None if "canarchy_containment" in told else True)


def _set_owners(owner: str) -> None:
    _guard.GUARD.owner = owner
    _access.GUARD.owner = owner


def _opt_outs_of(item: pytest.Item) -> frozenset:
    """The opt-out markers (:data:`MARKERS`) an item carries now."""
    return frozenset(m.name for m in item.iter_markers() if m.name in MARKERS)
