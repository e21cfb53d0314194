"""The disposable home, the environment scrub, and re-pointing of import-time paths.

A :class:`Sandbox` owns one temporary root per pytest process::

    <root>/home            the session home (collection, module/session fixtures)
    <root>/tests/<n>/home  a fresh, empty home per test
    <root>/tests/<n>/cwd   a fresh working directory per test
    <root>/refusals        bus-guard refusals written by child processes

The home is moved through the environment (HOME, USERPROFILE, XDG_*, APPDATA,
LOCALAPPDATA), not by patching ``Path.home``, so child processes inherit it
and a test may still set its own HOME. Module attributes that captured a
home path at import time (and function default arguments) are found by
scanning the ``canarchy`` modules and re-pointed at the current home.

No pytest import here: the plugin drives it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Iterable, Mapping

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

# The import-time constants named by the original design (seed 000, REQ-TISO-03).
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

# python-can's user config files live under "~"; the absolute one does not.
PYTHON_CAN_ABSOLUTE_CONFIG_FILES = ("/etc/can.conf",)


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
    files[:] = [f for f in files if f not in PYTHON_CAN_ABSOLUTE_CONFIG_FILES]
    return original


def is_scrubbed(name: str) -> bool:
    """True for a variable the suite removes (``CANARCHY_*``, python-can's ``CAN_*``)."""
    return name.startswith(SCRUBBED_PREFIXES)


def home_environment(home: Path) -> dict[str, str]:
    """The home variables pointing into ``home``."""
    return {name: str(home / sub) if sub else str(home) for name, sub in HOME_VARIABLES.items()}


def apply_environment(target: Mapping[str, str], environ: os._Environ | dict = os.environ) -> None:
    """Make ``environ`` equal to ``target``, touching only what differs."""
    current = environ.copy()
    for name in current.keys() - target.keys():
        del environ[name]
    for name, value in target.items():
        if current.get(name) != value:
            environ[name] = value


class EnvironmentSnapshot:
    """``os.environ`` as it was at one moment, to be put back later.

    Per test this is taken once and restored once, so it is built for speed
    (``docs/benchmarks.md``, isolation): on POSIX CPython it copies the
    interpreter's own bytes mapping behind ``os.environ`` (one C-level dict
    copy, where ``os.environ.copy()`` decodes every key and value), compares
    it in one C-level ``==`` and writes back only the keys that differ through
    ``os.environb``, which shares that mapping and calls ``putenv``/``unsetenv``.
    Where that mapping is not there (Windows, another interpreter) it falls
    back to ``os.environ.copy()`` and :func:`apply_environment`. Either way
    the result is the same: ``os.environ`` (and the C environment children
    inherit) equal to the snapshot.
    """

    __slots__ = ("_saved", "_raw")

    def __init__(self) -> None:
        raw = getattr(os.environ, "_data", None) if os.supports_bytes_environ else None
        self._raw = raw if isinstance(raw, dict) else None
        self._saved: dict = self._raw.copy() if self._raw is not None else os.environ.copy()

    def scrub(self) -> None:
        """Remove every ``CANARCHY_*``/``CAN_*`` variable that was set when the snapshot was taken."""
        if self._raw is not None:
            for key in [k for k in self._saved if k.startswith(_SCRUBBED_PREFIXES_BYTES)]:
                os.environb.pop(key, None)
        else:
            for name in [k for k in self._saved if is_scrubbed(k)]:
                os.environ.pop(name, None)

    def restore(self) -> None:
        """Make ``os.environ`` equal to the snapshot again, touching only what differs."""
        if self._raw is None or os.environ._data is not self._raw:  # type: ignore[attr-defined]
            apply_environment({os.fsdecode(k): os.fsdecode(v) for k, v in self._saved.items()}
                              if self._raw is not None else self._saved)
            return
        raw, saved = self._raw, self._saved
        if raw == saved:
            return
        for key in raw.keys() - saved.keys():
            os.environb.pop(key, None)
        for key, value in saved.items():
            if raw.get(key) != value:
                os.environb[key] = value


_SCRUBBED_PREFIXES_BYTES = tuple(prefix.encode() for prefix in SCRUBBED_PREFIXES)


@dataclass
class PathTarget:
    """An import-time path found in a module: ``module.attribute`` (or a
    function's default argument), its path relative to the home it was under,
    and the type to rebuild (``Path``/``str``)."""

    module: str
    attribute: str
    relative: PurePath
    kind: type
    function: Any = None  # a function whose __defaults__/__kwdefaults__ hold it
    slot: Any = None      # index in __defaults__ or name in __kwdefaults__


class Sandbox:
    """The plain object behind the plugin: homes, environment, import-time paths.

    ``operator_env``: the environment as the operator had it (restored for
    tests that opt out); ``real_home``: the operator's home directory.
    """

    def __init__(self, operator_env: Mapping[str, str] | None = None, parent: str | None = None) -> None:
        self.operator_env = dict(os.environ if operator_env is None else operator_env)
        self.real_home = Path(self.operator_env.get("HOME") or os.path.expanduser("~")).resolve()
        self.root = Path(tempfile.mkdtemp(prefix="canarchy-pytest-", dir=parent)).resolve()
        self.session_home = self.root / "home"
        self.session_home.mkdir()
        self.refusal_dir = self.root / "refusals"
        self.refusal_dir.mkdir()
        self.session_env: dict[str, str] = {}
        self._tests = 0
        self._targets: dict[tuple[str, str, Any], PathTarget] = {}
        self._scanned: set[str] = set()
        self._modules_seen = -1
        self._python_can_files: list[str] | None = None
        self._spare: tuple[Path, Path] | None = None
        self._home_envs: dict[Path, dict[str, str]] = {}

    # -- environments ------------------------------------------------------
    def isolated_environment(self, home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: the operator's) without scrubbed variables, homes moved to ``home``."""
        env = {k: v for k, v in (self.operator_env if base is None else base).items() if not is_scrubbed(k)}
        env.update(home_environment(home))
        return env

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
        """Offer a test's directories for reuse if they are still empty and unchanged."""
        try:
            for path in (home, cwd):
                if os.stat(path).st_mode & 0o7777 != 0o700:
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

    def restore_python_can(self) -> None:
        """Give python-can back its original config-file list (for opt-out tests)."""
        util = sys.modules.get("can.util")
        files = getattr(util, "CONFIG_FILES", None)
        if isinstance(files, list) and self._python_can_files is not None:
            files[:] = self._python_can_files

    # -- import-time paths -------------------------------------------------
    def _relative_home_path(self, value: Any) -> PurePath | None:
        """If ``value`` is a path under a home this sandbox knows (the real home,
        the session home or any test home), return it relative to that home."""
        if isinstance(value, PurePath):
            text = str(value)
        elif isinstance(value, str) and value.startswith(os.sep) and len(value) < 4096:
            text = value
        else:
            return None
        root, real = str(self.root), str(self.real_home)
        if text == root or text.startswith(root + os.sep):
            parts = PurePath(text).relative_to(self.root).parts
            if parts[:1] == ("home",):
                return PurePath(*parts[1:])
            if parts[:1] == ("tests",) and parts[2:3] == ("home",):
                return PurePath(*parts[3:])
            return None
        if text == real or text.startswith(real + os.sep):
            return PurePath(text).relative_to(self.real_home)
        return None

    def scan(self, force: bool = False) -> list[PathTarget]:
        """Find import-time home paths in ``canarchy`` modules not scanned yet
        (all of them with ``force``): module attributes and function defaults."""
        if not force and len(sys.modules) == self._modules_seen:
            return []
        self._modules_seen = len(sys.modules)
        found = []
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "canarchy" or name.startswith("canarchy.")):
                continue
            if name.startswith(_EXEMPT_PREFIX) or (name in self._scanned and not force):
                continue
            self._scanned.add(name)
            for attribute, value in list(vars(module).items()):
                found.extend(self._targets_in(name, attribute, value))
        for target in found:
            self._targets[(target.module, target.attribute, target.slot)] = target
        return found

    def _targets_in(self, module: str, attribute: str, value: Any) -> Iterable[PathTarget]:
        relative = self._relative_home_path(value)
        if relative is not None:
            yield PathTarget(module, attribute, relative, type(value))
            return
        function = getattr(value, "__func__", value)
        if not callable(function) or getattr(function, "__module__", None) != module:
            return
        for index, default in enumerate(getattr(function, "__defaults__", None) or ()):
            relative = self._relative_home_path(default)
            if relative is not None:
                yield PathTarget(module, f"{attribute}(default #{index})", relative, type(default), function, index)
        for key, default in (getattr(function, "__kwdefaults__", None) or {}).items():
            relative = self._relative_home_path(default)
            if relative is not None:
                yield PathTarget(module, f"{attribute}(default {key}=)", relative, type(default), function, key)

    def rebase(self, home: Path) -> None:
        """Point every import-time home path found so far (and the known ones) at ``home``."""
        self.scan()
        for module_name, attribute in KNOWN_IMPORT_TIME_PATHS:
            module = sys.modules.get(module_name)
            if module is not None and (module_name, attribute, None) not in self._targets:
                self._targets.update({(t.module, t.attribute, t.slot): t
                                      for t in self._targets_in(module_name, attribute, getattr(module, attribute, None))})
        for target in self._targets.values():
            value = target.kind(home / target.relative) if target.kind is not str else str(home / target.relative)
            if target.function is None:
                module = sys.modules.get(target.module)
                if module is not None:
                    setattr(module, target.attribute, value)
            elif isinstance(target.slot, int):
                defaults = list(target.function.__defaults__)
                defaults[target.slot] = value
                target.function.__defaults__ = tuple(defaults)
            else:
                target.function.__kwdefaults__[target.slot] = value

    def paths_under_real_home(self) -> list[str]:
        """Audit: every ``module.attribute`` (or default) in a ``canarchy`` module
        that still holds a path under the operator's real home."""
        self.scan(force=True)
        offenders = []
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "canarchy" or name.startswith("canarchy.")):
                continue
            if name.startswith(_EXEMPT_PREFIX):
                continue
            for attribute, value in list(vars(module).items()):
                for target in self._targets_in(name, attribute, value):
                    current = value if target.function is None else (
                        target.function.__defaults__[target.slot] if isinstance(target.slot, int)
                        else target.function.__kwdefaults__[target.slot])
                    text = str(current)
                    real = str(self.real_home)
                    if text == real or text.startswith(real + os.sep):
                        offenders.append(f"{name}.{target.attribute} = {text}")
        return offenders


