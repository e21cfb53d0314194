"""J1939 decoding (SAE J1939-21 / -71 / -73): PGN, SA and SPN values per frame, transport
protocol reassembly (BAM, RTS/CTS) and DM1/DM2 lamps and DTCs.

SPN layouts come from :mod:`canarchy.j1939_metadata` (the bundled catalog and the
user's override file), read once per :class:`J1939Catalog`. Values are
``raw x resolution + offset`` in the catalog's unit. No python-can, no cantools.
"""

from __future__ import annotations

import decimal
from typing import Any

from canarchy.decode.common import ValueRange, j1939_pgn
from canarchy.frames import CanFrame
from canarchy.warning_log import WarningLog

#: Distinct PGNs a summary keeps counts of (the first seen); frames of any other are counted apart.
MAX_PGNS = 4096

PGN_TP_CM = 0xEC00  # 60416, TP.CM connection management (SAE J1939-21)
PGN_TP_DT = 0xEB00  # 60160, TP.DT data transfer
PGN_DM1 = 0xFECA  # 65226, DM1 active diagnostic trouble codes (SAE J1939-73)
PGN_DM2 = 0xFECB  # 65227, DM2 previously active DTCs
_DM_PGNS = {PGN_DM1: "DM1", PGN_DM2: "DM2"}

TP_CM_RTS = 0x10
TP_CM_CTS = 0x11
TP_CM_EOM_ACK = 0x13
TP_CM_BAM = 0x20
TP_CM_ABORT = 0xFF

# SAE J1939-73: lamp status (2 bits) and lamp flash (2 bits).
LAMP_STATES = ("off", "on", "reserved", "not_available")
FLASH_STATES = ("slow_flash", "fast_flash", "reserved", "do_not_flash")
# Byte 1 (status) and byte 2 (flash) of DM1/DM2 hold four lamps, 2 bits each, low bits first.
DM_LAMPS = (("protect_lamp", 0), ("amber_warning_lamp", 2), ("red_stop_lamp", 4), ("malfunction_indicator_lamp", 6))

# SAE J1939-73 failure mode identifiers, restated.
FMI_DESCRIPTIONS = {
    0: "Data valid but above normal operating range (most severe)",
    1: "Data valid but below normal operating range (most severe)",
    2: "Data erratic, intermittent or incorrect",
    3: "Voltage above normal or shorted to high source",
    4: "Voltage below normal or shorted to low source",
    5: "Current below normal or open circuit",
    6: "Current above normal or grounded circuit",
    7: "Mechanical system not responding or out of adjustment",
    8: "Abnormal frequency, pulse width or period",
    9: "Abnormal update rate",
    10: "Abnormal rate of change",
    11: "Root cause not known",
    12: "Bad intelligent device or component",
    13: "Out of calibration",
    14: "Special instructions",
    15: "Data valid but above normal operating range (least severe)",
    16: "Data valid but above normal operating range (moderately severe)",
    17: "Data valid but below normal operating range (least severe)",
    18: "Data valid but below normal operating range (moderately severe)",
    19: "Received network data in error",
    20: "Data drifted high",
    21: "Data drifted low",
    31: "Condition exists",
}


def fmi_description(fmi: int) -> str:
    """Meaning of a failure mode identifier (SAE J1939-73); ``"Reserved"`` for 22..30."""
    return FMI_DESCRIPTIONS.get(fmi, "Reserved")


