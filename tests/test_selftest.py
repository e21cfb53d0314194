"""canarchy.testing.lanes.selftest: the seeded-defect corpus (fixtures/leaks) and its runner.

The whole corpus runs in `nox -s selftest`; here: the manifest is complete and
valid, the corpus is never collected by the normal suite (no module is named
test_*, every module is in the manifest, naming one explicitly is refused), one
defect is caught end to end, and a detector that stays silent is reported as a miss.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import argparse
import subprocess
from pathlib import Path

import pytest

from canarchy.testing.lanes import selftest
from canarchy.testing.lanes.project import load_project
from tests.helpers import PYTEST

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fixtures" / "leaks"
OPERATOR_HOME = ROOT / "fixtures" / "operator-home"


def test_the_corpus_covers_every_required_defect_and_detector():
    entries = {e.name: e for e in selftest.load_corpus(CORPUS)}
    required = {
        "module-scope-config", "session-fixture-findings", "thread-safe-udp-multicast", "relies-on-can-interface",
        "subprocess-bus", "swallowed-guard-error", "checkout-write", "virtual-bus-left-open",
        "canarchy-variable-left-set", "order-pair", "home-from-the-user-base", "home-removed", "putenv",
        "signal-handler", "collection-bus",
    }
    assert required <= set(entries)
    assert {e.detector for e in entries.values() if not e.is_control} == set(selftest.DETECTORS)
    assert [e.name for e in entries.values() if e.is_control] == ["control-clean"]
    listed = {e.file.name for e in entries.values()}
    assert listed == {p.name for p in CORPUS.glob("*.py")} - {"conftest.py"}, "every module is in the manifest"


def test_a_corpus_module_named_explicitly_is_refused_before_it_runs(tmp_path):
    """On a copy of the corpus: `pytest <corpus>/leak_checkout_write.py` would write into the rootdir."""
    import shutil

    corpus = tmp_path / "leaks"
    shutil.copytree(CORPUS, corpus)
    proc = subprocess.run(
        [*PYTEST, "--rootdir", str(tmp_path),
         str(corpus / "leak_checkout_write.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "runs only through `nox -s selftest`" in proc.stdout + proc.stderr
    assert not (tmp_path / "notes").exists()


def _defect(file: str = "m.py", **fields: str) -> str:
    """A one-defect manifest: name x, the given ``file`` and fields, expect and description set."""
    lines = ['[[defect]]', 'name = "x"', f'file = "{file}"', *(f'{k} = "{v}"' for k, v in fields.items()),
             'expect = "e"', 'description = "d"']
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "manifest, message",
    [
        (_defect(detector="luck", test="t"), "`detector` must be one of"),
        (_defect(detector="guard"), "needs `test`"),
        (_defect("nope.py", detector="sentinel"), "is not a file"),
        (_defect("test_m.py", detector="sentinel"), "would be collected"),
        (_defect(detector="sentinel"), "no [[control]]"),
        ('[[control]]\nname = "x"\nfile = "m.py"\ndescription = "d"\nsurprise = 1\n', "only"),
    ],
)
def test_invalid_manifests_are_refused(tmp_path, manifest, message):
    (tmp_path / "m.py").write_text("def test_x(): pass\n")
    (tmp_path / "test_m.py").write_text("def test_x(): pass\n")
    (tmp_path / "manifest.toml").write_text(manifest)
    with pytest.raises(selftest.CorpusError, match=message.replace("[", r"\[")):
        selftest.load_corpus(tmp_path)


def test_a_guard_defect_is_caught_end_to_end():
    [entry] = [e for e in selftest.load_corpus(CORPUS) if e.name == "swallowed-guard-error"]
    outcome = selftest.run_entry(entry, operator_home=OPERATOR_HOME)
    assert outcome.ok and outcome.verdict == "caught", outcome.evidence
    assert "the error may have been caught" in outcome.evidence


def test_a_silent_detector_is_a_miss(tmp_path):
    """A clean module declared as a guard defect: nothing fires, so the selftest must say MISSED."""
    (tmp_path / "quiet.py").write_text("def test_quiet():\n    pass\n")
    (tmp_path / "manifest.toml").write_text(
        '[[defect]]\nname = "quiet"\nfile = "quiet.py"\ndetector = "guard"\ntest = "test_quiet"\n'
        'expect = "tried to open a real CAN bus"\ndescription = "not a defect at all"\n'
        '[[control]]\nname = "c"\nfile = "quiet.py"\ndescription = "d"\n'
    )
    entry = selftest.load_corpus(tmp_path)[0]
    outcome = selftest.run_entry(entry, operator_home=OPERATOR_HOME)
    assert not outcome.ok and outcome.verdict == "MISSED"
    assert outcome.evidence == "test_quiet passed: nothing caught it"
    text = selftest.render([outcome])
    assert text.startswith("selftest: FAILED - caught 0/1") and "MISSED" in text
    assert "| `quiet` | not a defect at all | guard | MISSED |" in selftest.render_markdown([outcome])


def test_a_control_that_is_not_clean_names_its_failing_tests_and_their_differences(tmp_path):
    """canarchy's corpus under python-dateutil's settings (canarchy_scrub_prefixes = DATEUTIL_ CAN_, no
    CANARCHY_): the control failed saying only "hostile run exit code 1; parity different (exit code 1)"."""
    from canarchy.testing.lanes.project import Project

    [entry] = [e for e in selftest.load_corpus(CORPUS) if e.is_control]
    settings = Project(tmp_path, (), tmp_path, ("tests",), (), operator_home=OPERATOR_HOME, leaks=CORPUS,
                       uses_plugin=True, scrub_prefixes=("DATEUTIL_", "CAN_"),
                       plugin_ini=(("canarchy_scrub_prefixes", "DATEUTIL_ CAN_"),))
    outcome = selftest.run_entry(entry, operator_home=OPERATOR_HOME, settings=settings)
    assert not outcome.ok and outcome.verdict == "NOT CLEAN", outcome.evidence
    assert "hostile run exit code 1 (test_state_in_the_test_home failed: AssertionError: assert 'can9' is None)" \
        in outcome.evidence
    assert "parity different (exit code 1): test_state_in_the_test_home passed" in outcome.evidence
    assert "-> failed" in outcome.evidence


def test_the_corpus_runs_with_the_adopting_project_s_isolation_settings(tmp_path, capsys):
    """The corpus proves the project's own isolation: its canarchy_* options (not require_import: the corpus is
    not its code) are the corpus project's; a project whose configuration does not load the plugin fails."""
    import argparse

    from canarchy.testing.lanes.project import Project

    settings = Project(tmp_path, (), tmp_path, ("tests",), (), operator_home=OPERATOR_HOME, leaks=CORPUS,
                       uses_plugin=True, plugin_ini=(("canarchy_guarded_paths", "'~/.tinyp'"),
                                                     ("canarchy_require_import", "true")))
    entry = selftest.load_corpus(CORPUS)[0]
    ini = (selftest._project(tmp_path / "entry", entry, settings) / "pytest.ini").read_text()
    assert "canarchy_guarded_paths = '~/.tinyp'\n" in ini and "canarchy_require_import" not in ini
    without = Project(tmp_path, (), tmp_path, ("tests",), (), operator_home=OPERATOR_HOME, leaks=CORPUS)
    assert selftest.main(without, argparse.Namespace(only=[entry.name]), []) == selftest.EXIT_MISSED
    assert "does not load canarchy.testing.isolation.plugin" in capsys.readouterr().out


@pytest.mark.parametrize("keys, said", [
    ('operator_home = "home"\n', "names no `leaks` ([tool"),
    ('leaks = "leaks"\n', "names no `operator_home` ([tool"),
    ("", "names no `leaks` and no `operator_home`"),
])
def test_without_its_corpus_or_its_operator_home_the_lane_names_the_key_missing(tmp_path, capsys, keys, said):
    """A project with an operator home for parity and no corpus was told it names "no `leaks` corpus or no
    `operator_home`": which of the two it lacks, the lane knows."""
    (tmp_path / "home").mkdir()
    (tmp_path / "leaks").mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.canarchy.lanes]\n" + keys)
    code = selftest.main(load_project(tmp_path), argparse.Namespace(only=[]), [])
    out = capsys.readouterr().out
    assert code == 2 and said in out, out
