"""The harness's self-test: a corpus of seeded isolation defects, each of which must be caught.

Each corpus entry (``manifest.toml``: format and table in ``fixtures/leaks/README.md``)
runs as ``test_<name>.py`` in a fresh project under this checkout's plugin, as a hostile
operator, and its declared detector (:data:`DETECTORS`: guard, isolation, sentinel,
parity, order, deselect) must report it; a control must stay clean everywhere.
``python -m canarchy.testing.lanes selftest``; exit 0 when every defect is caught and
every control clean, 1 otherwise, 2 when the corpus cannot be read.
Design: docs/design/verification-harness.md §8.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

from canarchy.fileio import write_text_atomic
from canarchy.testing.isolation import PACKAGE_PARENT
from canarchy.testing.isolation.plugin import DESELECTED_PROPERTY
from canarchy.testing.isolation.refusal import REAL_BUS_REFUSED
from canarchy.testing.lanes.env import build_env, hostile_env
from canarchy.testing.isolation.tree import content_differences
from canarchy.testing.lanes.parity import run_parity
from canarchy.testing.lanes.project import PLUGIN, Project, read_toml
from canarchy.testing.lanes.render import markdown_table, table
from canarchy.testing.lanes.results import report_or_none, short_id, totals_text
from canarchy.testing.lanes.runner import Run, run_pytest
from canarchy.testing.lanes.verdict import SENTINEL_MARK
from canarchy.testing.lanes.workspace import temporary_tree

EXIT_CAUGHT = 0
EXIT_MISSED = 1
EXIT_CANNOT_DECIDE = 2

DETECTORS = ("guard", "isolation", "sentinel", "parity", "order", "deselect")



class CorpusError(Exception):
    """The corpus or its manifest cannot be used."""


@dataclass(frozen=True)
class Entry:
    """One corpus module: a defect (``detector`` set) or a control (``detector`` is None)."""

    name: str
    file: Path
    detector: str | None
    test: str | None
    expect: str | None
    description: str

    @property
    def is_control(self) -> bool:
        return self.detector is None


@dataclass
class Outcome:
    """What running one entry showed: ``caught`` (defects) or ``clean`` (controls); ``evidence`` says why."""

    entry: Entry
    ok: bool
    evidence: str
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        if self.entry.is_control:
            return "clean" if self.ok else "NOT CLEAN"
        return "caught" if self.ok else "MISSED"


def load_corpus(folder: str | os.PathLike[str]) -> list[Entry]:
    """Read ``folder/manifest.toml``; raises :class:`CorpusError` naming the problem."""
    base = Path(folder)
    path = base / "manifest.toml"
    doc = read_toml(path, CorpusError, "the manifest")
    if set(doc) - {"defect", "control"}:
        raise CorpusError(f"{path}: unknown tables {sorted(set(doc) - {'defect', 'control'})}")
    entries = [_corpus_entry(base, f"{path}: {kind} {index}", kind, raw)
               for kind in ("defect", "control") for index, raw in enumerate(doc.get(kind, []), 1)]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise CorpusError(f"{path}: a name is used twice")
    if not any(e.is_control for e in entries):
        raise CorpusError(f"{path}: no [[control]]: a corpus needs a module every detector passes")
    return entries


def _corpus_entry(base: Path, where: str, kind: str, raw: Any) -> Entry:
    """One ``[[defect]]`` or ``[[control]]`` table of the manifest, checked; ``where`` starts each error."""
    allowed = {"name", "file", "description"} | ({"detector", "test", "expect"} if kind == "defect" else set())
    if not isinstance(raw, dict) or set(raw) - allowed:
        raise CorpusError(f"{where}: only {sorted(allowed)} are allowed")
    for key in ("name", "file", "description") + (("detector", "expect") if kind == "defect" else ()):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise CorpusError(f"{where}: `{key}` must be a non-empty string")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", raw["name"]):
        raise CorpusError(f"{where}: `name` may hold letters, digits, '.', '_' and '-' only")
    file = base / raw["file"]
    if Path(raw["file"]).name != raw["file"] or not file.is_file():
        raise CorpusError(f"{where}: `file` {raw['file']!r} is not a file in {base}")
    if file.name.startswith("test_") or file.name.endswith("_test.py"):
        raise CorpusError(f"{where}: {file.name} would be collected by a plain pytest run; "
                          "do not name it test_*")
    detector = raw.get("detector")
    if kind == "defect" and detector not in DETECTORS:
        raise CorpusError(f"{where}: `detector` must be one of {', '.join(DETECTORS)}")
    if kind == "defect" and detector != "sentinel" and not raw.get("test"):
        raise CorpusError(f"{where}: the {detector} detector needs `test` (the test it must name)")
    return Entry(raw["name"], file, detector, raw.get("test"), raw.get("expect"), raw["description"])


# --------------------------------------------------------------------------- running one entry


def _project(base: Path, entry: Entry, settings: Project | None = None) -> Path:
    """A fresh project holding ``entry``, under the plugin with the isolation settings of ``settings`` (the
    adopting project's ``canarchy_*`` options but ``canarchy_require_import``: the corpus is not its code)."""
    project = base / "project"
    project.mkdir(parents=True)
    (project / "conftest.py").write_text('pytest_plugins = ["canarchy.testing.isolation.plugin"]\n', encoding="utf-8")
    own = "".join(f"{key} = {value}\n" for key, value in (settings.plugin_ini if settings else ())
                  if key != "canarchy_require_import")
    (project / "pytest.ini").write_text(f"[pytest]\nxfail_strict = true\n{own}", encoding="utf-8")
    shutil.copyfile(entry.file, project / f"test_{entry.name.replace('-', '_')}.py")
    return project


def _lane_project(project: Path, operator_home: Path, settings: Project | None = None) -> Project:
    """The lanes' view of the fresh ``project``: the adopting project's operator shell and scrub prefixes."""
    return Project(project, (), project, (".",), (), operator_home=operator_home,
                   operator_env=settings.operator_env if settings else (),
                   scrub_prefixes=settings.scrub_prefixes if settings else ())


def _source_env() -> dict[str, str]:
    """The caller's environment, reduced to the lanes' allow-list."""
    return build_env(home=os.devnull)


# This checkout's plugin is what the corpus tests, whatever is installed.
_EXTRA = {"PYTHONPATH": PACKAGE_PARENT}
_LOG_RECORDS = ("-o", "log_cli=true", "--log-cli-level=WARNING")


def _hostile_run(project: Path, base: Path, operator_home: Path) -> tuple[Run, Path]:
    """Run the project under the plugin as an operator with a full home and a hostile shell."""
    home = base / "operator-home"
    shutil.copytree(operator_home, home, symlinks=True)
    tmp = base / "tmp"
    tmp.mkdir()
    env = build_env(home=home, source=_source_env(), extra={**hostile_env(home), "TMPDIR": str(tmp), **_EXTRA})
    args = ["-p", "no:cacheprovider", "--strict-markers", "--junitxml=reports/selftest.xml", *_LOG_RECORDS, "."]
    return run_pytest(args, env=env, cwd=project, log=base / "selftest.log"), home


def _case(run: Run, test: str):  # type: ignore[no-untyped-def]
    report = report_or_none(run.junit)
    return next((c for k, c in (report.cases.items() if report else ()) if short_id(k) == test), None)


def _case_text(case) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(f"{r.message}\n{r.text}" for r in case.results)


def _check_test_failure(entry: Entry, run: Run, *, guard: bool) -> tuple[bool, str]:
    case = _case(run, entry.test or "")
    if case is None:
        return False, f"{entry.test} not in the report (exit code {run.returncode})"
    if not case.is_failing:
        return False, f"{entry.test} {case.outcome}: nothing caught it"
    text = _case_text(case)
    if guard and entry.expect != "left 1 python-can bus(es) open" and REAL_BUS_REFUSED not in text:
        return False, f"{entry.test} {case.outcome}, but not by the guard"
    if entry.expect and entry.expect not in text:
        return False, f"{entry.test} {case.outcome}, but its report lacks {entry.expect!r}"
    return True, f"{entry.test} {case.outcome}: report holds {entry.expect!r}"


def _check_deselected(entry: Entry, run: Run) -> tuple[bool, str]:
    report = report_or_none(run.junit)
    if report is None:
        return False, f"no report (exit code {run.returncode})"
    if _case(run, entry.test or "") is not None:
        return False, f"{entry.test} ran in a plain run"
    deselected = [n for n in report.properties_named(DESELECTED_PROPERTY) if short_id(n) == entry.test]
    if not deselected:
        return False, f"{entry.test} neither ran nor was deselected by the plugin (exit code {run.returncode})"
    return True, f"{entry.test} kept out of a plain run (the report names it deselected)"


def _check_sentinel(entry: Entry, run: Run) -> tuple[bool, str]:
    output = run.output
    if SENTINEL_MARK not in output:
        return False, f"no sentinel section (exit code {run.returncode})"
    section = output[output.index(SENTINEL_MARK):]
    if entry.expect and entry.expect not in section:
        return False, f"sentinel section lacks {entry.expect!r}"
    if run.returncode == 0:
        return False, "sentinel section printed but the run passed"
    return True, f"run failed (exit code {run.returncode}); sentinel lists {entry.expect}"


def _parity(project: Path, operator_home: Path, settings: Project | None):  # type: ignore[no-untyped-def]
    return run_parity(_lane_project(project, operator_home, settings), ["."], source_env=_source_env(),
                      hashseeds=(1, 2), extra_env=_EXTRA, reports=project.parent / "reports")  # its default jobs


def _order(project: Path, operator_home: Path, settings: Project | None):  # type: ignore[no-untyped-def]
    from canarchy.testing.lanes import order

    return order.run_order_lane(_lane_project(project, operator_home, settings), ["."], seeds=[1],
                                source_env=_source_env(), echo=lambda line: None, extra_env=_EXTRA,
                                reports=project.parent / "reports")


def run_entry(entry: Entry, *, operator_home: Path, settings: Project | None = None) -> Outcome:
    """Run one corpus entry against the harness and judge it (see the module docstring), with the isolation
    settings of ``settings``, the adopting project, when given."""
    started = time.monotonic()
    with temporary_tree(f"canarchy-selftest-{entry.name}-") as tmp:
        base = Path(tmp)
        project = _project(base, entry, settings)
        if entry.detector == "parity":
            result = _parity(project, operator_home, settings)
            rows = {short_id(r.id): f"{r.outcome_a} -> {r.outcome_b}" for r in result.comparison.differences}
            seen = rows.get(entry.test or "")
            ok = seen is not None and (not entry.expect or seen == entry.expect)
            evidence = (f"{entry.test}: {seen} (without -> with config)" if seen
                        else f"twins {result.comparison.verdict}")
        elif entry.detector == "order":
            result = _order(project, operator_home, settings)
            found = [b for b in result.bisections if short_id(b.victim) == entry.test]
            culprit = found[0].culprit if found else None
            ok = culprit is not None and short_id(culprit) == entry.expect
            evidence = (f"{entry.test}: {found[0].finding()} ({found[0].run_label} run)" if found
                        else f"order lane {result.status}: no victim named")
        else:
            run, home = _hostile_run(project, base, operator_home)
            if entry.is_control:
                ok, evidence = _check_control(entry, run, project, operator_home, home, settings)
            elif entry.detector == "sentinel":
                ok, evidence = _check_sentinel(entry, run)
            elif entry.detector == "deselect":
                ok, evidence = _check_deselected(entry, run)
            else:
                ok, evidence = _check_test_failure(entry, run, guard=entry.detector == "guard")
    return Outcome(entry, ok, evidence, time.monotonic() - started)


def _first_line(case) -> str:  # type: ignore[no-untyped-def]
    """The first line of what a failing case's report says (its assertion's ``E`` line where there is one)."""
    text = _case_text(case)
    lines = [line for line in text.splitlines() if line.strip()]
    said = next((line[1:].strip() for line in lines if line.startswith("E ")), lines[0].strip() if lines else "")
    return said[:160]


def _check_control(entry: Entry, run: Run, project: Path, operator_home: Path, home: Path,
                   settings: Project | None) -> tuple[bool, str]:
    problems = []
    if run.returncode != 0 or SENTINEL_MARK in run.output:
        report = report_or_none(run.junit)
        failing = [f"{key.rsplit('::', 1)[-1]} {case.outcome}: {_first_line(case)}"
                   for key, case in (report.cases.items() if report else ()) if case.is_failing]
        problems.append(f"hostile run exit code {run.returncode}" + (f" ({'; '.join(failing[:3])})" if failing else ""))
    changed = content_differences(operator_home, home)
    if changed:
        problems.append("operator home changed: " + "; ".join(changed[:3]))
    parity = _parity(project, operator_home, settings)
    if parity.exit_code != 0:
        differing = [f"{f.id.rsplit('::', 1)[-1]} {' '.join(f.clean)} -> {' '.join(f.operator)}"
                     for f in parity.findings]
        problems.append(f"parity {parity.comparison.verdict} (exit code {parity.exit_code})"
                        + (f": {'; '.join(differing[:3])}" if differing else ""))
    ordered = _order(project, operator_home, settings)
    if ordered.exit_code != 0:
        problems.append(f"order lane {ordered.status}")
    if problems:
        return False, "; ".join(problems)
    return True, f"{totals_text(report_or_none(run.junit))} under the plugin; parity identical; every order identical"


# --------------------------------------------------------------------------- the corpus


def run_corpus(
    entries: Sequence[Entry],
    *,
    operator_home: Path,
    echo: Callable[[str], None] = print,
    settings: Project | None = None,
) -> list[Outcome]:
    """Run every entry, one after the other (each already starts a few pytest processes)."""
    outcomes = []
    for entry in entries:
        outcome = run_entry(entry, operator_home=operator_home, settings=settings)
        echo(f"selftest: {entry.name}: {outcome.verdict} ({outcome.seconds:.0f} s) - {outcome.evidence}")
        outcomes.append(outcome)
    return outcomes


def passed(outcomes: Sequence[Outcome]) -> bool:
    """True when every defect was caught and every control stayed clean."""
    return bool(outcomes) and all(o.ok for o in outcomes)


def render(outcomes: Sequence[Outcome], seconds: float | None = None) -> str:
    """The terminal view: ``caught k/n``, controls, one row per entry."""
    defects = [o for o in outcomes if not o.entry.is_control]
    controls = [o for o in outcomes if o.entry.is_control]
    caught = sum(o.ok for o in defects)
    head = f"selftest: {'PASSED' if passed(outcomes) else 'FAILED'} - caught {caught}/{len(defects)}"
    head += f", controls clean {sum(o.ok for o in controls)}/{len(controls)}"
    if seconds is not None:
        head += f" ({seconds:.0f} s)"
    rows = [[o.entry.name, o.entry.detector or "(control)", o.verdict, o.evidence] for o in outcomes]
    return "\n".join([head, "", table(["entry", "detector", "verdict", "evidence"], rows)])


def render_markdown(outcomes: Sequence[Outcome], seconds: float | None = None) -> str:
    """``reports/selftest.md``."""
    defects = [o for o in outcomes if not o.entry.is_control]
    verdict = "PASSED" if passed(outcomes) else "FAILED"
    out = [f"# Selftest: {verdict} - caught {sum(o.ok for o in defects)}/{len(defects)}", ""]
    if seconds is not None:
        out += [f"Wall time: {seconds:.0f} s.", ""]
    out.append(markdown_table(["entry", "what it does", "detector", "verdict", "evidence"],
                              [[f"`{o.entry.name}`", o.entry.description, o.entry.detector or "(control)", o.verdict,
                                o.evidence] for o in outcomes]))
    return "\n".join(out) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", default=[], help="run only this entry (repeatable)")


def main(project: Project, args: argparse.Namespace, selection: Sequence[str]) -> int:
    """``python -m canarchy.testing.lanes selftest [--only NAME ...]``: the project's ``leaks`` corpus."""
    try:
        missing = [key for key, path in (("leaks", project.leaks), ("operator_home", project.operator_home))
                   if path is None]
        if missing:
            raise CorpusError(f"the project names no {' and no '.join(f'`{key}`' for key in missing)} "
                              "([tool.canarchy.lanes])")
        entries = load_corpus(project.leaks)
        if args.only:
            unknown = set(args.only) - {e.name for e in entries}
            if unknown:
                raise CorpusError(f"no such entry: {', '.join(sorted(unknown))}")
            entries = [e for e in entries if e.name in args.only]
    except CorpusError as exc:
        print(f"selftest: CANNOT DECIDE - {exc}")
        return EXIT_CANNOT_DECIDE
    if not project.uses_plugin:  # the corpus would prove a plugin that the project's own runs do not load
        print(f"selftest: FAILED - the project's pytest configuration does not load {PLUGIN} (addopts in "
              "[tool.pytest.ini_options], docs/adopting.md): nothing the corpus proves protects its suite")
        return EXIT_MISSED
    started = time.monotonic()
    outcomes = run_corpus(entries, operator_home=project.operator_home, settings=project)
    seconds = time.monotonic() - started
    print()
    print(render(outcomes, seconds))
    reports = project.root / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    write_text_atomic(reports / "selftest.md", render_markdown(outcomes, seconds))
    return EXIT_CAUGHT if passed(outcomes) else EXIT_MISSED
