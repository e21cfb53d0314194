"""Wall time of the nox lanes (issue #6, item 2).

Warm: ``nox --install-only -s unit parity mutation-530`` first (not timed), so
every lane's virtualenv exists and is installed; then ``nox -R -s LANE``
(reuse the environment, skip the install) ``runs`` times per lane,
interleaved. Cold: ``git clone`` of the checkout into a temporary directory
(the committed ``HEAD``; uncommitted changes are not in it), then
``nox -s unit`` there: virtualenv creation, ``pip install -e .[test]`` and
the suite. pip's own cache is left as the machine has it.

nox is the caller's (``--nox-python``: the interpreter that runs nox; the
bench lane passes its own nox's), run with the caller's environment minus
the bench lane's virtualenv, so a nested lane is built exactly as
``nox -s LANE`` from a shell would build it. Each lane builds its own
allow-listed environment and disposable home (``docs/design/verification-harness.md``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence

from benchmarks import measure

LANES = ("unit", "parity", "mutation-530")
#: A lane's one-line verdict (``unit: PASSED - ...``, ``parity: IDENTICAL``, ``mutation issue-530 ...: KILLED``).
_VERDICT = re.compile(r"^(unit|parity|integration|mutation[\w .()-]*): [A-Z][A-Z ]+\b")


@dataclass
class LaneRuns:
    """One lane's timed runs: wall seconds, CPU seconds (nox and every process it
    waited for), exit codes and the verdict line each printed."""

    lane: str
    cold: bool = False
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)

    @property
    def all_passed(self) -> bool:
        return bool(self.exit_codes) and all(code == 0 for code in self.exit_codes)


def verdict_line(output: str) -> str:
    """The last lane verdict line in ``output`` (without nox's ``nox >`` prefix), or ``""``."""
    found = ""
    for raw in output.splitlines():
        line = raw.strip()
        if line.startswith("nox > "):
            line = line[len("nox > "):]
        if _VERDICT.match(line):
            found = line
    return found


def nox_env(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without the bench lane's virtualenv (``VIRTUAL_ENV``
    and its ``bin`` on ``PATH``) and without a byte-code prefix."""
    env = dict(os.environ if source is None else source)
    venv = env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if venv:
        scripts = {str(Path(venv) / "bin"), str(Path(venv) / "Scripts")}
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p not in scripts)
    return env


def nox_command(nox_python: str, noxfile: Path, *args: str) -> list[str]:
    """``nox_python -m nox -f NOXFILE ARGS``."""
    return [nox_python, "-m", "nox", "-f", str(noxfile), *args]


def run_lanes(root: Path, nox_python: str, *, runs: int = 3, lanes: Sequence[str] = LANES, cold: bool = True,
              timeout: float = 1800.0, log: Callable[[str], None] = print) -> tuple[list[LaneRuns], list[str]]:
    """Time the warm lanes and, with ``cold``, a cold ``nox -s unit`` in a fresh clone.

    Returns ``(runs per lane, problems)``; the cold run is the last entry.
    """
    noxfile = root / "noxfile.py"
    env = nox_env()
    problems: list[str] = []
    setup = measure.run(nox_command(nox_python, noxfile, "--install-only", "-s", *lanes),
                        env=env, cwd=root, timeout=timeout)
    if not setup.ok:
        problems.append(f"nox --install-only failed (exit {setup.returncode}): {setup.output.strip()[-400:]}")
        return [], problems
    results = {lane: LaneRuns(lane) for lane in lanes}
    for round_no in range(runs):
        for lane in lanes:
            proc = measure.run(nox_command(nox_python, noxfile, "-R", "-s", lane), env=env, cwd=root,
                               timeout=timeout)
            row = results[lane]
            row.wall.append(proc.wall)
            row.cpu.append(proc.cpu)
            row.exit_codes.append(proc.returncode)
            row.verdicts.append(verdict_line(proc.output) or ("timed out" if proc.timed_out else ""))
            log(f"lane {lane} (warm) {round_no + 1}/{runs}: {proc.wall:.1f}s, exit {proc.returncode}"
                f" {row.verdicts[-1]}")
    out = [results[lane] for lane in lanes]
    if cold:
        out.append(_cold_unit(root, nox_python, env, timeout, problems, log))
    return out, problems


def _cold_unit(root: Path, nox_python: str, env: dict[str, str], timeout: float, problems: list[str],
               log: Callable[[str], None]) -> LaneRuns:
    row = LaneRuns("unit", cold=True)
    tmp = Path(tempfile.mkdtemp(prefix="canarchy-bench-clone-"))
    try:
        clone = tmp / "canarchy"
        cloned = subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], capture_output=True, text=True,
                                env=env, timeout=300)
        if cloned.returncode != 0:
            problems.append(f"git clone failed: {cloned.stderr.strip()[-400:]}")
            return row
        proc = measure.run(nox_command(nox_python, clone / "noxfile.py", "-s", "unit"), env=env, cwd=clone,
                           timeout=timeout)
        row.wall.append(proc.wall)
        row.cpu.append(proc.cpu)
        row.exit_codes.append(proc.returncode)
        row.verdicts.append(verdict_line(proc.output) or ("timed out" if proc.timed_out else ""))
        log(f"lane unit (cold, fresh clone): {proc.wall:.1f}s, exit {proc.returncode} {row.verdicts[-1]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return row
