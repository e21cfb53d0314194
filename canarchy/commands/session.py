"""`session save`, `session load` and `session show`: project-local session records.

Records live under ``./.canarchy/`` of the current working directory
(:mod:`canarchy.session`); shapes and error codes: ``docs/caches-and-sessions.md``.
"""

from __future__ import annotations

import argparse
from typing import Any

from canarchy.output import CommandResult


def add_parser(subparsers: Any, parent: argparse.ArgumentParser) -> None:
    """Register the `session` group."""
    group = subparsers.add_parser("session", parents=[parent], help="project-local session records")
    sub = group.add_subparsers(dest="session_command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("save", parents=[parent], help="save a session and make it active")
    p.add_argument("name", metavar="NAME", help="session name (letters, digits, - _ .)")
    # dest is not `interface`: prepare_args owns args.interface and resets it.
    p.add_argument("--interface", dest="session_interface", metavar="CH", help="CAN channel, e.g. can0")
    p.add_argument("--dbc", metavar="PATH", help="DBC file used with this session")
    p.add_argument("--capture", metavar="PATH", help="capture file used with this session")
    p.set_defaults(command="session save", handler=_save, render_text=_render_record)

    p = sub.add_parser("load", parents=[parent], help="make a saved session active and show it")
    p.add_argument("name", metavar="NAME", help="session name")
    p.set_defaults(command="session load", handler=_load, render_text=_render_record)

    p = sub.add_parser("show", parents=[parent], help="show the active session and the saved ones")
    p.set_defaults(command="session show", handler=_show, render_text=_render_show)


def _save(args: argparse.Namespace) -> CommandResult:
    from canarchy import session

    record = session.save_session(args.name, interface=args.session_interface, dbc=args.dbc,
                                  capture=args.capture)
    return CommandResult(data=_record_data(session, record))


def _load(args: argparse.Namespace) -> CommandResult:
    from canarchy import session

    record = session.load_session(args.name)
    return CommandResult(data=_record_data(session, record))


def _record_data(session: Any, record: dict[str, Any]) -> dict[str, Any]:
    """The record itself plus ``path``, the file it lives in."""
    return {**record, "path": str(session.sessions_dir() / f"{record['name']}.json")}


def _show(args: argparse.Namespace) -> CommandResult:
    from canarchy import session

    data, warnings = session.show_sessions()
    return CommandResult(data=data, warnings=warnings)


def _format_record(record: dict[str, Any]) -> list[str]:
    return [f"  {key}: {record.get(key) if record.get(key) is not None else '-'}"
            for key in ("interface", "dbc", "capture", "saved_at")]


def _render_record(result: CommandResult) -> str:
    record = result.data
    return "\n".join([f"active session: {record['name']}", *_format_record(record)])


def _render_show(result: CommandResult) -> str:
    data = result.data
    active = data["active"]
    lines = [f"active session: {active['name'] if active else 'none'}"]
    if active:
        lines.extend(_format_record(active))
    lines.append(f"saved sessions ({data['session_count']}): {', '.join(data['sessions']) or 'none'}")
    return "\n".join(lines)
