"""``capture``, ``send`` and ``replay`` against real peers on python-can ``virtual`` buses:
bus flags, frame syntax, filters, recording and replay."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import can
import pytest

from tests.helpers import open_slowly, receivers, run_cli, write_user_config


@pytest.fixture
def bus_kwargs_seen(monkeypatch):
    """The keyword arguments of every ``can.Bus`` opened (the real bus is still opened)."""
    seen: list[dict] = []
    real_bus = can.Bus

    def recording_bus(*args, **kwargs):
        seen.append(dict(kwargs))
        return real_bus(*args, **kwargs)

    monkeypatch.setattr(can, "Bus", recording_bus)
    return seen


# -- bus flags ----------------------------------------------------------------------------------

def test_bus_flags_reach_python_can_over_the_config_file(peer, virtual_channel, bus_kwargs_seen):
    write_user_config('[transport]\nbitrate = 250000\n[transport.bus_kwargs]\npreserve_timestamps = false\n')
    result = run_cli("send", virtual_channel, "0x123", "01", "--bitrate", "500000",
                     "--bus-option", "preserve_timestamps=true", "--bus-option", "rx_queue_size=64", "--json")
    assert result.code == 0, result.out
    assert bus_kwargs_seen == [{"channel": virtual_channel, "interface": "virtual", "ignore_config": True,
                                "bitrate": 500000, "preserve_timestamps": True, "rx_queue_size": 64}]
    assert peer.recv(1).arbitration_id == 0x123


def test_send_of_a_can_fd_frame_opens_the_bus_in_fd_mode(peer, virtual_channel, bus_kwargs_seen):
    result = run_cli("send", virtual_channel, "0x123", "00" * 12, "--fd", "--data-bitrate", "2000000", "--json")
    assert result.code == 0, result.out
    assert bus_kwargs_seen[0]["fd"] is True and bus_kwargs_seen[0]["data_bitrate"] == 2_000_000
    received = peer.recv(1)
    assert received.is_fd and len(received.data) == 12


@pytest.mark.parametrize("argv,words", [
    (["--bitrate", "9"], ["transport.bitrate", "the command line"]),
    (["--bus-option", "serial"], ["KEY=VALUE"]),
    (["--bus-option", "channel=can1"], ["channel"]),
    (["--bus-type", ""], ["transport.interface"]),
])
def test_bad_bus_flags_are_refused_before_any_bus_opens(peer, virtual_channel, bus_kwargs_seen, argv, words):
    result = run_cli("capture", virtual_channel, "--count", "1", *argv, "--json")
    assert result.code == 1, result.out
    message = result.envelope["errors"][0]["message"]
    assert all(word in message for word in words), message
    assert bus_kwargs_seen == []


# -- send: cansend's syntax and hex IDs ----------------------------------------------------------

def _sent(peer, virtual_channel, *argv):
    result = run_cli("send", virtual_channel, *argv, "--json")
    assert result.code == 0, result.out
    return result, peer.recv(1)


@pytest.mark.parametrize("argv,expected", [
    (["123#DEADBEEF"], (0x123, False, "deadbeef", False, False)),
    (["123#DE.AD.BE.EF"], (0x123, False, "deadbeef", False, False)),
    (["00000123#11"], (0x123, True, "11", False, False)),   # 8 digits: 29-bit, even below 0x7FF
    (["1F334455#"], (0x1F334455, True, "", False, False)),
    (["123#R"], (0x123, False, "", True, False)),
    (["7E0", "0210010000000000"], (0x7E0, False, "0210010000000000", False, False)),
    (["00000123", "00"], (0x123, True, "00", False, False)),  # today's form, with can-utils' widths
    (["0x7E0", "02"], (0x7E0, False, "02", False, False)),   # 0x forms keep working
    (["123##1" + "00" * 12], (0x123, False, "00" * 12, False, True)),
])
def test_send_puts_exactly_that_frame_on_the_bus(peer, virtual_channel, argv, expected):
    _result, received = _sent(peer, virtual_channel, *argv)
    assert (received.arbitration_id, received.is_extended_id, bytes(received.data).hex(), received.is_remote_frame,
            received.is_fd) == expected


def test_send_remote_frame_with_dlc_and_fd_flags(peer, virtual_channel):
    result, received = _sent(peer, virtual_channel, "123#R4")
    assert received.is_remote_frame and received.dlc == 4 and result.data["frame"]["dlc"] == 4
    result, received = _sent(peer, virtual_channel, "18DAF110##3" + "11" * 8)
    assert received.is_fd and received.bitrate_switch and received.error_state_indicator
    assert (received.arbitration_id, received.is_extended_id) == (0x18DAF110, True)
    assert result.data["frame"]["bitrate_switch"] is True and result.data["frame"]["error_state_indicator"] is True


def test_a_decimal_looking_id_is_hex_and_says_so(peer, virtual_channel):
    result, received = _sent(peer, virtual_channel, "291", "00")
    assert received.arbitration_id == 0x291  # as cansend reads it
    [note] = [w for w in result.envelope["warnings"] if "read as hex" in w]
    assert "hex 0x291" in note and "decimal 291 is 0x123" in note
    result, _ = _sent(peer, virtual_channel, "0x123", "00")
    assert not [w for w in result.envelope["warnings"] if "hex" in w]


def test_an_odd_width_id_above_7ff_is_29_bit_and_says_so(peer, virtual_channel):
    result, received = _sent(peer, virtual_channel, "0x1ABCD", "00")
    assert (received.arbitration_id, received.is_extended_id) == (0x1ABCD, True)
    assert any("0001ABCD" in w for w in result.envelope["warnings"])


@pytest.mark.parametrize("argv,code", [
    (["800", "00"], "INVALID_FRAME"),              # 3 digits above 0x7FF
    (["12#00"], "INVALID_FRAME"),                  # cansend IDs are 3 or 8 digits
    (["123#0"], "INVALID_FRAME_DATA"),
    (["123#" + "00" * 9], "INVALID_FRAME_DATA"),
    (["123##"], "INVALID_FRAME"),                  # no flags digit
    (["123##0" + "00" * 9], "INVALID_FRAME_DATA"),  # 9 bytes is not a CAN FD length
    (["123#R9"], "INVALID_FRAME"),
    (["123#00", "11"], "INVALID_ARGUMENTS"),
    (["123#00", "--fd"], "INVALID_ARGUMENTS"),
    (["3FFFFFFFF", "00"], "INVALID_FRAME"),
])
def test_send_refuses_frames_that_do_not_parse(peer, virtual_channel, argv, code):
    result = run_cli("send", virtual_channel, *argv, "--json")
    assert (result.code, result.error_codes) == (1, [code]), result.out
    assert peer.recv(0.05) is None


@pytest.mark.parametrize("argv", [["123#11", "22"], ["7E0", "0210", "11"], ["18DAF110", "02", "10"]])
def test_send_refuses_a_frame_split_where_its_data_has_a_space(argv):
    """cansend takes the frame as one argument: `send 123#11 22` sent 0x022 on a channel named '123#11', and
    `send 7E0 0210 11` the ID 0x210 on a channel named '7E0', exit 0. Such a 'channel' is refused."""
    result = run_cli("send", *argv, "--dry-run", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"]), result.out
    assert "in the channel's place" in result.envelope["errors"][0]["message"]


def test_an_id_and_its_data_without_a_channel_are_still_the_id_data_form():
    """What the refusal above leaves alone: `send ID DATA` with no channel, an 11-bit and a 29-bit ID."""
    for argv in (["7E0", "0210"], ["18DAF110", "02"]):
        result = run_cli("send", *argv, "--dry-run", "--json")
        assert result.code == 0 and result.data["frame"]["arbitration_id"] == int(argv[0], 16), result.out


def test_send_frame_syntax_without_a_channel_uses_the_default(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    write_user_config('[transport]\ndefault_interface = "scaffold1"\n')
    result = run_cli("send", "18FEF100#F7000004000000FF", "--json")
    assert result.code == 0, result.out
    frame = result.data["frame"]
    assert result.data["interface"] == "scaffold1" and frame["arbitration_id"] == 0x18FEF100
    assert frame["is_extended_id"] is True and frame["data"] == "f7000004000000ff"


def test_send_dry_run_shows_the_frame_and_the_note():
    result = run_cli("send", "123", "01", "--dry-run", "--json")
    assert result.code == 0 and result.data["frame"]["arbitration_id"] == 0x123
    assert any("read as hex" in w for w in result.envelope["warnings"])


def test_the_mcp_send_tool_keeps_its_decimal_or_0x_ids():
    from canarchy import mcp_server

    for given in (291, "291", "0x123"):
        outcome = mcp_server.run_tool("send", {"channel": "vcan0", "arbitration_id": given})
        assert outcome.envelope["data"]["frame"]["arbitration_id"] == 0x123, given


# -- capture: candump's stop conditions, streaming, filters, files ---------------------------------

import io  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from canarchy.cli import main  # noqa: E402
from canarchy.frame_syntax import format_frame  # noqa: E402
from canarchy.frames import CanFrame  # noqa: E402


class TimedStream(io.StringIO):
    """stdout that remembers when each line was written (monotonic), and whether the command had returned."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            self.lines.append((time.monotonic(), line))
        return super().write(text)


