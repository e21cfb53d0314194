"""``capture``, ``send`` and ``replay`` against real peers on python-can ``virtual`` buses:
bus flags, frame syntax, filters, recording and replay."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import can
import pytest

from tests.helpers import run_cli, write_user_config


@pytest.fixture
def peer(monkeypatch, virtual_channel):
    """A bus on the test's virtual channel; canarchy uses the virtual bus type and needs no typed YES."""
    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")
    with can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as bus:
        yield bus


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
