"""fixtures/adopter: another project adopting the plugin and the lanes (docs/adopting.md), and
every lane's verdict on it.

busprobe has the habits of a real suite nobody here wrote: a ``src/`` layout, unittest
``TestCase`` classes with ``subTest``, fixtures opened by relative path, a test that writes
into its own checkout and removes it, a load-sensitive test (deterministically flaky: the
second run in one place fails), a child Python that imports the package. Each lane runs
once, on one copy (module-scoped fixtures), and each test asserts its own part.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import contextlib
import dataclasses
import io
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from canarchy.testing.lanes import __main__ as lanes_cli
from canarchy.testing.lanes import mutation, mutation_report, parity
from canarchy.testing.lanes.project import Project, load_project
from tests.helpers import PYTEST

REPO = Path(__file__).resolve().parents[1]
ADOPTER = REPO / "fixtures" / "adopter"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def no_handler_survives(call):  # type: ignore[no-untyped-def]
    """``call()``'s result; AssertionError if it left a SIGINT or SIGTERM handler behind."""
    before = [signal.getsignal(sig) for sig in _SIGNALS]
    result = call()
    assert [signal.getsignal(sig) for sig in _SIGNALS] == before, "a lane's signal handler survived"
    return result


def lane_cli(project: Project, *argv: str) -> tuple[int, str]:
    """``python -m canarchy.testing.lanes --project ROOT ARGV`` run in this process: exit code, output."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)  # the unit lane echoes bytes
    with contextlib.redirect_stdout(out):
        code = no_handler_survives(lambda: lanes_cli.main(["--project", str(project.root), *argv]))
    out.buffer.seek(0)
    return code, out.buffer.read().decode("utf-8", "replace")


@pytest.fixture(scope="module")
def adopter(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """A copy of fixtures/adopter (never run in place), alone in its directory: the flaky
    test counts its runs beside the checkout."""
    root = tmp_path_factory.mktemp("adopter") / "busprobe"
    shutil.copytree(ADOPTER, root, ignore=shutil.ignore_patterns("reports", ".nox", "__pycache__"))
    return load_project(root)


@pytest.fixture(scope="module")
def unit_lane(adopter: Project) -> tuple[int, str]:
    return lane_cli(adopter, "unit", "--jobs", "0")


@pytest.fixture(scope="module")
def parity_lane(adopter: Project) -> parity.ParityResult:
    return no_handler_survives(lambda: parity.run_parity(adopter, list(adopter.tests), source_env=os.environ,
                                                         reruns=1, reports=adopter.root.parent / "parity-reports"))


@pytest.fixture(scope="module")
def mutation_lane(adopter: Project) -> mutation.MutationResult:
    assert adopter.mutations is not None
    definitions, broken = mutation.load_definitions([adopter.mutations])
    assert broken == [] and [m.name for m in definitions] == ["dlc-guard"]
    [result] = no_handler_survives(lambda: mutation.run_mutations(adopter, definitions, echo=lambda line: None))
    return result


def test_the_layout_is_read_from_the_adopter_s_pyproject(adopter):
    assert adopter.packages == ("busprobe",) and adopter.source == adopter.root / "src"
    assert adopter.tests == ("tests",) and adopter.install == ("-e", ".[test]")
    assert adopter.module_of("src/busprobe/frames.py") == "busprobe.frames"
    assert (adopter.operator_home, adopter.mutations) == (adopter.root / "operator-home", adopter.root / "mutations")


def test_unit_passes(unit_lane):
    code, out = unit_lane
    assert code == 0 and "unit: PASSED - 11 passed" in out, out


def test_parity_is_identical_despite_the_checkout_write(parity_lane):
    result = parity_lane
    assert result.exit_code == 0 and result.status == "PASSED", parity.render(result)
    assert result.of_kind("operator") == [] and result.home_changes == [] and result.checkout_changes == []
    writes = [line for line in result.checkout_writes if "candump.log.idx" in line]
    writer = "tests/test_index.py::TestIndex::test_the_index_is_written_beside_the_log"
    assert any(line.startswith(f"{writer}: open for writing") for line in writes), result.checkout_writes
    assert "written into its checkout (not a difference; what git ignores left out)" in parity.render(result)


def test_parity_reports_the_load_sensitive_test_as_flaky(parity_lane):
    result = parity_lane
    flaky = "tests.test_throughput.TestThroughput::test_decoding_keeps_up_with_a_busy_bus"
    assert [(f.id, f.kind) for f in result.findings] == [(flaky, "flaky")], parity.render(result)
    assert "results identical but for 1 flaky test" in parity.render(result)
    assert dataclasses.replace(result, strict=True).exit_code == 1  # --strict fails a flaky test


def test_the_mutation_is_killed_with_the_import_proof_covering_a_child(mutation_lane):
    result = mutation_lane
    assert result.status == "killed", mutation_report.render(result)
    assert [r.verdict for r in result.rows] == ["killed", "killed", "passes (ok)"]
    assert result.imported[0].endswith("src/busprobe/frames.py")
    assert len(result.importers) >= 2 and any("-m busprobe encode" in p for p in result.importers), result.importers


def test_order_passes(adopter):
    code, out = lane_cli(adopter, "order", "--seeds", "0")  # normal and reverse (a seed: tests/test_order.py)
    assert code == 0 and "order: PASSED" in out, out


def _adopter_files() -> list[str]:
    """The fixture's files, but the byte code pytest caches when it imports the conftest that
    refuses the run (where Python writes byte code: it is written before that code runs)."""
    return sorted(p.relative_to(ADOPTER).as_posix() for p in ADOPTER.rglob("*") if "__pycache__" not in p.parts)


def test_the_adopter_is_never_run_in_place(tmp_path):
    before = _adopter_files()
    proc = subprocess.run([*PYTEST, str(ADOPTER)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "is a fixture of canarchy's suite: it runs only on a copy" in proc.stdout + proc.stderr
    assert _adopter_files() == before


def test_a_run_with_the_plugin_disabled_says_why_each_test_cannot_be_isolated(tmp_path):
    """``-p no:...`` after the project's own ``-p``: the plugin's fixtures are registered, its start is not;
    each test fails naming that, not with a bare KeyError."""
    root = tmp_path / "busprobe"
    shutil.copytree(ADOPTER, root, ignore=shutil.ignore_patterns("reports", ".nox", "__pycache__"))
    proc = subprocess.run([*PYTEST, "-p", "no:canarchy.testing.isolation.plugin", "tests/test_frames.py"], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root / "src")}, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "KeyError" not in out, out
    assert "cannot be isolated: the plugin's fixtures are here, but the plugin did not start" in out, out


def test_docs_adopting_holds_the_adopter_s_ten_lines():
    """Each numbered line of docs/adopting.md is, without its comment, a line of the adopter's own files."""
    doc = (REPO / "docs" / "adopting.md").read_text(encoding="utf-8")
    numbered = {}
    for line in doc.splitlines():
        code, _, comment = line.partition("  # ")
        number = comment.removeprefix("noqa: F403").split()[0] if comment else ""
        if number.isdigit():
            numbered[int(number)] = code.rstrip() + ("  # noqa: F403" if "noqa: F403" in comment else "")
    assert sorted(numbered) == list(range(1, 11)), numbered
    own = set((ADOPTER / "pyproject.toml").read_text(encoding="utf-8").splitlines())
    own |= set((ADOPTER / "noxfile.py").read_text(encoding="utf-8").splitlines())
    assert [line for line in numbered.values() if line not in own] == []


