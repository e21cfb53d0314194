"""The MCP tools' catalogue, and a tool call turned into a checked canarchy command line.

Each :class:`ToolSpec` names a tool's kind, its command words and its JSON Schema input (:data:`TOOLS`).
A call's arguments are validated (:func:`validate_arguments`), its paths kept inside the directories the
operator allowed (:class:`ServerPolicy`, :func:`resolve_paths`), and the argv built (:func:`build_argv`) and,
for a reference or file tool, checked to touch no bus (:func:`check_argv`). Rules: ``docs/mcp.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

from canarchy.errors import UserInputError

#: Largest ``count`` the ``capture`` tool accepts (frames).
CAPTURE_MAX_COUNT = 1000
#: Largest ``timeout`` the ``capture`` tool accepts (seconds without a frame).
CAPTURE_MAX_TIMEOUT = 10.0
#: Events a file tool returns by default, and at most (``limit``).
FILE_EVENTS_DEFAULT = 200
FILE_EVENTS_MAX = 1000

#: Input properties a reference-only tool may never declare.
FORBIDDEN_REFERENCE_PROPERTIES = frozenset({"channel", "interface", "ack_active", "dry_run"})
#: Words of commands a reference-only tool must never run: they transmit on a bus
#: (send, fuzz guided, generate, simulate, scan), listen to one (capture) or write state (prune, save, load).
ACTIVE_COMMAND_WORDS = frozenset({"send", "fuzz", "guided", "capture", "prune", "save", "load", "generate",
                                  "simulate", "scan", "dids", "web"})
#: Flags that make a command active or plan active traffic.
ACTIVE_FLAGS = ("--ack-active", "--dry-run")

_OUTPUT_FLAG = "--json"

# A number as canarchy's parsers read it: decimal or 0x-hex. No sign: a token
# starting with "-" would be read by argparse as an option.
_NUMBER_PATTERN = r"^(0[xX][0-9A-Fa-f]+|[0-9]+)$"
# A python-can channel: can0, vcan0, PCAN_USBBUS1, /dev/ttyACM0@115200, udp_multicast's group (ff01::6361:6e61,
# 239.74.163.2) ... Never a bare number (the CLI's `send ID DATA` form relies on that) and never "-...".
CHANNEL_PATTERN = r"^([A-Za-z/][A-Za-z0-9_.:/@-]{0,127}|[0-9]{1,3}(\.[0-9]{1,3}){3})$"
# A payload as `send` reads it: hex digits, optionally 0x-prefixed, with spaces, colons or dots.
_DATA_PATTERN = r"^((0[xX])?[0-9A-Fa-f][0-9A-Fa-f :.]{0,254})?$"
# A path inside an allowed directory: relative or absolute, never "-..." nor empty.
_PATH_PATTERN = r"^[^-\x00][^\x00]{0,4095}$"


@dataclass(frozen=True)
class ServerPolicy:
    """What the person who started the server allowed (``mcp serve --files DIR --allow-active CH``).

    ``file_roots``: directories whose files the file tools may read (resolved,
    absolute); ``active_channels``: channels the active tools may transmit on.
    The default allows neither.
    """

    file_roots: tuple[Path, ...] = ()
    active_channels: frozenset[str] = frozenset()

    @classmethod
    def build(cls, files: Iterable[str] = (), allow_active: Iterable[str] = ()) -> ServerPolicy:
        """Check and resolve the operator's options. Raises ``UserInputError``
        ``MCP_FILES_INVALID`` (a directory that does not exist) or ``INVALID_ARGUMENTS`` (a bad channel)."""
        import re

        roots = []
        for text in files:
            path = Path(text).expanduser()
            if not path.is_dir():
                raise UserInputError("MCP_FILES_INVALID", f"--files {text!r} is not a directory.",
                                     "Give an existing directory that holds the recordings an agent may read.")
            roots.append(path.resolve())
        channels = frozenset(allow_active)
        for channel in sorted(channels):
            if not re.fullmatch(CHANNEL_PATTERN, channel):
                raise UserInputError("INVALID_ARGUMENTS", f"--allow-active {channel!r} is not a channel name.",
                                     "Name one channel per --allow-active, e.g. --allow-active can0.")
        return cls(tuple(dict.fromkeys(roots)), channels)


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool: its name, the canarchy command it runs and its input schema.

    ``kind``: ``"reference"`` (offline lookups), ``"file"`` (reads a recording
    under an allowed directory), ``"bus"`` (listens to a channel) or
    ``"active"`` (transmits). ``command``: the command words, e.g. ``("j1939",
    "pgn")``. ``positionals``: input properties passed, in order, after the
    command words; ``options``: property -> flag, passed in that order (a
    boolean property is the bare flag when true); ``paths``: properties that
    are file paths (resolved and checked against the allowed directories);
    ``flags``: fixed flags always passed (e.g. ``--summary``); ``hex``:
    number properties the command reads as hex (passed in 0x form); ``properties``
    and ``required``: the JSON Schema of the input (an object; no other keys
    allowed).
    """

    name: str
    kind: str
    command: tuple[str, ...]
    description: str
    properties: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    positionals: tuple[str, ...] = ()
    options: Mapping[str, str] = field(default_factory=dict)
    paths: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    hex: tuple[str, ...] = ()

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


