"""Decoding real captures: `decode` (DBC via cantools), `j1939 decode`, `isotp decode`, and canarchy.isotp.

Expected values are computed in the tests themselves from the candump text
(plain string slicing and the published formulas), not taken from canarchy.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from canarchy.cli import main
from canarchy.decode.dbc import load_dbc
from canarchy.decode.diagnostics import describe_diagnostic_pdu, obd_dtc
from canarchy.decode.j1939 import decode_dm
from canarchy.errors import DecodeError, UserInputError
from canarchy.isotp import IsoTpPdu, IsoTpReassembler, reassemble
from canarchy.frames import CanFrame
from tests.helpers import run_cli, same_value_ids

CAPTURES = Path(__file__).parent.parent / "fixtures" / "captures"
TRUCK = CAPTURES / "j1939_truck_idle.log"
LEAF = CAPTURES / "nissan_leaf_uds_79b_7bb.log"
SKODA = CAPTURES / "obd2_skoda_7e0_7e8.log"
J1939_DBC = CAPTURES / "css_j1939_demo.dbc"
LEAF_DBC = CAPTURES / "css_tp_uds_nissan_leaf.dbc"
PRIUS_DBC = CAPTURES / "toyota_prius_2010_pt.dbc"
BOSCH_DBC = CAPTURES / "bosch_motorsport_abs.dbc"


def _raw(path: Path) -> list[tuple[float, str, bytes]]:
    """(timestamp, ID text, data) per line, by plain string slicing."""
    out = []
    for line in path.read_text(encoding="ascii").splitlines():
        stamp, _channel, body = line.split()
        ident, data = body.split("#")
        out.append((float(stamp.strip("()")), ident, bytes.fromhex(data)))
    return out


def _isotp_by_hand(path: Path, ident: str) -> list[tuple[float, bytes]]:
    """ISO 15765-2 reassembly of one ID, written out plainly: (first-frame timestamp, payload)."""
    pdus, buf, want, start = [], b"", 0, 0.0
    for stamp, can_id, data in _raw(path):
        if can_id != ident:
            continue
        kind = data[0] >> 4
        if kind == 0:
            pdus.append((stamp, data[1:1 + (data[0] & 0xF)]))
        elif kind == 1:
            want, buf, start = ((data[0] & 0xF) << 8) | data[1], data[2:], stamp
        elif kind == 2 and want:
            buf += data[1:]
            if len(buf) >= want:
                pdus.append((start, buf[:want]))
                want = 0
    return pdus


def _events(result, event_type: str) -> list[dict]:
    return [e["payload"] for e in result.data["events"] if e["event_type"] == event_type]


# -- decode --dbc: J1939 by PGN ----------------------------------------------------------------


def test_truck_engine_speed_matches_the_j1939_71_formula():
    expected = [int.from_bytes(data[3:5], "little") * 0.125 for _, ident, data in _raw(TRUCK) if ident == "0CF00400"]
    assert len(expected) == 1000 and (min(expected), max(expected)) == (646.75, 653.75)
    result = run_cli("decode", "--file", str(TRUCK), "--dbc", str(J1939_DBC), "--json")
    assert result.code == 0
    eec1 = [p for p in _events(result, "decoded_message") if p["message"] == "EEC1"]
    assert [p["signals"]["EngineSpeed"]["value"] for p in eec1] == expected
    assert {p["signals"]["EngineSpeed"]["unit"] for p in eec1} == {"rpm"}
    # Matched by PGN: the DBC says 0x0CF004FE, the frames carry SA 0x00.
    assert {(p["arbitration_id"], p["pgn"], p["source_address"]) for p in eec1} == {(0x0CF00400, 61444, 0)}
    summary = result.data["messages"]["EEC1"]["signals"]["EngineSpeed"]
    assert (summary["count"], summary["min"], summary["max"]) == (1000, 646.75, 653.75)


def test_truck_vehicle_speed_and_unknown_ids_are_counted():
    result = run_cli("decode", "--file", str(TRUCK), "--dbc", str(J1939_DBC), "--summary", "--json")
    data = result.data
    assert result.code == 0 and "events" not in data
    ccvs1 = data["messages"]["CCVS1"]
    assert ccvs1["count"] == 100 and ccvs1["signals"]["WheelBasedVehicleSpeed"]["max"] == 0.0
    raw = _raw(TRUCK)
    unknown = sum(1 for _, ident, _d in raw if ident not in ("0CF00400", "0CFEF100"))
    assert (data["frame_count"], data["decoded_count"], data["unknown_frame_count"]) == (3582, 1100, unknown)
    assert data["unknown_ids"]["0x18FEDF00"] == sum(1 for _, ident, _d in raw if ident == "18FEDF00")
    assert data["j1939_message_count"] == 2 and result.envelope["warnings"] == []


def test_j1939_flag_matches_by_pgn_when_the_dbc_does_not_say_j1939(tmp_path):
    plain = tmp_path / "plain.dbc"
    # Mark both messages ExtendedCAN (enum index 1) instead of J1939PG (3).
    text = J1939_DBC.read_text(encoding="utf-8")
    for frame_id in ("2364540158", "2566844926"):
        text = text.replace(f'BA_ "VFrameFormat" BO_ {frame_id} 3;', f'BA_ "VFrameFormat" BO_ {frame_id} 1;')
    assert text.count('"VFrameFormat" BO_') == 2 and ' 3;' not in text.split('"VFrameFormat" BO_', 1)[1][:40]
    plain.write_text(text, encoding="utf-8")
    exact = run_cli("decode", "--file", str(TRUCK), "--dbc", str(plain), "--summary", "--json")
    by_pgn = run_cli("decode", "--file", str(TRUCK), "--dbc", str(plain), "--j1939", "--summary", "--json")
    assert (exact.data["decoded_count"], exact.data["j1939_message_count"]) == (0, 0)
    assert (by_pgn.data["decoded_count"], by_pgn.data["j1939_message_count"]) == (1100, 2)


# -- decode --dbc: ISO-TP payloads (Nissan Leaf) -----------------------------------------------


def test_leaf_state_of_charge_after_isotp_reassembly():
    answers = [(stamp, pdu) for stamp, pdu in _isotp_by_hand(LEAF, "7BB") if pdu[:2] == b"\x61\x01"]
    # The DBC lays SoC at big-endian bit 279 of [length byte] + PDU: PDU bytes 33..35, 0.0001 %/bit.
    expected = [round(int.from_bytes(pdu[33:36], "big") * 0.0001, 4) for _, pdu in answers]
    assert expected[:2] == [89.2286, 89.2184] and len(expected) == 13
    result = run_cli("decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC), "--json")
    assert result.code == 0
    decoded = _events(result, "decoded_message")
    soc = [p for p in decoded if "SoC" in p["signals"]]
    assert [round(p["signals"]["SoC"]["value"], 4) for p in soc] == expected
    assert [p["timestamp"] for p in soc] == [stamp for stamp, _ in answers]
    assert soc[0]["signals"]["SoC"]["unit"] == "%" and soc[0]["isotp"] == {"length": 53, "frame_count": 8}
    temps = [p for p in decoded if "BatPackTemp1" in p["signals"]]
    assert len(temps) == 13 and temps[0]["signals"]["BatPackTemp1"]["value"] == 2
    assert (result.data["isotp_pdu_count"], result.data["decoded_count"]) == (26, 26)
    assert result.data["unknown_ids"] == {"0x79B": 52}


def test_the_text_summary_counts_the_frames_of_iso_tp_transfers():
    """Every frame is in the summary line: the Leaf's 0x7BB frames are segments of 26 reassembled messages."""
    result = run_cli("decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC), "--summary", "--json")
    d = result.data
    assert d["isotp_frame_count"] + d["unknown_frame_count"] == d["frame_count"] and d["isotp_frame_count"] > 26
    text = run_cli("decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC), "--summary", "--text").out
    assert f"{d['isotp_frame_count']} in ISO-TP transfers (26 reassembled)" in text.splitlines()[0]


FRAME_FORMATS = ",".join(f'"{name}"' for name in ["StandardCAN", "ExtendedCAN", "reserved", "J1939PG",
                                                    *["reserved"] * 10, "StandardCAN_FD", "ExtendedCAN_FD"])
FD_DBC = f"""VERSION ""
BU_: A
BO_ 2147484177 FDMSG: 64 A
 SG_ S1 : 0|16@1- (0.5,-10) [0|0] "V" A
 SG_ TAIL : 504|8@1+ (1,0) [0|0] "" A
BA_DEF_ BO_ "VFrameFormat" ENUM {FRAME_FORMATS};
BA_DEF_DEF_ "VFrameFormat" "StandardCAN";
BA_ "VFrameFormat" BO_ 2147484177 15;
"""


def test_a_classic_frame_of_a_can_fd_message_is_decoded_as_it_is(tmp_path):
    """A message the DBC marks CAN FD (``VFrameFormat`` ``ExtendedCAN_FD``) is no ISO-TP transfer, however long:
    a classic 8-byte frame of it decodes the signals its bytes hold (``DBC_DATA_SHORT`` names the rest)."""
    dbc, log = tmp_path / "fd.dbc", tmp_path / "fd.log"
    dbc.write_text(FD_DBC)
    log.write_text("(1.000000) can0 00000211##1FDFF020000000000C0BF0000\n(1.000001) can0 00000211#FDFF020000000000\n")
    result = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--json")
    assert result.code == 0, result.out
    assert (result.data["frame_count"], result.data["decoded_count"], result.data["isotp_frame_count"]) == (2, 2, 0)
    assert [p["signals"]["S1"]["value"] for p in _events(result, "decoded_message")] == [-11.5, -11.5]
    assert result.data["warning_counts"] == {"DBC_DATA_SHORT": 2}


def test_leaf_plain_layout_shifts_the_signals():
    result = run_cli("decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC), "--isotp-layout", "plain",
                     "--summary", "--json")
    # Without the length byte the multiplexer reads 0x01/0x04 instead of 0x61: nothing decodes as SoC.
    assert "SoC" not in result.data["messages"].get("SoC_Temp", {}).get("signals", {})


# -- decode --dbc: databases -------------------------------------------------------------------


def test_cp1252_crlf_dbc_loads():
    raw = BOSCH_DBC.read_bytes()
    assert b"\r\n" in raw
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    database, warnings = load_dbc(BOSCH_DBC)
    assert warnings.render() == [] and len(database.messages) == 18
    yaw = next(s for m in database.messages for s in m.signals if s.name == "Yaw_Rate")
    assert yaw.unit == "°/s"


def test_a_dbc_matching_nothing_counts_every_frame_unknown():
    result = run_cli("decode", "--file", str(TRUCK), "--dbc", str(PRIUS_DBC), "--summary", "--json")
    assert result.code == 0
    assert (result.data["decoded_count"], result.data["unknown_frame_count"]) == (0, 3582)


def test_missing_dbc_is_dbc_not_found(tmp_path):
    result = run_cli("decode", "--file", str(TRUCK), "--dbc", str(tmp_path / "none.dbc"), "--json")
    assert (result.code, result.error_codes) == (1, ["DBC_NOT_FOUND"])
    assert result.envelope["errors"][0]["message"].endswith("does not exist.")
    with pytest.raises(UserInputError, match="is a directory"):  # it said "does not exist" of it
        load_dbc(tmp_path)


def test_a_dbc_that_is_a_named_pipe_is_named_so_and_never_waited_on(tmp_path):
    """A named pipe given as --dbc was reported as missing; it is no regular file, said so at once."""
    import os

    os.mkfifo(tmp_path / "bus.dbc")
    result = run_cli("decode", "--file", str(TRUCK), "--dbc", str(tmp_path / "bus.dbc"), "--json")
    assert (result.code, result.error_codes) == (1, ["DBC_NOT_FOUND"])
    assert "is not a regular file (a pipe" in result.envelope["errors"][0]["message"], result.envelope


def test_a_dbc_that_does_not_parse_is_dbc_load_failed(tmp_path):
    broken = tmp_path / "broken.dbc"
    broken.write_text('VERSION ""\nBO_ this is not a message\n', encoding="ascii")
    result = run_cli("decode", "--file", str(TRUCK), "--dbc", str(broken), "--json")
    assert (result.code, result.error_codes) == (3, ["DBC_LOAD_FAILED"])
    assert result.envelope["errors"][0]["hint"]
    with pytest.raises(DecodeError):
        load_dbc(broken)


def test_a_dbc_failing_only_strict_checks_loads_with_a_warning(tmp_path):
    overlapping = tmp_path / "overlap.dbc"
    overlapping.write_text('VERSION ""\nBS_:\nBU_:\nBO_ 2035 M: 8 X\n SG_ A : 0|8@1+ (1,0) [0|0] "" X\n'
                           ' SG_ B : 4|8@1+ (1,0) [0|0] "" X\n', encoding="ascii")
    database, warnings = load_dbc(overlapping)
    assert len(database.messages) == 1
    assert warnings.counts == {"DBC_NOT_STRICT": 1} and "strict" in warnings.render()[0]
    assert warnings.records[0].details == {"file": str(overlapping)}


def test_decode_errors_for_the_capture(tmp_path):
    missing = run_cli("decode", "--file", str(tmp_path / "x.log"), "--dbc", str(J1939_DBC), "--json")
    assert (missing.code, missing.error_codes) == (2, ["CAPTURE_SOURCE_UNAVAILABLE"])
    (tmp_path / "x.bin").write_bytes(b"")
    unknown = run_cli("decode", "--file", str(tmp_path / "x.bin"), "--dbc", str(J1939_DBC), "--json")
    assert (unknown.code, unknown.error_codes) == (1, ["CAPTURE_FORMAT_UNSUPPORTED"])


def test_corrupted_lines_are_warnings_and_the_rest_decodes(tmp_path):
    lines = TRUCK.read_text(encoding="ascii").splitlines()
    eec1_lines = [n for n, line in enumerate(lines, 1) if " 0CF00400#" in line]
    broken = eec1_lines[:3]
    for n in broken:
        lines[n - 1] = lines[n - 1][:-3]  # cut a hex digit and a byte: odd length
    path = tmp_path / "truck_damaged.log"
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    result = run_cli("decode", "--file", str(path), "--dbc", str(J1939_DBC), "--summary", "--json")
    assert result.code == 0
    assert result.data["messages"]["EEC1"]["count"] == 1000 - 3
    assert [w.split(": ")[0] for w in result.envelope["warnings"]] == [f"{path}:{n}" for n in broken]


# -- j1939 decode: SPNs from the bundled catalog, TP.BAM, DM1 ----------------------------------


def test_j1939_decode_engine_speed_priority_and_sa():
    expected = [int.from_bytes(data[3:5], "little") * 0.125 for _, ident, data in _raw(TRUCK) if ident == "0CF00400"]
    result = run_cli("j1939", "decode", "--file", str(TRUCK), "--pgn", "0xF004", "--json")
    assert result.code == 0
    frames = _events(result, "j1939_frame")
    assert len(frames) == 1000
    assert {(f["pgn"], f["acronym"], f["priority"], f["source_address"], f["destination_address"]) for f in frames} \
        == {(61444, "EEC1", 3, 0, None)}
    speeds = [next(s for s in f["spns"] if s["spn"] == 190) for f in frames]
    assert [s["value"] for s in speeds] == expected
    assert {(s["unit"], s["status"], s["name"]) for s in speeds} == {("rpm", "ok", "Engine Speed")}
    summary = result.data["spns"]["190"]
    assert (summary["min"], summary["max"], summary["count"]) == (646.75, 653.75, 1000)


def test_j1939_decode_not_available_values_are_flagged():
    result = run_cli("j1939", "decode", "--file", str(TRUCK), "--pgn", "65247", "--json")
    first = _events(result, "j1939_frame")[0]
    raw = next(data for _, ident, data in _raw(TRUCK) if ident == "18FEDF00")
    spn515 = next(s for s in first["spns"] if s["spn"] == 515)  # bytes 2-3, 0xFFFF here
    assert raw[1:3] == b"\xff\xff"
    assert (spn515["status"], spn515["value"], spn515["raw"]) == ("not_available", None, 0xFFFF)


def _dm1_by_hand() -> list[list[tuple[int, int, int, int]]]:
    """DM1s carried by TP.BAM in the truck log, decoded with the SAE J1939-73 bit layout."""
    transfers, current = [], None
    for _, ident, data in _raw(TRUCK):
        if ident == "1CECFF00" and data[0] == 0x20:
            size, packets, pgn = data[1] | data[2] << 8, data[3], data[5] | data[6] << 8 | data[7] << 16
            current = {"pgn": pgn, "size": size, "packets": packets, "data": b""}
        elif ident == "1CEBFF00" and current is not None:
            current["data"] += data[1:]
            if data[0] == current["packets"]:
                transfers.append(current)
                current = None
    dm1s = []
    for t in transfers:
        if t["pgn"] != 65226:
            continue
        payload = t["data"][:t["size"]]
        dtcs = []
        for i in range(2, len(payload) - 3, 4):
            a, b, c, d = payload[i:i + 4]
            dtcs.append((a | b << 8 | (c >> 5) << 16, c & 0x1F, d & 0x7F, d >> 7))
        dm1s.append(dtcs)
    return dm1s


def test_truck_dm1_active_dtcs_from_the_bam():
    expected = _dm1_by_hand()
    assert len(expected) == 10 and len(expected[0]) == 4
    result = run_cli("j1939", "decode", "--file", str(TRUCK), "--json")
    assert result.code == 0
    dm1 = _events(result, "j1939_dm1")
    assert len(dm1) == 10 and result.data["dm1_count"] == 10
    got = [[(d["spn"], d["fmi"], d["occurrence_count"], d["conversion_method"]) for d in p["dtcs"]] for p in dm1]
    assert got == expected
    assert expected[0] == [(980, 9, 126, 0), (3216, 20, 2, 0), (609, 9, 1, 0), (609, 12, 3, 0)]
    lamps = dm1[0]["lamps"]
    assert lamps["malfunction_indicator_lamp"]["state"] == "on"  # byte 1 = 0x43: bits 8-7 = 01
    assert lamps["red_stop_lamp"]["state"] == "off" and lamps["protect_lamp"]["state"] == "not_available"
    assert {p["transport"] for p in dm1} == {"BAM"} and {p["source_address"] for p in dm1} == {0}
    assert dm1[0]["dtcs"][1]["fmi_description"] == "Data drifted high"
    latest = result.data["dm"]
    assert [(d["type"], d["source_address"], d["dtc_count"]) for d in latest] == [("DM1", 0, 4)]


def test_truck_tp_bam_transfers_are_reassembled():
    result = run_cli("j1939", "decode", "--file", str(TRUCK), "--json")
    transfers = _events(result, "j1939_transport")
    assert [t["pgn"] for t in transfers].count(65226) == 10
    ec1 = [t for t in transfers if t["pgn"] == 65251]
    assert len(ec1) == 2 and {(t["size"], t["packet_count"], t["mode"]) for t in ec1} == {(39, 6, "BAM")}
    assert len(bytes.fromhex(ec1[0]["data"])) == 39
    assert result.data["transport"] == {"complete": 12, "incomplete": 0}
    assert result.envelope["warnings"] == []


def test_dm1_single_frame_no_dtc_and_padding():
    # Lamps all off, "no DTC" (all zero), padding FF FF: SAE J1939-73.
    decoded = decode_dm(bytes.fromhex("0000000000000000"))
    assert decoded["dtc_count"] == 0 and decoded["lamps"]["amber_warning_lamp"]["state"] == "off"
    one = decode_dm(bytes.fromhex("04FF6E0005FFFFFF"), {110: "Engine Coolant Temperature"})
    assert one["lamps"]["amber_warning_lamp"]["state"] == "on"
    assert one["dtcs"] == [{"spn": 110, "spn_name": "Engine Coolant Temperature", "fmi": 5,
                            "fmi_description": "Current below normal or open circuit",
                            "occurrence_count": None, "conversion_method": 1}]


def test_single_frame_dm1_and_an_orphan_tp_dt(tmp_path):
    path = tmp_path / "dm1.log"
    path.write_text("(1.000000) can0 18FECA00#0400D40309FEFFFF\n"
                    "(1.100000) can0 1CEBFF00#0143FFD403097E90\n", encoding="ascii")
    result = run_cli("j1939", "decode", "--file", str(path), "--json")
    dm1 = _events(result, "j1939_dm1")
    assert len(dm1) == 1 and dm1[0]["transport"] == "single_frame"
    assert [(d["spn"], d["fmi"], d["occurrence_count"]) for d in dm1[0]["dtcs"]] == [(980, 9, 126)]
    assert any("without an announced transfer" in w for w in result.envelope["warnings"])


def test_j1939_decode_does_not_import_cantools_or_python_can():
    code = ("import sys, io; from canarchy.cli import main; "
            f"main(['j1939', 'decode', '--file', {str(TRUCK)!r}, '--summary', '--json'], stdout=io.StringIO()); "
            f"main(['isotp', 'decode', '--file', {str(SKODA)!r}, '--summary', '--json'], stdout=io.StringIO()); "
            "print('can' in sys.modules, 'cantools' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False False", proc.stderr


def test_j1939_decode_bad_pgn():
    result = run_cli("j1939", "decode", "--file", str(TRUCK), "--pgn", "0x40000", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_PGN"])


# -- isotp decode: UDS / OBD-II / KWP2000 ------------------------------------------------------


def test_obd2_vin_reads_back():
    by_hand = [pdu for _, pdu in _isotp_by_hand(SKODA, "7E8") if pdu[:2] == b"\x49\x02"]
    assert by_hand and by_hand[0][3:].decode("ascii") == "TMBZZZ0X0NY000001"
    result = run_cli("isotp", "decode", "--file", str(SKODA), "--json")
    assert result.code == 0 and result.data["vin"] == "TMBZZZ0X0NY000001"
    vin = [p for p in _events(result, "isotp_pdu") if isinstance(p.get("obd"), dict) and "vin" in p["obd"]]
    assert len(vin) == 1
    assert (vin[0]["service"], vin[0]["service_name"], vin[0]["protocol"]) == \
           ("0x09", "RequestVehicleInformation", "OBD-II")
    assert (vin[0]["frame_count"], vin[0]["length"]) == (3, 20)


def test_obd2_engine_speed_vehicle_speed_and_coolant():
    responses = [pdu for _, pdu in _isotp_by_hand(SKODA, "7E8") if pdu[:1] == b"\x41"]
    rpm = [(256 * p[2] + p[3]) / 4 for p in responses if p[1] == 0x0C]
    speed = [p[2] for p in responses if p[1] == 0x0D]
    coolant = [p[2] - 40 for p in responses if p[1] == 0x05]
    result = run_cli("isotp", "decode", "--file", str(SKODA), "--summary", "--json")
    pids = result.data["obd_pids"]
    assert (pids["0x0C"]["max"], pids["0x0C"]["count"]) == (max(rpm), len(rpm)) == (2957.25, 69)
    assert pids["0x0D"]["max"] == max(speed) == 46
    assert (pids["0x05"]["first"], pids["0x05"]["max"]) == (coolant[0], max(coolant)) == (21, 63)
    assert pids["0x05"]["last"] == coolant[-1]
    load = [p[2] * 100 / 255 for p in responses if p[1] == 0x04]  # SAE J1979: 100/255 A, not rounded (82.745...)
    assert (pids["0x04"]["max"], pids["0x04"]["last"]) == (max(load), load[-1]) and max(load) != round(max(load), 2)
    assert (result.data["request_count"], result.data["response_count"]) == (1925, 1925)
    assert result.data["services"]["0x03"]["service_name"] == "RequestEmissionRelatedDTCs"


def test_leaf_kwp_exchanges_are_named():
    result = run_cli("isotp", "decode", "--file", str(LEAF), "--request-id", "0x79B", "--response-id", "0x7BB",
                     "--json")
    pdus = _events(result, "isotp_pdu")
    requests = [p for p in pdus if p["direction"] == "request"]
    responses = [p for p in pdus if p["direction"] == "response"]
    assert len(requests) == len(responses) == 26
    assert {p["data"] for p in requests} == {"2101", "2104"}
    assert {(p["service"], p["service_name"], p["protocol"], p["positive"]) for p in responses} == \
           {("0x21", "ReadDataByLocalIdentifier", "KWP2000", True)}
    assert [p["length"] for p in responses[:2]] == [53, 31]
    assert result.data["flow_control_count"] == 26 and result.data["multi_frame_count"] == 26


def test_uds_negative_response_and_multi_frame_request(tmp_path):
    path = tmp_path / "uds.log"
    path.write_text(
        "(1.000000) can0 7E0#0322F19055555555\n"
        "(1.010000) can0 7E8#037F2231AAAAAAAA\n"
        "(2.000000) can0 7E0#100A2EF190010203\n"
        "(2.005000) can0 7E8#3000000000000000\n"
        "(2.010000) can0 7E0#2104050607555555\n"
        "(2.020000) can0 7E8#036EF190AAAAAAAA\n", encoding="ascii")
    result = run_cli("isotp", "decode", "--file", str(path), "--json")
    pdus = _events(result, "isotp_pdu")
    assert [(p["direction"], p["service"], p["service_name"]) for p in pdus] == [
        ("request", "0x22", "ReadDataByIdentifier"), ("response", "0x22", "ReadDataByIdentifier"),
        ("request", "0x2E", "WriteDataByIdentifier"), ("response", "0x2E", "WriteDataByIdentifier")]
    assert (pdus[1]["positive"], pdus[1]["nrc"], pdus[1]["nrc_name"]) == (False, "0x31", "RequestOutOfRange")
    assert pdus[2]["data"] == "2ef19001020304050607" and pdus[2]["frame_count"] == 2
    assert pdus[3]["positive"] is True and result.data["negative_response_count"] == 1


def test_a_response_pending_is_an_interim_reply_not_a_negative_answer(tmp_path):
    """ISO 14229-1: ``7F SID 78`` (requestCorrectlyReceived-ResponsePending) says the answer will follow."""
    path = tmp_path / "pending.log"
    path.write_text("(1.000000) can0 7E0#0322F19000000000\n(1.010000) can0 7E8#037F227800000000\n"
                    "(1.050000) can0 7E8#037F227800000000\n(1.090000) can0 7E8#037F223100000000\n")
    data = run_cli("isotp", "decode", "--file", str(path), "--json").data
    assert (data["negative_response_count"], data["response_pending_count"], data["response_count"]) == (1, 2, 3)


def test_isotp_decode_same_ids_is_an_error():
    result = run_cli("isotp", "decode", "--file", str(SKODA), "--request-id", "0x7E8", "--response-id", "0x7E8",
                     "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])


def test_obd_dtc_text():
    assert obd_dtc(0x01, 0x23) == "P0123" and obd_dtc(0xC1, 0x00) == "U0100" and obd_dtc(0x42, 0xAB) == "C02AB"
    pdu = IsoTpPdu(0x7E8, bytes.fromhex("430201230456"), 1.0, 1.0, 1)
    assert describe_diagnostic_pdu(pdu, "response")["obd"] == {"dtc_count": 2, "dtcs": ["P0123", "P0456"]}


def test_mode_01_pids_of_sae_j1979_in_one_response():
    """A response carrying several PIDs (SAE J1979 mode $01), each decoded by its own formula over A, B and read
    past by its own length: fuel trim (A-128)*100/128, catalyst temperature (256A+B)/10-40, equivalence ratio
    2*(256A+B)/65536, fuel rate (256A+B)/20, torque A-125; an unknown PID ends the list with its raw bytes."""
    body = "41" + "0680" + "07C0" + "3C1234" + "448000" + "5E0190" + "62FA" + "FF0102"
    pdu = IsoTpPdu(0x7E8, bytes.fromhex(body), 1.0, 1.0, 2)
    got = [(v["pid"], v["value"], v["unit"]) for v in describe_diagnostic_pdu(pdu, "response")["obd"]]
    assert got == [("0x06", 0.0, "%"), ("0x07", 50.0, "%"), ("0x3C", 0x1234 / 10 - 40, "°C"),
                   ("0x44", 1.0, "ratio"), ("0x5E", 20.0, "L/h"), ("0x62", 125, "%"), ("0xFF", None, None)]


# -- canarchy.isotp ------------------------------------------------------------------------------


def _frame(can_id: int, hex_data: str, t: float = 0.0, fd: bool = False) -> CanFrame:
    return CanFrame(can_id, bytes.fromhex(hex_data), is_fd=fd, timestamp=t)


def test_isotp_single_frame_strips_padding():
    machine = IsoTpReassembler(0x7E8)
    pdu = machine.feed(_frame(0x7E8, "0341053DCCCCCCCC", 5.0))
    assert pdu is not None and pdu.data == bytes.fromhex("41053D") and pdu.timestamp == 5.0 and not pdu.multi_frame


def test_isotp_sequence_numbers_wrap_after_15():
    payload = bytes(range(200))
    frames = [_frame(0x7BB, "10C8" + payload[:6].hex(), 0.0)]
    rest, sn = payload[6:], 1
    while rest:
        frames.append(_frame(0x7BB, f"2{sn:X}" + rest[:7].hex().ljust(14, "0"), 0.01 * sn))
        rest, sn = rest[7:], (sn + 1) & 0xF
    pdus = list(reassemble(frames, [0x7BB]))
    assert len(frames) > 17 and [p.data for p in pdus] == [payload]
    assert pdus[0].frame_count == len(frames) and pdus[0].end_timestamp == frames[-1].timestamp


def test_isotp_sequence_error_drops_the_message_with_a_warning():
    warnings: list[str] = []
    frames = [_frame(0x7BB, "1010000102030405"), _frame(0x7BB, "2106070809101112"),
              _frame(0x7BB, "2313141516171819"), _frame(0x7BB, "0261015555555555")]
    pdus = list(reassemble(frames, [0x7BB], warnings))
    assert [p.data for p in pdus] == [b"\x61\x01"]
    assert len(warnings) == 1 and "expected SN 2, got 3" in warnings[0]


def test_isotp_flow_control_and_stray_consecutive_frames():
    machine = IsoTpReassembler(0x79B)
    assert machine.feed(_frame(0x79B, "3000000000000000")) is None and machine.flow_control_count == 1
    assert machine.feed(_frame(0x79B, "2102AFFFFFEBA6FF")) is None
    assert machine.warnings and "without a first frame" in machine.warnings[0]


def test_isotp_can_fd_single_frame_escape_and_incomplete_end():
    machine = IsoTpReassembler(0x7E8)
    data = "000A" + "11" * 10 + "CC" * 4
    pdu = machine.feed(_frame(0x7E8, data, fd=True))
    assert pdu is not None and pdu.data == b"\x11" * 10
    assert machine.feed(_frame(0x7E8, "1014490201544D42")) is None and machine.pending
    machine.finish()
    assert "incomplete at end of capture (6 of 20 bytes)" in machine.warnings[-1]


# -- streaming ---------------------------------------------------------------------------------


class _Discard:
    """A stdout that keeps nothing, counting the lines written."""

    def __init__(self) -> None:
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass


def test_jsonl_prints_events_then_a_closing_envelope(capsys):
    code = main(["decode", "--file", str(TRUCK), "--dbc", str(J1939_DBC), "--jsonl"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and len(lines) == 1101
    first = json.loads(lines[0])
    assert first["event_type"] == "decoded_message" and first["source"] == f"file:{TRUCK}"
    assert set(first["payload"]) == {"message", "arbitration_id", "is_extended_id", "timestamp", "signals", "pgn",
                                     "source_address"}
    closing = json.loads(lines[-1])
    assert closing["ok"] is True and closing["data"]["event_count"] == 1100 and "events" not in closing["data"]


@pytest.mark.parametrize("argv", [
    ["decode", "--dbc", str(J1939_DBC), "--jsonl"],
    ["j1939", "decode", "--jsonl"],
    ["j1939", "decode", "--summary", "--json"],
], ids=["decode-jsonl", "j1939-jsonl", "j1939-summary"])
def test_memory_does_not_grow_with_the_capture(tmp_path, monkeypatch, argv):
    lines = TRUCK.read_text(encoding="ascii").splitlines()[:1500]  # EEC1, CCVS1 and a DM1 BAM among them
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    small.write_text("\n".join(lines) + "\n", encoding="ascii")
    large.write_text("\n".join(lines * 4) + "\n", encoding="ascii")

    def peak(path: Path) -> int:
        sink = _Discard()
        monkeypatch.setattr(sys, "stdout", sink)
        tracemalloc.start()
        try:
            assert main([*argv, "--file", str(path)], stdout=sink) == 0
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak(small)  # warm-up: imports, the catalog, cantools' parser
    small_peak, large_peak = peak(small), peak(large)
    assert large_peak < small_peak * 1.5 + 256 * 1024, (small_peak, large_peak)


def test_text_output_of_each_command():
    text = run_cli("decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC), "--text").out
    assert "SoC=89.2286 %" in text.splitlines()[0]
    text = run_cli("j1939", "decode", "--file", str(TRUCK), "--summary", "--text").out
    assert "DM1 SA 0: SPN 3216" in text and "Data drifted high" in text
    text = run_cli("isotp", "decode", "--file", str(SKODA), "--summary", "--text").out
    assert "VIN: TMBZZZ0X0NY000001" in text


def test_text_writes_each_id_in_its_frame_width_as_candump_does():
    # candump, j1939 decode and the warnings write 3 hex digits for an 11-bit ID and 8 for a 29-bit one;
    # decode and isotp decode printed 0xCF00400 for 0CF00400 (and 0x123 for both 123 and 00000123)
    first = next(line for line in TRUCK.read_text(encoding="ascii").splitlines() if " 0CF00400#" in line)
    text = run_cli("decode", "--file", str(TRUCK), "--dbc", str(J1939_DBC), "--text").out.splitlines()
    assert text[0].split()[:3] == [first.split()[0].strip("()"), "0x0CF00400", "EEC1"]
    assert "  EEC1 (0x0CF004FE) x1000" in text and "  CCVS1 (0x18FEF1FE) x100" in text
    leaf = run_cli("decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC), "--text").out.splitlines()
    assert leaf[0].split()[1] == "0x7BB" and any(line.startswith("  ") and "(0x7BB)" in line for line in leaf)


def test_a_29_bit_frame_and_an_11_bit_frame_of_the_same_value_stay_apart(tmp_path):
    # The same ID value as an 11-bit and as a 29-bit message (cantools keeps them apart by is_extended_frame):
    # the decoded event says which frame it was, and the text shows it as candump would.
    log, dbc = same_value_ids(tmp_path, SKODA, "2.0")
    result = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--json")
    events = [e["payload"] for e in result.data["events"]]
    assert [(e["message"], e["arbitration_id"], e["is_extended_id"]) for e in events] == [
        ("STD", 0x7E8, False), ("EXT", 0x7E8, True)]
    messages = result.data["messages"]
    assert (messages["STD"]["is_extended_id"], messages["EXT"]["is_extended_id"]) == (False, True)
    text = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--text").out.splitlines()
    assert [line.split()[1:3] for line in text[:2]] == [["0x7E8", "STD"], ["0x000007E8", "EXT"]]
    assert "  STD (0x7E8) x1" in text and "  EXT (0x000007E8) x1" in text


# -- warnings as records -------------------------------------------------------------------------


def _leaf_with_gaps(tmp_path: Path, copies: int = 3, gaps: int = 14) -> tuple[Path, list[dict]]:
    """The Leaf log ``copies`` times over (later copies shifted in time), with the
    next-to-last consecutive frame of the first ``gaps`` multi-frame answers on 0x7BB
    removed; returns the log and the sequence errors that removal must cause."""
    lines = LEAF.read_text(encoding="ascii").splitlines()
    span = float(lines[-1].split()[0][1:-1]) - float(lines[0].split()[0][1:-1]) + 10.0
    shifted = []
    for copy in range(copies):
        for line in lines:
            stamp, rest = line.split(" ", 1)
            shifted.append(f"({float(stamp[1:-1]) + copy * span:.6f}) {rest}")
    answers: list[list[int]] = []  # line indexes of each 0x7BB answer's consecutive frames
    for index, line in enumerate(shifted):
        ident, _, data = line.split()[2].partition("#")
        if ident == "7BB" and data[0] == "1":
            answers.append([])
        elif ident == "7BB" and data[0] == "2":
            answers[-1].append(index)
    drop, expected = set(), []
    for cfs in answers[:gaps]:
        removed, detector = cfs[-2], cfs[-1]
        drop.add(removed)
        expected.append({"arbitration_id": 0x7BB, "expected_sequence": int(shifted[removed].split("#")[1][1], 16),
                         "sequence": int(shifted[detector].split("#")[1][1], 16),
                         "timestamp": float(shifted[detector].split()[0][1:-1])})
    path = tmp_path / "leaf_gaps.log"
    path.write_text("\n".join(line for i, line in enumerate(shifted) if i not in drop) + "\n", encoding="ascii")
    return path, expected


def test_no_warning_kind_hides_another(tmp_path):
    """Undecodable multiplexed answers (plain layout) come first and outnumber the ISO-TP gaps:
    every gap is still a record, with its ID and sequence numbers, and every kind is counted."""
    path, gaps = _leaf_with_gaps(tmp_path)
    result = run_cli("decode", "--file", str(path), "--dbc", str(LEAF_DBC), "--isotp-layout", "plain",
                     "--summary", "--json")
    assert result.code == 0, result.out
    data = result.data
    answers = 3 * 26
    assert data["warning_counts"] == {"DBC_DECODE_FAILED": answers - len(gaps), "ISOTP_SEQUENCE_ERROR": len(gaps)}
    records = [r for r in data["warning_records"] if r["code"] == "ISOTP_SEQUENCE_ERROR"]
    fields = ("arbitration_id", "expected_sequence", "sequence", "timestamp")
    assert [{k: r[k] for k in fields} for r in records] == gaps
    assert all(r["message"] in result.envelope["warnings"] for r in records)
    assert data["isotp_counts"] == {"0x7BB": {"complete": answers - len(gaps), "dropped": len(gaps), "incomplete": 0}}
    failed = [r for r in data["warning_records"] if r["code"] == "DBC_DECODE_FAILED"]
    assert len(failed) == 50 and {r["arbitration_id"] for r in failed} == {0x7BB}
    assert f"{answers - len(gaps) - 50} more DBC_DECODE_FAILED warning(s) not listed" in result.envelope["warnings"][-1]
    text = run_cli("decode", "--file", str(path), "--dbc", str(LEAF_DBC), "--isotp-layout", "plain", "--summary").err
    assert f"warnings by kind: DBC_DECODE_FAILED {answers - len(gaps)}, ISOTP_SEQUENCE_ERROR {len(gaps)}" in text


def test_isotp_decode_counts_complete_dropped_and_incomplete_pdus_per_id(tmp_path):
    path, gaps = _leaf_with_gaps(tmp_path)
    with path.open("a", encoding="ascii") as log:  # an answer cut off by the end of the capture
        log.write("(1700000000.000000) can0 7BB#10356101FFFFF3CC\n")
    result = run_cli("isotp", "decode", "--file", str(path), "--request-id", "0x79B", "--response-id", "0x7BB",
                     "--jsonl")
    closing = json.loads(result.out.splitlines()[-1])
    data = closing["data"]
    assert data["isotp_counts"] == {"0x79B": {"complete": 78, "dropped": 0, "incomplete": 0},
                                    "0x7BB": {"complete": 78 - len(gaps), "dropped": len(gaps), "incomplete": 1}}
    assert data["warning_counts"] == {"ISOTP_INCOMPLETE": 1, "ISOTP_SEQUENCE_ERROR": len(gaps)}
    incomplete = next(r for r in data["warning_records"] if r["code"] == "ISOTP_INCOMPLETE")
    assert (incomplete["arbitration_id"], incomplete["received_bytes"], incomplete["expected_bytes"]) == (0x7BB, 6, 53)
    assert data["pdu_count"] == 78 + 78 - len(gaps) == len(result.out.splitlines()) - 1


def test_the_real_recordings_decode_without_warnings():
    for argv in (["decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC)],
                 ["isotp", "decode", "--file", str(LEAF), "--request-id", "0x79B", "--response-id", "0x7BB"],
                 ["j1939", "decode", "--file", str(TRUCK)]):
        data = run_cli(*argv, "--summary", "--json").data
        assert (data["warning_counts"], data["warning_records"]) == ({}, []), argv


def test_float_signals_nan_and_infinity_keep_the_output_valid_json(tmp_path):
    dbc = tmp_path / "float.dbc"
    dbc.write_text('VERSION ""\n\nNS_ :\n\nBS_:\n\nBU_: ECU\n\nBO_ 1024 FLT: 4 ECU\n'
                   ' SG_ F : 0|32@1- (1,0) [0|0] "" ECU\n\nSIG_VALTYPE_ 1024 F : 1;\n')
    log = tmp_path / "float.log"
    # IEEE 754 single, little-endian: NaN, +inf, -inf, 1.0
    log.write_text("(1.000000) can0 400#0000C07F\n(2.000000) can0 400#0000807F\n"
                   "(3.000000) can0 400#000080FF\n(4.000000) can0 400#0000803F\n")

    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON: {text}"))

    result = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--jsonl")
    assert result.code == 0, result.out
    lines = [strict(line) for line in result.out.splitlines()]
    assert [e["payload"]["signals"]["F"]["value"] for e in lines[:-1]] == ["NaN", "Infinity", "-Infinity", 1.0]
    summary = lines[-1]["data"]["messages"]["FLT"]["signals"]["F"]
    assert (summary["min"], summary["max"], summary["first"], summary["last"]) == (1.0, 1.0, "NaN", 1.0)
    strict(run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--json").out)


def test_a_frame_shorter_than_its_message_decodes_what_it_holds_and_says_what_it_lacks(tmp_path):
    """cantools' CLI refuses such a frame ("Wrong data size"); canarchy decodes the signals inside the bytes it
    has, names the others in a warning, and counts a frame that holds no signal at all as not decoded."""
    import cantools

    message = cantools.database.load_file(str(BOSCH_DBC)).get_message_by_name("BREMSE_53")
    capture = tmp_path / "short.log"
    capture.write_text("(1.0) can0 5C0#0102\n(1.1) can0 5C0#\n(1.2) can0 5C0#0102030405060708\n")
    data = run_cli("decode", "--file", str(capture), "--dbc", str(BOSCH_DBC), "--json").envelope["data"]
    short, empty = [r for r in data["warning_records"] if r["message_name"] == "BREMSE_53"][:2]
    inside = set(message.decode(b"\x01\x02", allow_truncated=True))
    assert short["code"] == "DBC_DATA_SHORT" and (short["length"], short["expected_length"]) == (2, 8)
    assert set(short["missing_signals"]) == {s.name for s in message.signals} - inside and inside
    assert empty["code"] == "DBC_DECODE_FAILED" and "0 of its 8 bytes" in empty["message"]
    events = [e["payload"] for e in data["events"]]
    assert [set(e["signals"]) for e in events] == [inside, {s.name for s in message.signals}]
    assert (data["decode_error_count"], data["warning_counts"]) == (1, {"DBC_DATA_SHORT": 1, "DBC_DECODE_FAILED": 1})


def test_a_frame_longer_than_its_message_decodes_and_says_so(tmp_path):
    """cantools' CLI refuses a frame longer than its message too ("Wrong data size"): canarchy decodes the
    message's signals, as from its first bytes, and says the rest was left (often the database of another bus)."""
    import cantools

    message = cantools.database.load_file(str(BOSCH_DBC)).get_message_by_name("BREMSE_53")
    capture = tmp_path / "long.log"
    capture.write_text("(1.0) can0 5C0##00102030405060708090A0B0C\n")  # 12 bytes (CAN FD), an 8-byte message
    data = run_cli("decode", "--file", str(capture), "--dbc", str(BOSCH_DBC), "--json").envelope["data"]
    [long] = [r for r in data["warning_records"] if r["message_name"] == "BREMSE_53"]
    assert long["code"] == "DBC_DATA_LONG" and (long["length"], long["expected_length"]) == (12, 8), long
    expected = message.decode(bytes(range(1, 9)), decode_choices=True)
    assert {name: s["value"] for name, s in data["events"][0]["payload"]["signals"].items()} == pytest.approx(
        {name: getattr(value, "name", value) for name, value in expected.items()})  # a named value: its name


def test_text_output_prints_decoded_numbers_exactly_as_json_does(tmp_path):
    # 0xFFFFFFFF * 0.125 = 536870911.875 (cantools prints that); 6 significant digits gave 5.36871e+08
    dbc = tmp_path / "odo.dbc"
    dbc.write_text('VERSION ""\n\nNS_ :\n\nBS_:\n\nBU_: ECU\n\nBO_ 1025 ODO: 4 ECU\n'
                   ' SG_ Odo : 0|32@1+ (0.125,0) [0|0] "km" ECU\n')
    log = tmp_path / "odo.log"
    log.write_text("(1.000000) can0 401#FFFFFFFF\n(2.000000) can0 401#07000000\n")
    text = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--text").out
    assert "Odo=536870911.875 km" in text and "Odo=0.875 km" in text
    assert "Odo: 0.875..536870911.875 km" in text
    assert "e+08" not in text
    summary = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--json").data["messages"]["ODO"]["signals"]
    assert summary["Odo"]["max"] == 536870911.875


def test_web_dashboard_numbers_are_exact():
    from canarchy.web_render import _number

    assert (_number(536870911.875), _number(0.1), _number(None), _number(3)) == ("536870911.875", "0.1", "", "3")


def test_a_signal_with_a_value_table_has_one_numeric_range_and_decoded_first_and_last(tmp_path):
    dbc = tmp_path / "enum.dbc"
    dbc.write_text('VERSION ""\n\nNS_ :\n\nBS_:\n\nBU_: ECU\n\nBO_ 1026 ENUM: 2 ECU\n'
                   ' SG_ SigEnum : 0|8@1+ (1,0) [0|0] "" ECU\n SG_ Scaled : 8|8@1+ (2,1) [0|0] "" ECU\n\n'
                   'VAL_ 1026 SigEnum 0 "Off" 1 "On" 2 "Error" ;\nVAL_ 1026 Scaled 3 "Three" ;\n')
    log = tmp_path / "enum.log"
    log.write_text("(1.0) can0 402#0003\n(2.0) can0 402#0101\n(3.0) can0 402#0203\n(4.0) can0 402#0F03\n")
    signals = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--json").data["messages"]["ENUM"]["signals"]
    got = signals["SigEnum"]
    assert (got["min"], got["max"], got["first"], got["last"]) == (0, 15, "Off", 15)
    # a named value counts as the scaled number it stands for: raw 3 -> 7, raw 1 -> 3
    got = signals["Scaled"]
    assert (got["min"], got["max"], got["first"], got["last"]) == (3, 7, "Three", "Three")
    text = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--summary", "--text").out
    assert "SigEnum: 0..15 (first Off, last 15)" in text and "Scaled: 3..7 (first Three, last Three)" in text


def test_a_j1939_summary_lists_the_first_pgns_and_counts_the_frames_of_the_rest(tmp_path):
    """A fuzzed or random-ID capture reaches thousands of PGNs: the summary keeps counts of the first MAX_PGNS and
    counts the frames of any other (memory bounded), with one J1939_PGNS_UNLISTED warning."""
    from canarchy.decode.j1939 import MAX_PGNS

    # PDU2 PGNs (PF 0xF0-0xFF, PS 0-255) under data page 0, then data page 1: 8,192 distinct PGNs (SAE J1939-21)
    ids = [(6 << 26) | (page << 24) | (pf << 16) | (ps << 8) | 0x21
           for page in (0, 1) for pf in range(0xF0, 0x100) for ps in range(256)][:MAX_PGNS + 3]
    source = tmp_path / "many-pgns.log"
    source.write_text("".join(f"({n / 1000:.6f}) can0 {i:08X}#0011223344556677\n" for n, i in enumerate(ids)))
    data = run_cli("j1939", "decode", "--file", str(source), "--summary", "--json").data
    assert (data["j1939_frame_count"], len(data["pgns"]), data["unlisted_frame_count"]) == (MAX_PGNS + 3, MAX_PGNS, 3)
    assert [(w["code"], w["limit"]) for w in data["warning_records"] if w["code"].endswith("UNLISTED")] == [
        ("J1939_PGNS_UNLISTED", MAX_PGNS)]


def test_a_named_value_is_written_without_its_signal_s_unit_as_cantools_writes_it(tmp_path):
    """A signal with a value table and a unit (the Prius DBC's LOW_SPEED_LOCKOUT, "kph"): cantools' CLI writes
    the name alone; `low speed locked kph` read as a speed, and split on blanks into the wrong fields."""
    dbc = tmp_path / "named.dbc"
    dbc.write_text('VERSION ""\n\nNS_ :\n\nBS_:\n\nBU_: ECU\n\n'
                   'BO_ 1 CRUISE: 2 ECU\n SG_ LOCKOUT : 0|2@1+ (1,0) [0|3] "kph" ECU\n'
                   ' SG_ SET_SPEED : 8|8@1+ (1,0) [0|255] "kph" ECU\n\n'
                   'VAL_ 1 LOCKOUT 1 "low speed locked" 2 "ok" ;\n', encoding="ascii")
    log = tmp_path / "cruise.log"
    log.write_text("(1.000000) can0 001#0195\n(2.000000) can0 001#0396\n", encoding="ascii")
    lines = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--text").out.splitlines()
    assert lines[0].endswith("CRUISE  LOCKOUT=low speed locked  SET_SPEED=149 kph"), lines[0]
    assert lines[1].endswith("CRUISE  LOCKOUT=3 kph  SET_SPEED=150 kph"), lines[1]  # no name for 3: a number


def test_isotp_decode_on_ids_the_capture_lacks_says_which_it_has():
    """The Leaf's tester and ECU talk on 0x79B/0x7BB, not the default 0x7E0/0x7E8: zero PDUs and exit 0 said
    nothing of why; the warning names the busiest IDs and the options to give them."""
    data = run_cli("isotp", "decode", "--file", str(LEAF), "--json").data
    [unseen] = [r for r in data["warning_records"] if r["code"] == "ISOTP_IDS_UNSEEN"]
    assert (data["pdu_count"], data["other_frame_count"], unseen["busiest_ids"]) == (0, 221, [0x7BB, 0x79B])
    assert "--request-id and --response-id" in unseen["message"]
    right = run_cli("isotp", "decode", "--file", str(LEAF), "--request-id", "79B", "--response-id", "7BB",
                    "--json").data
    assert right["pdu_count"] == 52 and right["other_frame_count"] == 0 and not [
        r for r in right["warning_records"] if r["code"] == "ISOTP_IDS_UNSEEN"]
