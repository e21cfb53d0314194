"""canarchy.testing.lanes: lane environments, manifests, the private network namespace, verdicts, parity."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import os
import subprocess
import sys
from pathlib import Path

import pytest

from canarchy.testing.lanes import env as lane_env, manifest, netns as lane_netns, parity, runner, unit, verdict as lane_verdicts
from canarchy.testing.lanes import __main__ as lanes_cli
from tests.helpers import WAITING_TEST, interrupt_once_started

HOSTILE_SHELL = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": "/home/operator",
    "CANARCHY_DEFAULT_INTERFACE": "can0",
    "CANARCHY_PYTHON_CAN_INTERFACE": "udp_multicast",
    "CAN_INTERFACE": "socketcan",
    "CAN_CONFIG": '{"receive_own_messages": true}',
    "XDG_CONFIG_HOME": "/home/operator/.config",
    "PYTHONPATH": "/home/operator/lib",
    "PYTHONHASHSEED": "123",
    "VIRTUAL_ENV": "/home/operator/venv",
    "PYTEST_ADDOPTS": "-p no:canarchy",
    "SOMETHING_ELSE": "x",
}


# --------------------------------------------------------------------------- environment


def test_build_env_keeps_only_the_allow_list(tmp_path):
    env = lane_env.build_env(home=tmp_path, hashseed=7, source=HOSTILE_SHELL)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(tmp_path),
        "USERPROFILE": str(tmp_path),
        "PYTHONHASHSEED": "7",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }


def test_build_env_verdict_does_not_depend_on_the_callers_shell(tmp_path):
    clean = {k: HOSTILE_SHELL[k] for k in ("PATH", "LANG", "LC_ALL")}
    assert lane_env.build_env(home=tmp_path, source=HOSTILE_SHELL) == lane_env.build_env(home=tmp_path, source=clean)


def test_build_env_passthrough_and_extra(tmp_path):
    env = lane_env.build_env(
        home=tmp_path,
        source=HOSTILE_SHELL,
        passthrough=lane_env.OPERATOR_BUS_VARIABLES,
        extra={"TMPDIR": "/x", "CANARCHY_DEFAULT_INTERFACE": "239.74.163.2"},
    )
    assert env["CANARCHY_PYTHON_CAN_INTERFACE"] == "udp_multicast"  # passed through
    assert env["CANARCHY_DEFAULT_INTERFACE"] == "239.74.163.2"  # extra wins
    assert env["TMPDIR"] == "/x" and "CAN_INTERFACE" not in env


def _installed_plugin(site: Path) -> None:
    """A ``pytest11`` entry point, as ``pip install`` of a pytest plugin leaves
    one, that drops ``.installed-plugin-was-here`` in the working directory."""
    dist = site / "planted_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nplanted = planted_plugin\n")
    (site / "planted_plugin.py").write_text(
        "from pathlib import Path\n"
        "def pytest_configure(config):\n"
        "    (Path.cwd() / '.installed-plugin-was-here').touch()\n"
    )


def test_a_lane_never_loads_plugins_merely_installed_in_the_interpreter(tmp_path):
    site = tmp_path / "site"
    _installed_plugin(site)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_a.py").write_text("def test_a(): pass\n")
    args = ["-p", "no:cacheprovider", "--junitxml=reports/a.xml", "test_a.py"]
    # control: with autoload as a bare shell has it, the planted plugin runs
    control = {**os.environ, "PYTHONPATH": str(site)}
    control.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    subprocess.run([sys.executable, "-m", "pytest", *args], cwd=project, env=control, capture_output=True, check=True)
    assert (project / ".installed-plugin-was-here").exists()
    (project / ".installed-plugin-was-here").unlink()
    env = lane_env.build_env(home=tmp_path / "home", source={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": ""},
                          extra={"PYTHONPATH": str(site)})
    run = runner.run_pytest(sys.executable, args, env=env, log=tmp_path / "a.log", echo=False, cwd=project)
    assert run.returncode == 0, run.output
    assert not (project / ".installed-plugin-was-here").exists()


@pytest.mark.parametrize(
    "posargs, fixed, expected",
    [
        ([], None, ["tests"]),
        (["tests/test_cli.py::test_a", "-k", "json"], None, ["-k", "json", "tests/test_cli.py::test_a"]),
        (["-k=json", "-m", "not slow", "--deselect", "tests/x.py::t"], None, ["-k", "json", "-m", "not slow", "--deselect", "tests/x.py::t", "tests"]),
        (["tests/test_integration.py"], "integration", ["tests/test_integration.py"]),
    ],
)
def test_choose_tests_accepts_selection_only(posargs, fixed, expected):
    assert lane_env.choose_tests(posargs, fixed_markexpr=fixed) == expected


@pytest.mark.parametrize(
    "posargs, fixed, message",
    [
        (["--junitxml=elsewhere.xml"], None, "not allowed"),
        (["-p", "no:canarchy.testing.isolation.plugin"], None, "not allowed"),
        (["-o", "addopts="], None, "not allowed"),
        (["--strict-markers=false"], None, "not allowed"),
        (["-m", "uds"], "integration", "not allowed"),
        (["-m", "integration"], None, "own lane"),
        (["-m", "real_bus"], None, "no lane runs them"),
        (["-m", "uds or real_home"], None, "no lane runs them"),
        (["@/tmp/args"], None, "read arguments from that file"),
        (["-k", "@/tmp/args"], None, "read arguments from that file"),
        (["-k"], None, "needs a value"),
    ],
)
def test_choose_tests_refuses_everything_else(posargs, fixed, message):
    with pytest.raises(ValueError, match=message):
        lane_env.choose_tests(posargs, fixed_markexpr=fixed)


@pytest.mark.parametrize("path", ["/tmp/elsewhere/test_evil.py", "../other-checkout/tests", "tests/../../x/test_a.py::t"])
def test_choose_tests_keeps_to_the_checkout(tmp_path, path):
    """A test file outside the checkout would run without its conftest, i.e. unisolated."""
    checkout = tmp_path / "checkout"
    (checkout / "tests").mkdir(parents=True)
    assert lane_env.choose_tests(["tests/test_a.py::t", "tests"], root=checkout) == ["tests/test_a.py::t", "tests"]
    with pytest.raises(ValueError, match="is outside it"):
        lane_env.choose_tests([path], root=checkout)
    (checkout / "tests" / "escape").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="is outside it"):
        lane_env.choose_tests(["tests/escape/test_x.py"], root=checkout)


# --------------------------------------------------------------------------- manifests


def _tree(root: Path) -> Path:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("one")
    (root / "empty").mkdir()
    (root / ".hidden").write_text("h")
    (root / "link").symlink_to("a/b/f.txt")
    return root


def test_manifest_records_files_dirs_and_links(tmp_path):
    m = manifest.manifest(_tree(tmp_path / "t"))
    assert sorted(m) == [".hidden", "a", "a/b", "a/b/f.txt", "empty", "link"]
    assert m["a/b/f.txt"] == manifest.Entry("file", 3, "7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed")
    assert m["link"].kind == "link" and m["empty"].kind == "dir"


@pytest.mark.parametrize(
    "change, line",
    [
        (lambda r: (r / "a" / "b" / "f.txt").write_text("two"), "changed: a/b/f.txt (same size, different content)"),
        (lambda r: (r / "a" / "b" / "f.txt").write_text("three"), "changed: a/b/f.txt (3 -> 5 bytes)"),
        (lambda r: (r / "new").write_text(""), "added: new"),
        (lambda r: (r / "empty" / "sub").mkdir(), "added: empty/sub"),
        (lambda r: (r / ".hidden").unlink(), "removed: .hidden"),
        (lambda r: ((r / "link").unlink(), (r / "link").symlink_to("empty")), "changed: link (link target changed)"),
    ],
)
def test_diff_manifests_names_each_change(tmp_path, change, line):
    root = _tree(tmp_path / "t")
    before = manifest.manifest(root)
    change(root)
    assert manifest.diff_manifests(before, manifest.manifest(root)) == [line]


def test_unchanged_tree_has_no_diff(tmp_path):
    root = _tree(tmp_path / "t")
    assert manifest.diff_manifests(manifest.manifest(root), manifest.manifest(root)) == []


def test_tree_manifest_leaves_out_ignored_outputs(tmp_path):
    root = _tree(tmp_path / "t")
    for name in (".git/HEAD", "reports/unit.xml", "pkg/__pycache__/m.pyc", "canarchy.egg-info/PKG-INFO", ".nox/x"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    assert sorted(manifest.tree_manifest(root)) == [".hidden", "a", "a/b", "a/b/f.txt", "empty", "link", "pkg"]


def test_operator_home_fixture_is_complete():
    """The files the parity lane relies on (fixtures/operator-home/README.md) are all there."""
    home = Path(__file__).resolve().parents[1] / "fixtures" / "operator-home"
    files = {k for k, e in manifest.manifest(home).items() if e.kind == "file"}
    for required in (
        ".canarchy/config.toml",
        ".canarchy/j1939_spns.json",
        ".canarchy/j1587_pids.json",
        ".canarchy/j2497_mids.json",
        ".canarchy/cache/dbc/providers/opendbc/manifest.json",
        ".canarchy/cache/skills/providers/example/manifest.json",
        ".canrc",
        "can.conf",
        "README.md",
    ):
        assert required in files
    assert sum(1 for f in files if f.startswith(".canarchy/findings/") and f.endswith("/campaign.json")) == 2
    config = (home / ".canarchy" / "config.toml").read_text()
    for line in ('interface = "udp_multicast"', 'default_interface = "vcan-operator"', "require_active_ack = true", "[plugins.example]"):
        assert line in config
    dbc = lane_env.HOSTILE_ENV["CANARCHY_J1939_DBC"].replace("{home}/", "")
    assert dbc in files, "HOSTILE_ENV's DBC path must exist in the operator home"


# --------------------------------------------------------------------------- network namespace


def test_netns_command_wraps_and_execs(tmp_path):
    support = lane_netns.NetnsSupport(True, "test", "/usr/bin/unshare", "/usr/sbin/ip")
    argv = lane_netns.netns_command(["python", "-m", "pytest"], support)
    assert argv[:4] == ["/usr/bin/unshare", "--net", "--", "sh"]
    assert argv[5].endswith('&& exec "$@"') and "route add 224.0.0.0/4 dev lo" in argv[5]
    assert argv[6:] == ["sh", "python", "-m", "pytest"]


def test_netns_command_refuses_when_unavailable():
    with pytest.raises(RuntimeError, match="no private network namespace: needs root"):
        lane_netns.netns_command(["true"], lane_netns.NetnsSupport(False, "needs root"))


def test_netns_support_reasons(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert lane_netns._probe_netns() == lane_netns.NetnsSupport(False, "network namespaces are Linux-only (this is darwin)")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    support = lane_netns._probe_netns()
    assert not support.available and "needs root" in support.reason


def _net_ns(pid: str = "self") -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@pytest.mark.skipif(not lane_netns.netns_support().available, reason=lane_netns.netns_support().reason)
def test_private_namespace_has_only_loopback_and_dies_with_the_command():
    argv = lane_netns.netns_command(["sh", "-c", "readlink /proc/self/ns/net; ip -o link show; ip route show"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    ns, *rest = proc.stdout.splitlines()
    links = [line.split(":")[1].strip() for line in rest if ": " in line and "link/" in line]
    assert ns != _net_ns() and links == ["lo"]
    assert any(line.startswith("224.0.0.0/4 dev lo") for line in rest)
    holders = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if _net_ns(pid) == ns:
                    holders.append(pid)
            except OSError:
                continue
    assert holders == [], "the namespace outlived its command"


@pytest.mark.integration
def test_provided_bus_round_trip_in_the_private_namespace():
    """The integration lane's own bus: two udp_multicast buses exchange a frame in the namespace."""
    pytest.importorskip("msgpack", reason="python-can's multicast extra is not installed")
    if not lane_netns.netns_support().available:
        pytest.skip(lane_netns.netns_support().reason)
    ok, output = lane_netns.netns_roundtrip(sys.executable)
    assert ok, output


