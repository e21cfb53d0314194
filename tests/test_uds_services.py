"""``uds services``: reference, dry-run and active modes, and the #530 regressions.

The #530 regressions (REF-01..07, docs/tests/test-isolation.md) set the
configured default interface through their own fixtures (a config file in the
test's home, or the variable), never by inheriting the operator's: isolation
makes that coverage deliberate (REQ-TISO-08). ``nox -s mutation-530`` removes
the guard from ``prepare_args`` and requires these tests to fail.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import json

import pytest

from canarchy import uds
from tests.helpers import run_cli, write_user_config

CATALOG_SIDS = [f"0x{s.sid:02X}" for s in uds.SERVICES]


@pytest.fixture
def file_default_interface():
    """A user config file whose default interface is vcan7."""
    return write_user_config('[transport]\ndefault_interface = "vcan7"\n')


def assert_reference(result, capsys) -> None:
    """The catalog answer: reference mode, every SID, nothing active, nothing on stderr."""
    assert result.code == 0, result.out
    data = result.data
    assert data["mode"] == "reference"
    assert [s["service"] for s in data["services"]] == CATALOG_SIDS
    assert data["service_count"] == 27
    assert "probe_count" not in data and "interface" not in data
    assert capsys.readouterr().err == ""


# -- the #530 regressions --------------------------------------------------------------

def test_ref01_file_default_interface_stays_reference(file_default_interface, capsys):
    assert_reference(run_cli("uds", "services", "--json"), capsys)


def test_ref02_env_default_interface_stays_reference(monkeypatch, capsys):
    monkeypatch.setenv("CANARCHY_DEFAULT_INTERFACE", "vcan7")
    assert_reference(run_cli("uds", "services", "--json"), capsys)


def test_ref03_require_active_ack_does_not_block_reference(capsys):
    write_user_config('[transport]\ndefault_interface = "vcan7"\n[safety]\nrequire_active_ack = true\n')
    result = run_cli("uds", "services", "--json")
    assert "ACTIVE_ACK_REQUIRED" not in result.out
    assert_reference(result, capsys)


def test_ref04_reference_never_builds_transport(file_default_interface, rigged_transport, capsys):
    assert_reference(run_cli("uds", "services", "--json"), capsys)
    assert rigged_transport == []


def test_ref05_typed_channel_goes_active(file_default_interface, monkeypatch, capsys):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    result = run_cli("uds", "services", "can0", "--json")
    assert result.code == 0, result.out
    assert result.data["mode"] == "active"
    assert result.data["interface"] == "can0"
    assert result.data["interface_source"] == "cli"
    assert result.data["probe_count"] == 27
    err = capsys.readouterr().err
    assert "ACTIVE TRANSMIT" in err and "can0" in err and len(err.strip().splitlines()) == 1


def test_ref06_jsonl_stays_reference(file_default_interface, capsys):
    result = run_cli("uds", "services", "--jsonl")
    assert result.code == 0
    lines = result.out.splitlines()
    assert len(lines) == 1
    envelope = json.loads(lines[0])
    assert envelope["data"]["mode"] == "reference"
    assert "interface" not in envelope["data"]
    assert capsys.readouterr().err == ""


def test_ref07_text_stays_reference(file_default_interface, capsys):
    result = run_cli("uds", "services", "--text")
    assert result.code == 0
    assert result.out.startswith("UDS services (ISO 14229-1): 27")
    assert "active probe" not in result.out
    assert capsys.readouterr().err == ""


# -- reference details -----------------------------------------------------------------

def test_reference_catalog_fields():
    services = {s["service"]: s for s in run_cli("uds", "services", "--json").data["services"]}
    assert services["0x10"] == {"service": "0x10", "name": "DiagnosticSessionControl",
                                "positive_response_service": "0x50", "category": "session",
                                "requires_subfunction": True}
    assert services["0x85"]["positive_response_service"] == "0xC5"
    assert services["0x22"]["requires_subfunction"] is False


# -- dry run ------------------------------------------------------------------------------

def test_dry_run_plans_without_transport(rigged_transport, capsys):
    result = run_cli("uds", "services", "--dry-run", "--json")
    assert result.code == 0
    assert result.data["mode"] == "dry_run"
    assert result.data["planned_requests"] == 27
    assert result.data["first_request"]["data"] == "0210010000000000"
    assert rigged_transport == []
    assert capsys.readouterr().err == ""


def test_dry_run_probe_range():
    result = run_cli("uds", "services", "--dry-run", "--probe-start", "0x10", "--probe-end", "0x12", "--json")
    assert [r["service"] for r in result.data["requests"]] == ["0x10", "0x11", "0x12"]


@pytest.mark.parametrize("start,end", [("0x20", "0x10"), ("0x100", "0x101"), ("zz", "0x10"), ("0x10", None)])
def test_bad_probe_range(start, end):
    argv = ["uds", "services", "--dry-run", "--probe-start", start, "--json"]
    if end is not None:
        argv += ["--probe-end", end]
    result = run_cli(*argv)
    assert result.code == 1
    assert result.error_codes == ["INVALID_PROBE_RANGE"]


def test_bad_request_id():
    result = run_cli("uds", "services", "--dry-run", "--request-id", "0x20000000", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_FRAME"])


# -- active mode: the gate ---------------------------------------------------------------

def test_active_ack_required(monkeypatch, rigged_transport):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "1")
    result = run_cli("uds", "services", "can0", "--json")
    assert (result.code, result.error_codes) == (1, ["ACTIVE_ACK_REQUIRED"])
    assert rigged_transport == []


def test_active_confirmation_declined(monkeypatch, rigged_transport):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.StringIO("yes\n"))
    result = run_cli("uds", "services", "can0", "--ack-active", "--json")
    assert (result.code, result.error_codes) == (1, ["ACTIVE_CONFIRMATION_DECLINED"])
    assert rigged_transport == []


def test_transport_unavailable_exit_2(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    result = run_cli("uds", "services", "down0", "--json")
    assert (result.code, result.error_codes) == (2, ["TRANSPORT_UNAVAILABLE"])


# -- reply classification (ISO 14229-1) ------------------------------------------------------

def test_parse_response():
    positive = uds.parse_response(bytes.fromhex("5001003201F4"))
    assert (positive.positive, positive.sid, positive.nrc) == (True, 0x10, None)
    assert positive.payload == bytes.fromhex("01003201F4")
    negative = uds.parse_response(bytes.fromhex("7F2711"))
    assert (negative.positive, negative.sid, negative.nrc) == (False, 0x27, 0x11)
    assert uds.parse_response(bytes.fromhex("7F27")) is None  # a negative response is 3 bytes
    assert uds.parse_response(bytes.fromhex("1001")) is None  # a request, not a response
    assert uds.parse_response(b"") is None and uds.parse_response(None) is None


def test_probes_never_request_a_side_effect():
    """Only side-effect-free requests go out whole (0x10 01, 0x27 01, 0x3E 00: ISO 14229-1);
    every other service is probed with its SID alone."""
    requests = {r["service"]: r["data"] for r in run_cli("uds", "services", "--dry-run", "--json").data["requests"]}
    assert requests["0x10"] == "0210010000000000"
    assert requests["0x27"] == "0227010000000000"
    assert requests["0x3E"] == "023e000000000000"
    for sid in ("0x11", "0x14", "0x19", "0x28", "0x2E", "0x2F", "0x31", "0x34", "0x85"):
        assert requests[sid] == f"01{sid[2:].lower()}000000000000", sid


def test_every_negative_response_code_of_annex_a_has_its_name():
    """ISO 14229-1:2020 Annex A, Table A.1: the codes a server sends are named; the reserved ones are not."""
    named = {0x34: "AuthenticationRequired", 0x3A: "SecureDataVerificationFailed",
             0x5B: "SessionKeyCreationOrDerivationFailed", 0x83: "EngineIsRunning", 0x93: "VoltageTooLow",
             0x94: "ResourceTemporarilyNotAvailable", 0xF3: "VehicleManufacturerSpecificConditionsNotCorrect"}
    assert {nrc: uds.nrc_name(nrc) for nrc in named} == named
    defined = [*range(0x10, 0x15), 0x21, 0x22, *range(0x24, 0x27), 0x31, *range(0x33, 0x3B), *range(0x50, 0x5E),
               *range(0x70, 0x74), 0x78, 0x7E, 0x7F, *range(0x81, 0x8E), *range(0x8F, 0x95), *range(0xF0, 0xFF)]
    assert [nrc for nrc in range(1, 0x100) if uds.nrc_name(nrc) != "Unknown"] == defined
