"""``simulate ecu [CHANNEL]``: the simulated UDS ECU (:class:`canarchy.simulator.SimulatedEcu`) as a command.

It answers UDS (ISO 14229-1 over ISO 15765-2) on the configured python-can bus type as a TOML or JSON profile
says (:mod:`canarchy.commands._simulate_profile`), until SIGINT/SIGTERM, ``--duration`` or ``--max-requests``.
Active (it transmits its answers): the active-transmit gate (:mod:`canarchy.active`) runs first; ``--dry-run``
shows the resolved profile. Errors: ``SIMULATOR_PROFILE_INVALID``, ``SIMULATOR_TRANSPORT_UNSUPPORTED`` (exit 1);
``TRANSPORT_UNAVAILABLE``, ``SIMULATOR_BUS_FAILED`` (exit 2). See ``docs/generate-and-simulate.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any
from collections.abc import Callable

from canarchy.active import active_gate, add_active_arguments
from canarchy.commands._common import StopSignals, parse_arbitration_id, parse_int
from canarchy.commands._simulate_profile import describe_profile, load_ecus
from canarchy.errors import TransportError, UserInputError
from canarchy.output import CommandResult, open_stream, terminal_safe
from canarchy.frames import can_id_text

DEFAULT_REQUEST_ID = 0x7E0
#: Seconds between checks of the stop conditions while the ECU runs.
_POLL = 0.02


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    """Register the ``simulate`` group and ``simulate ecu``."""
    group = subparsers.add_parser("simulate", parents=[parent], help="simulated ECUs to test against (active)")
    sub = group.add_subparsers(dest="simulate_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("ecu", parents=[parent],
                       help="answer UDS requests as a simulated ECU until Ctrl+C, SIGTERM or --duration (active)")
    p.add_argument("channel", nargs="?", help="CAN channel (default: [transport].default_interface)")
    p.add_argument("--profile", metavar="FILE", help="ECU profile, .toml or .json (default: the built-in ECU)")
    p.add_argument("--request-id", help="request arbitration ID (default: the profile's, else 0x7E0)")
    p.add_argument("--response-id", help="response arbitration ID (default: the profile's, else request ID + 8)")
    p.add_argument("--duration", metavar="S", help="stop after this many seconds (default: run until stopped)")
    p.add_argument("--max-requests", metavar="N", help="stop once N UDS requests have been answered")
    add_active_arguments(p)
    p.set_defaults(command="simulate ecu", handler=_ecu, takes_channel=True,
                   no_interface_ok=lambda a: a.dry_run, render_text=_render_text)



# --- running ----------------------------------------------------------------------------------


def _ids(args: argparse.Namespace, from_profile: tuple[int | None, int | None]) -> tuple[int, int]:
    request_id = from_profile[0] if from_profile[0] is not None else DEFAULT_REQUEST_ID
    if args.request_id is not None:
        request_id = parse_arbitration_id(args.request_id)[0]  # hex, as every ID on the command line
    response_id = from_profile[1]
    if args.response_id is not None:
        response_id = parse_arbitration_id(args.response_id)[0]
    if response_id is None:
        response_id = _default_response_id(request_id)
    if response_id == request_id:
        raise UserInputError("INVALID_ARGUMENTS", f"Request and response ID are both 0x{request_id:X}.",
                             "Give the ECU different request and response IDs (e.g. 0x7E0 and 0x7E8).")
    return request_id, response_id


def _default_response_id(request_id: int) -> int:
    """:func:`canarchy.isotp.default_response_id`, else ``INVALID_ARGUMENTS``."""
    from canarchy.isotp import default_response_id

    response_id = default_response_id(request_id)
    if response_id is None:
        raise UserInputError("INVALID_ARGUMENTS", f"There is no default response ID for request ID 0x{request_id:X}.",
                             "Give --response-id (or response_id in the profile).")
    return response_id


def _limits(args: argparse.Namespace) -> tuple[float | None, int | None]:
    duration = None
    if args.duration is not None:
        try:
            duration = float(args.duration)
        except ValueError:
            duration = -1.0
        if not 0 < duration < float("inf"):
            raise UserInputError("INVALID_ARGUMENTS", f"--duration {args.duration!r} is not a number of seconds > 0.",
                                 "Give --duration in seconds, e.g. 30, or leave it out to run until Ctrl+C.")
    max_requests = None
    if args.max_requests is not None:
        max_requests = parse_int(args.max_requests, "INVALID_ARGUMENTS", "--max-requests", 1, 10**9,
                                 "Give --max-requests as a whole number >= 1.")
    return duration, max_requests


def _ecu(args: argparse.Namespace) -> CommandResult:
    loaded = load_ecus(args.profile)
    if len(loaded) > 1 and (args.request_id is not None or args.response_id is not None):
        raise UserInputError("INVALID_ARGUMENTS", f"The profile {args.profile} holds {len(loaded)} ECUs, each with "
                             "its own IDs: --request-id/--response-id do not apply.",
                             "Set each ECU's request_id/response_id in the profile, or drop the options.")
    ecus = []
    for profile, *profile_ids in loaded:
        request_id, response_id = _ids(args, (profile_ids[0], profile_ids[1]))
        ecus.append((profile, request_id, response_id))
    duration, max_requests = _limits(args)
    described = [{"request_id": request_id, "response_id": response_id, **describe_profile(profile)}
                 for profile, request_id, response_id in ecus]
    # The first ECU's fields at the top (the only ECU of a plain profile), every ECU in `ecus`.
    common = {"interface": args.interface, "profile": args.profile, **described[0], "ecus": described}
    if args.dry_run:
        return CommandResult(data=dict(common, mode="dry_run", duration_s=duration, max_requests=max_requests))
    from canarchy.transport import transport_backend_config

    settings = transport_backend_config()
    if settings.backend != "python-can":
        raise UserInputError("SIMULATOR_TRANSPORT_UNSUPPORTED",
                             f"The {settings.backend} backend cannot host a simulated ECU: it has no bus to answer on.",
                             "Use the python-can backend ([transport].backend) with a bus type such as socketcan "
                             "(vcan0) or virtual.")
    action = "answer UDS requests on " + ", ".join(
        f"{can_id_text(request_id)} with responses on {can_id_text(response_id)}"
        for _profile, request_id, response_id in ecus)
    warning = active_gate("simulate ecu", args.interface, action, args.ack_active)
    return _run(args, ecus, settings.bus_type, duration, max_requests, common, warning,
                bus_options=settings.bus_options)


def _run(args: argparse.Namespace, ecus: list[tuple[Any, int, int]], bus_type: str,
         duration: float | None, max_requests: int | None, common: dict[str, Any], warning: str,
         bus_options: dict[str, Any] | None = None) -> CommandResult:
    from canarchy import uds
    from canarchy.simulator import EcuNode, SimulatedNetwork

    stream = open_stream(args, f"simulate.ecu:{args.interface}", live=True,
                         keep=getattr(args, "output", "text") == "jsonl")
    nodes = [EcuNode(request_id, response_id, profile) for profile, request_id, response_id in ecus]
    network = SimulatedNetwork(args.interface, nodes, bus_type=bus_type,
                               bus_options=bus_options)  # bit rates and [transport.bus_kwargs], as every bus
    emit = stream.emit

    by_sid: dict[str, int] = {}
    seen = [0] * len(nodes)
    count = 0

    def note_requests() -> None:
        nonlocal count
        for position, node in enumerate(nodes):
            messages = node.messages
            while seen[position] < len(messages):
                request = messages[seen[position]]
                seen[position] += 1
                count += 1
                sid = f"0x{request[0]:02X}" if request else "-"
                by_sid[sid] = by_sid.get(sid, 0) + 1
                emit("uds_request", {"index": count, "data": request.hex(), "service": sid,
                                     "service_name": uds.service_name(request[0]) if request else None,
                                     "request_id": node.request_id})

    with StopSignals() as stop:
        try:
            network.start()
        except Exception as exc:  # python-can raises many types; the user gets one code
            from canarchy.transport import bus_unavailable

            raise bus_unavailable(args.interface, bus_type, exc) from None
        started = time.monotonic()  # --duration counts from the open bus (an adapter slow to open)
        try:
            sys.stderr.write(terminal_safe(f"canarchy: simulate ecu: ready on {bus_type} channel {args.interface}: "
                                           f"{'; '.join(_ready(ecu) for ecu in common['ecus'])} (Ctrl+C to stop)")
                             + "\n")
            sys.stderr.flush()
            emit("simulator_ready", {"interface": args.interface, "bus_type": bus_type,
                                     "request_id": common["request_id"], "response_id": common["response_id"],
                                     "services": common["services"],
                                     "ecus": [{key: ecu[key] for key in ("request_id", "response_id", "services")}
                                              for ecu in common["ecus"]]})
            stopped_by = _wait(network, stop, started, duration, max_requests, note_requests)
        finally:
            network.stop()
    note_requests()
    if network.error is not None:
        raise TransportError("SIMULATOR_BUS_FAILED",
                             f"The simulated ECU on {args.interface!r} stopped: {network.error.__class__.__name__}: "
                             f"{network.error}",
                             "Check that the interface is still up and the bus is not in bus-off.")
    for described, node in zip(common["ecus"], nodes, strict=True):
        described.update(requests=len(node.messages), frames_received=len(node.requests),
                         frames_sent=len(node.responses))
    data = dict(common, mode="active", interface_source=args.interface_source, bus_type=bus_type,
                stopped_by=stopped_by, elapsed_s=round(time.monotonic() - started, 6), requests=count,
                requests_by_service=dict(sorted(by_sid.items())),
                frames_received=sum(len(node.requests) for node in nodes),
                frames_sent=sum(len(node.responses) for node in nodes), duration_s=duration,
                max_requests=max_requests)
    return CommandResult(data=data, warnings=[warning])


def _ready(ecu: dict[str, Any]) -> str:
    services = "silent" if ecu.get("silent") else f"services {' '.join(ecu['services']) or 'none'}"
    return f"requests {can_id_text(ecu['request_id'])}, responses {can_id_text(ecu['response_id'])}, {services}"


def _wait(network: Any, stop: StopSignals, started: float, duration: float | None, max_requests: int | None,
          on_tick: Callable[[], None]) -> str:
    """Block until a stop condition; return which: a signal name, ``duration``,
    ``max_requests`` (all ECUs together) or ``bus_failed``."""
    deadline = None if duration is None else started + duration
    answered_at = None
    n_timeout = max(node.profile.n_timeout for node in network.ecus)
    while True:
        on_tick()
        if stop.name is not None:
            return stop.name
        if not network.running:
            return "bus_failed"
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return "duration"
        if max_requests is not None and sum(len(node.messages) for node in network.ecus) >= max_requests:
            # Let the last answer go out: delayed replies, and a segmented one that
            # waits for the tester's flow control (bounded by N_Bs).
            answered_at = answered_at or now
            if not network.busy or now - answered_at > n_timeout:
                return "max_requests"
        wait = _POLL if deadline is None else max(0.0, min(_POLL, deadline - now))
        stop.wait(wait)


def _render_text(result: CommandResult) -> str:
    d = result.data
    services = " ".join(d["services"]) or "none"
    if d["mode"] == "dry_run":
        lines = [f"dry run: would answer UDS requests on {can_id_text(d['request_id'])} with responses on "
                 f"{can_id_text(d['response_id'])}" + (f" on {d['interface']}" if d["interface"] else "")
                 + "; nothing opened",
                 f"  services: {services}"]
    else:
        lines = [f"simulated ECU on {d['interface']} ({d['bus_type']}) stopped by {d['stopped_by']} after "
                 f"{d['elapsed_s']:.1f} s: {d['requests']} UDS requests answered, {d['frames_received']} frames in, "
                 f"{d['frames_sent']} frames out",
                 f"  services: {services}"]
        if d["requests_by_service"]:
            lines.append("  requests: " + ", ".join(f"{sid} x{n}" for sid, n in d["requests_by_service"].items()))
    if d["nrc"]:
        lines.append("  forced NRCs: " + ", ".join(f"{sid} -> {nrc}" for sid, nrc in d["nrc"].items()))
    for did, value in d["dids"].items():
        lines.append(f"  DID {did}: {value['text'] if value['text'] is not None else value['hex']}")
    if len(d["ecus"]) > 1:
        lines.append(f"  {len(d['ecus'])} ECUs on the bus (the first above):")
        for ecu in d["ecus"]:
            answered = f": {ecu['requests']} requests" if "requests" in ecu else ""
            lines.append(f"    {_ready(ecu)}{answered}")
    return "\n".join(lines)
