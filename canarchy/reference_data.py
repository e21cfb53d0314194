"""Loading and merging of the bundled reference catalogs (J1939, J1587, J2497).

Shared by :mod:`canarchy.j1939_metadata`, :mod:`canarchy.j1587_metadata` and :mod:`canarchy.j2497_metadata`.
The bundled catalog (``canarchy/data/<name>.json``) is read once per process, the user's override file on
every lookup and shallow-merged over it. A missing override file is silent; one that cannot be used is
ignored as a whole, with one warning naming every problem. Formats, ``source`` values and the checks:
``docs/reference-data.md``. Imports neither python-can nor anything that resolves a home path.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Mapping

from canarchy.errors import DecodeError

_DECIMAL = re.compile(r"[0-9]+")

SOURCE_BUNDLED = "bundled"
SOURCE_OVERRIDE = "override"
SOURCE_BOTH = "bundled+override"


@dataclass(frozen=True)
class Catalog:
    """A bundled catalog: ``note`` is the file's ``"source"`` text, ``entries`` maps id -> entry."""

    note: str
    entries: Mapping[int, Mapping[str, Any]]


def load_bundled(filename: str, section: str) -> Catalog:
    """Return the bundled catalog ``canarchy/data/<filename>``, section ``section``.

    The parsed file is cached for the process; callers get fresh copies of
    entries from :func:`merge_entry`, so the cache cannot be mutated through them.

    Raises ``DecodeError`` (``REFERENCE_DATA_INVALID``, exit 3) when the file
    is missing or does not have the shape above: a broken installation, not a
    user error.
    """
    return _load_bundled(filename, section)


@functools.cache
def _load_bundled(filename: str, section: str) -> Catalog:
    from importlib import resources

    hint = "Reinstall canarchy; the bundled reference data is part of the package."
    try:
        text = resources.files("canarchy").joinpath("data", filename).read_text(encoding="utf-8")
        raw = json.loads(text)
    except (OSError, ValueError) as exc:
        raise DecodeError("REFERENCE_DATA_INVALID", f"Bundled catalog {filename} cannot be read: {exc}.",
                          hint) from None
    entries = raw.get(section) if isinstance(raw, dict) else None
    note = raw.get("source") if isinstance(raw, dict) else None
    if not isinstance(entries, dict) or not isinstance(note, str):
        raise DecodeError("REFERENCE_DATA_INVALID",
                          f"Bundled catalog {filename} lacks a \"source\" note or a {section!r} object.", hint)
    return Catalog(note=note, entries={int(key): value for key, value in entries.items()})


def override_path(env_var: str, default: Path) -> Path:
    """The override file to read: ``$<env_var>`` when set and non-empty, else ``default``.

    Called at lookup time. ``default`` is the module's import-time constant
    (e.g. ``j1939_metadata._SPN_OVERRIDES_DEFAULT``), passed in by the caller
    when it is called so a re-pointed constant takes effect.
    """
    value = os.environ.get(env_var, "").strip()
    return Path(value).expanduser() if value else Path(default)


def field_kinds(catalog: Catalog) -> dict[str, set[str]]:
    """For each field of the bundled entries, the JSON kinds it takes
    (``"a number"``, ``"a string"``, ``"null"``, ...)."""
    kinds: dict[str, set[str]] = {}
    for entry in catalog.entries.values():
        for name, value in entry.items():
            kinds.setdefault(name, set()).add(_json_type(value))
    return kinds


def merged_with_overrides(filename: str, section: str, path: Path, *, what: str, max_id: int,
                          check: Callable[[Mapping[str, Any]], list[str]] | None = None,
                          ) -> tuple[dict[int, tuple[dict[str, Any], str]], list[str]]:
    """The bundled catalog merged with the override file at ``path``: ``({id: (entry, source)}, warnings)``.

    Override fields are checked against the bundled catalog's field types, and
    each merged entry against ``check`` (a list of problems, empty when fine);
    see :func:`read_overrides`.
    """
    catalog = load_bundled(filename, section)
    overrides, warnings = read_overrides(path, what=what, max_id=max_id, catalog=catalog, check=check)
    return merged_catalog(catalog, overrides), warnings


