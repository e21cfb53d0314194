"""What the access guard (``canarchy.testing.isolation.access``) costs.

Per test: the generated trivial suite of :mod:`benchmarks.isolation` runs
bare, under canarchy's plugin, and under the plugin with the access guard
installed, configured (the default protection, the suite's directory
watched) and enabled, its owner set and its records taken per test as the
plugin does for the bus guard; interleaved rounds, the difference to the
plugin paired within a round, the median over rounds.

Per call, in fresh processes (the hook can never be removed, so never in
this one): a judged ``open`` of a file and a judged ``os.listdir`` in a
temporary directory, and an event the hook only looks up (``sys._getframe``),
each without the hook and then with it; best of 5 repeats, the median over runs.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from typing import Callable

from benchmarks import isolation, measure, report

TARGET_MS = 0.05
VARIANTS = ("bare", "canarchy", "access")
CONFTESTS = {
    **isolation.CONFTESTS,
    "access": isolation.CONFTESTS["canarchy"] + '''
import dataclasses
import tempfile
from pathlib import Path

from canarchy.testing.isolation import access as _access

_OPERATOR = {name: os.environ[name] for name in ("HOME", "USERPROFILE") if name in os.environ}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    protection = _access.default_protection(_OPERATOR, _access.account_database_home())
    _access.GUARD.configure(dataclasses.replace(protection, watched=(str(config.rootpath),),
                                                unwatched_names=(".pytest_cache", "__pycache__")))
    _access.GUARD.report_dir = Path(tempfile.mkdtemp(prefix="canarchy-bench-access-"))
    _access.install()
    _access.GUARD.enabled = True


def pytest_runtest_setup(item):
    _access.GUARD.owner = item.nodeid


def pytest_runtest_teardown(item):
    records = _access.GUARD.take_refusals() + _access.GUARD.take_watched()
    assert not records, records[0].message()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    _access.GUARD.enabled = False  # the plugin's sentinel hashes the operator's state next
''',
}
CASES = {
    "judged_open": "one judged `open` (a file in a temporary directory)",
    "judged_listdir": "one judged `os.listdir` (a temporary directory)",
    "other_event": "any other audited event (`sys._getframe`)",
}
_PER_CALL = '''
import dataclasses, json, os, sys, tempfile, timeit
from canarchy.testing.isolation import access
calls = int(sys.argv[1])
work = tempfile.mkdtemp(prefix="canarchy-bench-access-")
target = os.path.join(work, "file")
open(target, "w").close()
cases = {"judged_open": (lambda: open(target, "rb").close(), calls),
         "judged_listdir": (lambda: os.listdir(work), calls),
         "other_event": (sys._getframe, calls * 20)}
def per_call():
    return {name: min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6 for name, (fn, n) in cases.items()}
without = per_call()
protection = access.default_protection(os.environ, access.account_database_home())
access.GUARD.configure(dataclasses.replace(protection, watched=(os.path.join(work, "watched"),)))
access.install()
access.GUARD.enabled = True
print(json.dumps({"without": without, "with": per_call(), "refusals": len(access.GUARD.take_refusals())}))
'''


@dataclass
class AccessResult:
    """The per-test runs (variants :data:`VARIANTS`) and, per fresh process, the
    per-call times (µs) ``{"without": {case: µs}, "with": {case: µs}}``."""

    suite: isolation.IsolationResult
    per_call: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def per_test_ms(self, metric: str) -> float:
        """Median over rounds of (access - canarchy) / tests, in ms, for ``metric`` (``loop_cpu``, ``loop_wall``)."""
        ours, plugin = self.suite.overhead_ms("access", metric), self.suite.overhead_ms("canarchy", metric)
        return measure.median([a - b for a, b in zip(ours, plugin)])

    def added_us(self, case: str) -> float:
        """Median over runs of the µs the hook adds to one call of ``case``."""
        return measure.median([run["with"][case] - run["without"][case] for run in self.per_call])

    @property
    def ok(self) -> bool:
        return bool(self.suite.runs["access"].loop_cpu) and bool(self.per_call)


def run_per_call(calls: int = 20000, timeout: float = 300.0) -> dict:
    """One fresh process's per-call figures (see the module docstring). Raises ``RuntimeError`` if it fails."""
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-access-home-") as home:
        proc = measure.run([measure.python(), "-c", _PER_CALL, str(calls)], env=measure.child_env(home),
                           timeout=timeout)
    if not proc.ok:
        raise RuntimeError(f"exit {proc.returncode}: {' | '.join(proc.output.strip().splitlines()[-3:])}")
    return json.loads(proc.output.strip().splitlines()[-1])


def run_access(*, tests: int = 2000, rounds: int = 9, calls: int = 20000, warmup: bool = True,
               log: Callable[[str], None] = print) -> AccessResult:
    """Measure both figures: ``rounds`` interleaved rounds of the suites, ``rounds`` per-call processes."""
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
    return result


def report_lines(result: AccessResult) -> list[str]:
    """The report's section: ms per test over the plugin alone, µs per call."""
    def num(value: float, digits: int = 3) -> str:
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"

    cpu = result.per_test_ms("loop_cpu")
    verdict = "n/a" if math.isnan(cpu) else ("met" if cpu <= TARGET_MS else "**missed**")
    rounds = len(result.suite.runs["access"].loop_cpu)
    out = [f"### 5. Access guard ({result.suite.tests:,} trivial tests, median of {rounds} rounds; "
           f"per call: median of {len(result.per_call)} processes)", ""]
    rows = [["ms/test added to canarchy's plugin (CPU; wall)",
             f"{num(cpu)}; {num(result.per_test_ms('loop_wall'))}", f"<= {TARGET_MS} ms: {verdict}"]]
    for case, label in CASES.items():
        without = measure.median([run["without"][case] for run in result.per_call])
        rows.append([f"µs added to {label}", f"{num(result.added_us(case), 2)} (of {num(without, 2)} without)", ""])
    out += report.table(["figure", "value", "target"], rows)
    out += ["", "Per test: the test loop only, paired within a round; the access variant also sets the owner "
            "and takes the records in each test's setup and teardown. Per call: wall time, best of 5 repeats."]
    if result.problems:
        out += ["", "Problems: " + "; ".join(result.problems)]
    return out

