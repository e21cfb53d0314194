"""The parity lane: the suite with and without an operator's home and shell, compared test by test.

Two twins run at once, each on its own copy of the tree with its own hash seed, serially as an operator
runs pytest (``--jobs N``: N pytest-xdist workers each): *clean* (an empty home, a clean shell) and
*operator* (a copy of the project's operator home and :data:`~canarchy.testing.lanes.env.HOSTILE_ENV`).
Each test whose outcome differs is run again in both, to tell a dependency on the operator (the verdict
fails) from a flaky or hash-seed-dependent test (reported; ``--strict`` fails it). Design:
``docs/design/verification-harness.md`` §4.
"""

from __future__ import annotations

import argparse
import contextlib
import locale
import os
import random
import shutil
from pathlib import Path
from collections.abc import Mapping, Sequence

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import HOSTILE_ENV, build_env, hostile_env
from canarchy.testing.isolation.refusal import CHECKOUT_WRITE_PROPERTY, REFUSED_PROPERTY
from canarchy.testing.isolation.checkout import checkout_state
from canarchy.testing.isolation.tree import Entry, changes, content_differences, snapshot
from canarchy.testing.lanes.parity_report import NOT_SHUT_DOWN, render, render_markdown
from canarchy.testing.lanes.parity_result import Finding, ParityResult, Shard, Twin
from canarchy.testing.lanes.project import Project
from canarchy.testing.lanes.results import (ABSENT, Comparison, Report, Row, case_key, compare,
                                           load_allowlist, merge_reports, report_or_none)
from canarchy.testing.lanes.runner import (EXIT_CANNOT_DECIDE, concurrently, cores,
                                          pytest_flags, run_pytest, workers, xdist_options)
from canarchy.testing.lanes.shard import OPTION as SHARD_OPTION
from canarchy.testing.lanes.verdict import ALL_SKIPPED, every_case_skipped, read_run
from canarchy.testing.lanes.workspace import (copy_changes, copy_tree, logs_kept_if_interrupted, publish_reports,
                                              pythonpath, temporary_tree, tree_files)

TWINS = ("clean", "operator")
SHARD_PLUGIN = "canarchy.testing.lanes.shard"
NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
_COLLECT = ("-p", "detect_test_pollution", "--collect-only", "-q")
# python-can's "was not properly shut down" is a log record (BusABC.__del__): during a test it is in the
# test's captured log, which the JUnit report keeps (a pytest-xdist worker's too); at interpreter exit,
# on stderr, in the run's output.
_LOG_RECORDS = ("-o", "junit_logging=log", "-o", "junit_log_passing_tests=true")


