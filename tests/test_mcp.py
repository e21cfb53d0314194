"""``canarchy mcp serve``: the tool registry, the reference-only check, the active
``send`` tool's safety, the #530 regressions through MCP, and the server's process hygiene.

Clients are the SDK's own: ``mcp.Client`` in process (``mode="legacy"``: the
real stream loop over memory streams) and ``stdio_client`` + ``ClientSession``
against ``python -m canarchy mcp serve`` in a child process. pytest-asyncio is
not a dependency: coroutines run under ``anyio.run`` inside plain tests.

The #530 regressions (``test_mcp_ref_*``) configure the default interface
through their own fixtures (a config file in the test's home, the variable),
never the operator's (REQ-TISO-08); ``fixtures/mutations/issue-530.toml``
lists them as killers of the guard's removal.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import io
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from canarchy import cli, mcp_server, uds
from canarchy.errors import UserInputError
from tests.helpers import run_cli, write_user_config

CATALOG_SIDS = [f"0x{s.sid:02X}" for s in uds.SERVICES]
VCAN7_CONFIG = '[transport]\ndefault_interface = "vcan7"\n'
NONINTERACTIVE = "CANARCHY_MCP_NONINTERACTIVE_ACK"


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
def cli_calls(monkeypatch):
    """Record every argv the server hands to ``canarchy.cli.main`` (and still run it)."""
    calls = []
    real_main = cli.main

    def spy(argv=None, stdout=None):
        calls.append(list(argv))
        return real_main(argv, stdout=stdout)

    monkeypatch.setattr(cli, "main", spy)
    return calls


def in_process(*calls):
    """Run ``(tool, arguments)`` calls through an in-process server and the SDK's client.

    Returns ``(tools, results)``: the listed ``Tool`` models and one
    ``CallToolResult`` per call.
    """
    from mcp import Client

    async def session():
        async with Client(mcp_server.build_server(), mode="legacy") as client:
            listed = await client.list_tools()
            return listed.tools, [await client.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(session)


def assert_reference_envelope(envelope):
    """The catalog answer: reference mode, every SID, nothing active."""
    assert envelope["ok"] is True, envelope["errors"]
    assert envelope["command"] == "uds services"
    data = envelope["data"]
    assert data["mode"] == "reference"
    assert [s["service"] for s in data["services"]] == CATALOG_SIDS
    assert data["service_count"] == 27
    assert "probe_count" not in data and "interface" not in data


def error_codes(envelope):
    return [e["code"] for e in envelope["errors"]]


def assert_reference_schemas(tools):
    """Every tool is listed; reference-only ones accept no channel, interface, ack or dry run."""
    by_name = {tool.name: tool for tool in tools}
    assert list(by_name) == list(mcp_server.TOOLS)
    assert set(by_name) - mcp_server.REFERENCE_ONLY_TOOLS == {"capture", "send"}
    for name in mcp_server.REFERENCE_ONLY_TOOLS:
        schema = by_name[name].input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False, name
        for prop in schema.get("properties", {}):
            assert prop not in mcp_server.FORBIDDEN_REFERENCE_PROPERTIES, (name, prop)
            assert not any(word in prop for word in ("channel", "interface", "ack", "dry")), (name, prop)
        assert by_name[name].annotations.read_only_hint is True
    send = by_name["send"].input_schema["properties"]
    assert send["ack_active"]["default"] is False and send["dry_run"]["default"] is True
    assert by_name["send"].annotations.destructive_hint is True


# -- the registry and the reference-only check ------------------------------------------------


def test_registry_kinds():
    kinds = {name: spec.kind for name, spec in mcp_server.TOOLS.items()}
    assert kinds.pop("capture") == "bus" and kinds.pop("send") == "active"
    assert set(kinds.values()) == {"reference"}
    assert mcp_server.REFERENCE_ONLY_TOOLS == set(kinds) == {
        "config_show", "uds_services", "j1939_pgn", "j1939_spn", "j1587_pid", "j2497_mid",
        "dbc_cache_list", "skills_cache_list", "session_show"}


def test_schemas_listed_by_a_real_client():
    tools, _ = in_process()
    assert_reference_schemas(tools)
    capture = {tool.name: tool for tool in tools}["capture"].input_schema
    assert set(capture["required"]) == {"channel", "count"}
    assert (capture["properties"]["count"]["minimum"], capture["properties"]["count"]["maximum"]) == (1, 1000)


@pytest.mark.parametrize("name,arguments", [
    ("config_show", {}), ("uds_services", {}), ("j1939_pgn", {"pgn": 61444}), ("j1939_pgn", {"pgn": "0xF004"}),
    ("j1939_spn", {"spn": 190}), ("j1587_pid", {"pid": 84}), ("j2497_mid", {"mid": 137}),
    ("dbc_cache_list", {}), ("skills_cache_list", {}), ("session_show", {}),
])
def test_reference_builds_pass_the_check(name, arguments):
    spec = mcp_server.TOOLS[name]
    argv = mcp_server.build_argv(name, mcp_server.validate_arguments(spec, arguments))
    assert argv[:len(spec.command)] == list(spec.command) and argv[-1] == "--json"
    mcp_server.check_reference_argv(spec, argv)  # does not raise


@pytest.mark.parametrize("name,argv", [
    ("uds_services", ["uds", "services", "vcan7", "--json"]),
    ("uds_services", ["uds", "services", "--ack-active", "--json"]),
    ("uds_services", ["uds", "services", "--dry-run", "--json"]),
    ("uds_services", ["uds", "services", "--dry", "--json"]),
    ("uds_services", ["uds", "services", "--ack", "--json"]),
    ("uds_services", ["uds", "services", "--probe-start", "0x10", "--json"]),
    ("uds_services", ["send", "vcan7", "0x7E0", "0210", "--json"]),
    ("j1939_pgn", ["j1939", "pgn", "61444", "send", "--json"]),
    ("j1939_pgn", ["j1939", "pgn", "61444", "vcan7", "--json"]),
    ("config_show", ["fuzz", "guided", "vcan7", "--id", "0x7E0", "--json"]),
    ("session_show", ["session", "save", "x", "--json"]),
])
def test_tampered_argv_is_a_violation(name, argv):
    with pytest.raises(UserInputError) as caught:
        mcp_server.check_reference_argv(mcp_server.TOOLS[name], argv)
    assert caught.value.code == "REFERENCE_ONLY_TOOL_VIOLATION"
    assert "Nothing was run" in caught.value.message and caught.value.hint


def test_tampered_builder_fails_closed(monkeypatch, rigged_transport, cli_calls, capsys):
    write_user_config(VCAN7_CONFIG)
    monkeypatch.setattr(mcp_server, "build_argv", lambda name, arguments: ["uds", "services", "vcan7", "--json"])
    outcome = mcp_server.run_tool("uds_services", {})
    assert outcome.exit_code == 1
    assert error_codes(outcome.envelope) == ["REFERENCE_ONLY_TOOL_VIOLATION"]
    assert outcome.envelope["command"] == "uds services"
    _, [result] = in_process(("uds_services", {}))
    assert result.is_error is True
    assert error_codes(result.structured_content) == ["REFERENCE_ONLY_TOOL_VIOLATION"]
    assert cli_calls == [] and rigged_transport == []
    assert capsys.readouterr().err == ""


def test_tampered_send_builder_fails_closed(monkeypatch, rigged_transport, cli_calls):
    # A builder that drops --dry-run (or adds --ack-active) for an unacknowledged call.
    monkeypatch.setattr(mcp_server, "build_argv", lambda name, arguments: ["send", "vcan0", "0x1", "01", "--json"])
    outcome = mcp_server.run_tool("send", {"channel": "vcan0", "arbitration_id": 1})
    assert (outcome.exit_code, error_codes(outcome.envelope)) == (1, ["ACTIVE_TRANSMIT_REQUIRES_ACK"])
    monkeypatch.setattr(mcp_server, "build_argv",
                        lambda name, arguments: ["send", "vcan0", "0x1", "01", "--dry-run", "--ack-active", "--json"])
    outcome = mcp_server.run_tool("send", {"channel": "vcan0", "arbitration_id": 1})
    assert error_codes(outcome.envelope) == ["ACTIVE_TRANSMIT_REQUIRES_ACK"]
    assert cli_calls == [] and rigged_transport == []


# -- the #530 regressions through MCP -------------------------------------------------------------


def test_mcp_ref_in_process_stays_reference(monkeypatch, rigged_transport, capsys):
    """REF-06 (MCP, in process): a configured default interface never makes `uds_services` active."""
    config = write_user_config(VCAN7_CONFIG)
    shown = mcp_server.run_tool("config_show", {}).envelope["data"]["settings"]["CANARCHY_DEFAULT_INTERFACE"]
    assert (shown["value"], shown["source"]) == ("vcan7", "file")  # the fixture is in effect
    # (a) the tool function
    outcome = mcp_server.run_tool("uds_services", {})
    assert outcome.exit_code == 0
    assert_reference_envelope(outcome.envelope)
    # (b) the server's tools/call handler, through the SDK's client
    _, [result] = in_process(("uds_services", {}))
    assert result.is_error is False
    assert_reference_envelope(result.structured_content)
    assert json.loads(result.content[0].text) == result.structured_content
    # the variable instead of the file
    config.unlink()
    monkeypatch.setenv("CANARCHY_DEFAULT_INTERFACE", "vcan7")
    assert_reference_envelope(mcp_server.run_tool("uds_services", {}).envelope)
    assert rigged_transport == []
    assert capsys.readouterr().err == ""


def test_mcp_ref_stdio_stays_reference(tmp_path):
    """REF-06 (MCP, stdio): `python -m canarchy mcp serve` with HOME holding `default_interface = "vcan7"`."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    write_user_config(VCAN7_CONFIG)
    # The child inherits the test's environment (isolated HOME, the plugin's child
    # guard on PYTHONPATH); stdio_client would otherwise pass only HOME/PATH/... .
    # The scaffold backend: even a regression could not reach a python-can bus.
    env = dict(os.environ, HOME=str(Path.home()), CANARCHY_TRANSPORT_BACKEND="scaffold")
    params = StdioServerParameters(command=sys.executable, args=["-m", "canarchy", "mcp", "serve"], env=env)
    errlog = tmp_path / "server-stderr.txt"

    async def session():
        with open(errlog, "w", encoding="utf-8") as err:
            async with stdio_client(params, errlog=err) as (read_stream, write_stream):
                async with ClientSession(read_stream, write_stream) as client:
                    await client.initialize()
                    tools = (await client.list_tools()).tools
                    config = await client.call_tool("config_show", {})
                    services = await client.call_tool("uds_services", {})
                    send = await client.call_tool("send", {"channel": "vcan7", "arbitration_id": "0x7E0",
                                                           "data": "0210010000000000", "dry_run": False})
                    return tools, config, services, send

    tools, config, services, send = anyio.run(session)
    assert_reference_schemas(tools)
    shown = config.structured_content["data"]["settings"]["CANARCHY_DEFAULT_INTERFACE"]
    assert (shown["value"], shown["source"]) == ("vcan7", "file")  # the child read the temp config
    assert services.is_error is False
    assert_reference_envelope(services.structured_content)
    assert send.is_error is True
    assert error_codes(send.structured_content) == ["ACTIVE_TRANSMIT_REQUIRES_ACK"]
    assert send.meta == {"canarchy/exit_code": 1}
    stderr = errlog.read_text(encoding="utf-8")
    assert "ACTIVE TRANSMIT" not in stderr  # no active path began: no preflight warning
    assert "Traceback" not in stderr


