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

from canarchy import cli, mcp_server, mcp_tools, uds
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


def in_process(*calls, policy=None):
    """Run ``(tool, arguments)`` calls through an in-process server (under ``policy``) and the SDK's client.

    Returns ``(tools, results)``: the listed ``Tool`` models and one
    ``CallToolResult`` per call.
    """
    from mcp import Client

    async def session():
        async with Client(mcp_server.build_server(policy), mode="legacy") as client:
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
    assert data["service_count"] == 27 == len(uds.SERVICES)
    assert "probe_count" not in data and "interface" not in data


def error_codes(envelope):
    return [e["code"] for e in envelope["errors"]]


def assert_reference_schemas(tools):
    """Every tool is listed; reference-only ones accept no channel, interface, ack or dry run."""
    by_name = {tool.name: tool for tool in tools}
    assert list(by_name) == list(mcp_tools.TOOLS)
    assert set(by_name) - mcp_tools.REFERENCE_ONLY_TOOLS == {"capture", "send"}
    for name in mcp_tools.REFERENCE_ONLY_TOOLS:
        schema = by_name[name].input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False, name
        for prop in schema.get("properties", {}):
            assert prop not in mcp_tools.FORBIDDEN_REFERENCE_PROPERTIES, (name, prop)
            assert not any(word in prop for word in ("channel", "interface", "ack", "dry")), (name, prop)
        assert by_name[name].annotations.read_only_hint is True
    send = by_name["send"].input_schema["properties"]
    assert send["ack_active"]["default"] is False and send["dry_run"]["default"] is True
    assert by_name["send"].annotations.destructive_hint is True


# -- the registry and the reference-only check ------------------------------------------------


def test_registry_kinds():
    kinds = {name: spec.kind for name, spec in mcp_tools.TOOLS.items()}
    assert kinds.pop("capture") == "bus" and kinds.pop("send") == "active"
    assert {name for name, kind in kinds.items() if kind == "file"} == {
        "capture_summary", "decode_file", "isotp_decode_file", "j1939_decode_file"}
    assert mcp_tools.REFERENCE_ONLY_TOOLS == set(kinds) == {
        "config_show", "uds_services", "j1939_pgn", "j1939_spn", "j1587_pid", "j2497_mid",
        "dbc_cache_list", "skills_cache_list", "session_show",
        "capture_summary", "decode_file", "isotp_decode_file", "j1939_decode_file"}


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
    spec = mcp_tools.TOOLS[name]
    argv = mcp_tools.build_argv(name, mcp_tools.validate_arguments(spec, arguments))
    assert argv[:len(spec.command)] == list(spec.command) and argv[-1] == "--json"
    mcp_tools.check_argv(spec, argv)  # does not raise


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
        mcp_tools.check_argv(mcp_tools.TOOLS[name], argv)
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
            async with (
                stdio_client(params, errlog=err) as (read_stream, write_stream),
                ClientSession(read_stream, write_stream) as client,
            ):
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
    assert error_codes(send.structured_content) == ["MCP_ACTIVE_NOT_ALLOWED"]  # no --allow-active
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
    policy = mcp_tools.ServerPolicy(active_channels=frozenset({virtual_channel}))  # allowed, but not acknowledged
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        for arguments in ({"dry_run": False}, {"dry_run": False, "ack_active": False}):
            outcome = mcp_server.run_tool("send", {"channel": virtual_channel, "arbitration_id": "0x7E0",
                                                   "data": "0210", **arguments}, policy)
            assert outcome.exit_code == 1
            assert error_codes(outcome.envelope) == ["ACTIVE_TRANSMIT_REQUIRES_ACK"]
            assert outcome.envelope["command"] == "send"
        assert peer.recv(timeout=0.1) is None
    assert cli_calls == []
    assert capsys.readouterr().err == ""  # not even the preflight warning


