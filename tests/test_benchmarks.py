"""The benchmarks' code (benchmarks/) and the import hygiene of offline commands.

Nothing here asserts a timing: benchmarks run in ``nox -s bench``, never in
the suite. What is checked is that each benchmark measures what it says
(generated suites and logs, like-for-like decoding, the report's targets)
and that offline commands do not import python-can, cantools or the MCP SDK.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import argparse
import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import captures, isolation, lane_times, measure, report, startup
from benchmarks import __main__ as bench_main
from canarchy import cli
from canarchy.candump import parse_candump_line
from canarchy.errors import CanarchyError

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = ROOT / "fixtures" / "captures"
HEAVY = ("can", "cantools", "mcp")


# --------------------------------------------------------------------------- import hygiene

OFFLINE_COMMANDS = [
    ["config", "show", "--json"],
    ["uds", "services", "--json"],
    ["j1939", "pgn", "61444", "--json"],
    ["j1587", "pid", "84", "--json"],
    ["dbc", "cache", "list", "--json"],
    ["session", "show", "--json"],
]

_IMPORT_PROBE = """\
import io, json, sys
from canarchy.cli import main
code = main(sys.argv[1:], stdout=io.StringIO())
heavy = sorted(n for n in sys.modules if n.split(".")[0] in ("can", "cantools", "mcp"))
commands = sorted(n for n in sys.modules if n.startswith("canarchy.commands."))
print(json.dumps({"exit": code, "heavy": heavy, "commands": commands}))
"""


def _heavy_imports(argv: list[str], extra_env: dict[str, str] | None = None) -> dict:
    """Run ``canarchy.cli.main(argv)`` in a fresh interpreter; return its exit code,
    the python-can / cantools / mcp modules and the command modules it ended up with."""
    env = {**os.environ, **(extra_env or {})}
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *argv], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", OFFLINE_COMMANDS, ids=lambda a: " ".join(a[:-1]))
def test_offline_command_imports_no_python_can_cantools_or_mcp(argv):
    result = _heavy_imports(argv)
    assert result["exit"] == 0
    assert result["heavy"] == [], f"`canarchy {' '.join(argv)}` imported {result['heavy']}"


@pytest.mark.parametrize("argv", OFFLINE_COMMANDS, ids=lambda a: " ".join(a[:-1]))
def test_offline_command_imports_only_its_own_command_module(argv):
    imported = set(_heavy_imports(argv)["commands"])
    own = cli.COMMAND_GROUPS[argv[0]]
    assert own in imported
    # reference.py borrows `j1939 decode` from decode.py; _common is shared helpers
    allowed = {own, "canarchy.commands._common"}
    if own == "canarchy.commands.reference":
        allowed.add("canarchy.commands.decode")
    assert imported <= allowed, f"`canarchy {' '.join(argv)}` also imported {sorted(imported - allowed)}"


def test_uds_services_with_a_configured_default_interface_still_imports_no_python_can():
    # The #530 guard keeps it a reference lookup; it must not even import python-can.
    result = _heavy_imports(["uds", "services", "--json"], {"CANARCHY_DEFAULT_INTERFACE": "vcan0"})
    assert result["exit"] == 0
    assert result["heavy"] == []


def test_import_probe_sees_a_heavy_import():
    # Control: the probe reports cantools for `decode`, which needs it.
    result = _heavy_imports(["decode", "--file", str(CAPTURES / "j1939_truck_idle.log"),
                             "--dbc", str(CAPTURES / "css_j1939_demo.dbc"), "--summary", "--json"])
    assert result["exit"] == 0
    assert "cantools" in result["heavy"]


# --------------------------------------------------------------------------- one command module per command line


def _registered_by(module_name: str) -> list[str]:
    """The top-level commands ``module_name``'s ``add_parser`` registers."""
    parser = cli._ArgumentParser(prog="canarchy")
    subparsers = parser.add_subparsers(dest="group", parser_class=cli._ArgumentParser)
    importlib.import_module(module_name).add_parser(subparsers, cli._output_parent())
    return list(subparsers.choices)


