"""The CAN bus guard: a unit test can reach python-can's ``virtual`` bus and nothing else.

Hooks on python-can 4.x, installed once per process, switched by ``GUARD.enabled`` and never removed:
``can.interface._get_class_for_interface`` (every construction by name, before a driver is imported),
``can.BusABC.__new__`` (every bus class, before its ``__init__`` opens anything), the ``__init__`` of every
bus class but ``BusABC`` itself (an instance made without ``__new__``), and an observer of the audit event
``socket.__new__`` (a raw ``AF_CAN`` socket, whatever opens it, and the other families of
:data:`REFUSED_FAMILIES`). A refusal raises
:class:`RealCanBusRefused` and is recorded (also in ``report_dir`` when set), so code that catches it cannot
turn it into a pass; the buses let through are kept weakly, to check each was shut down. Design:
``docs/design/test-isolation.md`` ("Layer 3"). Imports neither pytest nor python-can at import time.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import socket
import sys
import threading
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any
from collections.abc import Callable

from canarchy.testing.isolation.interfaces import SOCKET_TYPE_MASK
from canarchy.testing.isolation.refusal import RealCanBusRefused, Refusal
from canarchy.testing.isolation.reportlog import ReportLog, append

ALLOWED_INTERFACE = "virtual"
AF_CAN = getattr(socket, "AF_CAN", 29)  # PF_CAN in Linux's include/linux/socket.h


def _families(*known: tuple[str, str, int]) -> dict[int, tuple[str, str]]:
    """``{family: (name, constant)}`` of ``(name, constant, Linux's number)``; the number where this Python
    lacks the constant on Linux (include/linux/socket.h: the kernel takes it), else left out."""
    linux = sys.platform.startswith("linux")
    found = {}
    for name, constant, number in known:
        family = getattr(socket, constant, number if linux else None)
        if family is not None:
            found[family] = (name, constant)
    return found


_LINUX = sys.platform.startswith("linux")
_SOCK_PACKET = 10  # linux/net.h: the obsolete packet type


def socket_family_made(family: object, kind: object) -> object:
    """The family of the socket the kernel makes for ``socket(family, kind)``: Linux's net/socket.c makes
    ``(AF_INET, SOCK_PACKET)`` a packet socket."""
    if _LINUX and family == socket.AF_INET and kind.__class__ is int and kind & SOCKET_TYPE_MASK == _SOCK_PACKET:
        return getattr(socket, "AF_PACKET", 17)
    return family


#: Socket families that reach a bus or another machine whatever the network namespace, by the name a refusal
#: gives them: a raw CAN socket (every SocketCAN driver's); a packet socket (frames onto any interface, a CAN one
#: included); Bluetooth (a wireless OBD or CAN adapter); vsock (the hypervisor's host).
REFUSED_FAMILIES = _families(("socketcan", "AF_CAN", 29), ("packet", "AF_PACKET", 17),
                             ("bluetooth", "AF_BLUETOOTH", 31), ("vsock", "AF_VSOCK", 40))
REPORT_FILE = "bus.jsonl"  # in report_dir: one refusal a line, appended by every process
_VIRTUAL_BACKEND = ("can.interfaces.virtual", "VirtualBus")

class BusGuard:
    """The process-wide guard state. One instance, :data:`GUARD`.

    ``enabled``: refuse non-virtual buses; ``owner``: the node id named in a
    refusal; ``refusals``: recorded attempts (cleared by the owner of a test);
    ``report_dir``: where a refusal is also appended to :data:`REPORT_FILE` (lets a
    parent pytest see refusals made in child processes).
    """

    def __init__(self) -> None:
        self.enabled = False
        self.owner = "<outside any test>"
        self.refusals: list[Refusal] = []
        self.report_dir: Path | None = None
        self._created: list[tuple[weakref.ReferenceType, str]] = []
        self.thread_owners: dict[int, str] = {}  # thread id -> the test that left it running (not owner)
        self.left_threads: dict[int, threading.Thread] = {}  # thread id -> that thread (an id is reused)
        self._lock = threading.Lock()
        self._log = ReportLog(REPORT_FILE)  # the report file of report_dir, and how far it was read

    # -- recording ---------------------------------------------------------
    def refuse(self, interface: str, channel: Any, route: str) -> RealCanBusRefused:
        """Record an attempt and return the exception to raise."""
        owner = self.thread_owners.get(threading.get_ident(), self.owner)
        refusal = Refusal(owner, str(interface), str(channel), route, os.getpid())
        with self._lock:
            self.refusals.append(refusal)
        if self.report_dir is not None:
            try:
                append(self.report_dir, REPORT_FILE, asdict(refusal))
            except OSError:
                pass  # the in-memory record and the raised error still stand
        return RealCanBusRefused(refusal.message())

    def take_refusals(self, nodeid: str | None = None) -> list[Refusal]:
        """Return and forget the recorded refusals (those of ``nodeid`` only,
        when given), including those child processes appended to ``report_dir``."""
        with self._lock:
            for record in self._log.read_new(self.report_dir):
                try:
                    refusal = Refusal(**record)
                except TypeError:
                    continue
                if refusal.pid != os.getpid():  # this process's own are in memory already
                    self.refusals.append(refusal)
            if not self.refusals:
                return []
            taken = [r for r in self.refusals if nodeid is None or r.nodeid == nodeid]
            self.refusals[:] = [r for r in self.refusals if r not in taken]  # in place: the seal holds the list
        return taken

    # -- tracking ------------------------------------------------------------
    def track(self, bus: Any) -> None:
        """Remember a bus that was let through (weakly), and who opened it (:attr:`owner`)."""
        self._created.append((weakref.ref(bus), self.owner))

    def take_unclosed(self) -> list[tuple[Any, str]]:
        """Return ``(bus, who opened it)`` for the tracked buses still open; forget all tracked buses."""
        created = list(self._created)
        self._created.clear()  # in place: the seal holds the list
        open_buses = []
        for ref, owner in created:
            bus = ref()
            if bus is not None and not getattr(bus, "_is_shutdown", True):
                open_buses.append((bus, owner))
        return open_buses

    # -- the checks --------------------------------------------------------
    def check_interface_name(self, name: Any) -> None:
        """Refuse a construction by interface name (route ``"by-name"``)."""
        if not self.enabled or name == ALLOWED_INTERFACE:
            return
        from can.interfaces import BACKENDS

        if name in BACKENDS:  # unknown names open nothing; python-can rejects them itself
            raise self.refuse(name, _channel_from_caller(), "by-name")

    def check_class(self, cls: type, args: tuple, kwargs: dict, route: str = "class") -> None:
        """Refuse constructing any bus class but the virtual bus (route ``"class"``: before an
        instance exists; ``"init"``: a driver's ``__init__`` reached without ``__new__``)."""
        if not self.enabled or _is_virtual_class(cls):
            return
        channel = kwargs.get("channel", args[0] if args else None)
        raise self.refuse(_interface_name_of(cls), channel, route)

    def check_socket(self, args: tuple) -> None:
        """Observer of the audit event ``socket.__new__`` (socket, family, type, protocol): refuse a
        socket of :data:`REFUSED_FAMILIES` (route ``"socket"``), a raw CAN one among them, by the family the
        kernel gives it (:func:`socket_family_made`)."""
        refused = REFUSED_FAMILIES.get(socket_family_made(args[1], args[2])) if self.enabled else None
        if refused is not None:
            raise self.refuse(refused[0], f"<an {refused[1]} socket, type {args[2]}, protocol {args[3]}>", "socket")


GUARD = BusGuard()


_VIRTUAL_CLASS: type | None = None  # python-can's VirtualBus, taken as its module finishes importing


def _remember_virtual_class() -> None:
    global _VIRTUAL_CLASS
    module = sys.modules["can.interfaces.virtual"]
    _VIRTUAL_CLASS = module.VirtualBus
    _PATCHED.extend([(module, "VirtualBus", module.VirtualBus),
                     (sys.modules[__name__], "_VIRTUAL_CLASS", _VIRTUAL_CLASS)])


def _is_virtual_class(cls: type) -> bool:
    if _VIRTUAL_CLASS is None:
        import can.interfaces.virtual  # noqa: F401  (its import runs _remember_virtual_class)
    return _VIRTUAL_CLASS is not None and issubclass(cls, _VIRTUAL_CLASS)


def _interface_name_of(cls: type) -> str:
    from can.interfaces import BACKENDS

    for name, (module_name, class_name) in BACKENDS.items():
        if cls.__name__ == class_name and (cls.__module__ + ".").startswith(module_name + "."):
            return name
    return f"{cls.__module__}.{cls.__qualname__}"


def _channel_from_caller() -> Any:
    """The channel python-can's ``Bus()`` resolved, read from its frame (best effort)."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        kwargs = frame.f_locals.get("kwargs")
        if isinstance(kwargs, dict) and "channel" in kwargs:
            return kwargs["channel"]
        if "channel" in frame.f_locals and frame.f_locals["channel"] is not None:
            return frame.f_locals["channel"]
        frame = frame.f_back
    return "<default>"


# -- installation ----------------------------------------------------------------

def _guard_init(cls: type) -> None:
    """Make ``cls``'s own ``__init__`` (if it has one) check the guard first: code that made an
    instance without calling the class (``object.__new__``) and then called a driver's
    ``__init__`` is refused before the driver opens anything. The check is of ``cls``, the
    class whose ``__init__`` runs, not of the instance's (possibly swapped) class. Its own
    ``_detect_available_configs`` too (route ``"detect"``): a driver's probe of the host's adapters
    (PCAN's and Kvaser's libraries open their device nodes, socketcand's listens for beacons)."""
    _guard_detect(cls)
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "_canarchy_guarded", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        GUARD.check_class(cls, args, kwargs, "init")
        init(self, *args, **kwargs)

    __init__._canarchy_guarded = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    _PATCHED.append((cls, "__init__", __init__))


def _guard_detect(cls: type) -> None:
    """Make ``cls``'s own ``_detect_available_configs`` (a staticmethod of python-can's bus classes) check the
    guard first (:func:`_guard_init`)."""
    found = cls.__dict__.get("_detect_available_configs")
    detect = found.__func__ if isinstance(found, (staticmethod, classmethod)) else None
    if detect is None or getattr(detect, "_canarchy_guarded", False):
        return

    @functools.wraps(detect)
    def _detect_available_configs(*args: Any, **kwargs: Any) -> Any:
        GUARD.check_class(cls, (), {"channel": "<the adapters this host has>"}, "detect")
        return detect(*args, **kwargs)

    _detect_available_configs._canarchy_guarded = True  # type: ignore[attr-defined]
    wrapped = type(found)(_detect_available_configs)
    cls._detect_available_configs = wrapped  # type: ignore[attr-defined]
    _PATCHED.append((cls, "_detect_available_configs", wrapped))


def _subclasses(cls: type) -> list[type]:
    found, pending = [], list(cls.__subclasses__())
    while pending:
        sub = pending.pop()
        found.append(sub)
        pending.extend(sub.__subclasses__())
    return found


_installed = False
_install_lock = threading.Lock()


def _patch_python_can() -> None:
    """Install both hooks into an imported python-can (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        # During `import can` the submodule is not yet an attribute of the package.
        interface_module = sys.modules["can.interface"]
        from can.bus import BusABC
        from can.interfaces import BACKENDS

        if tuple(BACKENDS.get(ALLOWED_INTERFACE, ())) != _VIRTUAL_BACKEND:
            # A plugin replaced the 'virtual' backend: it may not be in-process any more.
            BACKENDS[ALLOWED_INTERFACE] = _VIRTUAL_BACKEND
        original = interface_module._get_class_for_interface

        def _guarded_get_class_for_interface(interface: str):
            GUARD.check_interface_name(interface)
            return original(interface)

        _guarded_get_class_for_interface.__wrapped__ = original  # type: ignore[attr-defined]
        interface_module._get_class_for_interface = _guarded_get_class_for_interface

        def __new__(cls, *args: Any, **kwargs: Any):
            GUARD.check_class(cls, args, kwargs)
            instance = object.__new__(cls)
            if GUARD.enabled:
                GUARD.track(instance)
            return instance

        BusABC.__new__ = __new__  # type: ignore[method-assign]

        def __init_subclass__(cls, **kwargs: Any) -> None:
            super(BusABC, cls).__init_subclass__(**kwargs)
            _guard_init(cls)

        BusABC.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
        interfaces = sys.modules["can.interfaces"]
        _PATCHED[:] = [(interface_module, "_get_class_for_interface", _guarded_get_class_for_interface),
                       (BusABC, "__new__", __new__),
                       (BusABC, "__init_subclass__", BusABC.__dict__["__init_subclass__"]),
                       (interfaces, "BACKENDS", interfaces.BACKENDS)]
        for cls in _subclasses(BusABC):  # the bus classes imported before this hook (later ones: __init_subclass__)
            _guard_init(cls)
        after_import("can.interfaces.virtual", _remember_virtual_class)
        _installed = True


_PATCHED: list[tuple[Any, str, Any]] = []
#: Set when python-can is first imported, after the seal (canarchy.testing.isolation.seal).
SEAL_SKIPS = ("_installed", "_PATCHED", "_VIRTUAL_CLASS")


def patched_attributes() -> list[tuple[Any, str, Any]]:
    """``(object, name, value)`` of each hook installed into python-can (none before it is imported):
    the seal keeps ``value`` even if a test put something else there before it looked."""
    return list(_PATCHED)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a watched module finishes importing."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.callbacks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        callbacks = self.callbacks.pop(fullname)
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                for callback in callbacks:
                    callback()

        spec.loader = _Loader()
        return spec


_AFTER_IMPORT = _AfterImport()


def after_import(module_name: str, callback: Callable[[], None]) -> None:
    """Run ``callback()`` once ``module_name`` is imported (now, if it already is)."""
    if module_name in sys.modules:
        callback()
        return
    _AFTER_IMPORT.callbacks.setdefault(module_name, []).append(callback)
    if _AFTER_IMPORT not in sys.meta_path:
        sys.meta_path.insert(0, _AFTER_IMPORT)


def install() -> None:
    """Install the guard hooks now if python-can is imported, else as soon as it is.

    Does not enable the guard: set ``GUARD.enabled``. The raw-socket check rides on the access
    guard's audit hook (:func:`canarchy.testing.isolation.audithook.observe`; one hook per process).
    """
    from canarchy.testing.isolation import audithook

    audithook.observe("socket.__new__", GUARD.check_socket)
    after_import("can.interface", _patch_python_can)

