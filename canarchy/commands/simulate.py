"""``simulate ecu [CHANNEL]``: the simulated UDS ECU (:class:`canarchy.simulator.SimulatedEcu`) as a command.

It answers UDS (ISO 14229-1 over ISO 15765-2) on the configured python-can bus type as a TOML or JSON
profile says (:func:`load_profile`), until SIGINT/SIGTERM, ``--duration`` or ``--max-requests``. Active (it
transmits its answers): the active-transmit gate (:mod:`canarchy.active`) runs first; ``--dry-run`` shows the
resolved profile. Errors: ``SIMULATOR_PROFILE_INVALID``, ``SIMULATOR_TRANSPORT_UNSUPPORTED`` (exit 1);
``TRANSPORT_UNAVAILABLE``, ``SIMULATOR_BUS_FAILED`` (exit 2). See ``docs/generate-and-simulate.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from canarchy.active import active_gate, add_active_arguments
from canarchy.commands._common import StopSignals, parse_arbitration_id, parse_hex_data, parse_int
from canarchy.errors import TransportError, UserInputError
from canarchy.output import CommandResult, open_stream
from canarchy.frames import can_id_text
from canarchy.uds import NEGATIVE_RESPONSE_SID

DEFAULT_REQUEST_ID = 0x7E0
#: Seconds between checks of the stop conditions while the ECU runs.
_POLL = 0.02
#: Keys a profile may have (anything else is a typo, reported as such).
PROFILE_KEYS = ("request_id", "response_id", "services", "nrc", "dids", "writable_dids", "security",
                "pending", "delays", "padding", "silent")
_SECURITY_KEYS = ("seed", "key", "max_attempts", "lockout")


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


# --- the profile ------------------------------------------------------------------------------


def _invalid(path: str, message: str, hint: str | None = None) -> UserInputError:
    return UserInputError("SIMULATOR_PROFILE_INVALID", f"Profile {path}: {message}",
                          hint or "See docs/generate-and-simulate.md for the profile keys and their values.")


def _int(path: str, where: str, raw: Any, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise _invalid(path, f"{where} must be an integer or a \"0x..\" string, got {raw!r}.")
    if isinstance(raw, int):
        if not lo <= raw <= hi:
            raise _invalid(path, f"{where} = {raw} is outside 0x{lo:X}..0x{hi:X}.")
        return raw
    try:
        return parse_int(raw, "SIMULATOR_PROFILE_INVALID", where, lo, hi, "-")
    except UserInputError as exc:
        raise _invalid(path, exc.message) from None


def _seconds(path: str, where: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 60:
        raise _invalid(path, f"{where} must be a number of seconds 0..60, got {raw!r}.")
    return float(raw)


def _hex(path: str, where: str, raw: Any, max_bytes: int) -> bytes:
    if not isinstance(raw, str):
        raise _invalid(path, f"{where} must be a hex string, got {raw!r}.")
    try:
        value = parse_hex_data(raw, max_bytes=max_bytes)
    except UserInputError as exc:
        raise _invalid(path, f"{where}: {exc.message}") from None
    if not value:
        raise _invalid(path, f"{where} is empty.")
    return value


def _table(path: str, document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise _invalid(path, f"`{key}` must be a table (TOML) or an object (JSON), got {value!r}.")
    return value


def _sid_list(path: str, key: str, raw: Any, lo: int, hi: int) -> frozenset[int]:
    if not isinstance(raw, list):
        raise _invalid(path, f"`{key}` must be a list, got {raw!r}.")
    return frozenset(_int(path, f"{key}[{i}]", item, lo, hi) for i, item in enumerate(raw))


def read_profile_document(path: str) -> dict[str, Any]:
    """Read a profile file as a dict: ``.toml`` with tomllib, ``.json`` with json.

    Raises ``UserInputError`` ``SIMULATOR_PROFILE_INVALID`` when it is missing,
    unreadable, of another suffix, does not parse, or is not a table/object.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise _invalid(path, f"suffix {suffix or '(none)'!r} is neither .toml nor .json.",
                       "Write the profile as TOML (.toml) or JSON (.json).")
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _invalid(path, "the file does not exist.", "Check the path given to --profile.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _invalid(path, f"the file cannot be read: {getattr(exc, 'strerror', None) or exc}.",
                       "Check the file's permissions and that it is UTF-8 text.") from None
    try:
        if suffix == ".toml":
            import tomllib

            document = tomllib.loads(text)
        else:
            document = json.loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise _invalid(path, f"it does not parse as {suffix[1:].upper()}: {exc}.",
                       f"Fix the {suffix[1:].upper()} syntax at the place named.") from None
    if not isinstance(document, dict):
        raise _invalid(path, "the top level must be a table/object.")
    return document


