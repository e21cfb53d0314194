"""Naming and decoding diagnostic PDUs reassembled from ISO-TP: UDS (ISO 14229-1),
OBD-II (SAE J1979 / ISO 15031-5) and KWP2000 (ISO 14230-3) services; OBD-II mode
01 PID values, the mode 09 VIN and mode 03/07/0A DTCs; running summaries.
"""

from __future__ import annotations

from typing import Any

from canarchy.decode.common import ValueRange
from canarchy.isotp import IsoTpPdu
from canarchy.uds import NRC_RESPONSE_PENDING

_RESPONSE_PENDING = f"0x{NRC_RESPONSE_PENDING:02X}"  # ISO 14229-1: 7F SID 78 is an interim reply, not the answer

OBD_SERVICES = {
    0x01: "RequestCurrentPowertrainDiagnosticData",
    0x02: "RequestPowertrainFreezeFrameData",
    0x03: "RequestEmissionRelatedDTCs",
    0x04: "ClearEmissionRelatedDiagnosticInformation",
    0x05: "RequestOxygenSensorMonitoringTestResults",
    0x06: "RequestOnBoardMonitoringTestResults",
    0x07: "RequestPendingEmissionRelatedDTCs",
    0x08: "RequestControlOfOnBoardSystem",
    0x09: "RequestVehicleInformation",
    0x0A: "RequestPermanentEmissionRelatedDTCs",
}

# KWP2000 (ISO 14230-3) services that ISO 14229-1 dropped and ECUs still answer.
KWP_SERVICES = {
    0x1A: "ReadEcuIdentification",
    0x21: "ReadDataByLocalIdentifier",
    0x30: "InputOutputControlByLocalIdentifier",
    0x3B: "WriteDataByLocalIdentifier",
}

# SAE J1979 mode $01 PIDs: (name, unit, formula over the data bytes A, B); each PID's data bytes in _OBD_PID_LENGTH.
_TRIM = ("%", lambda d: (d[0] - 128) * 100 / 128)
_PERCENT = ("%", lambda d: d[0] * 100 / 255)
_CATALYST = ("°C", lambda d: (256 * d[0] + d[1]) / 10 - 40)
_TORQUE = ("%", lambda d: d[0] - 125)
OBD_PIDS: dict[int, tuple[str, str, Any]] = {
    0x04: ("Calculated engine load", *_PERCENT),
    0x05: ("Engine coolant temperature", "°C", lambda d: d[0] - 40),
    0x06: ("Short term fuel trim, bank 1", *_TRIM),
    0x07: ("Long term fuel trim, bank 1", *_TRIM),
    0x08: ("Short term fuel trim, bank 2", *_TRIM),
    0x09: ("Long term fuel trim, bank 2", *_TRIM),
    0x0A: ("Fuel pressure (gauge)", "kPa", lambda d: 3 * d[0]),
    0x0B: ("Intake manifold absolute pressure", "kPa", lambda d: d[0]),
    0x0C: ("Engine speed", "rpm", lambda d: (256 * d[0] + d[1]) / 4),
    0x0D: ("Vehicle speed", "km/h", lambda d: d[0]),
    0x0E: ("Timing advance", "° before TDC", lambda d: d[0] / 2 - 64),
    0x0F: ("Intake air temperature", "°C", lambda d: d[0] - 40),
    0x10: ("Mass air flow rate", "g/s", lambda d: (256 * d[0] + d[1]) / 100),
    0x11: ("Throttle position", *_PERCENT),
    0x1F: ("Run time since engine start", "s", lambda d: 256 * d[0] + d[1]),
    0x21: ("Distance traveled with MIL on", "km", lambda d: 256 * d[0] + d[1]),
    0x23: ("Fuel rail gauge pressure", "kPa", lambda d: 10 * (256 * d[0] + d[1])),
    0x2C: ("Commanded EGR", *_PERCENT),
    0x2D: ("EGR error", *_TRIM),
    0x2E: ("Commanded evaporative purge", *_PERCENT),
    0x2F: ("Fuel tank level input", *_PERCENT),
    0x30: ("Warm-ups since codes cleared", "count", lambda d: d[0]),
    0x31: ("Distance traveled since codes cleared", "km", lambda d: 256 * d[0] + d[1]),
    0x33: ("Absolute barometric pressure", "kPa", lambda d: d[0]),
    0x3C: ("Catalyst temperature, bank 1, sensor 1", *_CATALYST),
    0x3D: ("Catalyst temperature, bank 2, sensor 1", *_CATALYST),
    0x3E: ("Catalyst temperature, bank 1, sensor 2", *_CATALYST),
    0x3F: ("Catalyst temperature, bank 2, sensor 2", *_CATALYST),
    0x42: ("Control module voltage", "V", lambda d: (256 * d[0] + d[1]) / 1000),
    0x43: ("Absolute load value", "%", lambda d: (256 * d[0] + d[1]) * 100 / 255),
    0x44: ("Commanded air-fuel equivalence ratio", "ratio", lambda d: (256 * d[0] + d[1]) * 2 / 65536),
    0x45: ("Relative throttle position", *_PERCENT),
    0x46: ("Ambient air temperature", "°C", lambda d: d[0] - 40),
    0x47: ("Absolute throttle position B", *_PERCENT),
    0x49: ("Accelerator pedal position D", *_PERCENT),
    0x4A: ("Accelerator pedal position E", *_PERCENT),
    0x4C: ("Commanded throttle actuator", *_PERCENT),
    0x4D: ("Time run with MIL on", "min", lambda d: 256 * d[0] + d[1]),
    0x4E: ("Time since trouble codes cleared", "min", lambda d: 256 * d[0] + d[1]),
    0x5A: ("Relative accelerator pedal position", *_PERCENT),
    0x5C: ("Engine oil temperature", "°C", lambda d: d[0] - 40),
    0x5E: ("Engine fuel rate", "L/h", lambda d: (256 * d[0] + d[1]) / 20),
    0x61: ("Driver's demand engine, percent torque", *_TORQUE),
    0x62: ("Actual engine, percent torque", *_TORQUE),
    0x63: ("Engine reference torque", "N·m", lambda d: 256 * d[0] + d[1]),
}
_TWO_BYTES = {0x0C, 0x10, 0x1F, 0x21, 0x23, 0x31, 0x3C, 0x3D, 0x3E, 0x3F, 0x42, 0x43, 0x44, 0x4D, 0x4E, 0x5E, 0x63}
_OBD_PID_LENGTH = {pid: 2 if pid in _TWO_BYTES else 1 for pid in OBD_PIDS}
_DTC_LETTERS = "PCBU"


