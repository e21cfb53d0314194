"""canarchy.testing.lanes.results and .verdict: outcomes from JUnit reports and exit codes, never from
pytest's summary line.

The "real" reports are written by the pytest that runs this suite, from generated
test modules covering every outcome (subtests included); a report written by pytest 8
with pytest-rerunfailures and pytest-subtests is kept in fixtures/junit; crafted ones
cover what pytest would not write (a broken file, a bare <testsuite>).
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import os
import subprocess
from pathlib import Path

import pytest

from canarchy.testing.lanes import render, runner, verdict
from canarchy.testing.lanes.env import SAFETY_FLAGS
from canarchy.testing.lanes import results as jc
from canarchy.testing.lanes.runner import Run
from tests.helpers import PYTEST

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "junit"

SAMPLE = '''
import pytest

def test_pass(): pass
def test_fail(): assert 0
@pytest.fixture
def bad_setup(): raise RuntimeError("setup boom")
def test_setup_error(bad_setup): pass
@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown boom")
def test_pass_teardown_error(bad_teardown): pass
def test_fail_teardown_error(bad_teardown): assert 0
def test_skip(): pytest.skip("nope")
@pytest.mark.skip(reason="marked")
def test_skip_mark(): pass
@pytest.mark.xfail(reason="known", strict=True)
def test_xfail(): assert 0
def test_imperative_xfail(): pytest.xfail("imperative")
@pytest.mark.xfail(reason="known", strict=False)
def test_xpass_nonstrict(): pass
@pytest.mark.xfail(reason="known", strict=True)
def test_xpass_strict(): pass
@pytest.mark.parametrize("x", ["a b", "c::d", "[e]"])
def test_param(x): pass
class TestK:
    def test_m(self): pass
'''

EXPECTED = {
    "test_broken": "error",
    "test_sub.TestUnit::test_sub_fails": "failed",
    "test_sub.TestUnit::test_sub_passes": "passed",
    "test_sub::test_warns": "passed",
    "test_sample::test_pass": "passed",
    "test_sample::test_fail": "failed",
    "test_sample::test_setup_error": "error",
    "test_sample::test_pass_teardown_error": "passed+error",
    "test_sample::test_fail_teardown_error": "failed+error",
    "test_sample::test_skip": "skipped",
    "test_sample::test_skip_mark": "skipped",
    "test_sample::test_xfail": "xfailed",
    "test_sample::test_imperative_xfail": "xfailed",
    "test_sample::test_xpass_nonstrict": "passed",
    "test_sample::test_xpass_strict": "xpassed",
    "test_sample::test_param[a b]": "passed",
    "test_sample::test_param[c::d]": "passed",
    "test_sample::test_param[[e]]": "passed",
    "test_sample.TestK::test_m": "passed",
}


SUBTESTS = """
import unittest, warnings

class TestUnit(unittest.TestCase):
    def test_sub_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)

    def test_sub_passes(self):
        for i in range(2):
            with self.subTest(i=i):
                pass

def test_warns():
    warnings.warn("careful")
