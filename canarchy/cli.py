"""canarchy's command-line interface: one parser, one error boundary; output through :mod:`canarchy.output`.

Each module of :data:`COMMAND_GROUPS` exposes ``add_parser(subparsers, parent)``; the defaults its leaf
parsers set (``command``, ``handler``, ``takes_channel`` ...) are listed in ``docs/design/cli.md``
("Adding a command"). Exit codes: 0 ok, 1 user/input error, 2 transport error, 3 decode/schema error;
141 when the reader of the output went away.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import TextIO
from collections.abc import Callable, Iterator, Sequence

from canarchy.errors import (COMMAND_WARNINGS, EXIT_OK, EXIT_OUTPUT_CLOSED, CanarchyError, TransportError,
                             UserInputError)
from canarchy import __version__
from canarchy.fileio import write_failure_hint
from canarchy.output import OUTPUT_FORMATS, CommandResult, OutputClosed, OutputFailed, Printer, terminal_safe

#: The one command table: each top-level command and the module in
#: ``canarchy/commands/`` that registers it, in help order. A command line naming
#: one of these imports and builds that module's parser only (start-up time:
#: ``docs/benchmarks.md``); anything else (``--help``, no command, an unknown
#: one) gets the full parser.
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
#: The command modules, each once, in the order of :data:`COMMAND_GROUPS`.
COMMAND_MODULES = tuple(dict.fromkeys(COMMAND_GROUPS.values()))


class _ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become ``INVALID_ARGUMENTS`` (exit 1).

    argparse's own behaviour (usage on stderr, exit 2) would collide with the
    transport exit code and ignore ``--json``.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentsError(
            "INVALID_ARGUMENTS",
            f"{self.prog}: {message}",
            f"Run `{self.prog} --help` for the accepted arguments.",
            self.prog,
        )

    def _print_message(self, message: str, file: TextIO | None = None) -> None:
        """``--help`` and ``--version`` (argparse ignores a failed write, then exits 0): written and flushed
        now, a closed pipe or a full disk reported as for any other output."""
        if not message:
            return
        from canarchy.output import OutputClosed, OutputFailed

        file = file or sys.stdout
        try:
            file.write(message)
            file.flush()
        except BrokenPipeError:
            raise OutputClosed from None
        except OSError as exc:
            raise OutputFailed(exc) from None

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but an argument no parser knows is named with the command it was given to (argparse
        says it as the top level: ``canarchy: unrecognized arguments``)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            prog = f"{self.prog} {parsed.command}" if getattr(parsed, "command", None) else self.prog
            raise _ArgumentsError("INVALID_ARGUMENTS", f"{prog}: unrecognized arguments: {' '.join(extra)}",
                                  f"Run `{prog} --help` for the accepted arguments.", prog)
        return parsed


class _ArgumentsError(UserInputError):
    """``INVALID_ARGUMENTS`` of a parser; ``command``: the command it parsed for (``uds scan``), "canarchy" at the
    top level, for the envelope."""

    def __init__(self, code: str, message: str, hint: str, prog: str) -> None:
        super().__init__(code, message, hint)
        self.command = prog.removeprefix("canarchy ") or prog


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
        if token == "--version":
            return ()  # argparse prints it and exits before any command is parsed
        if token in ("-h", "--help", "--"):
            break
        if token.startswith("-"):  # the top-level parser has flags only (--json, --jsonl, --text)
            continue
        module = COMMAND_GROUPS.get(token)
        if module is not None:
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

    Order: a channel typed on the command line (``"cli"``); else nothing, for a form that opens no bus
    (``channel_unused``: ``capture --file``, which reads no setting either); else the configured
    default interface, ``[transport].default_interface`` or
    ``CANARCHY_DEFAULT_INTERFACE`` (``"config"``); else nothing, if the command
    has a no-interface form (``no_interface_ok``); else ``INTERFACE_REQUIRED`` (exit 1).

    The guard ``nox -s mutation-530`` reverts: ``uds services`` is active only when a channel is typed on
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
    channel_unused = getattr(args, "channel_unused", None)
    if channel_unused is not None and channel_unused(args):  # a form that opens no bus (capture --file)
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


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises ``KeyboardInterrupt("SIGTERM")``, so a stream
    ends on it as on Ctrl+C (main thread only; the previous handler comes back)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _file_size_limit_as_error() -> Iterator[None]:
    """Within the block a write past the file size limit (``ulimit -f``) fails with EFBIG
    instead of SIGXFSZ ending the process (main thread only; the previous handler comes back)."""
    sigxfsz = getattr(signal, "SIGXFSZ", None)
    if sigxfsz is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(sigxfsz, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(sigxfsz, previous)


def output_failed(reason: OSError | None) -> TransportError:
    """``OUTPUT_WRITE_FAILED`` (exit 2): standard output cannot be written (``reason`` None: it is closed)."""
    why = "it is closed" if reason is None else (reason.strerror or str(reason))
    return TransportError("OUTPUT_WRITE_FAILED", f"Cannot write the output to standard output: {why}.",
                          write_failure_hint(reason, "standard output (where it is redirected to)"))


def _report_on_stderr(error: CanarchyError) -> int:
    """Write ``error`` as one line on stderr (when stderr can be written); return its exit code."""
    stderr = sys.stderr
    if stderr is not None:
        try:
            stderr.write(terminal_safe(f"canarchy: error: {error.code}: {error.message} hint: {error.hint}") + "\n")
            stderr.flush()
        except (OSError, ValueError):
            pass
    return error.exit_code


def _silence(out: TextIO) -> None:
    """Point ``out``'s file descriptor at the null device, so that flushing it at
    interpreter exit does not fail again on the closed pipe."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run one canarchy command; return its exit code (0, 1, 2, 3; 141 for a closed output).

    The single error boundary: a ``CanarchyError`` becomes an envelope error; an output that
    cannot be written (closed, a full disk) becomes ``OUTPUT_WRITE_FAILED`` on stderr;
    nothing else is caught, so a bug still shows its traceback. Ctrl+C or
    SIGTERM ends the command; what it streamed is closed with the envelope.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    out = stdout if stdout is not None else sys.stdout
    if out is None:  # started with standard output closed (`>&-`): nothing could be reported
        return _report_on_stderr(output_failed(None))
    printer = Printer(_requested_format(argv), out, err=stderr)
    result: CommandResult | None = None
    error: CanarchyError | None = None
    config_warnings: list[str] = []
    token = COMMAND_WARNINGS.set(config_warnings)  # unknown keys of the config file, as it is read
    try:
        with _terminate_as_interrupt(), _file_size_limit_as_error():
            try:
                args = build_parser(argv).parse_args(argv)
                printer.fmt = getattr(args, "output", printer.fmt)
                printer.command = args.command
                printer.render_text = getattr(args, "render_text", None)
                printer.render_event = getattr(args, "render_event", None)
                args.printer = printer
                normalize = getattr(args, "normalize", None)
                if normalize is not None:
                    normalize(args)
                prepare_args(args)
                result = args.handler(args)
            except CanarchyError as exc:
                error = exc
                if isinstance(exc, _ArgumentsError):
                    printer.command = exc.command
            except KeyboardInterrupt:
                pass  # interrupted before it could report: the printer closes what was streamed
            finally:
                COMMAND_WARNINGS.reset(token)
            if result is not None and config_warnings:
                result.warnings[:0] = config_warnings
            printer.finish(result, error)
    except OutputClosed:
        _silence(out)
        return EXIT_OUTPUT_CLOSED
    except OutputFailed as exc:  # a full disk, a file size limit: said on stderr, stdout is past use
        _silence(out)
        if error is not None:  # the command's own error, which the output could not carry
            _report_on_stderr(error)
        return _report_on_stderr(output_failed(exc.reason))
    if error is None and printer.events is not None and printer.events.cut_short:  # a finite job not finished
        return 128 + signal.Signals[printer.events.stopped_by].value
    return EXIT_OK if error is None else error.exit_code
