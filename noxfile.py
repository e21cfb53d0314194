"""canarchy's verification lanes (docs/design/verification-harness.md).

    nox                                   # unit, integration, parity, mutation-530
    nox -s unit -- tests/test_cli.py -k json      # posargs only choose tests
    nox -t safety                         # parity and mutation-530

Every lane runs in an environment built from an allow-list
(``canarchy/testing/lanes/``), never the caller's shell, always with
``--strict-markers --strict-config -p no:cacheprovider`` and a JUnit report in
``reports/<lane>.xml``, and ends with a one-line verdict.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["unit", "integration", "parity", "mutation-530"]

ROOT = Path(__file__).resolve().parent
REPORTS = "reports"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
SAFETY_FLAGS = ("--strict-markers", "--strict-config", "-p", "no:cacheprovider")
# On Ctrl+C nox forwards SIGINT, then sends SIGTERM after `interrupt_timeout`
# and SIGKILL after `terminate_timeout` (0.3 s and 0.2 s by default): too short
# for a lane to stop its pytest runs and remove its temporary directories.
STOP_IN_TIME = {"interrupt_timeout": 30.0, "terminate_timeout": 10.0}


def _load_lanes():
    """Load canarchy/testing/lanes/env.py by path (standard library only): nox's
    interpreter need not have canarchy installed."""
    spec = importlib.util.spec_from_file_location("_canarchy_lane_env", ROOT / "canarchy" / "testing" / "lanes" / "env.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


lanes = _load_lanes()


@nox.session(tags=["tests"])
def unit(session: nox.Session) -> None:
    """Run the isolated unit suite (JUnit: reports/unit.xml)."""
    _install(session)
    _pytest(session, lane="unit")


@nox.session(tags=["tests", "bus"])
def integration(session: nox.Session) -> None:
    """Run the integration tests on a private loopback bus (or, with `-- --operator-bus`, the exported one)."""
    _install(session, multicast=True)
    operator = "--operator-bus" in session.posargs
    _pytest(session, lane="integration", markexpr="integration", bus="operator" if operator else "private",
            posargs=[a for a in session.posargs if a != "--operator-bus"])


@nox.session(tags=["safety"])
def parity(session: nox.Session) -> None:
    """Run the suite with and without an operator's home and shell; fail on any difference."""
    _install(session)
    _pytest(session, lane="parity", twins=True)


@nox.session(name="mutation-530", tags=["safety"])
def mutation_530(session: nox.Session) -> None:
    """Revert the #530 guard on a copy of the tree; pass only if its regression tests fail."""
    _install(session)
    _mutation(session, definition="fixtures/mutations/issue-530.toml")


@nox.session(tags=["harness"])
def mutations(session: nox.Session) -> None:
    """Remove every registered safety guard in turn (fixtures/mutations/); pass only if each is killed by all its killers."""
    _install(session)
    _mutation(session, definition="fixtures/mutations", action="run-all")


@nox.session(tags=["harness"])
def order(session: nox.Session) -> None:
    """Run the unit suite reversed and in seeded shuffles; fail on any difference, naming the polluter.

    ``nox -s order -- --seeds 5`` for seeds 1..5 (default 1..2), ``-- --seed 42`` for one seed;
    other posargs choose tests as in the unit lane.
    """
    _install(session)
    own, rest = _order_options(session)
    pytest_args = [*SAFETY_FLAGS, f"--junitxml={REPORTS}/order.xml", *_selection(session, markexpr=None, posargs=rest)]
    home = Path(session.virtualenv.location) / "lane-home"
    home.mkdir(exist_ok=True)
    session.run(
        "python", "-m", "canarchy.testing.lanes", "order", "run", *own, "--", *pytest_args,
        env=lanes.build_env(home=home), include_outer_env=False, **STOP_IN_TIME,
    )  # fmt: skip


@nox.session(tags=["harness"])
def selftest(session: nox.Session) -> None:
    """Feed the harness the seeded defects of fixtures/leaks/; pass only if each is caught by its detector."""
    _install(session)
    home = Path(session.virtualenv.location) / "lane-home"
    home.mkdir(exist_ok=True)
    session.run(
        "python", "-m", "canarchy.testing.lanes", "selftest", "run", "fixtures/leaks", "--reports", REPORTS,
        env=lanes.build_env(home=home), include_outer_env=False, **STOP_IN_TIME,
    )  # fmt: skip


