"""Offline decoding of capture files: ``decode``, ``isotp decode`` and (registered by the
``j1939`` group in :mod:`canarchy.commands.reference`) ``j1939 decode``.

Nothing here touches a bus. cantools is imported only by ``decode`` (inside
:func:`canarchy.decode.dbc.load_dbc`); python-can only for capture formats other
than candump. Output shapes and error codes: ``docs/decoding.md``.

Events are emitted through :func:`canarchy.output.open_stream` as they are
decoded (``--summary``: counted, not printed); summaries are running
aggregates, so memory does not grow with the capture in any output format.
"""

from __future__ import annotations

import argparse
from typing import Any

from canarchy.commands._common import parse_int
from canarchy.output import CommandResult, EventStream, number_text, open_stream


def add_parser(subparsers: Any, parent: argparse.ArgumentParser) -> None:
    """Register ``decode`` and the ``isotp`` group (``isotp decode``)."""
    p = subparsers.add_parser("decode", parents=[parent],
                              help="decode the frames of a capture file with a DBC (cantools)")
    _add_file_argument(p)
    p.add_argument("--dbc", required=True, metavar="DB", help="signal database (.dbc, .kcd, .sym, .arxml)")
    p.add_argument("--j1939", action="store_true",
                   help="match every 29-bit message by PGN (automatic for messages the DBC marks as J1939PG)")
    p.add_argument("--isotp-layout", choices=("length-prefixed", "plain"), default="length-prefixed",
                   help="layout of DBC messages longer than 8 bytes over a reassembled ISO-TP payload "
                        "(default: length-prefixed, the ISO-TP length byte before the data, as CSS Electronics' "
                        "TP DBCs expect)")
    _add_summary_argument(p)
    p.set_defaults(command="decode", handler=_decode, render_text=_render_decode, render_event=_decode_line)

    group = subparsers.add_parser("isotp", parents=[parent], help="ISO-TP (ISO 15765-2) reassembly of diagnostics")
    sub = group.add_subparsers(dest="isotp_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("decode", parents=[parent],
                       help="reassemble UDS / OBD-II / KWP2000 exchanges of a capture file into PDUs")
    _add_file_argument(p)
    p.add_argument("--request-id", default="0x7E0", help="arbitration ID of the requests (default 0x7E0)")
    p.add_argument("--response-id", default="0x7E8", help="arbitration ID of the responses (default 0x7E8)")
    _add_summary_argument(p)
    p.set_defaults(command="isotp decode", handler=_isotp_decode, render_text=_render_isotp, render_event=_isotp_line)


def add_j1939_decode_parser(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add ``decode`` to the ``j1939`` group's subparsers (called by :mod:`canarchy.commands.reference`)."""
    p = sub.add_parser("decode", parents=[parent],
                       help="decode the J1939 frames of a capture file: PGN, SA, SPN values, TP, DM1")
    _add_file_argument(p)
    p.add_argument("--pgn", help="print events of this PGN only (decimal or 0x-hex; summaries cover every frame)")
    _add_summary_argument(p)
    p.set_defaults(command="j1939 decode", handler=_j1939_decode, render_text=_render_j1939, render_event=_j1939_line)


def _add_file_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--file", required=True, metavar="CAPTURE",
                   help="capture file: candump -l .log/.candump, or .asc .blf .trc .csv .mf4 .db (optionally .gz); "
                        "'-' or a pipe: candump -l text as it comes")


def _add_summary_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--summary", action="store_true", help="counts and value ranges only, no per-frame events")


def _stream(args: argparse.Namespace, capture: Any) -> EventStream:
    """The command's event stream; each event flushed as it comes when ``capture`` is a stream (a pipe)."""
    return open_stream(args, f"file:{args.file}", live=capture.stream, keep=not args.summary,
                       finite=not capture.stream)


