"""The simulated UDS ECU (canarchy.simulator): the peer active commands are tested against.

Every test talks to a real :class:`SimulatedEcu` over python-can's in-process
``virtual`` bus on a channel of its own (the ``virtual_channel`` fixture).
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import can
import pytest

from canarchy.simulator import EcuProfile, SimulatedEcu, main
from canarchy.uds_server import DEFAULT_VIN
from tests.helpers import run_cli

REQUEST_ID, RESPONSE_ID = 0x7E0, 0x7E8


class EcuClient:
    """The tester (client) side: one virtual bus on the ECU's channel."""

    def __init__(self, bus: can.BusABC) -> None:
        self.bus = bus

    def send(self, data: bytes, arbitration_id: int = REQUEST_ID) -> None:
        self.bus.send(can.Message(arbitration_id=arbitration_id, data=data, is_extended_id=arbitration_id > 0x7FF))

    def receive(self, count: int, timeout: float = 2.0) -> list[bytes]:
        """Up to ``count`` response frames (data), waiting at most ``timeout`` s in all (long: the ECU is a
        thread, late on a loaded machine; a wait for frames that should not come gives its own short one)."""
        frames: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(frames) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            message = self.bus.recv(timeout=remaining)
            if message is not None and message.arbitration_id == RESPONSE_ID:
                frames.append(bytes(message.data))
        return frames

    def exchange(self, hex_request: str, count: int = 1, timeout: float = 2.0) -> list[bytes]:
        self.send(bytes.fromhex(hex_request))
        return self.receive(count, timeout)


@pytest.fixture
def ecu(virtual_channel):
    with SimulatedEcu(channel=virtual_channel) as running:
        yield running


@pytest.fixture
def tester(ecu, virtual_channel):
    with can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as bus:
        yield EcuClient(bus)


def sf(hex_payload: str) -> bytes:
    """A single frame as the ECU sends it: PCI, payload, 0xAA padding to 8 bytes."""
    payload = bytes.fromhex(hex_payload)
    frame = bytes((len(payload),)) + payload
    return frame + b"\xaa" * (8 - len(frame))


# -- supported and unsupported services ---------------------------------------------------

@pytest.mark.parametrize("request_hex, reply_hex", [
    ("021001", "5001003201f4"),   # DiagnosticSessionControl default: P2 50 ms, P2* 5000 ms
    ("021003", "5003003201f4"),   # extended session
    ("023e00", "7e00"),           # TesterPresent
    ("0322f195", "62f1950100"),   # ReadDataByIdentifier
    ("0414ffffff", "54"),         # ClearDiagnosticInformation, all groups
])
def test_positive_responses(tester, request_hex, reply_hex):
    assert tester.exchange(request_hex) == [sf(reply_hex)]


def test_report_number_of_dtcs_counts_by_status_mask(tester):
    # Default DTCs: 0x042000 status 0x2F, 0xC10000 status 0x09; mask 0x08 matches both, 0x20 one.
    assert tester.exchange("03190108") == [sf("5901ff010002")]
    assert tester.exchange("03190120") == [sf("5901ff010001")]


@pytest.mark.parametrize("sid", [0x23, 0x2F, 0x34, 0x35, 0x36, 0x37, 0x01, 0xBA])
def test_unsupported_sid_gets_service_not_supported(tester, sid):
    assert tester.exchange(f"02{sid:02x}00") == [sf(f"7f{sid:02x}11")]


def test_profile_decides_what_is_supported(virtual_channel):
    profile = EcuProfile(supported_sids=frozenset({0x3E}))
    with SimulatedEcu(channel=virtual_channel, profile=profile), \
            can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as bus:
        tester = EcuClient(bus)
        assert tester.exchange("023e00") == [sf("7e00")]
        assert tester.exchange("021001") == [sf("7f1011")]


def test_forced_nrc_and_session_gating(virtual_channel):
    profile = EcuProfile(forced_nrcs={0x22: 0x22})
    with SimulatedEcu(channel=virtual_channel, profile=profile), \
            can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as bus:
        tester = EcuClient(bus)
        assert tester.exchange("0322f190") == [sf("7f2222")]        # conditionsNotCorrect, forced
        assert tester.exchange("03280101") == [sf("7f287f")]        # not in the default session
        assert tester.exchange("021003")[0][:3] == bytes.fromhex("065003")
        assert tester.exchange("03280101") == [sf("6801")]


