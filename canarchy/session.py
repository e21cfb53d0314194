"""Project-local sessions: a named record of the channel, DBC and capture a user works with.

Files under ``./.canarchy/`` of the working directory (resolved at call time): ``sessions/<name>.json`` and
the pointer ``active_session.json``; formats in ``docs/caches-and-sessions.md``. Every write is atomic, and a
file canarchy cannot read is never overwritten. Errors (``UserInputError``, exit 1): ``INVALID_SESSION_NAME``,
``INVALID_ARGUMENTS`` (a blank field), ``SESSION_NOT_FOUND``, ``SESSION_CORRUPT``, ``SESSION_WRITE_FAILED``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from canarchy.errors import UserInputError
from canarchy.fileio import write_json_atomic

_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
_FIELDS = ("interface", "dbc", "capture")


def _state_dir() -> Path:
    return Path.cwd() / ".canarchy"


def sessions_dir() -> Path:
    """``./.canarchy/sessions`` under the current working directory (resolved now)."""
    return _state_dir() / "sessions"


def active_pointer_path() -> Path:
    """``./.canarchy/active_session.json`` under the current working directory (resolved now)."""
    return _state_dir() / "active_session.json"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def validate_name(name: str) -> str:
    """Return ``name`` if it is a session name, else raise ``INVALID_SESSION_NAME``.

    A name is 1..128 letters, digits, ``-``, ``_`` or ``.``, does not start
    with ``.`` and holds no path separator (it becomes ``<name>.json``).
    """
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise UserInputError(
            "INVALID_SESSION_NAME",
            f"{name!r} is not a valid session name.",
            "Use 1-128 letters, digits, '-', '_' or '.', not starting with '.' and without '/' or '\\' "
            "(e.g. `bench-1`).",
        )
    return name


def _session_path(name: str) -> Path:
    return sessions_dir() / f"{name}.json"


def _corrupt(path: Path, reason: str) -> UserInputError:
    return UserInputError(
        "SESSION_CORRUPT",
        f"{path} is not a valid canarchy session file: {reason}.",
        f"Inspect {path}, then fix it or move it aside; canarchy will not overwrite it.",
    )


def _read_json(path: Path) -> Any:
    """Parse a JSON file; ``FileNotFoundError`` passes through, anything else is ``SESSION_CORRUPT``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except NotADirectoryError:
        # A parent is a plain file: there is no such session file to read.
        raise FileNotFoundError(str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _corrupt(path, f"it cannot be read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"not JSON ({exc})") from None


def _read_record(path: Path, name: str) -> dict[str, Any]:
    """Read and check one session record; raises ``FileNotFoundError`` or ``SESSION_CORRUPT``."""
    record = _read_json(path)
    if not isinstance(record, dict):
        raise _corrupt(path, "expected a JSON object")
    if record.get("name") != name:
        raise _corrupt(path, f"its 'name' is {record.get('name')!r}, expected {name!r}")
    for key in _FIELDS:
        if key not in record:
            raise _corrupt(path, f"missing key {key!r}")
        if record[key] is not None and not isinstance(record[key], str):
            raise _corrupt(path, f"{key!r} must be a string or null")
    if not isinstance(record.get("saved_at"), str):
        raise _corrupt(path, "'saved_at' must be a string")
    return record


def _read_pointer() -> str | None:
    """The active session's name from the pointer file, or None when there is none."""
    path = active_pointer_path()
    try:
        pointer = _read_json(path)
    except FileNotFoundError:
        return None
    if not isinstance(pointer, dict) or not isinstance(pointer.get("name"), str) \
            or _NAME_RE.fullmatch(pointer["name"]) is None:
        raise _corrupt(path, "expected an object whose 'name' is a session name")
    return pointer["name"]


def _write_failed(path: Path, exc: OSError) -> UserInputError:
    return UserInputError(
        "SESSION_WRITE_FAILED",
        f"Could not write {path}: {exc.strerror or exc}.",
        f"Check that {path.parent} is a writable directory; nothing was changed.",
    )


def _atomic_write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` (sorted keys) to ``path`` atomically; raises ``SESSION_WRITE_FAILED``.

    See :mod:`canarchy.fileio`: on any failure ``path`` is left as it was.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, document)
    except OSError as exc:
        raise _write_failed(path, exc) from None


def _not_found(name: str) -> UserInputError:
    saved = list_sessions()
    listing = ", ".join(saved) if saved else "none"
    return UserInputError(
        "SESSION_NOT_FOUND",
        f"No session named {name!r} in {sessions_dir()}.",
        f"Run `canarchy session show` to list saved sessions (saved here: {listing}), "
        "or create it with `canarchy session save NAME`.",
    )


def list_sessions() -> list[str]:
    """Names of the sessions saved under ``./.canarchy/sessions``, sorted."""
    directory = sessions_dir()
    if not directory.is_dir():
        return []
    return sorted(
        p.stem for p in directory.glob("*.json") if _NAME_RE.fullmatch(p.stem) and p.is_file()
    )


def _activate(name: str) -> None:
    """Point ``active_session.json`` at ``name``; refuses to overwrite a corrupt pointer."""
    _read_pointer()
    _atomic_write_json(active_pointer_path(), {"name": name, "activated_at": _now()})


def save_session(name: str, interface: str | None = None, dbc: str | None = None,
                 capture: str | None = None) -> dict[str, Any]:
    """Save (or replace) session ``name`` and make it active; return the record.

    Record: ``{"name", "interface", "dbc", "capture", "saved_at"}`` (unset
    fields are null; paths are stored as given). Raises
    ``INVALID_SESSION_NAME``, ``INVALID_ARGUMENTS`` (a blank field),
    ``SESSION_CORRUPT`` (an existing record or pointer that cannot be read —
    left untouched) and ``SESSION_WRITE_FAILED``.
    """
    validate_name(name)
    values = {"interface": interface, "dbc": dbc, "capture": capture}
    for key, value in values.items():
        if value is not None and not value.strip():
            raise UserInputError(
                "INVALID_ARGUMENTS",
                f"--{key} is blank.",
                f"Give --{key} a value or leave the option out.",
            )
    path = _session_path(name)
    try:
        _read_record(path, name)
    except FileNotFoundError:
        pass
    _read_pointer()
    record = {"name": name, **values, "saved_at": _now()}
    _atomic_write_json(path, record)
    _activate(name)
    return record


def load_session(name: str) -> dict[str, Any]:
    """Make session ``name`` active and return its record.

    Raises ``INVALID_SESSION_NAME``, ``SESSION_NOT_FOUND`` (the hint lists the
    saved sessions), ``SESSION_CORRUPT`` (nothing is changed) and
    ``SESSION_WRITE_FAILED``.
    """
    validate_name(name)
    try:
        record = _read_record(_session_path(name), name)
    except FileNotFoundError:
        raise _not_found(name) from None
    _activate(name)
    return record


def show_sessions() -> tuple[dict[str, Any], list[str]]:
    """The active session and the saved ones: ``({"active", "sessions", "session_count"}, warnings)``.

    ``active`` is the active record, or None when no session is active or the
    pointer names a session that no longer exists (then a warning says so).
    Raises ``SESSION_CORRUPT`` when the pointer or the active record cannot be read.
    """
    warnings: list[str] = []
    active = None
    name = _read_pointer()
    if name is not None:
        try:
            active = _read_record(_session_path(name), name)
        except FileNotFoundError:
            warnings.append(
                f"SESSION_NOT_FOUND: {active_pointer_path()} names session {name!r}, "
                f"which is no longer saved; no session is active."
            )
    sessions = list_sessions()
    return {"active": active, "sessions": sessions, "session_count": len(sessions)}, warnings
