"""Decoding recorded CAN traffic: DBC signals, J1939 parameters and diagnostics over ISO-TP.

Three decoders, each fed frames one at a time (streaming: memory does not grow
with the capture; only bounded summaries are kept):

- :class:`DbcDecoder`: signals of a DBC (or KCD/SYM/ARXML) database through
  cantools. Frames are matched by arbitration ID; with J1939 matching (the
  database marks a message ``VFrameFormat J1939PG``, or ``j1939=True``) a
  29-bit frame also matches a message of the same PGN, because J1939 DBCs
  store IDs with a placeholder source address (``0x0CF004FE``: SA 0xFE).
  Messages longer than 8 bytes received as classic CAN frames are reassembled
  with ISO 15765-2 first (:mod:`canarchy.isotp`).
- :class:`J1939Decoder`: per frame the PGN, priority, SA and the values of the
  SPNs the bundled catalog places in it (:mod:`canarchy.j1939_metadata`:
  start bit, length, resolution, offset; SAE J1939-71); transport protocol
  reassembly (BAM and RTS/CTS, SAE J1939-21); DM1/DM2 diagnostic messages
  (lamps and DTCs, SAE J1939-73).
- :func:`describe_diagnostic_pdu`: names the service of a reassembled ISO-TP
  PDU (UDS, ISO 14229-1; OBD-II, SAE J1979 / ISO 15031-5; KWP2000, ISO
  14230-3) and decodes the OBD-II values it can (mode 01 PIDs, the VIN of mode
  09 PID 02, mode 03 DTCs).

Errors: :func:`load_dbc` raises ``UserInputError`` ``DBC_NOT_FOUND`` (exit 1)
and ``DecodeError`` ``DBC_LOAD_FAILED`` (exit 3). Frames that do not decode
are warnings, never errors. cantools is imported only inside :func:`load_dbc`;
python-can not at all. Output shapes: ``docs/decoding.md``.
"""

from __future__ import annotations

import decimal
import os
from pathlib import Path
from typing import Any, Iterable

from canarchy.errors import DecodeError, UserInputError
from canarchy.isotp import IsoTpPdu, IsoTpReassembler
from canarchy.transport import CanFrame

#: Warning strings kept per decoder; further ones are counted only.
MAX_WARNINGS = 50
#: Distinct unknown arbitration IDs listed in a summary; the rest are counted.
MAX_UNKNOWN_IDS = 256

ISOTP_LAYOUTS = ("length-prefixed", "plain")


class WarningLog:
    """A bounded list of warning strings: the first :data:`MAX_WARNINGS` kept, the rest counted."""

    def __init__(self, limit: int = MAX_WARNINGS) -> None:
        self.limit = limit
        self.items: list[str] = []
        self.dropped = 0

    def add(self, text: str) -> None:
        """Keep ``text`` if there is room, else count it."""
        if len(self.items) < self.limit:
            self.items.append(text)
        else:
            self.dropped += 1

    def extend(self, texts: Iterable[str]) -> None:
        """:meth:`add` each of ``texts``."""
        for text in texts:
            self.add(text)

    def render(self) -> list[str]:
        """The kept warnings, plus one line counting the dropped ones."""
        if not self.dropped:
            return list(self.items)
        return self.items + [f"{self.dropped} more warning(s) not listed (first {self.limit} shown)"]


def _hex_id(can_id: int, extended: bool) -> str:
    return f"0x{can_id:08X}" if extended else f"0x{can_id:03X}"


class _Range:
    """Count, min, max and last value of one numeric series (bounded memory)."""

    __slots__ = ("count", "min", "max", "first", "last")

    def __init__(self) -> None:
        self.count = 0
        self.min: Any = None
        self.max: Any = None
        self.first: Any = None
        self.last: Any = None

    def add(self, value: Any) -> None:
        self.count += 1
        self.last = value
        if self.count == 1:
            self.first = value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.min is None or value < self.min:
                self.min = value
            if self.max is None or value > self.max:
                self.max = value

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "min": self.min, "max": self.max, "first": self.first, "last": self.last}


# =====================================================================================
# DBC decoding (cantools)
# =====================================================================================


