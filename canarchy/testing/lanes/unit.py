"""The unit and integration lanes: one pytest run of the suite and its verdict; the integration bus."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from collections.abc import Sequence

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import OPERATOR_BUS_VARIABLES, build_env
from canarchy.testing.lanes.netns import NETNS_GROUP, netns_command, netns_roundtrip, netns_support
from canarchy.testing.lanes.project import Project
from canarchy.testing.lanes.results import node_id
from canarchy.testing.lanes.runner import (EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, pytest_flags, run_pytest,
                                          workers, xdist_options)
from canarchy.testing.lanes.verdict import NOT_ISOLATED, NOT_LOADED, Verdict, judge
from canarchy.testing.lanes.workspace import pythonpath, temporary_tree

PRIVATE_BUS_VARIABLE = "CANARCHY_TEST_PRIVATE_BUS"
ALLOW_TRANSMIT_VARIABLE = "CANARCHY_INTEGRATION_ALLOW_TRANSMIT"


def _integration_bus(env: dict[str, str], python: str, operator: bool) -> tuple[bool, list[str], str | None]:
    """Decide the integration lane's bus. Returns (use netns, notes, error).

    ``operator`` false (the default, and what ``nox`` runs): a private
    loopback-only namespace where the machine allows it, else no bus; an
    exported operator bus is *ignored* (its variables are removed) because
    the integration tests transmit. ``operator`` true (``nox -s integration
    -- --operator-bus``): the bus the operator exported, with transmitting
    tests allowed; an error if none is exported.
    """
    exported = {n: env[n] for n in OPERATOR_BUS_VARIABLES if env.get(n)}
    if operator:
        if not exported:
            return False, [], (f"--operator-bus needs {' and '.join(OPERATOR_BUS_VARIABLES)} exported "
                               "(the operator's bus type and channel)")
        shown = ", ".join(f"{n}={v}" for n, v in exported.items())
        env[ALLOW_TRANSMIT_VARIABLE] = "1"
        return False, [f"bus: the operator's ({shown}), on this machine's network, "
                       "chosen with --operator-bus: the integration tests transmit on it"], None
    notes = []
    for name in exported:
        del env[name]
    if exported:
        notes.append(f"ignored the exported operator bus ({', '.join(exported)}): the integration tests transmit; "
                     "run `nox -s integration -- --operator-bus` to use it")
    support = netns_support()
    if support.available:
        env["CANARCHY_PYTHON_CAN_INTERFACE"] = "udp_multicast"
        env["CANARCHY_DEFAULT_INTERFACE"] = NETNS_GROUP
        env[PRIVATE_BUS_VARIABLE] = "1"
        ok, output = netns_roundtrip(python, env={**build_env(home=tempfile.gettempdir()), **env})
        if not ok:
            return True, notes, f"the provided udp_multicast bus does not work in the namespace: {output}"
        return True, [
            *notes,
            f"bus: provided - python-can udp_multicast on {NETNS_GROUP} inside a private network namespace "
            "(loopback only; nothing leaves it)",
            "preflight: two buses exchanged a frame in the namespace (round trip ok)",
        ], None
    return False, [
        *notes,
        f"bus: none - {support.reason}; run `nox -s integration -- --operator-bus` with "
        f"{' and '.join(OPERATOR_BUS_VARIABLES)} exported to use a real bus. The bus tests skip with a reason."
    ], None


def _report(lane: str, project: Project, verdict: Verdict) -> int:
    md = project.root / "reports" / f"{lane}.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(md, verdict.markdown(show=lambda key: node_id(key, project.root)))
    print(verdict.line())
    for note in verdict.notes:
        if note == NOT_ISOLATED or note.startswith(NOT_LOADED):
            print(f"  {note}")
    for test_id in verdict.failing[:30]:
        print(f"  failing: {node_id(test_id, project.root)}")
    for line in verdict.sentinel:
        print(f"  sentinel: {line}")
    return verdict.exit_code


def run_suite(project: Project, lane: str, selection: Sequence[str], *, options: Sequence[str] = (),
              env_extra: dict[str, str] | None = None, prefix: Sequence[str] = (), notes: Sequence[str] = (),
              source_env: dict[str, str] | None = None, passthrough: Sequence[str] = (),
              skipped_proves: bool = False) -> Verdict:
    """One pytest run of ``selection`` in the checkout, with a fresh home and TMPDIR, judged
    (``skipped_proves``: see :func:`~canarchy.testing.lanes.verdict.judge`)."""
    junit = project.root / "reports" / f"{lane}.xml"
    with temporary_tree(f"canarchy-{lane}-") as tmp:
        home, child_tmp = Path(tmp) / "home", Path(tmp) / "tmp"
        home.mkdir()
        child_tmp.mkdir()
        # The import root first on PYTHONPATH, as in every lane: the checkout's code is what runs,
        # in the tests and in every child Python they start, installed or not.
        env = build_env(home=home, source=os.environ if source_env is None else source_env, passthrough=passthrough,
                        extra={"TMPDIR": str(child_tmp), **(env_extra or {}),
                               "PYTHONPATH": pythonpath(project.root, project, env_extra)})
        run = run_pytest([*pytest_flags(project), f"--junitxml={junit}", *options, *selection], env=env,
                         cwd=project.root, echo=True, prefix=prefix)
    return judge(lane, run, notes=notes, isolated=project.uses_plugin, skipped_proves=skipped_proves)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=None,
                        help="pytest-xdist workers (default: two per core; 0: none)")


def main(project: Project, args: argparse.Namespace, selection: Sequence[str]) -> int:
    """``python -m canarchy.testing.lanes unit [--jobs N] [-- SELECTION]``."""
    jobs = workers(args.jobs)
    options = xdist_options(jobs)
    note = f"{jobs} pytest-xdist workers" if jobs else "one process (no pytest-xdist workers)"
    print(f"unit: {note}")
    return _report("unit", project, run_suite(project, "unit", selection, options=options, notes=[note]))


def add_integration_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--operator-bus", action="store_true",
                        help="use the bus named by the exported CANARCHY_PYTHON_CAN_INTERFACE and "
                             "CANARCHY_DEFAULT_INTERFACE (the tests transmit on it)")


def main_integration(project: Project, args: argparse.Namespace, selection: Sequence[str]) -> int:
    """``python -m canarchy.testing.lanes integration [--operator-bus] [-- SELECTION]``: ``-m integration``."""
    env = {n: os.environ[n] for n in OPERATOR_BUS_VARIABLES if os.environ.get(n)}
    netns, notes, error = _integration_bus(env, sys.executable, operator=args.operator_bus)
    for note in notes:
        print(f"integration: {note}")
    if error:
        return _report("integration", project, Verdict("integration", "CANNOT DECIDE", error, notes=notes))
    verdict = run_suite(project, "integration", selection, options=["-m", "integration"], env_extra=env,
                        prefix=netns_command([]) if netns else (), notes=notes, skipped_proves=True)
    return _report("integration", project, verdict)


def main_netns_check(project: Project, args: argparse.Namespace, selection: Sequence[str]) -> int:
    """``netns-check``: say whether the private namespace works and prove a frame round trip."""
    support = netns_support()
    print(f"private network namespace: {'available' if support.available else 'not available'} - {support.reason}")
    if not support.available:
        return EXIT_CANNOT_DECIDE
    ok, output = netns_roundtrip(sys.executable)
    print(f"udp_multicast on {NETNS_GROUP}: {output}")
    return EXIT_PASSED if ok else EXIT_FAILED


