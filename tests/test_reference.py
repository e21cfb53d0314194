"""Reference lookups: bundled J1939/J1587/J2497 catalogs, override files, the 29-bit ID layout,
and the `j1939`, `j1587`, `j2497` commands (through ``canarchy.cli.main``).

Frames below are copied from the real capture ``j1939_truck_idle.log`` (CSS
Electronics sample data, see fixtures provenance): a diesel truck idling at
~650 rpm with SA 0x00 (engine) and 0x55 (DPF controller).
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import io
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from canarchy import j1587_metadata, j1939_metadata, j2497_metadata
from canarchy.cli import main
from canarchy.errors import UserInputError
from tests.helpers import run_cli

J1939_SPN_ENV = "CANARCHY_J1939_SPN_OVERRIDES"
J1587_PID_ENV = "CANARCHY_J1587_PID_OVERRIDES"
J2497_MID_ENV = "CANARCHY_J2497_MID_OVERRIDES"


# --- helpers -----------------------------------------------------------------------------------


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), stdout=out)
    return code, out.getvalue()


def run_json(*argv: str) -> tuple[int, dict]:
    code, text = run(*argv, "--json")
    return code, json.loads(text)


def assert_error(argv: tuple[str, ...], code: str) -> dict:
    """Run ``argv`` with --json; assert exit 1 and the single error ``code``; return the error."""
    exit_code, env = run_json(*argv)
    assert exit_code == 1, env
    assert env["ok"] is False
    assert [e["code"] for e in env["errors"]] == [code]
    assert env["errors"][0]["hint"]
    return env["errors"][0]


def bundled(name: str) -> dict:
    return json.loads(resources.files("canarchy").joinpath("data", name).read_text(encoding="utf-8"))


def home_override(name: str) -> Path:
    """The default override path under the (per-test, disposable) home."""
    return Path.home() / ".canarchy" / name


@pytest.fixture
def write_home_override():
    """Write an override file under ``Path.home()/.canarchy``; refuse to clobber one, remove it after.

    The hermetic harness gives every test a fresh home; the refusal and the
    clean-up keep this test harmless even where it does not.
    """
    written: list[Path] = []

    def write(name: str, content: str) -> Path:
        path = home_override(name)
        assert not path.exists(), f"refusing to overwrite an existing {path}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        written.append(path)
        return path

    yield write
    for path in written:
        path.unlink(missing_ok=True)


def decode(spn: dict, payload_hex: str) -> float:
    """Decode one scaled SPN from a payload using only the catalog's start_bit/bit_length/resolution/offset."""
    raw = int.from_bytes(bytes.fromhex(payload_hex), "little")
    value = (raw >> spn["start_bit"]) & ((1 << spn["bit_length"]) - 1)
    return value * spn["resolution"] + spn["offset"]


# --- the bundled catalogs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "section", "standards"),
    [
        ("j1939_pgns.json", "pgns", ("SAE J1939-71", "SAE J1939-21", "SAE J1939-73")),
        ("j1939_spns.json", "spns", ("SAE J1939-71",)),
        ("j1587_pids.json", "pids", ("SAE J1587",)),
        ("j2497_mids.json", "mids", ("SAE J1587", "SAE J2497")),
    ],
)
def test_bundled_file_loads_and_names_its_standard(name, section, standards):
    data = bundled(name)
    assert set(data) == {"source", section}
    for standard in standards:
        assert standard in data["source"]
    assert data[section], "catalog is empty"
    for key, entry in data[section].items():
        assert key.isdecimal() and str(int(key)) == key
        assert isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"]


def test_every_bundled_spn_references_a_bundled_pgn():
    pgns = bundled("j1939_pgns.json")["pgns"]
    spns = bundled("j1939_spns.json")["spns"]
    orphans = {spn: entry["pgn"] for spn, entry in spns.items() if str(entry["pgn"]) not in pgns}
    assert orphans == {}