"""


def _run_pytest(directory: Path, *args: str) -> tuple[Path, str, int]:
    (directory / "pytest.ini").write_text("[pytest]\n")
    junit = directory / "report.xml"
    # a pytest of its own, not a worker of ours: without our xdist worker's identity
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.run(
        [*PYTEST, "-c", str(directory / "pytest.ini"),
         "--rootdir", str(directory), f"--junitxml={junit}", *args],
        cwd=directory, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return junit, proc.stdout + proc.stderr, proc.returncode


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """One pytest run writing every outcome: SAMPLE, SUBTESTS and a module that fails to collect
    (``--continue-on-collection-errors``, so the rest still runs); its JUnit report, output, exit code."""
    directory = tmp_path_factory.mktemp("real")
    (directory / "test_sample.py").write_text(SAMPLE)
    (directory / "test_sub.py").write_text(SUBTESTS)
    (directory / "test_broken.py").write_text("import no_such_module_for_this_test\n")
    return _run_pytest(directory, "-q", "--continue-on-collection-errors", ".")


def _run(junit: Path, returncode: int) -> Run:
    return Run(["pytest"], returncode, junit.with_suffix(".log"), 0.1, junit)


def _xml(cases: str, *, root: str = "testsuites") -> str:
    suite = f'<testsuite name="pytest" tests="1">{cases}</testsuite>'
    return f'<?xml version="1.0" encoding="utf-8"?><testsuites>{suite}</testsuites>' if root == "testsuites" else suite


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- reading


def test_real_report_outcome_taxonomy(real):
    junit, *_ = real
    report = jc.load_report(junit)
    assert {k: c.outcome for k, c in report.cases.items()} == EXPECTED


def test_fail_plus_teardown_error_is_two_elements_merged_into_one_case(real):
    junit, *_ = real
    text = junit.read_text()
    assert text.count('name="test_fail_teardown_error"') == 2  # what pytest really writes
    case = jc.load_report(junit).cases["test_sample::test_fail_teardown_error"]
    assert [r.kind for r in case.results] == ["failure", "error"] and case.is_failing


def test_xfail_is_not_confused_with_skip(real):
    junit, *_ = real
    assert 'type="pytest.xfail"' in junit.read_text()
    report = jc.load_report(junit)
    assert report.cases["test_sample::test_xfail"].outcome == "xfailed"
    assert report.cases["test_sample::test_skip"].outcome == "skipped"


def test_strict_xpass_is_a_failure_with_the_xpass_message(real):
    junit, *_ = real
    case = jc.load_report(junit).cases["test_sample::test_xpass_strict"]
    assert case.results[0].message.startswith("[XPASS(strict)]")
    assert case.outcome == "xpassed" and case.is_failing


def test_bare_testsuite_root_reads_like_testsuites(tmp_path):
    cases = '<testcase classname="m" name="t1"/><testcase classname="m" name="t2"><failure message="x"/></testcase>'
    a = jc.load_report(_write(tmp_path, "a.xml", _xml(cases)))
    b = jc.load_report(_write(tmp_path, "b.xml", _xml(cases, root="testsuite")))
    assert {k: c.outcome for k, c in a.cases.items()} == {k: c.outcome for k, c in b.cases.items()} == {
        "m::t1": "passed",
        "m::t2": "failed",
    }


def test_collection_error_is_an_error_case(real):
    junit, *_ = real
    case = jc.load_report(junit).cases["test_broken"]
    assert case.outcome == "error" and case.results[0].phase == "collection"


def test_every_word_of_pytest_s_summary_is_read_from_the_report_instead(real):
    """pytest 9's summary line names each outcome (pytest 8's with ``rerun``: fixtures/junit, read in
    test_a_pytest_8_report_with_reruns_and_subtests; "no tests ran": test_no_tests_ran_cannot_decide).
    The lane never reads that line, and gets the same from the report and the exit code."""
    junit, output, code = real
    summary = output.strip().splitlines()[-1]
    for word in ("failed", "passed", "skipped", "xfailed", "xpassed", "warning", "error", "subtests passed"):
        assert word in summary, summary
    judged = verdict.judge("unit", _run(junit, code))
    assert judged.status == "FAILED" and code == 1
    assert judged.failing == sorted(k for k, outcome in EXPECTED.items() if outcome.split("+")[0] in (
        "failed", "error", "xpassed") or outcome.endswith("+error"))


@pytest.mark.parametrize(
    "content, reason",
    [
        ("", "empty"),
        ("<testsuites><testsuite>", "not a readable JUnit"),
        ("<html><body/></html>", "not a readable JUnit"),
    ],
)
def test_unreadable_reports_cannot_decide(tmp_path, content, reason):
    with pytest.raises(jc.CannotDecide, match=reason):
        jc.load_report(_write(tmp_path, "r.xml", content))


def test_missing_report_cannot_decide(tmp_path):
    with pytest.raises(jc.CannotDecide, match="no such report"):
        jc.load_report(tmp_path / "absent.xml")


def test_repeated_ids_are_merged_into_one_case(tmp_path):
    """pytest-rerunfailures writes one element per attempt; the last attempt and every failure count."""
    teardown = '<error message="failed on teardown with &quot;E&quot;"/>'
    cases = (f'<testcase classname="m" name="t"/><testcase classname="m" name="t">{teardown}</testcase>'
             '<testcase classname="m" name="r"/><testcase classname="m" name="r"/>')
    report = jc.load_report(_write(tmp_path, "r.xml", _xml(cases)))
    assert {k: c.outcome for k, c in report.cases.items()} == {"m::t": "passed+error", "m::r": "passed"}


def test_unittest_subtests_are_read_from_the_report(real):
    """pytest 9 writes a failing subTest into its test's element (and nothing for passing ones)."""
    junit, *_ = real
    text = junit.read_text()
    assert text.count('name="test_sub_fails"') == 1 and "<failure" in text.split('name="test_sub_fails"')[1][:400]
    report = jc.load_report(junit)
    assert report.cases["test_sub.TestUnit::test_sub_fails"].is_failing
    assert not report.cases["test_sub.TestUnit::test_sub_passes"].results