# --------------------------------------------------------------------------- verdicts


def _junit(path: Path, cases: str) -> Path:
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def _run(tmp_path: Path, cases: str | None, output: str, returncode: int = 0) -> runner.PytestRun:
    from canarchy.testing.lanes.results import parse_summary

    junit = tmp_path / "unit.xml"
    if cases is not None:
        _junit(junit, cases)
    return runner.PytestRun(returncode, output, parse_summary(output), 1.0, junit, tmp_path / "unit.log")


PASS = '<testcase classname="m" name="t1"/>'
FAIL = '<testcase classname="m" name="t2"><failure message="x"/></testcase>'
SKIP = '<testcase classname="m" name="t3"><skipped type="pytest.skip" message="no bus"/></testcase>'


@pytest.mark.parametrize(
    "cases, output, rc, status, detail",
    [
        (PASS + SKIP, "1 passed, 1 skipped in 0.1s", 0, "PASSED", "1 passed, 1 skipped"),
        (PASS + FAIL, "1 failed, 1 passed in 0.1s", 1, "FAILED", "exit code 1"),
        (SKIP, "1 skipped in 0.1s", 0, "NOT PROVEN", "every test skipped"),
        ("", "no tests ran in 0.1s", 5, "CANNOT DECIDE", "zero tests selected"),
        (PASS, "2 passed in 0.1s", 0, "CANNOT DECIDE", "accounts for 1 outcome(s), pytest printed 2"),
        (PASS, "Killed", 137, "CANNOT DECIDE", "no summary line"),
        (None, "ERROR: usage", 4, "CANNOT DECIDE", "no such report"),
    ],
)
def test_lane_verdict(tmp_path, cases, output, rc, status, detail):
    verdict = lane_verdicts.lane_verdict("unit", _run(tmp_path, cases, output, rc))
    assert verdict.status == status and detail in verdict.detail
    assert verdict.exit_code == {"PASSED": 0, "NOT PROVEN": 0, "FAILED": 1}.get(status, 2)
    assert verdict.line().startswith(f"unit: {status} - ")


