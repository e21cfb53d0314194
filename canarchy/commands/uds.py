"""``uds services``, ``uds scan``, ``uds dids``: the ISO 14229 catalog and UDS discovery.

``uds services`` without a channel typed on the command line (and without ``--dry-run``) is the reference
catalog: no transport, nothing sent, whatever the configured default interface
(:func:`canarchy.cli.prepare_args`). With a channel, and always for ``uds scan`` and ``uds dids``, the
command is active: the active-transmit gate, then one bus for the run (:mod:`canarchy.discovery`).
``--dry-run`` plans without a transport. See ``docs/uds-discovery.md``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from canarchy import uds
from canarchy.active import active_gate, add_active_arguments
from canarchy.commands._common import MAX_TIMEOUT_S, parse_arbitration_id, parse_int
from canarchy.errors import UserInputError
from canarchy.output import CommandResult
from canarchy.progress import ActiveRun
from canarchy.frames import can_id_text

DEFAULT_REQUEST_ID = 0x7E0
DEFAULT_TIMEOUT = 0.2
DEFAULT_SCAN_TIMEOUT = 0.1
DEFAULT_SCAN_IDS = "0x700-0x7FF"
DEFAULT_SCAN_TARGETS = "0x00-0xFF"
DEFAULT_LISTEN = 0.2


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    group = subparsers.add_parser("uds", parents=[parent], help="UDS (ISO 14229) diagnostics")
    sub = group.add_subparsers(dest="uds_command", metavar="SUBCOMMAND")
    sub.required = True

    p = sub.add_parser("services", parents=[parent],
                       help="list UDS services (reference), or probe an ECU for them (active, with a channel)")
    p.add_argument("channel", nargs="?", help="CAN channel to probe (makes the command active)")
    _add_target_arguments(p)
    p.add_argument("--probe-start", help="first SID to probe (with --probe-end: a range instead of the catalog)")
    p.add_argument("--probe-end", help="last SID to probe")
    add_active_arguments(p)
    p.set_defaults(command="uds services", handler=_services, takes_channel=True,
                   no_interface_ok=lambda args: True, render_text=_render_services)

    p = sub.add_parser("scan", parents=[parent],
                       help="find the arbitration IDs ECUs answer UDS on (active: one TesterPresent per ID)")
    p.add_argument("channel", nargs="?", help="CAN channel (default: [transport].default_interface)")
    p.add_argument("--addressing", choices=("11bit", "29bit", "both"), default="11bit",
                   help="11-bit request IDs, 29-bit normal fixed addressing 0x18DA<TA><SA> (ISO 15765-4), "
                        "or both (default 11bit)")
    p.add_argument("--ids", default=DEFAULT_SCAN_IDS, metavar="FIRST-LAST",
                   help=f"11-bit request IDs to try (default {DEFAULT_SCAN_IDS})")
    p.add_argument("--targets", default=DEFAULT_SCAN_TARGETS, metavar="FIRST-LAST",
                   help=f"29-bit target addresses to try (default {DEFAULT_SCAN_TARGETS})")
    p.add_argument("--tester-address", default="0xF1", help="29-bit source address of the tester (default 0xF1)")
    p.add_argument("--probe", choices=tuple(_scan_probes()), default="tester-present",
                   help="the request sent: tester-present (3E 00) or session (10 01, defaultSession)")
    p.add_argument("--timeout", type=float, default=DEFAULT_SCAN_TIMEOUT,
                   help=f"seconds to listen after each request (default {DEFAULT_SCAN_TIMEOUT:g})")
    p.add_argument("--listen", type=float, default=DEFAULT_LISTEN,
                   help=f"seconds of listening before the scan; IDs heard then are not sent on "
                        f"(default {DEFAULT_LISTEN:g}; 0: none)")
    add_active_arguments(p)
    p.set_defaults(command="uds scan", handler=_scan, takes_channel=True,
                   no_interface_ok=lambda args: args.dry_run, render_text=_render_scan)

    p = sub.add_parser("dids", parents=[parent],
                       help="read data identifiers with ReadDataByIdentifier (0x22; active)")
    p.add_argument("channel", nargs="?", help="CAN channel (default: [transport].default_interface)")
    _add_target_arguments(p)
    p.add_argument("--dids", default="0x{:04X}-0x{:04X}".format(*uds.IDENTIFICATION_DIDS), metavar="FIRST-LAST",
                   help="DIDs to read: a range or one DID (default 0xF180-0xF19F, ISO 14229-1 Annex C)")
    add_active_arguments(p)
    p.set_defaults(command="uds dids", handler=_dids, takes_channel=True,
                   no_interface_ok=lambda args: args.dry_run, render_text=_render_dids)


def _add_target_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--request-id", default=f"0x{DEFAULT_REQUEST_ID:X}",
                   help="arbitration ID of requests (default 0x7E0)")
    p.add_argument("--response-id", default=None,
                   help="arbitration ID of replies (default: the usual pair: request + 8, or 0x18DA<SA><TA>)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds to wait for each reply (default {DEFAULT_TIMEOUT:g}; after 0x78 up to 5)")


def _scan_probes() -> dict[str, bytes]:
    from canarchy.discovery import SCAN_PROBES

    return SCAN_PROBES


# --- arguments --------------------------------------------------------------------------------


def _timeout(value: float, option: str = "--timeout", allow_zero: bool = False) -> float:
    if not (value >= 0 if allow_zero else value > 0) or value > MAX_TIMEOUT_S:
        raise UserInputError("INVALID_TIMEOUT", f"{option} {value} must be {'>= 0' if allow_zero else '> 0'} "
                             f"and at most {MAX_TIMEOUT_S:g} seconds.", f"Give {option} in seconds, e.g. {option} 0.2.")
    return value


def _hex(text: str, what: str, lo: int, hi: int, code: str, hint: str) -> int:
    """A hex number (``7E0`` or ``0x7E0``, as can-utils write IDs) within ``lo..hi``."""
    raw = str(text).strip()
    digits = raw[2:] if raw.lower().startswith("0x") else raw
    try:
        value = int(digits, 16) if digits and digits.isascii() and digits.isalnum() else None
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise UserInputError(code, f"{what} {text!r} is not a hex number in 0x{lo:X}..0x{hi:X}.", hint)
    return value


def _range(text: str, what: str, lo: int, hi: int, code: str) -> tuple[int, int]:
    """``FIRST-LAST`` or one value, in hex (``0x`` optional), within ``lo..hi``."""
    hint = f"Give {what}s in hex as FIRST-LAST, e.g. {lo:X}-{hi:X}, or a single value."
    first, sep, last = str(text).partition("-")
    start = _hex(first, what, lo, hi, code, hint)
    end = _hex(last, what, lo, hi, code, hint) if sep else start
    if start > end:
        raise UserInputError(code, f"{what} range {text!r} is empty.", hint)
    return start, end


def _target(args: argparse.Namespace) -> tuple[int, int]:
    request_id = parse_arbitration_id(args.request_id)[0]  # hex, as every ID on the command line
    if args.response_id is None:
        from canarchy.isotp import default_response_id

        response_id = default_response_id(request_id)
        if response_id is None:
            raise UserInputError("INVALID_ARGUMENTS", f"There is no usual response ID for request ID "
                                 f"0x{request_id:X}.", "Pass --response-id with the ID the ECU answers on.")
    else:
        response_id = parse_arbitration_id(args.response_id)[0]
    if response_id == request_id:
        raise UserInputError("INVALID_ARGUMENTS", f"Request and response ID are both 0x{request_id:X}.",
                             "The ECU answers on another ID than it listens on, e.g. 0x7E0 and 0x7E8.")
    _timeout(args.timeout)
    return request_id, response_id


def _probe_sids(args: argparse.Namespace) -> list[int]:
    if args.probe_start is None and args.probe_end is None:
        return [service.sid for service in uds.SERVICES]
    hint = "Give both --probe-start and --probe-end as SIDs 0x00-0xFF, start <= end."
    if args.probe_start is None or args.probe_end is None:
        raise UserInputError("INVALID_PROBE_RANGE", "Only one end of the probe range was given.", hint)
    start = parse_int(args.probe_start, "INVALID_PROBE_RANGE", "SID", 0, 0xFF, hint)
    end = parse_int(args.probe_end, "INVALID_PROBE_RANGE", "SID", 0, 0xFF, hint)
    if start > end:
        raise UserInputError("INVALID_PROBE_RANGE", f"Probe range 0x{start:02X}..0x{end:02X} is empty.", hint)
    return list(range(start, end + 1))


# --- running an active command ----------------------------------------------------------------


def _session(args: argparse.Namespace, action: str) -> tuple[str, Any]:
    """The gate (before anything is opened), then the backend; returns ``(warning, backend)``."""
    from canarchy.transport import build_backend

    warning = active_gate(args.command, args.interface, action, args.ack_active)
    return warning, build_backend()


def _stalled(result: dict[str, Any]) -> bool:
    """Whether the ECU answered ``7F SID 78`` (requestCorrectlyReceived-ResponsePending) and then nothing: it is
    there, and did not finish in time (ISO 14229-2: P2*server expired), not silent."""
    return result["response"] == "none" and bool(result.get("pending_count"))


def _stalled_warning(what: str, request_id: int, count: int) -> str:
    from canarchy import discovery

    return (f"UDS_RESPONSE_PENDING_EXPIRED: {count} {what} on {can_id_text(request_id)} got responsePending (0x78) "
            f"and then no final response within {discovery.PENDING_TIMEOUT:g} s (P2*server, ISO 14229-2): the "
            "ECU is there and did not finish in time")


def _silent_warning(what: str, request_id: int, response_id: int, count: int, timeout: float) -> str:
    return (f"UDS_NO_RESPONSE: nothing answered on {can_id_text(response_id)} to {count} {what} sent on "
            f"{can_id_text(request_id)} (timeout {timeout:g} s): no ECU listens on this request ID, "
            f"or it answers elsewhere; this says nothing about the services it supports")


def _isotp_warnings(payload: dict[str, Any]) -> list[str]:
    return [f"UDS_ISOTP_ERROR: {text}" for text in payload.pop("warnings", [])]


# --- uds services -----------------------------------------------------------------------------


def _services(args: argparse.Namespace) -> CommandResult:
    if args.interface is None and not args.dry_run:
        return _reference()
    request_id, response_id = _target(args)
    sids = _probe_sids(args)
    if args.dry_run:
        return _dry_run_services(args, sids, request_id, response_id)
    return _active_services(args, sids, request_id, response_id)


def _reference() -> CommandResult:
    services = [service.to_dict() for service in uds.SERVICES]
    return CommandResult(data={"mode": "reference", "service_count": len(services), "services": services})


def _dry_run_services(args: argparse.Namespace, sids: list[int], request_id: int, response_id: int) -> CommandResult:
    planned = [
        {"service": f"0x{sid:02X}", "name": uds.service_name(sid), "arbitration_id": request_id,
         "data": uds.single_frame_request(sid).hex()}
        for sid in sids
    ]
    return CommandResult(data={
        "mode": "dry_run",
        "interface": args.interface,
        "request_id": request_id,
        "response_id": response_id,
        "planned_requests": len(planned),
        "first_request": planned[0] if planned else None,
        "requests": planned,
    })


def _active_services(args: argparse.Namespace, sids: list[int], request_id: int, response_id: int) -> CommandResult:
    from canarchy.discovery import probe_services

    warning, backend = _session(args, f"send {len(sids)} UDS requests on {can_id_text(request_id)}")
    run = ActiveRun(args, f"uds.services:{args.interface}")
    warnings = [warning]
    supported: list[str] = []
    stalled: list[str] = []
    done = 0

    def on_result(probe: dict[str, Any], exchange: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        warnings.extend(_isotp_warnings(exchange))
        if _stalled(probe):
            stalled.append(probe["service"])
        if probe["supported"]:
            supported.append(probe["service"])
        frames = exchange["frames"]
        run.emit("uds_transaction", {
            "request": next(f for f in frames if f["direction"] == "tx"),
            "responses": [f for f in frames if f["direction"] == "rx"],
            **exchange, **probe})
        run.progress.update(f"uds services {args.interface}: {done}/{len(sids)} probed, "
                            f"{len(supported)} supported, last {probe['service']} {probe['response']}")

    with backend.session(args.interface) as link:
        probes = probe_services(link, request_id, response_id, sids, args.timeout, on_result)
    answered = sum(1 for probe in probes if probe["response"] != "none") + len(stalled)
    if stalled:
        warnings.append(_stalled_warning("UDS requests", request_id, len(stalled)))
    if probes and not answered:
        warnings.append(_silent_warning("UDS requests", request_id, response_id, len(probes), args.timeout))
    return run.result({
        "mode": "active",
        "interface": args.interface,
        "interface_source": args.interface_source,
        "request_id": request_id,
        "response_id": response_id,
        "probe_count": len(probes),
        "answered_count": answered,
        "silent": bool(probes) and not answered,
        "supported_count": len(supported),
        "supported_services": supported,
        "probes": probes,
    }, warnings)


# --- uds dids ---------------------------------------------------------------------------------


def _dids(args: argparse.Namespace) -> CommandResult:
    from canarchy.discovery import read_dids
    from canarchy.isotp import single_frame

    request_id, response_id = _target(args)
    first, last = _range(args.dids, "DID", 0, 0xFFFF, "INVALID_DID_RANGE")
    dids = list(range(first, last + 1))
    common = {"interface": args.interface, "request_id": request_id, "response_id": response_id,
              "did_count": len(dids)}
    if args.dry_run:
        return CommandResult(data=dict(common, mode="dry_run", requests=[
            {"did": f"0x{did:04X}", "name": uds.did_name(did), "arbitration_id": request_id,
             "data": single_frame(uds.read_did_request(did)).hex()} for did in dids]))
    warning, backend = _session(args, f"send {len(dids)} ReadDataByIdentifier requests on {can_id_text(request_id)}")
    run = ActiveRun(args, f"uds.dids:{args.interface}")
    warnings = [warning]
    found: list[dict[str, Any]] = []
    stalled: list[str] = []
    done = 0

    def on_result(result: dict[str, Any], exchange: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        warnings.extend(_isotp_warnings(exchange))
        if _stalled(result):
            stalled.append(result["did"])
        if result["found"]:
            found.append(result)
        run.emit("uds_did", {**exchange, **result})
        run.progress.update(f"uds dids {args.interface}: {done}/{len(dids)} read, {len(found)} found, "
                            f"last {result['did']}")

    with backend.session(args.interface) as link:
        results = read_dids(link, request_id, response_id, dids, args.timeout, on_result)
    answered = sum(1 for result in results if result["response"] != "none") + len(stalled)
    if stalled:
        warnings.append(_stalled_warning("ReadDataByIdentifier requests", request_id, len(stalled)))
    if results and not answered:
        warnings.append(_silent_warning("ReadDataByIdentifier requests", request_id, response_id, len(results),
                                        args.timeout))
    refused: dict[str, int] = {}
    for result in results:
        if result["nrc"]:
            refused[result["nrc"]] = refused.get(result["nrc"], 0) + 1
    return run.result(dict(common, mode="active", interface_source=args.interface_source, answered_count=answered,
                           silent=bool(results) and not answered, found_count=len(found), dids=found,
                           refused_by_nrc=dict(sorted(refused.items()))), warnings)


# --- uds scan ---------------------------------------------------------------------------------


def _scan_candidates(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    from canarchy.discovery import candidates_11bit, candidates_29bit

    candidates: list[Any] = []
    plan: dict[str, Any] = {"addressing": args.addressing}
    if args.addressing in ("11bit", "both"):
        first, last = _range(args.ids, "11-bit request ID", 0, 0x7FF, "INVALID_SCAN_RANGE")
        candidates += candidates_11bit(first, last)
        plan["ids"] = [first, last]
    if args.addressing in ("29bit", "both"):
        first, last = _range(args.targets, "target address", 0, 0xFF, "INVALID_SCAN_RANGE")
        tester = _hex(args.tester_address, "Tester address", 0, 0xFF, "INVALID_SCAN_RANGE",
                      "Give the tester's 29-bit source address as a hex byte, e.g. F1.")
        candidates += candidates_29bit(first, last, tester)
        plan.update(targets=[first, last], tester_address=tester)
    return candidates, plan


def _scan(args: argparse.Namespace) -> CommandResult:
    from canarchy.discovery import SCAN_PROBES, scan_ecus
    from canarchy.isotp import single_frame

    _timeout(args.timeout)
    _timeout(args.listen, "--listen", allow_zero=True)
    candidates, plan = _scan_candidates(args)
    probe = SCAN_PROBES[args.probe]
    common = dict(plan, interface=args.interface, probe=args.probe, probe_data=probe.hex(),
                  candidate_count=len(candidates), timeout=args.timeout)
    if args.dry_run:
        shown = candidates[:10]
        return CommandResult(data=dict(common, mode="dry_run", first_requests=[
            {"arbitration_id": c.request_id, "is_extended_id": c.request_id > 0x7FF,
             "data": single_frame(probe).hex()} for c in shown]))
    warning, backend = _session(args, f"send a UDS {args.probe} request on each of {len(candidates)} "
                                      "arbitration IDs")
    run = ActiveRun(args, f"uds.scan:{args.interface}")
    warnings = [warning]
    found_count = 0
    done = 0
    ecus: list[dict[str, Any]] = []  # as each is confirmed: a scan Ctrl+C stops reports those found before it

    def on_result(record: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        run.emit("uds_scan_probe", record)
        run.progress.update(f"uds scan {args.interface}: {done}/{len(todo)} IDs, "
                            f"{found_count} ECU(s), at {can_id_text(record['request_id'])}")

    def on_ecu(ecu: dict[str, Any]) -> None:
        nonlocal found_count
        found_count += 1
        ecus.append(ecu)
        run.emit("uds_ecu", ecu)

    busy: set[int] = set()
    todo: list[Any] = []
    with backend.session(args.interface) as link, run.stream.stoppable():  # Ctrl+C: what was found stands
        busy = _listen_passively(link, args.listen)
        todo = [c for c in candidates if c.request_id not in busy]
        scan_ecus(link, todo, probe, args.timeout, on_result, on_ecu)
    if not ecus and not run.stream.stopped_by:
        warnings.append(f"UDS_SCAN_NO_ECU: no ECU answered a {args.probe} request on any of {len(todo)} "
                        f"arbitration IDs (timeout {args.timeout:g} s); check the channel, the bit rate and "
                        f"the addressing (--addressing 29bit)")
    return run.result(dict(common, mode="active", interface_source=args.interface_source, ecu_count=len(ecus),
                           ecus=ecus, busy_ids=sorted(busy), skipped_busy_count=len(candidates) - len(todo),
                           probed_count=done), warnings)


def _listen_passively(link: Any, seconds: float) -> set[int]:
    """Arbitration IDs heard in ``seconds`` of listening (another node's: not sent on)."""
    heard: set[int] = set()
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        frame = link.recv(remaining)
        if frame is None:
            break
        heard.add(frame.arbitration_id)
    return heard


# --- text -------------------------------------------------------------------------------------


def _render_services(result: CommandResult) -> str:
    data = result.data
    if data["mode"] == "reference":
        lines = [f"UDS services (ISO 14229-1): {data['service_count']}"]
        lines += [f"  {s['service']}  {s['name']:<32} {s['category']:<13} +resp {s['positive_response_service']}"
                  for s in data["services"]]
        return "\n".join(lines)
    if data["mode"] == "dry_run":
        lines = [f"dry run: {data['planned_requests']} requests on {can_id_text(data['request_id'])} (nothing sent)"]
        lines += [f"  {r['service']}  {r['name']:<32} {r['data']}" for r in data["requests"]]
        return "\n".join(lines)
    lines = [f"active probe of {data['interface']} ({can_id_text(data['request_id'])} -> "
             f"{can_id_text(data['response_id'])}): {data['supported_count']}/{data['probe_count']} services "
             f"supported, {data['answered_count']} answered"]
    for probe in data["probes"]:
        detail = probe["response"] if probe["nrc"] is None else f"NRC {probe['nrc']} {probe['nrc_name']}"
        if probe["frame_count"] > 1:
            detail += f" ({probe['frame_count']} frames)"
        mark = "yes" if probe["supported"] else "no "
        lines.append(f"  {probe['service']}  {probe['name']:<32} {mark}  {detail}")
    return "\n".join(lines)


def _render_dids(result: CommandResult) -> str:
    data = result.data
    if data["mode"] == "dry_run":
        lines = [f"dry run: {data['did_count']} ReadDataByIdentifier requests on {can_id_text(data['request_id'])} "
                 "(nothing sent)"]
        lines += [f"  {r['did']}  {r['name']}" for r in data["requests"][:40]]
        return "\n".join(lines)
    lines = [f"DIDs of {data['interface']} ({can_id_text(data['request_id'])} -> {can_id_text(data['response_id'])})"
             f": {data['found_count']} of {data['did_count']} read"]
    for did in data["dids"]:
        value = did.get("vin") or did.get("session") or did.get("text") or did["data"].upper()
        lines.append(f"  {did['did']}  {did['name']:<40} {value}")
    return "\n".join(lines)


def _render_scan(result: CommandResult) -> str:
    data = result.data
    if data["mode"] == "dry_run":
        lines = [f"dry run: would send {data['probe']} ({data['probe_data'].upper()}) on {data['candidate_count']} "
                 "arbitration IDs (nothing sent)"]
        lines += [f"  {can_id_text(r['arbitration_id'])}  {r['data'].upper()}" for r in data["first_requests"]]
        return "\n".join(lines)
    lines = [f"scan of {data['interface']}: {data['ecu_count']} ECU(s) answered {data['probe']} on "
             f"{data['probed_count']} IDs"]
    for ecu in data["ecus"]:
        nrc = f" NRC {ecu['nrc']}" if ecu["nrc"] else ""
        lines.append(f"  {can_id_text(ecu['request_id'])} -> {can_id_text(ecu['response_id'])}  "
                     f"{ecu['response']}{nrc}  {ecu['message'].upper()}  {ecu['latency_s'] * 1000:.1f} ms")
    return "\n".join(lines)