# -- the operator-state manifest ---------------------------------------------------

# What of the operator's home the suite must never change (product.md §1).
OPERATOR_STATE = (".canarchy", ".canrc", "can.conf", ".can")
# What of a checkout a test run may change.
CHECKOUT_IGNORED = (".git", ".nox", ".pytest_cache", "reports", "__pycache__", "build", "dist", ".venv")


def manifest(base: Path, names: Iterable[str] | None = None, ignored: Iterable[str] = ()) -> dict[str, tuple]:
    """``{relative path: (kind, size, sha256)}`` for ``names`` under ``base``
    (everything when None), skipping any path component in ``ignored`` and
    ``*.egg-info``. Symlinks are recorded by target, not followed."""
    ignored = set(ignored)
    result: dict[str, tuple] = {}
    starts = [base / n for n in names] if names is not None else [base]

    def visit(path: Path) -> None:
        rel = str(path.relative_to(base)) if path != base else "."
        try:
            if path.is_symlink():
                result[rel] = ("link", 0, os.readlink(path))
            elif path.is_dir():
                if path != base:
                    result[rel] = ("dir", 0, "")
                for child in sorted(os.listdir(path)):
                    if child in ignored or child.endswith(".egg-info"):
                        continue
                    visit(path / child)
            elif path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                result[rel] = ("file", path.stat().st_size, digest)
        except FileNotFoundError:
            pass

    for start in starts:
        if os.path.lexists(start):
            visit(start)
    return result


def manifest_diff(before: Mapping[str, tuple], after: Mapping[str, tuple]) -> list[str]:
    """Human-readable lines for every path added, removed or changed."""
    lines = []
    for path in sorted(set(before) | set(after)):
        if path not in after:
            lines.append(f"removed: {path}")
        elif path not in before:
            lines.append(f"added:   {path}")
        elif before[path] != after[path]:
            lines.append(f"changed: {path}")
    return lines