# -- send: the active tool ----------------------------------------------------------------------------


def test_send_plans_by_default(rigged_transport, capsys):
    outcome = mcp_server.run_tool("send", {"channel": "vcan0", "arbitration_id": "0x123", "data": "0210"})
    assert outcome.exit_code == 0
    data = outcome.envelope["data"]
    assert data["mode"] == "dry_run" and data["frame"]["arbitration_id"] == 0x123
    assert rigged_transport == [] and capsys.readouterr().err == ""


def test_send_without_ack_sends_nothing(monkeypatch, virtual_channel, cli_calls, capsys):
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        for arguments in ({"dry_run": False}, {"dry_run": False, "ack_active": False}):
            outcome = mcp_server.run_tool("send", {"channel": virtual_channel, "arbitration_id": "0x7E0",
                                                   "data": "0210", **arguments})
            assert outcome.exit_code == 1
            assert error_codes(outcome.envelope) == ["ACTIVE_TRANSMIT_REQUIRES_ACK"]
            assert outcome.envelope["command"] == "send"
        assert peer.recv(timeout=0.1) is None
    assert cli_calls == []
    assert capsys.readouterr().err == ""  # not even the preflight warning


def test_send_with_ack_reaches_a_virtual_peer_without_reading_stdin(monkeypatch, virtual_channel, capsys):
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "true")
    operator_stdin = io.StringIO("no\n")  # were the gate to read the real stdin, it would decline
    monkeypatch.setattr(sys, "stdin", operator_stdin)
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        outcome = mcp_server.run_tool("send", {"channel": virtual_channel, "arbitration_id": "0x7E0",
                                               "data": "0210010000000000", "ack_active": True, "dry_run": False})
        frame = peer.recv(timeout=1.0)
    assert outcome.exit_code == 0, outcome.envelope["errors"]
    assert outcome.envelope["data"]["mode"] == "active"
    assert frame is not None and frame.arbitration_id == 0x7E0
    assert bytes(frame.data) == bytes.fromhex("0210010000000000")
    assert sys.stdin is operator_stdin and operator_stdin.tell() == 0
    assert NONINTERACTIVE not in os.environ
    assert "ACTIVE TRANSMIT" in capsys.readouterr().err