def load_profile(path: str | None) -> tuple[Any, int | None, int | None]:
    """Build the ECU's :class:`~canarchy.simulator.EcuProfile` from a profile file.

    Returns ``(profile, request_id, response_id)`` (the IDs None when the file
    does not give them). Without a file: the built-in profile. A key the file
    gives replaces that default; keys it omits keep the default.

    Keys (integers as TOML integers or ``"0x.."`` strings; JSON object keys are
    strings): ``request_id``, ``response_id`` (arbitration IDs);
    ``services`` (list of supported SIDs; others get NRC 0x11); ``nrc`` (SID ->
    NRC returned for every request of that SID); ``dids`` (DID -> value: a text
    string, stored as its UTF-8 bytes, or ``{hex = "..."}``); ``writable_dids``
    (DIDs 0x2E may write); ``security`` (``seed``, ``key``: hex;
    ``max_attempts``; ``lockout``: seconds); ``pending`` (SID -> seconds
    before the settled reply, after 0x78); ``delays`` (SID -> seconds before
    the reply); ``padding`` (byte, or false for unpadded frames). ISO 14229-1
    names the services and NRCs.

    Raises ``UserInputError`` ``SIMULATOR_PROFILE_INVALID`` naming the file and the key.
    """
    from canarchy.simulator import EcuProfile

    if path is None:
        return EcuProfile(), None, None
    return _profile_from(path, read_profile_document(path))


def load_ecus(path: str | None) -> list[tuple[Any, int | None, int | None]]:
    """The ECUs of a profile file: one for a plain profile; one per entry of ``ecus`` (a list of
    tables, each a profile of its own with its own ``request_id``) for a network of ECUs on one bus.

    Raises ``UserInputError`` ``SIMULATOR_PROFILE_INVALID`` naming the file and the key.
    """
    if path is None:
        return [load_profile(None)]
    document = read_profile_document(path)
    if "ecus" not in document:
        return [_profile_from(path, document)]
    entries = document["ecus"]
    if set(document) != {"ecus"}:
        raise _invalid(path, "with `ecus`, every key belongs to one of the ECUs (found "
                             f"{', '.join(sorted(set(document) - {'ecus'}))} at the top).")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise _invalid(path, "`ecus` must be a non-empty list of tables ([[ecus]] in TOML).")
    ecus = []
    for index, entry in enumerate(entries):
        try:
            ecus.append(_profile_from(path, entry, f"ecus[{index}]."))
        except UserInputError as exc:  # name the entry
            raise _invalid(path, f"ecus[{index}]: {exc.message.removeprefix(f'Profile {path}: ')}", exc.hint) from None
    ids = [ecu[1] for ecu in ecus]
    if None in ids:
        raise _invalid(path, f"ecus[{ids.index(None)}] has no request_id: each ECU of a network needs its own.")
    if len(set(ids)) != len(ids):
        raise _invalid(path, "two ECUs share a request_id.")
    return ecus


def _profile_from(path: str, document: dict[str, Any], where: str = "") -> tuple[Any, int | None, int | None]:
    """One profile document (the file, or one entry of ``ecus``) as ``(profile, request_id, response_id)``."""
    from dataclasses import replace

    from canarchy.simulator import EcuProfile

    profile = EcuProfile()
    unknown = sorted(set(document) - set(PROFILE_KEYS))
    if unknown:
        raise _invalid(path, f"unknown key(s) {where}{(', ' + where).join(unknown)}; "
                             f"expected {', '.join(PROFILE_KEYS)} (or `ecus`, a list of ECUs).")
    changes: dict[str, Any] = {}
    request_id = response_id = None
    if "request_id" in document:
        request_id = _int(path, "request_id", document["request_id"], 0, 0x1FFFFFFF)
    if "response_id" in document:
        response_id = _int(path, "response_id", document["response_id"], 0, 0x1FFFFFFF)
    if "services" in document:
        changes["supported_sids"] = _sid_list(path, "services", document["services"], 0x00, 0xFF)
        if NEGATIVE_RESPONSE_SID in changes["supported_sids"]:
            raise _invalid(path, "services lists 0x7F, the negative response SID (ISO 14229-1).")
    if "nrc" in document:
        changes["forced_nrcs"] = {_int(path, f"nrc key {sid!r}", sid, 0, 0xFF): _int(path, f"nrc.{sid}", nrc, 1, 0xFF)
                                  for sid, nrc in _table(path, document, "nrc").items()}
    if "dids" in document:
        changes["dids"] = _dids(path, _table(path, document, "dids"))
    if "writable_dids" in document:
        changes["writable_dids"] = _sid_list(path, "writable_dids", document["writable_dids"], 0, 0xFFFF)
    if "security" in document:
        changes.update(_security(path, _table(path, document, "security")))
    for key, field_name in (("pending", "pending"), ("delays", "response_delays")):
        if key in document:
            changes[field_name] = {_int(path, f"{key} key {sid!r}", sid, 0, 0xFF): _seconds(path, f"{key}.{sid}", s)
                                   for sid, s in _table(path, document, key).items()}
    if "padding" in document:
        padding = document["padding"]
        changes["padding"] = None if padding is False else _int(path, "padding", padding, 0, 0xFF)
    if "silent" in document:
        if not isinstance(document["silent"], bool):
            raise _invalid(path, f"{where}silent must be true or false, got {document['silent']!r}.")
        changes["silent"] = document["silent"]
    return replace(profile, **changes), request_id, response_id


