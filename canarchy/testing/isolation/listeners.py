"""What a connect or a send reaches on this host: the process bound there, for the access guard to refuse one outside
the run.

An operator's daemon acts on what it is sent, outside every isolation: one listening on a Unix-domain socket (a
terminal multiplexer's server, an agent, a bus), in the file system or the abstract namespace, or on a port of
loopback or of the host (a database, socketcand or cannelloni relaying their CAN bus, a debugger's port). The
sockets bound there come from ``/proc/net/unix`` and the kernel's socket monitoring, sock_diag(7) (else the
``/proc/net/tcp``, ``tcp6``, ``udp`` and ``udp6`` tables, proc(5)); their holders from the ``socket:[inode]``
links of ``/proc/PID/fd``. Linux only. Design: ``docs/design/test-isolation.md`` ("Layer 6: the access guard").
"""

from __future__ import annotations

import _socket
import contextlib
import ipaddress
import os
import socket
import stat
import struct
import sys

from canarchy.testing.isolation.reaper import at_or_below, first_outside, pids

#: This process's network namespace (Linux, namespaces(7)): its inode tells one namespace from another.
NETWORK_NAMESPACE = "/proc/self/ns/net"

#: Per socket type: the protocol and the states asked of the kernel (TCP: listening, ``1 << TCP_LISTEN``; UDP:
#: every socket), and the tables of this network namespace read where it cannot answer (TCP: state 0A).
_KINDS = {socket.SOCK_STREAM: (socket.IPPROTO_TCP, 1 << 10, ("/proc/net/tcp", "/proc/net/tcp6"), "0A"),
          socket.SOCK_DGRAM: (socket.IPPROTO_UDP, 0xFFFFFFFF, ("/proc/net/udp", "/proc/net/udp6"), None)}
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20  # linux/sock_diag.h
_DUMP_REQUEST = 0x301  # NLM_F_REQUEST | NLM_F_DUMP, linux/netlink.h
_NLMSG_ERROR, _NLMSG_DONE = 2, 3


def port_holder_outside(sock: socket.socket, address: object, run: int) -> str | None:
    """What a connect or a send of ``sock`` (AF_INET or AF_INET6, a stream or a datagram socket) to ``address``
    (host, port, ...) would reach outside the run, in words, else None: a process bound to that port on that
    address of this host, or on every address while the destination is one of this host's."""
    if sock.family not in (socket.AF_INET, getattr(socket, "AF_INET6", None)) or not isinstance(address, tuple):
        return None
    kind = _KINDS.get(sock.type & 0xF)
    if kind is None or len(address) < 2 or not isinstance(address[1], int):
        return None
    bound = [(where, inode) for where, port, inode in _bound_sockets(*kind) if port == address[1]]
    destinations = _addresses(address[0]) if bound else []  # nothing bound to that port: no name resolved
    if not destinations:
        return None
    local = _local_addresses()
    return held_outside({f"socket:[{inode}]" for where, inode in bound
                         if any(_reaches(d, where, local) for d in destinations)}, run)


def _bound_sockets(protocol: int, states: int, tables: tuple[str, ...], state: str | None) -> list:
    """``(address, port, inode)`` of the sockets of ``protocol`` in ``states``, from the kernel, which answers
    with those alone; else (no sock_diag for the protocol: ``udp_diag`` not loaded) from the tables, which the
    kernel writes walking every socket of the host (milliseconds on a busy one, for each connect)."""
    try:
        return [*_diag(socket.AF_INET, protocol, states), *_diag(socket.AF_INET6, protocol, states)]
    except OSError:
        return [entry for table in tables for entry in _bound(table, state)]


def _diag(family: int, protocol: int, states: int) -> list:
    """``(address, port, inode)`` of each socket of ``family`` and ``protocol`` in ``states`` (a mask of TCP
    states): a dump of the kernel's socket monitoring (``NETLINK_SOCK_DIAG``, sock_diag(7): ``struct
    inet_diag_req_v2`` asked, ``struct inet_diag_msg`` answered). Raises OSError where it cannot answer."""
    request = struct.pack("=BBBBI48x", family, protocol, 0, 0, states)
    found = []
    # _socket's own: made by this function, the audit event of the netlink socket is the guard's own work
    with contextlib.closing(_socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)) as link:
        link.sendall(struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _DUMP_REQUEST, 1, 0) + request)
        while True:
            data, offset = link.recv(1 << 16), 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR or length < 16 + 72:
                    raise OSError(f"sock_diag: no dump of protocol {protocol} (message type {kind})")
                body = offset + 16  # inet_diag_msg: family, state, timer, retrans; its id (sport at 4, src at 8)
                raw = data[body + 8:body + (24 if family == socket.AF_INET6 else 12)]
                found.append((ipaddress.ip_address(raw), struct.unpack_from(">H", data, body + 4)[0],
                              str(struct.unpack_from("=I", data, body + 68)[0])))  # its inode
                offset += (length + 3) & ~3
            if not data:
                raise OSError("sock_diag: the dump ended without its end")


