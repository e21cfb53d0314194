"""canarchy's command-line interface: one parser, one error boundary, one printer.

Every command module in ``COMMAND_MODULES`` exposes ``add_parser(subparsers,
parent)`` (and has its top-level commands in ``COMMAND_GROUPS``); each leaf
parser it adds sets these defaults:

- ``command``: the envelope's command name, e.g. ``"uds services"``;
- ``handler``: ``handler(args) -> CommandResult``; raises ``CanarchyError``;
- ``takes_channel`` (optional, default False): the command has a ``channel``
  positional and goes through :func:`prepare_args`;
- ``no_interface_ok`` (optional): ``callable(args) -> bool``, true when the
  command has a form that needs no channel (dry runs, reference lookups);
- ``render_text`` (optional): ``callable(CommandResult) -> str`` for ``--text``;
- streaming handlers write event lines to ``args.stdout`` (the stream given
  to :func:`main`), never to ``sys.stdout`` directly;
- ``normalize`` (optional): ``callable(args)`` run before :func:`prepare_args`
  (e.g. to resolve optional positionals that argparse cannot tell apart).

Output (see ``docs/design/cli.md``): ``--text`` (default), ``--json`` (one
envelope, keys sorted), ``--jsonl`` (one event per line where the command has
events, else the envelope on one line). Envelope keys: ``ok``, ``command``,
``data``, ``warnings``, ``errors``. Exit codes: 0 ok, 1 user/input error,
2 transport error, 3 decode/schema error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TextIO

from canarchy.errors import COMMAND_WARNINGS, EXIT_OK, CanarchyError, UserInputError

COMMAND_MODULES = (
    "canarchy.commands.config_cmd",
    "canarchy.commands.bus",
    "canarchy.commands.replay",
    "canarchy.commands.uds",
    "canarchy.commands.fuzz",
    "canarchy.commands.caches",
    "canarchy.commands.reference",
    "canarchy.commands.session",
    "canarchy.commands.mcp",
    "canarchy.commands.decode",
    "canarchy.commands.plugins",
    "canarchy.commands.generate",
    "canarchy.commands.simulate",
    "canarchy.commands.web",
)

#: Top-level command -> the module in ``COMMAND_MODULES`` that registers it. A
#: command line naming one of these imports and builds that module's parser
#: only (start-up time: ``docs/benchmarks.md``); anything else (``--help``, no
#: command, an unknown or unlisted one) gets the full parser.
COMMAND_GROUPS = {
    "config": "canarchy.commands.config_cmd",
    "capture": "canarchy.commands.bus",
    "send": "canarchy.commands.bus",
    "replay": "canarchy.commands.replay",
    "uds": "canarchy.commands.uds",
    "fuzz": "canarchy.commands.fuzz",
    "dbc": "canarchy.commands.caches",
    "skills": "canarchy.commands.caches",
    "j1939": "canarchy.commands.reference",
    "j1587": "canarchy.commands.reference",
    "j2497": "canarchy.commands.reference",
    "session": "canarchy.commands.session",
    "mcp": "canarchy.commands.mcp",
    "decode": "canarchy.commands.decode",
    "isotp": "canarchy.commands.decode",
    "plugins": "canarchy.commands.plugins",
    "generate": "canarchy.commands.generate",
    "simulate": "canarchy.commands.simulate",
    "web": "canarchy.commands.web",
}

OUTPUT_FORMATS = ("text", "json", "jsonl")


@dataclass
class CommandResult:
    """What a handler returns.

    ``data``: the envelope's ``data`` object (JSON-serialisable).
    ``warnings``: human-readable strings, copied into the envelope.
    ``events``: when not None, a list of event dicts (see :func:`make_event`)
    stored as ``data["events"]`` and streamed one per line by ``--jsonl``.
    """

    data: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] | None = None


def make_event(event_type: str, payload: dict[str, Any], source: str, timestamp: float | None = None) -> dict[str, Any]:
    """Build one event ``{event_type, payload, source, timestamp}``.

    ``timestamp`` is seconds since the Unix epoch (float); now when omitted.
    """
    return {
        "event_type": event_type,
        "payload": payload,
        "source": source,
        "timestamp": time.time() if timestamp is None else timestamp,
    }


class _ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become ``INVALID_ARGUMENTS`` (exit 1).

    argparse's own behaviour (usage on stderr, exit 2) would collide with the
    transport exit code and ignore ``--json``.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserInputError(
            "INVALID_ARGUMENTS",
            f"{self.prog}: {message}",
            f"Run `{self.prog} --help` for the accepted arguments.",
        )


def _output_parent() -> argparse.ArgumentParser:
    parent = _ArgumentParser(add_help=False)
    group = parent.add_mutually_exclusive_group()
    for name in OUTPUT_FORMATS:
        group.add_argument(
            f"--{name}",
            dest="output",
            action="store_const",
            const=name,
            default=argparse.SUPPRESS,
            help=f"print {name} output",
        )
    return parent


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Return the argument parser: the full one (every command module registered),
    or, when ``argv`` names a command of ``COMMAND_GROUPS``, one with only the
    module that registers it (the same parse for that command line)."""
    parent = _output_parent()
    parser = _ArgumentParser(prog="canarchy", description="CAN / CAN FD toolkit with typed output.", parents=[parent])
    subparsers = parser.add_subparsers(dest="group", metavar="COMMAND", parser_class=_ArgumentParser)
    subparsers.required = True
    for module_name in _modules_for(argv):
        importlib.import_module(module_name).add_parser(subparsers, parent)
    return parser


