"""``capture`` and ``send``: frames from and to a CAN channel."""

from __future__ import annotations

import argparse
import itertools
import re
import time

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


def add_filter_argument(parser: argparse.ArgumentParser) -> None:
    """``--filter ID:MASK`` / ``ID~MASK`` (candump's syntax, repeatable; see :func:`parse_filters`)."""
    parser.add_argument("--filter", metavar="ID:MASK", action="append", default=[],
                        help="pass frames with (ID & MASK) == (FRAME_ID & MASK), hex as in candump (7E0:7F0; "
                             "8 ID digits: 29-bit frames; mask flags C0000000: no remote frames); ID~MASK passes "
                             "the others; repeatable: any may pass")


def parse_filters(texts: list[str]) -> tuple:
    """The :class:`~canarchy.frames.FrameFilter` of each ``--filter``. Raises ``INVALID_FILTER``."""
    from canarchy.frame_syntax import parse_filter

    return tuple(parse_filter(text) for text in texts)


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
                                 "Give one python-can keyword argument per --bus-option, "
                                 "e.g. --bus-option serial=12345.")
        options[key.strip()] = config.bus_kwarg_value(value)
    return {"CANARCHY_PYTHON_CAN_INTERFACE": args.bus_type, "CANARCHY_BITRATE": args.bitrate,
            "CANARCHY_DATA_BITRATE": args.data_bitrate, "CANARCHY_BUS_FD": True if args.fd else None,
            "CANARCHY_BUS_KWARGS": options or None}


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("capture", parents=[parent],
                              help="capture frames from a channel until --count, --duration or Ctrl+C (candump-style)")
    p.add_argument("channel", nargs="?", help="CAN channel (default: [transport].default_interface)")
    p.add_argument("--count", help="stop after N frames (default: [transport].capture_limit, else none; "
                   "0 = no limit)")
    p.add_argument("--duration", metavar="S", help="stop after S seconds")
    p.add_argument("--idle-timeout", "--timeout", dest="timeout", metavar="S",
                   help="stop after S seconds without a frame (default: [transport].capture_timeout, else none)")
    add_filter_argument(p)
    p.add_argument("--output", dest="output_file", metavar="FILE",
                   help="also write the frames to FILE as they come: .log (candump -l), .asc, .blf, .trc, .csv "
                        "(with --file: convert a recording)")
    p.add_argument("--overwrite", action="store_true", help="let --output replace an existing file")
    p.add_argument("--file", metavar="PATH",
                   help="read frames from a capture file instead of a channel (candump -l .log, .asc, .blf, .trc, "
                        ".csv, canarchy's .jsonl/.json ...; '-' or a pipe: candump -l text as it comes); --count "
                        "defaults to every frame")
    p.add_argument("--summary", action="store_true",
                   help="with --file: per arbitration ID counts, rates and last data instead of the frames")
    add_bus_arguments(p)
    p.set_defaults(command="capture", handler=_capture, takes_channel=True, render_text=_render_capture,
                   render_event=_render_frame, channel_unused=lambda a: a.file is not None)

    p = subparsers.add_parser("send", parents=[parent], help="send one frame (active)")
    p.add_argument("channel", nargs="?", help="CAN channel (omit to use [transport].default_interface)")
    p.add_argument("frame_id", metavar="FRAME|ID",
                   help="a frame in cansend's syntax (123#DEADBEEF, 18FEF100#00FF, 123#R, 123##1DEADBEEF), or an "
                        "arbitration ID in hex: 3 digits 11-bit, 8 digits 29-bit (7E0, 18FEF100, 0x7E0)")
    p.add_argument("data", metavar="DATA", nargs="?", default="", help="payload as hex after an ID, e.g. 0210")
    p.add_argument("--fd", action="store_true",
                   help="send a CAN FD frame (up to 64 bytes; the bus opens in CAN FD mode)")
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


