"""``replay FILE [CHANNEL]``: play a recording onto a bus with its original timing (active).

Any recording ``capture --file`` reads goes out on one bus on the schedule of :mod:`canarchy.replay`
(``--speed``, ``--loop N``, ``--skip S``, ``--filter``); error frames are counted, not sent. The
active-transmit gate (:mod:`canarchy.active`) runs first; ``--dry-run`` prints the schedule and opens
nothing. See ``docs/record-and-replay.md``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from canarchy.active import active_gate, add_active_arguments
from canarchy.commands._common import parse_int
from canarchy.commands.bus import add_bus_arguments, add_filter_argument, bus_flags, parse_filters
from canarchy.errors import UserInputError
from canarchy.output import CommandResult, open_stream

#: Slots a dry run of an endless replay (--loop 0) lists: its first pass, at most this many.
PREVIEW_SLOTS = 1000


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    """Register ``replay``."""
    p = subparsers.add_parser("replay", parents=[parent],
                              help="play a recording onto a bus with its original timing (canplayer-style; active)")
    p.add_argument("file", metavar="FILE", help="the recording: candump -l .log, .asc, .blf, .trc, .csv, "
                   "canarchy's .jsonl/.json ...")
    p.add_argument("channel", nargs="?", help="CAN channel to send on (default: [transport].default_interface)")
    p.add_argument("--speed", default="1", metavar="X", help="time factor: 2 plays twice as fast, 0.5 half (default 1)")
    p.add_argument("--loop", default="1", metavar="N", help="play the recording N times; 0 = until Ctrl+C (default 1)")
    p.add_argument("--skip", default=None, metavar="S",
                   help="shorten gaps longer than S seconds to S (default: keep every gap)")
    add_filter_argument(p)
    add_bus_arguments(p)
    add_active_arguments(p)
    p.set_defaults(command="replay", handler=_replay, takes_channel=True, no_interface_ok=lambda a: a.dry_run,
                   render_text=_render_text, render_event=_render_slot)


def _number(text: str, what: str, hint: str, positive: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 if positive else value >= 0) or value == float("inf"):
        raise UserInputError("INVALID_ARGUMENTS", f"{what} {text!r} is not a number {'> 0' if positive else '>= 0'}.",
                             hint)
    return value


def _options(args: argparse.Namespace) -> dict[str, Any]:
    speed = _number(args.speed, "--speed", "Give the time factor, e.g. --speed 2 (twice as fast) or 0.5.")
    loops = parse_int(args.loop, "INVALID_ARGUMENTS", "--loop", 0, 10**9,
                      "Give how many passes, e.g. --loop 3, or 0 to repeat until Ctrl+C.")
    skip = None if args.skip is None else _number(args.skip, "--skip", "Give seconds, e.g. --skip 1.")
    return {"speed": speed, "loops": loops or None, "skip": skip, "filters": parse_filters(args.filter)}


def _replay(args: argparse.Namespace) -> CommandResult:
    from canarchy.capture_file import open_capture
    from canarchy.replay import schedule
    from canarchy.frames import frame_passes

    options = _options(args)
    filters = options["filters"]
    first = open_capture(args.file)
    opened = [first]
    filtered = 0

    def one_pass():
        nonlocal filtered
        capture = opened.pop() if opened else open_capture(args.file)
        for frame in capture:
            if frame_passes(frame, filters):
                yield frame
            else:
                filtered += 1
        stats["error_frames"] += capture.error_frame_count
        stats["warnings"] = capture.all_warnings()

    stats: dict[str, Any] = {"error_frames": 0, "warnings": []}
    slots = schedule(one_pass, speed=options["speed"], loops=options["loops"], skip=options["skip"])
    common = {"file": args.file, "format": first.format, "interface": args.interface, "speed": options["speed"],
              "loops": options["loops"] or 0, "skip_s": options["skip"],
              "filters": [f.to_payload() for f in filters]}
    if args.dry_run:
        return _dry_run(args, slots, common, stats, lambda: filtered)
    passes = "until Ctrl+C" if options["loops"] is None else f"{options['loops']} time(s)"
    warning = active_gate("replay", args.interface, f"replay {args.file} {passes} at speed {options['speed']:g}",
                          args.ack_active)
    return _transmit(args, slots, common, stats, lambda: filtered, warning)


def _slot_payload(slot: Any) -> dict[str, Any]:
    """The event payload of a frame replay sends (or plans to): ``is_rx`` false, whatever the recording said."""
    return dict(slot.frame.to_payload(), is_rx=False, index=slot.index, loop=slot.loop,
                offset_s=round(slot.offset_s, 6))


def _dry_run(args: argparse.Namespace, slots: Any, common: dict[str, Any], stats: dict[str, Any],
             filtered: Any) -> CommandResult:
    endless = common["loops"] == 0
    stream = open_stream(args, f"replay:{args.file}")
    with stream.stoppable():
        for slot in slots:
            if endless and (slot.loop > 0 or stream.count >= PREVIEW_SLOTS):
                break
            stream.emit("frame_planned", _slot_payload(slot), slot.frame.timestamp)
    planned = stream.count
    data = dict(common, mode="dry_run", planned_frames=None if endless else planned, shown=planned,
                filtered=filtered(), error_frames_skipped=stats["error_frames"])
    return CommandResult(data=data, warnings=stats["warnings"])


def _transmit(args: argparse.Namespace, slots: Any, common: dict[str, Any], stats: dict[str, Any], filtered: Any,
              warning: str) -> CommandResult:
    from canarchy.replay import play
    from canarchy.transport import build_backend, transport_backend_config

    backend = build_backend(transport_backend_config(bus_flags(args)))
    stream = open_stream(args, f"replay:{args.interface}", live=True)
    max_late = 0.0
    started = time.monotonic()
    with backend.sender(args.interface) as send, stream.stoppable():  # Ctrl+C / SIGTERM: the frames sent stand
        for done in play(slots, lambda frame: send(_on_channel(frame, args.interface))):
            max_late = max(max_late, done.late_s)
            payload = dict(_slot_payload(done.slot), late_s=round(done.late_s, 6), due_at=done.due_at,
                           channel=args.interface, timestamp=done.sent_at)
            stream.emit("frame_sent", payload, done.sent_at)
    data = dict(common, mode="active", interface_source=args.interface_source, frames_sent=stream.count,
                stopped_by=stream.stopped_by or "end", elapsed_s=round(time.monotonic() - started, 6),
                max_late_s=round(max_late, 6), filtered=filtered(), error_frames_skipped=stats["error_frames"])
    return CommandResult(data=data, warnings=[warning, *stats["warnings"]])


def _on_channel(frame: Any, channel: str) -> Any:
    from dataclasses import replace

    return replace(frame, channel=channel, is_rx=False)


def _render_text(result: CommandResult) -> str:
    d = result.data
    if d["mode"] == "dry_run":
        total = "endless" if d["planned_frames"] is None else f"{d['planned_frames']} frames"
        lines = [f"dry run: replay {d['file']} ({total}, speed {d['speed']:g}) on {d['interface'] or '(no channel)'}; "
                 "nothing sent" + (f" (first pass shown: {d['shown']} frames)" if d["planned_frames"] is None else "")]
    else:
        lines = [f"replay of {d['file']} on {d['interface']}: {d['frames_sent']} frames sent in {d['elapsed_s']:.3f} s "
                 f"({'done' if d['stopped_by'] == 'end' else 'stopped by ' + d['stopped_by']}), "
                 f"at most {d['max_late_s'] * 1000:.1f} ms late"]
    return "\n".join(lines)


def _render_slot(event: dict[str, Any]) -> str:
    from canarchy.frame_syntax import format_frame
    from canarchy.frames import CanFrame

    p = event["payload"]
    return f"  {p['offset_s']:>12.6f}  {format_frame(CanFrame.from_payload(p))}"
