"""The trees of one pytest run and the containment's plan over them.

Where the checkout's git directories and virtual environments are, where the interpreter loads code
from, where pytest and the test tools write; the :class:`~canarchy.testing.isolation.containment.Plan`
made of them, entering it, and what it left reachable to the sentinel. Design:
``docs/design/test-isolation.md`` (layer 1).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import TYPE_CHECKING

import pytest

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import containment as _containment
from canarchy.testing.isolation import loadable as _loadable
from canarchy.testing.isolation import mountview as _mountview
from canarchy.testing.isolation import protection as _protection
from canarchy.testing.isolation import tree as _tree
from canarchy.testing.isolation.listeners import NETWORK_NAMESPACE
from canarchy.testing.isolation.settings import Settings, _is_worker, real_bus_asked

if TYPE_CHECKING:
    from canarchy.testing.isolation.session import _Run


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
    trees.update(os.path.join(root, venv) for venv in _loadable.virtual_environments(root))
    return sorted(t for t in trees if t and os.path.dirname(t) != t)


#: The system's trees of programs, libraries and their configuration (FHS 3.0), and the queues of ``cron``
#: and ``at``: a root run's write there runs in a later program of the operator's, outside the run.
SYSTEM_CODE_TREES = ("/usr", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/etc",
                     "/var/spool", "/var/lib", "/run/systemd")


def _operator_code_trees(operator_env: dict, writable: list[str], own: list[str]) -> list[str]:
    """Where a later program of the operator's loads code from: the directories of their ``PATH`` and
    :data:`SYSTEM_CODE_TREES` (a program planted there runs for the next command of that name), the
    byte-code cache of ``PYTHONPYCACHEPREFIX`` (``sys.pycache_prefix``: byte code planted there runs in
    place of its source) and the directories of ``PYTHONPATH`` (a ``sitecustomize`` there runs at
    start-up): each existing one that holds none of ``writable`` (the run's trees) and lies inside none
    of ``own`` (the checkout, the sandbox)."""
    found = [sys.pycache_prefix or "", *operator_env.get("PYTHONPATH", "").split(os.pathsep),
             *operator_env.get("PATH", "").split(os.pathsep), *SYSTEM_CODE_TREES]
    trees = {os.path.realpath(t) for t in found if t and os.path.isabs(t) and os.path.isdir(t)}
    holds = [os.path.realpath(t) for t in writable]
    mine = [os.path.realpath(t) for t in own]
    return sorted(t for t in trees if os.path.dirname(t) != t and not any(_mountview.inside(w, t) for w in holds)
                  and not any(_mountview.inside(t, m) for m in mine))


def _code_trees_beside(config: pytest.Config, operator_env: dict, temp_base: str) -> list[str]:
    """What the guard makes read-only, with the containment or without: the checkout's virtual environments,
    and the running interpreter's libraries and scripts (its standard library, its and the base's
    site-packages, the user site, ``bin``: a ``.pth`` file planted there runs in every later Python, before
    any isolation); each that holds neither the checkout nor a temporary directory of the run. Not the
    interpreter's whole prefix: a lane writes its reports inside its own environment (``.nox/ENV/tmp``)."""
    import site
    import sysconfig

    root = str(config.rootpath)
    held = [os.path.abspath(h) for h in (root, temp_base, tempfile.gettempdir(), operator_env.get("TMPDIR")) if h]
    trees = [os.path.join(root, venv) for venv in _loadable.virtual_environments(root)]
    paths = sysconfig.get_paths()
    trees += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts") if paths.get(k)]
    trees += site.getsitepackages() + ([site.USER_SITE] if site.ENABLE_USER_SITE and site.USER_SITE else [])
    trees = sorted({os.path.realpath(t) for t in trees if os.path.isdir(t)})
    return [t for t in trees if os.path.dirname(t) != t and not any(_mountview.inside(os.path.realpath(h), t)
                                                                     for h in held)]


def _pytest_cache_dir(config: pytest.Config) -> str | None:
    """pytest's cache directory (``cache_dir``, relative to the rootdir), None without its cache plugin."""
    if not config.pluginmanager.has_plugin("cacheprovider"):
        return None
    return os.path.join(config.rootpath, os.path.expandvars(os.path.expanduser(str(config.getini("cache_dir")))))


def _pytest_s_own_trees(config: pytest.Config) -> list[str]:
    """Where pytest and the test tools write, inside the checkout or not (:func:`_pytest_s_named_trees`)."""
    return [path for _, _, path in _pytest_s_named_trees(config)]


