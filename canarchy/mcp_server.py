"""canarchy's MCP server: canarchy commands as Model Context Protocol tools (``canarchy mcp serve``).

Each tool call is checked and turned into an argv by :mod:`canarchy.mcp_tools`, run in this process through
``canarchy.cli.main`` with ``--json``, and answered with the command's envelope. Reference and file tools never
touch a bus; ``capture`` listens; ``send`` transmits only on a channel the operator allowed
(:class:`~canarchy.mcp_tools.ServerPolicy`), with the call's ``ack_active`` and, under ``require_active_ack``, the
person's confirmation. Neither python-can nor the SDK is imported at import time; :func:`build_server` and
:func:`serve_stdio` import the SDK. Shapes and rules: ``docs/mcp.md``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterator, Mapping, Sequence

from canarchy import __version__, cli, output
from canarchy.active import caller_acknowledged, preflight_warning
from canarchy.errors import CanarchyError, UserInputError
from canarchy.mcp_tools import (REFERENCE_ONLY_TOOLS, TOOLS, ServerPolicy, ToolSpec, build_argv, check_argv,
                                 resolve_paths, tool_number, validate_arguments)

SERVER_NAME = "canarchy"

ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "command": {"type": "string"},
        "data": {"type": "object"},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                               "hint": {"type": "string"}},
                "required": ["code", "message", "hint"],
            },
        },
    },
    "required": ["ok", "command", "data", "warnings", "errors"],
}

#: What the client shows its user before an active call runs under ``require_active_ack``.
CONFIRMATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"transmit": {"type": "boolean", "title": "Transmit",
                                "description": "true to let canarchy transmit as described; anything else refuses"}},
    "required": ["transmit"],
}


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call produced: the CLI's exit code (0-3) and the envelope dict."""

    exit_code: int
    envelope: dict[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.envelope.get("ok"))


# One canarchy command at a time: commands share the process's cwd and stderr.
_COMMAND_LOCK = threading.Lock()


# --- active tools ----------------------------------------------------------------------------------


def _requires_ack() -> UserInputError:
    return UserInputError(
        "ACTIVE_TRANSMIT_REQUIRES_ACK",
        "`send` with dry_run false transmits on the bus and ack_active was not true. Nothing was sent.",
        "Call `send` with ack_active: true to transmit, or leave dry_run true (the default) to plan only.",
    )


def _not_allowed(channel: str, policy: ServerPolicy) -> UserInputError:
    allowed = ", ".join(sorted(policy.active_channels)) or "none"
    return UserInputError(
        "MCP_ACTIVE_NOT_ALLOWED",
        f"This server may not transmit on {channel!r} (channels allowed by the person who started it: {allowed}). "
        "Nothing was sent.",
        "Only the person running the server can allow a channel: `canarchy mcp serve --allow-active "
        f"{channel}`. Plan with dry_run: true meanwhile.",
    )


def _check_active_argv(arguments: Mapping[str, Any], argv: Sequence[str]) -> None:
    """Fail closed (``ACTIVE_TRANSMIT_REQUIRES_ACK``) unless ``argv`` transmits only when the
    call acknowledged it: without ``ack_active`` it must plan (``--dry-run``) and carry no ``--ack-active``."""
    acknowledged = bool(arguments.get("ack_active"))
    if not acknowledged and ("--dry-run" not in argv or "--ack-active" in argv):
        raise _requires_ack()


def _transmits(argv: Sequence[str]) -> bool:
    return "--dry-run" not in argv