def test_send_with_ack_reaches_a_virtual_peer_without_reading_stdin(monkeypatch, virtual_channel, capsys):
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    operator_stdin = io.StringIO("no\n")  # were the gate to read the real stdin, it would decline
    monkeypatch.setattr(sys, "stdin", operator_stdin)
    policy = mcp_tools.ServerPolicy(active_channels=frozenset({virtual_channel}))
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        outcome = mcp_server.run_tool("send", {"channel": virtual_channel, "arbitration_id": "0x7E0",
                                               "data": "0210010000000000", "ack_active": True, "dry_run": False},
                                      policy)
        frame = peer.recv(timeout=1.0)
    assert outcome.exit_code == 0, outcome.envelope["errors"]
    assert outcome.envelope["data"]["mode"] == "active"
    assert frame is not None and frame.arbitration_id == 0x7E0
    assert bytes(frame.data) == bytes.fromhex("0210010000000000")
    assert sys.stdin is operator_stdin and operator_stdin.tell() == 0
    assert NONINTERACTIVE not in os.environ
    assert "ACTIVE TRANSMIT" in capsys.readouterr().err


def test_require_active_ack_needs_the_users_confirmation(monkeypatch, virtual_channel, capsys):
    """Under require_active_ack the agent's ack_active is not enough: the person confirms, through the client."""
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "true")
    policy = mcp_tools.ServerPolicy(active_channels=frozenset({virtual_channel}))
    call = {"channel": virtual_channel, "arbitration_id": "0x7E0", "data": "023E00", "ack_active": True,
            "dry_run": False}
    asked = []
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        for answer, code in ((None, "MCP_CONFIRMATION_UNAVAILABLE"), (False, "ACTIVE_CONFIRMATION_DECLINED")):
            outcome = mcp_server.run_tool("send", call, policy, lambda message, a=answer: asked.append(message) or a)
            assert (outcome.exit_code, error_codes(outcome.envelope)) == (1, [code])
            assert peer.recv(timeout=0.1) is None
        assert "ACTIVE TRANSMIT" not in capsys.readouterr().err  # refused before the command ran
        outcome = mcp_server.run_tool("send", call, policy, lambda message: asked.append(message) or True)
        frame = peer.recv(timeout=1.0)
    assert outcome.exit_code == 0, outcome.envelope["errors"]
    assert frame is not None and bytes(frame.data) == bytes.fromhex("023E00")
    assert len(asked) == 3 and all(virtual_channel in m and "0x7E0" in m for m in asked)


def test_without_allow_active_nothing_reaches_the_bus(monkeypatch, virtual_channel, cli_calls, capsys):
    """Whatever the call says, a channel the operator did not allow is never transmitted on."""
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    other = mcp_tools.ServerPolicy(active_channels=frozenset({"can9"}))
    with can.Bus(channel=virtual_channel, interface="virtual") as peer:
        for policy in (None, mcp_tools.ServerPolicy(), other):
            for arguments in ATTEMPTS:
                outcome = mcp_server.run_tool("send", {"channel": virtual_channel, "arbitration_id": "0x7E0",
                                                       **arguments}, policy, lambda message: True)
                if outcome.ok:
                    assert outcome.envelope["data"]["mode"] == "dry_run", arguments
                else:
                    assert error_codes(outcome.envelope) in (["MCP_ACTIVE_NOT_ALLOWED"], ["INVALID_ARGUMENTS"]), \
                        (arguments, outcome.envelope["errors"])
        assert peer.recv(timeout=0.2) is None
    assert all("--dry-run" in argv for argv in cli_calls)  # only plans ever ran
    assert "ACTIVE TRANSMIT" not in capsys.readouterr().err


#: Calls an agent might make to get a frame out: none may transmit without --allow-active.
ATTEMPTS = [
    {"dry_run": False, "ack_active": True},
    {"dry_run": False, "ack_active": True, "data": "0210010000000000"},
    {"dry_run": False},
    {"ack_active": True},
    {"dry_run": False, "ack_active": True, "channel_override": "x"},
    {"dry_run": "false", "ack_active": "true"},
    {"dry_run": 0, "ack_active": 1},
    {"dry_run": None, "ack_active": True},
    {"dry_run": False, "ack_active": True, "data": "--ack-active"},
]


