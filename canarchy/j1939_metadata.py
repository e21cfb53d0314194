"""J1939 reference data: the bundled PGN and SPN catalogs, and the 29-bit arbitration ID layout.

Facts from SAE J1939-21 (ID layout, Request, transport protocol), SAE J1939-71 (parameter groups, SPNs),
SAE J1939-73 (DM1/DM2) and SAE J1939-81 (Address Claimed); see ``docs/reference-data.md``. Lookups and lists
return ``(result, warnings)``. SPN overrides: ``$CANARCHY_J1939_SPN_OVERRIDES`` when set and non-empty, else
:data:`_SPN_OVERRIDES_DEFAULT` (``~/.canarchy/j1939_spns.json``), read at each lookup; the constant is bound
at import on purpose (the test harness re-points it). Imports neither python-can nor cantools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Mapping

from canarchy import reference_data
from canarchy.errors import UserInputError

# Bound at import on purpose: the test isolation re-points such import-time paths into each test's home
# (docs/design/test-isolation.md); read at call time below.
_SPN_OVERRIDES_DEFAULT = Path.home() / ".canarchy" / "j1939_spns.json"

SPN_OVERRIDES_ENV = "CANARCHY_J1939_SPN_OVERRIDES"
PGN_MAX = 0x3FFFF  # 18 bits: EDP, DP, PF, PS (SAE J1939-21)
SPN_MAX = 524287  # 19 bits (SAE J1939-71)
ARBITRATION_ID_MAX = 0x1FFFFFFF  # 29-bit extended identifier
PDU2_MIN_PF = 240  # PF 0..239: PDU1 (destination specific); 240..255: PDU2 (broadcast)

_PGN_FILE = "j1939_pgns.json"
_SPN_FILE = "j1939_spns.json"
_PGN_FIELDS = ("acronym", "name", "length", "transmission_rate", "default_priority", "standard")
_SPN_FIELDS = ("name", "pgn", "start_position", "start_bit", "bit_length", "resolution", "offset", "unit", "data_range")


def spn_overrides_path() -> Path:
    """The SPN override file in force now: ``$CANARCHY_J1939_SPN_OVERRIDES`` or ``_SPN_OVERRIDES_DEFAULT``."""
    return reference_data.override_path(SPN_OVERRIDES_ENV, _SPN_OVERRIDES_DEFAULT)


def lookup_pgn(pgn: int) -> tuple[dict[str, Any] | None, list[str]]:
    """Look up a PGN; return ``(entry, warnings)``, ``entry`` None when unknown.

    ``entry``: ``{pgn, pgn_hex, pdu_format, acronym, name, length (bytes, or
    "variable"), transmission_rate, default_priority, standard, spn_count,
    spns: [SPN entries as from lookup_spn, by start_bit], source}``; ``note``
    when the catalog has one. ``source`` is ``"bundled"``; ``"bundled+override"``
    when an override changed or added one of its SPNs; ``"override"`` when only
    override SPNs name this PGN (its name etc. are then None).

    Raises ``UserInputError`` ``INVALID_PGN`` unless ``0 <= pgn <= 0x3FFFF``.
    """
    _check(pgn, PGN_MAX, "INVALID_PGN", "PGN")
    pgns = _pgns()
    spns, warnings = _merged_spns()
    carried = [_spn_view(number, entry, source, pgns) for number, (entry, source) in spns.items()
               if entry.get("pgn") == pgn]
    if pgn not in pgns.entries and not carried:
        return None, warnings
    return _pgn_view(pgn, pgns.entries.get(pgn), carried), warnings


def lookup_spn(spn: int) -> tuple[dict[str, Any] | None, list[str]]:
    """Look up an SPN; return ``(entry, warnings)``, ``entry`` None when unknown.

    ``entry``: ``{spn, name, pgn, pgn_acronym, start_position (J1939 1-based
    byte.bit, e.g. "4-5"), start_bit (0-based LSB index in the little-endian
    payload), bit_length, resolution (scale per bit), offset, unit,
    data_range: {min, max}, standard, source}`` plus catalog extras (``kind``,
    ``states``, ``layout_note``). Keys with no figure are None.

    Raises ``UserInputError`` ``INVALID_SPN`` unless ``0 <= spn <= 524287``.
    """
    _check(spn, SPN_MAX, "INVALID_SPN", "SPN")
    spns, warnings = _merged_spns()
    if spn not in spns:
        return None, warnings
    entry, source = spns[spn]
    return _spn_view(spn, entry, source, _pgns()), warnings


def list_pgns() -> tuple[list[dict[str, Any]], list[str]]:
    """Every PGN of the bundled catalog and of the SPN overrides, as from :func:`lookup_pgn`, by PGN."""
    pgns = _pgns()
    spns, warnings = _merged_spns()
    by_pgn: dict[int, list[dict[str, Any]]] = {number: [] for number in pgns.entries}
    for number, (entry, source) in spns.items():
        owner = entry.get("pgn")
        if _is_int(owner) and 0 <= owner <= PGN_MAX:
            by_pgn.setdefault(owner, []).append(_spn_view(number, entry, source, pgns))
    return [_pgn_view(n, pgns.entries.get(n), carried) for n, carried in sorted(by_pgn.items())], warnings


def list_spns() -> tuple[list[dict[str, Any]], list[str]]:
    """Every SPN of the bundled catalog merged with the overrides, as from :func:`lookup_spn`, by SPN."""
    pgns = _pgns()
    spns, warnings = _merged_spns()
    return [_spn_view(number, entry, source, pgns) for number, (entry, source) in spns.items()], warnings


# --- the 29-bit identifier (SAE J1939-21) -------------------------------------------------
#
#   bits 28-26 priority | 25 EDP | 24 DP | 23-16 PF | 15-8 PS | 7-0 SA
#
# PGN = EDP, DP, PF, PS (18 bits). PF < 240 (PDU1): PS is the destination
# address and the PGN carries PS = 0. PF >= 240 (PDU2): PS is the group
# extension and part of the PGN.


def pgn_from_arbitration_id(can_id: int) -> int:
    """The PGN of a 29-bit arbitration ID (SAE J1939-21).

    Examples: ``0x0CF00400`` -> 61444 (EEC1); ``0x18FEF100`` -> 65265 (CCVS1);
    ``0x1CECFF00`` -> 60416 (TP.CM; PDU1, so the destination 0xFF is not part of it).

    Raises ``UserInputError`` ``INVALID_ARBITRATION_ID`` unless ``0 <= can_id <= 0x1FFFFFFF``.
    """
    _check_id(can_id)
    pgn = (can_id >> 8) & PGN_MAX
    if _pf(can_id) < PDU2_MIN_PF:
        pgn &= ~0xFF
    return pgn


def source_address(can_id: int) -> int:
    """The source address (SA, bits 7-0) of a 29-bit arbitration ID: 0..255.
    Raises as :func:`pgn_from_arbitration_id`."""
    _check_id(can_id)
    return can_id & 0xFF


def priority(can_id: int) -> int:
    """The priority (bits 28-26) of a 29-bit arbitration ID: 0 (highest) .. 7.
    Raises as :func:`pgn_from_arbitration_id`."""
    _check_id(can_id)
    return (can_id >> 26) & 0x7


def destination_address(can_id: int) -> int | None:
    """The destination address (PS) of a PDU1 arbitration ID (255 = global); None for PDU2 (broadcast).

    Raises as :func:`pgn_from_arbitration_id`.
    """
    _check_id(can_id)
    return (can_id >> 8) & 0xFF if _pf(can_id) < PDU2_MIN_PF else None


def pdu_format(pgn: int) -> str:
    """``"PDU1"`` (PF < 240, destination specific) or ``"PDU2"`` (broadcast) for a PGN.

    Raises ``UserInputError`` ``INVALID_PGN`` unless ``0 <= pgn <= 0x3FFFF``.
    """
    _check(pgn, PGN_MAX, "INVALID_PGN", "PGN")
    return "PDU1" if ((pgn >> 8) & 0xFF) < PDU2_MIN_PF else "PDU2"


def describe_arbitration_id(can_id: int) -> dict[str, Any]:
    """Split a 29-bit arbitration ID: ``{arbitration_id, priority, edp, dp, pf, ps, pgn,
    pdu_format, destination_address (None for PDU2), source_address}``. Raises as
    :func:`pgn_from_arbitration_id`."""
    pgn = pgn_from_arbitration_id(can_id)
    return {
        "arbitration_id": can_id,
        "priority": priority(can_id),
        "edp": (can_id >> 25) & 1,
        "dp": (can_id >> 24) & 1,
        "pf": _pf(can_id),
        "ps": (can_id >> 8) & 0xFF,
        "pgn": pgn,
        "pdu_format": pdu_format(pgn),
        "destination_address": destination_address(can_id),
        "source_address": source_address(can_id),
    }


# --- internals --------------------------------------------------------------------------------


def _pgns() -> reference_data.Catalog:
    return reference_data.load_bundled(_PGN_FILE, "pgns")


def _spn_problems(entry: Mapping[str, Any]) -> list[str]:
    """Where an SPN sits must fit a classic 8-byte J1939 frame (SAE J1939-71), and its scale be usable."""
    problems = []
    start, length = entry.get("start_bit"), entry.get("bit_length")
    if isinstance(start, int) and not 0 <= start <= 63:
        problems.append(f"start_bit {start} is outside 0..63")
    if isinstance(length, int) and not 1 <= length <= 64:
        problems.append(f"bit_length {length} is outside 1..64")
    if isinstance(start, int) and isinstance(length, int) and not problems and start + length > 64:
        problems.append(f"start_bit {start} + bit_length {length} runs past the 8-byte frame")
    resolution = entry.get("resolution")
    if isinstance(resolution, (int, float)) and not isinstance(resolution, bool) and resolution <= 0:
        problems.append(f"resolution {resolution} is not > 0")
    return problems


def _merged_spns() -> tuple[dict[int, tuple[dict[str, Any], str]], list[str]]:
    return reference_data.merged_with_overrides(_SPN_FILE, "spns", spn_overrides_path(), what="J1939 SPN",
                                                max_id=SPN_MAX, check=_spn_problems)


def _pgn_view(pgn: int, bundled: Any, carried: list[dict[str, Any]]) -> dict[str, Any]:
    entry: dict[str, Any] = dict.fromkeys(_PGN_FIELDS)
    if bundled is not None:
        entry.update(reference_data.merge_entry(bundled, None)[0])  # type: ignore[index]
    carried.sort(key=_payload_order)
    if bundled is None:
        source = reference_data.SOURCE_OVERRIDE
    elif any(spn["source"] != reference_data.SOURCE_BUNDLED for spn in carried):
        source = reference_data.SOURCE_BOTH
    else:
        source = reference_data.SOURCE_BUNDLED
    entry.update(pgn=pgn, pgn_hex=f"0x{pgn:04X}", pdu_format=pdu_format(pgn), spns=carried,
                 spn_count=len(carried), source=source)
    return entry


def _spn_view(spn: int, entry: dict[str, Any], source: str, pgns: reference_data.Catalog) -> dict[str, Any]:
    view: dict[str, Any] = dict.fromkeys(_SPN_FIELDS)
    view.update(entry)
    owner = pgns.entries.get(view["pgn"]) if _is_int(view["pgn"]) else None
    view["pgn_acronym"] = owner.get("acronym") if owner else None
    if view.get("standard") is None:
        view["standard"] = owner.get("standard") if owner else None
    view.update(spn=spn, source=source)
    return view


def _payload_order(spn: dict[str, Any]) -> tuple[int, int]:
    """Sort key: start bit, else the first byte of ``start_position`` ("3-5" -> 16), else last."""
    if _is_int(spn.get("start_bit")):
        return spn["start_bit"], spn["spn"]
    head = str(spn.get("start_position") or "").split("-")[0].split(".")[0]
    return ((int(head) - 1) * 8 if head.isdecimal() and int(head) > 0 else 1 << 30), spn["spn"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(value: Any, maximum: int, code: str, what: str) -> None:
    if not _is_int(value) or not 0 <= value <= maximum:
        raise UserInputError(code, f"{what} {value!r} is not an integer in 0..{maximum} (0x{maximum:X}).",
                             f"Give the {what} in decimal or 0x-hex, 0..{maximum}.")


def _check_id(can_id: Any) -> None:
    if not _is_int(can_id) or not 0 <= can_id <= ARBITRATION_ID_MAX:
        raise UserInputError("INVALID_ARBITRATION_ID",
                             f"Arbitration ID {can_id!r} is not a 29-bit identifier (0..0x1FFFFFFF).",
                             "J1939 uses 29-bit (extended) arbitration IDs, e.g. 0x0CF00400.")


def _pf(can_id: int) -> int:
    return (can_id >> 16) & 0xFF
