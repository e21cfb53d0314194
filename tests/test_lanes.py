"""canarchy.testing.lanes: environments, a project's layout, copies, the unit and parity lanes, interrupts."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import contextlib
import locale
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from canarchy.testing.lanes import __main__ as lanes_cli
from canarchy.testing.lanes import env as lane_env
from canarchy.testing.isolation.tree import changes, snapshot
from canarchy.testing.lanes import parity, runner, unit, verdict, workspace
from canarchy.testing.lanes import netns as lane_netns
from canarchy.testing.lanes.project import Project, ProjectError, load_project
from tests.helpers import AS_IN_A_TERMINAL, PYTEST, WAITING_TEST, interrupt_once_started, resource_warnings

REPO = Path(__file__).resolve().parents[1]

HOSTILE_SHELL = {
    "PATH": "/usr/bin:/bin",
    "LANG": "ja_JP.UTF-8",
    "LC_ALL": "ja_JP.UTF-8",
    "LC_TIME": "fr_FR.UTF-8",
    "TZ": "Asia/Tokyo",
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
    assert env == {  # the caller's time zone and locale are not the run's: both decide tests (time.localtime)
        "PATH": "/usr/bin:/bin",
        "TZ": "UTC",
        "LANG": "C.UTF-8",
        "HOME": str(tmp_path),
        "USERPROFILE": str(tmp_path),
        "PYTHONHASHSEED": "7",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        # the caller's home, which the plugin protects as the operator's (HOME names the lane's own)
        lane_env.OPERATOR_HOMES_VARIABLE: HOSTILE_SHELL["HOME"],
    }


def test_build_env_verdict_does_not_depend_on_the_callers_shell(tmp_path):
    clean = {k: HOSTILE_SHELL[k] for k in ("PATH", "HOME")}
    assert lane_env.build_env(home=tmp_path, source=HOSTILE_SHELL) == lane_env.build_env(home=tmp_path, source=clean)


def test_the_caller_s_home_is_protected_in_a_lane_s_run_whose_home_is_the_lane_s_own(tmp_path):
    """A lane's run has a HOME of its own; the home of whoever started nox (a container's or a CI job's, not the
    account's) reaches the plugin as the operator's, and a test writing there is refused at that moment. An
    inner lane (nox's lane process building its pytest's environment) keeps the outermost caller's; the tests do
    not see the variable."""
    caller = tmp_path / "caller-home"
    (caller / ".config").mkdir(parents=True)
    shell = {"PATH": os.environ["PATH"], "HOME": str(caller)}
    outer = lane_env.build_env(home=tmp_path / "nox-lane-home", source=shell)
    inner = lane_env.build_env(home=tmp_path / "run-home", source=outer)
    assert inner[lane_env.OPERATOR_HOMES_VARIABLE] == str(caller) and inner["HOME"] == str(tmp_path / "run-home")
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "tests" / "conftest.py").write_text('pytest_plugins = ["canarchy.testing.isolation.plugin"]\n')
    (project / "tests" / "test_writes.py").write_text(
        "import os\ndef test_writes_the_caller_s_home():\n"
        f"    open({str(caller / '.config' / 'leak.txt')!r}, 'w').close()\n"
        "def test_sees_no_caller_s_home():\n    assert 'PYTEST_CANARCHY_OPERATOR_HOMES' not in os.environ\n")
    (tmp_path / "run-home").mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=project,
                          env={**inner, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "test_writes_the_caller_s_home tried to open for writing" in done.stdout, done.stdout
    assert "1 failed, 1 passed" in done.stdout and not (caller / ".config" / "leak.txt").exists()


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
    import importlib.metadata

    site = tmp_path / "site"
    _installed_plugin(site)
    # control: the planted distribution carries the pytest11 entry point pytest's autoload reads
    [dist] = importlib.metadata.distributions(path=[str(site)])
    assert [(e.group, e.value) for e in dist.entry_points] == [("pytest11", "planted_plugin")]
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_a.py").write_text("def test_a(): pass\n")
    env = lane_env.build_env(home=tmp_path / "home", source={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": ""},
                             extra={"PYTHONPATH": str(site)})
    run = runner.run_pytest(["-p", "no:cacheprovider", "--junitxml=reports/a.xml", "test_a.py"], env=env,
                            log=tmp_path / "a.log", cwd=project)
    assert run.returncode == 0, run.output
    assert not (project / ".installed-plugin-was-here").exists()


@pytest.mark.parametrize(
    "posargs, fixed, expected",
    [
        ([], None, ["tests"]),
        (["tests/test_cli.py::test_a", "-k", "json"], None, ["-k", "json", "tests/test_cli.py::test_a"]),
        (["-k=json", "-m", "not slow", "--deselect", "tests/x.py::t"], None,
         ["-k", "json", "-m", "not slow", "--deselect", "tests/x.py::t", "tests"]),
        (["tests/test_integration.py"], "integration", ["tests/test_integration.py"]),
    ],
)
def test_choose_tests_accepts_selection_only(posargs, fixed, expected):
    assert lane_env.choose_tests(posargs, fixed_markexpr=fixed) == expected


@pytest.mark.parametrize(("posargs", "own", "rest"), [
    (["--strict", "tests/test_cli.py", "--shards", "3", "-k", "json"], ["--strict", "--shards", "3"],
     ["tests/test_cli.py", "-k", "json"]),
    (["--jobs=2", "--seeds"], ["--jobs=2", "--seeds", ""], []),  # a missing value: the lane's parser refuses ""
    (["--strictly", "-x"], [], ["--strictly", "-x"]),
])
def test_a_nox_session_takes_its_lane_s_options_out_of_the_posargs(posargs, own, rest):
    assert lane_env.lane_options(posargs, flags=("--strict",), valued=("--shards", "--jobs", "--seeds")) == (own, rest)


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


@pytest.mark.parametrize("path", ["/tmp/elsewhere/test_evil.py", "../other-checkout/tests",
                                  "tests/../../x/test_a.py::t"])
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


def test_operator_home_fixture_is_complete():
    """The files the parity lane relies on (fixtures/operator-home/README.md) are all there."""
    home = Path(__file__).resolve().parents[1] / "fixtures" / "operator-home"
    files = {k for k, e in snapshot(home, walk="whole").items() if e.kind == "file"}
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
    for line in ('interface = "udp_multicast"', 'default_interface = "vcan-operator"', "require_active_ack = true",
                 "[plugins.example]"):
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
    assert lane_netns._probe_netns() == lane_netns.NetnsSupport(
        False, "network namespaces are Linux-only (this is darwin)")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    support = lane_netns._probe_netns()
    assert support.flags == ("--user", "--map-root-user", "--net")  # another user: a user namespace too
    if support.available:  # unprivileged user namespaces allowed here: the wrapped command gets them
        assert lane_netns.netns_command(["true"], support)[1:4] == ["--user", "--map-root-user", "--net"]
    else:
        assert "unshare --user --map-root-user --net` failed" in support.reason and "as root" in support.reason


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


@pytest.mark.parametrize("args", [[], ["--junitxml=a.xml", "--junitxml=b.xml"], ["--junitxml", "a.xml"]])
def test_junit_path_must_be_given_once(args):
    with pytest.raises(ValueError, match="exactly one --junitxml"):
        runner.junit_path(args)


# --------------------------------------------------------------------------- a project's layout


PYPROJECT = """
[tool.pytest.ini_options]
addopts = ["-p", "canarchy.testing.isolation.plugin"]
xfail_strict = true
canarchy_network_namespace = true