def test_bundled_spn_positions_fit_their_pgn_and_ranges_follow_the_scaling():
    pgns = bundled("j1939_pgns.json")["pgns"]
    largest_valid_raw = {8: 0xFA, 16: 0xFAFF, 32: 0xFAFFFFFF}
    for number, spn in bundled("j1939_spns.json")["spns"].items():
        length = pgns[str(spn["pgn"])]["length"]
        if "start_bit" in spn and isinstance(length, int):
            assert spn["start_bit"] + spn["bit_length"] <= 8 * length, number
        if spn.get("kind") == "measured":
            expected_max = spn["offset"] + spn["resolution"] * largest_valid_raw[spn["bit_length"]]
            assert spn["data_range"]["min"] == spn["offset"], number
            assert spn["data_range"]["max"] == pytest.approx(expected_max), number


def test_catalogs_hold_the_common_ids():
    pgns = {int(k) for k in bundled("j1939_pgns.json")["pgns"]}
    assert {61444, 61443, 65262, 65265, 65266, 65263, 65270, 65271, 65226, 65253,
            60416, 60160, 59904, 60928, 65269, 65276} <= pgns
    spns = {int(k) for k in bundled("j1939_spns.json")["spns"]}
    assert {190, 84, 110, 100, 91, 513, 247, 96, 171, 168, 183} <= spns
    assert len(spns) >= 20
    pids = {int(k) for k in bundled("j1587_pids.json")["pids"]}
    assert {84, 190, 110, 100, 168, 96, 91, 245, 247} <= pids
    assert len(pids) >= 25
    mids = {int(k) for k in bundled("j2497_mids.json")["mids"]}
    assert set(range(128, 141)) <= mids
    assert all(128 <= mid <= 255 for mid in mids)


@pytest.mark.parametrize(
    ("spn", "pgn", "start_bit", "bit_length", "resolution", "offset", "unit"),
    [
        (190, 61444, 24, 16, 0.125, 0, "rpm"),
        (513, 61444, 16, 8, 1, -125, "%"),
        (91, 61443, 8, 8, 0.4, 0, "%"),
        (110, 65262, 0, 8, 1, -40, "°C"),
        (84, 65265, 8, 16, 1 / 256, 0, "km/h"),
        (183, 65266, 0, 16, 0.05, 0, "L/h"),
        (100, 65263, 24, 8, 4, 0, "kPa"),
        (168, 65271, 32, 16, 0.05, 0, "V"),
        (247, 65253, 0, 32, 0.05, 0, "h"),
        (171, 65269, 24, 16, 0.03125, -273, "°C"),
        (96, 65276, 8, 8, 0.4, 0, "%"),
    ],
)
def test_lookup_spn_gives_the_standard_scaling(spn, pgn, start_bit, bit_length, resolution, offset, unit):
    entry, warnings = j1939_metadata.lookup_spn(spn)
    assert warnings == []
    assert entry is not None
    assert (entry["spn"], entry["pgn"], entry["start_bit"], entry["bit_length"]) == (spn, pgn, start_bit, bit_length)
    assert entry["resolution"] == pytest.approx(resolution)
    assert (entry["offset"], entry["unit"], entry["source"]) == (offset, unit, "bundled")


@pytest.mark.parametrize(
    ("spn", "payload", "expected"),
    [
        (190, "607D84481400F084", 649.0),  # EEC1 0x0CF00400: idle engine speed
        (84, "F7000004000000FF", 0.0),  # CCVS1 0x0CFEF100: parked
        (110, "6F3F392BFFFFFFFF", 71.0),  # ET1 0x18FEEE00: coolant
        (175, "6F3F392BFFFFFFFF", 72.78125),  # ET1: oil temperature
        (108, "C5FFFFC923FFFFFF", 98.5),  # AMB 0x18FEF500: barometric pressure
        (171, "C5FFFFC923FFFFFF", 13.28125),  # AMB: ambient air
        (100, "B2FFFF40FFFFFFFA", 256.0),  # EFL/P1 0x18FEEF00: oil pressure at idle
        (96, "FFBBFFFFFFFFFFFF", 74.8),  # DD 0x18FEFC00: fuel level
        (183, "37000000870100FF", 2.75),  # LFE1 0x18FEF200: idle fuel rate
        (245, "FFFFFFFF47B00100", 13832.875),  # VD 0x18FEE000: odometer
    ],
)
def test_catalog_decodes_real_frames_to_plausible_values(spn, payload, expected):
    entry, _ = j1939_metadata.lookup_spn(spn)
    assert decode(entry, payload) == pytest.approx(expected)