def _reaches(destination: ipaddress._BaseAddress, bound: ipaddress._BaseAddress, local: set) -> bool:
    """Whether a packet to ``destination`` reaches a socket bound to ``bound`` (the wildcard: any address of this
    host and any multicast group, which Linux delivers to every such socket of the port (``IP_MULTICAST_ALL``):
    python-can's ``udp_multicast`` bus; an IPv6 socket also takes IPv4 as ``::ffff:a.b.c.d``)."""
    if isinstance(bound, ipaddress.IPv6Address) and bound.ipv4_mapped is not None:
        bound = bound.ipv4_mapped
    if bound.is_unspecified:  # a group's datagrams reach every socket of the host bound to their port
        return destination.is_loopback or destination.is_multicast or destination in local
    return destination == bound


def _addresses(host: object) -> list:
    """The addresses ``host`` names, as a connect reaches them: a literal, or a name (``str``, ``bytes``,
    ``bytearray``, which CPython takes alike) resolved the way a connect would (``getaddrinfo``: ``"0"`` and
    ``"0x0"`` too); the unspecified address is loopback (Linux's ip_route_connect)."""
    if isinstance(host, (bytes, bytearray)):
        try:
            host = bytes(host).decode("ascii")
        except UnicodeDecodeError:
            return []
    if not isinstance(host, str):
        return []
    try:
        found = [ipaddress.ip_address(host.partition("%")[0] or "0.0.0.0")]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except (OSError, UnicodeError):
            return []
        found = list({ipaddress.ip_address(info[4][0].partition("%")[0]) for info in infos})
    connected = []
    for address in found:
        if isinstance(address, ipaddress.IPv6Address):
            address = address.ipv4_mapped or address
        if address.is_unspecified:
            address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
        connected.append(address)
    return connected


def _bound(table: str, state: str | None) -> list:
    """``(address, port, inode)`` of each socket in ``table`` (in ``state``, when given)."""
    found = []
    try:
        with open(table, encoding="ascii") as fh:
            next(fh, None)  # the heading
            for line in fh:
                fields = line.split()
                if len(fields) < 10 or (state is not None and fields[3] != state):
                    continue
                host, _, port = fields[1].partition(":")
                found.append((_unhex(host), int(port, 16), fields[9]))
    except (OSError, ValueError):
        return []
    return found


