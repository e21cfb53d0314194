"""The order lane: the suite's result must not depend on the order its tests run in.

It runs the suite in the normal order, reversed (:mod:`.reverse`) and in
seeded shuffles (pytest-randomly, ``--randomly-seed=N``), each on its own copy
of the tree with a fresh home, two at a time; compares each run with the
normal one test by test (:func:`~canarchy.testing.lanes.results.compare`);
and for each test whose outcome changed, asks detect-test-pollution which of
the tests that ran before it in the failing run makes it fail (a polluter); for a
test that fails alone, it bisects the tests that ran before it where it passed to
the one it needs first (a state-setter). Design: docs/design/verification-harness.md §7.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import build_env
from canarchy.testing.lanes.project import Project
from canarchy.testing.lanes.render import comparison_table, markdown_table
from canarchy.testing.lanes.results import (Comparison, Report, Row, case_key, compare, report_or_none,
                                             totals_text)
from canarchy.testing.lanes.runner import (
    EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, Run, concurrently, pytest_flags, run, run_pytest,
)
from canarchy.testing.lanes.verdict import (ALL_SKIPPED, BEYOND_ITS_TESTS, NOT_ISOLATED, every_case_skipped,
                                            failed_beyond_its_tests, isolated_run, plugins_not_loaded, read_run,
                                            sentinel_lines)
from canarchy.testing.lanes.workspace import (copy_tree, logs_kept_if_interrupted, publish_reports, pythonpath,
                                              temporary_tree, tree_files)

DEFAULT_SEEDS = 2
_POLLUTER = re.compile(r"-> the polluting test is: (?P<id>\S.*)$", re.M)
_FAILS_ALONE = "fails when run alone"


@dataclass
class OrderRun:
    """One run of the suite in one order: ``label`` is ``normal``, ``reverse`` or ``seed N``."""

    label: str
    options: tuple[str, ...]
    copy: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()  # what each of its pytest runs starts with (:func:`~.runner.pytest_flags`)
    run: Run | None = None
    report: Report | None = None
    problem: str | None = None
    node_ids: dict[str, str] = field(default_factory=dict)  # case key -> node id
    serial: tuple[str, ...] = ()  # what its reproduce line needs to run in one process, as the lane's run did

    def reproduce(self, selection: Sequence[str]) -> str:
        """The command that runs the suite in this order in the project's own environment: with ``-n 0`` where
        the project's addopts start pytest-xdist workers (each would run its share in its own order)."""
        return " ".join(["python -m pytest", *self.serial, *self.options, *selection])

    @property
    def executed(self) -> list[str]:
        """Node ids in the order they ran (the report lists cases in that order; what failed or skipped at
        collection left out: no test of it ran)."""
        return [self.node_ids.get(key, key) for key in _ran(self)]


@dataclass
class Bisection:
    """What the search found for ``victim`` in the ``run_label`` run: the ``culprit`` (None when none was
    found), a ``polluter`` (the victim fails right after it) or a ``state-setter`` (it passes only after it)."""

    victim: str
    run_label: str
    culprit: str | None
    note: str
    candidates: int = 0
    kind: str = "polluter"

    def finding(self) -> str:
        if self.culprit is None:
            return self.note
        return f"polluted by {self.culprit}" if self.kind == "polluter" else f"needs {self.culprit} to run first"


@dataclass
class OrderResult:
    """Everything the lane found; ``exit_code`` 0 same results, 1 an order differs, 2 cannot decide."""

    runs: list[OrderRun]
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    bisections: list[Bisection] = field(default_factory=list)
    unsearched: list[str] = field(default_factory=list)  # differing tests past the most searched (report keys)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if any(r.problem for r in self.runs) or any(c.undecided for c in self.comparisons.values()):
            return EXIT_CANNOT_DECIDE
        if any(c.differences for c in self.comparisons.values()) or self.runs_failed:
            return EXIT_FAILED
        return EXIT_PASSED

    def show(self, key: str) -> str:
        """A test's report key as displayed: its node id, as a run collected it, else the key."""
        return next((r.node_ids[key] for r in self.runs if key in r.node_ids), key)

    @property
    def runs_failed(self) -> list[OrderRun]:
        """The runs whose pytest failed the run although none of their tests failed."""
        return [r for r in self.runs if failed_beyond_its_tests(r.run, r.report)]

    @property
    def status(self) -> str:
        return {EXIT_PASSED: "PASSED", EXIT_FAILED: "FAILED"}.get(self.exit_code, "CANNOT DECIDE")