def test_lookup_pgn_lists_its_spns_in_payload_order():
    entry, warnings = j1939_metadata.lookup_pgn(61444)
    assert warnings == []
    assert entry["acronym"] == "EEC1" and entry["pgn_hex"] == "0xF004" and entry["pdu_format"] == "PDU2"
    assert entry["length"] == 8 and entry["source"] == "bundled"
    assert [s["spn"] for s in entry["spns"]][:4] == [899, 512, 513, 190]
    assert entry["spn_count"] == len(entry["spns"])
    assert all(s["pgn"] == 61444 and s["pgn_acronym"] == "EEC1" for s in entry["spns"])


def test_dm1_is_variable_length_from_j1939_73():
    entry, _ = j1939_metadata.lookup_pgn(65226)
    assert entry["acronym"] == "DM1" and entry["length"] == "variable"
    assert entry["standard"] == "SAE J1939-73"
    assert {1213, 623, 624, 987} <= {s["spn"] for s in entry["spns"]}


def test_returned_entries_are_copies_of_the_catalog():
    entry, _ = j1939_metadata.lookup_spn(190)
    entry["data_range"]["max"] = -1
    entry["name"] = "mutated"
    again, _ = j1939_metadata.lookup_spn(190)
    assert again["name"] == "Engine Speed" and again["data_range"]["max"] == 8031.875


def test_j1587_page_and_length_class_follow_the_pid_number():
    speed, _ = j1587_metadata.lookup_pid(84)
    assert (speed["page"], speed["data_length"], speed["length_prefixed"]) == (1, 1, False)
    assert (speed["resolution"], speed["unit"]) == (0.5, "mph")
    assert speed["metric"] == {"resolution": 0.805, "unit": "km/h"}
    distance, _ = j1587_metadata.lookup_pid(245)
    assert (distance["data_length"], distance["length_prefixed"]) == (4, True)
    page2, _ = j1587_metadata.lookup_pid(256)
    assert page2["page"] == 2
    assert j1587_metadata.pid_page(511) == 2


def test_j2497_trailer_abs_mids():
    names = {mid: j2497_metadata.lookup_mid(mid)[0]["name"] for mid in (128, 130, 136, 137, 138, 139, 140)}
    assert names == {128: "Engine #1", 130: "Transmission", 136: "Brakes, Power Unit", 137: "Brakes, Trailer #1",
                     138: "Brakes, Trailer #2", 139: "Brakes, Trailer #3", 140: "Instrument Cluster"}


@pytest.mark.parametrize(
    ("call", "value", "code"),
    [
        (j1939_metadata.lookup_pgn, 0x40000, "INVALID_PGN"),
        (j1939_metadata.lookup_pgn, -1, "INVALID_PGN"),
        (j1939_metadata.lookup_pgn, True, "INVALID_PGN"),
        (j1939_metadata.lookup_spn, 524288, "INVALID_SPN"),
        (j1939_metadata.lookup_spn, "190", "INVALID_SPN"),
        (j1587_metadata.lookup_pid, 512, "INVALID_PID"),
        (j2497_metadata.lookup_mid, 256, "INVALID_MID"),
    ],
)
def test_lookup_functions_reject_bad_ids(call, value, code):
    with pytest.raises(UserInputError) as info:
        call(value)
    assert info.value.code == code and info.value.hint


# --- the 29-bit arbitration ID (SAE J1939-21) -------------------------------------------------


