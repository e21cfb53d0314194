"""What the isolation sentinel costs as the user's trees grow (section ``sentinel``).

Four scenarios are built in a temporary directory, each a git checkout holding
the same 10-test project plus a fake home: ``empty`` (nothing more),
``ignored`` (``files`` empty files in a git-ignored directory of the checkout),
``tracked`` (``files`` empty tracked files), ``home`` (a sparse ``sparse_bytes``
file in the home's ``.canarchy``: ``truncate``, so it takes no disk).

Measured per scenario, interleaved, ``rounds`` times:

``snapshot``
    a child (``python -m benchmarks.sentinel worker CHECKOUT HOME``) takes what
    the sentinel takes with :mod:`canarchy.testing.isolation.tree` (the checkout's
    ``checkout_state``, the operator state under the home; twice, and ``changes``
    of each): wall and
    CPU time (git's included), resident set before, high-water mark after
    (``VmHWM``, reset first).
``pytest``
    ``python -m pytest`` on the 10 tests with ``HOME`` at the fake home, bare and
    with ``-p canarchy.testing.isolation.plugin``: wall time and the run's ``VmHWM``
    (written by the project's conftest at ``pytest_unconfigure``). Whatever the
    plugin's sentinel uses, this measures it.

Targets (:data:`TARGETS`, judged by :func:`verdicts`) are costs of a tree over the ``empty``
scenario, in CPU time (git included) and peak memory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence

SCENARIOS = ("empty", "ignored", "tracked", "home")
VARIANTS = ("bare", "plugin")
IGNORED_DIR = "ignored-data"
#: scenario -> (what is measured, limit) over the ``empty`` scenario: seconds, or MiB of peak memory.
TARGETS = {
    "ignored": (("seconds", 0.020),),
    "home": (("seconds", 0.020), ("peak_mib", 5.0)),
    "tracked": (("seconds", 1.0),),
}
TESTS = 10
_FILES_PER_DIR = 1000

_CONFTEST = '''\
import os


def pytest_unconfigure(config):
    target = os.environ.get("BENCH_VMHWM_FILE")
    if target:
        with open("/proc/self/status", encoding="ascii") as fh:
            peak = next((line.split()[1] for line in fh if line.startswith("VmHWM:")), "0")
        with open(target, "w", encoding="ascii") as fh:
            fh.write(peak)
'''

_GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@example.invalid", "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@example.invalid"}


def _git(cwd: Path, *args: str) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **_GIT_ENV}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, timeout=600)


def _many_files(where: Path, count: int) -> None:
    for index in range(count):
        folder = where / f"d{index // _FILES_PER_DIR:04d}"
        if index % _FILES_PER_DIR == 0:
            folder.mkdir(parents=True)
        # Empty: no data block to allocate, or to discard when the tree is removed (on a file
        # system mounted with `discard` that is what building and removing would cost).
        open(folder / f"f{index % _FILES_PER_DIR:04d}.txt", "xb").close()


def build_scenario(root: Path, scenario: str, *, files: int = 100_000,
                   sparse_bytes: int = 2 << 30) -> tuple[Path, Path]:
    """Build ``root/scenario/{checkout,home}``; return ``(checkout, home)``. ``ValueError`` for
    an unknown scenario; ``subprocess.CalledProcessError`` if git fails."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    checkout, home = root / scenario / "checkout", root / scenario / "home"
    (checkout / "tests").mkdir(parents=True)
    home.mkdir()
    (checkout / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n", encoding="utf-8")
    (checkout / "conftest.py").write_text(_CONFTEST, encoding="utf-8")
    (checkout / ".gitignore").write_text(f"/{IGNORED_DIR}/\n", encoding="utf-8")
    body = "".join(f"def test_{n:02d}():\n    assert {n} == {n}\n\n\n" for n in range(TESTS))
    (checkout / "tests" / "test_sample.py").write_text(body, encoding="utf-8")
    if scenario == "ignored":
        _many_files(checkout / IGNORED_DIR, files)
    elif scenario == "tracked":
        _many_files(checkout / "data", files)
    elif scenario == "home":
        (home / ".canarchy").mkdir()
        with open(home / ".canarchy" / "big.bin", "wb") as fh:
            fh.truncate(sparse_bytes)
    _git(checkout, "init", "-q", ".")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "scenario")
    return checkout, home


