"""Finding paths under a home that modules bound at import time, to re-point them.

:func:`find` walks a module's attributes (containers, classes of the scanned packages and their instances,
``functools.partial`` objects, functions' default arguments); each path found is a :class:`Target` that
:meth:`Target.point` re-points at another home, and a value that cannot be re-pointed becomes a :class:`Stuck`
named ``module.attribute[key]``. What is walked: ``docs/design/test-isolation.md`` ("Layer 2"). No pytest
import here.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any
from collections.abc import Callable

MAX_DEPTH = 6
_MAX_ITEMS = 50_000  # values looked at per module, at most


@dataclass
class Target:
    """A re-pointable path: ``name`` for messages, ``point(home)`` stores it under ``home``,
    ``current()`` reads what is there now."""

    name: str
    point: Callable[[Any], None]
    current: Callable[[], Any]


@dataclass(frozen=True)
class Stuck:
    """A home path that cannot be re-pointed: ``name`` (``module.attribute[key]``), ``value``, why."""

    name: str
    value: str
    reason: str


class _Slot:
    """Where a value sits: ``get()``, ``set(value)``, ``name``."""

    def __init__(self, name: str, get: Callable[[], Any], put: Callable[[Any], None]) -> None:
        self.name, self.get, self.set = name, get, put


def _attr_slot(holder: Any, attribute: str, name: str) -> _Slot:
    def put(value: Any) -> None:
        try:
            setattr(holder, attribute, value)
        except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
            object.__setattr__(holder, attribute, value)  # a frozen dataclass instance

    return _Slot(name, lambda: getattr(holder, attribute), put)


def _item_slot(container: Any, key: Any, name: str) -> _Slot:
    return _Slot(name, lambda: container[key], lambda value: container.__setitem__(key, value))


def _defaults_slot(function: Any, index: int, name: str) -> _Slot:
    def put(value: Any) -> None:
        defaults = list(function.__defaults__)
        defaults[index] = value
        function.__defaults__ = tuple(defaults)

    return _Slot(name, lambda: function.__defaults__[index], put)


class Finder:
    """Walks values for paths under any of ``homes`` (resolved strings); ``relative(value)``
    returns ``(PurePath under the home, type to rebuild)`` or None; ``packages`` bound
    which classes, instances and functions are looked into."""

    def __init__(self, relative: Callable[[Any], Any], contains_home: Callable[[str], bool],
                 packages: tuple[str, ...]) -> None:
        self.relative, self.contains_home, self.packages = relative, contains_home, packages
        self.targets: list[Target] = []
        self.stuck: list[Stuck] = []
        self._seen: set[int] = set()
        self._budget = _MAX_ITEMS

    def _ours(self, obj: Any) -> bool:
        module = getattr(obj, "__module__", None) or ""
        return any(module == p or module.startswith(p + ".") for p in self.packages)

    def walk_module(self, module_name: str, module: Any) -> None:
        self._budget = _MAX_ITEMS
        for attribute, value in list(vars(module).items()):
            if attribute.startswith("__") and attribute.endswith("__"):
                continue
            self.walk(_attr_slot(module, attribute, f"{module_name}.{attribute}"), value, MAX_DEPTH)

    # -- the walk ---------------------------------------------------------------------
    def walk(self, slot: _Slot, value: Any, depth: int) -> None:
        """Register a target for ``value`` held at ``slot``, or walk into it."""
        rebuild = self.rebuilder(slot, value, depth)
        if rebuild is not None:
            self.targets.append(Target(slot.name, lambda home, r=rebuild: slot.set(r(home)), slot.get))

    def rebuilder(self, slot: _Slot, value: Any, depth: int) -> Callable[[Any], Any] | None:
        """For a value that must be replaced as a whole (a path, or an immutable container holding
        one): a function ``home -> new value``. Mutable containers are walked in place (None)."""
        self._budget -= 1
        found = self.relative(value)
        if found is not None:
            relative, kind = found
            return lambda home: _rebuild(kind, home, relative)
        if isinstance(value, (str, bytes)):
            text = os.fsdecode(value) if isinstance(value, bytes) else value
            if len(text) < 4096 and self.contains_home(text):
                self.stuck.append(Stuck(slot.name, text, "a string that contains a home path among other text"))
            return None
        if depth <= 0 or self._budget <= 0 or isinstance(value, (int, float, complex, bool, type(None))):
            return None
        if id(value) in self._seen:
            return None
        self._seen.add(id(value))
        return self._inside(slot, value, depth)

    def _inside(self, slot: _Slot, value: Any, depth: int) -> Callable[[Any], Any] | None:
        """:meth:`rebuilder` for a holder seen for the first time: its items, elements or attributes."""
        if isinstance(value, dict):
            for key, item in list(value.items()):
                self.walk(_item_slot(value, key, f"{slot.name}[{key!r}]"), item, depth - 1)
            return None
        if isinstance(value, list):
            for index, item in enumerate(list(value)):
                self.walk(_item_slot(value, index, f"{slot.name}[{index}]"), item, depth - 1)
            return None
        if isinstance(value, (tuple, frozenset, set)):
            return self._container(slot, value, depth)
        if isinstance(value, functools.partial):
            return self._partial(slot, value, depth)
        if isinstance(value, type) and self._ours(value):
            self._class(slot.name, value, depth)
            return None
        if callable(value) and hasattr(value, "__defaults__") and self._ours(getattr(value, "__func__", value)):
            self._function(slot.name, getattr(value, "__func__", value), depth)
            return None
        if hasattr(value, "__dict__") and not isinstance(value, type) and self._ours(type(value)):
            for attribute, item in list(vars(value).items()):
                self.walk(_attr_slot(value, attribute, f"{slot.name}.{attribute}"), item, depth - 1)
        return None

    def _container(self, slot: _Slot, value: Any, depth: int) -> Callable[[Any], Any] | None:
        items = list(value)
        parts = []
        for index, item in enumerate(items):
            element = _Slot(f"{slot.name}[{index}]", lambda: None, lambda v: None)  # never set directly
            parts.append(self.rebuilder(element, item, depth - 1))
        if all(p is None for p in parts):
            return None

        def rebuilt(home: Any) -> Any:
            new = [p(home) if p is not None else item for p, item in zip(parts, items, strict=True)]
            if isinstance(value, set):  # mutable: changed in place, the same object stays where it is
                value.clear()
                value.update(new)
                return value
            if hasattr(value, "_make"):  # a named tuple
                return type(value)._make(new)
            return type(value)(new)

        if isinstance(value, set):
            self.targets.append(Target(slot.name, rebuilt, slot.get))
            return None
        return rebuilt

    def _partial(self, slot: _Slot, value: functools.partial, depth: int) -> Callable[[Any], Any] | None:
        self.walk(_Slot(f"{slot.name}.keywords", lambda: value.keywords, lambda v: None), value.keywords, depth - 1)
        args = self._container(_Slot(f"{slot.name}.args", lambda: value.args, lambda v: None), value.args, depth)
        if args is None:
            return None
        return lambda home: functools.partial(value.func, *args(home), **value.keywords)

    def _function(self, name: str, function: Any, depth: int) -> None:
        for index, default in enumerate(function.__defaults__ or ()):
            self.walk(_defaults_slot(function, index, f"{name}(default #{index})"), default, depth - 1)
        kwdefaults = function.__kwdefaults__ or {}
        for key, default in list(kwdefaults.items()):
            self.walk(_item_slot(kwdefaults, key, f"{name}(default {key}=)"), default, depth - 1)

    def _class(self, name: str, cls: type, depth: int) -> None:
        for attribute, value in list(vars(cls).items()):
            if attribute in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__"):
                continue
            inner = getattr(value, "__func__", value)  # staticmethod, classmethod
            if attribute == "__dataclass_fields__":
                for field_name, field in value.items():
                    self.walk(_attr_slot(field, "default", f"{name}.{field_name} (dataclass default)"),
                              field.default, depth - 1)
                continue
            if callable(inner) and hasattr(inner, "__defaults__") and not isinstance(value, type):
                self._function(f"{name}.{attribute}", inner, depth - 1)
                continue
            if attribute.startswith("__") and attribute.endswith("__"):
                continue
            self.walk(_attr_slot(cls, attribute, f"{name}.{attribute}"), value, depth - 1)


def _rebuild(kind: type, home: Any, relative: PurePath) -> Any:
    joined = PurePath(home) / relative
    if kind is str:
        return str(joined)
    if kind is bytes:
        return os.fsencode(str(joined))
    return kind(joined)
