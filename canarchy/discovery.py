"""UDS discovery over one open bus: which IDs answer, which services, which DIDs.

:func:`scan_ecus` (one side-effect-free request per candidate request ID, each answer confirmed by asking
again), :func:`probe_services` (one request per SID) and :func:`read_dids` (ReadDataByIdentifier 0x22 per
DID), each on a :class:`canarchy.isotp.BusLink` held open for the run and reporting every result to
``on_result`` as it happens. No python-can here. Shapes and rules: ``docs/uds-discovery.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable

from canarchy import uds
from canarchy.isotp import (PCI_FIRST, BusLink, Exchange, IsoTpTester, default_response_id, normal_fixed_id,
                            single_frame, single_frame_payload)
from canarchy.frames import MAX_STANDARD_ID, CanFrame

#: Seconds to wait after a 0x78 responsePending for the settled answer (P2*server default, ISO 14229-2).
PENDING_TIMEOUT = 5.0
#: responsePending answers accepted in a row before the probe is given up.
MAX_PENDING = 20
#: The discovery requests a scan may send (ISO 14229-1; neither changes the ECU's state).
SCAN_PROBES = {
    "tester-present": uds.request_payload(uds.SID_TESTER_PRESENT, 0x00),
    "session": uds.request_payload(uds.SID_DIAGNOSTIC_SESSION_CONTROL, uds.SESSION_DEFAULT),
}
#: The tester's source address for 29-bit normal fixed addressing (0xF1: an external test equipment address).
DEFAULT_TESTER_ADDRESS = 0xF1


def _settle() -> Callable[[bytes], bool]:
    """A ``settle`` for :meth:`IsoTpTester.request`: true for 0x78, at most :data:`MAX_PENDING` times."""
    seen = 0

    def pending(message: bytes) -> bool:
        nonlocal seen
        reply = uds.parse_response(message)
        if reply is None or not reply.pending or seen >= MAX_PENDING:
            return False
        seen += 1
        return True
    return pending


def _exchange_payload(exchange: Exchange) -> dict[str, Any]:
    """The frames of an exchange, as event payloads: ``request`` (the first frame
    sent), ``frames`` (every frame in order, each with ``direction``)."""
    frames = [dict(frame.to_payload(), direction=direction) for direction, frame in exchange.frames]
    return {"request_data": exchange.request.hex(), "frames": frames,
            "latency_s": None if exchange.latency is None else round(exchange.latency, 6)}


def classify(exchange: Exchange) -> dict[str, Any]:
    """The settled answer of an exchange (its last message that is not 0x78) as
    ``{response, nrc, nrc_name, message, pending_count, frame_count}``;
    ``response`` is ``positive``, ``negative``, ``invalid`` (an answer that is
    not UDS) or ``none`` (no answer); ``frame_count``: frames received."""
    messages = exchange.messages
    replies = [uds.parse_response(message) for message in messages]
    pending = sum(1 for reply in replies if reply is not None and reply.pending)
    settled = [(message, reply) for message, reply in zip(messages, replies, strict=True)
               if reply is None or not reply.pending]
    out: dict[str, Any] = {"response": "none", "nrc": None, "nrc_name": None, "message": None,
                           "pending_count": pending,
                           "frame_count": sum(1 for direction, _ in exchange.frames if direction == "rx")}
    if not settled:
        return out
    message, reply = settled[-1]
    out["message"] = message.hex()
    if reply is None:
        out["response"] = "invalid"
    elif reply.positive:
        out["response"] = "positive"
    else:
        out.update(response="negative", nrc=f"0x{reply.nrc:02X}", nrc_name=uds.nrc_name(reply.nrc))
    return out


# -- services ------------------------------------------------------------------------------------


def probe_services(link: BusLink, request_id: int, response_id: int, sids: Iterable[int], timeout: float,
                   on_result: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Send one discovery request per SID; return one probe per SID.

    A probe: ``service`` ("0x10"), ``name``, ``supported`` (a positive reply,
    or a negative one other than 0x11 serviceNotSupported: ISO 14229-1) and
    :func:`classify`'s fields. ``on_result(probe, exchange_payload)`` runs
    after each probe.
    """
    tester = IsoTpTester(link, request_id, response_id)
    probes = []
    for sid in sids:
        exchange = tester.request(uds.request_payload(sid), timeout, settle=_settle(), pending_timeout=PENDING_TIMEOUT)
        probe = {"service": f"0x{sid:02X}", "name": uds.service_name(sid), **classify(exchange)}
        probe["supported"] = probe["response"] == "positive" or (
            probe["response"] == "negative" and probe["nrc"] != f"0x{uds.NRC_SERVICE_NOT_SUPPORTED:02X}")
        probes.append(probe)
        if on_result is not None:
            on_result(probe, dict(_exchange_payload(exchange), warnings=exchange.warnings))
    return probes


# -- DIDs ---------------------------------------------------------------------------------------


