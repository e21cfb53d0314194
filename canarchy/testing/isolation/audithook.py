"""The process's one audit hook (PEP 578): the access guard judges through it, and other parts of the
isolation watch events through it (:func:`observe`), since every audit hook costs on every audited event of
the process. :func:`install` adds it; :func:`activate_from_environment` configures, installs and enables the
guard in a child Python. Design: ``docs/design/test-isolation.md`` ("Layer 6: the access guard").
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import fields
from types import CodeType, FrameType, FunctionType, ModuleType
from pathlib import Path
from collections.abc import Callable, Mapping

from canarchy.testing.isolation._child import parent_nodeid
from canarchy.testing.isolation.access import CHILD_VARIABLES, ENVIRONMENT_VARIABLE, EXEMPT_JUDGING, GUARD, AccessGuard
from canarchy.testing.isolation.events import JUDGED_EVENTS, PROCESS_STARTS, RELINKING
from canarchy.testing.isolation.protection import Protection

#: Other watchers of audit events, sharing the one hook (an audit hook costs on every event of
#: the process): event -> callbacks ``callback(args)``, called whether or not the guard is enabled.
_OBSERVERS: dict[str, list[Callable[[tuple], None]]] = {}
_EVENTS: set[str] = set(JUDGED_EVENTS)


def observe(event: str, callback: Callable[[tuple], None]) -> None:
    """Call ``callback(args)`` on every ``event`` from now on (once :func:`install` has run);
    a callback already registered for ``event`` is not added twice."""
    callbacks = _OBSERVERS.setdefault(event, [])
    if callback not in callbacks:
        callbacks.append(callback)
    _EVENTS.add(event)


def _make_hook(guard: AccessGuard) -> Callable[[str, tuple], None]:
    events = _EVENTS
    observers = _OBSERVERS
    relinking = RELINKING
    local = guard._local
    audit = guard._audit
    forget = guard.forget_resolutions

    def hook(event: str, args: tuple) -> None:
        if event not in events:  # the fast path: every audited event of the process comes here
            return
        watchers = observers.get(event)
        if watchers is not None:
            for watcher in watchers:
                watcher(args)
            if event not in JUDGED_EVENTS:
                return
        if event in relinking:
            forget()
        if not guard.enabled:
            return
        busy = getattr(local, "busy", False)
        if busy and _own_work(local):
            return  # what the judging itself does (a record written, a cache filled), the harness's own reads
        local.busy = EXEMPT_JUDGING if busy else True  # what the judging sees: whether the thread was exempt before
        start, local.start = getattr(local, "start", None), _FRAME(0)
        try:
            audit(event, args)
        finally:
            local.busy, local.start = busy, start

    return hook


_PACKAGE = __name__.rpartition(".")[0]
_WRAPPERS = f"{_PACKAGE}.c_openers"  # raises the events of C functions for their callers
_OWN: set[CodeType] = set()  # the code of this package's functions, as each module was when first looked at
_RAISING: set[CodeType] = set()  # ... of those in _WRAPPERS
_LOOKED_AT: set[str] = set()
_SKIPPED = (str, bytes, int, float, type(None), ModuleType, tuple, set, frozenset)
#: They grow as modules of the package are loaded: the seal keeps them by identity only (:func:`~.session._seal`).
SEAL_SKIPS = ("_OWN", "_RAISING", "_LOOKED_AT")


_FRAME = sys._getframe


def _own_work(local: threading.local) -> bool:
    """Whether the event comes from the isolation's own code, when its thread is exempt: every frame from the code
    that raised it (past the wrappers that raise the events of C functions for their callers) up to where the
    thread became exempt (``local.start``: the hook judging, or :meth:`~.access.AccessGuard.exempt`'s caller) is
    a function of this package (by identity: code compiled under one of its file names is not). The code of
    anyone else that the harness's work runs is judged, and so is the package's own code it calls: the
    standard library's, a function a test put in the place of one, a test's audit hook, trace function,
    finalizer, garbage-collector callback or signal handler that runs on the thread meanwhile."""
    if not _LOOKED_AT:
        _look_at(list(sys.modules))  # the first time: every module of the package loaded by now
    start = getattr(local, "start", None)
    frame = _FRAME(2)  # 0 this, 1 the hook, 2 the code that raised the event
    while frame is not None and frame.f_code in _RAISING:  # install() imported them before any event
        frame = frame.f_back
    while frame is not None:
        if frame.f_code not in _OWN and frame.f_code not in _RAISING and not _newly_own(frame):
            return False
        if frame is start:
            return True
        frame = frame.f_back
    return False


def _newly_own(frame: FrameType) -> bool:
    """Whether ``frame`` runs code of a module of the package loaded since the last look."""
    module = frame.f_globals.get("__name__")
    return module not in _LOOKED_AT and _look_at([module]) and frame.f_code in _OWN


def _look_at(names: list) -> bool:
    """Add the code of those of ``names`` that are modules of this package, loaded and not looked at yet, to
    :data:`_OWN` (:data:`_RAISING` for :data:`_WRAPPERS`); True if there was one."""
    added = False
    for name in names:
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is not None and name not in _LOOKED_AT and (name == _PACKAGE or name.startswith(_PACKAGE + ".")):
            _LOOKED_AT.add(name)
            found: set[CodeType] = set()
            _codes([v for k, v in vars(module).items() if k != "__builtins__"], name, getattr(module, "__file__", None),
                   found)
            _OWN.update(found)
            if name == _WRAPPERS:
                _RAISING.update(found)
            added = True
    return added


def _codes(todo: list, module: str, file: str | None, found: set[CodeType]) -> None:
    """Add to ``found`` the code of ``module``'s functions (compiled from ``file``) among ``todo``: its functions,
    classes and tables of them, what each defines inside, what a decorator wraps (``__wrapped__``)."""
    seen: set[int] = set()
    while todo:
        value = todo.pop()
        if isinstance(value, _SKIPPED) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, (dict, list)):  # a table of functions (events.SPECIAL)
            todo += value.values() if isinstance(value, dict) else value
        elif isinstance(value, (staticmethod, classmethod)):
            todo.append(value.__func__)
        elif isinstance(value, property):
            todo += [value.fget, value.fset, value.fdel]
        elif isinstance(value, type):
            if value.__module__ == module:
                todo += vars(value).values()
            continue
        elif isinstance(value, FunctionType) and value.__code__.co_filename == file:
            codes = [value.__code__]
            while codes:
                code = codes.pop()
                found.add(code)
                codes += [c for c in code.co_consts if isinstance(c, CodeType)]
        if callable(value) and (wrapped := getattr(value, "__wrapped__", None)) is not None:
            todo.append(wrapped)


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Add the audit hook to this process (once; idempotent), with the audit events of the C functions that
    open paths without one (:mod:`~canarchy.testing.isolation.c_openers`). Does not enable the guard: set
    ``GUARD.enabled``."""
    global _installed
    from canarchy.testing.isolation import c_openers  # here: it imports this module; before the hook sees imports

    with _install_lock:
        if not _installed:
            sys.addaudithook(_make_hook(GUARD))
            for event in PROCESS_STARTS:
                observe(event, GUARD.process_started)
            c_openers.install()
            _installed = True


def activate_from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """In a child process: configure, install and enable :data:`GUARD` from the
    variable :meth:`AccessGuard.to_environment` made (``environ``, default
    ``os.environ``), owned by the parent's test (``PYTEST_CURRENT_TEST``).
    Returns False when the variable is absent; raises ``ValueError`` when it is
    malformed."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENVIRONMENT_VARIABLE)
    if not raw:
        return False
    try:
        document = json.loads(raw)
        protection = Protection(**{f.name: tuple(document[f.name]) for f in fields(Protection)})
        report_dir = document["report_dir"]
        run_pid = int(document["run_pid"])
        terminals = frozenset(int(device) for device in document.get("terminals", ()))
        network_namespace = int(document.get("network_namespace", 0))
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} is not a configuration of the access guard: {error}") from None
    GUARD.configure(protection)
    GUARD.report_dir = Path(report_dir) if report_dir else None
    GUARD.run_pid = run_pid
    GUARD.terminals = terminals
    GUARD.network_namespace = network_namespace
    GUARD.owner = parent_nodeid(environ.get("PYTEST_CURRENT_TEST"))
    GUARD.child_variables = {name: environ[name] for name in CHILD_VARIABLES if name in environ}  # its children's
    GUARD._memory_pid = None  # every record goes to report_dir, for the parent
    GUARD.enabled = True
    install()
    return True