def decode_dm(data: bytes, spn_names: dict[int, str] | None = None) -> dict[str, Any]:
    """Decode a DM1 / DM2 payload (SAE J1939-73).

    Layout: byte 1 lamp status, byte 2 lamp flash (each four 2-bit fields:
    protect, amber warning, red stop, malfunction indicator, from the low
    bits); then 4 bytes per DTC: SPN low 16 bits (bytes 1-2, least
    significant first) and the SPN's high 3 bits in bits 8-6 of byte 3, FMI in
    bits 5-1 of byte 3, occurrence count in bits 7-1 of byte 4, SPN conversion
    method (CM) in bit 8 of byte 4. An all-zero DTC (SPN 0, FMI 0) means "no
    DTC"; all-ones bytes are padding. Both are skipped.

    Returns ``{lamps: {lamp: {status, state, flash, flash_state}},
    dtc_count, dtcs: [{spn, spn_name, fmi, fmi_description,
    occurrence_count (None when 127 = not available), conversion_method}]}``.
    """
    names = spn_names or {}
    lamps = {}
    status = data[0] if len(data) > 0 else 0xFF
    flash = data[1] if len(data) > 1 else 0xFF
    for lamp, shift in DM_LAMPS:
        s = (status >> shift) & 3
        f = (flash >> shift) & 3
        lamps[lamp] = {"status": s, "state": LAMP_STATES[s], "flash": f, "flash_state": FLASH_STATES[f]}
    dtcs = []
    for start in range(2, len(data) - 3, 4):
        chunk = data[start:start + 4]
        if chunk == b"\xff\xff\xff\xff":
            continue
        spn = chunk[0] | (chunk[1] << 8) | ((chunk[2] >> 5) << 16)
        fmi = chunk[2] & 0x1F
        if spn == 0 and fmi == 0:
            continue
        occurrence = chunk[3] & 0x7F
        dtcs.append({
            "spn": spn,
            "spn_name": names.get(spn),
            "fmi": fmi,
            "fmi_description": fmi_description(fmi),
            "occurrence_count": None if occurrence == 0x7F else occurrence,
            "conversion_method": chunk[3] >> 7,
        })
    return {"lamps": lamps, "dtc_count": len(dtcs), "dtcs": dtcs}


def _decimals(number: Any) -> int:
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        return 0
    exponent = decimal.Decimal(repr(float(number))).normalize().as_tuple().exponent
    return max(0, -int(exponent))


class _SpnLayout:
    """One catalog SPN prepared for fast extraction from a payload."""

    __slots__ = (
        "ascii",
        "bit_length",
        "digits",
        "kind",
        "mask",
        "name",
        "offset",
        "resolution",
        "spn",
        "start_bit",
        "states",
        "unit",
    )

    def __init__(self, spn: int, entry: dict[str, Any]) -> None:
        self.spn = spn
        self.name = entry.get("name")
        self.unit = entry.get("unit") or ""
        self.kind = entry.get("kind") or "measured"
        self.start_bit = entry.get("start_bit")
        self.bit_length = entry.get("bit_length")
        self.ascii = self.kind == "ascii"
        self.mask = (1 << self.bit_length) - 1 if isinstance(self.bit_length, int) else 0
        self.resolution = entry.get("resolution")
        self.offset = entry.get("offset") or 0
        self.digits = max(_decimals(self.resolution), _decimals(self.offset))
        states = entry.get("states")
        self.states = ({int(k): str(v) for k, v in states.items() if str(k).isdecimal()}
                       if isinstance(states, dict) else {})

    @property
    def usable(self) -> bool:
        if self.ascii:
            return isinstance(self.start_bit, int) or self.start_bit is None
        return isinstance(self.start_bit, int) and isinstance(self.bit_length, int) and self.bit_length > 0

    def decode(self, data: bytes, whole: int) -> dict[str, Any] | None:
        """``{spn, name, raw, value, unit, status}`` (plus ``state``, the catalog's name of a discrete
        value) or None when the payload is too short."""
        if self.ascii:
            start = (self.start_bit or 0) // 8
            end = len(data) if self.bit_length is None else start + self.bit_length // 8
            if start >= len(data) or end > len(data):
                return None
            text = bytes(data[start:end]).split(b"*")[0].decode("ascii", "replace").strip("\x00 \xff")
            return {"spn": self.spn, "name": self.name, "raw": bytes(data[start:end]).hex(), "value": text,
                    "unit": self.unit, "status": "ok"}
        if self.start_bit + self.bit_length > 8 * len(data):
            return None
        raw = (whole >> self.start_bit) & self.mask
        state = self.states.get(raw) if self.states else None
        status = _STATE_STATUS.get(state, "ok") if state is not None else _status(raw, self.bit_length, self.kind)
        if status != "ok" or self.resolution is None:
            value = raw if status == "ok" else None
        else:
            value = round(raw * self.resolution + self.offset, self.digits)
            if self.digits == 0:
                value = int(value)
        out = {"spn": self.spn, "name": self.name, "raw": raw, "value": value, "unit": self.unit, "status": status}
        if state is not None:
            out["state"] = state
        return out


