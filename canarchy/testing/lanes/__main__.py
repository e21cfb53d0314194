"""``python -m canarchy.testing.lanes LANE ...``: the one command line of the lanes (what nox runs).

    python -m canarchy.testing.lanes run --lane NAME [--bus none|private|operator] -- PYTEST_ARGS
    python -m canarchy.testing.lanes parity --operator-home DIR [--allowlist F] -- PYTEST_ARGS
    python -m canarchy.testing.lanes netns-check
    python -m canarchy.testing.lanes mutation run|run-all PATH [options]
    python -m canarchy.testing.lanes order run [--seeds N] [--seed S ...] -- PYTEST_ARGS
    python -m canarchy.testing.lanes selftest run fixtures/leaks [options]
    python -m canarchy.testing.lanes compare A.xml B.xml [options]

``PYTEST_ARGS`` are pytest's arguments (without ``-m pytest``) and contain
exactly one ``--junitxml=PATH``. Exit codes: 0 passed / identical,
1 failed / different, 2 cannot decide, 128 + N interrupted by signal N.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from typing import Sequence

from canarchy.testing.lanes.runner import Terminated, junit_path, split_pytest_args

#: Lanes whose module has its own ``main(argv)``.
_MODULES = {
    "mutation": "canarchy.testing.lanes.mutation",
    "order": "canarchy.testing.lanes.order",
    "selftest": "canarchy.testing.lanes.selftest",
    "compare": "canarchy.testing.lanes.results",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one lane (see the module docstring); returns its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _MODULES:
        rest = argv if argv[0] == "compare" else argv[1:]  # results.main has the compare subcommand itself
        return importlib.import_module(_MODULES[argv[0]]).main(rest)
    from canarchy.testing.lanes.parity import cmd_parity
    from canarchy.testing.lanes.unit import cmd_netns_check, cmd_run

    own, pytest_args = split_pytest_args(argv)
    parser = argparse.ArgumentParser(prog="python -m canarchy.testing.lanes")
    sub = parser.add_subparsers(dest="action", required=True)
    p_run = sub.add_parser("run", help="run pytest once and print the lane's verdict")
    p_run.add_argument("--lane", required=True)
    p_run.add_argument("--bus", choices=("none", "private", "operator"), default="none",
                       help="private: a loopback-only namespace where possible, else none; "
                            "operator: the bus the operator exported (the tests transmit on it)")
    p_run.set_defaults(func=cmd_run)
    p_par = sub.add_parser("parity", help="run the clean and the configured twin and compare")
    p_par.add_argument("--operator-home", required=True)
    p_par.add_argument("--allowlist")
    p_par.add_argument("--checkout", default=".")
    p_par.set_defaults(func=cmd_parity)
    p_ns = sub.add_parser("netns-check", help="probe the private network namespace and the provided bus")
    p_ns.set_defaults(func=cmd_netns_check)
    for name in _MODULES:
        sub.add_parser(name, help=f"see python -m canarchy.testing.lanes {name} --help")
    args = parser.parse_args(own)
    args.pytest_args = pytest_args
    if args.action in ("run", "parity"):
        try:
            junit_path(pytest_args)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        return args.func(args)
    except Terminated:
        print(f"{args.action}: terminated; the lane's temporary directories were removed", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"{args.action}: interrupted by SIGINT; the lane's temporary directories were removed", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
