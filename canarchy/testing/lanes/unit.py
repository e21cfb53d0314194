"""The unit and integration lanes: one pytest run and its verdict; the integration lane's bus."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import OPERATOR_BUS_VARIABLES
from canarchy.testing.lanes.netns import NETNS_GROUP, containment, netns_roundtrip, netns_support
from canarchy.testing.lanes.runner import EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, junit_path, raise_on_sigterm, run_pytest
from canarchy.testing.lanes.verdict import Verdict, lane_verdict


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
        ok, output = netns_roundtrip(python, env=env)
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


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: one pytest run with its verdict (unit and integration lanes)."""
    raise_on_sigterm()
    env = dict(os.environ)
    junit = junit_path(args.pytest_args)
    log = junit.with_suffix(".log")
    notes: list[str] = []
    netns = False
    if args.bus in ("private", "operator"):
        netns, notes, error = _integration_bus(env, sys.executable, operator=args.bus == "operator")
        if error:
            verdict = Verdict(args.lane, "CANNOT DECIDE", error, notes=notes)
            print(verdict.line())
            junit.with_suffix(".md").parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(junit.with_suffix(".md"), verdict.markdown())
            return verdict.exit_code
    else:
        netns, note = containment()
        notes.append(note)
    for note in notes:
        print(f"{args.lane}: {note}")
    with tempfile.TemporaryDirectory(prefix=f"canarchy-{args.lane}-") as tmp:
        home, child_tmp = Path(tmp) / "home", Path(tmp) / "tmp"
        home.mkdir()
        child_tmp.mkdir()
        # A fresh home, and TMPDIR inside our directory: what the run leaves behind goes with it.
        env.update(HOME=str(home), USERPROFILE=str(home), TMPDIR=str(child_tmp))
        run = run_pytest(sys.executable, args.pytest_args, env=env, log=log, netns=netns)
    verdict = lane_verdict(args.lane, run, notes=notes)
    junit.with_suffix(".md").parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(junit.with_suffix(".md"), verdict.markdown())
    print(verdict.line())
    for test_id in verdict.failing[:30]:
        print(f"  failing: {test_id}")
    return verdict.exit_code


def cmd_netns_check(args: argparse.Namespace) -> int:
    """``netns-check``: say whether the private namespace works and prove a frame round trip."""
    support = netns_support()
    print(f"private network namespace: {'available' if support.available else 'not available'} - {support.reason}")
    if not support.available:
        return EXIT_CANNOT_DECIDE
    ok, output = netns_roundtrip(sys.executable)
    print(f"udp_multicast on {NETNS_GROUP}: {output}")
    return EXIT_PASSED if ok else EXIT_FAILED