def _result(data: dict[str, Any], stream: EventStream, *logs: Any) -> CommandResult:
    """The command's result: ``data`` with ``event_count`` and the warnings of ``logs``
    (:class:`~canarchy.warning_log.WarningLog`, merged in order) as records, counts and strings."""
    from canarchy.warning_log import WarningLog

    merged = WarningLog()
    for log in logs:
        merged.merge(log)
    return CommandResult(data=dict(data, event_count=stream.count, **merged.to_data()), warnings=merged.render())


def _open(path: str):
    """The capture to decode: a file, or ``-`` / a pipe read once as it comes (:func:`open_capture`)."""
    from canarchy.capture_file import open_capture

    return open_capture(path, stream=True)


# --- handlers ---------------------------------------------------------------------------------


def _decode(args: argparse.Namespace) -> CommandResult:
    from canarchy.decode.dbc import DbcDecoder, load_dbc

    capture = _open(args.file)
    database, dbc_warnings = load_dbc(args.dbc)
    decoder = DbcDecoder(database, j1939=args.j1939, isotp_layout=args.isotp_layout)
    stream = _stream(args, capture)
    with stream.stoppable():
        for frame in capture:
            for payload in decoder.feed(frame):
                stream.emit("decoded_message", payload, payload["timestamp"])
    decoder.finish()
    data = {"file": args.file, "dbc": args.dbc, "format": capture.format, "j1939": args.j1939,
            "j1939_message_count": decoder.j1939_message_count, "isotp_layout": args.isotp_layout,
            **decoder.summary()}
    return _result(data, stream, dbc_warnings, capture.log, decoder.warnings)


def _isotp_decode(args: argparse.Namespace) -> CommandResult:
    from canarchy.commands._common import parse_arbitration_id
    from canarchy.decode.common import MAX_UNKNOWN_IDS, isotp_counts
    from canarchy.decode.diagnostics import DiagnosticSummary, describe_diagnostic_pdu
    from canarchy.warning_log import WarningLog
    from canarchy.isotp import IsoTpReassembler

    request_id, request_ext = parse_arbitration_id(args.request_id)
    response_id, response_ext = parse_arbitration_id(args.response_id)
    if (request_id, request_ext) == (response_id, response_ext):
        from canarchy.errors import UserInputError

        raise UserInputError("INVALID_ARGUMENTS", f"--request-id and --response-id are both 0x{request_id:X}.",
                             "Give the tester's ID as --request-id and the ECU's as --response-id (e.g. 0x7E0, 0x7E8).")
    capture = _open(args.file)
    machines = {(request_id, request_ext): (IsoTpReassembler(request_id), "request"),
                (response_id, response_ext): (IsoTpReassembler(response_id), "response")}
    warnings = WarningLog()
    summary = DiagnosticSummary()
    stream = _stream(args, capture)
    others: dict[tuple[int, bool], int] = {}  # frames on other IDs, by ID (the first MAX_UNKNOWN_IDS)
    other_frames = 0
    with stream.stoppable():
        for frame in capture:
            slot = machines.get((frame.arbitration_id, frame.is_extended_id))
            if slot is None:
                key = (frame.arbitration_id, frame.is_extended_id)
                other_frames += 1
                if key in others or len(others) < MAX_UNKNOWN_IDS:
                    others[key] = others.get(key, 0) + 1
                continue
            machine, direction = slot
            pdu = machine.feed(frame)
            if machine.warnings:
                warnings.extend(machine.warnings)
                machine.warnings.clear()
            if pdu is None:
                continue
            described = describe_diagnostic_pdu(pdu, direction)
            summary.add(described)
            stream.emit("isotp_pdu", described, pdu.timestamp)
    flow_control = 0
    for machine, _direction in machines.values():
        machine.finish()
        warnings.extend(machine.warnings)
        flow_control += machine.flow_control_count
    if other_frames == capture.frame_count > 0:
        busiest = sorted(others.items(), key=lambda item: -item[1])[:4]
        on = ", ".join(f"{_id(i, e)} ({n})" for (i, e), n in busiest)
        warnings.add("ISOTP_IDS_UNSEEN", f"no frame on {_id(request_id, request_ext)} or "
                     f"{_id(response_id, response_ext)}; the capture's frames are on {on}: give the tester's and the "
                     "ECU's IDs as --request-id and --response-id",
                     request_id=request_id, response_id=response_id, busiest_ids=[i for (i, _e), _n in busiest])
    data = {"file": args.file, "format": capture.format, "request_id": request_id, "response_id": response_id,
            "frame_count": capture.frame_count, "other_frame_count": other_frames, "flow_control_count": flow_control,
            "isotp_counts": isotp_counts(machine for machine, _direction in machines.values()), **summary.to_dict()}
    return _result(data, stream, capture.log, warnings)