def test_ack_is_scoped_to_the_call_even_when_it_fails(monkeypatch):
    monkeypatch.setenv("CANARCHY_TRANSPORT_BACKEND", "scaffold")
    stdin_before = sys.stdin
    outcome = mcp_server.run_tool("send", {"channel": "down0", "arbitration_id": 1, "ack_active": True,
                                           "dry_run": False},
                                  mcp_tools.ServerPolicy(active_channels=frozenset({"down0"})))
    assert (outcome.exit_code, error_codes(outcome.envelope)) == (2, ["TRANSPORT_UNAVAILABLE"])
    assert sys.stdin is stdin_before
    assert NONINTERACTIVE not in os.environ


@pytest.mark.parametrize("channel", ["239.74.163.2", "ff01::6361:6e61"])
def test_a_udp_multicast_group_is_a_channel(channel, rigged_transport, cli_calls):
    """python-can's udp_multicast channel is its group: the IPv4 one starts with a digit, and the channel pattern
    (no bare number: `send ID DATA`) refused it, so the README's bus could not be used through MCP."""
    outcome = mcp_server.run_tool("send", {"channel": channel, "arbitration_id": 1})
    assert outcome.envelope["data"]["mode"] == "dry_run" and outcome.envelope["data"]["frame"]["channel"] == channel
    assert cli_calls == [["send", channel, "0x1", "", "--dry-run", "--json"]]


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
    assert mcp_tools.build_argv("capture", {"channel": "vcan0", "count": 5, "timeout": 1}) == [
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
    assert outcome.envelope["command"] == mcp_tools.TOOLS[name].command_name
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
        policy=mcp_tools.ServerPolicy(active_channels=frozenset({"scaffold0"})),
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
        deadline = time.monotonic() + 90  # a hang detector: three SDK start-ups on a busy machine
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
    for stop, (code, _elapsed, rest, stderr) in outcomes.items():
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
    assert result.err.startswith("error: MCP_SDK_MISSING")


def test_the_cli_does_not_import_the_sdk_or_python_can():
    code = ("import io, sys; from canarchy.cli import main; "
            "main(['uds', 'services', '--json'], stdout=io.StringIO()); "
            "import canarchy.mcp_server; "
            "print(sorted(m for m in ('mcp', 'can') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# -- over stdio: consent and recordings, with the SDK's own client ---------------------------------------

CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"


def over_stdio(serve_args, calls, tmp_path, *, env=None, elicitation=None):
    """Run ``python -m canarchy mcp serve SERVE_ARGS`` and make ``calls`` (``(tool, arguments)``) with the
    SDK's ``ClientSession`` (``elicitation``: its elicitation callback, None: the client has none).
    Returns ``(results, server stderr)``."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    child_env = dict(os.environ, HOME=str(Path.home()), **(env or {}))
    params = StdioServerParameters(command=sys.executable, args=["-m", "canarchy", "mcp", "serve", *serve_args],
                                   env=child_env)
    errlog = tmp_path / f"server-stderr-{len(list(tmp_path.glob('server-stderr-*')))}.txt"

    async def session():
        with open(errlog, "w", encoding="utf-8") as err:
            async with (
                stdio_client(params, errlog=err) as (read_stream, write_stream),
                ClientSession(read_stream, write_stream, elicitation_callback=elicitation) as client,
            ):
                await client.initialize()
                return [await client.call_tool(name, arguments) for name, arguments in calls]

    results = anyio.run(session)
    return results, errlog.read_text(encoding="utf-8")


def _accept(*answers, seen=None):
    """An elicitation callback whose user answers ``transmit: True/False`` in turn (always True when none given)."""
    import mcp.types as types

    queue = list(answers)

    async def callback(context, params):
        if seen is not None:
            seen.append(params.message)
        return types.ElicitResult(action="accept", content={"transmit": queue.pop(0) if queue else True})
    return callback


def test_stdio_server_without_allow_active_never_transmits(tmp_path, virtual_channel):
    env = {"CANARCHY_PYTHON_CAN_INTERFACE": "virtual"}
    base = {"channel": virtual_channel, "arbitration_id": "0x7E0"}
    calls = [("send", {**base, **arguments}) for arguments in ATTEMPTS]
    # even a client whose user would say yes to everything
    results, stderr = over_stdio([], calls, tmp_path, env=env, elicitation=_accept())
    for (_name, arguments), result in zip(calls, results, strict=True):
        envelope = result.structured_content
        if envelope["ok"]:
            assert envelope["data"]["mode"] == "dry_run", arguments
        else:
            assert error_codes(envelope) in (["MCP_ACTIVE_NOT_ALLOWED"], ["INVALID_ARGUMENTS"]), arguments
    assert sum(error_codes(r.structured_content) == ["MCP_ACTIVE_NOT_ALLOWED"] for r in results) >= 3
    assert "ACTIVE TRANSMIT" not in stderr and "Traceback" not in stderr  # no active path even began
    # The control: the same call on a server whose operator allowed the channel does transmit.
    results, stderr = over_stdio(["--allow-active", virtual_channel], calls[:1] + [
        ("send", {**calls[0][1], "channel": "vcan9"})], tmp_path, env=env)
    assert results[0].is_error is False and results[0].structured_content["data"]["mode"] == "active"
    assert error_codes(results[1].structured_content) == ["MCP_ACTIVE_NOT_ALLOWED"]  # another channel: no
    assert stderr.count("ACTIVE TRANSMIT") == 1 and virtual_channel in stderr


def test_stdio_require_active_ack_asks_the_person(tmp_path, virtual_channel):
    write_user_config('[safety]\nrequire_active_ack = true\n')
    env = {"CANARCHY_PYTHON_CAN_INTERFACE": "virtual"}
    call = [("send", {"channel": virtual_channel, "arbitration_id": "0x7E0", "data": "023E00",
                      "ack_active": True, "dry_run": False})]
    serve = ["--allow-active", virtual_channel]
    [no_elicitation], _ = over_stdio(serve, call, tmp_path, env=env)
    assert error_codes(no_elicitation.structured_content) == ["MCP_CONFIRMATION_UNAVAILABLE"]
    seen = []
    (refused, confirmed), stderr = over_stdio(serve, call * 2, tmp_path, env=env,
                                              elicitation=_accept(False, True, seen=seen))
    assert error_codes(refused.structured_content) == ["ACTIVE_CONFIRMATION_DECLINED"]
    assert confirmed.is_error is False, confirmed.structured_content["errors"]
    assert confirmed.structured_content["data"]["mode"] == "active"
    assert len(seen) == 2 and all(virtual_channel in m and "0x7E0" in m and "ACTIVE TRANSMIT" in m for m in seen)
    assert stderr.count("ACTIVE TRANSMIT") == 1


def test_stdio_file_tools_decode_the_real_recordings(tmp_path):
    truck, dbc = "j1939_truck_idle.log", "css_j1939_demo.dbc"
    calls = [
        ("capture_summary", {"file": truck}),
        ("decode_file", {"file": truck, "dbc": dbc}),
        ("decode_file", {"file": str(CAPTURES / truck), "dbc": dbc, "summary": True}),
        ("j1939_decode_file", {"file": truck, "pgn": 65226}),
        ("isotp_decode_file", {"file": "obd2_skoda_7e0_7e8.log", "summary": True}),
        ("isotp_decode_file", {"file": "nissan_leaf_uds_79b_7bb.log", "request_id": "0x79B",
                               "response_id": "0x7BB", "limit": 5}),
        ("capture_summary", {"file": "../../README.md"}),
        ("capture_summary", {"file": "/etc/hostname"}),
    ]
    results, stderr = over_stdio(["--files", str(CAPTURES)], calls, tmp_path)
    summary, decoded, decoded_summary, j1939, obd, leaf, dotdot, absolute = (r.structured_content for r in results)
    assert summary["ok"] and (summary["data"]["frame_count"], summary["data"]["id_count"]) == (3582, 45)
    eec1 = next(row for row in summary["data"]["ids"] if row["id"] == "0CF00400")
    stamps = [float(line.split()[0][1:-1]) for line in (CAPTURES / truck).read_text().splitlines()
              if line.split()[2].startswith("0CF00400#")]
    assert (eec1["count"], eec1["rate_hz"]) == (len(stamps), round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 3))
    assert decoded["ok"] and decoded["data"]["decoded_count"] == 1100
    assert len(decoded["data"]["events"]) == mcp_tools.FILE_EVENTS_DEFAULT and decoded["data"]["events_total"] == 1100
    assert any(w.startswith("MCP_EVENTS_TRUNCATED") for w in decoded["warnings"])
    assert decoded_summary["data"]["decoded_count"] == 1100 and "events" not in decoded_summary["data"]
    assert j1939["ok"] and j1939["data"]["dm1_count"] == 10 and j1939["data"]["pgn_filter"] == 65226
    assert obd["ok"] and obd["data"]["vin"] == "TMBZZZ0X0NY000001"
    assert leaf["ok"] and len(leaf["data"]["events"]) == 5 and leaf["data"]["request_id"] == 0x79B
    for refused in (dotdot, absolute):
        assert error_codes(refused) == ["MCP_PATH_NOT_ALLOWED"], refused
    assert "Traceback" not in stderr


def test_stdio_paths_cannot_leave_the_allowed_directory(tmp_path):
    root = tmp_path / "recordings"
    root.mkdir()
    (root / "inside.log").write_bytes((CAPTURES / "obd2_skoda_7e0_7e8.log").read_bytes()[:4000])
    (root / "escape.log").symlink_to(CAPTURES / "obd2_skoda_7e0_7e8.log")   # a link that leads out
    (root / "etc").symlink_to("/etc", target_is_directory=True)
    calls = [("capture_summary", {"file": "inside.log"}), ("capture_summary", {"file": "escape.log"}),
             ("capture_summary", {"file": "etc/hostname"}), ("capture_summary", {"file": "sub/../../x.log"}),
             ("capture_summary", {"file": "-x"})]
    results, _ = over_stdio(["--files", str(root)], calls, tmp_path)
    inside, escape, etc, dotdot, option = (r.structured_content for r in results)
    assert inside["ok"] and inside["data"]["frame_count"] > 10
    assert [error_codes(e) for e in (escape, etc, dotdot)] == [["MCP_PATH_NOT_ALLOWED"]] * 3
    assert error_codes(option) == ["INVALID_ARGUMENTS"]
    [no_files], _ = over_stdio([], calls[:1], tmp_path)
    assert error_codes(no_files.structured_content) == ["MCP_FILES_NOT_ALLOWED"]


def test_file_tools_argv_check(tmp_path):
    policy = mcp_tools.ServerPolicy(file_roots=(CAPTURES,))
    spec = mcp_tools.TOOLS["capture_summary"]
    good = ["capture", "--file", str(CAPTURES / "j1939_truck_idle.log"), "--summary", "--json"]
    mcp_tools.check_argv(spec, good, policy)  # does not raise
    for bad in (["capture", "vcan0", "--summary", "--json"],                       # a channel: a live capture
                ["capture", "--file", "/etc/hostname", "--summary", "--json"],      # outside the roots
                ["capture", "--file", str(CAPTURES / "j1939_truck_idle.log"), "--count", "5", "--json"],
                good[:-1] + ["send", "--json"]):
        with pytest.raises(UserInputError) as caught:
            mcp_tools.check_argv(spec, bad, policy)
        assert caught.value.code == "REFERENCE_ONLY_TOOL_VIOLATION", bad


def test_serve_refuses_a_files_directory_that_does_not_exist(tmp_path):
    result = run_cli("mcp", "serve", "--files", str(tmp_path / "missing"))
    assert result.code == 1 and result.err.startswith("error: MCP_FILES_INVALID")
    result = run_cli("mcp", "serve", "--allow-active", "-x")
    assert result.code == 1
