"""Every example of the README's "Using canarchy" block does what its comment says.

Each line runs as written, in-process, from a working directory holding a
copy of ``fixtures/captures``. Where a line names ``can0`` (a real interface),
the test runs it on a python-can ``virtual`` channel instead, with a stand-in
on the other end: a simulated ECU (``canarchy.simulator``) for the UDS and
fuzz examples, a peer sending a 100 ms periodic message or test traffic for
the captures, a receiving peer for ``send`` and ``replay``. ``uds scan``
probes 767 IDs at its default 0.1 s timeout (over a minute): it runs here on
two 11-bit IDs (the ECU's and the one before) and two 29-bit targets, with 0.25 s for each
answer (a 10 ms window over every ID missed the simulated ECU's answer when
other test runs loaded the machine). Two lines run faster than written, as the
virtual bus allows: the 5 s capture records for 2 s (the stand-in's traffic
takes 1.2 s), and the fuzz campaign sends at 100 frames/s instead of its
default 10. ``mcp serve`` runs as a child process that gets an
``initialize`` request and then end of input. The section "Try it without
hardware" is run across processes by ``tests/test_quickstart.py``.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import can
import pytest

from canarchy.cli import main
from canarchy.simulator import SimulatedEcu
from tests.helpers import receivers

ROOT = Path(__file__).resolve().parents[1]


def readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Using canarchy\n\n```sh\n(.*?)```", text, flags=re.S).group(1)
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


EXAMPLES = readme_examples()


class Run:
    def __init__(self, code: int, out: str) -> None:
        self.code, self.out = code, out

    def json(self) -> dict:
        return json.loads(self.out)


def run(line: str, channel: str | None = None) -> Run:
    argv = shlex.split(line)[1:]
    if channel is not None:
        argv = [channel if word == "can0" else word for word in argv]
    out = io.StringIO()
    code = main(argv, stdout=out)
    return Run(code, out.getvalue())


def example(start: str) -> str:
    [line] = [line for line in EXAMPLES if line.startswith(start)]
    return line


@pytest.fixture(autouse=True)
def workdir(monkeypatch, tmp_path):
    shutil.copytree(ROOT / "fixtures" / "captures", tmp_path / "fixtures" / "captures")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def virtual(monkeypatch, virtual_channel):
    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    return virtual_channel


def test_every_example_is_covered():
    covered = {"canarchy uds services --json", "canarchy uds services can0", "canarchy uds scan",
               "canarchy uds dids", "canarchy capture can0 --count", "canarchy capture can0 --filter",
               "canarchy replay", "canarchy send", "canarchy fuzz guided", "canarchy j1939 pgn",
               "canarchy capture --file", "canarchy decode", "canarchy j1939 decode", "canarchy isotp decode",
               "canarchy mcp serve", "canarchy web serve", "canarchy config show", "canarchy config check",
               "canarchy --version"}
    assert len(EXAMPLES) == len(covered)
    for line in EXAMPLES:
        assert any(line.startswith(prefix) for prefix in covered), line


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as ended:  # argparse's version action, as cantools --version
        run(example("canarchy --version"))
    assert ended.value.code == 0 and capsys.readouterr().out == f"canarchy {version('canarchy')}\n"


def test_uds_services_reference():
    data = run(example("canarchy uds services --json")).json()["data"]
    assert data["mode"] == "reference" and data["service_count"] == 27


def test_uds_services_probes_an_ecu_and_asks_for_yes(virtual, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("YES\n"))
    with SimulatedEcu(channel=virtual):
        result = run(example("canarchy uds services can0") + " --json", virtual)
    assert result.code == 0, result.out
    assert result.json()["data"]["supported_count"] == 11
    assert "Type YES to transmit" in capsys.readouterr().err


def test_uds_scan_finds_the_ecu(virtual, monkeypatch):
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")
    with SimulatedEcu(channel=virtual):
        result = run(example("canarchy uds scan") + " --ids 0x7DF-0x7E0 --targets 0x00-0x01 --timeout 0.25 --text",
                     virtual)
    assert result.code == 0, result.out
    assert "1 ECU(s) answered" in result.out and "7E0 -> 7E8" in result.out


def test_uds_dids_reads_the_vin(virtual):
    with SimulatedEcu(channel=virtual):
        result = run(example("canarchy uds dids") + " --text", virtual)
    assert result.code == 0, result.out
    assert re.search(r"0xF190\s+VIN\s+TMBZZZ0X0NY000001", result.out), result.out


def test_capture_count_ten_as_json_lines(virtual):
    with can.Bus(channel=virtual, interface="virtual", ignore_config=True) as peer:
        task = peer.send_periodic(can.Message(arbitration_id=0x123, data=b"\x01", is_extended_id=False), 0.1)
        try:
            result = run(example("canarchy capture can0 --count"), virtual)
        finally:
            task.stop()
    lines = [json.loads(line) for line in result.out.splitlines()]
    assert result.code == 0 and len(lines) == 11
    assert [line["event_type"] for line in lines[:10]] == ["frame"] * 10 and lines[10]["ok"] is True


def _record(virtual: str) -> list[tuple[int, bytes]]:
    """The capture example, with a stand-in sending 0x7E0/0x7E8 and other traffic meanwhile."""
    outcome: list[Run] = []
    line = example("canarchy capture can0 --filter").replace("--duration 5", "--duration 2")
    thread = threading.Thread(target=lambda: outcome.append(run(line, virtual)))
    sent = []
    with can.Bus(channel=virtual, interface="virtual", ignore_config=True) as peer:
        thread.start()
        while receivers(virtual) < 2:  # the capture's bus is open (it sees only what is sent after)
            assert thread.is_alive(), outcome
            time.sleep(0.01)
        for index in range(12):
            arbitration_id = (0x7E0, 0x7E8, 0x123)[index % 3]
            message = can.Message(arbitration_id=arbitration_id, data=bytes([index]) * 8, is_extended_id=False)
            peer.send(message)
            sent.append((arbitration_id, bytes(message.data)))
            time.sleep(0.02)
        thread.join(30)
    assert outcome and outcome[0].code == 0, outcome
    assert "stopped by duration" in outcome[0].out and "written to drive.blf" in outcome[0].out
    return [s for s in sent if s[0] != 0x123]


def test_capture_with_a_filter_records_a_blf_file_that_replay_plays_back(virtual, monkeypatch):
    """The README's two lines in its order: record drive.blf, then play it back."""
    expected = _record(virtual)
    assert [(m.arbitration_id, bytes(m.data)) for m in can.BLFReader("drive.blf")] == expected
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")
    with can.Bus(channel=virtual, interface="virtual", ignore_config=True) as peer:
        result = run(example("canarchy replay"), virtual)
        received = []
        while (message := peer.recv(timeout=0.05)) is not None:
            received.append((message.arbitration_id, bytes(message.data)))
    assert result.code == 0, result.out
    assert received == expected
    assert f"{len(expected)} frames sent" in result.out