def service_name(sid: int) -> tuple[str, str]:
    """``(protocol, name)`` of a request service ID: UDS (``canarchy.uds`` catalog, ISO 14229-1),
    else OBD-II (SAE J1979 $01-$0A), else KWP2000 (ISO 14230-3), else ``("unknown", "Unknown")``."""
    from canarchy import uds

    name = uds.service_name(sid)
    if name != "Unknown":
        return "UDS", name
    if sid in OBD_SERVICES:
        return "OBD-II", OBD_SERVICES[sid]
    if sid in KWP_SERVICES:
        return "KWP2000", KWP_SERVICES[sid]
    return "unknown", "Unknown"


def obd_dtc(high: int, low: int) -> str:
    """A two-byte OBD-II DTC as text (SAE J1979): ``0x01 0x23`` -> ``"P0123"``."""
    return f"{_DTC_LETTERS[high >> 6]}{(high >> 4) & 3}{high & 0xF:X}{low >> 4:X}{low & 0xF:X}"


def describe_diagnostic_pdu(pdu: IsoTpPdu, direction: str) -> dict[str, Any]:
    """Describe one reassembled diagnostic PDU.

    ``direction``: ``"request"`` or ``"response"``. Returns ``{arbitration_id,
    direction, timestamp, end_timestamp, frame_count, length, data (hex),
    service ("0x22"), service_name, protocol ("UDS"/"OBD-II"/"KWP2000"/"unknown")}``;
    a response adds ``positive`` and, when negative (``7F SID NRC``), ``nrc``
    and ``nrc_name`` (ISO 14229-1 Annex A); OBD-II responses add ``obd``
    (mode 01: ``[{pid, name, value, unit}]``; mode 09 PID 02: ``{vin}``;
    modes 03/07/0A: ``{dtcs: ["P0123", …]}``).
    """
    from canarchy import uds

    data = pdu.data
    out: dict[str, Any] = {
        "arbitration_id": pdu.arbitration_id,
        "direction": direction,
        "timestamp": pdu.timestamp,
        "end_timestamp": pdu.end_timestamp,
        "frame_count": pdu.frame_count,
        "length": pdu.length,
        "data": data.hex(),
    }
    if not data:
        out.update(service=None, service_name="Unknown", protocol="unknown")
        return out
    first = data[0]
    if direction == "request":
        protocol, name = service_name(first)
        out.update(service=f"0x{first:02X}", service_name=name, protocol=protocol)
        if protocol == "OBD-II" and len(data) > 1:
            out["pid"] = f"0x{data[1]:02X}"
        return out
    if first == uds.NEGATIVE_RESPONSE_SID and len(data) >= 3:
        protocol, name = service_name(data[1])
        out.update(service=f"0x{data[1]:02X}", service_name=name, protocol=protocol, positive=False,
                   nrc=f"0x{data[2]:02X}", nrc_name=uds.nrc_name(data[2]))
        return out
    sid = first - uds.POSITIVE_RESPONSE_OFFSET
    if sid < 0:
        out.update(service=None, service_name="Unknown", protocol="unknown", positive=None)
        return out
    protocol, name = service_name(sid)
    out.update(service=f"0x{sid:02X}", service_name=name, protocol=protocol, positive=True)
    if protocol == "OBD-II":
        obd = _decode_obd_response(sid, data[1:])
        if obd is not None:
            out["obd"] = obd
    return out


