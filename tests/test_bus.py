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