@pytest.mark.parametrize(
    ("can_id", "pgn", "sa", "prio", "fmt", "dest"),
    [
        (0x0CF00400, 61444, 0x00, 3, "PDU2", None),  # EEC1
        (0x0CFEF100, 65265, 0x00, 3, "PDU2", None),  # CCVS1 as in the capture
        (0x18FEF100, 65265, 0x00, 6, "PDU2", None),  # CCVS1 at its default priority
        (0x1CECFF00, 60416, 0x00, 7, "PDU1", 0xFF),  # TP.CM BAM to global
        (0x1CEBFF00, 60160, 0x00, 7, "PDU1", 0xFF),  # TP.DT
        (0x18FD9F55, 64927, 0x55, 6, "PDU2", None),  # from the DPF controller
        (0x10FDA300, 64931, 0x00, 4, "PDU2", None),
        (0x18EA00F9, 59904, 0xF9, 6, "PDU1", 0x00),  # Request to SA 0
    ],
)
def test_arbitration_id_layout(can_id, pgn, sa, prio, fmt, dest):
    assert j1939_metadata.pgn_from_arbitration_id(can_id) == pgn
    assert j1939_metadata.source_address(can_id) == sa
    assert j1939_metadata.priority(can_id) == prio
    assert j1939_metadata.destination_address(can_id) == dest
    described = j1939_metadata.describe_arbitration_id(can_id)
    assert (described["pgn"], described["pdu_format"], described["source_address"]) == (pgn, fmt, sa)


def test_data_page_bits_are_part_of_the_pgn():
    assert j1939_metadata.pgn_from_arbitration_id(0x19FEF100) == 0x1FEF1
    assert j1939_metadata.describe_arbitration_id(0x19FEF100)["dp"] == 1


def test_tp_cm_bam_payload_names_dm1():
    payload = bytes.fromhex("20120003FFCAFE00")  # 0x1CECFF00 in the capture
    assert payload[0] == 32  # BAM
    transported = int.from_bytes(payload[5:8], "little")
    entry, _ = j1939_metadata.lookup_pgn(transported)
    assert entry["acronym"] == "DM1"


@pytest.mark.parametrize("bad", [-1, 0x20000000, True, "0x0CF00400"])
def test_arbitration_id_out_of_range(bad):
    with pytest.raises(UserInputError) as info:
        j1939_metadata.pgn_from_arbitration_id(bad)
    assert info.value.code == "INVALID_ARBITRATION_ID"


# --- commands: success paths -----------------------------------------------------------------


@pytest.mark.parametrize("number", ["61444", "0xF004", "0XF004"])
def test_j1939_pgn_json(number):
    code, env = run_json("j1939", "pgn", number)
    assert code == 0
    assert set(env) == {"ok", "command", "data", "warnings", "errors"}
    assert env["ok"] is True and env["command"] == "j1939 pgn" and env["errors"] == [] and env["warnings"] == []
    data = env["data"]
    assert (data["pgn"], data["acronym"], data["name"]) == (61444, "EEC1", "Electronic Engine Controller 1")
    assert data["source"] == "bundled" and data["transmission_rate"] and data["default_priority"] == 3
    assert 190 in [s["spn"] for s in data["spns"]]


def test_j1939_pgn_jsonl_is_the_envelope_on_one_line():
    code, text = run("j1939", "pgn", "65265", "--jsonl")
    assert code == 0
    lines = text.strip().splitlines()
    assert len(lines) == 1
    env = json.loads(lines[0])
    assert env["command"] == "j1939 pgn" and env["data"]["acronym"] == "CCVS1"


def test_j1939_pgn_text():
    code, text = run("j1939", "pgn", "0xF004", "--text")
    assert code == 0
    assert text.startswith("PGN 61444 (0xF004) EEC1 Electronic Engine Controller 1")
    assert "Engine Speed" in text and "0.125 rpm/bit" in text


def test_j1939_pgn_text_is_the_default():
    assert run("j1939", "pgn", "60416")[1].startswith("PGN 60416 (0xEC00) TP.CM")


def test_j1939_spn_json_jsonl_text():
    code, env = run_json("j1939", "spn", "190")
    assert code == 0 and env["command"] == "j1939 spn"
    data = env["data"]
    assert (data["spn"], data["name"], data["pgn"], data["pgn_acronym"]) == (190, "Engine Speed", 61444, "EEC1")
    assert data["data_range"] == {"min": 0, "max": 8031.875} and data["source"] == "bundled"
    code, text = run("j1939", "spn", "0xBE", "--jsonl")
    assert code == 0 and json.loads(text)["data"]["spn"] == 190
    code, text = run("j1939", "spn", "84", "--text")
    assert code == 0
    assert text.startswith("SPN 84: Wheel-Based Vehicle Speed") and "65265 (0xFEF1) CCVS1" in text


