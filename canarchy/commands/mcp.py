"""``mcp serve``: canarchy's tools for agents over the Model Context Protocol (stdio).

This module only registers the command; the server (:mod:`canarchy.mcp_server`) and the MCP SDK are
imported when it runs. ``--files DIR`` and ``--allow-active CHANNEL`` widen what the tools may do (neither
by default). stdout belongs to the protocol: ``--json``/``--jsonl`` are ``INVALID_ARGUMENTS``. Exit 0 when
the client closes stdin and on SIGINT/SIGTERM. Tools, schemas and safety: ``docs/mcp.md``.
"""

from __future__ import annotations

import argparse

from canarchy.output import CommandResult
from canarchy.errors import UserInputError


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    """Register the `mcp` group and its `serve` command."""
    group = subparsers.add_parser("mcp", parents=[parent], help="Model Context Protocol server for agents")
    sub = group.add_subparsers(dest="mcp_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("serve", parents=[parent],
                       help="serve canarchy's tools over MCP on stdin/stdout (stops on EOF, SIGINT, SIGTERM)")
    p.add_argument("--files", action="append", default=[], metavar="DIR",
                   help="let the file tools read recordings under DIR (repeatable; default: no files)")
    p.add_argument("--allow-active", action="append", default=[], metavar="CHANNEL",
                   help="let the active tools transmit on CHANNEL (repeatable; default: on none)")
    p.set_defaults(command="mcp serve", handler=_serve, render_text=_render_text)


def _serve(args: argparse.Namespace) -> CommandResult:
    output = getattr(args, "output", "text")
    if output != "text":
        raise UserInputError(
            "INVALID_ARGUMENTS",
            f"`mcp serve` speaks MCP on stdout; --{output} does not apply.",
            "Run `canarchy mcp serve` without an output flag; each tool answers with a JSON envelope.",
        )
    from canarchy.mcp_tools import ServerPolicy

    policy = ServerPolicy.build(args.files, args.allow_active)
    try:
        from canarchy import mcp_server

        stopped_by = mcp_server.serve_stdio(policy)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("mcp", "mcp_types", "anyio"):
            raise
        raise UserInputError(
            "MCP_SDK_MISSING",
            f"The MCP SDK is not installed ({exc.name} is missing).",
            "Install it with `pip install 'mcp>=2'` (a canarchy dependency) and run `canarchy mcp serve` again.",
        ) from None
    return CommandResult(data={"stopped_by": stopped_by})


def _render_text(result: CommandResult) -> str:
    # Nothing: after the serve, stdout is still the client's pipe.
    return ""