# -- 0x78 responsePending ----------------------------------------------------------------------

def test_response_pending_then_settled_reply(tester):
    start = time.monotonic()
    tester.send(bytes.fromhex("021101"))
    first = tester.receive(1)
    pending_at = time.monotonic()
    second = tester.receive(1)
    settled_at = time.monotonic()
    assert first == [sf("7f1178")]
    assert second == [sf("5101")]
    assert settled_at - start >= 0.05 and pending_at <= settled_at


# -- feedback worth fuzzing for ----------------------------------------------------------------

def test_security_access_wrong_keys_then_lockout(tester):
    assert tester.exchange("06270200000000") == [sf("7f2724")]      # key before any seed: sequence error
    assert tester.exchange("022701") == [sf("670111223344")]
    assert tester.exchange("06270200000000") == [sf("7f2735")]      # invalidKey
    assert tester.exchange("06270201020304") == [sf("7f2735")]
    assert tester.exchange("062702ffffffff") == [sf("7f2736")]      # third wrong key: exceeded
    assert tester.exchange("022701") == [sf("7f2737")]              # lock-out: time delay not expired


def test_security_access_correct_key_unlocks(tester):
    assert tester.exchange("022701") == [sf("670111223344")]
    assert tester.exchange("062702eeddccbb") == [sf("6702")]
    assert tester.exchange("022701") == [sf("670100000000")]        # unlocked: all-zero seed


@pytest.mark.parametrize("request_hex, nrc", [
    ("0127", "13"),            # SecurityAccess without a sub-function
    ("03270100", "13"),        # requestSeed with data
    ("0427020102", "13"),      # key too short
    ("022705", "12"),          # level not supported
    ("0122", "13"),            # ReadDataByIdentifier without a DID
    ("0422f19000", "13"),      # ... with half a DID
    ("0322f100", "31"),        # ... with an unknown DID
    ("0414000001", "31"),      # ClearDiagnosticInformation of an unknown group
    ("021004", "12"),          # unknown session
    ("021002", "22"),          # programming session straight from default: conditionsNotCorrect
])
def test_negative_responses(tester, request_hex, nrc):
    sid = request_hex[2:4]
    assert tester.exchange(request_hex) == [sf(f"7f{sid}{nrc}")]


def test_routine_control(tester):
    assert tester.exchange("0431011234") == [sf("7f3131")]          # unknown routine id: requestOutOfRange
    assert tester.exchange("0431010203") == [sf("7f3122")]          # conditionsNotCorrect
    assert tester.exchange("043101ff00") == [sf("7f3133")]          # securityAccessDenied while locked
    assert tester.exchange("0431010202") == [sf("71010202" + "00")]
    assert tester.exchange("033101ff") == [sf("7f3113")]            # incomplete routine id


def test_suppress_positive_response_bit(tester):
    assert tester.exchange("023e80", timeout=0.1) == []             # suppressed
    assert tester.exchange("023e81") == [sf("7f3e12")]              # negative responses are not


def test_invalid_single_frames_are_ignored_but_recorded(ecu, tester):
    for frame in ("0222", "0822f190", "00", ""):
        tester.send(bytes.fromhex(frame))
    assert tester.receive(1, timeout=0.1) == []
    assert tester.exchange("023e00") == [sf("7e00")]              # answered: the frames before it were seen
    assert ecu.requests == [bytes.fromhex(f) for f in ("0222", "0822f190", "00", "", "023e00")]
    assert ecu.messages == [bytes.fromhex("3e00")]


def test_requests_and_messages_are_recorded(ecu, tester):
    tester.exchange("023e00")
    tester.send(bytes.fromhex("0322f1900000"), arbitration_id=0x7E1)  # another ECU's id: not ours
    tester.exchange("0322f186")
    assert ecu.requests == [bytes.fromhex("023e00"), bytes.fromhex("0322f186")]
    assert ecu.messages == [bytes.fromhex("3e00"), bytes.fromhex("22f186")]


# -- ISO-TP segmentation ----------------------------------------------------------------------

def test_vin_is_sent_segmented_with_flow_control(tester):
    first = tester.exchange("0322f190")
    assert first == [bytes.fromhex("101462f190") + DEFAULT_VIN[:3].encode()]
    assert tester.receive(1, timeout=0.1) == []                      # nothing before flow control
    tester.send(bytes.fromhex("300000"))
    rest = tester.receive(2)
    assert [frame[0] for frame in rest] == [0x21, 0x22]
    payload = (first[0][2:] + rest[0][1:] + rest[1][1:])[:0x14]
    assert payload == bytes.fromhex("62f190") + DEFAULT_VIN.encode()


