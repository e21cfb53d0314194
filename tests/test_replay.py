"""``replay`` and its scheduler: a recording played onto a real peer (python-can ``virtual`` bus).

Timing is asserted as a schedule, never as a wall-clock bound: every frame
reaches the peer no earlier than its slot (relative to the first frame, which
is due at once), in the recording's order.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import json
from pathlib import Path

import can
import pytest

from canarchy import replay, transport
from canarchy.frames import CanFrame
from tests.helpers import run_cli

#: The scheduler waits on the monotonic clock; its slots and the peer's receive stamps are on
#: the wall clock, read a moment apart: a frame may appear this much before its slot.
CLOCK_TOLERANCE_S = 0.001

RECORDING = """\
(1700000000.000000) can0 123#11
(1700000000.050000) can0 18FEF100#F7000004000000FF
(1700000000.100000) can0 7E0#0210010000000000
(1700000000.100000) can0 123#R4
(1700000000.300000) can0 456##1000102030405060708090A0B
"""
OFFSETS = [0.0, 0.05, 0.10, 0.10, 0.30]
FRAMES = [(0x123, False, "11"), (0x18FEF100, True, "f7000004000000ff"), (0x7E0, False, "0210010000000000"),
          (0x123, False, ""), (0x456, False, "000102030405060708090a0b")]


@pytest.fixture
def recording(tmp_path) -> Path:
    path = tmp_path / "drive.log"
    path.write_text(RECORDING, encoding="utf-8")
    return path


def drain(bus: can.BusABC) -> list[can.Message]:
    messages = []
    while (message := bus.recv(timeout=0.05)) is not None:
        messages.append(message)
    return messages


def assert_on_schedule(received: list[can.Message], events: list[dict]) -> None:
    """Each frame reached the peer no earlier than its slot (``due_at``: the replay's start on the
    wall clock plus the frame's offset), in order."""
    assert len(received) == len(events)
    for message, event in zip(received, events, strict=True):
        assert message.timestamp >= event["payload"]["due_at"] - CLOCK_TOLERANCE_S, (message, event["payload"])
    stamps = [m.timestamp for m in received]
    assert stamps == sorted(stamps)


def jsonl_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_replay_puts_the_recording_on_the_bus_on_its_schedule(peer, virtual_channel, recording):
    result = run_cli("replay", str(recording), virtual_channel, "--jsonl")
    assert result.code == 0, result.out
    lines = jsonl_lines(result.out)
    events, envelope = lines[:-1], lines[-1]
    received = drain(peer)
    assert [(m.arbitration_id, m.is_extended_id, bytes(m.data).hex()) for m in received] == FRAMES
    assert received[3].is_remote_frame and received[3].dlc == 4
    assert received[4].is_fd and received[4].bitrate_switch
    assert_on_schedule(received, events)
    assert [e["payload"]["offset_s"] for e in events] == OFFSETS
    data = envelope["data"]
    assert (data["mode"], data["frames_sent"], data["stopped_by"]) == ("active", 5, "end")


def test_speed_loop_and_filters(peer, virtual_channel, recording):
    result = run_cli("replay", str(recording), virtual_channel, "--speed", "4", "--loop", "2",
                     "--filter", "123:7FF", "--filter", "18FEF100:1FFFFFFF", "--jsonl")
    assert result.code == 0, result.out
    events = jsonl_lines(result.out)[:-1]
    received = drain(peer)
    one_pass = [FRAMES[0], FRAMES[1], FRAMES[3]]
    assert [(m.arbitration_id, m.is_extended_id, bytes(m.data).hex()) for m in received] == one_pass * 2
    # second pass starts where the first ended (0.10 s of recording), all at speed 4
    expected = [o / 4 for o in (0.0, 0.05, 0.10, 0.10, 0.15, 0.20)]
    assert [e["payload"]["offset_s"] for e in events] == pytest.approx(expected)
    assert_on_schedule(received, events)
    assert jsonl_lines(result.out)[-1]["data"]["filtered"] == 4


def test_inverse_filter_and_skip(peer, virtual_channel, recording):
    result = run_cli("replay", str(recording), virtual_channel, "--filter", "123~7FF", "--skip", "0.01", "--json")
    assert result.code == 0, result.out
    received = drain(peer)
    assert [m.arbitration_id for m in received] == [0x18FEF100, 0x7E0, 0x456]
    assert [e["payload"]["offset_s"] for e in result.data["events"]] == pytest.approx([0.0, 0.01, 0.02])


def test_dry_run_prints_the_schedule_and_opens_nothing(monkeypatch, recording):
    monkeypatch.setattr(transport, "build_backend", lambda *a: pytest.fail("a transport was built"))
    result = run_cli("replay", str(recording), "--dry-run", "--speed", "2", "--json")
    assert result.code == 0, result.out
    data = result.data
    assert (data["mode"], data["interface"], data["planned_frames"]) == ("dry_run", None, 5)
    assert [e["payload"]["offset_s"] for e in data["events"]] == [o / 2 for o in OFFSETS]
    assert [e["event_type"] for e in data["events"]] == ["frame_planned"] * 5
    text = run_cli("replay", str(recording), "--dry-run", "--text").out
    assert "0.300000  456##1000102030405060708090A0B" in text and "123#R4" in text


def test_the_gate_runs_before_the_bus_opens(peer, virtual_channel, recording, monkeypatch, capsys):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "true")
    result = run_cli("replay", str(recording), virtual_channel, "--json")
    assert (result.code, result.error_codes) == (1, ["ACTIVE_ACK_REQUIRED"])
    assert "ACTIVE TRANSMIT: `replay`" in capsys.readouterr().err
    assert drain(peer) == []
    assert run_cli("replay", str(recording), virtual_channel, "--ack-active", "--json").code == 0
    assert len(drain(peer)) == 5