def _number(description: str) -> dict[str, Any]:
    return {"type": ["integer", "string"], "minimum": 0, "pattern": _NUMBER_PATTERN, "description": description}


def _path(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": _PATH_PATTERN, "description": description}


_CHANNEL = {"type": "string", "pattern": CHANNEL_PATTERN, "description": "CAN channel, e.g. can0"}


_FILE = _path("recording: a path inside a directory the server was started with (mcp serve --files DIR), "
              "relative to it or absolute; candump .log, .asc, .blf, .trc, .csv ... (optionally .gz)")


_SUMMARY = {"type": "boolean", "default": False, "description": "counts and value ranges only, no events"}


_LIMIT = {"type": "integer", "minimum": 1, "maximum": FILE_EVENTS_MAX, "default": FILE_EVENTS_DEFAULT,
          "description": f"events returned at most (1..{FILE_EVENTS_MAX}); the counts cover the whole file"}


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
    ToolSpec("capture_summary", "file", ("capture",),
             "Summarise a recording: frames, time span, and per arbitration ID the count, rate, period, DLCs "
             "and last data (like `capture --file F --summary`). Reads the file only.",
             {"file": _FILE}, ("file",), options={"file": "--file"}, paths=("file",), flags=("--summary",)),
    ToolSpec("decode_file", "file", ("decode",),
             "Decode a recording's signals with a DBC (cantools; J1939 by PGN, ISO-TP for long messages), like "
             "`decode --file F --dbc DB`. Returns the summary (counts, min/max/last per signal) and up to `limit` "
             "decoded messages.",
             {"file": _FILE, "dbc": _path("signal database (.dbc .kcd .sym .arxml) inside an allowed directory"),
              "j1939": {"type": "boolean", "default": False,
                        "description": "match every 29-bit message by PGN"},
              "summary": _SUMMARY, "limit": _LIMIT},
             ("file", "dbc"), options={"file": "--file", "dbc": "--dbc", "j1939": "--j1939", "summary": "--summary"},
             paths=("file", "dbc")),
    ToolSpec("isotp_decode_file", "file", ("isotp", "decode"),
             "Reassemble a recording's ISO-TP (ISO 15765-2) exchanges on a request/response ID pair into UDS, "
             "OBD-II or KWP2000 messages (the VIN, DTCs ...), like `isotp decode --file F`.",
             {"file": _FILE, "request_id": _number("request arbitration ID (default 0x7E0)"),
              "response_id": _number("response arbitration ID (default 0x7E8)"),
              "summary": _SUMMARY, "limit": _LIMIT},
             ("file",), options={"file": "--file", "request_id": "--request-id", "response_id": "--response-id",
                                 "summary": "--summary"}, paths=("file",), hex=("request_id", "response_id")),
    ToolSpec("j1939_decode_file", "file", ("j1939", "decode"),
             "Decode a recording's SAE J1939 traffic: PGN, source address, SPN values, transport protocol, DM1 "
             "faults, like `j1939 decode --file F`.",
             {"file": _FILE, "pgn": _number("only events of this PGN (the summary covers every frame)"),
              "summary": _SUMMARY, "limit": _LIMIT},
             ("file",), options={"file": "--file", "pgn": "--pgn", "summary": "--summary"}, paths=("file",)),
    ToolSpec("capture", "bus", ("capture",),
             "Capture at most `count` frames from a CAN channel (listen only; nothing is sent). Stops after "
             f"`count` frames or `timeout` seconds without a frame (default {CAPTURE_MAX_TIMEOUT:g}).",
             {"channel": _CHANNEL,
              "count": {"type": "integer", "minimum": 1, "maximum": CAPTURE_MAX_COUNT,
                        "description": f"frames to capture at most (1..{CAPTURE_MAX_COUNT})"},
              "timeout": {"type": "number", "minimum": 0, "maximum": CAPTURE_MAX_TIMEOUT,
                          "description": f"seconds without a frame that end the capture (0..{CAPTURE_MAX_TIMEOUT:g})"}},
             ("channel", "count"), ("channel",), {"count": "--count", "timeout": "--timeout"}),
    ToolSpec("send", "active", ("send",),
             "ACTIVE: send one CAN frame. Plans only (dry run) unless dry_run is false. Transmitting needs "
             "ack_active: true and a channel the person running the server allowed (mcp serve --allow-active CH); "
             "with [safety] require_active_ack that person also confirms each transmission through the client.",
             {"channel": _CHANNEL,
              "arbitration_id": _number("arbitration ID, e.g. \"0x123\" or 291; above 0x7FF a 29-bit ID"),
              "data": {"type": "string", "pattern": _DATA_PATTERN, "default": "",
                       "description": "payload as hex, e.g. \"0210\" or \"02:10\" (at most 64 bytes)"},
              "ack_active": {"type": "boolean", "default": False,
                             "description": "acknowledge that this call transmits on the bus"},
              "dry_run": {"type": "boolean", "default": True,
                          "description": "plan only, send nothing (the default)"}},
             ("channel", "arbitration_id"), ("channel", "arbitration_id", "data"),
             {"dry_run": "--dry-run", "ack_active": "--ack-active"}, hex=("arbitration_id",)),
)


