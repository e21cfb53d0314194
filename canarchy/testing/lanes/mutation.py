"""The mutation lanes: reintroduce a fixed defect on a copy of the tree; its killer tests must fail.

A mutation is a TOML file (format: ``fixtures/mutations/README.md``). :func:`run_mutations` runs every
listed test once unmutated and each mutant's tests, ``jobs`` runs at a time on copies of the tree; a run counts
only if every Python process it started imported the project's packages from the copy (the import proof), and
a survivor only if the run started no process the proof cannot follow (:mod:`canarchy.testing.lanes.starts`).
Anything that prevents an answer is CANNOT DECIDE, never "killed". Design: ``docs/design/verification-harness.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import build_env
from canarchy.testing.lanes.mutation_file import Mutation, load_mutation
from canarchy.testing.lanes.mutation_report import render, render_markdown, render_summary, render_summary_markdown
from canarchy.testing.isolation import CHILD_HOOK_DIR
from canarchy.testing.isolation.tempbase import inside
from canarchy.testing.isolation.tree import SKIP_LIST, snapshot
from canarchy.testing.lanes.netns import netns_support
from canarchy.testing.lanes.project import Project, ProjectError
from canarchy.testing.lanes.results import CannotDecide, Case, case_key, load_report
from canarchy.testing.lanes.starts import load_starts, unseen
from canarchy.testing.lanes.runner import (EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, RunTimeout, concurrently, run,
                                           cores, pytest_flags, run_pytest, stopping)
from canarchy.testing.lanes.workspace import (CopyError, clear_reports, copy_changes, copy_tree, temporary_tree,
                                              tree_files)
from canarchy.testing.lanes.verdict import stopped_text

HOOK_DIR = Path(CHILD_HOOK_DIR)


@dataclass
class TestRow:
    """One listed test: ``killer``/``control``, its outcome unmutated and on the mutant, the verdict."""

    __test__ = False  # not a pytest test class

    node_id: str
    role: str
    baseline: str = "-"
    mutant: str = "-"
    verdict: str = "-"


@dataclass
class MutationResult:
    """``status``: ``killed``, ``survived`` or ``cannot decide``; ``imported``: the mutated modules' files;
    ``importers``: each Python process of the mutant's run that imported the copy (``pid: command line``);
    ``unseen``: each process of that run the import proof could not follow (``command line: why``); ``log``: the
    mutant run's pytest output (``reports/mutation-<name>-mutant.log``)."""

    mutation: Mutation
    status: str = "cannot decide"
    reason: str = ""
    rows: list[TestRow] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    importers: list[str] = field(default_factory=list)
    unseen: list[str] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    log: str = ""

    @property
    def killed(self) -> list[TestRow]:
        return [r for r in self.rows if r.role == "killer" and r.verdict == "killed"]

    @property
    def exit_code(self) -> int:
        return {"killed": EXIT_PASSED, "survived": EXIT_FAILED}.get(self.status, EXIT_CANNOT_DECIDE)


# -- definitions -------------------------------------------------------------------------

def load_definitions(paths: Sequence[str | Path]) -> tuple[list[Mutation], list[MutationResult]]:
    """Mutations from files and directories (``*.toml``); broken ones as cannot-decide results."""
    files: list[Path] = []
    for given in map(Path, paths):
        files.extend(sorted(given.glob("*.toml")) if given.is_dir() else [given])
    loaded, broken, names = [], [], {}
    for path in files:
        try:
            m = load_mutation(path)
        except CannotDecide as exc:
            broken.append(MutationResult(Mutation(path.stem, "-", "", (), (), (), source=str(path)), reason=str(exc)))
            continue
        if m.name in names:
            broken.append(MutationResult(m, reason=f"`name` {m.name!r} is also used by {names[m.name]}"))
            continue
        names[m.name] = path.name
        loaded.append(m)
    return loaded, broken


# -- running -----------------------------------------------------------------------------

