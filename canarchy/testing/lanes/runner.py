"""The one way the lanes run pytest: a child process, its output kept in a log.

Processes still running are stopped on an interrupt (:func:`stop_all`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from canarchy.testing.lanes.netns import netns_command

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_CANNOT_DECIDE = 2


# pytest processes started by run_pytest and still running (parity runs two from threads).
_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_all() -> None:
    """Stop every pytest process still running (an interrupt reached only this thread)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _stop(proc)


@dataclass
class PytestRun:
    """One pytest process: exit code, its output, the parsed summary line, duration (s)."""

    returncode: int
    output: str
    summary: dict[str, int] | None
    duration: float
    junit: Path
    log: Path


def junit_path(pytest_args: Sequence[str]) -> Path:
    """The single ``--junitxml=PATH`` in ``pytest_args``; ``ValueError`` if absent or repeated."""
    found = [a.split("=", 1)[1] for a in pytest_args if a.startswith("--junitxml=")]
    if len(found) != 1 or any(a == "--junitxml" for a in pytest_args):
        raise ValueError("pytest arguments must contain exactly one --junitxml=PATH")
    return Path(found[0])


def with_junit(pytest_args: Sequence[str], path: Path) -> list[str]:
    """``pytest_args`` with its ``--junitxml=`` replaced by ``path``."""
    junit_path(pytest_args)
    return [f"--junitxml={path}" if a.startswith("--junitxml=") else a for a in pytest_args]


def run_pytest(
    python: str,
    pytest_args: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    netns: bool = False,
    echo: bool = True,
    cwd: str | os.PathLike[str] | None = None,
) -> PytestRun:
    """Run ``python -m pytest PYTEST_ARGS`` and keep its output in ``log``.

    ``echo`` also streams the output to our stdout (one lane at a time);
    ``netns`` runs it in a private network namespace. A stale JUnit file
    from an earlier run is removed first so it can never be read as this run's.
    """
    junit = junit_path(pytest_args)
    if cwd is not None and not junit.is_absolute():
        junit = Path(cwd) / junit
    junit.unlink(missing_ok=True)
    junit.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pytest", *pytest_args]
    if netns:
        argv = netns_command(argv)
    start = time.monotonic()
    chunks: list[str] = []
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                chunks.append(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            proc.wait()
        finally:
            _stop(proc)
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    from canarchy.testing.lanes.results import parse_summary

    output = "".join(chunks)
    return PytestRun(proc.returncode, output, parse_summary(output), time.monotonic() - start, junit, log)


class Terminated(BaseException):
    """Raised by the SIGTERM handler so ``finally`` blocks clean up."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def raise_on_sigterm() -> None:
    """Turn SIGTERM into an exception so temporary homes are removed on the way out
    (SIGINT already arrives as KeyboardInterrupt)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)




def split_pytest_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(lane options, pytest arguments)``: what comes before and after the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []
