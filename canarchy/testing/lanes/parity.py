"""The parity lane: the suite twice at once, with and without an operator's home and shell, compared."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import build_env, hostile_env
from canarchy.testing.lanes.manifest import diff_manifests, manifest, tree_manifest
from canarchy.testing.lanes.netns import netns_support
from canarchy.testing.lanes.runner import (
    EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, PytestRun, junit_path, raise_on_sigterm, run_pytest, stop_all,
    with_junit,
)
from canarchy.testing.lanes.verdict import summary_text

_NOT_SHUT_DOWN = "was not properly shut down"

@dataclass
class ParityResult:
    """Everything the parity lane found; ``exit_code`` 0 identical, 1 different, 2 cannot decide."""

    comparison: object
    runs: dict[str, PytestRun]
    not_shut_down: dict[str, list[str]]
    home_changes: list[str]
    checkout_changes: list[str]
    hashseeds: dict[str, int]
    netns_note: str

    @property
    def exit_code(self) -> int:
        code = self.comparison.exit_code  # type: ignore[attr-defined]
        if code == EXIT_CANNOT_DECIDE:
            return code
        if code or any(self.not_shut_down.values()) or self.home_changes or self.checkout_changes:
            return EXIT_FAILED
        return EXIT_PASSED


def run_parity(
    python: str,
    pytest_args: Sequence[str],
    *,
    operator_home: Path,
    checkout: Path,
    allowlist: Path | None,
    source_env: Mapping[str, str],
    hashseeds: tuple[int, int] | None = None,
    use_netns: bool | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> ParityResult:
    """Run the suite twice at once - clean twin (empty home, clean shell) and
    configured twin (a copy of ``operator_home`` and :data:`HOSTILE_ENV`), each
    in its own private network namespace where available (:func:`containment`;
    ``use_netns`` False/True forces it); ``extra_env`` is set in both,
    e.g. a ``PYTHONPATH``) - then compare the reports,
    scan both logs for "was not properly shut down", and check that the home
    copy and the checkout are byte-for-byte unchanged.
    """
    from canarchy.testing.lanes import results as junit_compare

    base_junit = junit_path(pytest_args)
    seeds = hashseeds or tuple(random.sample(range(1, 2**31), 2))  # type: ignore[assignment]
    support = netns_support()
    netns = support.available if use_netns is None else use_netns
    netns_note = (
        "both twins ran in private network namespaces (loopback only)" if netns
        else f"no private network namespace ({support.reason})"
    )
    fixture_manifest = manifest(operator_home)
    checkout_before = tree_manifest(checkout)
    runs: dict[str, PytestRun] = {}
    with tempfile.TemporaryDirectory(prefix="canarchy-parity-") as tmp:
        clean_home = Path(tmp) / "clean-home"
        clean_home.mkdir()
        op_home = Path(tmp) / "operator-home"
        shutil.copytree(operator_home, op_home, symlinks=True)
        if diff_manifests(fixture_manifest, manifest(op_home)):
            raise RuntimeError("the operator home copy differs from the fixture before the run")
        tmpdirs = {name: Path(tmp) / f"{name}-tmp" for name in ("clean", "operator")}
        for d in tmpdirs.values():
            d.mkdir()
        hostile = hostile_env(op_home)
        twins = {
            "clean": (
                build_env(
                    home=clean_home, hashseed=seeds[0], source=source_env,
                    extra={**(extra_env or {}), "TMPDIR": str(tmpdirs["clean"])},
                ),
                netns,
            ),
            "operator": (
                build_env(
                    home=op_home, hashseed=seeds[1], source=source_env,
                    extra={**(extra_env or {}), **hostile, "TMPDIR": str(tmpdirs["operator"])},
                ),
                netns,
            ),
        }
        errors: dict[str, BaseException] = {}

        def _run(name: str) -> None:
            env, in_netns = twins[name]
            junit = base_junit.with_name(f"{base_junit.stem}-{name}{base_junit.suffix}")
            try:
                runs[name] = run_pytest(
                    python,
                    with_junit(pytest_args, junit),
                    env=env,
                    log=junit.with_suffix(".log"),
                    netns=in_netns,
                    echo=False,
                    cwd=checkout,
                )
            except BaseException as exc:  # reported below; a thread must not die silently
                errors[name] = exc

        threads = [threading.Thread(target=_run, args=(name,), name=f"parity-{name}") for name in twins]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            # On Ctrl+C or SIGTERM (raised here, in the main thread) stop both twins and wait for
            # their threads before the temporary homes are removed.
            stop_all()
            for t in threads:
                if t.is_alive():
                    t.join()
        if errors:
            name, exc = next(iter(errors.items()))
            raise RuntimeError(f"the {name} twin could not be run: {exc}") from exc
        home_changes = diff_manifests(fixture_manifest, manifest(op_home))
    checkout_changes = diff_manifests(checkout_before, tree_manifest(checkout))
    comparison = junit_compare.compare(
        runs["clean"].junit,
        runs["operator"].junit,
        allowlist=junit_compare.load_allowlist(allowlist),
        expected_a=junit_compare.summary_total(runs["clean"].summary) if runs["clean"].summary is not None else None,
        expected_b=junit_compare.summary_total(runs["operator"].summary) if runs["operator"].summary is not None else None,
        label_a="without config",
        label_b="with config",
    )
    runs = {name: runs[name] for name in twins}  # clean first, whatever finished first
    for name, run in runs.items():
        if run.summary is None:
            comparison.undecided.append(f"{name} twin: pytest printed no summary line (exit code {run.returncode})")
        elif run.returncode not in (0, 1):
            # 2 interrupted (e.g. a collection error), 3 internal error, 4 usage error, 5 no tests:
            # there are no test results to compare, even if both twins agree.
            comparison.undecided.append(f"{name} twin: pytest exit code {run.returncode}, so its run has no test results")
    not_shut_down = {
        name: [line.strip() for line in run.output.splitlines() if _NOT_SHUT_DOWN in line] for name, run in runs.items()
    }
    return ParityResult(
        comparison, runs, not_shut_down, home_changes, checkout_changes, {"clean": seeds[0], "operator": seeds[1]}, netns_note
    )


def parity_markdown(result: ParityResult) -> str:
    """reports/parity.md: the comparison plus the log, home and checkout checks."""
    from canarchy.testing.lanes.results import render_markdown

    out = [render_markdown(result.comparison, title="Parity (TEST-TISO-16)")]  # type: ignore[arg-type]
    out.append("## Runs")
    out.append("")
    out.append("| twin | PYTHONHASHSEED | exit code | pytest summary | seconds | log |")
    out.append("|---|---|---|---|---|---|")
    for name, run in result.runs.items():
        summary = summary_text(run.summary) if run.summary is not None else "(none)"
        out.append(f"| {name} | {result.hashseeds[name]} | {run.returncode} | {summary} | {run.duration:.1f} | `{run.log}` |")
    out.append("")
    out.append(f"Network: {result.netns_note}.")
    out.append("")
    out.append("## Checks")
    out.append("")
    for name, lines in result.not_shut_down.items():
        out.append(f"- `{_NOT_SHUT_DOWN}` in the {name} log: {len(lines)}")
        out.extend(f"  - {line}" for line in lines[:10])
    out.append(f"- operator home unchanged: {'yes' if not result.home_changes else 'NO'}")
    out.extend(f"  - {line}" for line in result.home_changes[:50])
    out.append(f"- checkout unchanged: {'yes' if not result.checkout_changes else 'NO'}")
    out.extend(f"  - {line}" for line in result.checkout_changes[:50])
    out.append("")
    return "\n".join(out)


def cmd_parity(args: argparse.Namespace) -> int:
    """``parity``: the TEST-TISO-16 lane."""
    from canarchy.testing.lanes.results import CannotDecide, render_table

    raise_on_sigterm()
    base_junit = junit_path(args.pytest_args)
    try:
        result = run_parity(
            sys.executable,
            args.pytest_args,
            operator_home=Path(args.operator_home),
            checkout=Path(args.checkout).resolve(),
            allowlist=Path(args.allowlist) if args.allowlist else None,
            source_env=os.environ,
        )
    except (CannotDecide, RuntimeError, OSError) as exc:
        print(f"parity: CANNOT DECIDE - {exc}")
        return EXIT_CANNOT_DECIDE
    print(render_table(result.comparison))  # type: ignore[arg-type]
    for name, run in result.runs.items():
        summary = summary_text(run.summary) if run.summary is not None else "(no summary line)"
        print(f"  {name} twin: {summary} in {run.duration:.1f} s, PYTHONHASHSEED={result.hashseeds[name]}, log {run.log}")
    print(f"  network: {result.netns_note}")
    for name, lines in result.not_shut_down.items():
        for line in lines:
            print(f"  {name} log: {line}")
    for line in result.home_changes:
        print(f"  operator home changed: {line}")
    for line in result.checkout_changes:
        print(f"  checkout changed: {line}")
    md = base_junit.with_suffix(".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(md, parity_markdown(result))
    verdict = {EXIT_PASSED: "PASSED", EXIT_FAILED: "FAILED"}.get(result.exit_code, "CANNOT DECIDE")
    print(f"parity: {verdict} - results {result.comparison.verdict}; summary in {md}")  # type: ignore[attr-defined]
    return result.exit_code