def test_command_groups_name_the_module_that_registers_each_command():
    registered = {name: module for module in cli.COMMAND_MODULES for name in _registered_by(module)}
    assert registered == cli.COMMAND_GROUPS, (
        "cli.COMMAND_GROUPS must map every top-level command to the module that registers it "
        "(a command missing there still works, but builds every parser: slower start-up)")


@pytest.mark.parametrize(("argv", "expected"), [
    (["uds", "services", "--json"], ("canarchy.commands.uds",)),
    (["--json", "j1939", "pgn", "61444"], ("canarchy.commands.reference",)),
    (["dbc", "--help"], ("canarchy.commands.caches",)),
    ([], cli.COMMAND_MODULES),
    (["--help"], cli.COMMAND_MODULES),
    (["-h", "uds"], cli.COMMAND_MODULES),
    (["--json"], cli.COMMAND_MODULES),
    (["nonesuch", "uds"], cli.COMMAND_MODULES),
    (["--", "uds"], cli.COMMAND_MODULES),
])
def test_a_command_line_needs_only_the_module_of_its_command(argv, expected):
    assert tuple(cli._modules_for(argv)) == tuple(expected)


def _leaf_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _leaf_paths(sub, prefix + (name,)) or [prefix + (name,)]
    return paths


def _parse(parser: argparse.ArgumentParser, argv: list[str]):
    try:
        namespace = parser.parse_args(argv)
    except CanarchyError as exc:
        return ("error", exc.code, exc.message)
    # handlers built per add_parser call (lambdas, closures) compare by their code
    return {k: (v.__module__, v.__qualname__) if callable(v) else v for k, v in vars(namespace).items()}


_PARSE_SUFFIXES = (["--json"], ["can0", "--json"], ["--bogus"], ["0x100", "--jsonl"], ["--file", "x.log", "--text"])


def test_the_smaller_parser_parses_every_command_line_as_the_full_one():
    full = cli.build_parser()
    paths = _leaf_paths(full)
    assert len(paths) > 20 and ("uds", "services") in paths
    for path in paths:
        for suffix in _PARSE_SUFFIXES:
            argv = [*path, *suffix]
            assert cli._modules_for(argv) == (cli.COMMAND_GROUPS[path[0]],)
            assert _parse(cli.build_parser(argv), argv) == _parse(full, argv), argv


# --------------------------------------------------------------------------- measure


def test_run_reports_exit_code_output_and_usage():
    proc = measure.run([sys.executable, "-c", "import sys; print('hello'); sys.exit(3)"])
    assert proc.returncode == 3 and not proc.ok
    assert proc.output.strip() == "hello"
    assert proc.wall > 0 and proc.cpu >= 0 and proc.maxrss_kib > 0
    assert not proc.timed_out


def test_run_kills_a_child_after_its_timeout():
    proc = measure.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert proc.timed_out and not proc.ok
    assert proc.wall < 20


def test_child_env_is_allow_listed_with_its_own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CANARCHY_DEFAULT_INTERFACE", "can0")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = measure.child_env(tmp_path, bytecode_prefix=tmp_path / "pyc")
    assert env["HOME"] == str(tmp_path)
    assert "CANARCHY_DEFAULT_INTERFACE" not in env and "PYTHONPATH" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert measure.child_env(tmp_path)["PYTHONDONTWRITEBYTECODE"] == "1"