def _confirm_transmission(spec: ToolSpec, values: Mapping[str, Any],
                          confirm: Callable[[str], bool | None] | None) -> None:
    """Under ``require_active_ack``: ask the person through the client (``confirm``); raise unless they said yes."""
    from canarchy import config

    required, _source = config.resolve("CANARCHY_REQUIRE_ACTIVE_ACK")
    if not required:
        return
    action = f"send frame 0x{tool_number(values['arbitration_id']):X} [{values.get('data') or '-'}]"
    message = (preflight_warning(spec.command_name, values["channel"], action) +
               " An agent asks for it through MCP; [safety] require_active_ack asks you to confirm.")
    answer = None if confirm is None else confirm(message)
    if answer is None:
        raise UserInputError(
            "MCP_CONFIRMATION_UNAVAILABLE",
            "[safety] require_active_ack is set and this MCP client cannot ask its user to confirm (it does not "
            "support elicitation). Nothing was sent.",
            "Use a client that supports MCP elicitation, or plan with dry_run: true; the agent's ack_active alone "
            "is not a person's consent.")
    if answer is not True:
        raise UserInputError("ACTIVE_CONFIRMATION_DECLINED",
                             f"The transmission on {values['channel']} was not confirmed by the user. "
                             "Nothing was sent.",
                             "Ask the user; plan with dry_run: true meanwhile.")


# --- running --------------------------------------------------------------------------------------


def _failure(command: str, error: CanarchyError) -> ToolOutcome:
    return ToolOutcome(error.exit_code, output.envelope(command, None, error))


def _execute(argv: list[str], acknowledged: bool) -> ToolOutcome:
    out = io.StringIO()
    with _COMMAND_LOCK:
        if acknowledged:
            with caller_acknowledged():
                code = cli.main(argv, stdout=out)
        else:
            code = cli.main(argv, stdout=out)
    return ToolOutcome(code, json.loads(out.getvalue()))


def _bound_events(outcome: ToolOutcome, limit: int) -> ToolOutcome:
    """At most ``limit`` of the envelope's ``data.events``; the rest is counted (``events_total``) and warned of."""
    data = outcome.envelope.get("data") or {}
    events = data.get("events")
    if not isinstance(events, list) or len(events) <= limit:
        return outcome
    data["events_total"] = len(events)
    data["events"] = events[:limit]
    outcome.envelope["warnings"].append(
        f"MCP_EVENTS_TRUNCATED: {limit} of {len(events)} events returned; the counts and summaries cover the whole "
        "file (raise limit up to 1000, or narrow the question, e.g. by PGN)")
    return outcome


def run_tool(name: str, arguments: Mapping[str, Any] | None = None, policy: ServerPolicy | None = None,
             confirm: Callable[[str], bool | None] | None = None) -> ToolOutcome:
    """Run one tool in this process; return its exit code and envelope.

    ``policy``: what the operator allowed (default: no files, no channel to
    transmit on); ``confirm(message)``: asks the person through the client,
    returning True (yes), False (no) or None (cannot ask). Order: look the
    tool up (``MCP_UNKNOWN_TOOL``), validate the arguments
    (``INVALID_ARGUMENTS``), resolve paths (``MCP_FILES_NOT_ALLOWED``,
    ``MCP_PATH_NOT_ALLOWED``), for a transmission: the channel allowed
    (``MCP_ACTIVE_NOT_ALLOWED``), ``ack_active`` (``ACTIVE_TRANSMIT_REQUIRES_ACK``),
    the person's confirmation under ``require_active_ack``
    (``MCP_CONFIRMATION_UNAVAILABLE``, ``ACTIVE_CONFIRMATION_DECLINED``); then
    build and check the argv and run ``canarchy.cli.main(argv)``. Each refusal
    is an error envelope with exit code 1, and nothing has run. Exceptions
    other than ``CanarchyError`` (bugs) propagate.
    """
    policy = ServerPolicy() if policy is None else policy
    spec = TOOLS.get(name)
    if spec is None:
        return _failure("mcp", UserInputError(
            "MCP_UNKNOWN_TOOL", f"There is no tool named {name!r}.",
            f"List the tools; canarchy serves {', '.join(TOOLS)}."))
    try:
        values = resolve_paths(spec, validate_arguments(spec, arguments), policy)
        if spec.kind == "active" and not values["dry_run"]:
            if values["channel"] not in policy.active_channels:
                raise _not_allowed(values["channel"], policy)
            if not values["ack_active"]:
                raise _requires_ack()
        argv = build_argv(name, values)
        if name in REFERENCE_ONLY_TOOLS:
            check_argv(spec, argv, policy)
        elif spec.kind == "active":
            _check_active_argv(values, argv)
            if _transmits(argv):
                if values["channel"] not in policy.active_channels or argv[1] != values["channel"]:
                    raise _not_allowed(values["channel"], policy)
                _confirm_transmission(spec, values, confirm)
        elif list(argv[:len(spec.command)]) != list(spec.command):
            raise UserInputError("INVALID_ARGUMENTS", f"Tool {name!r} built {argv!r}.",
                                 "This is a bug in canarchy's MCP server; report it.")
    except CanarchyError as exc:
        return _failure(spec.command_name, exc)
    acknowledged = spec.kind == "active" and "--ack-active" in argv and _transmits(argv)
    outcome = _execute(argv, acknowledged)
    if "limit" in spec.properties:
        outcome = _bound_events(outcome, values["limit"])
    return outcome


