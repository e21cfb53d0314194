"""Private network namespaces for the lanes (Linux): ``unshare --net`` plus ``ip``.

:func:`netns_command` wraps a command to run in a fresh network namespace holding only ``lo`` (up) and a route
for IPv4 multicast (``224.0.0.0/4 dev lo``); a user other than root gets a user namespace too, where the
kernel allows it. python-can's ``udp_multicast`` (which needs ``msgpack``) round-trips frames there on the
IPv4 group :data:`NETNS_GROUP`; its IPv6 default fails with ENODEV. See
``docs/design/verification-harness.md`` §3.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from collections.abc import Mapping, Sequence

#: python-can ``udp_multicast``'s IPv4 default group: the channel of the bus the
#: integration lane provides inside the private namespace.
NETNS_GROUP = "239.74.163.2"


@dataclass(frozen=True)
class NetnsSupport:
    """Whether :func:`netns_command` can be used here; ``reason`` says why (not)."""

    available: bool
    reason: str
    unshare: str | None = None
    ip: str | None = None
    flags: tuple[str, ...] = ("--net",)


_NETNS_CACHE: NetnsSupport | None = None
_SBIN_PATH = os.pathsep.join(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])


def _setup_script(ip: str) -> str:
    return f"{ip} link set lo up && {ip} route add 224.0.0.0/4 dev lo"


def netns_support(*, refresh: bool = False) -> NetnsSupport:
    """Probe once whether a private network namespace can be made (Linux, ``unshare``, ``ip``)."""
    global _NETNS_CACHE
    if _NETNS_CACHE is not None and not refresh:
        return _NETNS_CACHE
    _NETNS_CACHE = _probe_netns()
    return _NETNS_CACHE


def _probe_netns() -> NetnsSupport:
    if not sys.platform.startswith("linux"):
        return NetnsSupport(False, f"network namespaces are Linux-only (this is {sys.platform})")
    flags = ("--net",) if os.geteuid() == 0 else ("--user", "--map-root-user", "--net")
    search = os.pathsep.join(filter(None, [os.environ.get("PATH"), _SBIN_PATH]))
    unshare, ip = shutil.which("unshare", path=search), shutil.which("ip", path=search)
    if unshare is None or ip is None:
        missing = " and ".join(n for n, p in (("unshare", unshare), ("ip", ip)) if p is None)
        return NetnsSupport(False, f"{missing} not found (util-linux / iproute2)")
    try:
        proc = subprocess.run(
            [unshare, *flags, "--", "sh", "-c", _setup_script(ip)],
            capture_output=True,
            text=True,
            timeout=10,
            env={"PATH": _SBIN_PATH},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return NetnsSupport(False, f"`unshare --net` could not run: {exc}")
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        hint = "" if os.geteuid() == 0 else " (unprivileged user namespaces refused? run the lane as root)"
        return NetnsSupport(False, f"`unshare {' '.join(flags)}` failed: "
                                   f"{detail[-1] if detail else proc.returncode}{hint}")
    where = "" if os.geteuid() == 0 else ", in a user namespace of its own"
    return NetnsSupport(True, f"private network namespace (loopback only, IPv4 multicast routed to lo{where})",
                        unshare, ip, flags)


def netns_command(argv: Sequence[str], support: NetnsSupport | None = None) -> list[str]:
    """Wrap ``argv`` to run in a fresh network namespace holding only ``lo``.

    The wrapped command execs in place of the shell, so signals reach it and
    the namespace ends when it exits. Raises ``RuntimeError`` when
    :func:`netns_support` says it is unavailable.
    """
    support = support or netns_support()
    if not support.available or support.unshare is None or support.ip is None:
        raise RuntimeError(f"no private network namespace: {support.reason}")
    return [support.unshare, *support.flags, "--", "sh", "-c", _setup_script(support.ip) + ' && exec "$@"', "sh",
            *argv]


_ROUNDTRIP_CODE = """
import sys, can
group = sys.argv[1]
a = can.Bus(interface="udp_multicast", channel=group, ignore_config=True)
try:
    b = can.Bus(interface="udp_multicast", channel=group, ignore_config=True)
    try:
        sent = can.Message(arbitration_id=0x18FEF100, is_extended_id=True, data=bytes(range(8)))
        a.send(sent)
        got = b.recv(2.0)
        ok = got is not None and got.arbitration_id == sent.arbitration_id and bytes(got.data) == bytes(sent.data)
        print("round trip ok" if ok else f"round trip FAILED: received {got!r}")
        sys.exit(0 if ok else 1)
    finally:
        b.shutdown()
finally:
    a.shutdown()
"""


def netns_roundtrip(python: str, *, env: Mapping[str, str] | None = None, timeout: float = 30) -> tuple[bool, str]:
    """Prove the provided bus works: inside a private namespace, two python-can
    ``udp_multicast`` buses on :data:`NETNS_GROUP` in one process exchange one
    extended frame. Returns (ok, output). Needs ``msgpack`` in ``python``.
    """
    support = netns_support()
    if not support.available:
        return False, support.reason
    argv = netns_command([python, "-c", _ROUNDTRIP_CODE, NETNS_GROUP], support)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None)
    except subprocess.TimeoutExpired:
        return False, f"round trip timed out after {timeout} s"
    output = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0 and "round trip ok" in proc.stdout, output


