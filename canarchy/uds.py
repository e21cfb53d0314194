"""UDS (ISO 14229-1) reference data: the service catalog, NRC and DID names, request and reply forms.

Pure data and pure functions; no transport, no python-can.

Sources: ISO 14229-1 (2013 and 2020 editions), §8 and the service
identifier table (a positive response SID is the request SID + 0x40),
Annex A Table A.1 (negative response codes; a negative response is
``7F <SID> <NRC>``), Annex C Table C.1 (identification DIDs 0xF180-0xF19F).
"""

from __future__ import annotations

from dataclasses import dataclass

POSITIVE_RESPONSE_OFFSET = 0x40
NEGATIVE_RESPONSE_SID = 0x7F

# Service identifiers the tools and the simulated ECU use by name.
SID_DIAGNOSTIC_SESSION_CONTROL = 0x10
SID_ECU_RESET = 0x11
SID_CLEAR_DIAGNOSTIC_INFORMATION = 0x14
SID_READ_DTC_INFORMATION = 0x19
SID_READ_DATA_BY_IDENTIFIER = 0x22
SID_SECURITY_ACCESS = 0x27
SID_COMMUNICATION_CONTROL = 0x28
SID_WRITE_DATA_BY_IDENTIFIER = 0x2E
SID_ROUTINE_CONTROL = 0x31
SID_TESTER_PRESENT = 0x3E
SID_CONTROL_DTC_SETTING = 0x85

# Negative response codes (Annex A, Table A.1) used by name.
NRC_GENERAL_REJECT = 0x10
NRC_SERVICE_NOT_SUPPORTED = 0x11
NRC_SUB_FUNCTION_NOT_SUPPORTED = 0x12
NRC_INCORRECT_MESSAGE_LENGTH_OR_INVALID_FORMAT = 0x13
NRC_CONDITIONS_NOT_CORRECT = 0x22
NRC_REQUEST_SEQUENCE_ERROR = 0x24
NRC_REQUEST_OUT_OF_RANGE = 0x31
NRC_SECURITY_ACCESS_DENIED = 0x33
NRC_INVALID_KEY = 0x35
NRC_EXCEEDED_NUMBER_OF_ATTEMPTS = 0x36
NRC_REQUIRED_TIME_DELAY_NOT_EXPIRED = 0x37
NRC_RESPONSE_PENDING = 0x78
NRC_SERVICE_NOT_SUPPORTED_IN_ACTIVE_SESSION = 0x7F

# DiagnosticSessionControl session types (§9.2).
SESSION_DEFAULT = 0x01
SESSION_PROGRAMMING = 0x02
SESSION_EXTENDED = 0x03
SESSION_NAMES = {SESSION_DEFAULT: "defaultSession", SESSION_PROGRAMMING: "programmingSession",
                 SESSION_EXTENDED: "extendedDiagnosticSession", 0x04: "safetySystemDiagnosticSession"}

