"""Process state a test may change and must give back, checked and restored after each test.

The environment (only the variables the ``os.putenv``/``os.unsetenv`` audit events name), python-can's
module-level configuration, signal handlers and the umask, and the hooks that would run a test's code inside
later tests (trace and profile functions, garbage-collector callbacks, the collector switched off). Everything
changed is put back; :meth:`ProcessState.finish` returns, in words, what the test should not have left changed. Details:
``docs/design/test-isolation.md`` ("Layer 2"). No pytest import here.
"""

from __future__ import annotations

import ctypes
import gc
import operator
import errno
import os
import signal
import sys
import threading
from typing import Any
from collections.abc import Mapping

from canarchy.testing.isolation.access import GUARD
from canarchy.testing.isolation.reaper import stat_fields

_ENVIRON = os.environ
_SIGNALS = tuple(s for s in signal.Signals if s not in (signal.SIGKILL, getattr(signal, "SIGSTOP", None)))
try:  # signal.getsignal wraps this one, turning SIG_DFL/SIG_IGN into enums by a failed lookup for every
    from _signal import getsignal as _getsignal  # other handler: 0.8 us a signal, two looks a test
except ImportError:  # pragma: no cover - an implementation without the C module (docs/benchmarks.md)
    _getsignal = signal.getsignal
_MISSING = object()


def _blocked() -> frozenset | None:
    """The signals this thread blocks (None where the platform cannot say)."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - Windows
        return None
    return frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, ()))


def _names(signals: frozenset | None) -> str:
    names = []
    for number in sorted(int(s) for s in signals or ()):
        try:
            names.append(signal.Signals(number).name)
        except ValueError:  # a real-time signal has no name
            names.append(str(number))
    return ", ".join(names) or "none"


def _key(value: Any) -> str:
    return os.fsdecode(value) if isinstance(value, bytes) else str(value)


def _c_getenv() -> Any:
    try:
        getenv = ctypes.CDLL(None).getenv
    except (OSError, AttributeError):  # pragma: no cover - no C library to ask (Windows)
        return None
    getenv.restype = ctypes.c_char_p
    getenv.argtypes = [ctypes.c_char_p]
    return getenv


def give_up_the_terminal() -> str | None:
    """Detach this process from its controlling terminal (``TIOCNOTTY``, ioctl_tty(2)), so that no process a
    test starts has one: a process with it may type into the operator's shell (``TIOCSTI``), which runs what it
    typed once pytest has exited. The standard streams stay open on the terminal (output, a debugger's input)
    and Ctrl+C still reaches pytest's process group. Returns why it could not, None when done or not needed."""
    if not hasattr(os, "getsid"):  # pragma: no cover - Windows: no controlling terminals
        return None
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT):  # none (a CI job, nox's pipes): nothing to give up
            return None
        return f"whether pytest has a terminal to give up could not be told (/dev/tty: {exc.strerror or exc})"
    try:
        if os.getsid(0) == os.getpid():  # a session leader's TIOCNOTTY would hang up its own process group
            return ("pytest leads its session (setsid), so the processes a test starts keep its terminal: a change "
                    "to it through /dev/tty is refused, but a program that is not Python can type into it there")
        import fcntl
        import termios

        fcntl.ioctl(fd, termios.TIOCNOTTY)
        return None
    except OSError as exc:
        return f"the terminal could not be given up ({exc.strerror or exc})"
    finally:
        os.close(fd)


