"""The plugin's session layer: what one pytest process enters once, before collection.

The run's state (:class:`_Run`, in ``config.stash``), the disposable session home behind both
guards (the containment entered by :mod:`.plan`, the process's end guarded by :mod:`.exits`), the
seal over the isolation's own code, the opt-out markers. Design: ``docs/design/test-isolation.md``
(layer 1).
"""

from __future__ import annotations

import ast
import atexit
import logging
import os
import posix
import socket
import stat
import sys
import tempfile
from dataclasses import dataclass, field, replace
from collections.abc import Callable

import pytest

from canarchy.testing.isolation import CHILD_HOOK_DIR, PACKAGE_PARENT
from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import descriptors as _descriptors
from canarchy.testing.isolation import audithook as _audithook
from canarchy.testing.isolation import c_openers as _c_openers
from canarchy.testing.isolation import containment as _containment
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation import handover as _handover
from canarchy.testing.isolation import interfaces as _interfaces
from canarchy.testing.isolation import kernel as _kernel
from canarchy.testing.isolation import protection as _protection
from canarchy.testing.isolation import reaper as _reaper
from canarchy.testing.isolation import signals as _signals
from canarchy.testing.isolation import tempbase as _tempbase
from canarchy.testing.isolation.procstate import STATE as _STATE
from canarchy.testing.isolation.procstate import erase_start_up_environment as _erase_start_up_environment
from canarchy.testing.isolation.procstate import give_up_the_terminal as _give_up_the_terminal
from canarchy.testing.isolation.procstate import keep_memory_private as _keep_memory_private
from canarchy.testing.isolation import tree as _tree
from canarchy.testing.isolation.sandbox import Sandbox, SandboxView, changes_since, modules_now
from canarchy.testing.isolation.seal import Seal
from canarchy.testing.isolation.exits import (_guard_the_exit, _name_exit_handlers, _stop_on_sigterm,
                                             _the_process_ends_with)
from canarchy.testing.isolation.plan import (_code_trees_beside, _enter_containment, _pytest_s_named_trees,
                                             _pytest_s_own_trees, _pytest_s_staging, _reachable)
from canarchy.testing.isolation.settings import Settings, _is_worker, real_bus_asked

MARKERS = {
    "integration": "uses the real environment and a real CAN bus; deselected unless -m names it",
    "real_bus": "may open a real CAN bus (the guard stands down); the home stays isolated; "
                "deselected unless -m names it",
    "real_home": "sees the operator's real home and environment; the bus guard stays on; "
                 "deselected unless -m names it",
}


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
    unreached: frozenset[str] = frozenset()  # guarded paths the mount view made unreachable (plan._unreached)
    # CAN adapters' device nodes present at the start: refused and covered (none when -m asks for a real bus)
    adapter_devices: tuple[str, ...] = ()
    # the device nodes of the operator's terminal (protection.operator_terminals): refused and covered too
    terminals: tuple[str, ...] = ()
    # the operator's files the guard refuses beyond ``guarded`` that exist (./can.ini, ./.canarchy): covered too
    refused_files: tuple[str, ...] = ()
    network_note: str = ""
    # the mount view's mounts when it was entered (containment.mount_table) and /proc's st_dev; None without it
    mounts_at_start: dict[str, tuple[str, str]] | None = None
    proc_device: int = 0
    header: list[str] = field(default_factory=list)
    plugins_not_loaded: list[str] = field(default_factory=list)  # installed, not loaded (plugin._plugins_not_loaded)
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
    # scrubbed variables set outside any test (a conftest, collection, a wider fixture) and removed: name -> the
    # test before which they were removed; shown in the terminal summary (pertest.isolate_canarchy_state)
    scrubbed_outside: dict[str, str] = field(default_factory=dict)
    subreaper: bool = False  # this process adopts its descendants whose parent ended (so none is out of sight)
    process_owners: dict[int, str] = field(default_factory=dict)  # pid -> the test at whose end it was running
    last_look: Callable[[str], None] | None = None  # that look with a reason, for an os._exit before the end
    last_lines: list[str] = field(default_factory=list)  # what the last look has found so far
    exit_status: int = 0  # the session's, as the sentinel left it
    failed_reports: int = 0  # test reports that failed, counted here: a test can zero pytest's own count