def _order_options(session: nox.Session) -> tuple[list[str], list[str]]:
    """Split the order lane's own ``--seeds N`` / ``--seed S`` from the test selection."""
    own, rest, args = [], [], list(session.posargs)
    while args:
        token = args.pop(0)
        name, has_value, value = token.partition("=")
        if name in ("--seeds", "--seed"):
            if not has_value:
                if not args:
                    session.error(f"{name} needs a value")
                value = args.pop(0)
            if not value.isdigit():
                session.error(f"{name} takes a whole number, not {value!r}")
            own += [name, value]
        else:
            rest.append(token)
    return own, rest


def _install(session: nox.Session, *, multicast: bool = False) -> None:
    """Install canarchy with its `test` extra (pyproject.toml is the one list of dependencies).

    ``multicast``: also the ``integration`` extra (python-can's ``multicast``,
    i.e. ``msgpack``), which the integration lane's ``udp_multicast`` bus needs.
    Other lanes go without it on purpose: there a leaked ``udp_multicast`` bus
    cannot even open a socket.
    """
    extras = PYPROJECT["project"].get("optional-dependencies", {})
    wanted = ["test", "integration"] if multicast else ["test"]
    missing = [name for name in wanted if name not in extras]
    if missing:
        session.error(f"pyproject.toml lacks [project.optional-dependencies] {', '.join(missing)}: the lanes install it")
    session.install("-e", f".[{','.join(wanted)}]")


def _selection(session: nox.Session, *, markexpr: str | None, posargs: list[str] | None = None) -> list[str]:
    """posargs, checked to only choose tests (paths, node ids, -k, -m, --deselect); default ``tests``."""
    try:
        return lanes.choose_tests(session.posargs if posargs is None else posargs, fixed_markexpr=markexpr)
    except ValueError as exc:
        session.error(str(exc))


def _pytest(
    session: nox.Session,
    *,
    lane: str,
    markexpr: str | None = None,
    bus: str = "none",
    twins: bool = False,
    posargs: list[str] | None = None,
) -> None:
    """The one place the pytest command is built; runs it through canarchy.testing.lanes for the verdict.

    ``markexpr``: the lane's fixed ``-m``; ``bus``: ``"private"`` (a
    loopback-only namespace where possible, else none; an exported operator
    bus is ignored) or ``"operator"`` (the exported bus, explicitly chosen);
    ``twins``: the parity lane (clean and configured run, compared);
    ``posargs``: the selection (default: the session's posargs).
    """
    pytest_args = [
        *SAFETY_FLAGS,
        f"--junitxml={REPORTS}/{lane}.xml",
        *(["-m", markexpr] if markexpr else []),
        # parity reads python-can's "was not properly shut down" log records from the output
        *(["-o", "log_cli=true", "--log-cli-level=WARNING"] if twins else []),
        *_selection(session, markexpr=markexpr, posargs=posargs),
    ]
    home = Path(session.virtualenv.location) / "lane-home"
    home.mkdir(exist_ok=True)
    passthrough = lanes.OPERATOR_BUS_VARIABLES if bus in ("private", "operator") else ()
    env = lanes.build_env(home=home, passthrough=passthrough)
    if twins:
        wrapper = ["parity", "--operator-home", "fixtures/operator-home", "--allowlist", "fixtures/parity-allowlist.toml"]
    else:
        wrapper = ["run", "--lane", lane, "--bus", bus]
    session.run("python", "-m", "canarchy.testing.lanes", *wrapper, "--", *pytest_args, env=env, include_outer_env=False,
                **STOP_IN_TIME)


def _mutation(session: nox.Session, *, definition: str, action: str = "run") -> None:
    """Run one mutation definition (``run``) or a folder of them (``run-all``) with the
    session's interpreter; reports in reports/."""
    home = Path(session.virtualenv.location) / "lane-home"
    home.mkdir(exist_ok=True)
    env = lanes.build_env(home=home)
    session.run(
        "python", "-m", "canarchy.testing.lanes", "mutation", action, definition, "--reports", REPORTS,
        env=env, include_outer_env=False, **STOP_IN_TIME,
    )  # fmt: skip


@nox.session(tags=["bench"])
def bench(session: nox.Session) -> None:
    """Measure isolation, lanes, capture reading, start-up (reports/bench.md, docs/benchmarks.md); not pass/fail.

    ``nox -s bench -- --sections startup --startup-runs 30``: options of ``python -m benchmarks``.
    """
    _install(session)
    session.run("python", "-m", "benchmarks", "--nox-python", sys.executable, "--reports", REPORTS, *session.posargs,
                **STOP_IN_TIME)