class _Workspace:
    """A run's temporary directory: ``tree`` (the copy, made once and restored after each
    mutant), ``home``, ``tmp``, ``out`` (reports) and a fresh ``proof`` directory per pytest run."""

    def __init__(self, project: Project, root: Path, python: str, timeout: float) -> None:
        self.project, self.root, self.python, self.timeout = project, root, python, timeout
        self.tree, self.home, self.tmp, self.out = root / "tree", root / "home", root / "tmp", root / "out"
        for d in (self.home, self.tmp, self.out):
            d.mkdir(parents=True)
        self.files = tree_files(project.root, project)
        self.pristine: dict = {}
        self.runs = 0
        self.output = ""  # the last pytest run's output

    def make_copy(self) -> None:
        if self.tree.exists():
            shutil.rmtree(self.tree)
        self.tree.mkdir()
        copy_tree(self.project.root, self.tree, self.files)
        self.pristine = snapshot(self.tree, walk=SKIP_LIST)

    def changes(self) -> list[str]:
        return copy_changes(self.project.root, self.pristine, snapshot(self.tree, walk=SKIP_LIST))

    def restore(self, texts: dict[str, tuple[str, str]]) -> None:
        """Write each mutated file's original text back; a file the lane itself rewrote is no change."""
        for file, (original, _mutated) in texts.items():
            (self.tree / file).write_text(original, encoding="utf-8")
        self.pristine.update(snapshot(self.tree, only=list(texts)))

    @property
    def import_root(self) -> Path:
        return self.tree / self.project.source.relative_to(self.project.root)

    def env(self, proof: Path, packages: Sequence[str]) -> dict[str, str]:
        return build_env(home=self.home, hashseed=0, extra={
            "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(self.import_root)]), "TMPDIR": str(self.tmp),
            "PYTEST_CANARCHY_IMPORT_PROOF": str(proof), "PYTEST_CANARCHY_IMPORT_PACKAGES": ",".join(packages)})

    def pytest(self, label: str, node_ids: Sequence[str],
               packages: Sequence[str]) -> tuple[dict[str, Case], list[dict], list[str]]:
        """Run ``node_ids`` on the copy: their cases, the import-proof records of every process that reported,
        and the processes it started that could not report (:func:`starts.unseen`)."""
        self.runs += 1
        self.output = ""
        proof = self.root / f"proof-{self.runs}"
        proof.mkdir()
        junit = self.out / f"{label}.xml"
        try:
            done = run_pytest([*pytest_flags(self.project), "-c", str(self.tree / self.project.pytest_config),
                               f"--junitxml={junit}", *node_ids], env=self.env(proof, packages), cwd=self.tree,
                              python=self.python, timeout=self.timeout)
        except RunTimeout as exc:
            raise CannotDecide(f"{label}: {exc}") from None
        self.output = done.output
        try:
            report = load_report(junit)
        except CannotDecide as exc:
            tail = "\n".join(done.output.splitlines()[-15:])
            raise CannotDecide(f"{label}: no usable JUnit report ({exc}); pytest exit code {done.returncode}\n"
                               f"{tail}") from None
        missing = [n for n in node_ids if case_key(n) not in report.cases]
        cases = {n: [k for k in report.cases if k.startswith(case_key(n) + "[")] for n in missing if "[" not in n}
        if any(cases.values()):
            raise CannotDecide(f"{label}: a parametrized test is named without its case: name each case it means ("
                               + "; ".join(f"{n}: {', '.join(k.rpartition('::')[2] for k in found)}"
                                           for n, found in cases.items() if found) + ")")
        if missing:
            why = "no such test?" if done.returncode in (0, 1) else (  # pytest's words name the copy's paths
                "the run stopped first: " + stopped_text(done).replace(os.path.join(str(self.tree), ""), ""))
            raise CannotDecide(f"{label}: not run ({why}): {', '.join(missing)}")
        records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(proof.glob("*.json"))]
        blind = unseen(load_starts(proof), proof=proof, packages=packages, hook_dir=HOOK_DIR)
        return {n: report.cases[case_key(n)] for n in node_ids}, records, blind

    def prove_imports(self, label: str, records: list[dict], packages: Sequence[str]) -> list[str]:
        """Each process that reported (``pid: command line``); CannotDecide unless some process
        reported and every one imported ``packages`` from the copy."""
        if not records:
            raise CannotDecide(f"{label}: the import proof heard from no process (is {HOOK_DIR} on PYTHONPATH?)")
        tree = str(self.tree.resolve())
        for r in records:
            origin = str(Path(r["origin"]).resolve()) if r.get("origin") not in (None, "?") else "?"
            if not inside(origin, tree):
                raise CannotDecide(
                    f"{label}: process {r['pid']} ({' '.join(map(str, r['argv']))[:120]}, cwd {r['cwd']}) imported "
                    f"{r['package']} from {r['origin']}, not from the copy {tree}: an installed or stale copy would "
                    "be tested instead")
        return list({r["pid"]: f"{r['pid']}: {' '.join(map(str, r['argv']))[:160]}" for r in records}.values())

    def probe(self, mutation: Mutation, texts: dict[str, tuple[str, str]]) -> list[str]:
        """Import each mutated module in a fresh interpreter from the copy: its file must hold the mutant."""
        modules = [self.project.module_of(f) for f in mutation.files]
        code = "import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)"
        log = self.out / f"{mutation.name}-probe.log"
        done = run([self.python, "-c", code, *modules], env=self.env(self.root / "proof-probe", ()), cwd=self.tree,
                   log=log, timeout=120)
        printed = done.output.strip().splitlines()[-len(modules):] if modules else []
        if done.returncode != 0 or len(printed) != len(modules):
            raise CannotDecide(f"import proof: `import {', '.join(modules)}` failed in the copy: {done.output[-500:]}")
        for file, where in zip(mutation.files, printed, strict=True):
            if Path(where).resolve() != (self.tree / file).resolve():
                raise CannotDecide(f"import proof: {file} was imported from {where}, not from the copy")
            if Path(where).read_text(encoding="utf-8") != texts[file][1]:
                raise CannotDecide(f"import proof: {where} does not hold the mutated text")
        return printed