@pytest.mark.parametrize("argv,code", [
    (["--speed", "0"], "INVALID_ARGUMENTS"),
    (["--speed", "fast"], "INVALID_ARGUMENTS"),
    (["--loop", "-1"], "INVALID_ARGUMENTS"),
    (["--skip", "-2"], "INVALID_ARGUMENTS"),
    (["--filter", "123"], "INVALID_FILTER"),
])
def test_bad_options(recording, argv, code):
    result = run_cli("replay", str(recording), "--dry-run", *argv, "--json")
    assert (result.code, result.error_codes) == (1, [code]), result.out


def test_a_missing_recording_is_a_source_error(tmp_path):
    result = run_cli("replay", str(tmp_path / "nope.log"), "--dry-run", "--json")
    assert (result.code, result.error_codes) == (2, ["CAPTURE_SOURCE_UNAVAILABLE"])


# -- the scheduler on its own clock -----------------------------------------------------------

def frames_at(*stamps: float) -> list[CanFrame]:
    return [CanFrame(0x100 + i, b"", timestamp=t) for i, t in enumerate(stamps)]


def test_schedule_offsets_loops_skip_and_disorder():
    frames = frames_at(10.0, 10.5, 10.4, 12.5)  # 10.4 is out of order: a gap of 0
    slots = list(replay.schedule(lambda: frames, speed=2, loops=2, skip=1.0))
    assert [s.offset_s for s in slots] == [0.0, 0.25, 0.25, 0.75, 0.75, 1.0, 1.0, 1.5]
    assert [s.loop for s in slots] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [s.index for s in slots] == list(range(8))
    assert list(replay.schedule(list, loops=None)) == []  # an empty recording ends an endless replay


def test_play_never_sends_before_a_slot_and_keeps_order():
    now = [100.0]
    sent: list[tuple[float, int]] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds * 0.5  # a sleep that wakes early: play must wait again

    def send(frame: CanFrame) -> None:
        sent.append((now[0], frame.arbitration_id))
        now[0] += 0.3 if frame.arbitration_id == 0x101 else 0.0  # a slow send makes the next frames late

    slots = list(replay.schedule(lambda: frames_at(0.0, 0.1, 0.2, 1.0)))
    done = list(replay.play(slots, send, clock=lambda: now[0], sleep=sleep))
    assert [i for _t, i in sent] == [0x100, 0x101, 0x102, 0x103]
    for (at, _id), slot in zip(sent, slots, strict=True):
        assert at >= 100.0 + slot.offset_s
    assert done[2].late_s == pytest.approx(0.2) and done[3].late_s == 0.0  # late frames do not move the schedule


def test_timestamps_that_step_back_do_not_delay_the_rest_of_the_recording():
    """Frames of a merged log out of order by a millisecond (pairs swapped): each keeps its slot
    t_i - t_0 (an earlier-stamped one goes out with the previous frame), as canplayer and python-can's
    MessageSync schedule them; the steps back do not add up into a replay slower than the recording."""
    stamps = []
    for pair in range(500):
        stamps += [100.0 + 0.002 * pair + 0.002, 100.0 + 0.002 * pair + 0.001]
    frames = [CanFrame(0x123, b"\x01", timestamp=t) for t in stamps]
    offsets = [slot.offset_s for slot in replay.schedule(lambda: frames)]
    expected, latest = [], stamps[0]
    for t in stamps:
        latest = max(latest, t)
        expected.append(latest - stamps[0])
    assert offsets == pytest.approx(expected, abs=1e-9)
    assert offsets[-1] == pytest.approx(max(stamps) - stamps[0], abs=1e-9)


def test_replayed_frames_are_sent_not_received(monkeypatch, recording):
    planned = run_cli("replay", str(recording), "--dry-run", "--json").data["events"]
    assert planned and {e["payload"]["is_rx"] for e in planned} == {False}
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    result = run_cli("replay", str(recording), "scaffold1", "--speed", "100", "--json")
    assert result.code == 0, result.out
    assert result.data["events"] and {e["payload"]["is_rx"] for e in result.data["events"]} == {False}


def test_a_replay_stopped_by_sigterm_says_so(peer, virtual_channel, recording, monkeypatch):
    """A SIGTERM (a cancelled job, ``timeout``) ends the replay as Ctrl+C does, exit 0, and it is named as the
    signal it was (as capture names it), not taken for Ctrl+C."""
    import os
    import signal
    import time

    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) % 2 == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler the command set turns it into a clean stop
        time.sleep(seconds)

    real = replay.play
    monkeypatch.setattr(replay, "play", lambda slots, send, **kw: real(slots, send, sleep=sleep))
    result = run_cli("replay", str(recording), virtual_channel, "--json")
    assert result.code == 0, result.out
    assert (result.data["stopped_by"], result.data["frames_sent"]) == ("SIGTERM", len(drain(peer))) != ("SIGTERM", 5)
    text = run_cli("replay", str(recording), virtual_channel, "--text")
    assert (text.code, text.out.count("(stopped by SIGTERM)")) == (0, 1), text.out
