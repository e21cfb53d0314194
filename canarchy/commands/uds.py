"""``uds services``: the ISO 14229 service catalog, or active service discovery.

Modes (``docs/design/cli.md``):

- reference: no channel typed on the command line and no ``--dry-run``. The
  static catalog; no transport is built, nothing is sent, nothing on stderr.
  A configured default interface never changes this (the #530 guard, in
  :func:`canarchy.cli.prepare_args`).
- active: a channel typed on the command line. The active-transmit gate, then
  one single-frame request per probed SID on ``--request-id``; replies on
  ``--response-id`` within ``--timeout`` seconds. A SID is supported on a
  positive reply or a negative reply other than NRC 0x11; NRC 0x78 (response
  pending) waits for the settled answer (ISO 14229-1).
- dry-run: the planned requests; needs no channel and transmits nothing.
"""

from __future__ import annotations

import argparse

from canarchy import uds
from canarchy.active import active_gate, add_active_arguments
from canarchy.output import CommandResult, open_stream
from canarchy.commands._common import parse_int
from canarchy.errors import UserInputError

DEFAULT_REQUEST_ID = 0x7E0
DEFAULT_RESPONSE_ID = 0x7E8
DEFAULT_TIMEOUT = 0.2


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    group = subparsers.add_parser("uds", parents=[parent], help="UDS (ISO 14229) diagnostics")
    sub = group.add_subparsers(dest="uds_command", metavar="SUBCOMMAND")
    sub.required = True
    p = sub.add_parser("services", parents=[parent],
                       help="list UDS services (reference), or probe an ECU for them (active, with a channel)")
    p.add_argument("channel", nargs="?", help="CAN channel to probe (makes the command active)")
    p.add_argument("--request-id", default="0x7E0", help="arbitration ID of requests (default 0x7E0)")
    p.add_argument("--response-id", default="0x7E8", help="arbitration ID of replies (default 0x7E8)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait per reply (default 0.2)")
    p.add_argument("--probe-start", help="first SID to probe (with --probe-end: a range instead of the catalog)")
    p.add_argument("--probe-end", help="last SID to probe")
    add_active_arguments(p)
    p.set_defaults(command="uds services", handler=_services, takes_channel=True,
                   no_interface_ok=lambda args: True, render_text=_render_text)


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


def _ids(args: argparse.Namespace) -> tuple[int, int]:
    hint = "Use an 11-bit ID (0x000-0x7FF) or a 29-bit ID up to 0x1FFFFFFF."
    request_id = parse_int(args.request_id, "INVALID_FRAME", "Request ID", 0, 0x1FFFFFFF, hint)
    response_id = parse_int(args.response_id, "INVALID_FRAME", "Response ID", 0, 0x1FFFFFFF, hint)
    if not args.timeout > 0:
        raise UserInputError("INVALID_TIMEOUT", f"--timeout {args.timeout} must be > 0 seconds.",
                             "Give the reply timeout in seconds, e.g. --timeout 0.2.")
    return request_id, response_id


def _services(args: argparse.Namespace) -> CommandResult:
    if args.interface is None and not args.dry_run:
        return _reference()
    request_id, response_id = _ids(args)
    sids = _probe_sids(args)
    if args.dry_run:
        return _dry_run(args, sids, request_id, response_id)
    return _active(args, sids, request_id, response_id)


def _reference() -> CommandResult:
    services = [service.to_dict() for service in uds.SERVICES]
    return CommandResult(data={"mode": "reference", "service_count": len(services), "services": services})


def _dry_run(args: argparse.Namespace, sids: list[int], request_id: int, response_id: int) -> CommandResult:
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


def _active(args: argparse.Namespace, sids: list[int], request_id: int, response_id: int) -> CommandResult:
    from canarchy.transport import CanFrame, build_backend

    warning = active_gate("uds services", args.interface, f"send {len(sids)} UDS requests on 0x{request_id:X}",
                          args.ack_active)
    backend = build_backend()
    extended = request_id > 0x7FF

    def accept(frame: CanFrame) -> bool:
        return frame.arbitration_id == response_id and uds.parse_single_frame_reply(frame.data) is not None

    probes, supported = [], []
    stream = open_stream(args, f"uds.services:{args.interface}", live=True)
    for sid in sids:
        request = CanFrame(request_id, uds.single_frame_request(sid), is_extended_id=extended)

        def answers(frame: CanFrame, sid: int = sid) -> bool:
            reply = uds.parse_single_frame_reply(frame.data)
            return accept(frame) and reply is not None and reply.sid == sid

        def pending(frame: CanFrame) -> bool:
            reply = uds.parse_single_frame_reply(frame.data)
            return reply is not None and reply.nrc == uds.NRC_RESPONSE_PENDING

        replies = backend.transaction(args.interface, request, answers, args.timeout, settle=pending)
        probe = _classify(sid, replies)
        probes.append(probe)
        if probe["supported"]:
            supported.append(probe["service"])
        stream.emit("uds_transaction", {
            "request": request.to_payload(),
            "responses": [frame.to_payload() for frame in replies],
            **probe,
        })
    return CommandResult(
        data={
            "mode": "active",
            "interface": args.interface,
            "interface_source": args.interface_source,
            "request_id": request_id,
            "response_id": response_id,
            "probe_count": len(probes),
            "supported_count": len(supported),
            "supported_services": supported,
            "probes": probes,
        },
        warnings=[warning],
    )


def _classify(sid: int, replies: list) -> dict:
    """Classify the settled reply to one probe (the last non-pending one)."""
    settled = None
    for frame in replies:
        reply = uds.parse_single_frame_reply(frame.data)
        if reply is not None and reply.nrc != uds.NRC_RESPONSE_PENDING:
            settled = reply
    probe = {"service": f"0x{sid:02X}", "name": uds.service_name(sid), "response": "none",
             "nrc": None, "nrc_name": None, "supported": False,
             "pending_count": sum(1 for f in replies if (r := uds.parse_single_frame_reply(f.data)) and r.nrc == 0x78)}
    if settled is None:
        return probe
    if settled.positive:
        probe.update(response="positive", supported=True)
    else:
        probe.update(response="negative", nrc=f"0x{settled.nrc:02X}", nrc_name=uds.nrc_name(settled.nrc),
                     supported=settled.nrc != uds.NRC_SERVICE_NOT_SUPPORTED)
    return probe


def _render_text(result: CommandResult) -> str:
    data = result.data
    if data["mode"] == "reference":
        lines = [f"UDS services (ISO 14229-1): {data['service_count']}"]
        lines += [f"  {s['service']}  {s['name']:<32} {s['category']:<13} +resp {s['positive_response_service']}"
                  for s in data["services"]]
        return "\n".join(lines)
    if data["mode"] == "dry_run":
        lines = [f"dry run: {data['planned_requests']} requests on 0x{data['request_id']:X} (nothing sent)"]
        lines += [f"  {r['service']}  {r['name']:<32} {r['data']}" for r in data["requests"]]
        return "\n".join(lines)
    lines = [f"active probe of {data['interface']}: {data['supported_count']}/{data['probe_count']} services supported"]
    for probe in data["probes"]:
        detail = probe["response"] if probe["nrc"] is None else f"NRC {probe['nrc']} {probe['nrc_name']}"
        mark = "yes" if probe["supported"] else "no "
        lines.append(f"  {probe['service']}  {probe['name']:<32} {mark}  {detail}")
    return "\n".join(lines)
