"""J1587 reference data: the bundled parameter identifier (PID) catalog.

Facts from SAE J1587 (Appendix A); pages and data lengths by PID range: ``docs/reference-data.md``.
Overrides: ``$CANARCHY_J1587_PID_OVERRIDES`` when set and non-empty, else :data:`_PID_OVERRIDES_DEFAULT`
(``~/.canarchy/j1587_pids.json``), read at each lookup; the constant is bound at import on purpose (the test
harness re-points it). Imports neither python-can nor cantools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from canarchy import reference_data
from canarchy.errors import UserInputError

# Bound at import on purpose: the test isolation re-points such import-time paths into each test's home
# (docs/design/test-isolation.md); read at call time below.
_PID_OVERRIDES_DEFAULT = Path.home() / ".canarchy" / "j1587_pids.json"

PID_OVERRIDES_ENV = "CANARCHY_J1587_PID_OVERRIDES"
PID_MAX = 511  # two pages of 256 PIDs (SAE J1587)
STANDARD = "SAE J1587"

_PID_FILE = "j1587_pids.json"
_PID_FIELDS = ("name", "data_length", "data_type", "resolution", "unit", "data_range")


def pid_overrides_path() -> Path:
    """The PID override file in force now: ``$CANARCHY_J1587_PID_OVERRIDES`` or ``_PID_OVERRIDES_DEFAULT``."""
    return reference_data.override_path(PID_OVERRIDES_ENV, _PID_OVERRIDES_DEFAULT)


def pid_page(pid: int) -> int:
    """The J1587 page of a PID: 1 for 0-255, 2 for 256-511. Raises ``UserInputError`` ``INVALID_PID``."""
    _check(pid)
    return 1 if pid < 256 else 2


def lookup_pid(pid: int) -> tuple[dict[str, Any] | None, list[str]]:
    """Look up a PID; return ``(entry, warnings)``, ``entry`` None when unknown.

    ``entry``: ``{pid, page (1|2), name, data_length (data characters, or
    "variable"), length_prefixed (bool: a byte count precedes the data, PIDs
    192-253 of a page), data_type ("unsigned", "signed", "bit-mapped",
    "ASCII", "special"), resolution, unit (native, US customary), data_range:
    {min, max}, standard, source}``; ``metric: {resolution, unit}`` and
    ``note`` where the catalog has them. Keys with no figure are None.

    Raises ``UserInputError`` ``INVALID_PID`` unless ``0 <= pid <= 511``.
    """
    _check(pid)
    pids, warnings = _merged()
    if pid not in pids:
        return None, warnings
    entry, source = pids[pid]
    return _view(pid, entry, source), warnings


def list_pids() -> tuple[list[dict[str, Any]], list[str]]:
    """Every PID of the bundled catalog merged with the overrides, as from :func:`lookup_pid`, by PID."""
    pids, warnings = _merged()
    return [_view(pid, entry, source) for pid, (entry, source) in pids.items()], warnings


def _merged() -> tuple[dict[int, tuple[dict[str, Any], str]], list[str]]:
    return reference_data.merged_with_overrides(_PID_FILE, "pids", pid_overrides_path(),
                                                what="J1587 PID", max_id=PID_MAX)


def _view(pid: int, entry: dict[str, Any], source: str) -> dict[str, Any]:
    view: dict[str, Any] = dict.fromkeys(_PID_FIELDS)
    view.update(entry)
    view.update(pid=pid, page=pid_page(pid), length_prefixed=192 <= pid % 256 <= 253,
                standard=STANDARD, source=source)
    return view


def _check(pid: Any) -> None:
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= PID_MAX:
        raise UserInputError("INVALID_PID", f"PID {pid!r} is not an integer in 0..{PID_MAX}.",
                             "J1587 PIDs are 0-255 (page 1) and 256-511 (page 2), in decimal or 0x-hex.")
