"""The simulated ECU's UDS server (ISO 14229-1): what it supports, and how it answers a request.

:class:`EcuProfile` says which services, sessions, DIDs, routines, security access and timings the ECU has;
the server turns one reassembled request into its replies, with no I/O and no threads (the bus side is
:mod:`canarchy.simulator`). Timing terms (P2server, S3server, responsePending) are ISO 14229-2's.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from collections.abc import Callable

from canarchy.uds import (DID_ACTIVE_SESSION, DID_VIN, NEGATIVE_RESPONSE_SID, NRC_CONDITIONS_NOT_CORRECT,
                          NRC_EXCEEDED_NUMBER_OF_ATTEMPTS, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT,
                          NRC_INVALID_KEY, NRC_REQUEST_OUT_OF_RANGE, NRC_REQUEST_SEQUENCE_ERROR,
                          NRC_REQUIRED_TIME_DELAY_NOT_EXPIRED, NRC_RESPONSE_PENDING, NRC_SECURITY_ACCESS_DENIED,
                          NRC_SERVICE_NOT_SUPPORTED, NRC_SERVICE_NOT_SUPPORTED_IN_ACTIVE_SESSION,
                          NRC_SUB_FUNCTION_NOT_SUPPORTED, POSITIVE_RESPONSE_OFFSET, SESSION_DEFAULT,
                          SESSION_EXTENDED, SESSION_PROGRAMMING, SID_CLEAR_DIAGNOSTIC_INFORMATION,
                          SID_COMMUNICATION_CONTROL, SID_CONTROL_DTC_SETTING, SID_DIAGNOSTIC_SESSION_CONTROL,
                          SID_ECU_RESET, SID_READ_DATA_BY_IDENTIFIER, SID_READ_DTC_INFORMATION, SID_ROUTINE_CONTROL,
                          SID_SECURITY_ACCESS, SID_TESTER_PRESENT, SID_WRITE_DATA_BY_IDENTIFIER,
                          SUPPRESS_POSITIVE_RESPONSE)

# Services whose sub-function byte carries the suppressPosRspMsgIndicationBit (ISO 14229-1 §8.2.2).
_SPRMIB_SERVICES = frozenset({SID_DIAGNOSTIC_SESSION_CONTROL, SID_ECU_RESET, SID_COMMUNICATION_CONTROL,
                               SID_TESTER_PRESENT, SID_CONTROL_DTC_SETTING})


DEFAULT_VIN = "TMBZZZ0X0NY000001"


def _default_dids() -> dict[int, bytes]:
    # DIDs from ISO 14229-1 Table C.1 (0xF186 is answered from the live session).
    return {
        0xF187: b"SIM-0001",          # vehicleManufacturerSparePartNumber
        0xF18C: b"SIM0000001",        # ECUSerialNumber
        DID_VIN: DEFAULT_VIN.encode(),  # VIN, 17 bytes: needs a segmented response
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
        {SID_DIAGNOSTIC_SESSION_CONTROL, SID_ECU_RESET, SID_CLEAR_DIAGNOSTIC_INFORMATION, SID_READ_DTC_INFORMATION,
         SID_READ_DATA_BY_IDENTIFIER, SID_SECURITY_ACCESS, SID_COMMUNICATION_CONTROL, SID_WRITE_DATA_BY_IDENTIFIER,
         SID_ROUTINE_CONTROL, SID_TESTER_PRESENT, SID_CONTROL_DTC_SETTING})
    session_sids: dict[int, frozenset[int]] = field(default_factory=lambda: {
        SID_COMMUNICATION_CONTROL: frozenset({SESSION_EXTENDED, SESSION_PROGRAMMING}),
        SID_WRITE_DATA_BY_IDENTIFIER: frozenset({SESSION_EXTENDED}),
        SID_CONTROL_DTC_SETTING: frozenset({SESSION_EXTENDED, SESSION_PROGRAMMING}),
    })
    forced_nrcs: dict[int, int] = field(default_factory=dict)
    pending: dict[int, float] = field(default_factory=lambda: {SID_ECU_RESET: 0.05})
    response_delays: dict[int, float] = field(default_factory=lambda: {SID_CLEAR_DIAGNOSTIC_INFORMATION: 0.08})
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


def _positive(sid: int, *fields: int) -> bytes:
    """A positive response's first bytes: the SID + 0x40, then ``fields``."""
    return bytes((sid + POSITIVE_RESPONSE_OFFSET, *fields))


