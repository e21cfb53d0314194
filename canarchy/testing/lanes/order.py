"""The order lane: the suite's result must not depend on the order its tests run in.

Two parts:

The pytest plugin (loaded explicitly with ``-p canarchy.testing.lanes.order``; it
does nothing unless one of its options is given)
    ``--canarchy-order=normal|reverse|shuffle`` reorders the collected tests
    in ``pytest_collection_modifyitems`` (after every other plugin, so
    deselected tests stay out):

    - ``reverse``: the whole list backwards (modules stay contiguous, so
      module-scoped fixtures are set up once per module as usual);
    - ``shuffle`` with ``--canarchy-order-seed=N``: modules in a random order,
      then classes within each module, then tests within each class or
      module, all from ``random.Random(N)`` (the same seed and the same
      collection give the same order on any machine: no hash of anything is
      used);
    - ``--canarchy-order-file=PATH``: exactly the node ids listed in PATH (one
      per line), in that order; every other test is deselected (bisection);
    - ``--canarchy-order-record=PATH``: write the final order there (one node
      id a line), so the lane knows which tests ran before a victim.

The lane (``python -m canarchy.testing.lanes order run [--seeds N] [--seed S ...] -- PYTEST_ARGS``)
    runs the suite in the normal order, in reverse and in N seeded shuffles
    (seeds ``1..N`` unless given with ``--seed``; default ``N = 2``), two runs
    at a time, each in its own empty home and ``TMPDIR``; compares each
    reordered run with the normal one using the parity comparator
    (:mod:`canarchy.testing.lanes.results`); and for every test whose outcome
    changed, bisects the tests that ran before it in the run where it
    failed, to name the polluter: the victim passes alone and fails when run
    right after the polluter. A failing order reproduces with::

        python -m pytest -p canarchy.testing.lanes.order --canarchy-order=shuffle --canarchy-order-seed=N tests

Exit codes: 0 every order gives the normal result; 1 an order differs;
2 cannot decide (a run without a usable report, zero tests, counts that
disagree with pytest's summary).

Public surface: :func:`reorder`, :func:`run_order_lane`, :func:`bisect_polluter`,
:class:`OrderRun`, :class:`Bisection`, :class:`OrderResult`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import pytest

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import build_env
from canarchy.testing.lanes.netns import containment
from canarchy.testing.lanes.runner import (
    PytestRun, Terminated, junit_path, raise_on_sigterm, run_pytest, split_pytest_args, stop_all, with_junit,
)
from canarchy.testing.lanes.verdict import summary_text

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_CANNOT_DECIDE = 2

DEFAULT_SEEDS = 2
ORDERS = ("normal", "reverse", "shuffle")

# --------------------------------------------------------------------------- the pytest plugin


def pytest_addoption(parser) -> None:  # type: ignore[no-untyped-def]
    group = parser.getgroup("canarchy-order", "canarchy order lane (canarchy.testing.lanes.order)")
    group.addoption("--canarchy-order", choices=ORDERS, default=None, help="run the tests in this order")
    group.addoption("--canarchy-order-seed", type=int, default=None, help="seed of --canarchy-order=shuffle")
    group.addoption("--canarchy-order-file", default=None, help="run exactly these node ids (one a line), in this order")
    group.addoption("--canarchy-order-record", default=None, help="write the final order here (one node id a line)")


def _group_key(nodeid: str) -> tuple[str, str]:
    """(module path, class path) of a node id: ``a.py::K::t[x]`` -> (``a.py``, ``a.py::K``)."""
    head = nodeid.split("[", 1)[0]
    parts = head.split("::")
    return parts[0], "::".join(parts[:-1])


def reorder(nodeids: Sequence[str], order: str, seed: int | None = None) -> list[str]:
    """Return ``nodeids`` in ``order`` (see the module docstring); pure, for tests and the plugin.

    Raises ``ValueError`` for an unknown order or a shuffle without a seed.
    """
    ids = list(nodeids)
    if order == "normal":
        return ids
    if order == "reverse":
        return ids[::-1]
    if order != "shuffle":
        raise ValueError(f"unknown order {order!r}; one of {', '.join(ORDERS)}")
    if seed is None:
        raise ValueError("--canarchy-order=shuffle needs --canarchy-order-seed")
    rng = random.Random(seed)
    modules: dict[str, dict[str, list[str]]] = {}
    for nodeid in ids:  # dicts keep collection order: the shuffle depends only on it and the seed
        module, klass = _group_key(nodeid)
        modules.setdefault(module, {}).setdefault(klass, []).append(nodeid)
    module_names = list(modules)
    rng.shuffle(module_names)
    result: list[str] = []
    for module in module_names:
        classes = list(modules[module].values())
        rng.shuffle(classes)
        for tests in classes:
            tests = list(tests)
            rng.shuffle(tests)
            result.extend(tests)
    return result


@pytest.hookimpl(trylast=True)  # after canarchy's plugin and -k/-m: deselected tests stay out
def pytest_collection_modifyitems(session, config, items) -> None:  # type: ignore[no-untyped-def]
    order = config.getoption("canarchy_order")
    listed = config.getoption("canarchy_order_file")
    record = config.getoption("canarchy_order_record")
    if listed:
        wanted = [line.strip() for line in Path(listed).read_text(encoding="utf-8").splitlines() if line.strip()]
        by_id = {item.nodeid: item for item in items}
        missing = [nodeid for nodeid in wanted if nodeid not in by_id]
        if missing:
            raise ValueError(f"--canarchy-order-file: not collected: {', '.join(missing[:5])}")
        chosen = {nodeid for nodeid in wanted}
        dropped = [item for item in items if item.nodeid not in chosen]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = [by_id[nodeid] for nodeid in wanted]
    elif order is not None:
        by_id = {item.nodeid: item for item in items}
        items[:] = [by_id[nodeid] for nodeid in reorder(list(by_id), order, config.getoption("canarchy_order_seed"))]
    if record:
        Path(record).parent.mkdir(parents=True, exist_ok=True)
        Path(record).write_text("".join(item.nodeid + "\n" for item in items), encoding="utf-8")


# --------------------------------------------------------------------------- the lane


@dataclass
class OrderRun:
    """One full run of the suite in one order. ``label``: ``normal``, ``reverse`` or ``seed N``."""

    label: str
    order: str
    seed: int | None
    run: PytestRun | None = None
    order_file: Path | None = None

    @property
    def executed(self) -> list[str]:
        if self.order_file is None or not self.order_file.exists():
            return []
        return [line for line in self.order_file.read_text(encoding="utf-8").splitlines() if line]

    def reproduce(self) -> str:
        if self.order == "normal":
            return "python -m pytest tests"
        extra = f" --canarchy-order-seed={self.seed}" if self.seed is not None else ""
        return f"python -m pytest -p canarchy.testing.lanes.order --canarchy-order={self.order}{extra} tests"


@dataclass
class Bisection:
    """The search for the test that pollutes ``victim`` when run before it (in run ``run_label``).

    ``polluter``: the node id found, or None; ``note``: what was established
    (e.g. "passes alone, fails right after the polluter"); ``steps``: pytest
    runs used.
    """

    victim: str
    run_label: str
    polluter: str | None
    note: str
    steps: int = 0
    candidates: int = 0


@dataclass
class OrderResult:
    """Everything the order lane found."""

    runs: list[OrderRun]
    comparisons: dict[str, object] = field(default_factory=dict)
    bisections: list[Bisection] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.undecided or any(c.exit_code == EXIT_CANNOT_DECIDE for c in self.comparisons.values()):  # type: ignore[attr-defined]
            return EXIT_CANNOT_DECIDE
        if any(c.differences for c in self.comparisons.values()):  # type: ignore[attr-defined]
            return EXIT_FAILED
        return EXIT_PASSED

    @property
    def status(self) -> str:
        return {EXIT_PASSED: "PASSED", EXIT_FAILED: "FAILED"}.get(self.exit_code, "CANNOT DECIDE")


def _node_id_of(key: str, executed: Sequence[str]) -> str | None:
    """The executed node id whose report key is ``key``."""
    from canarchy.testing.lanes.results import case_key

    for nodeid in executed:
        if case_key(nodeid) == key:
            return nodeid
    return None


class _Runs:
    """Runs pytest for the lane: fresh home and TMPDIR per run, the lane's environment."""

    def __init__(self, python: str, pytest_args: Sequence[str], env: dict[str, str], workdir: Path, cwd: Path,
                 netns: bool = False) -> None:
        self.python, self.pytest_args, self.env, self.workdir, self.cwd = python, list(pytest_args), env, workdir, cwd
        self.netns = netns
        self._n = 0
        self._lock = threading.Lock()

    def run(self, name: str, extra: Sequence[str]) -> PytestRun:
        with self._lock:
            self._n += 1
            n = self._n
        home, tmp = self.workdir / f"{n}-home", self.workdir / f"{n}-tmp"
        home.mkdir()
        tmp.mkdir()
        env = dict(self.env, HOME=str(home), USERPROFILE=str(home), TMPDIR=str(tmp))
        base = junit_path(self.pytest_args)
        junit = base.with_name(f"{base.stem}-{name}{base.suffix}")
        args = with_junit(self.pytest_args, junit)
        argv = ["-p", "canarchy.testing.lanes.order", *extra, *args]
        return run_pytest(self.python, argv, env=env, log=junit.with_suffix(".log"), echo=False, cwd=self.cwd,
                                netns=self.netns)