def test_a_pytest_8_report_with_reruns_and_subtests():
    report = jc.load_report(FIXTURES / "pytest8-rerun-subtests.xml")
    assert {k.rsplit("::", 1)[-1]: c.outcome for k, c in report.cases.items()} == {
        "test_rerun_then_pass": "passed", "test_warns": "passed", "test_subtests_fixture": "failed",
        "test_subtests_pass": "passed", "test_xpass_nonstrict": "passed"}
    judged = verdict.judge("unit", _run(FIXTURES / "pytest8-rerun-subtests.xml", 1))
    assert judged.status == "FAILED" and judged.failing == ["test_p8::test_subtests_fixture"]


@pytest.mark.parametrize("returncode, status", [(2, "CANNOT DECIDE"), (3, "CANNOT DECIDE"), (4, "CANNOT DECIDE"),
                                                (5, "CANNOT DECIDE"), (0, "PASSED"), (1, "FAILED")])
def test_the_verdict_comes_from_the_exit_code_and_the_report(tmp_path, returncode, status):
    junit = _write(tmp_path, "r.xml", _xml('<testcase classname="m" name="t"/>'))
    judged = verdict.judge("unit", _run(junit, returncode))
    assert judged.status == status, judged.detail
    if returncode == 1:  # failed, with no failing case: e.g. the isolation sentinel
        assert "yet pytest failed the run" in judged.detail


def test_no_tests_ran_cannot_decide(tmp_path):
    (tmp_path / "test_none.py").write_text("")
    junit, output, code = _run_pytest(tmp_path, "test_none.py")
    assert code == 5, output
    judged = verdict.judge("unit", _run(junit, code))
    assert judged.status == "CANNOT DECIDE" and "no tests collected" in judged.detail


def test_every_skipped_proves_nothing_and_a_clean_exit_with_failures_cannot_decide(tmp_path):
    skipped = _write(tmp_path, "s.xml", _xml('<testcase classname="m" name="t"><skipped message="no bus"/></testcase>'))
    assert verdict.judge("integration", _run(skipped, 0), skipped_proves=True).status == "NOT PROVEN"  # no bus
    judged = verdict.judge("unit", _run(skipped, 0))  # a suite whose every test skipped proves nothing
    assert judged.status == "CANNOT DECIDE" and "proves nothing" in judged.detail and judged.exit_code == 2
    failing = _write(tmp_path, "f.xml", _xml('<testcase classname="m" name="t"><failure message="x"/></testcase>'))
    assert verdict.judge("unit", _run(failing, 0)).status == "CANNOT DECIDE"
    assert verdict.judge("unit", _run(tmp_path / "missing.xml", 0)).status == "CANNOT DECIDE"


