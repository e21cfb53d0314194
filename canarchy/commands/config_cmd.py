"""``config show`` (every setting, its value and where it came from) and ``config check``
(fails on any unknown key or table, or a value that does not convert)."""

from __future__ import annotations

import argparse

from canarchy import config
from canarchy.errors import ConfigError
from canarchy.output import CommandResult


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    group = subparsers.add_parser("config", parents=[parent], help="configuration")
    sub = group.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    sub.required = True
    p = sub.add_parser("show", parents=[parent], help="show each setting with its source (env, file, default)")
    p.set_defaults(command="config show", handler=_show, render_text=_render_text)
    p = sub.add_parser("check", parents=[parent],
                       help="check the config file: exit 1 on an unknown key or table or a bad value")
    p.set_defaults(command="config check", handler=_check, render_text=_render_check)


def _show(args: argparse.Namespace) -> CommandResult:
    path = config.config_path()
    resolved = config.load_config()
    settings = {
        variable: {"key": entry["key"], "value": entry["value"], "source": entry["source"]}
        for variable, entry in resolved.items()
    }
    return CommandResult(data={"config_path": str(path), "config_found": path.is_file(), "settings": settings,
                               "bus_kwargs": config.resolve_bus_kwargs()})


def _check(args: argparse.Namespace) -> CommandResult:
    """Every finding of the file (unknown names) and every value that does not convert."""
    path = config.config_path()
    document = config.read_config_file(path)
    problems = config.check_document(document, path) + config.value_problems()
    if problems:
        raise ConfigError("CONFIG_CHECK_FAILED", f"{len(problems)} problem(s): " + "; ".join(problems),
                          f"Fix or remove the names and values listed in {path}; "
                          "`canarchy config show` lists the known settings.")
    return CommandResult(data={"config_path": str(path), "config_found": path.is_file(), "problems": []})


def _render_text(result: CommandResult) -> str:
    data = result.data
    found = "found" if data["config_found"] else "not found"
    lines = [f"config file: {data['config_path']} ({found})"]
    for variable, entry in data["settings"].items():
        if variable == "CANARCHY_BUS_KWARGS":
            continue
        lines.append(f"  {entry['key']:<32} = {entry['value']!r:<16} ({entry['source']}, {variable})")
    kwargs = data["bus_kwargs"]
    if kwargs:
        lines.append("  transport.bus_kwargs (python-can keyword arguments, CANARCHY_BUS_KWARGS):")
    else:
        lines.append(f"  {'transport.bus_kwargs':<32} = {'{}':<16} (default, CANARCHY_BUS_KWARGS)")
    for name, entry in kwargs.items():
        lines.append(f"    {name:<30} = {entry['value']!r:<16} ({entry['source']})")
    return "\n".join(lines)


def _render_check(result: CommandResult) -> str:
    data = result.data
    if not data["config_found"]:
        return f"config file: {data['config_path']} (not found): nothing to check, the defaults apply"
    return f"config file: {data['config_path']}: every table, key and value is known and valid"
