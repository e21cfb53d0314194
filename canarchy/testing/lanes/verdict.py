"""A lane's verdict on one pytest run, from its JUnit report and exit code alone.

pytest's exit codes (``pytest.ExitCode``): 0 all passed, 1 some failed,
2 interrupted, 3 internal error, 4 usage error, 5 no tests collected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Iterable

from canarchy.testing.isolation.plugin import ISOLATION_PROPERTY, ITEMS_PROPERTY, NOT_LOADED_HEADER, NOT_LOADED_PROPERTY
from canarchy.testing.lanes.render import markdown_table
from canarchy.testing.lanes.results import CannotDecide, Report, load_report, totals_text
from canarchy.testing.lanes.runner import EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, Run

_EXIT_MEANING = {2: "interrupted (or a collection error)", 3: "an internal error", 4: "a usage error",
                 5: "no tests collected"}


@dataclass
class Verdict:
    """``status``: PASSED, NOT PROVEN (every case skipped), FAILED or CANNOT DECIDE."""

    lane: str
    status: str
    detail: str
    failing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    report: Report | None = None
    sentinel: list[str] = field(default_factory=list)  # the isolation sentinel's lines in the run's log

    @property
    def exit_code(self) -> int:
        return {"PASSED": EXIT_PASSED, "NOT PROVEN": EXIT_PASSED, "FAILED": EXIT_FAILED}.get(
            self.status, EXIT_CANNOT_DECIDE)

    def line(self) -> str:
        return f"{self.lane}: {self.status} - {self.detail}"

    def markdown(self, show=str) -> str:  # type: ignore[no-untyped-def]
        """``reports/<lane>.md`` (``show``: a failing test's key as displayed, its node id)."""
        out = [f"# {self.lane}: {self.status}", "", self.detail, ""]
        out.extend(f"- {note}" for note in self.notes)
        if self.sentinel:
            out += ["", "## The isolation sentinel", "", "```", *self.sentinel, "```"]
        if self.failing:
            out += ["", f"## Failing ({len(self.failing)})", "",
                    markdown_table(["test"], [[f"`{show(t)}`"] for t in self.failing])]
        return "\n".join(out) + "\n"


_SAID = ("ERROR:", "pytest: error:", "INTERNALERROR>", "!!!!")


def pytest_said(run: Run) -> str:
    """pytest's own line on why a run ended early, from its log: the first ``ERROR:`` (an unknown ini option,
    a missing file), ``pytest: error:`` or, after ``ERROR: usage:``, argparse's ``...: error:`` line (a bad
    argument, with a hint when it is unrecognized), ``INTERNALERROR>`` or ``!!! ... !!!`` (an
    interruption: a test's ``pytest.exit()`` or ``KeyboardInterrupt``) line; "" when there is none."""
    usage = ""
    try:
        with open(run.log, encoding="utf-8", errors="replace") as log:
            for line in log:
                if usage and ": error: " in line:  # the line after argparse's usage says what was wrong
                    return _hinted(line.strip()[:300])
                if line.startswith("ERROR: usage:"):
                    usage = line.strip()
                elif line.startswith("INTERNALERROR>"):
                    return _hinted(_internal_error(line, log)[:300])
                elif line.startswith(_SAID):
                    return line.strip().strip("!").strip()[:300]
    except OSError:
        pass
    return usage[:300]


#: an exception's line in an INTERNALERROR traceback (pytest-xdist prefixes a worker's with "E")
_RAISED = re.compile(r"INTERNALERROR>(?:\s+E)?\s+((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Failed|Exit)?: .*)")


def _internal_error(first: str, rest: Iterable[str]) -> str:
    """What an INTERNALERROR says: the first exception line of its traceback (a worker's own under
    pytest-xdist, not xdist's ``AssertionError: Traceback ...`` around it), else the traceback's first line."""
    for line in (first, *rest):
        if not line.startswith("INTERNALERROR>"):
            continue
        raised = _RAISED.match(line.rstrip())
        if raised and not raised.group(1).endswith("Traceback (most recent call last):"):
            return f"INTERNALERROR> {raised.group(1).strip()}"
    return first.strip()


def _hinted(said: str) -> str:
    """pytest's error line, with a hint where an option, or a marker, of a plugin the lanes do not load is
    unknown."""
    if "unrecognized arguments" in said:
        return (f"{said}; is it an option of a pytest plugin? the lanes load none that is merely installed: name "
                "it in addopts with -p (docs/adopting.md, 'Your pytest plugins')")
    if "not found in `markers` configuration option" in said:
        return (f"{said}; a marker of a pytest plugin? the lanes load none that is merely installed, and run with "
                "--strict-markers: name it in addopts with -p (docs/adopting.md, 'Your pytest plugins')")
    return said


def stopped_text(run: Run) -> str:
    """``pytest exit code N: what it means`` and, where its log says, pytest's own words."""
    said = pytest_said(run)
    return (f"pytest exit code {run.returncode}: {_EXIT_MEANING.get(run.returncode, 'an unknown exit code')}"
            + (f" (pytest: {said})" if said else ""))


def read_run(run: Run, *, isolated: bool = False, complete: bool = False) -> tuple[Report | None, str | None]:
    """The run's report, or None and why it has no usable one. ``isolated``: the project's
    configuration loads the plugin, so a report without its suite property is no answer.
    ``complete``: nor is a run with a collection error, for a lane that compares runs (pytest
    stops such a run with exit code 2, but under pytest-xdist it exits 1)."""
    if run.returncode not in (0, 1):
        return None, stopped_text(run)
    assert run.junit is not None
    try:
        report = load_report(run.junit)
    except CannotDecide as exc:
        return None, f"{exc}; pytest exit code {run.returncode}"
    why_not = _unusable(report, run.returncode, complete)
    if why_not is None and isolated and not report.properties_named(ISOLATION_PROPERTY):
        return None, ("the run was not under canarchy's isolation, which the project's pyproject.toml loads "
                      f"(no {ISOLATION_PROPERTY} property in the report): does a pytest.toml, pytest.ini, tox.ini or "
                      "setup.cfg shadow its [tool.pytest.ini_options]?")
    return (None, f"{why_not}; pytest exit code {run.returncode}") if why_not else (report, None)


def _unusable(report: Report, returncode: int, complete: bool) -> str | None:
    """Why a report read from a run that exited 0 or 1 answers nothing, or None: no cases, a collection error
    (``complete``), a failing case under exit 0, fewer cases than the run was to run and none failing."""
    if not report.cases:
        return "the report holds zero test cases"
    uncollected = [key for key, case in report.cases.items()
                   if any(r.kind == "error" and r.phase == "collection" for r in case.results)] if complete else []
    if uncollected:
        return f"errors during collection: {', '.join(uncollected[:3])}"
    if returncode == 0 and report.failing:
        return f"pytest exited 0 but the report has failing cases: {', '.join(report.failing[:3])}"
    ran = sum(1 for case in report.cases.values() if not any(r.phase == "collection" for r in case.results))
    to_run = max((int(n) for n in report.properties_named(ITEMS_PROPERTY) if n.isdigit()), default=0)
    if ran < to_run and not report.failing:  # pytest.exit() in a test, or a signal: the rest never ran
        return (f"the report holds {ran} of the {to_run} tests the run was to run: it stopped before the "
                "others (a test's pytest.exit()?)")
    return None


def failed_beyond_its_tests(run: Run | None, report: Report | None) -> bool:
    """pytest exited 1 although no test in its report failed: the run itself failed (the isolation's
    sentinel, a process a test left running, a refusal outside any test)."""
    return run is not None and report is not None and run.returncode == 1 and not report.failing


BEYOND_ITS_TESTS = "yet pytest failed the run (see the log: e.g. the isolation sentinel)"
SENTINEL_MARK = "canarchy isolation sentinel"  # in the heading of each of the sentinel's sections
SENTINEL_LINES = 20


def sentinel_lines(run: Run) -> list[str]:
    """The isolation sentinel's sections in the run's log (each heading and what follows it, up to the
    next pytest section), at most :data:`SENTINEL_LINES` lines; [] when it printed none. Read line by line."""
    found: list[str] = []
    inside = False
    try:
        with open(run.log, encoding="utf-8", errors="replace") as log:
            for line in log:
                line = line.rstrip("\n")
                if SENTINEL_MARK in line:
                    inside = True
                elif inside and line.startswith("====="):
                    inside = False
                if inside and line.strip():
                    found.append(line.strip("= ") if SENTINEL_MARK in line else line)
                    if len(found) >= SENTINEL_LINES:
                        found.append("... (more in the log)")
                        break
    except OSError:
        return []
    return found


NOX_DIR = ".nox/"
ANOTHER_NOX = (f"the checkout changed under {NOX_DIR} during the run: another nox session in this checkout makes or "
               "rebuilds its virtualenv there (and installs the project, which may rewrite generated files): run one "
               "nox at a time per checkout")


def _not_loaded_in_header(run: Run) -> list[str]:
    """The plugins the run's header names as installed but not loaded (:data:`~.plugin.NOT_LOADED_HEADER`)."""
    try:
        with open(run.log, encoding="utf-8", errors="replace") as log:
            for number, line in enumerate(log):
                if NOT_LOADED_HEADER in line:
                    return [name.strip() for name in line.split(NOT_LOADED_HEADER, 1)[1].split(", ") if name.strip()]
                if number > 200:  # the header is at the top
                    break
    except OSError:
        pass
    return []


def every_case_skipped(report: Report | None) -> bool:
    """Whether ``report`` holds cases and every one of them skipped: a run that proves nothing."""
    return report is not None and bool(report.cases) and all(
        case.outcome == "skipped" for case in report.cases.values())


ALL_SKIPPED = "every test case skipped: the run proves nothing"
NOT_ISOLATED = ("not isolated: the run did not load canarchy.testing.isolation.plugin (no canarchy_isolation "
                "property in its report), so nothing kept its tests from the operator's home, variables and bus")


NOT_LOADED = "not loaded: "


def plugins_not_loaded(reports: Iterable[Report | None], also: Iterable[str] = ()) -> str | None:
    """The note naming the installed pytest plugins the runs behind ``reports`` did not load (the plugin's
    ``NOT_LOADED_PROPERTY``; ``also``: those a run without a report named in its header), else None."""
    names = sorted({*also, *(name for report in reports if report is not None
                             for name in report.properties_named(NOT_LOADED_PROPERTY))})
    return (f"{NOT_LOADED}{', '.join(names)}: installed where the lane runs, but every lane turns plugin "
            "autoloading off, so the tests and options they bring are not in this verdict; name each your suite "
            "needs with -p in addopts (docs/adopting.md, \"Your pytest plugins\")") if names else None


def isolated_run(report: Report | None) -> bool:
    """Whether ``report`` comes from a run under canarchy's plugin (True where there is no report to tell)."""
    return report is None or bool(report.properties_named(ISOLATION_PROPERTY))


def judge(lane: str, run: Run, *, notes: Iterable[str] = (), isolated: bool = False,
          skipped_proves: bool = False) -> Verdict:
    """CANNOT DECIDE without a usable report; FAILED on exit code 1; when every case skipped, NOT PROVEN
    where skipping is the lane's answer (``skipped_proves``: the integration lane without a bus), else
    CANNOT DECIDE."""
    notes = list(notes)
    where = f"(JUnit: {run.junit}, log: {run.log}, {run.duration:.1f} s)"
    report, why_not = read_run(run, isolated=isolated)
    if report is None:  # pytest stopped before its report: the plugin's header may still name the plugins
        notes += [note for note in [plugins_not_loaded([], _not_loaded_in_header(run))] if note]
        return Verdict(lane, "CANNOT DECIDE", f"{why_not} {where}", notes=notes)
    summary = totals_text(report)
    notes += [note for note in [plugins_not_loaded([report])] if note]
    if not isolated_run(report):
        notes = [*notes, NOT_ISOLATED]
        summary = f"{summary} (not isolated)"
    if run.returncode == 1:
        sentinel = sentinel_lines(run)
        if any(f" {NOX_DIR}" in line or f"/{NOX_DIR}" in line for line in sentinel):
            notes = [*notes, ANOTHER_NOX]
        detail = f"{summary}, {BEYOND_ITS_TESTS}" if failed_beyond_its_tests(run, report) else (
            f"{summary}, and the isolation sentinel failed the run" if sentinel else summary)
        return Verdict(lane, "FAILED", f"{detail}; exit code 1 {where}", report.failing, notes, report, sentinel)
    if every_case_skipped(report):
        if not skipped_proves:
            return Verdict(lane, "CANNOT DECIDE", f"{ALL_SKIPPED}: {summary} {where}", notes=notes, report=report)
        return Verdict(lane, "NOT PROVEN", f"every test skipped: {summary} {where}", notes=notes, report=report)
    return Verdict(lane, "PASSED", f"{summary} {where}", notes=notes, report=report)