def test_ack_is_scoped_to_the_call_even_when_it_fails(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    stdin_before = sys.stdin
    outcome = mcp_server.run_tool("send", {"channel": "down0", "arbitration_id": 1, "ack_active": True,
                                           "dry_run": False})
    assert (outcome.exit_code, error_codes(outcome.envelope)) == (2, ["TRANSPORT_UNAVAILABLE"])
    assert sys.stdin is stdin_before
    assert NONINTERACTIVE not in os.environ


def test_ack_with_dry_run_still_plans(rigged_transport, cli_calls):
    outcome = mcp_server.run_tool("send", {"channel": "vcan0", "arbitration_id": 1, "ack_active": True})
    assert outcome.envelope["data"]["mode"] == "dry_run"
    assert cli_calls == [["send", "vcan0", "0x1", "", "--dry-run", "--ack-active", "--json"]]
    assert rigged_transport == []


# -- capture, inputs, errors -------------------------------------------------------------------------


def test_capture_is_bounded(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    outcome = mcp_server.run_tool("capture", {"channel": "vcan0", "count": 2, "timeout": 0.1})
    assert outcome.exit_code == 0
    assert outcome.envelope["data"]["frame_count"] == 2
    assert [e["event_type"] for e in outcome.envelope["data"]["events"]] == ["frame", "frame"]
    assert mcp_server.build_argv("capture", {"channel": "vcan0", "count": 5, "timeout": 1}) == [
        "capture", "vcan0", "--count", "5", "--timeout", "1.0", "--json"]


@pytest.mark.parametrize("name,arguments", [
    ("uds_services", {"channel": "vcan7"}),
    ("uds_services", {"dry_run": True}),
    ("j1939_pgn", {}),
    ("j1939_pgn", {"pgn": "--ack-active"}),
    ("j1939_pgn", {"pgn": -1}),
    ("j1939_pgn", {"pgn": True}),
    ("capture", {"channel": "vcan0"}),
    ("capture", {"channel": "vcan0", "count": 0}),
    ("capture", {"channel": "vcan0", "count": 1001}),
    ("capture", {"channel": "vcan0", "count": "5"}),
    ("capture", {"channel": "vcan0", "count": 5, "timeout": 60}),
    ("send", {"channel": "-x", "arbitration_id": 1}),
    ("send", {"channel": "123", "arbitration_id": 1}),
    ("send", {"channel": "vcan0", "arbitration_id": 1, "data": "zz"}),
    ("send", {"channel": "vcan0", "arbitration_id": 1, "ack_active": "yes", "dry_run": False}),
])
def test_invalid_arguments_run_nothing(name, arguments, cli_calls):
    outcome = mcp_server.run_tool(name, arguments)
    assert (outcome.exit_code, error_codes(outcome.envelope)) == (1, ["INVALID_ARGUMENTS"])
    assert outcome.envelope["command"] == mcp_server.TOOLS[name].command_name
    assert all(e["hint"] for e in outcome.envelope["errors"])
    assert cli_calls == []


def test_command_errors_pass_through():
    outcome = mcp_server.run_tool("j1939_pgn", {"pgn": 999999})
    assert (outcome.exit_code, error_codes(outcome.envelope)) == (1, ["INVALID_PGN"])
    assert "3840" in outcome.envelope["errors"][0]["hint"]


@pytest.mark.parametrize("name,arguments,command", [
    ("config_show", {}, "config show"), ("j1939_pgn", {"pgn": "0xF004"}, "j1939 pgn"),
    ("j1939_spn", {"spn": 190}, "j1939 spn"), ("j1587_pid", {"pid": 84}, "j1587 pid"),
    ("j2497_mid", {"mid": 137}, "j2497 mid"), ("dbc_cache_list", {}, "dbc cache list"),
    ("skills_cache_list", {}, "skills cache list"), ("session_show", {}, "session show"),
])
def test_reference_tools_answer(name, arguments, command, rigged_transport):
    outcome = mcp_server.run_tool(name, arguments)
    assert outcome.exit_code == 0, outcome.envelope["errors"]
    assert outcome.envelope["command"] == command and outcome.envelope["ok"] is True
    assert rigged_transport == []


def test_unknown_tool():
    outcome = mcp_server.run_tool("uds_probe", {})
    assert (outcome.exit_code, error_codes(outcome.envelope)) == (1, ["MCP_UNKNOWN_TOOL"])


def test_a_bug_is_an_internal_error_not_a_dead_server(monkeypatch, capsys):
    def broken(argv=None, stdout=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "main", broken)
    with pytest.raises(RuntimeError):
        mcp_server.run_tool("config_show", {})  # the function itself does not hide bugs
    _, [result, after] = in_process(("config_show", {}), ("unknown", {}))
    assert result.is_error is True and error_codes(result.structured_content) == ["INTERNAL_ERROR"]
    assert error_codes(after.structured_content) == ["MCP_UNKNOWN_TOOL"]  # still serving
    assert "RuntimeError: boom" in capsys.readouterr().err


# -- the server process ----------------------------------------------------------------------------------


def test_hosting_in_process_leaves_no_process_state(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    env_before, cwd_before = dict(os.environ), os.getcwd()
    streams_before = (sys.stdin, sys.stdout, sys.stderr)
    handlers_before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    logging_before = (list(root.handlers), root.level)
    _, results = in_process(
        ("send", {"channel": "scaffold0", "arbitration_id": "0x123", "data": "01", "ack_active": True,
                  "dry_run": False}),
        ("uds_services", {}),
        ("send", {"channel": "scaffold0", "arbitration_id": "0x123", "dry_run": False}),
    )
    assert results[0].structured_content["data"]["mode"] == "active"
    assert_reference_envelope(results[1].structured_content)
    assert error_codes(results[2].structured_content) == ["ACTIVE_TRANSMIT_REQUIRES_ACK"]
    assert dict(os.environ) == env_before and NONINTERACTIVE not in os.environ
    assert os.getcwd() == cwd_before
    assert (sys.stdin, sys.stdout, sys.stderr) == streams_before
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == handlers_before
    assert (list(root.handlers), root.level) == logging_before


_INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}})


