"""Compare two pytest JUnit XML reports test case by test case (the parity verdict).

Used by the ``parity`` and ``order`` lanes (harness.md §3-§4, TEST-TISO-16)
and by the mutation runner to read outcomes. Reading is done with
``junitparser``; tested with 3.1.0, 3.2.0, 4.0.2, 5.0.0 and 5.0.3
(``tests/test_junit_compare.py``), so the range is ``junitparser>=3.1,<6``.

Identity
    A test case is keyed by ``classname::name`` as pytest writes them, e.g.
    ``tests.test_cli.TestMain::test_help[json]`` (parametrized ids are kept
    whole, brackets and all). Position in the file never matters, nor do
    timings, hostnames or timestamps. :func:`case_key` turns a pytest node id
    (``tests/test_cli.py::TestMain::test_help[json]``) into the same key.

Outcome taxonomy (measured on pytest 8.2-9.2 with the default ``xunit2``)
    ====================================  =================================
    JUnit ``<testcase>`` content           outcome
    ====================================  =================================
    nothing                                ``passed`` (a non-strict XPASS too:
                                           pytest writes nothing for it, so
                                           the report cannot tell them apart;
                                           this repository sets
                                           ``xfail_strict = true``)
    ``<failure message="[XPASS(strict)]…">``  ``xpassed`` (a strict XPASS; pytest
                                           counts it as failed)
    ``<failure>``                          ``failed`` (call phase)
    ``<skipped type="pytest.xfail">``      ``xfailed``
    other ``<skipped>``                    ``skipped``
    ``<error message="failed on setup…">`` ``error`` (also ``collection
                                           failure`` and unknown errors)
    ``<error message="failed on teardown…">``  ``+error`` appended to the call
                                           outcome: ``passed+error``,
                                           ``failed+error``, ``skipped+error``
    ====================================  =================================

    A test whose call failed and whose teardown then raised is written by
    pytest as *two* ``<testcase>`` elements with the same id (one with the
    ``<failure>``, one with the teardown ``<error>``); they are merged into one
    case with outcome ``failed+error``. Any other repeated id is an error of
    the report (:class:`CannotDecide`).

Counting
    :attr:`Report.counted` is the number of outcome entries pytest's summary
    line ("3 failed, 6 passed, 1 error in 0.1s") shows for the cases in the
    report: one per ``<failure>``/``<error>``/``<skipped>`` element, plus one
    for a call that passed (no element). :func:`parse_summary` and
    :func:`summary_total` read the same number from pytest's output, so a
    report that lost cases is caught.

Verdict (:class:`Comparison`)
    ``identical`` (exit 0), ``different`` (exit 1) or ``cannot decide``
    (exit 2): either report unreadable, empty, with zero cases, with a
    repeated id, or whose count disagrees with the count pytest printed.
    Differences on ids listed in the allow-list (TOML ``[[allowed]]`` entries
    with ``id`` and ``reason``; ``fixtures/parity-allowlist.toml``) are shown
    but do not count.

CLI::

    python -m canarchy.testing.lanes compare A.xml B.xml
        [--markdown OUT.md] [--allowlist F.toml]
        [--expected-a N] [--expected-b N] [--expected N,M]
        [--label-a TEXT] [--label-b TEXT]

Public surface: :func:`load_report`, :func:`compare`, :func:`load_allowlist`,
:func:`parse_summary`, :func:`summary_total`, :func:`case_key`,
:func:`render_table`, :func:`render_markdown`, :class:`Report`,
:class:`Case`, :class:`Comparison`, :class:`CannotDecide`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from canarchy.fileio import write_text_atomic

EXIT_IDENTICAL = 0
EXIT_DIFFERENT = 1
EXIT_CANNOT_DECIDE = 2

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
ABSENT = "absent"

_XPASS_STRICT_PREFIX = "[XPASS(strict)]"
_SETUP_PREFIX = "failed on setup with"
_TEARDOWN_PREFIX = "failed on teardown with"
_COLLECTION_MESSAGE = "collection failure"

# "3 failed, 6 passed, 2 skipped, 1 xpassed, 3 errors in 0.09s" (pytest's
# last line; with or without the ``====`` rulers, "in 62.0s (0:01:02)").
_SUMMARY_RE = re.compile(r"^[= ]*(?P<body>(?:no tests ran|\d+ [a-z]+(?:, \d+ [a-z]+)*)) in [\d.]+s")
_SUMMARY_ITEM_RE = re.compile(r"(\d+) ([a-z]+)")
_COUNTED_WORDS = {
    "passed": "passed",
    "failed": "failed",
    "error": "error",
    "errors": "error",
    "skipped": "skipped",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
}


class CannotDecide(Exception):
    """The inputs do not allow a verdict (unreadable, empty, inconsistent report)."""


@dataclass(frozen=True)
class ResultElement:
    """One ``<failure>``, ``<error>`` or ``<skipped>`` element of a test case.

    ``kind``: ``failure`` / ``error`` / ``skipped``. ``phase``: ``call``,
    ``setup``, ``teardown``, ``collection`` or ``unknown`` (errors only; read
    from pytest's message). ``text``: the element's body (the traceback).
    """

    kind: str
    type: str | None
    message: str
    text: str
    phase: str


@dataclass(frozen=True)
class Case:
    """One test case (all JUnit elements that carry its id, merged)."""

    id: str
    outcome: str
    results: tuple[ResultElement, ...] = ()

    @property
    def counted(self) -> int:
        """Outcome entries pytest's summary line holds for this case."""
        return len(self.results) + (1 if self.outcome.split("+")[0] == "passed" else 0)

    @property
    def is_failing(self) -> bool:
        """True when pytest would fail the run because of this case."""
        return self.outcome.split("+")[0] in ("failed", "error", "xpassed") or self.outcome.endswith("+error")

    @property
    def failure_text(self) -> str:
        """Message and body of every ``<failure>`` element, joined."""
        return "\n".join(f"{r.message}\n{r.text}" for r in self.results if r.kind == "failure")


@dataclass
class Report:
    """A loaded JUnit report: ``cases`` keyed by :func:`case_key` form."""

    path: str
    cases: dict[str, Case]

    @property
    def counted(self) -> int:
        """Sum of :attr:`Case.counted`: comparable with :func:`summary_total`."""
        return sum(case.counted for case in self.cases.values())

    def totals(self) -> Counter[str]:
        """How many cases have each outcome label."""
        return Counter(case.outcome for case in self.cases.values())


@dataclass(frozen=True)
class AllowEntry:
    """One allow-list entry: a test meant to differ, and why."""

    id: str
    reason: str


@dataclass(frozen=True)
class Row:
    """One compared id: outcome on each side (``absent`` when missing)."""

    id: str
    outcome_a: str
    outcome_b: str
    allowed_reason: str | None = None


@dataclass
class Comparison:
    """The result of :func:`compare`."""

    label_a: str
    label_b: str
    report_a: Report | None
    report_b: Report | None
    differences: list[Row] = field(default_factory=list)
    allowed: list[Row] = field(default_factory=list)
    stale_allowed: list[AllowEntry] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``cannot decide``, ``different`` or ``identical``."""
        if self.undecided:
            return "cannot decide"
        return "different" if self.differences else "identical"

    @property
    def exit_code(self) -> int:
        """0 identical, 1 different, 2 cannot decide."""
        return {"identical": EXIT_IDENTICAL, "different": EXIT_DIFFERENT}.get(self.verdict, EXIT_CANNOT_DECIDE)


def case_key(node_id: str) -> str:
    """Return the report key for a pytest node id (or a key, unchanged).

    ``tests/test_x.py::TestK::test_m[a::b]`` -> ``tests.test_x.TestK::test_m[a::b]``
    (the path becomes the dotted module, classes join the classname, the
    parametrization is kept whole).
    """
    head, bracket, tail = node_id.partition("[")
    parts = head.split("::")
    path = parts[0].replace("\\", "/")
    if len(parts) < 2 or not path.endswith(".py"):
        return node_id
    module = path[: -len(".py")].strip("/").replace("/", ".")
    classname = ".".join([module, *parts[1:-1]])
    return f"{classname}::{parts[-1]}{bracket}{tail}"


def _phase(kind: str, message: str) -> str:
    if kind != "error":
        return "call"
    if message.startswith(_SETUP_PREFIX):
        return "setup"
    if message.startswith(_TEARDOWN_PREFIX):
        return "teardown"
    if message.startswith(_COLLECTION_MESSAGE):
        return "collection"
    return "unknown"


def _outcome(results: Sequence[ResultElement]) -> str:
    call = [r for r in results if r.kind in ("failure", "skipped")]
    teardown = any(r.kind == "error" and r.phase == "teardown" for r in results)
    if call:
        first = call[0]
        if first.kind == "failure":
            main = "xpassed" if first.message.startswith(_XPASS_STRICT_PREFIX) else "failed"
        else:
            main = "xfailed" if first.type == "pytest.xfail" else "skipped"
    elif any(r.kind == "error" and r.phase != "teardown" for r in results):
        return "error"
    else:
        main = "passed"
    return f"{main}+error" if teardown else main


def _is_double_fail(elements: Sequence[Sequence[ResultElement]]) -> bool:
    """pytest's one legitimate repeat: a failed call, then a teardown error."""
    if len(elements) != 2:
        return False
    first, second = elements
    return (
        any(r.kind == "failure" for r in first)
        and bool(second)
        and all(r.kind == "error" and r.phase == "teardown" for r in second)
    )


def load_report(path: str | os.PathLike[str]) -> Report:
    """Load a pytest JUnit XML report (root ``<testsuites>`` or a bare ``<testsuite>``).

    Raises :class:`CannotDecide` when the file is missing, empty, not JUnit
    XML, or repeats a test id (other than pytest's failed-call +
    teardown-error pair). Zero cases is *not* an error here; :func:`compare`
    refuses it.
    """
    from junitparser import JUnitXml, JUnitXmlError  # imported here: the noxfile imports nothing heavy

    p = Path(path)
    try:
        if p.stat().st_size == 0:
            raise CannotDecide(f"{p}: the report is empty (0 bytes)")
        xml = JUnitXml.fromfile(str(p))
    except CannotDecide:
        raise
    except FileNotFoundError:
        raise CannotDecide(f"{p}: no such report") from None
    except (OSError, JUnitXmlError, SyntaxError, ValueError) as exc:  # ParseError is a SyntaxError
        raise CannotDecide(f"{p}: not a readable JUnit XML report ({exc})") from None

    elements: dict[str, list[list[ResultElement]]] = {}
    for suite in _iter_suites(xml):
        for tc in suite:
            classname = tc.classname or ""
            name = tc.name or ""
            key = f"{classname}::{name}" if classname else name
            results = []
            for r in tc.result:
                kind = type(r).__name__.lower()
                if kind not in ("failure", "error", "skipped"):
                    continue
                message = r.message or ""
                results.append(ResultElement(kind, r.type, message, r.text or "", _phase(kind, message)))
            elements.setdefault(key, []).append(results)

    cases: dict[str, Case] = {}
    for key, groups in elements.items():
        if len(groups) > 1 and not _is_double_fail(groups):
            raise CannotDecide(f"{p}: test id {key!r} appears {len(groups)} times in the report")
        merged = tuple(r for group in groups for r in group)
        cases[key] = Case(key, _outcome(merged), merged)
    return Report(str(p), cases)


def _iter_suites(xml):  # type: ignore[no-untyped-def]
    """Every ``<testsuite>``, including suites nested in suites.

    junitparser 3.x returns a bare ``<testsuite>`` root as a ``TestSuite``
    (iterating it yields test cases); 4.x and later wrap it in ``JUnitXml``.
    """
    from junitparser import TestSuite

    stack = [xml] if isinstance(xml, TestSuite) else list(xml)
    while stack:
        suite = stack.pop(0)
        if not isinstance(suite, TestSuite):
            continue
        yield suite
        stack.extend(TestSuite.fromelem(child) for child in suite._elem if child.tag == "testsuite")


def parse_summary(output: str) -> dict[str, int] | None:
    """Read pytest's final summary line from its terminal output.

    Returns e.g. ``{"failed": 3, "passed": 6, "error": 3, "deselected": 2}``
    (``errors`` is folded into ``error``, ``warnings`` into ``warning``), ``{}``
    for "no tests ran", or None when no summary line is found.
    """
    found: dict[str, int] | None = None
    for line in output.splitlines():
        m = _SUMMARY_RE.match(line.strip())
        if not m:
            continue
        counts: dict[str, int] = {}
        for number, word in _SUMMARY_ITEM_RE.findall(m.group("body")):
            word = {"errors": "error", "warnings": "warning"}.get(word, word)
            counts[word] = counts.get(word, 0) + int(number)
        found = counts
    return found


def summary_total(counts: dict[str, int]) -> int:
    """Outcome entries in a summary: passed+failed+error+skipped+xfailed+xpassed
    (deselected and warnings are not test outcomes)."""
    return sum(counts.get(word, 0) for word in set(_COUNTED_WORDS.values()))


def load_allowlist(path: str | os.PathLike[str] | None) -> list[AllowEntry]:
    """Read ``[[allowed]]`` entries (``id``, ``reason``) from a TOML file.

    ``id`` is a node id or a report key. A missing path (None) is an empty
    list. Raises :class:`CannotDecide` for an unreadable file, an entry without
    a non-empty ``id``/``reason``, an unknown key, or a repeated id.
    """
    if path is None:
        return []
    p = Path(path)
    try:
        document = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CannotDecide(f"{p}: the allow-list cannot be read ({exc})") from None
    unknown = set(document) - {"allowed"}
    if unknown:
        raise CannotDecide(f"{p}: unknown top-level key(s) {sorted(unknown)}; only [[allowed]] entries")
    entries: list[AllowEntry] = []
    seen: set[str] = set()
    raw_entries = document.get("allowed", [])
    if not isinstance(raw_entries, list):
        raise CannotDecide(f"{p}: `allowed` must be an array of tables ([[allowed]])")
    for index, raw in enumerate(raw_entries, 1):
        if not isinstance(raw, dict) or set(raw) - {"id", "reason"}:
            raise CannotDecide(f"{p}: entry {index} may hold only `id` and `reason`")
        test_id, reason = raw.get("id"), raw.get("reason")
        if not isinstance(test_id, str) or not test_id.strip():
            raise CannotDecide(f"{p}: entry {index} has no `id`")
        if not isinstance(reason, str) or not reason.strip():
            raise CannotDecide(f"{p}: entry {index} ({test_id}) has no `reason`: say why it is meant to differ")
        key = case_key(test_id.strip())
        if key in seen:
            raise CannotDecide(f"{p}: {test_id} is listed twice")
        seen.add(key)
        entries.append(AllowEntry(key, reason.strip()))
    return entries


def _load_or_reason(path: str | os.PathLike[str], undecided: list[str]) -> Report | None:
    try:
        return load_report(path)
    except CannotDecide as exc:
        undecided.append(str(exc))
        return None


def compare(
    path_a: str | os.PathLike[str],
    path_b: str | os.PathLike[str],
    *,
    allowlist: Iterable[AllowEntry] = (),
    expected_a: int | None = None,
    expected_b: int | None = None,
    label_a: str = "without config",
    label_b: str = "with config",
) -> Comparison:
    """Compare two reports; never raises for a bad report (see ``undecided``).

    ``expected_a``/``expected_b``: the outcome count pytest printed for that
    run (:func:`summary_total`); a report whose :attr:`Report.counted`
    disagrees cannot be trusted.
    """
    undecided: list[str] = []
    report_a = _load_or_reason(path_a, undecided)
    report_b = _load_or_reason(path_b, undecided)
    result = Comparison(label_a, label_b, report_a, report_b, undecided=undecided)
    for label, report, expected in ((label_a, report_a, expected_a), (label_b, report_b, expected_b)):
        if report is None:
            continue
        if not report.cases:
            undecided.append(f"{label}: {report.path} holds zero test cases")
        if expected is not None and report.counted != expected:
            undecided.append(
                f"{label}: {report.path} accounts for {report.counted} outcome(s) but pytest reported {expected}"
            )
    if report_a is None or report_b is None:
        return result

    allowed = {entry.id: entry for entry in allowlist}
    used: set[str] = set()
    for key in sorted(set(report_a.cases) | set(report_b.cases)):
        case_a, case_b = report_a.cases.get(key), report_b.cases.get(key)
        outcome_a = case_a.outcome if case_a else ABSENT
        outcome_b = case_b.outcome if case_b else ABSENT
        if outcome_a == outcome_b:
            continue
        if key in allowed:
            used.add(key)
            result.allowed.append(Row(key, outcome_a, outcome_b, allowed[key].reason))
        else:
            result.differences.append(Row(key, outcome_a, outcome_b))
    result.stale_allowed = [entry for key, entry in allowed.items() if key not in used]
    return result


def _totals_text(report: Report | None) -> str:
    if report is None:
        return "unreadable"
    totals = report.totals()
    if not totals:
        return "0 cases"
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def render_table(comparison: Comparison, *, title: str = "parity") -> str:
    """The terminal view: verdict, totals per side, one row per differing test."""
    c = comparison
    lines = [f"{title}: {c.verdict.upper()}"]
    lines.append(f"  {c.label_a}: {_totals_text(c.report_a)}")
    lines.append(f"  {c.label_b}: {_totals_text(c.report_b)}")
    for reason in c.undecided:
        lines.append(f"  cannot decide: {reason}")
    if c.differences:
        lines.append("")
        lines.append(_table(["test id", c.label_a, c.label_b], [[r.id, r.outcome_a, r.outcome_b] for r in c.differences]))
    if c.allowed:
        lines.append("")
        lines.append("allowed to differ (allow-list):")
        lines.append(
            _table(
                ["test id", c.label_a, c.label_b, "reason"],
                [[r.id, r.outcome_a, r.outcome_b, r.allowed_reason or ""] for r in c.allowed],
            )
        )
    for entry in c.stale_allowed:
        lines.append(f"  allow-list entry did not differ: {entry.id} ({entry.reason})")
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(comparison: Comparison, *, title: str = "Parity") -> str:
    """The Markdown summary a CI page can show (same content as the table)."""
    c = comparison
    out = [f"# {title}: {c.verdict}", ""]
    out.append("| run | report | cases | outcomes |")
    out.append("|---|---|---|---|")
    for label, report in ((c.label_a, c.report_a), (c.label_b, c.report_b)):
        path = report.path if report else "-"
        n = str(len(report.cases)) if report else "-"
        out.append(f"| {_md_cell(label)} | `{path}` | {n} | {_md_cell(_totals_text(report))} |")
    out.append("")
    if c.undecided:
        out.append("## Cannot decide")
        out.append("")
        out.extend(f"- {_md_cell(reason)}" for reason in c.undecided)
        out.append("")
    if c.differences:
        out.append(f"## Differences ({len(c.differences)})")
        out.append("")
        out.append(f"| test id | {_md_cell(c.label_a)} | {_md_cell(c.label_b)} |")
        out.append("|---|---|---|")
        out.extend(f"| `{_md_cell(r.id)}` | {r.outcome_a} | {r.outcome_b} |" for r in c.differences)
        out.append("")
    out.append(f"## Allow-list ({len(c.allowed)} used, {len(c.stale_allowed)} not differing)")
    out.append("")
    if c.allowed or c.stale_allowed:
        out.append(f"| test id | {_md_cell(c.label_a)} | {_md_cell(c.label_b)} | reason |")
        out.append("|---|---|---|---|")
        out.extend(
            f"| `{_md_cell(r.id)}` | {r.outcome_a} | {r.outcome_b} | {_md_cell(r.allowed_reason or '')} |"
            for r in c.allowed
        )
        out.extend(f"| `{_md_cell(e.id)}` | (same) | (same) | {_md_cell(e.reason)} |" for e in c.stale_allowed)
    else:
        out.append("No entries.")
    out.append("")
    return "\n".join(out)


def _parse_expected(text: str | None) -> tuple[int | None, int | None]:
    if not text:
        return None, None
    a, sep, b = text.partition(",")
    if not sep:
        raise argparse.ArgumentTypeError("--expected takes A_COUNT,B_COUNT")
    return int(a), int(b)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 0 identical, 1 different, 2 cannot decide."""
    parser = argparse.ArgumentParser(prog="python -m canarchy.testing.lanes", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("compare", help="compare two JUnit XML reports test by test")
    p.add_argument("report_a", help="JUnit XML of run A (default label: without config)")
    p.add_argument("report_b", help="JUnit XML of run B (default label: with config)")
    p.add_argument("--markdown", type=Path, help="also write the Markdown summary here")
    p.add_argument("--allowlist", type=Path, help="TOML file of [[allowed]] id/reason entries")
    p.add_argument("--expected", help="A_COUNT,B_COUNT: outcome counts pytest printed for each run")
    p.add_argument("--expected-a", type=int, help="outcome count pytest printed for run A")
    p.add_argument("--expected-b", type=int, help="outcome count pytest printed for run B")
    p.add_argument("--label-a", default="without config")
    p.add_argument("--label-b", default="with config")
    args = parser.parse_args(argv)

    try:
        exp_a, exp_b = _parse_expected(args.expected)
        allowlist = load_allowlist(args.allowlist)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        print(f"cannot decide: {exc}", file=sys.stderr)
        return EXIT_CANNOT_DECIDE
    except CannotDecide as exc:
        print(f"cannot decide: {exc}", file=sys.stderr)
        return EXIT_CANNOT_DECIDE
    comparison = compare(
        args.report_a,
        args.report_b,
        allowlist=allowlist,
        expected_a=args.expected_a if args.expected_a is not None else exp_a,
        expected_b=args.expected_b if args.expected_b is not None else exp_b,
        label_a=args.label_a,
        label_b=args.label_b,
    )
    print(render_table(comparison))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.markdown, render_markdown(comparison))
    return comparison.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