def _seconds(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UserInputError("INVALID_ARGUMENTS", f"{what} {text!r} is not a number of seconds >= 0.",
                             f"Give {what} in seconds, e.g. {what} 2.5.")
    return value


def _capture_limits(args: argparse.Namespace, settings) -> tuple[int | None, float | None, float | None]:
    """``(count, duration, idle timeout)`` from the flags, else the configured defaults; None: no limit."""
    if args.count is None:
        limit = settings.capture_limit
    else:
        limit = parse_int(args.count, "INVALID_COUNT", "--count", 0, 10**9, "Give --count as a whole number >= 0.")
        limit = limit or None
    duration = _seconds(args.duration, "--duration")
    idle = _seconds(args.timeout, "--idle-timeout")
    return limit, duration, settings.capture_timeout if idle is None else idle


def _stop_reason(count: int, limit: int | None, elapsed: float, duration: float | None) -> str | None:
    """The capture limit reached (``count``, ``duration``), or None; ``elapsed`` in seconds since the bus opened.
    The idle timeout is judged after a wait that brought no frame, so that a frame already received counts."""
    if limit is not None and count >= limit:
        return "count"
    if duration is not None and elapsed >= duration:
        return "duration"
    return None


def _capture(args: argparse.Namespace) -> CommandResult:
    """``capture CHANNEL``: frames as they arrive until --count, --duration, --idle-timeout, Ctrl+C or SIGTERM."""
    if args.file is not None:
        return _capture_file(args)
    if args.summary:
        raise UserInputError("INVALID_ARGUMENTS", "capture: --summary summarises a file; give --file PATH.",
                             "Use `capture --file PATH --summary`, or drop --summary to capture from the channel.")
    from canarchy.capture_writer import CaptureWriter
    from canarchy.transport import CAPTURE_POLL_S, SourceEnded, build_backend, transport_backend_config

    settings = transport_backend_config(bus_flags(args))
    limit, duration, idle = _capture_limits(args, settings)
    filters = parse_filters(args.filter)
    writer = CaptureWriter(args.output_file, args.overwrite) if args.output_file else None  # fails before the bus
    backend = build_backend(settings)
    stream = open_stream(args, f"capture:{args.interface}", live=True)
    count = 0
    stopped_by = None
    started = time.monotonic()
    opened = False
    try:
        # Ctrl+C or SIGTERM (canarchy.cli.main turns it into KeyboardInterrupt) ends the loop; the frames stand.
        with stream.stoppable(), backend.receiver(args.interface, filters) as recv:
            opened = True
            # --duration and --idle-timeout count from the open bus (as candump -T): an adapter slow to open
            # (udp_multicast joining its group) does not use them up before the first frame can arrive
            started = last = time.monotonic()
            while True:
                now = time.monotonic()
                stopped_by = _stop_reason(count, limit, now - started, duration)
                if stopped_by is not None:
                    break
                wait = CAPTURE_POLL_S
                if duration is not None:
                    wait = min(wait, started + duration - now)
                if idle is not None:
                    wait = min(wait, last + idle - now)
                try:
                    frame = recv(max(0.0, wait))
                except SourceEnded:
                    stopped_by = "end_of_source"
                    break
                if frame is None:
                    if idle is not None and time.monotonic() - last >= idle:
                        stopped_by = "idle_timeout"
                        break
                    continue
                count += 1
                last = time.monotonic()
                if writer is not None:
                    writer.write(frame)
                stream.emit_frame("frame", frame)
    finally:
        if writer is not None:
            writer.close(keep=opened)  # the frames so far stand, however the capture ended; no bus, no file
    data = {"interface": args.interface, "interface_source": args.interface_source, "frame_count": count,
            "stopped_by": stopped_by or stream.stopped_by or "SIGINT",
            "elapsed_s": round(time.monotonic() - started, 6), "count": limit,
            "duration_s": duration, "idle_timeout_s": idle, "filters": [f.to_payload() for f in filters],
            "output": _output_data(writer, kept=opened)}
    return CommandResult(data=data, warnings=[] if writer is None else writer.warnings())


def _output_data(writer, kept: bool) -> dict | None:
    """``data.output`` of a capture written to a file (None: no ``--output``): where, in which format, the frames
    written, and whether the file was kept (a conversion a signal cut short keeps none)."""
    if writer is None:
        return None
    return {"path": str(writer.path), "format": writer.format, "frames_written": writer.frame_count, "kept": kept}


def _capture_file(args: argparse.Namespace) -> CommandResult:
    """``capture --file PATH``: the frames of a capture file, as if captured (no bus is opened).

    Errors: ``CAPTURE_SOURCE_UNAVAILABLE`` (exit 2), ``CAPTURE_FORMAT_UNSUPPORTED`` (exit 1), see
    :mod:`canarchy.capture_file`; malformed lines are warnings naming file and line.
    """
    from canarchy.capture_file import open_capture

    if args.interface_source == "cli":
        raise UserInputError("INVALID_ARGUMENTS", f"capture: give a channel ({args.channel}) or --file, not both.",
                             "Drop the channel to read the file, or drop --file to capture from the channel.")
    for flag, value in (("--duration", args.duration), ("--idle-timeout", args.timeout), ("--bus-type", args.bus_type),
                        ("--bitrate", args.bitrate), ("--data-bitrate", args.data_bitrate), ("--fd", args.fd),
                        ("--bus-option", args.bus_option)):
        if value not in (None, []):  # [] : no --bus-option
            raise UserInputError("INVALID_ARGUMENTS", f"capture: {flag} applies to a bus, not to --file.",
                                 "Use --count to read part of a recording, or drop the option.")
    limit = None
    if args.count is not None:
        limit = parse_int(args.count, "INVALID_COUNT", "--count", 0, 10**9, "Give --count as a whole number >= 0.")
        limit = None if limit == 0 else limit
    filters = parse_filters(args.filter)
    capture = open_capture(args.file, stream=True)
    from canarchy.capture_writer import CaptureWriter

    writer = CaptureWriter(args.output_file, args.overwrite) if args.output_file else None  # a conversion
    filtered = _Filtered(capture, filters, args.file)
    frames = capture if not filters else iter(filtered)
    if limit is not None:
        frames = itertools.islice(frames, limit)
    if args.summary:  # the same frames (--filter, --count, --output), summarised instead of printed
        return _capture_summary(args, capture, frames, writer, filtered)
    stream = open_stream(args, f"file:{args.file}", live=capture.stream, finite=not capture.stream)
    emit = stream.emit_frame
    _convert(frames, writer, lambda frame: emit("frame", frame), stream)
    filtered.note()
    data = {"interface": None, "interface_source": None, "file": args.file, "format": capture.format,
            "frame_count": stream.count, "filters": [f.to_payload() for f in filters],
            "output": _output_data(writer, kept=not stream.cut_short), **capture.log.to_data()}
    return CommandResult(data=data, warnings=capture.all_warnings() + ([] if writer is None else writer.warnings()))


def _convert(frames, writer, each, stream) -> None:
    """Write each frame to ``writer`` (``--output``; None: no file), then hand it to ``each``, inside the
    ``stream``'s stoppable block (a stop by signal ends the loop there). A read that failed (no frame:
    CAPTURE_FORMAT_INVALID ...), whose reader went away (a closed pipe) or that a signal cut short before the
    file's end (:attr:`~canarchy.output.EventStream.cut_short`; a stream from a pipe ends there) converted only
    part of the recording, or nothing: no file is left, as for a bus that never opened."""
    read = False
    try:
        with stream.stoppable():
            for frame in frames:
                if writer is not None:
                    writer.write(frame)
                each(frame)
        read = not stream.cut_short
    finally:
        if writer is not None:
            writer.close(keep=read)


class _Filtered:
    """The frames of ``capture`` that ``filters`` pass, counting those candump's filters would decide otherwise
    (kept out or passed only by their ID's width); :meth:`note` warns of them in the capture's log."""

    def __init__(self, capture, filters: tuple, path: str) -> None:
        self.capture, self.filters, self.path, self.other_width = capture, filters, path, 0

    def __iter__(self):
        from canarchy.frames import frame_passes

        # candump decides otherwise only through a width canarchy checks and its mask does not name
        differs = any(f.extended is not None and not f.width_in_mask for f in self.filters)
        for frame in self.capture:
            passed = frame_passes(frame, self.filters)
            if differs and passed != frame_passes(frame, self.filters, as_candump=True):
                self.other_width += 1
            if passed:
                yield frame

    def note(self) -> None:
        if self.other_width:
            self.capture.log.add(
                "CAPTURE_FILTER_WIDTH", f"{self.path}: {self.other_width} frame(s) of the other ID width match a "
                "--filter's ID and mask, which candump's filter would decide otherwise (pass, or for ID~MASK keep "
                "out): a filter is for the ID width it is written in (3 digits: 11-bit, 8 digits: 29-bit; give one "
                "of each for both, or candump's own C00007FF / 800007FF mask flags)",
                file=self.path, count=self.other_width)


def _capture_summary(args: argparse.Namespace, capture, frames, writer, filtered: _Filtered) -> CommandResult:
    """``capture --file PATH --summary``: :class:`canarchy.capture_stats.CaptureStats` of ``frames`` (the
    file's, after --filter and --count), each also written to ``writer`` (``--output``) when given."""
    from canarchy.capture_stats import MAX_IDS, CaptureStats

    stats = CaptureStats()
    stream = open_stream(args, f"file:{args.file}", live=capture.stream, keep=False, finite=not capture.stream)
    _convert(frames, writer, stats.feed, stream)
    filtered.note()
    if stats.unlisted_frame_count:
        capture.log.add("CAPTURE_IDS_UNLISTED", f"{args.file}: {stats.unlisted_frame_count} frame(s) of IDs past the "
                        f"first {MAX_IDS} distinct IDs are counted, not listed (--filter the IDs of interest to list "
                        "them)", count=stats.unlisted_frame_count, limit=MAX_IDS)
    data = {"interface": None, "interface_source": None, "file": args.file, "format": capture.format,
            "summary": True, **stats.to_dict(), **capture.log.to_data()}
    if writer is not None:
        data["output"] = _output_data(writer, kept=not stream.cut_short)
    return CommandResult(data=data, warnings=capture.all_warnings() + ([] if writer is None else writer.warnings()))


def _frame_to_send(args: argparse.Namespace):
    """The frame ``send`` was given (cansend syntax, or ID and DATA), marked as sent (``is_rx`` false), and
    warnings about its ID."""
    from dataclasses import replace

    from canarchy.frame_syntax import id_notes, parse_frame
    from canarchy.frames import CanFrame

    typed = getattr(args, "channel", None) or ""
    if "#" in typed or re.fullmatch(r"(0[xX])?([0-9A-Fa-f]{3}|[0-9A-Fa-f]{8})", typed):
        raise UserInputError("INVALID_ARGUMENTS", f"send: {typed!r} is in the channel's place, but it reads as "
                             f"{'a frame' if '#' in typed else 'an arbitration ID'}: the arguments were split "
                             "where the frame has a space.",
                             "Give the channel first and the frame as one argument, its data without spaces: "
                             "send can0 123#1122, or send can0 7E0 021001.")
    if "#" in args.frame_id:
        if args.data:
            raise UserInputError("INVALID_ARGUMENTS", f"send: {args.frame_id!r} is a whole frame; {args.data!r} "
                                 "is one argument too many.", "Put the data after the '#': 123#DEADBEEF.")
        frame = parse_frame(args.frame_id, args.interface)
        if args.fd and not frame.is_fd:
            raise UserInputError("INVALID_ARGUMENTS", f"send: --fd with the classic frame {args.frame_id!r}.",
                                 "Write a CAN FD frame with '##' and a flags digit (123##0DEADBEEF), or drop --fd.")
        return replace(frame, is_rx=False), []
    arbitration_id, extended = parse_arbitration_id(args.frame_id)
    data = parse_hex_data(args.data)
    return CanFrame(arbitration_id, data, is_extended_id=extended, is_fd=args.fd, channel=args.interface,
                    is_rx=False), id_notes(args.frame_id)


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


def _render_frame(event: dict) -> str:
    from canarchy.frame_syntax import frame_line

    return frame_line(event["payload"])


def _render_capture(result: CommandResult) -> str:
    data = result.data
    if data.get("summary"):  # capture --file --summary
        from canarchy.capture_stats import render_ids

        return render_ids(data)
    if data.get("file") is not None:  # capture --file
        return f"capture of {data['file']}: {data['frame_count']} frames"
    output = data["output"]
    return (f"capture on {data['interface']}: {data['frame_count']} frames in {data['elapsed_s']:.3f} s "
            f"(stopped by {data['stopped_by']})" + (f", written to {output['path']}" if output else ""))


def _render_send(result: CommandResult) -> str:
    from canarchy.frame_syntax import frame_line

    data = result.data
    if data["mode"] == "dry_run":
        head = f"dry run: would send on {data['interface']}" if data["interface"] else \
            "dry run: would send (no channel given or configured)"
    else:
        head = f"sent on {data['interface']}"
    return "\n".join([head, frame_line(data["frame"])])
