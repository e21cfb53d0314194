"""What changes the host's network interfaces from a test's Python code, where the run has no network namespace
of its own: a netlink socket (``AF_NETLINK``; rtnetlink sets a link up or down, a CAN interface's bitrate, an
address or a route, sock_diag destroys another process's sockets, generic netlink reaches ethtool) and a
socket-configuration ioctl that is not a read (linux/sockios.h, ``0x890B``-``0x89FF``: ``SIOCSIFFLAGS``,
``SIOCSIFMTU``, ``SIOCETHTOOL``, a device's private ones); and a raw IP socket, whose packets reach any port of
the host (a daemon's) with no port in the address to judge. Linux only; standard library only.
"""

from __future__ import annotations

import _socket
import os
import socket
import sys

AF_NETLINK = getattr(socket, "AF_NETLINK", 16)
_IP = (socket.AF_INET, socket.AF_INET6)
#: A socket type without its flags (SOCK_NONBLOCK, SOCK_CLOEXEC): linux/net.h's SOCK_TYPE_MASK.
SOCKET_TYPE_MASK = 0xF
#: The socket-configuration requests of linux/sockios.h (routes, interfaces, ARP, bridges, device-private ones).
_SOCKIOS = range(0x890B, 0x8A00)
#: Those that only read (linux/sockios.h): SIOCGIFNAME, GIFCONF, GIFFLAGS, GIFADDR, GIFDSTADDR, GIFBRDADDR,
#: GIFNETMASK, GIFMETRIC, GIFMEM, GIFMTU, GIFENCAP, GIFHWADDR, GIFSLAVE, GIFINDEX, GIFPFLAGS, GIFCOUNT, GIFBR,
#: GIFTXQLEN, GMIIPHY, GMIIREG, OUTQNSD, GARP, GRARP, GIFMAP, GHWTSTAMP. ``SIOCETHTOOL`` carries ethtool's reads
#: and writes alike, in memory the request points to: judged a change.
_READS = frozenset({0x8910, 0x8912, 0x8913, 0x8915, 0x8917, 0x8919, 0x891B, 0x891D, 0x891F, 0x8921, 0x8925, 0x8927,
                    0x8929, 0x8933, 0x8935, 0x8938, 0x8940, 0x8942, 0x8947, 0x8948, 0x894B, 0x8954, 0x8961, 0x8970,
                    0x89B1})
#: The audit events judged here (CPython 3.11 "Audit events table"): (socket, family, type, protocol), and
#: (fd, request, argument), the request already an unsigned int.
EVENTS = frozenset({"socket.__new__", "fcntl.ioctl"}) if sys.platform.startswith("linux") else frozenset()


def interface_change(event: str, args: tuple) -> tuple[str, str] | None:
    """``(operation, what)`` in words for an event of :data:`EVENTS` that can change the host's network
    interfaces, else None."""
    if event == "socket.__new__" and args[1] == AF_NETLINK:
        return f"open a netlink socket (protocol {args[3]}) to", "the kernel's network configuration"
    if event == "socket.__new__" and args[1] in _IP and args[2].__class__ is int and (
            args[2] & SOCKET_TYPE_MASK == socket.SOCK_RAW):
        return "open a raw IP socket (its packets carry their own ports, past the port check) on", "the host's network"
    if event == "fcntl.ioctl" and args[1].__class__ is int and args[1] in _SOCKIOS and args[1] not in _READS:
        return f"change a network interface (ioctl {args[1]:#06x}) through", f"descriptor {args[0]}"
    return None


def socket_family(fd: int) -> int | None:
    """The address family of the socket open on descriptor ``fd`` (``SO_DOMAIN``), or None where it cannot say."""
    try:
        copy = _socket.socket(fileno=os.dup(fd))  # the guard's own look: no audit event a test could be blamed for
    except OSError:
        return None
    try:
        return copy.family
    finally:
        copy.close()