def _mutated_texts(mutation: Mutation, tree: Path) -> dict[str, tuple[str, str]]:
    """``{file: (original, mutated)}``; CannotDecide unless each ``search`` occurs exactly once."""
    texts: dict[str, tuple[str, str]] = {}
    for index, edit in enumerate(mutation.edits, 1):
        if edit.file not in texts:
            try:
                original = (tree / edit.file).read_text(encoding="utf-8")
            except OSError as exc:
                raise CannotDecide(f"{edit.file}: cannot read it in the copy ({exc})") from None
            texts[edit.file] = (original, original)
        original, current = texts[edit.file]
        count = current.count(edit.search)
        if count != 1:
            which = "`search`" if len(mutation.edits) == 1 else f"edit {index}'s `search`"
            raise CannotDecide(f"{edit.file}: {which} occurs {count} times (exactly 1 required); "
                               f"update {mutation.source or 'the mutation file'} to the current code")
        texts[edit.file] = (original, current.replace(edit.search, edit.replace, 1))
    return texts


def _wrong_reason(case: Case, excluded: Sequence[str]) -> str | None:
    """The excluded exception (``ImportError`` ...) the case failed with: the type that starts a failure's message
    (pytest's: ``Type: text`` of what ended the test), not a name anywhere in the report (its source, shown in
    the traceback, or an assertion's values may name one)."""
    raised = [(r.message or "").split(":", 1)[0].strip().rpartition(".")[2] for r in case.results
              if r.kind == "failure"]
    return next((name for name in excluded if name in raised), None)


def _judge(result: MutationResult, mutant: dict[str, Case]) -> None:
    m = result.mutation
    broken = []
    for row in result.rows:
        case = mutant[row.node_id]
        row.mutant = case.outcome
        if row.role == "control":
            row.verdict = "passes (ok)" if case.outcome == "passed" else "BROKEN"
            if case.outcome != "passed":
                broken.append(row.node_id)
        elif case.outcome.split("+")[0] == "failed":
            wrong = _wrong_reason(case, m.excluded_exceptions)
            row.verdict = f"not killed: failed with {wrong}" if wrong else "killed"
        elif case.outcome.startswith("error"):
            row.verdict = "not killed: error outside the test phase"
        else:
            row.verdict = "SURVIVED"
    if broken:
        result.status = "cannot decide"
        result.reason = "controls failed on the mutant, so it is broken beyond the defect: " + ", ".join(broken)
    elif len(result.killed) == len(m.killers):
        result.status, result.reason = "killed", "every killer failed on the mutant and every control passed"
    else:
        result.status, result.reason = "survived", "the mutant was not caught by every killer"


def _packages(project: Project, mutations: Sequence[Mutation]) -> list[str]:
    """The packages the import proof watches: the project's, and the top package of each mutated module."""
    found = list(project.packages)
    for m in mutations:
        for file in m.files:
            try:
                found.append(project.module_of(file).split(".")[0])
            except ProjectError:
                continue
    return sorted(set(found))