#: Bit 7 of a sub-function byte: suppressPosRspMsgIndicationBit (§7.5).
SUPPRESS_POSITIVE_RESPONSE = 0x80


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
    UdsService(0x24, "ReadScalingDataByIdentifier", "data", False),
    UdsService(0x27, "SecurityAccess", "security", True, 0x01),
    UdsService(0x28, "CommunicationControl", "communication", True),
    UdsService(0x29, "Authentication", "security", True),
    UdsService(0x2A, "ReadDataByPeriodicIdentifier", "data", False),
    UdsService(0x2C, "DynamicallyDefineDataIdentifier", "data", True),
    UdsService(0x2E, "WriteDataByIdentifier", "data", False),
    UdsService(0x2F, "InputOutputControlByIdentifier", "control", False),
    UdsService(0x31, "RoutineControl", "control", True),
    UdsService(0x34, "RequestDownload", "transfer", False),
    UdsService(0x35, "RequestUpload", "transfer", False),
    UdsService(0x36, "TransferData", "transfer", False),
    UdsService(0x37, "RequestTransferExit", "transfer", False),
    UdsService(0x38, "RequestFileTransfer", "transfer", False),
    UdsService(0x3D, "WriteMemoryByAddress", "data", False),
    UdsService(0x3E, "TesterPresent", "session", True, 0x00),
    UdsService(0x83, "AccessTimingParameter", "communication", True),
    UdsService(0x84, "SecuredDataTransmission", "security", False),
    UdsService(0x85, "ControlDTCSetting", "diagnostics", True),
    UdsService(0x86, "ResponseOnEvent", "communication", True),
    UdsService(0x87, "LinkControl", "communication", True),
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
    0x34: "AuthenticationRequired",
    0x35: "InvalidKey",
    0x36: "ExceededNumberOfAttempts",
    0x37: "RequiredTimeDelayNotExpired",
    0x38: "SecureDataTransmissionRequired",
    0x39: "SecureDataTransmissionNotAllowed",
    0x3A: "SecureDataVerificationFailed",
    0x50: "CertificateVerificationFailedInvalidTimePeriod",
    0x51: "CertificateVerificationFailedInvalidSignature",
    0x52: "CertificateVerificationFailedInvalidChainOfTrust",
    0x53: "CertificateVerificationFailedInvalidType",
    0x54: "CertificateVerificationFailedInvalidFormat",
    0x55: "CertificateVerificationFailedInvalidContent",
    0x56: "CertificateVerificationFailedInvalidScope",
    0x57: "CertificateVerificationFailedInvalidCertificate",
    0x58: "OwnershipVerificationFailed",
    0x59: "ChallengeCalculationFailed",
    0x5A: "SettingAccessRightsFailed",
    0x5B: "SessionKeyCreationOrDerivationFailed",
    0x5C: "ConfigurationDataUsageFailed",
    0x5D: "DeAuthenticationFailed",
    0x70: "UploadDownloadNotAccepted",
    0x71: "TransferDataSuspended",
    0x72: "GeneralProgrammingFailure",
    0x73: "WrongBlockSequenceCounter",
    0x78: "RequestCorrectlyReceivedResponsePending",
    0x7E: "SubFunctionNotSupportedInActiveSession",
    0x7F: "ServiceNotSupportedInActiveSession",
    # 0x81..0x94: conditions of the vehicle that the request needs (the server names the one not met)
    0x81: "RpmTooHigh",
    0x82: "RpmTooLow",
    0x83: "EngineIsRunning",
    0x84: "EngineIsNotRunning",
    0x85: "EngineRunTimeTooLow",
    0x86: "TemperatureTooHigh",
    0x87: "TemperatureTooLow",
    0x88: "VehicleSpeedTooHigh",
    0x89: "VehicleSpeedTooLow",
    0x8A: "ThrottleOrPedalTooHigh",
    0x8B: "ThrottleOrPedalTooLow",
    0x8C: "TransmissionRangeNotInNeutral",
    0x8D: "TransmissionRangeNotInGear",
    0x8F: "BrakeSwitchesNotClosed",
    0x90: "ShifterLeverNotInPark",
    0x91: "TorqueConverterClutchLocked",
    0x92: "VoltageTooHigh",
    0x93: "VoltageTooLow",
    0x94: "ResourceTemporarilyNotAvailable",
}


def nrc_name(nrc: int) -> str:
    """Name of a negative response code (ISO 14229-1 Annex A; 0xF0..0xFE: the vehicle manufacturer's
    own conditions), or ``"Unknown"`` (a code the standard reserves)."""
    if 0xF0 <= nrc <= 0xFE:
        return "VehicleManufacturerSpecificConditionsNotCorrect"
    return NRC_NAMES.get(nrc, "Unknown")


def service_name(sid: int) -> str:
    """Name of a request SID from the catalog, or ``"Unknown"``."""
    service = SERVICES_BY_SID.get(sid)
    return service.name if service else "Unknown"


def request_payload(sid: int, subfunction: int | None = None) -> bytes:
    """The UDS bytes of a discovery request: the SID, then ``subfunction`` or,
    when None, the catalog's side-effect-free ``probe_subfunction`` (if any)."""
    service = SERVICES_BY_SID.get(sid)
    if subfunction is None and service is not None:
        subfunction = service.probe_subfunction
    return bytes([sid]) if subfunction is None else bytes([sid, subfunction])


def single_frame_request(sid: int, subfunction: int | None = None, padding: int = 0x00) -> bytes:
    """An 8-byte ISO 15765-2 single frame carrying :func:`request_payload` (padded with ``padding``)."""
    from canarchy.isotp import single_frame

    return single_frame(request_payload(sid, subfunction), padding)


@dataclass(frozen=True)
class UdsReply:
    """A decoded UDS response: ``positive``, ``sid`` (the request SID it
    answers), ``nrc`` (None when positive), ``payload`` (bytes after the SID,
    or after ``7F SID NRC``)."""

    positive: bool
    sid: int
    nrc: int | None
    payload: bytes

    @property
    def pending(self) -> bool:
        """True for ``7F SID 78`` (responsePending: the settled answer follows)."""
        return self.nrc == NRC_RESPONSE_PENDING


