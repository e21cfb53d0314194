"""canarchy's MCP server: canarchy commands as Model Context Protocol tools (``canarchy mcp serve``).

Every tool builds a canarchy argv, runs it in this process through
``canarchy.cli.main(argv, stdout=buffer)`` with ``--json``, and answers with
the command's envelope ``{ok, command, data, warnings, errors}``: as
``structuredContent`` and as the JSON text of the one content block. A tool
error is an envelope with ``ok = false`` and ``isError = true``. Shapes, the
registry and safety rules: ``docs/mcp.md``.

Three kinds of tool (:data:`TOOLS`):

- **reference** (:data:`REFERENCE_ONLY_TOOLS`): ``config_show``,
  ``uds_services``, ``j1939_pgn``, ``j1939_spn``, ``j1587_pid``,
  ``j2497_mid``, ``dbc_cache_list``, ``skills_cache_list``, ``session_show``.
  Their input schemas have no channel, interface, acknowledgement or dry-run
  property, and the argv built for each is checked before it runs
  (:func:`check_reference_argv`): a channel positional for ``uds services``,
  ``--ack-active``, ``--dry-run`` or an active command word is
  ``REFERENCE_ONLY_TOOL_VIOLATION`` and nothing runs.
- **bus**: ``capture`` (listen only), bounded by a required ``count``
  (1..1000 frames) and a ``timeout`` gap of at most 10 s.
- **active**: ``send``. ``dry_run`` defaults to true. Transmitting needs
  ``dry_run: false`` *and* ``ack_active: true``; without the acknowledgement
  the answer is ``ACTIVE_TRANSMIT_REQUIRES_ACK`` (exit-1 class) and no command
  runs. With it the command runs with ``--ack-active`` inside
  :func:`canarchy.active.caller_acknowledged` (context-local): the gate asks
  no ``YES`` on stdin, which is the protocol, and no environment variable or
  other process-wide state is set.

The module imports neither python-can nor the MCP SDK at import time: the
registry, :func:`build_argv`, :func:`check_reference_argv` and
:func:`run_tool` are plain Python; :func:`build_server` and
:func:`serve_stdio` import the SDK (``mcp`` >= 2: ``mcp.server.lowlevel``).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from canarchy import __version__, cli, output
from canarchy.active import caller_acknowledged
from canarchy.errors import CanarchyError, UserInputError

SERVER_NAME = "canarchy"

#: Largest ``count`` the ``capture`` tool accepts (frames).
CAPTURE_MAX_COUNT = 1000
#: Largest ``timeout`` the ``capture`` tool accepts (seconds without a frame).
CAPTURE_MAX_TIMEOUT = 10.0

#: Input properties a reference-only tool may never declare.
FORBIDDEN_REFERENCE_PROPERTIES = frozenset({"channel", "interface", "ack_active", "dry_run"})
#: Words of commands a reference-only tool must never run: they transmit on a bus
#: (send, fuzz guided), listen to one (capture) or write state (prune, save, load).
ACTIVE_COMMAND_WORDS = frozenset({"send", "fuzz", "guided", "capture", "prune", "save", "load"})
#: Flags that make a command active or plan active traffic.
ACTIVE_FLAGS = ("--ack-active", "--dry-run")

_OUTPUT_FLAG = "--json"

# A number as canarchy's parsers read it: decimal or 0x-hex. No sign: a token
# starting with "-" would be read by argparse as an option.
_NUMBER_PATTERN = r"^(0[xX][0-9A-Fa-f]+|[0-9]+)$"
# A python-can channel: can0, vcan0, PCAN_USBBUS1, /dev/ttyACM0@115200 ... Never
# a bare number (the CLI's `send ID DATA` form relies on that) and never "-...".
_CHANNEL_PATTERN = r"^[A-Za-z/][A-Za-z0-9_.:/@-]{0,127}$"
# A payload as `send` reads it: hex digits, optionally 0x-prefixed, with spaces, colons or dots.
_DATA_PATTERN = r"^((0[xX])?[0-9A-Fa-f][0-9A-Fa-f :.]{0,254})?$"

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


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool: its name, the canarchy command it runs and its input schema.

    ``kind``: ``"reference"`` (offline lookups), ``"bus"`` (listens to a
    channel) or ``"active"`` (transmits). ``command``: the command words, e.g.
    ``("j1939", "pgn")``. ``positionals``: input properties passed, in order,
    as positional arguments after the command words. ``properties`` and
    ``required``: the JSON Schema of the input (an object; no other keys
    allowed).
    """

    name: str
    kind: str
    command: tuple[str, ...]
    description: str
    properties: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    positionals: tuple[str, ...] = ()

    @property
    def command_name(self) -> str:
        """The envelope's ``command`` value, e.g. ``"j1939 pgn"``."""
        return " ".join(self.command)

    def input_schema(self) -> dict[str, Any]:
        """The tool's JSON Schema input (``type: object``, ``additionalProperties: false``)."""
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {name: dict(prop) for name, prop in self.properties.items()},
            "additionalProperties": False,
        }
        if self.required:
            schema["required"] = list(self.required)
        return schema


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call produced: the CLI's exit code (0-3) and the envelope dict."""

    exit_code: int
    envelope: dict[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.envelope.get("ok"))


