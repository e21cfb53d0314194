"""Run the README's "Try it without hardware" section in this (private) network namespace.

Started by ``tests/test_quickstart.py`` inside ``unshare --net`` after it made
``lo`` and a veth pair ``lan0``/``lan1`` (``lan0`` with an address and the
default route: the machine's network interface; ``lan1``: the local network).
It sniffs ``lan1`` (``AF_PACKET``) while it runs the section's terminal 1
command in the background and the terminal 2 commands one by one (a line
ending in ``&`` in the background, ``wait`` for it), as ``argv[2]`` (a uid,
or ``-`` for this user), then sends one UDP datagram off the machine as a
control for the sniffer. Prints one JSON report on stdout.

Usage: ``python tests/quickstart_child.py README WORKDIR UID``
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SECTION = "## Try it without hardware"
UDP_MULTICAST_PORT = 43113  # python-can's udp_multicast bus binds it (UdpMulticastBus's default port)


def udp_sockets(port: int) -> int:
    """UDP sockets of this network namespace bound to ``port`` (``/proc/net/udp`` and ``udp6``)."""
    count = 0
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)  # the header
            count += sum(int(line.split()[1].rsplit(":", 1)[1], 16) == port for line in lines)
    return count


def blocks(readme: str) -> list[list[str]]:
    """The ``sh`` blocks of the section, as command lines (comments and blank lines dropped)."""
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    result = []
    for block in found:
        lines = []
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                lines.append(command)
        result.append(lines)
    return result


def sniff(ifname: str, stop: threading.Event, packets: list[bytes]) -> None:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    sock.bind((ifname, 0))
    sock.settimeout(0.1)
    try:
        while not stop.is_set():
            try:
                packets.append(sock.recv(65535))
            except TimeoutError:
                continue
    finally:
        sock.close()


def argv_of(line: str) -> list[str]:
    words = shlex.split(line)
    return [sys.executable, "-m", "canarchy", *words[1:]] if words[0] == "canarchy" else words


def main(readme_path: str, workdir: str, uid: str) -> int:
    setup, terminal1, terminal2 = blocks(Path(readme_path).read_text(encoding="utf-8"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANARCHY_", "CAN_"))}
    env["HOME"] = workdir
    for line in setup:
        words = shlex.split(line)
        if words[0] == "export":
            for item in words[1:]:
                key, _, value = item.partition("=")
                env[key] = value
    user = {} if uid == "-" else {"user": int(uid), "group": int(uid)}
    popen = dict(cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **user)
    stop, packets = threading.Event(), []
    sniffer = threading.Thread(target=sniff, args=("lan1", stop, packets))
    sniffer.start()
    time.sleep(0.3)
    report: dict = {"setup": setup, "commands": [], "uid": os.getuid() if uid == "-" else int(uid)}
    [server_line] = terminal1
    server = subprocess.Popen(argv_of(server_line), **popen)
    ready = ""  # stderr up to the ready line: the preflight warning, then "...: ready on ..."
    while server.poll() is None and ": ready on " not in ready:
        ready += server.stderr.readline()
    report["server_ready"] = ready.strip().splitlines()[-1] if ready.strip() else ""
    background: list[tuple[str, subprocess.Popen]] = []

    def finish(line: str, proc: subprocess.Popen) -> None:
        out, err = proc.communicate(timeout=120)
        report["commands"].append({"line": line, "returncode": proc.returncode, "stdout": out, "stderr": err})

    try:
        for line in terminal2:
            if line == "wait":
                while background:
                    finish(*background.pop(0))
                continue
            if line.endswith("&"):
                command = line[:-1].strip()
                before = udp_sockets(UDP_MULTICAST_PORT)
                proc = subprocess.Popen(argv_of(command), **popen)
                background.append((command, proc))
                deadline = time.monotonic() + 60  # the capture's bus is open before the traffic starts
                while udp_sockets(UDP_MULTICAST_PORT) <= before and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                continue
            finish(line, subprocess.Popen(argv_of(line), **popen))
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
        report["server"] = {"line": server_line, "returncode": server.returncode, "stdout": out,
                            "stderr": ready + err}
        for line, proc in background:
            proc.kill()
            finish(line, proc)
    # Control: a datagram for the default route leaves by lan0 and is seen on lan1.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        control.sendto(b"canarchy-quickstart-control", ("192.0.2.1", 9))
    time.sleep(0.5)
    stop.set()
    sniffer.join()
    report["packets"] = [p.hex() for p in packets]
    report["files"] = sorted(p.name for p in Path(workdir).iterdir())
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