_RUN = pytest.StashKey[_Run]()
_ACTIVE: list[Sandbox] = []


def active_sandbox() -> SandboxView | None:
    """A view of the :class:`Sandbox` of the pytest run configured in this process, or None when the
    plugin is not active here. For helpers that must refuse to write anywhere but a disposable home."""
    return SandboxView(_ACTIVE[0]) if _ACTIVE else None


_inside = _tempbase.inside


def _leave_the_operator_s_process_state(run: _Run) -> None:
    """After the containment: this process's memory (where the operator's environment is kept) unreadable to
    what tests start, and a session keyring of the run's own; what could not be done goes into the header."""
    private = _keep_memory_private()
    if private:
        run.header.append(private)
    try:  # the operator's login session keyring (tickets, tokens) is not the run's: a key read or left there
        _kernel.join_new_session_keyring()
    except OSError as exc:
        if sys.platform.startswith("linux"):
            run.header.append(f"the operator's session keyring stays reachable from the tests ({exc.strerror})")


def _take_the_terminals(config: pytest.Config, run: _Run) -> None:
    """The operator's terminal: its device nodes (refused, covered) and numbers (a change through a descriptor of
    it is refused): found before pytest gives it up and the containment covers them. A worker takes them, and
    the private network namespace it shares, from the controller (:func:`~.plugin.pytest_configure_node`; the
    controller's namespace is taken as it enters the containment, :func:`~.plan._enter_containment`)."""
    if _is_worker(config):
        terminals, devices = config.workerinput.pop("canarchy_terminals", ((), ()))
        run.terminals, _access.GUARD.terminals = tuple(terminals), frozenset(devices)
        _access.GUARD.network_namespace = config.workerinput.pop("canarchy_network_namespace", 0)
    else:
        run.terminals = tuple(_protection.operator_terminals())
        _access.GUARD.terminals = _signals.devices(run.terminals)


def _keep_dev_tty_from_the_tests() -> None:
    """pytest keeps the operator's terminal (it leads its session, or could not give it up): ``/dev/tty``, each
    process's own controlling terminal, is then the operator's for pytest and what a test starts, and a change
    through a descriptor of it is refused like one through its node (:func:`_take_the_terminals`). Opened, it is
    not refused, nor covered: a covered ``/dev/tty`` is a file, and a pytest a test runs on a terminal of its own
    could not give that one up (canarchy's own tests do)."""
    _access.GUARD.terminals |= _signals.devices(["/dev/tty"])


def _watched_state(settings: Settings, homes: list[str]) -> list[str]:
    """The guarded paths (``canarchy_guarded_paths``), and in each home the operator state the guard refuses
    whatever they say (:func:`~.protection.home_state`): the sentinel watches what the guard refuses."""
    return list(dict.fromkeys([*settings.guarded_under(homes), *_protection.home_state(homes)]))


