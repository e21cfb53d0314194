"""The CLI surface: envelope, output modes, exit codes, argument errors, capture and send."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import io
import json
import subprocess
import sys

import pytest

from canarchy import output, transport
from tests.helpers import receivers, run_cli, write_user_config


@pytest.fixture
def scaffold(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")


def test_envelope_keys_are_exact_and_sorted():
    result = run_cli("uds", "services", "--json")
    assert list(result.envelope) == ["command", "data", "errors", "ok", "warnings"]
    assert result.envelope["command"] == "uds services" and result.envelope["ok"] is True


@pytest.mark.parametrize("fmt", ["--json", "--jsonl", "--text"])
def test_argument_errors_honour_the_format(fmt):
    result = run_cli("send", fmt)
    assert result.code == 1
    if fmt == "--text":
        assert result.out == "" and result.err.startswith("error: INVALID_ARGUMENTS")  # on stderr, as candump
    else:
        envelope = json.loads(result.out)
        assert envelope["ok"] is False and envelope["errors"][0]["code"] == "INVALID_ARGUMENTS"
        assert envelope["errors"][0]["hint"]


def test_unknown_command_is_a_user_error():
    result = run_cli("frobnicate", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])


def test_every_error_has_a_hint():
    for argv in (["send", "0x123", "zz", "--json"], ["capture", "--json"], ["send", "0xFFFFFFFFF", "--json"]):
        result = run_cli(*argv)
        assert result.code == 1
        assert all(e["hint"] for e in result.envelope["errors"])


def test_python_m_canarchy_runs():
    proc = subprocess.run([sys.executable, "-m", "canarchy", "uds", "services", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["data"]["service_count"] == 27
    assert proc.stderr == ""


def test_offline_commands_do_not_import_python_can():
    code = ("import sys, io; from canarchy.cli import main; "
            "main(['uds','services','--json'], stdout=io.StringIO()); "
            "main(['config','show','--json'], stdout=io.StringIO()); "
            "print('can' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


# -- interface fallback (prepare_args) ---------------------------------------------------

def test_interface_required_names_the_setting():
    result = run_cli("capture", "--json")
    assert (result.code, result.error_codes) == (1, ["INTERFACE_REQUIRED"])
    assert "[transport].default_interface" in result.envelope["errors"][0]["hint"]


def test_configured_default_interface_is_used_for_capture(scaffold):
    write_user_config('[transport]\ndefault_interface = "scaffold3"\n')
    result = run_cli("capture", "--json")
    assert result.code == 0
    assert (result.data["interface"], result.data["interface_source"]) == ("scaffold3", "config")


def test_command_line_channel_wins(scaffold):
    write_user_config('[transport]\ndefault_interface = "scaffold3"\n')
    result = run_cli("capture", "scaffold9", "--json")
    assert (result.data["interface"], result.data["interface_source"]) == ("scaffold9", "cli")


# -- capture ------------------------------------------------------------------------------

def test_capture_scaffold_json_and_jsonl(scaffold):
    result = run_cli("capture", "scaffold0", "--count", "3", "--json")
    assert result.code == 0
    events = result.data["events"]
    assert result.data["frame_count"] == 3 and len(events) == 3
    assert events[0]["event_type"] == "frame"
    assert set(events[0]) == {"event_type", "payload", "source", "timestamp"}
    assert events[0]["payload"]["arbitration_id"] == 0x0CF00400
    jsonl = run_cli("capture", "scaffold0", "--jsonl")  # the scaffold's three frames, then the end of its source
    lines = [json.loads(line) for line in jsonl.out.splitlines()]
    assert [line["event_type"] for line in lines[:3]] == ["frame", "frame", "frame"]
    assert lines[3]["ok"] is True and lines[3]["data"]["frame_count"] == 3 and "events" not in lines[3]["data"]
    assert len(lines) == 4


def test_capture_text(scaffold):
    result = run_cli("capture", "scaffold0", "--text")
    assert "(1635188455.029900)  scaffold0  0CF00400   [8]  60 7D 84 48 14 00 F0 84" in result.out


def test_capture_transport_error_exit_2(scaffold):
    result = run_cli("capture", "missing0", "--json")
    assert (result.code, result.error_codes) == (2, ["TRANSPORT_UNAVAILABLE"])


def test_capture_bad_count(scaffold):
    result = run_cli("capture", "scaffold0", "--count", "-1", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_COUNT"])
    assert result.envelope["errors"][0]["message"] == "--count '-1' is outside 0..1000000000."  # no hex for a count
    hexed = run_cli("capture", "scaffold0", "--count", "0x3B9ACA01", "--json").envelope["errors"][0]["message"]
    assert hexed.endswith("is outside 0..1000000000 (0x0..0x3B9ACA00).")  # written in hex: in hex too


def test_capture_on_a_virtual_bus_sees_a_real_frame(monkeypatch, virtual_channel):
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    monkeypatch.setenv("CANARCHY_CAPTURE_TIMEOUT", "5")  # an upper bound: the frame ends the capture (limit 1)
    frames = []
    backend = transport.build_backend()
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        stream = backend.capture(virtual_channel, limit=1)
        # The capture bus opens on first next(); send from a thread once it exists.
        import threading

        def later():
            import time

            deadline = time.monotonic() + 30
            while receivers(virtual_channel) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            peer.send(can.Message(arbitration_id=0x18FEF100, data=bytes.fromhex("F7000004000000FF")))

        sender = threading.Thread(target=later)
        sender.start()
        frames = list(stream)
        sender.join()
    assert [(f.arbitration_id, f.is_extended_id, f.data.hex()) for f in frames] == [
        (0x18FEF100, True, "f7000004000000ff")]


# -- send -----------------------------------------------------------------------------------

def test_send_reaches_a_peer_on_a_virtual_bus(monkeypatch, virtual_channel, capsys):
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        result = run_cli("send", virtual_channel, "0x7E0", "0210010000000000", "--json")
        received = peer.recv(timeout=1)
    assert result.code == 0, result.out
    assert result.data["mode"] == "active" and result.data["frame"]["data"] == "0210010000000000"
    assert (received.arbitration_id, bytes(received.data)) == (0x7E0, bytes.fromhex("0210010000000000"))
    assert "ACTIVE TRANSMIT" in capsys.readouterr().err


def test_send_without_channel_uses_the_id_and_data(scaffold):
    write_user_config('[transport]\ndefault_interface = "scaffold1"\n')
    result = run_cli("send", "0x123", "0210", "--json")
    assert result.code == 0, result.out
    assert result.data["interface"] == "scaffold1"
    assert result.data["frame"]["arbitration_id"] == 0x123 and result.data["frame"]["data"] == "0210"


def test_send_extended_id_and_fd(scaffold):
    result = run_cli("send", "scaffold0", "0x18FEF100", "01" * 12, "--fd", "--json")
    assert result.code == 0, result.out
    assert result.data["frame"]["is_extended_id"] is True and result.data["frame"]["is_fd"] is True


@pytest.mark.parametrize("argv,code", [
    (["send", "scaffold0", "0x123", "0g"], "INVALID_FRAME_DATA"),
    (["send", "scaffold0", "0x123", "012"], "INVALID_FRAME_DATA"),
    (["send", "scaffold0", "0x123", "00" * 9], "INVALID_FRAME"),
    (["send", "scaffold0", "0x123", "00" * 9, "--fd"], "INVALID_FRAME"),
    (["send", "scaffold0", "0x20000000", "00"], "INVALID_FRAME"),
    (["send", "scaffold0", "banana", "00"], "INVALID_FRAME"),
])
def test_send_bad_input(scaffold, argv, code):
    result = run_cli(*argv, "--json")
    assert (result.code, result.error_codes) == (1, [code])


def test_send_dry_run_needs_no_channel_and_sends_nothing(monkeypatch):
    built = []
    monkeypatch.setattr(transport, "build_backend", lambda *a: built.append(a))
    result = run_cli("send", "0x123", "01", "--dry-run", "--json")
    assert result.code == 0 and result.data["mode"] == "dry_run"
    assert built == []


def test_send_ack_required(scaffold, monkeypatch):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "true")
    result = run_cli("send", "scaffold0", "0x123", "01", "--json")
    assert (result.code, result.error_codes) == (1, ["ACTIVE_ACK_REQUIRED"])


def test_send_ack_with_yes_and_noninteractive(scaffold, monkeypatch):
    import io

    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "true")
    monkeypatch.setattr(sys, "stdin", io.StringIO("YES\n"))
    assert run_cli("send", "scaffold0", "0x123", "01", "--ack-active", "--json").code == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")
    assert run_cli("send", "scaffold0", "0x123", "01", "--ack-active", "--json").code == 0


def test_text_output_shows_warnings_on_stderr():
    out, err = io.StringIO(), io.StringIO()
    output.Printer("text", out, "x", err=err).finish(output.CommandResult(data={"a": 1}, warnings=["careful"]), None)
    assert (out.getvalue(), err.getvalue()) == ("a: 1\n", "warning: careful\n")


def test_receive_failure_is_a_transport_error(monkeypatch):
    class BrokenBus:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def send(self, message):
            pass

        def recv(self, timeout=None):
            raise OSError("Network is down")

    backend = transport.PythonCanBackend(bus_type="virtual")
    monkeypatch.setattr(backend, "_open_bus", lambda channel: BrokenBus())
    with pytest.raises(transport.TransportError) as caught, backend.session("x") as session:
        session.recv(0.1)
    assert caught.value.code == "TRANSPORT_RECEIVE_FAILED"
    with pytest.raises(transport.TransportError):
        list(backend.capture("x", limit=1))


def test_caller_acknowledged_is_scoped_to_its_block(scaffold, monkeypatch):
    import io
    import threading

    from canarchy.active import caller_acknowledged

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with caller_acknowledged():
        assert run_cli("send", "scaffold0", "0x123", "01", "--ack-active", "--json").code == 0
        other = []
        thread = threading.Thread(target=lambda: other.append(
            run_cli("send", "scaffold0", "0x123", "01", "--ack-active", "--json").error_codes))
        thread.start()
        thread.join()
        assert other == [["ACTIVE_CONFIRMATION_DECLINED"]]  # another thread's context is not acknowledged
    result = run_cli("send", "scaffold0", "0x123", "01", "--ack-active", "--json")
    assert result.error_codes == ["ACTIVE_CONFIRMATION_DECLINED"]


def test_version_loads_no_command_module():
    """``canarchy --version`` answers before any command module is imported (the README's test checks its text)."""
    probe = ("import sys\nfrom canarchy.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('canarchy.commands.')))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout + proc.stderr


@pytest.mark.parametrize("argv, command", [(["uds", "scan", "--bad"], "uds scan"),
                                           (["capture", "--count"], "capture"),
                                           (["isotp", "decode", "--file", "x.log", "--nope"], "isotp decode")])
def test_an_argument_error_names_the_command_it_was_given_to(argv, command):
    """An option the command does not know is its error (the envelope's ``command``, the message, the hint's
    ``--help``), as argparse says it of subcommands; argparse said `canarchy: unrecognized arguments`."""
    result = run_cli(*argv, "--json")
    [error] = result.envelope["errors"]
    assert (result.code, result.envelope["command"], error["code"]) == (1, command, "INVALID_ARGUMENTS")
    assert error["message"].startswith(f"canarchy {command}: ") and f"`canarchy {command} --help`" in error["hint"]
