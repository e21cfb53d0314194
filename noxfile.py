"""canarchy's verification lanes (docs/design/verification-harness.md).

    nox                                        # unit, integration, parity, mutation-530
    nox -s unit -- tests/test_cli.py -k json   # posargs only choose tests
    nox -t harness                             # mutations, order, selftest

The sessions live in canarchy/testing/lanes/noxsessions.py (shared with every
project that adopts the harness); this file adds canarchy's own.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nox

_spec = importlib.util.spec_from_file_location(
    "_canarchy_noxsessions", Path(__file__).parent / "canarchy" / "testing" / "lanes" / "noxsessions.py")
lanes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lanes)  # registers unit, integration, parity, mutations, order, selftest

nox.options.sessions = ["unit", "integration", "parity", "mutation-530"]


@nox.session(name="mutation-530", tags=["safety"])
def mutation_530(session: nox.Session) -> None:
    """Revert the #530 guard on a copy of the tree; pass only if its regression tests fail."""
    lanes.install(session)
    lanes.lane(session, "mutation", "fixtures/mutations/issue-530.toml")


@nox.session(tags=["lint"])
def lint(session: nox.Session) -> None:
    """Lint the tree with ruff (its rules: pyproject.toml [tool.ruff])."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(tags=["bench"])
def bench(session: nox.Session) -> None:
    """Measure isolation, lanes, capture reading, start-up (reports/bench.md, docs/benchmarks.md); not pass/fail.

    ``nox -s bench -- --sections startup --startup-runs 30``: options of ``python -m benchmarks``.
    """
    lanes.install(session)
    session.run("python", "-m", "benchmarks", "--nox-python", sys.executable, "--reports", "reports",
                *session.posargs, **lanes.STOP_IN_TIME)
