"""canarchy.testing.lanes.mutation: the mutation runner, on small generated projects.

Each project is a git work tree under tmp_path with a package holding a guard,
the tests that should catch its removal, and a mutation file. The runner must
never write to that tree and must leave no temporary copy behind.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from canarchy.testing.lanes import __main__ as lanes_cli
from canarchy.testing.lanes import env as lane_env
from canarchy.testing.isolation.tree import WHOLE, changes, snapshot
from canarchy.testing.lanes import mutation, mutation_report
from canarchy.testing.lanes.mutation_file import load_mutation
from canarchy.testing.lanes import netns as lane_netns
from canarchy.testing.lanes import starts
from canarchy.testing.lanes.netns import NetnsSupport
from canarchy.testing.lanes.project import load_project

REPO = Path(__file__).resolve().parents[1]

GUARD = '''\
def decide(channel, default):
    """Reference mode unless a channel is typed (the guard under test)."""
    if channel is None:
        return "reference"
    return "active:" + (channel or default)
'''

TESTS = '''\
import pytest
from tinypkg.guard import decide

def test_killer():
    assert decide(None, "vcan7") == "reference"

def test_control():
    assert decide("can0", "vcan7") == "active:can0"

def test_unrelated():
    assert 1 + 1 == 2

@pytest.mark.parametrize("default", ["vcan7", "vcan8"])
def test_each_default(default):
    assert decide(None, default) == "reference"

@pytest.fixture
def reference_mode():
    assert decide(None, "vcan7") == "reference", "setup needs reference mode"

def test_needs_reference_mode_in_setup(reference_mode):
    pass

def test_slow(tmp_path):
    import os, time
    marker = os.environ.get("MARKER_FILE") or MARKER
    with open(marker + ".tmp", "w") as fh:  # renamed into place: a reader never sees it empty
        fh.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    time.sleep(60)

MARKER = {marker!r}
'''

SEARCH = '    if channel is None:\n        return "reference"\n'
REPLACE = "    # MUTANT: the guard is removed\n"
KILLER = "tests/test_guard.py::test_killer"
CONTROL = "tests/test_guard.py::test_control"


def _mutation_file(path: Path, *, search: str = SEARCH, replace: str = REPLACE, killers=(KILLER,), controls=(CONTROL,),
                   extra: str = "") -> Path:
    lines = [
        'name = "tiny-guard"',
        "issue = 1",
        'description = "remove the reference guard"',
        'file = "tinypkg/guard.py"',
        f"search = '''\n{search}'''",
        f"replace = '''\n{replace}'''",
        f"killers = {json.dumps(list(killers))}",
        f"controls = {json.dumps(list(controls))}",
    ]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return _project(tmp_path)


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the runner's temporary copies go, so the test can see they are removed."""
    root = tmp_path / "tmproot"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _run(project: Path, mutation_path: Path, timeout: float = 120) -> mutation.MutationResult:
    [result] = mutation.run_mutations(load_project(project), [load_mutation(mutation_path)],
                                      echo=lambda line: None, timeout=timeout)
    return result


def assert_tree_untouched(project: Path, before: dict, temp_root: Path) -> None:
    """The working tree is byte-identical and no temporary copy is left."""
    assert changes(before, snapshot(project, walk=WHOLE)) == []
    assert list(temp_root.iterdir()) == []


# --------------------------------------------------------------------------- one run, many mutations

BATCH_TESTS = """
import socket
from pathlib import Path
from tinypkg.guard import decide

def test_fails_unmutated():
    assert decide(None, "x") == "REFERENCE"

def test_no_stray_file():
    stray = Path(__file__).parent / "stray.txt"
    if decide(None, "x") != "reference":
        stray.write_text("leak")
    assert not stray.exists()

def test_in_namespace():
    assert decide(None, "x") == "reference"
    assert [name for _index, name in socket.if_nameindex()] == ["lo"]

REMEMBERED = {}

def test_remembers():
    REMEMBERED["k"] = 1

def test_recalls_what_was_remembered():
    assert REMEMBERED.get("k") == 1
"""

UNRELATED = "tests/test_guard.py::test_unrelated"
SETUP_KILLER = "tests/test_guard.py::test_needs_reference_mode_in_setup"
BROKEN = "    import tinypkg_no_such_module  # MUTANT: breaks every call, not the behaviour\n"
TYPED = ('    return "active:" + (channel or default)\n',
         '    return "active:" + default  # MUTANT: ignores the typed channel\n')
