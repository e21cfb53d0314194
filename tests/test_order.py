"""canarchy.testing.lanes.order: the reordering plugin, the bisection, and the order lane on generated projects."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import subprocess
import sys
from pathlib import Path

import pytest

from canarchy.testing.lanes import order

IDS = [
    "tests/test_a.py::test_1",
    "tests/test_a.py::test_2",
    "tests/test_a.py::TestK::test_3",
    "tests/test_a.py::TestK::test_4[x]",
    "tests/test_b.py::test_5",
    "tests/test_b.py::test_6",
    "tests/test_c.py::test_7",
]


# --------------------------------------------------------------------------- reorder()


def test_reverse_is_the_list_backwards():
    assert order.reorder(IDS, "reverse") == IDS[::-1]
    assert order.reorder(IDS, "normal") == IDS


def test_shuffle_is_reproducible_and_a_permutation():
    first = order.reorder(IDS, "shuffle", 1)
    assert first == order.reorder(IDS, "shuffle", 1)
    assert sorted(first) == sorted(IDS)
    assert len({tuple(order.reorder(IDS, "shuffle", seed)) for seed in range(1, 9)}) > 1


def test_shuffle_keeps_modules_and_classes_contiguous():
    for seed in range(1, 20):
        shuffled = order.reorder(IDS, "shuffle", seed)
        modules = [nodeid.split("::")[0] for nodeid in shuffled]
        blocks = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
        assert len(blocks) == len(set(blocks)), shuffled  # each module runs as one block
        klass = [i for i, nodeid in enumerate(shuffled) if "::TestK::" in nodeid]
        assert klass == list(range(klass[0], klass[0] + 2)), shuffled


@pytest.mark.parametrize("args, message", [(("sideways",), "unknown order"), (("shuffle",), "needs --canarchy-order-seed")])
def test_bad_orders_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        order.reorder(IDS, *args)


# --------------------------------------------------------------------------- the plugin


def _project(root: Path, files: dict[str, str]) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    for name, text in files.items():
        (root / "tests" / name).write_text(text)
    return root


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(root / "pytest.ini"), "--rootdir", str(root),
         "-p", "canarchy.testing.lanes.order", *args],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


FILES = {
    "test_a.py": "def test_1(): pass\ndef test_2(): pass\ndef test_skipme(): pass\n",
    "test_b.py": "class TestK:\n    def test_3(self): pass\n    def test_4(self): pass\n",
}


def test_plugin_reverses_records_and_respects_deselection(tmp_path):
    root = _project(tmp_path / "p", FILES)
    record = tmp_path / "order.txt"
    proc = _pytest(root, "--canarchy-order=reverse", f"--canarchy-order-record={record}", "-k", "not skipme", "tests")
    assert proc.returncode == 0, proc.stdout
    assert record.read_text().splitlines() == [
        "tests/test_b.py::TestK::test_4", "tests/test_b.py::TestK::test_3", "tests/test_a.py::test_2", "tests/test_a.py::test_1",
    ]
    assert "4 passed, 1 deselected" in proc.stdout


def test_plugin_runs_exactly_the_listed_tests_in_that_order(tmp_path):
    root = _project(tmp_path / "p", FILES)
    listing, record = tmp_path / "ids.txt", tmp_path / "order.txt"
    listing.write_text("tests/test_b.py::TestK::test_4\ntests/test_a.py::test_1\n")
    proc = _pytest(root, f"--canarchy-order-file={listing}", f"--canarchy-order-record={record}", "-v", "tests")
    assert proc.returncode == 0, proc.stdout
    assert record.read_text().splitlines() == ["tests/test_b.py::TestK::test_4", "tests/test_a.py::test_1"]
    assert "2 passed, 3 deselected" in proc.stdout


def test_plugin_without_options_changes_nothing(tmp_path):
    root = _project(tmp_path / "p", FILES)
    proc = _pytest(root, "-v", "tests")
    ran = [line.split()[0] for line in proc.stdout.splitlines() if " PASSED" in line]
    assert ran == ["tests/test_a.py::test_1", "tests/test_a.py::test_2", "tests/test_a.py::test_skipme",
                   "tests/test_b.py::TestK::test_3", "tests/test_b.py::TestK::test_4"]


# --------------------------------------------------------------------------- bisection


def _fake(polluters: set[str], *, flaky: bool = False):
    calls = []

    def try_order(ids):
        calls.append(list(ids))
        if flaky and len(calls) == 2:
            return False
        return polluters <= set(ids[:-1]) if polluters else True

    return try_order, calls


BEFORE = [f"tests/test_x.py::test_{i}" for i in range(13)]


def test_bisection_names_the_polluter():
    try_order, calls = _fake({BEFORE[9]})
    found = order.bisect_polluter("tests/test_v.py::test_victim", BEFORE, try_order)
    assert found.polluter == BEFORE[9] and found.note == "passes alone, fails right after the polluter"
    assert calls[0] == ["tests/test_v.py::test_victim"] and calls[1] == [*BEFORE, "tests/test_v.py::test_victim"]
    assert found.steps == len(calls) <= 2 + 2 * 4  # logarithmic


def test_bisection_says_when_there_is_no_order_dependency():
    try_order, _ = _fake(set())
    assert order.bisect_polluter("v", BEFORE, try_order).note == "fails when run alone: not an order dependency"
    try_order, _ = _fake({BEFORE[0]}, flaky=True)
    assert "flaky" in order.bisect_polluter("v", BEFORE, try_order).note


def test_bisection_reports_a_polluting_combination():
    try_order, _ = _fake({BEFORE[1], BEFORE[11]})
    found = order.bisect_polluter("v", BEFORE, try_order)
    assert found.polluter is None and found.note.startswith("needs several of 13 earlier tests together")


# --------------------------------------------------------------------------- the lane


PAIR = {
    "shared.py": "STATE = []\n",
    "test_a_victim.py": "from tests.shared import STATE\ndef test_victim():\n    assert STATE == []\n",
    "test_b_fillers.py": "".join(f"def test_filler_{i}(): pass\n" for i in range(6)),
    "test_c_polluter.py": "from tests.shared import STATE\ndef test_polluter():\n    STATE.append('left behind')\n",
    "__init__.py": "",
}


def _lane_args(root: Path) -> list[str]:
    return ["-p", "no:cacheprovider", "-c", str(root / "pytest.ini"), "--rootdir", str(root),
            "--junitxml=reports/order.xml", "tests"]  # fmt: skip


def test_order_lane_finds_and_names_the_polluter(tmp_path):
    root = _project(tmp_path / "p", PAIR)
    result = order.run_order_lane(sys.executable, _lane_args(root), seeds=[1], cwd=root, echo=lambda line: None)
    assert result.exit_code == 1 and result.status == "FAILED"
    rows = [(r.id, r.outcome_a, r.outcome_b) for r in result.comparisons["reverse"].differences]
    assert rows == [("tests.test_a_victim::test_victim", "passed", "failed")]
    [bisection] = result.bisections
    assert (bisection.victim, bisection.run_label) == ("tests/test_a_victim.py::test_victim", "reverse")
    assert bisection.polluter == "tests/test_c_polluter.py::test_polluter"
    text = order.render(result)
    assert text.splitlines()[0].endswith("- 1 differing test(s): 1 polluter(s) named, 0 flaky (not reproduced)")
    assert "polluted by tests/test_c_polluter.py::test_polluter" in text
    assert "--canarchy-order=shuffle --canarchy-order-seed=1" in text
    md = order.render_markdown(result)
    assert "| `tests/test_a_victim.py::test_victim` | reverse | `tests/test_c_polluter.py::test_polluter` |" in md


def test_order_lane_passes_an_order_independent_suite(tmp_path):
    files = {"test_a.py": "".join(f"def test_{i}(): pass\n" for i in range(5)), "test_b.py": "def test_b(): pass\n"}
    root = _project(tmp_path / "p", files)
    result = order.run_order_lane(sys.executable, _lane_args(root), seeds=[1, 2], cwd=root, echo=lambda line: None)
    assert result.exit_code == 0, order.render(result)
    assert [r.label for r in result.runs] == ["normal", "reverse", "seed 1", "seed 2"]
    assert result.bisections == [] and all(c.verdict == "identical" for c in result.comparisons.values())


def test_order_lane_cannot_decide_without_results(tmp_path):
    root = _project(tmp_path / "p", {"test_a.py": "import no_such_module_anywhere\n"})
    result = order.run_order_lane(sys.executable, _lane_args(root), seeds=[], cwd=root, echo=lambda line: None)
    assert result.exit_code == 2
    assert any("exit code 2" in reason for reason in result.undecided)


def test_cli_prints_the_table_and_writes_markdown(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path / "p", PAIR)
    monkeypatch.chdir(root)
    assert order.main(["run", "--seeds", "0", "--", *_lane_args(root)]) == 1
    out = capsys.readouterr().out
    assert "order: FAILED" in out and "normal vs reverse: DIFFERENT" in out
    assert (root / "reports" / "order.md").read_text().startswith("# Order lane: FAILED")


def test_every_order_run_is_contained(tmp_path):
    from canarchy.testing.lanes import netns as lane_netns

    from tests.test_lanes import _needs_a_namespace, unguarded_child

    _needs_a_namespace()
    root = _project(tmp_path / "p", {"test_c.py": unguarded_child()})
    lines = []
    result = order.run_order_lane(sys.executable, _lane_args(root), seeds=[1], cwd=root, echo=lines.append)
    assert [entry.run.summary for entry in result.runs] == [{"passed": 1}] * 3, lines
    assert any("network: a private namespace" in line for line in lines) and lane_netns.netns_support().available


def test_ctrl_c_stops_the_runs_starts_no_more_and_leaves_nothing(tmp_path):
    """Two runs at a time, four queued (normal, reverse, seeds 1 and 2): SIGINT while the first
    two wait; neither of the queued ones may start afterwards."""
    import os

    from canarchy.testing.lanes import env as lane_env
    from tests.helpers import WAITING_TEST, interrupt_once_started

    started, tmp = tmp_path / "started", tmp_path / "tmp"
    started.mkdir()
    tmp.mkdir()
    root = _project(tmp_path / "p", {"test_w.py": WAITING_TEST.format(started=str(started))})
    env = lane_env.build_env(home=tmp_path / "home", source=os.environ,
                          extra={"TMPDIR": str(tmp), "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    argv = [sys.executable, "-m", "canarchy.testing.lanes", "order", "run", "--seeds", "2", "--jobs", "2", "--", *_lane_args(root)]
    lane = interrupt_once_started(argv, started=started, runs=2, cwd=root, env=env)
    assert lane.returncode == 130, lane.out + lane.err
    assert "order: interrupted by SIGINT" in lane.err and "Traceback" not in lane.err, lane.err
    assert len(lane.pids) == 2, "a queued run started after the interrupt"
    for pid in lane.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert list(tmp.iterdir()) == []
