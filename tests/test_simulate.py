"""``simulate ecu``: the simulated UDS ECU as a command.

End to end, in one process: the command's handler runs in a thread on the
test's python-can ``virtual`` channel, and ``uds services CHANNEL`` probes it
from the test's thread; what it finds must be what the profile says. python-can's
virtual bus lives in one process, so the subprocess tests cover only what
needs a process: signals, ``--duration`` and the exit status.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import can
import pytest

from canarchy.cli import main
from canarchy.uds_server import DEFAULT_VIN
from tests.helpers import run_cli

PROFILE = """\
# a small ECU: five services, RoutineControl refused, its own VIN and security key
services = ["0x10", "0x22", "0x27", "0x31", "0x3E"]

[nrc]
"0x31" = "0x22"   # conditionsNotCorrect

[dids]
"0xF190" = "WDB12345678901234"
"0xF195" = { hex = "0102" }

[security]
seed = "A1B2C3D4"
key = "5E4D3C2B"
"""


class ReadyStream(io.StringIO):
    """stdout for a command in a thread: ``ready`` is set once a ``simulator_ready`` line is written."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = threading.Event()

    def write(self, text: str) -> int:
        count = super().write(text)
        if '"simulator_ready"' in text:
            self.ready.set()
        return count


class EcuThread:
    """``canarchy simulate ecu ARGV --jsonl`` running in a thread."""

    def __init__(self, *argv: str) -> None:
        self.out = ReadyStream()
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, args=(list(argv),), daemon=True)

    def _run(self, argv: list[str]) -> None:
        self.code = main(["simulate", "ecu", *argv, "--jsonl"], stdout=self.out)

    def __enter__(self) -> EcuThread:
        self.thread.start()
        if not self.out.ready.wait(5):
            self.thread.join(5)
            pytest.fail(f"the simulator did not get ready: {self.out.getvalue()}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.thread.join(10)
        assert not self.thread.is_alive(), "the simulator did not stop"

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.out.getvalue().splitlines()]


@pytest.fixture
def virtual(monkeypatch):
    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")