#: Every tool, by name, in listing order.
TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in _TOOL_LIST}


#: Tools that never touch a bus: the reference lookups and the file tools.
REFERENCE_ONLY_TOOLS: frozenset[str] = frozenset(
    name for name, spec in TOOLS.items() if spec.kind in ("reference", "file"))


def _check_registry() -> None:
    """Fail at import if a reference-only tool declares a bus or active input, or an option that is a bus flag."""
    for name in REFERENCE_ONLY_TOOLS:
        spec = TOOLS[name]
        declared = set(spec.properties)
        if declared & FORBIDDEN_REFERENCE_PROPERTIES:
            forbidden = sorted(declared & FORBIDDEN_REFERENCE_PROPERTIES)
            raise RuntimeError(f"reference-only MCP tool {name!r} declares {forbidden}")
        if any(_is_active_flag(flag) for flag in (*spec.options.values(), *spec.flags)):
            raise RuntimeError(f"reference-only MCP tool {name!r} passes an active flag")


def _bad_input(spec: ToolSpec, message: str) -> UserInputError:
    return UserInputError("INVALID_ARGUMENTS", f"Tool {spec.name!r}: {message}",
                          f"List the tools and follow `{spec.name}`'s input schema: types, ranges and patterns "
                          "are enforced and no other properties are accepted.")