@pytest.mark.parametrize("pyproject, test, said", [
    ("[tool.pytest.ini_options]\ncanarchy_nothing = 1\n", "def test_a():\n    pass\n",
     "Unknown config option: canarchy_nothing"),
    ("", "import pytest\n\ndef test_a():\n    pytest.exit('bye', returncode=3)\n", "_pytest.outcomes.Exit: bye"),
    ("", "def test_a():\n    raise KeyboardInterrupt\n", "KeyboardInterrupt"),
], ids=["usage-error", "pytest-exit", "keyboard-interrupt"])
def test_a_run_that_stopped_early_says_why_in_pytest_s_words(tmp_path, pyproject, test, said):
    (tmp_path / "pyproject.toml").write_text(pyproject)
    (tmp_path / "test_x.py").write_text(test)
    junit = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    done = runner.run_pytest([*SAFETY_FLAGS, f"--junitxml={junit}", "test_x.py"], env=env, cwd=tmp_path)
    report, why = verdict.read_run(done)
    assert report is None and f"pytest exit code {done.returncode}" in why and said in why, why


def test_a_run_without_the_plugin_is_said_to_be_not_isolated(tmp_path):
    case = '<testcase classname="m" name="t"/>'
    bare = _write(tmp_path, "bare.xml", _xml(case))
    judged = verdict.judge("unit", _run(bare, 0))
    assert judged.status == "PASSED" and "not isolated" in judged.detail and verdict.NOT_ISOLATED in judged.notes
    isolated = _write(tmp_path, "isolated.xml", '<testsuites><testsuite name="pytest"><properties><property '
                      f'name="{verdict.ISOLATION_PROPERTY}" value="on"/></properties>{case}</testsuite></testsuites>')
    judged = verdict.judge("unit", _run(isolated, 0))
    assert judged.status == "PASSED" and "not isolated" not in judged.detail and not judged.notes


def test_suite_and_case_properties_are_read(tmp_path):
    text = ('<testsuites><testsuite name="pytest"><properties><property name="canarchy_deselected" value="a.py::t"/>'
            '</properties><testcase classname="m" name="t"><properties><property name="w" value="x"/></properties>'
            '</testcase></testsuite></testsuites>')
    report = jc.load_report(_write(tmp_path, "p.xml", text))
    assert report.properties_named("canarchy_deselected") == ["a.py::t"]
    assert report.cases["m::t"].property_values("w") == ["x"]


@pytest.mark.parametrize(
    "node_id, key",
    [
        ("tests/test_x.py::test_a", "tests.test_x::test_a"),
        ("tests/test_x.py::TestK::test_m", "tests.test_x.TestK::test_m"),
        ("tests/sub/test_y.py::test_p[a::b-c/d.py]", "tests.sub.test_y::test_p[a::b-c/d.py]"),
        ("tests.test_x::test_a", "tests.test_x::test_a"),
        ("docs/usage.md::usage.md", "docs.usage.md::usage.md"),  # a doctest text file: JUnit keeps its suffix
        ("tests/test_mypy.yml::case[x]", "tests.test_mypy.yml::case[x]"),
    ],
)
def test_case_key_from_node_id(node_id, key):
    assert jc.case_key(node_id) == key