def _run_tool_reporting_bugs(name: str, arguments: Mapping[str, Any] | None, policy: ServerPolicy | None = None,
                             confirm: Callable[[str], bool | None] | None = None) -> ToolOutcome:
    """:func:`run_tool`, with a bug reported as an ``INTERNAL_ERROR`` envelope (traceback on stderr)."""
    try:
        return run_tool(name, arguments, policy, confirm)
    except Exception as exc:  # the server must answer; the traceback goes to the server's log
        traceback.print_exc(file=sys.stderr)
        spec = TOOLS.get(name)
        return _failure(spec.command_name if spec else "mcp", CanarchyError(
            "INTERNAL_ERROR", f"Tool {name!r} failed: {type(exc).__name__}: {exc}",
            "This is a bug in canarchy; the traceback is on the MCP server's stderr. Please report it."))


# --- the MCP server (imports the SDK) -----------------------------------------------------------------


def _annotations(spec: ToolSpec, types: Any) -> Any:
    if spec.kind in ("reference", "file"):
        return types.ToolAnnotations(title=spec.name, read_only_hint=True, destructive_hint=False,
                                     idempotent_hint=True, open_world_hint=False)
    if spec.kind == "bus":
        return types.ToolAnnotations(title=spec.name, read_only_hint=True, destructive_hint=False,
                                     idempotent_hint=False, open_world_hint=True)
    return types.ToolAnnotations(title=spec.name, read_only_hint=False, destructive_hint=True,
                                 idempotent_hint=False, open_world_hint=True)


