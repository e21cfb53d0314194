"""``web serve --file CAPTURE [--dbc DB] [--bind HOST:PORT]``: a read-only local dashboard.

Reads the capture (and the DBC) before binding, so their errors come first; then serves
(:mod:`canarchy.web`) until SIGINT, SIGTERM or ``--duration`` and prints the envelope (exit 0). Default bind
``127.0.0.1:8765``; a host other than loopback needs ``--allow-remote``. Errors: ``WEB_BIND_INVALID``
(exit 1), ``WEB_BIND_FAILED`` (exit 2), and those of reading the capture and the DBC. See ``docs/web.md``.
"""

from __future__ import annotations

import argparse
import sys
import time

from canarchy.commands._common import StopSignals
from canarchy.errors import UserInputError
from canarchy.output import CommandResult, open_stream, terminal_safe


#: Shown in --help; the values live in :mod:`canarchy.web` and :mod:`canarchy.web_bind` (not imported here:
#: http.server costs ~40 ms on every canarchy command). tests/test_web.py checks that they agree.
HELP_DEFAULTS = {"bind": "127.0.0.1:8765", "event_limit": None, "max_event_limit": 10_000_000}


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    """Register the ``web`` group and ``web serve``."""
    group = subparsers.add_parser("web", parents=[parent], help="a read-only local dashboard of a capture file")
    sub = group.add_subparsers(dest="web_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("serve", parents=[parent],
                       help="serve a dashboard of a capture file (HTML page, /api/status, /api/events) until Ctrl+C")
    p.add_argument("--file", required=True, metavar="CAPTURE", help="capture file (as for capture --file)")
    p.add_argument("--dbc", metavar="DB", help="signal database to decode the frames with (as for decode --dbc)")
    p.add_argument("--bind", default=None, metavar="HOST:PORT",
                   help=f"address to listen on (default {HELP_DEFAULTS['bind']}; port 0 = any free port)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback host in --bind (the dashboard has no authentication)")
    p.add_argument("--speed", default="1", metavar="X",
                   help="replay speed of the event stream: 1 = as recorded, 10 = ten times faster, 0 = no pacing")
    p.add_argument("--event-limit", default=None, metavar="N",
                   help=f"events per stream at most (default: the whole recording; at most "
                        f"{HELP_DEFAULTS['max_event_limit']})")
    p.add_argument("--duration", metavar="S", help="stop after this many seconds (default: until Ctrl+C)")
    p.set_defaults(command="web serve", handler=_serve, render_text=_render_text)


def _number(text: str, option: str, lo: float, hi: float, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        kind = "a whole number" if integer else "a number"
        raise UserInputError("INVALID_ARGUMENTS", f"{option} {text!r} is not {kind} in {lo:g}..{hi:g}.",
                             f"Give {option} as {kind} between {lo:g} and {hi:g}.")
    return value


def _serve(args: argparse.Namespace) -> CommandResult:
    from canarchy import web, web_bind

    bind = web_bind.parse_bind(web_bind.DEFAULT_BIND if args.bind is None else args.bind, args.allow_remote)
    speed = _number(args.speed, "--speed", 0, web.MAX_SPEED, False)
    limit = web.DEFAULT_EVENT_LIMIT if args.event_limit is None else int(
        _number(args.event_limit, "--event-limit", 1, web.MAX_EVENT_LIMIT, True))
    duration = None if args.duration is None else _number(args.duration, "--duration", 0.001, 10**9, False)
    dashboard = web.Dashboard(args.file, args.dbc)  # capture and DBC errors before anything listens
    warnings = list(dashboard.warnings)
    if not bind.loopback:
        warnings.append(f"the dashboard listens on {bind.host}, beyond this machine, without authentication")
    server = web.DashboardServer(bind, dashboard, speed=speed, event_limit=limit)
    with StopSignals() as stop:
        try:
            server.start()
            sys.stderr.write(terminal_safe(f"canarchy: web serve: {args.file} on {server.url} (read-only; Ctrl+C to "
                                           "stop)") + "\n")
            sys.stderr.flush()
            open_stream(args, f"web:{server.url}", live=True, keep=getattr(args, "output", "text") == "jsonl").emit(
                "web_listening", {"url": server.url, "file": args.file, "dbc": args.dbc})
            deadline = None if duration is None else time.monotonic() + duration
            while stop.name is None:
                remaining = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if remaining <= 0:
                    break
                stop.wait(remaining)
            stopped_by = stop.name or "duration"
        finally:
            server.stop()
    data = {"url": server.url, "host": server.server_address[0], "port": server.server_address[1],
            "file": args.file, "dbc": args.dbc, "format": dashboard.format, "frame_count": dashboard.frame_count,
            "decoded_count": dashboard.decoded_count, "requests": server.requests,
            "streams_served": server.streams_served, "uptime_s": round(server.uptime, 3), "stopped_by": stopped_by}
    return CommandResult(data=data, warnings=warnings)


def _render_text(result: CommandResult) -> str:
    d = result.data
    decoded = "" if d["decoded_count"] is None else f", {d['decoded_count']} decoded"
    return (f"web serve: {d['url']} stopped by {d['stopped_by']} after {d['uptime_s']:.1f} s: "
            f"{d['requests']} requests, {d['streams_served']} event streams; "
            f"{d['file']}: {d['frame_count']} frames{decoded}")
