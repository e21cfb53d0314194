"""Structured errors: every failure a user can cause has a code, a message and a hint (never empty).

``CanarchyError`` (``code``, ``message``, ``hint``, ``exit_code``) and its classes: ``UserInputError``
(exit 1; ``ConfigError``, ``CONFIG_INVALID``, under it), ``TransportError`` (exit 2), ``DecodeError``
(exit 3). The CLI's one error boundary (``canarchy.cli.main``) turns any of them into an envelope error
``{code, message, hint}`` and the class's exit code; the codes: ``docs/design/cli.md``.
"""

from __future__ import annotations

from _thread import _local


class _PerThread(_local):
    """One value per thread with a ContextVar's ``get``/``set``/``reset`` (thread-local
    storage: no ``contextvars`` import at start-up; a new thread starts with None)."""

    value: object = None

    def get(self) -> object:
        return self.value

    def set(self, value: object) -> object:
        token, self.value = self.value, value
        return token

    def reset(self, token: object) -> None:
        self.value = token


#: Warnings of the running command that come from outside its handler (the config
#: file's unknown keys): a list while ``canarchy.cli.main`` runs a command, else None.
COMMAND_WARNINGS = _PerThread()

EXIT_OK = 0
EXIT_USER = 1
EXIT_TRANSPORT = 2
EXIT_DECODE = 3
#: The reader of the output went away (a closed pipe): 128 + SIGPIPE, what a shell
#: reports for a tool that SIGPIPE ended (``candump | head``).
EXIT_OUTPUT_CLOSED = 141


def one_full_stop(text: str) -> str:
    """``text`` with a sentence's doubled full stop made one: a reason that ends with '.' put before
    the '.' of the sentence around it ("cannot be read: Permission denied.." ). An ellipsis ('...'),
    a range ('0..8') and a path ('..') are left as they are."""
    if ".." not in text:
        return text
    import re

    return re.sub(r"(?<=[^.\s])\.\.(?=\s|$)", ".", text)


class CanarchyError(Exception):
    """Base of every error canarchy reports to a user.

    Attributes: ``code`` (UPPER_SNAKE string, stable: users and agents parse it),
    ``message`` (what went wrong, one sentence), ``hint`` (what to do about it,
    never empty), ``exit_code`` (process exit status for the CLI).
    """

    exit_code = EXIT_USER

    def __init__(self, code: str, message: str, hint: str) -> None:
        if not hint:
            raise ValueError(f"error {code} needs a non-empty hint")
        message, hint = one_full_stop(message), one_full_stop(hint)
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, str]:
        """Return the envelope form ``{"code", "message", "hint"}``."""
        return {"code": self.code, "message": self.message, "hint": self.hint}


class UserInputError(CanarchyError):
    """Bad input on the command line or in a file the user named (exit 1)."""

    exit_code = EXIT_USER


class ConfigError(UserInputError):
    """The configuration file or a configuration value is invalid (exit 1)."""


class TransportError(CanarchyError):
    """A CAN transport could not be opened, read or written (exit 2)."""

    exit_code = EXIT_TRANSPORT


class DecodeError(CanarchyError):
    """Data that does not decode or does not match its schema (exit 3)."""

    exit_code = EXIT_DECODE
