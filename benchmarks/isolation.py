"""What canarchy's test isolation costs per test.

A generated suite of trivial tests (``def test_0001(): pass``, default 2,000 in
10 modules) runs under four ``conftest.py`` files, each in its own directory,
in the same session:

``bare``
    no isolation: pytest's own cost, the reference.
``floor``
    two autouse function-scoped fixtures that only ``yield`` (the shape of
    canarchy's two): what pytest charges for any two such fixtures. No
    fixture-based isolation can cost less than this.
``canarchy``
    ``pytest_plugins = ["canarchy.testing.isolation.plugin"]``, as tests/conftest.py.
``naive``
    the seed's fixture: per test ``tmp_path_factory.mktemp("home")``, then
    ``monkeypatch.setenv`` of ``HOME``/``USERPROFILE`` and ``monkeypatch.delenv``
    of every ``CANARCHY_*`` variable.

Every conftest also holds a timer (``pytest_runtestloop`` wrapper) that writes
the wall and CPU time of the test loop to a JSON file, so per-test figures
leave out interpreter start, collection and session set-up (those are
reported separately as "whole run"). Variants run interleaved, in a rotating
order, so that a burst of load on a shared machine hits all of them.
Overhead per test = (variant - bare) / tests, paired within one round; the
report gives the median over rounds.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping

from benchmarks import measure

VARIANTS = ("bare", "floor", "canarchy", "naive")

_TIMER = '''\
import json
import os
import time

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        return (yield)
    finally:
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        with open(os.environ["BENCH_TIMING_FILE"], "w", encoding="utf-8") as fh:
            json.dump({"wall": wall, "cpu": cpu, "tests": session.testscollected,
                       "failed": session.testsfailed}, fh)
'''

CONFTESTS = {
    "bare": "",
    "floor": '''

@pytest.fixture(autouse=True)
def _first(request):
    yield None


@pytest.fixture(autouse=True)
def _second(request):
    yield None
''',
    "canarchy": '''
pytest_plugins = ["canarchy.testing.isolation.plugin"]
''',
    "naive": '''

@pytest.fixture(autouse=True)
def _naive_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))
    for name in [name for name in os.environ if name.startswith("CANARCHY_")]:
        monkeypatch.delenv(name)
    yield home
''',
}


def write_suite(root: Path, variant: str, *, tests: int = 2000, modules: int = 10,
                conftests: Mapping[str, str] = CONFTESTS) -> Path:
    """Write the generated suite for ``variant`` under ``root/variant``; return that directory.

    ``tests`` trivial tests spread over ``modules`` files; a ``pytest.ini`` makes
    the directory pytest's rootdir (so no other configuration is read);
    ``conftests``: each variant's conftest.py code (after the timer). Raises
    ``KeyError`` for an unknown variant, ``ValueError`` when ``tests`` < 1.
    """
    if tests < 1 or modules < 1:
        raise ValueError("tests and modules must be at least 1")
    extra = conftests[variant]
    suite = root / variant
    suite.mkdir(parents=True)
    (suite / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (suite / "conftest.py").write_text(_TIMER + extra, encoding="utf-8")
    per_module, rest = divmod(tests, modules)
    number = 0
    for index in range(modules):
        count = per_module + (1 if index < rest else 0)
        if count == 0:
            continue
        body = "".join(f"def test_{number + i:05d}():\n    pass\n\n\n" for i in range(count))
        number += count
        (suite / f"test_generated_{index:02d}.py").write_text(body, encoding="utf-8")
    return suite


@dataclass
class VariantRuns:
    """The measured runs of one variant: per round, the test loop's wall and CPU
    time (s) and the whole process's wall and CPU time (s)."""

    loop_wall: list[float] = field(default_factory=list)
    loop_cpu: list[float] = field(default_factory=list)
    proc_wall: list[float] = field(default_factory=list)
    proc_cpu: list[float] = field(default_factory=list)