def _outcome(run: PytestRun, key: str) -> str:
    from canarchy.testing.lanes.results import CannotDecide, load_report

    try:
        case = load_report(run.junit).cases.get(key)
    except CannotDecide:
        return "unreadable"
    return case.outcome if case is not None else "absent"


def bisect_polluter(
    victim: str,
    before: Sequence[str],
    try_order: Callable[[Sequence[str]], bool],
    *,
    run_label: str = "",
) -> Bisection:
    """Find the test among ``before`` (the tests that ran before ``victim``) that makes it fail.

    ``try_order(ids)`` runs exactly ``ids`` in that order and returns True
    when the last one (the victim) fails. First the victim alone must pass and
    fail after all of ``before``; then halves are kept while they still make it
    fail, until one test is left. If neither half alone does, the pollution
    needs tests from both: the remaining set is reported.
    """
    steps = 0

    def fails_after(ids: Sequence[str]) -> bool:
        nonlocal steps
        steps += 1
        return try_order([*ids, victim])

    if fails_after([]):
        return Bisection(victim, run_label, None, "fails when run alone: not an order dependency", steps, len(before))
    if not fails_after(before):
        return Bisection(victim, run_label, None, "passes after the same tests when run again: flaky, not reproduced",
                         steps, len(before))
    candidates = list(before)
    while len(candidates) > 1:
        half = len(candidates) // 2
        first, second = candidates[:half], candidates[half:]
        if fails_after(first):
            candidates = first
        elif fails_after(second):
            candidates = second
        else:
            return Bisection(victim, run_label, None,
                             f"needs several of {len(candidates)} earlier tests together: {', '.join(candidates[:5])}",
                             steps, len(before))
    return Bisection(victim, run_label, candidates[0], "passes alone, fails right after the polluter", steps, len(before))