def _modules_for(argv: Sequence[str] | None) -> Sequence[str]:
    """The command modules a parse of ``argv`` needs: the one registering the
    first positional token, when ``COMMAND_GROUPS`` knows it and no ``-h``/``--help``
    comes before it; else all of ``COMMAND_MODULES``."""
    for token in argv or ():
        if token in ("-h", "--help", "--"):
            break
        if token.startswith("-"):  # the top-level parser has flags only (--json, --jsonl, --text)
            continue
        module = COMMAND_GROUPS.get(token)
        if module in COMMAND_MODULES:
            return (module,)
        break
    return COMMAND_MODULES


def _requested_format(argv: Sequence[str]) -> str:
    """The output format named in ``argv``, read before parsing so that
    argument errors are reported in the format the user asked for."""
    fmt = "text"
    for token in argv:
        if token == "--":
            break
        if token in ("--json", "--jsonl", "--text"):
            fmt = token[2:]
    return fmt


def prepare_args(args: argparse.Namespace) -> argparse.Namespace:
    """Resolve the channel a command works on; sets ``interface`` and ``interface_source``.

    Order: a channel typed on the command line (``"cli"``); else the configured
    default interface, ``[transport].default_interface`` or
    ``CANARCHY_DEFAULT_INTERFACE`` (``"config"``); else nothing, if the command
    has a no-interface form; else ``INTERFACE_REQUIRED`` (exit 1).

    The #530 guard: ``uds services`` is active only when a channel is typed on
    the command line. Without one (and without ``--dry-run``) it is a reference
    lookup, and the configured default never turns it into bus traffic.

    Raises: ``UserInputError`` (``INTERFACE_REQUIRED``), ``ConfigError``.
    """
    args.interface = None
    args.interface_source = None
    if not getattr(args, "takes_channel", False):
        return args
    if getattr(args, "channel", None):
        args.interface = args.channel
        args.interface_source = "cli"
        return args
    if args.command == "uds services" and not args.dry_run:
        return args
    from canarchy import transport

    default = transport.default_can_interface()
    if default:
        args.interface = default
        args.interface_source = "config"
        return args
    no_interface_ok: Callable[[argparse.Namespace], bool] | None = getattr(args, "no_interface_ok", None)
    if no_interface_ok is not None and no_interface_ok(args):
        return args
    raise UserInputError(
        "INTERFACE_REQUIRED",
        f"`{args.command}` needs a CAN channel and none was given or configured.",
        "Pass a channel (e.g. `can0`) or set `[transport].default_interface` in ~/.canarchy/config.toml "
        "(or CANARCHY_DEFAULT_INTERFACE).",
    )


def envelope(command: str, result: CommandResult | None, error: CanarchyError | None) -> dict[str, Any]:
    """Return the envelope dict ``{ok, command, data, warnings, errors}``."""
    data: dict[str, Any] = {}
    warnings: list[str] = []
    if result is not None:
        data = dict(result.data)
        if result.events is not None:
            data["events"] = result.events
        warnings = list(result.warnings)
    return {
        "ok": error is None,
        "command": command,
        "data": data,
        "warnings": warnings,
        "errors": [error.to_dict()] if error is not None else [],
    }


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)


def _default_text(result: CommandResult) -> str:
    lines = []
    for key in sorted(result.data):
        value = result.data[key]
        if isinstance(value, (dict, list)):
            value = _dumps(value)
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def render(fmt: str, command: str, result: CommandResult | None, error: CanarchyError | None,
           render_text: Callable[[CommandResult], str] | None = None) -> str:
    """Render the outcome of a command as the text to print on stdout (no trailing newline).

    Pure: printing happens only in :func:`main`.
    """
    env = envelope(command, result, error)
    if fmt == "json":
        return json.dumps(env, sort_keys=True, indent=2)
    if fmt == "jsonl":
        if error is None and result is not None and result.events is not None:
            return "\n".join(_dumps(event) for event in result.events)
        return _dumps(env)
    if error is not None:
        return f"error: {error.code}: {error.message}\nhint: {error.hint}"
    assert result is not None
    text = (render_text or _default_text)(result)
    if result.warnings:
        text += "".join(f"\nwarning: {w}" for w in result.warnings)
    return text


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """Run one canarchy command; return its exit code (0, 1, 2 or 3).

    The single error boundary: a ``CanarchyError`` becomes an envelope error;
    nothing else is caught, so a bug still shows its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    out = stdout if stdout is not None else sys.stdout
    fmt = _requested_format(argv)
    command = "canarchy"
    render_text = None
    result: CommandResult | None = None
    error: CanarchyError | None = None
    config_warnings: list[str] = []
    token = COMMAND_WARNINGS.set(config_warnings)  # unknown keys of the config file, as it is read
    try:
        try:
            args = build_parser(argv).parse_args(argv)
            args.stdout = out
            fmt = getattr(args, "output", fmt)
            command = args.command
            render_text = getattr(args, "render_text", None)
            normalize = getattr(args, "normalize", None)
            if normalize is not None:
                normalize(args)
            prepare_args(args)
            result = args.handler(args)
        except CanarchyError as exc:
            error = exc
        except KeyboardInterrupt:
            # Ctrl+C ends a streaming command; what was already printed stands.
            return EXIT_OK
    finally:
        COMMAND_WARNINGS.reset(token)
    if result is not None and config_warnings:
        result.warnings[:0] = config_warnings
    text = render(fmt, command, result, error, render_text)
    if text:
        out.write(text + "\n")
        out.flush()
    return EXIT_OK if error is None else error.exit_code