def _number(description: str) -> dict[str, Any]:
    return {"type": ["integer", "string"], "minimum": 0, "pattern": _NUMBER_PATTERN, "description": description}


_TOOL_LIST = (
    ToolSpec("config_show", "reference", ("config", "show"),
             "Show every canarchy setting with its value and source (env, file, default) and the config file read."),
    ToolSpec("uds_services", "reference", ("uds", "services"),
             "The ISO 14229-1 UDS service catalog (SID, name, positive response SID, category, subfunction). "
             "Reference only: never probes a bus, whatever the configured default interface."),
    ToolSpec("j1939_pgn", "reference", ("j1939", "pgn"),
             "Describe a SAE J1939 parameter group (PGN) and the SPNs it carries.",
             {"pgn": _number("PGN, decimal or 0x-hex (0..0x3FFFF), e.g. 61444 or \"0xF004\"")},
             ("pgn",), ("pgn",)),
    ToolSpec("j1939_spn", "reference", ("j1939", "spn"),
             "Describe a SAE J1939 suspect parameter (SPN): PGN, position, scaling, unit.",
             {"spn": _number("SPN, decimal or 0x-hex (0..524287), e.g. 190")}, ("spn",), ("spn",)),
    ToolSpec("j1587_pid", "reference", ("j1587", "pid"),
             "Describe a SAE J1587 parameter identifier (PID).",
             {"pid": _number("PID, decimal or 0x-hex (0..511; 256-511 are page 2), e.g. 84")}, ("pid",), ("pid",)),
    ToolSpec("j2497_mid", "reference", ("j2497", "mid"),
             "Name a J1587/J2497 message identifier (MID).",
             {"mid": _number("MID, decimal or 0x-hex (0..255), e.g. 137")}, ("mid",), ("mid",)),
    ToolSpec("dbc_cache_list", "reference", ("dbc", "cache", "list"),
             "List the providers and files in the local DBC cache."),
    ToolSpec("skills_cache_list", "reference", ("skills", "cache", "list"),
             "List the providers and files in the local skills cache."),
    ToolSpec("session_show", "reference", ("session", "show"),
             "Show the active session and the saved ones of the server's working directory."),
    ToolSpec("capture", "bus", ("capture",),
             "Capture at most `count` frames from a CAN channel (listen only; nothing is sent). Stops after "
             f"`count` frames or `timeout` seconds without a frame (default {CAPTURE_MAX_TIMEOUT:g}).",
             {"channel": {"type": "string", "pattern": _CHANNEL_PATTERN, "description": "CAN channel, e.g. can0"},
              "count": {"type": "integer", "minimum": 1, "maximum": CAPTURE_MAX_COUNT,
                        "description": f"frames to capture at most (1..{CAPTURE_MAX_COUNT})"},
              "timeout": {"type": "number", "minimum": 0, "maximum": CAPTURE_MAX_TIMEOUT,
                          "description": f"seconds without a frame that end the capture (0..{CAPTURE_MAX_TIMEOUT:g})"}},
             ("channel", "count")),
    ToolSpec("send", "active", ("send",),
             "ACTIVE: send one CAN frame. Plans only (dry run) unless dry_run is false; transmitting also needs "
             "ack_active: true, else the answer is ACTIVE_TRANSMIT_REQUIRES_ACK and nothing is sent.",
             {"channel": {"type": "string", "pattern": _CHANNEL_PATTERN, "description": "CAN channel, e.g. can0"},
              "arbitration_id": _number("arbitration ID, e.g. \"0x123\" or 291; above 0x7FF a 29-bit ID"),
              "data": {"type": "string", "pattern": _DATA_PATTERN, "default": "",
                       "description": "payload as hex, e.g. \"0210\" or \"02:10\" (at most 64 bytes)"},
              "ack_active": {"type": "boolean", "default": False,
                             "description": "acknowledge that this call transmits on the bus"},
              "dry_run": {"type": "boolean", "default": True,
                          "description": "plan only, send nothing (the default)"}},
             ("channel", "arbitration_id")),
)