def _unhex(text: str) -> ipaddress._BaseAddress:
    """An address as proc(5) prints it: 32-bit words in this host's byte order."""
    raw = b"".join(int(text[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(text), 8))
    return ipaddress.ip_address(raw)


def _local_addresses(fib_trie: str = "/proc/net/fib_trie") -> set:
    """The addresses a packet reaches this host by: its own (``fib_trie``'s ``/32 host LOCAL``,
    ``/proc/net/if_inet6``) and its broadcast ones (``/32 link BROADCAST``, and ``255.255.255.255``)."""
    found: set = {ipaddress.ip_address("255.255.255.255")}
    try:
        with open(fib_trie, encoding="ascii") as fh:
            last = None
            for line in fh:
                text = line.strip()
                if text.startswith("|--"):
                    last = text[3:].strip()
                elif text in ("/32 host LOCAL", "/32 link BROADCAST") and last:
                    found.add(ipaddress.ip_address(last))
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as fh:
            found.update(ipaddress.ip_address(bytes.fromhex(line.split()[0])) for line in fh if line.strip())
    except (OSError, ValueError):
        pass
    return found


def unix_table(table: str = "/proc/net/unix") -> list[tuple[bytes, bytes]]:
    """``(name, inode)`` of each Unix-domain socket bound in this network namespace (``/proc/net/unix``, proc(5):
    its last and its seventh column; an abstract name as ``@name``), [] where there is no such table."""
    try:
        with open(table, "rb") as fh:
            next(fh, None)  # the heading
            return [(fields[7], fields[6]) for fields in (line.rstrip(b"\n").split(None, 7) for line in fh)
                    if len(fields) == 8]
    except OSError:
        return []


def unix_listener_outside(address: str | bytes, run: int, table: str = "/proc/net/unix",
                          network_namespace: int = 0) -> str | None:
    """What a connect or a send to the Unix-domain socket ``address`` (a path, or an abstract name: its first
    byte NUL) would reach outside the run whose top pytest is ``run``, in words, else None: a process not at or
    below it holding a socket bound there (``/proc/net/unix``, proc(5), and the ``socket:[inode]`` links of
    ``/proc/PID/fd``); when no process the guard can see holds one, and none of the run's it cannot see (not
    dumpable: pytest's forked children) might, the process is one the run cannot see (another user's daemon).
    The operator's daemon, agent, terminal multiplexer or bus, bound in the file system outside the home or in
    the abstract namespace, acts on what it is sent, outside every isolation. ``network_namespace``: the inode
    of the run's private network namespace; in it, the table shows its own sockets only, and a socket file it
    does not show is bound in another (the host's, the operator's daemon). None where there is no such table,
    or nothing is bound there."""
    name = os.fsencode(address)
    bound = unix_table(table)
    if name[:1] == b"\0":
        shown = b"@" + name[1:].replace(b"\0", b"@")
        links = {f"socket:[{inode.decode()}]" for path, inode in bound if path == shown}
    else:
        links = {f"socket:[{inode.decode()}]" for path, inode in bound if _same_file(path, name)}
        if not links and network_namespace and _bound_elsewhere(name, network_namespace):
            return "a process outside the run's network namespace (the socket is bound in another: the host's)"
    return held_outside(links, run)


def _bound_elsewhere(address: bytes, network_namespace: int) -> bool:
    """Whether ``address`` is a socket file while this process is in the run's private network namespace
    ``network_namespace`` (a nested one of a test's child shows other sockets)."""
    try:
        return stat.S_ISSOCK(os.stat(address).st_mode) and os.stat(NETWORK_NAMESPACE).st_ino == network_namespace
    except OSError:
        return False


def held_outside(links: set[str], run: int) -> str | None:
    """Who outside the run whose top pytest is ``run`` holds a socket whose ``/proc/PID/fd`` link is one of
    ``links`` (``socket:[inode]``), in words, else None (see :func:`unix_listener_outside`)."""
    if not links:
        return None
    me = os.getpid()
    if _held_below(links, me):  # a test's own server: found without reading every process's descriptors
        return None
    holders, unseen = _socket_holders(links)
    if holders:
        return first_outside(holders, run)
    top = run if at_or_below(me, run) else me
    if any(at_or_below(pid, top) for pid in unseen):
        return None
    return "a process the run cannot see (no process of the run holds a socket bound there)"


def _held_below(links: set[str], pid: int) -> bool:
    """Whether ``pid`` and the processes below it (``/proc/PID/task/TID/children``, proc(5)) hold a socket of
    each of ``links``: then every socket bound there is the run's own (one an outside process shares, passed or
    inherited from the run, is the run's too). False where a descriptor list or a children file cannot be read:
    the caller then reads every process's."""
    left, stack, seen = set(links), [pid], set()
    while stack and left:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            left -= descriptor_links(pid)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", "rb") as fh:
                    stack += [int(child) for child in fh.read().split()]
        except OSError:
            continue
    return not left


def _same_file(bound: bytes, address: bytes) -> bool:
    """Whether the socket file bound at ``bound`` (a name in ``/proc/net/unix``) is the file ``address`` names
    (followed as a connect follows it): a symlink, a hard link, ``..`` or ``/proc/self/fd/N`` reach it too."""
    if bound[:1] != b"/":
        return False  # abstract, or bound by a relative name: not found by its file
    try:
        one, other = os.stat(bound), os.stat(address)
    except (OSError, ValueError):
        return False
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _socket_holders(links: set[str]) -> tuple[list[int], list[int]]:
    """The processes with a descriptor whose ``/proc/PID/fd`` link is one of ``links``, and those whose
    descriptors cannot be read."""
    found: list[int] = []
    unseen: list[int] = []
    for pid in pids():
        try:
            if not links.isdisjoint(descriptor_links(pid)):
                found.append(pid)
        except OSError:  # not listed, or listed but not readable (a process that is not dumpable)
            unseen.append(pid)
    return found, unseen


def descriptor_links(pid: int) -> set[str]:
    """What each descriptor of ``pid`` names (``/proc/PID/fd``, proc(5): ``socket:[inode]`` for a socket); one
    closed meanwhile is left out. Raises OSError where the list cannot be read, PermissionError where it is
    listed but not readable (a process that is not dumpable)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except PermissionError:
            raise
        except OSError:
            continue
    return found