def test_flow_control_block_size_is_honoured(tester):
    tester.exchange("0322f190")
    tester.send(bytes.fromhex("300100"))                             # one consecutive frame per block
    assert [f[0] for f in tester.receive(1)] == [0x21]
    assert tester.receive(1, timeout=0.15) == []                     # the block is over: wait for flow control
    tester.send(bytes.fromhex("300100"))
    assert [f[0] for f in tester.receive(1)] == [0x22]


def test_segmented_request_is_reassembled(ecu, tester):
    # 22 F187 F18C F195 F186: 9 bytes, a first frame plus one consecutive frame.
    request = bytes.fromhex("22f187f18cf195f186")
    # flow control: CTS, BS 0, STmin 0
    assert tester.exchange("100922f187f18cf1") == [bytes.fromhex("300000") + b"\xaa" * 5]
    tester.send(bytes.fromhex("2195f186"))
    first = tester.receive(1)
    assert first[0][0] >> 4 == 1                                     # the answer is segmented too
    assert ecu.messages == [request]


# -- lifecycle ---------------------------------------------------------------------------------

def test_clean_shutdown(virtual_channel, caplog):
    caplog.set_level(logging.DEBUG, logger="can")
    with SimulatedEcu(channel=virtual_channel) as ecu:
        assert ecu.running
        assert virtual_channel in can.interfaces.virtual.channels
        thread = ecu._thread
    assert not ecu.running and not thread.is_alive()
    assert virtual_channel not in can.interfaces.virtual.channels
    del ecu
    gc.collect()
    assert not [r for r in caplog.records if "not properly shut down" in r.getMessage()]


def test_stop_is_idempotent(virtual_channel):
    ecu = SimulatedEcu(channel=virtual_channel).start()
    ecu.stop()
    ecu.stop()
    assert virtual_channel not in can.interfaces.virtual.channels
    assert ecu.error is None


def test_extended_ids(virtual_channel):
    with SimulatedEcu(channel=virtual_channel, request_id=0x18DA10F1, response_id=0x18DAF110), \
            can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as bus:
        bus.send(can.Message(arbitration_id=0x18DA10F1, data=bytes.fromhex("023e00"), is_extended_id=True))
        reply = bus.recv(timeout=0.5)
    assert reply is not None and reply.is_extended_id and reply.arbitration_id == 0x18DAF110
    assert bytes(reply.data) == sf("7e00")


# -- what `uds services` sees ------------------------------------------------------------------

def test_uds_services_active_classifies_the_simulator(monkeypatch, virtual_channel):
    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    profile = EcuProfile(pending={0x10: 0.05})
    with SimulatedEcu(channel=virtual_channel, profile=profile) as ecu:
        result = run_cli("uds", "services", virtual_channel, "--json")
    assert result.code == 0, result.out
    data = result.data
    assert data["probe_count"] == 27
    assert sorted(data["supported_services"]) == [
        "0x10", "0x11", "0x14", "0x19", "0x22", "0x27", "0x28", "0x2E", "0x31", "0x3E", "0x85"]
    session = next(p for p in data["probes"] if p["service"] == "0x10")
    assert session["pending_count"] == 1 and session["response"] == "positive"
    reset = next(p for p in data["probes"] if p["service"] == "0x11")
    assert (reset["response"], reset["nrc"], reset["supported"]) == ("negative", "0x13", True)
    assert len(ecu.messages) == 27
    # Discovery executed nothing with a side effect: ECUReset went out as its SID alone.
    assert [bytes(m) for m in ecu.messages if m[0] == 0x11] == [b"\x11"]


# -- as a process ------------------------------------------------------------------------------

def test_main_runs_for_duration(virtual_channel, capsys):
    assert main(["--channel", virtual_channel, "--duration", "0.05"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["event"] for line in lines] == ["ready", "stopped"]
    assert lines[0]["request_id"] == 0x7E0 and lines[0]["response_id"] == 0x7E8
    assert virtual_channel not in can.interfaces.virtual.channels


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
def test_process_stops_on_sigterm(virtual_channel):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "canarchy.simulator", "--channel", virtual_channel],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert json.loads(out.splitlines()[-1])["event"] == "stopped"