def orders(seeds: Sequence[int]) -> list[OrderRun]:
    """The runs of the lane: normal, reverse, one per seed."""
    runs = [OrderRun("normal", ()), OrderRun("reverse", ("-p", "canarchy.testing.lanes.reverse"))]
    return runs + [OrderRun(f"seed {s}", ("-p", "randomly", f"--randomly-seed={s}")) for s in seeds]


def _ran(entry: OrderRun) -> list[str]:
    """The case keys of the tests ``entry`` ran, in the order they ran (what failed at collection left out)."""
    cases = entry.report.cases.items() if entry.report else ()
    return [key for key, case in cases if not any(r.phase == "collection" for r in case.results)]


def _failed(outcome: str) -> bool:
    return outcome.split("+")[0] in ("failed", "error", "xpassed") or outcome.endswith("+error")


def _one_run(entry: OrderRun, selection: Sequence[str], out: Path, python: str, echo: Callable[[str], None],
             isolated: bool) -> None:
    name = entry.label.replace(" ", "-")
    ids = out / f"order-{name}-ids.txt"
    echo(f"order: running {entry.label}")
    entry.run = run_pytest([*entry.flags, f"--junitxml={out / f'order-{name}.xml'}", *entry.options,
                            "-p", "detect_test_pollution", f"--dtp-testids-output-file={ids}", *selection],
                           env=entry.env, cwd=entry.copy, python=python)
    entry.report, entry.problem = read_run(entry.run, isolated=isolated, complete=True)
    try:
        entry.node_ids = {case_key(n): n for n in ids.read_text(encoding="utf-8").splitlines() if n}
    except OSError:
        entry.node_ids = {}
    echo(f"order: {entry.label} done in {entry.run.duration:.0f} s, exit code {entry.run.returncode}")


def bisect(entry: OrderRun, victim: str, before: Sequence[str], out: Path, python: str) -> Bisection:
    """Ask detect-test-pollution which of ``before`` (in that order) makes ``victim`` fail."""
    listing = out / f"order-bisect-{abs(hash(victim))}.txt"
    listing.write_text("".join(f"{n}\n" for n in [*before, victim]), encoding="utf-8")
    # Imported, not run with -m: it loads itself into pytest as ``-p <its __name__>``. Each pytest it starts
    # gets the lane's flags as every run of the lane does (``-p xdist -n 0`` among them): with plugin
    # autoloading off, an ``-n auto`` in the project's addopts was an unrecognized argument to its pytest,
    # and the bisection found "no single polluter".
    code = f"import sys, detect_test_pollution as d; d.PYTEST_OPTIONS += {tuple(entry.flags)!r}; sys.exit(d.main())"
    done = run([python, "-c", code, "--failing-test", victim, "--testids-file", str(listing)],
               env=entry.env, cwd=entry.copy, log=listing.with_suffix(".log"))
    found = _POLLUTER.search(done.output)
    if done.returncode == 0 and found:
        return Bisection(victim, entry.label, found.group("id").strip(), "passes alone, fails right after the polluter",
                         len(before))
    if "test failed!" in done.output:
        note = _FAILS_ALONE
    elif "but it passed" in done.output:
        note = "passes after the same tests when run again: flaky, not reproduced"
    else:
        note = f"detect-test-pollution found no single polluter (exit code {done.returncode}, log {done.log})"
    return Bisection(victim, entry.label, None, note, len(before))


def _passes_after(entry: OrderRun, victim: str, first: Sequence[str], stem: Path, python: str) -> bool | None:
    """Whether ``victim`` passes when exactly ``first`` run before it, in that order, on ``entry``'s copy
    (detect-test-pollution's ``--dtp-testids-input-file`` picks and orders them); None: no report of it."""
    listing = stem.with_suffix(".txt")
    listing.write_text("".join(f"{n}\n" for n in [*first, victim]), encoding="utf-8")
    files = list(dict.fromkeys(n.split("::")[0] for n in [*first, victim]))
    done = run_pytest([*entry.flags, f"--junitxml={stem.with_suffix('.xml')}", "-p", "detect_test_pollution",
                       f"--dtp-testids-input-file={listing}", *files], env=entry.env, cwd=entry.copy, python=python)
    case = report.cases.get(case_key(victim)) if (report := report_or_none(done.junit)) else None
    return None if case is None else not _failed(case.outcome)