@dataclass
class IsolationResult:
    """Runs of every variant (same rounds), the test count, and failures seen."""

    tests: int
    rounds: int
    runs: dict[str, VariantRuns]
    problems: list[str] = field(default_factory=list)

    def overhead_ms(self, variant: str, metric: str) -> list[float]:
        """Per round, ``(variant - bare) / tests`` in ms for ``metric``
        (``loop_wall``, ``loop_cpu``, ``proc_wall``, ``proc_cpu``)."""
        ours, bare = getattr(self.runs[variant], metric), getattr(self.runs["bare"], metric)
        return [1000.0 * (a - b) / self.tests for a, b in zip(ours, bare, strict=True)]

    def summary(self) -> dict[str, dict[str, float]]:
        """``{variant: {metric: median ms per test over bare}}`` plus the bare loop's own ms per test."""
        out: dict[str, dict[str, float]] = {}
        for variant in self.runs:
            row = {m: measure.median(self.overhead_ms(variant, m)) for m in ("loop_wall", "loop_cpu", "proc_wall")}
            row["loop_wall_per_test"] = measure.median([1000.0 * w / self.tests for w in self.runs[variant].loop_wall])
            out[variant] = row
        return out


def run_isolation(*, tests: int = 2000, rounds: int = 9, variants: tuple[str, ...] = VARIANTS,
                  timeout: float = 600.0, warmup: bool = True, conftests: Mapping[str, str] = CONFTESTS,
                  log: Callable[[str], None] = print) -> IsolationResult:
    """Generate the suites in a temporary directory and run them ``rounds`` times
    (plus, with ``warmup``, one round first that is not counted). Requires ``"bare"`` in ``variants``;
    ``conftests`` as for :func:`write_suite`."""
    if "bare" not in variants:
        raise ValueError("the 'bare' variant is the reference and must be measured")
    result = IsolationResult(tests=tests, rounds=rounds, runs={v: VariantRuns() for v in variants})
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-isolation-") as tmp:
        root = Path(tmp)
        suites = {v: write_suite(root / "suites", v, tests=tests, conftests=conftests) for v in variants}
        prefix = root / "pycache"
        for round_no in range(-1 if warmup else 0, rounds):  # round -1: warm-up (byte code, file cache)
            order = list(variants)
            if round_no > 0:
                shift = round_no % len(order)
                order = order[shift:] + order[:shift]
            measured: dict[str, tuple[float, float, float, float]] = {}
            for variant in order:
                timing_file = root / f"timing-{variant}.json"
                timing_file.unlink(missing_ok=True)
                home = root / "home" / f"{variant}-{round_no + 1}"
                home.mkdir(parents=True)
                # One CANARCHY_* variable, so that both isolations have one to remove.
                env = measure.child_env(home, bytecode_prefix=prefix,
                                        extra={"BENCH_TIMING_FILE": str(timing_file), "CANARCHY_BENCH": "1"})
                proc = measure.run([measure.python(), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                                   env=env, cwd=suites[variant], timeout=timeout)
                timing = json.loads(timing_file.read_text(encoding="utf-8")) if timing_file.exists() else None
                if not proc.ok or timing is None or timing["tests"] != tests or timing["failed"]:
                    tail = proc.output.strip().splitlines()[-3:]
                    result.problems.append(f"{variant} round {round_no + 1}: exit {proc.returncode}, "
                                           f"timing {timing}: {' | '.join(tail)}")
                    continue
                measured[variant] = (timing["wall"], timing["cpu"], proc.wall, proc.cpu)
            if round_no < 0:
                continue
            if len(measured) != len(variants):  # overheads are paired within a round: keep whole rounds only
                continue
            for variant, (loop_wall, loop_cpu, proc_wall, proc_cpu) in measured.items():
                runs = result.runs[variant]
                runs.loop_wall.append(loop_wall)
                runs.loop_cpu.append(loop_cpu)
                runs.proc_wall.append(proc_wall)
                runs.proc_cpu.append(proc_cpu)
            log(f"isolation round {round_no + 1}/{rounds}: "
                + ", ".join(f"{v} {measured[v][0]:.2f}s" for v in variants))
    return result
