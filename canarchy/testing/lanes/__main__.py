"""``python -m canarchy.testing.lanes LANE ...``: the one command line of the lanes (what nox runs).

Lanes: ``unit``, ``integration``, ``parity``, ``mutation``, ``order``, ``selftest``, ``netns-check``, and
``compare A.xml B.xml``; ``-- SELECTION`` chooses tests only; the project's layout comes from its
pyproject.toml (:mod:`canarchy.testing.lanes.project`). Exit codes: 0 passed, 1 failed, 2 cannot decide,
128 + N interrupted by signal N. Synopsis and design: ``docs/design/verification-harness.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence

from canarchy.testing.lanes.runner import (EXIT_CANNOT_DECIDE, Interrupted, interrupts, shielded,
                                           split_pytest_args, temporary_files_outside)

#: lane -> (module, main, add_arguments or None, -m the lane fixes)
LANES = {
    "unit": ("unit", "main", "add_arguments", None),
    "integration": ("unit", "main_integration", "add_integration_arguments", "integration"),
    "parity": ("parity", "main", "add_arguments", None),
    "mutation": ("mutation", "main", "add_arguments", None),
    "order": ("order", "main", "add_arguments", None),
    "selftest": ("selftest", "main", "add_arguments", None),
    "netns-check": ("unit", "main_netns_check", None, None),
}

#: lane -> its files in the project's ``reports/``, removed as it starts (the mutation lane removes
#: those of the mutations it runs, once it has read them); each of these lanes and the mutation lane holds
#: ``reports/.LANE.lock`` while it runs (:func:`~canarchy.testing.lanes.workspace.reports_lock`)
REPORTS = {"unit": ("unit.*",), "integration": ("integration.*",), "parity": ("parity.*", "parity-*"),
           "order": ("order.*", "order-*"), "selftest": ("selftest.*",)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m canarchy.testing.lanes",
                                     description="Run one of the verification lanes.")
    parser.add_argument("--project", default=".", help="the project's root (default: the working directory)")
    sub = parser.add_subparsers(dest="lane", required=True, metavar="LANE")
    for lane, (module, _main, add_arguments, _m) in LANES.items():
        lane_parser = sub.add_parser(lane)
        if add_arguments:
            getattr(importlib.import_module(f"canarchy.testing.lanes.{module}"), add_arguments)(lane_parser)
    compare = sub.add_parser("compare", help="compare two JUnit XML reports test by test")
    compare.add_argument("report_a")
    compare.add_argument("report_b")
    compare.add_argument("--markdown", help="also write the Markdown summary here")
    compare.add_argument("--allowlist", help="TOML file of [[allowed]] id/reason entries")
    compare.add_argument("--label-a", default="without config")
    compare.add_argument("--label-b", default="with config")
    return parser


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from canarchy.fileio import write_text_atomic
    from canarchy.testing.lanes.render import comparison_markdown, comparison_table
    from canarchy.testing.lanes.results import CannotDecide, compare, load_allowlist

    try:
        allowlist = load_allowlist(args.allowlist)
    except CannotDecide as exc:
        print(f"compare: CANNOT DECIDE - {exc}")
        return EXIT_CANNOT_DECIDE
    comparison = compare(args.report_a, args.report_b, allowlist=allowlist, label_a=args.label_a, label_b=args.label_b)
    print(comparison_table(comparison, title="compare"))
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.markdown), comparison_markdown(comparison, title="Comparison"))
    return comparison.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one lane (see the module docstring) and return its exit code."""
    # each line as it is printed: the pytest children write to the same stream (a pipe, a CI log) meanwhile
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)
    own, posargs = split_pytest_args(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(own)
    if args.lane == "compare":
        return _compare(args)
    from canarchy.testing.lanes.env import choose_tests
    from canarchy.testing.lanes.project import ProjectError, load_project

    module, main_name, _add, markexpr = LANES[args.lane]
    try:
        project = load_project(args.project)
        selection = choose_tests(posargs, fixed_markexpr=markexpr, default=project.tests, root=project.root)
    except (ProjectError, ValueError) as exc:
        print(f"{args.lane}: CANNOT DECIDE - {exc}")
        return EXIT_CANNOT_DECIDE
    lane_main = getattr(importlib.import_module(f"canarchy.testing.lanes.{module}"), main_name)
    from canarchy.testing.lanes.workspace import KEPT_WHEN_INTERRUPTED, LaneBusy, clear_reports, reports_lock

    try:
        lock = reports_lock(project.root / "reports", args.lane) if args.lane in REPORTS or args.lane == "mutation" \
            else contextlib.nullcontext()  # netns-check writes no report
        with lock, interrupts(), temporary_files_outside(project.root):
            clear_reports(project.root / "reports", REPORTS.get(args.lane, ()))
            try:
                return lane_main(project, args, selection)
            except Interrupted:  # no verdict: what the runs wrote before it goes but their logs
                with shielded():
                    clear_reports(project.root / "reports", REPORTS.get(args.lane, ()), KEPT_WHEN_INTERRUPTED)
                raise
    except LaneBusy as exc:
        print(f"{args.lane}: CANNOT DECIDE - {exc}")
        return EXIT_CANNOT_DECIDE
    except Interrupted as exc:
        print(f"{args.lane}: interrupted by {exc.name}; every process it started was stopped and its temporary "
              "directories removed", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    import signal

    from canarchy.testing.lanes.runner import own_signals

    own_signals()
    code = main()
    for sig in (signal.SIGINT, signal.SIGTERM):  # the lane has reported: a late signal must not change
        signal.signal(sig, signal.SIG_IGN)      # the exit code (CPython resets handlers at exit, not SIG_IGN)
    sys.exit(code)
