"""Simulated UDS ECUs: the real peers active commands are tested against.

:class:`SimulatedEcu` is one ECU on its own python-can bus; :class:`SimulatedNetwork` puts several
:class:`EcuNode` objects (one may be ``silent``) on one bus. They answer UDS (ISO 14229-1) over ISO-TP
(ISO 15765-2) from a background thread, open their bus with ``ignore_config=True`` and shut it down on exit;
``requests``/``messages``/``responses`` record what crossed the bus. Usage, the default :class:`EcuProfile`
and ``python -m canarchy.simulator``: ``docs/fuzz-guided.md``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

from canarchy.isotp import (CF_DATA, CLASSIC_FRAME, FF_DATA, FF_MAX_LENGTH, FLOW_STATUS_CONTINUE,
                            FLOW_STATUS_WAIT, PCI_CONSECUTIVE, PCI_FIRST, PCI_FLOW_CONTROL, PCI_SINGLE, SF_MAX,
                            flow_control, single_frame_payload, st_min_seconds)
from canarchy.uds import (NEGATIVE_RESPONSE_SID, NRC_CONDITIONS_NOT_CORRECT, NRC_EXCEEDED_NUMBER_OF_ATTEMPTS,
                          NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT, NRC_INVALID_KEY, NRC_REQUEST_OUT_OF_RANGE,
                          NRC_REQUEST_SEQUENCE_ERROR, NRC_REQUIRED_TIME_DELAY_NOT_EXPIRED, NRC_RESPONSE_PENDING,
                          NRC_SECURITY_ACCESS_DENIED, NRC_SERVICE_NOT_SUPPORTED,
                          NRC_SERVICE_NOT_SUPPORTED_IN_ACTIVE_SESSION, NRC_SUB_FUNCTION_NOT_SUPPORTED,
                          POSITIVE_RESPONSE_OFFSET, SESSION_DEFAULT, SESSION_EXTENDED, SESSION_PROGRAMMING,
                          SUPPRESS_POSITIVE_RESPONSE)

_log = logging.getLogger(__name__)

# Services whose sub-function byte carries the suppressPosRspMsgIndicationBit (ISO 14229-1 §8.2.2).
_SPRMIB_SERVICES = frozenset({0x10, 0x11, 0x28, 0x3E, 0x85})

DEFAULT_VIN = "TMBZZZ0X0NY000001"


def _default_dids() -> dict[int, bytes]:
    # DIDs from ISO 14229-1 Table C.1 (0xF186 is answered from the live session).
    return {
        0xF187: b"SIM-0001",          # vehicleManufacturerSparePartNumber
        0xF18C: b"SIM0000001",        # ECUSerialNumber
        0xF190: DEFAULT_VIN.encode(),  # VIN, 17 bytes: needs a segmented response
        0xF195: b"\x01\x00",          # systemSupplierECUSoftwareVersionNumber
        0xF198: b"TESTER",            # repairShopCodeOrTesterSerialNumber (writable)
    }


@dataclass(frozen=True)
class EcuProfile:
    """What the simulated ECU supports and how it answers (all times in seconds).

    - ``supported_sids``: SIDs answered by a service handler; any other SID
      gets ``7F SID 11``. A supported SID without a handler here answers a
      bare positive response (SID + 0x40, the sub-function echoed).
    - ``session_sids``: SID -> sessions (0x01 default, 0x02 programming,
      0x03 extended) in which it is available; elsewhere ``7F SID 7F``.
    - ``forced_nrcs``: SID -> NRC returned for every request of that SID
      (after the support and session checks), e.g. ``{0x19: 0x22}``.
    - ``pending``: SID -> delay: ``7F SID 78`` at once, the settled reply
      after the delay (ISO 14229-2 responsePending).
    - ``response_delays``: SID -> delay before the reply, without 0x78 (a
      slow ECU: beyond P2server = 0.05 s this is what ``timing:slow`` finds).
    - ``dids``: DID -> value for 0x22; 0xF186 (active session) is implicit;
      ``writable_dids`` may be written by 0x2E (extended session, unlocked).
    - ``routines``: routine id -> status record (bytes) for a positive
      ``71 01 RID ...`` or an NRC (int); ``secured_routines`` need 0x27 first.
    - SecurityAccess level 1 (sub-functions 0x01 requestSeed / 0x02 sendKey):
      ``security_seed``, ``security_key``, ``security_max_attempts`` wrong
      keys before 0x36, then ``security_lockout`` seconds of 0x37.
    - ``dtcs``: (3-byte DTC, status byte) pairs for 0x19 0x01 / 0x02.
    - ISO-TP: ``padding`` byte (None: unpadded), ``block_size`` and
      ``st_min`` sent in the ECU's flow control, ``n_timeout`` (N_Bs/N_Cr).
    - ``s3_timeout``: a non-default session falls back to default after this
      much silence (ISO 14229-2 S3server).
    - ``silent``: receive (and record) every frame but never answer: an ECU
      that is on the bus and does not speak UDS on these IDs.
    """

    supported_sids: frozenset[int] = frozenset(
        {0x10, 0x11, 0x14, 0x19, 0x22, 0x27, 0x28, 0x2E, 0x31, 0x3E, 0x85})
    session_sids: dict[int, frozenset[int]] = field(default_factory=lambda: {
        0x28: frozenset({SESSION_EXTENDED, SESSION_PROGRAMMING}),
        0x2E: frozenset({SESSION_EXTENDED}),
        0x85: frozenset({SESSION_EXTENDED, SESSION_PROGRAMMING}),
    })
    forced_nrcs: dict[int, int] = field(default_factory=dict)
    pending: dict[int, float] = field(default_factory=lambda: {0x11: 0.05})
    response_delays: dict[int, float] = field(default_factory=lambda: {0x14: 0.08})
    dids: dict[int, bytes] = field(default_factory=_default_dids)
    writable_dids: frozenset[int] = frozenset({0xF198})
    routines: dict[int, bytes | int] = field(default_factory=lambda: {
        0x0202: b"\x00",                         # checkMemory: passed
        0x0203: NRC_CONDITIONS_NOT_CORRECT,      # checkProgrammingPreconditions: refused
        0xFF00: b"\x00",                         # eraseMemory
    })
    secured_routines: frozenset[int] = frozenset({0xFF00})
    security_seed: bytes = bytes.fromhex("11223344")
    security_key: bytes = bytes.fromhex("EEDDCCBB")
    security_max_attempts: int = 3
    security_lockout: float = 10.0
    dtcs: tuple[tuple[int, int], ...] = ((0x042000, 0x2F), (0xC10000, 0x09))
    padding: int | None = 0xAA
    block_size: int = 0
    st_min: int = 0
    n_timeout: float = 1.0
    s3_timeout: float = 5.0
    silent: bool = False


def _negative(sid: int, nrc: int) -> bytes:
    return bytes((NEGATIVE_RESPONSE_SID, sid, nrc))


@dataclass
class _Reply:
    """One UDS response to send after ``delay`` seconds."""

    payload: bytes
    delay: float = 0.0


class _UdsServer:
    """The UDS state machine (session, security, routines); no I/O, no threads.

    ``handle(request, now)`` returns the replies to send, in order, each
    with its delay; an empty list means no response (suppressed).
    """

    def __init__(self, profile: EcuProfile) -> None:
        self.profile = profile
        self.dids = dict(profile.dids)
        self.session = SESSION_DEFAULT
        self.unlocked = False
        self.seed_outstanding = False
        self.failed_attempts = 0
        self.locked_until = 0.0
        self.started_routines: set[int] = set()
        self.last_request = 0.0

    def reset(self) -> None:
        """Back to power-on state (ECUReset): default session, security locked."""
        self.session = SESSION_DEFAULT
        self.unlocked = False
        self.seed_outstanding = False
        self.started_routines.clear()

    def handle(self, request: bytes, now: float) -> list[_Reply]:
        if not request:
            return []
        if (self.session != SESSION_DEFAULT and self.last_request
                and now - self.last_request > self.profile.s3_timeout):
            self.session = SESSION_DEFAULT
            self.unlocked = False
        self.last_request = now
        sid = request[0]
        if sid not in self.profile.supported_sids:
            return [_Reply(_negative(sid, NRC_SERVICE_NOT_SUPPORTED))]
        sessions = self.profile.session_sids.get(sid)
        if sessions is not None and self.session not in sessions:
            return [_Reply(_negative(sid, NRC_SERVICE_NOT_SUPPORTED_IN_ACTIVE_SESSION))]
        if sid in self.profile.forced_nrcs:
            return [_Reply(_negative(sid, self.profile.forced_nrcs[sid]))]
        handler: Callable[[bytes, float], bytes | None] = getattr(
            self, f"_service_{sid:02x}", self._service_generic)
        if sid in _SPRMIB_SERVICES and len(request) >= 2 and request[1] & SUPPRESS_POSITIVE_RESPONSE:
            response = handler(request, now)
            # suppressPosRspMsgIndicationBit: negative responses are still sent.
            if response is not None and response[0] != NEGATIVE_RESPONSE_SID:
                response = None
        else:
            response = handler(request, now)
        if response is None:
            return []
        if sid in self.profile.pending and response[0] != NEGATIVE_RESPONSE_SID:
            return [_Reply(_negative(sid, NRC_RESPONSE_PENDING)), _Reply(response, self.profile.pending[sid])]
        return [_Reply(response, self.profile.response_delays.get(sid, 0.0))]

    # Each service handler returns the response payload, or None to stay silent.

    def _service_generic(self, request: bytes, now: float) -> bytes:
        return bytes((request[0] + POSITIVE_RESPONSE_OFFSET,)) + request[1:2]

    def _service_10(self, request: bytes, now: float) -> bytes:
        """DiagnosticSessionControl: 50 session P2(2 bytes, ms) P2*(2 bytes, 10 ms)."""
        if len(request) != 2:
            return _negative(0x10, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        session = request[1] & 0x7F
        if session not in (SESSION_DEFAULT, SESSION_PROGRAMMING, SESSION_EXTENDED):
            return _negative(0x10, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        if session == SESSION_PROGRAMMING and self.session == SESSION_DEFAULT:
            return _negative(0x10, NRC_CONDITIONS_NOT_CORRECT)
        if session != self.session:
            self.unlocked = False
            self.seed_outstanding = False
        self.session = session
        return bytes((0x50, session, 0x00, 0x32, 0x01, 0xF4))  # P2 50 ms, P2* 5000 ms

    def _service_11(self, request: bytes, now: float) -> bytes:
        """ECUReset: 0x01 hardReset, 0x03 softReset; resets session and security."""
        if len(request) != 2:
            return _negative(0x11, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        kind = request[1] & 0x7F
        if kind not in (0x01, 0x03):
            return _negative(0x11, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        self.reset()
        return bytes((0x51, kind))

    def _service_14(self, request: bytes, now: float) -> bytes:
        """ClearDiagnosticInformation: only groupOfDTC 0xFFFFFF (all groups)."""
        if len(request) != 4:
            return _negative(0x14, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if request[1:4] != b"\xff\xff\xff":
            return _negative(0x14, NRC_REQUEST_OUT_OF_RANGE)
        return b"\x54"

    def _service_19(self, request: bytes, now: float) -> bytes:
        """ReadDTCInformation: 0x01 reportNumberOfDTCByStatusMask, 0x02 reportDTCByStatusMask."""
        if len(request) < 2:
            return _negative(0x19, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        report = request[1] & 0x7F
        if report not in (0x01, 0x02):
            return _negative(0x19, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        if len(request) != 3:
            return _negative(0x19, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        mask = request[2]
        matching = [(dtc, status) for dtc, status in self.profile.dtcs if status & mask]
        availability = 0xFF
        if report == 0x01:
            # format identifier 0x01 = ISO 14229-1 DTC format
            return bytes((0x59, 0x01, availability, 0x01)) + len(matching).to_bytes(2, "big")
        records = b"".join(dtc.to_bytes(3, "big") + bytes((status,)) for dtc, status in matching)
        return bytes((0x59, 0x02, availability)) + records

    def _service_22(self, request: bytes, now: float) -> bytes:
        """ReadDataByIdentifier: one or more 2-byte DIDs."""
        body = request[1:]
        if not body or len(body) % 2:
            return _negative(0x22, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        out = bytearray(b"\x62")
        for index in range(0, len(body), 2):
            did = int.from_bytes(body[index:index + 2], "big")
            if did == 0xF186:
                value = bytes((self.session,))
            elif did in self.dids:
                value = self.dids[did]
            else:
                return _negative(0x22, NRC_REQUEST_OUT_OF_RANGE)
            out += body[index:index + 2] + value
        return bytes(out)

    def _service_27(self, request: bytes, now: float) -> bytes:
        """SecurityAccess level 1: 0x01 requestSeed, 0x02 sendKey (see EcuProfile)."""
        if len(request) < 2:
            return _negative(0x27, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        level = request[1]
        if level not in (0x01, 0x02):
            return _negative(0x27, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        key_length = len(self.profile.security_key)
        if len(request) != (2 if level == 0x01 else 2 + key_length):
            return _negative(0x27, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if now < self.locked_until:
            return _negative(0x27, NRC_REQUIRED_TIME_DELAY_NOT_EXPIRED)
        if level == 0x01:
            if self.unlocked:  # ISO 14229-1: an unlocked server answers with an all-zero seed
                return b"\x67\x01" + bytes(len(self.profile.security_seed))
            self.seed_outstanding = True
            return b"\x67\x01" + self.profile.security_seed
        if not self.seed_outstanding:
            return _negative(0x27, NRC_REQUEST_SEQUENCE_ERROR)
        if request[2:] == self.profile.security_key:
            self.unlocked = True
            self.seed_outstanding = False
            self.failed_attempts = 0
            return b"\x67\x02"
        # A wrong key keeps the seed valid (the simulator's choice) until the
        # attempts run out; then the seed is void and a lock-out begins.
        self.failed_attempts += 1
        if self.failed_attempts >= self.profile.security_max_attempts:
            self.failed_attempts = 0
            self.seed_outstanding = False
            self.locked_until = now + self.profile.security_lockout
            return _negative(0x27, NRC_EXCEEDED_NUMBER_OF_ATTEMPTS)
        return _negative(0x27, NRC_INVALID_KEY)

    def _service_28(self, request: bytes, now: float) -> bytes:
        """CommunicationControl: control type 0x00-0x03 plus a communication type byte."""
        if len(request) < 2:
            return _negative(0x28, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        control = request[1] & 0x7F
        if control > 0x03:
            return _negative(0x28, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        if len(request) != 3:
            return _negative(0x28, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if request[2] & 0x03 == 0:
            return _negative(0x28, NRC_REQUEST_OUT_OF_RANGE)
        return bytes((0x68, control))

    def _service_2e(self, request: bytes, now: float) -> bytes:
        """WriteDataByIdentifier: DID + record; only ``writable_dids``, only when unlocked."""
        if len(request) < 4:
            return _negative(0x2E, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        did = int.from_bytes(request[1:3], "big")
        if did not in self.profile.writable_dids:
            return _negative(0x2E, NRC_REQUEST_OUT_OF_RANGE)
        if not self.unlocked:
            return _negative(0x2E, NRC_SECURITY_ACCESS_DENIED)
        self.dids[did] = bytes(request[3:])
        return b"\x6e" + request[1:3]

    def _service_31(self, request: bytes, now: float) -> bytes:
        """RoutineControl: 0x01 start, 0x02 stop, 0x03 requestResults of a 2-byte routine id."""
        if len(request) < 4:
            return _negative(0x31, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        control = request[1]
        if control not in (0x01, 0x02, 0x03):
            return _negative(0x31, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        rid = int.from_bytes(request[2:4], "big")
        outcome = self.profile.routines.get(rid)
        if outcome is None:
            return _negative(0x31, NRC_REQUEST_OUT_OF_RANGE)
        if rid in self.profile.secured_routines and not self.unlocked:
            return _negative(0x31, NRC_SECURITY_ACCESS_DENIED)
        if isinstance(outcome, int):
            return _negative(0x31, outcome)
        if control == 0x01:
            self.started_routines.add(rid)
            return bytes((0x71, control)) + request[2:4] + outcome
        if rid not in self.started_routines:
            return _negative(0x31, NRC_REQUEST_SEQUENCE_ERROR)
        if control == 0x02:
            self.started_routines.discard(rid)
        return bytes((0x71, control)) + request[2:4] + outcome

    def _service_3e(self, request: bytes, now: float) -> bytes:
        """TesterPresent: zeroSubFunction only."""
        if len(request) != 2:
            return _negative(0x3E, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if request[1] & 0x7F != 0x00:
            return _negative(0x3E, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        return b"\x7e\x00"

    def _service_85(self, request: bytes, now: float) -> bytes:
        """ControlDTCSetting: 0x01 on, 0x02 off."""
        if len(request) < 2:
            return _negative(0x85, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        setting = request[1] & 0x7F
        if setting not in (0x01, 0x02):
            return _negative(0x85, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        return bytes((0xC5, setting))


class EcuNode:
    """One simulated ECU on a shared bus: its addresses, its UDS state, and what crossed the bus for it.

    ``request_id`` / ``response_id``: physical request and response arbitration
    IDs (29-bit when > 0x7FF); ``profile``: :class:`EcuProfile`; ``name``: a
    label. Readable while it runs: ``requests`` (data of every frame received
    on the request ID, ``list[bytes]``), ``messages`` (reassembled UDS
    requests), ``responses`` (data of every frame sent), ``server`` (the UDS
    state machine). Frames go out through the bus that hosts it
    (:class:`SimulatedEcu`, :class:`SimulatedNetwork`).
    """

    def __init__(self, request_id: int = 0x7E0, response_id: int | None = None, profile: EcuProfile | None = None,
                 name: str | None = None) -> None:
        self.request_id = request_id
        self.response_id = request_id + 8 if response_id is None else response_id
        self.profile = EcuProfile() if profile is None else profile
        self.name = name or f"ecu-0x{request_id:X}"
        self.requests: list[bytes] = []
        self.messages: list[bytes] = []
        self.responses: list[bytes] = []
        self.server = _UdsServer(self.profile)
        self._host: _BusHost | None = None
        self._rx: dict[str, Any] | None = None   # segmented request being received
        self._tx: dict[str, Any] | None = None   # segmented response being sent

    @property
    def busy(self) -> bool:
        """True while a segmented response waits for the tester's flow control or is being sent."""
        return self._tx is not None

    # -- ISO-TP reception --

    def on_message(self, message: Any) -> None:
        """Take one frame seen on the bus (any ID)."""
        if message.arbitration_id != self.request_id or message.is_extended_id != (self.request_id > 0x7FF):
            return
        if message.is_remote_frame or message.is_error_frame:
            return
        data = bytes(message.data)
        self.requests.append(data)
        if not data or self.profile.silent:
            return
        kind = data[0] >> 4
        if kind == PCI_SINGLE:
            self._on_single_frame(data)
        elif kind == PCI_FIRST:
            self._on_first_frame(data)
        elif kind == PCI_CONSECUTIVE:
            self._on_consecutive_frame(data)
        elif kind == PCI_FLOW_CONTROL:
            self._on_flow_control(data)
        # other PCI types are reserved: ignored (ISO 15765-2)

    def _on_single_frame(self, data: bytes) -> None:
        payload = single_frame_payload(data)
        if payload is None or (len(data) > CLASSIC_FRAME and len(payload) <= SF_MAX and data[0] & 0x0F == 0):
            return  # invalid SF_DL (an FD escape must carry more than a classic frame could): ignored
        self._rx = None  # a new single frame ends a reception in progress
        self._on_request(payload)

    def _on_first_frame(self, data: bytes) -> None:
        length = ((data[0] & 0x0F) << 8) | data[1] if len(data) >= 2 else 0
        if len(data) != CLASSIC_FRAME or length <= SF_MAX:
            return  # a first frame uses the whole frame and more than a single frame holds
        self._tx = None  # a new request cancels a response still being sent
        self._rx = {"length": length, "data": bytearray(data[2:]), "sn": 1, "block": 0,
                    "deadline": time.monotonic() + self.profile.n_timeout}
        self._send_frame(self._flow_control())

    def _flow_control(self) -> bytes:
        return flow_control(FLOW_STATUS_CONTINUE, self.profile.block_size, self.profile.st_min, padding=None)

    def _on_consecutive_frame(self, data: bytes) -> None:
        rx = self._rx
        if rx is None:
            return
        if time.monotonic() > rx["deadline"] or data[0] & 0x0F != rx["sn"]:
            self._rx = None  # N_Cr timeout or wrong sequence number: reception aborted
            return
        rx["data"] += data[1:]
        rx["sn"] = (rx["sn"] + 1) & 0x0F
        rx["deadline"] = time.monotonic() + self.profile.n_timeout
        if len(rx["data"]) >= rx["length"]:
            self._rx = None
            self._on_request(bytes(rx["data"][:rx["length"]]))
            return
        rx["block"] += 1
        if self.profile.block_size and rx["block"] >= self.profile.block_size:
            rx["block"] = 0
            self._send_frame(self._flow_control())

    def _on_flow_control(self, data: bytes) -> None:
        tx = self._tx
        if tx is None or not tx["awaiting_fc"]:
            return
        if time.monotonic() > tx["deadline"]:
            self._tx = None  # N_Bs timeout: transmission aborted
            return
        status = data[0] & 0x0F
        if status == FLOW_STATUS_WAIT:
            tx["deadline"] = time.monotonic() + self.profile.n_timeout
            return
        if status != FLOW_STATUS_CONTINUE or len(data) < 3:
            self._tx = None  # overflow or invalid flow status: abort
            return
        tx["awaiting_fc"] = False
        tx["block_size"] = data[1]
        tx["st_min"] = st_min_seconds(data[2])
        tx["sent_in_block"] = 0
        self._send_next_consecutive(tx)

    # -- UDS and ISO-TP transmission --

    def _on_request(self, payload: bytes) -> None:
        self.messages.append(payload)
        for reply in self.server.handle(payload, time.monotonic()):
            if reply.delay > 0:
                self._host.after(reply.delay, lambda p=reply.payload: self._send_payload(p))
            else:
                self._send_payload(reply.payload)

    def _send_payload(self, payload: bytes) -> None:
        if len(payload) <= SF_MAX:
            self._send_frame(bytes((len(payload),)) + payload)
            return
        if len(payload) > FF_MAX_LENGTH:
            _log.warning("simulated ECU: %d-byte response does not fit ISO-TP; dropped", len(payload))
            return
        self._send_frame(bytes((0x10 | (len(payload) >> 8), len(payload) & 0xFF)) + payload[:FF_DATA])
        self._tx = {"payload": payload, "offset": FF_DATA, "sn": 1, "awaiting_fc": True,
                    "deadline": time.monotonic() + self.profile.n_timeout}

    def _send_next_consecutive(self, tx: dict[str, Any]) -> None:
        if self._tx is not tx:
            return  # cancelled by a newer request
        payload = tx["payload"]
        chunk = payload[tx["offset"]:tx["offset"] + CF_DATA]
        self._send_frame(bytes((0x20 | tx["sn"],)) + chunk)
        tx["offset"] += len(chunk)
        tx["sn"] = (tx["sn"] + 1) & 0x0F
        tx["sent_in_block"] += 1
        if tx["offset"] >= len(payload):
            self._tx = None
            return
        if tx["block_size"] and tx["sent_in_block"] >= tx["block_size"]:
            tx["awaiting_fc"] = True
            tx["deadline"] = time.monotonic() + self.profile.n_timeout
            return
        if tx["st_min"] > 0:
            self._host.after(tx["st_min"], lambda: self._send_next_consecutive(tx))
        else:
            self._send_next_consecutive(tx)

    def _send_frame(self, data: bytes) -> None:
        if self.profile.padding is not None and len(data) < CLASSIC_FRAME:
            data = data + bytes((self.profile.padding,)) * (CLASSIC_FRAME - len(data))
        self._host.send(self.response_id, data)
        self.responses.append(data)


