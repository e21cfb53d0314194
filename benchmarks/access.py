"""What the access guard (``canarchy.testing.isolation.access``) costs.

Per test, measured: the trivial suite of :mod:`benchmarks.isolation` runs
bare; under canarchy's plugin with ``audithook.install`` made a no-op before the
plugin starts (no audit hook: neither the access guard nor the plugin's
observers of ``os.putenv``); under the plugin as it is (the guard on, the
hook installed once); and under the plugin with one more audit hook that
returns at once (what any Python audit hook costs: CPython calls it for
every audited event). Interleaved rounds, differences paired within a round.

Per call, in fresh processes (a hook can never be removed, so never in this
one): a judged ``open`` and ``os.listdir`` in a temporary directory, an event
the hook only looks up (``sys._getframe``), each without and then with the
hook, and one ``GUARD.take()``; best of 5 repeats. Per test, modelled: the
audited events of one test (counted in one more run) times those costs,
which a loaded machine disturbs far less than a whole run.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from benchmarks import isolation, measure, report

TARGET_MS = 0.05
VARIANTS = ("bare", "unguarded", "canarchy", "hook")
_UNGUARDED = '''
from canarchy.testing.isolation import audithook as _audithook

_audithook.install = lambda: None  # before the plugin starts: no audit hook, so no access guard
'''
_COUNTER = '''
import collections
import sys

from canarchy.testing.isolation.events import JUDGED_EVENTS as _JUDGED

_counts = collections.Counter()
_counting = []


def _count(event, args):
    if _counting:
        _counts["open" if event == "open" else "judged" if event in _JUDGED else "other"] += 1


sys.addaudithook(_count)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    _counting.append(True)
    try:
        return (yield)
    finally:
        _counting.clear()
        with open(os.environ["BENCH_COUNT_FILE"], "w", encoding="utf-8") as handle:
            json.dump({kind: n / session.testscollected for kind, n in _counts.items()}, handle)
'''
CONFTESTS = {
    **isolation.CONFTESTS,
    "unguarded": _UNGUARDED + isolation.CONFTESTS["canarchy"],
    "hook": isolation.CONFTESTS["canarchy"] + "\nimport sys\n\nsys.addaudithook(lambda event, args: None)\n",
    "count": isolation.CONFTESTS["canarchy"] + _COUNTER,
}
JUDGED_CASES = ("judged_open", "judged_listdir")
CASES = {
    "judged_open": "one judged `open` (a file in a temporary directory)",
    "judged_listdir": "one judged `os.listdir` (a temporary directory)",
    "other_event": "any other audited event (`sys._getframe`)",
}
_PER_CALL = '''
import dataclasses, json, os, sys, tempfile, timeit
from pathlib import Path
from canarchy.testing.isolation import access, audithook, protection, tempbase
calls = int(sys.argv[1])
work = tempfile.mkdtemp(prefix="canarchy-bench-access-")
target = os.path.join(work, "file")
open(target, "w").close()
cases = {"judged_open": (lambda: open(target, "rb").close(), calls),
         "judged_listdir": (lambda: os.listdir(work), calls),
         "other_event": (sys._getframe, calls * 20)}
def best(fn, n):
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
without = {name: best(fn, n) for name, (fn, n) in cases.items()}
operator = protection.default_protection(os.environ, tempbase.account_database_home())
access.GUARD.configure(dataclasses.replace(operator, watched=(os.path.join(work, "watched"),)))
access.GUARD.report_dir = Path(work)
audithook.install()
access.GUARD.enabled = True
with_hook = {name: best(fn, n) for name, (fn, n) in cases.items()}
# the judging alone, without the system call it precedes (which load disturbs most): what the hook runs
flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
judging = {"judged_open": best(lambda: access.GUARD._audit("open", (target, "rb", flags)), calls),
           "judged_listdir": best(lambda: access.GUARD._audit("os.listdir", (work,)), calls)}
take = best(access.GUARD.take, calls)
print(json.dumps({"without": without, "with": with_hook, "judging": judging, "take": take,
                  "refusals": len(access.GUARD.take_refusals())}))
access.GUARD.enabled = False
import shutil
shutil.rmtree(work, ignore_errors=True)
'''


@dataclass
class AccessResult:
    """The per-test runs (variants :data:`VARIANTS`); per fresh process, the per-call
    times (µs) ``{"without": {case: µs}, "with": {case: µs}, "judging": {case: µs}, "take": µs}``
    (``judging``: the guard's work for the event, without the system call); the audited
    events of one test (``{"open"|"judged"|"other": per test}``)."""

    suite: isolation.IsolationResult
    per_call: list[dict] = field(default_factory=list)
    events: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def per_test_ms(self, metric: str, variant: str = "canarchy", reference: str = "unguarded") -> float:
        """Median over rounds of (``variant`` - ``reference``) / tests, in ms, for ``metric``
        (``loop_cpu``, ``loop_wall``): by default what the hook adds to the plugin."""
        ours, theirs = self.suite.overhead_ms(variant, metric), self.suite.overhead_ms(reference, metric)
        return measure.median([a - b for a, b in zip(ours, theirs, strict=True)])

    def added_us(self, case: str) -> float:
        """Median over runs of the µs the hook adds to one call of ``case``."""
        return measure.median([run["with"][case] - run["without"][case] for run in self.per_call])

    def judging_us(self, case: str) -> float:
        """Median over runs of the µs the guard spends judging one ``case`` (no system call in it)."""
        return measure.median([run["judging"][case] for run in self.per_call])

    def modelled_ms(self) -> float:
        """One test's events times their costs, plus one take, in ms (NaN without counts): each
        event pays the hook's call (``other_event``); a judged one its judging too."""
        if not self.events or not self.per_call:
            return float("nan")
        call = self.added_us("other_event")
        take = measure.median([run["take"] for run in self.per_call])
        return (self.events.get("open", 0.0) * (call + self.judging_us("judged_open"))
                + self.events.get("judged", 0.0) * (call + self.judging_us("judged_listdir"))
                + self.events.get("other", 0.0) * call + take) / 1000.0

    @property
    def ok(self) -> bool:
        return bool(self.suite.runs["canarchy"].loop_cpu) and bool(self.per_call) and bool(self.events)


def run_per_call(calls: int = 20000, timeout: float = 300.0) -> dict:
    """One fresh process's per-call figures (see the module docstring). Raises ``RuntimeError`` if it fails."""
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-access-home-") as home:
        proc = measure.run([measure.python(), "-c", _PER_CALL, str(calls)], env=measure.child_env(home),
                           timeout=timeout)
    if not proc.ok:
        raise RuntimeError(f"exit {proc.returncode}: {' | '.join(proc.output.strip().splitlines()[-3:])}")
    return json.loads(proc.output.strip().splitlines()[-1])


def count_events(tests: int = 2000, timeout: float = 600.0) -> dict[str, float]:
    """The audited events of one test under the plugin: ``{"open", "judged", "other": per test}``.
    Raises ``RuntimeError`` if the run fails."""
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-access-count-") as tmp:
        root = Path(tmp)
        suite = isolation.write_suite(root / "suites", "count", tests=tests, conftests=CONFTESTS)
        counts = root / "counts.json"
        env = measure.child_env(root / "home", extra={"BENCH_TIMING_FILE": str(root / "timing.json"),
                                                      "BENCH_COUNT_FILE": str(counts)})
        (root / "home").mkdir()
        proc = measure.run([measure.python(), "-m", "pytest", "-q", "-p", "no:cacheprovider"], env=env,
                           cwd=suite, timeout=timeout)
        if not proc.ok or not counts.exists():
            raise RuntimeError(f"exit {proc.returncode}: {' | '.join(proc.output.strip().splitlines()[-3:])}")
        return json.loads(counts.read_text(encoding="utf-8"))


def run_access(*, tests: int = 2000, rounds: int = 9, calls: int = 20000, warmup: bool = True,
               log: Callable[[str], None] = print) -> AccessResult:
    """Measure it all: ``rounds`` interleaved rounds of the suites, ``rounds`` per-call processes, one count."""
    suite = isolation.run_isolation(tests=tests, rounds=rounds, variants=VARIANTS, warmup=warmup,
                                    conftests=CONFTESTS, log=log)
    result = AccessResult(suite=suite, problems=list(suite.problems))
    for run_no in range(rounds):
        try:
            result.per_call.append(run_per_call(calls))
        except (RuntimeError, OSError, ValueError) as error:
            result.problems.append(f"per-call run {run_no + 1}: {error}")
            continue
        log(f"access per-call run {run_no + 1}/{rounds}: "
            + ", ".join(f"{case} +{result.per_call[-1]['with'][case] - result.per_call[-1]['without'][case]:.2f} µs"
                        for case in CASES))
    try:
        result.events = count_events(tests)
    except (RuntimeError, OSError, ValueError) as error:
        result.problems.append(f"event count: {error}")
    return result


def report_lines(result: AccessResult) -> list[str]:
    """The report's section: ms per test over the plugin alone (measured, and modelled), µs per call."""
    def num(value: float, digits: int = 3) -> str:
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"

    def verdict(ms: float) -> str:
        return "n/a" if math.isnan(ms) else ("met" if ms <= TARGET_MS else "**missed**")

    cpu, modelled = result.per_test_ms("loop_cpu"), result.modelled_ms()
    events = ", ".join(f"{num(result.events.get(kind, 0.0), 1)} {kind}" for kind in ("open", "judged", "other"))
    rounds = len(result.suite.runs["canarchy"].loop_cpu)
    out = [f"### 5. Access guard ({result.suite.tests:,} trivial tests, median of {rounds} rounds; "
           f"per call: median of {len(result.per_call)} processes)", ""]
    floor = [result.per_test_ms(metric, "hook", "canarchy") for metric in ("loop_cpu", "loop_wall")]
    rows = [["ms/test the audit hook adds to canarchy's plugin (the guard and the plugin's observers), "
             "measured (CPU; wall)", f"{num(cpu)}; {num(result.per_test_ms('loop_wall'))}",
             f"<= {TARGET_MS} ms: {verdict(cpu)}"],
            ["ms/test one more hook that returns at once adds, the floor of any audit hook (CPU; wall)",
             f"{num(floor[0])}; {num(floor[1])}", ""],
            [f"ms/test added, modelled: the events of one test ({events}) times their costs, plus one take",
             num(modelled), f"<= {TARGET_MS} ms: {verdict(modelled)}"]]
    for case, label in CASES.items():
        without = measure.median([run["without"][case] for run in result.per_call])
        judging = f"; judging alone {num(result.judging_us(case), 2)}" if case in JUDGED_CASES else ""
        rows.append([f"µs added to {label}", f"{num(result.added_us(case), 2)} (of {num(without, 2)} without)"
                     f"{judging}", ""])
    rows.append(["µs for one `GUARD.take()` (nothing to take)",
                 num(measure.median([run["take"] for run in result.per_call]), 2), ""])
    out += report.table(["figure", "value", "target"], rows)
    out += ["", "Measured: the test loop only, paired within a round. Modelled: every event pays the hook's call "
            "(as `sys._getframe`), a judged one its judging too (as the `os.listdir`; an `open` as the `open`); "
            "for `os.putenv` that leaves out what the plugin's observer of it does. Per call: wall time, best of "
            "5 repeats; \"judging alone\" is the guard's work for the event without its system call, steadier "
            "than the difference of two calls on a loaded machine."]
    if result.problems:
        out += ["", "Problems: " + "; ".join(result.problems)]
    return out