class CaptureThread:
    """``canarchy capture ARGV`` in a thread (the virtual bus lives in this process)."""

    def __init__(self, *argv: str) -> None:
        self.argv = argv
        self.out = TimedStream()
        self.code: int | None = None
        self.ended: float | None = None
        self.thread = threading.Thread(target=self._run, args=(list(argv),), daemon=True)

    def _run(self, argv: list[str]) -> None:
        self.code = main(["capture", *argv], stdout=self.out)
        self.ended = time.monotonic()

    def __enter__(self) -> CaptureThread:
        channel = self.argv[0]
        already = receivers(channel)
        self.thread.start()
        # A virtual bus delivers only to buses already open: wait until the capture's is.
        deadline = time.monotonic() + 30
        while receivers(channel) <= already and self.thread.is_alive():
            assert time.monotonic() < deadline, "the capture's bus never opened"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.thread.join(30)
        assert not self.thread.is_alive(), "the capture did not end"

    def jsonl(self) -> list[dict]:
        return [json.loads(line) for line in self.out.getvalue().splitlines()]


def test_count_ten_on_a_100_ms_periodic_message_gets_ten_frames(peer, virtual_channel):
    """The README's `capture can0 --count 10`: gaps longer than the old 50 ms idle stop do not end it."""
    task = peer.send_periodic(can.Message(arbitration_id=0x123, data=b"\x01\x02", is_extended_id=False), 0.1)
    try:
        with CaptureThread(virtual_channel, "--count", "10", "--jsonl") as capture:
            pass
    finally:
        task.stop()
    lines = capture.jsonl()
    assert [line["event_type"] for line in lines[:-1]] == ["frame"] * 10
    envelope = lines[-1]
    assert envelope["ok"] is True and envelope["data"]["frame_count"] == 10
    assert envelope["data"]["stopped_by"] == "count"