[tool.canarchy.lanes]
operator_home = "operator-home"
"""


def _project(root: Path, tests: str, *, pyproject: str = PYPROJECT) -> Project:
    """A tiny project under the plugin: tests/test_p.py holding ``tests``, an operator home
    with a config that names a default interface, a git work tree."""
    (root / "tests").mkdir(parents=True)
    (root / "pyproject.toml").write_text(pyproject)
    (root / "tests" / "test_p.py").write_text(tests)
    home = root / "operator-home" / ".canarchy"
    home.mkdir(parents=True)
    (home / "config.toml").write_text('[transport]\ndefault_interface = "vcan-operator"\n')
    (root / ".gitignore").write_text("reports/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True, capture_output=True)
    return load_project(root)


def test_parity_without_its_operator_home_cannot_decide_and_says_what_to_make(tmp_path, capsys):
    """An operator home named in pyproject but never made: a verdict naming it, not a traceback."""
    project = _project(tmp_path / "p", "def test_ok():\n    pass\n")
    shutil.rmtree(project.root / "operator-home")
    code = lanes_cli.main(["--project", str(project.root), "parity"])
    out = capsys.readouterr().out
    assert code == 2 and "parity: CANNOT DECIDE" in out and "operator-home" in out and "not a directory" in out, out


def test_a_flat_and_a_src_layout_are_read_from_pyproject(tmp_path):
    flat = tmp_path / "flat"
    (flat / "pkg").mkdir(parents=True)
    (flat / "pyproject.toml").write_text('[project]\nname = "pkg"\n[tool.pytest.ini_options]\ntestpaths = ["t"]\n')
    project = load_project(flat)
    assert (project.packages, project.source, project.tests, project.install) == (("pkg",), flat.resolve(), ("t",),
                                                                                  ("-e", "."))
    assert project.module_of("pkg/guard.py") == "pkg.guard" and project.module_of("pkg/__init__.py") == "pkg"
    src = tmp_path / "srcl"
    (src / "src" / "my_pkg").mkdir(parents=True)
    (src / "pyproject.toml").write_text('[project]\nname = "my-pkg"\n[project.optional-dependencies]\ntest = []\n')
    project = load_project(src)
    assert project.packages == ("my_pkg",) and project.source == (src / "src").resolve()
    assert project.module_of("src/my_pkg/a/b.py") == "my_pkg.a.b" and project.install == ("-e", ".[test]")
    assert project.import_root() == str((src / "src").resolve())
    with pytest.raises(ProjectError, match="not under the project's source directory"):
        project.module_of("tools/x.py")


@pytest.mark.parametrize("file", ["dateutil/test/test_easter.py", "dateutil/test/_common.py",
                                  "dateutil/conftest.py", "dateutil/x_solution.py"])
def test_a_test_module_inside_the_package_is_no_module_a_mutation_may_edit(tmp_path, file):
    """python-dateutil keeps its tests in the package (dateutil/test/, testpaths = dateutil/test docs): its test
    modules are under the source directory, yet a mutation of one proves nothing about the code (the lane said
    KILLED for a killer whose own body the mutant broke). A package among testpaths for its doctests
    (sortedcontainers: ``testpaths = docs sortedcontainers tests``) still holds code a mutation may edit."""
    (tmp_path / "dateutil" / "test").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n')
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\ntestpaths = dateutil/test docs dateutil\n"
                                        "python_files = test_*.py *_solution.py\n")
    project = load_project(tmp_path)
    assert project.module_of("dateutil/easter.py") == "dateutil.easter"
    assert project.module_of("dateutil/tz/tz.py") == "dateutil.tz.tz"
    with pytest.raises(ProjectError, match=r"a module of the project's tests .*not a test or its conftest"):
        project.module_of(file)


@pytest.mark.parametrize("file", ["dateutil/test/_common.py", "dateutil/test/__init__.py",
                                  "dateutil/test/property/__init__.py"])
def test_a_helper_of_the_tests_inside_the_package_is_no_module_a_mutation_may_edit(tmp_path, file):
    """python-dateutil 2.8 as released sets no testpaths: its tests' helpers (``dateutil/test/_common.py``)
    were taken for code, a mutation of one said KILLED of a killer whose own helper it broke. A subpackage
    holding a conftest.py or a module pytest collects (python_files) is the tests'; the top-level package and
    the code beside it are not."""
    for name in ("dateutil/__init__.py", "dateutil/easter.py", "dateutil/tz/__init__.py", "dateutil/test/__init__.py",
                 "dateutil/test/conftest.py", "dateutil/test/_common.py", "dateutil/test/property/__init__.py",
                 "dateutil/test/property/test_prop.py", "dateutil/conftest.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\npython_files = test_*.py *_solution.py\n")
    project = load_project(tmp_path)
    assert project.module_of("dateutil/easter.py") == "dateutil.easter"
    assert project.module_of("dateutil/tz/__init__.py") == "dateutil.tz"
    with pytest.raises(ProjectError, match=r"a module of the project's tests .*not a test or its conftest"):
        project.module_of(file)


@pytest.mark.parametrize("files, install", [
    ({"setup.cfg": "[metadata]\nname = x\n[options.extras_require]\ntest =\n    canarchy[lanes] @ file:///c\n"},
     ("-e", ".[test]")),
    ({"setup.cfg": "[metadata]\nname = x\n[options.extras_require]\ndocs = sphinx\n"}, ("-e", ".")),
    ({"setup.cfg": "[metadata]\nname = x\n"}, ("-e", ".")),
    ({"pyproject.toml": '[project]\nname = "x"\ndynamic = ["optional-dependencies"]\n',
      "setup.cfg": "[options.extras_require]\ntest = pytest\n"}, ("-e", ".[test]")),
    ({"pyproject.toml": '[project]\nname = "x"\n[project.optional-dependencies]\ntests = ["hypothesis"]\n'},
     ("-e", ".[tests]")),
    ({"pyproject.toml": '[project]\nname = "x"\n[project.optional-dependencies]\ntests = ["a"]\ntest = ["b"]\n'},
     ("-e", ".[test]")),
], ids=["setup.cfg-test-extra", "setup.cfg-other-extra", "setup.cfg-no-extras", "dynamic-from-setup.cfg",
        "tests-extra", "test-before-tests"])
def test_a_setuptools_project_s_test_extra_in_setup_cfg_is_what_the_lanes_install(tmp_path, files, install):
    """A project whose metadata is in setup.cfg (python-dateutil) declares its extras in [options.extras_require]:
    the lanes install its test extra, which brings canarchy, as they do a [project.optional-dependencies] one.
    A project whose extra is named ``tests`` (attrs) gets that one: the lanes installed ``-e .`` and stopped,
    "did not install canarchy's harness", where canarchy was listed beside the suite's own needs."""
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n')
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert load_project(tmp_path).install == install


def test_a_project_without_pyproject_toml_is_read_as_with_an_empty_lanes_table(tmp_path):
    """A setuptools project with only setup.py and setup.cfg: the lanes take their defaults (tests from its
    pytest section, its test extra), as for a pyproject.toml without [tool.canarchy.lanes]."""
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n[options.extras_require]\ntest = pytest\n"
                                        "[tool:pytest]\ntestpaths = checks\n")
    project = load_project(tmp_path)
    assert (project.install, project.tests, project.source) == (("-e", ".[test]"), ("checks",), tmp_path.resolve())