def find_state_setter(entry: OrderRun, victim: str, before: Sequence[str], out: Path, python: str) -> Bisection:
    """For a ``victim`` that fails alone but passed after ``before`` in the ``entry`` run: bisect ``before``
    (keeping its order) to the one test the victim needs to run first."""
    stem = out / f"order-setter-{abs(hash(victim))}"
    steps = itertools.count(1)

    def passes(first: Sequence[str]) -> bool | None:
        return _passes_after(entry, victim, first, stem.with_name(f"{stem.name}-{next(steps)}"), python)

    again = passes(before)
    if not again:
        why = "flaky, not reproduced" if again is False else f"no report of it (logs: {stem}-1.*)"
        return Bisection(victim, entry.label, None, f"{_FAILS_ALONE}, and after the tests that ran before it in "
                         f"the {entry.label} run too: {why}", len(before), "state-setter")
    candidates = list(before)
    while len(candidates) > 1:
        half = candidates[: len(candidates) // 2]
        candidates = half if passes(half) else candidates[len(half):]
    if candidates and passes(candidates):
        return Bisection(victim, entry.label, candidates[0], f"{_FAILS_ALONE}, passes right after the state-setter",
                         len(before), "state-setter")
    return Bisection(victim, entry.label, None, f"{_FAILS_ALONE}; it passes after the tests that ran before it in the "
                     f"{entry.label} run, but after no single one of them", len(before), "state-setter")


def _prepare(entry: OrderRun, base: Path, project: Project, files: list[str], source_env: Mapping[str, str] | None,
             extra_env: Mapping[str, str] | None) -> None:
    """Give ``entry`` its own copy of the checkout, home and TMPDIR under ``base``, and its environment."""
    entry.copy, home, tmpdir = base / "tree", base / "home", base / "tmp"
    for d in (entry.copy, home, tmpdir):
        d.mkdir(parents=True)
    copy_tree(project.root, entry.copy, files)
    entry.flags = tuple(pytest_flags(project))
    entry.serial = ("-n", "0") if project.addopts_workers else ()
    entry.env = build_env(home=home, source=source_env, extra={
        **(extra_env or {}), "TMPDIR": str(tmpdir), "PYTHONPATH": pythonpath(entry.copy, project, extra_env)})


def _before(entry: OrderRun, key: str) -> tuple[str, list[str]] | None:
    """``(the node id of case ``key``, the node ids ``entry`` ran before it)``, or None."""
    executed = entry.executed
    node_id = entry.node_ids.get(key)
    if node_id is None or node_id not in executed:
        return None
    return node_id, executed[: executed.index(node_id)]


def _search(row: Row, normal: OrderRun, other: OrderRun, out: Path, python: str,
            echo: Callable[[str], None]) -> Bisection | None:
    """The polluter of the test of ``row`` in the run where it failed, or else its state-setter in the run
    where it passed; None where it failed in neither (e.g. present in one run only: the comparison names it)."""
    where, passed = (normal, other) if _failed(row.outcome_a) else (other, normal) if _failed(row.outcome_b) else (
        None, None)
    found = _before(where, row.id) if where is not None else None
    if found is None:
        return None
    victim, before = found
    echo(f"order: asking detect-test-pollution about {len(before)} tests before {victim} ({where.label})")
    bisection = bisect(where, victim, before, out, python)
    setting = _before(passed, row.id) if bisection.note == _FAILS_ALONE else None
    if setting is not None:
        echo(f"order: {victim} fails alone; looking for its state-setter among the {len(setting[1])} tests before "
             f"it ({passed.label})")
        bisection = find_state_setter(passed, setting[0], setting[1], out, python)
    return _confirmed(bisection, where if bisection.kind == "polluter" else passed, out, python)


#: How many more runs of a victim, alone and right after the test a bisection named, must agree before
#: the lane names that test: a flaky victim's outcome changes between runs, and a bisection of what ran
#: before it then ends on some test by chance.
CONFIRM_RUNS = 2


def _confirmed(found: Bisection, entry: OrderRun, out: Path, python: str) -> Bisection:
    """``found`` when its victim, run :data:`CONFIRM_RUNS` more times alone and as many right after its culprit
    (or only alone, where it fails alone and none was found), gives the outcome it claims every time; else
    the same victim with no culprit and a note that it is flaky."""
    alone_fails = found.kind == "state-setter" or found.note == _FAILS_ALONE
    if found.culprit is None and not alone_fails:
        return found
    stem = out / f"order-confirm-{abs(hash(found.victim))}"
    steps = itertools.count(1)
    seen_alone = [_passes_after(entry, found.victim, [], stem.with_name(f"{stem.name}-{next(steps)}"), python)
                  for _ in range(CONFIRM_RUNS)]
    seen_after = [_passes_after(entry, found.victim, [found.culprit], stem.with_name(f"{stem.name}-{next(steps)}"),
                                python) for _ in range(CONFIRM_RUNS)] if found.culprit else []
    if all(ok is (not alone_fails) for ok in seen_alone) and all(ok is alone_fails for ok in seen_after):
        return found
    words = {True: "passed", False: "failed", None: "no report"}
    runs = f"alone: {', '.join(words[o] for o in seen_alone)}" + (
        f"; right after {found.culprit}: {', '.join(words[o] for o in seen_after)}" if seen_after else "")
    return Bisection(found.victim, found.run_label, None, f"flaky: its outcome changes from run to run with the "
                     f"same tests before it ({runs}); no test is named", found.candidates, found.kind)


def run_order_lane(project: Project, selection: Sequence[str], *, seeds: Sequence[int], jobs: int = 2,
                   max_bisections: int = 3, source_env: Mapping[str, str] | None = None, python: str | None = None,
                   reports: Path | None = None, echo: Callable[[str], None] = print,
                   extra_env: Mapping[str, str] | None = None) -> OrderResult:
    """Run every order of :func:`orders`, compare with the normal run, find the polluters."""
    python = python or sys.executable
    out = reports or project.root / "reports"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = OrderResult(orders(seeds))
    files = tree_files(project.root, project)
    with temporary_tree("canarchy-order-") as tmp, contextlib.ExitStack() as stack:
        # The runs write here, not into ``out``: the checkout (``out`` in it) may lie in the operator's home,
        # which a run on a copy may only read; copied to ``out`` at the end.
        work = Path(tmp) / "reports"
        work.mkdir()
        stack.enter_context(logs_kept_if_interrupted(work, out))
        for index, entry in enumerate(result.runs):
            _prepare(entry, Path(tmp) / str(index), project, files, source_env, extra_env)
        concurrently([lambda e=e: _one_run(e, selection, work, python, echo, project.uses_plugin)
                      for e in result.runs], workers=jobs)
        normal = result.runs[0]
        if normal.problem is None and every_case_skipped(normal.report):
            normal.problem = f"{ALL_SKIPPED} (no order of skipped tests can differ)"
        reverse = result.runs[1]
        if reverse.problem is None and normal.report and reverse.report and _ran(reverse) != _ran(normal)[::-1]:
            reverse.problem = ("it did not run the tests in the reverse of the normal order: a hook of the project "
                               "reorders them after the lane (a pytest_collection_modifyitems wrapper that sorts "
                               "them?), so the orders the lane means to try are not the ones that ran")
        for entry in result.runs[1:]:
            if normal.report and entry.report:
                result.comparisons[entry.label] = compare(normal.report, entry.report, label_a="normal",
                                                          label_b=entry.label)
        _bisect(result, work, python, echo, max_bisections)
        _publish(result, work, out)
    result.seconds = time.monotonic() - started
    return result


def _bisect(result: OrderResult, work: Path, python: str, echo: Callable[[str], None], most: int) -> None:
    """Search the culprit of each differing test (each once, ``most`` at the most), in the run it differed in."""
    normal, seen = result.runs[0], set()
    for label, comparison in result.comparisons.items():
        for row in comparison.differences:
            if row.id in seen:
                continue
            seen.add(row.id)
            if len(result.bisections) >= most:
                result.unsearched.append(row.id)
                continue
            found = _search(row, normal, next(r for r in result.runs if r.label == label), work, python, echo)
            if found is not None:
                result.bisections.append(found)


def _publish(result: OrderResult, work: Path, out: Path) -> None:
    """Copy the runs' reports to ``out``; the problems and the bisections' notes then name their logs there
    (detect-test-pollution's, a state-setter search's), not in the temporary tree removed next."""
    notes = publish_reports(work, out, [e.run for e in result.runs],
                            [*(e.problem for e in result.runs), *(b.note for b in result.bisections)])
    for entry, problem in zip(result.runs, notes, strict=False):
        entry.problem = problem
    for found, note in zip(result.bisections, notes[len(result.runs):], strict=True):
        found.note = note


def render(result: OrderResult, selection: Sequence[str] = ()) -> str:
    """The terminal view: verdict, one line per run, differing tests, polluters."""
    lines = [f"order: {result.status} ({result.seconds:.0f} s)"]
    if not all(isolated_run(entry.report) for entry in result.runs):
        lines.append(f"  {NOT_ISOLATED}")
    lines += [f"  {note}" for note in [plugins_not_loaded(entry.report for entry in result.runs)] if note]
    for entry in result.runs:
        secs = entry.run.duration if entry.run else 0
        lines.append(f"  {entry.label:<10} {totals_text(entry.report):<40} {secs:>5.0f} s   "
                     f"reproduce: {entry.reproduce(selection)}")
        if entry.problem:
            lines.append(f"  cannot decide ({entry.label}): {entry.problem}")
        elif entry in result.runs_failed:
            lines.append(f"  failed ({entry.label}): no test failed, {BEYOND_ITS_TESTS}: {entry.run.log}")
            lines += [f"    sentinel: {line}" for line in sentinel_lines(entry.run)]
    for label, comparison in result.comparisons.items():
        if comparison.differences or comparison.undecided:
            lines += ["", comparison_table(comparison, title=f"normal vs {label}", show=result.show)]
    if result.bisections:
        lines += ["", "order dependencies (a polluter makes the victim fail after it; a state-setter must run "
                  "before the victim for it to pass):"]
        lines += [f"  victim {b.victim} ({b.run_label} run): {b.finding()}" for b in result.bisections]
    if result.unsearched:
        lines.append(f"  {_unsearched_text(result)}")
    return "\n".join(lines)


def _unsearched_text(result: OrderResult) -> str:
    shown = ", ".join(result.show(key) for key in result.unsearched[:5])
    return (f"not searched for a culprit: {len(result.unsearched)} more differing test(s) ({shown}"
            f"{', ...' if len(result.unsearched) > 5 else ''}), past the {len(result.bisections)} searched "
            "(`python -m canarchy.testing.lanes order --max-bisections N`, or select those tests)")


def render_markdown(result: OrderResult, selection: Sequence[str] = ()) -> str:
    """``reports/order.md``."""
    out = [f"# Order lane: {result.status}", "", f"Wall time: {result.seconds:.0f} s.", "", markdown_table(
        ["run", "outcomes", "seconds", "reproduce"],
        [[e.label, totals_text(e.report), f"{e.run.duration if e.run else 0:.0f}", f"`{e.reproduce(selection)}`"]
         for e in result.runs])]
    out += [f"- cannot decide ({e.label}): {e.problem}" for e in result.runs if e.problem]
    out += [f"- {e.label}: no test failed, {BEYOND_ITS_TESTS}: `{e.run.log}`" for e in result.runs_failed]
    for label, c in result.comparisons.items():
        out += ["", f"## normal vs {label}: {c.verdict}", ""]
        out += [f"- cannot decide: {reason}" for reason in c.undecided]
        if c.differences:
            out.append(markdown_table(["test id", "normal", label], [[f"`{result.show(r.id)}`", r.outcome_a,
                                                                      r.outcome_b]
                                                                     for r in c.differences]))
    if result.bisections:
        out += ["", "## Order dependencies", "", markdown_table(["victim", "run", "kind", "culprit", "note"], [
            [f"`{b.victim}`", b.run_label, b.kind, f"`{b.culprit}`" if b.culprit else "-", b.note]
            for b in result.bisections])]
    if result.unsearched:
        out += ["", f"- {_unsearched_text(result)}"]
    return "\n".join(out) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                        help=f"shuffles with seeds 1..N (default {DEFAULT_SEEDS})")
    parser.add_argument("--seed", type=int, action="append", default=[],
                        help="a specific seed (repeatable; replaces 1..N)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--max-bisections", type=int, default=3,
                        help="differing tests searched for a culprit, at most (default 3; the others are named)")


def main(project: Project, args: argparse.Namespace, selection: Sequence[str]) -> int:
    """``python -m canarchy.testing.lanes order [--seeds N | --seed S ...] [-- SELECTION]``."""
    if args.seeds < 0:
        print("order: CANNOT DECIDE - --seeds must be >= 0")
        return EXIT_CANNOT_DECIDE
    seeds = args.seed or list(range(1, args.seeds + 1))
    result = run_order_lane(project, selection, seeds=seeds, jobs=args.jobs, max_bisections=args.max_bisections,
                            source_env=os.environ)
    print(render(result, selection))
    md = project.root / "reports" / "order.md"
    write_text_atomic(md, render_markdown(result, selection))
    print(f"order: {result.status} - summary in {md}")
    return result.exit_code