def test_j1587_pid_json_jsonl_text():
    code, env = run_json("j1587", "pid", "190")
    assert code == 0 and env["command"] == "j1587 pid"
    assert (env["data"]["pid"], env["data"]["name"], env["data"]["resolution"]) == (190, "Engine Speed", 0.25)
    code, text = run("j1587", "pid", "0x54", "--jsonl")
    assert json.loads(text)["data"]["name"] == "Road Speed"
    code, text = run("j1587", "pid", "245", "--text")
    assert code == 0 and text.startswith("PID 245 (page 1): Total Vehicle Distance") and "0.161 km" in text


def test_j1587_pids_json_jsonl_text():
    code, env = run_json("j1587", "pids")
    assert code == 0 and env["command"] == "j1587 pids"
    pids = [p["pid"] for p in env["data"]["pids"]]
    assert pids == sorted(pids) and env["data"]["pid_count"] == len(pids) >= 25
    code, text = run("j1587", "pids", "--jsonl")
    assert code == 0 and len(text.strip().splitlines()) == 1
    code, text = run("j1587", "pids", "--text")
    assert code == 0 and "Road Speed" in text and "Total Engine Hours" in text


def test_j2497_mid_json_jsonl_text():
    code, env = run_json("j2497", "mid", "137")
    assert code == 0 and env["command"] == "j2497 mid"
    assert env["data"]["name"] == "Brakes, Trailer #1" and "J2497" in env["data"]["note"]
    code, text = run("j2497", "mid", "0x80", "--jsonl")
    assert json.loads(text)["data"] ["name"] == "Engine #1"
    code, text = run("j2497", "mid", "140", "--text")
    assert code == 0 and text.startswith("MID 140: Instrument Cluster")


def test_j2497_mids_json_jsonl_text():
    code, env = run_json("j2497", "mids")
    assert code == 0 and env["command"] == "j2497 mids"
    mids = [m["mid"] for m in env["data"]["mids"]]
    assert mids[0] == 128 and env["data"]["mid_count"] == len(mids)
    code, text = run("j2497", "mids", "--jsonl")
    assert code == 0 and json.loads(text)["data"]["mid_count"] == len(mids)
    code, text = run("j2497", "mids", "--text")
    assert code == 0 and "136  Brakes, Power Unit" in text


# --- commands: errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (("j1939", "pgn", "abc"), "INVALID_PGN"),
        (("j1939", "pgn", "0x40000"), "INVALID_PGN"),
        (("j1939", "pgn", "262144"), "INVALID_PGN"),
        (("j1939", "pgn", "-1"), "INVALID_PGN"),
        (("j1939", "pgn", "0x"), "INVALID_PGN"),
        (("j1939", "spn", "524288"), "INVALID_SPN"),
        (("j1939", "spn", "1.5"), "INVALID_SPN"),
        (("j1587", "pid", "512"), "INVALID_PID"),
        (("j1587", "pid", "0x200"), "INVALID_PID"),
        (("j1587", "pid", "speed"), "INVALID_PID"),
        (("j2497", "mid", "256"), "INVALID_MID"),
        (("j2497", "mid", "0xZZ"), "INVALID_MID"),
        (("j1939", "pgn", "65280"), "PGN_NOT_FOUND"),
        (("j1939", "spn", "524287"), "SPN_NOT_FOUND"),
        (("j1587", "pid", "300"), "PID_NOT_FOUND"),
        (("j2497", "mid", "251"), "MID_NOT_FOUND"),
        (("j1939", "pgn"), "INVALID_ARGUMENTS"),
        (("j1587", "pid", "84", "85"), "INVALID_ARGUMENTS"),
    ],
)
def test_bad_and_unknown_ids(argv, code):
    assert_error(argv, code)


def test_an_arbitration_id_given_as_pgn_gets_a_hint_with_its_pgn():
    error = assert_error(("j1939", "pgn", "0x0CF00400"), "INVALID_PGN")
    assert "61444" in error["hint"]