def validate_arguments(spec: ToolSpec, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check ``arguments`` against ``spec``'s input schema (jsonschema, JSON Schema 2020-12);
    return them with the schema's defaults filled in.

    Raises ``UserInputError`` ``INVALID_ARGUMENTS`` naming the property and what is wrong.
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise _bad_input(spec, "arguments must be a JSON object.")
    error = best_match(Draft202012Validator(spec.input_schema()).iter_errors(dict(arguments)))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path)
        raise _bad_input(spec, f"{where + ': ' if where else ''}{error.message}.")
    values = dict(arguments)
    for name, prop in spec.properties.items():
        if name not in values and "default" in prop:
            values[name] = prop["default"]
    return values


def resolve_paths(spec: ToolSpec, values: Mapping[str, Any], policy: ServerPolicy) -> dict[str, Any]:
    """``values`` with each path property resolved to an absolute path inside ``policy.file_roots``.

    A relative path is tried under each allowed directory in order (the first
    where it exists wins, else the first). ``..`` and symbolic links are
    resolved first, so neither leads out. Raises ``UserInputError``
    ``MCP_FILES_NOT_ALLOWED`` (the server was started without ``--files``) or
    ``MCP_PATH_NOT_ALLOWED`` (the path resolves outside every allowed directory).
    """
    if not spec.paths:
        return dict(values)
    if not policy.file_roots:
        raise UserInputError("MCP_FILES_NOT_ALLOWED", f"Tool {spec.name!r} reads files, and this server allows none.",
                             "The person running the server can allow a directory: `canarchy mcp serve --files DIR`.")
    out = dict(values)
    for name in spec.paths:
        if name not in out:
            continue
        raw = Path(out[name]).expanduser()
        options = [raw] if raw.is_absolute() else [root / raw for root in policy.file_roots]
        resolved = [candidate.resolve() for candidate in options]
        chosen = next((path for path in resolved if path.exists()), resolved[0])
        if not any(chosen == root or chosen.is_relative_to(root) for root in policy.file_roots):
            raise UserInputError(
                "MCP_PATH_NOT_ALLOWED",
                f"Tool {spec.name!r}: {name} {out[name]!r} resolves to {chosen}, outside the allowed "
                f"director{'y' if len(policy.file_roots) == 1 else 'ies'} "
                f"{', '.join(str(root) for root in policy.file_roots)}.",
                "Give a path inside an allowed directory (relative to it, or absolute); `..` and symbolic links "
                "that lead out are refused.")
        out[name] = str(chosen)
    return out


def _token(value: Any, prop: Mapping[str, Any], hex_form: bool = False) -> str:
    if prop.get("type") == "number" and not isinstance(value, bool):
        return repr(float(value))
    if hex_form:  # the tool's number is decimal or 0x-hex; this command line reads hex (can-utils): pass 0x form
        return f"0x{tool_number(value):X}"
    return str(value)


def tool_number(value: Any) -> int:
    """A number property's value (an integer, or a string matching ``_NUMBER_PATTERN``) as an int."""
    raw = str(value).strip()
    return int(raw, 16) if raw.lower().startswith("0x") else int(raw, 10)


def build_argv(name: str, arguments: Mapping[str, Any]) -> list[str]:
    """The canarchy argv for tool ``name`` with validated ``arguments`` (``--json`` included):
    the command words, the positionals in order, then each option given (a
    true boolean as its bare flag; a false or absent one not at all)."""
    spec = TOOLS[name]
    argv = list(spec.command)
    argv += [_token(arguments.get(positional, ""), spec.properties[positional], positional in spec.hex)
             for positional in spec.positionals]
    for prop_name, flag in spec.options.items():
        value = arguments.get(prop_name)
        if name == "capture" and prop_name == "timeout" and value is None:
            value = CAPTURE_MAX_TIMEOUT  # a command-line capture runs until stopped; the tool always ends
        if value is None or value is False:
            continue
        argv += [flag] if value is True else [flag, _token(value, spec.properties[prop_name], prop_name in spec.hex)]
    return argv + list(spec.flags) + [_OUTPUT_FLAG]