def write_profile(tmp_path: Path, text: str = PROFILE, name: str = "ecu.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# -- end to end ---------------------------------------------------------------------------------

def test_uds_services_finds_the_services_of_the_profile(virtual, virtual_channel, tmp_path):
    profile = write_profile(tmp_path)
    with EcuThread(virtual_channel, "--profile", profile, "--ack-active", "--max-requests", "27",
                   "--duration", "10") as ecu:
        probe = run_cli("uds", "services", virtual_channel, "--ack-active", "--json")
    assert probe.code == 0, probe.out
    assert probe.data["supported_services"] == ["0x10", "0x22", "0x27", "0x31", "0x3E"]
    routine = next(p for p in probe.data["probes"] if p["service"] == "0x31")
    assert routine["nrc"] == "0x22"  # the profile's NRC override, as the tester saw it
    assert ecu.code == 0
    lines = ecu.lines()
    assert lines[0]["event_type"] == "simulator_ready"
    assert [line["payload"]["service"] for line in lines[1:-1]] == [p["service"] for p in probe.data["probes"]]
    envelope = lines[-1]
    assert envelope["ok"] is True and envelope["command"] == "simulate ecu"
    data = envelope["data"]
    assert (data["requests"], data["stopped_by"], data["bus_type"]) == (27, "max_requests", "virtual")
    assert data["requests_by_service"]["0x10"] == 1 and sum(data["requests_by_service"].values()) == 27
    assert data["frames_sent"] == 27  # one single-frame answer per probe


def test_the_profile_vin_and_security_key_are_served(virtual, virtual_channel, tmp_path):
    profile = write_profile(tmp_path)
    with (
        EcuThread(virtual_channel, "--profile", profile, "--max-requests", "3", "--duration", "5"),
        can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as tester,
    ):
        def exchange(data: str, expect: int = 1) -> list[bytes]:
            tester.send(can.Message(arbitration_id=0x7E0, data=bytes.fromhex(data), is_extended_id=False))
            frames = []
            while len(frames) < expect and (message := tester.recv(timeout=1)) is not None:
                if message.arbitration_id == 0x7E8:
                    frames.append(bytes(message.data))
            return frames

        first = exchange("0322F190", 1)
        assert first[0][:5] == bytes.fromhex("101462F190")  # first frame: 20 bytes follow
        rest = exchange("300000", 2)  # flow control: send the consecutive frames
        vin = (first[0][5:] + rest[0][1:] + rest[1][1:])[:17]
        assert vin.decode() == "WDB12345678901234" != DEFAULT_VIN
        assert exchange("022701")[0][:7] == bytes.fromhex("066701A1B2C3D4")  # the profile's seed
        assert exchange("0627025E4D3C2B")[0][:3] == bytes.fromhex("026702")


def test_without_a_profile_the_built_in_ecu_answers(virtual, virtual_channel):
    with EcuThread(virtual_channel, "--max-requests", "27", "--duration", "10") as ecu:
        probe = run_cli("uds", "services", virtual_channel, "--timeout", "2", "--json")  # every probe answered
    assert probe.data["supported_services"] == ["0x10", "0x11", "0x14", "0x19", "0x22", "0x27", "0x28", "0x2E",
                                                "0x31", "0x3E", "0x85"]
    assert ecu.lines()[-1]["data"]["requests"] == 27


def test_it_stops_after_duration(virtual, virtual_channel):
    with EcuThread(virtual_channel, "--duration", "0.2") as ecu:
        pass
    envelope = ecu.lines()[-1]
    assert (envelope["data"]["stopped_by"], envelope["data"]["requests"]) == ("duration", 0)
    assert envelope["data"]["elapsed_s"] >= 0.2


def test_the_duration_counts_from_the_open_bus(virtual, virtual_channel, monkeypatch):
    """An adapter slower to open than --duration: the clock started before the bus, so the ECU stopped as it
    became ready, and never served the time it was given."""
    from canarchy.simulator import SimulatedNetwork

    real = SimulatedNetwork.start
    opened: list[float] = []

    def slow(self, *args, **kwargs):
        time.sleep(0.5)
        real(self, *args, **kwargs)
        opened.append(time.monotonic())

    monkeypatch.setattr(SimulatedNetwork, "start", slow)
    with EcuThread(virtual_channel, "--duration", "0.3"):
        pass
    assert time.monotonic() - opened[0] >= 0.3


# -- the gate, the plan and the errors ----------------------------------------------------------

def test_it_is_active_the_gate_runs_first(virtual, virtual_channel, monkeypatch, capsys):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "true")
    result = run_cli("simulate", "ecu", virtual_channel, "--duration", "5", "--json")
    assert (result.code, result.error_codes) == (1, ["ACTIVE_ACK_REQUIRED"])
    assert "ACTIVE TRANSMIT: `simulate ecu` will answer UDS requests on 7E0" in capsys.readouterr().err


def test_dry_run_shows_the_profile_and_opens_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(can, "Bus", lambda *a, **k: pytest.fail("a bus was opened"))
    result = run_cli("simulate", "ecu", "--dry-run", "--profile", write_profile(tmp_path), "--json")
    assert result.code == 0, result.out
    data = result.data
    assert (data["mode"], data["interface"], data["request_id"], data["response_id"]) == ("dry_run", None, 0x7E0, 0x7E8)
    assert data["services"] == ["0x10", "0x22", "0x27", "0x31", "0x3E"]
    assert data["nrc"] == {"0x31": "0x22"}
    assert data["dids"] == {"0xF190": {"hex": b"WDB12345678901234".hex(), "text": "WDB12345678901234"},
                            "0xF195": {"hex": "0102", "text": None}}
    assert (data["security"]["seed"], data["security"]["key"]) == ("a1b2c3d4", "5e4d3c2b")