#: Every tool, by name, in listing order.
TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in _TOOL_LIST}
#: The registry of reference-only tools: everything but ``capture`` and ``send``.
REFERENCE_ONLY_TOOLS: frozenset[str] = frozenset(name for name, spec in TOOLS.items() if spec.kind == "reference")


def _check_registry() -> None:
    """Fail at import if a reference-only tool declares a bus or active input."""
    for name in REFERENCE_ONLY_TOOLS:
        declared = set(TOOLS[name].properties)
        if declared & FORBIDDEN_REFERENCE_PROPERTIES:
            raise RuntimeError(f"reference-only MCP tool {name!r} declares {sorted(declared & FORBIDDEN_REFERENCE_PROPERTIES)}")


_check_registry()

# One canarchy command at a time: commands share the process's cwd and stderr.
_COMMAND_LOCK = threading.Lock()


# --- input validation --------------------------------------------------------------------------


def _bad_input(spec: ToolSpec, message: str) -> UserInputError:
    return UserInputError("INVALID_ARGUMENTS", f"Tool {spec.name!r}: {message}",
                          f"List the tools and follow `{spec.name}`'s input schema: types, ranges and patterns "
                          "are enforced and no other properties are accepted.")


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def validate_arguments(spec: ToolSpec, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check ``arguments`` against ``spec``'s input schema; return them with defaults filled in.

    Enforces ``required``, ``additionalProperties: false``, ``type``,
    ``minimum``/``maximum`` (numbers) and ``pattern`` (strings).
    Raises ``UserInputError`` ``INVALID_ARGUMENTS`` naming the property.
    """
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise _bad_input(spec, "arguments must be a JSON object.")
    unknown = sorted(set(arguments) - set(spec.properties))
    if unknown:
        raise _bad_input(spec, f"unknown propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}.")
    missing = [name for name in spec.required if name not in arguments]
    if missing:
        raise _bad_input(spec, f"missing required {', '.join(missing)}.")
    values: dict[str, Any] = {}
    for name, prop in spec.properties.items():
        if name not in arguments:
            if "default" in prop:
                values[name] = prop["default"]
            continue
        value = arguments[name]
        kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        if not any(_type_ok(value, kind) for kind in kinds):
            raise _bad_input(spec, f"{name} must be {' or '.join(kinds)}, not {type(value).__name__}.")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in prop and value < prop["minimum"]:
                raise _bad_input(spec, f"{name} {value} is below the minimum {prop['minimum']}.")
            if "maximum" in prop and value > prop["maximum"]:
                raise _bad_input(spec, f"{name} {value} is above the maximum {prop['maximum']}.")
        if isinstance(value, str) and "pattern" in prop and not re.fullmatch(prop["pattern"], value):
            raise _bad_input(spec, f"{name} {value!r} does not match {prop['pattern']}.")
        values[name] = value
    return values


# --- argv -----------------------------------------------------------------------------------------


def build_argv(name: str, arguments: Mapping[str, Any]) -> list[str]:
    """The canarchy argv for tool ``name`` with validated ``arguments`` (``--json`` included).

    ``capture``: ``capture CHANNEL --count N [--timeout S]``; ``send``:
    ``send CHANNEL ID DATA`` plus ``--dry-run`` and/or ``--ack-active`` as
    asked; every other tool: its command words, then its positionals.
    """
    spec = TOOLS[name]
    argv = list(spec.command)
    if name == "capture":
        argv += [arguments["channel"], "--count", str(arguments["count"])]
        # A capture now runs until stopped; the tool is always bounded by an idle timeout.
        timeout = arguments.get("timeout")
        argv += ["--timeout", repr(float(CAPTURE_MAX_TIMEOUT if timeout is None else timeout))]
    elif name == "send":
        # The tool's ID is decimal or 0x-hex; the command line's is hex (can-utils), so pass 0x form.
        raw = str(arguments["arbitration_id"]).strip()
        number = int(raw, 16) if raw.lower().startswith("0x") else int(raw, 10)
        argv += [arguments["channel"], f"0x{number:X}", arguments.get("data", "")]
        if arguments.get("dry_run", True):
            argv.append("--dry-run")
        if arguments.get("ack_active", False):
            argv.append("--ack-active")
    else:
        argv += [str(arguments[positional]) for positional in spec.positionals]
    return argv + [_OUTPUT_FLAG]


def _is_active_flag(token: str) -> bool:
    """True for ``--ack-active``, ``--dry-run`` and any abbreviation argparse would expand to them."""
    bare = token.split("=", 1)[0]
    return bare.startswith("--") and len(bare) > 2 and any(flag.startswith(bare) for flag in ACTIVE_FLAGS)


def check_reference_argv(spec: ToolSpec, argv: Sequence[str]) -> None:
    """Check that ``argv`` is a reference-only run of ``spec``'s command; raise otherwise.

    Rejected: an argv that does not start with the tool's command words; a
    channel (any positional) for ``uds services``; more positionals than the
    tool declares; ``--ack-active``, ``--dry-run`` or an abbreviation of them;
    any flag but ``--json``; an active command word (:data:`ACTIVE_COMMAND_WORDS`)
    anywhere. Raises ``UserInputError`` ``REFERENCE_ONLY_TOOL_VIOLATION``.
    """
    argv = [str(token) for token in argv]
    words = list(spec.command)
    problems = []
    if argv[:len(words)] != words:
        problems.append(f"it does not start with `{spec.command_name}`")
    rest = argv[len(words):]
    positionals = [token for token in rest if not token.startswith("-")]
    if spec.command == ("uds", "services") and positionals:
        problems.append(f"a channel positional ({positionals[0]!r}) would make `uds services` active")
    elif len(positionals) > len(spec.positionals):
        problems.append(f"unexpected positionals {positionals[len(spec.positionals):]!r}")
    for token in argv:
        if _is_active_flag(token):
            problems.append(f"active flag {token!r}")
        elif token.startswith("-") and token != _OUTPUT_FLAG:
            problems.append(f"unexpected option {token!r}")
        if token in ACTIVE_COMMAND_WORDS:
            problems.append(f"active command word {token!r}")
    if problems:
        raise UserInputError(
            "REFERENCE_ONLY_TOOL_VIOLATION",
            f"Reference-only tool {spec.name!r} built {argv!r}: {'; '.join(problems)}. Nothing was run.",
            "This is a bug in canarchy's MCP server, stopped before it reached a bus; report it. "
            "Use the `send` tool (with ack_active) for active work.",
        )


def _requires_ack() -> UserInputError:
    return UserInputError(
        "ACTIVE_TRANSMIT_REQUIRES_ACK",
        "`send` with dry_run false transmits on the bus and ack_active was not true. Nothing was sent.",
        "Call `send` with ack_active: true to transmit, or leave dry_run true (the default) to plan only.",
    )


def _check_active_argv(arguments: Mapping[str, Any], argv: Sequence[str]) -> None:
    """Fail closed (``ACTIVE_TRANSMIT_REQUIRES_ACK``) unless ``argv`` transmits only when the
    call acknowledged it: without ``ack_active`` it must plan (``--dry-run``) and carry no ``--ack-active``."""
    acknowledged = bool(arguments.get("ack_active"))
    if not acknowledged and ("--dry-run" not in argv or "--ack-active" in argv):
        raise _requires_ack()


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


def run_tool(name: str, arguments: Mapping[str, Any] | None = None) -> ToolOutcome:
    """Run one tool in this process; return its exit code and envelope.

    Order: look the tool up (``MCP_UNKNOWN_TOOL``), validate the arguments
    (``INVALID_ARGUMENTS``), refuse an unacknowledged transmission
    (``ACTIVE_TRANSMIT_REQUIRES_ACK``), build the argv (:func:`build_argv`),
    check it (:func:`check_reference_argv` for reference-only tools), then
    ``canarchy.cli.main(argv)``. Each refusal is an error envelope with exit
    code 1, and nothing has run. Exceptions other than ``CanarchyError`` (bugs)
    propagate.
    """
    spec = TOOLS.get(name)
    if spec is None:
        return _failure("mcp", UserInputError(
            "MCP_UNKNOWN_TOOL", f"There is no tool named {name!r}.",
            f"List the tools; canarchy serves {', '.join(TOOLS)}."))
    try:
        values = validate_arguments(spec, arguments)
        if spec.kind == "active" and not values["dry_run"] and not values["ack_active"]:
            raise _requires_ack()
        argv = build_argv(name, values)
        if name in REFERENCE_ONLY_TOOLS:
            check_reference_argv(spec, argv)
        elif spec.kind == "active":
            _check_active_argv(values, argv)
        elif list(argv[:len(spec.command)]) != list(spec.command):
            raise UserInputError("INVALID_ARGUMENTS", f"Tool {name!r} built {argv!r}.",
                                 "This is a bug in canarchy's MCP server; report it.")
    except CanarchyError as exc:
        return _failure(spec.command_name, exc)
    acknowledged = spec.kind == "active" and "--ack-active" in argv and "--dry-run" not in argv
    return _execute(argv, acknowledged)


def _run_tool_reporting_bugs(name: str, arguments: Mapping[str, Any] | None) -> ToolOutcome:
    """:func:`run_tool`, with a bug reported as an ``INTERNAL_ERROR`` envelope (traceback on stderr)."""
    try:
        return run_tool(name, arguments)
    except Exception as exc:  # the server must answer; the traceback goes to the server's log
        traceback.print_exc(file=sys.stderr)
        spec = TOOLS.get(name)
        return _failure(spec.command_name if spec else "mcp", CanarchyError(
            "INTERNAL_ERROR", f"Tool {name!r} failed: {type(exc).__name__}: {exc}",
            "This is a bug in canarchy; the traceback is on the MCP server's stderr. Please report it."))


# --- the MCP server (imports the SDK) -----------------------------------------------------------------


def _annotations(spec: ToolSpec, types: Any) -> Any:
    if spec.kind == "reference":
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


def build_server(runner: Callable[[str, Mapping[str, Any] | None], ToolOutcome] | None = None) -> Any:
    """Return an ``mcp.server.lowlevel.Server`` serving :data:`TOOLS` (not started).

    ``runner`` runs one call (default: :func:`run_tool`, with bugs reported as
    ``INTERNAL_ERROR``); it runs in a worker thread so a capture does not stall
    the protocol. Building the server touches no process-wide state.
    """
    import anyio
    import mcp.types as types
    from mcp.server.lowlevel import Server

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
        outcome = await anyio.to_thread.run_sync(run, params.name, params.arguments)
        return tool_result(outcome, types)

    return Server(SERVER_NAME, version=__version__,
                  instructions="canarchy CAN toolkit. Reference tools never touch a bus. `send` is active: it "
                               "plans (dry_run) by default and transmits only with dry_run false and ack_active true.",
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


async def _serve_stdio() -> str:
    import signal

    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server()
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


def serve_stdio() -> str:
    """Serve MCP on this process's stdin/stdout until end-of-file, SIGINT or SIGTERM.

    Returns what stopped it: ``"eof"``, ``"SIGINT"`` or ``"SIGTERM"`` (the
    CLI exits 0 for each). While serving, fd 0 reads the null device and fd 1
    writes to stderr (the SDK's claim), so stray reads and prints miss the
    wire; both are restored on return, and so are the SIGINT/SIGTERM
    handlers. A tool call in progress finishes first (it is bounded).
    Must run in the main thread (signal handlers).
    """
    import anyio

    return anyio.run(_serve_stdio)
