"""UDS (ISO 14229-1) reference data: the diagnostic service catalog and NRC names.

Pure data and pure functions; no transport, no python-can.

Sources: ISO 14229-1:2020, §8 and Table 2 (service identifiers; a positive
response SID is the request SID + 0x40), Annex A Table A.1 (negative response
codes); a negative response is ``7F <SID> <NRC>``.
"""

from __future__ import annotations

from dataclasses import dataclass

POSITIVE_RESPONSE_OFFSET = 0x40
NEGATIVE_RESPONSE_SID = 0x7F
NRC_SERVICE_NOT_SUPPORTED = 0x11
NRC_RESPONSE_PENDING = 0x78


@dataclass(frozen=True)
class UdsService:
    """One diagnostic service: ``sid`` (request SID), ``name``, ``category``,
    ``requires_subfunction`` (the request carries a sub-function byte) and
    ``probe_subfunction``: the sub-function a discovery probe sends, set only
    where the request has no side effect (0x10 0x01 defaultSession, 0x27 0x01
    requestSeed, 0x3E 0x00 zeroSubFunction; ISO 14229-1). Every other service
    is probed with its SID alone, which a server that supports it rejects by
    length (NRC 0x13) without executing anything: discovery never resets an
    ECU, disables communication or DTC setting, starts a routine or writes."""

    sid: int
    name: str
    category: str
    requires_subfunction: bool
    probe_subfunction: int | None = None

    @property
    def positive_response_sid(self) -> int:
        """Positive response SID (request SID + 0x40, ISO 14229-1)."""
        return self.sid + POSITIVE_RESPONSE_OFFSET

    def to_dict(self) -> dict:
        """JSON form used by ``uds services``: ``service`` and
        ``positive_response_service`` are upper-case hex strings such as ``"0x10"``."""
        return {
            "service": f"0x{self.sid:02X}",
            "name": self.name,
            "positive_response_service": f"0x{self.positive_response_sid:02X}",
            "category": self.category,
            "requires_subfunction": self.requires_subfunction,
        }


# ISO 14229-1 services, in SID order.
SERVICES: tuple[UdsService, ...] = (
    UdsService(0x10, "DiagnosticSessionControl", "session", True, 0x01),
    UdsService(0x11, "ECUReset", "session", True),
    UdsService(0x14, "ClearDiagnosticInformation", "diagnostics", False),
    UdsService(0x19, "ReadDTCInformation", "diagnostics", True),
    UdsService(0x22, "ReadDataByIdentifier", "data", False),
    UdsService(0x23, "ReadMemoryByAddress", "data", False),
    UdsService(0x27, "SecurityAccess", "security", True, 0x01),
    UdsService(0x28, "CommunicationControl", "communication", True),
    UdsService(0x2E, "WriteDataByIdentifier", "data", False),
    UdsService(0x2F, "InputOutputControlByIdentifier", "control", False),
    UdsService(0x31, "RoutineControl", "control", True),
    UdsService(0x34, "RequestDownload", "transfer", False),
    UdsService(0x35, "RequestUpload", "transfer", False),
    UdsService(0x36, "TransferData", "transfer", False),
    UdsService(0x37, "RequestTransferExit", "transfer", False),
    UdsService(0x3E, "TesterPresent", "session", True, 0x00),
    UdsService(0x85, "ControlDTCSetting", "diagnostics", True),
)
SERVICES_BY_SID = {service.sid: service for service in SERVICES}

# ISO 14229-1:2020 Annex A, Table A.1 (negative response codes).
NRC_NAMES: dict[int, str] = {
    0x10: "GeneralReject",
    0x11: "ServiceNotSupported",
    0x12: "SubFunctionNotSupported",
    0x13: "IncorrectMessageLengthOrInvalidFormat",
    0x14: "ResponseTooLong",
    0x21: "BusyRepeatRequest",
    0x22: "ConditionsNotCorrect",
    0x24: "RequestSequenceError",
    0x25: "NoResponseFromSubnetComponent",
    0x26: "FailurePreventsExecutionOfRequestedAction",
    0x31: "RequestOutOfRange",
    0x33: "SecurityAccessDenied",
    0x35: "InvalidKey",
    0x36: "ExceededNumberOfAttempts",
    0x37: "RequiredTimeDelayNotExpired",
    0x70: "UploadDownloadNotAccepted",
    0x71: "TransferDataSuspended",
    0x72: "GeneralProgrammingFailure",
    0x73: "WrongBlockSequenceCounter",
    0x78: "RequestCorrectlyReceivedResponsePending",
    0x7E: "SubFunctionNotSupportedInActiveSession",
    0x7F: "ServiceNotSupportedInActiveSession",
}


def nrc_name(nrc: int) -> str:
    """Name of a negative response code, or ``"ISOSAEReserved"``/``"Unknown"``."""
    return NRC_NAMES.get(nrc, "Unknown")


def service_name(sid: int) -> str:
    """Name of a request SID from the catalog, or ``"Unknown"``."""
    service = SERVICES_BY_SID.get(sid)
    return service.name if service else "Unknown"


def single_frame_request(sid: int, subfunction: int | None = None, padding: int = 0x00) -> bytes:
    """An 8-byte ISO 15765-2 single frame carrying one UDS request.

    ``[PCI length, SID, (sub-function)]`` padded with ``padding``. Services that
    take a sub-function get ``subfunction`` (default 0x01).
    """
    service = SERVICES_BY_SID.get(sid)
    payload = bytes([sid])
    if subfunction is None and service is not None:
        subfunction = service.probe_subfunction
    if subfunction is not None:
        payload += bytes([subfunction])
    frame = bytes([len(payload)]) + payload
    return frame + bytes([padding]) * (8 - len(frame))


@dataclass(frozen=True)
class UdsReply:
    """A decoded single-frame UDS reply: ``positive``, ``sid`` (the request SID
    it answers), ``nrc`` (None when positive), ``payload`` (bytes after the SID)."""

    positive: bool
    sid: int
    nrc: int | None
    payload: bytes


def parse_single_frame_reply(data: bytes) -> UdsReply | None:
    """Decode an ISO 15765-2 single frame holding a UDS response, or None.

    Returns None for anything that is not a single frame (PCI type != 0) or is
    too short to be a response.
    """
    if not data or data[0] >> 4 != 0:
        return None
    length = data[0] & 0x0F
    body = bytes(data[1:1 + length])
    if len(body) < 1 or len(body) != length:
        return None
    if body[0] == NEGATIVE_RESPONSE_SID:
        if len(body) < 3:
            return None
        return UdsReply(False, body[1], body[2], body[3:])
    if body[0] < POSITIVE_RESPONSE_OFFSET:
        return None
    return UdsReply(True, body[0] - POSITIVE_RESPONSE_OFFSET, None, body[1:])