def test_a_stray_pytest_ini_that_loses_the_plugin_cannot_decide(tmp_path):
    """A pytest.ini beside pyproject.toml shadows its [tool.pytest.ini_options], addopts and all: the lane
    loads the plugin itself (its project's configuration does), which names the stray file and refuses the
    run before any test."""
    root = tmp_path / "busprobe"
    shutil.copytree(ADOPTER, root, ignore=shutil.ignore_patterns("reports", ".nox", "__pycache__"))
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n", encoding="utf-8")
    code, out = lane_cli(load_project(root), "unit", "--jobs", "0", "--", "tests/test_frames.py")
    assert code == 2 and "unit: CANNOT DECIDE - pytest exit code 4" in out, out
    assert "pytest.ini shadows the project's configuration" in out and "collected" not in out, out


def test_parity_fails_a_refusal_made_alike_in_both_twins(tmp_path):
    """A test that finds the home through ``site.USER_BASE`` (worked out at start-up: only a serial run
    has the operator's there, so the unit lane's workers never meet it) and reads a guarded file there is
    refused in each serial twin alike: the results are identical, yet every operator's plain pytest
    errors. Parity fails, naming the test and the refusal in each twin."""
    root = tmp_path / "busprobe"
    shutil.copytree(ADOPTER, root, ignore=shutil.ignore_patterns("reports", ".nox", "__pycache__"))
    (root / "tests" / "test_user_base.py").write_text(
        "import site\nfrom pathlib import Path\n\n\n"
        "def test_reads_the_config_beside_user_base():\n"
        "    try:\n"
        "        (Path(site.USER_BASE).parent / '.busprobe' / 'config.toml').read_text()\n"
        "    except OSError:\n"
        "        pass\n", encoding="utf-8")
    project = load_project(root)
    result = no_handler_survives(lambda: parity.run_parity(project, ["tests/test_user_base.py"], source_env=os.environ,
                                                           reruns=1, reports=tmp_path / "parity-reports"))
    rendered = parity.render(result)
    assert result.comparison.differences == [] and result.exit_code == 1 and result.status == "FAILED", rendered
    key = "tests/test_user_base.py::test_reads_the_config_beside_user_base"  # the node id, to paste into pytest
    assert {line.split(":", 1)[0] for line in result.refusals} == {"clean twin", "operator twin"}, result.refusals
    assert all(f": {key}: " in line and ".busprobe/config.toml" in line for line in result.refusals), result.refusals
    assert "refused by the isolation: operator twin: " + key in rendered