def parse_response(message: bytes | None) -> UdsReply | None:
    """Decode a whole UDS response message (ISO-TP payload), or None when it is
    not one: empty, a ``7F`` shorter than 3 bytes, or a first byte below 0x40."""
    if not message:
        return None
    if message[0] == NEGATIVE_RESPONSE_SID:
        if len(message) < 3:
            return None
        return UdsReply(False, message[1], message[2], bytes(message[3:]))
    if message[0] < POSITIVE_RESPONSE_OFFSET:
        return None
    return UdsReply(True, message[0] - POSITIVE_RESPONSE_OFFSET, None, bytes(message[1:]))


# ISO 14229-1 Annex C, Table C.1: identification data identifiers.
DID_NAMES: dict[int, str] = {
    0xF180: "BootSoftwareIdentification",
    0xF181: "ApplicationSoftwareIdentification",
    0xF182: "ApplicationDataIdentification",
    0xF183: "BootSoftwareFingerprint",
    0xF184: "ApplicationSoftwareFingerprint",
    0xF185: "ApplicationDataFingerprint",
    0xF186: "ActiveDiagnosticSession",
    0xF187: "VehicleManufacturerSparePartNumber",
    0xF188: "VehicleManufacturerECUSoftwareNumber",
    0xF189: "VehicleManufacturerECUSoftwareVersionNumber",
    0xF18A: "SystemSupplierIdentifier",
    0xF18B: "ECUManufacturingDate",
    0xF18C: "ECUSerialNumber",
    0xF18D: "SupportedFunctionalUnits",
    0xF18E: "VehicleManufacturerKitAssemblyPartNumber",
    0xF190: "VIN",
    0xF191: "VehicleManufacturerECUHardwareNumber",
    0xF192: "SystemSupplierECUHardwareNumber",
    0xF193: "SystemSupplierECUHardwareVersionNumber",
    0xF194: "SystemSupplierECUSoftwareNumber",
    0xF195: "SystemSupplierECUSoftwareVersionNumber",
    0xF196: "ExhaustRegulationOrTypeApprovalNumber",
    0xF197: "SystemNameOrEngineType",
    0xF198: "RepairShopCodeOrTesterSerialNumber",
    0xF199: "ProgrammingDate",
    0xF19A: "CalibrationRepairShopCodeOrCalibrationEquipmentSerialNumber",
    0xF19B: "CalibrationDate",
    0xF19C: "CalibrationEquipmentSoftwareNumber",
    0xF19D: "ECUInstallationDate",
    0xF19E: "ODXFile",
    0xF19F: "Entity",
}
DID_VIN = 0xF190
DID_ACTIVE_SESSION = 0xF186
#: The default range of a DID read scan: Annex C's identification DIDs.
IDENTIFICATION_DIDS = (0xF180, 0xF19F)
VIN_LENGTH = 17  # ISO 3779


def did_name(did: int) -> str:
    """Name of a data identifier from Annex C, or ``"Unknown"``."""
    return DID_NAMES.get(did, "Unknown")


def read_did_request(did: int) -> bytes:
    """The UDS bytes of ReadDataByIdentifier for one DID: ``22 <DID high> <DID low>``."""
    return bytes((SID_READ_DATA_BY_IDENTIFIER, did >> 8 & 0xFF, did & 0xFF))


def decode_did(did: int, value: bytes) -> dict:
    """Describe one DID's data record: ``did`` ("0xF190"), ``name``, ``data`` (hex),
    ``length``, and where it applies ``text`` (printable ASCII, trailing NUL,
    0xFF and spaces stripped), ``vin`` (0xF190 holding 17 characters of ISO 3779's
    alphabet: digits and capitals but I, O, Q) or ``session`` (0xF186: the
    session's name)."""
    out: dict = {"did": f"0x{did:04X}", "name": did_name(did), "data": value.hex(), "length": len(value)}
    stripped = value.rstrip(b"\x00\xff ")
    if stripped and all(0x20 <= byte < 0x7F for byte in stripped):
        out["text"] = stripped.decode("ascii")
    if did == DID_VIN:
        text = out.get("text", "")
        if len(text) == VIN_LENGTH and all(c.isdigit() or (c.isupper() and c not in "IOQ") for c in text):
            out["vin"] = text
    if did == DID_ACTIVE_SESSION and len(value) == 1:
        out["session"] = SESSION_NAMES.get(value[0], f"0x{value[0]:02X}")
    return out