def run_order_lane(
    python: str,
    pytest_args: Sequence[str],
    *,
    seeds: Sequence[int],
    source_env: dict[str, str] | None = None,
    cwd: Path | None = None,
    jobs: int = 2,
    max_bisections: int = 3,
    echo: Callable[[str], None] = print,
    extra_env: dict[str, str] | None = None,
) -> OrderResult:
    """Run the suite normally, reversed and once per seed; compare; bisect each victim.

    The runs' environment is built from the allow-list of ``source_env``
    (default ``os.environ``) plus ``extra_env``; each run gets a fresh home
    and TMPDIR, and its own private network namespace where the machine
    allows it (:func:`canarchy.testing.containment`).
    """
    from canarchy.testing.lanes import results as junit_compare

    started = time.monotonic()
    cwd = Path.cwd() if cwd is None else cwd
    runs = [OrderRun("normal", "normal", None), OrderRun("reverse", "reverse", None)]
    runs += [OrderRun(f"seed {seed}", "shuffle", seed) for seed in seeds]
    result = OrderResult(runs)
    with tempfile.TemporaryDirectory(prefix="canarchy-order-") as tmp:
        work = Path(tmp)
        # HOME and TMPDIR are set per run (fresh, empty); the rest from the allow-list only.
        env = build_env(home=work, source=os.environ if source_env is None else source_env, extra=extra_env)
        netns, note = containment()
        echo(f"order: {note}")
        runner = _Runs(python, pytest_args, env, work, cwd, netns=netns)

        def full_run(entry: OrderRun) -> None:
            name = entry.label.replace(" ", "-")
            entry.order_file = work / f"{name}.order"
            extra = [f"--canarchy-order={entry.order}", f"--canarchy-order-record={entry.order_file}"]
            if entry.seed is not None:
                extra.append(f"--canarchy-order-seed={entry.seed}")
            echo(f"order: running {entry.label} ({entry.reproduce()})")
            entry.run = runner.run(name, extra)
            echo(f"order: {entry.label} done in {entry.run.duration:.0f} s, exit code {entry.run.returncode}")

        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            for future in [pool.submit(full_run, entry) for entry in runs]:
                future.result()
        finally:
            # On an interrupt: no queued run may start, and the running ones stop now.
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()
            pool.shutdown(wait=True)
        normal = runs[0]
        for entry in runs:
            assert entry.run is not None
            if entry.run.summary is None:
                result.undecided.append(f"{entry.label}: pytest printed no summary line (exit code {entry.run.returncode})")
            elif entry.run.returncode not in (0, 1):
                result.undecided.append(f"{entry.label}: pytest exit code {entry.run.returncode}: no test results")
        for entry in runs[1:]:
            assert entry.run is not None and normal.run is not None
            result.comparisons[entry.label] = junit_compare.compare(
                normal.run.junit,
                entry.run.junit,
                expected_a=junit_compare.summary_total(normal.run.summary) if normal.run.summary is not None else None,
                expected_b=junit_compare.summary_total(entry.run.summary) if entry.run.summary is not None else None,
                label_a="normal",
                label_b=entry.label,
            )

        # Bisect: for each test whose outcome changed, search the run where it failed.
        seen: set[str] = set()
        for label, comparison in result.comparisons.items():
            for row in comparison.differences:  # type: ignore[attr-defined]
                if row.id in seen or len(result.bisections) >= max_bisections:
                    continue
                seen.add(row.id)
                failing = {"normal": row.outcome_a, label: row.outcome_b}
                where = next((name for name, outcome in failing.items() if outcome.split("+")[0] in ("failed", "error")
                              or outcome.endswith("+error")), None)
                if where is None:
                    continue  # e.g. present in one run only: the comparison already names it
                entry = next(e for e in runs if e.label == where)
                executed = entry.executed
                victim = _node_id_of(row.id, executed)
                if victim is None:
                    continue
                before = executed[: executed.index(victim)]
                echo(f"order: bisecting {len(before)} tests that ran before {victim} in the {where} run")

                def try_order(ids: Sequence[str], key: str = row.id) -> bool:
                    listing = work / f"bisect-{time.monotonic_ns()}.txt"
                    listing.write_text("".join(i + "\n" for i in ids), encoding="utf-8")
                    # The lane's whole selection is collected (as in the full run); the file picks and orders.
                    run = runner.run("bisect", [f"--canarchy-order-file={listing}"])
                    outcome = _outcome(run, key)
                    return outcome.split("+")[0] in ("failed", "error") or outcome.endswith("+error")

                result.bisections.append(bisect_polluter(victim, before, try_order, run_label=where))
    result.seconds = time.monotonic() - started
    return result