def test_a_pdu1_pgn_with_a_destination_byte_gets_a_hint():
    error = assert_error(("j1939", "pgn", "0xEC12"), "PGN_NOT_FOUND")
    assert "60416" in error["hint"]


@pytest.mark.parametrize(
    ("argv", "code", "env_var", "filename"),
    [
        (("j1939", "pgn", "65280"), "PGN_NOT_FOUND", J1939_SPN_ENV, "j1939_spns.json"),
        (("j1939", "spn", "520000"), "SPN_NOT_FOUND", J1939_SPN_ENV, "j1939_spns.json"),
        (("j1587", "pid", "300"), "PID_NOT_FOUND", J1587_PID_ENV, "j1587_pids.json"),
        (("j2497", "mid", "87"), "MID_NOT_FOUND", J2497_MID_ENV, "j2497_mids.json"),
    ],
)
def test_not_found_hint_names_the_override_file(argv, code, env_var, filename):
    error = assert_error(argv, code)
    assert env_var in error["hint"]
    assert str(home_override(filename)) in error["hint"]


def test_errors_honour_text_output():
    result = run_cli("j2497", "mid", "300", "--text")
    assert result.code == 1 and result.out == ""
    assert result.err.startswith("error: INVALID_MID:") and "\nhint: " in result.err


# --- override files ---------------------------------------------------------------------------


def test_override_in_home_merges_over_and_adds_to_the_catalog(write_home_override):
    write_home_override("j1939_spns.json", json.dumps({
        "190": {"name": "Engine Speed (tuned)"},
        "520000": {"name": "Proprietary boost target", "pgn": 65280, "start_bit": 0, "bit_length": 8,
                   "resolution": 1, "offset": 0, "unit": "kPa"},
    }))
    code, env = run_json("j1939", "spn", "190")
    assert code == 0 and env["warnings"] == []
    data = env["data"]
    assert data["name"] == "Engine Speed (tuned)" and data["source"] == "bundled+override"
    assert (data["resolution"], data["start_bit"], data["unit"]) == (0.125, 24, "rpm")  # shallow merge keeps the rest
    code, env = run_json("j1939", "spn", "520000")
    assert code == 0 and env["data"]["source"] == "override" and env["data"]["unit"] == "kPa"
    code, env = run_json("j1939", "pgn", "61444")
    assert env["data"]["source"] == "bundled+override"
    code, env = run_json("j1939", "pgn", "65280")
    assert code == 0
    assert env["data"]["source"] == "override" and env["data"]["name"] is None
    assert [s["spn"] for s in env["data"]["spns"]] == [520000]
    code, env = run_json("j1939", "pgn", "65262")
    assert env["data"]["source"] == "bundled"


def test_home_overrides_for_j1587_and_j2497(write_home_override):
    write_home_override("j1587_pids.json", '{"84": {"note": "calibrated"}, "300": {"name": "Page two thing"}}')
    write_home_override("j2497_mids.json", '{"87": {"name": "Trailer ABS (J1708 range)"}}')
    _, env = run_json("j1587", "pid", "84")
    assert env["data"]["note"] == "calibrated" and env["data"]["name"] == "Road Speed"
    assert env["data"]["source"] == "bundled+override"
    _, env = run_json("j1587", "pid", "300")
    assert env["data"]["page"] == 2 and env["data"]["source"] == "override"
    _, env = run_json("j1587", "pids")
    assert 300 in [p["pid"] for p in env["data"]["pids"]]
    _, env = run_json("j2497", "mid", "87")
    assert env["data"] == {"mid": 87, "name": "Trailer ABS (J1708 range)", "standard": "SAE J1587 / SAE J2497",
                           "source": "override"}
    _, env = run_json("j2497", "mids")
    assert env["data"]["mids"][0]["mid"] == 87


