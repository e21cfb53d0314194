"""The disposable home, the environment scrub, and re-pointing of import-time paths.

A :class:`Sandbox` owns one temporary root per pytest process: the session home, a fresh home and working
directory per test, and the bus-guard refusals written by child processes. The home moves through the
environment (HOME, USERPROFILE, XDG_*, APPDATA, LOCALAPPDATA), not by patching ``Path.home``, so children
inherit it. Layout and rules: ``docs/design/test-isolation.md`` ("Layer 1", "Layer 2"). No pytest import
here: the plugin drives it.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path, PurePath
from types import MappingProxyType
from typing import Any
from collections.abc import Iterable, Mapping

from canarchy.testing.isolation.importpaths import Finder, Stuck, Target
from canarchy.testing.isolation.protection import OPERATOR_HOMES_VARIABLE, PYTHON_CAN_SYSTEM_FILES
from canarchy.testing.isolation.tempbase import inside, mark_run, sweep_stale_runs

# Variables that decide where "home" is, on POSIX and Windows.
HOME_VARIABLES: Mapping[str, str] = {
    "HOME": "",
    "USERPROFILE": "",
    "XDG_CONFIG_HOME": ".config",
    "XDG_CACHE_HOME": ".cache",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
    "APPDATA": "AppData/Roaming",
    "LOCALAPPDATA": "AppData/Local",
}
# Prefixes of variables the product or python-can read as configuration.
SCRUBBED_PREFIXES = ("CANARCHY_", "CAN_")
#: The name of a run's temporary root begins so (in the run's temporary directory); what it hands pytest-xdist
#: workers lies beside it, its name followed by :data:`HANDED_SUFFIX` (:func:`~.handover.handed_directory`).
ROOT_PREFIX, HANDED_SUFFIX = "canarchy-pytest-", "-handed"

# The import-time constants the design names (REQ-TISO-03).
# The scan below finds these and any others; this list makes sure they are
# checked even if a scan were to miss them.
KNOWN_IMPORT_TIME_PATHS: tuple[tuple[str, str], ...] = (
    ("canarchy.dbc_cache", "_CACHE_ROOT"),
    ("canarchy.dbc_cache", "_CONFIG_PATH"),
    ("canarchy.skills_cache", "_CACHE_ROOT"),
    ("canarchy.skills_cache", "_CONFIG_PATH"),
    ("canarchy.j1587_metadata", "_PID_OVERRIDES_DEFAULT"),
    ("canarchy.j1939_metadata", "_SPN_OVERRIDES_DEFAULT"),
    ("canarchy.j2497_metadata", "_MID_OVERRIDES_DEFAULT"),
)
# Modules that are never re-pointed: the sandbox itself must remember the real home.
_EXEMPT_PREFIX = "canarchy.testing"

#: git's own variables kept for the programs the plugin starts: which configuration files it reads (the
#: operator's ignore rules). The others (``GIT_DIR``, ``GIT_INDEX_FILE``, ``GIT_CONFIG_COUNT``/``_KEY_n``...)
#: would point its git at another repository, index or configuration than the checkout's own.
GIT_CONFIG_SELECTORS = ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM")

#: Variables that name code the run itself runs on or starts (its interpreter, virtual environment, Python's
#: own settings, a version manager's or toolchain's tree): kept in the tests' environment even when they name
#: a path in the operator's home (:meth:`Sandbox.names_the_operator_s_files`), as is any variable naming a
#: path inside the running interpreter's trees or the checkout. ``PATH`` and ``PYTHONPATH`` are among them.
CODE_VARIABLES = frozenset({
    "PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONPYCACHEPREFIX", "PYTHONEXECUTABLE",
    "VIRTUAL_ENV", "PYENV_ROOT", "PYENV_DIR", "CONDA_PREFIX", "CONDA_EXE", "CONDA_PYTHON_EXE", "CONDA_ROOT",
    "RUSTUP_HOME", "JAVA_HOME", "GOROOT", "LD_LIBRARY_PATH", "LD_PRELOAD", "DYLD_LIBRARY_PATH", "SHELL"})


def scrub_python_can() -> list[str] | None:
    """Empty ``can.rc`` and keep python-can's config-file search inside the home
    (drop ``/etc/can.conf``). Returns the file list as it was before, or None
    while python-can is not imported (nothing to do yet)."""
    can = sys.modules.get("can")
    if can is None:
        return None
    rc = getattr(can, "rc", None)
    if isinstance(rc, dict) and rc:
        rc.clear()
    files = getattr(sys.modules.get("can.util"), "CONFIG_FILES", None)
    if not isinstance(files, list):
        return None
    original = list(files)
    files[:] = [f for f in files if f not in PYTHON_CAN_SYSTEM_FILES]
    return original


def modules_now() -> dict[str, Any]:
    """``sys.modules`` copied in one step: an entry a finalizer removes as a garbage collection runs it (jinja2's
    ``ModuleLoader`` drops its templates' module when collected) cannot change it in the middle of a walk."""
    return sys.modules.copy()


def is_scrubbed(name: str, prefixes: tuple[str, ...] = SCRUBBED_PREFIXES) -> bool:
    """True for a variable the suite removes (default: ``CANARCHY_*``, python-can's ``CAN_*``)."""
    return name.startswith(prefixes)


def _code_tree_forms(code_trees: Iterable[str], homes: set[str]) -> list[str]:
    """``code_trees`` as written and resolved (:func:`_forms`), but a tree that is one of ``homes`` or holds
    one (Python installed with ``--prefix=$HOME``): it keeps nothing of the home."""
    return [form for t in code_trees for form in _forms(t)
            if form not in homes and not any(h.startswith(form + os.sep) for h in homes)]


def _names_files_in(value: str, homes: set[str], trees: list[str]) -> bool:
    """Whether ``value`` (a path, or an ``os.pathsep`` list of them) names a path below one of ``homes`` that
    is none of ``trees`` nor below one (:func:`_code_tree_forms`), compared as written and as the OS resolves
    it (:func:`_forms`: ``/home/me/.gitconfig`` where ``/home`` links to ``/var/home``)."""
    for element in value.split(os.pathsep):
        if os.path.isabs(element):
            forms = _forms(element)
            if any(_under_any(p, homes) for p in forms) and not any(p in trees or _under_any(p, trees)
                                                                    for p in forms):
                return True
    return False


def _under_any(path: str, tops: Iterable[str]) -> bool:
    """Whether normalised ``path`` lies below one of ``tops``."""
    return any(path.startswith(top + os.sep) for top in tops)


def home_environment(home: Path) -> dict[str, str]:
    """The home variables pointing into ``home``."""
    return {name: str(home / sub) if sub else str(home) for name, sub in HOME_VARIABLES.items()}


def apply_environment(target: Mapping[str, str], environ: os._Environ | dict | None = None) -> None:
    """Make ``environ`` (default ``os.environ``) equal to ``target``, touching only what differs."""
    environ = os.environ if environ is None else environ
    current = environ.copy()
    for name in current.keys() - target.keys():
        del environ[name]
    for name, value in target.items():
        if current.get(name) != value:
            environ[name] = value


def changes_since(entered: Mapping[str, str], now: Mapping[str, str],
                  skip: tuple[str, ...] = ()) -> dict[str, str | None]:
    """What differs in ``now`` from the environment ``entered``: each variable set or changed since, with its
    value, each removed since, with None; a name with a prefix in ``skip`` left out."""
    changes: dict[str, str | None] = {k: v for k, v in now.items() if not k.startswith(skip) and entered.get(k) != v}
    changes.update({k: None for k in entered if k not in now and not k.startswith(skip)})
    return changes


def _forms(path: str) -> set[str]:
    """An absolute ``path`` as written (``normpath``: ``..`` folded on the text) and as the OS resolves it
    (``realpath``: each symlink followed, ``//`` made ``/``), each once."""
    written = os.path.normpath(path)
    if written.startswith(os.sep * 2):  # POSIX keeps a leading "//"; Linux reads it as "/"
        written = os.sep + written.lstrip(os.sep)
    return {written, os.path.realpath(path)}


class Sandbox:
    """The plain object behind the plugin: homes, environment, import-time paths.

    ``operator_env``: the environment as the operator had it (restored for
    tests that opt out); ``real_home``: the operator's home directory.
    """

    def __init__(self, operator_env: Mapping[str, str] | None = None, parent: str | None = None, *,
                 scrub_prefixes: tuple[str, ...] = SCRUBBED_PREFIXES, scan_packages: tuple[str, ...] = ("canarchy",),
                 account_home: str | None = None, code_trees: tuple[str, ...] = (),
                 keep_variables: tuple[str, ...] = ()) -> None:
        self.operator_env = dict(os.environ if operator_env is None else operator_env)
        self.scrub_prefixes = scrub_prefixes
        self.keep_variables = keep_variables  # prefixes (``canarchy_keep_variables``): kept wherever they point
        #: The environment of the programs the plugin itself starts (git), read-only: the operator's, their home
        #: and configuration kept, without the scrubbed variables (a test's process could read them from those
        #: programs) and git's variables but :data:`GIT_CONFIG_SELECTORS`.
        self.tool_env: Mapping[str, str] = MappingProxyType({
            k: v for k, v in self.operator_env.items()
            if not is_scrubbed(k, scrub_prefixes) and (not k.startswith("GIT_") or k in GIT_CONFIG_SELECTORS)})
        self.scan_packages = scan_packages
        self.real_home = Path(self.operator_env.get("HOME") or os.path.expanduser("~")).resolve()
        # roots of runs killed before their cleanup, and the operator's environment they handed their workers
        sweep_stale_runs(parent or tempfile.gettempdir(), ROOT_PREFIX, beside=(HANDED_SUFFIX,))
        self.root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX, dir=parent)).resolve()
        mark_run(self.root)
        self.session_home = self.root / "home"
        self.session_home.mkdir()
        self.refusal_dir = self.root / "refusals"
        self.refusal_dir.mkdir()
        self.session_env: dict[str, str] = {}
        self._tests = 0
        self.real_homes = list(dict.fromkeys(
            [str(self.real_home), *(str(Path(h).resolve()) for h in (account_home,) if h)]))
        #: Where the run's own code lives (the interpreter's prefixes and ``code_trees``, the checkout): a
        #: variable naming a path inside one stays in the tests' environment wherever it lies.
        self.code_trees = tuple(dict.fromkeys(os.path.normpath(t) for t in (
            sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
            *code_trees) if t and os.path.isabs(t)))
        self._home_forms: set[str] | None = None  # the real homes, and the code trees, as written and resolved
        self._tree_forms: list[str] = []
        self._targets: list[Target] = []
        self.stuck: list[Stuck] = []
        self._stuck_reported = 0
        self._scanned: set[str] = set()
        self._modules_seen = -1
        self._python_can_files: list[str] | None = None
        self._spare: tuple[Path, Path] | None = None
        self._home_envs: dict[Path, dict[str, str]] = {}

    # -- environments ------------------------------------------------------
    def isolated_environment(self, home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: the operator's) without scrubbed variables (nor the caller's homes a lane handed the
        plugin, :data:`~.protection.OPERATOR_HOMES_VARIABLE`), homes moved to ``home``."""
        env = {k: v for k, v in (self.operator_env if base is None else base).items()
               if not is_scrubbed(k, self.scrub_prefixes) and not self.names_the_operator_s_files(k, v)
               and k != OPERATOR_HOMES_VARIABLE}
        env.update(home_environment(home))
        return env

    def names_the_operator_s_files(self, name: str, value: str) -> bool:
        """Whether variable ``name`` points a program at the operator's files: its value, or an element of a
        ``os.pathsep`` list, is an absolute path in a real home, as written or resolved (a symlink to the home
        or into it; ``GIT_CONFIG_GLOBAL``, ``PIP_CONFIG_FILE``,
        ``PYTHONSTARTUP``, ``KUBECONFIG``, ``CARGO_HOME``...; a ``git config --global`` would write there;
        a value that is the home itself names none of its files).
        Such a variable is left out of the tests' environment, so the program takes its default, under the
        test's home. Not one of :data:`CODE_VARIABLES` or of the project's ``canarchy_keep_variables``, nor one
        whose paths lie inside the running interpreter's trees or the checkout (a virtualenv in the home; the run
        needs that code)."""
        if name in CODE_VARIABLES or name in HOME_VARIABLES or os.sep not in value or (
                self.keep_variables and name.startswith(self.keep_variables)):
            return False
        if self._home_forms is None:  # once: every variable of the environment is asked about
            self._home_forms = {form for h in (*self.real_homes, self.operator_env.get("HOME") or "")
                                if h and os.path.isabs(h) for form in _forms(h) if form != os.sep}
            self._tree_forms = _code_tree_forms(self.code_trees, self._home_forms)
        return _names_files_in(value, self._home_forms, self._tree_forms)

    def home_environment(self, home: Path) -> dict[str, str]:
        """:func:`home_environment` of ``home``, remembered: test homes are reused
        while tests leave them empty, so the same few are asked for again."""
        env = self._home_envs.get(home)
        if env is None:
            env = self._home_envs[home] = home_environment(home)
        return env

    def enter_session(self, extra: Mapping[str, str] | None = None) -> None:
        """The early layer: move this process into the session home, scrubbed."""
        env = self.isolated_environment(self.session_home)
        env.update(extra or {})
        self.session_env = env
        apply_environment(env)
        self.rebase(self.session_home)

    def new_test_dirs(self) -> tuple[Path, Path]:
        """Return ``(home, cwd)`` for the next test: both exist and are empty.

        A pair a test left empty and unchanged is handed to the next test
        instead of creating two more directories (``mkdir`` costs ~0.3 ms on
        some file systems, more than the rest of the isolation together).
        """
        if self._spare is not None:
            pair, self._spare = self._spare, None
            return pair
        self._tests += 1
        base = self.root / "tests" / str(self._tests)
        home, cwd = base / "home", base / "cwd"
        os.makedirs(home, mode=0o700)
        os.mkdir(cwd, mode=0o700)
        return home, cwd

    def release_test_dirs(self, home: Path, cwd: Path) -> None:
        """Offer a test's directories for reuse if they are still empty, unchanged directories (not a
        symlink a test put in their place: the next test's home would be wherever it points)."""
        try:
            for path in (home, cwd):
                if os.lstat(path).st_mode != stat.S_IFDIR | 0o700:
                    return
                with os.scandir(path) as entries:
                    if next(entries, None) is not None:
                        return
        except OSError:
            return
        self._spare = (home, cwd)

    def cleanup(self) -> None:
        """Remove the temporary root (end of the session)."""
        shutil.rmtree(self.root, ignore_errors=True)

    # -- python-can's ambient configuration --------------------------------
    def scrub_python_can(self) -> None:
        """See :func:`scrub_python_can`; remembers python-can's original file list."""
        original = scrub_python_can()
        if original is not None and self._python_can_files is None:
            self._python_can_files = original

    def python_can_expected(self) -> tuple[dict, list[str]] | None:
        """What isolated tests find in python-can's globals: ``(can.rc, CONFIG_FILES)`` contents."""
        if self._python_can_files is None:
            return None
        return {}, [f for f in self._python_can_files if f not in PYTHON_CAN_SYSTEM_FILES]

    def restore_python_can(self) -> None:
        """Give python-can back its original config-file list (for opt-out tests)."""
        util = sys.modules.get("can.util")
        files = getattr(util, "CONFIG_FILES", None)
        if isinstance(files, list) and self._python_can_files is not None:
            files[:] = self._python_can_files

    # -- import-time paths -------------------------------------------------
    def _relative_home_path(self, value: Any) -> tuple[PurePath, type] | None:
        """If ``value`` is a path (str, bytes or ``PurePath``) under a home this sandbox knows
        (a real home, the session home or any test home): ``(path relative to it, its type)``."""
        if isinstance(value, PurePath):
            text = str(value)
        elif isinstance(value, str) and value.startswith(os.sep) and len(value) < 4096:
            text = value
        elif isinstance(value, bytes) and value.startswith(os.fsencode(os.sep)) and len(value) < 4096:
            text = os.fsdecode(value)
        else:
            return None
        kind = type(value)
        root = str(self.root)
        if inside(text, root):
            parts = PurePath(text).relative_to(self.root).parts
            if parts[:1] == ("home",):
                return PurePath(*parts[1:]), kind
            if parts[:1] == ("tests",) and parts[2:3] == ("home",):
                return PurePath(*parts[3:]), kind
            return None
        for real in self.real_homes:
            if text == real or text.startswith(real + os.sep):  # a home of / holds only /
                return PurePath(text).relative_to(real), kind
        return None

    def _contains_real_home(self, text: str) -> bool:
        return any(real + os.sep in text for real in self.real_homes if real != os.sep)

    def scan(self, force: bool = False) -> list[Target]:
        """Find import-time home paths in the scanned packages' modules not scanned yet (all of
        them with ``force``); returns the new targets (see :mod:`.importpaths`)."""
        if not force and len(sys.modules) == self._modules_seen:
            return []
        self._modules_seen = len(sys.modules)
        finder = Finder(self._relative_home_path, self._contains_real_home, self.scan_packages)
        for name, module in modules_now().items():
            if module is None or not self._scanned_package(name) or name.startswith(_EXEMPT_PREFIX):
                continue
            if name in self._scanned and not force:
                continue
            self._scanned.add(name)
            finder.walk_module(name, module)
        known = {t.name for t in self._targets}
        new = [t for t in finder.targets if t.name not in known]
        self._targets.extend(new)
        self.stuck.extend(s for s in finder.stuck if s not in self.stuck)
        return new

    def _scanned_package(self, name: str) -> bool:
        """Whether module ``name`` belongs to a package whose import-time paths are scanned."""
        return any(name == p or name.startswith(p + ".") for p in self.scan_packages)

    def rebase(self, home: Path) -> None:
        """Point every import-time home path found so far at ``home``; a holder that refuses
        the new value joins :attr:`stuck`."""
        self.scan()
        for target in list(self._targets):
            try:
                target.point(home)
            except (AttributeError, TypeError, ValueError) as exc:
                self._targets.remove(target)
                self.stuck.append(Stuck(target.name, str(target.current()), f"its holder refuses a new value ({exc})"))

    def take_stuck(self) -> list[Stuck]:
        """Return and forget the home paths found since the last call that cannot be re-pointed."""
        taken = self.stuck[self._stuck_reported:]
        self._stuck_reported = len(self.stuck)
        return taken

    def paths_under_real_home(self) -> list[str]:
        """Audit: every value the scan can reach in the scanned packages that still holds a path
        under a real home (``module.attribute[key] = path``), and every one it cannot re-point."""
        finder = Finder(lambda value: self._under_real(value), self._contains_real_home, self.scan_packages)
        for name, module in modules_now().items():
            if module is not None and self._scanned_package(name) and not name.startswith(_EXEMPT_PREFIX):
                finder.walk_module(name, module)
        return [f"{t.name} = {t.current()}" for t in finder.targets] + [f"{s.name} = {s.value} ({s.reason})"
                                                                          for s in finder.stuck]

    def _under_real(self, value: Any) -> tuple[PurePath, type] | None:
        found = self._relative_home_path(value)
        if found is None:
            return None
        text = os.fsdecode(value) if isinstance(value, bytes) else str(value)
        return found if any(text == r or text.startswith(r + os.sep) for r in self.real_homes) else None


class SandboxView:
    """What a test is given of the session's :class:`Sandbox` (the ``canarchy_sandbox`` fixture,
    ``active_sandbox()``): its directories, the operator's home path (every access there is refused)
    and the audit of import-time home paths; never the operator's environment. Read-only."""

    __slots__ = ("_sandbox", "real_home", "root", "session_home")

    def __init__(self, sandbox: Sandbox) -> None:
        for name, value in (("root", sandbox.root), ("session_home", sandbox.session_home),
                            ("real_home", sandbox.real_home), ("_sandbox", sandbox)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the session's sandbox is read-only to a test ({name})")

    __delattr__ = __setattr__

    def paths_under_real_home(self) -> list[str]:
        """:meth:`Sandbox.paths_under_real_home`."""
        return self._sandbox.paths_under_real_home()

    def rebase(self, home: Path) -> None:
        """:meth:`Sandbox.rebase`."""
        self._sandbox.rebase(home)
