"""nox sessions over the lanes, for canarchy and for any project that adopts the harness.

A noxfile gets every session with ``from canarchy.testing.lanes.noxsessions import *`` (``docs/adopting.md``).
Each session installs the project (``[tool.canarchy.lanes] install``) and runs ``python -m
canarchy.testing.lanes LANE`` in an environment built from an allow-list (:mod:`.env`), never the caller's
shell; posargs only choose tests. Standard library and nox only: nox's interpreter need not have the
project's dependencies (this file and its two siblings are loaded by path).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import nox

__all__ = ["install", "integration", "lane", "mutations", "order", "parity", "selftest", "unit"]


def _load(key: str, path: Path):  # type: ignore[no-untyped-def]
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[key] = module  # dataclasses look their module up
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[key]


def _sibling(name: str):  # type: ignore[no-untyped-def]
    return _load(f"_canarchy_lanes_{name}", Path(__file__).with_name(f"{name}.py"))


_env = _sibling("env")
_tempbase = _load("_canarchy_tempbase", Path(__file__).parent.parent / "isolation" / "tempbase.py")
try:
    PROJECT = _sibling("project").load_project(Path.cwd())  # nox runs a noxfile from its own directory
except _sibling("project").ProjectError as _error:  # nox would print a traceback of its loader
    print(f"nox: {_error}\nnox: the lanes read the project's layout there (docs/adopting.md)", file=sys.stderr)
    raise SystemExit(2) from None
# On Ctrl+C nox waits `interrupt_timeout` for the lane (which the signal reached: from the terminal, or passed on
# by _signals_reach_the_lane), then sends SIGTERM, and SIGKILL after `terminate_timeout` (0.3 s and 0.2 s by
# default): too short for a lane to stop its runs.
STOP_IN_TIME = {"interrupt_timeout": 30.0, "terminate_timeout": 10.0}

nox.needs_version = ">=2025.2.9"
# `nox` alone runs the lanes the project has the data for (a noxfile may set its own list).
nox.options.sessions = ["unit", *(["parity"] if PROJECT.operator_home else []),
                        *(["mutations"] if PROJECT.mutations else [])]
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = True


#: uv leaves byte code uncompiled (pip compiles it): every Python a lane starts, and the suite's child
#: pythons, would compile pytest and the rest from source at each start (about 0.1 s each, docs/benchmarks.md).
INSTALL_ENV = {"UV_COMPILE_BYTECODE": "1"}


def install(session: nox.Session, *extra: str) -> None:
    """Install the project as its ``[tool.canarchy.lanes] install`` says, with the requirements of its
    ``install_groups`` (PEP 735, read by nox) and ``extra`` ones, byte code compiled."""
    groups = nox.project.dependency_groups(nox.project.load_toml(PROJECT.root / "pyproject.toml"),
                                           *PROJECT.install_groups) if PROJECT.install_groups else ()
    session.install(*PROJECT.install, *groups, env=INSTALL_ENV)
    if extra:
        session.install(*extra, env=INSTALL_ENV)
    # the lane runs `python -m canarchy.testing.lanes` in this virtualenv: an install that did not bring
    # canarchy would end in Python's bare "No module named 'canarchy'" (None: nox --install-only runs nothing)
    found = session.run("python", "-c", HARNESS_PROBE, silent=True)
    if isinstance(found, str) and found.strip().splitlines()[-1:] == ["False"]:
        session.error(f"`pip install {' '.join(PROJECT.install)}` did not install canarchy's harness "
                      "(canarchy.testing.lanes) into the session's virtualenv, and every lane runs from there: list "
                      "\"canarchy[lanes] @ ...\" (a direct reference: a bare canarchy on PyPI is another project) in "
                      "the project's `test` extra (or `tests`, where it has no `test`; [project.optional-dependencies] "
                      "in pyproject.toml, [options.extras_require] in setup.cfg; else its `test` or `tests` "
                      "dependency group), or name what to install in "
                      "[tool.canarchy.lanes] install (docs/adopting.md)")


#: prints whether the lanes' package imports in the session's Python (False for no canarchy, or another one)
HARNESS_PROBE = ("import importlib.util as u\n"
                 "try:\n    print(u.find_spec('canarchy.testing.lanes') is not None)\n"
                 "except ImportError:\n    print(False)\n")


def lane(session: nox.Session, name: str, *options: str, passthrough: tuple[str, ...] = ()) -> None:
    """Run one lane in the session's virtualenv; the session's posargs choose its tests."""
    # TMPDIR is the base itself, not a directory in it: the lane nests its runs' temporary trees
    # there, and a Unix socket's path (Chromium's, a test's) must stay under 108 bytes.
    base = temp_outside()
    home = tempfile.mkdtemp(prefix=f"canarchy-lane-{name}-home-", dir=base)
    pid_file = home + ".pid"  # beside the home: the lane's pid, for the signals nox passes on
    extra = {"TMPDIR": base, _LANE_PID_VARIABLE: pid_file}
    try:
        with _signals_reach_the_lane(pid_file):
            try:
                session.run("python", "-m", "canarchy.testing.lanes", name, *options, "--", *session.posargs,
                            env=_env.build_env(home=home, passthrough=passthrough, extra=extra),
                            include_outer_env=False, **STOP_IN_TIME)
            except KeyboardInterrupt:
                _wait_for_the_lane(pid_file)
                raise
    finally:
        shutil.rmtree(home, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(pid_file)


_LANE_PID_VARIABLE = "CANARCHY_LANE_PID_FILE"  # runner.LANE_PID_VARIABLE (this module imports no lane code)


def _wait_for_the_lane(pid_file: str) -> None:
    """Until the lane (the pid it wrote to ``pid_file``, nox's child) has ended, ``STOP_IN_TIME`` at most: a second
    Ctrl+C cuts nox's own wait short, and nox gave the prompt back while the lane still stopped its runs and
    removed its trees. A further Ctrl+C ends the wait (and reaches the lane: it kills its runs at once)."""
    with contextlib.suppress(OSError, ValueError), open(pid_file, encoding="ascii") as handle:
        pid = int(handle.read())
        deadline = time.monotonic() + STOP_IN_TIME["interrupt_timeout"]
        while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
            time.sleep(0.05)


@contextlib.contextmanager
def _signals_reach_the_lane(pid_file: str):  # type: ignore[no-untyped-def]
    """Within the block, a SIGINT or SIGTERM to nox is passed on to the lane (the pid it wrote to ``pid_file``),
    then is a Ctrl+C to nox, which waits for the lane (``STOP_IN_TIME``) and ends the session: nox itself
    passes nothing on (it counts on the terminal's process group), so a signal to nox's pid alone (``kill``,
    ``timeout``, a cancelled CI job) left the lane running, and nox then reported its verdict or left it
    orphaned. The lane takes the same signal from the terminal and from here as one interrupt
    (runner.SAME_INTERRUPT_SECONDS), and a SIGTERM when nox ends (``PR_SET_PDEATHSIG``)."""
    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError, ValueError), open(pid_file, encoding="ascii") as handle:
            os.kill(int(handle.read()), signum)
        signal.default_int_handler(signum, frame)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def temp_outside() -> str:
    """A temporary directory in neither the project nor the operator's home (nox's own
    ``session.create_tmp()`` is inside the project: a lane's homes would be in the checkout)."""
    base, note = _tempbase.outside_project(PROJECT.root)
    if note:
        print(f"nox: {note}", file=sys.stderr)
    return base


def _lane_options(session: nox.Session, **kinds: tuple[str, ...]) -> list[str]:
    """Take the lane's own options out of the session's posargs (:func:`~.env.lane_options`); the rest choose tests."""
    own, session.posargs[:] = _env.lane_options(session.posargs, **kinds)
    return own


@nox.session(tags=["tests"])
def unit(session: nox.Session) -> None:
    """Run the isolated suite (two pytest-xdist workers per core; reports/unit.xml).

    ``nox -s unit -- --jobs N``: N pytest-xdist workers (0: one process); other posargs choose tests.
    """
    install(session)
    lane(session, "unit", *_lane_options(session, valued=("--jobs",)))


@nox.session(tags=["tests", "bus"])
def integration(session: nox.Session) -> None:
    """Run the integration tests on a private loopback bus (with `-- --operator-bus`: the exported one)."""
    install(session, "python-can[multicast]")
    operator = "--operator-bus" in session.posargs
    session.posargs[:] = [a for a in session.posargs if a != "--operator-bus"]
    lane(session, "integration", *(["--operator-bus"] if operator else []), passthrough=_env.OPERATOR_BUS_VARIABLES)


@nox.session(tags=["safety"])
def parity(session: nox.Session) -> None:
    """Run the suite with and without an operator's home and shell, each on a copy; fail on a difference.

    ``nox -s parity -- --strict``: fail on flaky and hash-seed dependent tests too; ``-- --shards N``: N pytest
    processes a twin (default one per core); ``-- --jobs N``: N pytest-xdist workers instead; other posargs
    choose tests.
    """
    install(session)
    lane(session, "parity", *_lane_options(session, flags=("--strict",), valued=("--shards", "--jobs")))


@nox.session(tags=["harness"])
def mutations(session: nox.Session) -> None:
    """Remove every registered safety guard in turn on a copy; pass only if each is killed by its killers."""
    install(session)
    lane(session, "mutation")


@nox.session(tags=["harness"])
def order(session: nox.Session) -> None:
    """Run the suite reversed and in seeded shuffles; fail on a difference, naming the polluter.

    ``nox -s order -- --seeds 5``: seeds 1..5; ``-- --seed 42``: one seed; other posargs choose tests.
    """
    install(session)
    lane(session, "order", *_lane_options(session, valued=("--seeds", "--seed")))


@nox.session(tags=["harness"])
def selftest(session: nox.Session) -> None:
    """Feed the harness its corpus of seeded isolation defects; pass only if each is caught."""
    install(session)
    lane(session, "selftest")