#: name -> what _mutation_file is given; run in this order on one copy with one baseline.
BATCH = {
    "phase-only": {"killers": (KILLER, UNRELATED, SETUP_KILLER)},
    "typed-channel": {"search": TYPED[0], "replace": TYPED[1], "killers": (CONTROL,), "controls": (KILLER,)},
    "import-error": {"replace": BROKEN},
    "two-edits": None,  # EDITS, with test_batch.py::test_no_stray_file writing into the copy
    "twice": {"search": "    return"},
    "absent": {"search": "    if channel is None and False:\n"},
    "failing-unmutated": {"killers": ("tests/test_batch.py::test_fails_unmutated",), "controls": ()},
    "in-namespace": {"killers": ("tests/test_batch.py::test_in_namespace",), "controls": (),
                     "extra": "needs_netns = true\n"},
    # a killer that passes only after another mutation's test: run with its own tests alone, it fails unmutated
    "setter-first": {"killers": ("tests/test_batch.py::test_remembers",), "controls": ()},
    "needs-a-setter": {"replace": "    # MUTANT needs-a-setter: the guard removed, which its killer never reads\n",
                       "killers": ("tests/test_batch.py::test_recalls_what_was_remembered",), "controls": ()},
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every mutation of BATCH in one :func:`mutation.run_mutations` call on a project under the plugin
    (whose private network namespace the needs_netns mutation relies on)."""
    base = tmp_path_factory.mktemp("batch")
    repo = _project(base)
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\nxfail_strict = true\n'
                                         'addopts = ["-p", "canarchy.testing.isolation.plugin"]\n'
                                         "canarchy_network_namespace = true\n")
    (repo / "tests" / "test_batch.py").write_text(BATCH_TESTS)
    definitions = []
    for name, given in BATCH.items():
        path = base / f"{name}.toml"
        if given is None:
            path.write_text(EDITS)
        else:
            _mutation_file(path, **given)
            path.write_text(path.read_text().replace('name = "tiny-guard"', f'name = "{name}"'))
        definitions.append(load_mutation(path))
    temp_root = base / "tmproot"
    temp_root.mkdir()
    before = snapshot(repo, walk=WHOLE)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(temp_root))
        results = mutation.run_mutations(load_project(repo), definitions, echo=lines.append, timeout=120)
    return {"results": {r.mutation.name: r for r in results}, "lines": lines, "repo": repo, "before": before,
            "temp_root": temp_root, "in order": [r.mutation.name for r in results]}


def test_one_baseline_results_in_order_and_the_tree_untouched(batch):
    assert batch["in order"] == list(BATCH)
    assert sum(line.startswith("mutations: working on") for line in batch["lines"]) == 1
    assert_tree_untouched(batch["repo"], batch["before"], batch["temp_root"])


def test_a_mutant_caught_by_every_killer_is_killed(batch):
    """The second mutant ran on a restored copy: the first one's guard is back, so its control passes."""
    result = batch["results"]["typed-channel"]
    assert (result.status, result.exit_code) == ("killed", 0), result.reason
    rows = {r.node_id: (r.baseline, r.mutant, r.verdict) for r in result.rows}
    assert rows == {CONTROL: ("passed", "failed", "killed"), KILLER: ("passed", "passed", "passes (ok)")}
    assert "killed by 1/1: test_control" in mutation_report.render(result)
    # The import proof saw the mutant in the temporary copy, and the pytest run import from it.
    assert result.imported[0].startswith(str(batch["temp_root"])) and result.imported[0].endswith("tinypkg/guard.py")
    assert len(result.importers) == 1 and "pytest" in result.importers[0]


def test_only_a_test_phase_failure_counts_as_a_kill(batch):
    result = batch["results"]["phase-only"]
    assert result.status == "survived" and result.exit_code == 1
    verdicts = {r.node_id: (r.mutant, r.verdict) for r in result.rows if r.role == "killer"}
    assert verdicts == {
        KILLER: ("failed", "killed"),
        UNRELATED: ("passed", "SURVIVED"),
        SETUP_KILLER: ("error", "not killed: error outside the test phase"),
    }
    assert "killed by 1/3: test_killer" in mutation_report.render(result)


def test_import_error_is_not_a_kill_and_a_broken_control_cannot_decide(batch):
    result = batch["results"]["import-error"]
    rows = {r.node_id: (r.mutant, r.verdict) for r in result.rows}
    assert rows[KILLER] == ("failed", "not killed: failed with ModuleNotFoundError")
    assert rows[CONTROL] == ("failed", "BROKEN")
    assert result.status == "cannot decide" and result.exit_code == 2
    assert "controls failed on the mutant" in result.reason


def test_several_edits_and_a_copy_dirtied_by_a_mutant(batch):
    """[[edits]]: two search/replace pairs in one mutation; a mutant whose tests write into the tree
    gets a fresh copy before the next mutation."""
    result = batch["results"]["two-edits"]
    assert [e.search for e in result.mutation.edits] == ["    if channel is None:\n", '        return "reference"\n']
    assert result.status == "killed", result.reason
    dirtied = [line.split(":")[0] for line in batch["lines"] if "its tests changed the copy" in line]
    assert dirtied == ["mutation two-edits"], batch["lines"]  # restoring a mutated file is no change
    assert not (batch["repo"] / "tests" / "stray.txt").exists()


@pytest.mark.parametrize("name, count", [("twice", 2), ("absent", 0)])
def test_search_must_occur_exactly_once(batch, name, count):
    result = batch["results"][name]
    assert result.status == "cannot decide" and f"occurs {count} times (exactly 1 required)" in result.reason


def test_killer_failing_unmutated_cannot_decide(batch):
    result = batch["results"]["failing-unmutated"]
    assert result.status == "cannot decide"
    assert result.reason.startswith("baseline: these must pass on the unmutated code first")
    assert result.rows[0].baseline == "failed"


def test_a_mutation_that_needs_a_namespace_runs_in_the_plugin_s(batch):
    """The lane does not wrap pytest in a namespace of its own: the project's isolation makes one;
    where none can be made, the mutation cannot decide (it never runs unprotected)."""
    result = batch["results"]["in-namespace"]
    if lane_netns.netns_support().available:
        assert result.status == "killed", result.reason
    else:
        assert result.status == "cannot decide" and "needs the private network namespace" in result.reason


def test_the_summary_has_one_row_per_mutation(batch):
    results = list(batch["results"].values())
    table = mutation_report.render_summary(results).splitlines()
    assert table[0].startswith(f"mutations: {sum(r.status == 'killed' for r in results)}/{len(BATCH)} killed")
    rows = {line.split()[0]: line.split()[1:4] for line in table[4:] if line.strip()}
    assert rows["typed-channel"] == ["1", "1", "KILLED"] and rows["phase-only"] == ["3", "1", "SURVIVED"]
    assert rows["twice"] == ["1", "0", "CANNOT"]
    md = mutation_report.render_summary_markdown(results)
    assert md.startswith("# Mutations: FAILED") and "| [typed-channel](mutation-typed-channel.md) |" in md


def _project(base: Path) -> Path:
    """A tiny git work tree: tinypkg/guard.py, its tests, a pyproject and an ignored file."""
    repo = base / "repo"
    (repo / "tinypkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\nxfail_strict = true\n')
    (repo / "tinypkg" / "__init__.py").write_text("")
    (repo / "tinypkg" / "guard.py").write_text(GUARD)
    (repo / "tests" / "test_guard.py").write_text(TESTS.format(marker=str(base / "slow.marker")))
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "ignored.txt").write_text("must not be copied\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True, capture_output=True)
    return repo


def test_the_copy_runs_with_the_pytest_configuration_wherever_the_project_keeps_it(project, temp_root, tmp_path):
    """A project whose pytest configuration is in tox.ini (``filterwarnings = error``): the mutant's warning
    fails the killer as in the project's own runs; read from pyproject.toml alone it would survive."""
    (project / "pyproject.toml").write_text('[project]\nname = "tinypkg"\n')
    (project / "tox.ini").write_text("[tox]\nenvlist = py\n\n[pytest]\nxfail_strict = true\nfilterwarnings =\n"
                                     "    error\n")
    replace = ('    import warnings\n    warnings.warn("reference mode is going away", DeprecationWarning)\n'
               '    if channel is None:\n        return "reference"\n')
    result = _run(project, _mutation_file(tmp_path / "m.toml", replace=replace, controls=()))
    assert result.status == "killed", result.reason


def test_a_parametrized_killer_named_without_its_case_cannot_decide_naming_the_cases(project, temp_root, tmp_path):
    result = _run(project, _mutation_file(tmp_path / "m.toml", killers=("tests/test_guard.py::test_each_default",),
                                          controls=()))
    assert result.status == "cannot decide"
    assert "named without its case" in result.reason and "test_each_default[vcan7], test_each_default[vcan8]" in \
        result.reason, result.reason


def test_the_mutant_run_s_output_is_kept_and_the_verdict_said_after_the_baseline(project, temp_root, tmp_path,
                                                                                   capsys):
    """``reports/mutation-<name>-mutant.log``: the killers' failures on the mutant, for a reader to check that
    they fail for the right reason; the progress lines give the verdict only once the baseline is in."""
    code = lanes_cli.main(["--project", str(project), "mutation", str(_mutation_file(tmp_path / "m.toml")),
                           "--timeout", "120"])
    out = capsys.readouterr().out
    assert code == 0, out
    log = (project / "reports" / "mutation-tiny-guard-mutant.log").read_text()
    assert "test_killer" in log and "AssertionError" in log and "1 failed, 1 passed" in log, log
    assert out.index("the verdict waits for its baseline") < out.index("mutation tiny-guard: KILLED\n"), out


def test_a_doctest_text_file_is_a_killer_like_any_test(project, temp_root, tmp_path):
    """A killer that is no Python module's test (``tests/test_guard.txt::test_guard.txt``, a doctest of
    ``--doctest-glob``; a YAML case of pytest-mypy-plugins): its JUnit key keeps the file's suffix
    (``tests.test_guard.txt``), so the lane that looked for ``tests/test_guard.txt::...`` unchanged said
    "not run (no such test?)" of a test that ran, and could not decide."""
    (project / "tests" / "test_guard.txt").write_text(
        ">>> from tinypkg.guard import decide\n>>> decide(None, 'vcan7')\n'reference'\n")
    killers = (KILLER, "tests/test_guard.txt::test_guard.txt")
    result = _run(project, _mutation_file(tmp_path / "m.toml", killers=killers))
    assert result.status == "killed", result.reason


def test_unknown_node_id_selects_nothing_and_cannot_decide(project, temp_root, tmp_path):
    lines: list[str] = []
    [result] = mutation.run_mutations(load_project(project), [load_mutation(_mutation_file(
        tmp_path / "m.toml", killers=("tests/test_guard.py::test_no_such_test",), controls=()))], echo=lines.append,
        timeout=120)
    assert result.status == "cannot decide"
    # nothing waits for the baseline: the progress line said so, with "0/1 killers failed" as if it had run
    assert "mutation tiny-guard: mutant run done; it cannot decide" in lines, lines
    assert not any("waits for its baseline" in line for line in lines), lines
    assert "baseline" in result.reason and "not run" in result.reason, result.reason
    assert "ERROR: not found:" in result.reason and "test_no_such_test" in result.reason  # pytest's own words
    assert "not found: tests/test_guard.py::test_no_such_test" in result.reason, result.reason  # as the project's


CHILD_TEST = """
import os, subprocess, sys

def test_child_says_reference():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([{stale!r}, os.environ.get("PYTHONPATH", "")]))
    code = "from tinypkg.guard import decide; print(decide(None, 'vcan7'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd={elsewhere!r}, capture_output=True, text=True)
    assert out.stdout.strip() == "reference", out.stderr
"""


def test_a_child_that_imports_a_stale_copy_makes_the_mutation_undecidable(project, temp_root, tmp_path):
    """A stale copy of the package placed first on a killer's child's sys.path would test
    unmutated code (a wrong SURVIVED): the child's own import report names it."""
    stale = tmp_path / "stale"
    (stale / "tinypkg").mkdir(parents=True)
    (stale / "tinypkg" / "__init__.py").write_text("")
    (stale / "tinypkg" / "guard.py").write_text(GUARD)
    (tmp_path / "elsewhere").mkdir()
    (project / "tests" / "test_child.py").write_text(CHILD_TEST.format(stale=str(stale),
                                                                        elsewhere=str(tmp_path / "elsewhere")))
    killers = ("tests/test_child.py::test_child_says_reference",)
    result = _run(project, _mutation_file(tmp_path / "m.toml", killers=killers, controls=()))
    assert result.status == "cannot decide", mutation_report.render(result)
    assert f"imported tinypkg from {stale}" in result.reason and "not from the copy" in result.reason
    assert "-c from tinypkg.guard import decide" in result.reason  # the process is named by its argv


BLIND_TESTS = """
import os, subprocess, sys
from tinypkg.guard import decide

CHECKOUT = {checkout!r}  # stands for an editable install's .pth file: the unmutated checkout on sys.path
BLIND = f"import sys; sys.path.insert(0, {{CHECKOUT!r}}); from tinypkg.guard import decide; print(decide(None, 'v'))"

def says(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, **kwargs).stdout.strip()

def test_isolated_child():
    assert says([sys.executable, "-I", "-c", BLIND]) == "reference"

def test_empty_environment_child():
    assert says([sys.executable, "-c", BLIND], env={{}}) == "reference"

def test_shell_child():
    assert says(f"{{sys.executable}} -I -c \\"{{BLIND}}\\"", shell=True) == "reference"

def test_normal_child():
    assert says([sys.executable, "-c", "from tinypkg.guard import decide; print(decide(None, 'v'))"]) == "reference"
"""


def test_a_survivor_whose_killer_started_a_python_the_proof_cannot_see_cannot_decide(project, temp_root, tmp_path):
    """A killer's child started with -I, with env={} or through a shell skips the import-proof hook and here
    imports the unmutated checkout: its mutant is not SURVIVED but CANNOT DECIDE, naming the child and why.
    A child that inherits the run's environment reports itself, and its kill stands."""
    (project / "tests" / "test_blind.py").write_text(BLIND_TESTS.format(checkout=str(project)))
    names = {"isolated": "-I (isolated mode) ignores PYTHONPATH", "empty-environment": "the environment it was given "
             "lacks PYTEST_CANARCHY_IMPORT_PROOF/_PACKAGES and PYTHONPATH with", "shell": "a shell", "normal": None}
    definitions = []
    for name in names:
        path = _mutation_file(tmp_path / f"{name}.toml", controls=(),
                              killers=(f"tests/test_blind.py::test_{name.replace('-', '_')}_child",))
        path.write_text(path.read_text().replace('name = "tiny-guard"', f'name = "{name}"'))
        definitions.append(load_mutation(path))
    results = {r.mutation.name: r for r in mutation.run_mutations(load_project(project), definitions,
                                                                   echo=lambda line: None, timeout=120)}
    for name, why in names.items():
        result = results[name]
        if why is None:
            assert result.status == "killed" and not result.unseen, mutation_report.render(result)
            assert any("-c from tinypkg.guard import decide" in i for i in result.importers), result.importers
            continue
        assert result.status == "cannot decide", mutation_report.render(result)
        assert [r.verdict for r in result.rows] == ["SURVIVED"]  # the killer's child did test the checkout
        assert "could not see these processes" in result.reason and why in result.reason, result.reason
        assert f"{sys.executable} " in result.reason and "sys.path.insert" in result.reason  # the command line
        assert "not seen by the import proof: 1 process(es)" in mutation_report.render(result)
    assert list(temp_root.iterdir()) == []


@pytest.mark.parametrize(("argv", "env", "why"), [
    (["python3", "-c", "x"], None, None),
    (["python3", "-X", "dev", "-W", "error", "-m", "S"], None, None),  # option values and module names are not flags
    (["/venv/bin/python3.11", "-Ic", "x"], None, "-I (isolated mode)"),
    (["python", "-sE", "t.py"], None, "-E ignores PYTHONPATH"),
    (["python", "-S", "t.py"], None, "-S skips the site module"),
    (["python", "t.py"], {}, "lacks PYTEST_CANARCHY_IMPORT_PROOF/_PACKAGES and PYTHONPATH with"),
    (["python", "t.py"], {"PYTHONPATH": "/elsewhere"}, "PYTHONPATH with"),
    (["python", "t.py"], {"PYTHONPATH": "{copy_hook}:{hook}"}, None),  # the plugin puts the copy's hook first
    (["python", "t.py"], {"PYTHONPATH": "{other}:{hook}"}, "before any other sitecustomize"),
    (["/bin/sh", "-c", "python -c x"], None, "a shell"),
    (["env", "-i", "python", "x.py"], None, "`env -i python x.py` may start a Python in another environment"),
    (["env", "python", "-I", "x.py"], None, "-I (isolated mode)"),
    (["timeout", "5", "python3", "-E", "x.py"], None, "-E ignores PYTHONPATH"),
    (["git", "status"], {}, None),  # a compiled program: not followed (a documented limit)
])
def test_which_started_processes_the_import_proof_cannot_follow(tmp_path, argv, env, why):
    hook = mutation.HOOK_DIR
    hooked = {"PYTHONPATH": f"{hook}:/copy", "PYTEST_CANARCHY_IMPORT_PROOF": str(tmp_path),
              "PYTEST_CANARCHY_IMPORT_PACKAGES": "pkg", "PATH": "/usr/bin:/bin"}
    for name, text in (("copy_hook", (hook / "sitecustomize.py").read_text()), ("other", "print('other')\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sitecustomize.py").write_text(text)
    if env and "PYTHONPATH" in env:
        env = dict(hooked, PYTHONPATH=env["PYTHONPATH"].format(hook=hook, copy_hook=tmp_path / "copy_hook",
                                                                other=tmp_path / "other"))
    start = {"event": "subprocess.Popen", "program": argv[0], "argv": argv, "cwd": str(tmp_path),
             "env_given": env is not None, "env": hooked if env is None else env}
    found = starts.unseen([start], proof=tmp_path, packages=["pkg"], hook_dir=hook)
    if why is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(" ".join(argv)) and why in found[0], found


def test_a_script_s_interpreter_line_is_judged_as_its_command(tmp_path):
    script = tmp_path / "tool"
    script.write_text("#!/usr/bin/env -S python3 -I\nprint(1)\n")
    start = {"event": "subprocess.Popen", "program": "tool", "argv": ["tool"], "cwd": str(tmp_path),
             "env_given": False, "env": {"PATH": str(tmp_path)}}
    [found] = starts.unseen([start], proof=tmp_path, packages=["pkg"], hook_dir=mutation.HOOK_DIR)
    assert "a script run by `#!/usr/bin/env -S python3 -I`: -I (isolated mode)" in found


def test_untracked_files_are_copied_and_ignored_ones_are_not(project):
    from canarchy.testing.lanes.workspace import tree_files

    (project / "notes.md").write_text("untracked, not ignored\n")
    files = tree_files(project)
    assert "notes.md" in files and "tinypkg/guard.py" in files
    assert "ignored.txt" not in files


def test_an_interrupt_midway_removes_the_copy_and_leaves_the_tree_untouched(project, tmp_path):
    """Start the runner in a subprocess, SIGTERM it while a slow killer sleeps (SIGINT: tests/test_order.py)."""
    signum = signal.SIGTERM
    temp_root = tmp_path / "tmproot"
    temp_root.mkdir()
    marker = tmp_path / "slow.marker"
    path = _mutation_file(tmp_path / "m.toml", killers=("tests/test_guard.py::test_slow",), controls=())
    before = snapshot(project, walk=WHOLE)
    (tmp_path / "home").mkdir()  # not tmp_path: a TMPDIR inside the home would be moved out of it
    env = lane_env.build_env(home=tmp_path / "home", extra={"TMPDIR": str(temp_root), "PYTHONPATH": str(REPO)})
    runner = subprocess.Popen(
        [sys.executable, "-m", "canarchy.testing.lanes", "--project", str(project), "mutation", str(path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline and runner.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), "the slow killer never started"
        assert any(temp_root.iterdir()), "the runner should be working in the temporary root"
        runner.send_signal(signum)
        output, _ = runner.communicate(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == 128 + signum, output
    assert f"mutation: interrupted by {signal.Signals(signum).name}; every process it started was stopped" in output
    assert "Traceback" not in output
    assert_tree_untouched(project, before, temp_root)
    child = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the interrupted pytest run was left running"


def test_a_timeout_cannot_decide_and_cleans_up(project, temp_root, tmp_path):
    """A killer that outlives the per-run timeout: cannot decide, child stopped, copy removed, tree untouched."""
    marker = tmp_path / "slow.marker"
    path = _mutation_file(tmp_path / "m.toml", killers=("tests/test_guard.py::test_slow",), controls=())
    before = snapshot(project, walk=WHOLE)
    result = _run(project, path, timeout=1)
    assert result.status == "cannot decide" and "ran over 1 s" in result.reason
    assert_tree_untouched(project, before, temp_root)
    if marker.exists():  # on a loaded machine pytest may not even have reached the test in 1 s
        child = int(marker.read_text())
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the timed-out pytest run was left running"


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return "\nState:\tZ" not in status


# --------------------------------------------------------------------------- definitions


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace('name = "tiny-guard"\n', ""), "missing keys ['name']"),
        (lambda t: t + 'surprise = 1\n', "unknown keys ['surprise']"),
        (lambda t: t.replace("# MUTANT: the guard is removed\n", ""), "`replace` must be a non-empty string"),
        (lambda t: t.replace('killers = ["tests/test_guard.py::test_killer"]', "killers = []"), "`killers` is empty"),
        (lambda t: t.replace('controls = ["tests/test_guard.py::test_control"]',
                             'controls = ["tests/test_guard.py::test_killer"]'), "listed twice"),
        (lambda t: t.replace('file = "tinypkg/guard.py"', 'file = "../outside.py"'), "without '..'"),
        (lambda t: t + '[kill]\nrequires = "error"\n', "must be \"failure\""),
        (lambda t: t + '[kill]\nexcluded_exceptions = ["not a name"]\n', "list of exception names"),
    ],
)
def test_invalid_definitions_are_refused(tmp_path, edit, message):
    path = _mutation_file(tmp_path / "m.toml")
    path.write_text(edit(path.read_text()))
    with pytest.raises(mutation.CannotDecide) as info:
        load_mutation(path)
    assert message in str(info.value)


def test_issue_530_definition_matches_the_current_code():
    """The #530 mutation still applies exactly once (so `nox -s mutation-530` can decide)."""
    root = Path(__file__).resolve().parents[1]
    definition = load_mutation(root / "fixtures" / "mutations" / "issue-530.toml")
    assert definition.files == ("canarchy/cli.py",)
    assert load_project(root).module_of("canarchy/cli.py") == "canarchy.cli"
    [edit] = definition.edits
    assert (root / edit.file).read_text(encoding="utf-8").count(edit.search) == 1
    assert definition.killers
    assert definition.controls == ("tests/test_uds_services.py::test_ref05_typed_channel_goes_active",)
    for node_id in definition.killers + definition.controls:
        path, name = node_id.split("::", 1)
        assert f"def {name}(" in (root / path).read_text(encoding="utf-8"), node_id


def test_cli_run_all_reports_the_worst_outcome(project, temp_root, tmp_path, capsys):
    """The command line over a folder: each definition's table, the summary, reports; the worst exit code.
    (Definitions that cannot apply start no pytest; a killed mutant's row:
    test_the_summary_has_one_row_per_mutation.)"""
    folder = tmp_path / "mutations"
    folder.mkdir()
    b = _mutation_file(folder / "b.toml", search="    no such code\n")
    b.write_text(b.read_text().replace('name = "tiny-guard"', 'name = "stale"'))
    (folder / "c.toml").write_text("not toml [")
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    code = lanes_cli.main(["--project", str(project), "mutation", str(folder), "--timeout", "120"])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before, "a lane handler survived"
    assert code == 2
    out = capsys.readouterr().out
    assert "mutations: 0/2 killed by every named killer" in out
    table = out[out.index("mutations: 0/2"):].splitlines()
    assert table[2].split()[:3] == ["mutation", "killers", "expected"]
    rows = {line.split()[0]: line.split()[1:4] for line in table[4:] if line.strip()}
    assert rows["stale"] == ["1", "0", "CANNOT"] and "occurs 0 times" in out
    assert rows["c"] == ["0", "0", "CANNOT"] and "c.toml: cannot read the mutation" in out
    md = (project / "reports" / "mutations.md").read_text()
    assert md.startswith("# Mutations: FAILED (0/2 killed)") and "| [stale](mutation-stale.md) |" in md
    assert (project / "reports" / "mutation-stale.md").is_file()
    assert list(temp_root.iterdir()) == []


EDITS = """\
name = "two-edits"
issue = 1
description = "d"
file = "tinypkg/guard.py"
killers = ["tests/test_guard.py::test_killer", "tests/test_batch.py::test_no_stray_file"]
[[edits]]
search = '''
    if channel is None:
'''
replace = '''
    if channel == "never":  # MUTANT 1
'''
[[edits]]
search = '''
        return "reference"
'''
replace = '''
        return "reference"  # MUTANT 2
'''
"""

def test_edits_and_search_together_are_refused(tmp_path):
    path = tmp_path / "m.toml"
    both = "file = \"tinypkg/guard.py\"\nsearch = 'x'\nreplace = 'y'\n"
    path.write_text(EDITS.replace('file = "tinypkg/guard.py"\n', both))
    with pytest.raises(mutation.CannotDecide, match="not both"):
        load_mutation(path)


def test_a_mutation_that_needs_a_namespace_cannot_decide_without_one(project, temp_root, tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "netns_support", lambda: NetnsSupport(False, "not root"))
    result = _run(project, _mutation_file(tmp_path / "m.toml", extra="needs_netns = true\n"))
    assert result.status == "cannot decide" and "needs the private network namespace" in result.reason
    assert list(temp_root.iterdir()) == []


REGISTRY = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "mutations").glob("*.toml"))


@pytest.mark.parametrize("path", REGISTRY, ids=[p.stem for p in REGISTRY])
def test_every_registered_mutation_matches_the_current_code(path):
    """Each definition in fixtures/mutations/ loads, applies exactly once (edit by edit) and names
    tests that exist, so `nox -s mutations` can decide; the names are unique."""
    root = REPO
    definition = load_mutation(path)
    assert definition.name == path.stem
    texts = {}
    for edit in definition.edits:
        text = texts.get(edit.file) or (root / edit.file).read_text(encoding="utf-8")
        assert text.count(edit.search) == 1, f"{path.name}: {edit.search!r}"
        assert "MUTANT" in edit.replace, f"{path.name}: mark the mutant so the import proof can recognise it"
        texts[edit.file] = text.replace(edit.search, edit.replace, 1)
    for node_id in definition.killers + definition.controls:
        file, name = node_id.split("::", 1)
        assert f"def {name.split('[')[0]}(" in (root / file).read_text(encoding="utf-8"), node_id


def test_the_registry_covers_every_protection():
    """Each protection has a mutation."""
    names = {p.stem for p in REGISTRY}
    assert {
        "issue-530", "reference-no-transport", "active-ack-gate", "iso-home-redirect", "iso-test-home",
        "iso-canarchy-scrub", "iso-can-scrub", "iso-import-time-redirect", "iso-session-layer",
        "iso-guard-by-name", "iso-guard-class", "iso-unswallowable-refusal", "iso-child-guard",
        "iso-sentinel", "iso-test-cwd", "iso-env-restore", "iso-access-guard", "iso-access-children",
        "iso-containment", "iso-putenv", "iso-environ-replaced", "iso-python-can-globals", "iso-signal-handlers",
        "iso-umask", "iso-stale-bus", "iso-import-time-containers", "iso-stuck", "iso-earliest-start",
        "iso-required-import", "iso-stray-config", "iso-pins", "iso-seal", "iso-frozen-markers", "iso-dir-descriptor",
        "iso-inherited-fds", "iso-temp-base", "iso-readonly-trees", "iso-bytecode", "iso-bytecode-check",
        "iso-driver-init", "iso-late-refusal", "iso-start-up-environ", "iso-worker-problems",
        "iso-fixture-setup-refusal", "iso-at-exit", "iso-thread-reuse",
    } <= names


RENDEZVOUS = """
import os, time
from pathlib import Path
from tinypkg.guard import decide

def test_meets_the_other_run():
    here = Path({where!r})
    (here / str(os.getpid())).write_text(os.getcwd())
    deadline = time.monotonic() + 60  # a bound against a hang, not a speed target
    while len(list(here.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(here.iterdir())) == 2, "the baseline and the mutant did not run at the same time"
    assert decide(None, "vcan7") == "reference"
"""


@pytest.mark.parametrize(("available", "expected"), [(1, 1), (2, 2), (4, 4), (64, 4)])
def test_by_default_one_run_per_core_and_never_more_than_four(monkeypatch, available, expected):
    """Each job is a whole pytest run on a copy of the tree: a large machine must not start dozens."""
    monkeypatch.setattr(mutation, "cores", lambda: available)
    assert mutation.default_jobs() == expected


def test_the_baseline_and_the_mutant_run_at_once_each_on_a_copy_of_its_own(project, temp_root, tmp_path):
    """Its killer waits for the other run to start: it passes unmutated only if the mutant's run
    started meanwhile, on another copy of the tree."""
    where = tmp_path / "runs"
    where.mkdir()
    (project / "tests" / "test_overlap.py").write_text(RENDEZVOUS.format(where=str(where)))
    path = _mutation_file(tmp_path / "m.toml", killers=("tests/test_overlap.py::test_meets_the_other_run",),
                          controls=())
    [result] = mutation.run_mutations(load_project(project), [load_mutation(path)],
                                      echo=lambda line: None, timeout=120, jobs=2)
    assert result.status == "killed", result.reason
    assert [r.baseline for r in result.rows] == ["passed"]
    copies = {p.read_text() for p in where.iterdir()}
    assert len(copies) == 2 and all(c.startswith(str(temp_root)) for c in copies), copies


def test_a_killer_that_fails_without_the_mutation_when_run_with_its_own_tests_alone_decides_nothing(batch):
    """Each mutant runs only its own tests: its baseline does too, so a killer that passed only after another
    mutation's test (a state-setter) is seen failing unmutated, not credited with a kill."""
    result = batch["results"]["needs-a-setter"]
    assert result.status == "cannot decide", (result.status, result.reason)
    assert "baseline" in result.reason and "test_recalls_what_was_remembered (failed)" in result.reason


def test_a_killer_whose_source_names_an_excluded_exception_still_kills():
    """A killer failed with ValueError, and its source, which the traceback shows, handles an ImportError: the
    lane took it for a mutant that broke an import (not killed). Only what pytest says was raised counts."""
    from canarchy.testing.lanes.mutation import _wrong_reason
    from canarchy.testing.lanes.results import Case, ResultElement

    traceback = ('    launcher.write_text("try: ...except ImportError: ...")\n>       late = output[...]\n'
                 "E       ValueError: substring not found\n")
    killed = Case("t", "failed", (ResultElement("failure", None, "ValueError: substring not found", traceback,
                                                "call"),))
    broken = Case("t", "failed", (ResultElement("failure", None, "ModuleNotFoundError: No module named 'x'",
                                                "E   ModuleNotFoundError: No module named 'x'\n", "call"),))
    excluded = ("ImportError", "ModuleNotFoundError", "SyntaxError")
    assert (_wrong_reason(killed, excluded), _wrong_reason(broken, excluded)) == (None, "ModuleNotFoundError")