@pytest.mark.parametrize("key, shown", [
    ("dateutil.test.test_tz.GettzTest::testX", "dateutil/test/test_tz.py::GettzTest::testX"),
    ("dateutil.test.test_tz::test_p[a.b::c-d/e.py]", "dateutil/test/test_tz.py::test_p[a.b::c-d/e.py]"),
    ("dateutil.test.test_tz.TestOuter.TestInner::test_m", "dateutil/test/test_tz.py::TestOuter::TestInner::test_m"),
    ("tests.test_gone::test_a", "tests.test_gone::test_a"),  # no such module: the key as it is
    ("dateutil/test/test_tz.py::test_a", "dateutil/test/test_tz.py::test_a"),  # already a node id
    ("dateutil.test.test_tz", "dateutil.test.test_tz"),  # a module's collection error: no test name
    ("docs.usage.md::usage.md", "docs/usage.md::usage.md"),  # a doctest text file
    ("dateutil.test.cases.yml::case[x]", "dateutil/test/cases.yml::case[x]"),
])
def test_a_report_key_is_shown_as_the_node_id_of_its_module_under_the_root(tmp_path, key, shown):
    """The lanes showed JUnit's classname (``dateutil.test.test_tz.GettzTest::testX``), which pytest cannot be
    given; the node id of the module found under the checkout can."""
    (tmp_path / "dateutil" / "test").mkdir(parents=True)
    (tmp_path / "dateutil" / "test" / "test_tz.py").write_text("")
    (tmp_path / "dateutil" / "test" / "cases.yml").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "usage.md").write_text("")
    assert jc.node_id(key, tmp_path) == shown
    assert jc.node_id(key, None) == key
    assert jc.case_key(jc.node_id(key, tmp_path)) == jc.case_key(key)


# --------------------------------------------------------------------------- comparing


def test_same_report_is_identical(real):
    junit, *_ = real
    result = jc.compare(junit, junit)
    assert result.verdict == "identical" and result.exit_code == 0 and not result.differences


def test_order_and_timing_do_not_matter(tmp_path):
    a = _xml('<testcase classname="m" name="t1" time="0.1"/><testcase classname="m" name="t2" time="9"/>')
    b = _xml('<testcase classname="m" name="t2" time="0.5"/><testcase classname="m" name="t1" time="3"/>')
    assert jc.compare(_write(tmp_path, "a.xml", a), _write(tmp_path, "b.xml", b)).verdict == "identical"


def test_different_outcome_and_missing_case_are_differences(tmp_path):
    a = _xml('<testcase classname="m" name="t1"/><testcase classname="m" name="t2"/>')
    b = _xml('<testcase classname="m" name="t1"><failure message="boom"/></testcase>'
             '<testcase classname="m" name="t3"/>')
    result = jc.compare(_write(tmp_path, "a.xml", a), _write(tmp_path, "b.xml", b))
    assert result.verdict == "different" and result.exit_code == 1
    assert [(r.id, r.outcome_a, r.outcome_b) for r in result.differences] == [
        ("m::t1", "passed", "failed"),
        ("m::t2", "passed", "absent"),
        ("m::t3", "absent", "passed"),
    ]


def test_xfail_versus_skip_is_a_difference(tmp_path):
    a = _xml('<testcase classname="m" name="t"><skipped type="pytest.xfail" message="k"/></testcase>')
    b = _xml('<testcase classname="m" name="t"><skipped type="pytest.skip" message="k"/></testcase>')
    result = jc.compare(_write(tmp_path, "a.xml", a), _write(tmp_path, "b.xml", b))
    assert [(r.outcome_a, r.outcome_b) for r in result.differences] == [("xfailed", "skipped")]


def test_zero_cases_cannot_decide(tmp_path):
    empty = _write(tmp_path, "e.xml", '<testsuites><testsuite name="pytest" tests="0"/></testsuites>')
    result = jc.compare(empty, empty)
    assert result.verdict == "cannot decide" and result.exit_code == 2
    assert any("zero test cases" in r for r in result.undecided)


def test_unreadable_side_cannot_decide_and_is_named(tmp_path, real):
    junit, *_ = real
    result = jc.compare(junit, _write(tmp_path, "bad.xml", "not xml"), label_b="with config")
    assert result.verdict == "cannot decide" and "bad.xml" in result.undecided[0]


# --------------------------------------------------------------------------- allow-list