def test_send_one_frame(virtual):
    with can.Bus(channel=virtual, interface="virtual", ignore_config=True) as peer:
        result = run(example("canarchy send"), virtual)
        message = peer.recv(1)
    assert result.code == 0, result.out
    assert (message.arbitration_id, message.is_extended_id, bytes(message.data).hex()) == (
        0x7E0, False, "0210010000000000")


def test_fuzz_guided_writes_findings(virtual, workdir):
    with SimulatedEcu(channel=virtual):
        result = run(example("canarchy fuzz guided") + " --rate 100 --json", virtual)
    assert result.code == 0, result.out
    data = result.json()["data"]
    assert data["frames_sent"] == 50 and data["findings_count"] >= 1
    assert (workdir / "findings" / data["campaign_id"] / "campaign.json").is_file()


def test_j1939_pgn():
    data = run(example("canarchy j1939 pgn") + " --json").json()["data"]
    assert data["pgn"] == 61444 and "EEC1" in json.dumps(data)


def test_capture_file():
    result = run(example("canarchy capture --file") + " --json")
    assert result.code == 0 and result.json()["data"]["frame_count"] == 5


def test_decode_with_a_dbc():
    result = run(example("canarchy decode"))
    lines = [json.loads(line) for line in result.out.splitlines()]
    assert result.code == 0 and lines[-1]["ok"] is True and len(lines) > 1


def test_j1939_dm1():
    result = run(example("canarchy j1939 decode"))
    assert result.code == 0, result.out
    assert "DM1 SA 0:" in result.out and "DTCs: SPN 980 FMI 9" in result.out


def test_isotp_decode_finds_the_vin():
    result = run(example("canarchy isotp decode"))
    assert result.code == 0, result.out
    assert "VIN: TMBZZZ0X0NY000001" in result.out


def test_mcp_serve_answers_initialize_on_stdio():
    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "readme-test", "version": "0"}}}
    argv = shlex.split(example("canarchy mcp serve"))[1:]
    proc = subprocess.run([sys.executable, "-m", "canarchy", *argv], input=json.dumps(request) + "\n",
                          capture_output=True, text=True, timeout=120)
    answer = json.loads(proc.stdout.splitlines()[0])
    assert answer["id"] == 1 and "serverInfo" in answer["result"]


def test_web_serve_shows_the_recording():
    # The example's port is fixed (8765); here any free one, and a set duration instead of Ctrl+C.
    result = run(example("canarchy web serve") + " --bind 127.0.0.1:0 --duration 0.3 --json")
    assert result.code == 0, result.out
    data = result.json()["data"]
    assert (data["frame_count"], data["decoded_count"], data["stopped_by"]) == (3582, 1100, "duration")


def test_config_show_and_check():
    data = run(example("canarchy config show") + " --json").json()["data"]
    assert data["settings"]["CANARCHY_TRANSPORT_BACKEND"]["source"] == "default"
    assert run(example("canarchy config check")).code == 0
    (Path.home() / ".canarchy").mkdir()
    (Path.home() / ".canarchy" / "config.toml").write_text("[transprot]\n")
    assert run(example("canarchy config check")).code == 1
