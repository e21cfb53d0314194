"""`dbc cache list`, `dbc cache prune` and `skills cache list`.

Offline commands: they read manifests under the cache roots
(:mod:`canarchy.dbc_cache`, :mod:`canarchy.skills_cache`) and never import
python-can. Data shapes and error codes: ``docs/caches-and-sessions.md``.
"""

from __future__ import annotations

import argparse
from typing import Any

from canarchy.output import CommandResult


def add_parser(subparsers: Any, parent: argparse.ArgumentParser) -> None:
    """Register the `dbc` and `skills` groups, each with a `cache` subgroup."""
    dbc = subparsers.add_parser("dbc", parents=[parent], help="DBC files and the local DBC cache")
    dbc_sub = dbc.add_subparsers(dest="dbc_command", metavar="COMMAND")
    dbc_sub.required = True
    dbc_cache = dbc_sub.add_parser("cache", parents=[parent], help="inspect or prune the local DBC cache")
    dbc_cache_sub = dbc_cache.add_subparsers(dest="dbc_cache_command", metavar="COMMAND")
    dbc_cache_sub.required = True

    p = dbc_cache_sub.add_parser("list", parents=[parent], help="list cached DBC providers and files")
    p.set_defaults(command="dbc cache list", handler=_dbc_list, render_text=_render_list)

    p = dbc_cache_sub.add_parser("prune", parents=[parent],
                                 help="remove cached commits other than each manifest's current one")
    p.add_argument("--provider", metavar="P", help="prune only this provider")
    p.set_defaults(command="dbc cache prune", handler=_dbc_prune, render_text=_render_prune)

    skills = subparsers.add_parser("skills", parents=[parent], help="skills and the local skills cache")
    skills_sub = skills.add_subparsers(dest="skills_command", metavar="COMMAND")
    skills_sub.required = True
    skills_cache = skills_sub.add_parser("cache", parents=[parent], help="inspect the local skills cache")
    skills_cache_sub = skills_cache.add_subparsers(dest="skills_cache_command", metavar="COMMAND")
    skills_cache_sub.required = True

    p = skills_cache_sub.add_parser("list", parents=[parent], help="list cached skills providers and files")
    p.set_defaults(command="skills cache list", handler=_skills_list, render_text=_render_list)


def _dbc_list(args: argparse.Namespace) -> CommandResult:
    from canarchy import dbc_cache

    data, warnings = dbc_cache.list_cache()
    return CommandResult(data=data, warnings=warnings)


def _dbc_prune(args: argparse.Namespace) -> CommandResult:
    from canarchy import dbc_cache

    data, warnings = dbc_cache.prune_cache(args.provider)
    return CommandResult(data=data, warnings=warnings)


def _skills_list(args: argparse.Namespace) -> CommandResult:
    from canarchy import skills_cache

    data, warnings = skills_cache.list_cache()
    return CommandResult(data=data, warnings=warnings)


def _render_list(result: CommandResult) -> str:
    data = result.data
    lines = [f"cache root: {data['cache_root']}", f"providers: {data['provider_count']}"]
    if data.get("default_provider"):
        lines.append(f"default provider: {data['default_provider']}")
    for provider in data["providers"]:
        lines.append(
            f"  {provider['provider']}  commit {provider['commit']}  fetched {provider['fetched_at']}  "
            f"{provider['file_count']} files, {provider['bytes']} bytes"
        )
        for entry in provider["files"]:
            missing = "" if entry["present"] else "  (missing)"
            lines.append(f"    {entry['path']}  {entry['bytes']} bytes{missing}")
    return "\n".join(lines)


def _render_prune(result: CommandResult) -> str:
    data = result.data
    lines = [f"cache root: {data['cache_root']}",
             f"removed: {data['removed_count']} ({data['bytes_freed']} bytes freed)"]
    lines.extend(f"  {path}" for path in data["removed"])
    return "\n".join(lines)