def test_median_and_spread():
    assert measure.median([3.0, 1.0, 2.0]) == 2.0
    assert measure.spread([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert measure.median([]) != measure.median([])  # NaN


# --------------------------------------------------------------------------- isolation


def _test_functions(suite: Path) -> list[str]:
    names = []
    for module in sorted(suite.glob("test_*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        names += [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    return names


@pytest.mark.parametrize("variant", isolation.VARIANTS)
def test_write_suite_generates_the_asked_number_of_distinct_trivial_tests(tmp_path, variant):
    suite = isolation.write_suite(tmp_path, variant, tests=25, modules=4)
    names = _test_functions(suite)
    assert len(names) == 25 and len(set(names)) == 25
    assert len(list(suite.glob("test_*.py"))) == 4
    assert (suite / "pytest.ini").exists()
    conftest = (suite / "conftest.py").read_text(encoding="utf-8")
    assert "pytest_runtestloop" in conftest
    assert ('pytest_plugins = ["canarchy.testing.isolation.plugin"]' in conftest) == (variant == "canarchy")
    assert ("tmp_path_factory.mktemp" in conftest and "monkeypatch.delenv" in conftest) == (variant == "naive")


def test_write_suite_rejects_unknown_variants_and_empty_suites(tmp_path):
    with pytest.raises(KeyError):
        isolation.write_suite(tmp_path, "nonesuch")
    with pytest.raises(ValueError):
        isolation.write_suite(tmp_path, "bare", tests=0)


def test_isolation_runs_every_variant_and_pairs_overheads_by_round():
    # canarchy's plugin scrubs the environment: the timer must still find its output file
    result = isolation.run_isolation(tests=3, rounds=1, variants=("bare", "canarchy"), warmup=False,
                                     log=lambda _: None)
    assert result.problems == []
    for variant in ("bare", "canarchy"):
        runs = result.runs[variant]
        assert len(runs.loop_wall) == len(runs.loop_cpu) == len(runs.proc_wall) == 1
        assert runs.loop_wall[0] > 0
    summary = result.summary()
    assert summary["bare"]["loop_wall"] == 0.0
    assert set(summary) == {"bare", "canarchy"}


def test_isolation_requires_the_bare_reference():
    with pytest.raises(ValueError):
        isolation.run_isolation(tests=3, rounds=1, variants=("canarchy",))


def test_overhead_is_variant_minus_bare_per_test_in_ms():
    result = isolation.IsolationResult(tests=1000, rounds=2, runs={
        "bare": isolation.VariantRuns(loop_wall=[1.0, 2.0], loop_cpu=[1.0, 1.0], proc_wall=[2.0, 3.0]),
        "canarchy": isolation.VariantRuns(loop_wall=[1.1, 2.3], loop_cpu=[1.05, 1.15], proc_wall=[2.5, 3.5]),
    })
    assert result.overhead_ms("canarchy", "loop_wall") == pytest.approx([0.1, 0.3])
    assert result.summary()["canarchy"]["loop_cpu"] == pytest.approx(0.1)


# --------------------------------------------------------------------------- captures


@pytest.fixture(scope="module")
def generated_log(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "mixed.log"
    written = captures.generate_log(path, [CAPTURES / s for s in captures.MIXED_SOURCES], 9000)
    assert written == 9000
    return path


def test_generated_log_has_exact_frames_in_time_order_and_parses(generated_log):
    lines = generated_log.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 9000  # more than one copy of the 7,657 source frames
    frames = [parse_candump_line(line) for line in lines]
    assert all(f is not None for f in frames)
    stamps = [f.timestamp for f in frames]
    assert stamps == sorted(stamps)
    # the first lines are the truck capture's, with its own gaps
    source = captures._capture_lines(CAPTURES / "j1939_truck_idle.log")
    assert lines[0].split(" ", 1)[1] == source[0][1]
    assert stamps[1] - stamps[0] == pytest.approx(source[1][0] - source[0][0], abs=2e-6)


def test_generate_log_rejects_nothing_to_write(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError):
        captures.generate_log(tmp_path / "out.log", [empty], 10)
    with pytest.raises(ValueError):
        captures.generate_log(tmp_path / "out.log", [CAPTURES / "j1939_truck_idle.log"], 0)


def test_both_readers_count_every_frame_of_the_generated_log(generated_log):
    ours = captures.worker("canarchy-read", str(generated_log))
    theirs = captures.worker("python-can-read", str(generated_log))
    assert ours["frames"] == theirs["frames"] == 9000
    assert ours["peak_kib"] >= ours["rss_before_kib"] > 0


def test_both_decoders_decode_the_same_frames(tmp_path):
    log = tmp_path / "j1939.log"
    captures.generate_log(log, [CAPTURES / "j1939_truck_idle.log"], 5000)
    dbc = str(CAPTURES / captures.J1939_DBC)
    ours = captures.worker("canarchy-decode", str(log), dbc)
    theirs = captures.worker("cantools-decode", str(log), dbc)
    assert ours["frames"] == theirs["frames"] == 5000
    assert ours["decoded"] == theirs["decoded"] > 1000  # EEC1 and CCVS1 from every source address


@pytest.mark.parametrize("kind", ["capture-jsonl", "capture-json", "capture-text"])
def test_the_output_forms_print_every_frame(generated_log, kind):
    result = captures.worker(kind, str(generated_log))
    assert result["frames"] == 9000 and result["seconds"] > 0
    assert result["peak_kib"] >= result["rss_before_kib"] > 0


def test_capture_targets_are_judged_from_the_runs():
    def runs(kind, seconds, peak_kib):
        return captures.KindRuns(kind, "mixed", [{"frames": 1000, "decoded": 0, "seconds": seconds,
                                                  "cpu_seconds": seconds, "rss_before_kib": 1, "peak_kib": peak_kib}])

    result = captures.CaptureResult(
        logs={"mixed": {"frames": 1000, "bytes": 1}, "j1939": {"frames": 1000, "bytes": 1}},
        kinds={"python-can-read": runs("python-can-read", 1.0, 1), "canarchy-read": runs("canarchy-read", 0.4, 1),
               "capture-jsonl": runs("capture-jsonl", 1.2, 20 * 1024),
               "decode-json": runs("decode-json", 3.0, 70 * 1024)})
    text = "\n".join(report.capture_target_lines(result, {}))
    assert "candump parser: 0.40 x python-can's reader (CPU, median); target <= 0.5 x: met" in text
    assert "`capture --file --jsonl`: 1.20 x python-can's reader (CPU, median); target <= 1.0 x: **missed**" in text
    assert "at most 70.0 MiB (decode-json); target < 64 MiB (stated for 10,000,000 frames): **missed**" in text


def test_capture_worker_command_line(generated_log):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.captures", "worker", "canarchy-read",
                           str(generated_log)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["frames"] == 9000
    assert captures.main(["nonsense"]) == 2


# --------------------------------------------------------------------------- start-up


def test_startup_measures_the_offline_commands_beside_the_references():
    rows = startup.commands()
    offline = [r for r in rows if r.offline]
    assert [r.label for r in offline] == [label for label, _ in startup.CANARCHY_COMMANDS]
    assert all(r.argv[-1] == "--json" for r in offline)
    assert {r.label for r in rows if not r.offline} == {"python -c pass", 'python -c "import can"', "cantools --help"}


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the probe reads /proc (Linux)")
def test_memory_probe_reports_the_commands_own_peak(tmp_path):
    out = tmp_path / "hwm"
    code = "x = bytearray(64 * 1024 * 1024)"
    proc = subprocess.run([sys.executable, "-c", startup.PROBE, "code", code], capture_output=True, text=True,
                          env={**os.environ, "BENCH_VMHWM_FILE": str(out)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert int(out.read_text()) > 64 * 1024  # KiB


# --------------------------------------------------------------------------- lanes


def test_verdict_line_finds_the_lane_verdict():
    output = "nox > Running session unit\n...\nunit: PASSED - 536 passed in 46.0s\nnox > Session unit was successful"
    assert lane_times.verdict_line(output) == "unit: PASSED - 536 passed in 46.0s"
    mutation = "mutation issue-530 (issue 530): KILLED"
    assert lane_times.verdict_line(mutation + "\n") == mutation
    assert lane_times.verdict_line("nothing here\n") == ""


def test_nested_nox_runs_without_the_bench_virtualenv():
    source = {"VIRTUAL_ENV": "/v/bench", "PATH": os.pathsep.join(["/v/bench/bin", "/usr/bin"]), "HOME": "/h",
              "PYTHONPYCACHEPREFIX": "/p"}
    env = lane_times.nox_env(source)
    assert "VIRTUAL_ENV" not in env and "PYTHONPYCACHEPREFIX" not in env
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/h"
    assert lane_times.nox_command("/py", Path("/r/noxfile.py"), "-R", "-s", "unit") == [
        "/py", "-m", "nox", "-f", "/r/noxfile.py", "-R", "-s", "unit"]


# --------------------------------------------------------------------------- report


def test_replace_block_keeps_the_prose_and_is_idempotent():
    doc = f"# Benchmarks\n\nprose\n\n{report.BEGIN}\nold\n{report.END}\n\nmore prose\n"
    once = report.replace_block(doc, "new table")
    assert "old" not in once and "new table" in once
    assert once.startswith("# Benchmarks\n\nprose\n") and once.endswith("\n\nmore prose\n")
    assert report.replace_block(once, "new table") == once
    appended = report.replace_block("# Benchmarks\n", "t")
    assert appended == f"# Benchmarks\n\n{report.BEGIN}\nt\n{report.END}\n"


def test_isolation_report_checks_both_targets():
    def result(canarchy_cpu: float, naive_cpu: float) -> isolation.IsolationResult:
        runs = {"bare": isolation.VariantRuns([1.0], [1.0], [2.0], [2.0]),
                "canarchy": isolation.VariantRuns([1.0], [1.0 + canarchy_cpu], [2.0], [2.0]),
                "naive": isolation.VariantRuns([1.0], [1.0 + naive_cpu], [2.0], [2.0])}
        return isolation.IsolationResult(tests=1000, rounds=1, runs=runs)

    good = "\n".join(report.isolation_lines(result(0.05, 0.4)))  # 0.05 and 0.4 ms per test
    assert "<= 0.1 ms: met; below naive: met" in good
    bad = "\n".join(report.isolation_lines(result(0.5, 0.4)))
    assert "<= 0.1 ms: **missed**; below naive: **missed**" in bad


def test_lanes_report_judges_the_suite_the_default_run_parity_mutation_and_cold():
    rows = [lane_times.LaneRuns("pytest", wall=[20.0, 40.0, 30.0], exit_codes=[0, 0, 0]),
            lane_times.LaneRuns("default", wall=[50.0], exit_codes=[0]),
            lane_times.LaneRuns("unit", wall=[40.0, 50.0, 60.0], exit_codes=[0, 0, 0],
                                verdicts=["unit: PASSED - 5 passed"] * 3),
            lane_times.LaneRuns("parity", wall=[70.0], exit_codes=[0], verdicts=["parity: PASSED - same"]),
            lane_times.LaneRuns("mutation-530", wall=[6.0], exit_codes=[1], verdicts=[""]),
            lane_times.LaneRuns("unit", cold=True, wall=[55.0], cpu=[80.0], exit_codes=[0],
                                verdicts=["unit: PASSED - x"])]
    text = "\n".join(report.lanes_lines(rows, []))
    assert "`python -m pytest` (plain, serial" in text and "<= 30 s: met" in text
    assert "1.67 x plain pytest; <= 1.6 x: **missed**" in text
    assert "1.40 x unit; <= 1.3 x: **missed**" in text
    assert "<= 5 s: **missed**" in text and "exit 1" in text
    assert "fresh clone (cold) | 1 | 55.0" in text and "CPU s (all processes)" in text and "< 60 s: met" in text


def test_the_plain_suite_runs_with_the_unit_lane_s_interpreter_and_the_default_run_names_no_session():
    root = Path("/r")
    assert lane_times._command("/py", root / "noxfile.py", root, lane_times.PLAIN) == [
        "/r/.nox/unit/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    assert lane_times._command("/py", root / "noxfile.py", root, lane_times.DEFAULT)[-1] == "-R"
    assert lane_times._command("/py", root / "noxfile.py", root, "parity")[-2:] == ["-s", "parity"]


def test_main_rejects_unknown_sections(capsys):
    assert bench_main.main(["--sections", "nonesuch", "--no-docs"]) == 2
    assert "unknown section" in capsys.readouterr().err