def load_dbc(path: str | os.PathLike[str]) -> tuple[Any, list[str]]:
    """Load a signal database with cantools; return ``(database, warnings)``.

    The text encoding is detected: UTF-8 when the file is valid UTF-8, else
    cp1252 (Vector tools write DBCs in the Windows code page; e.g. German
    comments), else ISO-8859-1. Line endings may be LF or CRLF. The database is
    loaded in cantools' strict mode; when only the strict checks fail (e.g.
    overlapping signals) it is loaded again without them and a warning says so.

    Raises ``UserInputError`` ``DBC_NOT_FOUND`` (exit 1) when ``path`` is not a
    file, ``DecodeError`` ``DBC_LOAD_FAILED`` (exit 3) when it does not parse.
    """
    text_path = str(path)
    target = Path(text_path)
    if not target.is_file():
        raise UserInputError("DBC_NOT_FOUND", f"DBC file {text_path!r} does not exist"
                             + (" (it is a directory)." if target.is_dir() else "."),
                             "Check the path passed to --dbc (relative paths start at the current directory).")
    try:
        raw = target.read_bytes()
    except OSError as exc:
        raise UserInputError("DBC_NOT_FOUND", f"DBC file {text_path!r} cannot be read: {exc.strerror or exc}.",
                             "Check the file's permissions.") from None
    encoding = _detect_encoding(raw)
    import cantools  # imported here: only the decode commands pay for it

    warnings: list[str] = []
    try:
        database = cantools.database.load_file(text_path, encoding=encoding, strict=True)
    except cantools.database.Error as strict_exc:
        try:
            database = cantools.database.load_file(text_path, encoding=encoding, strict=False)
        except Exception as exc:
            raise _load_failed(text_path, exc) from None
        warnings.append(f"{text_path}: loaded without cantools' strict checks: {_first_line(strict_exc)}")
    except Exception as exc:  # cantools' parsers raise more than its own Error (e.g. ValueError, KeyError)
        raise _load_failed(text_path, exc) from None
    if not getattr(database, "messages", None):
        warnings.append(f"{text_path}: the database defines no messages; every frame will be unknown")
    return database, warnings


def _detect_encoding(raw: bytes) -> str:
    for encoding in ("utf-8", "cp1252"):
        try:
            raw.decode(encoding)
            return encoding
        except UnicodeDecodeError:
            continue
    return "iso-8859-1"  # decodes any byte


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or exc.__class__.__name__
    return text.splitlines()[0]


def _load_failed(path: str, exc: BaseException) -> DecodeError:
    return DecodeError("DBC_LOAD_FAILED", f"{path!r} does not load as a signal database: {_first_line(exc)}",
                       "Check that it is a DBC (or KCD/SYM/ARXML) file and that the line named above is valid; "
                       "`python -m cantools dump FILE` shows the same parser's view.")


def _j1939_pgn(can_id: int) -> int:
    """PGN of a 29-bit ID (SAE J1939-21): PDU1 (PF < 240) drops the destination byte."""
    pgn = (can_id >> 8) & 0x3FFFF
    return pgn & 0x3FF00 if (pgn >> 8) & 0xFF < 240 else pgn


def _plain(value: Any) -> Any:
    """A cantools signal value as JSON: numbers stay numbers, named values become their name."""
    if isinstance(value, (int, float)) or value is None:
        return value
    name = getattr(value, "name", None)
    if name is not None:
        return str(name)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return str(value)


