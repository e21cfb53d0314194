"""Move the test process into a private network namespace (Linux).

The bus guard works inside Python: a child process that drops the test's
environment (``python -I``, ``env={...}``) never loads it. A network
namespace works in the kernel: CAN interfaces (``can0``, ``vcan0``) and every
route off the machine belong to the namespace they were made in, so a
process in a fresh one finds only ``lo``, whatever it runs. Children inherit
the namespace of the thread that starts them.

:func:`enter_private_network` calls ``unshare(CLONE_NEWNET)`` for the calling
thread (the main thread, early in ``pytest_configure``, before pytest-xdist
starts workers or anything starts threads) and brings ``lo`` up with the
``SIOCGIFFLAGS``/``SIOCSIFFLAGS`` ioctls (what ``ip link set lo up`` does),
so loopback servers in tests keep working. It needs ``CAP_SYS_ADMIN`` (root);
elsewhere it changes nothing and says why. The namespace ends with the last
process in it. Constants: ``CLONE_NEWNET`` from ``<sched.h>``, the ioctl
numbers and ``IFF_UP`` from ``<linux/sockios.h>``/``<net/if.h>``.

No pytest import here: the plugin drives it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the 24-byte union


def current_namespace() -> str | None:
    """The calling thread's network namespace as the kernel names it
    (``"net:[4026531840]"``), or None where there is no ``/proc``."""
    for path in ("/proc/thread-self/ns/net", "/proc/self/ns/net"):
        try:
            return os.readlink(path)
        except OSError:
            continue
    return None


def _unshare_network() -> None:
    """``unshare(CLONE_NEWNET)``; OSError with the errno on failure."""
    unshare = getattr(os, "unshare", None)  # Python 3.12+
    if unshare is not None:
        unshare(CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(CLONE_NEWNET)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _bring_loopback_up() -> None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        _, flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


def enter_private_network() -> tuple[bool, str]:
    """Move the calling thread (and every process it starts afterwards) into a
    new network namespace holding only ``lo``, up.

    Returns ``(True, note)`` when done, ``(False, note with the reason)`` when
    the machine does not allow it (not Linux, not root, no ``/proc``); never
    raises for those. If ``lo`` cannot be brought up the namespace is kept
    (nothing can leave it either way) and the note says so.
    """
    if not sys.platform.startswith("linux"):
        return False, f"the host's (network namespaces are Linux-only; this is {sys.platform})"
    before = current_namespace()
    try:
        _unshare_network()
    except OSError as exc:
        reason = "not root" if exc.errno == errno.EPERM else (exc.strerror or str(exc))
        return False, f"the host's (unshare(CLONE_NEWNET): {reason})"
    after = current_namespace()
    if before is not None and after == before:  # pragma: no cover - a kernel that ignored the call
        return False, "the host's (unshare(CLONE_NEWNET) left the namespace unchanged)"
    try:
        _bring_loopback_up()
    except OSError as exc:  # pragma: no cover - lo exists in every new namespace
        return True, f"a private namespace without loopback ({exc.strerror or exc}): nothing reaches a network"
    return True, "a private namespace (loopback only): no CAN interface, no route off the machine"