def _node_ids(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    except OSError:
        return []


def twin_workers(requested: int | None = None) -> int:
    """pytest-xdist workers of each twin: ``requested``, else none. A worker starts with the controller's
    scrubbed environment, so what Python works out from the operator's at start-up (``site.USER_BASE``,
    under their home) is not there: a twin in workers is less the operator's than one run serially."""
    return 0 if requested is None else workers(requested)


def twin_shards(requested: int | None = None, jobs: int = 0) -> int:
    """Serial pytest processes of each twin: ``requested``, else one per core (one under ``jobs`` pytest-xdist
    workers). Each starts with the twin's whole environment, as an operator's pytest does."""
    if requested is not None:
        return max(requested, 1)
    return 1 if jobs else cores()


def _shard_name(twin: str, index: int, count: int) -> str:
    """A shard's name, for its report, log and copy: ``clean`` for a twin in one process, else ``clean-shard2``."""
    return twin + (f"-shard{index + 1}" if count > 1 else "")


def _stem(twin: Twin, index: int) -> str:
    """The name of a shard's report and log: ``parity-clean``, else ``parity-clean-shard2``."""
    return f"parity-{_shard_name(twin.name, index, len(twin.shards))}"


def _run_shard(twin: Twin, index: int, selection: Sequence[str], out: Path, python: str, isolated: bool,
               jobs: int) -> None:
    shard, count, stem = twin.shards[index], len(twin.shards), _stem(twin, index)
    # detect-test-pollution writes the collected node ids (each pytest-xdist worker, and each shard, the same list)
    args = [*twin.flags, f"--junitxml={out / f'{stem}.xml'}", *_LOG_RECORDS, *(xdist_options(jobs) if jobs else ()),
            "-p", "detect_test_pollution", f"--dtp-testids-output-file={out / f'{stem}-ids.txt'}",
            *(["-p", SHARD_PLUGIN, f"{SHARD_OPTION}={index}/{count}"] if count > 1 else []), *selection]
    shard.run = run_pytest(args, env=shard.env, cwd=shard.copy, python=python)
    if index and shard.run.returncode == NO_TESTS_COLLECTED:
        return  # fewer tests than shards: this one had none
    shard.report, shard.problem = read_run(shard.run, isolated=isolated, complete=True)


def _join_shards(twin: Twin, out: Path) -> None:
    """The twin's report (or problem and collection errors) and node ids file from its shards'."""
    count = len(twin.shards)
    problems = [(i, s.problem) for i, s in enumerate(twin.shards) if s.problem]
    if problems:
        i, problem = problems[0]
        twin.problem = f"shard {i + 1} of {count}: {problem}" if count > 1 else problem
        twin.uncollected = {key: error for s in twin.shards if s.problem and s.run and s.run.junit
                            for key, error in _collection_errors(s.run.junit).items()}
    else:
        twin.report = merge_reports([s.report for s in twin.shards if s.report is not None])
    if count > 1:
        ids = dict.fromkeys(n for i in range(count) for n in _node_ids(out / f"{_stem(twin, i)}-ids.txt"))
        write_text_atomic(out / f"parity-{twin.name}-ids.txt", "".join(f"{n}\n" for n in ids))


def _collection_errors(junit: Path) -> dict[str, str]:
    """What a run could not collect (its report's collection errors: serial pytest stops there with exit
    code 2, pytest-xdist goes on and exits 1), case key -> the error's first line; {} without a report."""
    report = report_or_none(junit)
    found = {}
    for key, case in report.cases.items() if report else ():
        errors = [r for r in case.results if r.kind == "error" and r.phase == "collection"]
        if errors:
            found[key] = next((line for r in errors for line in (r.text or r.message).splitlines()
                               if line.startswith("E ")), errors[0].message).removeprefix("E").strip()
    return found


def _collected_in_one_twin(twins: dict[str, Twin]) -> list[Finding]:
    """One finding per module the operator twin alone, or the clean twin alone, could not collect (the other twin
    ran without a problem): the configuration decides whether the suite can even be collected."""
    broken = [t for t in twins.values() if t.uncollected]
    if len(broken) != 1 or any(t.problem for t in twins.values() if t is not broken[0]):
        return []
    twin = broken[0]
    mine, other = ("could not be collected",), ("collected",)
    return [Finding(key, "operator", *((other, mine) if twin.name == "operator" else (mine, other)),
                    f"the {twin.name} twin alone could not collect it: {error}")
            for key, error in sorted(twin.uncollected.items())]


def _collect(twin: Twin, env: Mapping[str, str], selection: Sequence[str], out: Path, name: str,
             python: str) -> set[str]:
    """Node ids of a collection of ``twin``'s copy with ``env`` (detect-test-pollution writes them)."""
    ids = out / f"parity-{name}-ids.txt"
    args = [*twin.flags, *_COLLECT, f"--dtp-testids-output-file={ids}", f"--junitxml={out / f'parity-{name}.xml'}",
            *selection]
    run_pytest(args, env=env, cwd=twin.copy, python=python)
    return set(_node_ids(ids))


def _rerun(twin: Twin, env: Mapping[str, str], name: str, node_ids: Sequence[str], times: int, out: Path,
           python: str) -> dict[str, list[str]]:
    """Run ``node_ids`` ``times`` more times with ``env`` on ``twin``'s copy; their outcomes by case key."""
    seen: dict[str, list[str]] = {case_key(n): [] for n in node_ids}
    for i in range(1, times + 1):
        junit = out / f"parity-{name}-rerun{i}.xml"
        rerun = run_pytest([*twin.flags, f"--junitxml={junit}", *node_ids], env=env, cwd=twin.copy, python=python)
        report, _ = read_run(rerun)
        for key in seen:
            seen[key].append(report.cases[key].outcome if report and key in report.cases else ABSENT)
    return seen


def _make_twin(name: str, seed: int, project: Project, files: list[str], base: Path, op_home: Path,
               source_env: Mapping[str, str] | None, extra_env: Mapping[str, str] | None, shards: int) -> Twin:
    """One twin: the operator's home and shell, or a clean home; each shard its own copy of the checkout and
    TMPDIR (a shard's sentinel sees no other's writes)."""
    home = op_home if name == "operator" else base / "clean-home"
    home.mkdir(exist_ok=True)
    made = []
    for i in range(shards):
        stem = base / _shard_name(name, i, shards)
        copy, tmp = Path(f"{stem}-tree"), Path(f"{stem}-tmp")
        copy.mkdir()
        tmp.mkdir()
        copy_tree(project.root, copy, files)
        extra = {**(extra_env or {}), "TMPDIR": str(tmp), "PYTHONPATH": pythonpath(copy, project, extra_env)}
        if name == "operator":
            extra.update(hostile_env(op_home))
            extra.update({k: v.replace("{home}", str(op_home)) for k, v in project.operator_env})
        made.append(Shard(copy, build_env(home=home, hashseed=seed, source=source_env, extra=extra)))
    return Twin(name, made, seed, tuple(pytest_flags(project)))


def _check_twin(result: ParityResult, twin: Twin, copies_before: list[dict[str, Entry]], root: Path) -> None:
    """Add what ``twin``'s run wrote into its copy of ``root`` (but what git ignores there), and its not-shut-down
    log lines, to ``result``."""
    cases = twin.report.cases.items() if twin.report else ()
    result.checkout_writes += [f"{result.show(key)}: {path}" for key, case in cases
                               for path in case.property_values(CHECKOUT_WRITE_PROPERTY)]
    result.refusals += [f"{twin.name} twin: {result.show(key)}: {text}" for key, case in cases
                        for text in case.property_values(REFUSED_PROPERTY)]
    for shard, before in zip(twin.shards, copies_before, strict=True):
        result.checkout_writes += [f"{twin.name} twin's copy after its run: {line}"
                                   for line in copy_changes(root, before, snapshot(shard.copy))]
    logged = "\n".join([*(run.output for run in twin.runs), *(case.output for _, case in cases)])
    result.not_shut_down[twin.name] = [line.strip() for line in logged.splitlines() if NOT_SHUT_DOWN in line]


def run_parity(project: Project, selection: Sequence[str], *, source_env: Mapping[str, str] | None = None,
               reruns: int = 2, strict: bool = False, hashseeds: tuple[int, int] | None = None,
               reports: Path | None = None, python: str | None = None,
               extra_env: Mapping[str, str] | None = None, jobs: int | None = None,
               shards: int | None = None) -> ParityResult:
    """Run both twins, re-run what differs, and judge (see the module docstring).

    ``selection``: pytest's test selection (:func:`~canarchy.testing.lanes.env.choose_tests`);
    reports and logs go to ``reports`` (default ``<root>/reports``); ``extra_env``
    is set in both twins; ``jobs``: pytest-xdist workers of each twin (:func:`twin_workers`); ``shards``:
    its pytest processes (:func:`twin_shards`).
    """
    import sys

    python = python or sys.executable
    if project.operator_home is None:
        raise ValueError("the project names no operator home ([tool.canarchy.lanes] operator_home)")
    out = reports or project.root / "reports"
    out.mkdir(parents=True, exist_ok=True)
    seeds = hashseeds or tuple(random.sample(range(1, 2**31), 2))
    checkout_before = checkout_state(project.root)
    files = tree_files(project.root, project)
    with temporary_tree("canarchy-parity-") as tmp, contextlib.ExitStack() as stack:
        base = Path(tmp)
        # The twins write their reports here, not into ``out``: the checkout (``out`` in it) may lie in the
        # operator's home, which a twin's isolation lets it only read (a run on a copy is not the checkout's);
        # they are copied to ``out`` at the end.
        work = base / "reports"
        work.mkdir()
        stack.enter_context(logs_kept_if_interrupted(work, out))
        op_home = base / "operator-home"
        shutil.copytree(project.operator_home, op_home, symlinks=True)
        per_twin = twin_workers(jobs)
        count = twin_shards(shards, per_twin)
        twins = {name: _make_twin(name, seed, project, files, base, op_home, source_env, extra_env, count)
                 for name, seed in zip(TWINS, seeds, strict=True)}
        copies_before = {name: [snapshot(s.copy) for s in t.shards] for name, t in twins.items()}
        jobs_ = [lambda t=t, i=i: _run_shard(t, i, selection, work, python, project.uses_plugin, per_twin)
                 for t in twins.values() for i in range(count)]
        concurrently(jobs_, workers=len(jobs_))
        for twin in twins.values():
            _join_shards(twin, work)
        apart = _collected_in_one_twin(twins)
        comparison = _compare_twins(twins, project, apart)
        result = ParityResult(comparison, twins, strict=strict, root=project.root)
        result.unexercised = [p for p in project.scrub_prefixes
                              if not any(k.startswith(p) for k in twins["operator"].env)]
        result.unavailable_locales = unavailable_locales(twins["operator"].env)
        if apart:
            result.findings = apart
        elif not comparison.undecided:
            result.findings = _classify(twins, comparison, selection, work, reruns, python)
        for name, twin in twins.items():
            _check_twin(result, twin, copies_before[name], project.root)
        _publish(work, out, list(twins.values()))
        result.checkout_writes = sorted(set(result.checkout_writes))
        result.home_changes = content_differences(project.operator_home, op_home)
    result.checkout_changes = changes(checkout_before, checkout_state(project.root))
    return result


def _publish(work: Path, out: Path, twins: list[Twin]) -> None:
    """The twins' reports and logs copied from ``work`` to ``out`` once (:func:`~.workspace.publish_reports`),
    their runs and problems pointing there."""
    problems = publish_reports(work, out, [s.run for t in twins for s in t.shards], [t.problem for t in twins])
    for twin, problem in zip(twins, problems, strict=True):
        twin.problem = problem


def _compare_twins(twins: dict[str, Twin], project: Project, apart: list[Finding]) -> Comparison:
    """The twins' reports compared test by test, with why they cannot decide; nothing compared when one twin
    alone could not collect (``apart``: that is the answer, and that twin ran nothing)."""
    if apart:
        for twin in twins.values():
            twin.problem = None
        return Comparison("without config", "with config", None, None)
    comparison = compare(*(t.report or Report("-", {}) for t in twins.values()),
                         allowlist=load_allowlist(project.parity_allowlist))
    if any(t.problem for t in twins.values()):
        comparison.undecided.extend(f"{t.name} twin: {t.problem}" for t in twins.values() if t.problem)
    elif all(every_case_skipped(t.report) for t in twins.values()):
        comparison.undecided.append(f"both twins: {ALL_SKIPPED}")
    return comparison


def _classify(twins: dict[str, Twin], comparison: Comparison, selection: Sequence[str], out: Path, reruns: int,
              python: str) -> list[Finding]:
    """Each difference as ``operator``, ``flaky`` or ``hash seed`` (see the module docstring)."""
    clean, operator = twins["clean"], twins["operator"]
    reseeded_env = dict(clean.env, PYTHONHASHSEED=str(operator.hashseed))
    absent = [r for r in comparison.differences if ABSENT in (r.outcome_a, r.outcome_b)]
    present = [r for r in comparison.differences if r not in absent]
    findings: list[Finding] = []
    if absent:
        findings += _classify_absent(clean, operator, reseeded_env, absent, selection, out, python)
    if present:
        findings += _classify_present(clean, operator, reseeded_env, present, out, reruns, python)
    return findings


def _classify_absent(clean: Twin, operator: Twin, reseeded_env: dict[str, str], absent: list[Row],
                     selection: Sequence[str], out: Path, python: str) -> list[Finding]:
    """Tests collected in one twin only: is the clean configuration with the operator's seed the same? The
    operator twin's tests are those its report holds: its collected ids are listed before a project's later
    hooks (``trylast``) keep one from running."""
    again = {case_key(n) for n in _collect(clean, reseeded_env, selection, out, "clean-reseeded", python)}
    theirs = set(operator.report.cases) if operator.report else set()
    findings = []
    for row in absent:
        seed = (row.id in again) == (row.id in theirs)
        findings.append(Finding(row.id, "hash seed" if seed else "operator", (row.outcome_a,), (row.outcome_b,),
                                _UNSTABLE if seed else "collected in one configuration only"))
    return findings


def _classify_present(clean: Twin, operator: Twin, reseeded_env: dict[str, str], present: list[Row], out: Path,
                      reruns: int, python: str) -> list[Finding]:
    """Tests with different outcomes: re-run each in both twins and in the clean one under the operator's seed."""
    ids = {case_key(n): n for n in _node_ids(out / "parity-clean-ids.txt")}
    node_ids = [ids[r.id] for r in present if r.id in ids]
    jobs = [lambda t=t: _rerun(t, t.env, t.name, node_ids, reruns, out, python) for t in (clean, operator)]
    jobs.append(lambda: _rerun(clean, reseeded_env, "clean-reseeded", node_ids, 1, out, python))
    seen_clean, seen_operator, reseeded = concurrently(jobs) if node_ids else ({}, {}, {})
    findings = []
    for row in present:
        in_clean = (row.outcome_a, *seen_clean.get(row.id, []))
        in_operator = (row.outcome_b, *seen_operator.get(row.id, []))
        if len(set(in_clean)) > 1 or len(set(in_operator)) > 1:
            findings.append(Finding(row.id, "flaky", in_clean, in_operator,
                                    "varies within a configuration; see also `nox -s order`"))
        elif reseeded.get(row.id, [None])[0] == row.outcome_b:
            findings.append(Finding(row.id, "hash seed", in_clean, in_operator, _UNSTABLE))
        else:
            findings.append(Finding(row.id, "operator", in_clean, in_operator,
                                    "the same outcome every time in each configuration, different between them"))
    return _attributed(clean, operator, findings, ids, out, python)


#: what the operator twin's configuration is made of, beside the clean one's: its parts by their variables
#: (the rest: the project's own ``operator_env``); a copy's own TMPDIR, PYTHONPATH and hash seed are no part
_OWN_TO_EACH_RUN = frozenset({"TMPDIR", "PYTHONPATH", "PYTHONHASHSEED"})
_TIME_AND_LANGUAGE = ("TZ", "LANG", "LANGUAGE", "LC_")
_PARTS = ("the operator home", "the time zone and locale", "canarchy's operator shell", "operator_env")


def operator_parts(clean_env: Mapping[str, str], operator_env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The operator twin's configuration in parts, each named with its variables: its home (``HOME``), its
    time zone and locale, canarchy's operator shell (:data:`~.env.HOSTILE_ENV`'s other variables) and the
    project's ``operator_env``; a part the twins do not differ in is left out."""
    groups: dict[str, dict[str, str]] = {}
    for name, value in sorted(operator_env.items()):
        if clean_env.get(name) == value or name in _OWN_TO_EACH_RUN:
            continue
        if name in ("HOME", "USERPROFILE"):
            label = "the operator home"
        elif name.startswith(_TIME_AND_LANGUAGE):
            label = "the time zone and locale"
        elif name in HOSTILE_ENV:
            label = "canarchy's operator shell"
        else:
            label = "operator_env"
        groups.setdefault(label, {})[name] = value
    return {f"{label} ({_names(groups[label], label)})": groups[label] for label in _PARTS if label in groups}


def unavailable_locales(env: Mapping[str, str]) -> list[str]:
    """``NAME=value`` of the locale variables in ``env`` (``LANG``, ``LC_*``) that name a locale this machine does
    not have (``setlocale`` refuses it), sorted. Asked of this process's ``LC_CTYPE``, put back after."""
    previous = locale.setlocale(locale.LC_CTYPE)
    missing = []
    try:
        for name, value in sorted(env.items()):
            if (name == "LANG" or name.startswith("LC_")) and value:
                try:
                    locale.setlocale(locale.LC_CTYPE, value)
                except locale.Error:
                    missing.append(f"{name}={value}")
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)
    return missing