def _classification(result: OrderResult) -> str:
    """`` - N differing test(s): k polluter(s) named, f flaky (not reproduced), ...`` or ''."""
    differing = {r.id for c in result.comparisons.values() for r in c.differences}  # type: ignore[attr-defined]
    if not differing:
        return ""
    named = sum(1 for b in result.bisections if b.polluter)
    flaky = sum(1 for b in result.bisections if "flaky" in b.note)
    other = len(result.bisections) - named - flaky
    parts = [f"{named} polluter(s) named", f"{flaky} flaky (not reproduced)"]
    if other:
        parts.append(f"{other} other (see below)")
    if len(differing) > len(result.bisections):
        parts.append(f"{len(differing) - len(result.bisections)} not bisected")
    return f" - {len(differing)} differing test(s): " + ", ".join(parts)


def render(result: OrderResult) -> str:
    """The terminal view: verdict, one line per run, differing tests, polluters."""
    from canarchy.testing.lanes.results import render_table

    lines = [f"order: {result.status} ({result.seconds:.0f} s){_classification(result)}"]
    for entry in result.runs:
        run = entry.run
        summary = summary_text(run.summary) if run and run.summary is not None else "(no summary)"
        lines.append(f"  {entry.label:<10} {summary:<40} {run.duration if run else 0:>5.0f} s   reproduce: {entry.reproduce()}")
    for reason in result.undecided:
        lines.append(f"  cannot decide: {reason}")
    for label, comparison in result.comparisons.items():
        if comparison.differences or comparison.undecided:  # type: ignore[attr-defined]
            lines += ["", render_table(comparison, title=f"normal vs {label}")]  # type: ignore[arg-type]
    if result.bisections:
        lines += ["", "polluters (victim passes alone, fails right after the polluter):"]
        for b in result.bisections:
            lines.append(f"  victim {b.victim} ({b.run_label} run): "
                         + (f"polluted by {b.polluter}" if b.polluter else b.note) + f" [{b.steps} runs]")
    return "\n".join(lines)


