"""``python -m benchmarks``: run the sections and write the report (``nox -s bench`` calls this).

Options: ``--sections isolation,lanes,captures,startup,access,containment,sentinel`` (default all);
``--rounds N`` (isolation rounds, default 9), ``--tests N`` (default 2000),
``--lane-runs N`` (default 3), ``--no-cold``, ``--capture-runs N`` (default
3), ``--frames N`` (default 1,000,000), ``--startup-runs N`` (default 15),
``--containment-runs N`` (default 15), ``--sentinel-rounds N`` (default 5),
``--sentinel-files N`` (default 100,000);
``--nox-python PATH`` (the interpreter that runs nox; without it the lanes
section is skipped); ``--reports DIR`` (default ``reports``; writes
``bench.md`` and ``bench.json``); ``--docs PATH`` (default
``docs/benchmarks.md``, its results block is replaced) or ``--no-docs``.

Exit code 0 when every section ran (missed targets are reported, not
failed: benchmarks are not tests), 1 when a section could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import measure, report

SECTIONS = ("isolation", "lanes", "captures", "startup", "access", "containment", "sentinel")
ROOT = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="canarchy's benchmarks (docs/benchmarks.md)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    p.add_argument("--rounds", type=int, default=9, help="isolation rounds (default 9)")
    p.add_argument("--tests", type=int, default=2000, help="generated trivial tests (default 2000)")
    p.add_argument("--lane-runs", type=int, default=3, help="timed runs per warm lane (default 3)")
    p.add_argument("--no-cold", action="store_true", help="skip the cold `nox -s unit` in a fresh clone")
    p.add_argument("--capture-runs", type=int, default=3, help="runs per capture reader (default 3)")
    p.add_argument("--frames", type=int, default=1_000_000, help="frames per generated log (default 1,000,000)")
    p.add_argument("--startup-runs", type=int, default=15, help="runs per command (default 15)")
    p.add_argument("--containment-runs", type=int, default=15, help="runs per containment variant (default 15)")
    p.add_argument("--sentinel-rounds", type=int, default=5, help="rounds per sentinel scenario (default 5)")
    p.add_argument("--sentinel-files", type=int, default=100_000, help="files per large tree (default 100,000)")
    p.add_argument("--nox-python", help="interpreter that runs nox (the lanes section needs it)")
    p.add_argument("--reports", default="reports", help="directory for bench.md and bench.json (default reports)")
    p.add_argument("--docs", default="docs/benchmarks.md", help="document whose results block is replaced")
    p.add_argument("--no-docs", action="store_true", help="do not touch the document")
    return p


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "(unknown commit)"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "(unknown commit)"


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# Each section: (what goes into bench.json under its name, or None for nothing; its report lines; did it measure?)
Section = tuple[object, list[str], bool]


def _isolation(args: argparse.Namespace) -> Section:
    from benchmarks import isolation

    result = isolation.run_isolation(tests=args.tests, rounds=args.rounds)
    return _jsonable(result), report.isolation_lines(result), bool(result.runs["bare"].loop_wall)


def _lanes(args: argparse.Namespace) -> Section:
    if not args.nox_python:
        return None, ["### 2. Lanes", "", "Not measured: no `--nox-python` given."], False
    from benchmarks import lane_times

    rows, problems = lane_times.run_lanes(ROOT, args.nox_python, runs=args.lane_runs, cold=not args.no_cold)
    return {"runs": _jsonable(rows), "problems": problems}, report.lanes_lines(rows, problems), bool(rows)


def _captures(args: argparse.Namespace) -> Section:
    from benchmarks import captures

    result = captures.run_captures(frames=args.frames, runs=args.capture_runs)
    return _jsonable(result), report.captures_lines(result), all(r.results for r in result.kinds.values())


def _startup(args: argparse.Namespace) -> Section:
    from benchmarks import startup

    rows = startup.run_startup(runs=args.startup_runs)
    return _jsonable(rows), report.startup_lines(rows, startup.TARGET_S), all(r.wall for r in rows)


def _access(args: argparse.Namespace) -> Section:
    from benchmarks import access

    result = access.run_access(tests=args.tests, rounds=args.rounds)
    return _jsonable(result), access.report_lines(result), bool(result.ok)


def _containment(args: argparse.Namespace) -> Section:
    from benchmarks import containment

    rows = containment.run_containment(runs=args.containment_runs)
    return _jsonable(rows), containment.containment_lines(rows), all(r.ms for r in rows)


def _sentinel(args: argparse.Namespace) -> Section:
    from benchmarks import sentinel

    result = sentinel.run_sentinel(files=args.sentinel_files, rounds=args.sentinel_rounds)
    return _jsonable(result), sentinel.report_lines(result), all(r.snapshot for r in result.scenarios.values())


RUNNERS = {"isolation": _isolation, "lanes": _lanes, "captures": _captures, "startup": _startup,
           "access": _access, "containment": _containment, "sentinel": _sentinel}


def _under_root(name: str) -> Path:
    return ROOT / name if not Path(name).is_absolute() else Path(name)


def _write(args: argparse.Namespace, text: str, document: dict[str, object]) -> None:
    """Write ``bench.md`` and ``bench.json`` under ``--reports``; replace the results block of ``--docs``."""
    from canarchy.fileio import write_json_atomic, write_text_atomic

    reports = _under_root(args.reports)
    reports.mkdir(parents=True, exist_ok=True)
    write_text_atomic(reports / "bench.md", "# canarchy benchmarks\n\n" + text)
    write_json_atomic(reports / "bench.json", document)
    print(text)
    print(f"bench: wrote {reports / 'bench.md'} and bench.json")
    if not args.no_docs:
        docs = _under_root(args.docs)
        existing = docs.read_text(encoding="utf-8") if docs.exists() else "# Benchmarks\n"
        write_text_atomic(docs, report.replace_block(existing, text))
        print(f"bench: updated the results block of {docs}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        print(f"unknown section(s): {', '.join(unknown)}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    started, clock = time.strftime("%Y-%m-%d %H:%M %Z"), time.monotonic()
    info = measure.machine()
    info["loadavg_start"] = info["loadavg"]
    print(f"bench: {info['cores']} cores, Python {info['python']}, load {info['loadavg']}; sections {sections}")
    blocks: list[list[str]] = []
    raw: dict[str, object] = {}
    failed = []
    for name in (s for s in SECTIONS if s in sections):
        value, block, measured = RUNNERS[name](args)
        if value is not None:
            raw[name] = value
        blocks.append(block)
        if not measured:
            failed.append(name)
    info["loadavg"] = measure.machine()["loadavg"]
    seconds = time.monotonic() - clock
    body = report.machine_lines(info, started, seconds, _commit())
    for block in blocks:
        body += [""] + block
    text = "\n".join(body) + "\n"
    _write(args, text, {"machine": info, "started": started, "seconds": seconds, **raw})
    if failed:
        print(f"bench: could not measure: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