@pytest.mark.parametrize(
    ("env_var", "argv", "field"),
    [
        (J1939_SPN_ENV, ("j1939", "spn", "110"), "name"),
        (J1587_PID_ENV, ("j1587", "pid", "110"), "name"),
        (J2497_MID_ENV, ("j2497", "mid", "130"), "name"),
    ],
)
def test_variable_points_at_an_override_file_and_wins_over_home(env_var, argv, field, tmp_path, monkeypatch,
                                                               write_home_override):
    filename = {J1939_SPN_ENV: "j1939_spns.json", J1587_PID_ENV: "j1587_pids.json",
                J2497_MID_ENV: "j2497_mids.json"}[env_var]
    number = argv[-1]
    write_home_override(filename, json.dumps({number: {field: "from home"}}))
    custom = tmp_path / "custom.json"
    custom.write_text(json.dumps({number: {field: "from variable"}}), encoding="utf-8")
    monkeypatch.setenv(env_var, str(custom))
    _, env = run_json(*argv)
    assert env["data"][field] == "from variable" and env["data"]["source"] == "bundled+override"
    monkeypatch.setenv(env_var, "")  # empty: the default path again
    _, env = run_json(*argv)
    assert env["data"][field] == "from home"


def test_override_paths_are_resolved_when_called(tmp_path, monkeypatch):
    """The harness re-points the import-time constants; lookups must read them at call time."""
    for module, attr, key, call in [
        (j1939_metadata, "_SPN_OVERRIDES_DEFAULT", "190", j1939_metadata.lookup_spn),
        (j1587_metadata, "_PID_OVERRIDES_DEFAULT", "190", j1587_metadata.lookup_pid),
        (j2497_metadata, "_MID_OVERRIDES_DEFAULT", "190", j2497_metadata.lookup_mid),
    ]:
        path = tmp_path / f"{attr}.json"
        path.write_text(json.dumps({key: {"name": f"re-pointed {attr}"}}), encoding="utf-8")
        monkeypatch.setattr(module, attr, path)
        entry, warnings = call(int(key))
        assert warnings == [] and entry["name"] == f"re-pointed {attr}"


def test_default_override_paths_live_under_home():
    assert j1939_metadata._SPN_OVERRIDES_DEFAULT.name == "j1939_spns.json"
    assert j1587_metadata._PID_OVERRIDES_DEFAULT.name == "j1587_pids.json"
    assert j2497_metadata._MID_OVERRIDES_DEFAULT.name == "j2497_mids.json"
    for path in (j1939_metadata._SPN_OVERRIDES_DEFAULT, j1587_metadata._PID_OVERRIDES_DEFAULT,
                 j2497_metadata._MID_OVERRIDES_DEFAULT):
        assert path.parent.name == ".canarchy"


def test_missing_override_file_is_silent(tmp_path, monkeypatch):
    monkeypatch.setenv(J1587_PID_ENV, str(tmp_path / "absent.json"))
    code, env = run_json("j1587", "pid", "84")
    assert code == 0 and env["warnings"] == [] and env["data"]["source"] == "bundled"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[84, 85]", "top level is an array"),
        ('"84"', "top level is a string"),
        ('{"road": {"name": "x"}}', "'road' is not a decimal"),
        ('{"-1": {"name": "x"}}', "'-1' is not a decimal"),
        ('{"84": "Road Speed"}', "entry '84' is a string"),
        ('{"84": ["x"]}', "entry '84' is an array"),
        ('{"600": {"name": "x"}}', "outside 0..511"),
        ('{"84": {"name": "x"}, "084": {"name": "y"}}', "second time"),
    ],
)
def test_malformed_override_file_warns_and_answers_from_the_bundled_catalog(content, problem, tmp_path, monkeypatch):
    path = tmp_path / "pids.json"
    path.write_text(content, encoding="utf-8")
    monkeypatch.setenv(J1587_PID_ENV, str(path))
    code, env = run_json("j1587", "pid", "84")
    assert code == 0 and env["ok"] is True
    assert env["data"]["name"] == "Road Speed" and env["data"]["source"] == "bundled"
    assert len(env["warnings"]) == 1
    assert str(path) in env["warnings"][0] and problem in env["warnings"][0]


