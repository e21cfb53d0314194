"""Where a project keeps its code, tests and harness data: read from its ``pyproject.toml``, and from the
file its pytest configuration is in (which may be another: ``pytest.ini``, ``tox.ini``, ``setup.cfg`` ...).

The ``[tool.canarchy.lanes]`` table (keys and defaults: ``docs/design/verification-harness.md`` §1,
``docs/adopting.md``) overrides what is otherwise derived. Standard library only (nox's interpreter loads it,
and ``loadable.py`` beside the plugin by path). Raises :class:`ProjectError` naming the key for anything it
cannot use.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

if __package__:
    from canarchy.testing.isolation.loadable import PYTEST_CONFIGURATION
else:  # loaded by path (nox): the plugin's list of pytest's configuration files, the same way
    import importlib.util

    _spec = importlib.util.spec_from_file_location("_canarchy_loadable",
                                                   Path(__file__).parent.parent / "isolation" / "loadable.py")
    _loadable = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    sys.modules.setdefault("_canarchy_loadable", _loadable)
    _spec.loader.exec_module(_loadable)  # type: ignore[union-attr]
    PYTEST_CONFIGURATION = _loadable.PYTEST_CONFIGURATION

PLUGIN = "canarchy.testing.isolation.plugin"
_KEYS = {"packages", "source", "tests", "install", "install_groups", "operator_home", "operator_env",
         "parity_allowlist", "mutations", "leaks"}


class ProjectError(ValueError):
    """The project's configuration cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class Project:
    """A project's layout, all paths absolute."""

    root: Path
    packages: tuple[str, ...]  # may be empty: derived from [project] name when not given
    source: Path
    tests: tuple[str, ...]
    install: tuple[str, ...]
    install_groups: tuple[str, ...] = ()  # PEP 735 dependency groups installed beside ``install``
    operator_home: Path | None = None
    parity_allowlist: Path | None = None
    mutations: Path | None = None
    leaks: Path | None = None
    uses_plugin: bool = False  # its pytest configuration loads canarchy.testing.isolation.plugin
    addopts_workers: bool = False  # its addopts start pytest-xdist workers (``-n auto``): the lanes give ``-n 0``
    operator_env: tuple[tuple[str, str], ...] = ()  # the operator's shell for parity, beside canarchy's own
    scrub_prefixes: tuple[str, ...] = ()  # canarchy_scrub_prefixes of its pytest configuration
    plugin_ini: tuple[tuple[str, str], ...] = ()  # its canarchy_* pytest settings, as pytest.ini lines would give them
    pytest_config: str = "pyproject.toml"  # the file pytest takes its configuration from, relative to root
    python_files: tuple[str, ...] = ("test_*.py", "*_test.py")  # its test modules' names (pytest's python_files)

    def module_of(self, file: str) -> str:
        """The dotted module of a project-relative ``file`` (``src/pkg/a.py`` -> ``pkg.a``).

        Raises :class:`ProjectError` when the file is not a module under :attr:`source`.
        """
        path = (self.root / file).resolve()
        try:
            relative = PurePosixPath(path.relative_to(self.source.resolve()).as_posix())
        except ValueError:
            raise ProjectError(f"{file}: not under the project's source directory {self.source}") from None
        if relative.suffix != ".py":
            raise ProjectError(f"{file}: not a Python module")
        tests = self._test_path_of(path)
        if tests is not None:
            raise ProjectError(f"{file}: a module of the project's tests ({tests}), although under its source "
                               "directory: a mutation edits the code the tests prove, not a test or its conftest")
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def _test_path_of(self, path: Path) -> str | None:
        """Why ``path`` is one of the tests' modules, or None: a conftest; a test module by name
        (``python_files``); a module under a test path (``tests``, from ``testpaths``) inside a package
        (``pkg/tests/``). A test path that is a top-level package, the source directory or the root holds the
        code too (doctests: ``testpaths = pkg``) and says nothing by itself."""
        if path.name == "conftest.py":
            return "conftest.py"
        if any(fnmatch.fnmatch(path.name, pattern) for pattern in self.python_files):
            return f"python_files {' '.join(self.python_files)}"
        source = self.source.resolve()
        directory = self._test_directory_of(path, source)
        if directory is not None:
            return directory
        for test in self.tests:
            where = (self.root / test).resolve()
            inside = where.relative_to(source).parts if where.is_relative_to(source) else ()
            if len(inside) >= 2 and (path == where or where in path.parents):
                return test
        return None

    def _test_directory_of(self, path: Path, source: Path) -> str | None:
        """The subpackage of the tests ``path`` lies in (``dateutil/test/`` of ``dateutil/test/_common.py``), or
        None: a directory below a top-level package that holds a conftest.py or a module named as
        ``python_files`` says. The top-level package and the source directory hold code beside such files."""
        if not path.is_relative_to(source):
            return None
        parts = path.relative_to(source).parts[:-1]
        for depth in range(2, len(parts) + 1):
            directory = source.joinpath(*parts[:depth])
            names = [entry.name for entry in directory.glob("*.py")]
            if "conftest.py" in names or any(fnmatch.fnmatch(name, pattern)
                                             for name in names for pattern in self.python_files):
                return f"{PurePosixPath(*parts[:depth])}/, a directory of the tests"
        return None

    def import_root(self) -> str:
        """The directory to put first on ``PYTHONPATH`` so the packages import from this tree."""
        return str(self.source)