def test_a_json_profile_and_ids_from_profile_and_flags(tmp_path):
    profile = write_profile(tmp_path, json.dumps({"request_id": "0x7DF", "services": [16, "0x3E"], "padding": False,
                                                  "dids": {"0xF190": "JSONVIN0000000001"}}), "ecu.json")
    data = run_cli("simulate", "ecu", "--dry-run", "--profile", profile, "--json").data
    assert (data["request_id"], data["response_id"], data["services"], data["padding"]) == (
        0x7DF, 0x7E7, ["0x10", "0x3E"], None)
    data = run_cli("simulate", "ecu", "--dry-run", "--profile", profile, "--request-id", "0x18DA10F1", "--json").data
    assert (data["request_id"], data["response_id"]) == (0x18DA10F1, 0x18DAF110)


def test_dry_run_text(tmp_path):
    out = run_cli("simulate", "ecu", "--dry-run", "--profile", write_profile(tmp_path)).out
    assert "services: 0x10 0x22 0x27 0x31 0x3E" in out and "DID 0xF190: WDB12345678901234" in out


@pytest.mark.parametrize("text,fragment", [
    ("services = [\"0x10\"\n", "does not parse as TOML"),
    ("service = [\"0x10\"]\n", "unknown key(s) service"),
    ("services = \"0x10\"\n", "`services` must be a list"),
    ("services = [\"0x100\"]\n", "outside 0..255"),
    ("services = [\"0x7F\"]\n", "negative response SID"),
    ("services = [true]\n", "services[0] must be an integer"),
    ("[nrc]\n\"0x31\" = 0\n", "nrc.0x31"),
    ("[dids]\n\"0xF190\" = 17\n", "dids.0xF190 must be a text string"),
    ("[dids]\n\"0x1F190\" = \"x\"\n", "dids key '0x1F190'"),
    ("[dids]\n\"0xF190\" = { hex = \"0g\" }\n", "dids.0xF190.hex"),
    ("[security]\nseed = \"\"\n", "security.seed is empty"),
    ("[security]\npin = \"1234\"\n", "unknown key(s) security.pin"),
    ("[pending]\n\"0x11\" = -1\n", "pending.0x11 must be a number of seconds"),
    ("padding = true\n", "padding must be an integer"),
    ("request_id = \"0x20000000\"\n", "request_id"),
])
def test_bad_profiles(tmp_path, text, fragment):
    result = run_cli("simulate", "ecu", "--dry-run", "--profile", write_profile(tmp_path, text), "--json")
    assert (result.code, result.error_codes) == (1, ["SIMULATOR_PROFILE_INVALID"]), result.out
    assert fragment in result.envelope["errors"][0]["message"]


@pytest.mark.parametrize("name,content,fragment", [
    ("missing.toml", None, "does not exist"),
    ("ecu.yaml", "services: []", "neither .toml nor .json"),
    ("ecu.json", "[1, 2]", "top level must be"),
    ("ecu.json", "{\"services\": [16,]}", "does not parse as JSON"),
])
def test_profile_files_that_cannot_be_used(tmp_path, name, content, fragment):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    result = run_cli("simulate", "ecu", "vcan0", "--profile", str(path), "--json")
    assert (result.code, result.error_codes) == (1, ["SIMULATOR_PROFILE_INVALID"])
    assert fragment in result.envelope["errors"][0]["message"]


@pytest.mark.parametrize("argv,code", [
    (["--duration", "0"], "INVALID_ARGUMENTS"),
    (["--duration", "soon"], "INVALID_ARGUMENTS"),
    (["--max-requests", "0"], "INVALID_ARGUMENTS"),
    (["--request-id", "0x7E0", "--response-id", "0x7E0"], "INVALID_ARGUMENTS"),
    (["--request-id", "0x18FEF100"], "INVALID_ARGUMENTS"),  # no usual response ID: give one
    (["--request-id", "zz"], "INVALID_FRAME"),
])
def test_bad_options(argv, code):
    result = run_cli("simulate", "ecu", "--dry-run", *argv, "--json")
    assert (result.code, result.error_codes) == (1, [code]), result.out


