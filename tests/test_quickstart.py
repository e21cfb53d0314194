"""The README's "Try it without hardware" section, run as written, across processes.

Cross-process means a bus between processes, which the isolated suite never
opens: so this is an ``integration`` test, and it makes its own private
network namespace (Linux, root): ``lo`` plus a veth pair standing for the
machine's network interface (``lan0``, with the default route) and the local
network (``lan1``). ``tests/quickstart_child.py`` runs the section's
commands there (as ``nobody`` where that user can run this Python) and sniffs
``lan1``. The test checks that each command did what the README says and that
no packet of the bus reached the local network, while a control datagram
sent off the machine did.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import importlib.util
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import can
import pytest

from canarchy.testing.lanes.netns import netns_support

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("quickstart_child.py")
GROUP = "ff01::6361:6e61"
NOBODY = 65534


def _setup(ip: str) -> str:
    return " && ".join([
        f"{ip} link set lo up",
        # no duplicate address detection in this namespace: IPv6 on lan0 (its link-local address, its
        # multicast route) is usable as soon as the link is up, instead of a second or two later
        "echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad",
        f"{ip} link add lan0 type veth peer name lan1",
        f"{ip} link set lan1 up",
        f"{ip} link set lan0 up",
        f"{ip} addr add 192.0.2.10/24 dev lan0",
        f"{ip} route add default via 192.0.2.1 dev lan0",
        f"{ip} neigh add 192.0.2.1 lladdr 02:00:00:00:00:01 dev lan0",
    ])


def _nobody_can_run_python() -> bool:
    try:
        return subprocess.run([sys.executable, "-c", "import canarchy, can, msgpack"], user=NOBODY, group=NOBODY,
                              capture_output=True, timeout=60, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _udp_and_group(packet: bytes) -> tuple[bool, bool]:
    """(carries UDP, names the bus's group) for one Ethernet frame."""
    group = ipaddress.IPv6Address(GROUP).packed
    ethertype = packet[12:14]
    udp = (ethertype == b"\x86\xdd" and packet[20] == 17) or (ethertype == b"\x08\x00" and packet[23] == 17)
    return udp, group in packet


_REPORT: dict = {}


@pytest.fixture
def report(tmp_path_factory) -> dict:
    """The child's report: made once by the first test that asks (inside that integration
    test, where child processes may open a real bus), then shared."""
    if not _REPORT:
        _REPORT.update(_run_quickstart(tmp_path_factory))
    return _REPORT


def _run_quickstart(tmp_path_factory) -> dict:
    support = netns_support()
    if not support.available:
        pytest.skip(f"needs a private network namespace: {support.reason}")
    if importlib.util.find_spec("msgpack") is None:
        pytest.skip("python-can's udp_multicast bus needs msgpack: pip install -e '.[integration]'")
    workdir = tmp_path_factory.mktemp("quickstart")
    (workdir / "fixtures" / "captures").mkdir(parents=True)
    shutil.copy(ROOT / "fixtures" / "captures" / "obd2_skoda_7e0_7e8.log", workdir / "fixtures" / "captures")
    uid = "-"
    if os.geteuid() == 0 and _nobody_can_run_python():
        for path in [workdir, *workdir.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        uid = str(NOBODY)
    argv = [support.unshare, "--net", "--", "sh", "-c", _setup(support.ip) + ' && exec "$@"', "sh",
            sys.executable, str(CHILD), str(ROOT / "README.md"), str(workdir), uid]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANARCHY_", "CAN_"))}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["workdir"] = workdir
    return result


def _command(report: dict, start: str) -> dict:
    [found] = [c for c in report["commands"] if c["line"].startswith(start)]
    assert found["returncode"] == 0, found
    return found


def test_the_section_sets_up_the_loopback_only_bus(report):
    assert report["setup"][1:] == ["export CANARCHY_PYTHON_CAN_INTERFACE=udp_multicast",
                                   f"export CANARCHY_DEFAULT_INTERFACE={GROUP}",
                                   "export CANARCHY_BUS_KWARGS=hop_limit=0"]
    assert "ready on udp_multicast channel" in report["server_ready"], report["server"]


def test_uds_services_finds_the_simulated_ecu(report):
    text = _command(report, "canarchy uds services")["stdout"]
    assert "11/27 services supported" in text, text


def test_fuzz_guided_gets_feedback_from_the_simulated_ecu(report):
    text = _command(report, "canarchy fuzz guided")["stdout"]
    assert "20 frames sent" in text or "frames_sent: 20" in text, text


def test_capture_records_what_replay_sends_and_python_can_reads_it_back(report):
    _command(report, "canarchy replay fixtures/")
    capture = _command(report, "canarchy capture --duration")
    log = report["workdir"] / "drive.log"
    recorded = list(can.CanutilsLogReader(str(log)))
    assert recorded, capture
    # the replayed requests (its --filter 7E0:7FF) and the simulated ECU's answers to them
    assert {m.arbitration_id for m in recorded} == {0x7E0, 0x7E8}
    sent = list(can.CanutilsLogReader(str(ROOT / "fixtures" / "captures" / "obd2_skoda_7e0_7e8.log")))
    requests = [bytes(m.data) for m in sent if m.arbitration_id == 0x7E0]
    replayed = [bytes(m.data) for m in recorded if m.arbitration_id == 0x7E0]
    assert replayed == requests[:len(replayed)] and len(replayed) > 10  # in order, none lost before the end
    answers = [bytes(m.data) for m in recorded if m.arbitration_id == 0x7E8]
    assert answers and all(a[1] == 0x7F for a in answers)  # OBD-II service 0x01 is no UDS service: 7F 01 11


def test_the_recording_reads_back_and_replays(report):
    text = _command(report, "canarchy capture --file drive.log")["stdout"]
    lines = text.splitlines()
    assert lines[-1] == "capture of drive.log: 3 frames" and lines[0].endswith("  7E0   [8]  02 01 01 55 55 55 55 55")
    dry = _command(report, "canarchy replay drive.log --dry-run")["stdout"]
    assert "dry run: replay drive.log" in dry and "nothing sent" in dry


def test_the_simulated_ecu_stopped_cleanly(report):
    assert report["server"]["returncode"] == 0, report["server"]
    assert "stopped by SIGINT" in report["server"]["stdout"]


def test_nothing_of_the_bus_reached_the_local_network(report):
    seen = [_udp_and_group(bytes.fromhex(p)) for p in report["packets"]]
    control = [p for p in report["packets"] if b"canarchy-quickstart-control".hex() in p]
    assert len(control) == 1, "the sniffer did not see the control datagram: it proves nothing"
    assert sum(udp for udp, _ in seen) == 1, "a UDP datagram other than the control reached the local network"
    assert not any(group for _, group in seen), "the bus's multicast group was announced on the local network"


def test_it_ran_as_an_ordinary_user_where_the_machine_allows(report):
    if report["uid"] != NOBODY:
        pytest.skip("the commands ran as root: this machine's Python is not readable by nobody (e.g. under /root)"
                    if report["uid"] == 0 else f"the commands ran as this user (uid {report['uid']}): only root "
                    "can run them as nobody")
    assert report["uid"] == NOBODY
