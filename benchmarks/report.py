"""The Markdown report: ``reports/bench.md`` and the results block of ``docs/benchmarks.md``.

Pure functions from the sections' results to text; :func:`replace_block`
puts the text between :data:`BEGIN` and :data:`END` in a document (appended
when the markers are missing), so the prose around the table stays as written.
"""

from __future__ import annotations

import math
import re
from typing import Any
from collections.abc import Sequence

from benchmarks import measure

BEGIN = "<!-- bench:results:begin (written by `nox -s bench`; edits here are replaced) -->"
END = "<!-- bench:results:end -->"
ISOLATION_TARGET_MS = 0.10
PARITY_RATIO_TARGET = 1.3
MUTATION_TARGET_S = 5.0
COLD_UNIT_TARGET_S = 60.0
SUITE_TARGET_S = 30.0
DEFAULT_NOX_RATIO_TARGET = 1.6

_ISOLATION_LABELS = {
    "bare": "bare pytest (reference)",
    "floor": "two empty autouse fixtures (pytest's floor)",
    "canarchy": "canarchy's plugin",
    "naive": "naive fixture (mktemp home + monkeypatch)",
}
_CAPTURE_LABELS = {
    "canarchy-read": "canarchy `open_capture` (parse)",
    "python-can-read": "python-can `CanutilsLogReader` (parse)",
    "canarchy-decode": "canarchy `decode --summary` (parse + decode + summaries)",
    "cantools-decode": "python-can reader + cantools `decode` (parse + decode)",
    "capture-jsonl": "canarchy `capture --file --jsonl` (parse + print)",
    "capture-json": "canarchy `capture --file --json` (parse + print)",
    "capture-text": "canarchy `capture --file --text` (parse + print)",
    "decode-jsonl": "canarchy `decode --jsonl` (parse + decode + print)",
    "decode-json": "canarchy `decode --json` (parse + decode + print)",
    "decode-text": "canarchy `decode --text` (parse + decode + print)",
}


def _num(value: float, digits: int = 2) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table (header, separator, rows); cells are used as given."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def machine_lines(info: dict[str, Any], started: str, seconds: float, commit: str) -> list[str]:
    """The "measured on" paragraph."""
    load = info.get("loadavg_start"), info.get("loadavg")
    return [
        f"Measured {started} on {info['cores']} cores, {info['implementation']} {info['python']}, "
        f"{info['platform']}; canarchy {commit}; the whole run took {seconds / 60:.1f} min. "
        f"Load average (1/5/15 min) {load[0]} at the start, {load[1]} at the end: the machine is shared, "
        "so figures are medians of repeated, interleaved runs, and CPU times (steadier than wall "
        "times under load) are given beside wall times.",
    ]


def isolation_lines(result: Any) -> list[str]:
    """Section 1: ms per test over bare pytest, per variant."""
    summary = result.summary()
    out = [f"### 1. Isolation overhead per test ({result.tests:,} trivial tests, "
           f"median of {len(result.runs['bare'].loop_wall)} rounds)", ""]
    rows = []
    for variant, row in summary.items():
        label = _ISOLATION_LABELS.get(variant, variant)
        if variant == "bare":
            rows.append([label, "0", "0", "0", _num(row["loop_wall_per_test"], 3), ""])
            continue
        target = ""
        if variant == "canarchy":
            naive = summary.get("naive", {}).get("loop_cpu", float("nan"))
            cpu = row["loop_cpu"]
            target = (f"<= {ISOLATION_TARGET_MS} ms: {_verdict(cpu <= ISOLATION_TARGET_MS)}; "
                      f"below naive: {_verdict(cpu < naive if not math.isnan(naive) else None)}")
        rows.append([label, _num(row["loop_cpu"], 3), _num(row["loop_wall"], 3), _num(row["proc_wall"], 3),
                     _num(row["loop_wall_per_test"], 3), target])
    out += table(["isolation", "ms/test over bare (CPU)", "ms/test over bare (wall)",
                  "ms/test over bare (whole run, wall)", "ms/test total (wall)", "target"], rows)
    out += ["", "Per test: the test loop only (`pytest_runtestloop`); \"whole run\" adds interpreter start, "
            "collection and session set-up, spread over the tests. Overheads are paired within a round."]
    if result.problems:
        out += ["", "Problems: " + "; ".join(result.problems)]
    return out