def _dids(path: str, table: dict[str, Any]) -> dict[int, bytes]:
    """The ``dids`` table: DID -> its value, a text string (UTF-8) or ``{hex = ".."}``, 1..4000 bytes."""
    dids = {}
    for did, value in table.items():
        number = _int(path, f"dids key {did!r}", did, 0, 0xFFFF)
        if isinstance(value, str):
            data = value.encode("utf-8")
        elif isinstance(value, dict) and set(value) == {"hex"}:
            data = _hex(path, f"dids.{did}.hex", value["hex"], 4000)
        else:
            raise _invalid(path, f"dids.{did} must be a text string or {{hex = \"..\"}}, got {value!r}.")
        if not data or len(data) > 4000:
            raise _invalid(path, f"dids.{did} must hold 1..4000 bytes (one ISO-TP message), has {len(data)}.")
        dids[number] = data
    return dids


def _security(path: str, security: dict[str, Any]) -> dict[str, Any]:
    """The ``security`` table as the profile's ``security_*`` field changes."""
    unknown = sorted(set(security) - set(_SECURITY_KEYS))
    if unknown:
        raise _invalid(path, f"unknown key(s) security.{', security.'.join(unknown)}; "
                             f"expected {', '.join(_SECURITY_KEYS)}.")
    changes: dict[str, Any] = {}
    if "seed" in security:
        changes["security_seed"] = _hex(path, "security.seed", security["seed"], 32)
    if "key" in security:
        changes["security_key"] = _hex(path, "security.key", security["key"], 32)
    if "max_attempts" in security:
        changes["security_max_attempts"] = _int(path, "security.max_attempts", security["max_attempts"], 1, 255)
    if "lockout" in security:
        changes["security_lockout"] = _seconds(path, "security.lockout", security["lockout"])
    return changes


def describe_profile(profile: Any) -> dict[str, Any]:
    """The profile as JSON: hex strings for SIDs, NRCs and DIDs, DID values as hex and (when printable) text."""
    def text(value: bytes) -> str | None:
        try:
            decoded = value.decode("ascii")
        except UnicodeDecodeError:
            return None
        return decoded if decoded.isprintable() else None

    return {
        "silent": profile.silent,
        "services": [f"0x{sid:02X}" for sid in sorted(profile.supported_sids)],
        "nrc": {f"0x{sid:02X}": f"0x{nrc:02X}" for sid, nrc in sorted(profile.forced_nrcs.items())},
        "dids": {f"0x{did:04X}": {"hex": value.hex(), "text": text(value)}
                 for did, value in sorted(profile.dids.items())},
        "writable_dids": [f"0x{did:04X}" for did in sorted(profile.writable_dids)],
        "security": {"seed": profile.security_seed.hex(), "key": profile.security_key.hex(),
                     "max_attempts": profile.security_max_attempts, "lockout": profile.security_lockout},
        "pending": {f"0x{sid:02X}": s for sid, s in sorted(profile.pending.items())},
        "delays": {f"0x{sid:02X}": s for sid, s in sorted(profile.response_delays.items())},
        "padding": profile.padding,
    }


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

    started = time.monotonic()
    with StopSignals() as stop:
        try:
            network.start()
        except Exception as exc:  # python-can raises many types; the user gets one code
            from canarchy.transport import bus_unavailable

            raise bus_unavailable(args.interface, bus_type, exc) from None
        try:
            sys.stderr.write(f"canarchy: simulate ecu: ready on {bus_type} channel {args.interface}: "
                             f"{'; '.join(_ready(ecu) for ecu in common['ecus'])} (Ctrl+C to stop)\n")
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