def _j1939_decode(args: argparse.Namespace) -> CommandResult:
    from canarchy.decode.j1939 import J1939Catalog, J1939Decoder

    only_pgn = None
    if args.pgn is not None:
        only_pgn = parse_int(args.pgn, "INVALID_PGN", "PGN", 0, 0x3FFFF,
                             "Give the PGN in decimal or 0x-hex, 0..0x3FFFF, e.g. 61444 or 0xF004.")
    capture = _open(args.file)
    catalog = J1939Catalog()
    decoder = J1939Decoder(catalog)
    stream = _stream(args, capture)
    with stream.stoppable():
        for frame in capture:
            for event_type, payload in decoder.feed(frame):
                if only_pgn is not None and _event_pgn(event_type, payload) != only_pgn:
                    continue
                stream.emit(event_type, payload, payload["timestamp"])
    decoder.finish()
    data = {"file": args.file, "format": capture.format, "pgn_filter": only_pgn, **decoder.summary()}
    return _result(data, stream, catalog.warnings, capture.log, decoder.warnings)


def _event_pgn(event_type: str, payload: dict[str, Any]) -> int | None:
    if event_type in ("j1939_dm1", "j1939_dm2"):
        return 0xFECA if event_type == "j1939_dm1" else 0xFECB
    return payload.get("pgn")


# --- text rendering ---------------------------------------------------------------------------


_number = number_text


def _id(can_id: int, extended: bool | None = None) -> str:
    """An arbitration ID in text as candump writes it (3 hex digits for 11 bits, 8 for 29 bits), after ``0x``;
    ``extended`` None: 29-bit above 0x7FF (the rule of ``isotp decode``'s IDs)."""
    from canarchy.frames import can_id_text

    return "0x" + can_id_text(can_id, extended)


def _decode_line(event: dict[str, Any]) -> str:
    p = event["payload"]
    values = "  ".join(f"{name}={_number(s['value'])}"  # a named value (VAL_) has no unit, as in cantools' CLI
                       f"{(' ' + s['unit']) if s['unit'] and not isinstance(s['value'], str) else ''}"
                       for name, s in p["signals"].items())
    return f"{p['timestamp']:.6f}  {_id(p['arbitration_id'], p.get('is_extended_id'))}  {p['message']}  {values}"


def _render_decode(result: CommandResult) -> str:
    d = result.data
    lines = []
    lines.append(f"{d['file']} with {d['dbc']}: {d['frame_count']} frames, {d['decoded_count']} decoded, "
                 f"{d['unknown_frame_count']} unknown ({len(d['unknown_ids'])} IDs), "
                 f"{d['decode_error_count']} not decodable"
                 + (f", {d['isotp_frame_count']} in ISO-TP transfers ({d['isotp_pdu_count']} reassembled)"
                    if d["isotp_frame_count"] else "")
                 + (f", {d['remote_frame_count']} remote" if d["remote_frame_count"] else ""))
    for name, m in d["messages"].items():
        lines.append(f"  {name} ({_id(m['arbitration_id'], m.get('is_extended_id'))}) x{m['count']}")
        for sig, s in m["signals"].items():
            span = (f"{_number(s['min'])}..{_number(s['max'])}" if s["min"] is not None else _number(s["last"]))
            if isinstance(s["first"], str) or isinstance(s["last"], str):  # named values: as decoded
                span += f" (first {_number(s['first'])}, last {_number(s['last'])})"
            lines.append(f"    {sig}: {span} {s['unit']}".rstrip())
    return "\n".join(lines)