def _start(config: pytest.Config, where: str) -> None:
    """Move this process into the disposable session home behind the guards (once)."""
    settings = Settings.from_config(config)
    operator_env, handed = _handover.operator_env_of(config)
    account_home = _tempbase.account_database_home()
    homes = _protection.operator_homes(operator_env, account_home)
    guarded = _watched_state(settings, homes)
    if not _is_worker(config):
        _refuse_inherited_descriptors(guarded, homes, config, settings)
        if os.path.realpath(config.rootpath) in homes:
            raise pytest.UsageError(
                f"canarchy test isolation: the rootdir is the operator's home ({config.rootpath}): the checkout "
                "is writable and the home is not. Run pytest from the project (its pytest.ini, pyproject.toml "
                "or tox.ini sets the rootdir), or pass --rootdir.")
        _refuse_writable_trees_in_the_home(config, homes)
    temp_base, temp_note = _tempbase.temp_base([*((h, "the operator's home") for h in homes),
                                                (str(config.rootpath), "the checkout")])
    sandbox = Sandbox(operator_env, temp_base, scrub_prefixes=settings.scrub_prefixes,
                      scan_packages=settings.scan_packages, account_home=account_home,
                      code_trees=(str(config.rootpath),), keep_variables=settings.keep_variables)
    atexit.register(sandbox.cleanup)  # also when pytest stops before pytest_unconfigure (a refused conftest)
    run = _Run(settings, sandbox, where, homes, guarded, temp_base=temp_base)
    run.adapter_devices = () if real_bus_asked(config) else tuple(_protection.can_adapter_devices())
    _take_the_terminals(config, run)
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
    _stop_on_sigterm(config)
    kept = _give_up_the_terminal()  # the operator's shell reads what a process with the terminal types into it
    if kept:
        run.header.append(kept)
        _keep_dev_tty_from_the_tests()
    # A child that is not Python reads /proc/PID/environ with no guard: erase what it shows
    # (before the containment covers the file this reads to find it).
    if not _erase_start_up_environment():
        run.header.append("the environment pytest was started with stays in /proc/PID/environ (not found in "
                          "its memory): a child that is not Python can read it there")
    protection = _protection.default_protection(operator_env, account_home, cwd=str(config.invocation_params.dir),
                                                temp=run.temp_base)
    protection = replace(protection, refused=(*protection.refused, *run.terminals))  # refused, and covered
    run.refused_files = tuple(p for p in protection.refused if p not in guarded and not p.startswith("/proc/")
                              and os.path.lexists(p))
    _enter_containment(config, run)
    _leave_the_operator_s_process_state(run)
    protection = _protection.Protection(
        # a CAN adapter's device node too: a serial port, which no network namespace stops
        refused=tuple(dict.fromkeys([*protection.refused, *run.guarded, *run.adapter_devices])),
        read_only=(*protection.read_only, *_code_trees_beside(config, operator_env, temp_base)),
        writable=(*protection.writable, str(sandbox.root), *_pytest_s_own_trees(config)),
        watched=(str(config.rootpath),), staging=_pytest_s_staging(config))
    # where the controller hands its workers the operator's variables: refused, not covered (made later)
    protection = replace(protection, refused=(*protection.refused, str(_handover.handed_directory(sandbox)), *handed))
    _access.GUARD.configure(protection)
    _access.GUARD.report_dir = sandbox.refusal_dir
    # the run's top pytest: a pytest-xdist worker's is its parent, the subreaper its tests' orphans go to
    _access.GUARD.run_pid = os.getppid() if _is_worker(config) else os.getpid()
    _access.GUARD.owner = _START_UP
    _STATE.expected_python_can = sandbox.python_can_expected
    _audithook.observe("os.putenv", _STATE.on_putenv)
    _audithook.observe("os.unsetenv", _STATE.on_unsetenv)
    _audithook.install()
    _access.GUARD.enabled = True
    set_early = _set_before_the_start(config)
    pythonpath = [CHILD_HOOK_DIR, PACKAGE_PARENT]
    if operator_env.get("PYTHONPATH"):
        pythonpath.append(operator_env["PYTHONPATH"])
    with _access.GUARD.exempt():  # in a child of a guarded test, its own children's configuration replaces the parent's
        sandbox.enter_session({
            # an xdist worker's own identity (PYTEST_XDIST_WORKER, ...) is not the controller's
            **{k: v for k, v in os.environ.items() if k.startswith("PYTEST_XDIST_")},
            **({"TMPDIR": temp_base} if temp_note else {}),
            **_access.GUARD.to_environment(),
            "PYTEST_CANARCHY_GUARD": "1",
            "PYTEST_CANARCHY_GUARD_DIR": str(sandbox.refusal_dir),
            "PYTHONPATH": os.pathsep.join(pythonpath),
        })
    _access.GUARD.child_variables.update({name: os.environ[name] for name in _access.CHILD_VARIABLES})
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    _STATE.changed_between_tests()  # the session's own environment is not a test's doing
    _set_again(set_early)  # a worker's conftests' own doing, as in a run without workers
    _guard.GUARD.owner = _START_UP
    _guard.GUARD.report_dir = sandbox.refusal_dir
    _guard.GUARD.enabled = True
    _access.GUARD.thread_owners = _guard.GUARD.thread_owners  # one map of left-running threads, read by both
    _guard.install()
    _guard.after_import("can.interface", sandbox.scrub_python_can)
    logging.getLogger("can.bus").addHandler(_SHUTDOWN_RECORDS)
    _protection.import_writers()  # taken now, before any test could replace them
    run.seal = _seal(sandbox)


