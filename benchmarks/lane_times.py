"""Wall and CPU time of the nox lanes against one plain pytest run.

Warm: ``nox --install-only`` of the default sessions first (not timed), then,
``runs`` times, interleaved: ``python -m pytest -q -p no:cacheprovider`` with
the unit lane's interpreter (the suite as the README runs it, serial), the
default ``nox -R`` (every default session, environments reused, no install),
and ``nox -R -s LANE`` for each lane. Cold: ``git clone`` of the checkout's
``HEAD`` into a temporary directory, then ``nox -s unit`` there (virtualenv,
``pip install -e .[test]``, the suite; pip's cache as the machine has it).

nox is the caller's (``--nox-python``), run with the caller's environment minus
the bench lane's virtualenv, so a nested lane is built exactly as from a shell.
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
#: The rows that are not a single lane: the plain suite and the default ``nox`` run.
PLAIN, DEFAULT = "pytest", "default"
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


def _command(nox_python: str, noxfile: Path, root: Path, name: str) -> list[str]:
    if name == PLAIN:
        venv_python = root / ".nox" / "unit" / "bin" / "python"
        return [str(venv_python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return nox_command(nox_python, noxfile, "-R", *(() if name == DEFAULT else ("-s", name)))


def run_lanes(root: Path, nox_python: str, *, runs: int = 3, lanes: Sequence[str] = LANES, cold: bool = True,
              timeout: float = 1800.0, log: Callable[[str], None] = print) -> tuple[list[LaneRuns], list[str]]:
    """Time the plain suite, the default nox run and each lane warm and, with ``cold``, a cold
    ``nox -s unit`` in a fresh clone. Returns ``(runs per row, problems)``; the cold run is last."""
    noxfile = root / "noxfile.py"
    env = nox_env()
    problems: list[str] = []
    setup = measure.run(nox_command(nox_python, noxfile, "--install-only"), env=env, cwd=root, timeout=timeout)
    if not setup.ok:
        problems.append(f"nox --install-only failed (exit {setup.returncode}): {setup.output.strip()[-400:]}")
        return [], problems
    names = (PLAIN, DEFAULT, *lanes)
    results = {name: LaneRuns(name) for name in names}
    for round_no in range(runs):
        for name in names:
            proc = measure.run(_command(nox_python, noxfile, root, name), env=env, cwd=root, timeout=timeout)
            row = results[name]
            row.wall.append(proc.wall)
            row.cpu.append(proc.cpu)
            row.exit_codes.append(proc.returncode)
            row.verdicts.append(verdict_line(proc.output) or ("timed out" if proc.timed_out else ""))
            log(f"lane {name} (warm) {round_no + 1}/{runs}: {proc.wall:.1f}s, exit {proc.returncode}"
                f" {row.verdicts[-1]}")
    out = [results[name] for name in names]
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
