"""Running one measured child process, and the statistics the report uses.

:func:`run` starts a process with its output in temporary files and reaps it
with ``os.wait4``, so each run has its own resource usage: wall time (s),
CPU time (user + system, s) and peak resident set size (KiB, Linux
``ru_maxrss``). CPU time is the steadier figure on a shared machine: other
processes stretch the wall time of a run far more than its CPU time.

:func:`child_env` is the environment every measured child gets: the lanes'
allow-list (``canarchy.testing.lanes.env.build_env``) with a disposable home, so a
benchmark never reads or writes the operator's home.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping, Sequence


@dataclass(frozen=True)
class Run:
    """One finished child: ``wall`` and ``cpu`` in seconds, ``maxrss_kib`` in KiB,
    ``returncode`` (negative: killed by that signal), ``output`` (stdout + stderr
    as text), ``timed_out``."""

    wall: float
    cpu: float
    maxrss_kib: int
    returncode: int
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None, keep_output: bool = True) -> Run:
    """Run ``argv`` to completion and measure it (see the module docstring).

    ``timeout`` (s): the child's process group is killed after it, and the run is
    marked ``timed_out``. ``keep_output``: when false the output is discarded
    (``output`` is ``""``). Raises ``OSError`` if the program cannot be started.
    """
    with tempfile.TemporaryFile() as sink:
        target = sink if keep_output else subprocess.DEVNULL
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=target, stderr=subprocess.STDOUT,
                                start_new_session=True)
        expired = threading.Event()

        def _kill() -> None:
            expired.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

        timer = threading.Timer(timeout, _kill) if timeout else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if timer is not None:
                timer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        output = ""
        if keep_output:
            sink.seek(0)
            output = sink.read().decode("utf-8", "replace")
    return Run(wall=wall, cpu=usage.ru_utime + usage.ru_stime, maxrss_kib=int(usage.ru_maxrss),
               returncode=proc.returncode, output=output, timed_out=expired.is_set())


def child_env(home: str | os.PathLike[str], *, bytecode_prefix: str | os.PathLike[str] | None = None,
              extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a measured child: the lanes' allow-list, ``HOME`` = ``home``.

    Unlike a lane, byte code may be written (a user's installed canarchy has its
    ``.pyc`` files): into ``bytecode_prefix`` (``PYTHONPYCACHEPREFIX``) when
    given, so the checkout gets no ``__pycache__``; without it, not at all.
    """
    from canarchy.testing.lanes.env import build_env

    env = build_env(home=home, extra=extra)
    if bytecode_prefix is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.fspath(bytecode_prefix)
    return env


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> tuple[float, float]:
    """``(min, max)`` of ``values`` (NaNs when empty)."""
    return (min(values), max(values)) if values else (float("nan"), float("nan"))


def python() -> str:
    """The interpreter running the benchmarks (the lane's, under nox)."""
    return sys.executable


def venv_script(name: str) -> Path | None:
    """A console script installed next to :func:`python` (e.g. ``canarchy``), or None."""
    path = Path(sys.executable).parent / name
    return path if path.exists() else None


def machine() -> dict[str, object]:
    """What the figures depend on: cores, Python, platform, load averages."""
    import platform

    try:
        load = os.getloadavg()
    except OSError:  # not on every platform
        load = (float("nan"),) * 3
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(terse=True),
        "loadavg": [round(x, 2) for x in load],
    }
