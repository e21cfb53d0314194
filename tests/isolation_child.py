"""Run a small test project in a child pytest under canarchy's plugin, as an operator would.

The child gets the hostile operator environment the parity lane uses: a copy of
``fixtures/operator-home`` (a real-looking ``~/.canarchy`` with config, caches and old
findings, ``~/.canrc`` and ``~/can.conf`` naming socketcan) and the variables of
``canarchy.testing.lanes.env.HOSTILE_ENV`` exported. The child's plugin must isolate its
tests from all of it; the parent asserts on the child's JUnit report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from canarchy.testing.lanes.env import hostile_env
from tests.helpers import PYTEST

REPO = Path(__file__).resolve().parents[1]
OPERATOR_HOME = REPO / "fixtures" / "operator-home"


def make_operator_home(base: Path) -> Path:
    """A copy of the hostile operator home (``fixtures/operator-home``) at ``base/operator-home``."""
    return Path(shutil.copytree(OPERATOR_HOME, base / "operator-home", ignore=shutil.ignore_patterns("README.md")))


@dataclass
class ChildRun:
    """The outcome of one child pytest: exit code, output, and per-test results
    ``{test name: (outcome, message)}`` with outcome passed/failed/error/skipped."""

    returncode: int
    output: str
    results: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    home: Path | None = None
    modules: dict[str, set[str]] = field(default_factory=dict)  # test name -> the JUnit classnames holding it

    def outcomes(self, name: str) -> set[str]:
        return {outcome for outcome, _ in self.results.get(name, [])}

    def messages(self, name: str) -> str:
        return "\n".join(message for _, message in self.results.get(name, []))


def operator_environment(home: Path, hostile: bool = True) -> dict[str, str]:
    """A shell as an operator has it: their HOME, no test-harness variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "CANARCHY_", "CAN_")) and k not in ("PYTHONPATH",)}
    env.update({"HOME": str(home), "USERPROFILE": str(home), "PYTHONDONTWRITEBYTECODE": "1"})
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "APPDATA", "LOCALAPPDATA"):
        env.pop(name, None)
    if hostile:
        env.update(hostile_env(home))
    env["PYTHONPATH"] = str(REPO)
    return env


def run_child(base: Path, files: dict[str, str], *args: str, hostile: bool = True,
              env: dict[str, str] | None = None, timeout: float = 120, pass_fds: tuple[int, ...] = (),
              stdin: int | None = None, program: tuple[str, ...] = PYTEST) -> ChildRun:
    """Write ``files`` (name -> source, dedented) into a project under ``base``
    and run pytest there with canarchy's plugin and an operator environment (``stdin``: a descriptor its
    standard input is a copy of; ``program``: how pytest is started, :data:`~tests.helpers.PYTEST`'s way)."""
    project = base / "project"
    project.mkdir(parents=True, exist_ok=True)
    files = {"conftest.py": 'pytest_plugins = ["canarchy.testing.isolation.plugin"]\n', **files}
    for name, source in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(textwrap.dedent(source))
    home = make_operator_home(base)
    run_env = operator_environment(home, hostile)
    run_env.update(env or {})
    report = base / "child-report.xml"
    # the CHILD_* variables hand a child test the operator's paths it must find refused or empty
    command = [*program, "-q", "--strict-markers", f"--junitxml={report}", "--rootdir", str(project),
               "-o", "canarchy_keep_variables=CHILD_", *args]
    proc = subprocess.run(command, cwd=project, env=run_env, capture_output=True, text=True, timeout=timeout,
                          pass_fds=pass_fds, stdin=stdin)
    run = ChildRun(proc.returncode, proc.stdout + proc.stderr, home=home)
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("name")
            run.modules.setdefault(name, set()).add(case.get("classname", ""))
            entries = []
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed"}.get(child.tag, child.tag)
                    entries.append((outcome, (child.get("message") or "") + "\n" + (child.text or "")))
            run.results.setdefault(name, []).extend(entries or [("passed", "")])
    return run


def run_batch(base: Path, files: dict[str, str], *args: str, env: dict[str, str] | None = None,
              timeout: float = 300) -> tuple[ChildRun, list[str]]:
    """One child pytest carrying many independent test files (``run_child``'s arguments),
    and the changes it left in the operator home (empty when it left it byte-identical).

    The report is read by test name, so a name two modules share is refused. A run that
    times out is returned as a run, not raised: each test that reads it then fails on its
    own assertions instead of erroring at setup."""
    from canarchy.testing.isolation.tree import content_differences

    pristine = make_operator_home(base / "pristine")
    try:
        run = run_child(base, files, *args, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        parts = (part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                 for part in (expired.stdout, expired.stderr))
        run = ChildRun(-1, f"the child pytest timed out after {timeout} s\n" + "".join(parts),
                       home=base / "operator-home")
    shared = {name: sorted(modules) for name, modules in run.modules.items() if len(modules) > 1}
    assert not shared, f"test names shared by several modules of one batch: {shared}"
    return run, content_differences(pristine, run.home)