def test_allowlisted_difference_is_reported_not_counted(tmp_path):
    allow = _write(tmp_path, "allow.toml", '[[allowed]]\nid = "m.py::t1"\nreason = "reads the real home on purpose"\n')
    a = _xml('<testcase classname="m" name="t1"/>')
    b = _xml('<testcase classname="m" name="t1"><failure message="x"/></testcase>')
    result = jc.compare(_write(tmp_path, "a.xml", a), _write(tmp_path, "b.xml", b), allowlist=jc.load_allowlist(allow))
    assert result.verdict == "identical"
    assert [(r.id, r.allowed_reason) for r in result.allowed] == [("m::t1", "reads the real home on purpose")]
    assert "reads the real home on purpose" in render.comparison_table(result)
    assert "reads the real home on purpose" in render.comparison_markdown(result)


def test_unused_allowlist_entry_is_listed(tmp_path):
    allow = _write(tmp_path, "allow.toml", '[[allowed]]\nid = "m::t9"\nreason = "r"\n')
    a = _write(tmp_path, "a.xml", _xml('<testcase classname="m" name="t1"/>'))
    result = jc.compare(a, a, allowlist=jc.load_allowlist(allow))
    assert result.verdict == "identical" and [e.id for e in result.stale_allowed] == ["m::t9"]


def test_repository_allowlist_starts_empty():
    path = Path(__file__).resolve().parents[1] / "fixtures" / "parity-allowlist.toml"
    assert jc.load_allowlist(path) == []


@pytest.mark.parametrize(
    "content, message",
    [
        ('[[allowed]]\nid = "m::t"\n', "no `reason`"),
        ('[[allowed]]\nreason = "r"\n', "no `id`"),
        ('[[allowed]]\nid = "m::t"\nreason = "r"\n[[allowed]]\nid = "m::t"\nreason = "again"\n', "listed twice"),
        ('[[allowed]]\nid = "m::t"\nreason = "r"\nextra = 1\n', "only `id` and `reason`"),
        ('[other]\n', "unknown top-level"),
        ("[[allowed]\n", "cannot read the allow-list"),
    ],
)
def test_invalid_allowlist_cannot_decide(tmp_path, content, message):
    with pytest.raises(jc.CannotDecide, match=message):
        jc.load_allowlist(_write(tmp_path, "allow.toml", content))


# --------------------------------------------------------------------------- CLI and output