def test_pytest_9_s_native_table_is_the_project_s_configuration(tmp_path):
    """``[tool.pytest]`` with native TOML types (pytest 9; humanize keeps its settings there): the lanes take the
    tests, the plugin and the scrubbed prefixes from it, as from ``[tool.pytest.ini_options]``."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest]\ntestpaths = ["checks"]\naddopts = ["-p", "canarchy.testing.isolation.plugin"]\n'
        'canarchy_scrub_prefixes = ["HUMANIZE_"]\n')
    project = load_project(tmp_path)
    assert (project.tests, project.uses_plugin, project.scrub_prefixes) == (("checks",), True, ("HUMANIZE_",))


def test_a_noxfile_over_a_project_the_lanes_cannot_read_stops_with_the_reason_and_no_traceback(tmp_path):
    """nox prints a traceback of its loader for any error a noxfile raises: the sessions' module says what is
    wrong with the project's table instead, and nox exits 2."""
    (tmp_path / "pyproject.toml").write_text("[tool.canarchy.lanes]\ntestz = ['t']\n")
    (tmp_path / "noxfile.py").write_text("from canarchy.testing.lanes.noxsessions import *\n")
    done = subprocess.run([sys.executable, "-m", "nox", "-l"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 2, done
    assert "unknown keys ['testz']" in done.stderr and "Traceback" not in done.stderr, done.stderr


class _Session:
    """What :func:`noxsessions.install` uses of a nox session; ``found``: the probe's output."""

    def __init__(self, found: str | None):
        self.found, self.installed = found, []

    def install(self, *args: str, env: dict | None = None) -> None:
        self.installed.append(args)

    def run(self, *args: str, silent: bool = False, **kwargs: object) -> str | None:
        return self.found

    def error(self, message: str) -> None:
        raise RuntimeError(message)


def test_a_nox_session_whose_install_brings_no_canarchy_stops_saying_what_to_list(monkeypatch, tmp_path):
    """`-e .` of a project whose test extra the lanes do not see (or that lacks canarchy) leaves the session's
    virtualenv without canarchy: the session says so and what to list, not Python's "No module named 'canarchy'"."""
    monkeypatch.chdir(REPO)  # the module reads the project nox runs in
    from canarchy.testing.lanes import noxsessions

    with pytest.raises(RuntimeError, match=r"did not install canarchy's harness .*canarchy\[lanes\] @ .*"
                                           r"another project.*\[options.extras_require\]"):
        noxsessions.install(_Session("False\n"))
    (tmp_path / "other" / "canarchy").mkdir(parents=True)  # PyPI's canarchy: no testing package
    (tmp_path / "other" / "canarchy" / "__init__.py").write_text("")
    for path, said in ((tmp_path / "none", "False"), (tmp_path / "other", "False"), (REPO, "True")):
        # -S: no site-packages (this interpreter's canarchy), only PYTHONPATH's
        probe = subprocess.run([sys.executable, "-S", "-c", noxsessions.HARNESS_PROBE], capture_output=True,
                               text=True, env={"PYTHONPATH": str(path), "PATH": os.environ["PATH"]}, cwd=tmp_path)
        assert probe.stdout.strip() == said, (path, probe.stdout, probe.stderr)
    for found in ("True\n", None):  # None: nox --install-only runs no command
        session = _Session(found)
        noxsessions.install(session)
        assert session.installed == [noxsessions.PROJECT.install]


def test_a_project_s_test_dependency_group_is_installed_beside_it(monkeypatch, tmp_path):
    """structlog keeps its suite's needs in a PEP 735 dependency group (``[dependency-groups] tests``), not an
    extra: the lanes installed ``-e .`` alone and the session stopped without canarchy. With no test extra, the
    ``test`` (else ``tests``) group is installed beside the project, its included groups expanded by nox;
    ``install_groups`` names others."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[dependency-groups]\ntests = ["canarchy[lanes] @ file:///c", '
        '{include-group = "typing"}]\ntyping = ["mypy"]\ndocs = ["sphinx"]\n')
    project = load_project(tmp_path)
    assert (project.install, project.install_groups) == (("-e", "."), ("tests",))
    monkeypatch.chdir(REPO)  # the module reads the project nox runs in
    from canarchy.testing.lanes import noxsessions

    monkeypatch.setattr(noxsessions, "PROJECT", project)
    session = _Session("True\n")
    noxsessions.install(session)
    assert session.installed == [("-e", ".", "canarchy[lanes] @ file:///c", "mypy")]
    with open(tmp_path / "pyproject.toml", "a") as handle:
        handle.write('[project.optional-dependencies]\ntest = ["pytest"]\n[tool.canarchy.lanes]\n'
                     'install_groups = ["docs"]\n')
    project = load_project(tmp_path)  # an extra wins; a group the table names is installed beside it
    assert (project.install, project.install_groups) == (("-e", ".[test]"), ("docs",))


SIGTERM_TO_NOX = """
import os, signal
from canarchy.testing.lanes import noxsessions

class Session:  # what noxsessions.lane uses of a nox session
    posargs = []
    def run(self, *args, env=None, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # nox's own process gets it, as from `timeout nox`

noxsessions.lane(Session(), "unit")
"""


def test_a_sigterm_to_nox_during_a_lane_ends_it_as_ctrl_c_and_removes_the_lane_s_home(tmp_path):
    """SIGTERM's default action ends nox at once, before the session removes the home it made for the lane:
    within the lane a SIGTERM is a Ctrl+C, which nox passes on to the lane, and the home goes."""
    temp = tmp_path / "temp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-c", SIGTERM_TO_NOX], cwd=REPO, env={**os.environ, "TMPDIR": str(temp)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGINT and "KeyboardInterrupt" in done.stderr, done  # not -SIGTERM
    assert not list(temp.iterdir()), done  # canarchy-lane-unit-home-*


NOX_RUNNING_A_LANE = '''
import os, sys
from nox import popen
from canarchy.testing.lanes import noxsessions

LANE = """
import sys, time
from canarchy.testing.lanes import runner

def stop_all():  # what the lane's interrupts() runs on its way out: did a copy of the signal make it hurry?
    time.sleep(0.5)
    print("lane: further interrupts", len(runner._HURRY), flush=True)

runner.stop_all = stop_all
runner.own_signals()
try:
    with runner.interrupts():
        print("lane: ready", flush=True)  # in the block: a signal before it would be noted, and raised at its start
        time.sleep(300)
except runner.Interrupted as exc:
    print("lane: interrupted by", exc.name, flush=True)
    sys.exit(exc.exit_code)
"""

class Session:  # what noxsessions.lane uses of a nox session; the lane runs as nox runs it (nox.popen.popen)
    posargs = []
    def run(self, *args, env=None, include_outer_env=True, **kwargs):
        env = {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # the canarchy this process imported
        # nox waits that long for the lane before its own SIGTERM (STOP_IN_TIME): longer than the test waits
        popen.popen([sys.executable, "-c", LANE], env=env, **{**kwargs, "interrupt_timeout": 300})

noxsessions.lane(Session(), "unit")
'''


@pytest.mark.parametrize("how", ["SIGTERM to nox", "SIGINT to nox", "Ctrl+C", "Ctrl+C twice", "nox killed"])
def test_a_signal_to_nox_reaches_the_lane_once(tmp_path, how):
    """nox passes no signal on to the lane (its popen counts on the terminal's process group) and then waits
    for it or ends: a SIGTERM or SIGINT to nox's pid alone (``kill``, ``timeout``, a cancelled CI job) let the
    lane run on and report after nox said "interrupted", or left it orphaned. The session passes each on; a
    Ctrl+C, which the lane gets from the terminal and from nox, is one interrupt, not two (no hurry); a second
    Ctrl+C cuts nox's own wait short, and the session still waits for the lane (nox ended, the prompt back,
    while the lane still removed its trees); when nox is killed, the kernel sends the lane a SIGTERM."""
    temp = tmp_path / "temp"
    temp.mkdir()
    nox = subprocess.Popen([*AS_IN_A_TERMINAL, sys.executable, "-c", NOX_RUNNING_A_LANE], cwd=REPO,
                           env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        assert nox.stdout.readline() == "lane: ready\n"
        if how.startswith("Ctrl+C"):
            os.killpg(nox.pid, signal.SIGINT)  # the terminal's process group: nox and the lane
            if how == "Ctrl+C twice":
                time.sleep(0.3)  # within the lane's 0.5 s stop
                os.killpg(nox.pid, signal.SIGINT)  # nox's own wait for the lane ends (KeyboardInterrupt in it)
        else:
            nox.send_signal({"SIGTERM to nox": signal.SIGTERM, "SIGINT to nox": signal.SIGINT,
                             "nox killed": signal.SIGKILL}[how])
        out, _ = nox.communicate(timeout=60)  # to the end of the output: the lane's too, once nox is gone
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(nox.pid, signal.SIGKILL)
    name = "SIGTERM" if how in ("SIGTERM to nox", "nox killed") else "SIGINT"
    assert f"lane: interrupted by {name}" in out and "lane: further interrupts 0" in out, out
    if how != "nox killed":  # nox waited for the lane, then removed its home and the pid file
        assert nox.returncode == -signal.SIGINT and not list(temp.iterdir()), (out, list(temp.iterdir()))
        assert out.index(f"lane: interrupted by {name}") < out.index("KeyboardInterrupt"), out  # the lane first


@pytest.mark.parametrize("name, posargs, own", [
    ("unit", ["--jobs", "1", "tests/test_a.py", "-k", "json"], ["--jobs", "1"]),
    ("unit", ["tests/test_a.py", "--jobs=0"], ["--jobs=0"]),
    ("parity", ["--strict", "tests/test_a.py", "--shards", "2"], ["--strict", "--shards", "2"]),
    ("order", ["--seeds", "3", "-k", "json"], ["--seeds", "3"]),
])
def test_a_nox_session_passes_its_lane_s_own_options_and_leaves_the_rest_to_choose_tests(monkeypatch, name, posargs,
                                                                                         own):
    """``nox -s unit -- --jobs 1 tests/...``: the session gives the lane its own options before ``--`` and the
    rest after it, as the lane's parser expects (a lane's option after ``--`` would be refused as a test choice)."""
    from canarchy.testing.lanes import noxsessions

    class Session:  # what the sessions use of a nox session
        def __init__(self) -> None:
            self.posargs, self.ran = list(posargs), []

        def run(self, *args, **kwargs):
            self.ran.append(args)

    monkeypatch.setattr(noxsessions, "install", lambda session: None)
    session = Session()
    getattr(noxsessions, name)(session)
    [ran] = session.ran
    rest = [arg for arg in posargs if arg not in own]
    assert list(ran) == ["python", "-m", "canarchy.testing.lanes", name, *own, "--", *rest], ran


@pytest.mark.parametrize("files, config", [
    ({"tox.ini": "[tox]\nenvlist = py\n[pytest]\n{options}"}, "tox.ini"),
    ({"setup.cfg": "[metadata]\nname = x\n[tool:pytest]\n{options}", "tox.ini": "[tox]\nenvlist = py\n"}, "setup.cfg"),
    ({"pytest.ini": "[pytest]\n{options}", "tox.ini": "[pytest]\naddopts = -q\n"}, "pytest.ini"),
    ({"pyproject.toml": '[project]\nname = "x"\n[tool.pytest.ini_options]\ntestpaths = ["testing", "more"]\n'
                        'addopts = ["-p", "canarchy.testing.isolation.plugin"]\n'
                        'canarchy_scrub_prefixes = ["X_", "CAN_"]\n',
      "tox.ini": "[pytest]\naddopts = -q\n"}, "pyproject.toml"),
], ids=["tox.ini", "setup.cfg", "pytest.ini-first", "pyproject-before-tox.ini"])
def test_the_pytest_configuration_is_read_from_the_file_pytest_reads(tmp_path, files, config):
    """The lanes take the project's tests, plugin and scrubbed prefixes from the file pytest takes its
    configuration from (pytest 9's order), not from pyproject.toml alone; the mutation lane passes that file."""
    from _pytest.config.findpaths import locate_config

    options = ("addopts = -p canarchy.testing.isolation.plugin\ntestpaths = testing\n    more\n"
               "canarchy_scrub_prefixes = X_ CAN_\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    for name, text in files.items():
        (tmp_path / name).write_text(text.format(options=options))
    project = load_project(tmp_path)
    found = locate_config(tmp_path, [tmp_path])[1]  # pytest's own choice
    assert project.pytest_config == config == found.name
    assert (project.tests, project.uses_plugin, project.scrub_prefixes) == (("testing", "more"), True, ("X_", "CAN_"))


def test_an_ini_file_s_names_keep_their_case_as_pytest_reads_them(tmp_path):
    """``Testpaths`` is not pytest's ``testpaths`` (pytest warns it is unknown): the lanes run the tests pytest
    would, not the ones a case-folding reader finds."""
    from _pytest.config.findpaths import locate_config

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (tmp_path / "tox.ini").write_text("[pytest]\nTestpaths = testing\nCanarchy_Scrub_Prefixes = X_\n")
    options = locate_config(tmp_path, [tmp_path])[2]  # pytest's own reading
    assert "testpaths" not in options and "canarchy_scrub_prefixes" not in options
    project = load_project(tmp_path)
    assert (project.tests, project.scrub_prefixes) == ((".",), ())


@pytest.mark.parametrize("table, message", [
    ('packages = "x"\nunknown = 1', "unknown keys"),
    ('operator_home = "../elsewhere"', "outside the project root"),
    ("packages = []", "non-empty list"),
])
def test_a_bad_lanes_table_is_named(tmp_path, table, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.canarchy.lanes]\n{table}\n")
    with pytest.raises(ProjectError, match=message):
        load_project(tmp_path)


def test_canarchy_s_own_layout():
    project = load_project(REPO)
    assert project.packages == ("canarchy",) and project.source == REPO and project.tests == ("tests",)
    assert project.operator_home == REPO / "fixtures" / "operator-home"
    assert project.mutations == REPO / "fixtures" / "mutations" and project.uses_plugin


def test_a_copy_holds_what_git_would_commit(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    (root / "pkg" / "tracked.py").write_text("x")
    (root / "untracked.txt").write_text("y")
    (root / ".gitignore").write_text("ignored/\n")
    (root / "ignored").mkdir()
    (root / "ignored" / "big.bin").write_text("z")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "pkg"], check=True)
    assert workspace.tree_files(root) == [".gitignore", "pkg/tracked.py", "pyproject.toml", "untracked.txt"]
    dest = tmp_path / "copy"
    dest.mkdir()
    assert workspace.copy_tree(root, dest) == 4 and not (dest / "ignored").exists()
    plain = tmp_path / "plain"
    for name in ("a.py", "venv/pyvenv.cfg", "venv/lib/x.py", ".tox/y", "src/pkg/m.py", "src/pkg/__pycache__/m.pyc"):
        (plain / name).parent.mkdir(parents=True, exist_ok=True)
        (plain / name).write_text("")
    assert workspace.tree_files(plain) == ["a.py", "src/pkg/m.py"]


def test_what_git_ignores_in_the_checkout_is_no_change_of_a_copy(tmp_path):
    """A copy's changes leave out what git ignores in the checkout (a tool's output, as pytest-benchmark's
    ``.benchmarks/`` made as pytest starts: the sentinel does not watch it either), a directory rule too; what git
    would show stays a change; outside a work tree every change counts."""
    root, copy = tmp_path / "repo", tmp_path / "copy"
    root.mkdir()
    (root / ".gitignore").write_text(".benchmarks/\n*.log\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    copy.mkdir()
    before = snapshot(copy)
    for name in (".benchmarks/Linux-CPython/0001.json", "tests/run.log", "tests/scratch.txt"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text("x")
    after = snapshot(copy)
    assert workspace.copy_changes(root, before, after) == ["added: tests", "added: tests/scratch.txt"]
    assert len(workspace.copy_changes(tmp_path / "no-repo", before, after)) == len(changes(before, after)) > 2


@pytest.mark.parametrize(("lane", "stray"), [  # each lane and each kind of file once: one place gives the flags
    (["unit", "--jobs", "0"], ("pytest.ini", "[pytest]\n")), (["parity"], ("pytest.toml", "[pytest]\n")),
    (["order", "--seeds", "0"], ("tests/tox.ini", "[pytest]\n")), (["unit"], ("tests/setup.cfg", "[tool:pytest]\n")),
], ids=["unit-pytest.ini", "parity-pytest.toml", "order-tox.ini", "unit-xdist-setup.cfg"])
def test_a_stray_configuration_that_drops_the_plugin_runs_no_test_in_any_lane(tmp_path, capsys, lane, stray):
    """A pytest.ini or pytest.toml beside pyproject.toml (a tox.ini or setup.cfg nearer the tests) shadowing its
    addopts would run the suite without the plugin: each lane loads the plugin itself
    (:func:`~canarchy.testing.lanes.runner.pytest_flags`), which names the stray file and refuses the run first."""
    ran = tmp_path / "ran"
    # testpaths: the lanes give pytest `tests`, from which it finds a tox.ini or setup.cfg there first (without
    # testpaths they give `.`, as a plain pytest collects from the root, and the file is not pytest's)
    project = _project(tmp_path / "p", f"def test_runs():\n    open({str(ran)!r}, 'a').write('ran')\n",
                       pyproject=PYPROJECT.replace("xfail_strict", 'testpaths = ["tests"]\nxfail_strict'))
    (project.root / stray[0]).write_text(stray[1])
    code = lanes_cli.main(["--project", str(project.root), *lane])
    out = capsys.readouterr().out
    assert not ran.exists(), f"a test ran unisolated under the stray {stray[0]}:\n{out}"
    assert code == 2 and "CANNOT DECIDE" in out and f"{stray[0]} shadows the project's configuration" in out, out


def test_the_plugin_named_twice_is_loaded_once(tmp_path):
    """The lanes' ``-p`` beside the project's own: one plugin, one isolated run."""
    project = _project(tmp_path / "p", "def test_ok():\n    pass\n")
    junit = tmp_path / "r.xml"
    env = lane_env.build_env(home=tmp_path / "home", extra={"PYTHONPATH": str(REPO)})
    done = runner.run_pytest([*runner.pytest_flags(project), "-p", "canarchy.testing.isolation.plugin",
                              f"--junitxml={junit}", "tests"], env=env, cwd=project.root)
    assert runner.pytest_flags(project).count("canarchy.testing.isolation.plugin") == 1
    assert done.returncode == 0 and "1 passed" in done.output, done.output
    assert done.output.count("session layer started") == 1, done.output


GENERATED_PYPROJECT = PYPROJECT + """
[project]
name = "genpkg"
"""


def _generated_project(root: Path) -> Project:
    """A src-layout project whose package imports a git-ignored generated ``_version.py`` (as hatch-vcs makes)
    and reads an ignored data file beside it; byte code, a tool cache, a virtualenv and a build output lie
    under the import root or beside it, ignored too."""
    _project(root, "import genpkg\n\ndef test_version():\n    assert genpkg.__version__ == '1.2.3'\n"
               "    assert genpkg.data() == 'table'\n", pyproject=GENERATED_PYPROJECT)
    pkg = root / "src" / "genpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from importlib.resources import files\n\nfrom genpkg._version import "
                                     "__version__\n\ndef data():\n    return files(__name__).joinpath("
                                     "'table.dat').read_text()\n")
    for name, text in (("src/genpkg/_version.py", "__version__ = '1.2.3'\n"), ("src/genpkg/table.dat", "table"),
                       ("src/genpkg/__pycache__/x.cpython-311.pyc", ""), ("src/.mypy_cache/x.json", ""),
                       ("src/.venv/pyvenv.cfg", ""), ("src/.venv/lib/site.py", ""), ("build/lib/genpkg/a.py", "")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / ".gitignore").write_text("reports/\n_version.py\n*.dat\n__pycache__/\n.mypy_cache/\n.venv/\nbuild/\n")
    return load_project(root)


def test_a_copy_holds_what_git_ignores_under_the_import_root_that_an_import_loads(tmp_path):
    project = _generated_project(tmp_path / "p")
    files = workspace.tree_files(project.root, project)
    assert "src/genpkg/_version.py" in files and "src/genpkg/table.dat" in files, files
    assert [f for f in files if "__pycache__" in f or "mypy" in f or ".venv" in f or f.startswith("build/")] == []
    assert "src/genpkg/_version.py" not in workspace.tree_files(project.root)  # what git would commit alone


def test_parity_runs_a_package_that_imports_a_generated_ignored_module(tmp_path):
    """hatch-vcs's ``_version.py`` is git-ignored: without it in the copies the test failed in both twins alike."""
    project = _generated_project(tmp_path / "p")
    result = parity.run_parity(project, ["tests"], source_env=os.environ, reruns=1, reports=tmp_path / "reports")
    outcomes = {name: [c.outcome for c in twin.report.cases.values()] for name, twin in result.twins.items()}
    assert outcomes == {"clean": ["passed"], "operator": ["passed"]}, parity.render(result)


XDIST_PYPROJECT = PYPROJECT.replace('addopts = ["-p", "canarchy.testing.isolation.plugin"]',
                                   'addopts = ["-p", "canarchy.testing.isolation.plugin", "-n", "2"]')


@pytest.mark.parametrize("lane", [["unit", "--jobs", "0"], ["parity"], ["order", "--seeds", "0"]])
def test_a_project_s_own_n_in_addopts_runs_serially_where_the_lane_does(tmp_path, capsys, lane):
    """``-n 2`` in addopts, pytest-xdist not named (an everyday run has it autoloaded): a lane loads it and
    gives its own ``-n``, so it is neither an unrecognized argument nor workers where the lane runs serially."""
    assert 'addopts = ["-p", "canarchy.testing.isolation.plugin", "-n", "2"]' in XDIST_PYPROJECT
    project = _project(tmp_path / "p", "import os\n\ndef test_serial():\n"
                       "    assert 'PYTEST_XDIST_WORKER' not in os.environ\n", pyproject=XDIST_PYPROJECT)
    code = lanes_cli.main(["--project", str(project.root), *lane])
    out = capsys.readouterr().out
    assert code == 0 and "unrecognized arguments" not in out, out


def test_an_unrecognized_argument_is_named_with_pytest_s_own_line_and_a_hint(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("ERROR: usage: __main__.py [options] [file_or_dir] [file_or_dir] [...]\n"
                   "__main__.py: error: unrecognized arguments: --reruns\n  inifile: pyproject.toml\n")
    said = verdict.stopped_text(runner.Run(["pytest"], 4, log, 0.0))
    assert "pytest exit code 4: a usage error (pytest: __main__.py: error: unrecognized arguments: --reruns;" in said
    assert "name it in addopts with -p" in said, said


XDIST_INTERNAL_ERROR = """\
created: 4/4 workers
INTERNALERROR> def worker_internal_error(
INTERNALERROR>         self, node: WorkerController, formatted_error: str
INTERNALERROR> >           assert False, formatted_error
INTERNALERROR> E           AssertionError: Traceback (most recent call last):
INTERNALERROR> E               File "/x/_pytest/main.py", line 289, in wrap_session
INTERNALERROR> E                 item.add_marker(pytest.mark.no_cover)
INTERNALERROR> E             Failed: 'no_cover' not found in `markers` configuration option
INTERNALERROR> E           assert False
INTERNALERROR>   File "/x/xdist/dsession.py", line 218, in worker_workerfinished
INTERNALERROR>     self._active_nodes.remove(node)
INTERNALERROR> KeyError: <WorkerController gw0>
"""
SERIAL_INTERNAL_ERROR = """\
INTERNALERROR> Traceback (most recent call last):
INTERNALERROR>   File "/x/_pytest/main.py", line 289, in wrap_session
INTERNALERROR>     raise ZeroDivisionError("the conftest's hook divided")
INTERNALERROR> ZeroDivisionError: the conftest's hook divided
"""


@pytest.mark.parametrize("log, said, hint", [
    (XDIST_INTERNAL_ERROR, "INTERNALERROR> Failed: 'no_cover' not found in `markers` configuration option;", True),
    (SERIAL_INTERNAL_ERROR, "INTERNALERROR> ZeroDivisionError: the conftest's hook divided)", False),
], ids=["xdist-unregistered-marker", "serial"])
def test_an_internal_error_is_named_by_its_exception_not_its_traceback_s_first_line(tmp_path, log, said, hint):
    """python-dateutil's conftest marks items ``no_cover``, a marker pytest-cov registers: with the plugin not
    loaded, pytest stops with an INTERNALERROR whose first line is a traceback's (xdist's ``def
    worker_internal_error(``); the lane names the exception, and hints at the plugin when it is a marker."""
    (tmp_path / "run.log").write_text(log)
    text = verdict.stopped_text(runner.Run(["pytest"], 3, tmp_path / "run.log", 0.0))
    assert text.startswith("pytest exit code 3: an internal error (pytest: ") and said in text, text
    assert ("a marker of a pytest plugin? the lanes load none that is merely installed" in text) is hint, text


def test_a_conftest_marking_items_with_an_unregistered_marker_is_named_by_the_unit_lane(tmp_path, capsys):
    project = _project(tmp_path / "p", "def test_ok():\n    pass\n")
    (project.root / "tests" / "conftest.py").write_text(
        "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
        "    for item in items:\n        item.add_marker(pytest.mark.no_cover)\n")
    code = lanes_cli.main(["--project", str(project.root), "unit", "--jobs", "2"])
    out = capsys.readouterr().out
    assert code == 2 and "unit: CANNOT DECIDE" in out, out
    said = "(pytest: INTERNALERROR> Failed: 'no_cover' not found in `markers` configuration option; a marker"
    assert said in out, out


# --------------------------------------------------------------------------- the unit lane


def unguarded_child() -> str:
    """A test whose child escapes the bus guard the documented way (``python -I`` drops the
    PYTHONPATH hook) and must find itself in a network namespace other than this test's,
    holding only ``lo``: the plugin's own namespace, whatever lane runs it."""
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


UNIT_TESTS = """
import os

def test_home():
    assert 'CANARCHY_DEFAULT_INTERFACE' not in os.environ

def test_worker():
    assert os.environ.get('PYTEST_XDIST_WORKER')
"""


def test_the_unit_lane_runs_the_suite_in_workers_and_contains_what_it_starts(tmp_path, capsys, monkeypatch):
    """One run of the unit lane with a pytest-xdist worker (the adopter's runs it with none,
    tests/test_adopter.py); where namespaces can be made, a child the guard cannot reach is contained."""
    contained = lane_netns.netns_support().available
    project = _project(tmp_path / "p", UNIT_TESTS + (unguarded_child() if contained else ""))
    monkeypatch.setenv("CANARCHY_DEFAULT_INTERFACE", "can0")  # the caller's shell never reaches a lane's test
    code = lanes_cli.main(["--project", str(project.root), "unit", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "unit: 1 pytest-xdist workers" in out and f"unit: PASSED - {3 if contained else 2} passed" in out, out
    assert (project.root / "reports" / "unit.md").read_text().startswith("# unit: PASSED")


FAILING_AND_STRAY = """
import subprocess

def test_fails():
    assert 1 == 2

def test_a_shell_leaves_a_file(request):
    subprocess.run(["sh", "-c", f"echo x > {request.config.rootpath}/stray.txt"], check=True)
"""


def test_the_unit_lane_names_the_sentinel_s_findings_beside_the_failing_tests(tmp_path, capsys):
    """A run with a failing test whose sentinel also failed it: the lane's summary says both, not the test only."""
    project = _project(tmp_path / "p", FAILING_AND_STRAY)
    code = lanes_cli.main(["--project", str(project.root), "unit", "--jobs", "0"])
    out = capsys.readouterr().out
    summary = out[out.index("unit: FAILED"):]
    assert code == 1 and "and the isolation sentinel failed the run" in summary, out
    assert "  failing: tests/test_p.py::test_fails\n" in summary and "  sentinel: " in summary, summary
    assert "| `tests/test_p.py::test_fails` |" in (project.root / "reports" / "unit.md").read_text()
    assert "added: stray.txt" in summary and "added: stray.txt" in (project.root / "reports" / "unit.md").read_text()


def test_the_unit_lane_names_an_installed_pytest_plugin_its_run_did_not_load(tmp_path, capsys):
    """Every lane turns plugin autoloading off: an installed plugin the project does not name with ``-p`` (one that
    collects cases of its own, from YAML files say) is left out of the run, and the lane says so beside its verdict;
    one the lane loads (xdist) is not named."""
    project = _project(tmp_path / "p", "def test_a():\n    pass\n")
    dist = project.root / "yamlcases-1.0.dist-info"  # on the run's PYTHONPATH (the project root): installed there
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: yamlcases\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nyamlcases = yamlcases_plugin\n")
    code = lanes_cli.main(["--project", str(project.root), "unit", "--jobs", "1"])
    captured = capsys.readouterr()
    out = captured.out
    assert "unit: PASSED" in out, (code, out, captured.err)
    summary = out[out.index("unit: PASSED"):]
    assert code == 0 and "  not loaded: " in summary and "yamlcases (-p yamlcases)" in summary, out
    assert "pytest-xdist" not in summary, summary
    assert "yamlcases (-p yamlcases)" in (project.root / "reports" / "unit.md").read_text()


@pytest.mark.parametrize(("available", "unit_default"), [(1, 2), (2, 4), (8, 16)])
def test_by_default_the_unit_lane_runs_two_workers_per_core_and_each_parity_twin_none(
        monkeypatch, available, unit_default):
    """A parity twin runs serially unless --jobs says otherwise: a pytest-xdist worker starts with the
    controller's scrubbed environment, so it is less the operator's than a serial run."""
    monkeypatch.setattr(runner, "cores", lambda: available)
    assert (runner.workers(), parity.twin_workers()) == (unit_default, 0)
    assert (runner.workers(0), runner.workers(3), parity.twin_workers(1), parity.twin_workers(0)) == (0, 3, 1, 0)


# --------------------------------------------------------------------------- the parity lane


#: Every kind of difference parity tells apart, in one unisolated suite (no plugin): run once.
#: Under the plugin the same kinds of leak give identical twins (tests/test_adopter.py).
EVERY_KIND = """
import logging, os, time
from pathlib import Path

import pytest

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

def test_writes_into_its_checkout():
    (Path(__file__).parent / "scratch.txt").write_text("x")

def test_flaky():
    # every run counts itself (atomically: the twins run at once); the second one fails
    n = 1
    while True:
        try:
            os.close(os.open(os.path.join({runs!r}, str(n)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            n += 1
    assert n != 2

@pytest.mark.parametrize("pair", frozenset({{("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)}}))
def test_pairs(pair):
    assert pair[1] != 3

def test_twins_meet():
    meeting = Path({meeting!r})
    (meeting / os.environ["PYTHONHASHSEED"]).write_text("")
    deadline = time.monotonic() + 60
    while len(list(meeting.iterdir())) < 2:
        assert time.monotonic() < deadline, "the other twin never ran at the same time"
        time.sleep(0.05)
    assert "LEAKY_CALLER_VARIABLE" not in os.environ and "CANARCHY_CALLER" not in os.environ
"""

UNISOLATED = PYPROJECT.replace('addopts = ["-p", "canarchy.testing.isolation.plugin"]\n', "").replace(
    "canarchy_network_namespace = true\n", "")


def _position_under(seed: int) -> int:
    code = 'print(list(frozenset({("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)})).index(("c", 3)))'
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, parity.ParityResult, dict]:
    """One parity run over EVERY_KIND, with a caller's shell holding variables that must not get through
    and two hash seeds under which the failing ``test_pairs`` value has different positional ids."""
    base = tmp_path_factory.mktemp("every-kind")
    (base / "runs").mkdir()
    (base / "meeting").mkdir()
    project = _project(base / "p", EVERY_KIND.format(runs=str(base / "runs"), meeting=str(base / "meeting")),
                       pyproject=UNISOLATED)
    first = _position_under(1)
    other = next(seed for seed in range(2, 60) if _position_under(seed) != first)
    before = snapshot(project.root)
    caller = dict(os.environ, LEAKY_CALLER_VARIABLE="1", CANARCHY_CALLER="x")
    # two pytest-xdist workers a twin, as on a two-core machine: python-can's log record comes
    # through a worker's report
    result = parity.run_parity(project, ["tests"], source_env=caller, hashseeds=(1, other), reruns=1, jobs=2)
    return project, result, {"before": before, "meeting": base / "meeting"}


def test_parity_tells_each_kind_of_difference_apart(every_kind):
    _project, result, _ = every_kind
    kinds = {f.id.removeprefix("tests.test_p::"): f.kind for f in result.findings}
    pairs = sorted(k for k in kinds if k.startswith("test_pairs["))
    assert kinds == {"test_reads_the_home_config": "operator", "test_reads_the_shell": "operator",
                     "test_flaky": "flaky", **dict.fromkeys(pairs, "hash seed")}, parity.render(result)
    assert len(pairs) == 2
    operator = {f.id: f for f in result.of_kind("operator")}
    assert operator["tests.test_p::test_reads_the_shell"].clean == ("passed", "passed")  # the run and its re-run
    assert result.exit_code == 1 and result.status == "FAILED"
    text, md = parity.render(result), parity.render_markdown(result)
    assert "sort the values or give ids=" in text and "flaky" in text
    assert "`tests/test_p.py::test_reads_the_shell` | depends on the operator" in md  # a node id to paste
    assert "\ntests/test_p.py::test_reads_the_shell " in text


def test_each_operator_dependent_finding_names_the_part_of_the_operator_s_configuration_behind_it(every_kind):
    _project, result, _ = every_kind
    why = {f.id.removeprefix("tests.test_p::"): f.detail for f in result.of_kind("operator")}
    assert why["test_reads_the_home_config"].endswith("; the operator's outcome with the operator home (HOME) alone")
    assert why["test_reads_the_shell"].endswith(
        "; the operator's outcome with canarchy's operator shell (CANARCHY_*, CAN_*, XDG_*) alone"), why


BY_PART = """
import os
import time
from pathlib import Path

def test_local_time():
    assert time.localtime(0).tm_hour == 0

def test_project_variable():
    assert "X_CHANNEL" not in os.environ

def test_home_and_time_zone_together():
    assert not ((Path.home() / ".canarchy").is_dir() and os.environ.get("TZ") != "UTC")

def test_fails_in_both():
    assert False
"""


def test_parity_names_the_time_zone_operator_env_or_no_one_part_alone(tmp_path):
    """python-dateutil's testGettzCacheTzLocal failed only in the operator twin, which differs in its home, its
    shell, the project's variables and its time zone: the finding says which one gives that outcome alone."""
    project = _project(tmp_path / "p", BY_PART,
                       pyproject=UNISOLATED + 'operator_env = { X_CHANNEL = "{home}/can7" }\n')
    result = parity.run_parity(project, ["tests"], source_env=os.environ, hashseeds=(3, 3), reruns=1, jobs=0,
                               shards=1)
    why = {f.id.removeprefix("tests.test_p::"): f.detail for f in result.findings if f.kind == "operator"}
    assert why["test_local_time"].endswith(
        "with the time zone and locale (LANG=de_DE.UTF-8, TZ=NST+3:30) alone"), parity.render(result)
    assert why["test_project_variable"].endswith("with operator_env (X_CHANNEL) alone")
    assert "no one part alone gives the operator's outcome (the operator home (HOME); the time zone" in why[
        "test_home_and_time_zone_together"] and why["test_home_and_time_zone_together"].endswith("together they do")
    assert "with the time zone and locale" in parity.render(result) and "together they do" in \
        parity.render_markdown(result)
    # no difference, no finding; but the suite fails, and the verdict says parity does not judge that
    assert "\n  1 test(s) fail in both twins (tests/test_p.py::test_fails_in_both): parity compares the twins, it " \
        "does not pass" in parity.render(result)
    assert "- 1 test(s) fail in both twins (tests/test_p.py::test_fails_in_both)" in parity.render_markdown(result)
    # where this machine has no de_DE.UTF-8, a test that sets the locale fails in that twin for that alone
    missing = parity.unavailable_locales({"LANG": "de_DE.UTF-8"})
    for text in (parity.render(result), parity.render_markdown(result)):
        assert ("LANG=de_DE.UTF-8: no such locale on this machine" in text) == bool(missing), text


def test_a_locale_this_machine_lacks_is_told_apart_from_one_it_has():
    """``setlocale`` refuses a locale that is not installed; the process's own locale is put back."""
    before = locale.setlocale(locale.LC_CTYPE)
    found = parity.unavailable_locales({"LANG": "xx_XX.UTF-8", "LC_TIME": "C.UTF-8", "TZ": "NST+3:30", "LC_ALL": ""})
    assert found == ["LANG=xx_XX.UTF-8"] and locale.setlocale(locale.LC_CTYPE) == before


def test_parity_checks_the_operator_home_the_logs_and_the_checkout(every_kind):
    project, result, seen = every_kind
    assert result.home_changes == ["added: .canarchy/findings", "added: .canarchy/findings/new-campaign"]
    assert result.not_shut_down["clean"] == [] and len(result.not_shut_down["operator"]) >= 1
    assert "operator home unchanged: NO" in parity.render_markdown(result)
    assert not (project.operator_home / ".canarchy" / "findings").exists()  # the fixture itself is never the home
    # a test writing into its checkout writes into its twin's copy: reported, not a difference
    assert {"clean twin's copy after its run: added: tests/scratch.txt",
            "operator twin's copy after its run: added: tests/scratch.txt"} <= set(result.checkout_writes)
    assert result.checkout_changes == []
    assert changes(seen["before"], snapshot(project.root)) == []


NOT_SHUT_DOWN = """
import atexit
import logging

atexit.register(lambda: logging.getLogger("can.bus").warning("AtExitBus was not properly shut down"))

def test_logs_during_the_test():
    logging.getLogger("can.bus").warning("DuringTestBus was not properly shut down")
"""


def test_parity_finds_python_can_s_log_record_during_a_test_and_at_exit_in_a_serial_run(tmp_path):
    """The record a test makes is in its JUnit case (junit_logging); one at interpreter exit in the
    run's output. (Under pytest-xdist workers: the every_kind run.)"""
    result = parity.run_parity(_project(tmp_path / "p", NOT_SHUT_DOWN, pyproject=UNISOLATED), ["tests"],
                               source_env=os.environ, hashseeds=(5, 6), jobs=0)
    for twin in parity.TWINS:
        found = " | ".join(result.not_shut_down[twin])
        assert "DuringTestBus was not properly shut down" in found and "AtExitBus" in found, found
        [case] = result.twins[twin].report.cases.values()
        assert "DuringTestBus" in case.output and "AtExitBus" in result.twins[twin].run.output, case.output
    assert result.exit_code == 1, parity.render(result)


def _tests(count: int) -> str:
    """``count`` tests; the last one fails where ``CAN_INTERFACE`` is set (the operator twin's shell)."""
    return "import os\n\n" + "".join(
        f"def test_{i}():\n    assert {'CAN_INTERFACE' if i == count - 1 else 'NOTHING'!r} not in os.environ\n\n"
        for i in range(count))


def test_a_shard_keeps_every_nth_test_and_a_bad_shard_is_a_usage_error(tmp_path):
    root = _project(tmp_path / "p", _tests(6), pyproject=UNISOLATED).root
    ran = subprocess.run([*PYTEST, "-p", parity.SHARD_PLUGIN, "--canarchy-shard=1/4", "-v", "tests"], cwd=root,
                         capture_output=True, text=True)
    assert [line.split()[0] for line in ran.stdout.splitlines() if " PASSED" in line] == [
        "tests/test_p.py::test_1", "tests/test_p.py::test_5"], ran.stdout
    assert "2 passed, 4 deselected" in ran.stdout
    bad = subprocess.run([*PYTEST, "-p", parity.SHARD_PLUGIN, "--canarchy-shard=4/4", "tests"], cwd=root,
                         capture_output=True, text=True)
    assert bad.returncode == 4 and "--canarchy-shard=4/4: give I/N, whole numbers with 0 <= I < N" in bad.stderr


@pytest.mark.parametrize("count", [5, 2], ids=["two-a-shard", "an-empty-shard"])
def test_a_twin_in_shards_runs_each_test_once_and_parity_finds_the_difference(tmp_path, count):
    """Each twin in three serial pytest processes, each started with the twin's whole environment: one
    report of every test per twin, and a shard with no test (more shards than tests) is no problem."""
    project = _project(tmp_path / "p", _tests(count), pyproject=UNISOLATED)
    result = parity.run_parity(project, ["tests"], source_env=os.environ, hashseeds=(3, 4), reruns=1, shards=3)
    every = [f"tests.test_p::test_{i}" for i in range(count)]
    assert [(f.id, f.kind) for f in result.findings] == [(every[-1], "operator")], parity.render(result)
    for twin in result.twins.values():
        assert sum(len(s.report.cases) for s in twin.shards if s.report) == count  # each test in one shard
        assert len(twin.shards) == 3 and sorted(twin.report.cases) == every
        assert len({s.copy for s in twin.shards}) == 3 and all(r.returncode in (0, 1, 5) for r in twin.runs)
    ids = (project.root / "reports" / "parity-clean-ids.txt").read_text().split()
    assert ids == [f"tests/test_p.py::test_{i}" for i in range(count)]
    assert result.status == "FAILED" and "3 shards" in parity.render(result)
    assert "| operator 3/" in parity.render_markdown(result)


def test_parity_twins_write_no_report_into_the_checkout_and_the_lane_publishes_them(tmp_path, monkeypatch):
    """A twin runs on a copy, so the checkout is not its checkout: when it lies in the operator's home
    (``~/canarchy``, a new user's clone) the twin may only read it, and a report or node ids file written
    there by the twin's pytest was refused (both twins CANNOT DECIDE, "no such report"). The twins write
    into the lane's temporary tree; the lane copies their reports and logs to ``reports/`` afterwards."""
    project = _project(tmp_path / "p", _tests(2))
    written: list[str] = []
    real = parity.run_pytest

    def recording(args, **kwargs):
        written.extend(a.split("=", 1)[1] for a in args
                       if a.startswith(("--junitxml=", "--dtp-testids-output-file=")))
        return real(args, **kwargs)

    monkeypatch.setattr(parity, "run_pytest", recording)
    result = parity.run_parity(project, ["tests"], source_env=os.environ, hashseeds=(3, 4), reruns=1, shards=2)
    assert written and not [w for w in written if Path(w).resolve().is_relative_to(project.root.resolve())], written
    reports = project.root / "reports"
    for twin in result.twins.values():
        assert twin.problem is None and twin.report is not None, parity.render(result)
        for run in twin.runs:
            assert run.log.parent == reports and run.log.is_file() and run.junit.parent == reports, run
            assert run.junit.is_file()
    ids = (reports / "parity-clean-ids.txt").read_text().split()
    assert ids == ["tests/test_p.py::test_0", "tests/test_p.py::test_1"]
    assert str(reports / "parity-clean-shard1.log") in parity.render_markdown(result)


def test_parity_twins_run_concurrently_on_copies_with_their_own_hash_seeds(every_kind):
    project, result, seen = every_kind
    assert "tests.test_p::test_twins_meet" not in {f.id for f in result.findings}  # passed in both, at the same time
    assert sorted(p.name for p in seen["meeting"].iterdir()) == sorted(str(t.hashseed) for t in result.twins.values())
    assert {t.copy for t in result.twins.values()}.isdisjoint({project.root})


@pytest.mark.parametrize("jobs", [0, 2], ids=["serial", "xdist"])
def test_parity_cannot_decide_when_both_twins_break_the_same_way(tmp_path, jobs):
    """Serial pytest stops at the collection error (exit code 2); under pytest-xdist the run exits 1
    with the error in its report: two identical reports of nothing are no parity either way."""
    result = parity.run_parity(_project(tmp_path / "p", "import no_such_module_anywhere\n"), ["tests"],
                               source_env=os.environ, hashseeds=(11, 22), jobs=jobs)
    assert not result.comparison.differences and result.exit_code == 2
    expected = "pytest exit code 2" if jobs == 0 else "errors during collection: tests.test_p; pytest exit code 1"
    assert any(expected in reason for reason in result.comparison.undecided), result.comparison.undecided


@pytest.mark.parametrize("jobs", [0, 2], ids=["serial", "xdist"])
def test_a_module_only_the_operator_twin_cannot_collect_fails_parity_and_is_named(tmp_path, jobs):
    """The operator's locale decides whether the suite can even be collected: that is a dependence on the
    operator, not a run with no answer (serial pytest stops at the error with exit code 2)."""
    project = _project(tmp_path / "p", "def test_a():\n    pass\n")
    (project.root / "tests" / "test_locale.py").write_text(
        "import os\n\nif os.environ.get('LANG', '').startswith('de'):\n"
        "    raise ImportError('no catalogue for this locale')\n\ndef test_b():\n    pass\n")
    result = parity.run_parity(project, ["tests"], source_env=os.environ, hashseeds=(11, 22), jobs=jobs)
    shown = parity.render(result)
    assert result.exit_code == 1 and result.status == "FAILED", shown
    [finding] = result.findings
    assert (finding.id, finding.kind) == ("tests.test_locale", "operator"), finding
    assert "operator twin alone could not collect it" in finding.detail and "no catalogue" in finding.detail
    assert "the operator twin alone could not collect 1 module(s)" in shown


def test_a_test_a_late_hook_keeps_from_running_in_the_operator_twin_alone_fails_parity(tmp_path):
    """A project's ``trylast`` hook that drops a test where the time zone is not UTC: the operator twin's collected
    ids (listed before that hook) still name it, but it never runs there. Which tests a twin ran is what its
    report holds, so this is the operator's doing, not the hash seed's."""
    project = _project(tmp_path / "p", "def test_a():\n    pass\n\ndef test_midnight():\n    pass\n")
    (project.root / "tests" / "conftest.py").write_text(
        "import time, pytest\n\n@pytest.hookimpl(trylast=True)\ndef pytest_collection_modifyitems(items):\n"
        "    if time.timezone:\n        items[:] = [i for i in items if 'midnight' not in i.nodeid]\n")
    result = parity.run_parity(project, ["tests"], source_env=os.environ, hashseeds=(11, 22))
    shown = parity.render(result)
    assert result.exit_code == 1 and result.status == "FAILED", shown
    [finding] = result.findings
    assert (finding.id, finding.kind) == ("tests.test_p::test_midnight", "operator"), shown


def test_parity_cannot_decide_when_every_test_skips_in_both_twins(tmp_path):
    """A conftest that skips every test where ``TZ`` is set (the lanes set it in both twins): two identical
    reports of skipped tests compare equal and prove nothing."""
    project = _project(tmp_path / "p", "def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    (project.root / "tests" / "conftest.py").write_text(
        "import os, pytest\n\ndef pytest_collection_modifyitems(items):\n    for item in items:\n"
        "        if os.environ.get('TZ'):\n            item.add_marker(pytest.mark.skip(reason='TZ set'))\n")
    result = parity.run_parity(project, ["tests"], source_env=os.environ, hashseeds=(11, 22))
    assert result.exit_code == 2 and result.status == "CANNOT DECIDE", parity.render(result)
    assert any("every test case skipped" in reason for reason in result.comparison.undecided)


def test_a_run_s_log_keeps_its_first_and_last_part_whatever_it_prints(tmp_path, monkeypatch):
    """A test that prints hundreds of megabytes fills no disk: the log keeps the start and pytest's end."""
    monkeypatch.setattr(runner, "LOG_KEEPS", 1000)
    code = "import sys; sys.stdout.write('START' + 'x' * 100000 + 'END'); sys.stdout.flush()"
    done = runner.run([sys.executable, "-c", code], env=os.environ, cwd=tmp_path, log=tmp_path / "run.log")
    text = (tmp_path / "run.log").read_text()
    assert done.returncode == 0 and text.startswith("START") and text.endswith("END"), text[:80]
    assert len(text) < 3000 and "bytes of the run's output left out here" in text
    small = runner.run([sys.executable, "-c", "print('all of it')"], env=os.environ, cwd=tmp_path,
                       log=tmp_path / "small.log")
    assert small.returncode == 0 and (tmp_path / "small.log").read_text() == "all of it\n"


def test_a_run_leaves_no_pipe_open(tmp_path):
    """The pipe a run's output came through is closed when the run ends: nothing is left for Python to warn
    about in a project's test that runs lane code, under ``filterwarnings = error``."""
    with resource_warnings() as found:
        runner.run([sys.executable, "-c", "print('x')"], env=os.environ, cwd=tmp_path, log=tmp_path / "run.log")
    assert found == []


def test_a_lane_removes_its_reports_of_an_earlier_run_as_it_starts(tmp_path, capsys):
    """An earlier run's verdict (one that was interrupted, say) and re-run reports are not left beside this run's."""
    project = _project(tmp_path / "p", "def test_a():\n    pass\n")
    reports = project.root / "reports"
    reports.mkdir()
    for name in ("parity.md", "parity-operator-rerun1.xml", "order.md", "unit.md"):
        (reports / name).write_text("# Parity: FAILED (an earlier run)\n")
    assert lanes_cli.main(["--project", str(project.root), "parity"]) == 0, capsys.readouterr().out
    assert not (reports / "parity-operator-rerun1.xml").exists()
    assert "PASSED" in (reports / "parity.md").read_text()
    assert (reports / "order.md").exists() and (reports / "unit.md").exists()  # another lane's: kept


HELD_TEST = """
import os, time
from pathlib import Path

def test_waits():
    first = not any(p.name.isdigit() for p in Path({started!r}).iterdir())
    Path({started!r}, str(os.getpid())).write_text("")
    while first and not Path({started!r}, "go").exists():  # the first run holds on; any other passes
        time.sleep(0.05)
"""


def test_a_second_run_of_a_lane_refuses_to_start_while_the_first_holds_the_reports(tmp_path, capsys):
    """Lane B would remove lane A's open ``reports/unit.log``: it cannot decide, naming A's pid and how to wait,
    and leaves A's reports alone; once A ends, or dies by SIGKILL (the kernel drops its lock), a run starts."""
    started, _tmp, project, env = _lane_to_interrupt(tmp_path, HELD_TEST)
    argv = [sys.executable, "-m", "canarchy.testing.lanes", "--project", str(project.root), "unit", "--jobs", "0"]
    log = project.root / "reports" / "unit.log"

    def start() -> subprocess.Popen:
        lane = subprocess.Popen(argv, cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        deadline = time.monotonic() + 60
        while not any(p.name.isdigit() for p in started.iterdir()):
            assert lane.poll() is None and time.monotonic() < deadline, "the first run never started its test"
            time.sleep(0.05)
        return lane

    first = start()
    try:
        code = lanes_cli.main(["--project", str(project.root), "unit", "--jobs", "0"])
        out = capsys.readouterr().out
        assert code == 2 and "unit: CANNOT DECIDE - another unit run" in out and f"(pid {first.pid})" in out, out
        assert "flock " in out and log.exists(), out
        (started / "go").write_text("")
        first_out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0 and f"log: {log}" in first_out and "unit: PASSED" in first_out, first_out
    (started / "go").unlink()
    for p in started.iterdir():
        p.unlink()
    crashed = start()
    os.killpg(crashed.pid, signal.SIGKILL)
    crashed.wait(30)
    for p in started.iterdir():  # its pytest, in a session of its own, outlives it: ended too
        os.kill(int(p.name), signal.SIGKILL)
    assert lanes_cli.main(["--project", str(project.root), "unit", "--jobs", "0"]) == 0, capsys.readouterr().out


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


# --------------------------------------------------------------------------- interrupts


class _Stop(BaseException):
    pass


def test_an_interrupt_returns_only_after_every_running_job_has_ended():
    """A signal handler's exception cuts the main thread's wait short while a job still works
    (it cleans up for 0.5 s): the interrupt reaches the caller only after the job has ended.
    (A plain ``Thread.join`` fails this on CPython 3.11: the interrupted join marks the running
    thread stopped, and the lane removed its temporary tree while a job was still writing in it.)"""
    import threading
    import time

    ended = threading.Event()

    def job() -> None:
        time.sleep(0.2)  # the main thread is waiting by now
        os.kill(os.getpid(), signal.SIGUSR1)  # its handler runs in the main thread, in that wait
        time.sleep(0.5)
        ended.set()

    def handler(signum, frame):
        raise _Stop

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with pytest.raises(_Stop):
            runner.concurrently([job], workers=1)
        assert ended.is_set(), "concurrently returned while a job was still running"
        assert not runner.stopping(), "the next concurrently call would start nothing"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_an_interrupt_while_a_temporary_tree_goes_lets_it_go_first(tmp_path, monkeypatch):
    """SIGINT arrives during the removal (sent by the first unlink): the whole tree is removed,
    then the lane is interrupted. (Before, the exception cut the removal short and the tree stayed.)"""
    tree = tmp_path / "canarchy-mutation-x"
    for d in range(3):
        (tree / f"copy-{d}").mkdir(parents=True)
        for f in range(20):
            (tree / f"copy-{d}" / f"f{f}").write_text("x")
    unlink, sent = os.unlink, []

    def unlink_and_signal(*args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return unlink(*args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink_and_signal)
    with pytest.raises(runner.Interrupted), runner.interrupts():
        workspace.remove_tree(tree)
    assert sent and not tree.exists()


def _lane_to_interrupt(tmp_path: Path, test: str) -> tuple[Path, Path, Project, dict[str, str]]:
    """``(started, TMPDIR, project, lane environment)`` for a lane run as a process on a project
    whose test is ``test`` (formatted with ``started``, the directory its runs write pids into)."""
    started, tmp = tmp_path / "started", tmp_path / "tmp"
    started.mkdir()
    tmp.mkdir()
    project = _project(tmp_path / "p", test.format(started=str(started)))
    env = lane_env.build_env(home=tmp_path / "lane-home", source=os.environ,
                             extra={"TMPDIR": str(tmp), "PYTHONPATH": str(REPO)})
    return started, tmp, project, env


def test_ctrl_c_in_the_parity_lane_stops_both_twins_and_leaves_nothing(tmp_path):
    """Two SIGINTs 150 ms apart (the second makes the stop hurry); one SIGINT: tests/test_order.py."""
    started, tmp, project, env = _lane_to_interrupt(tmp_path, WAITING_TEST)
    argv = [sys.executable, "-m", "canarchy.testing.lanes", "--project", str(project.root), "parity"]
    lane = interrupt_once_started(argv, started=started, runs=2, cwd=project.root, env=env, signals=2)
    assert lane.returncode == 130, lane.out + lane.err
    assert "parity: interrupted by SIGINT" in lane.err and "Traceback" not in lane.err, lane.err
    for pid in lane.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert list(tmp.iterdir()) == []
    kept = sorted(p.name for p in (project.root / "reports").iterdir())
    assert kept and all(name.startswith("parity-") and name.endswith(".log") for name in kept), kept


def test_lane_code_run_in_process_leaves_no_signal_handler(tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with runner.interrupts():
        assert signal.getsignal(signal.SIGTERM) is not before[1]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_lane_keeps_its_temporary_files_out_of_the_project(tmp_path, monkeypatch):
    """nox's session directory (TMPDIR for a lane) is inside the project: the lane's homes must not be."""
    import tempfile

    inner = tmp_path / "project" / ".nox" / "unit" / "tmp"
    inner.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(inner))
    tempfile.tempdir = None
    with runner.temporary_files_outside(tmp_path / "project") as base:
        made = tempfile.mkdtemp()
        assert os.environ["TMPDIR"] == base and not made.startswith(str(tmp_path / "project"))
        os.rmdir(made)
    assert os.environ["TMPDIR"] == str(inner) and tempfile.gettempdir() == str(inner)
    with runner.temporary_files_outside(tmp_path / "elsewhere") as base:  # not inside: kept as it is
        assert base == str(inner) and os.environ["TMPDIR"] == str(inner)


def test_the_operator_twin_exports_the_project_s_own_operator_variables(tmp_path):
    """An adopter's variables (its scrub prefixes) reach the operator twin through
    ``operator_env``; without it, the lane says that prefix was never exercised."""
    # the operator's environment as the plugin keeps it (to give it back): a test that digs it out
    tests = ("from canarchy.testing.isolation.session import _RUN\n\n"
             "def test_depends_on_the_shell(request):\n"
             "    assert 'ADOPT_MODE' not in request.config.stash[_RUN].sandbox.operator_env\n")
    prefixes = 'canarchy_scrub_prefixes = ["ADOPT_"]\n'
    pyproject = PYPROJECT.replace("xfail_strict = true\n", "xfail_strict = true\n" + prefixes)
    without = parity.run_parity(_project(tmp_path / "without", tests, pyproject=pyproject), ["tests"],
                                source_env=os.environ, hashseeds=(3, 4), reruns=1, jobs=0)
    assert without.exit_code == 0 and without.unexercised == ["ADOPT_"], parity.render(without)
    assert "not exercised: the operator twin exports no ADOPT_* variable" in parity.render(without)
    pyproject += 'operator_env = { ADOPT_MODE = "operator", ADOPT_HOME = "{home}/.adopt" }\n'
    project = _project(tmp_path / "with", tests, pyproject=pyproject)
    assert dict(project.operator_env) == {"ADOPT_MODE": "operator", "ADOPT_HOME": "{home}/.adopt"}
    found = parity.run_parity(project, ["tests"], source_env=os.environ, hashseeds=(3, 4), reruns=1, jobs=0)
    assert found.exit_code == 1 and found.unexercised == []
    assert [(f.id, f.kind) for f in found.findings] == [("tests.test_p::test_depends_on_the_shell", "operator")]
    assert found.twins["operator"].env["ADOPT_HOME"].endswith("/operator-home/.adopt")


def test_a_test_that_depends_on_the_operator_s_time_zone_differs_between_the_twins(tmp_path):
    """The lanes fix the time zone (UTC) whoever runs them, and the operator twin's is another: a test that
    reads the local time is found (the caller's TZ is not passed on: it would give both twins the same)."""
    tests = ("import time\n\ndef test_epoch_is_midnight():\n"
             "    assert time.strftime('%H:%M', time.localtime(0)) == '00:00'\n")
    found = parity.run_parity(_project(tmp_path / "tz", tests), ["tests"], source_env={**os.environ, "TZ": "UTC"},
                              hashseeds=(3, 4), reruns=1, jobs=0)
    assert found.exit_code == 1, parity.render(found)
    assert [(f.id, f.kind) for f in found.findings] == [("tests.test_p::test_epoch_is_midnight", "operator")]


DETACHING_TEST = """
import os, subprocess, time
from pathlib import Path

def test_leaves_a_detached_child():
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path({started!r}, str(child.pid)).write_text("")
    time.sleep(120)
"""


def test_ctrl_c_stops_what_a_test_detached_too(tmp_path):
    """A test's child in a session of its own is out of reach of the run's process group; the lane,
    its subreaper, adopts it when the run ends and stops it as well."""
    started, _tmp, project, env = _lane_to_interrupt(tmp_path, DETACHING_TEST)
    argv = [sys.executable, "-m", "canarchy.testing.lanes", "--project", str(project.root), "unit", "--jobs", "1"]
    lane = interrupt_once_started(argv, started=started, runs=1, cwd=project.root, env=env)
    assert lane.returncode == 130 and "unit: interrupted by SIGINT" in lane.err, lane.out + lane.err
    [detached] = lane.pids
    with pytest.raises(ProcessLookupError):
        os.kill(detached, 0)


LEAVES_A_FILE = """
from pathlib import Path

def test_leaves_a_file_in_its_checkout():
    (Path(__file__).parent / "left.txt").write_text("x")

def test_stable():
    pass
"""


def test_a_twin_whose_run_failed_beyond_its_tests_fails_parity(tmp_path):
    """Every test passes in both twins, yet the isolation's sentinel fails each run (a file left in the
    checkout): identical results are no pass."""
    result = parity.run_parity(_project(tmp_path / "p", LEAVES_A_FILE), ["tests"], source_env=os.environ, reruns=0)
    assert [t.run.returncode for t in result.twins.values()] == [1, 1] and not result.findings, parity.render(result)
    assert result.runs_failed == ["clean", "operator"] and result.status == "FAILED", parity.render(result)
    assert "operator twin: no test failed, yet pytest failed the run" in parity.render(result)
    assert "- clean twin: no test failed, yet pytest failed the run" in parity.render_markdown(result)
    assert "    sentinel: " in parity.render(result) and "left.txt (written by" in parity.render(result)


TOOLS = """
from pathlib import Path

def test_uses_pytest_s_cache(cache):
    cache.set("tools/n", 1)
    assert cache.get("tools/n", None) == 1

def test_writes_hypothesis_s_database(request):
    database = Path(request.config.rootpath) / ".hypothesis" / "examples"
    database.mkdir(parents=True, exist_ok=True)
    (database / "entry").write_bytes(b"x")
"""


def test_the_lane_s_own_reports_pytest_s_cache_and_a_tool_s_database_fail_nothing(tmp_path, capsys):
    """An adopter whose git does not ignore reports/: the lane's JUnit report and log are its own, not a
    test's; pytest's cache fixture works (in a directory of the run's own); hypothesis's database in the
    rootdir, which git ignores, is a tool's cache, not a file a test left where git does not show it."""
    project = _project(tmp_path / "p", TOOLS)
    (project.root / ".gitignore").write_text(".hypothesis/\n")
    code = lanes_cli.main(["--project", str(project.root), "unit", "--jobs", "0"])
    out = capsys.readouterr().out
    assert code == 0 and "unit: PASSED - 2 passed" in out, out
    assert not (project.root / ".pytest_cache").exists()


def test_without_testpaths_a_lane_runs_the_tests_pytest_collects_from_the_root(tmp_path):
    """A project that sets no ``testpaths`` (python-dateutil 2.8: its tests in ``dateutil/test/``, its pytest
    section in ``setup.cfg``) has pytest collect from the rootdir: the lanes ran ``tests``, which it lacks, and
    said "no tests collected" of a suite of two thousand."""
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = pkg\n[tool:pytest]\npython_files = test_*.py\n")
    (tmp_path / "pkg" / "test").mkdir(parents=True)
    for init in ("pkg/__init__.py", "pkg/test/__init__.py"):
        (tmp_path / init).write_text("")
    (tmp_path / "pkg" / "test" / "test_a.py").write_text("def test_a():\n    pass\n")
    project = load_project(tmp_path)
    selection = lane_env.choose_tests([], default=project.tests, root=tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                           "-p", "no:cacheprovider", *selection], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert "pkg/test/test_a.py::test_a" in done.stdout, (selection, done.stdout, done.stderr)


def test_a_copy_of_a_signal_is_the_same_interrupt_and_a_later_one_a_further_one():
    """A Ctrl+C reaches a lane nox runs twice, from the terminal and passed on by nox: the copy, within
    SAME_INTERRUPT_SECONDS of the first, is the same interrupt (the lane lets its runs end); a signal after
    that is a second Ctrl+C, which makes the lane stop them at once. The copies are sent here one by one, each
    handled before the next (two pending at once would be one to Python anyway)."""
    def handled(signum: int) -> list[int]:
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # the handler runs between two bytecodes of this thread
        return list(runner._HURRY)

    before = signal.getsignal(signal.SIGINT)
    with runner.interrupts():
        with pytest.raises(runner.Interrupted):
            handled(signal.SIGINT)
            time.sleep(5)
        copy = handled(signal.SIGTERM)
        time.sleep(runner.SAME_INTERRUPT_SECONDS)
        further = handled(signal.SIGINT)
    assert (copy, further) == ([], [signal.SIGINT])
    assert runner._HURRY == [] and signal.getsignal(signal.SIGINT) is before


def test_an_interrupted_lane_leaves_no_report_that_reads_as_a_verdict(tmp_path, monkeypatch, capsys):
    """The run's pytest had written its JUnit report (every test passed) when Ctrl+C reached the lane: that
    file, left in reports/, read as 91 green tests to a CI job that reads JUnit. An interrupted lane removes
    what its runs wrote but the logs, and says it was interrupted (exit 128 + the signal)."""
    project = _project(tmp_path / "p", "def test_a():\n    pass\n")

    def interrupted_after_its_report(project, args, selection):
        reports = project.root / "reports"
        reports.mkdir(exist_ok=True)
        (reports / "unit.xml").write_text('<testsuite tests="91" failures="0" errors="0"/>')
        (reports / "unit.log").write_text("91 passed in 8.98s\n")
        raise runner.Interrupted(signal.SIGINT)

    monkeypatch.setattr(unit, "main", interrupted_after_its_report)
    code = lanes_cli.main(["--project", str(project.root), "unit"])
    assert code == 128 + signal.SIGINT and "unit: interrupted by SIGINT" in capsys.readouterr().err
    assert sorted(p.name for p in (project.root / "reports").iterdir() if not p.name.startswith(".")) == ["unit.log"]