def _status(row: Any) -> str:
    if not row.exit_codes:
        return "not run"
    texts = []
    for code, verdict in zip(row.exit_codes, row.verdicts, strict=False):
        word = re.match(r"^[^:]+: ([A-Z][A-Z ]*[A-Z])", verdict)
        texts.append(word.group(1) if word else f"exit {code}")
    distinct = sorted(set(texts))
    return ", ".join(distinct)


def lanes_lines(rows: Sequence[Any], problems: Sequence[str]) -> list[str]:
    """Section 2: the plain suite, the default nox run and each lane, with their targets."""
    out = ["### 2. Lanes (wall time)", ""]
    warm = {r.lane: r for r in rows if not r.cold}

    def median_of(name: str) -> float:
        return measure.median(warm[name].wall) if name in warm and warm[name].wall else float("nan")

    def ratio_target(med: float, base: float, base_name: str, limit: float) -> str:
        ratio = med / base if base == base and base > 0 else float("nan")
        return (f"{_num(ratio)} x {base_name}; <= {limit} x: "
                f"{_verdict(None if math.isnan(ratio) else ratio <= limit)}")

    table_rows = []
    for row in rows:
        med = measure.median(row.wall)
        low, high = measure.spread(row.wall)
        target = ""
        if row.cold:
            target = f"< {COLD_UNIT_TARGET_S:.0f} s: {_verdict(med < COLD_UNIT_TARGET_S if row.wall else None)}"
        elif row.lane == "pytest":
            target = f"<= {SUITE_TARGET_S:.0f} s: {_verdict(med <= SUITE_TARGET_S if row.wall else None)}"
        elif row.lane == "default":
            target = ratio_target(med, median_of("pytest"), "plain pytest", DEFAULT_NOX_RATIO_TARGET)
        elif row.lane == "parity":
            target = ratio_target(med, median_of("unit"), "unit", PARITY_RATIO_TARGET)
        elif row.lane.startswith("mutation"):
            target = f"<= {MUTATION_TARGET_S:.0f} s: {_verdict(med <= MUTATION_TARGET_S if row.wall else None)}"
        if row.cold:
            label = f"`nox -s {row.lane}` in a fresh clone (cold)"
        elif row.lane == "pytest":
            label = "`python -m pytest` (plain, serial; the unit lane's interpreter)"
        elif row.lane == "default":
            label = "`nox -R` (the default sessions, warm)"
        else:
            label = f"`nox -R -s {row.lane}` (warm)"
        table_rows.append([label, str(len(row.wall)), _num(med, 1), f"{_num(low, 1)}-{_num(high, 1)}",
                           _num(measure.median(row.cpu), 1), _status(row), target])
    out += table(["lane", "runs", "median s", "range s", "CPU s (all processes)", "verdict", "target"], table_rows)
    out += ["", "CPU: nox and every process it waited for (pytest, its children), summed over cores. A lane whose "
            "CPU time is more than the machine's cores times another lane's wall time cannot be faster than that."]
    if problems:
        out += ["", "Problems: " + "; ".join(problems)]
    return out


def captures_lines(result: Any) -> list[str]:
    """Section 3: frames per second and memory."""
    logs = result.logs
    out = ["### 3. Reading and decoding a large candump log", "",
           f"`mixed.log`: {logs['mixed']['frames']:,} frames, {logs['mixed']['bytes'] / 2**20:.1f} MiB (all three "
           f"captures); `j1939.log`: {logs['j1939']['frames']:,} frames, {logs['j1939']['bytes'] / 2**20:.1f} MiB "
           "(the J1939 truck capture), decoded against `css_j1939_demo.dbc`.", ""]
    rows = []
    rates = {}
    for kind, runs in result.kinds.items():
        if not runs.results:
            rows.append([_CAPTURE_LABELS.get(kind, kind), runs.log, "failed", "", "", "", "", ""])
            continue
        rate = measure.median(runs.rates())
        rates[kind] = rate
        last = runs.results[-1]
        peak = measure.median([r["peak_kib"] for r in runs.results]) / 1024
        before = measure.median([r["rss_before_kib"] for r in runs.results]) / 1024
        rows.append([_CAPTURE_LABELS.get(kind, kind), f"`{runs.log}.log`", f"{rate / 1000:,.0f}k",
                     f"{measure.median(runs.cpu_rates()) / 1000:,.0f}k", f"{last['frames']:,}",
                     f"{last['decoded']:,}" if kind.endswith("decode") else "-",
                     f"{before:.1f}", f"{peak:.1f}"])
    out += table(["reader", "log", "frames/s (wall)", "frames/s (CPU)", "frames", "decoded", "RSS before, MiB",
                  "peak RSS in the loop, MiB"], rows)
    out += [""] + capture_target_lines(result, rates)
    if "canarchy-decode" in rates and "cantools-decode" in rates:
        ratio = rates["canarchy-decode"] / rates["cantools-decode"]
        out += [f"Decoding: canarchy's `decode` runs at {ratio:.2f} x the plain python-can + cantools loop."]
    out += ["Memory (medians): \"before\" is the process's resident set after imports and the DBC load, before "
            "the first frame; the peak is its high-water mark (VmHWM) while reading, reset before the first frame. "
            "A peak equal to \"before\" for a file of tens of MiB means the reader streams."]
    failures = [f"{k}: {f}" for k, r in result.kinds.items() for f in r.failures]
    if failures:
        out += ["", "Problems: " + "; ".join(failures)]
    return out