def test_an_active_run_needs_a_channel():
    assert run_cli("simulate", "ecu", "--json").error_codes == ["INTERFACE_REQUIRED"]


def test_the_scaffold_backend_cannot_host_it(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    result = run_cli("simulate", "ecu", "scaffold0", "--duration", "1", "--json")
    assert (result.code, result.error_codes) == (1, ["SIMULATOR_TRANSPORT_UNSUPPORTED"])


def test_a_bus_that_cannot_be_opened_is_a_transport_error(virtual, monkeypatch):
    def refuse(*args, **kwargs):
        raise can.CanInterfaceNotImplementedError("no such interface")

    monkeypatch.setattr(can, "Bus", refuse)
    result = run_cli("simulate", "ecu", "vcan9", "--duration", "1", "--json")
    assert (result.code, result.error_codes) == (2, ["TRANSPORT_UNAVAILABLE"])


# -- as a process -------------------------------------------------------------------------------

def _start(channel: str, *argv: str) -> subprocess.Popen:
    env = dict(os.environ, CANARCHY_PYTHON_CAN_INTERFACE="virtual")
    return subprocess.Popen([sys.executable, "-m", "canarchy", "simulate", "ecu", channel, *argv, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_sigterm_and_sigint_stop_the_process_cleanly(virtual_channel):
    """SIGTERM and SIGINT (Ctrl+C) each end the process promptly with exit 0 and the envelope
    (``--duration`` is only the safety net). The two processes start together: importing
    python-can dominates."""
    procs = {"SIGTERM": _start(virtual_channel + "-a", "--duration", "30"),
             "SIGINT": _start(virtual_channel + "-b", "--duration", "30")}
    outcomes = {}
    try:
        for stop, proc in procs.items():
            gate = proc.stderr.readline()
            assert "ACTIVE TRANSMIT" in gate, gate
            ready = proc.stderr.readline()
            assert ready.startswith("canarchy: simulate ecu: ready on virtual channel"), ready
            proc.send_signal(getattr(signal, stop))
            started = time.monotonic()
            out, err = proc.communicate(timeout=30)  # a hang detector, not a speed target
            outcomes[stop] = (proc.returncode, time.monotonic() - started, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for stop, (code, _elapsed, out, err) in outcomes.items():
        assert code == 0, (stop, err)
        assert "Traceback" not in err, (stop, err)
        envelope = json.loads(out)
        assert envelope["ok"] is True and envelope["data"]["stopped_by"] == stop
        assert envelope["data"]["requests"] == 0


# In a child process: for each n, SIGINT is raised at the n-th profiler event of the wait
# loop, so it lands on every bytecode boundary of the waiting code in turn, including
# those where that code holds a lock of its own.
_SIGNAL_AT_EVERY_POINT = """
import signal, sys
from canarchy.commands._common import StopSignals

events = 0
for n in range(1, 41):
    events = 0

    def profile(frame, event, arg):
        global events
        events += 1
        if events == n:
            signal.raise_signal(signal.SIGINT)

    with StopSignals() as stop:
        sys.setprofile(profile)
        try:
            while not stop.wait(0.001):
                pass
        finally:
            sys.setprofile(None)
    assert stop.name == "SIGINT", (n, stop.name)
print("stopped 40 times")
"""


def test_a_stop_signal_ends_the_wait_wherever_it_lands():
    """The stop handler of ``simulate ecu`` and ``web serve`` takes no lock. A handler that
    set a ``threading.Event`` could run while the main thread held that Event's own lock
    inside ``wait`` and then wait for itself for ever: a Ctrl+C that hangs the command."""
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_AT_EVERY_POINT], capture_output=True, text=True,
                          timeout=60)  # a hang detector
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "stopped 40 times\n"


def test_a_bad_profile_exits_1_before_anything_is_opened(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "canarchy", "simulate", "ecu", "vcan0", "--profile",
                           write_profile(tmp_path, "services = 5\n"), "--json"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["errors"][0]["code"] == "SIMULATOR_PROFILE_INVALID"
    assert proc.stderr == ""  # no preflight warning: nothing was about to transmit


NETWORK = """\
# three ECUs on one bus: one with a 16-byte seed, one that never answers, one on 29-bit addressing
[[ecus]]
request_id = "0x7E0"
[ecus.security]
seed = "000102030405060708090A0B0C0D0E0F"

[[ecus]]
request_id = "0x7E1"
silent = true

[[ecus]]
request_id = "0x18DA33F1"
[ecus.dids]
"0xF190" = "WDB2030461A123456"
"""


def test_a_profile_with_several_ecus_on_one_bus(virtual, virtual_channel, tmp_path):
    profile = write_profile(tmp_path, NETWORK, "network.toml")
    with EcuThread(virtual_channel, "--profile", profile, "--ack-active", "--duration", "10",
                   "--max-requests", "5") as ecu:
        scan = run_cli("uds", "scan", virtual_channel, "--addressing", "both", "--ids", "7E0-7E1",
                       "--targets", "33", "--timeout", "0.25", "--json")  # 0.25 s: room for a loaded machine
        vin = run_cli("uds", "dids", virtual_channel, "--request-id", "18DA33F1", "--dids", "F190", "--timeout", "2",
                      "--json")
    assert scan.code == 0, scan.out
    assert [(e["request_id"], e["response_id"]) for e in scan.data["ecus"]] == [(0x7E0, 0x7E8),
                                                                                (0x18DA33F1, 0x18DAF133)]
    assert vin.data["dids"][0]["vin"] == "WDB2030461A123456"
    envelope = ecu.lines()[-1]
    data = envelope["data"]
    assert [(e["request_id"], e["silent"]) for e in data["ecus"]] == [(0x7E0, False), (0x7E1, True),
                                                                       (0x18DA33F1, False)]
    assert [e["requests"] for e in data["ecus"]] == [2, 0, 3]   # scan + confirmation; the silent one answers none
    assert data["ecus"][1]["frames_received"] == 1              # ... though the scan's request reached it
    assert data["ecus"][0]["security"]["seed"] == "000102030405060708090a0b0c0d0e0f"
    ready = next(line for line in ecu.lines() if line.get("event_type") == "simulator_ready")
    assert [e["request_id"] for e in ready["payload"]["ecus"]] == [0x7E0, 0x7E1, 0x18DA33F1]


@pytest.mark.parametrize("text, message", [
    ("[[ecus]]\nservices = [\"0x10\"]\n", "ecus[0] has no request_id"),
    ("[[ecus]]\nrequest_id = 1\n[[ecus]]\nrequest_id = 1\n", "two ECUs share a request_id"),
    ("services = [\"0x10\"]\n[[ecus]]\nrequest_id = 1\n", "every key belongs to one of the ECUs"),
    ("ecus = []\n", "non-empty list"),
    ("[[ecus]]\nrequest_id = 1\nsilent = \"yes\"\n", "ecus[0]: ecus[0].silent must be true or false"),
    ("[[ecus]]\nrequest_id = 1\nbogus = 1\n", "ecus[0]: unknown key(s) ecus[0].bogus"),
])
def test_bad_networks(text, message, tmp_path):
    result = run_cli("simulate", "ecu", "--profile", write_profile(tmp_path, text), "--dry-run", "--json")
    assert (result.code, result.error_codes) == (1, ["SIMULATOR_PROFILE_INVALID"])
    assert message in result.envelope["errors"][0]["message"]


def test_a_network_takes_no_id_options(tmp_path):
    result = run_cli("simulate", "ecu", "--profile", write_profile(tmp_path, NETWORK), "--request-id", "7E0",
                     "--dry-run", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])