def _pytest_s_named_trees(config: pytest.Config) -> list[tuple[str, str, str]]:
    """``(what, as given, path)`` of each tree pytest and the test tools write as their own: the tools' caches under
    the rootdir (:data:`~canarchy.testing.isolation.tree.TOOL_CACHES`), pytest's cache directory (it writes
    a ``.gitignore`` of its own there), ``--basetemp``."""
    trees = [("the test tools' cache", name, os.path.join(config.rootpath, name)) for name in _tree.TOOL_CACHES]
    cache_dir = _pytest_cache_dir(config)
    if cache_dir is not None:
        trees.append(("pytest's cache_dir", str(config.getini("cache_dir")), cache_dir))
    basetemp = getattr(config.known_args_namespace, "basetemp", None)
    if basetemp:
        trees.append(("--basetemp", str(basetemp), os.path.abspath(basetemp)))
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
    (none of them a home: see :func:`~canarchy.testing.isolation.session._start`)."""
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
        held = [t for t in code if _mountview.inside(os.path.abspath(basetemp), t)]
        code = [t for t in code if t not in held]
        run.header += [f"containment: {t} stays writable to other processes: --basetemp is inside it" for t in held]
    code += _operator_code_trees(run.sandbox.operator_env, sorted(writable), [root, str(run.sandbox.root)])
    read_only = [*homes, *_git_dirs(root), *code, *_protection.kernel_settings()]
    writable.update(_protection.NAMESPACE_SETTINGS)
    # A CAN adapter's device node becomes an empty read-only file too: for the tests and every process they
    # start, as unreachable as the operator's files (nothing reads them: not in run.guarded).
    covered = [*run.guarded, *run.refused_files, *run.adapter_devices]
    covered += [d for d in _protection.KERNEL_DEVICES if os.path.exists(d)]  # the kernel's log: covered alike
    covered += [d for d in _protection.KEY_LISTS if os.path.exists(d)]  # and its lists of keys
    return _containment.Plan(covered=covered, read_only=read_only, writable=sorted(writable), network=network,
                             processes=tuple(_protection.this_and_above()), sockets=tuple(_protection.unix_sockets()))


def _unreached(run: _Run) -> frozenset[str]:
    """The guarded paths the mount view made unreachable: under an empty read-only cover, or absent and
    not creatable (the path or where it resolves to). Empty when the mount view is not in force."""
    report = run.containment
    view = report.protection("mount view") if report is not None else None
    if view is None or not view.in_force:
        return frozenset()
    shut = [*report.covered, *report.uncreatable]
    return frozenset(path for path in run.guarded
                     if any(_mountview.inside(p, s) for p in (path, os.path.realpath(path)) for s in shut))


def _network_wanted(config: pytest.Config, settings: Settings, wanted: bool | None = None) -> tuple[bool, str]:
    if not (settings.network_namespace if wanted is None else wanted):
        return False, "the host's (canarchy_network_namespace is off)"
    named = real_bus_asked(config)
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
        network = run.containment.protection("network")
        if network is not None and network.in_force:  # a socket bound in another one is outside the run
            _access.GUARD.network_namespace = os.stat(NETWORK_NAMESPACE).st_ino
            if run.seal is not None:  # entered late, for a project's conftest (session.require_containment)
                run.seal.renew(_access.GUARD, "network_namespace")
        view = run.containment.protection("mount view")
        if view is not None and view.in_force:  # what a test's process mounts in this view, the last look removes
            run.proc_device = os.stat("/proc").st_dev
            run.mounts_at_start = _containment.mount_table(run.proc_device)
    if run.home_before is not None:
        run.home_before = _reachable(run, run.home_before)
    if not run.settings.containment:
        run.header.append("containment: mount view: off (canarchy_containment is false): the operator's state "
                          "stays reachable to the processes a test starts; the sentinel compares it after the run")
    run.network_note = note if not want_network else (
        "a private namespace (loopback only)" if run.containment.protection("network") and
        run.containment.protection("network").in_force else f"the host's ({run.containment.reason})")


def _reachable(run: _Run, manifest: dict) -> dict:
    """``manifest`` without what lies under a path the mount view made unreachable: the sentinel
    checks the containment's covers of those instead (``sentinel._covers_broken``)."""
    return {path: entry for path, entry in manifest.items()
            if not any(_mountview.inside(path, shut) for shut in run.unreached)}