# The catalog names discrete values; these names mark the indicator values (SAE J1939-71).
_STATE_STATUS = {"not available": "not_available", "error": "error", "reserved": "reserved"}


def _status(raw: int, bits: int, kind: str) -> str:
    """Parameter range of a raw value (SAE J1939-71): ``ok``, ``reserved``, ``error``, ``not_available``.

    Whole-byte parameters: the most significant byte 0xFB-0xFD is reserved,
    0xFE an error indicator, 0xFF not available. Parameters of 2-7 bits: all
    ones is not available and all ones minus one an error (2 bits: 10 error, 11
    not available). Addresses and 1-bit fields have no indicator values.
    """
    if kind == "address" or bits < 2:
        return "ok"
    if bits % 8 == 0:
        top = raw >> (bits - 8)
        if top == 0xFF:
            return "not_available"
        if top == 0xFE:
            return "error"
        if top >= 0xFB:
            return "reserved"
        return "ok"
    if bits < 8:
        ones = (1 << bits) - 1
        if raw == ones:
            return "not_available"
        if raw == ones - 1:
            return "error"
    return "ok"


class J1939Catalog:
    """The SPN layouts and names of the bundled J1939 catalog merged with the user's overrides, read once.

    ``by_pgn``: PGN -> [_SpnLayout] (only SPNs with a fixed position);
    ``pgn_names``: PGN -> (acronym, name); ``spn_names``: SPN -> name;
    ``warnings``: a :class:`~canarchy.warning_log.WarningLog` of problems reading the override file.
    """

    def __init__(self) -> None:
        from canarchy import j1939_metadata

        pgns, pgn_warnings = j1939_metadata.list_pgns()
        spns, spn_warnings = j1939_metadata.list_spns()
        self.warnings = WarningLog()
        for text in dict.fromkeys(pgn_warnings + spn_warnings):
            self.warnings.add("J1939_CATALOG_OVERRIDE", text)
        self.pgn_names = {entry["pgn"]: (entry.get("acronym"), entry.get("name")) for entry in pgns}
        self.spn_names = {entry["spn"]: entry.get("name") for entry in spns}
        self.by_pgn: dict[int, list[_SpnLayout]] = {}
        for entry in spns:
            pgn = entry.get("pgn")
            if not isinstance(pgn, int) or pgn in _DM_PGNS:
                continue  # DM1/DM2 have a repeating layout: decode_dm reads them
            layout = _SpnLayout(entry["spn"], entry)
            if layout.usable:
                self.by_pgn.setdefault(pgn, []).append(layout)
        for layouts in self.by_pgn.values():
            layouts.sort(key=lambda item: (item.start_bit if isinstance(item.start_bit, int) else 0, item.spn))

    def decode_spns(self, pgn: int, data: bytes) -> list[dict[str, Any]]:
        """Values of the catalog SPNs of ``pgn`` in ``data`` (those that fit)."""
        layouts = self.by_pgn.get(pgn)
        if not layouts:
            return []
        whole = int.from_bytes(data, "little")
        out = []
        for layout in layouts:
            value = layout.decode(data, whole)
            if value is not None:
                out.append(value)
        return out


