"""``config show``: every configuration value, where it came from, and the file read."""

from __future__ import annotations

import argparse

from canarchy import config
from canarchy.output import CommandResult


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    group = subparsers.add_parser("config", parents=[parent], help="configuration")
    sub = group.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    sub.required = True
    p = sub.add_parser("show", parents=[parent], help="show each setting with its source (env, file, default)")
    p.set_defaults(command="config show", handler=_show, render_text=_render_text)


def _show(args: argparse.Namespace) -> CommandResult:
    path = config.config_path()
    resolved = config.load_config()
    settings = {
        variable: {"key": entry["key"], "value": entry["value"], "source": entry["source"]}
        for variable, entry in resolved.items()
    }
    return CommandResult(data={"config_path": str(path), "config_found": path.is_file(), "settings": settings})


def _render_text(result: CommandResult) -> str:
    data = result.data
    found = "found" if data["config_found"] else "not found"
    lines = [f"config file: {data['config_path']} ({found})"]
    for variable, entry in data["settings"].items():
        lines.append(f"  {entry['key']:<32} = {entry['value']!r:<16} ({entry['source']}, {variable})")
    return "\n".join(lines)