def read_toml(path: Path, error: type[Exception], what: str = "it") -> dict:
    """``path`` parsed as TOML; ``error`` naming it and ``what`` it is where it cannot be read or parsed
    (``FileNotFoundError`` too)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{path}: cannot read {what} ({exc})") from None


def _strings(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise ProjectError(f"{where}: expected a non-empty list of strings")
    return tuple(value)


def _inside(root: Path, value: object, where: str) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise ProjectError(f"{where}: expected a path relative to the project root")
    path = (root / value).resolve()
    if path != root and root not in path.parents:
        raise ProjectError(f"{where}: {value!r} is outside the project root {root}")
    return path


def _default_packages(root: Path, doc: dict) -> tuple[str, ...]:
    """The import name derived from ``[project] name`` when such a package exists; else none."""
    name = doc.get("project", {}).get("name")
    if isinstance(name, str):
        module = re.sub(r"[-.]+", "_", name).lower()
        for base in (root / "src", root):
            if (base / module).is_dir() or (base / f"{module}.py").is_file():
                return (module,)
    return ()


def load_project(root: str | os.PathLike[str] = ".") -> Project:
    """Read ``root/pyproject.toml`` and return the :class:`Project`; a project without one (``setup.py``,
    ``setup.cfg``) gets what an empty ``[tool.canarchy.lanes]`` gives."""
    base = Path(root).resolve()
    pyproject = base / "pyproject.toml"
    doc = read_toml(pyproject, ProjectError) if pyproject.exists() else {}
    table = doc.get("tool", {}).get("canarchy", {}).get("lanes", {})
    where = f"{pyproject} [tool.canarchy.lanes]"
    if not isinstance(table, dict):
        raise ProjectError(f"{where}: expected a table")
    unknown = set(table) - _KEYS
    if unknown:
        raise ProjectError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
    config, ini = pytest_configuration(base)
    paths = {key: _inside(base, table[key], f"{where} {key}") if key in table else None
             for key in ("operator_home", "parity_allowlist", "mutations", "leaks")}
    settings = _pytest_settings(table, where, ini)
    # pyproject.toml's own table names the plugin, a file before it does not: the lanes load it all the same,
    # and it refuses the run, naming the file that shadows the project's configuration
    tool = doc.get("tool", {}).get("pytest", {})
    settings["uses_plugin"] |= _loads_plugin({k: v for k, v in tool.items() if k != "ini_options"}
                                             or tool.get("ini_options", {}))
    python_files = ini.get("python_files") or ["test_*.py", "*_test.py"]
    python_files = python_files.split() if isinstance(python_files, str) else python_files
    return Project(base, *_layout(base, doc, table, where, ini), **paths, **settings,
                   pytest_config=config or "pyproject.toml", python_files=tuple(map(str, python_files)))


def pytest_configuration(base: Path) -> tuple[str | None, dict]:
    """``(name, options)``: the file in ``base`` pytest 9 takes its configuration from, found as it finds it
    (``_pytest.config.findpaths``: the first of :data:`PYTEST_CONFIGURATION` that is one; ``pytest.ini`` and
    ``pytest.toml`` always are, the others with their section), and its options (an ini file's values are
    strings); ``(None, {})`` when there is none. Its parents are not searched: a lane runs a copy of
    ``base``. Raises :class:`ProjectError` for a file it cannot read."""
    for name in PYTEST_CONFIGURATION:
        path = base / name
        if not path.is_file():
            continue
        try:
            if path.suffix == ".toml":
                doc = tomllib.loads(path.read_text(encoding="utf-8"))
                if name in ("pytest.toml", ".pytest.toml"):
                    return name, doc.get("pytest", {})
                tool = doc.get("tool", {}).get("pytest", {})
                native = {k: v for k, v in tool.items() if k != "ini_options"}
                if native or "ini_options" in tool:
                    return name, native or tool["ini_options"]
                continue
            parser = _ini(path)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error) as exc:
            raise ProjectError(f"{path}: cannot read it ({exc})") from None
        section = "tool:pytest" if path.suffix == ".cfg" else "pytest"
        if parser.has_section(section):
            return name, dict(parser[section])
        if name in ("pytest.ini", ".pytest.ini"):
            return name, {}
    return None, {}


def _ini(path: Path) -> configparser.ConfigParser:
    """``path`` read as an ini file, names kept in their case as pytest's iniconfig reads them; raises
    ``OSError``, ``UnicodeDecodeError``, ``configparser.Error``."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text(encoding="utf-8"), str(path))
    return parser