class _TransportSession:
    __slots__ = ("mode", "packets", "pgn", "received", "size", "timestamp")

    def __init__(self, mode: str, pgn: int, size: int, packets: int, timestamp: float) -> None:
        self.mode = mode
        self.pgn = pgn
        self.size = size
        self.packets = packets
        self.received: dict[int, bytes] = {}
        self.timestamp = timestamp


class J1939Decoder:
    """Decode J1939 frames one at a time (bounded memory: one open transport session per sender/receiver pair).

    :meth:`feed` returns ``(event_type, payload)`` pairs:

    - ``"j1939_frame"`` for every 29-bit frame: ``{arbitration_id, timestamp,
      pgn, acronym, priority, source_address, destination_address (None for
      PDU2), data (hex), spns: [{spn, name, raw, value, unit, status}]}``;
    - ``"j1939_transport"`` when a TP.CM BAM or RTS/CTS transfer completes:
      ``{pgn, acronym, mode ("BAM"/"RTS/CTS"), source_address,
      destination_address, size, packet_count, data, timestamp,
      end_timestamp, spns}``;
    - ``"j1939_dm1"`` / ``"j1939_dm2"`` for each DM1/DM2 (single frame or
      transported): ``{source_address, transport ("single_frame"/"BAM"/"RTS/CTS"),
      timestamp, lamps, dtc_count, dtcs}`` (see :func:`decode_dm`).

    Frames with 11-bit IDs are counted (``other_frame_count``) and skipped.
    """

    def __init__(self, catalog: J1939Catalog | None = None) -> None:
        self.catalog = catalog or J1939Catalog()
        self.warnings = WarningLog()
        self.frame_count = 0
        self.j1939_frame_count = 0
        self.other_frame_count = 0
        self.unlisted_frame_count = 0  # frames of PGNs past the first MAX_PGNS
        self.transport_complete = 0
        self.transport_incomplete = 0
        self.dm_count = {"DM1": 0, "DM2": 0}
        self._sessions: dict[tuple[int, int], _TransportSession] = {}
        self._pgn_stats: dict[int, dict[str, Any]] = {}
        self._spn_stats: dict[int, tuple[ValueRange, str | None, str]] = {}
        self._latest_dm: dict[tuple[str, int], dict[str, Any]] = {}

    def feed(self, frame: CanFrame) -> list[tuple[str, dict[str, Any]]]:
        """Decode one frame; return its events (see the class docstring)."""
        self.frame_count += 1
        if not frame.is_extended_id or frame.is_remote_frame:
            self.other_frame_count += 1
            return []
        self.j1939_frame_count += 1
        can_id = frame.arbitration_id
        pf = (can_id >> 16) & 0xFF
        pgn = j1939_pgn(can_id)
        sa = can_id & 0xFF
        da = (can_id >> 8) & 0xFF if pf < 240 else None
        data = frame.data
        spns = self.catalog.decode_spns(pgn, data)
        self._count(pgn, sa, spns)
        acronym = self.catalog.pgn_names.get(pgn, (None, None))[0]
        events: list[tuple[str, dict[str, Any]]] = [("j1939_frame", {
            "arbitration_id": can_id,
            "timestamp": frame.timestamp,
            "pgn": pgn,
            "acronym": acronym,
            "priority": (can_id >> 26) & 0x7,
            "source_address": sa,
            "destination_address": da,
            "data": data.hex(),
            "spns": spns,
        })]
        if pgn == PGN_TP_CM:
            self._connection(frame, sa, 0xFF if da is None else da, data)
        elif pgn == PGN_TP_DT:
            events.extend(self._data_transfer(frame, sa, 0xFF if da is None else da, data))
        elif pgn in _DM_PGNS:
            events.append(self._dm(pgn, sa, "single_frame", frame.timestamp, data))
        return events

    def finish(self) -> None:
        """End of the capture: warn about transfers left incomplete."""
        for (sa, da), session in self._sessions.items():
            self.transport_incomplete += 1
            self.warnings.add("J1939_TP_INCOMPLETE",
                              f"J1939 TP {session.mode} PGN {session.pgn} from SA {sa} to {da} begun at "
                              f"t={session.timestamp:.6f}: incomplete at end of capture "
                              f"({len(session.received)} of {session.packets} packets)",
                              source_address=sa, destination_address=da, pgn=session.pgn, timestamp=session.timestamp,
                              received_packets=len(session.received), packets=session.packets)
        self._sessions.clear()

    def summary(self) -> dict[str, Any]:
        """``{frame_count, j1939_frame_count, other_frame_count, unlisted_frame_count (of PGNs past
        the first MAX_PGNS), pgns: {"<pgn>": {acronym, count, source_addresses}},
        spns: {"<spn>": {name, unit, count, min, max, first, last}},
        transport: {complete, incomplete}, dm1_count, dm2_count,
        dm: [{type, source_address, timestamp, lamps, dtc_count, dtcs}] (the latest per type and SA)}``."""
        return {
            "frame_count": self.frame_count,
            "j1939_frame_count": self.j1939_frame_count,
            "other_frame_count": self.other_frame_count,
            "unlisted_frame_count": self.unlisted_frame_count,
            "pgns": {str(pgn): {"acronym": stats["acronym"], "count": stats["count"],
                                "source_addresses": sorted(stats["source_addresses"])}
                     for pgn, stats in sorted(self._pgn_stats.items())},
            "spns": {str(spn): {"name": name, "unit": unit, **series.to_dict()}
                     for spn, (series, name, unit) in sorted(self._spn_stats.items())},
            "transport": {"complete": self.transport_complete, "incomplete": self.transport_incomplete},
            "dm1_count": self.dm_count["DM1"],
            "dm2_count": self.dm_count["DM2"],
            "dm": [dict(entry) for _, entry in sorted(self._latest_dm.items())],
        }

    # -- internals ---------------------------------------------------------------------------

    def _count(self, pgn: int, sa: int, spns: list[dict[str, Any]]) -> None:
        stats = self._pgn_stats.get(pgn)
        if stats is None and len(self._pgn_stats) < MAX_PGNS:
            stats = self._pgn_stats[pgn] = {"acronym": self.catalog.pgn_names.get(pgn, (None, None))[0],
                                            "count": 0, "source_addresses": set()}
        if stats is not None:
            stats["count"] += 1
            stats["source_addresses"].add(sa)
        elif not self.unlisted_frame_count:
            self.unlisted_frame_count = 1
            self.warnings.add("J1939_PGNS_UNLISTED", f"frames of PGNs past the first {MAX_PGNS} distinct PGNs are "
                              "counted (unlisted_frame_count), not listed", limit=MAX_PGNS)
        else:
            self.unlisted_frame_count += 1
        for item in spns:
            if item["status"] != "ok":
                continue
            entry = self._spn_stats.get(item["spn"])
            if entry is None:
                entry = self._spn_stats[item["spn"]] = (ValueRange(), item["name"], item["unit"])
            entry[0].add(item["value"])

    def _connection(self, frame: CanFrame, sa: int, da: int, data: bytes) -> None:
        if len(data) < 8:
            self.warnings.add("J1939_TP_CM_SHORT", f"t={frame.timestamp:.6f} TP.CM from SA {sa}: {len(data)} bytes, "
                              "expected 8", source_address=sa, destination_address=da, timestamp=frame.timestamp)
            return
        control = data[0]
        key = (sa, da)
        if control in (TP_CM_BAM, TP_CM_RTS):
            size = data[1] | (data[2] << 8)
            packets = data[3]
            pgn = data[5] | (data[6] << 8) | (data[7] << 16)
            mode = "BAM" if control == TP_CM_BAM else "RTS/CTS"
            if key in self._sessions:
                old = self._sessions[key]
                self.transport_incomplete += 1
                self.warnings.add("J1939_TP_REPLACED",
                                  f"t={frame.timestamp:.6f} TP {mode} from SA {sa}: a new transfer "
                                  f"replaces PGN {old.pgn} begun at t={old.timestamp:.6f} "
                                  f"({len(old.received)} of {old.packets} packets)",
                                  source_address=sa, destination_address=da, pgn=old.pgn, timestamp=frame.timestamp,
                                  received_packets=len(old.received), packets=old.packets)
            if not 9 <= size <= 1785 or packets != -(-size // 7):
                self.warnings.add("J1939_TP_SIZE_INVALID",
                                  f"t={frame.timestamp:.6f} TP {mode} from SA {sa}: size {size} "
                                  f"and {packets} packets do not agree (SAE J1939-21: 9..1785 bytes, 7 per packet)",
                                  source_address=sa, destination_address=da, pgn=pgn, timestamp=frame.timestamp,
                                  size=size, packets=packets)
                self._sessions.pop(key, None)
                return
            self._sessions[key] = _TransportSession(mode, pgn, size, packets, frame.timestamp)
        elif control == TP_CM_ABORT:  # either end of the connection may abort it
            aborted = self._sessions.pop(key, None) or self._sessions.pop((da, sa), None)
            if aborted is not None:
                self.transport_incomplete += 1
        # CTS and EndOfMsgAck steer the sender; a passive reader needs nothing from them.

    def _data_transfer(self, frame: CanFrame, sa: int, da: int, data: bytes) -> list[tuple[str, dict[str, Any]]]:
        session = self._sessions.get((sa, da))
        if not data:
            return []
        sequence = data[0]
        if session is None:
            self.warnings.add("J1939_TP_DT_UNANNOUNCED", f"t={frame.timestamp:.6f} TP.DT from SA {sa} (packet "
                              f"{sequence}) without an announced transfer; ignored",
                              source_address=sa, destination_address=da, timestamp=frame.timestamp, sequence=sequence)
            return []
        if not 1 <= sequence <= session.packets:
            self.warnings.add("J1939_TP_DT_OUT_OF_RANGE", f"t={frame.timestamp:.6f} TP.DT from SA {sa}: packet "
                              f"{sequence} outside 1..{session.packets}; ignored", source_address=sa,
                              destination_address=da, pgn=session.pgn, timestamp=frame.timestamp, sequence=sequence,
                              packets=session.packets)
            return []
        session.received[sequence] = bytes(data[1:8])  # a resent packet (RTS/CTS) replaces the first copy
        if len(session.received) < session.packets:
            return []
        del self._sessions[(sa, da)]
        self.transport_complete += 1
        payload = b"".join(session.received[n] for n in range(1, session.packets + 1))[:session.size]
        spns = self.catalog.decode_spns(session.pgn, payload)
        self._count(session.pgn, sa, spns)
        events: list[tuple[str, dict[str, Any]]] = [("j1939_transport", {
            "pgn": session.pgn,
            "acronym": self.catalog.pgn_names.get(session.pgn, (None, None))[0],
            "mode": session.mode,
            "source_address": sa,
            "destination_address": da,
            "size": session.size,
            "packet_count": session.packets,
            "data": payload.hex(),
            "timestamp": session.timestamp,
            "end_timestamp": frame.timestamp,
            "spns": spns,
        })]
        if session.pgn in _DM_PGNS:
            events.append(self._dm(session.pgn, sa, session.mode, session.timestamp, payload))
        return events

    def _dm(self, pgn: int, sa: int, transport: str, timestamp: float, data: bytes) -> tuple[str, dict[str, Any]]:
        kind = _DM_PGNS[pgn]
        self.dm_count[kind] += 1
        payload = {"source_address": sa, "transport": transport, "timestamp": timestamp,
                   **decode_dm(data, self.catalog.spn_names)}
        self._latest_dm[(kind, sa)] = {"type": kind, **payload}
        return f"j1939_{kind.lower()}", payload