def read_dids(link: BusLink, request_id: int, response_id: int, dids: Iterable[int], timeout: float,
              on_result: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """ReadDataByIdentifier for each DID; return one result per DID.

    A result: ``did`` ("0xF190"), ``name``, ``found`` (a positive answer echoing
    the DID), :func:`classify`'s fields and, when found,
    :func:`canarchy.uds.decode_did`'s (``data``, ``length``, ``text``, ``vin``,
    ``session``).
    """
    tester = IsoTpTester(link, request_id, response_id)
    results = []
    for did in dids:
        exchange = tester.request(uds.read_did_request(did), timeout, settle=_settle(),
                                  pending_timeout=PENDING_TIMEOUT)
        result = {"did": f"0x{did:04X}", "name": uds.did_name(did), "found": False, **classify(exchange)}
        message = bytes.fromhex(result["message"]) if result["message"] else b""
        if (result["response"] == "positive" and message[0] == 0x62 and len(message) >= 3
                and int.from_bytes(message[1:3], "big") == did):
            result.update(uds.decode_did(did, message[3:]), found=True)
        results.append(result)
        if on_result is not None:
            on_result(result, dict(_exchange_payload(exchange), warnings=exchange.warnings))
    return results


# -- the ECU scan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A request ID to try, and the response ID it usually pairs with (None: none usual)."""

    request_id: int
    expected_response_id: int | None


def candidates_11bit(first: int, last: int) -> list[Candidate]:
    """Every 11-bit request ID in ``first..last`` (0x700-0x7FF by default in the command)."""
    return [Candidate(can_id, default_response_id(can_id)) for can_id in range(first, last + 1)]


def candidates_29bit(first_target: int, last_target: int, tester: int = DEFAULT_TESTER_ADDRESS) -> list[Candidate]:
    """ISO 15765-4 normal fixed addressing: 0x18DA<TA><SA> for each target address in range
    (the tester's own address skipped), each expected to answer on 0x18DA<SA><TA>."""
    return [Candidate(normal_fixed_id(target, tester), normal_fixed_id(tester, target))
            for target in range(first_target, last_target + 1) if target != tester]


def _answers_probe(frame: CanFrame, sid: int) -> bytes | None:
    """The UDS bytes of ``frame`` when it is an answer to ``sid`` (a single frame, or a first
    frame's opening bytes), else None."""
    payload = single_frame_payload(frame.data)
    if payload is None and frame.data and frame.data[0] >> 4 == PCI_FIRST and len(frame.data) >= 3:
        payload = bytes(frame.data[2:])
    reply = uds.parse_response(payload)
    return payload if reply is not None and reply.sid == sid else None


def _listen(link: BusLink, request: CanFrame, sid: int, timeout: float) -> tuple[float, list[tuple[CanFrame, bytes]]]:
    """Send ``request``; return its send time and every answer to ``sid`` seen on any ID within ``timeout``."""
    import time

    sent_at = link.send(request)
    deadline = time.monotonic() + timeout
    answers = []
    while (remaining := deadline - time.monotonic()) > 0:
        frame = link.recv(remaining)
        if frame is None:
            break
        payload = _answers_probe(frame, sid)
        if payload is not None and frame.arbitration_id != request.arbitration_id:
            answers.append((frame, payload))
    return sent_at, answers


def scan_ecus(link: BusLink, candidates: Iterable[Candidate], probe: bytes, timeout: float,
              on_result: Callable[[dict[str, Any]], None] | None = None,
              on_ecu: Callable[[dict[str, Any]], None] | None = None,
              padding: int = 0x00) -> list[dict[str, Any]]:
    """Send ``probe`` on each candidate request ID; return the ECUs that answered and confirmed it.

    Every ID is listened to. A candidate whose request ID was already seen
    answering (the response ID of an ECU found earlier) is skipped, not
    sent on. A reply is confirmed by asking that request ID once more and
    seeing the answer on the same response ID again; an unconfirmed one
    (a late answer to an earlier request, say) is dropped. ``on_result``
    gets each probe as it happens: ``{request_id, is_extended_id, answered,
    skipped, responses: [{response_id, message}], confirmed}``; ``on_ecu``
    each ECU as soon as it is confirmed.

    An ECU: ``request_id``, ``response_id``, ``is_extended_id``,
    ``expected_response_id`` (whether the pair is the usual one: +8, or
    0x18DA<SA><TA>), ``usual_pair``, ``message`` (its answer, hex),
    ``response`` (``positive``/``negative``), ``nrc``, ``latency_s``.
    """
    sid = probe[0]
    responders: set[int] = set()
    found: list[dict[str, Any]] = []
    for candidate in candidates:
        extended = candidate.request_id > MAX_STANDARD_ID
        record: dict[str, Any] = {"request_id": candidate.request_id, "is_extended_id": extended,
                                  "answered": False, "skipped": False, "responses": []}
        if candidate.request_id in responders:
            record["skipped"] = True  # an ECU's response ID: sending on it would impersonate that ECU
            if on_result is not None:
                on_result(record)
            continue
        request = CanFrame(candidate.request_id, single_frame(probe, padding), is_extended_id=extended)
        sent_at, answers = _listen(link, request, sid, timeout)
        for frame, payload in answers:
            record["responses"].append({"response_id": frame.arbitration_id, "message": payload.hex()})
        record["answered"] = bool(answers)
        if answers:
            _sent, again = _listen(link, request, sid, timeout)
            confirmed_ids = {frame.arbitration_id for frame, _ in again}
            for frame, payload in answers:
                if frame.arbitration_id not in confirmed_ids or any(
                        e["request_id"] == candidate.request_id and e["response_id"] == frame.arbitration_id
                        for e in found):
                    continue
                responders.add(frame.arbitration_id)
                reply = uds.parse_response(payload)
                ecu = {
                    "request_id": candidate.request_id,
                    "response_id": frame.arbitration_id,
                    "is_extended_id": extended,
                    "expected_response_id": candidate.expected_response_id,
                    "usual_pair": candidate.expected_response_id == frame.arbitration_id,
                    "message": payload.hex(),
                    "response": "positive" if reply.positive else "negative",
                    "nrc": None if reply.positive else f"0x{reply.nrc:02X}",
                    "latency_s": round(max(0.0, frame.timestamp - sent_at), 6),
                }
                found.append(ecu)
                if on_ecu is not None:
                    on_ecu(ecu)
            record["confirmed"] = sorted(confirmed_ids & {frame.arbitration_id for frame, _ in answers})
        if on_result is not None:
            on_result(record)
    return found
