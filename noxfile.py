"""canarchy's verification lanes (docs/design/verification-harness.md).

    nox                                        # unit, integration, parity, mutation-530
    nox -s unit -- tests/test_cli.py -k json   # posargs only choose tests
    nox -t harness                             # mutations, order, selftest, adopter

The sessions live in canarchy/testing/lanes/noxsessions.py (shared with every
project that adopts the harness); this file adds canarchy's own.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import nox

_spec = importlib.util.spec_from_file_location(
    "_canarchy_noxsessions", Path(__file__).parent / "canarchy" / "testing" / "lanes" / "noxsessions.py")
lanes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lanes)  # registers unit, integration, parity, mutations, order, selftest

nox.options.sessions = ["unit", "integration", "parity", "mutation-530"]
ROOT = Path(__file__).resolve().parent


@nox.session(name="mutation-530", tags=["safety"])
def mutation_530(session: nox.Session) -> None:
    """Revert the #530 guard on a copy of the tree; pass only if its regression tests fail."""
    lanes.install(session)
    lanes.lane(session, "mutation", "fixtures/mutations/issue-530.toml")


@nox.session(tags=["harness"])
def adopter(session: nox.Session) -> None:
    """Adopt the harness as another project would (fixtures/adopter, docs/adopting.md): its lanes on a copy."""
    base = Path(session.create_tmp()).resolve() / "adopter"
    shutil.rmtree(base, ignore_errors=True)  # the copy alone in its directory: its flaky test counts runs beside it
    project = base / "busprobe"
    shutil.copytree(ROOT / "fixtures" / "adopter", project, ignore=shutil.ignore_patterns("reports", ".nox",
                                                                                         "__pycache__"))
    session.install("-e", f"{ROOT}[lanes]", "-e", f"{project}[test]", "nox",  # this canarchy, not an index's
                    env=lanes.INSTALL_ENV)
    session.chdir(project)
    session.run("python", "-m", "nox", "--list")  # its one-line noxfile loads and registers the lanes
    for name, *options in (("unit",), ("parity",), ("mutation",), ("order", "--seeds", "1")):
        lanes.lane(session, name, *options)


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