def test_cli_exit_codes_and_markdown(tmp_path, capsys):
    from canarchy.testing.lanes.__main__ import main

    a = _write(tmp_path, "a.xml", _xml('<testcase classname="m" name="t1"/>'))
    b = _write(tmp_path, "b.xml",
               _xml('<testcase classname="m" name="t1"><error message="failed on setup with x"/></testcase>'))
    md = tmp_path / "out" / "parity.md"
    assert main(["compare", str(a), str(a)]) == 0
    assert main(["compare", str(a), str(b), "--markdown", str(md)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out and "m::t1" in out and "without config" in out and "with config" in out
    assert "| `m::t1` | passed | error |" in md.read_text()
    assert main(["compare", str(a), str(tmp_path / "missing.xml")]) == 2
    assert "CANNOT DECIDE" in capsys.readouterr().out


def test_table_lists_each_differing_test_by_id(tmp_path):
    a = _xml("".join(f'<testcase classname="m" name="t{i}"/>' for i in range(3)))
    b = _xml('<testcase classname="m" name="t0"/><testcase classname="m" name="t1"><failure message="x"/></testcase>')
    table = render.comparison_table(jc.compare(_write(tmp_path, "a.xml", a), _write(tmp_path, "b.xml", b)))
    lines = table.splitlines()
    assert any(line.split() == ["m::t1", "passed", "failed"] for line in lines)
    assert any(line.split() == ["m::t2", "passed", "absent"] for line in lines)
    assert not any(line.startswith("m::t0") for line in lines)


STOPS_EARLY = """
import pytest

def test_a_passes():
    pass

def test_b_ends_the_run():
    pytest.exit("done early", returncode=0)

def test_c_fails():
    assert False
"""


SKIPS_ONE = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    return True if "broken" in item.nodeid else None  # the test is never run, and nothing is reported
"""


def test_a_run_in_workers_that_never_ran_a_test_is_no_pass(tmp_path):
    """Under pytest-xdist the controller collects nothing itself: the count of tests the run was to run comes
    from the workers' collection, so a test a conftest keeps from running is missed there too."""
    (tmp_path / "test_some.py").write_text("def test_one():\n    pass\n\ndef test_broken():\n    assert False\n")
    (tmp_path / "conftest.py").write_text(SKIPS_ONE)
    junit, output, code = _run_pytest(tmp_path, "-p", "canarchy.testing.isolation.plugin", "-p", "no:randomly",
                                      "-p", "xdist", "-n", "2", "test_some.py")
    assert code == 0, output
    judged = verdict.judge("unit", _run(junit, code))
    assert judged.status == "CANNOT DECIDE" and "holds 1 of the 2 tests" in judged.detail, judged.detail


def test_a_run_that_stopped_before_its_last_tests_is_no_pass(tmp_path):
    """A test's ``pytest.exit(returncode=0)``: pytest exits 0 with a report of the tests that ran; the isolation
    records how many the run was to run, and a lane that reads fewer cannot decide (the rest never ran)."""
    (tmp_path / "test_stops.py").write_text(STOPS_EARLY)
    junit, output, code = _run_pytest(tmp_path, "-p", "canarchy.testing.isolation.plugin", "-p", "no:randomly",
                                      "test_stops.py")
    assert code == 0, output
    judged = verdict.judge("unit", _run(junit, code))
    assert judged.status == "CANNOT DECIDE" and "holds 2 of the 3 tests" in judged.detail, judged.detail
    (tmp_path / "test_stops.py").write_text(STOPS_EARLY.replace('pytest.exit("done early", returncode=0)', "pass"))
    junit, output, code = _run_pytest(tmp_path, "-p", "canarchy.testing.isolation.plugin", "-p", "no:randomly",
                                      "test_stops.py")
    assert (code, verdict.judge("unit", _run(junit, code)).status) == (1, "FAILED"), output


def test_a_checkout_changed_under_nox_s_directory_points_at_another_nox_session(tmp_path):
    """Another nox session in the checkout makes or rebuilds its virtualenv under .nox/ while a lane runs there: the
    lane's sentinel sees the checkout change and fails the run, every test passed. The verdict says what likely
    changed it, beside the sentinel's lines; a change elsewhere gets no such note."""
    junit = _write(tmp_path, "r.xml", _xml('<testcase classname="m" name="t"/>'))
    for changed, noted in ((".nox/mutations/lib/python3.11/site-packages/x.pth", True), ("stray.txt", False)):
        junit.with_suffix(".log").write_text(
            "1 passed in 0.1s\n===== canarchy isolation sentinel, after the session =====\n"
            f"the test run changed the checkout:\n  removed: {changed}\n")
        judged = verdict.judge("unit", _run(junit, 1))
        assert judged.status == "FAILED" and (verdict.ANOTHER_NOX in judged.notes) == noted, judged


def test_a_run_that_wrote_no_report_still_names_the_plugins_it_did_not_load(tmp_path):
    """pytest stopped before its report (an internal error: a marker only a plugin the project does not load
    registers): the lane cannot decide, and the plugins the run's header named as not loaded are named beside
    that verdict too, not only in passing runs'."""
    from canarchy.testing.isolation.plugin import NOT_LOADED_HEADER

    log = tmp_path / "r.log"
    log.write_text(f"platform linux\ncanarchy isolation: {NOT_LOADED_HEADER}pytest-cov (-p pytest_cov), anyio "
                   "(-p anyio)\nINTERNALERROR> Failed: 'no_cover' not found in markers\n")
    judged = verdict.judge("unit", _run(tmp_path / "r.xml", 3))
    assert judged.status == "CANNOT DECIDE", judged
    [note] = [n for n in judged.notes if n.startswith(verdict.NOT_LOADED)]
    assert "anyio (-p anyio), pytest-cov (-p pytest_cov)" in note, note
