"""The active-transmit gate: nothing goes on a bus without it.

Every active command calls :func:`active_gate` after its dry-run check and before it opens a transport: a
one-line preflight warning on stderr; with ``[safety].require_active_ack`` and no ``--ack-active``,
``ACTIVE_ACK_REQUIRED`` (exit 1); with ``--ack-active``, ``YES`` typed on stdin (else
``ACTIVE_CONFIRMATION_DECLINED``, exit 1) unless ``CANARCHY_MCP_NONINTERACTIVE_ACK=1`` or the caller
collected the acknowledgement itself (:func:`caller_acknowledged`, the MCP server). Rules:
``docs/design/cli.md`` ("Active transmit").
"""

from __future__ import annotations

import argparse
import contextvars
import os
import sys
from contextlib import contextmanager
from typing import TextIO
from collections.abc import Iterator

from canarchy import config
from canarchy.errors import UserInputError
from canarchy.output import ShownWarning, terminal_safe

NONINTERACTIVE_ACK_VARIABLE = "CANARCHY_MCP_NONINTERACTIVE_ACK"
# Set only inside `caller_acknowledged()`: context-local, never process-wide.
_CALLER_ACKNOWLEDGED: contextvars.ContextVar[bool] = contextvars.ContextVar("canarchy_caller_acknowledged",
                                                                             default=False)


@contextmanager
def caller_acknowledged() -> Iterator[None]:
    """Within this block, ``--ack-active`` needs no typed ``YES``: the caller
    (e.g. an MCP client sending ``ack_active: true``) has acknowledged the
    transmission itself. Context-local: other threads and tasks, and the code
    after the block, are unaffected."""
    token = _CALLER_ACKNOWLEDGED.set(True)
    try:
        yield
    finally:
        _CALLER_ACKNOWLEDGED.reset(token)


def add_active_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--ack-active`` and ``--dry-run`` to an active command's parser."""
    parser.add_argument("--ack-active", action="store_true",
                        help="acknowledge that this command transmits on the bus (asks for YES); required where "
                             "[safety].require_active_ack is set")
    parser.add_argument("--dry-run", action="store_true", help="plan only: open no transport, send nothing")


def preflight_warning(command: str, channel: str, action: str) -> str:
    """The one-line preflight warning text for an active command."""
    return f"canarchy: ACTIVE TRANSMIT: `{command}` will {action} on channel {channel}."


def active_gate(command: str, channel: str, action: str, ack_active: bool,
                stdin: TextIO | None = None, stderr: TextIO | None = None) -> ShownWarning:
    """Run the gate for one active command; return the warning that was printed (for the envelope).

    ``action`` completes "will ... on channel X" (e.g. ``"send 17 UDS requests"``).
    Raises ``UserInputError`` with ``ACTIVE_ACK_REQUIRED`` or
    ``ACTIVE_CONFIRMATION_DECLINED``; ``ConfigError`` on a bad
    ``require_active_ack`` value.
    """
    stdin = sys.stdin if stdin is None else stdin
    stderr = sys.stderr if stderr is None else stderr
    warning = preflight_warning(command, channel, action)
    stderr.write(terminal_safe(warning) + "\n")
    stderr.flush()
    require_ack, _source = config.resolve("CANARCHY_REQUIRE_ACTIVE_ACK")
    if require_ack and not ack_active:
        raise UserInputError(
            "ACTIVE_ACK_REQUIRED",
            f"`{command}` transmits on {channel} and [safety].require_active_ack is set.",
            "Re-run with --ack-active to confirm, or use --dry-run to plan without transmitting.",
        )
    if ack_active and os.environ.get(NONINTERACTIVE_ACK_VARIABLE) != "1" and not _CALLER_ACKNOWLEDGED.get():
        stderr.write("Type YES to transmit: ")
        stderr.flush()
        answer = stdin.readline() if stdin is not None else ""
        if answer.strip() != "YES":
            raise UserInputError(
                "ACTIVE_CONFIRMATION_DECLINED",
                f"Transmission on {channel} was not confirmed.",
                "Type YES (upper case) at the prompt to transmit, or use --dry-run.",
            )
    return ShownWarning(warning)