def test_text_mode_streams_each_frame_as_it_arrives(peer, virtual_channel):
    with CaptureThread(virtual_channel, "--count", "3", "--text") as capture:
        for index in range(3):
            peer.send(can.Message(arbitration_id=0x7E0 + index, data=bytes([index]), is_extended_id=False))
            deadline = time.monotonic() + 30
            while len(capture.out.lines) <= index:  # its line is out before the next frame is sent
                assert time.monotonic() < deadline, f"frame {index} was not printed while the capture ran"
                time.sleep(0.01)
            assert capture.thread.is_alive() or index == 2
    frames = [(at, line) for at, line in capture.out.lines if "[1]" in line]
    assert len(frames) == 3
    assert frames[0][1].endswith(f"{virtual_channel}  7E0   [1]  00") and frames[0][1].startswith("(")
    assert capture.out.lines[-1][1].startswith(f"capture on {virtual_channel}: 3 frames")


def test_duration_and_idle_timeout_end_a_capture(peer, virtual_channel):
    with CaptureThread(virtual_channel, "--duration", "0.5", "--json") as capture:
        peer.send(can.Message(arbitration_id=0x123, is_extended_id=False))
    data = json.loads(capture.out.getvalue())["data"]
    assert (data["stopped_by"], data["frame_count"], data["duration_s"]) == ("duration", 1, 0.5)
    assert data["elapsed_s"] >= 0.5
    with CaptureThread(virtual_channel, "--idle-timeout", "0.4", "--json") as capture:
        pass
    data = json.loads(capture.out.getvalue())["data"]
    assert (data["stopped_by"], data["frame_count"]) == ("idle_timeout", 0)


def test_the_idle_timeout_counts_from_the_open_bus(peer, virtual_channel, monkeypatch):
    """An adapter slower to open than --idle-timeout (udp_multicast joining its group): the timer started before
    the bus, so the capture stopped as it opened, before any frame could come (candump -T counts from the open
    socket)."""
    open_slowly(monkeypatch, 0.5)
    with CaptureThread(virtual_channel, "--idle-timeout", "0.3", "--json") as capture:
        peer.send(can.Message(arbitration_id=0x123, is_extended_id=False))
    data = json.loads(capture.out.getvalue())["data"]
    assert (data["stopped_by"], data["frame_count"]) == ("idle_timeout", 1)


def test_configured_capture_limit_and_timeout_are_defaults_only(peer, virtual_channel):
    write_user_config("[transport]\ncapture_limit = 2\ncapture_timeout = 5\n")
    with CaptureThread(virtual_channel, "--json") as capture:
        for _ in range(3):
            peer.send(can.Message(arbitration_id=0x123, is_extended_id=False))
    data = json.loads(capture.out.getvalue())["data"]
    assert (data["frame_count"], data["stopped_by"], data["idle_timeout_s"]) == (2, "count", 5.0)


FRAMES_FOR_FILTERS = [(0x7E0, False), (0x7E8, False), (0x123, False), (0x18DAF110, True), (0x000007E0, True)]


