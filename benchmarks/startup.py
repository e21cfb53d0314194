"""Command start-up: wall time from process start to exit.

Each command runs as its own process (the ``canarchy`` console script of the
interpreter running the benchmarks), with a disposable home, and with byte
code cached in a temporary ``PYTHONPYCACHEPREFIX`` as an installed canarchy
has it. One untimed warm-up run per command fills that cache; then the
commands run interleaved, ``runs`` times each. Beside them: ``python -c pass``
(the interpreter's own start), ``python -c "import can"`` and
``cantools --help``, the price the offline commands avoid by not importing
python-can and cantools.

Peak memory: ``ru_maxrss`` of a child started from this (larger) process
includes this process's own resident set before ``exec``, so each command
also runs once under :data:`PROBE`, which reports the command's own high-water
mark (``VmHWM`` of ``/proc/self/status``, Linux) at exit.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from benchmarks import measure

#: (label, argv after the ``canarchy`` program) of the offline commands measured.
CANARCHY_COMMANDS = (
    ("canarchy config show --json", ["config", "show", "--json"]),
    ("canarchy uds services --json", ["uds", "services", "--json"]),
    ("canarchy j1939 pgn 61444 --json", ["j1939", "pgn", "61444", "--json"]),
)

#: Target for the offline commands (s, median wall time).
TARGET_S = 0.15

#: Runs a command (``script PATH ARGS``, ``module NAME ARGS`` or ``code TEXT``)
#: and writes its peak resident set (KiB) to ``$BENCH_VMHWM_FILE`` at exit.
PROBE = """\
import atexit, os, runpy, sys
def _report():
    with open('/proc/self/status') as fh:
        for line in fh:
            if line.startswith('VmHWM:'):
                with open(os.environ['BENCH_VMHWM_FILE'], 'w') as out:
                    out.write(line.split()[1])
atexit.register(_report)
mode, target, *rest = sys.argv[1:]
if mode == 'code':
    sys.argv = ['-c', *rest]
    exec(compile(target, '<string>', 'exec'), {'__name__': '__main__'})
elif mode == 'module':
    sys.argv = [target, *rest]
    runpy.run_module(target, run_name='__main__', alter_sys=True)
else:
    sys.argv = [target, *rest]
    runpy.run_path(target, run_name='__main__')
"""


@dataclass
class CommandRuns:
    """One command's runs: wall and CPU seconds, ``ru_maxrss`` in KiB (an upper
    bound, see the module docstring), ``peak_kib`` (the probe's own figure), failures."""

    label: str
    argv: list[str]
    offline: bool
    probe: list[str] = field(default_factory=list)
    peak_kib: int | None = None
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    maxrss_kib: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def commands() -> list[CommandRuns]:
    """The command lines measured, in report order (canarchy's offline commands first)."""
    python = measure.python()
    probe = [python, "-c", PROBE]

    def program(name: str) -> tuple[list[str], list[str]]:
        script = measure.venv_script(name)
        if script is not None:
            return [str(script)], probe + ["script", str(script)]
        return [python, "-m", name], probe + ["module", name]

    canarchy, canarchy_probe = program("canarchy")
    cantools, cantools_probe = program("cantools")
    rows = [CommandRuns(label, canarchy + argv, True, canarchy_probe + argv) for label, argv in CANARCHY_COMMANDS]
    rows += [
        CommandRuns("python -c pass", [python, "-c", "pass"], False, probe + ["code", "pass"]),
        CommandRuns('python -c "import can"', [python, "-c", "import can"], False, probe + ["code", "import can"]),
        CommandRuns("cantools --help", cantools + ["--help"], False, cantools_probe + ["--help"]),
    ]
    return rows


def run_startup(*, runs: int = 15, timeout: float = 60.0, log: Callable[[str], None] = print) -> list[CommandRuns]:
    """Measure every command of :func:`commands` ``runs`` times (after one warm-up each)."""
    rows = commands()
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-startup-") as tmp:
        root = Path(tmp)
        home = root / "home"
        home.mkdir()
        env = measure.child_env(home, bytecode_prefix=root / "pycache")
        for round_no in range(-1, runs):
            for row in rows:
                proc = measure.run(row.argv, env=env, cwd=root, timeout=timeout, keep_output=True)
                if not proc.ok:
                    row.failures.append(f"exit {proc.returncode}: {proc.output.strip()[-200:]}")
                    continue
                if round_no >= 0:
                    row.wall.append(proc.wall)
                    row.cpu.append(proc.cpu)
                    row.maxrss_kib.append(proc.maxrss_kib)
            if round_no >= 0 and (round_no + 1) % 5 == 0:
                log(f"start-up round {round_no + 1}/{runs}")
        if os.path.exists("/proc/self/status"):
            for row in rows:
                row.peak_kib = _peak_kib(row, env, root, timeout)
    return rows


def _peak_kib(row: CommandRuns, env: dict[str, str], cwd: Path, timeout: float) -> int | None:
    """The command's own peak resident set in KiB (one run under :data:`PROBE`), or None."""
    report = cwd / "vmhwm"
    report.unlink(missing_ok=True)
    proc = measure.run(row.probe, env={**env, "BENCH_VMHWM_FILE": str(report)}, cwd=cwd, timeout=timeout)
    if not proc.ok or not report.exists():
        row.failures.append(f"memory probe: exit {proc.returncode}: {proc.output.strip()[-200:]}")
        return None
    return int(report.read_text(encoding="ascii"))
