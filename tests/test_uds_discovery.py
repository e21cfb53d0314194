"""UDS discovery (``uds scan``, ``uds dids``, active ``uds services``) and the ISO-TP tester,
against simulated ECUs on python-can's ``virtual`` bus.

The bus of most tests holds three ECUs (:func:`three_ecus`): one that speaks
UDS on 0x7E0 and answers SecurityAccess with a 16-byte seed (a segmented
answer), one that is on 0x7E1 and never answers, and one on 29-bit normal
fixed addressing (target 0x33) with its own DIDs. An observer bus on the same
channel sees every frame that crossed it.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import json
import threading
import time

import can
import pytest

from canarchy import uds
from canarchy.isotp import IsoTpTester
from canarchy.simulator import EcuNode, EcuProfile, SimulatedEcu, SimulatedNetwork
from canarchy.transport import PythonCanBackend
from tests.helpers import recorded, run_cli

SEED16 = bytes(range(0xA0, 0xB0))
VIN = "WDB2030461A123456"
DID_ECU = 0x18DA33F1, 0x18DAF133
DIDS = {0xF190: VIN.encode(), 0xF18C: b"SN-000042", 0xF195: b"\x02\x07",
        0xF197: b"SIMBRAKE   ", 0x0101: bytes(range(40))}
#: For a run whose every probe is answered: the wait ends with the answer, so a long one costs nothing and a
#: loaded machine's late ECU thread is still heard (the default 0.2 s is a tester's P2, not a test's margin).
ANSWERED = ("--timeout", "2")


@pytest.fixture(autouse=True)
def virtual_transport(monkeypatch):
    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")


@pytest.fixture
def three_ecus(virtual_channel):
    """The three ECUs on one bus, and an observer that records every frame (``observed``)."""
    ecus = [
        EcuNode(0x7E0, profile=EcuProfile(security_seed=SEED16), name="multi-frame"),
        EcuNode(0x7E1, profile=EcuProfile(silent=True), name="silent"),
        EcuNode(*DID_ECU, profile=EcuProfile(dids=DIDS), name="dids"),
    ]
    observed: list[can.Message] = []
    with SimulatedNetwork(virtual_channel, ecus) as network, \
            can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as observer:
        notifier = can.Notifier(observer, [observed.append], timeout=0.05)
        try:
            yield network, observed
        finally:
            notifier.stop()


def by_name(network):
    return {node.name: node for node in network.ecus}


# -- the three ECUs -----------------------------------------------------------------------------


def test_scan_finds_exactly_the_two_that_answer(three_ecus):
    network, observed = three_ecus
    ecus = by_name(network)
    result = run_cli("uds", "scan", network.channel, "--addressing", "both", "--ids", "0x7DC-0x7EB",
                     "--targets", "0x32-0x35", "--timeout", "0.1", "--json")  # 0.1 s: room for a loaded machine
    assert result.code == 0, result.out
    data = result.data
    found = [(e["request_id"], e["response_id"], e["is_extended_id"], e["usual_pair"]) for e in data["ecus"]]
    assert found == [(0x7E0, 0x7E8, False, True), (*DID_ECU, True, True)]
    assert all(e["response"] == "positive" and e["message"] == "7e00" for e in data["ecus"])
    assert data["ecu_count"] == 2 and data["probed_count"] == 16 + 4
    # The silent ECU was asked (once: nothing to confirm) and said nothing.
    assert ecus["silent"].requests == [bytes.fromhex("023e000000000000")]
    assert ecus["multi-frame"].requests == [bytes.fromhex("023e000000000000")] * 2  # asked, then confirmed
    # Nothing was sent on the response ID of the ECU found: the frames seen there are all its own.
    on_7e8 = [bytes(m.data) for m in observed if m.arbitration_id == 0x7E8 and not m.is_extended_id]
    assert on_7e8 == ecus["multi-frame"].responses
    events = [e["event_type"] for e in data["events"]]
    assert events.count("uds_ecu") == 2 and events.count("uds_scan_probe") == data["probed_count"]
    skipped = [e["payload"]["request_id"] for e in data["events"] if e["payload"].get("skipped")]
    assert skipped == [0x7E8]  # the ECU's response ID, found earlier in the scan


def test_uds_services_reads_the_multi_frame_answer(three_ecus):
    network, _observed = three_ecus
    ecu = by_name(network)["multi-frame"]
    result = run_cli("uds", "services", network.channel, *ANSWERED, "--json")
    assert result.code == 0, result.out
    probes = {p["service"]: p for p in result.data["probes"]}
    seed = probes["0x27"]
    assert (seed["response"], seed["supported"], seed["frame_count"]) == ("positive", True, 3)
    assert seed["message"] == "6701" + SEED16.hex()  # all 18 bytes, reassembled
    assert result.data["probe_count"] == len(uds.SERVICES) == 27
    assert not any(w.startswith("UDS_NO_RESPONSE") for w in result.envelope["warnings"])
    # The tester asked for the rest of the answer: flow control (ContinueToSend, BS 0, STmin 0) reached the ECU.
    assert bytes.fromhex("3000000000000000") in ecu.requests
    transaction = next(e["payload"] for e in result.data["events"] if e["payload"]["service"] == "0x27")
    assert [f["direction"] for f in transaction["frames"]] == ["tx", "rx", "tx", "rx", "rx"]
    # a frame canarchy sent is no received one (docs/record-and-replay.md: is_rx false), the ECU's are
    assert [f["is_rx"] for f in transaction["frames"]] == [False, True, False, True, True]


def test_the_silent_ecu_gets_its_warning(three_ecus):
    network, _observed = three_ecus
    silent = by_name(network)["silent"]
    result = run_cli("uds", "services", network.channel, "--request-id", "0x7E1", "--probe-start", "0x10",
                     "--probe-end", "0x14", "--timeout", "0.05", "--json")
    assert result.code == 0, result.out
    data = result.data
    assert (data["silent"], data["answered_count"], data["supported_count"]) == (True, 0, 0)
    codes = [w.split(":", 1)[0] for w in result.envelope["warnings"]]
    assert codes.count("UDS_NO_RESPONSE") == 1
    assert "7E9" in next(w for w in result.envelope["warnings"] if w.startswith("UDS_NO_RESPONSE"))
    assert len(recorded(silent.requests, 5)) == 5  # every probe arrived, none answered: the warning is right
    dids = run_cli("uds", "dids", network.channel, "--request-id", "0x7E1", "--dids", "0xF190", "--json")
    assert dids.data["silent"] is True and any(w.startswith("UDS_NO_RESPONSE") for w in dids.envelope["warnings"])


def test_an_ecu_that_answers_is_not_called_silent(three_ecus):
    network, _observed = three_ecus
    result = run_cli("uds", "services", network.channel, "--probe-start", "0x23", "--probe-end", "0x24", *ANSWERED,
                     "--json")
    assert [p["nrc"] for p in result.data["probes"]] == ["0x11", "0x11"]   # supports neither ...
    assert result.data["silent"] is False                                  # ... but it answered
    assert not any(w.startswith("UDS_NO_RESPONSE") for w in result.envelope["warnings"])


def test_dids_are_read_and_decoded(three_ecus):
    network, _observed = three_ecus
    result = run_cli("uds", "dids", network.channel, "--request-id", f"0x{DID_ECU[0]:X}", *ANSWERED, "--json")
    assert result.code == 0, result.out
    data = result.data
    assert data["response_id"] == DID_ECU[1]  # the usual pair: 0x18DA<SA><TA>
    dids = {d["did"]: d for d in data["dids"]}
    assert sorted(dids) == ["0xF186", "0xF18C", "0xF190", "0xF195", "0xF197"]  # F186 is the session, implicit
    assert (dids["0xF190"]["name"], dids["0xF190"]["vin"], dids["0xF190"]["frame_count"]) == ("VIN", VIN, 3)
    assert dids["0xF18C"]["text"] == "SN-000042"
    assert dids["0xF197"]["text"] == "SIMBRAKE"               # trailing padding stripped
    assert dids["0xF195"]["data"] == "0207" and "text" not in dids["0xF195"]
    assert dids["0xF186"]["session"] == "defaultSession"
    assert data["refused_by_nrc"] == {"0x31": 32 - 5}          # requestOutOfRange for the others
    text = run_cli("uds", "dids", network.channel, "--request-id", f"0x{DID_ECU[0]:X}", "--dids", "0xF190",
                   *ANSWERED).out
    assert "0xF190  VIN" in text and VIN in text and "18DA33F1 -> 18DAF133" in text


def test_a_long_did_outside_the_default_range(three_ecus):
    network, _observed = three_ecus
    result = run_cli("uds", "dids", network.channel, "--request-id", f"0x{DID_ECU[0]:X}", "--dids", "0x0100-0x0102",
                     *ANSWERED, "--json")
    [did] = result.data["dids"]
    assert (did["did"], did["name"], did["data"], did["length"]) == ("0x0101", "Unknown", bytes(range(40)).hex(), 40)
    assert did["frame_count"] == 7  # 43 bytes: a first frame and six consecutive frames


def test_jsonl_streams_each_result_then_the_envelope(three_ecus):
    network, _observed = three_ecus
    result = run_cli("uds", "dids", network.channel, "--request-id", f"0x{DID_ECU[0]:X}", "--dids",
                     "0xF18C-0xF190", "--jsonl")
    lines = [json.loads(line) for line in result.out.splitlines()]
    assert [line.get("event_type") for line in lines[:-1]] == ["uds_did"] * 5
    assert [line["payload"]["did"] for line in lines[:-1]] == ["0xF18C", "0xF18D", "0xF18E", "0xF18F", "0xF190"]
    assert lines[-1]["command"] == "uds dids" and lines[-1]["data"]["found_count"] == 2
    assert "events" not in lines[-1]["data"]


# -- the scan's safety rules --------------------------------------------------------------------


def test_a_late_answer_is_not_credited_to_the_next_id(virtual_channel):
    # The ECU on 0x7D0 answers TesterPresent 0.3 s late: after the scan moved on to 0x7D1 (in the middle of its
    # 0.2 s wait, so that a loaded machine's 0.1 s either way still lands it there).
    slow = EcuNode(0x7D0, profile=EcuProfile(response_delays={0x3E: 0.3}))
    with SimulatedNetwork(virtual_channel, [slow]):
        result = run_cli("uds", "scan", virtual_channel, "--ids", "0x7D0-0x7D2", "--timeout", "0.2",
                         "--listen", "0", "--json")
    assert result.data["ecus"] == []
    probes = {e["payload"]["request_id"]: e["payload"] for e in result.data["events"]}
    assert probes[0x7D1]["answered"] is True and probes[0x7D1]["confirmed"] == []   # heard, then not again
    assert any(w.startswith("UDS_SCAN_NO_ECU") for w in result.envelope["warnings"])


def test_ids_already_in_use_are_not_sent_on(virtual_channel):
    # Another node transmits on 0x7D3 every 20 ms; an ECU listens there too. The scan must not join in.
    ecu = EcuNode(0x7D3)
    with SimulatedNetwork(virtual_channel, [ecu]), \
            can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as other:
        task = other.send_periodic(can.Message(arbitration_id=0x7D3, data=bytes(8), is_extended_id=False), 0.02)
        try:
            result = run_cli("uds", "scan", virtual_channel, "--ids", "0x7D0-0x7D5", "--timeout", "0.02",
                             "--listen", "0.2", "--json")
        finally:
            task.stop()
    data = result.data
    assert 0x7D3 in data["busy_ids"] and data["skipped_busy_count"] == 1 and data["probed_count"] == 5
    assert set(ecu.requests) == {bytes(8)}  # only the other node's frames ever reached 0x7D3
    assert data["ecus"] == []


def test_session_probe_sends_default_session_only(virtual_channel):
    with SimulatedEcu(channel=virtual_channel, request_id=0x7D9) as ecu:
        result = run_cli("uds", "scan", virtual_channel, "--ids", "0x7D8-0x7DA", "--probe", "session",
                         "--timeout", "0.25", "--json")  # three IDs: room for a loaded machine
    [found] = result.data["ecus"]
    assert (found["request_id"], found["response_id"], found["message"]) == (0x7D9, 0x7E1, "5001003201f4")
    assert set(ecu.messages) == {bytes.fromhex("1001")}
    assert ecu.server.session == uds.SESSION_DEFAULT


def test_scan_dry_run_builds_no_transport(rigged_transport, capsys):
    result = run_cli("uds", "scan", "--dry-run", "--addressing", "both", "--json")
    assert result.code == 0, result.out
    data = result.data
    assert (data["mode"], data["candidate_count"], data["interface"]) == ("dry_run", 256 + 255, None)
    assert data["first_requests"][0] == {"arbitration_id": 0x700, "is_extended_id": False,
                                         "data": "023e000000000000"}
    assert rigged_transport == [] and capsys.readouterr().err == ""


def test_dids_dry_run_plans_the_requests(rigged_transport):
    result = run_cli("uds", "dids", "--dry-run", "--dids", "0xF190", "--json")
    assert result.data["requests"] == [{"did": "0xF190", "name": "VIN", "arbitration_id": 0x7E0,
                                        "data": "0322f19000000000"}]
    assert rigged_transport == []


@pytest.mark.parametrize("command", [("scan", "--ids", "0x700-0x701"), ("dids", "--dids", "0xF190")])
def test_the_gate_comes_first(command, virtual_channel, monkeypatch):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "1")
    with SimulatedEcu(channel=virtual_channel, request_id=0x700) as ecu:
        result = run_cli("uds", command[0], virtual_channel, *command[1:], "--json")
    assert (result.code, result.error_codes) == (1, ["ACTIVE_ACK_REQUIRED"])
    assert ecu.requests == []


@pytest.mark.parametrize("argv, code", [
    (("scan", "--ids", "0x7FF-0x700"), "INVALID_SCAN_RANGE"),
    (("scan", "--ids", "0x800"), "INVALID_SCAN_RANGE"),
    (("scan", "--addressing", "29bit", "--targets", "0x100"), "INVALID_SCAN_RANGE"),
    (("scan", "--timeout", "0"), "INVALID_TIMEOUT"),
    (("scan", "--listen", "-1"), "INVALID_TIMEOUT"),
    (("dids", "--dids", "0xF190-0xF180"), "INVALID_DID_RANGE"),
    (("dids", "--dids", "0x10000"), "INVALID_DID_RANGE"),
    (("dids", "--request-id", "0x18FEF100"), "INVALID_ARGUMENTS"),  # no usual response ID
    (("services", "--response-id", "0x7E0"), "INVALID_ARGUMENTS"),
])
def test_bad_arguments(argv, code):
    result = run_cli("uds", *argv, "--dry-run", "--json")
    assert (result.code, result.error_codes) == (1, [code]), result.out


def test_scan_needs_a_channel_unless_dry_run():
    result = run_cli("uds", "scan", "--json")
    assert (result.code, result.error_codes) == (1, ["INTERFACE_REQUIRED"])


# -- the ISO-TP tester ---------------------------------------------------------------------------


def test_tester_sends_a_segmented_request_and_honours_the_ecus_flow_control(virtual_channel):
    # The ECU asks for one consecutive frame per block, 5 ms apart; the request (15 bytes) takes 2 CFs.
    profile = EcuProfile(block_size=1, st_min=5)
    request = bytes.fromhex("22" "f187" "f18c" "f195" "f190" "f198" "f186" "f187")
    with SimulatedEcu(channel=virtual_channel, profile=profile) as ecu, \
            PythonCanBackend("virtual").session(virtual_channel) as link:
        exchange = IsoTpTester(link, 0x7E0, 0x7E8, block_size=2).request(request, 0.5)
    assert ecu.messages == [request]
    frames = [(direction, bytes(frame.data), frame.timestamp) for direction, frame in exchange.frames]
    kinds = [(direction, data[0] >> 4) for direction, data, _ in frames]
    # FF, the ECU's FC, one CF, its FC again, the last CF; then the answer's first frame.
    assert kinds[:6] == [("tx", 1), ("rx", 3), ("tx", 2), ("rx", 3), ("tx", 2), ("rx", 1)]
    assert frames[4][2] - frames[2][2] >= 0.0045  # STmin 5 ms between the two consecutive frames
    reply = uds.parse_response(exchange.messages[0])
    assert reply.positive and reply.sid == 0x22 and exchange.warnings == []
    assert len(exchange.messages[0]) == 67 and b"TMBZZZ0X0NY000001" in exchange.messages[0]
    # The answer takes 9 CFs and this tester asked for blocks of 2: its FC first, then after CF 2, 4, 6, 8.
    sent_fc = [data for direction, data, _ in frames if direction == "tx" and data[0] >> 4 == 3]
    assert sent_fc == [bytes.fromhex("3002000000000000")] * 5
    assert [data[0] for direction, data, _ in frames if direction == "rx" and data[0] >> 4 == 2] == \
        [0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29]


def test_tester_reports_an_answer_that_stops_half_way(virtual_channel):
    # A raw peer: answers with a first frame and one consecutive frame of a 20-byte message, then nothing.
    def peer(bus: can.BusABC) -> None:
        while (message := bus.recv(timeout=2)) is not None:
            if message.arbitration_id == 0x7E0 and message.data[0] == 0x03:
                bus.send(can.Message(arbitration_id=0x7E8, data=bytes.fromhex("101462f190414243"),
                                     is_extended_id=False))
            elif message.arbitration_id == 0x7E0 and message.data[0] == 0x30:
                bus.send(can.Message(arbitration_id=0x7E8, data=bytes.fromhex("2144454647484950"),
                                     is_extended_id=False))
                return

    with can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as raw, \
            PythonCanBackend("virtual").session(virtual_channel) as link:
        thread = threading.Thread(target=peer, args=(raw,), daemon=True)
        thread.start()
        started = time.monotonic()
        exchange = IsoTpTester(link, 0x7E0, 0x7E8, n_timeout=0.2).request(uds.read_did_request(0xF190), 0.5)
        thread.join(5)
    assert exchange.messages == []
    assert len(exchange.warnings) == 1 and "stopped before its end" in exchange.warnings[0]
    assert time.monotonic() - started < 5


def test_uds_services_streams_each_probe_as_it_happens(virtual_channel):
    """--jsonl: each probe's event is written before the next request reaches the ECU."""
    import io

    from canarchy.cli import main

    with SimulatedEcu(channel=virtual_channel) as ecu:
        class Recording(io.StringIO):
            def __init__(self) -> None:
                super().__init__()
                self.seen: list[int] = []

            def write(self, text):
                self.seen.append(len(ecu.messages))
                return super().write(text)

        out = Recording()
        assert main(["uds", "services", virtual_channel, *ANSWERED, "--jsonl"], stdout=out) == 0
    *events, envelope = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["payload"]["service"] for e in events] == [f"0x{s.sid:02X}" for s in uds.SERVICES]
    assert out.seen[:len(events)] == list(range(1, len(events) + 1))  # event i written when i requests had arrived
    assert envelope["command"] == "uds services" and envelope["data"]["probe_count"] == 27