def _names(part: Mapping[str, str], label: str) -> str:
    """``TZ=NST+3:30, LANG=de_DE.UTF-8``; a shell's many variables by prefix (``CAN_*, CANARCHY_*``)."""
    if label == "canarchy's operator shell":
        return ", ".join(sorted({name.split("_", 1)[0] + "_*" for name in part}))
    if label == "the operator home":
        return "HOME"
    return ", ".join(f"{name}={value}" if label == "the time zone and locale" else name for name, value in part.items())


def _attributed(clean: Twin, operator: Twin, findings: list[Finding], ids: Mapping[str, str], out: Path,
                python: str) -> list[Finding]:
    """``findings``, each that depends on the operator saying which part of the operator's configuration
    alone gives the operator twin's outcome (:func:`operator_parts`): its tests run once more on the clean
    twin's copy with the clean environment and that one part (the home part: a fresh copy of the operator
    home, so the twins' own is not written twice)."""
    dependent = [f for f in findings if f.kind == "operator" and f.id in ids]
    parts = operator_parts(clean.env, operator.env)
    if not dependent or len(parts) < 2:
        return findings
    node_ids = [ids[f.id] for f in dependent]
    home = Path(operator.env["HOME"])
    alone = home.with_name(home.name + "-alone")
    if not alone.exists():
        shutil.copytree(home, alone, symlinks=True)
    envs = [dict(clean.env, **{k: (str(alone) if k in ("HOME", "USERPROFILE") else v) for k, v in part.items()})
            for part in parts.values()]
    jobs = [lambda e=e, i=i: _rerun(clean, e, f"operator-part{i + 1}", node_ids, 1, out, python)
            for i, e in enumerate(envs)]
    seen = concurrently(jobs)
    named = []
    for finding in findings:
        if finding in dependent:
            alone_gives = [label for label, outcomes in zip(parts, seen, strict=True)
                           if outcomes.get(finding.id, [None])[0] == finding.operator[0]]
            cause = (f"the operator's outcome with {' or with '.join(alone_gives)} alone" if alone_gives else
                     f"no one part alone gives the operator's outcome ({'; '.join(parts)}): together they do")
            finding = Finding(finding.id, finding.kind, finding.clean, finding.operator, f"{finding.detail}; {cause}")
        named.append(finding)
    return named