def test_failed_verdict_lists_failing_tests(tmp_path):
    verdict = lane_verdicts.lane_verdict("unit", _run(tmp_path, PASS + FAIL, "1 failed, 1 passed in 0.1s", 1))
    assert verdict.failing == ["m::t2"] and "`m::t2`" in verdict.markdown()


@pytest.mark.parametrize("args", [[], ["--junitxml=a.xml", "--junitxml=b.xml"], ["--junitxml", "a.xml"]])
def test_junit_path_must_be_given_once(args):
    with pytest.raises(ValueError, match="exactly one --junitxml"):
        runner.junit_path(args)


def _project(root: Path, tests: str) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "tests" / "test_p.py").write_text(tests)
    return root


def _pytest_args(root: Path, junit: str) -> list[str]:
    return ["-p", "no:cacheprovider", "-c", str(root / "pytest.ini"), "--rootdir", str(root), f"--junitxml={junit}",
            "-o", "log_cli=true", "--log-cli-level=WARNING", "tests"]  # fmt: skip


def test_run_lane_end_to_end(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path / "p", "import os\ndef test_home():\n    assert os.environ['HOME'] != os.environ.get('OUTER')\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("CANARCHY_DEFAULT_INTERFACE", "can0")  # must not reach the run
    code = lanes_cli.main(["run", "--lane", "unit", "--", *_pytest_args(root, "reports/unit.xml")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "unit: PASSED - 1 passed" in out
    assert (root / "reports" / "unit.md").read_text().startswith("# unit: PASSED")
    assert (root / "reports" / "unit.log").exists()


def unguarded_child() -> str:
    """A test module whose child escapes the bus guard the documented way
    (``python -I`` drops the PYTHONPATH hook) and must find itself in a network
    namespace other than the caller's (this test's), holding only ``lo``.
    Works wherever the caller runs, a lane's namespace included."""
    outer = os.readlink("/proc/self/ns/net")
    return f"""
import subprocess, sys

def test_an_unguarded_child_is_contained():
    probe = "import os, socket; print(os.readlink('/proc/self/ns/net'), sorted(n for _, n in socket.if_nameindex()))"
    seen = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True).stdout
    namespace, interfaces = seen.split(" ", 1)
    assert namespace != {outer!r}, "the child shares the caller's network namespace"
    assert interfaces.strip() == "['lo']", seen
"""


def _needs_a_namespace() -> None:
    if not lane_netns.netns_support().available:
        pytest.skip(lane_netns.netns_support().reason)


def test_unit_lane_contains_a_child_the_guard_cannot_reach(tmp_path, monkeypatch, capsys):
    _needs_a_namespace()
    root = _project(tmp_path / "p", unguarded_child())
    monkeypatch.chdir(root)
    code = lanes_cli.main(["run", "--lane", "unit", "--", *_pytest_args(root, "reports/unit.xml")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "unit: network: a private namespace (loopback only)" in out


def test_both_parity_twins_are_contained(tmp_path):
    _needs_a_namespace()
    root = _project(tmp_path / "p", unguarded_child())
    (tmp_path / "home").mkdir()
    result = parity.run_parity(sys.executable, _pytest_args(root, "reports/parity.xml"), operator_home=tmp_path / "home",
                              checkout=root, allowlist=None, source_env=os.environ, hashseeds=(11, 22))
    assert {name: run.summary for name, run in result.runs.items()} == {"clean": {"passed": 1}, "operator": {"passed": 1}}
    assert result.exit_code == 0 and "both twins" in result.netns_note


LEAKY_TESTS = """
import logging, os
from pathlib import Path

def test_stable():
    pass

def test_reads_the_home_config():
    assert not (Path.home() / ".canarchy" / "config.toml").exists()

def test_reads_the_shell():
    assert "CANARCHY_DEFAULT_INTERFACE" not in os.environ

def test_writes_into_the_home():
    if (Path.home() / ".canarchy").is_dir():
        (Path.home() / ".canarchy" / "findings" / "new-campaign").mkdir(parents=True, exist_ok=True)
        logging.getLogger("can.bus").warning("UdpMulticastBus was not properly shut down")
"""


def test_parity_finds_every_kind_of_leak(tmp_path):
    root = _project(tmp_path / "p", LEAKY_TESTS)
    home = tmp_path / "operator-home"
    (home / ".canarchy").mkdir(parents=True)
    (home / ".canarchy" / "config.toml").write_text('[transport]\ndefault_interface = "vcan-operator"\n')
    result = parity.run_parity(
        sys.executable, _pytest_args(root, "reports/parity.xml"), operator_home=home, checkout=root,
        allowlist=None, source_env=os.environ, hashseeds=(11, 22), use_netns=False,
    )  # fmt: skip
    rows = [(r.id, r.outcome_a, r.outcome_b) for r in result.comparison.differences]
    assert rows == [
        ("tests.test_p::test_reads_the_home_config", "passed", "failed"),
        ("tests.test_p::test_reads_the_shell", "passed", "failed"),
    ]
    assert result.home_changes == ["added: .canarchy/findings", "added: .canarchy/findings/new-campaign"]
    assert result.not_shut_down["clean"] == [] and len(result.not_shut_down["operator"]) >= 1
    assert result.checkout_changes == [] and result.exit_code == 1
    md = parity.parity_markdown(result)
    assert "| `tests.test_p::test_reads_the_shell` | passed | failed |" in md and "operator home unchanged: NO" in md
    assert (home / ".canarchy" / "findings").exists() is False  # the fixture itself is never the home


def test_parity_identical_runs_pass(tmp_path):
    root = _project(tmp_path / "p", "import pytest\n@pytest.mark.parametrize('x', range(3))\ndef test_a(x): pass\n")
    home = tmp_path / "operator-home"
    (home / ".canarchy").mkdir(parents=True)
    result = parity.run_parity(
        sys.executable, _pytest_args(root, "reports/parity.xml"), operator_home=home, checkout=root,
        allowlist=None, source_env=os.environ, hashseeds=(11, 22), use_netns=False,
    )  # fmt: skip
    assert result.comparison.verdict == "identical" and result.exit_code == 0, parity.parity_markdown(result)
    assert {name: run.summary for name, run in result.runs.items()} == {"clean": {"passed": 3}, "operator": {"passed": 3}}
    assert result.runs["clean"].junit.name == "parity-clean.xml" and result.runs["operator"].junit.exists()


def test_parity_cannot_decide_when_both_twins_break_the_same_way(tmp_path):
    root = _project(tmp_path / "p", "import no_such_module_anywhere\n")
    home = tmp_path / "operator-home"
    home.mkdir()
    result = parity.run_parity(
        sys.executable, _pytest_args(root, "reports/parity.xml"), operator_home=home, checkout=root,
        allowlist=None, source_env=os.environ, hashseeds=(11, 22), use_netns=False,
    )  # fmt: skip
    assert not result.comparison.differences  # they agree ...
    assert result.exit_code == 2  # ... but an interrupted collection has no results to compare
    assert any("pytest exit code 2" in reason for reason in result.comparison.undecided)


MEET = """
import os, time
from pathlib import Path

MEETING = Path({meeting!r})

def test_twins_meet():
    (MEETING / os.environ["PYTHONHASHSEED"]).write_text("")
    deadline = time.monotonic() + 60
    while len(list(MEETING.iterdir())) < 2:
        assert time.monotonic() < deadline, "the other twin never ran at the same time"
        time.sleep(0.05)
    assert "LEAKY_CALLER_VARIABLE" not in os.environ and "CANARCHY_CALLER" not in os.environ
"""


def test_parity_twins_run_concurrently_with_their_own_hash_seeds_and_a_built_environment(tmp_path):
    """Each twin waits for the other (so they overlap in time), under its own PYTHONHASHSEED,
    and sees nothing of the caller's shell but the allow-list."""
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    root = _project(tmp_path / "p", MEET.format(meeting=str(meeting)))
    home = tmp_path / "operator-home"
    home.mkdir()
    caller = dict(os.environ, LEAKY_CALLER_VARIABLE="1", CANARCHY_CALLER="x")
    result = parity.run_parity(
        sys.executable, _pytest_args(root, "reports/parity.xml"), operator_home=home, checkout=root,
        allowlist=None, source_env=caller, hashseeds=(11, 22), use_netns=False,
    )  # fmt: skip
    assert result.exit_code == 0, parity.parity_markdown(result)
    assert sorted(p.name for p in meeting.iterdir()) == ["11", "22"]
    assert result.hashseeds == {"clean": 11, "operator": 22}


def test_parity_draws_two_different_hash_seeds(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(parity, "run_pytest", lambda *a, **k: drawn.append(k["env"]["PYTHONHASHSEED"]) or (_ for _ in ()).throw(RuntimeError("stop")))
    root = _project(tmp_path / "p", "def test_a(): pass\n")
    (tmp_path / "h").mkdir()
    with pytest.raises(RuntimeError, match="could not be run"):
        parity.run_parity(sys.executable, _pytest_args(root, "reports/parity.xml"), operator_home=tmp_path / "h",
                         checkout=root, allowlist=None, source_env=os.environ, use_netns=False)
    assert len(drawn) == 2 and drawn[0] != drawn[1]


def test_integration_lane_ignores_an_exported_operator_bus_unless_asked(monkeypatch):
    """The default integration lane never transmits on the operator's bus: only
    `-- --operator-bus` uses it (and only then are transmitting tests allowed)."""
    monkeypatch.setattr(unit, "netns_support", lambda: lane_netns.NetnsSupport(False, "not root"))
    env = {"PATH": "/bin", "CANARCHY_PYTHON_CAN_INTERFACE": "socketcan", "CANARCHY_DEFAULT_INTERFACE": "can0"}
    netns, notes, error = unit._integration_bus(env, sys.executable, operator=False)
    assert (netns, error) == (False, None)
    assert "CANARCHY_DEFAULT_INTERFACE" not in env and "CANARCHY_PYTHON_CAN_INTERFACE" not in env
    assert unit.ALLOW_TRANSMIT_VARIABLE not in env
    assert any("ignored the exported operator bus" in note for note in notes)

    env = {"PATH": "/bin", "CANARCHY_PYTHON_CAN_INTERFACE": "socketcan", "CANARCHY_DEFAULT_INTERFACE": "can0"}
    netns, notes, error = unit._integration_bus(env, sys.executable, operator=True)
    assert (netns, error) == (False, None)
    assert env["CANARCHY_DEFAULT_INTERFACE"] == "can0" and env[unit.ALLOW_TRANSMIT_VARIABLE] == "1"

    netns, notes, error = unit._integration_bus({"PATH": "/bin"}, sys.executable, operator=True)
    assert error and "--operator-bus needs" in error


def test_ctrl_c_in_the_parity_lane_stops_both_twins_and_leaves_nothing(tmp_path):
    started, tmp = tmp_path / "started", tmp_path / "tmp"
    started.mkdir()
    tmp.mkdir()
    root = _project(tmp_path / "p", WAITING_TEST.format(started=str(started)))
    (tmp_path / "home").mkdir()
    env = lane_env.build_env(home=tmp_path / "lane-home", source=os.environ,
                          extra={"TMPDIR": str(tmp), "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    argv = [sys.executable, "-m", "canarchy.testing.lanes", "parity", "--operator-home", str(tmp_path / "home"),
            "--checkout", str(root), "--", *_pytest_args(root, "reports/parity.xml")]
    lane = interrupt_once_started(argv, started=started, runs=2, cwd=root, env=env)
    assert lane.returncode == 130, lane.out + lane.err
    assert "parity: interrupted by SIGINT" in lane.err and "Traceback" not in lane.err, lane.err
    for pid in lane.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert list(tmp.iterdir()) == []