def _sub_function(request: bytes) -> int:
    """The sub-function of a request, without the suppressPosRspMsgIndicationBit."""
    return request[1] & ~SUPPRESS_POSITIVE_RESPONSE


def _negative(sid: int, nrc: int) -> bytes:
    return bytes((NEGATIVE_RESPONSE_SID, sid, nrc))


#: How often a server repeats responsePending while it works: before the tester's P2*server (5 s, what
#: DiagnosticSessionControl announces) runs out, as ISO 14229-2 asks of a server.
PENDING_REPEAT_S = 4.0


@dataclass
class _Reply:
    """One UDS response to send after ``delay`` seconds."""

    payload: bytes
    delay: float = 0.0


class UdsServer:
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
        #: SID -> the handler of that service: it returns the response, or None to stay silent.
        self._handlers: dict[int, Callable[[bytes, float], bytes | None]] = {
            SID_DIAGNOSTIC_SESSION_CONTROL: self._diagnostic_session_control,
            SID_ECU_RESET: self._ecu_reset,
            SID_CLEAR_DIAGNOSTIC_INFORMATION: self._clear_diagnostic_information,
            SID_READ_DTC_INFORMATION: self._read_dtc_information,
            SID_READ_DATA_BY_IDENTIFIER: self._read_data_by_identifier,
            SID_SECURITY_ACCESS: self._security_access,
            SID_COMMUNICATION_CONTROL: self._communication_control,
            SID_WRITE_DATA_BY_IDENTIFIER: self._write_data_by_identifier,
            SID_ROUTINE_CONTROL: self._routine_control,
            SID_TESTER_PRESENT: self._tester_present,
            SID_CONTROL_DTC_SETTING: self._control_dtc_setting,
        }

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
        handler = self._handlers.get(sid, self._bare_positive)
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
            delay = self.profile.pending[sid]  # a 0x78 at once, and again each PENDING_REPEAT_S until the answer
            count = max(1, math.ceil(delay / PENDING_REPEAT_S))
            pending = [_Reply(_negative(sid, NRC_RESPONSE_PENDING), index * PENDING_REPEAT_S) for index in range(count)]
            return [*pending, _Reply(response, delay)]
        return [_Reply(response, self.profile.response_delays.get(sid, 0.0))]

    def _bare_positive(self, request: bytes, now: float) -> bytes:
        """A supported service with no handler here: the bare positive response, the sub-function echoed."""
        return _positive(request[0]) + request[1:2]

    def _diagnostic_session_control(self, request: bytes, now: float) -> bytes:
        """DiagnosticSessionControl: 50 session P2(2 bytes, ms) P2*(2 bytes, 10 ms)."""
        if len(request) != 2:
            return _negative(SID_DIAGNOSTIC_SESSION_CONTROL, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        session = _sub_function(request)
        if session not in (SESSION_DEFAULT, SESSION_PROGRAMMING, SESSION_EXTENDED):
            return _negative(SID_DIAGNOSTIC_SESSION_CONTROL, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        if session == SESSION_PROGRAMMING and self.session == SESSION_DEFAULT:
            return _negative(SID_DIAGNOSTIC_SESSION_CONTROL, NRC_CONDITIONS_NOT_CORRECT)
        if session != self.session:
            self.unlocked = False
            self.seed_outstanding = False
        self.session = session
        return _positive(SID_DIAGNOSTIC_SESSION_CONTROL, session, 0x00, 0x32, 0x01, 0xF4)  # P2 50 ms, P2* 5000 ms

    def _ecu_reset(self, request: bytes, now: float) -> bytes:
        """ECUReset: 0x01 hardReset, 0x03 softReset; resets session and security."""
        if len(request) != 2:
            return _negative(SID_ECU_RESET, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        kind = _sub_function(request)
        if kind not in (0x01, 0x03):
            return _negative(SID_ECU_RESET, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        self.reset()
        return _positive(SID_ECU_RESET, kind)

    def _clear_diagnostic_information(self, request: bytes, now: float) -> bytes:
        """ClearDiagnosticInformation: only groupOfDTC 0xFFFFFF (all groups)."""
        if len(request) != 4:
            return _negative(SID_CLEAR_DIAGNOSTIC_INFORMATION, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if request[1:4] != b"\xff\xff\xff":
            return _negative(SID_CLEAR_DIAGNOSTIC_INFORMATION, NRC_REQUEST_OUT_OF_RANGE)
        return _positive(SID_CLEAR_DIAGNOSTIC_INFORMATION)

    def _read_dtc_information(self, request: bytes, now: float) -> bytes:
        """ReadDTCInformation: 0x01 reportNumberOfDTCByStatusMask, 0x02 reportDTCByStatusMask."""
        if len(request) < 2:
            return _negative(SID_READ_DTC_INFORMATION, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        report = _sub_function(request)
        if report not in (0x01, 0x02):
            return _negative(SID_READ_DTC_INFORMATION, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        if len(request) != 3:
            return _negative(SID_READ_DTC_INFORMATION, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        mask = request[2]
        matching = [(dtc, status) for dtc, status in self.profile.dtcs if status & mask]
        availability = 0xFF
        if report == 0x01:
            # format identifier 0x01 = ISO 14229-1 DTC format
            return _positive(SID_READ_DTC_INFORMATION, 0x01, availability, 0x01) + len(matching).to_bytes(2, "big")
        records = b"".join(dtc.to_bytes(3, "big") + bytes((status,)) for dtc, status in matching)
        return _positive(SID_READ_DTC_INFORMATION, 0x02, availability) + records

    def _read_data_by_identifier(self, request: bytes, now: float) -> bytes:
        """ReadDataByIdentifier: one or more 2-byte DIDs."""
        body = request[1:]
        if not body or len(body) % 2:
            return _negative(SID_READ_DATA_BY_IDENTIFIER, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        out = bytearray(_positive(SID_READ_DATA_BY_IDENTIFIER))
        for index in range(0, len(body), 2):
            did = int.from_bytes(body[index:index + 2], "big")
            if did == DID_ACTIVE_SESSION:
                value = bytes((self.session,))
            elif did in self.dids:
                value = self.dids[did]
            else:
                return _negative(SID_READ_DATA_BY_IDENTIFIER, NRC_REQUEST_OUT_OF_RANGE)
            out += body[index:index + 2] + value
        return bytes(out)

    def _security_access(self, request: bytes, now: float) -> bytes:
        """SecurityAccess level 1: 0x01 requestSeed, 0x02 sendKey (see EcuProfile)."""
        if len(request) < 2:
            return _negative(SID_SECURITY_ACCESS, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        level = request[1]
        if level not in (0x01, 0x02):
            return _negative(SID_SECURITY_ACCESS, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        key_length = len(self.profile.security_key)
        if len(request) != (2 if level == 0x01 else 2 + key_length):
            return _negative(SID_SECURITY_ACCESS, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if now < self.locked_until:
            return _negative(SID_SECURITY_ACCESS, NRC_REQUIRED_TIME_DELAY_NOT_EXPIRED)
        if level == 0x01:
            if self.unlocked:  # ISO 14229-1: an unlocked server answers with an all-zero seed
                return _positive(SID_SECURITY_ACCESS, 0x01) + bytes(len(self.profile.security_seed))
            self.seed_outstanding = True
            return _positive(SID_SECURITY_ACCESS, 0x01) + self.profile.security_seed
        if not self.seed_outstanding:
            return _negative(SID_SECURITY_ACCESS, NRC_REQUEST_SEQUENCE_ERROR)
        if request[2:] == self.profile.security_key:
            self.unlocked = True
            self.seed_outstanding = False
            self.failed_attempts = 0
            return _positive(SID_SECURITY_ACCESS, 0x02)
        # A wrong key keeps the seed valid (the simulator's choice) until the
        # attempts run out; then the seed is void and a lock-out begins.
        self.failed_attempts += 1
        if self.failed_attempts >= self.profile.security_max_attempts:
            self.failed_attempts = 0
            self.seed_outstanding = False
            self.locked_until = now + self.profile.security_lockout
            return _negative(SID_SECURITY_ACCESS, NRC_EXCEEDED_NUMBER_OF_ATTEMPTS)
        return _negative(SID_SECURITY_ACCESS, NRC_INVALID_KEY)

    def _communication_control(self, request: bytes, now: float) -> bytes:
        """CommunicationControl: control type 0x00-0x03 plus a communication type byte."""
        if len(request) < 2:
            return _negative(SID_COMMUNICATION_CONTROL, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        control = _sub_function(request)
        if control > 0x03:
            return _negative(SID_COMMUNICATION_CONTROL, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        if len(request) != 3:
            return _negative(SID_COMMUNICATION_CONTROL, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if request[2] & 0x03 == 0:
            return _negative(SID_COMMUNICATION_CONTROL, NRC_REQUEST_OUT_OF_RANGE)
        return _positive(SID_COMMUNICATION_CONTROL, control)

    def _write_data_by_identifier(self, request: bytes, now: float) -> bytes:
        """WriteDataByIdentifier: DID + record; only ``writable_dids``, only when unlocked."""
        if len(request) < 4:
            return _negative(SID_WRITE_DATA_BY_IDENTIFIER, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        did = int.from_bytes(request[1:3], "big")
        if did not in self.profile.writable_dids:
            return _negative(SID_WRITE_DATA_BY_IDENTIFIER, NRC_REQUEST_OUT_OF_RANGE)
        if not self.unlocked:
            return _negative(SID_WRITE_DATA_BY_IDENTIFIER, NRC_SECURITY_ACCESS_DENIED)
        self.dids[did] = bytes(request[3:])
        return _positive(SID_WRITE_DATA_BY_IDENTIFIER) + request[1:3]

    def _routine_control(self, request: bytes, now: float) -> bytes:
        """RoutineControl: 0x01 start, 0x02 stop, 0x03 requestResults of a 2-byte routine id."""
        if len(request) < 4:
            return _negative(SID_ROUTINE_CONTROL, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        control = request[1]
        if control not in (0x01, 0x02, 0x03):
            return _negative(SID_ROUTINE_CONTROL, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        rid = int.from_bytes(request[2:4], "big")
        outcome = self.profile.routines.get(rid)
        if outcome is None:
            return _negative(SID_ROUTINE_CONTROL, NRC_REQUEST_OUT_OF_RANGE)
        if rid in self.profile.secured_routines and not self.unlocked:
            return _negative(SID_ROUTINE_CONTROL, NRC_SECURITY_ACCESS_DENIED)
        if isinstance(outcome, int):
            return _negative(SID_ROUTINE_CONTROL, outcome)
        if control == 0x01:
            self.started_routines.add(rid)
            return _positive(SID_ROUTINE_CONTROL, control) + request[2:4] + outcome
        if rid not in self.started_routines:
            return _negative(SID_ROUTINE_CONTROL, NRC_REQUEST_SEQUENCE_ERROR)
        if control == 0x02:
            self.started_routines.discard(rid)
        return _positive(SID_ROUTINE_CONTROL, control) + request[2:4] + outcome

    def _tester_present(self, request: bytes, now: float) -> bytes:
        """TesterPresent: zeroSubFunction only."""
        if len(request) != 2:
            return _negative(SID_TESTER_PRESENT, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        if _sub_function(request) != 0x00:
            return _negative(SID_TESTER_PRESENT, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        return _positive(SID_TESTER_PRESENT, 0x00)

    def _control_dtc_setting(self, request: bytes, now: float) -> bytes:
        """ControlDTCSetting: 0x01 on, 0x02 off."""
        if len(request) < 2:
            return _negative(SID_CONTROL_DTC_SETTING, NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT)
        setting = _sub_function(request)
        if setting not in (0x01, 0x02):
            return _negative(SID_CONTROL_DTC_SETTING, NRC_SUB_FUNCTION_NOT_SUPPORTED)
        return _positive(SID_CONTROL_DTC_SETTING, setting)
