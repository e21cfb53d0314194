"""Shared test helpers: run the CLI in-process and read its envelope."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canarchy.cli import main

#: How every child pytest of these tests starts: this interpreter, no cache provider, and only
#: the plugins the child names (its conftest, ``-p``; ``-p xdist`` for workers). What a child
#: decides must not depend on the pytest plugins the person running the suite has installed,
#: nor its start-up on their number (about 1.2 s a child with hypothesis and pytest-benchmark
#: installed, 0.16 s with none loaded).
PYTEST = (sys.executable, "-m", "pytest", "--disable-plugin-autoload", "-p", "no:cacheprovider")


@dataclass
class CliRun:
    """One in-process CLI run: exit code, stdout text, stderr text, and (for --json) the envelope."""

    code: int
    out: str
    err: str = ""

    @property
    def envelope(self) -> dict[str, Any]:
        return json.loads(self.out)

    @property
    def data(self) -> dict[str, Any]:
        return self.envelope["data"]

    @property
    def error_codes(self) -> list[str]:
        return [e["code"] for e in self.envelope["errors"]]


# Prefix for a command a test interrupts "from the keyboard": SIGINT back at its
# default, as in a terminal, even when this suite was started in the background
# by a shell (which sets it to "ignore", and exec keeps that).
AS_IN_A_TERMINAL = [
    sys.executable, "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


# A test that records its pid in STARTED and then waits: what an interrupted lane must stop.
WAITING_TEST = """
import os, time
from pathlib import Path

def test_waits():
    Path({started!r}, str(os.getpid())).write_text("")
    time.sleep(120)
"""


@dataclass
class Interrupted:
    """A lane interrupted from the keyboard: its exit code, output, and the pids its tests wrote."""

    returncode: int
    out: str
    err: str
    pids: list[int]


def interrupt_once_started(argv: list[str], *, started: Path, runs: int, cwd: Path,
                           env: dict[str, str], signals: int = 1, signum: int = signal.SIGINT) -> Interrupted:
    """Start ``argv`` as from a terminal, send ``signum`` (``signals`` times, 150 ms apart) once
    ``runs`` waiting tests have written their pids into ``started``, and collect what it did
    (a second later, so a run that wrongly starts after the interrupt has had time to write
    its pid too)."""
    lane = subprocess.Popen(
        [*AS_IN_A_TERMINAL, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(started.iterdir())) < runs:
            assert lane.poll() is None and time.monotonic() < deadline, f"{runs} runs never started"
            time.sleep(0.05)
        for i in range(signals):
            if i:
                time.sleep(0.15)
            lane.send_signal(signum)
        out, err = lane.communicate(timeout=60)
    finally:
        if lane.poll() is None:
            os.killpg(lane.pid, signal.SIGKILL)
    time.sleep(1)
    return Interrupted(lane.returncode, out, err, [int(p.name) for p in started.iterdir()])


def require_isolation() -> None:
    """RuntimeError unless canarchy's isolation is active in this process."""
    from canarchy.testing.isolation.plugin import active_sandbox

    if active_sandbox() is None:
        raise RuntimeError("canarchy's isolation (canarchy.testing.isolation.plugin) is not active in this run: "
                           "these helpers write under the home and the working directory")


def disposable_home() -> Path:
    """``Path.home()``, after checking that it is a home canarchy's isolation
    made for this run. Raises RuntimeError when the isolation is not active
    (the suite run with its plugin disabled) or the home is the operator's
    (a ``real_home``/``integration`` test): the helpers below write there."""
    from canarchy.testing.isolation.plugin import active_sandbox

    require_isolation()
    sandbox = active_sandbox()
    home = Path.home().resolve()
    if sandbox.root not in home.parents:
        raise RuntimeError(
            f"refusing to write under {home}: it is not a disposable home of canarchy's isolation "
            "(is canarchy.testing.isolation.plugin active, and is this test not marked real_home/integration?)"
        )
    return home


def receivers(channel: str) -> int:
    """Buses open on a python-can virtual channel (python-can's own registry)."""
    from can.interfaces import virtual

    with virtual.channels_lock:
        return len(virtual.channels.get(channel, ()))


def recorded(requests: list, count: int, timeout: float = 10) -> list:
    """``requests`` (a simulated ECU's list, which its thread appends to in its own time) once it holds
    ``count`` entries, or after ``timeout`` seconds as it is then."""
    deadline = time.monotonic() + timeout
    while len(requests) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return requests


def open_slowly(monkeypatch: Any, seconds: float) -> None:
    """Every python-can bus canarchy opens takes ``seconds`` longer to open (an adapter slow to come up:
    udp_multicast joining its group, a USB adapter's driver)."""
    from canarchy.transport import PythonCanBackend

    real = PythonCanBackend._open_bus

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PythonCanBackend, "_open_bus", slow)


def run_cli(*argv: str) -> CliRun:
    """Run ``canarchy *argv`` in this process. It may write under the home and
    the working directory, so the isolation must be active (integration tests
    run it against the operator's environment on purpose)."""
    require_isolation()
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return CliRun(code, out.getvalue(), err.getvalue())


def write_user_config(text: str) -> Path:
    """Write ``~/.canarchy/config.toml`` in the (disposable) home of the running test."""
    path = disposable_home() / ".canarchy" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def same_value_ids(tmp_path: Path, recording: Path, stamp: str) -> tuple[Path, Path]:
    """``(log, dbc)``: the first real ``7E8#`` line of ``recording``, then its data on the 29-bit ID of the same
    value at ``stamp``; a DBC with an 11-bit ``STD`` and a 29-bit ``EXT`` message on that value."""
    line = next(line for line in recording.read_text(encoding="ascii").splitlines() if " 7E8#" in line)
    channel, data = line.split()[1], line.split("#")[1]
    log = tmp_path / "both.log"
    log.write_text(f"{line}\n({stamp}) {channel} 000007E8#{data}\n", encoding="ascii")
    dbc = tmp_path / "both.dbc"
    dbc.write_text('VERSION ""\n\nNS_ :\n\nBS_:\n\nBU_: ECU\n\n'
                   'BO_ 2024 STD: 8 ECU\n SG_ A : 0|8@1+ (1,0) [0|0] "" ECU\n\n'
                   'BO_ 2147485672 EXT: 8 ECU\n SG_ B : 8|8@1+ (1,0) [0|0] "" ECU\n', encoding="ascii")
    return log, dbc


@contextlib.contextmanager
def resource_warnings() -> Iterator[list[str]]:
    """The messages of the ``ResourceWarning`` s raised in the block and when it ends, after a garbage
    collection: a file left open, a process left running. The list is filled as the block ends."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield found
        gc.collect()
    found += [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


@contextlib.contextmanager
def listeners_outside(code: str) -> Iterator[dict[str, Any]]:
    """Run ``code`` (Python that binds sockets and sets ``found``, a JSON-able dict of what it bound) in a process of
    its own, a daemon beside the run, until the block ends; yields ``found``. Not this process's sockets: pytest
    makes itself not dumpable, and a guard that is not root cannot look at its descriptors (README's limits)."""
    source = f"import json, socket, sys\n{code}\nprint(json.dumps(found), flush=True)\nsys.stdin.read()\n"
    daemon = subprocess.Popen([sys.executable, "-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = daemon.stdout.readline()
        if not line:
            raise RuntimeError(f"the listening process ended before it said what it bound: {daemon.wait()}")
        yield json.loads(line)
    finally:
        daemon.stdin.close()
        daemon.stdout.close()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
