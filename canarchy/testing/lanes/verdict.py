"""A lane's verdict on one pytest run: PASSED, FAILED, NOT PROVEN or CANNOT DECIDE."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from canarchy.testing.lanes.runner import EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, PytestRun

@dataclass
class Verdict:
    """A lane's verdict: ``status`` PASSED / FAILED / CANNOT DECIDE / NOT PROVEN, a one-line
    ``detail``, ``failing`` test ids, Markdown ``markdown``; ``exit_code`` 0/1/2."""

    lane: str
    status: str
    detail: str
    failing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"PASSED": EXIT_PASSED, "NOT PROVEN": EXIT_PASSED, "FAILED": EXIT_FAILED}.get(
            self.status, EXIT_CANNOT_DECIDE
        )

    def line(self) -> str:
        return f"{self.lane}: {self.status} - {self.detail}"

    def markdown(self) -> str:
        out = [f"# {self.lane}: {self.status}", "", self.detail, ""]
        if self.notes:
            out.extend(f"- {n}" for n in self.notes)
            out.append("")
        if self.failing:
            out.append(f"## Failing ({len(self.failing)})")
            out.append("")
            out.extend(f"- `{t}`" for t in self.failing)
            out.append("")
        return "\n".join(out)


def summary_text(summary: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {w}" for w, n in summary.items()) or "no tests ran"


def lane_verdict(lane: str, run: PytestRun, *, notes: Iterable[str] = ()) -> Verdict:
    """Judge one pytest run: cannot decide on a missing/unreadable/empty report, a
    missing summary line, or a report that disagrees with pytest's count; else
    FAILED on a non-zero exit; NOT PROVEN when every case skipped; else PASSED."""
    from canarchy.testing.lanes.results import CannotDecide, load_report, summary_total

    notes = list(notes)
    where = f"(JUnit: {run.junit}, log: {run.log}, {run.duration:.1f} s)"
    try:
        report = load_report(run.junit)
    except CannotDecide as exc:
        return Verdict(lane, "CANNOT DECIDE", f"{exc}; pytest exit code {run.returncode} {where}", notes=notes)
    if run.summary is None:
        return Verdict(lane, "CANNOT DECIDE", f"pytest printed no summary line; exit code {run.returncode} {where}", notes=notes)
    if not report.cases:
        return Verdict(lane, "CANNOT DECIDE", f"zero tests selected ({summary_text(run.summary)}) {where}", notes=notes)
    if report.counted != summary_total(run.summary):
        return Verdict(
            lane,
            "CANNOT DECIDE",
            f"the report accounts for {report.counted} outcome(s), pytest printed "
            f"{summary_total(run.summary)} ({summary_text(run.summary)}) {where}",
            notes=notes,
        )
    failing = sorted(k for k, c in report.cases.items() if c.is_failing)
    if run.returncode != 0 or failing:
        return Verdict(lane, "FAILED", f"{summary_text(run.summary)}; exit code {run.returncode} {where}", failing, notes)
    if all(c.outcome == "skipped" for c in report.cases.values()):
        return Verdict(lane, "NOT PROVEN", f"every test skipped: {summary_text(run.summary)} {where}", notes=notes)
    return Verdict(lane, "PASSED", f"{summary_text(run.summary)} {where}", notes=notes)


