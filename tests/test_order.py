"""canarchy.testing.lanes.order: the order lane (reverse, pytest-randomly shuffles, detect-test-pollution)
on generated projects."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import os
import subprocess
import sys
from pathlib import Path

import pytest

from canarchy.testing.lanes import __main__ as lanes_cli
from canarchy.testing.lanes import env as lane_env
from canarchy.testing.lanes import order
from canarchy.testing.lanes.project import Project, load_project
from canarchy.testing.lanes.results import totals_text
from tests.helpers import WAITING_TEST, interrupt_once_started

REPO = Path(__file__).resolve().parents[1]


def _project(root: Path, files: dict[str, str]) -> Project:
    (root / "tests").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = ["-p", "canarchy.testing.isolation.plugin"]\n')
    for name, text in files.items():
        (root / "tests" / name).write_text(text)
    (root / ".gitignore").write_text("reports/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return load_project(root)


def _lane(project: Project, seeds=(1,), **kwargs) -> order.OrderResult:
    return order.run_order_lane(project, ["tests"], seeds=list(seeds), source_env=os.environ, echo=lambda line: None,
                                **kwargs)


FILES = {
    "test_a.py": "def test_1(): pass\ndef test_2(): pass\n",
    "test_b.py": "class TestK:\n    def test_3(self): pass\n    def test_4(self): pass\n",
}


def test_the_reverse_plugin_runs_the_tests_backwards_after_deselection(tmp_path):
    project = _project(tmp_path / "p", FILES)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-p", "canarchy.testing.lanes.reverse",
                           "-v", "-k", "not test_2", "tests"], cwd=project.root, capture_output=True, text=True, timeout=120)
    ran = [line.split()[0] for line in proc.stdout.splitlines() if " PASSED" in line]
    assert ran == ["tests/test_b.py::TestK::test_4", "tests/test_b.py::TestK::test_3", "tests/test_a.py::test_1"], proc.stdout


PAIR = {
    "shared.py": "STATE = []\n",
    "test_a_victim.py": "from tests.shared import STATE\ndef test_victim():\n    assert STATE == []\n",
    "test_b_fillers.py": "".join(f"def test_filler_{i}(): pass\n" for i in range(6)),
    "test_c_polluter.py": "from tests.shared import STATE\ndef test_polluter():\n    STATE.append('left behind')\n",
    "__init__.py": "",
}


def test_order_lane_finds_and_names_the_polluter(tmp_path):
    project = _project(tmp_path / "p", PAIR)
    result = _lane(project)
    assert result.exit_code == 1 and result.status == "FAILED", order.render(result)
    rows = [(r.id, r.outcome_a, r.outcome_b) for r in result.comparisons["reverse"].differences]
    assert rows == [("tests.test_a_victim::test_victim", "passed", "failed")]
    [bisection] = result.bisections
    assert (bisection.victim, bisection.run_label) == ("tests/test_a_victim.py::test_victim", "reverse")
    assert bisection.polluter == "tests/test_c_polluter.py::test_polluter", bisection.note
    text = order.render(result, ["tests"])
    assert "polluted by tests/test_c_polluter.py::test_polluter" in text
    assert "python -m pytest -p randomly --randomly-seed=1 tests" in text
    md = order.render_markdown(result)
    assert "| `tests/test_a_victim.py::test_victim` | reverse | `tests/test_c_polluter.py::test_polluter` |" in md


def test_order_lane_passes_an_order_independent_suite(tmp_path):
    files = {"test_a.py": "".join(f"def test_{i}(): pass\n" for i in range(5)), "test_b.py": "def test_b(): pass\n"}
    result = _lane(_project(tmp_path / "p", files), seeds=(1, 2))
    assert result.exit_code == 0, order.render(result)
    assert [r.label for r in result.runs] == ["normal", "reverse", "seed 1", "seed 2"]
    assert result.bisections == [] and all(c.verdict == "identical" for c in result.comparisons.values())
    assert [totals_text(r.report) for r in result.runs] == ["6 passed"] * 4


def test_a_seeded_shuffle_really_reorders(tmp_path):
    files = {"test_a.py": "".join(f"def test_{i}(): pass\n" for i in range(8))}
    result = _lane(_project(tmp_path / "p", files), seeds=(3,))
    normal, shuffled = result.runs[0].executed, result.runs[2].executed
    assert sorted(normal) == sorted(shuffled) and normal != shuffled


def test_order_lane_cannot_decide_without_results(tmp_path):
    result = _lane(_project(tmp_path / "p", {"test_a.py": "import no_such_module_anywhere\n"}), seeds=())
    assert result.exit_code == 2
    assert any("exit code 2" in (r.problem or "") for r in result.runs)


def test_cli_prints_the_table_and_writes_markdown(tmp_path, capsys):
    project = _project(tmp_path / "p", PAIR)
    assert lanes_cli.main(["--project", str(project.root), "order", "--seeds", "0"]) == 1
    out = capsys.readouterr().out
    assert "order: FAILED" in out and "normal vs reverse: DIFFERENT" in out
    assert (project.root / "reports" / "order.md").read_text().startswith("# Order lane: FAILED")


def test_ctrl_c_stops_the_runs_starts_no_more_and_leaves_nothing(tmp_path):
    """Two runs at a time, four queued (normal, reverse, seeds 1 and 2): SIGINT while the first
    two wait; neither of the queued ones may start afterwards."""
    started, tmp = tmp_path / "started", tmp_path / "tmp"
    started.mkdir()
    tmp.mkdir()
    project = _project(tmp_path / "p", {"test_w.py": WAITING_TEST.format(started=str(started))})
    env = lane_env.build_env(home=tmp_path / "home", source=os.environ, extra={"TMPDIR": str(tmp), "PYTHONPATH": str(REPO)})
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