def capture_target_lines(result: Any, rates: dict[str, float]) -> list[str]:
    """The verdicts on the capture targets (``benchmarks.captures.TARGETS``): time ratios to
    python-can's reader (median CPU rates) and the peak resident set of each output form."""
    from benchmarks.captures import MEMORY_KINDS, TARGETS

    cpu = {kind: measure.median(runs.cpu_rates()) for kind, runs in result.kinds.items() if runs.results}
    out = []
    reference = cpu.get("python-can-read")
    for kind, key, what in (("canarchy-read", "parse_time_ratio", "the candump parser"),
                            ("capture-jsonl", "capture_jsonl_time_ratio", "`capture --file --jsonl`")):
        if reference and kind in cpu:
            ratio = reference / cpu[kind]  # time ratio: ours / python-can's
            out.append(f"Time of {what}: {ratio:.2f} x python-can's reader (CPU, median); target <= "
                       f"{TARGETS[key]:.1f} x: {_verdict(ratio <= TARGETS[key])}.")
    frames = result.logs["mixed"]["frames"]
    peaks = {kind: measure.median([r["peak_kib"] for r in result.kinds[kind].results]) / 1024
             for kind in MEMORY_KINDS if kind in result.kinds and result.kinds[kind].results}
    if peaks:
        worst = max(peaks, key=peaks.get)
        out.append(f"Peak resident set of every output form of `capture --file` and `decode` at {frames:,} frames: "
                   f"at most {peaks[worst]:.1f} MiB ({worst}); target < {TARGETS['peak_mib']:.0f} MiB "
                   f"(stated for 10,000,000 frames): {_verdict(peaks[worst] < TARGETS['peak_mib'])}.")
    return out


def startup_lines(rows: Sequence[Any], target_s: float) -> list[str]:
    """Section 4: start-up wall times."""
    runs = max((len(r.wall) for r in rows), default=0)
    out = [f"### 4. Command start-up (process start to exit, median of {runs} runs)", ""]
    table_rows = []
    for row in rows:
        med = measure.median(row.wall)
        target = f"<= {target_s} s: {_verdict(med <= target_s if row.wall else None)}" if row.offline else ""
        peak = f"{row.peak_kib / 1024:.1f}" if row.peak_kib else "n/a"
        table_rows.append([f"`{row.label}`", _num(med, 3), _num(measure.median(row.cpu), 3), peak, target])
    out += table(["command", "wall s", "CPU s", "peak RSS, MiB", "target"], table_rows)
    failures = [f"{r.label}: {f}" for r in rows for f in r.failures]
    if failures:
        out += ["", "Problems: " + "; ".join(failures[:10])]
    return out


def replace_block(document: str, block: str) -> str:
    """``document`` with the text between :data:`BEGIN` and :data:`END` replaced by ``block``
    (both markers kept); the markers and block are appended when missing."""
    body = f"{BEGIN}\n{block.rstrip()}\n{END}"
    start, end = document.find(BEGIN), document.find(END)
    if start == -1 or end == -1 or end < start:
        return document.rstrip("\n") + "\n\n" + body + "\n"
    return document[:start] + body + document[end + len(END):]
