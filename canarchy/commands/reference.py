"""Reference lookups: `j1939 pgn N`, `j1939 spn N`, `j1587 pid N`, `j1587 pids`, `j2497 mid N`, `j2497 mids`.

Offline: answers come from the bundled catalogs merged with the user's
override files (:mod:`canarchy.reference_data`); nothing here touches a bus or
imports python-can. N is decimal or 0x-hex. Data shapes and error codes:
``docs/reference-data.md``.
"""

from __future__ import annotations

import argparse
from typing import Any

from canarchy.output import CommandResult
from canarchy.commands._common import parse_int
from canarchy.errors import UserInputError


def add_parser(subparsers: Any, parent: argparse.ArgumentParser) -> None:
    """Register the `j1939`, `j1587` and `j2497` groups."""
    group = subparsers.add_parser("j1939", parents=[parent], help="J1939 reference lookups (PGNs, SPNs)")
    sub = group.add_subparsers(dest="j1939_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("pgn", parents=[parent], help="describe a parameter group and the SPNs it carries")
    p.add_argument("number", metavar="N", help="PGN, decimal or 0x-hex (0..0x3FFFF), e.g. 61444 or 0xF004")
    p.set_defaults(command="j1939 pgn", handler=_pgn, render_text=_render_pgn)
    p = sub.add_parser("spn", parents=[parent], help="describe a suspect parameter (position, scaling, unit)")
    p.add_argument("number", metavar="N", help="SPN, decimal or 0x-hex (0..524287), e.g. 190")
    p.set_defaults(command="j1939 spn", handler=_spn, render_text=_render_spn)
    from canarchy.commands.decode import add_j1939_decode_parser  # `j1939 decode --file`: offline, no bus

    add_j1939_decode_parser(sub, parent)

    group = subparsers.add_parser("j1587", parents=[parent], help="J1587 reference lookups (PIDs)")
    sub = group.add_subparsers(dest="j1587_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("pid", parents=[parent], help="describe a J1587 parameter identifier")
    p.add_argument("number", metavar="N", help="PID, decimal or 0x-hex (0..511; 256-511 are page 2), e.g. 84")
    p.set_defaults(command="j1587 pid", handler=_pid, render_text=_render_pid)
    p = sub.add_parser("pids", parents=[parent], help="list the J1587 PID catalog")
    p.set_defaults(command="j1587 pids", handler=_pids, render_text=_render_pids)

    group = subparsers.add_parser("j2497", parents=[parent], help="J2497 / J1587 reference lookups (MIDs)")
    sub = group.add_subparsers(dest="j2497_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("mid", parents=[parent], help="name a J1587/J2497 message identifier")
    p.add_argument("number", metavar="N", help="MID, decimal or 0x-hex (0..255), e.g. 137")
    p.set_defaults(command="j2497 mid", handler=_mid, render_text=_render_mid)
    p = sub.add_parser("mids", parents=[parent], help="list the J1587/J2497 MID catalog")
    p.set_defaults(command="j2497 mids", handler=_mids, render_text=_render_mids)


# --- handlers -------------------------------------------------------------------------------


def _pgn(args: argparse.Namespace) -> CommandResult:
    from canarchy import j1939_metadata as j1939

    pgn = _parse_pgn(args.number)
    entry, warnings = j1939.lookup_pgn(pgn)
    if entry is None:
        hint = (f"The bundled catalog holds common SAE J1939-71/-21/-73 PGNs. To describe this one, add its SPNs "
                f"(each with \"pgn\": {pgn}) to {j1939.spn_overrides_path()}, a JSON object keyed by decimal SPN, "
                f"or point CANARCHY_J1939_SPN_OVERRIDES at such a file.")
        if j1939.pdu_format(pgn) == "PDU1" and pgn & 0xFF:
            base = pgn & ~0xFF
            hint = (f"PDU1 PGNs (PF < 240) carry PS = 0: the low byte is a destination address. "
                    f"Did you mean {base} (0x{base:04X})? ") + hint
        raise UserInputError("PGN_NOT_FOUND", f"PGN {pgn} (0x{pgn:04X}) is not in the J1939 catalog.",
                             _with_warnings(hint, warnings))
    return CommandResult(data=entry, warnings=warnings)


def _spn(args: argparse.Namespace) -> CommandResult:
    from canarchy import j1939_metadata as j1939

    spn = parse_int(args.number, "INVALID_SPN", "SPN", 0, j1939.SPN_MAX,
                    f"Give the SPN in decimal or 0x-hex, 0..{j1939.SPN_MAX} (19 bits), e.g. 190.")
    entry, warnings = j1939.lookup_spn(spn)
    if entry is None:
        hint = (f"The bundled catalog holds common SAE J1939-71 SPNs. Add this one to "
                f"{j1939.spn_overrides_path()} (a JSON object keyed by decimal SPN) or point "
                f"CANARCHY_J1939_SPN_OVERRIDES at such a file.")
        raise UserInputError("SPN_NOT_FOUND", f"SPN {spn} is not in the J1939 catalog.", _with_warnings(hint, warnings))
    return CommandResult(data=entry, warnings=warnings)


def _pid(args: argparse.Namespace) -> CommandResult:
    from canarchy import j1587_metadata as j1587

    pid = parse_int(args.number, "INVALID_PID", "PID", 0, j1587.PID_MAX,
                    "J1587 PIDs are 0-255 (page 1) and 256-511 (page 2), in decimal or 0x-hex.")
    entry, warnings = j1587.lookup_pid(pid)
    if entry is None:
        hint = (f"`canarchy j1587 pids` lists the bundled catalog. Add this PID to {j1587.pid_overrides_path()} "
                f"(a JSON object keyed by decimal PID) or point CANARCHY_J1587_PID_OVERRIDES at such a file.")
        raise UserInputError("PID_NOT_FOUND", f"PID {pid} (page {j1587.pid_page(pid)}) is not in the J1587 catalog.",
                             _with_warnings(hint, warnings))
    return CommandResult(data=entry, warnings=warnings)


def _pids(args: argparse.Namespace) -> CommandResult:
    from canarchy import j1587_metadata as j1587

    entries, warnings = j1587.list_pids()
    return CommandResult(data={"pid_count": len(entries), "pids": entries}, warnings=warnings)


def _mid(args: argparse.Namespace) -> CommandResult:
    from canarchy import j2497_metadata as j2497

    mid = parse_int(args.number, "INVALID_MID", "MID", 0, j2497.MID_MAX,
                    "J1587/J2497 MIDs are 0-255, in decimal or 0x-hex; the catalog holds 128-255.")
    entry, warnings = j2497.lookup_mid(mid)
    if entry is None:
        hint = (f"`canarchy j2497 mids` lists the bundled catalog. Add this MID to {j2497.mid_overrides_path()} "
                f"(a JSON object keyed by decimal MID) or point CANARCHY_J2497_MID_OVERRIDES at such a file.")
        if mid <= j2497.J1708_MID_MAX:
            hint = "MIDs 0-127 are assigned by SAE J1708, not J1587, and are not bundled. " + hint
        raise UserInputError("MID_NOT_FOUND", f"MID {mid} is not in the J1587/J2497 catalog.",
                             _with_warnings(hint, warnings))
    return CommandResult(data=entry, warnings=warnings)


def _mids(args: argparse.Namespace) -> CommandResult:
    from canarchy import j2497_metadata as j2497

    entries, warnings = j2497.list_mids()
    return CommandResult(data={"mid_count": len(entries), "mids": entries}, warnings=warnings)


def _parse_pgn(text: str) -> int:
    """Parse a PGN; a 29-bit arbitration ID typed by mistake gets a hint naming its PGN."""
    from canarchy import j1939_metadata as j1939

    hint = f"Give the PGN in decimal or 0x-hex, 0..{j1939.PGN_MAX} (0x{j1939.PGN_MAX:X}), e.g. 61444 or 0xF004."
    try:
        return parse_int(text, "INVALID_PGN", "PGN", 0, j1939.PGN_MAX, hint)
    except UserInputError as exc:
        try:
            can_id = parse_int(text, "INVALID_PGN", "PGN", 0, j1939.ARBITRATION_ID_MAX, hint)
        except UserInputError:
            raise exc from None
        pgn = j1939.pgn_from_arbitration_id(can_id)
        raise UserInputError(exc.code, exc.message,
                             f"{text} looks like a 29-bit arbitration ID; its PGN is {pgn} (0x{pgn:04X}) "
                             f"from source address {j1939.source_address(can_id)}: "
                             f"try `canarchy j1939 pgn {pgn}`.") from None


def _with_warnings(hint: str, warnings: list[str]) -> str:
    # An error envelope has no room for the lookup's warnings; a broken override
    # file is often why an id is missing, so say so in the hint.
    return hint if not warnings else hint + " Note: " + " ".join(warnings)


# --- text rendering ---------------------------------------------------------------------------


def _show(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _scaling(entry: dict[str, Any], per: str = "bit") -> list[str]:
    lines = []
    unit = entry.get("unit") or ""
    resolution = entry.get("resolution")
    if resolution is not None and entry.get("kind") != "discrete":
        text = f"resolution: {resolution} {unit}/{per}".replace(" /", " per ")
        if entry.get("offset") not in (None, 0):
            text += f", offset {entry['offset']} {unit}".rstrip()
        lines.append(text)
    elif unit:
        lines.append(f"unit: {unit}")
    data_range = entry.get("data_range")
    if isinstance(data_range, dict) and "min" in data_range and "max" in data_range:
        lines.append(f"range: {data_range['min']} to {data_range['max']} {unit}".rstrip())
    return lines


def _states(entry: dict[str, Any]) -> list[str]:
    states = entry.get("states")
    if not isinstance(states, dict):
        return []
    return ["states: " + ", ".join(f"{raw} = {meaning}" for raw, meaning in states.items())]


def _footer(entry: dict[str, Any]) -> list[str]:
    lines = [f"standard: {_show(entry.get('standard'))}    source: {_show(entry.get('source'))}"]
    for key in ("note", "layout_note"):
        if entry.get(key):
            lines.append(f"note: {entry[key]}")
    return lines


def _indent(head: str, lines: list[str]) -> str:
    return "\n".join([head, *(f"  {line}" for line in lines)])


def _render_pgn(result: CommandResult) -> str:
    e = result.data
    length = e.get("length")
    length_text = f"{length} bytes" if isinstance(length, int) else _show(length)
    lines = [
        f"format: {e.get('pdu_format')}    length: {length_text}    "
        f"default priority: {_show(e.get('default_priority'))}",
        f"transmission rate: {_show(e.get('transmission_rate'))}",
        *_footer(e),
        f"SPNs ({e.get('spn_count', 0)}):",
    ]
    for spn in e.get("spns") or []:
        scale = "; ".join(_scaling(spn)) or _show(spn.get("unit"))
        lines.append(f"  {spn['spn']:>6}  {_show(spn.get('start_position')):<6} {_show(spn.get('bit_length')):>3} bit  "
                     f"{_show(spn.get('name'))}  [{scale}]")
    title = " ".join(part for part in (e.get("acronym"), e.get("name")) if part) or "(no catalog name)"
    return _indent(f"PGN {e['pgn']} ({e['pgn_hex']}) {title}", lines)


def _render_spn(result: CommandResult) -> str:
    e = result.data
    pgn = e.get("pgn")
    pgn_text = f"{pgn} (0x{pgn:04X}) {_show(e.get('pgn_acronym'))}" if isinstance(pgn, int) else _show(pgn)
    bits = e.get("bit_length")
    position = f"byte {_show(e.get('start_position'))}, " + (f"{bits} bits" if bits is not None else "variable length")
    if e.get("start_bit") is not None:
        position += f", start bit {e['start_bit']}"
    lines = [f"PGN: {pgn_text}", f"position: {position}", *_scaling(e), *_states(e), *_footer(e)]
    return _indent(f"SPN {e['spn']}: {_show(e.get('name'))}", lines)


def _render_pid(result: CommandResult) -> str:
    e = result.data
    length = e.get("data_length")
    data = (f"{length} character{'s' if length != 1 else ''}" if isinstance(length, int) else _show(length))
    if e.get("length_prefixed"):
        data += ", after a byte count"
    lines = [f"data: {data}, {_show(e.get('data_type'))}", *_scaling(e)]
    metric = e.get("metric")
    if isinstance(metric, dict):
        lines.append(f"metric: {metric.get('resolution')} {metric.get('unit')} per bit")
    lines.extend(_footer(e))
    return _indent(f"PID {e['pid']} (page {e.get('page')}): {_show(e.get('name'))}", lines)


def _render_pids(result: CommandResult) -> str:
    lines = [f"{result.data['pid_count']} J1587 PIDs:"]
    for e in result.data["pids"]:
        scale = "; ".join(_scaling(e)[:1])
        tag = "" if e.get("source") == "bundled" else f"  ({e.get('source')})"
        lines.append(f"  {e['pid']:>3}  {_show(e.get('name'))}{'  [' + scale + ']' if scale else ''}{tag}")
    return "\n".join(lines)


def _render_mid(result: CommandResult) -> str:
    e = result.data
    return _indent(f"MID {e['mid']}: {_show(e.get('name'))}", _footer(e))


def _render_mids(result: CommandResult) -> str:
    lines = [f"{result.data['mid_count']} J1587/J2497 MIDs:"]
    for e in result.data["mids"]:
        tag = "" if e.get("source") == "bundled" else f"  ({e.get('source')})"
        lines.append(f"  {e['mid']:>3}  {_show(e.get('name'))}{tag}")
    return "\n".join(lines)
