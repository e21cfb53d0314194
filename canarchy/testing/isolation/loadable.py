"""Where a later Python loads code from in a tree without being asked, or on import: the names of start-up
code (distribution metadata, ``.pth`` files, the ``site`` hooks, pytest's configuration and conftests), what an
import runs besides source, what it finds a module in, and the virtual environments (PEP 405) with their
``site-packages``. Names and places only: :func:`~canarchy.testing.isolation.checkout.checkout_state` records what is
there, the access guard protects it (:mod:`~canarchy.testing.isolation.protection`). Standard library only.
"""

from __future__ import annotations

import glob
import importlib.machinery
import os

VENV_MARKER = "pyvenv.cfg"
#: Where tools keep their virtual environments in a project, besides its top: any directory there whose name
#: starts with a dot (nox's, tox's, hatch's, direnv's) and these.
VENV_HOLDERS = ("envs", "venvs")

#: Code and configuration a later Python or pytest run loads without being asked: a distribution's
#: metadata found on ``sys.path`` (its entry points: pytest plugins, console scripts), ``.pth`` files,
#: sourceless byte code (``pprint.pyc`` shadows the standard library's ``pprint``), the ``site``
#: hooks, pytest's configuration files and conftests, the project's tools' (:func:`is_start_up_code`).
START_UP_SUFFIXES = (".egg-info", ".dist-info", ".egg-link", ".pth", ".pyc", ".pyo")
#: Directories that hold no code of the checkout's to import: version control's own, byte-code caches, node's.
VERSION_CONTROL_DIRS = (".git", ".hg", ".svn", ".bzr", "_darcs", ".jj")
NEVER_CODE = frozenset({*VERSION_CONTROL_DIRS, "__pycache__", "node_modules"})
#: What an import runs besides a ``.py`` file: byte code, and this interpreter's extension modules.
IMPORTABLE_SUFFIXES = (".pyc", *importlib.machinery.EXTENSION_SUFFIXES)
#: Every file an import finds a module in: source, byte code, extension modules.
MODULE_SUFFIXES = tuple(dict.fromkeys((*importlib.machinery.SOURCE_SUFFIXES, *IMPORTABLE_SUFFIXES)))
#: pytest's configuration files: every name pytest 9 looks for (``_pytest.config.findpaths.locate_config``).
PYTEST_CONFIGURATION = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                        "setup.cfg")
#: What the project's own tools read or run from its directory, unasked, when the operator next uses them: uv's
#: configuration (its package index), the interpreter pyenv and uv choose, pdb's start-up commands, nox's
#: sessions, ``pip install .``'s build script, pre-commit's hooks, direnv's shell code, an editor's tasks.
TOOL_START_UP = ("uv.toml", ".python-version", ".pdbrc", "noxfile.py", "setup.py", ".pre-commit-config.yaml",
                 ".envrc", ".vscode")
START_UP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py", "conftest.py", *PYTEST_CONFIGURATION,
                            *TOOL_START_UP})


def is_start_up_code(name: str) -> bool:
    """Whether a file or directory called ``name`` is code or configuration a later run loads
    unasked (:data:`START_UP_NAMES`, :data:`START_UP_SUFFIXES`)."""
    return name in START_UP_NAMES or name.endswith(START_UP_SUFFIXES)


def is_module(name: str, directory: bool) -> bool:
    """Whether an import may find a module or package in an entry called ``name``: a suffix of
    :data:`MODULE_SUFFIXES`, or (``directory``: a directory or a link to one, a namespace package at least) a
    name an ``import`` statement can spell, not in :data:`NEVER_CODE`."""
    return name.endswith(MODULE_SUFFIXES) or (directory and name.isidentifier() and name not in NEVER_CODE)


def virtual_environments(root: str | os.PathLike[str]) -> list[str]:
    """The virtual environments (a directory holding ``pyvenv.cfg``; PEP 405) at the top of ``root`` and one
    level below a directory there whose name starts with a dot or is in :data:`VENV_HOLDERS`, relative to
    ``root``: one listing of the top and of each such directory, one ``stat`` per directory in them."""
    base = os.fspath(root)
    found: list[str] = []
    pending = [""]
    while pending:
        holder = pending.pop(0)
        try:
            with os.scandir(os.path.join(base, holder) if holder else base) as it:
                names = sorted(e.name for e in it if e.name not in NEVER_CODE and e.is_dir(follow_symlinks=False))
        except OSError:
            continue
        for name in names:
            if os.path.isfile(os.path.join(base, holder, name, VENV_MARKER)):
                found.append(os.path.join(holder, name))
            elif not holder and (name.startswith(".") or name in VENV_HOLDERS):
                pending.append(name)
    return found


def site_packages(root: str | os.PathLike[str], venv: str) -> list[str]:
    """The ``site-packages`` directories of the virtual environment ``venv`` (relative to ``root``, as the
    result): ``lib/pythonX.Y/site-packages`` (and ``lib64``'s) on POSIX, ``Lib/site-packages`` on Windows."""
    base = os.fspath(root)
    found = glob.glob(os.path.join(glob.escape(os.path.join(base, venv)), "lib*", "python*", "site-packages"))
    found += glob.glob(os.path.join(glob.escape(os.path.join(base, venv)), "Lib", "site-packages"))
    return sorted(dict.fromkeys(os.path.relpath(p, base) for p in found if not os.path.islink(os.path.dirname(
        os.path.dirname(p)))))