class DbcDecoder:
    """Decode frames with a cantools database, one frame at a time.

    ``j1939``: match every 29-bit message by PGN as well (otherwise only the
    messages the database marks as J1939). ``isotp_layout``: how a message
    longer than 8 bytes is laid over a reassembled ISO-TP payload:
    ``"length-prefixed"`` (the payload preceded by the length byte of its
    SF/FF header, the layout of CSS Electronics' TP DBCs) or ``"plain"``.

    :meth:`feed` returns the event payloads (0 or 1) for a frame:
    ``{message, arbitration_id, timestamp, signals: {name: {value, unit}}}``,
    plus ``pgn`` and ``source_address`` when matched by PGN and ``isotp``
    (``{length, frame_count}``) when reassembled. Counters and bounded
    summaries: :meth:`summary`. Warnings: ``warnings`` (:class:`WarningLog`).
    """

    def __init__(self, database: Any, *, j1939: bool = False, isotp_layout: str = "length-prefixed") -> None:
        if isotp_layout not in ISOTP_LAYOUTS:
            raise ValueError(f"isotp_layout must be one of {ISOTP_LAYOUTS}")
        self.j1939 = j1939
        self.isotp_layout = isotp_layout
        self.warnings = WarningLog()
        self._by_id: dict[tuple[int, bool], Any] = {}
        self._by_pgn: dict[int, Any] = {}
        for message in database.messages:
            extended = bool(message.is_extended_frame)
            self._by_id.setdefault((message.frame_id, extended), message)
            if extended and (j1939 or (message.protocol or "").lower() == "j1939"):
                self._by_pgn.setdefault(_j1939_pgn(message.frame_id), message)
        self._reassemblers: dict[tuple[int, bool], IsoTpReassembler] = {}
        self.frame_count = 0
        self.decoded_count = 0
        self.unknown_frame_count = 0
        self.decode_error_count = 0
        self.remote_frame_count = 0
        self.isotp_pdu_count = 0
        self._unknown_ids: dict[str, int] = {}
        self._unlisted_unknown = 0
        self._messages: dict[str, dict[str, Any]] = {}

    @property
    def j1939_message_count(self) -> int:
        """Messages matched by PGN (J1939) rather than by exact ID."""
        return len(self._by_pgn)

    def feed(self, frame: CanFrame) -> list[dict[str, Any]]:
        """Decode one frame; return the decoded-message payloads it completes (0 or 1)."""
        self.frame_count += 1
        if frame.is_remote_frame:
            self.remote_frame_count += 1
            return []
        key = (frame.arbitration_id, frame.is_extended_id)
        message = self._by_id.get(key)
        by_pgn = False
        if message is None and frame.is_extended_id and self._by_pgn:
            message = self._by_pgn.get(_j1939_pgn(frame.arbitration_id))
            by_pgn = message is not None
        if message is None:
            self._unknown(frame)
            return []
        data = frame.data
        isotp = None
        if message.length > 8 and not frame.is_fd:
            machine = self._reassemblers.get(key)
            if machine is None:
                machine = self._reassemblers[key] = IsoTpReassembler(frame.arbitration_id)
            pdu = machine.feed(frame)
            self.warnings.extend(machine.warnings)
            machine.warnings.clear()
            if pdu is None:
                return []
            self.isotp_pdu_count += 1
            data = bytes([pdu.length_byte]) + pdu.data if self.isotp_layout == "length-prefixed" else pdu.data
            isotp = {"length": pdu.length, "frame_count": pdu.frame_count}
            timestamp = pdu.timestamp
        else:
            timestamp = frame.timestamp
        try:
            values = message.decode(data, decode_choices=True, scaling=True, allow_truncated=True)
        except Exception as exc:  # cantools raises its DecodeError and others (e.g. a bad multiplexer value)
            self.decode_error_count += 1
            self.warnings.add(f"t={timestamp:.6f} {_hex_id(frame.arbitration_id, frame.is_extended_id)} "
                              f"{message.name}: does not decode: {_first_line(exc)}")
            return []
        signals = {}
        stats = self._message_stats(message)
        for name, value in values.items():
            try:
                unit = message.get_signal_by_name(name).unit or ""
            except KeyError:
                unit = ""
            plain = _plain(value)
            signals[name] = {"value": plain, "unit": unit}
            series = stats["signals"].get(name)
            if series is None:
                series = stats["signals"][name] = (_Range(), unit)
            series[0].add(plain)
        stats["count"] += 1
        self.decoded_count += 1
        payload: dict[str, Any] = {
            "message": message.name,
            "arbitration_id": frame.arbitration_id,
            "timestamp": timestamp,
            "signals": signals,
        }
        if by_pgn:
            payload["pgn"] = _j1939_pgn(frame.arbitration_id)
            payload["source_address"] = frame.arbitration_id & 0xFF
        if isotp is not None:
            payload["isotp"] = isotp
        return [payload]

    def finish(self) -> None:
        """End of the capture: report ISO-TP messages left incomplete."""
        for machine in self._reassemblers.values():
            machine.finish()
            self.warnings.extend(machine.warnings)
            machine.warnings.clear()

    def summary(self) -> dict[str, Any]:
        """``{frame_count, decoded_count, unknown_frame_count, unknown_ids {hex id: count},
        unknown_ids_unlisted, decode_error_count, remote_frame_count, isotp_pdu_count,
        messages: {name: {arbitration_id, count, signals: {name: {unit, count, min, max, first, last}}}}}``."""
        messages = {}
        for name, stats in sorted(self._messages.items()):
            messages[name] = {
                "arbitration_id": stats["arbitration_id"],
                "count": stats["count"],
                "signals": {sig: {"unit": unit, **series.to_dict()}
                            for sig, (series, unit) in sorted(stats["signals"].items())},
            }
        return {
            "frame_count": self.frame_count,
            "decoded_count": self.decoded_count,
            "unknown_frame_count": self.unknown_frame_count,
            "unknown_ids": dict(sorted(self._unknown_ids.items())),
            "unknown_ids_unlisted": self._unlisted_unknown,
            "decode_error_count": self.decode_error_count,
            "remote_frame_count": self.remote_frame_count,
            "isotp_pdu_count": self.isotp_pdu_count,
            "messages": messages,
        }

    def _unknown(self, frame: CanFrame) -> None:
        self.unknown_frame_count += 1
        label = _hex_id(frame.arbitration_id, frame.is_extended_id)
        if label in self._unknown_ids:
            self._unknown_ids[label] += 1
        elif len(self._unknown_ids) < MAX_UNKNOWN_IDS:
            self._unknown_ids[label] = 1
        else:
            self._unlisted_unknown += 1

    def _message_stats(self, message: Any) -> dict[str, Any]:
        stats = self._messages.get(message.name)
        if stats is None:
            stats = self._messages[message.name] = {"arbitration_id": message.frame_id, "count": 0, "signals": {}}
        return stats


