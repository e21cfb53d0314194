"""Where the dashboard listens: a ``--bind HOST:PORT`` value checked into a :class:`Bind`.

Loopback only (127.0.0.0/8, ::1) unless ``allow_remote``; host names are never looked up here.
Errors: ``UserInputError`` ``WEB_BIND_INVALID`` (exit 1).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from canarchy.errors import UserInputError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_BIND = f"{DEFAULT_HOST}:{DEFAULT_PORT}"


@dataclass(frozen=True)
class Bind:
    """Where to listen: ``host`` (an address, or a name with ``allow_remote``), ``port``
    (0 = any free port), ``family`` (``socket.AF_INET`` or ``AF_INET6``), ``loopback``."""

    host: str
    port: int
    family: int
    loopback: bool


def _bind_error(text: str, why: str) -> UserInputError:
    return UserInputError("WEB_BIND_INVALID", f"--bind {text!r}: {why}",
                          "Give HOST:PORT with a loopback host, e.g. 127.0.0.1:8765, [::1]:8765, or "
                          "127.0.0.1:0 for any free port; other hosts need --allow-remote.")


def parse_bind(text: str, allow_remote: bool = False) -> Bind:
    """Parse ``HOST:PORT`` / ``[IPV6]:PORT`` / ``:PORT`` (host 127.0.0.1).

    ``localhost`` means 127.0.0.1 (no name lookup). Port 0..65535. A host that
    is not a loopback address (127.0.0.0/8, ::1) is refused unless
    ``allow_remote``. Raises ``UserInputError`` ``WEB_BIND_INVALID``.
    """
    host, port = _split_bind(text)
    host = host or DEFAULT_HOST
    if host.lower() == "localhost":
        host = DEFAULT_HOST
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None:
        return _named_bind(text, host, port, allow_remote)
    if not address.is_loopback and not allow_remote:
        raise _bind_error(text, f"{host} is not a loopback address; the dashboard has no authentication.")
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    return Bind(str(address), port, family, address.is_loopback)


def _split_bind(text: str) -> tuple[str, int]:
    """``(host as written, may be empty; port)`` of a ``--bind`` value."""
    raw = text.strip()
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0 or raw[end + 1:end + 2] != ":":
            raise _bind_error(text, "an IPv6 address is written [ADDRESS]:PORT.")
        host, port_text = raw[1:end], raw[end + 2:]
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep:
            raise _bind_error(text, "expected HOST:PORT.")
        if ":" in host:
            raise _bind_error(text, "an IPv6 address is written in brackets, [::1]:PORT.")
    if not (port_text.isascii() and port_text.isdigit()):
        raise _bind_error(text, f"port {port_text!r} is not a number.")
    port = int(port_text)
    if port > 65535:
        raise _bind_error(text, f"port {port} is above 65535.")
    return host, port


def _named_bind(text: str, host: str, port: int, allow_remote: bool) -> Bind:
    """The bind for a host name (not an address): only with ``allow_remote``, never looked up here."""
    if not allow_remote:
        raise _bind_error(text, f"{host!r} is not a loopback address; the dashboard has no authentication.")
    if not all(c.isalnum() or c in "-." for c in host) or len(host) > 253:
        raise _bind_error(text, f"{host!r} is not a host name or address.")
    return Bind(host, port, socket.AF_INET, False)