def _is_active_flag(token: str) -> bool:
    """True for ``--ack-active``, ``--dry-run`` and any abbreviation argparse would expand to them."""
    bare = token.split("=", 1)[0]
    return bare.startswith("--") and len(bare) > 2 and any(flag.startswith(bare) for flag in ACTIVE_FLAGS)


_check_registry()


def check_argv(spec: ToolSpec, argv: Sequence[str], policy: ServerPolicy | None = None) -> None:
    """Check that ``argv`` is a bus-free run of ``spec``'s command (a reference or file tool); raise otherwise.

    Rejected: an argv that does not start with the tool's command words; a
    channel (any positional) for ``uds services``; more positionals than the
    tool declares; ``--ack-active``, ``--dry-run`` or an abbreviation of them;
    any flag but ``--json`` and the tool's own options; an active command word
    (:data:`ACTIVE_COMMAND_WORDS`) anywhere past the command words; a path
    option whose value is not an absolute path inside ``policy.file_roots``.
    Raises ``UserInputError`` ``REFERENCE_ONLY_TOOL_VIOLATION``.
    """
    argv = [str(token) for token in argv]
    words = list(spec.command)
    problems = []
    if argv[:len(words)] != words:
        problems.append(f"it does not start with `{spec.command_name}`")
    positionals = _scan_options(spec, argv[len(words):], policy, problems)
    problems += _positional_problems(spec, positionals)
    problems += [f"active command word {token!r}" for token in argv[len(words):] if token in ACTIVE_COMMAND_WORDS]
    if any(word in ACTIVE_COMMAND_WORDS for word in words) and spec.kind != "file":
        problems.append(f"active command word {words[0]!r}")
    if problems:
        raise UserInputError(
            "REFERENCE_ONLY_TOOL_VIOLATION",
            f"Reference-only tool {spec.name!r} built {argv!r}: {'; '.join(problems)}. Nothing was run.",
            "This is a bug in canarchy's MCP server, stopped before it reached a bus; report it. "
            "Use the `send` tool (with ack_active) for active work.",
        )


def _scan_options(spec: ToolSpec, rest: list[str], policy: ServerPolicy | None, problems: list[str]) -> list[str]:
    """Walk the tokens after the command words; append each flag problem to ``problems``; return the positionals."""
    flags = {flag: prop for prop, flag in spec.options.items()}
    positionals, index = [], 0
    while index < len(rest):
        token = rest[index]
        index += 1
        if _is_active_flag(token):
            problems.append(f"active flag {token!r}")
        elif token == _OUTPUT_FLAG or token in spec.flags:
            pass
        elif token in flags:
            if spec.properties[flags[token]].get("type") == "boolean":
                continue
            if index >= len(rest):
                problems.append(f"option {token!r} without a value")
                continue
            value = rest[index]
            index += 1
            if flags[token] in spec.paths and not _inside(value, policy):
                problems.append(f"path {value!r} outside the allowed directories")
        elif token.startswith("-"):
            problems.append(f"unexpected option {token!r}")
        else:
            positionals.append(token)
    return positionals


def _positional_problems(spec: ToolSpec, positionals: list[str]) -> list[str]:
    """A channel given to ``uds services``, or more positionals than ``spec`` declares."""
    if spec.command == ("uds", "services") and positionals:
        return [f"a channel positional ({positionals[0]!r}) would make `uds services` active"]
    if len(positionals) > len(spec.positionals):
        return [f"unexpected positionals {positionals[len(spec.positionals):]!r}"]
    return []


def _inside(value: str, policy: ServerPolicy | None) -> bool:
    if policy is None or not os.path.isabs(value):
        return False
    path = Path(value).resolve()
    return any(path == root or path.is_relative_to(root) for root in policy.file_roots)
