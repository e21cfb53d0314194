"""A mutation definition: the TOML file that reintroduces one fixed defect, read and checked.

Format: ``fixtures/mutations/README.md``. :func:`load_mutation` returns a :class:`Mutation` or raises
:class:`CannotDecide` naming the file and the problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from canarchy.testing.lanes.project import read_toml
from canarchy.testing.lanes.results import CannotDecide

DEFAULT_EXCLUDED = ("ImportError", "ModuleNotFoundError", "SyntaxError")
_KEYS = {"name", "issue", "description", "file", "search", "replace", "edits", "needs_netns", "killers", "controls",
         "kill"}


@dataclass(frozen=True)
class Edit:
    """One search/replace: ``search`` occurs exactly once in ``file`` (as left by the edits before it)."""

    file: str
    search: str
    replace: str


@dataclass(frozen=True)
class Mutation:
    """One mutation definition; ``needs_netns``: the mutant may open a real bus, so its tests
    run only where the isolation's private network namespace exists."""

    name: str
    issue: str
    description: str
    edits: tuple[Edit, ...]
    killers: tuple[str, ...]
    controls: tuple[str, ...]
    excluded_exceptions: tuple[str, ...] = DEFAULT_EXCLUDED
    needs_netns: bool = False
    source: str = ""

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(edit.file for edit in self.edits))

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self.killers + self.controls


def _text(p: Path, doc: dict, key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value.strip():
        raise CannotDecide(f"{p}: `{key}` must be a non-empty string")
    return value


def _relative_file(p: Path, value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CannotDecide(f"{p}: {where} must be a non-empty string")
    file = PurePosixPath(value)
    if file.is_absolute() or ".." in file.parts:
        raise CannotDecide(f"{p}: {where} must be relative to the project root, without '..'")
    return file.as_posix()


def _edit(p: Path, raw: object, default_file: str | None, where: str) -> Edit:
    if not isinstance(raw, dict) or set(raw) - {"file", "search", "replace"}:
        raise CannotDecide(f"{p}: {where} may hold `file`, `search` and `replace` only")
    for key in ("search", "replace"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            hint = " (make the mutant recognisable, e.g. a marker comment)" if key == "replace" else ""
            raise CannotDecide(f"{p}: {where}: `{key}` must be a non-empty string{hint}")
    if raw["search"] == raw["replace"]:
        raise CannotDecide(f"{p}: {where}: `replace` equals `search`: that is no mutation")
    return Edit(_relative_file(p, raw.get("file", default_file), f"{where}: `file`"), raw["search"], raw["replace"])


def _node_ids(p: Path, doc: dict, key: str) -> tuple[str, ...]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise CannotDecide(f"{p}: `{key}` must be a list of pytest node ids")
    return tuple(v.strip() for v in value)


def _excluded(p: Path, doc: dict) -> tuple[str, ...]:
    kill = doc.get("kill", {})
    if not isinstance(kill, dict) or set(kill) - {"requires", "excluded_exceptions"}:
        raise CannotDecide(f"{p}: [kill] may hold `requires` and `excluded_exceptions` only")
    if kill.get("requires", "failure") != "failure":
        raise CannotDecide(f'{p}: [kill].requires must be "failure" (a test-phase <failure>)')
    excluded = kill.get("excluded_exceptions", list(DEFAULT_EXCLUDED))
    if not isinstance(excluded, list) or not all(isinstance(e, str) and e.isidentifier() for e in excluded):
        raise CannotDecide(f"{p}: [kill].excluded_exceptions must be a list of exception names")
    return tuple(excluded)


def load_mutation(path: str | Path) -> Mutation:
    """Read and validate a mutation TOML file; :class:`CannotDecide` names the problem."""
    p = Path(path)
    doc = read_toml(p, CannotDecide, "the mutation")
    required = {"name", "issue", "description", "killers"} | ({"file", "search", "replace"} - (
        {"search", "replace", "file"} if "edits" in doc else set()))
    if set(doc) - _KEYS or required - set(doc):
        raise CannotDecide(f"{p}: unknown keys {sorted(set(doc) - _KEYS)}, missing keys {sorted(required - set(doc))}")
    name = _text(p, doc, "name")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise CannotDecide(f"{p}: `name` may hold letters, digits, '.', '_' and '-' only")
    default_file = _relative_file(p, doc["file"], "`file`") if "file" in doc else None
    if "edits" in doc:
        if "search" in doc or "replace" in doc:
            raise CannotDecide(f"{p}: give either `search`/`replace` or [[edits]], not both")
        if not isinstance(doc["edits"], list) or not doc["edits"]:
            raise CannotDecide(f"{p}: `edits` must be a non-empty array of tables ([[edits]])")
        edits = tuple(_edit(p, raw, default_file, f"edit {i}") for i, raw in enumerate(doc["edits"], 1))
    else:
        edits = (_edit(p, {"search": doc["search"], "replace": doc["replace"]}, default_file, "the mutation"),)
    killers, controls = _node_ids(p, doc, "killers"), _node_ids(p, doc, "controls")
    if not killers:
        raise CannotDecide(f"{p}: `killers` is empty: nothing could catch the mutant")
    listed = killers + controls
    if len(set(listed)) != len(listed):
        raise CannotDecide(f"{p}: a node id is listed twice (killer and control, or repeated)")
    if not isinstance(doc.get("needs_netns", False), bool):
        raise CannotDecide(f"{p}: `needs_netns` must be true or false")
    return Mutation(name, str(doc["issue"]), _text(p, doc, "description").strip(), edits, killers, controls,
                    _excluded(p, doc), doc.get("needs_netns", False), str(p))