_UNSTABLE = ("the clean configuration gives the operator twin's result under its PYTHONHASHSEED: the test or its "
             "parametrized ids depend on hash order (a set or frozenset iterated?); sort the values or give ids=")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reruns", type=int, default=2, help="extra runs of each differing test per configuration")
    parser.add_argument("--strict", action="store_true", help="also fail on flaky tests and unstable ids")
    parser.add_argument("--jobs", type=int, default=None,
                        help="pytest-xdist workers of each twin (default 0: serial, as an operator runs pytest)")
    parser.add_argument("--shards", type=int, default=None,
                        help="serial pytest processes of each twin, each with every N-th test (default: one per "
                             "core; one with --jobs)")


def main(project: Project, args: argparse.Namespace, selection: Sequence[str]) -> int:
    """``python -m canarchy.testing.lanes parity [--reruns N] [--strict] [-- SELECTION]``."""
    if project.operator_home is None:
        print("parity: CANNOT DECIDE - the project names no operator home ([tool.canarchy.lanes] operator_home)")
        return EXIT_CANNOT_DECIDE
    if not project.operator_home.is_dir():
        print(f"parity: CANNOT DECIDE - the operator home {project.operator_home} ([tool.canarchy.lanes] "
              "operator_home) is not a directory: make it, holding the files an operator of the project has in "
              "their home (docs/adopting.md)")
        return EXIT_CANNOT_DECIDE
    result = run_parity(project, selection, source_env=os.environ, reruns=args.reruns, strict=args.strict,
                        jobs=args.jobs, shards=args.shards)
    print(render(result))
    md = project.root / "reports" / "parity.md"
    write_text_atomic(md, render_markdown(result))
    print(f"parity: summary in {md}")
    return result.exit_code