class _BusHost:
    """One python-can bus and the thread that serves the :class:`EcuNode` objects on it.

    Opens its bus with ``ignore_config=True``; on :meth:`stop` it stops the
    thread, joins it and shuts the bus down. ``error``: an exception that
    ended the thread, or None.
    """

    def __init__(self, bus_type: str, channel: str, nodes: Sequence[EcuNode],
                 bus_options: dict[str, Any] | None = None) -> None:
        self.bus_type = bus_type
        self.channel = channel
        self.bus_options = dict(bus_options or {})
        self.nodes = list(nodes)
        for node in self.nodes:
            node._host = self
        self.error: BaseException | None = None
        self._bus: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_order = itertools.count()

    # -- lifecycle --

    def start(self) -> _BusHost:
        """Open the bus and start answering. Idempotent. Raises whatever python-can raises."""
        if self._bus is not None:
            return self
        import can

        self._bus = can.Bus(channel=self.channel, interface=self.bus_type, ignore_config=True, **self.bus_options)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"SimulatedEcu-{self.channel}", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._bus.shutdown()
            self._bus = None
            raise
        return self

    def stop(self) -> None:
        """Stop the thread, join it, and shut the bus down. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._bus is not None:
            bus, self._bus = self._bus, None
            bus.shutdown()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the answering thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def busy(self) -> bool:
        """True while an answer is still to go out: a delayed or pending reply,
        or a segmented response waiting for the tester's flow control."""
        return bool(self._timers) or any(node.busy for node in self.nodes)

    # -- the loop --

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._fire_due_timers()
                wait = 0.02
                if self._timers:
                    wait = max(0.0, min(wait, self._timers[0][0] - time.monotonic()))
                message = self._bus.recv(timeout=wait)
                if message is not None:
                    for node in self.nodes:
                        node.on_message(message)
        except BaseException as exc:  # recorded for the test; the bus is still shut down by stop()
            self.error = exc
            _log.exception("simulated ECU on %s stopped", self.channel)

    def after(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` on the bus thread ``delay`` seconds from now."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_order), action))

    def _fire_due_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _due, _order, action = heapq.heappop(self._timers)
            action()

    def send(self, arbitration_id: int, data: bytes) -> None:
        """Transmit one classic CAN frame (29-bit when ``arbitration_id`` > 0x7FF)."""
        import can

        self._bus.send(can.Message(arbitration_id=arbitration_id, data=data, is_extended_id=arbitration_id > 0x7FF,
                                   is_fd=False))


class SimulatedEcu(_BusHost):
    """One UDS ECU on its own python-can bus, answering in a background thread.

    ``bus_type``: python-can interface name (``virtual`` in tests);
    ``channel``: the channel to open (a unique name per test on ``virtual``);
    ``request_id`` / ``response_id``: physical request and response
    arbitration IDs (29-bit when > 0x7FF); ``profile``: :class:`EcuProfile`.

    Use as a context manager (or ``start()`` / ``stop()``). ``requests``,
    ``messages``, ``responses``, ``server`` and ``profile`` are those of its
    :class:`EcuNode` (``node``); ``error``: an exception that ended the thread.

    Raises whatever python-can raises when the bus cannot be opened.
    """

    def __init__(self, bus_type: str = "virtual", channel: str = "canarchy-sim", request_id: int = 0x7E0,
                 response_id: int | None = None, profile: EcuProfile | None = None,
                 bus_options: dict[str, Any] | None = None) -> None:
        self.node = EcuNode(request_id, response_id, profile)
        super().__init__(bus_type, channel, [self.node], bus_options)

    request_id = property(lambda self: self.node.request_id)
    response_id = property(lambda self: self.node.response_id)
    profile = property(lambda self: self.node.profile)
    server = property(lambda self: self.node.server)
    requests = property(lambda self: self.node.requests)
    messages = property(lambda self: self.node.messages)
    responses = property(lambda self: self.node.responses)


class SimulatedNetwork(_BusHost):
    """Several ECUs (:class:`EcuNode`) on one python-can bus, served by one thread::

        with SimulatedNetwork(channel, [EcuNode(0x7E0), EcuNode(0x7E1, profile=EcuProfile(silent=True))]) as net:
            ...
        net.ecus[1].requests     # what reached the silent one

    ``ecus``: the nodes, in the order given. Their request IDs must differ.
    Raises ValueError for two ECUs on one request ID, and whatever python-can
    raises when the bus cannot be opened.
    """

    def __init__(self, channel: str, ecus: Sequence[EcuNode], bus_type: str = "virtual",
                 bus_options: dict[str, Any] | None = None) -> None:
        ids = [node.request_id for node in ecus]
        if len(set(ids)) != len(ids):
            raise ValueError(f"two simulated ECUs share a request ID: {sorted(ids)}")
        super().__init__(bus_type, channel, ecus, bus_options)

    @property
    def ecus(self) -> list[EcuNode]:
        return self.nodes


def _int_auto(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r} (use 0x7E0 or 2016)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run a simulated ECU as a process until SIGINT/SIGTERM or ``--duration`` seconds.

    Prints one JSON line ``{"event": "ready", ...}`` on stdout once the bus is
    open and one ``{"event": "stopped", "requests": N, ...}`` at the end.
    Returns 0, or 2 when the bus cannot be opened.
    """
    parser = argparse.ArgumentParser(prog="python -m canarchy.simulator",
                                     description="Simulated UDS ECU (ISO 14229-1 over ISO 15765-2).")
    parser.add_argument("--bus-type", default="virtual", help="python-can interface name (default: virtual)")
    parser.add_argument("--channel", required=True, help="channel to open (a multicast group for udp_multicast)")
    parser.add_argument("--request-id", type=_int_auto, default=0x7E0, help="request arbitration ID (0x7E0)")
    parser.add_argument("--response-id", type=_int_auto, default=None,
                        help="response arbitration ID (default: request ID + 8)")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--no-padding", action="store_true", help="send frames unpadded (DLC = used bytes)")
    args = parser.parse_args(argv)
    profile = EcuProfile(padding=None) if args.no_padding else EcuProfile()
    from canarchy.commands._common import StopSignals

    ecu = SimulatedEcu(bus_type=args.bus_type, channel=args.channel, request_id=args.request_id,
                       response_id=args.response_id, profile=profile)
    with StopSignals() as stop:
        try:
            try:
                ecu.start()
            except Exception as exc:
                print(json.dumps({"event": "error", "message": f"cannot open {args.bus_type} {args.channel}: {exc}"}),
                      flush=True)
                return 2
            print(json.dumps({"event": "ready", "bus_type": args.bus_type, "channel": args.channel,
                              "request_id": ecu.request_id, "response_id": ecu.response_id}), flush=True)
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while stop.name is None and ecu.running:
                remaining = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if remaining <= 0:
                    break
                stop.wait(remaining)
        finally:
            ecu.stop()
    print(json.dumps({"event": "stopped", "requests": len(ecu.requests), "responses": len(ecu.responses),
                      "error": None if ecu.error is None else repr(ecu.error)}), flush=True)
    return 0 if ecu.error is None else 2


if __name__ == "__main__":
    sys.exit(main())
