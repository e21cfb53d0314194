"""``plugins list``, ``plugins enable NAME``, ``plugins disable NAME``.

Discovery and the config file: :mod:`canarchy.plugins`; see ``docs/plugins.md``.

A name must be known: ``enable`` needs an installed plugin, ``disable`` an
installed or configured one; otherwise ``PLUGIN_NOT_FOUND`` (exit 1) and the
file is untouched. ``--force`` skips that check (to prepare the state of a
plugin before installing it, or to record a name the listing cannot see).
"""

from __future__ import annotations

import argparse

from canarchy.output import CommandResult
from canarchy.errors import UserInputError


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    """Register the ``plugins`` group: ``list``, ``enable``, ``disable``."""
    group = subparsers.add_parser("plugins", parents=[parent],
                                  help="list, enable and disable plugins (entry points canarchy.*)")
    sub = group.add_subparsers(dest="plugins_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("list", parents=[parent],
                       help="installed plugins with their state, and configured ones that are not installed")
    p.set_defaults(command="plugins list", handler=_list, render_text=_render_list)
    for verb, enabled in (("enable", True), ("disable", False)):
        p = sub.add_parser(verb, parents=[parent], help=f"{verb} a plugin ([plugins.NAME] in config.toml)")
        p.add_argument("name", metavar="NAME", help="the plugin's entry point name (see `plugins list`)")
        p.add_argument("--force", action="store_true",
                       help="write the state even when no such plugin is installed (or configured)")
        p.set_defaults(command=f"plugins {verb}", handler=_setter(enabled), render_text=_render_set)


def _list(args: argparse.Namespace) -> CommandResult:
    from canarchy import config, plugins

    path = config.config_path()
    found, warnings = plugins.list_plugins(path)
    return CommandResult(data={
        "config_path": str(path),
        "config_found": path.is_file(),
        "groups": list(plugins.GROUPS),
        "plugin_count": len(found),
        "installed_count": sum(1 for p in found if p.installed),
        "enabled_count": sum(1 for p in found if p.enabled),
        "plugins": [p.to_dict() for p in found],
    }, warnings=warnings)


def _setter(enabled: bool):
    def handler(args: argparse.Namespace) -> CommandResult:
        return _set(args, enabled)

    return handler


def _check_name(name: str) -> str:
    if not name.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise UserInputError("INVALID_ARGUMENTS", f"{name!r} is not a plugin name.",
                             "Give the plugin's entry point name as `plugins list` shows it.")
    return name


def _set(args: argparse.Namespace, enabled: bool) -> CommandResult:
    from canarchy import config, plugins

    name = _check_name(args.name)
    path = config.config_path()
    found, warnings = plugins.discover()
    states = plugins.configured_states(path)  # CONFIG_INVALID here, before anything is written
    installed = name in found
    known = installed or (not enabled and name in states)
    if not known and not args.force:
        verb = "enable" if enabled else "disable"
        listing = ", ".join(sorted(found)) or "none"
        raise UserInputError(
            "PLUGIN_NOT_FOUND",
            f"No plugin named {name!r} is installed{'' if enabled else ' or configured'} (installed: {listing}).",
            f"Check the name with `canarchy plugins list`, install the package, or pass --force to {verb} it anyway.",
        )
    outcome = plugins.set_enabled(name, enabled, path)
    if not installed:
        warnings = warnings + [f"plugin {name!r} is not installed; its state is recorded for when it is"]
    groups = sorted({ep.group for ep in found.get(name, [])}, key=plugins.GROUPS.index)
    return CommandResult(data={"name": name, "installed": installed, "groups": groups, **outcome},
                         warnings=warnings)


def _render_list(result: CommandResult) -> str:
    d = result.data
    lines = [f"{d['plugin_count']} plugin(s), {d['enabled_count']} enabled; state in {d['config_path']}"
             + ("" if d["config_found"] else " (not created yet)")]
    for p in d["plugins"]:
        state = "enabled " if p["enabled"] else "disabled"
        origin = "" if p["state_source"] == "config" else " (default)"
        if not p["installed"]:
            lines.append(f"  {p['name']:<24} {state}{origin}  not installed")
            continue
        where = ", ".join(f"{ep['group']} -> {ep['value']} ({ep['distribution'] or '?'} {ep['version'] or ''})".rstrip()
                          for ep in p["entry_points"])
        lines.append(f"  {p['name']:<24} {state}{origin}  {where}")
    return "\n".join(lines)


def _render_set(result: CommandResult) -> str:
    d = result.data
    state = "enabled" if d["enabled"] else "disabled"
    if not d["changed"]:
        return f"plugin {d['name']} already {state}; {d['config_path']} unchanged"
    return f"plugin {d['name']} {state} in {d['config_path']}"