def test_the_progress_line_is_for_terminals_only(virtual_channel, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        with SimulatedEcu(channel=virtual_channel):
            result = run_cli("uds", "services", virtual_channel, "--probe-start", "0x10", "--probe-end", "0x11",
                             *ANSWERED, "--json")
        assert result.code == 0
        text = stream.getvalue()
        assert ("\r\x1b[K" in text and "uds services" in text and "probed" in text) is shown, text
        assert "\r" not in result.out  # never on stdout


def test_a_scan_stopped_by_ctrl_c_reports_the_ecus_it_found(three_ecus, monkeypatch):
    """Ctrl+C mid-scan ended with an envelope of ``stopped_by`` alone: the ECUs confirmed before it were gone
    (fuzz guided keeps its summary). What Ctrl+C raises is raised here at the probe after the first ECU."""
    from canarchy import discovery

    network, _observed = three_ecus
    real = discovery.scan_ecus

    def interrupted_after_the_first_ecu(link, todo, probe, timeout, on_result, on_ecu):
        found = []

        def result(record):
            on_result(record)
            if found:
                raise KeyboardInterrupt("SIGINT")

        return real(link, todo, probe, timeout, result, lambda ecu: (found.append(ecu), on_ecu(ecu)))

    monkeypatch.setattr(discovery, "scan_ecus", interrupted_after_the_first_ecu)
    result = run_cli("uds", "scan", network.channel, "--ids", "0x7E0-0x7FF", "--timeout", "0.15", "--json")
    data = result.data
    assert result.code == 0 and data["stopped_by"] == "SIGINT", result.out
    assert [(e["request_id"], e["response_id"]) for e in data["ecus"]] == [(0x7E0, 0x7E8)] == [
        (e["request_id"], e["response_id"]) for e in (x["payload"] for x in data["events"]
                                                      if x["event_type"] == "uds_ecu")]
    assert data["ecu_count"] == 1 and data["probed_count"] == 1 < 32


def test_an_ecu_that_says_response_pending_then_nothing_is_not_called_silent(virtual_channel, monkeypatch):
    """ISO 14229-2: after 0x78 the tester waits P2*server (5 s; 0.3 s here); an ECU that then says nothing is
    there and did not finish. It was reported as "no ECU listens on this request ID" (answered 0, silent)."""
    from canarchy import discovery

    monkeypatch.setattr(discovery, "PENDING_TIMEOUT", 0.3)
    ecu = EcuNode(0x7E0, profile=EcuProfile(pending={0x22: 2.0}), name="slow")  # its answer 2 s after the 0x78
    with SimulatedNetwork(virtual_channel, [ecu]):
        result = run_cli("uds", "dids", virtual_channel, "--dids", "F190", "--timeout", "0.3", "--json")
    data = result.data
    assert result.code == 0 and data["events"][0]["payload"]["pending_count"] == 1, result.out
    assert not any(w.startswith("UDS_NO_RESPONSE") for w in result.envelope["warnings"]), result.envelope
    assert any(w.startswith("UDS_RESPONSE_PENDING_EXPIRED: 1 ReadDataByIdentifier requests on 7E0 got "
                            "responsePending") for w in result.envelope["warnings"]), result.envelope
    assert (data["answered_count"], data["silent"]) == (1, False)


def test_a_slow_ecu_repeats_response_pending_until_it_answers(virtual_channel, monkeypatch):
    """ISO 14229-2: a server that needs longer than P2*server repeats 0x78 before it runs out; the simulator
    sent one, then silence until its answer, so a tester that waits P2* after each 0x78 gave up. With a 0.2 s
    repeat here (4 s by default), a 0.7 s answer comes after four 0x78, each within a tester's 0.6 s P2* (0.4 s
    of room for a loaded machine); one 0x78 and silence would outlast it."""
    from canarchy import discovery, uds_server

    monkeypatch.setattr(uds_server, "PENDING_REPEAT_S", 0.2)
    monkeypatch.setattr(discovery, "PENDING_TIMEOUT", 0.6)
    ecu = EcuNode(0x7E0, profile=EcuProfile(pending={0x22: 0.7}), name="slow")
    with SimulatedNetwork(virtual_channel, [ecu]):
        result = run_cli("uds", "dids", virtual_channel, "--dids", "F190", "--timeout", "2", "--json")
    [read] = result.data["dids"]
    assert (read["did"], read["found"], read["pending_count"]) == ("0xF190", True, 4), result.out