def _start_server() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "canarchy", "mcp", "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _handshake(proc: subprocess.Popen, deadline: float) -> None:
    """Send `initialize` and wait for the reply: once it arrives, the server is serving
    and its signal handlers are installed."""
    proc.stdin.write(_INITIALIZE + "\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "the server did not answer `initialize` in time"
    assert json.loads(proc.stdout.readline())["result"]["serverInfo"]["name"] == "canarchy"


def test_serve_stops_cleanly_on_sigterm_sigint_and_eof():
    """Exit 0, promptly, no traceback, nothing more on stdout: on SIGTERM, on SIGINT, and when
    the client closes stdin. The three servers start together (the SDK import dominates)."""
    stops = ("SIGTERM", "SIGINT", "eof")
    procs = {stop: _start_server() for stop in stops}
    outcomes = {}
    try:
        deadline = time.monotonic() + 20
        for proc in procs.values():
            _handshake(proc, deadline)
        for stop, proc in procs.items():
            started = time.monotonic()
            if stop == "eof":
                proc.stdin.close()
            else:
                proc.send_signal(getattr(signal, stop))
            code = proc.wait(timeout=30)  # a hang detector, not a speed target
            outcomes[stop] = (code, time.monotonic() - started, proc.stdout.read(), proc.stderr.read())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if not stream.closed:
                    stream.close()
    for stop, (code, elapsed, rest, stderr) in outcomes.items():
        assert code == 0, (stop, stderr)
        assert "Traceback" not in stderr, (stop, stderr)
        assert rest == "", stop  # nothing after the protocol: no envelope on stdout


def test_serve_refuses_json_output():
    result = run_cli("mcp", "serve", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])


def test_serve_without_the_sdk(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)
    result = run_cli("mcp", "serve")
    assert result.code == 1
    assert result.out.startswith("error: MCP_SDK_MISSING")


def test_the_cli_does_not_import_the_sdk_or_python_can():
    code = ("import io, sys; from canarchy.cli import main; "
            "main(['uds', 'services', '--json'], stdout=io.StringIO()); "
            "import canarchy.mcp_server; "
            "print(sorted(m for m in ('mcp', 'can') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
