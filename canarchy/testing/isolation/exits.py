"""The end of a pytest process that is the program: what may end it, and who is named for what runs then.

Until the sentinel's last look, ``os._exit`` takes that look first and ``os.exec*`` of the process is
refused; afterwards an exit with another status, and the start of a process, are late. An atexit
handler a test registered runs named after that test. A first SIGTERM stops the run as Ctrl+C does.
Design: ``docs/design/test-isolation.md``.
"""

from __future__ import annotations

import atexit
import os
import posix
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from _pytest import config as _pytest_config

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation import audithook as _audithook
from canarchy.testing.isolation import guard as _guard
from canarchy.testing.isolation.events import PROCESS_STARTS
from canarchy.testing.isolation.refusal import Access
from canarchy.testing.isolation.settings import _is_worker

if TYPE_CHECKING:
    from canarchy.testing.isolation.session import _Run

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
            guard.late(Access(guard.owner, "call", call, call, "late",
                                      f"the run's exit status is pytest's, {run.exit_status}", pid))
        _REAL_EXIT(status)

    def _exec(args: tuple) -> None:
        if os.getpid() == pid:
            path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else repr(args[0])
            guard.refuse(Access(guard.owner, "replace the pytest process with", path,
                                        path, "exec", "os.exec*", pid))

    def _start_late(args: tuple) -> None:  # a process started after the look: the reaper has stopped the others
        if guard.late is not None and os.getpid() == pid and not guard.busy():
            what = " ".join(repr(a) for a in args if isinstance(a, (str, bytes, list, tuple)))[:200] or "a fork"
            guard.late(Access(guard.owner, "start a process", what, what, "late", "", pid))

    os._exit = posix._exit = _exit
    _audithook.observe("os.exec", _exec)
    for event in PROCESS_STARTS:
        _audithook.observe(event, _start_late)


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


def _stop_on_sigterm(config: pytest.Config) -> None:
    """When pytest is the program, or a pytest-xdist worker (``timeout`` signals the whole group), and
    SIGTERM would end the process at once (its default action), the first one raises
    ``KeyboardInterrupt`` instead, so that pytest ends as on Ctrl+C: what tests left running stopped, the
    last look taken, the run's temporary tree removed (``timeout``, a CI job cancelled); a second one
    ends the process at once with the default's status, 128 + 15."""
    if (_the_process_ends_with(config) or _is_worker(config)) and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)


_TERMINATED: list[int] = []  # the SIGTERM already received
SEAL_SKIPS = ("_TERMINATED",)


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM's handler: ``KeyboardInterrupt`` the first time, the default's exit afterwards."""
    if _TERMINATED:
        _REAL_EXIT(128 + signum)
    _TERMINATED.append(signum)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")


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
    """Whether this pytest is the program, not a ``pytest.main()`` called by code that goes on afterwards
    (which gets its world back): pytest's entry point (:data:`_CONSOLE_MAIN`) is on the stack, which every way of
    starting it as a program calls (the ``pytest`` script under any name an installer gives it, ``pytest-3``
    too, and ``python -m pytest``), with the command line's arguments."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code not in _CONSOLE_MAIN:
        frame = frame.f_back
    return frame is not None and list(config.invocation_params.args) == sys.argv[1:]


#: The code of pytest's entry point: ``console_main``, which the scripts and ``python -m pytest`` call up to pytest
#: 9.0, and ``_console_main``, which they call from 9.1 on (``console_main`` deprecated). Taken at import: a test
#: that replaces them changes nothing.
_CONSOLE_MAIN = frozenset(function.__code__ for function in (
    getattr(_pytest_config, name, None) for name in ("console_main", "_console_main")) if function is not None)
