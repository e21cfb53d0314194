"""Integration tests: the real environment and a real bus (``-m integration``).

Deselected by default. ``nox -s integration`` runs them; on Linux as root it
provides a bus they may legally use (python-can ``udp_multicast`` inside a
private network namespace holding only loopback) and exports
``CANARCHY_PYTHON_CAN_INTERFACE``/``CANARCHY_DEFAULT_INTERFACE`` for it.
Elsewhere the operator's own configuration names the bus; with none, the
bus tests skip and say why.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from canarchy import config, frames, transport
from tests.helpers import run_cli

pytestmark = pytest.mark.integration


def _real_bus() -> tuple[str, str]:
    """The bus type and channel the operator (or the lane) configured, or skip."""
    settings = transport.transport_backend_config()
    channel = transport.default_can_interface()
    if settings.backend != "python-can" or channel is None or settings.bus_type == "virtual":
        pytest.skip("no real bus configured: set [transport].interface and default_interface "
                    "(or CANARCHY_PYTHON_CAN_INTERFACE / CANARCHY_DEFAULT_INTERFACE), or run `nox -s integration` "
                    "as root on Linux for a private loopback bus")
    if settings.bus_type == "udp_multicast" and importlib.util.find_spec("msgpack") is None:
        pytest.skip("python-can's udp_multicast bus needs msgpack: pip install -e '.[integration]'")
    return settings.bus_type, channel


def _transmit_bus() -> tuple[str, str]:
    """The bus for a test that TRANSMITS (frames, UDS probes, a fuzz campaign): only a
    private bus the lane provided, or one the operator explicitly opened to transmission."""
    bus_type, channel = _real_bus()
    if os.environ.get("CANARCHY_TEST_PRIVATE_BUS") != "1" and os.environ.get(
            "CANARCHY_INTEGRATION_ALLOW_TRANSMIT") != "1":
        pytest.skip(f"would transmit on {bus_type} {channel}, which is not a private test bus: "
                    "run `nox -s integration` (a private loopback bus), or set "
                    "CANARCHY_INTEGRATION_ALLOW_TRANSMIT=1 if this bus may take test traffic "
                    "(frames, UDS probes, a short fuzz campaign)")
    return bus_type, channel


def test_the_real_home_is_seen():
    home = Path.home()
    assert "canarchy-pytest-" not in str(home)
    assert home == Path(os.path.expanduser("~"))
    assert config.config_path() == home / ".canarchy" / "config.toml"


def test_config_show_reports_the_real_configuration():
    result = run_cli("config", "show", "--json")
    assert result.code == 0, result.out
    data = result.data
    assert data["config_path"] == str(Path.home() / ".canarchy" / "config.toml")
    assert data["config_found"] == (Path.home() / ".canarchy" / "config.toml").is_file()
    for variable, entry in data["settings"].items():
        if os.environ.get(variable, "").strip():
            assert entry["source"] == "env", variable


def test_round_trip_through_the_python_can_backend():
    bus_type, channel = _transmit_bus()
    receiver = transport.PythonCanBackend(bus_type=bus_type, capture_timeout=2.0)
    sender = transport.PythonCanBackend(bus_type=bus_type)
    frame = frames.CanFrame(0x18FEF100, bytes.fromhex("F7000004000000FF"), is_extended_id=True)
    captured: list[frames.CanFrame] = []
    stream = receiver.capture(channel, limit=1, timeout=3.0)
    ready = threading.Event()

    def capture():
        first = stream.__next__  # opens the bus on the first call
        ready.set()
        try:
            captured.append(first())
        except StopIteration:
            pass

    worker = threading.Thread(target=capture)
    worker.start()
    ready.wait(5)
    time.sleep(0.3)  # the receiving socket joins the group inside next()
    sender.send(channel, frame)
    worker.join(10)
    assert [(f.arbitration_id, f.is_extended_id, f.data) for f in captured] == [
        (frame.arbitration_id, True, frame.data)]


def test_uds_services_finds_a_simulated_ecu_in_another_process():
    bus_type, channel = _transmit_bus()
    simulator = subprocess.Popen(
        [sys.executable, "-m", "canarchy.simulator", "--bus-type", bus_type, "--channel", channel,
         "--duration", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(simulator.stdout.readline() or "{}")
        assert ready.get("event") == "ready", ready
        env = dict(os.environ, CANARCHY_MCP_NONINTERACTIVE_ACK="1")
        proc = subprocess.run([sys.executable, "-m", "canarchy", "uds", "services", channel, "--ack-active",
                               "--timeout", "0.5", "--json"], capture_output=True, text=True, env=env, timeout=60)
    finally:
        simulator.terminate()
        simulator.wait(10)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["mode"] == "active" and data["probe_count"] == 27
    assert "0x10" in data["supported_services"] and "0x3E" in data["supported_services"]
    assert data["supported_count"] < 27  # the simulated ECU answers 0x11 to some services


# -- cross-process on the real bus ------------------------------------------------

def _canarchy(*argv: str, timeout: float = 60, **popen) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CANARCHY_MCP_NONINTERACTIVE_ACK="1")  # --ack-active without a typed YES
    return subprocess.run([sys.executable, "-m", "canarchy", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, **popen)


def _operator_state() -> dict:
    from canarchy.testing.isolation.tree import OPERATOR_STATE, snapshot

    return snapshot(Path.home(), only=OPERATOR_STATE)


def test_send_and_capture_round_trip_between_two_processes():
    """`capture CHANNEL --count 1` in one process receives what `send CHANNEL --ack-active` sends from another."""
    _bus_type, channel = _transmit_bus()
    capture = subprocess.Popen([sys.executable, "-m", "canarchy", "capture", channel, "--count", "1",
                                "--timeout", "20", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sends = []
    try:
        # The capture process has no "ready" line: send until it has its frame (or give up).
        for _attempt in range(10):
            sends.append(_canarchy("send", channel, "0x18FEF100", "F7000004000000FF", "--ack-active", "--json"))
            assert sends[-1].returncode == 0, sends[-1].stdout + sends[-1].stderr
            try:
                out, err = capture.communicate(timeout=1.5)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            pytest.fail(f"capture received nothing after {len(sends)} sends")
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait(10)
    assert capture.returncode == 0, out + err
    sent = json.loads(sends[-1].stdout)["data"]
    assert sent["mode"] == "active" and sent["interface"] == channel
    data = json.loads(out)["data"]
    assert data["frame_count"] == 1 and data["interface"] == channel
    [event] = data["events"]
    frame = event["payload"]
    assert (frame["arbitration_id"], frame["is_extended_id"], frame["data"]) == (0x18FEF100, True, "f7000004000000ff")


def test_fuzz_guided_campaign_against_a_simulated_ecu_in_another_process(tmp_path):
    """A short `fuzz guided --ack-active` campaign against `python -m canarchy.simulator` on the real bus:
    findings are written under --findings-dir, the operator's ~/.canarchy is left as it was."""
    bus_type, channel = _transmit_bus()
    before = _operator_state()
    findings = tmp_path / "findings"
    simulator = subprocess.Popen(
        [sys.executable, "-m", "canarchy.simulator", "--bus-type", bus_type, "--channel", channel, "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(simulator.stdout.readline() or "{}")
        assert ready.get("event") == "ready", ready
        proc = _canarchy("fuzz", "guided", channel, "--id", "0x7E0", "--ack-active", "--max-iterations", "20",
                         "--rate", "50", "--timeout", "0.3", "--seed", "5", "--findings-dir", str(findings), "--json",
                         timeout=120)
    finally:
        simulator.terminate()
        simulator.wait(10)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["mode"] == "active" and data["interface"] == channel
    assert data["frames_sent"] == 20 and data["findings_count"] >= 1
    assert any(marker.startswith(("positive:", "nrc:")) for marker in data["markers"]), data["markers"]
    campaign = findings / data["campaign_id"]
    assert data["findings_dir"] == str(campaign)
    written = sorted(p.name for p in campaign.iterdir())
    assert written[0] == "campaign.json" and len(written) == 1 + data["findings_count"]
    assert json.loads((campaign / "campaign.json").read_text())["status"] == "finished"
    assert _operator_state() == before, "the campaign touched the operator's ~/.canarchy"