def render_markdown(result: OrderResult) -> str:
    """``reports/order.md``."""
    out = [f"# Order lane: {result.status}", "", f"Wall time: {result.seconds:.0f} s.{_classification(result)}", ""]
    out += ["| run | order | seed | pytest summary | seconds | reproduce |", "|---|---|---|---|---|---|"]
    for entry in result.runs:
        run = entry.run
        summary = summary_text(run.summary) if run and run.summary is not None else "(none)"
        out.append(f"| {entry.label} | {entry.order} | {entry.seed if entry.seed is not None else '-'} | {summary} | "
                   f"{run.duration if run else 0:.0f} | `{entry.reproduce()}` |")
    out.append("")
    if result.undecided:
        out += ["## Cannot decide", ""] + [f"- {r}" for r in result.undecided] + [""]
    for label, c in result.comparisons.items():
        out.append(f"## normal vs {label}: {c.verdict}")  # type: ignore[attr-defined]
        out.append("")
        for reason in c.undecided:  # type: ignore[attr-defined]
            out.append(f"- cannot decide: {reason}")
        if c.differences:  # type: ignore[attr-defined]
            out += [f"| test id | normal | {label} |", "|---|---|---|"]
            out += [f"| `{r.id}` | {r.outcome_a} | {r.outcome_b} |" for r in c.differences]  # type: ignore[attr-defined]
        out.append("")
    if result.bisections:
        out += ["## Polluters", "", "| victim | run | polluter | note | runs |", "|---|---|---|---|---|"]
        for b in result.bisections:
            out.append(f"| `{b.victim}` | {b.run_label} | {f'`{b.polluter}`' if b.polluter else '-'} | {b.note} | {b.steps} |")
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    own, pytest_args = split_pytest_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m canarchy.testing.lanes order")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("run", help="run the suite in several orders and compare with the normal order")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"shuffled runs with seeds 1..N (default {DEFAULT_SEEDS})")
    p.add_argument("--seed", type=int, action="append", default=[], help="a specific seed (repeatable; replaces 1..N)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    p.add_argument("--max-bisections", type=int, default=3)
    args = parser.parse_args(own)
    try:
        junit = junit_path(pytest_args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.seeds < 0:
        parser.error("--seeds must be >= 0")
    seeds = args.seed or list(range(1, args.seeds + 1))
    raise_on_sigterm()
    try:
        result = run_order_lane(sys.executable, pytest_args, seeds=seeds, jobs=args.jobs,
                                max_bisections=args.max_bisections)
    except Terminated:
        print("order: terminated; its runs were stopped and its temporary directories removed", file=sys.stderr)
        return 128 + 15
    except KeyboardInterrupt:
        print("order: interrupted by SIGINT; its runs were stopped and its temporary directories removed",
              file=sys.stderr)
        return 128 + 2
    print(render(result))
    md = junit.with_suffix(".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(md, render_markdown(result))
    print(f"order: {result.status} - summary in {md}")
    return result.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
