"""``capture`` and ``send``: frames from and to a CAN channel."""

from __future__ import annotations

import argparse
import itertools

from canarchy.active import active_gate, add_active_arguments
from canarchy.commands._common import parse_arbitration_id, parse_hex_data, parse_int
from canarchy.errors import UserInputError
from canarchy.output import CommandResult, open_stream


def add_bus_arguments(parser: argparse.ArgumentParser, fd: bool = True) -> None:
    """The bus flags: ``--bus-type``, ``--bitrate``, ``--data-bitrate``, ``--fd`` (unless
    the command has its own), ``--bus-option KEY=VALUE`` (repeatable); see :func:`bus_flags`."""
    group = parser.add_argument_group("bus (flag > CANARCHY_* variable > [transport] in config.toml)")
    group.add_argument("--bus-type", metavar="NAME", help="python-can bus type: socketcan, pcan, kvaser, vector, "
                       "slcan, udp_multicast ... (default: [transport].interface)")
    group.add_argument("--bitrate", metavar="BPS", help="nominal bit rate in bit/s, e.g. 500000 "
                       "(default: [transport].bitrate)")
    group.add_argument("--data-bitrate", metavar="BPS", help="CAN FD data-phase bit rate in bit/s, e.g. 2000000 "
                       "(default: [transport].data_bitrate)")
    if fd:
        group.add_argument("--fd", action="store_true", default=None, help="open the bus in CAN FD mode "
                           "(default: [transport].fd)")
    group.add_argument("--bus-option", metavar="KEY=VALUE", action="append", default=[],
                       help="a python-can bus keyword argument, e.g. --bus-option serial=12345 (repeatable; "
                            "over [transport.bus_kwargs])")


def bus_flags(args: argparse.Namespace) -> dict:
    """The bus flags of ``args`` by variable, for :func:`canarchy.transport.transport_backend_config`.

    Raises ``UserInputError`` ``INVALID_ARGUMENTS`` for a ``--bus-option`` without ``=``.
    """
    from canarchy import config

    options: dict = {}
    for item in args.bus_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserInputError("INVALID_ARGUMENTS", f"--bus-option {item!r} is not KEY=VALUE.",
                                 "Give one python-can keyword argument per --bus-option, e.g. --bus-option serial=12345.")
        options[key.strip()] = config.bus_kwarg_value(value)
    return {"CANARCHY_PYTHON_CAN_INTERFACE": args.bus_type, "CANARCHY_BITRATE": args.bitrate,
            "CANARCHY_DATA_BITRATE": args.data_bitrate, "CANARCHY_BUS_FD": True if args.fd else None,
            "CANARCHY_BUS_KWARGS": options or None}


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("capture", parents=[parent], help="capture frames from a channel")
    p.add_argument("channel", nargs="?", help="CAN channel (default: [transport].default_interface)")
    p.add_argument("--count", help="stop after N frames (default: [transport].capture_limit; 0 = until Ctrl+C)")
    p.add_argument("--timeout", type=float, help="stop after this many seconds without a frame")
    p.add_argument("--file", metavar="PATH",
                   help="read frames from a capture file instead of a channel (candump -l .log, .asc, .blf, .trc, "
                        ".csv ...); --count defaults to every frame, --timeout does not apply")
    add_bus_arguments(p)
    p.set_defaults(command="capture", handler=_capture, takes_channel=True, render_text=_render_capture,
                   render_event=_render_frame, no_interface_ok=lambda a: a.file is not None)

    p = subparsers.add_parser("send", parents=[parent], help="send one frame (active)")
    p.add_argument("channel", nargs="?", help="CAN channel (omit to use [transport].default_interface)")
    p.add_argument("frame_id", metavar="FRAME|ID",
                   help="a frame in cansend's syntax (123#DEADBEEF, 18FEF100#00FF, 123#R, 123##1DEADBEEF), or an "
                        "arbitration ID in hex: 3 digits 11-bit, 8 digits 29-bit (7E0, 18FEF100, 0x7E0)")
    p.add_argument("data", metavar="DATA", nargs="?", default="", help="payload as hex after an ID, e.g. 0210")
    p.add_argument("--fd", action="store_true", help="send a CAN FD frame (up to 64 bytes; the bus opens in CAN FD mode)")
    add_bus_arguments(p, fd=False)
    add_active_arguments(p)
    p.set_defaults(command="send", handler=_send, takes_channel=True, no_interface_ok=lambda a: a.dry_run,
                   normalize=_normalize_send, render_text=_render_send)


def _normalize_send(args: argparse.Namespace) -> None:
    """``send ID DATA`` (no channel) parses as channel=ID, ID=DATA: shift the words back.

    A channel is never a bare number, so a first word that parses as an
    arbitration ID, with a payload left empty, is the ID.
    """
    if args.channel is not None and args.data == "" and _looks_like_id(args.channel):
        args.channel, args.frame_id, args.data = None, args.channel, args.frame_id


def _looks_like_id(text: str | None) -> bool:
    if text is None:
        return False
    try:
        parse_arbitration_id(text)
        return True
    except UserInputError:
        return False


