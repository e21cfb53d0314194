"""``capture`` and ``send``: frames from and to a CAN channel."""

from __future__ import annotations

import argparse

from canarchy.active import active_gate, add_active_arguments
from canarchy.output import CommandResult, open_stream
from canarchy.commands._common import parse_arbitration_id, parse_hex_data, parse_int
from canarchy.errors import UserInputError


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("capture", parents=[parent], help="capture frames from a channel")
    p.add_argument("channel", nargs="?", help="CAN channel (default: [transport].default_interface)")
    p.add_argument("--count", help="stop after N frames (default: [transport].capture_limit; 0 = until Ctrl+C)")
    p.add_argument("--timeout", type=float, help="stop after this many seconds without a frame")
    p.add_argument("--file", metavar="PATH",
                   help="read frames from a capture file instead of a channel (candump -l .log, .asc, .blf, .trc, "
                        ".csv ...); --count defaults to every frame, --timeout does not apply")
    p.set_defaults(command="capture", handler=_capture, takes_channel=True, render_text=_render_capture,
                   render_event=_render_frame, no_interface_ok=lambda a: a.file is not None)

    p = subparsers.add_parser("send", parents=[parent], help="send one frame (active)")
    p.add_argument("channel", nargs="?", help="CAN channel (omit to use [transport].default_interface)")
    p.add_argument("frame_id", metavar="ID", help="arbitration ID, e.g. 0x123 or 291 (> 0x7FF: 29-bit)")
    p.add_argument("data", metavar="DATA", nargs="?", default="", help="payload as hex, e.g. 0210")
    p.add_argument("--fd", action="store_true", help="send a CAN FD frame (up to 64 bytes)")
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

    settings = transport_backend_config()
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
            stream.emit("frame", frame.to_payload(), frame.timestamp)
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
    with stream.stoppable():
        for frame in capture:
            if limit is not None and stream.count >= limit:
                break
            stream.emit("frame", frame.to_payload(), frame.timestamp)
    data = {"interface": None, "interface_source": None, "file": args.file, "format": capture.format,
            "frame_count": stream.count, **capture.log.to_data()}
    return CommandResult(data=data, warnings=capture.all_warnings())


def _send(args: argparse.Namespace) -> CommandResult:
    from canarchy.transport import CanFrame

    arbitration_id, extended = parse_arbitration_id(args.frame_id)
    data = parse_hex_data(args.data)
    frame = CanFrame(arbitration_id, data, is_extended_id=extended, is_fd=args.fd, channel=args.interface)
    if args.dry_run:
        return CommandResult(data={"mode": "dry_run", "interface": args.interface, "frame": frame.to_payload()})
    warning = active_gate("send", args.interface, f"send 1 frame (0x{arbitration_id:X})", args.ack_active)
    from canarchy.transport import build_backend

    sent = build_backend().send(args.interface, frame)
    open_stream(args, f"send:{args.interface}").emit("frame_sent", sent.to_payload())
    return CommandResult(data={"mode": "active", "interface": args.interface,
                               "interface_source": args.interface_source, "frame": sent.to_payload()},
                         warnings=[warning])


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
