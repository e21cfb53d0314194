"""DBC (and KCD/SYM/ARXML) decoding with cantools, one frame at a time.

:func:`load_dbc` reads the database (cantools is imported there, not at module
import); :class:`DbcDecoder` matches frames by arbitration ID or, for J1939
messages, by PGN (J1939 DBCs store a placeholder source address, e.g.
``0x0CF004FE``), reassembles messages longer than 8 bytes with ISO 15765-2
(:mod:`canarchy.isotp`), and keeps per-signal running summaries.

Errors: ``DBC_NOT_FOUND`` (``UserInputError``, exit 1), ``DBC_LOAD_FAILED``
(``DecodeError``, exit 3). A frame that does not decode is a warning.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from canarchy.decode.common import MAX_UNKNOWN_IDS, ValueRange, hex_id, isotp_counts, j1939_pgn
from canarchy.errors import DecodeError, UserInputError
from canarchy.fileio import UnreadableFile, read_small_bytes
from canarchy.isotp import IsoTpReassembler
from canarchy.frames import CanFrame
from canarchy.warning_log import WarningLog

ISOTP_LAYOUTS = ("length-prefixed", "plain")
#: The largest signal database read, in bytes (an AUTOSAR ARXML of a whole vehicle runs to hundreds of MB).
DATABASE_LIMIT = 512 << 20


def load_dbc(path: str | os.PathLike[str]) -> tuple[Any, WarningLog]:
    """Load a signal database with cantools; return ``(database, warnings)`` (``DBC_NOT_STRICT``,
    ``DBC_NO_MESSAGES`` records).

    The text encoding is detected: UTF-8 when the file is valid UTF-8, else
    cp1252 (Vector tools write DBCs in the Windows code page; e.g. German
    comments), else ISO-8859-1. Line endings may be LF or CRLF. The database is
    loaded in cantools' strict mode; when only the strict checks fail (e.g.
    overlapping signals) it is loaded again without them and a warning says so.

    Raises ``UserInputError`` ``DBC_NOT_FOUND`` (exit 1) when ``path`` is not a regular file of at most
    :data:`DATABASE_LIMIT` bytes (:func:`~canarchy.fileio.read_small_bytes`), ``DecodeError``
    ``DBC_LOAD_FAILED`` (exit 3) when it does not parse.
    """
    text_path = str(path)
    try:
        raw = read_small_bytes(Path(text_path), DATABASE_LIMIT)
    except UnreadableFile as exc:
        raise UserInputError("DBC_NOT_FOUND", f"DBC file {text_path!r} {exc.reason}.", exc.hint) from None
    if raw is None:
        raise UserInputError("DBC_NOT_FOUND", f"DBC file {text_path!r} does not exist.",
                             "Check the path passed to --dbc (relative paths start at the current directory).")
    encoding = _detect_encoding(raw)
    import cantools  # imported here: only the decode commands pay for it

    warnings = WarningLog()
    try:
        database = cantools.database.load_file(text_path, encoding=encoding, strict=True)
    except cantools.database.Error as strict_exc:
        try:
            database = cantools.database.load_file(text_path, encoding=encoding, strict=False)
        except Exception as exc:
            raise _load_failed(text_path, exc) from None
        warnings.add("DBC_NOT_STRICT",
                     f"{text_path}: loaded without cantools' strict checks: {_first_line(strict_exc)}",
                     file=text_path)
    except Exception as exc:  # cantools' parsers raise more than its own Error (e.g. ValueError, KeyError)
        raise _load_failed(text_path, exc) from None
    if not getattr(database, "messages", None):
        warnings.add("DBC_NO_MESSAGES", f"{text_path}: the database defines no messages; every frame will be unknown",
                     file=text_path)
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


def _choice_number(signal: Any, value: Any) -> Any:
    """The number a named value (a VAL_ entry, keyed by raw value) stands for, scaled like the signal's
    other values; None for a value that is not named."""
    raw = getattr(value, "value", None)
    if signal is None or getattr(value, "name", None) is None or not isinstance(raw, (int, float)):
        return None
    try:
        return signal.conversion.raw_to_scaled(raw, decode_choices=False)
    except Exception:  # a conversion cantools cannot apply: the name counts in first/last only
        return None


def _plain(value: Any) -> Any:
    """A cantools signal value as JSON: numbers stay numbers, named values become their name; an IEEE 754
    float signal's NaN or infinity, which JSON has no number for, is the string "NaN", "Infinity" or
    "-Infinity" (the spelling JavaScript and Python give them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
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
    SF/FF header, the layout of CSS Electronics' TP DBCs) or ``"plain"``; a
    CAN FD message (``VFrameFormat``) is never reassembled.

    :meth:`feed` returns the event payloads (0 or 1) for a frame:
    ``{message, arbitration_id, is_extended_id, timestamp, signals: {name: {value, unit}}}``,
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
                self._by_pgn.setdefault(j1939_pgn(message.frame_id), message)
        self._reassemblers: dict[tuple[int, bool], IsoTpReassembler] = {}
        self.frame_count = 0
        self.decoded_count = 0
        self.unknown_frame_count = 0
        self.decode_error_count = 0
        self.remote_frame_count = 0
        self.isotp_pdu_count = 0
        self.isotp_frame_count = 0  # frames fed to ISO-TP reassembly (their message is counted once, decoded)
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
            message = self._by_pgn.get(j1939_pgn(frame.arbitration_id))
            by_pgn = message is not None
        if message is None:
            self._unknown(frame)
            return []
        isotp = None
        if message.length > 8 and not frame.is_fd and not message.is_fd:  # a CAN FD message's frame: as it is
            self.isotp_frame_count += 1
            whole = self._reassembled(key, frame)
            if whole is None:
                return []
            data, timestamp, isotp = whole
        else:
            data, timestamp = frame.data, frame.timestamp
        values = self._values(message, frame, data, timestamp)
        if values is None:
            return []
        payload: dict[str, Any] = {
            "message": message.name,
            "arbitration_id": frame.arbitration_id,
            "is_extended_id": frame.is_extended_id,
            "timestamp": timestamp,
            "signals": self._signals(message, values),
        }
        if by_pgn:
            payload["pgn"] = j1939_pgn(frame.arbitration_id)
            payload["source_address"] = frame.arbitration_id & 0xFF
        if isotp is not None:
            payload["isotp"] = isotp
        return [payload]

    def _reassembled(self, key: tuple[int, bool], frame: CanFrame) -> tuple[bytes, float, dict[str, int]] | None:
        """Feed a frame of a message longer than 8 bytes to its ID's ISO-TP reassembler: ``(data, timestamp,
        {length, frame_count})`` when it completes one, else None."""
        machine = self._reassemblers.get(key)
        if machine is None:
            machine = self._reassemblers[key] = IsoTpReassembler(frame.arbitration_id)
        pdu = machine.feed(frame)
        self.warnings.extend(machine.warnings)
        machine.warnings.clear()
        if pdu is None:
            return None
        self.isotp_pdu_count += 1
        data = bytes([pdu.length_byte]) + pdu.data if self.isotp_layout == "length-prefixed" else pdu.data
        return data, pdu.timestamp, {"length": pdu.length, "frame_count": pdu.frame_count}

    def _values(self, message: Any, frame: CanFrame, data: bytes, timestamp: float) -> dict[str, Any] | None:
        """The signal values ``data`` decodes to (scaled, choices named), or None with a ``DBC_DECODE_FAILED``
        warning; a ``DBC_DATA_SHORT`` warning names the signals beyond data shorter than the message, a
        ``DBC_DATA_LONG`` one the data longer than it."""
        where = f"t={timestamp:.6f} {hex_id(frame.arbitration_id, frame.is_extended_id)} {message.name}"
        try:
            values = message.decode(data, decode_choices=True, scaling=True, allow_truncated=True)
            missing = self._cut_off(message, data, values)
        except Exception as exc:  # cantools raises its DecodeError and others (e.g. a bad multiplexer value)
            missing, why = None, _first_line(exc)
        else:
            why = f"{len(data)} of its {message.length} bytes: no signal inside them" if values == {} and missing \
                else None
        if why is not None:
            self.decode_error_count += 1
            self.warnings.add("DBC_DECODE_FAILED", f"{where}: does not decode: {why}",
                              arbitration_id=frame.arbitration_id, timestamp=timestamp, message_name=message.name)
            return None
        if missing:  # the signals that lie in the bytes the frame has are decoded; cantools' CLI refuses it whole
            self.warnings.add("DBC_DATA_SHORT", f"{where}: {len(data)} of its {message.length} bytes: "
                              f"{', '.join(missing)} not decoded (beyond the data)",
                              arbitration_id=frame.arbitration_id, timestamp=timestamp, message_name=message.name,
                              length=len(data), expected_length=message.length, missing_signals=missing)
        elif len(data) > message.length:  # cantools' CLI refuses it ("Wrong data size"): often another bus's DBC
            self.warnings.add("DBC_DATA_LONG", f"{where}: {len(data)} bytes, its message {message.length}: the bytes "
                              "past them are not decoded (is the database this bus's?)",
                              arbitration_id=frame.arbitration_id, timestamp=timestamp, message_name=message.name,
                              length=len(data), expected_length=message.length)
        return values

    def _signals(self, message: Any, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """``{name: {value, unit}}`` of a decoded message, counted into its summary."""
        signals = {}
        stats = self._message_stats(message)
        for name, value in values.items():
            try:
                signal = message.get_signal_by_name(name)
            except KeyError:
                signal = None
            unit = (signal.unit if signal is not None else "") or ""
            plain = _plain(value)
            signals[name] = {"value": plain, "unit": unit}
            series = stats["signals"].get(name)
            if series is None:
                series = stats["signals"][name] = (ValueRange(), unit)
            series[0].add(plain, _choice_number(signal, value))
        stats["count"] += 1
        self.decoded_count += 1
        return signals

    @staticmethod
    def _cut_off(message: Any, data: bytes, values: dict[str, Any]) -> list[str]:
        """The signals of ``message`` that ``data``, shorter than the message, does not reach (those the
        message decoded from the same bytes zero-padded to its length has and ``values`` has not)."""
        if len(data) >= message.length:
            return []
        whole = message.decode(data.ljust(message.length, b"\0"), decode_choices=False, scaling=False,
                               allow_truncated=True)
        return [name for name in whole if name not in values]

    def finish(self) -> None:
        """End of the capture: report ISO-TP messages left incomplete."""
        for machine in self._reassemblers.values():
            machine.finish()
            self.warnings.extend(machine.warnings)
            machine.warnings.clear()

    def summary(self) -> dict[str, Any]:
        """``{frame_count, decoded_count, unknown_frame_count, unknown_ids {hex id: count},
        unknown_ids_unlisted, decode_error_count, remote_frame_count, isotp_frame_count, isotp_pdu_count,
        isotp_counts: {hex id: {complete, dropped, incomplete}},
        messages: {name: {arbitration_id, is_extended_id, count, signals: {name: {unit, count, min, max, first,
        last}}}}}``."""
        messages = {}
        for name, stats in sorted(self._messages.items()):
            messages[name] = {
                "arbitration_id": stats["arbitration_id"],
                "is_extended_id": stats["is_extended_id"],
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
            "isotp_frame_count": self.isotp_frame_count,
            "isotp_pdu_count": self.isotp_pdu_count,
            "isotp_counts": isotp_counts(self._reassemblers.values()),
            "messages": messages,
        }

    def _unknown(self, frame: CanFrame) -> None:
        self.unknown_frame_count += 1
        label = hex_id(frame.arbitration_id, frame.is_extended_id)
        if label in self._unknown_ids:
            self._unknown_ids[label] += 1
        elif len(self._unknown_ids) < MAX_UNKNOWN_IDS:
            self._unknown_ids[label] = 1
        else:
            self._unlisted_unknown += 1

    def _message_stats(self, message: Any) -> dict[str, Any]:
        stats = self._messages.get(message.name)
        if stats is None:
            stats = self._messages[message.name] = {"arbitration_id": message.frame_id,
                                                    "is_extended_id": bool(message.is_extended_frame),
                                                    "count": 0, "signals": {}}
        return stats