def _capture(args: argparse.Namespace) -> CommandResult:
    if args.file is not None:
        return _capture_file(args)
    from canarchy.transport import build_backend, transport_backend_config

    settings = transport_backend_config(bus_flags(args))
    if args.count is None:
        limit = settings.capture_limit
    else:
        limit = parse_int(args.count, "INVALID_COUNT", "--count", 0, 10**9, "Give --count as a whole number >= 0.")
        limit = None if limit == 0 else limit
    if args.timeout is not None and not args.timeout >= 0:
        raise UserInputError("INVALID_TIMEOUT", f"--timeout {args.timeout} must be >= 0.", "Give seconds, e.g. 0.5.")
    backend = build_backend(settings)
    stream = open_stream(args, f"capture:{args.interface}", live=True)
    with stream.stoppable():  # Ctrl+C ends an unbounded capture; the frames so far stand
        for frame in backend.capture(args.interface, limit=limit, timeout=args.timeout):
            stream.emit_frame("frame", frame)
    return CommandResult(data={"interface": args.interface, "interface_source": args.interface_source,
                               "frame_count": stream.count})


def _capture_file(args: argparse.Namespace) -> CommandResult:
    """``capture --file PATH``: the frames of a capture file, as if captured (no bus is opened).

    Errors: ``CAPTURE_SOURCE_UNAVAILABLE`` (exit 2), ``CAPTURE_FORMAT_UNSUPPORTED`` (exit 1), see
    :mod:`canarchy.capture_file`; malformed lines are warnings naming file and line.
    """
    from canarchy.capture_file import open_capture

    if args.interface_source == "cli":
        raise UserInputError("INVALID_ARGUMENTS", f"capture: give a channel ({args.channel}) or --file, not both.",
                             "Drop the channel to read the file, or drop --file to capture from the channel.")
    limit = None
    if args.count is not None:
        limit = parse_int(args.count, "INVALID_COUNT", "--count", 0, 10**9, "Give --count as a whole number >= 0.")
        limit = None if limit == 0 else limit
    capture = open_capture(args.file)
    stream = open_stream(args, f"file:{args.file}")
    emit = stream.emit_frame
    with stream.stoppable():
        for frame in capture if limit is None else itertools.islice(capture, limit):
            emit("frame", frame)
    data = {"interface": None, "interface_source": None, "file": args.file, "format": capture.format,
            "frame_count": stream.count, **capture.log.to_data()}
    return CommandResult(data=data, warnings=capture.all_warnings())


def _frame_to_send(args: argparse.Namespace):
    """The frame ``send`` was given (cansend syntax, or ID and DATA) and warnings about its ID."""
    from canarchy.frame_syntax import id_notes, parse_frame
    from canarchy.transport import CanFrame

    if "#" in args.frame_id:
        if args.data:
            raise UserInputError("INVALID_ARGUMENTS", f"send: {args.frame_id!r} is a whole frame; {args.data!r} "
                                 "is one argument too many.", "Put the data after the '#': 123#DEADBEEF.")
        frame = parse_frame(args.frame_id, args.interface)
        if args.fd and not frame.is_fd:
            raise UserInputError("INVALID_ARGUMENTS", f"send: --fd with the classic frame {args.frame_id!r}.",
                                 "Write a CAN FD frame with '##' and a flags digit (123##0DEADBEEF), or drop --fd.")
        return frame, []
    arbitration_id, extended = parse_arbitration_id(args.frame_id)
    data = parse_hex_data(args.data)
    return CanFrame(arbitration_id, data, is_extended_id=extended, is_fd=args.fd, channel=args.interface), \
        id_notes(args.frame_id)


def _send(args: argparse.Namespace) -> CommandResult:
    frame, notes = _frame_to_send(args)
    if frame.is_fd:
        args.fd = True  # a CAN FD frame needs the bus in CAN FD mode
    if args.dry_run:
        return CommandResult(data={"mode": "dry_run", "interface": args.interface, "frame": frame.to_payload()},
                             warnings=notes)
    from canarchy.frame_syntax import format_frame

    warning = active_gate("send", args.interface, f"send 1 frame ({format_frame(frame)})", args.ack_active)
    from canarchy.transport import build_backend, transport_backend_config

    sent = build_backend(transport_backend_config(bus_flags(args))).send(args.interface, frame)
    open_stream(args, f"send:{args.interface}").emit("frame_sent", sent.to_payload())
    return CommandResult(data={"mode": "active", "interface": args.interface,
                               "interface_source": args.interface_source, "frame": sent.to_payload()},
                         warnings=[warning, *notes])


def _frame_line(f: dict) -> str:
    width = 8 if f["is_extended_id"] else 3
    return f"{f['channel'] or '-'}  {f['arbitration_id']:0{width}X}  [{f['dlc']}]  {f['data'].upper()}"


def _render_frame(event: dict) -> str:
    return _frame_line(event["payload"])


def _render_capture(result: CommandResult) -> str:
    data = result.data
    return f"capture on {data['interface'] or data['file']}: {data['frame_count']} frames"


def _render_send(result: CommandResult) -> str:
    data = result.data
    return "\n".join([f"{data['mode']} on {data['interface']}", _frame_line(data["frame"])])