def _decode_obd_response(mode: int, body: bytes) -> Any:
    if mode == 0x01:
        values = []
        index = 0
        while index < len(body):
            pid = body[index]
            size = _OBD_PID_LENGTH.get(pid)
            if size is None or index + 1 + size > len(body):
                values.append({"pid": f"0x{pid:02X}", "name": None, "value": None, "unit": None,
                               "raw": body[index + 1:].hex()})
                break
            name, unit, formula = OBD_PIDS[pid]
            values.append({"pid": f"0x{pid:02X}", "name": name, "value": formula(body[index + 1:index + 1 + size]),
                           "unit": unit, "raw": body[index + 1:index + 1 + size].hex()})
            index += 1 + size
        return values
    if mode == 0x09 and len(body) >= 2 and body[0] == 0x02:
        # PID 02 on ISO 15765-4: one byte "number of data items", then 17 ASCII characters.
        vin = body[2:] if len(body) >= 19 else body[1:]
        return {"pid": "0x02", "vin": vin.decode("ascii", "replace").strip("\x00 ")}
    if mode in (0x03, 0x07, 0x0A) and body:
        count = body[0]
        dtcs = [obd_dtc(body[i], body[i + 1]) for i in range(1, min(len(body) - 1, 1 + 2 * count), 2)]
        return {"dtc_count": count, "dtcs": dtcs}
    return None


class DiagnosticSummary:
    """Bounded counts over described diagnostic PDUs: per service, NRCs, the VIN, OBD-II PID ranges."""

    def __init__(self) -> None:
        self.pdu_count = 0
        self.requests = 0
        self.responses = 0
        self.negative = 0
        self.pending = 0
        self.multi_frame = 0
        self.services: dict[str, dict[str, Any]] = {}
        self.vin: str | None = None
        self.obd: dict[str, tuple[ValueRange, str, str]] = {}

    def add(self, described: dict[str, Any]) -> None:
        self.pdu_count += 1
        if described["frame_count"] > 1:
            self.multi_frame += 1
        if described["direction"] == "request":
            self.requests += 1
        else:
            self.responses += 1
            if described.get("positive") is False:
                if described.get("nrc") == _RESPONSE_PENDING:  # an interim reply: the answer follows
                    self.pending += 1
                else:
                    self.negative += 1
        key = described.get("service") or "none"
        entry = self.services.get(key)
        if entry is None:
            entry = self.services[key] = {"service_name": described["service_name"],
                                          "protocol": described["protocol"], "requests": 0, "responses": 0}
        entry["requests" if described["direction"] == "request" else "responses"] += 1
        obd = described.get("obd")
        if isinstance(obd, dict) and obd.get("vin"):
            self.vin = obd["vin"]
        elif isinstance(obd, list):
            for item in obd:
                if item["name"] is None:
                    continue
                slot = self.obd.get(item["pid"])
                if slot is None:
                    slot = self.obd[item["pid"]] = (ValueRange(), item["name"], item["unit"])
                slot[0].add(item["value"])

    def to_dict(self) -> dict[str, Any]:
        """``{pdu_count, request_count, response_count, negative_response_count, response_pending_count,
        multi_frame_count,
        services: {"0x22": {service_name, protocol, requests, responses}}, vin,
        obd_pids: {"0x0C": {name, unit, count, min, max, first, last}}}``."""
        return {
            "pdu_count": self.pdu_count,
            "request_count": self.requests,
            "response_count": self.responses,
            "negative_response_count": self.negative,
            "response_pending_count": self.pending,
            "multi_frame_count": self.multi_frame,
            "services": dict(sorted(self.services.items())),
            "vin": self.vin,
            "obd_pids": {pid: {"name": name, "unit": unit, **series.to_dict()}
                         for pid, (series, name, unit) in sorted(self.obd.items())},
        }