def _isotp_line(event: dict[str, Any]) -> str:
    p = event["payload"]
    arrow = "->" if p["direction"] == "request" else "<-"
    head = f"{p['timestamp']:.6f}  {_id(p['arbitration_id'])} {arrow} {p['service'] or '-'} {p['service_name']}"
    if p.get("positive") is False:
        head += f" NEGATIVE {p['nrc']} {p['nrc_name']}"
    obd = p.get("obd")
    if isinstance(obd, dict) and obd.get("vin"):
        head += f"  VIN {obd['vin']}"
    elif isinstance(obd, dict) and "dtcs" in obd:
        head += "  DTCs " + (" ".join(obd["dtcs"]) or "none")
    elif isinstance(obd, list):
        head += "  " + "  ".join(f"{v['name']}={_number(v['value'])} {v['unit']}" for v in obd if v["name"])
    return f"{head}  [{p['length']} B: {p['data']}]"


def _render_isotp(result: CommandResult) -> str:
    d = result.data
    lines = []
    lines.append(f"{d['file']}: {d['pdu_count']} PDUs ({d['request_count']} requests on {_id(d['request_id'])}, "
                 f"{d['response_count']} responses on {_id(d['response_id'])}, "
                 f"{d['negative_response_count']} negative, {d['response_pending_count']} pending), "
                 f"{d['multi_frame_count']} multi-frame")
    for sid, s in d["services"].items():
        lines.append(f"  {sid} {s['service_name']} ({s['protocol']}): {s['requests']} requests, "
                     f"{s['responses']} responses")
    if d.get("vin"):
        lines.append(f"  VIN: {d['vin']}")
    for pid, s in d["obd_pids"].items():
        lines.append(f"  PID {pid} {s['name']}: {_number(s['min'])}..{_number(s['max'])} {s['unit']}")
    return "\n".join(lines)


def _j1939_line(event: dict[str, Any]) -> str:
    p = event["payload"]
    kind = event["event_type"]
    if kind == "j1939_frame":
        values = "  ".join(f"{s['spn']}={_number(s['value']) if s['status'] == 'ok' else s['status']}"
                           f"{(' ' + s['unit']) if s['unit'] and s['status'] == 'ok' else ''}" for s in p["spns"])
        return (f"{p['timestamp']:.6f}  0x{p['arbitration_id']:08X}  PGN {p['pgn']} {p['acronym'] or ''}  "
                f"SA {p['source_address']}  P{p['priority']}  {values}").rstrip()
    if kind == "j1939_transport":
        return (f"{p['timestamp']:.6f}  TP {p['mode']} PGN {p['pgn']} {p['acronym'] or ''} from SA "
                f"{p['source_address']}: {p['size']} bytes {p['data']}")
    lamps = " ".join(f"{name}={lamp['state']}" for name, lamp in p["lamps"].items())
    dtcs = "; ".join(f"SPN {t['spn']} FMI {t['fmi']} OC {_number(t['occurrence_count'])}" for t in p["dtcs"])
    return f"{p['timestamp']:.6f}  {kind[6:].upper()} SA {p['source_address']}: {lamps}  DTCs: {dtcs or 'none'}"


def _render_j1939(result: CommandResult) -> str:
    d = result.data
    lines = []
    lines.append(f"{d['file']}: {d['frame_count']} frames ({d['j1939_frame_count']} J1939), "
                 f"{len(d['pgns'])} PGNs, {d['transport']['complete']} TP transfers, {d['dm1_count']} DM1")
    for dm in d["dm"]:
        for t in dm["dtcs"]:
            lines.append(f"  {dm['type']} SA {dm['source_address']}: "
                         f"SPN {t['spn']} ({t['spn_name'] or 'not in catalog'}) "
                         f"FMI {t['fmi']} {t['fmi_description']}, occurrences {_number(t['occurrence_count'])}")
    return "\n".join(lines)