# =====================================================================================
# J1939 (SAE J1939-21 / -71 / -73)
# =====================================================================================

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

    __slots__ = ("spn", "name", "unit", "kind", "start_bit", "bit_length", "mask", "resolution", "offset",
                 "digits", "ascii", "states")

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
        self.states = {int(k): str(v) for k, v in states.items() if str(k).isdecimal()} if isinstance(states, dict) else {}

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
    ``warnings``: from reading the override file.
    """

    def __init__(self) -> None:
        from canarchy import j1939_metadata

        pgns, pgn_warnings = j1939_metadata.list_pgns()
        spns, spn_warnings = j1939_metadata.list_spns()
        self.warnings = list(dict.fromkeys(pgn_warnings + spn_warnings))
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
    __slots__ = ("mode", "pgn", "size", "packets", "received", "timestamp")

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
        self.transport_complete = 0
        self.transport_incomplete = 0
        self.dm_count = {"DM1": 0, "DM2": 0}
        self._sessions: dict[tuple[int, int], _TransportSession] = {}
        self._pgn_stats: dict[int, dict[str, Any]] = {}
        self._spn_stats: dict[int, tuple[_Range, str | None, str]] = {}
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
        pgn = _j1939_pgn(can_id)
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
            self.warnings.add(f"J1939 TP {session.mode} PGN {session.pgn} from SA {sa} to {da} begun at "
                              f"t={session.timestamp:.6f}: incomplete at end of capture "
                              f"({len(session.received)} of {session.packets} packets)")
        self._sessions.clear()

    def summary(self) -> dict[str, Any]:
        """``{frame_count, j1939_frame_count, other_frame_count,
        pgns: {"<pgn>": {acronym, count, source_addresses}},
        spns: {"<spn>": {name, unit, count, min, max, first, last}},
        transport: {complete, incomplete}, dm1_count, dm2_count,
        dm: [{type, source_address, timestamp, lamps, dtc_count, dtcs}] (the latest per type and SA)}``."""
        return {
            "frame_count": self.frame_count,
            "j1939_frame_count": self.j1939_frame_count,
            "other_frame_count": self.other_frame_count,
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
        if stats is None:
            stats = self._pgn_stats[pgn] = {"acronym": self.catalog.pgn_names.get(pgn, (None, None))[0],
                                            "count": 0, "source_addresses": set()}
        stats["count"] += 1
        stats["source_addresses"].add(sa)
        for item in spns:
            if item["status"] != "ok":
                continue
            entry = self._spn_stats.get(item["spn"])
            if entry is None:
                entry = self._spn_stats[item["spn"]] = (_Range(), item["name"], item["unit"])
            entry[0].add(item["value"])

    def _connection(self, frame: CanFrame, sa: int, da: int, data: bytes) -> None:
        if len(data) < 8:
            self.warnings.add(f"t={frame.timestamp:.6f} TP.CM from SA {sa}: {len(data)} bytes, expected 8")
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
                self.warnings.add(f"t={frame.timestamp:.6f} TP {mode} from SA {sa}: a new transfer replaces "
                                  f"PGN {old.pgn} begun at t={old.timestamp:.6f} "
                                  f"({len(old.received)} of {old.packets} packets)")
            if not 9 <= size <= 1785 or packets != -(-size // 7):
                self.warnings.add(f"t={frame.timestamp:.6f} TP {mode} from SA {sa}: size {size} and "
                                  f"{packets} packets do not agree (SAE J1939-21: 9..1785 bytes, 7 per packet)")
                self._sessions.pop(key, None)
                return
            self._sessions[key] = _TransportSession(mode, pgn, size, packets, frame.timestamp)
        elif control == TP_CM_ABORT:
            if self._sessions.pop(key, None) is not None or self._sessions.pop((da, sa), None) is not None:
                self.transport_incomplete += 1
        # CTS and EndOfMsgAck steer the sender; a passive reader needs nothing from them.

    def _data_transfer(self, frame: CanFrame, sa: int, da: int, data: bytes) -> list[tuple[str, dict[str, Any]]]:
        session = self._sessions.get((sa, da))
        if not data:
            return []
        sequence = data[0]
        if session is None:
            self.warnings.add(f"t={frame.timestamp:.6f} TP.DT from SA {sa} (packet {sequence}) "
                              f"without an announced transfer; ignored")
            return []
        if not 1 <= sequence <= session.packets:
            self.warnings.add(f"t={frame.timestamp:.6f} TP.DT from SA {sa}: packet {sequence} outside "
                              f"1..{session.packets}; ignored")
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


# =====================================================================================
# Diagnostics over ISO-TP: UDS (ISO 14229-1), OBD-II (SAE J1979), KWP2000 (ISO 14230-3)
# =====================================================================================

# SAE J1979 / ISO 15031-5 service ($01-$0A) names, restated.
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

# SAE J1979 mode $01 PIDs: (name, unit, formula over the data bytes A, B).
OBD_PIDS: dict[int, tuple[str, str, Any]] = {
    0x04: ("Calculated engine load", "%", lambda d: round(d[0] * 100 / 255, 2)),
    0x05: ("Engine coolant temperature", "°C", lambda d: d[0] - 40),
    0x0B: ("Intake manifold absolute pressure", "kPa", lambda d: d[0]),
    0x0C: ("Engine speed", "rpm", lambda d: (256 * d[0] + d[1]) / 4),
    0x0D: ("Vehicle speed", "km/h", lambda d: d[0]),
    0x0F: ("Intake air temperature", "°C", lambda d: d[0] - 40),
    0x10: ("Mass air flow rate", "g/s", lambda d: (256 * d[0] + d[1]) / 100),
    0x11: ("Throttle position", "%", lambda d: round(d[0] * 100 / 255, 2)),
    0x1F: ("Run time since engine start", "s", lambda d: 256 * d[0] + d[1]),
    0x21: ("Distance traveled with MIL on", "km", lambda d: 256 * d[0] + d[1]),
    0x2F: ("Fuel tank level input", "%", lambda d: round(d[0] * 100 / 255, 2)),
    0x31: ("Distance traveled since codes cleared", "km", lambda d: 256 * d[0] + d[1]),
    0x33: ("Absolute barometric pressure", "kPa", lambda d: d[0]),
    0x42: ("Control module voltage", "V", lambda d: (256 * d[0] + d[1]) / 1000),
    0x46: ("Ambient air temperature", "°C", lambda d: d[0] - 40),
    0x5C: ("Engine oil temperature", "°C", lambda d: d[0] - 40),
}
# Data bytes of each PID above (SAE J1979).
_OBD_PID_LENGTH = {0x04: 1, 0x05: 1, 0x0B: 1, 0x0C: 2, 0x0D: 1, 0x0F: 1, 0x10: 2, 0x11: 1, 0x1F: 2, 0x21: 2,
                   0x2F: 1, 0x31: 2, 0x33: 1, 0x42: 2, 0x46: 1, 0x5C: 1}
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
        self.multi_frame = 0
        self.services: dict[str, dict[str, Any]] = {}
        self.vin: str | None = None
        self.obd: dict[str, tuple[_Range, str, str]] = {}

    def add(self, described: dict[str, Any]) -> None:
        self.pdu_count += 1
        if described["frame_count"] > 1:
            self.multi_frame += 1
        if described["direction"] == "request":
            self.requests += 1
        else:
            self.responses += 1
            if described.get("positive") is False:
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
                    slot = self.obd[item["pid"]] = (_Range(), item["name"], item["unit"])
                slot[0].add(item["value"])

    def to_dict(self) -> dict[str, Any]:
        """``{pdu_count, request_count, response_count, negative_response_count, multi_frame_count,
        services: {"0x22": {service_name, protocol, requests, responses}}, vin,
        obd_pids: {"0x0C": {name, unit, count, min, max, first, last}}}``."""
        return {
            "pdu_count": self.pdu_count,
            "request_count": self.requests,
            "response_count": self.responses,
            "negative_response_count": self.negative,
            "multi_frame_count": self.multi_frame,
            "services": dict(sorted(self.services.items())),
            "vin": self.vin,
            "obd_pids": {pid: {"name": name, "unit": unit, **series.to_dict()}
                         for pid, (series, name, unit) in sorted(self.obd.items())},
        }