def keep_memory_private() -> str | None:
    """Make this process not dumpable (``prctl(PR_SET_DUMPABLE, 0)``, prctl(2)): a process a test starts can then
    read nothing of its memory (``process_vm_readv(2)``, ``/proc/PID/mem``, ``/proc/PID/task/TID/mem`` of a thread
    started later), where the operator's environment is kept to give back to the tests that opt out; only a
    process with ``CAP_SYS_PTRACE`` in the initial user namespace still can (root outside the containment).
    After entering the containment: its user namespace's id maps are written through ``/proc/self``, which this
    makes root's. Returns why it could not, None when done."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE (linux/prctl.h)
            return f"pytest's memory stays readable to the processes tests start ({os.strerror(ctypes.get_errno())})"
    except (OSError, AttributeError):  # pragma: no cover - no C library
        return "pytest's memory stays readable to the processes tests start (no prctl)"
    return None


def erase_start_up_environment() -> bool:
    """Overwrite, in this process's memory, the environment it was started with: what
    ``/proc/PID/environ`` and every ``/proc/PID/task/TID/environ`` show to any process, Python
    or not (proc(5): the bytes from ``env_start`` to ``env_end``). Every variable of
    ``os.environ`` first gets a C copy of its own (``setenv`` copies), so nothing refers to
    the old bytes. The caller lets this process read ``/proc/self/environ``. False, and
    nothing changed, where that record cannot be found or does not match the memory."""
    try:
        fields = stat_fields()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51
        with open("/proc/self/environ", "rb") as handle:  # the kernel's read: never faults
            shown = handle.read()
    except (OSError, ValueError, IndexError):
        return False
    if not 0 < start < end or len(shown) != end - start or ctypes.string_at(start, end - start) != shown:
        return False
    try:
        for name, value in os.environb.items():
            os.putenv(name, value)
    except (ValueError, OSError):  # a name setenv refuses ("=x" at exec): its old bytes are still in use
        return False
    ctypes.memset(start, 0, end - start)
    return True


def _hooks() -> tuple:
    """What runs code of whoever set it inside later tests, which the guards would name for what it does."""
    return (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile(), tuple(gc.callbacks),
            gc.isenabled())


#: What a test left of :func:`_hooks`, in words, and how it is put back (the value it had before).
_HOOKS = (("a trace function set (sys.settrace)", sys.settrace),
          ("a profile function set (sys.setprofile)", sys.setprofile),
          ("a trace function for new threads set (threading.settrace)", threading.settrace),
          ("a profile function for new threads set (threading.setprofile)", threading.setprofile),
          ("garbage-collector callbacks changed (gc.callbacks)", lambda before: gc.callbacks.__setitem__(
              slice(None), before)),
          ("the garbage collector switched off (gc.disable)", lambda before: gc.enable() if before else None))


def _restore_hooks(before: tuple) -> list[str]:
    """Put back what changed of :func:`_hooks` since ``before``; what changed, in words: its code would run in a
    later test, named for what it does there."""
    problems = []
    for (what, put_back), was, now in zip(_HOOKS, before, _hooks(), strict=True):
        if now is not was and now != was:
            problems.append(f"left {what}: it would run in later tests, which would be named for what it does "
                            "(put back)")
            put_back(was)
    return problems


class ProcessState:
    """The watcher: :meth:`begin` before a test, :meth:`finish` after it. One instance, :data:`STATE`;
    the audit hook feeds it through :meth:`on_putenv`/:meth:`on_unsetenv`."""

    def __init__(self) -> None:
        self.active = False
        self._quiet = False
        self._before: dict[str, str | None] = {}
        self._between: set[str] = set()  # variables changed outside any test (collection, wider fixtures)
        self._getenv = _c_getenv()
        self._signals: dict[int, Any] = {}
        self._mask: frozenset = frozenset()
        self._umask = 0
        # What the signal check calls, taken now: a test that replaces operator.is_ or builtins.all
        # (outside the sealed modules) cannot make it see no change.
        self._ops = (all, map, operator.is_, _getsignal, _blocked)
        self._can: tuple | None = None
        self._hooks: tuple = ()
        #: ``() -> (rc contents, CONFIG_FILES contents)`` an isolated test starts with, for a test
        #: that imports python-can itself (nothing of it to note at :meth:`begin`); set by the plugin.
        self.expected_python_can: Any = None

    # -- the audit events (os.environ has not changed yet when they arrive) --
    def on_putenv(self, args: tuple) -> None:
        if self._quiet:
            return
        key = _key(args[0])
        if not self.active:
            self._between.add(key)
        elif key not in self._before:
            self._before[key] = _ENVIRON.get(key)

    def on_unsetenv(self, args: tuple) -> None:
        self.on_putenv(args)

    # -- a test ----------------------------------------------------------------
    def changed_between_tests(self) -> set[str]:
        """Return and forget the variables set or removed since the last test (outside any test)."""
        changed, self._between = self._between, set()
        return changed

    def quietly(self, changes: Mapping[str, str | None]) -> None:
        """Set (or, for None, remove) variables without it counting as the test's change: the harness's own
        work, whose values the access guard does not judge (:meth:`~.access.AccessGuard.exempt`)."""
        self._quiet = True
        try:
            with GUARD.exempt():
                for key, value in changes.items():
                    if value is None:
                        _ENVIRON.pop(key, None)
                    else:
                        _ENVIRON[key] = value
        finally:
            self._quiet = False

    def quietly_apply(self, target: dict[str, str]) -> None:
        """Make ``os.environ`` equal to ``target`` without it counting as anyone's change (as :meth:`quietly`)."""
        from canarchy.testing.isolation.sandbox import apply_environment

        self._quiet = True
        try:
            with GUARD.exempt():
                apply_environment(target, _ENVIRON)
        finally:
            self._quiet = False

    def begin(self) -> None:
        """Note the state the test starts with."""
        self._before.clear()
        _every, each, _is, getsignal, blocked = self._ops
        self._signals = dict(zip(_SIGNALS, each(getsignal, _SIGNALS), strict=True))
        self._mask = blocked()
        self._umask = os.umask(0o077)
        os.umask(self._umask)
        self._can = self._python_can()
        self._hooks = _hooks()
        self.active = True

    def finish(self) -> list[str]:
        """Put back what the test changed; the changes it should not have left, in words."""
        self.active = False
        problems: list[str] = []
        if os.environ is not _ENVIRON:
            problems.append("replaced os.environ with another object (put back)")
            os.environ = _ENVIRON  # noqa: B003 - the object itself is put back, not its contents
        self._quiet = True
        try:
            for key, value in self._before.items():
                if self._getenv is not None and self._c_value(key) != _ENVIRON.get(key):
                    problems.append(f"changed {key} with os.putenv/os.unsetenv: the C-level environment every "
                                    "later child inherits, not os.environ (put back)")
                if value is None:
                    _ENVIRON.pop(key, None)
                    os.unsetenv(key)
                else:
                    _ENVIRON[key] = value
        finally:
            self._quiet = False
            self._before.clear()
        problems += self._restore_signals()
        umask = os.umask(self._umask)
        if umask != self._umask:
            problems.append(f"left the umask at {umask:04o} (was {self._umask:04o}; put back)")
        problems += self._restore_python_can()
        problems += _restore_hooks(self._hooks)
        return problems

    def _c_value(self, key: str) -> str | None:
        raw = self._getenv(os.fsencode(key))
        return None if raw is None else os.fsdecode(raw)

    def _restore_signals(self) -> list[str]:
        every, each, is_, getsignal, blocked = self._ops
        problems = []
        mask = blocked()
        if mask is not None and mask != self._mask:
            problems.append(f"left the signal mask changed (blocked now: {_names(mask)}; before: "
                            f"{_names(self._mask)}; put back)")
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        if every(each(is_, each(getsignal, _SIGNALS), self._signals.values())):
            return problems
        for sig, handler in self._signals.items():
            now = getsignal(sig)
            if now is not handler:  # identity only: a handler object may claim equality
                problems.append(f"left a handler for {sig.name} installed (put back)")
                try:
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
                except (ValueError, OSError, TypeError):  # not the main thread, or a handler set from C
                    pass
        return problems

    # -- python-can -------------------------------------------------------------
    @staticmethod
    def _python_can() -> tuple | None:
        can, util, interfaces = (sys.modules.get(n) for n in ("can", "can.util", "can.interfaces"))
        if can is None or util is None:
            return None
        rc, files = getattr(can, "rc", None), getattr(util, "CONFIG_FILES", None)
        backends = getattr(interfaces, "BACKENDS", None) if interfaces is not None else None
        virtual = backends.get("virtual", _MISSING) if isinstance(backends, dict) else _MISSING
        return (rc, dict(rc) if isinstance(rc, dict) else rc, files, list(files) if isinstance(files, list) else files,
                backends, virtual)

    def _restore_python_can(self) -> list[str]:
        before, now = self._can, self._python_can()
        if now is None:
            return []
        if before is None:  # imported during the test: compare with what the isolation makes of it
            expected = self.expected_python_can() if self.expected_python_can is not None else None
            if expected is None:
                return []
            before = (now[0], expected[0], now[2], expected[1], now[4], now[5])
        rc, rc_items, files, file_items, backends, virtual = before
        problems = []
        can, util = sys.modules["can"], sys.modules["can.util"]
        if now[0] is not rc or now[1] != rc_items:
            problems.append("changed python-can's can.rc (put back)")
            can.rc = rc
            if isinstance(rc, dict):
                rc.clear()
                rc.update(rc_items)
        if now[2] is not files or now[3] != file_items:
            problems.append("changed python-can's config-file list can.util.CONFIG_FILES (put back)")
            util.CONFIG_FILES = files
            if isinstance(files, list):
                files[:] = file_items
        if isinstance(backends, dict) and now[5] is not virtual and virtual is not _MISSING:
            problems.append("changed python-can's 'virtual' backend entry (put back)")
            backends["virtual"] = virtual
        return problems


STATE = ProcessState()