def _set_before_the_start(config: pytest.Config) -> dict[str, str | None]:
    """A pytest-xdist worker's isolation starts at ``pytest_configure``, after its initial conftests (and its
    controller's) set or removed variables: those, against the controller's session environment, which the
    worker started with (None: removed); none outside a worker. Without them a variable a conftest sets at
    import would reach the tests of a run without workers, and not those of a worker."""
    entered = config.workerinput.pop("canarchy_session_env", None) if _is_worker(config) else None
    if entered is None:
        return {}
    # not the worker's identity, nor its isolation's own
    return changes_since(entered, os.environ, skip=("PYTEST_XDIST_", "PYTEST_CANARCHY_"))


def _set_again(variables: dict[str, str | None]) -> None:
    """Set ``variables`` through ``os.environ`` (None: remove), seen as set outside any test."""
    for key, value in variables.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


_UNSEALED = {"canarchy.testing.isolation.containment", "canarchy.testing.isolation.kernel",
             "canarchy.testing.isolation.mountview", "canarchy.testing.isolation.seal",
             "canarchy.testing.isolation._child"}


def _seal(sandbox: Sandbox) -> Seal:
    """Every module of the isolation but those used only at entry, the guards' configuration,
    the guards themselves (an attribute of their own would hide a method), and the environment
    of the programs the plugin starts."""
    modules = [m for name, m in sorted(modules_now().items())
               if name.startswith("canarchy.testing.isolation.") and name not in _UNSEALED and m is not None]
    attributes = [(_access.GUARD, "protection"), (_access.GUARD, "_zones"), (_access.GUARD, "report_dir"),
                  (_access.GUARD, "child_variables"),
                  (_guard.GUARD, "report_dir"), (sandbox, "tool_env"), (os, "_exit"), (posix, "_exit"),
                  (atexit, "register"),
                  *_import_machinery(),
                  *_c_openers.audited_c_openers()]
    seal = Seal(modules, attributes, instances=[_access.GUARD, _access.GUARD.paths, _guard.GUARD])
    seal.extend(_guard_state(), contents=False)
    seal.extend([(_audithook, name) for name in _audithook.SEAL_SKIPS], contents=False)
    zones = _access.GUARD._zones  # made once by configure; its tables never change afterwards
    seal.extend([(zones, "__class__"), *((zones, name) for name in type(zones).__slots__)])
    return seal


def _guard_state() -> list[tuple[object, str]]:
    """The guards' own state by identity: their class (a subclass could override a method) and
    every attribute but those that change in a test (``enabled``, ``owner``, ``others_relink``)."""
    pairs: list[tuple[object, str]] = []
    for guard in (_access.GUARD, _access.GUARD.paths, _guard.GUARD):
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


def _refuse_inherited_descriptors(guarded: list[str], homes: list[str], config: pytest.Config,
                                  settings: Settings) -> None:
    """Refuse a run started with a directory descriptor open (paths resolved through it pass by
    the containment's view and the access guard), one open on the operator's state, or one beyond the standard
    streams open for writing on a file of an operator home outside the checkout (``4>>~/.bashrc``: a write
    through it is never judged); with the containment, one open to read a file of a tree its
    view makes read-only (an operator home outside the checkout, the interpreter's trees; ``pytest <
    ~/.bashrc``): a child reopens it for writing by ``/proc/self/fd/N``, which names the file on the mount it
    was opened on, not the view's. A socket of a family that reaches a bus or the host's network configuration
    (:func:`_inherited_socket`) refuses it too; with a private network namespace, any socket but a Unix one: a
    write to it needs no privilege and leaves by the namespace it was made in."""
    rootdir = os.path.realpath(config.rootpath)
    private_network = settings.network_namespace and not real_bus_asked(config)
    read_only = [*homes, *{os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}] \
        if settings.containment else []
    found = [why for fd, status in _descriptors.open_descriptors()
             if (why := _inherited(fd, status, guarded, homes, rootdir, read_only, private_network)) is not None]
    if found:
        raise pytest.UsageError(
            "canarchy test isolation: pytest was started with a descriptor its protections cannot see "
            "through (files opened through it pass by the containment's view and the access guard): "
            + "; ".join(found) + ". Start pytest without it (in a shell, `exec N<&-` closes descriptor N; "
            "`flock -o` closes the lock's before running the command).")


