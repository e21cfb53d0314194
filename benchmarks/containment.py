"""What entering containment costs (``canarchy.testing.isolation.containment``).

Each run is a fresh child (``python -I``) that loads the module and enters
the plan the plugin builds: the five operator paths under a disposable home
(``.canarchy`` and ``.canrc`` exist, the other three do not), the home
read-only, a checkout, a sandbox and a TMPDIR writable inside it. The child
times :func:`enter` alone (wall and CPU time around the call; interpreter
start is not part of the cost) and prints it. The target is on the median
wall time; CPU time (user + system) is the steadier figure on a shared machine. With and without the network
namespace, ``runs`` times each, interleaved. Target: :data:`TARGET_MS`.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from benchmarks import measure, report

TARGET_MS = 50.0
MODULE = Path(__file__).resolve().parents[1] / "canarchy" / "testing" / "isolation" / "containment.py"

CHILD = """\
import importlib.util, json, sys, time
found = importlib.util.spec_from_file_location("containment", sys.argv[1])
m = sys.modules["containment"] = importlib.util.module_from_spec(found)
found.loader.exec_module(m)
home, etc, network = sys.argv[2], sys.argv[3], sys.argv[4] == "1"
plan = m.Plan(covered=[f"{home}/{n}" for n in (".canarchy", ".canrc", "can.conf", ".can")] + [f"{etc}/can.conf"],
              read_only=[home], writable=[f"{home}/{n}" for n in ("checkout", "sandbox", "tmp")], network=network)
start, cpu = time.perf_counter(), time.process_time()
result = m.enter(plan)
ms, cpu_ms = (time.perf_counter() - start) * 1000, (time.process_time() - cpu) * 1000
print(json.dumps({"ms": ms, "cpu_ms": cpu_ms, "in_force": result.in_force, "reason": result.reason}))
"""


@dataclass
class EnterRuns:
    """One variant's runs: wall and CPU milliseconds per ``enter``, whether it was in force, failures."""

    label: str
    network: bool
    ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    in_force: list[bool] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def run_containment(*, runs: int = 15, timeout: float = 60.0, log: Callable[[str], None] = print) -> list[EnterRuns]:
    """Enter containment in ``runs`` fresh children per variant (after one warm-up each)."""
    rows = [EnterRuns("user + mount + network namespaces, locked", True),
            EnterRuns("user + mount namespaces, locked (network kept)", False)]
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-containment-") as tmp:
        root = Path(tmp)
        home, etc = root / "home", root / "etc"
        for path in (home / ".canarchy", home / "checkout", home / "sandbox", home / "tmp", etc):
            path.mkdir(parents=True)
        (home / ".canarchy" / "config.toml").write_text("[transport]\n", encoding="ascii")
        (home / ".canrc").write_text("[default]\n", encoding="ascii")
        env = measure.child_env(root / "child-home")
        for round_no in range(-1, runs):
            for row in rows:
                argv = [measure.python(), "-I", "-c", CHILD, str(MODULE), str(home), str(etc),
                        "1" if row.network else "0"]
                proc = measure.run(argv, env=env, cwd=root, timeout=timeout)
                try:
                    result = json.loads(proc.output.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    row.failures.append(f"exit {proc.returncode}: {proc.output.strip()[-200:]}")
                    continue
                if not result["in_force"]:
                    row.failures.append(result["reason"])
                if round_no >= 0:
                    row.ms.append(result["ms"])
                    row.cpu_ms.append(result["cpu_ms"])
                    row.in_force.append(result["in_force"])
            if round_no >= 0 and (round_no + 1) % 5 == 0:
                log(f"containment round {round_no + 1}/{runs}")
    return rows


def containment_lines(rows: Sequence[Any]) -> list[str]:
    """Section 6: what ``enter`` costs."""
    runs = max((len(r.ms) for r in rows), default=0)
    out = [f"### 6. Containment (entering, in a fresh child process, {runs} runs)", ""]
    table_rows = []
    for row in rows:
        median, (low, high) = measure.median(row.ms), measure.spread(row.ms)
        ok = (median <= TARGET_MS and all(row.in_force)) if row.ms else None
        table_rows.append([row.label, report._num(median, 1), f"{report._num(low, 1)}-{report._num(high, 1)}",
                           report._num(measure.median(row.cpu_ms), 1),
                           f"{sum(row.in_force)}/{len(row.in_force)}",
                           f"<= {TARGET_MS:.0f} ms: {report._verdict(ok)}"])
    out += report.table(["variant", "median ms", "min-max ms", "CPU ms", "in force", "target"], table_rows)
    failures = sorted({f"{r.label}: {f}" for r in rows for f in r.failures})
    if failures:
        out += ["", "Not in force: " + "; ".join(failures[:5])]
    return out
