"""Reading pytest's JUnit XML reports, and comparing two of them test case by test case.

A case is keyed by ``classname::name`` as pytest writes them
(``tests.test_cli.TestMain::test_help[json]``); :func:`case_key` turns a node
id into that key. Outcomes and the table that maps JUnit elements to them:
docs/design/verification-harness.md ("How JUnit reports are read"). Reading is
done with ``junitparser`` (tested with 3.1 to 5.0). Nothing here reads
pytest's terminal output.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Sequence

from canarchy.testing.lanes.project import read_toml

EXIT_IDENTICAL = 0
EXIT_DIFFERENT = 1
EXIT_CANNOT_DECIDE = 2

ABSENT = "absent"

_XPASS_STRICT_PREFIX = "[XPASS(strict)]"
_SETUP_PREFIX = "failed on setup with"
_TEARDOWN_PREFIX = "failed on teardown with"
_COLLECTION_MESSAGE = "collection failure"
_COLLECTION_SKIP = "collection skipped"  # a module that skipped itself as it was collected: no test of it ran


class CannotDecide(Exception):
    """The inputs do not allow a verdict (a missing, empty or unreadable report)."""


@dataclass(frozen=True)
class ResultElement:
    """One ``<failure>``, ``<error>`` or ``<skipped>`` element of a test case.

    ``phase``: ``call``, ``setup``, ``teardown``, ``collection`` or ``unknown``
    (errors, and a module skipped as it was collected, from pytest's message); ``text``: the body (the traceback).
    """

    kind: str
    type: str | None
    message: str
    text: str
    phase: str


@dataclass(frozen=True)
class Case:
    """One test case: every JUnit element that carries its id, merged.

    ``properties``: the ``<property>`` name/value pairs pytest recorded for it
    (canarchy's isolation records the test's writes into the checkout there);
    ``output``: its ``<system-out>`` and ``<system-err>`` text (with ``junit_logging=log``,
    its captured log records).
    """

    id: str
    outcome: str
    results: tuple[ResultElement, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()
    output: str = ""

    @property
    def is_failing(self) -> bool:
        """True when pytest fails the run because of this case."""
        return self.outcome.split("+")[0] in ("failed", "error", "xpassed") or self.outcome.endswith("+error")

    @property
    def failure_text(self) -> str:
        """Message and body of every ``<failure>`` element, joined."""
        return "\n".join(f"{r.message}\n{r.text}" for r in self.results if r.kind == "failure")

    def property_values(self, name: str) -> list[str]:
        return [value for key, value in self.properties if key == name]


@dataclass
class Report:
    """A loaded JUnit report: ``cases`` keyed by :func:`case_key` form, in the order they ran."""

    path: str
    cases: dict[str, Case]
    properties: tuple[tuple[str, str], ...] = ()  # the test suites' own <property> elements

    def properties_named(self, name: str) -> list[str]:
        return [value for key, value in self.properties if key == name]

    def totals(self) -> Counter[str]:
        """How many cases have each outcome."""
        return Counter(case.outcome for case in self.cases.values())

    @property
    def failing(self) -> list[str]:
        return sorted(key for key, case in self.cases.items() if case.is_failing)


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
    """The report key of a pytest node id (a key is returned unchanged), made as pytest's JUnit writer makes
    it (``mangle_test_address``: the path's ``/`` become ``.``, a final ``.py`` is dropped).

    ``tests/test_x.py::TestK::test_m[a::b]`` -> ``tests.test_x.TestK::test_m[a::b]``; an item of another
    file keeps its suffix: ``docs/usage.md::usage.md`` (a doctest of ``--doctest-glob``) ->
    ``docs.usage.md::usage.md``, ``tests/test_mypy.yml::case`` -> ``tests.test_mypy.yml::case``.
    """
    head, bracket, tail = node_id.partition("[")
    parts = head.split("::")
    path = parts[0].replace("\\", "/")
    if len(parts) < 2:
        return node_id
    module = path.removesuffix(".py").strip("/").replace("/", ".")
    classname = ".".join([module, *parts[1:-1]])
    return f"{classname}::{parts[-1]}{bracket}{tail}"


def node_id(key: str, root: Path | None) -> str:
    """The pytest node id of a report key, for people to read and paste (``pytest NODE_ID``):
    ``dateutil.test.test_tz.GettzTest::testX`` -> ``dateutil/test/test_tz.py::GettzTest::testX`` where that
    module is a file under ``root``, the longest such module path; an item of another file (a doctest text
    file, a YAML case) keeps the file's suffix in the key: ``docs.usage.md::usage.md`` ->
    ``docs/usage.md::usage.md``; else the key unchanged (a module pytest could not collect, a key from
    elsewhere)."""
    head, bracket, tail = key.partition("[")
    classname, sep, name = head.rpartition("::")
    if not sep or root is None or "/" in classname:
        return key
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        module = "/".join(parts[:i]) + ".py"
        other = "/".join(parts[:i - 1]) + "." + parts[i - 1]  # a file of another kind: its suffix the last part
        for path in (module, other) if i > 1 else (module,):
            if (root / path).is_file():
                return "::".join([path, *parts[i:], name]) + bracket + tail
    return key


def _phase(kind: str, message: str) -> str:
    if kind != "error":
        return "collection" if kind == "skipped" and message == _COLLECTION_SKIP else "call"
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
    failures = [r for r in call if r.kind == "failure"]
    if failures:
        main = "xpassed" if all(r.message.startswith(_XPASS_STRICT_PREFIX) for r in failures) else "failed"
    elif call:
        main = "xfailed" if call[0].type == "pytest.xfail" else "skipped"
    elif any(r.kind == "error" and r.phase != "teardown" for r in results):
        return "error"
    else:
        main = "passed"
    return f"{main}+error" if teardown else main


def report_or_none(path: str | os.PathLike[str]) -> Report | None:
    """:func:`load_report`, None where there is no report to read."""
    try:
        return load_report(path)
    except CannotDecide:
        return None


def short_id(node_id: str) -> str:
    """A test's name without its file and class (``tests/test_a.py::C::test_b`` -> ``test_b``)."""
    return node_id.rsplit("::", 1)[-1]


def load_report(path: str | os.PathLike[str]) -> Report:
    """Load a pytest JUnit XML report (root ``<testsuites>`` or a bare ``<testsuite>``).

    Elements repeating one id are merged into one case (pytest writes a failed
    call and its teardown error as two; subtests may add more). Raises
    :class:`CannotDecide` when the file is missing, empty or not JUnit XML.
    """
    from junitparser import JUnitXml, JUnitXmlError  # imported here: nox's interpreter has no junitparser

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

    parts: dict[str, tuple[list[ResultElement], list[tuple[str, str]], list[str]]] = {}
    suite_properties: list[tuple[str, str]] = []
    for suite in _iter_suites(xml):
        for element in suite._elem.findall("properties"):
            suite_properties.extend((e.get("name", ""), e.get("value", "")) for e in element.iter("property"))
        for tc in suite:
            classname, name = tc.classname or "", tc.name or ""
            _add_case_parts(tc, parts.setdefault(f"{classname}::{name}" if classname else name, ([], [], [])))
    cases = {key: Case(key, _outcome(found), tuple(found), tuple(props), "\n".join(output))
             for key, (found, props, output) in parts.items()}
    return Report(str(p), cases, tuple(suite_properties))


def merge_reports(reports: Sequence[Report]) -> Report:
    """The reports of one suite run in parts (a shard each, no test in two) as one report: their cases in
    turn, their suite properties together; named after the first. Raises ``ValueError`` for no report."""
    if not reports:
        raise ValueError("no report to merge")
    if len(reports) == 1:
        return reports[0]
    return Report(reports[0].path, {k: c for r in reports for k, c in r.cases.items()},
                  tuple(p for r in reports for p in r.properties))


def _add_case_parts(tc, parts: tuple[list[ResultElement], list[tuple[str, str]], list[str]]) -> None:  # type: ignore[no-untyped-def]
    """Add one ``<testcase>`` element's results, properties and captured output to ``parts``."""
    found, props, output = parts
    for r in tc.result:
        kind = type(r).__name__.lower()
        if kind in ("failure", "error", "skipped"):
            message = r.message or ""
            found.append(ResultElement(kind, r.type, message, r.text or "", _phase(kind, message)))
    props.extend((e.get("name", ""), e.get("value", "")) for e in tc._elem.iter("property"))
    output.extend(e.text or "" for e in tc._elem if e.tag in ("system-out", "system-err"))


def _iter_suites(xml):  # type: ignore[no-untyped-def]
    """Every ``<testsuite>``, nested ones included (junitparser 3.x returns a bare
    root ``<testsuite>`` as a ``TestSuite``; 4.x and later wrap it in ``JUnitXml``)."""
    from junitparser import TestSuite

    stack = [xml] if isinstance(xml, TestSuite) else list(xml)
    while stack:
        suite = stack.pop(0)
        if not isinstance(suite, TestSuite):
            continue
        yield suite
        stack.extend(TestSuite.fromelem(child) for child in suite._elem if child.tag == "testsuite")


def load_allowlist(path: str | os.PathLike[str] | None) -> list[AllowEntry]:
    """Read ``[[allowed]]`` entries (``id``, ``reason``) from a TOML file; None is an empty list.

    Raises :class:`CannotDecide` for an unreadable file, an entry without a
    non-empty ``id``/``reason``, an unknown key, or a repeated id.
    """
    if path is None:
        return []
    p = Path(path)
    document = read_toml(p, CannotDecide, "the allow-list")
    unknown = set(document) - {"allowed"}
    if unknown:
        raise CannotDecide(f"{p}: unknown top-level key(s) {sorted(unknown)}; only [[allowed]] entries")
    raw_entries = document.get("allowed", [])
    if not isinstance(raw_entries, list):
        raise CannotDecide(f"{p}: `allowed` must be an array of tables ([[allowed]])")
    entries: list[AllowEntry] = []
    seen: set[str] = set()
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


def compare(report_a: Report | str | os.PathLike[str], report_b: Report | str | os.PathLike[str], *,
            allowlist: Iterable[AllowEntry] = (), label_a: str = "without config",
            label_b: str = "with config") -> Comparison:
    """Compare two reports (or report paths); never raises for a bad report (see ``undecided``)."""
    undecided: list[str] = []
    loaded: list[Report | None] = []
    for label, report in ((label_a, report_a), (label_b, report_b)):
        if not isinstance(report, Report):
            try:
                report = load_report(report)
            except CannotDecide as exc:
                undecided.append(f"{label}: {exc}")
                report = None
        if report is not None and not report.cases:
            undecided.append(f"{label}: {report.path} holds zero test cases")
        loaded.append(report)
    a, b = loaded
    result = Comparison(label_a, label_b, a, b, undecided=undecided)
    if a is None or b is None:
        return result
    allowed = {entry.id: entry for entry in allowlist}
    used: set[str] = set()
    for key in sorted(set(a.cases) | set(b.cases)):
        outcome_a = a.cases[key].outcome if key in a.cases else ABSENT
        outcome_b = b.cases[key].outcome if key in b.cases else ABSENT
        if outcome_a == outcome_b:
            continue
        if key in allowed:
            used.add(key)
            result.allowed.append(Row(key, outcome_a, outcome_b, allowed[key].reason))
        else:
            result.differences.append(Row(key, outcome_a, outcome_b))
    result.stale_allowed = [entry for key, entry in allowed.items() if key not in used]
    return result


def totals_text(report: Report | None) -> str:
    """``"12 passed, 1 failed"`` (most frequent first), ``"0 cases"`` or ``"unreadable"``."""
    if report is None:
        return "unreadable"
    totals = report.totals()
    if not totals:
        return "0 cases"
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))