@pytest.mark.parametrize("filters,expected", [
    (["7E0:7F0"], [0x7E0, 0x7E8]),                        # 11-bit frames only: the 29-bit 0x7E0 does not pass
    (["7E0:7FF", "18DAF100:1FFFFF00"], [0x7E0, 0x18DAF110]),
    (["000007E0:1FFFFFFF"], [0x7E0]),                     # 8 digits: the 29-bit frame
    (["7E0~7F0"], [0x123, 0x18DAF110, 0x7E0]),            # inverse: every frame the filter would not pass
    (["~7E0:7F0", "7E8:7FF"], [0x7E8, 0x123, 0x18DAF110, 0x7E0]),
])
def test_filters_pass_what_candump_would(peer, virtual_channel, bus_kwargs_seen, filters, expected):
    argv = [a for f in filters for a in ("--filter", f)]
    with CaptureThread(virtual_channel, "--idle-timeout", "0.2", *argv, "--json") as capture:
        for arbitration_id, extended in FRAMES_FOR_FILTERS:
            peer.send(can.Message(arbitration_id=arbitration_id, is_extended_id=extended))
    events = json.loads(capture.out.getvalue())["data"]["events"]
    assert [e["payload"]["arbitration_id"] for e in events] == expected
    opened = [kw for kw in bus_kwargs_seen if kw["channel"] == virtual_channel]
    inverse = any("~" in f for f in filters)
    # normal filters go to python-can (the kernel or the adapter may apply them); inverse ones are canarchy's
    assert ("can_filters" in opened[-1]) is not inverse


def test_filters_in_python_can_form(peer, virtual_channel, bus_kwargs_seen):
    with CaptureThread(virtual_channel, "--idle-timeout", "0.2", "--filter", "7E0:7F0", "--filter",
                       "18DAF100:1FFFFF00", "--json"):
        pass
    assert bus_kwargs_seen[-1]["can_filters"] == [{"can_id": 0x7E0, "can_mask": 0x7F0, "extended": False},
                                                 {"can_id": 0x18DAF100, "can_mask": 0x1FFFFF00, "extended": True}]


@pytest.mark.parametrize("argv,code", [
    (["--filter", "7E0"], "INVALID_FILTER"),
    (["--filter", "7E0:XYZ"], "INVALID_FILTER"),
    (["--filter", "800:7FF"], "INVALID_FILTER"),
    (["--filter", "123:1FFFFFFFF"], "INVALID_FILTER"),
    (["--duration", "-1"], "INVALID_ARGUMENTS"),
    (["--idle-timeout", "soon"], "INVALID_ARGUMENTS"),
    (["--output", "x.pcap"], "CAPTURE_FORMAT_UNSUPPORTED"),
])
def test_capture_refuses_bad_options_before_opening_a_bus(peer, virtual_channel, bus_kwargs_seen, argv, code):
    result = run_cli("capture", virtual_channel, *argv, "--json")
    assert (result.code, result.error_codes) == (1, [code]), result.out
    assert bus_kwargs_seen == []


# -- capture --output: python-can's writers, read back with python-can's readers ------------------

SENT = [can.Message(arbitration_id=0x123, data=b"\x11\x22", is_extended_id=False),
        can.Message(arbitration_id=0x18FEF100, data=bytes.fromhex("F7000004000000FF"), is_extended_id=True),
        can.Message(arbitration_id=0x456, data=bytes(range(12)), is_fd=True, bitrate_switch=True,
                    is_extended_id=False),
        can.Message(arbitration_id=0x7E0, is_remote_frame=True, dlc=4, is_extended_id=False)]


def record(peer, virtual_channel, path, *extra) -> dict:
    with CaptureThread(virtual_channel, "--count", str(len(SENT)), "--output", str(path), *extra, "--json") as cap:
        for message in SENT:
            peer.send(message)
            time.sleep(0.05)
    assert cap.code == 0, cap.out.getvalue()
    return json.loads(cap.out.getvalue())


READERS = {"log": can.CanutilsLogReader, "asc": can.ASCReader, "blf": can.BLFReader, "trc": can.TRCReader,
           "csv": can.CSVReader}


@pytest.mark.parametrize("suffix", sorted(READERS))
def test_output_files_read_back_with_python_can(peer, virtual_channel, tmp_path, suffix):
    path = tmp_path / f"drive.{suffix}"
    envelope = record(peer, virtual_channel, path)
    events = envelope["data"]["events"]
    back = list(READERS[suffix](str(path)))
    kept = [m for m in SENT if not (suffix == "trc" and (m.is_fd or m.is_remote_frame))]
    assert [(m.arbitration_id, m.is_extended_id, bytes(m.data), m.is_remote_frame) for m in back] == [
        (m.arbitration_id, m.is_extended_id, bytes(m.data), m.is_remote_frame) for m in kept]
    if suffix in ("log", "blf", "asc"):
        assert [m.is_fd for m in back] == [m.is_fd for m in kept]
    # timestamps: absolute, or (asc) relative to the first frame, to the format's precision
    stamps = [e["payload"]["timestamp"] for e in events
              if not (suffix == "trc" and (e["payload"]["is_fd"] or e["payload"]["is_remote_frame"]))]
    offset = stamps[0] - back[0].timestamp
    assert [m.timestamp + offset for m in back] == pytest.approx(stamps, abs=1e-4)
    assert envelope["data"]["output"]["frames_written"] == len(kept)
    assert bool(envelope["warnings"]) == (suffix in ("trc", "csv"))
    if suffix in ("log", "blf", "asc"):  # the remote frame's DLC
        assert [m.dlc for m in back if m.is_remote_frame] == [4]


