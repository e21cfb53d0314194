"""canarchy.testing.lanes.order: the order lane (reverse, pytest-randomly shuffles, detect-test-pollution)
on generated projects."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from canarchy.testing.lanes import __main__ as lanes_cli
from canarchy.testing.lanes import env as lane_env
from canarchy.testing.lanes import order
from canarchy.testing.lanes.project import Project, load_project
from canarchy.testing.lanes.results import load_report
from tests.helpers import WAITING_TEST, interrupt_once_started

REPO = Path(__file__).resolve().parents[1]


def _project(root: Path, files: dict[str, str]) -> Project:
    (root / "tests").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = ["-p", "canarchy.testing.isolation.plugin"]\n')
    for name, text in files.items():
        (root / "tests" / name).write_text(text)
    (root / ".gitignore").write_text("reports/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return load_project(root)


def _lane(project: Project, seeds=(1,), **kwargs) -> order.OrderResult:
    return order.run_order_lane(project, ["tests"], seeds=list(seeds), source_env=os.environ, echo=lambda line: None,
                                **kwargs)


#: The seeded corpus's order-dependent pair (one definition of that defect): the selftest lane
#: runs it through its ``order`` detector, this module through the order lane's command line.
PAIR = {"test_pair.py": (REPO / "fixtures" / "leaks" / "leak_order_pair.py").read_text(encoding="utf-8")}
VICTIM = "tests/test_pair.py::test_victim_assumes_an_empty_registry"
POLLUTER = "tests/test_pair.py::test_polluter_registers_and_forgets"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, int, str, list[str]]:
    """The order lane's command line, run once over an order-dependent pair (normal, reverse, seed 1),
    with a deselection; an order-independent suite passing: tests/test_adopter.py. Also returns where
    its pytest runs were told to write their reports and node ids."""
    project = _project(tmp_path_factory.mktemp("pair") / "p", PAIR)
    out, written = io.StringIO(), []
    real = order.run_pytest

    def recording(args, **kwargs):
        written.extend(a.split("=", 1)[1] for a in args if a.startswith(("--junitxml=", "--dtp-testids-")))
        return real(args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(order, "run_pytest", recording)
        code = lanes_cli.main(["--project", str(project.root), "order", "--seeds", "1",
                               "--", "-k", "not test_filler_1"])
    return project, code, out.getvalue(), written


def _ran(project: Project, label: str) -> list[str]:
    """Case keys in the order the ``label`` run executed them (its JUnit report lists them so)."""
    return list(load_report(project.root / "reports" / f"order-{label}.xml").cases)


def test_order_lane_finds_and_names_the_polluter(pair):
    project, code, out, _written = pair
    assert code == 1 and "order: FAILED" in out and "normal vs reverse: DIFFERENT" in out, out
    assert "tests/test_pair.py::test_victim_assumes_an_empty_registry  passed  failed" in out  # a node id to paste
    assert f"victim {VICTIM} (reverse run): polluted by {POLLUTER}" in out
    # the project sets no testpaths: pytest collects from the root, the line says "."
    assert "reproduce: python -m pytest -p randomly --randomly-seed=1 -k not test_filler_1 ." in out
    md = (project.root / "reports" / "order.md").read_text()
    assert md.startswith("# Order lane: FAILED") and f"| `{VICTIM}` | reverse | polluter | `{POLLUTER}` |" in md
    assert f"| `{VICTIM}` | passed | failed |" in md


def test_reverse_runs_backwards_after_deselection_and_a_seed_really_shuffles(pair):
    project, _code, _out, _written = pair
    normal, reverse, shuffled = _ran(project, "normal"), _ran(project, "reverse"), _ran(project, "seed-1")
    assert len(normal) == 4 and "tests.test_pair::test_filler_1" not in normal
    assert reverse == normal[::-1]
    assert sorted(shuffled) == sorted(normal) and shuffled not in (normal, reverse)


def test_the_polluter_is_found_where_the_project_s_addopts_ask_for_xdist_workers(tmp_path):
    """``-n auto`` in addopts is fine for every run of the lane (it gives ``-p xdist -n 0``); the pytest runs
    of detect-test-pollution's bisection had no such flags and stopped at "unrecognized arguments: -n", so
    the lane said it "found no single polluter" of a victim with one."""
    project = _project(tmp_path / "p", PAIR)
    (project.root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = ["-p", "canarchy.testing.isolation.plugin", "-n", "auto"]\n')
    result = _lane(load_project(project.root), seeds=())
    [found] = result.bisections
    assert (found.victim, found.culprit) == (VICTIM, POLLUTER), order.render(result)
    # the order a reproduce line gives is the lane's only in one process: workers would each run a share
    assert "reproduce: python -m pytest -n 0 -p canarchy.testing.lanes.reverse" in order.render(result)


def test_a_differing_test_past_the_searched_ones_is_named_not_dropped(tmp_path):
    """The lane searches a culprit for the first differing tests only (``--max-bisections``); the others were
    left out of the report without a word (an adopter's fourth victim had no line at all)."""
    project = _project(tmp_path / "p", PAIR)
    result = _lane(project, seeds=(), max_bisections=0)
    assert result.bisections == [] and [result.show(key) for key in result.unsearched] == [VICTIM]
    assert f"not searched for a culprit: 1 more differing test(s) ({VICTIM})" in order.render(result)
    assert "--max-bisections N" in order.render_markdown(result)


TWO_POLLUTERS = """
SEEN = set()

def test_victim_fails_after_both():
    assert SEEN != {"a", "b"}

def test_a():
    SEEN.add("a")

def test_b():
    SEEN.add("b")
"""


def test_a_bisection_that_names_no_polluter_points_at_its_log_where_the_lane_left_it(tmp_path):
    """No single test pollutes the victim (it fails only after both others): the finding names
    detect-test-pollution's log, which must be in the reports the lane published, not in its temporary tree
    removed before the verdict was printed."""
    project = _project(tmp_path / "p", {"test_two.py": TWO_POLLUTERS})
    result = _lane(project, seeds=())
    [found] = result.bisections
    assert found.culprit is None and "found no single polluter" in found.note, order.render(result)
    log = Path(found.note.rpartition("log ")[2].rstrip(")"))
    assert log.parent == project.root / "reports" and log.is_file(), found.note


def test_a_test_that_fails_alone_is_traced_to_the_test_it_needs_first(tmp_path):
    """Reversed, the dependent test runs first and fails; it fails alone too, so no polluter exists:
    the lane bisects the tests that ran before it in the normal run and names the state-setter."""
    source = (REPO / "fixtures" / "leaks" / "leak_order_setter.py").read_text(encoding="utf-8")
    result = _lane(_project(tmp_path / "p", {"test_setter.py": source}), seeds=())
    [found] = result.bisections
    assert result.status == "FAILED" and found.run_label == "normal", order.render(result)
    assert (found.victim, found.kind) == ("tests/test_setter.py::test_reads_the_warm_cache", "state-setter")
    assert found.culprit == "tests/test_setter.py::test_setter_warms_the_cache", found.note
    assert "needs tests/test_setter.py::test_setter_warms_the_cache to run first" in order.render(result)


def test_a_module_skipped_at_collection_is_no_test_that_ran(tmp_path):
    """A module that skips itself as it is collected (``importorskip``, ``pytest.skip(allow_module_level=True)``)
    is one JUnit entry, "collection skipped", in every run: it is not a test the runs ran in some order, so the
    lane still decides and still names the test a dependent one needs first."""
    source = (REPO / "fixtures" / "leaks" / "leak_order_setter.py").read_text(encoding="utf-8")
    skipped = "import pytest\npytest.importorskip('a_module_nobody_installed')\n"
    result = _lane(_project(tmp_path / "p", {"test_aa_optional.py": skipped, "test_setter.py": source}), seeds=())
    [found] = result.bisections
    assert result.status == "FAILED", order.render(result)
    assert found.culprit == "tests/test_setter.py::test_setter_warms_the_cache", found.note


ALTERNATING = """
import os


def test_one():
    pass


def test_two():
    pass


def test_three():
    pass


def test_alternates():  # fails at every other run, whatever ran before it: flaky, in no order's debt
    path = os.environ["ORDER_FLIP"]
    count = int(open(path).read() or 0) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(count))
    assert count % 2 == 0
"""


def test_a_flaky_test_is_not_blamed_on_a_test_that_ran_before_it(tmp_path):
    """Its outcome changes from one run to the next: a bisection of what ran before it ends on some test
    by chance. The lane runs the victim again after that test and alone before naming it, and says flaky."""
    project = _project(tmp_path / "p", {"test_flip.py": ALTERNATING})
    result = _lane(project, seeds=(), jobs=1, extra_env={"ORDER_FLIP": str(tmp_path / "flip")})
    shown = order.render(result)
    assert [b.culprit for b in result.bisections] == [None], shown
    assert "flaky" in shown and "to run first" not in shown and "polluted by" not in shown, shown


def test_order_lane_cannot_decide_without_results(tmp_path):
    result = _lane(_project(tmp_path / "p", {"test_a.py": "import no_such_module_anywhere\n"}), seeds=())
    assert result.exit_code == 2
    assert any("exit code 2" in (r.problem or "") for r in result.runs)


SORTS_BACK = """
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    yield
    items.sort(key=lambda item: item.nodeid)  # after every other hook, the lane's reordering among them
    if len(items) > 2:  # all but back in order: the last two swapped
        items[-2], items[-1] = items[-1], items[-2]
"""


def test_order_lane_cannot_decide_when_the_project_puts_its_tests_back_in_order(tmp_path):
    """A conftest's wrapper that sorts the tests after every other hook: the reversed run ran them in the normal
    order, so the lane compared one order with itself and cannot say the tests are independent of it."""
    project = _project(tmp_path / "p", {"test_a.py": "def test_a():\n    pass\n\ndef test_b():\n    pass\n\n"
                                                     "def test_c():\n    pass\n", "conftest.py": SORTS_BACK})
    result = _lane(project, seeds=())
    assert result.exit_code == 2 and result.status == "CANNOT DECIDE", order.render(result)
    assert "did not run the tests in the reverse of the normal order" in (result.runs[1].problem or ""), \
        order.render(result)
    assert "- cannot decide (reverse): it did not run the tests in the reverse" in order.render_markdown(result)


def test_order_lane_cannot_decide_when_every_test_skips(tmp_path):
    skipping = "import pytest\n\npytestmark = pytest.mark.skip(reason='never here')\n\n" + \
        "def test_a():\n    pass\n\ndef test_b():\n    pass\n"
    result = _lane(_project(tmp_path / "p", {"test_a.py": skipping}), seeds=())
    assert result.exit_code == 2 and result.status == "CANNOT DECIDE"
    assert any("every test case skipped" in (r.problem or "") for r in result.runs)


def test_ctrl_c_stops_the_runs_starts_no_more_and_leaves_nothing(tmp_path):
    """Two runs at a time, four queued (normal, reverse, seeds 1 and 2): SIGINT while the first
    two wait; neither of the queued ones may start afterwards."""
    started, tmp = tmp_path / "started", tmp_path / "tmp"
    started.mkdir()
    tmp.mkdir()
    project = _project(tmp_path / "p", {"test_w.py": WAITING_TEST.format(started=str(started))})
    env = lane_env.build_env(home=tmp_path / "home", source=os.environ,
                             extra={"TMPDIR": str(tmp), "PYTHONPATH": str(REPO)})
    argv = [sys.executable, "-m", "canarchy.testing.lanes", "--project", str(project.root), "order", "--seeds", "2",
            "--jobs", "2"]
    lane = interrupt_once_started(argv, started=started, runs=2, cwd=project.root, env=env)
    assert lane.returncode == 130, lane.out + lane.err
    assert "order: interrupted by SIGINT" in lane.err and "Traceback" not in lane.err, lane.err
    assert len(lane.pids) == 2, "a queued run started after the interrupt"
    for pid in lane.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert list(tmp.iterdir()) == []
    # what ran until the interrupt is in the runs' logs, which reach reports/ (as docs/adopting.md says); nothing
    # that reads as a verdict does
    assert sorted(p.name for p in (project.root / "reports").iterdir()) == ["order-normal.log", "order-reverse.log"]


def test_a_run_that_failed_beyond_its_tests_fails_the_order_lane(tmp_path):
    """Every test passes in every order, yet the isolation's sentinel fails each run (a file left in the
    checkout): the same results in every order are no pass."""
    project = _project(tmp_path / "p", {"test_left.py": "from pathlib import Path\n\n"
                                                       "def test_leaves_a_file():\n"
                                                       "    (Path(__file__).parent / 'left.txt').write_text('x')\n"})
    result = _lane(project, seeds=())
    assert result.runs_failed and result.status == "FAILED", order.render(result)
    assert "failed (normal): no test failed, yet pytest failed the run" in order.render(result)
    # the sentinel's lines name the test and the file in the terminal, as the unit lane prints them
    assert "    sentinel: " in order.render(result) and "left.txt" in order.render(result), order.render(result)


def test_the_runs_write_no_report_into_the_checkout_and_the_lane_publishes_them(pair):
    """Each run is on a copy, so the checkout is not its checkout: when it lies in the operator's home
    (``~/canarchy``, a new user's clone) such a run may only read it, and its report or node ids written
    there were refused (every run CANNOT DECIDE). The runs and the search write into the lane's temporary
    tree; the lane copies their reports and logs to ``reports/`` afterwards."""
    project, _code, out, written = pair
    assert len(written) > 6, written  # three runs, each with its ids, and the search's runs
    assert not [w for w in written if Path(w).resolve().is_relative_to(project.root.resolve())], written
    reports = project.root / "reports"
    for label in ("normal", "reverse", "seed-1"):
        assert {f"order-{label}{end}" for end in (".log", ".xml", "-ids.txt")} <= set(os.listdir(reports)), label
    assert f"polluted by {POLLUTER}" in out and "CANNOT DECIDE" not in out, out