def _layout(base: Path, doc: dict, table: dict, where: str, ini: dict) -> tuple:
    """``(packages, source, tests, install, install_groups)``: from ``table`` where it says, else from the
    project's layout."""
    packages = _strings(table["packages"], f"{where} packages") if "packages" in table else _default_packages(base, doc)
    if "source" in table:
        source = _inside(base, table["source"], f"{where} source")
    else:
        src = base / "src"
        in_src = any((src / p).exists() for p in packages) if packages else src.is_dir()
        source = src if in_src else base
    if "tests" in table:
        tests = _strings(table["tests"], f"{where} tests")
    else:
        testpaths = ini.get("testpaths")
        testpaths = testpaths.split() if isinstance(testpaths, str) else testpaths  # an ini file's: one string
        # without testpaths pytest collects from the rootdir, where the lanes run it: a package's own tests
        # (``pkg/test/``) and a docs directory's modules are run as a plain ``pytest`` runs them
        tests = tuple(testpaths) if isinstance(testpaths, list) and testpaths else (".",)
    # the test extra, else a tests one (attrs): the extra that already brings the suite's needs; without
    # either, a PEP 735 dependency group of one of those names (structlog's tests group) beside the project
    extra = next((name for name in ("test", "tests") if name in _extras(base, doc)), None)
    if "install" in table:
        install = _strings(table["install"], f"{where} install")
    else:
        install = ("-e", f".[{extra}]") if extra else ("-e", ".")
    declared = doc.get("dependency-groups", {})
    if "install_groups" in table:
        groups = _strings(table["install_groups"], f"{where} install_groups")
    elif "install" not in table and not extra and isinstance(declared, dict):
        groups = tuple(name for name in ("test", "tests") if name in declared)[:1]
    else:
        groups = ()
    return packages, source, tests, install, groups


def _extras(base: Path, doc: dict) -> set[str]:
    """The extras the project declares: ``[project.optional-dependencies]`` in ``pyproject.toml``, else (a
    setuptools project whose metadata is in ``setup.cfg``) ``[options.extras_require]`` there. Extras only
    ``setup.py`` computes are not seen: such a project names them in ``[tool.canarchy.lanes] install``."""
    extras = doc.get("project", {}).get("optional-dependencies", {})
    if isinstance(extras, dict) and extras:
        return set(extras)
    try:
        parser = _ini(base / "setup.cfg")
    except (OSError, UnicodeDecodeError, configparser.Error):
        return set()
    # extras' names compared as pip normalises them (lower case)
    return {name.lower() for name in parser["options.extras_require"]} if parser.has_section(
        "options.extras_require") else set()


def _pytest_settings(table: dict, where: str, ini: dict) -> dict:
    """Whether the project's addopts load the plugin, its ``operator_env`` and ``canarchy_scrub_prefixes``."""
    uses_plugin = _loads_plugin(ini)
    operator_env = table.get("operator_env", {})
    if not isinstance(operator_env, dict) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
            for k, v in operator_env.items()):
        raise ProjectError(f"{where} operator_env: expected a table of variable names to strings")
    prefixes = ini.get("canarchy_scrub_prefixes", [])
    prefixes = tuple(p for p in (prefixes if isinstance(prefixes, list) else str(prefixes).split())
                     if isinstance(p, str))
    plugin_ini = tuple((key, _ini_text(value)) for key, value in ini.items() if key.startswith("canarchy_"))
    return {"uses_plugin": uses_plugin, "operator_env": tuple(operator_env.items()), "scrub_prefixes": prefixes,
            "plugin_ini": plugin_ini, "addopts_workers": _starts_workers(ini)}


def _addopts(ini: dict) -> str:
    """The ``addopts`` of a pytest configuration's options, as one line."""
    addopts = ini.get("addopts", "")
    return " ".join(map(str, addopts)) if isinstance(addopts, list) else str(addopts)


def _loads_plugin(ini: dict) -> bool:
    """Whether the ``addopts`` of a pytest configuration's options name the plugin."""
    return PLUGIN in _addopts(ini)


def _starts_workers(ini: dict) -> bool:
    """Whether the ``addopts`` give pytest-xdist a number of workers (``-n auto``, ``-n4``,
    ``--numprocesses=2``)."""
    return any(word.startswith(("-n", "--numprocesses")) for word in _addopts(ini).split())


def _ini_text(value: object) -> str:
    """A ``[tool.pytest.ini_options]`` value as a ``pytest.ini`` line holds it (a list: shell-quoted words)."""
    import shlex

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(shlex.quote(str(item)) for item in value)
    return str(value)
