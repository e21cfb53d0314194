"""The isolation's own integrity: a test may not switch off or replace what protects the next one.

:class:`Seal` remembers, when it is made, every global of the given modules and
every attribute of the classes they define (by identity; a set, list or dict
also by its contents, one level down; a module's ``SEAL_SKIPS`` names what it
changes itself later), chosen attributes of chosen objects, and
which of those objects' own attributes exist (one added there can hide a method).
:meth:`Seal.broken` names each that differs since and puts it back.
"""

from __future__ import annotations

import inspect
import operator
from itertools import repeat
from types import MappingProxyType, ModuleType
from typing import Any
from collections.abc import Iterable

_MISSING = object()


def _contents(value: Any) -> Any:
    """A record of a mutable container's contents (one level down) for :func:`_same`, else None."""
    if isinstance(value, set):
        return frozenset(value)
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value), tuple((k, list(v)) for k, v in value.items() if isinstance(v, list))
    return None


def _same(value: Any, record: Any) -> bool:
    """Whether ``value`` still holds what :func:`_contents` recorded (``==``, identity first)."""
    if isinstance(record, tuple):
        items, lists = record
        for key, inner in lists:
            if value.get(key) != inner:
                return False
        return value == items
    return value == record


def _refill(container: Any, contents: Any) -> None:
    if isinstance(container, set):
        container.clear()
        container.update(contents)
    elif isinstance(container, list):
        container[:] = contents
    elif isinstance(container, dict):
        items, lists = contents
        container.clear()
        container.update(items)
        for key, inner in lists:
            container[key][:] = inner


def _raw(holder: Any, name: str) -> Any:
    """A class's own attribute as stored (a staticmethod stays one), else ``getattr``."""
    if inspect.isclass(holder):
        return holder.__dict__.get(name, _MISSING)
    return getattr(holder, name, _MISSING)


def _namespace(holder: Any) -> Any:
    """Where ``holder``'s own attributes live, read without ``getattr`` (a module's or a
    class's ``__dict__``; both live views), or None for any other object."""
    if isinstance(holder, ModuleType) or inspect.isclass(holder):
        return holder.__dict__
    return None


class Seal:
    """``modules``: sealed whole (their classes too); ``attributes``: ``(object, name)`` pairs;
    ``instances``: objects that may not gain an attribute of their own."""

    def __init__(self, modules: Iterable[ModuleType], attributes: Iterable[tuple[Any, str]] = (),
                 instances: Iterable[Any] = ()) -> None:
        self._kept: list[tuple[str, Any, str, Any, Any]] = []
        self._keys: set[tuple[int, str]] = set()
        for module in modules:
            short = module.__name__.rsplit(".", 1)[-1]
            skipped = set(getattr(module, "SEAL_SKIPS", ()))
            for name, value in list(vars(module).items()):
                if name.startswith("__") or name in skipped:
                    continue
                self._keep(f"{short}.{name}", module, name, value)
                if inspect.isclass(value) and value.__module__ == module.__name__:
                    for attr, member in list(vars(value).items()):
                        if attr not in ("__dict__", "__weakref__", "__doc__", "__module__"):
                            self._keep(f"{short}.{name}.{attr}", value, attr, member)
        self.extend(attributes)
        self._instances = [(obj, frozenset(vars(obj))) for obj in instances]
        self._fast: tuple | None = None
        # What the fast check calls, taken now: a test that replaces builtins.all or operator.is_
        # (outside the sealed modules) cannot make it say "unchanged".
        self._ops = (all, map, operator.is_, repeat, _same, (getattr, dict.get, MappingProxyType.get))

    def extend(self, attributes: Iterable[tuple[Any, ...]], contents: bool = True) -> None:
        """Seal ``(object, name)`` pairs too, as they are now, or ``(object, name, value)`` with
        the value they must hold (a pair already sealed is skipped); ``contents=False``:
        identity only (a cache or a record list that changes in place)."""
        for holder, name, *value in attributes:
            if (id(holder), name) not in self._keys:
                label = f"{getattr(holder, '__name__', type(holder).__name__)}.{name}"
                self._keep(label, holder, name, value[0] if value else _raw(holder, name), contents)

    def renew(self, holder: Any, name: str) -> None:
        """Seal ``holder.name`` as it is now: the isolation itself changed it after the seal was made (a
        containment a project's conftest asked for)."""
        self._fast = None
        self._kept = [entry if entry[2] is not holder or entry[3] != name else
                      (*entry[:4], _raw(holder, name), None if entry[5] is None else _contents(_raw(holder, name)))
                      for entry in self._kept]

    def _keep(self, label: str, holder: Any, name: str, value: Any, contents: bool = True) -> None:
        self._fast = None
        self._keys.add((id(holder), name))
        # a class's dunder dicts (annotations, dataclass fields) protect nothing: identity only
        record = None if name.startswith("__") or not contents else _contents(value)
        self._kept.append((label, _namespace(holder), holder, name, value, record))

    def _unchanged(self) -> bool:
        """Whether nothing sealed differs: per kind of holder (a module's dict, a class's mapping proxy,
        any other object), one C-level ``map`` of the kind's unbound lookup over its entries."""
        every, each, is_, repeated, same, lookups = self._ops
        if self._fast is None:
            columns: list[tuple[list, list, list]] = [([], [], []) for _ in lookups]
            for _label, namespace, holder, name, value, _contents in self._kept:
                kind = 0 if namespace is None else 1 if type(namespace) is dict else 2
                where, names, values = columns[kind]
                where.append(holder if namespace is None else namespace)
                names.append(name)
                values.append(value)
            sealed = [(k[4], k[5]) for k in self._kept if k[5] is not None]
            self._fast = ([(lookup, *column) for lookup, column in zip(lookups, columns, strict=True)],
                          [v for v, _ in sealed], [c for _, c in sealed])
        groups, containers, records = self._fast
        return (every(every(each(is_, each(lookup, holders, names, repeated(_MISSING)), values))
                      for lookup, holders, names, values in groups)
                and every(each(same, containers, records))
                and every(names.issuperset(vars(obj)) for obj, names in self._instances))

    def broken(self) -> list[str]:
        """What changed since the seal was made, in words (each put back). Runs twice per
        test: a C-speed comparison first; the entries one by one only when something differs."""
        if self._unchanged():
            return []
        found = []
        for label, namespace, holder, name, value, contents in self._kept:
            now = namespace.get(name, _MISSING) if namespace is not None else getattr(holder, name, _MISSING)
            if now is not value:
                found.append(f"{label} replaced")
                setattr(holder, name, value)
            elif contents is not None and not _same(value, contents):
                found.append(f"{label} changed")
                _refill(value, contents)
        for obj, names in self._instances:
            for name in set(vars(obj)) - names:
                found.append(f"{type(obj).__name__}.{name} added")
                del vars(obj)[name]
        return found