MAX_DEFAULT_JOBS = 4  # each job is a whole pytest run on a copy of the tree


def default_jobs() -> int:
    """Copies worked on at once by default: one per core, at most :data:`MAX_DEFAULT_JOBS`."""
    return min(cores(), MAX_DEFAULT_JOBS)


def run_mutations(project: Project, mutations: Sequence[Mutation], *, python: str = sys.executable,
                  timeout: float = 900.0, echo: Callable[[str], None] = print,
                  jobs: int | None = None) -> list[MutationResult]:
    """Run ``mutations`` on copies of ``project``, ``jobs`` pytest runs at a time (default
    :func:`default_jobs`): for each, a baseline run of its tests on the unmutated code and a run on the
    mutant, each on a copy of its own. A mutant's verdict stands only if its tests passed in its baseline."""
    results = [MutationResult(m, rows=[TestRow(n, "killer") for n in m.killers]
                              + [TestRow(n, "control") for n in m.controls]) for m in mutations]
    netns = netns_support()
    with temporary_tree("canarchy-mutation-") as tmp:
        started = time.monotonic()
        try:
            first = _Workspace(project, Path(tmp) / "copy-1", python, timeout)
            first.make_copy()
            packages = _packages(project, mutations)
        except (CopyError, OSError) as exc:
            for result in results:
                result.reason = f"cannot copy the project: {exc}"
            return results
        pending = []
        for result in results:
            result.durations["copy"] = time.monotonic() - started
            try:
                if result.mutation.needs_netns and not netns.available:
                    raise CannotDecide("needs the private network namespace (its mutant removes a bus guard, so its "
                                       f"tests could reach a real bus) and there is none: {netns.reason}")
                for file in result.mutation.files:
                    project.module_of(file)
                pending.append((result, _mutated_texts(result.mutation, first.tree)))
            except (CannotDecide, ProjectError) as exc:
                result.reason = str(exc)
        if pending:
            _run_concurrently(first, pending, packages, min(jobs or default_jobs(), 1 + len(pending)), echo)
    return results


def _run_concurrently(first: _Workspace, pending: list, packages: Sequence[str], jobs: int,
                      echo: Callable[[str], None]) -> None:
    """The baseline and every mutant of ``pending``, ``jobs`` at a time, each holding one copy while it runs."""
    free: queue.SimpleQueue[_Workspace] = queue.SimpleQueue()
    free.put(first)
    for i in range(2, jobs + 1):
        extra = _Workspace(first.project, first.root.parent / f"copy-{i}", first.python, first.timeout)
        extra.make_copy()
        free.put(extra)
    where = first.root.parent if jobs > 1 else first.tree
    echo(f"mutations: working on {jobs} cop{'ies' if jobs > 1 else 'y'} in {where}, {jobs} run(s) at a time "
         f"(the project is only read); import proof watches {', '.join(packages) or 'nothing'}")

    def holding_a_copy(job: Callable[[_Workspace], object]) -> object:
        work = free.get()
        try:
            return job(work)
        finally:
            free.put(work)

    # Each mutant's own tests, as its run selects them, on the unmutated copy: a killer that passes only after
    # another mutation's test (a state-setter) would otherwise fail in the mutant's run for want of it.
    baselines = [functools.partial(_baseline, node_ids=list(result.mutation.node_ids), packages=packages,
                                   label=f"{result.mutation.name}-baseline") for result, _ in pending]
    mutants = [functools.partial(_one, result=result, texts=texts, packages=packages, echo=echo)
               for result, texts in pending]
    outcome = concurrently([functools.partial(holding_a_copy, job) for job in (*baselines, *mutants)], workers=jobs)
    for (result, _texts), baseline in zip(pending, outcome[:len(pending)], strict=True):
        _apply_baseline(baseline, result)
        echo(f"mutation {result.mutation.name}: {result.status.upper()}")


def _baseline(work: _Workspace, node_ids: list[str], packages: Sequence[str],
              label: str = "baseline") -> tuple[dict | str, float]:
    """The listed tests (one mutant's selection) once on the unmutated copy: ``({node id: Case}, seconds)``, or
    ``(why it cannot decide, seconds)``."""
    started = time.monotonic()
    try:
        cases, records, _unseen = work.pytest(label, node_ids, packages)  # unmutated: any import is the same code
        work.prove_imports(label, records, packages)
    except CannotDecide as exc:
        return str(exc), time.monotonic() - started
    finally:
        if not stopping() and work.changes():
            work.make_copy()
    return cases, time.monotonic() - started


