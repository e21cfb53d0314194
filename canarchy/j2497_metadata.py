"""J2497 reference data: the bundled message identifier (MID) catalog.

SAE J2497 (PLC4TRUCKS) uses the MIDs of SAE J1587 unchanged; MIDs 0-127 belong to SAE J1708 and are not
bundled. See ``docs/reference-data.md``. Overrides: ``$CANARCHY_J2497_MID_OVERRIDES`` when set and non-empty,
else :data:`_MID_OVERRIDES_DEFAULT` (``~/.canarchy/j2497_mids.json``), read at each lookup; the constant is
bound at import on purpose (the test harness re-points it). Imports neither python-can nor cantools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from canarchy import reference_data
from canarchy.errors import UserInputError

# Bound at import on purpose: the test isolation re-points such import-time paths into each test's home
# (docs/design/test-isolation.md); read at call time below.
_MID_OVERRIDES_DEFAULT = Path.home() / ".canarchy" / "j2497_mids.json"

MID_OVERRIDES_ENV = "CANARCHY_J2497_MID_OVERRIDES"
MID_MAX = 255
J1708_MID_MAX = 127  # MIDs 0-127 belong to SAE J1708
STANDARD = "SAE J1587 / SAE J2497"

_MID_FILE = "j2497_mids.json"


def mid_overrides_path() -> Path:
    """The MID override file in force now: ``$CANARCHY_J2497_MID_OVERRIDES`` or ``_MID_OVERRIDES_DEFAULT``."""
    return reference_data.override_path(MID_OVERRIDES_ENV, _MID_OVERRIDES_DEFAULT)


def lookup_mid(mid: int) -> tuple[dict[str, Any] | None, list[str]]:
    """Look up a MID; return ``(entry, warnings)``, ``entry`` None when unknown.

    ``entry``: ``{mid, name, standard, source}``, plus ``note`` where the
    catalog has one (e.g. the trailer ABS MIDs 137-139 used on PLC4TRUCKS).

    Raises ``UserInputError`` ``INVALID_MID`` unless ``0 <= mid <= 255``.
    """
    if isinstance(mid, bool) or not isinstance(mid, int) or not 0 <= mid <= MID_MAX:
        raise UserInputError("INVALID_MID", f"MID {mid!r} is not an integer in 0..{MID_MAX}.",
                             "J1587/J2497 MIDs are 0-255, in decimal or 0x-hex; the catalog holds 128-255.")
    mids, warnings = _merged()
    if mid not in mids:
        return None, warnings
    entry, source = mids[mid]
    return _view(mid, entry, source), warnings


def list_mids() -> tuple[list[dict[str, Any]], list[str]]:
    """Every MID of the bundled catalog merged with the overrides, as from :func:`lookup_mid`, by MID."""
    mids, warnings = _merged()
    return [_view(mid, entry, source) for mid, (entry, source) in mids.items()], warnings


def _merged() -> tuple[dict[int, tuple[dict[str, Any], str]], list[str]]:
    return reference_data.merged_with_overrides(_MID_FILE, "mids", mid_overrides_path(),
                                                what="J2497 MID", max_id=MID_MAX)


def _view(mid: int, entry: dict[str, Any], source: str) -> dict[str, Any]:
    view: dict[str, Any] = {"name": None}
    view.update(entry)
    view.update(mid=mid, standard=STANDARD, source=source)
    return view