def _inherited(fd: int, status: os.stat_result, guarded: list[str], homes: list[str], rootdir: str,
               read_only: list[str], private_network: bool) -> str | None:
    """Why descriptor ``fd`` (``status``) refuses the run (:func:`_refuse_inherited_descriptors`), else None."""
    target = _descriptors.descriptor_path(fd) or "?"
    if stat.S_ISDIR(status.st_mode):
        return f"descriptor {fd} is open on the directory {target}"
    if stat.S_ISSOCK(status.st_mode):
        return _inherited_socket(fd, private_network)
    if any(_inside(target, g) for g in guarded):
        return f"descriptor {fd} is open on {target}, the operator's own state"
    if not status.st_nlink or _inside(target, rootdir):  # unlinked: pytest's capture (in a home TMPDIR too)
        return None
    if _descriptors.opened_for_writing(fd):
        return f"descriptor {fd} is open for writing on {target}, in the operator's home" if fd > 2 and any(
            _inside(target, h) for h in homes) else None
    if stat.S_ISREG(status.st_mode) and any(_inside(target, tree) for tree in read_only):
        return (f"descriptor {fd} is open (to read) on {target}, in a tree the containment makes read-only: a "
                f"child would reopen it for writing by /proc/self/fd/{fd}")
    return None


def _inherited_socket(fd: int, private_network: bool) -> str | None:
    """Why socket descriptor ``fd`` refuses the run: one of a family the bus guard refuses to open, or netlink (a
    write to it reaches a bus or the host's network configuration, in any namespace); with a private network
    namespace (``private_network``), any but a Unix socket (it stays in the host's network). Else None."""
    family = _interfaces.socket_family(fd)
    if family in _guard.REFUSED_FAMILIES:
        name = _guard.REFUSED_FAMILIES[family][0]
        return f"descriptor {fd} is a {name} socket, which reaches a bus or another machine"
    if family == _interfaces.AF_NETLINK:
        return f"descriptor {fd} is a netlink socket, which reaches the kernel's network configuration"
    if private_network and family not in (socket.AF_UNIX, None):
        return (f"descriptor {fd} is a socket of the host's network (family {family}), outside the run's private "
                "network namespace")
    return None


def _guarded_manifest(run: _Run) -> dict:
    """The operator's guarded paths the sentinel compares (:func:`_reachable`), keyed by path."""
    found: dict = {}
    with _access.GUARD.exempt():
        for path in run.guarded:
            base, name = os.path.split(path)
            found.update({os.path.join(base, k): v for k, v in _tree.snapshot(base, only=[name]).items()})
    return _reachable(run, found)


def _check_configuration(config: pytest.Config) -> None:
    """Name a pytest configuration that shadows the project's own (a stray pytest.toml, pytest.ini, tox.ini or
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


def _refuse_writable_trees_in_the_home(config: pytest.Config, homes: frozenset[str] | set[str]) -> None:
    """A tree pytest and the test tools write as their own (:func:`~.plan._pytest_s_named_trees`: ``--basetemp``,
    given on the command line or in ``PYTEST_ADDOPTS``, ``cache_dir``, a tool's cache) that lies, or leads
    through a link, into the operator's home outside the checkout: every test could write there, as pytest
    was told. Refused at the start (``TMPDIR`` there is moved aside: the run's own temporary files; these the
    operator named, or a link a test left in the checkout made)."""
    root = os.path.realpath(config.rootpath)
    for what, given, path in _pytest_s_named_trees(config):
        # where pytest writes, and where a "~" it takes as a name would have it write
        for resolved in {os.path.realpath(path), os.path.realpath(os.path.abspath(os.path.expanduser(given)))}:
            home = next((h for h in homes if _tempbase.inside(resolved, os.path.realpath(h))), None)
            if home is not None and not _tempbase.inside(resolved, root):
                break
        else:
            continue
        link = f" (a link to {resolved})" if os.path.islink(path) else ""
        raise pytest.UsageError(
            f"canarchy test isolation: {what} {given}{link} lies in the operator's home ({home}): every test "
            "could write there. Give a directory outside the home (or in the checkout), or leave the option out; "
            "remove a link a test left there.")
