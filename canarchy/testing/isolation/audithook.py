"""The process's one audit hook (PEP 578): the access guard judges through it, and other parts of the
isolation watch events through it (:func:`observe`), since every audit hook costs on every audited event of
the process. :func:`install` adds it; :func:`activate_from_environment` configures, installs and enables the
guard in a child Python. Design: ``docs/design/test-isolation.md`` ("Layer 6: the access guard").
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading
from dataclasses import fields
from pathlib import Path
from collections.abc import Callable, Mapping

from canarchy.testing.isolation._child import parent_nodeid
from canarchy.testing.isolation.access import ENVIRONMENT_VARIABLE, GUARD, AccessGuard
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
        if busy and _own_work():
            return  # what the judging itself does (a record written, a cache filled), the harness's own reads
        local.busy = True
        try:
            audit(event, args)
        finally:
            local.busy = busy

    return hook


_OWN_CODE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__)
_STANDARD_LIBRARY = tuple(dict.fromkeys(
    os.path.join(p, "") for p in (_STDLIB_DIR, os.path.realpath(_STDLIB_DIR), sysconfig.get_path("stdlib"))))
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")  # under the stdlib, not of it


def _own_work() -> bool:
    """Whether the event comes from the isolation's own code, when its thread is exempt: going out from the code
    that raised it, a frame of this package comes before any frame of code outside it and the standard library.
    A test's audit hook, trace function, finalizer or signal handler that runs on the thread meanwhile is not."""
    frame = sys._getframe(2)  # 0 this, 1 the hook, 2 the code that raised the event
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_OWN_CODE):
            return True
        if not (name.startswith(_STANDARD_LIBRARY) and not any(part in name for part in _INSTALLED)) and (
                not name.startswith("<frozen ")):
            return False
        frame = frame.f_back
    return False


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
    GUARD._memory_pid = None  # every record goes to report_dir, for the parent
    GUARD.enabled = True
    install()
    return True