# --------------------------------------------------------------------------- worker (child process)


def worker(checkout: str, home: str) -> dict[str, float | int]:
    """What the sentinel does, with :mod:`canarchy.testing.isolation.tree`, timed in this process."""
    from benchmarks.captures import _peak_kib, _reset_peak, _rss_kib
    from canarchy.testing.isolation import tree
    from canarchy.testing.isolation.checkout import checkout_state

    def cpu_now() -> float:  # this process and the git processes it waited for (µs resolution)
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    _reset_peak()
    before_kib = _rss_kib()
    wall, cpu = time.perf_counter(), cpu_now()
    first = checkout_state(checkout), tree.snapshot(home, only=tree.OPERATOR_STATE)
    second = checkout_state(checkout, previous=first[0]), tree.snapshot(home, only=tree.OPERATOR_STATE)
    found = tree.changes(first[0], second[0]) + tree.changes(first[1], second[1])
    wall, cpu = time.perf_counter() - wall, cpu_now() - cpu
    return {"seconds": wall, "cpu_seconds": cpu, "rss_before_kib": before_kib, "peak_kib": _peak_kib(),
            "entries": len(first[0]) + len(first[1]), "changes": len(found)}


# --------------------------------------------------------------------------- parent


@dataclass
class ScenarioRuns:
    """Per round: the snapshot worker's JSON, and per variant the pytest run's wall and CPU
    time (s, CPU including git and other children) and peak (KiB); failures seen."""

    snapshot: list[dict] = field(default_factory=list)
    pytest_wall: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    pytest_cpu: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    pytest_peak_kib: dict[str, list[int]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    failures: list[str] = field(default_factory=list)


@dataclass
class SentinelResult:
    """The runs of every scenario and the sizes used."""

    files: int
    sparse_bytes: int
    rounds: int
    scenarios: dict[str, ScenarioRuns]

    def figures(self) -> dict[str, dict[str, float]]:
        """Medians per scenario: snapshot seconds and peak growth (MiB), pytest wall per
        variant, the plugin's cost over bare (s, wall and CPU, paired within a round) and its
        peak over bare (MiB)."""
        from benchmarks import measure

        def over(values: dict[str, list[float]]) -> float:
            return measure.median([p - b for p, b in zip(values["plugin"], values["bare"], strict=True)])

        out = {}
        for name, runs in self.scenarios.items():
            snap = runs.snapshot
            peak_over_bare = [(p - b) / 1024 for p, b in zip(runs.pytest_peak_kib["plugin"],
                                                             runs.pytest_peak_kib["bare"], strict=True)]
            out[name] = {
                "snapshot_seconds": measure.median([r["seconds"] for r in snap]),
                "snapshot_cpu_seconds": measure.median([r["cpu_seconds"] for r in snap]),
                "snapshot_peak_mib": measure.median([(r["peak_kib"] - r["rss_before_kib"]) / 1024 for r in snap]),
                "entries": snap[-1]["entries"] if snap else 0,
                "bare_seconds": measure.median(runs.pytest_wall["bare"]),
                "plugin_seconds": measure.median(runs.pytest_wall["plugin"]),
                "plugin_over_bare_seconds": over(runs.pytest_wall),
                "plugin_over_bare_cpu_seconds": over(runs.pytest_cpu),
                "plugin_peak_over_bare_mib": measure.median(peak_over_bare),
            }
        return out


def _pytest_run(checkout: Path, home: Path, variant: str, prefix: Path,
                timeout: float) -> tuple[float, float, int] | str:
    from benchmarks import measure

    peak_file = checkout.parent / f"vmhwm-{variant}"
    peak_file.unlink(missing_ok=True)
    env = measure.child_env(home, bytecode_prefix=prefix, extra={"BENCH_VMHWM_FILE": str(peak_file)})
    argv = [measure.python(), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if variant == "plugin":
        argv += ["-p", "canarchy.testing.isolation.plugin"]
    proc = measure.run(argv, env=env, cwd=checkout, timeout=timeout)
    if not proc.ok or not peak_file.exists():
        return f"{variant}: exit {proc.returncode}: {' | '.join(proc.output.strip().splitlines()[-3:])}"
    return proc.wall, proc.cpu, int(peak_file.read_text(encoding="ascii") or 0)


def run_sentinel(*, files: int = 100_000, sparse_bytes: int = 2 << 30, rounds: int = 5, timeout: float = 600.0,
                 scenarios: Sequence[str] = SCENARIOS, warmup: bool = True,
                 log: Callable[[str], None] = print) -> SentinelResult:
    """Build the scenarios in a temporary directory and measure them ``rounds`` times (plus, with
    ``warmup``, one uncounted round first), scenarios and variants interleaved in a rotating order."""
    from benchmarks import measure

    result = SentinelResult(files=files, sparse_bytes=sparse_bytes, rounds=rounds,
                            scenarios={s: ScenarioRuns() for s in scenarios})
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-sentinel-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        trees = {s: build_scenario(root, s, files=files, sparse_bytes=sparse_bytes) for s in scenarios}
        log(f"sentinel: built {len(trees)} scenarios ({files:,} files, {sparse_bytes / 2**30:.1f} GiB sparse) "
            f"in {time.monotonic() - started:.0f} s")
        prefix = root / "pycache"
        for round_no in range(-1 if warmup else 0, rounds):
            order = list(scenarios)
            if round_no > 0:
                order = order[round_no % len(order):] + order[:round_no % len(order)]
            for scenario in order:
                checkout, home = trees[scenario]
                runs = result.scenarios[scenario]
                env = measure.child_env(home, bytecode_prefix=prefix)
                proc = measure.run([measure.python(), "-m", "benchmarks.sentinel", "worker", str(checkout), str(home)],
                                   env=env, cwd=repo, timeout=timeout)
                try:
                    figures = json.loads(proc.output.strip().splitlines()[-1]) if proc.ok else None
                except (json.JSONDecodeError, IndexError):
                    figures = None
                variants = VARIANTS if round_no % 2 else VARIANTS[::-1]
                measured = {v: _pytest_run(checkout, home, v, prefix, timeout) for v in variants}
                if round_no < 0:
                    continue
                problems = [m for m in measured.values() if isinstance(m, str)]
                if figures is None:
                    problems.append(f"snapshot worker: exit {proc.returncode}: {proc.output.strip()[-300:]}")
                if problems:
                    runs.failures.extend(problems)
                    continue
                runs.snapshot.append(figures)
                for variant, (wall, cpu, peak) in measured.items():  # type: ignore[misc]
                    runs.pytest_wall[variant].append(wall)
                    runs.pytest_cpu[variant].append(cpu)
                    runs.pytest_peak_kib[variant].append(peak)
            if round_no >= 0:
                log(f"sentinel round {round_no + 1}/{rounds}: " + ", ".join(
                    f"{s} snapshot {result.scenarios[s].snapshot[-1]['seconds'] * 1000:.0f} ms"
                    for s in scenarios if result.scenarios[s].snapshot))
    return result


def verdicts(result: SentinelResult) -> dict[str, list[tuple[str, str, float, float, bool]]]:
    """Per scenario with targets: ``(form, what, value, limit, met)``, ``form`` ``snapshot`` or
    ``pytest``; values are CPU seconds or MiB over the ``empty`` scenario (empty when it is missing)."""
    figures = result.figures()
    empty = figures.get("empty")
    out: dict[str, list[tuple[str, str, float, float, bool]]] = {}
    for name, targets in TARGETS.items():
        row = figures.get(name)
        if row is None or empty is None:
            continue
        over = {
            "snapshot": (row["snapshot_cpu_seconds"] - empty["snapshot_cpu_seconds"],
                         row["snapshot_peak_mib"] - empty["snapshot_peak_mib"]),
            "pytest": (row["plugin_over_bare_cpu_seconds"] - empty["plugin_over_bare_cpu_seconds"],
                       row["plugin_peak_over_bare_mib"] - empty["plugin_peak_over_bare_mib"]),
        }
        out[name] = [(form, what, value, limit, value <= limit)
                     for form, (seconds, peak) in over.items()
                     for what, limit in targets
                     for value in [seconds if what == "seconds" else peak]]
    return out


def _amount(what: str, value: float) -> str:
    return f"{value * 1000:.0f} ms" if what == "seconds" else f"{value:.1f} MiB"


def report_lines(result: SentinelResult) -> list[str]:
    """Section 5 of the report: per scenario, the snapshot and the pytest runs, and the targets."""
    from benchmarks.report import _num, _verdict, table

    figures = result.figures()
    judged = verdicts(result)
    labels = {
        "empty": "empty checkout (the 10-test project)",
        "ignored": f"+ {result.files:,} files in a git-ignored directory",
        "tracked": f"+ {result.files:,} tracked files",
        "home": f"+ a {result.sparse_bytes / 2**30:.3g} GiB sparse file in `~/.canarchy`",
    }
    rows = []
    for name, row in figures.items():
        verdict = "; ".join(f"{form}: {_amount(what, value)} <= {_amount(what, limit)}: {_verdict(met)}"
                            for form, what, value, limit, met in judged.get(name, ()))
        rows.append([labels.get(name, name), f"{row['entries']:,}", _num(row["snapshot_seconds"] * 1000, 1),
                     _num(row["snapshot_cpu_seconds"] * 1000, 1), _num(row["snapshot_peak_mib"], 1),
                     _num(row["bare_seconds"], 3), _num(row["plugin_seconds"], 3),
                     _num(row["plugin_over_bare_cpu_seconds"] * 1000, 0),
                     _num(row["plugin_over_bare_seconds"] * 1000, 0), _num(row["plugin_peak_over_bare_mib"], 1),
                     verdict])
    out = [f"### 7. Sentinel: the cost of what the user has (10-test run, median of {result.rounds} rounds)", ""]
    out += table(["tree", "entries snapshotted", "snapshot + changes, ms (wall)", "(CPU)", "snapshot peak, MiB",
                  "pytest bare, s (wall)", "with the plugin, s (wall)", "plugin over bare, ms (CPU)", "(wall)",
                  "plugin's peak over bare, MiB", "target: the tree's cost over the empty checkout (CPU)"], rows)
    out += ["", "Snapshot: `canarchy.testing.isolation.tree` in a child, the sentinel's four snapshots (checkout "
            "and operator state, before and after) and their `changes`; peak = high-water mark minus the resident "
            "set before. pytest: whole process (git and other children in its CPU time), bare and with "
            "`-p canarchy.testing.isolation.plugin`, `HOME` at the scenario's home. A tree's cost is its figure "
            "minus the empty checkout's (for pytest: of \"plugin over bare\"), in CPU time, steadier than wall "
            "time on a shared machine."]
    failures = [f"{name}: {f}" for name, runs in result.scenarios.items() for f in runs.failures]
    if failures:
        out += ["", "Problems: " + "; ".join(failures[:6])]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``worker CHECKOUT HOME``: print one JSON line of figures."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != "worker":
        print("usage: python -m benchmarks.sentinel worker CHECKOUT HOME", file=sys.stderr)
        return 2
    print(json.dumps(worker(args[1], args[2]), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