def _apply_baseline(baseline: tuple[dict | str, float], result: MutationResult) -> None:
    """A mutation whose tests did not all pass unmutated cannot decide, whatever its mutant did."""
    cases, seconds = baseline
    result.durations["baseline"] = seconds
    if isinstance(cases, str):
        result.status, result.reason = "cannot decide", cases
        return
    for row in result.rows:
        row.baseline = cases[row.node_id].outcome
    not_passing = [f"{r.node_id} ({r.baseline})" for r in result.rows if r.baseline != "passed"]
    if not_passing:
        result.status = "cannot decide"
        result.reason = "baseline: these must pass on the unmutated code first: " + ", ".join(not_passing)


def _one(work: _Workspace, *, result: MutationResult, texts: dict[str, tuple[str, str]], packages: Sequence[str],
         echo: Callable[[str], None]) -> None:
    m = result.mutation
    started = time.monotonic()
    try:
        for file, (_original, mutated) in texts.items():
            (work.tree / file).write_text(mutated, encoding="utf-8")
        result.imported = work.probe(m, texts)
        try:
            cases, records, result.unseen = work.pytest(f"{m.name}-mutant", m.node_ids, packages)
        finally:
            result.log = work.output
        result.importers = work.prove_imports(f"{m.name} on the mutant", records, packages)
        _judge(result, cases)
        if result.status == "survived" and result.unseen:  # a killer's unseen child may have tested other code
            result.status = "cannot decide"
            result.reason = ("the mutant survived, but the import proof could not see these processes of its run, "
                             "which may have imported the project from elsewhere than the copy: "
                             + "; ".join(result.unseen))
    except (CannotDecide, ProjectError) as exc:
        result.status, result.reason = "cannot decide", str(exc)
    finally:
        work.restore(texts)
        changed = [] if stopping() else work.changes()
        if changed:
            echo(f"mutation {m.name}: its tests changed the copy ({'; '.join(changed[:3])}"
                 f"{f'; {len(changed) - 3} more' if len(changed) > 3 else ''}); making a fresh one")
            work.make_copy()
    result.durations["mutant"] = time.monotonic() - started
    if result.status == "cannot decide":  # nothing waits: the verdict below says why
        echo(f"mutation {m.name}: mutant run done; it cannot decide")
        return
    echo(f"mutation {m.name}: mutant run done ({len(result.killed)}/{len(m.killers)} killers failed; "
         f"{len(result.importers)} process(es) imported the copy); the verdict waits for its baseline")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("definitions", nargs="*",
                        help="mutation files or directories (default: the project's mutations)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per pytest run")
    parser.add_argument("--jobs", type=int, default=None,
                        help="pytest runs at once, each on its own copy (default: one per core, at most 4)")


def main(project: Project, args: argparse.Namespace, selection: Sequence[str]) -> int:
    """``python -m canarchy.testing.lanes mutation [DEFINITION ...]``; exit code: the worst result."""
    paths = args.definitions or ([project.mutations] if project.mutations else [])
    if not paths:
        print("mutation: CANNOT DECIDE - no definitions given and the project names no `mutations` directory")
        return EXIT_CANNOT_DECIDE
    started = time.monotonic()
    loaded, broken = load_definitions(paths)
    clear_reports(project.root / "reports", ("mutations.md", *(f"mutation-{m.name}{end}" for m in loaded
                                                               for end in (".md", "-mutant.log"))))
    results = run_mutations(project, loaded, timeout=args.timeout, jobs=args.jobs) + broken
    if not results:
        print(f"mutation: CANNOT DECIDE - no mutation definition in {', '.join(map(str, paths))}")
        return EXIT_CANNOT_DECIDE
    seconds = time.monotonic() - started
    reports = project.root / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    for result in results:
        print(render(result) + "\n")
        write_text_atomic(reports / f"mutation-{result.mutation.name}.md", render_markdown(result))
        if result.log:
            write_text_atomic(reports / f"mutation-{result.mutation.name}-mutant.log", result.log)
    if len(results) > 1:
        print(render_summary(results, seconds))
        write_text_atomic(reports / "mutations.md", render_summary_markdown(results, seconds))
    return max(r.exit_code for r in results)