def test_output_is_never_half_written_and_never_clobbered(peer, virtual_channel, tmp_path):
    path = tmp_path / "drive.log"
    path.write_text("precious\n")
    result = run_cli("capture", virtual_channel, "--count", "1", "--output", str(path), "--json")
    assert (result.code, result.error_codes) == (1, ["CAPTURE_OUTPUT_EXISTS"])
    assert path.read_text() == "precious\n"
    seen_during: list[list[str]] = []
    with CaptureThread(virtual_channel, "--count", "2", "--output", str(path), "--overwrite", "--json"):
        peer.send(can.Message(arbitration_id=0x123, is_extended_id=False))
        time.sleep(0.2)
        seen_during.append(sorted(p.name for p in tmp_path.iterdir()))
        peer.send(can.Message(arbitration_id=0x124, is_extended_id=False))
    assert path.read_text() != "precious\n" and [m.arbitration_id for m in can.CanutilsLogReader(str(path))] == [
        0x123, 0x124]
    assert seen_during[0][0].startswith(".drive.log.") and "drive.log" in seen_during[0]  # old file until the end
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drive.log"]


def test_a_capture_recorded_and_replayed_reproduces_frames_and_schedule(monkeypatch, virtual_channel, tmp_path):
    """capture --output, then replay of that file onto a second peer: same frames, none before its slot."""
    from tests.test_replay import assert_on_schedule

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")
    gaps = [0.0, 0.12, 0.05, 0.2, 0.01]
    path = tmp_path / "drive.blf"
    with (
        can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as source,
        CaptureThread(virtual_channel, "--count", str(len(gaps)), "--output", str(path), "--json") as capture,
    ):
        for index, gap in enumerate(gaps):
            time.sleep(gap)
            source.send(can.Message(arbitration_id=0x100 + index, data=bytes([index]) * 8, is_extended_id=False))
    recorded = [e["payload"] for e in json.loads(capture.out.getvalue())["data"]["events"]]
    with can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as target:
        result = run_cli("replay", str(path), virtual_channel, "--jsonl")
        assert result.code == 0, result.out
        received = []
        while (message := target.recv(timeout=0.05)) is not None:
            received.append(message)
    lines = [json.loads(line) for line in result.out.splitlines()]
    assert [(m.arbitration_id, bytes(m.data).hex()) for m in received] == [
        (f["arbitration_id"], f["data"]) for f in recorded]
    slots = [f["timestamp"] - recorded[0]["timestamp"] for f in recorded]
    assert [e["payload"]["offset_s"] for e in lines[:-1]] == pytest.approx(slots, abs=1e-5)
    assert_on_schedule(received, lines[:-1])


# -- capture in its own process: SIGTERM and Ctrl+C close with the envelope -------------------------