def tool_result(outcome: ToolOutcome, types: Any) -> Any:
    """The ``CallToolResult`` for ``outcome``: the envelope as structured content and as JSON text,
    ``isError`` when the envelope is not ok, and ``_meta["canarchy/exit_code"]``."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(outcome.envelope, sort_keys=True))],
        structured_content=outcome.envelope,
        is_error=not outcome.ok,
        _meta={"canarchy/exit_code": outcome.exit_code},
    )


def build_server(policy: ServerPolicy | None = None,
                 runner: Callable[..., ToolOutcome] | None = None) -> Any:
    """Return an ``mcp.server.lowlevel.Server`` serving :data:`TOOLS` under ``policy`` (not started).

    ``runner(name, arguments, policy, confirm)`` runs one call (default:
    :func:`run_tool`, with bugs reported as ``INTERNAL_ERROR``) in a worker
    thread, so a capture does not stall the protocol; ``confirm`` asks the
    client's user through MCP elicitation (None when the client cannot).
    Building the server touches no process-wide state.
    """
    import functools

    import anyio
    import mcp.types as types
    from mcp.server.lowlevel import Server

    policy = ServerPolicy() if policy is None else policy
    run = runner or _run_tool_reporting_bugs
    tools = [
        types.Tool(name=spec.name, title=spec.name, description=spec.description,
                   input_schema=spec.input_schema(), output_schema=ENVELOPE_SCHEMA,
                   annotations=_annotations(spec, types))
        for spec in TOOLS.values()
    ]

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: Any) -> Any:
        session = ctx.session
        capabilities = getattr(session, "client_capabilities", None)

        def confirm(message: str) -> bool | None:
            """Ask the user (from the worker thread, through the event loop); None: the client cannot."""
            if capabilities is None or capabilities.elicitation is None:
                return None
            try:
                result = anyio.from_thread.run(functools.partial(
                    session.elicit_form, message, CONFIRMATION_SCHEMA, ctx.request_id))
            except Exception:  # the client failed to ask: no consent
                traceback.print_exc(file=sys.stderr)
                return None
            return result.action == "accept" and (result.content or {}).get("transmit") is True

        outcome = await anyio.to_thread.run_sync(run, params.name, params.arguments, policy, confirm)
        return tool_result(outcome, types)

    allowed = ", ".join(sorted(policy.active_channels)) or "none"
    return Server(SERVER_NAME, version=__version__,
                  instructions="canarchy CAN toolkit. Reference and file tools never touch a bus; file tools read "
                               f"recordings under the directories the operator allowed ({len(policy.file_roots)}). "
                               "`send` is active: it plans (dry_run) by default and transmits only with dry_run "
                               f"false, ack_active true, on a channel the operator allowed ({allowed}), and, under "
                               "require_active_ack, after the user confirms.",
                  on_list_tools=list_tools, on_call_tool=call_tool)


@contextmanager
def _claim_stdin() -> Iterator[int]:
    """Move the protocol off fd 0 for the serve: yield a private duplicate; fd 0 reads the null device.

    Anything that reads stdin while serving (a prompt) reads end-of-file
    instead of protocol bytes. fd 0 is restored on exit.
    """
    wire = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    try:
        yield wire
    finally:
        os.dup2(wire, 0)
        os.close(wire)


async def _wire_lines(fd: int) -> Any:
    """Yield the protocol's lines (str, no newline) from ``fd`` until end-of-file; skip blank lines.

    Waits with ``anyio.wait_readable``, so a signal's cancellation stops it at
    once (a reader thread blocked in ``readline`` would keep the process alive).
    A file that cannot be polled (a regular file) is read directly: its reads do not block.
    """
    import anyio

    pending = b""
    pollable = True
    while True:
        if pollable:
            try:
                await anyio.wait_readable(fd)
            except OSError:
                pollable = False
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode("utf-8", errors="replace")
    if pending.strip():
        yield pending.decode("utf-8", errors="replace")


async def _serve_stdio(policy: ServerPolicy) -> str:
    import signal

    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(policy)
    stopped_by = "eof"
    handled = (signal.SIGINT, signal.SIGTERM)
    saved = {signum: signal.getsignal(signum) for signum in handled}
    try:
        async with anyio.create_task_group() as group:

            async def watch_signals(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
                nonlocal stopped_by
                with anyio.open_signal_receiver(*handled) as received:
                    task_status.started()
                    async for signum in received:
                        stopped_by = signal.Signals(signum).name
                        group.cancel_scope.cancel()
                        return

            await group.start(watch_signals)
            with _claim_stdin() as wire:
                async with stdio_server(stdin=_wire_lines(wire)) as (read_stream, write_stream):
                    await server.run(read_stream, write_stream, server.create_initialization_options())
            group.cancel_scope.cancel()
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return stopped_by


def serve_stdio(policy: ServerPolicy | None = None) -> str:
    """Serve MCP under ``policy`` on this process's stdin/stdout until end-of-file, SIGINT or SIGTERM.

    Returns what stopped it: ``"eof"``, ``"SIGINT"`` or ``"SIGTERM"`` (the
    CLI exits 0 for each). While serving, fd 0 reads the null device and fd 1
    writes to stderr (the SDK's claim), so stray reads and prints miss the
    wire; both are restored on return, and so are the SIGINT/SIGTERM
    handlers. A tool call in progress finishes first (it is bounded).
    Must run in the main thread (signal handlers).
    """
    import anyio

    return anyio.run(_serve_stdio, ServerPolicy() if policy is None else policy)