def test_malformed_home_override_warns_in_text_and_in_lists(write_home_override):
    path = write_home_override("j2497_mids.json", "{oops")
    result = run_cli("j2497", "mid", "137", "--text")
    assert result.code == 0 and "Brakes, Trailer #1" in result.out
    assert f"warning: J2497 MID override file {path} ignored" in result.err
    code, env = run_json("j2497", "mids")
    assert code == 0 and env["data"]["mid_count"] == 123 and str(path) in env["warnings"][0]


def test_malformed_j1939_override_warns_on_pgn_and_spn(tmp_path, monkeypatch):
    path = tmp_path / "spns.json"
    path.write_text('{"190": 5}', encoding="utf-8")
    monkeypatch.setenv(J1939_SPN_ENV, str(path))
    for argv in (("j1939", "spn", "190"), ("j1939", "pgn", "61444")):
        code, env = run_json(*argv)
        assert code == 0 and env["data"]["source"] == "bundled"
        assert str(path) in env["warnings"][0] and "entry '190' is a number" in env["warnings"][0]


def test_unreadable_override_file_warns(tmp_path, monkeypatch):
    directory = tmp_path / "a-directory.json"
    directory.mkdir()
    monkeypatch.setenv(J1939_SPN_ENV, str(directory))
    entry, warnings = j1939_metadata.lookup_spn(190)
    assert entry["source"] == "bundled"
    assert len(warnings) == 1 and str(directory) in warnings[0] and "cannot be read" in warnings[0]


def test_malformed_override_and_unknown_id_puts_the_warning_in_the_hint(tmp_path, monkeypatch):
    path = tmp_path / "mids.json"
    path.write_text('{"87": "Trailer ABS"}', encoding="utf-8")
    monkeypatch.setenv(J2497_MID_ENV, str(path))
    error = assert_error(("j2497", "mid", "87"), "MID_NOT_FOUND")
    assert str(path) in error["hint"] and "J1708" in error["hint"]


def test_override_cannot_change_the_id_or_source(tmp_path, monkeypatch):
    path = tmp_path / "spns.json"
    path.write_text('{"190": {"spn": 1, "source": "bundled", "pgn": 61444}}', encoding="utf-8")
    monkeypatch.setenv(J1939_SPN_ENV, str(path))
    entry, _ = j1939_metadata.lookup_spn(190)
    assert entry["spn"] == 190 and entry["source"] == "bundled+override"


# --- import cost ----------------------------------------------------------------------------------


def test_reference_modules_do_not_import_python_can():
    code = (
        "import sys\n"
        "import canarchy.j1939_metadata as a, canarchy.j1587_metadata as b, canarchy.j2497_metadata as c\n"
        "import canarchy.commands.reference\n"
        "a.lookup_pgn(61444); a.lookup_spn(190); a.pgn_from_arbitration_id(0x0CF00400)\n"
        "b.list_pids(); c.list_mids()\n"
        "leaked = sorted(m for m in sys.modules if m == 'can' or m.startswith('can.') or m.startswith('cantools'))\n"
        "assert not leaked, leaked\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARCHY_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("entry,problem", [
    ({"resolution": "fast"}, "field 'resolution' is a string, expected a number"),
    ({"start_bit": 900}, "start_bit 900 is outside 0..63"),
    ({"start_bit": 56, "bit_length": 16}, "runs past the 8-byte frame"),
    ({"resolution": 0}, "resolution 0 is not > 0"),
    ({"name": 5}, "field 'name' is a number, expected a string"),
])
def test_badly_typed_spn_override_is_ignored_with_a_warning(entry, problem):
    """A value that would crash or silently break decoding is refused like a malformed file."""
    path = Path.home() / ".canarchy" / "j1939_spns.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"190": entry}))
    result = run_cli("j1939", "spn", "190", "--json")
    assert result.code == 0
    assert result.data["source"] == "bundled" and result.data["resolution"] == 0.125
    assert len(result.envelope["warnings"]) == 1 and problem in result.envelope["warnings"][0]
    assert str(path) in result.envelope["warnings"][0]
    log = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "j1939_truck_idle.log"
    decoded = run_cli("j1939", "decode", "--file", str(log), "--summary", "--json")
    assert decoded.code == 0, decoded.out