def wait_for_sigterm_handler(pid: int, timeout: float = 60) -> None:
    """Until process ``pid`` catches SIGTERM (Linux: ``SigCgt`` of ``/proc/PID/status``)."""
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        time.sleep(3)  # no /proc: give it time
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        caught = next((line.split()[1] for line in status.read_text().splitlines() if line.startswith("SigCgt:")), "0")
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.05)
    raise AssertionError("the capture never installed its SIGTERM handler")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_a_capture_with_its_envelope(virtual_channel, signum):
    from tests.helpers import AS_IN_A_TERMINAL

    env = dict(os.environ, CANARCHY_PYTHON_CAN_INTERFACE="virtual")
    proc = subprocess.Popen([*AS_IN_A_TERMINAL, sys.executable, "-m", "canarchy", "capture", virtual_channel,
                             "--duration", "60", "--jsonl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_for_sigterm_handler(proc.pid)  # installed as the capture starts: then the signal ends the wait
        time.sleep(0.5)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    envelope = json.loads(out.splitlines()[-1])
    assert envelope["ok"] is True and envelope["data"]["stopped_by"] == signum.name
    assert "Traceback" not in err


def test_the_mcp_capture_tool_stays_bounded_on_a_quiet_bus(monkeypatch, virtual_channel):
    """A command-line capture runs until stopped; the MCP tool always ends (count or its idle timeout)."""
    from canarchy import mcp_server, mcp_tools

    monkeypatch.setattr(mcp_tools, "CAPTURE_MAX_TIMEOUT", 0.3)
    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    outcome = mcp_server.run_tool("capture", {"channel": virtual_channel, "count": 5})
    data = outcome.envelope["data"]
    assert (outcome.exit_code, data["frame_count"], data["stopped_by"], data["idle_timeout_s"]) == (
        0, 0, "idle_timeout", 0.3)


@pytest.mark.parametrize("argv", [
    ["uds", "services", "--request-id", "7E0", "--dry-run"],
    ["simulate", "ecu", "--request-id", "7E0", "--dry-run"],
    ["fuzz", "guided", "--id", "7E0", "--dry-run"],
])
def test_ids_of_the_other_commands_are_hex_too(argv):
    result = run_cli(*argv, "--json")
    assert result.code == 0, result.out
    assert result.data.get("request_id", result.data.get("arbitration_id")) == 0x7E0


# -- canarchy's JSON output read back as a recording ------------------------------------------------

@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_captured_json_reads_back_and_replays(peer, virtual_channel, tmp_path, fmt):
    path = tmp_path / f"drive.{fmt}"
    with CaptureThread(virtual_channel, "--count", str(len(SENT)), f"--{fmt}") as capture:
        for message in SENT:
            peer.send(message)
            time.sleep(0.05)
    path.write_text(capture.out.getvalue())
    back = run_cli("capture", "--file", str(path), "--json")
    assert back.code == 0, back.out
    frames = [e["payload"] for e in back.data["events"]]
    original = [e["payload"] for e in capture.jsonl()[:-1]] if fmt == "jsonl" else [
        e["payload"] for e in json.loads(capture.out.getvalue())["data"]["events"]]
    assert frames == original and back.data["format"] == fmt
    assert frames[2]["is_fd"] and frames[2]["bitrate_switch"] and frames[3]["dlc"] == 4
    dry = run_cli("replay", str(path), "--dry-run", "--json")
    assert [e["payload"]["offset_s"] for e in dry.data["events"]] == pytest.approx(
        [f["timestamp"] - frames[0]["timestamp"] for f in frames], abs=1e-6)  # offsets are rounded to 1 us


def test_json_lines_that_are_no_frames_are_warnings_not_errors(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([
        json.dumps({"event_type": "frame", "payload": {"arbitration_id": 0x123, "data": "01", "timestamp": 1.0}}),
        json.dumps({"event_type": "uds_request", "payload": {"index": 1}}),
        "not json",
        json.dumps({"event_type": "frame", "payload": {"arbitration_id": 0x900, "data": "01"}}),  # 11-bit > 0x7FF
        json.dumps({"ok": True, "command": "capture", "data": {}, "errors": [], "warnings": []}),
    ]) + "\n")
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0, result.out
    assert [e["payload"]["arbitration_id"] for e in result.data["events"]] == [0x123]
    warnings = result.envelope["warnings"]
    assert len(warnings) == 2 and ":line 3:" in warnings[0] and ":line 4:" in warnings[1]


def test_capture_file_filters_and_converts_a_recording(tmp_path):
    from pathlib import Path

    source = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "obd2_skoda_7e0_7e8.log"
    target = tmp_path / "answers.blf"
    result = run_cli("capture", "--file", str(source), "--filter", "7E8:7FF", "--count", "20", "--output",
                     str(target), "--json")
    assert result.code == 0, result.out
    originals = [m for m in can.CanutilsLogReader(str(source)) if m.arbitration_id == 0x7E8][:20]
    converted = list(can.BLFReader(str(target)))
    assert [(m.arbitration_id, bytes(m.data)) for m in converted] == [
        (m.arbitration_id, bytes(m.data)) for m in originals]
    assert [m.timestamp for m in converted] == pytest.approx([m.timestamp for m in originals], abs=1e-5)
    assert result.data["output"]["frames_written"] == 20 == result.data["frame_count"]


@pytest.mark.parametrize("option", [["--duration", "3"], ["--idle-timeout", "1"], ["--bus-type", "pcan"],
                                    ["--bitrate", "500000"], ["--data-bitrate", "2000000"], ["--fd"],
                                    ["--bus-option", "serial=1"]])
def test_capture_file_refuses_bus_only_options(tmp_path, option):
    """A recording has no bus: a bus's option with --file is an error naming it, not silently dropped."""
    result = run_cli("capture", "--file", str(tmp_path / "x.log"), *option, "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])
    assert f"capture: {option[0]} applies to a bus, not to --file" in result.envelope["errors"][0]["message"]


def test_no_output_file_when_the_bus_never_opened(monkeypatch, tmp_path):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    result = run_cli("capture", "missing0", "--output", str(tmp_path / "x.log"), "--json")
    assert (result.code, result.error_codes) == (2, ["TRANSPORT_UNAVAILABLE"])
    assert list(tmp_path.iterdir()) == []


def test_no_output_file_when_a_conversion_reads_no_frame(tmp_path):
    source = tmp_path / "garbage.log"
    source.write_text("garbage\nmore garbage\n")
    target = tmp_path / "out.log"
    result = run_cli("capture", "--file", str(source), "--output", str(target), "--json")
    assert (result.code, result.error_codes) == (3, ["CAPTURE_FORMAT_INVALID"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.log"]


def test_no_half_written_output_file_when_the_reader_of_a_conversion_goes_away(tmp_path):
    import io

    from canarchy.cli import main

    class ClosedAfterFirstWrite(io.StringIO):
        def write(self, text):
            if self.getvalue():
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(text)

        def flush(self):
            if self.getvalue():
                raise BrokenPipeError(32, "Broken pipe")

    source = tmp_path / "long.log"
    source.write_text("".join(f"({1700000000 + i / 1000:.6f}) can0 123#{i % 256:02X}\n" for i in range(5000)))
    target = tmp_path / "out.blf"
    code = main(["capture", "--file", str(source), "--output", str(target), "--jsonl"], stdout=ClosedAfterFirstWrite())
    assert code == 141
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.log"]


def test_capture_file_summary_honours_filter_count_and_output(tmp_path):
    from pathlib import Path

    source = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "obd2_skoda_7e0_7e8.log"
    target = tmp_path / "answers.blf"
    result = run_cli("capture", "--file", str(source), "--summary", "--filter", "7E8:7FF", "--count", "20",
                     "--output", str(target), "--json")
    assert result.code == 0, result.out
    assert result.data["frame_count"] == 20
    assert [entry["arbitration_id"] for entry in result.data["ids"]] == [0x7E8]
    originals = [m for m in can.CanutilsLogReader(str(source)) if m.arbitration_id == 0x7E8][:20]
    assert [(m.arbitration_id, bytes(m.data)) for m in can.BLFReader(str(target))] == [
        (m.arbitration_id, bytes(m.data)) for m in originals]
    assert result.data["output"]["frames_written"] == 20


@pytest.mark.parametrize("filters, passed, differs", [
    (["123:7FF"], ["123#11", "123#R"], 1),          # candump's mask without flags also passes 00000123
    (["123:C00007FF"], ["123#11"], 0),              # candump's usage text: only 11-bit, non-remote frames of 0x123
    (["123:400007FF"], ["123#11"], 1),              # no remote frames; the width unchecked by candump
    (["123~7FF"], ["00000123#11", "456#22"], 1),    # candump's inverse would keep 00000123 out
    (["123~C00007FF"], ["123#R", "00000123#11", "456#22"], 0),
])
def test_candump_s_mask_flags_and_where_its_filters_decide_otherwise(tmp_path, filters, passed, differs):
    """The mask may carry candump's CAN_EFF_FLAG and CAN_RTR_FLAG (linux/can.h): the width, and no remote frames.
    Frames a candump filter would decide otherwise (passed, or kept out by an inverse one) are counted."""
    log = tmp_path / "mixed.log"
    log.write_text("".join(f"(1.{i:06d}) can0 {frame}\n" for i, frame in
                           enumerate(["123#11", "123#R", "00000123#11", "456#22"])))
    data = run_cli("capture", "--file", str(log), *[a for f in filters for a in ("--filter", f)], "--json").data
    assert [format_frame(CanFrame.from_payload(e["payload"])) for e in data["events"]] == passed
    assert [r["count"] for r in data["warning_records"] if r["code"] == "CAPTURE_FILTER_WIDTH"] == (
        [differs] if differs else [])


def test_a_filter_that_keeps_out_frames_candump_s_would_pass_says_so():
    """`--filter 400:7FF` is for 11-bit frames (python-can's `extended` key); candump's, whose mask holds no EFF
    flag, also passes the truck's 29-bit frames whose low 11 bits are 0x400. An empty result said nothing."""
    source = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "j1939_truck_idle.log"
    candump_passes = sum(1 for m in can.CanutilsLogReader(str(source)) if m.arbitration_id & 0x7FF == 0x400)
    for summary in ((), ("--summary",)):
        data = run_cli("capture", "--file", str(source), "--filter", "400:7FF", *summary, "--json").data
        [record] = data["warning_records"]
        assert (data["frame_count"], record["code"], record["count"]) == (0, "CAPTURE_FILTER_WIDTH", candump_passes)
    both = run_cli("capture", "--file", str(source), "--filter", "400:7FF", "--filter", "00000400:000007FF",
                   "--json").data
    assert (both["frame_count"], both["warning_records"]) == (candump_passes, []) and candump_passes > 1000


@pytest.mark.parametrize("suffix, merged, frames", [
    ("log", [], 0), ("asc", ["can0", "vcan0", "any"], 2), ("blf", ["can0", "vcan0", "any"], 2),
    ("trc", ["can0", "vcan0", "any"], 2), ("csv", ["can0", "vcan0", "can1", "any"], 4)])
def test_a_conversion_that_merges_channels_says_which(tmp_path, suffix, merged, frames):
    """.asc/.blf/.trc number channels by the digits of their names, .csv has none: frames of two channels
    that the file writes as one can no longer be told apart, and the envelope says so."""
    source = tmp_path / "multi.log"
    source.write_text("(1.0) can0 123#11\n(2.0) vcan0 124#22\n(3.0) can1 125#33\n(4.0) any 126#44\n"
                      "(5.0) can1 127#55\n", encoding="ascii")
    result = run_cli("capture", "--file", str(source), "--output", str(tmp_path / f"out.{suffix}"), "--json")
    assert result.code == 0, result.out
    notes = [w for w in result.envelope["warnings"] if "channels" in w]
    if not merged:
        assert notes == []
        return
    assert len(notes) == 1 and f"{frames} frame(s)" in notes[0], notes
    assert ", ".join(merged) in notes[0]


@pytest.mark.parametrize("suffix", ["blf", "asc", "trc"])
def test_a_frame_the_format_cannot_hold_is_a_write_error_that_names_it_and_leaves_no_file(tmp_path, suffix):
    from canarchy.capture_writer import CaptureWriter
    from canarchy.errors import TransportError
    from canarchy.frames import CanFrame

    writer = CaptureWriter(tmp_path / f"y11k.{suffix}")
    with pytest.raises(TransportError) as info:
        writer.write(CanFrame(0x123, b"\x01", timestamp=3e11))  # the year 11476: the .blf header fails at close
        writer.close()
    assert info.value.code == "CAPTURE_WRITE_FAILED"
    assert "year 11476 is out of range" in info.value.message
    assert "year 9999" in info.value.hint and "disk" not in info.value.hint
    assert list(tmp_path.iterdir()) == []


def test_a_conversion_whose_writer_fails_is_capture_write_failed_without_a_file(tmp_path, monkeypatch):
    # a reader that let such a timestamp through: the writer's failure is still an error, not a traceback
    from canarchy import candump, capture_file

    monkeypatch.setattr(candump, "checked_timestamp", lambda stamp: stamp, raising=False)
    monkeypatch.setattr(capture_file, "TIMESTAMP_LIMIT", float("inf"), raising=False)
    source = tmp_path / "y11k.log"
    source.write_text("(300000000000.000000) can0 123#01\n(300000000001.000000) can0 123#02\n")
    result = run_cli("capture", "--file", str(source), "--output", str(tmp_path / "y11k.blf"), "--json")
    assert (result.code, result.error_codes) == (2, ["CAPTURE_WRITE_FAILED"])
    assert "year 9999" in result.envelope["errors"][0]["hint"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["y11k.log"]


def test_send_dry_run_names_its_channel_or_says_there_is_none():
    text = run_cli("send", "123#DEADBEEF", "--dry-run", "--text").out
    assert text.splitlines()[0] == "dry run: would send (no channel given or configured)"
    assert "None" not in text
    text = run_cli("send", "can0", "123#DEADBEEF", "--dry-run", "--text").out
    assert text.splitlines()[0] == "dry run: would send on can0"


@pytest.mark.parametrize("argv", [["123#DEADBEEF"], ["123", "DEADBEEF"], ["123##1DEADBEEF"]])
def test_a_frame_we_send_or_plan_to_send_is_not_received(monkeypatch, argv):
    assert run_cli("send", *argv, "--dry-run", "--json").data["frame"]["is_rx"] is False
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    sent = run_cli("send", "scaffold1", *argv, "--json")
    assert sent.code == 0, sent.out
    assert sent.data["frame"]["is_rx"] is False
    assert [e["payload"]["is_rx"] for e in sent.data["events"]] == [False]


def test_a_bus_that_does_not_open_says_the_system_s_reason_and_what_to_check_for_its_type():
    """python-can's udp_multicast says only "could not create or configure socket" when the group cannot be
    joined (no interface up but loopback: ENODEV), and the hint named `ip link show can0` for every bus type."""
    import errno

    from canarchy.transport import bus_unavailable

    try:
        try:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        except OSError as cause:  # as python-can raises it (udp_multicast/bus.py)
            raise can.CanInitializationError("could not create or configure socket") from cause
    except can.CanInitializationError as exc:
        multicast = bus_unavailable("ff01::6361:6e61", "udp_multicast", exc)
    assert multicast.message.endswith("could not create or configure socket (No such device)"), multicast.message
    assert "besides loopback" in multicast.hint and "can0" not in multicast.hint, multicast.hint
    socketcan = bus_unavailable("vcan7", "socketcan", OSError(errno.ENODEV, "No such device"))
    assert "`ip link show vcan7`" in socketcan.hint and socketcan.message.count("No such device") == 1