def read_overrides(path: Path, *, what: str, max_id: int, catalog: Catalog | None = None,
                   check: Callable[[Mapping[str, Any]], list[str]] | None = None,
                   ) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Read an override file; return ``({id: entry}, warnings)``.

    ``what`` names the catalog in warnings (e.g. ``"J1939 SPN"``); ids must be
    decimal strings within ``0..max_id``. With ``catalog``, a field the bundled
    entries have must keep one of its JSON kinds, and ``check`` is run on each
    entry as merged over the bundled one. Missing file: ``({}, [])``. Unusable
    file: ``({}, [one warning naming the file and each problem])``.
    Never raises for anything in the file.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, []
    except (OSError, UnicodeDecodeError) as exc:
        return {}, [_ignored(what, path, f"it cannot be read ({exc.__class__.__name__}: {exc})")]
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        return {}, [_ignored(what, path, f"it is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")]
    if not isinstance(raw, dict):
        return {}, [_ignored(what, path,
                             f"the top level is {_json_type(raw)}, expected an object keyed by decimal {what} id")]
    entries: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    for key, value in raw.items():
        if not _DECIMAL.fullmatch(key):
            problems.append(f"key {key!r} is not a decimal {what} id")
            continue
        number = int(key)
        if number > max_id:
            problems.append(f"key {key!r} is outside 0..{max_id}")
        elif not isinstance(value, dict):
            problems.append(f"entry {key!r} is {_json_type(value)}, expected an object")
        elif number in entries:
            problems.append(f"key {key!r} names {number} a second time")
        else:
            entries[number] = value
            problems.extend(_entry_problems(key, value, catalog, check))
    if problems:
        return {}, [_ignored(what, path, "; ".join(problems))]
    return entries, []


def merge_entry(bundled: Mapping[str, Any] | None,
                override: Mapping[str, Any] | None) -> tuple[dict[str, Any], str] | None:
    """Shallow-merge one override entry over one bundled entry.

    Returns ``(entry, source)`` with a new dict (nested values deep-copied from
    the bundled side), or ``None`` when both are ``None``.
    """
    if bundled is None and override is None:
        return None
    merged: dict[str, Any] = copy.deepcopy(dict(bundled)) if bundled is not None else {}
    if override is not None:
        merged.update(override)
    if bundled is None:
        return merged, SOURCE_OVERRIDE
    return merged, SOURCE_BOTH if override is not None else SOURCE_BUNDLED


def merged_catalog(catalog: Catalog,
                   overrides: Mapping[int, Mapping[str, Any]]) -> dict[int, tuple[dict[str, Any], str]]:
    """Every id of the bundled catalog and the overrides, each as ``(entry, source)``."""
    out: dict[int, tuple[dict[str, Any], str]] = {}
    for number in sorted(set(catalog.entries) | set(overrides)):
        result = merge_entry(catalog.entries.get(number), overrides.get(number))
        assert result is not None
        out[number] = result
    return out


def _entry_problems(key: str, value: Mapping[str, Any], catalog: Catalog | None,
                    check: Callable[[Mapping[str, Any]], list[str]] | None) -> list[str]:
    if catalog is None:
        return []
    problems = []
    kinds = field_kinds(catalog)
    for name, field_value in value.items():
        expected = kinds.get(name)
        if expected and _json_type(field_value) not in expected:
            problems.append(f"entry {key!r} field {name!r} is {_json_type(field_value)}, "
                            f"expected {' or '.join(sorted(expected))}")
    if not problems and check is not None:
        merged = merge_entry(catalog.entries.get(int(key)), value)
        problems.extend(f"entry {key!r}: {problem}" for problem in check(merged[0]))  # type: ignore[index]
    return problems


def _ignored(what: str, path: Path, reason: str) -> str:
    return f"{what} override file {path} ignored: {reason}. Answering from the bundled catalog only."


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    names = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), "a value")
