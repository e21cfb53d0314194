"""Self-tests of the hermetic suite (docs/tests/test-isolation.md, TEST-TISO-*).

In-process tests check what every unit test sees. Child runs
(``tests/isolation_child.py``) put a small test project under the plugin in a
hostile operator environment and check that each kind of leak is caught, with
the expected message: those tests fail if the protection they cover is removed.
Child tests that need no command line or configuration of their own share one
child run (the ``batch`` fixture); each parent test reads its own tests' outcomes
and messages in that run's report.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import os
import subprocess
import sys
from pathlib import Path

import pytest

from canarchy import transport
from canarchy.errors import TransportError
from canarchy.testing.lanes import netns as lane_netns
from canarchy.testing.isolation.refusal import RealCanBusRefused
from canarchy.testing.isolation.sandbox import KNOWN_IMPORT_TIME_PATHS
from tests.helpers import PYTEST
from tests.isolation_child import run_batch, run_child

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """One child run, under the hostile operator environment, of every child test file
    below that needs no command line of its own."""
    base = tmp_path_factory.mktemp("batch")
    files = {"conftest.py": SCOPES_CONFTEST, "test_view.py": VIEW, "test_scopes.py": SCOPES,
             "test_routes.py": ROUTES, "test_swallow.py": SWALLOW, "test_env.py": ENVIRONMENT,
             "test_child.py": SWALLOWED_CHILD, "test_blinded.py": BLINDED_PARENT, "test_open.py": LEFT_OPEN,
             "test_fresh.py": FRESH,
             "test_can_env.py": CAN_ENVIRONMENT, "test_constants.py": CONSTANTS,
             "test_home_variables.py": HOME_FILE_VARIABLES}
    operator_home = base / "operator-home"
    env = {"CHILD_OPERATOR_HOME": str(operator_home),
           "LEFT_BY_THE_OPERATOR": "kept", "ALSO_LEFT_BY_THE_OPERATOR": "kept",
           # variables that point a program at a file in the operator's home, and one that names code
           "GIT_CONFIG_GLOBAL": str(operator_home / ".gitconfig"),
           "PYTHONSTARTUP": str(operator_home / ".pythonrc.py"),
           "KUBECONFIG": os.pathsep.join(("/etc/kube.conf", str(operator_home / ".kube" / "config"))),
           "PYENV_ROOT": str(operator_home / ".pyenv")}
    run, _ = run_batch(base, files, env=env)
    return run


# -- TEST-TISO-01..07: state redirection ----------------------------------------------

def test_tiso01_home_is_a_fresh_temporary_directory(canarchy_sandbox):
    home = Path.home()
    assert home.is_dir()
    assert list(home.iterdir()) == []
    assert canarchy_sandbox.root in home.parents
    assert home != canarchy_sandbox.real_home


def test_a_home_a_test_replaced_by_a_symlink_is_not_handed_to_the_next_test(tmp_path):
    """A test's home and working directory go to the next test only if they are still the empty
    directories the plugin made: a symlink a test put in their place (to an empty directory outside
    the run) would make the next test's home a directory that outlives the run."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    run = run_child(tmp_path, {"test_relink.py": """
        import os
        from pathlib import Path

        def test_puts_a_symlink_in_place_of_its_home_and_cwd():
            home, cwd = Path.home(), Path.cwd()
            os.chdir(home.parent)
            home.rmdir()
            home.symlink_to(os.environ["CHILD_ELSEWHERE"])
            cwd.rmdir()
            cwd.symlink_to(os.environ["CHILD_ELSEWHERE"])

        def test_gets_directories_of_its_own():
            for path in (Path.home(), Path.cwd()):
                assert not path.is_symlink() and path.resolve() != Path(os.environ["CHILD_ELSEWHERE"]), path
    """}, "-p", "no:randomly", env={"CHILD_ELSEWHERE": str(elsewhere)})
    assert run.returncode == 0, run.output
    assert run.results["test_gets_directories_of_its_own"] == [("passed", "")], run.output


def test_tiso02_home_variable_and_path_home_agree():
    assert Path(os.environ["HOME"]) == Path.home()
    for name in ("USERPROFILE", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "APPDATA", "LOCALAPPDATA"):
        assert Path(os.environ[name]).is_relative_to(Path.home()), name


def test_tiso03_no_canarchy_or_can_variables_visible():
    assert [k for k in os.environ if k.startswith(("CANARCHY_", "CAN_"))] == []


def test_tiso04_user_config_reads_empty():
    assert transport._load_user_config() == {}


def test_tiso05_no_default_interface_inherited():
    assert transport.default_can_interface() is None


@pytest.mark.parametrize("module_name,attribute", KNOWN_IMPORT_TIME_PATHS)
def test_tiso06_import_time_paths_are_in_the_test_home(module_name, attribute):
    import importlib

    module = importlib.import_module(module_name)
    value = Path(getattr(module, attribute))
    assert value.is_relative_to(Path.home()), f"{module_name}.{attribute} = {value}"
    assert value.relative_to(Path.home()).parts[0] == ".canarchy"


def test_tiso07_default_findings_root_is_in_the_test_home():
    from canarchy import fuzz

    assert fuzz.default_findings_root() == Path.home() / ".canarchy" / "findings"


VIEW = """
    import os
    from pathlib import Path
    from canarchy import transport, config
    def test_view():
        assert [k for k in os.environ if k.startswith(("CANARCHY_", "CAN_"))] == []
        assert transport._load_user_config() == {}
        assert transport.default_can_interface() is None
        settings = transport.transport_backend_config()
        assert (settings.backend, settings.bus_type) == ("python-can", "socketcan")
        assert not (Path.home() / ".canrc").exists()
"""


def test_operator_state_is_invisible_in_a_hostile_environment(batch):
    """TEST-TISO-03..05 against a real operator config, CANARCHY_* and CAN_* exported."""
    assert batch.outcomes("test_view") == {"passed"}, batch.output


# -- TEST-TISO-08..12: the bus guard --------------------------------------------------

def test_tiso08_socketcan_is_refused(bus_guard):
    import can

    with pytest.raises(AssertionError, match="tried to open a real CAN bus"):
        can.Bus(channel="can0", interface="socketcan")
    assert [(r.interface, r.channel) for r in bus_guard.take_refusals()] == [("socketcan", "can0")]


def test_tiso09_udp_multicast_is_refused(bus_guard):
    import can

    with pytest.raises(RealCanBusRefused):
        can.Bus(channel="239.74.163.2", interface="udp_multicast")
    assert [r.interface for r in bus_guard.take_refusals()] == ["udp_multicast"]


def test_tiso10_refusal_names_the_test(request, bus_guard):
    import can

    with pytest.raises(RealCanBusRefused) as caught:
        can.Bus(channel="can0", interface="socketcan")
    bus_guard.take_refusals()
    message = str(caught.value)
    assert request.node.nodeid in message
    assert "interface='socketcan'" in message and "channel='can0'" in message
    assert "virtual" in message and "integration" in message


def test_a_bus_class_is_refused_before_an_instance_exists(bus_guard, caplog):
    """By ``BusABC.__new__``: no half-made driver is left for its ``__del__`` to log about and
    shut down (the ``__init__`` wrappers would refuse too, route "init", after the instance exists)."""
    import gc

    from can.interfaces.socketcan import SocketcanBus

    with pytest.raises(RealCanBusRefused):
        SocketcanBus("can0")
    gc.collect()
    assert [r.route for r in bus_guard.take_refusals()] == ["class"]
    assert not [r for r in caplog.records if "not properly shut down" in r.getMessage()]


def test_tiso11_virtual_bus_is_allowed(virtual_channel):
    import can
    from can.interfaces.virtual import VirtualBus

    bus = can.Bus(channel=virtual_channel, interface="virtual")
    try:
        assert isinstance(bus, VirtualBus)
        other = can.Bus(channel=virtual_channel, interface="virtual")
        with other:
            bus.send(can.Message(arbitration_id=0x123, data=b"\x01", is_extended_id=False))
            assert other.recv(timeout=1).arbitration_id == 0x123
    finally:
        bus.shutdown()
    assert bus._is_shutdown


def test_tiso12_backend_raises_through_the_guard(bus_guard):
    backend = transport.PythonCanBackend(bus_type="socketcan")
    with pytest.raises(TransportError) as caught:
        list(backend.capture("can0"))
    assert isinstance(caught.value.__cause__, RealCanBusRefused)
    assert [r.interface for r in bus_guard.take_refusals()] == ["socketcan"]


# -- TEST-TISO-13, 15: the integration marker ------------------------------------------

INTEGRATION_FILE = """
    import pytest
    def test_ordinary():
        pass
    @pytest.mark.integration
    def test_marked():
        pass
    @pytest.mark.real_bus
    def test_on_a_real_bus():
        pass
    @pytest.mark.real_home
    def test_in_the_real_home():
        pass
"""


def _pytest_with_repo_config(tmp_path, *args):
    (tmp_path / "test_marker.py").write_text(__import__("textwrap").dedent(INTEGRATION_FILE))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["canarchy.testing.isolation.plugin"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [*PYTEST, "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-o", "canarchy_require_import=false", "-W", "error::pytest.PytestUnknownMarkWarning", str(tmp_path), *args],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )


def test_tiso13_integration_deselected_by_default(tmp_path):
    """And the narrower opt-outs with it: a plain run touches nothing of the operator's."""
    proc = _pytest_with_repo_config(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 3 deselected" in proc.stdout


def test_tiso13_other_marker_expressions_keep_integration_out(tmp_path):
    proc = _pytest_with_repo_config(tmp_path, "-m", "not real_bus")
    assert "1 passed, 3 deselected" in proc.stdout, proc.stdout


def test_tiso15_integration_runs_when_selected(tmp_path):
    proc = _pytest_with_repo_config(tmp_path, "-m", "integration", "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_marked PASSED" in proc.stdout and "1 passed, 3 deselected" in proc.stdout


@pytest.mark.parametrize("markexpr, marker, asked", [
    ("", "integration", False), ("integration", "integration", True), ("not integration", "integration", False),
    ("uds or integration", "integration", True), ("uds and not integration", "integration", False),
    ("uds", "real_bus", False), ("real_busy", "real_bus", False), ("real_bus or not real_bus", "real_bus", True),
    ("(uds or real_home) and not slow", "real_home", True), ("real_bus or not integration", "integration", False),
    ("not (uds and not real_bus)", "real_bus", True), ("dev(serial='x y') and integration", "integration", True),
    ("integration(", "integration", True),
])
def test_an_expression_asks_for_a_marker_only_if_it_names_it_outside_a_not(markexpr, marker, asked):
    from canarchy.testing.isolation.plugin import asks_for

    assert asks_for(markexpr, marker) is asked


def test_a_test_with_two_opt_outs_runs_only_when_both_are_asked_for(tmp_path):
    files = {"test_two.py": """
        import pytest
        @pytest.mark.real_home
        @pytest.mark.real_bus
        def test_home_and_bus():
            pass
    """}
    run = run_child(tmp_path / "one", files, "-m", "real_home")
    assert run.outcomes("test_home_and_bus") == set(), run.output  # the guard would be off: not asked
    run = run_child(tmp_path / "both", files, "-m", "real_home and real_bus")
    assert run.outcomes("test_home_and_bus") == {"passed"}, run.output


def test_each_opt_out_runs_only_when_named(tmp_path):
    proc = _pytest_with_repo_config(tmp_path, "-m", "real_bus or not integration", "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_on_a_real_bus PASSED" in proc.stdout and "test_ordinary PASSED" in proc.stdout
    assert "2 passed, 2 deselected" in proc.stdout, proc.stdout


# -- the isolation cannot be switched off by accident ----------------------------------------

WRITES_HOME = """
import canarchy.testing.required
from pathlib import Path
def test_writes_home():
    (Path.home() / ".canarchy").mkdir(exist_ok=True)
    (Path.home() / ".canarchy" / "config.toml").write_text("overwritten")
"""


def _operator_run(tmp_path, *args):
    """pytest with the repository's configuration on a project holding this suite's own
    conftest.py, as an operator whose ~/.canarchy/config.toml must survive."""
    project, home = tmp_path / "project", tmp_path / "operator-home"
    project.mkdir()
    (home / ".canarchy").mkdir(parents=True)
    (home / ".canarchy" / "config.toml").write_text("[transport]\ndefault_interface = \"can0\"\n")
    (project / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (project / "test_w.py").write_text(WRITES_HOME)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(REPO), HOME=str(home))
    proc = subprocess.run(
        [*PYTEST, "-c", str(REPO / "pyproject.toml"), "--rootdir", str(project),
         "-o", "canarchy_require_import=false", str(project), *args],
        capture_output=True, text=True, cwd=project, env=env, timeout=120,
    )  # fmt: skip
    return proc, (home / ".canarchy" / "config.toml").read_text()


def test_noconftest_still_runs_isolated(tmp_path):
    proc, config = _operator_run(tmp_path, "--noconftest")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert config == '[transport]\ndefault_interface = "can0"\n'


def test_a_run_with_the_plugin_disabled_is_refused(tmp_path):
    proc, config = _operator_run(tmp_path, "-p", "no:canarchy.testing.isolation.plugin")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "canarchy's tests run only under its isolation plugin (canarchy.testing.isolation.plugin)" in proc.stderr
    assert config == '[transport]\ndefault_interface = "can0"\n'


@pytest.mark.parametrize("opt_out", [("--noconftest", "-o", "addopts="), ("--noconftest", "-c", os.devnull)],
                         ids=["noconftest-no-addopts", "noconftest-other-config"])
def test_a_module_importing_required_never_runs_unisolated(tmp_path, opt_out):
    """Both ways the plugin is loaded dropped at once: nothing would refuse the run, but each
    test module that imports canarchy.testing.required is a collection error instead."""
    proc, config = _operator_run(tmp_path, *opt_out)
    assert proc.returncode == 2 and "0 passed" not in proc.stdout, proc.stdout + proc.stderr
    assert "canarchy's isolation (canarchy.testing.isolation.plugin) is not active" in proc.stdout, proc.stdout
    assert config == '[transport]\ndefault_interface = "can0"\n'


def test_every_test_module_imports_required():
    line = "import canarchy.testing.required  # noqa: F401"
    missing = [p.name for p in sorted((REPO / "tests").glob("test_*.py")) if line not in p.read_text()]
    assert missing == [], f"add `{line}` to these test modules"


def test_writing_helpers_refuse_a_home_that_is_not_disposable(canarchy_sandbox, monkeypatch):
    from tests import helpers

    assert helpers.disposable_home() == Path.home().resolve()
    monkeypatch.setenv("HOME", str(canarchy_sandbox.real_home))  # as in a real_home test
    with pytest.raises(RuntimeError, match="not a disposable home"):
        helpers.disposable_home()
    monkeypatch.setattr("canarchy.testing.isolation.session._ACTIVE", [])  # as with the plugin disabled
    with pytest.raises(RuntimeError, match="is not active"):
        helpers.require_isolation()


# -- the kernel's wall: a private network namespace for the whole run ----------------------

ESCAPING_CHILD = """
    import subprocess, sys
    def test_child_without_the_guard():
        probe = ("import os, socket; "
                 "print(os.readlink('/proc/self/ns/net'), sorted(n for _, n in socket.if_nameindex()))")
        print("CHILD-SEES", subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True).stdout)
"""


def _child_sees(output: str) -> tuple[str, str]:
    """(network namespace, interfaces) the ESCAPING_CHILD probe printed in a run's output."""
    line = next(line for line in output.splitlines() if "CHILD-SEES " in line)
    namespace, interfaces = line.split("CHILD-SEES ", 1)[1].split(" ", 1)
    return namespace, interfaces.strip()


@pytest.mark.skipif(not lane_netns.netns_support().available, reason=lane_netns.netns_support().reason)
def test_a_run_can_move_into_a_private_network_namespace(tmp_path):
    """With canarchy_network_namespace on, even a child the guard cannot reach (python -I)
    is in a namespace other than the caller's, with only lo; off, or when -m selects tests
    that use a real bus, it is not."""
    outer = os.readlink("/proc/self/ns/net")
    on = "[pytest]\ncanarchy_network_namespace = true\n"
    run = run_child(tmp_path / "on", {"test_c.py": ESCAPING_CHILD, "pytest.ini": on}, "-s")
    assert run.returncode == 0, run.output
    namespace, interfaces = _child_sees(run.output)
    assert namespace != outer and interfaces == "['lo']", run.output
    run = run_child(tmp_path / "off", {"test_c.py": ESCAPING_CHILD}, "-s")
    assert _child_sees(run.output)[0] == outer, run.output
    run = run_child(tmp_path / "bus", {"test_c.py": ESCAPING_CHILD, "pytest.ini": on},
                    "-s", "-m", "real_bus or not integration")
    assert _child_sees(run.output)[0] == outer, run.output
    # the same at the earliest start (-p: before the command line is parsed into config.option)
    run = run_child(tmp_path / "early", {"test_c.py": ESCAPING_CHILD, "pytest.ini": on}, "-s",
                    "-p", "canarchy.testing.isolation.plugin", "-m", "real_bus or not integration")
    assert _child_sees(run.output)[0] == outer, run.output
    # "not integration" cannot select a test that uses a real bus: the namespace stays
    run = run_child(tmp_path / "not", {"test_c.py": ESCAPING_CHILD, "pytest.ini": on}, "-s", "-m", "not integration")
    assert _child_sees(run.output)[0] != outer, run.output


@pytest.mark.skipif(not lane_netns.netns_support().available, reason=lane_netns.netns_support().reason)
def test_the_suite_keeps_its_namespace_under_a_foreign_config_file(tmp_path):
    """`-c /dev/null` loses pyproject's canarchy_network_namespace; tests/conftest.py asks again."""
    outer = os.readlink("/proc/self/ns/net")
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (project / "test_c.py").write_text(__import__("textwrap").dedent(ESCAPING_CHILD))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [*PYTEST, "-c", os.devnull, "--rootdir", str(project), "-s", str(project)],
        capture_output=True, text=True, cwd=project, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _child_sees(proc.stdout)[0] != outer, proc.stdout


# -- REQ-TISO-14: wider-scoped fixtures see the disposable home ---------------------------

@pytest.fixture(scope="module")
def module_scoped_config():
    """Loads canarchy's configuration from a module-scoped fixture (the seed-004 hazard)."""
    from canarchy import config

    # Where it would read, and what the environment says, without reading (a read of the operator's
    # config would be refused by the access guard at setup, before this test could say what is wrong).
    return {"home": Path.home(), "path": config.config_path(), "variables": sorted(
        k for k in os.environ if k.startswith(("CANARCHY_", "CAN_")))}


def test_module_scoped_fixture_sees_the_disposable_home(module_scoped_config, canarchy_sandbox):
    assert module_scoped_config["home"] == canarchy_sandbox.session_home
    assert module_scoped_config["path"].is_relative_to(canarchy_sandbox.root)
    assert module_scoped_config["variables"] == []


SCOPES_CONFTEST = """
    pytest_plugins = ["canarchy.testing.isolation.plugin"]
    import pytest
    from pathlib import Path
    def snapshot():
        from canarchy import transport, dbc_cache
        return {"home": Path.home(), "default": transport.default_can_interface(),
                "config": transport._load_user_config(), "cache": dbc_cache._CACHE_ROOT}
    @pytest.fixture(scope="session")
    def session_view():
        return snapshot()
    @pytest.fixture(scope="module")
    def module_view():
        return snapshot()
    @pytest.fixture(scope="class")
    def class_view():
        return snapshot()
"""
SCOPES = """
    import os
    from pathlib import Path
    operator_home = Path(os.environ["CHILD_OPERATOR_HOME"])
    def check(view):
        assert view["default"] is None
        assert view["config"] == {}
        assert operator_home not in view["home"].parents and view["home"] != operator_home
        assert not view["cache"].is_relative_to(operator_home)
    def test_session(session_view):
        check(session_view)
    def test_module(module_view):
        check(module_view)
    class TestClass:
        def test_class(self, class_view):
            check(class_view)
"""


def test_wider_scoped_fixtures_in_a_hostile_environment(batch):
    for name in ("test_session", "test_module", "test_class"):
        assert batch.outcomes(name) == {"passed"}, batch.output


# -- every route to a real bus ------------------------------------------

ROUTES = """
    import os, socket
    import pytest
    from can import Bus as PreBoundBus  # bound before the guard? (at import: the guard is installed at configure)
    import can
    from canarchy.testing.isolation.refusal import RealCanBusRefused

    opened = []
    _real_socket = socket.socket
    class _Recording(_real_socket):
        def __init__(self, family=-1, *args, **kwargs):
            opened.append(family)
            super().__init__(family, *args, **kwargs)
    socket.socket = _Recording

    def test_can_bus():
        can.Bus(channel="can0", interface="socketcan")
    def test_interface_bus():
        can.interface.Bus(channel="can0", interface="socketcan")
    def test_thread_safe_bus():
        can.ThreadSafeBus(channel="239.74.163.2", interface="udp_multicast")
    def test_prebound_bus():
        PreBoundBus(channel="can0", interface="socketcan")
    def test_positional():
        can.Bus("can0", "socketcan")
    def test_legacy_bustype():
        can.Bus(channel="can0", bustype="socketcan")
    def test_direct_udp_multicast_class():
        from can.interfaces.udp_multicast import UdpMulticastBus
        UdpMulticastBus("239.74.163.2")
    def test_direct_socketcan_class():
        from can.interfaces.socketcan import SocketcanBus
        SocketcanBus("vcan0")
    def test_env_can_interface():
        os.environ["CAN_INTERFACE"] = "socketcan"
        can.Bus(channel="can0")
    def test_env_can_config():
        os.environ["CAN_CONFIG"] = '{"interface": "udp_multicast", "channel": "239.74.163.2"}'
        can.Bus()
    def test_can_rc():
        can.rc["interface"] = "socketcan"
        can.Bus(channel="can0")
    def test_canrc_file():
        from pathlib import Path
        (Path.home() / ".canrc").write_text("[default]\\ninterface = socketcan\\nchannel = can0\\n")
        can.Bus()
    def test_detect_available_configs():
        can.detect_available_configs(interfaces=["socketcan"])
    def test_swallowed():
        try:
            can.Bus(channel="can0", interface="socketcan")
        except Exception:
            pass
    def test_driver_init_without_new():
        from can.interfaces.socketcand import SocketCanDaemonBus
        SocketCanDaemonBus.__init__(object.__new__(SocketCanDaemonBus), channel="can0", host="127.0.0.1", port=9)
    def test_driver_init_on_a_virtual_instance():
        from can.interfaces.socketcan import SocketcanBus
        from can.interfaces.virtual import VirtualBus
        SocketcanBus.__init__(object.__new__(VirtualBus), "can0")
    def test_subclass_with_its_own_new():
        from can.interfaces.socketcan import SocketcanBus
        class Sneaky(SocketcanBus):
            def __new__(cls, *args, **kwargs):
                return object.__new__(cls)
        Sneaky("can0")
    def test_raw_can_socket():
        _real_socket(socket.AF_CAN, socket.SOCK_RAW, socket.CAN_RAW).close()
    def test_packet_socket():  # frames onto can0 itself; no network namespace here
        _real_socket(socket.AF_PACKET, socket.SOCK_RAW, 0x000C).close()  # ETH_P_CAN
    def test_packet_socket_asked_as_inet():  # Linux's net/socket.c makes (AF_INET, SOCK_PACKET) a packet socket
        _real_socket(socket.AF_INET, 10 | socket.SOCK_CLOEXEC, socket.htons(0x0003)).close()  # ETH_P_ALL
    def test_bluetooth_socket():  # an ELM327-style OBD adapter over RFCOMM
        _real_socket(31, socket.SOCK_STREAM, 3).close()  # AF_BLUETOOTH, BTPROTO_RFCOMM: not every Python names them
    def test_vsock_socket():  # the hypervisor's host, beyond every network namespace
        _real_socket(40, socket.SOCK_STREAM).close()  # AF_VSOCK

    def test_detect_available_configs_is_refused_before_the_driver_is_imported(bus_guard):
        with pytest.raises(RealCanBusRefused):
            can.detect_available_configs(interfaces=["socketcan"])
        assert [r.route for r in bus_guard.take_refusals()] == ["by-name"]  # not the driver's own probe's

    def test_a_driver_s_own_probe():  # socketcand's listens for beacons; PCAN's and Kvaser's libraries open devices
        from can.interfaces.socketcand import SocketCanDaemonBus
        SocketCanDaemonBus._detect_available_configs()

    def test_zz_no_socket_was_opened():
        assert opened == []

    def test_virtual_spellings():
        from can.interfaces.virtual import VirtualBus
        VirtualBus._detect_available_configs()  # the in-process bus's own probe passes
        buses = [can.Bus(channel="v1", interface="virtual"), can.Bus("v2", "virtual"),
                 can.Bus(channel="v3", bustype="virtual"), VirtualBus("v4"),
                 can.ThreadSafeBus(channel="v5", interface="virtual")]
        for bus in buses:
            bus.shutdown()
"""
REFUSED_ROUTES = ("test_can_bus", "test_interface_bus", "test_thread_safe_bus", "test_prebound_bus", "test_positional",
                  "test_legacy_bustype", "test_direct_udp_multicast_class", "test_direct_socketcan_class",
                  "test_env_can_interface", "test_env_can_config", "test_can_rc", "test_canrc_file",
                  "test_detect_available_configs", "test_swallowed", "test_driver_init_without_new",
                  "test_driver_init_on_a_virtual_instance", "test_subclass_with_its_own_new", "test_raw_can_socket",
                  "test_packet_socket", "test_packet_socket_asked_as_inet", "test_bluetooth_socket",
                  "test_vsock_socket", "test_a_driver_s_own_probe")


def test_every_route_to_a_real_bus_is_refused(batch):
    for name in REFUSED_ROUTES:
        outcomes = batch.outcomes(name)
        assert outcomes & {"failed", "error"}, f"{name} was not refused:\n{batch.output}"
        messages = batch.messages(name)
        assert "tried to open a real CAN bus" in messages, f"{name}:\n{messages}"
        assert f"test_routes.py::{name}" in messages, f"{name} not named:\n{messages}"
    assert batch.outcomes("test_zz_no_socket_was_opened") == {"passed"}, batch.output
    assert batch.outcomes("test_detect_available_configs_is_refused_before_the_driver_is_imported") == {"passed"}, \
        batch.messages("test_detect_available_configs_is_refused_before_the_driver_is_imported")
    assert batch.outcomes("test_virtual_spellings") == {"passed"}, batch.messages("test_virtual_spellings")


SWALLOW = """
    import can
    def test_swallows_a_refusal():
        try:
            can.Bus(channel="can0", interface="socketcan")
        except Exception:
            pass
    def test_next_is_clean():
        pass
"""


def test_swallowed_refusal_fails_its_test_at_teardown(batch):
    """A swallowed refusal still fails its test, at teardown, with the guard's message."""
    assert batch.outcomes("test_swallows_a_refusal") == {"error"}  # the call passed; the teardown check fails it
    assert "the error may have been caught" in batch.messages("test_swallows_a_refusal")
    assert batch.outcomes("test_next_is_clean") == {"passed"}


# -- environment does not survive a test --------------------------------

ENVIRONMENT = """
    import os, subprocess, sys
    def test_a_sets():
        os.environ["CANARCHY_MCP_NONINTERACTIVE_ACK"] = "1"
        os.environ["SOME_OTHER_SETTING"] = "x"
        os.environ["LEFT_BY_THE_OPERATOR"] = "changed"
        del os.environ["ALSO_LEFT_BY_THE_OPERATOR"]
        os.environb[b"NOT_UTF8"] = b"\\xff\\xfe"
    def test_b_sees_nothing():
        assert "CANARCHY_MCP_NONINTERACTIVE_ACK" not in os.environ
        assert "SOME_OTHER_SETTING" not in os.environ and b"NOT_UTF8" not in os.environb
        assert (os.environ["LEFT_BY_THE_OPERATOR"], os.environ["ALSO_LEFT_BY_THE_OPERATOR"]) == ("kept", "kept")
        # and the C environment a child inherits says the same
        probe = ("import os; print(sorted(k for k in os.environ if k.startswith(('SOME_', 'NOT_UTF8', 'LEFT_', "
                 "'ALSO_'))), os.environ['LEFT_BY_THE_OPERATOR'])")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        assert out.split(" ", 1) == ["['ALSO_LEFT_BY_THE_OPERATOR',", "'LEFT_BY_THE_OPERATOR'] kept\\n"], out
"""


HOME_FILE_VARIABLES = """
    import os, subprocess
    from pathlib import Path
    def test_git_config_global_writes_into_the_test_home():
        assert [k for k in ("GIT_CONFIG_GLOBAL", "PYTHONSTARTUP", "KUBECONFIG") if k in os.environ] == []
        assert os.environ["PYENV_ROOT"] == os.path.join(os.environ["CHILD_OPERATOR_HOME"], ".pyenv")
        subprocess.run(["git", "config", "--global", "user.name", "a test"], check=True)
        assert "a test" in (Path.home() / ".gitconfig").read_text()
"""


def test_a_variable_naming_a_file_in_the_operator_s_home_does_not_reach_a_test(batch):
    """``GIT_CONFIG_GLOBAL`` exported by the operator: a test's ``git config --global`` writes its own home."""
    assert batch.outcomes("test_git_config_global_writes_into_the_test_home") == {"passed"}, batch.output
    assert not (batch.home / ".gitconfig").exists()


def test_only_variables_naming_files_of_the_operator_s_home_are_left_out(tmp_path):
    from canarchy.testing.isolation.sandbox import Sandbox

    home = tmp_path / "op"
    checkout = home / "src" / "project"
    checkout.mkdir(parents=True)
    (tmp_path / "link").symlink_to(home)  # /home/me where /home links to /var/home: the home by another name
    operator = {"HOME": str(home), "PATH": f"{home}/.local/bin:/usr/bin", "VIRTUAL_ENV": f"{home}/.venv",
                "GIT_CONFIG_GLOBAL": f"{home}/.gitconfig", "PIP_CONFIG_FILE": f"{home}/x/../pip.conf",
                "GNUPGHOME": f"{tmp_path}/link/.gnupg", "HISTFILE": f"/{home}/.history",
                "THROUGH_A_LINK_INTO_THE_CHECKOUT": f"{tmp_path}/link/src/project/setup.cfg",
                "LINK_TO_THE_HOME": f"{tmp_path}/link",
                "NPM_CONFIG_USERCONFIG": f"{home}/.npmrc", "XDG_DATA_DIRS": f"/usr/share:{home}/.local/share",
                "COVERAGE_RCFILE": f"{checkout}/.coveragerc", "NAMES_THE_HOME": str(home),
                "ELSEWHERE": "/etc/gitconfig", "WORDS": f"--config={home}/.x", "RELATIVE": "x/y",
                "KEPT_BY_THE_PROJECT": f"{home}/.canarchy/config.toml"}
    sandbox = Sandbox(operator, str(tmp_path), code_trees=(str(checkout),), keep_variables=("KEPT_",))
    try:
        env = sandbox.isolated_environment(sandbox.session_home)
    finally:
        sandbox.cleanup()
    assert {"GIT_CONFIG_GLOBAL", "PIP_CONFIG_FILE", "NPM_CONFIG_USERCONFIG", "XDG_DATA_DIRS", "GNUPGHOME",
            "HISTFILE"}.isdisjoint(env), env
    kept = ("PATH", "VIRTUAL_ENV", "COVERAGE_RCFILE", "NAMES_THE_HOME", "ELSEWHERE", "WORDS", "RELATIVE",
            "KEPT_BY_THE_PROJECT", "THROUGH_A_LINK_INTO_THE_CHECKOUT", "LINK_TO_THE_HOME")
    assert {k: env[k] for k in kept} == {k: operator[k] for k in kept}
    assert env["HOME"] == str(sandbox.session_home)


def test_environment_set_by_a_test_does_not_reach_the_next(batch):
    """The batch exports LEFT_BY_THE_OPERATOR and ALSO_LEFT_BY_THE_OPERATOR as "kept"."""
    assert batch.outcomes("test_a_sets") == {"passed"}, batch.output
    assert batch.outcomes("test_b_sees_nothing") == {"passed"}, batch.output


SET_OUTSIDE_ANY_TEST = {
    "pyproject.toml": '[tool.pytest.ini_options]\naddopts = ["-p", "canarchy.testing.isolation.plugin"]\n'
                      'canarchy_scrub_prefixes = ["X_", "CAN_"]\n',
    ".gitignore": "__pycache__/\n",
    "tests/conftest.py": "import os\nimport pytest\n\nos.environ['X_FLAG'] = '1'\nos.environ['OTHER'] = '1'\n\n\n"
                         "@pytest.fixture(scope='session', autouse=True)\ndef channel():\n"
                         "    os.environ['X_CHANNEL'] = 'vcan0'\n",
    "tests/test_p.py": "import os\n\n\ndef test_flag():\n    assert 'X_FLAG' not in os.environ\n\n\n"
                       "def test_other():\n    assert os.environ['OTHER'] == '1'\n",
}


@pytest.mark.parametrize("workers", [(), ("-p", "xdist", "-n", "1")], ids=["serial", "xdist"])
def test_a_scrubbed_variable_set_outside_any_test_is_removed_saying_so(tmp_path, workers):
    """A conftest (at import, or in a session fixture) sets variables under canarchy_scrub_prefixes: every test
    runs without them, as before, but the first test's report and the run's summary now say which and why,
    instead of a test that finds its variable gone for no reason it can see. Under pytest-xdist the
    controller's summary says what its workers found."""
    for name, text in SET_OUTSIDE_ANY_TEST.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    run = subprocess.run([*PYTEST, "-p", "no:randomly", "-rP", *workers, "tests"], cwd=tmp_path, capture_output=True,
                         text=True)
    out = run.stdout
    assert run.returncode == 0 and "2 passed" in out, out + run.stderr
    said = ("removed X_CHANNEL, X_FLAG: set outside any test (a conftest, collection or a fixture wider than a test) "
            "under canarchy_scrub_prefixes (X_), which every test runs without")
    assert "canarchy isolation: scrubbed variables set outside any test" in out and \
        f"before tests/test_p.py::test_flag: {said}" in out, out
    assert "Captured canarchy isolation setup" in out and "monkeypatch.setenv" in out, out  # test_flag's own report
    assert "OTHER" not in out.split("scrubbed variables set outside any test", 1)[1], out  # not a scrubbed prefix


SET_AT_IMPORT = {
    "pyproject.toml": '[tool.pytest.ini_options]\naddopts = ["-p", "canarchy.testing.isolation.plugin"]\n',
    ".gitignore": "__pycache__/\n",
    "tests/conftest.py": "import os\n\nos.environ['APP_SETTINGS'] = 'tests.settings'\nos.environ.pop('LANG', None)\n",
    "tests/test_s.py": "import os\nimport pytest\n\nSET = 'tests.settings'\n\n\n"
                       "def test_a():\n"
                       "    assert (os.environ['APP_SETTINGS'], 'LANG' in os.environ) == (SET, False)\n\n\n"
                       "@pytest.mark.real_home\ndef test_b_opts_out():\n"
                       "    assert os.environ['APP_SETTINGS'] == SET\n\n\n"
                       "def test_c_after_it():\n    assert os.environ['APP_SETTINGS'] == SET\n",
}


@pytest.mark.parametrize("workers", [(), ("-p", "xdist", "-n", "1")], ids=["serial", "xdist"])
def test_a_variable_a_conftest_sets_at_import_reaches_every_test(tmp_path, workers):
    """A conftest sets a variable at import (Django's settings module, say) or removes one: every test sees that,
    as under plain pytest, in a pytest-xdist worker too (whose isolation starts after its conftests ran), in a
    test that opts out (real_home: the operator's environment and what conftests set) and after one."""
    for name, text in SET_AT_IMPORT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    run = subprocess.run([*PYTEST, "-p", "no:randomly", "-m", "real_home or not real_home", *workers, "tests"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "LANG": "C.UTF-8"})
    assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout + run.stderr


def test_a_pytest_a_test_starts_in_a_pytest_xdist_worker_is_isolated_from_its_start(tmp_path):
    """Such a run inherits ``PYTEST_XDIST_WORKER`` but is no worker: its isolation starts before its initial
    conftests, which then run inside it (a variable one sets is said, as in any run)."""
    for name, text in SET_OUTSIDE_ANY_TEST.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw7", "PYTEST_XDIST_TESTRUNUID": "0" * 32}
    run = subprocess.run([*PYTEST, "-p", "no:randomly", "tests"], cwd=tmp_path, capture_output=True, text=True,
                         env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "session layer started before the initial conftests are imported" in run.stdout, run.stdout
    assert "before tests/test_p.py::test_flag: removed X_CHANNEL, X_FLAG:" in run.stdout, run.stdout


def test_unlisted_import_time_paths_are_found_and_repointed(canarchy_sandbox, monkeypatch):
    import types

    real = canarchy_sandbox.real_home
    probe = types.ModuleType("canarchy._audit_probe")
    probe.STATE_DIR = real / ".canarchy" / "probe"
    probe.STATE_TEXT = str(real / ".canarchy" / "probe.json")

    def reader(path=real / ".canarchy" / "x.json", *, other=str(real / ".canarchy" / "y")):
        return path, other

    reader.__module__ = "canarchy._audit_probe"
    probe.reader = reader
    monkeypatch.setitem(sys.modules, "canarchy._audit_probe", probe)
    offenders = canarchy_sandbox.paths_under_real_home()
    assert len([o for o in offenders if o.startswith("canarchy._audit_probe.")]) == 4, offenders
    canarchy_sandbox.rebase(Path.home())
    assert Path.home() / ".canarchy" / "probe" == probe.STATE_DIR
    assert str(Path.home() / ".canarchy" / "probe.json") == probe.STATE_TEXT
    assert reader() == (Path.home() / ".canarchy" / "x.json", str(Path.home() / ".canarchy" / "y"))
    assert [o for o in canarchy_sandbox.paths_under_real_home() if "_audit_probe" in o] == []


def test_no_canarchy_module_holds_the_real_home(canarchy_sandbox):
    import importlib
    import pkgutil

    import canarchy

    for info in pkgutil.walk_packages(canarchy.__path__, "canarchy."):
        if not info.name.startswith("canarchy.testing") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert canarchy_sandbox.paths_under_real_home() == []


# -- child processes ------------------------------------------------------

def test_a_test_takes_its_own_refusals_and_they_stay_in_its_report(request, bus_guard):
    """Taken, a refusal no longer fails the test, but its JUnit case keeps it; another test's are not
    a test's to take."""
    import can

    from canarchy.testing.isolation.refusal import EXPECTED_REFUSAL_PROPERTY

    with pytest.raises(RealCanBusRefused):
        can.Bus(channel="can0", interface="socketcan")
    with pytest.raises(ValueError, match="may take its own refusals only"):
        bus_guard.take_refusals("tests/test_other.py::test_other")
    assert [r.channel for r in bus_guard.take_refusals(request.node.nodeid)] == ["can0"]
    [(_, text)] = [p for p in request.node.user_properties if p[0] == EXPECTED_REFUSAL_PROPERTY]
    assert request.node.nodeid in text and "tried to open a real CAN bus" in text


def test_the_plugin_s_programs_get_no_variable_that_moves_git_elsewhere(tmp_path):
    """The sentinel's git reads the checkout's repository with the operator's ignore rules: of git's
    variables only those choosing configuration files pass, and a test cannot add one."""
    from canarchy.testing.isolation.sandbox import Sandbox

    operator = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "GIT_DIR": "/elsewhere/.git",
                "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.excludesFile", "GIT_CONFIG_VALUE_0": "/dev/null",
                "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"), "CAN_INTERFACE": "socketcan"}
    sandbox = Sandbox(operator, parent=str(tmp_path))
    try:
        assert dict(sandbox.tool_env) == {"HOME": str(tmp_path), "PATH": os.environ["PATH"],
                                          "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig")}
        with pytest.raises(TypeError):
            sandbox.tool_env["GIT_DIR"] = "/elsewhere/.git"  # type: ignore[index]
    finally:
        sandbox.cleanup()


def test_child_process_inherits_the_home():
    out = subprocess.run([sys.executable, "-c", "import pathlib, os; print(pathlib.Path.home()); "
                          "print(sorted(k for k in os.environ if k.startswith(('CANARCHY_', 'CAN_'))))"],
                         capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert out == [str(Path.home()), "[]"]


INNER_RUN = """
import subprocess, sys

def test_its_child_reads_the_inner_operator_s_config():
    subprocess.run([sys.executable, "-c", "import os; open(os.environ['CHILD_INNER_CONFIG']).read()"])

def test_its_child_starts():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
"""


def test_a_child_pytest_given_the_run_s_environment_isolates_its_own_tests(tmp_path):
    """A test that runs pytest under the plugin (a project testing its own pytest plugins) hands it the run's
    guard; that pytest's session then configures the guard of its own tests' children (its operator's home
    refused to them): its own work, not a forged configuration."""
    project, home = tmp_path / "project", tmp_path / "home"
    (home / ".canarchy").mkdir(parents=True)
    (home / ".canarchy" / "config.toml").write_text("[safety]\n")
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "conftest.py").write_text('pytest_plugins = ["canarchy.testing.isolation.plugin"]\n')
    (project / "test_inner.py").write_text(INNER_RUN)
    env = dict(os.environ, HOME=str(home), CHILD_INNER_CONFIG=str(home / ".canarchy" / "config.toml"))
    proc = subprocess.run([*PYTEST, "-q", "-p", "no:randomly", "-o", "canarchy_keep_variables=CHILD_"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 passed, 1 error" in out and "INTERNALERROR" not in out
    assert "test_inner.py::test_its_child_reads_the_inner_operator_s_config tried to open for reading" in out


def test_child_process_bus_is_refused_naming_the_parent_test(request, bus_guard):
    env = dict(os.environ, CANARCHY_PYTHON_CAN_INTERFACE="udp_multicast", CANARCHY_MCP_NONINTERACTIVE_ACK="1")
    proc = subprocess.run([sys.executable, "-m", "canarchy", "send", "239.74.163.2", "0x123", "01", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tried to open a real CAN bus" in proc.stdout
    assert request.node.nodeid in proc.stdout
    refusals = bus_guard.take_refusals(request.node.nodeid)
    assert [(r.interface, r.pid != os.getpid()) for r in refusals] == [("udp_multicast", True)]


SWALLOWED_CHILD = """
    import subprocess, sys
    def test_spawns():
        subprocess.run([sys.executable, "-c",
                        "import can\\ntry:\\n  can.Bus(channel='can0', interface='socketcan')\\n"
                        "except Exception: pass"],
                       check=True, timeout=60)
"""


def test_swallowed_child_refusal_still_fails_the_parent(batch):
    assert "error" in batch.outcomes("test_spawns"), batch.output
    assert "in child process" in batch.messages("test_spawns")


# The parent reads its children's records with os.pread and json.loads: a fixture that replaces them for
# the tests of its module (the seal does not cover the standard library) would keep the records out.
BLINDED_PARENT = """
    import json, os
    import pytest
    import test_child  # SWALLOWED_CHILD

    @pytest.fixture(scope="module")
    def blinded():
        real = os.pread, json.loads
        os.pread, json.loads = (lambda fd, size, offset: b""), (lambda text: None)
        yield
        os.pread, json.loads = real

    def test_spawns_with_the_parent_blinded(blinded):
        test_child.test_spawns()
"""


def test_a_child_s_refusal_reaches_the_parent_whose_reading_calls_a_test_replaced(batch):
    assert "error" in batch.outcomes("test_spawns_with_the_parent_blinded"), batch.output
    assert "in child process" in batch.messages("test_spawns_with_the_parent_blinded")


# What a thread or child left running by a test does later: read the operator's config (refused).
LATE_READ = """
    import os, threading, time
    from pathlib import Path

    TARGET = Path(os.environ["CHILD_OPERATOR_HOME"]) / ".canarchy" / "config.toml"

    def _read():
        try:
            open(TARGET).close()
        except Exception:
            pass
"""

LATE = LATE_READ + """
    NEXT_TEST_RUNS = threading.Event()
    THREAD_ACTED = threading.Event()

    def test_leaves_a_thread_running():
        threading.Thread(target=lambda: (NEXT_TEST_RUNS.wait(30), _read(), THREAD_ACTED.set()), daemon=True).start()

    def test_runs_while_that_thread_acts():
        NEXT_TEST_RUNS.set()
        THREAD_ACTED.wait(30)  # a bound against a hang: the thread acts while this test runs

    ACTED = Path(os.environ["CHILD_OPERATOR_HOME"]).parent / "child-acted"
    NEXT_TEST_STARTED = Path(os.environ["CHILD_OPERATOR_HOME"]).parent / "next-test-started"

    def test_forks_a_child_that_acts_later():
        if os.fork() == 0:
            deadline = time.monotonic() + 30  # acts once the next test runs (a bound against a hang)
            while not NEXT_TEST_STARTED.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            _read()
            os.close(os.open(ACTED, os.O_CREAT | os.O_WRONLY))
            os._exit(0)

    def test_runs_while_that_child_acts():
        os.close(os.open(NEXT_TEST_STARTED, os.O_CREAT | os.O_WRONLY))
        deadline = time.monotonic() + 30  # a bound against a hang: the child acts while this test runs
        while not ACTED.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
"""


@pytest.mark.parametrize("workers", [(), ("-p", "xdist", "-n", "2", "--dist", "loadfile")], ids=["serial", "xdist"])
def test_what_a_test_leaves_running_is_named_after_it_ended_and_the_next_test_is_not_blamed(tmp_path, workers):
    """A thread or a forked child that outlives its test and is refused later: the run fails with
    a line naming the test that left it running; the test running at that moment passes. Under
    pytest-xdist the worker's line reaches the controller, which fails the run."""
    if workers:
        pytest.importorskip("xdist")
    run = run_child(tmp_path, {"test_late.py": LATE}, *workers,
                    env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    for name in ("test_leaves_a_thread_running", "test_runs_while_that_thread_acts",
                 "test_forks_a_child_that_acts_later", "test_runs_while_that_child_acts"):
        assert run.outcomes(name) == {"passed"}, run.output
    assert run.returncode == 1, run.output
    late = run.output[run.output.index("attempts refused after their test had ended"):]
    assert "test_late.py::test_leaves_a_thread_running tried to open for reading" in late, run.output
    assert "test_late.py::test_forks_a_child_that_acts_later tried to open for reading" in late, run.output
    assert "in child process" in late and "test_runs_while" not in late, late


ORPHAN_IN_A_WORKER = """
    import os, signal, subprocess

    def test_ends_a_process_its_shell_left_behind():
        # the shell ends; its sleep is adopted by the run's subreaper: the controller, not this worker
        pid = int(subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                 text=True, check=True).stdout)
        os.kill(pid, signal.SIGKILL)
"""


def test_a_pytest_xdist_worker_s_test_may_end_what_it_started_after_the_controller_adopted_it(tmp_path):
    """What a test's shell leaves behind is adopted by the run's top pytest (the subreaper), which under
    pytest-xdist is the controller, above the worker: it is still the run's, so the test may signal it."""
    pytest.importorskip("xdist")
    run = run_child(tmp_path, {"test_orphan.py": ORPHAN_IN_A_WORKER}, "-p", "xdist", "-n", "1")
    assert run.outcomes("test_ends_a_process_its_shell_left_behind") == {"passed"}, run.output
    assert run.returncode == 0, run.output


REUSED_THREAD_ID = LATE_READ + """
    import queue

    STOP, ACT = threading.Event(), threading.Event()
    FIRST = []

    def test_leaves_a_thread_running():
        first = threading.Thread(target=lambda: STOP.wait(30), daemon=True)
        first.start()
        FIRST.append(first)

    def _candidate(decided):
        if decided.get(timeout=30):
            ACT.wait(30)
            _read()

    def test_ends_it_and_leaves_another():
        STOP.set()
        FIRST[0].join(30)
        # join() returns before the C library has taken the thread's stack back: until then the next thread gets
        # another, and the C library hands out the stack freed last (a failed candidate's) from then on
        task, deadline = f"/proc/self/task/{FIRST[0].native_id}", time.monotonic() + 10
        while os.path.exists(task) and time.monotonic() < deadline:
            time.sleep(0.005)
        reused = False
        for _ in range(300):  # once the first thread has fully exited, the C library gives its id to the next
            decided = queue.Queue()
            second = threading.Thread(target=_candidate, args=(decided,), daemon=True)
            second.start()
            reused = second.ident == FIRST[0].ident
            decided.put(reused)
            if reused:
                break
            second.join(30)
            time.sleep(0.01)
        Path(os.environ["CHILD_OPERATOR_HOME"]).parent.joinpath("reused").write_text(str(reused))

    def test_runs_while_it_acts():
        ACT.set()
        time.sleep(0.5)
"""


def test_a_thread_id_reused_by_a_later_test_s_thread_names_that_later_test(tmp_path):
    """Thread ids are reused once a thread ends: a thread left running by the second test, with the
    id of the first test's ended thread, is named after the second test, not the first."""
    run = run_child(tmp_path, {"test_reuse.py": REUSED_THREAD_ID},
                    env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    if (tmp_path / "reused").read_text() != "True":
        pytest.skip("this C library gave the second thread a new id: nothing was reused")
    late = run.output[run.output.index("attempts refused after their test had ended"):]
    assert "test_reuse.py::test_ends_it_and_leaves_another tried to open for reading" in late, run.output
    assert "test_leaves_a_thread_running tried" not in late, late
    assert run.outcomes("test_runs_while_it_acts") == {"passed"}, run.output


def test_a_wider_fixture_failed_by_a_refusal_errors_only_the_tests_that_need_it(tmp_path):
    """The refusal that fails a module-scoped fixture's set-up is reported with the test that needed
    it (and every later one that does: pytest keeps the error), not at the next, unrelated test."""
    run = run_child(tmp_path, {"test_fixture_refused.py": """
        import os, pytest
        from pathlib import Path

        @pytest.fixture(scope="module")
        def operator_config():
            return (Path(os.environ["CHILD_OPERATOR_HOME"]) / ".canarchy" / "config.toml").read_text()

        @pytest.fixture(scope="module")
        def operator_config_or_nothing():
            try:
                (Path(os.environ["CHILD_OPERATOR_HOME"]) / ".canarchy" / "config.toml").read_text()
            except Exception:
                raise RuntimeError("no configuration") from None

        def test_needs_it(operator_config):
            pass

        def test_innocent_next():
            pass

        def test_needs_the_other(operator_config_or_nothing):
            pass

        def test_innocent_last():
            pass
    """}, env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    for name in ("test_needs_it", "test_needs_the_other"):
        assert run.outcomes(name) == {"error"}, run.output
        assert "module-scoped fixture" in run.messages(name) and "tried to open for reading" in run.messages(name)
    assert "RuntimeError: no configuration" in run.messages("test_needs_the_other")
    for name in ("test_innocent_next", "test_innocent_last"):
        assert run.outcomes(name) == {"passed"}, run.output


def test_a_test_run_twice_in_one_session_is_failed_for_its_own_refusal_both_times(tmp_path):
    """What a rerun plugin does (here ``--keep-duplicates``): the second run's refusal is its own, not late."""
    run = run_child(tmp_path, {"test_twice.py": """
        import can
        def test_swallows_a_refusal():
            try:
                can.Bus(channel="can0", interface="socketcan")
            except Exception:
                pass
    """}, "--keep-duplicates", "test_twice.py", "test_twice.py")
    outcomes = [outcome for outcome, _ in run.results.get("test_swallows_a_refusal", [])]
    assert outcomes == ["error", "error"], run.output
    assert "attempts refused after their test had ended" not in run.output, run.output


# -- in-process resources ----------------------------------------------------

LEFT_OPEN = """
    import can
    KEEP = []
    def test_leaves_bus_open():
        KEEP.append(can.Bus(channel="left-open", interface="virtual"))
    def test_drops_unclosed_bus():
        can.Bus(channel="dropped", interface="virtual")
    def test_after():
        from can.interfaces import virtual
        assert virtual.channels == {}
"""


def test_a_bus_left_open_fails_its_test(batch):
    assert "error" in batch.outcomes("test_leaves_bus_open"), batch.output
    assert "left 1 python-can bus(es) open" in batch.messages("test_leaves_bus_open")
    assert "error" in batch.outcomes("test_drops_unclosed_bus"), batch.output
    assert "not properly shut down" in batch.messages("test_drops_unclosed_bus")
    assert batch.outcomes("test_after") == {"passed"}


def test_virtual_channel_names_are_unique(virtual_channel):
    from canarchy.testing.isolation.plugin import new_virtual_channel

    names = {virtual_channel, *(new_virtual_channel() for _ in range(100))}
    assert len(names) == 101
    assert all(name.startswith(f"canarchy-test-{os.getpid()}-") for name in names)


# -- the checkout ----------------------------------------------------------------

def test_working_directory_is_disposable(canarchy_sandbox):
    cwd = Path.cwd()
    assert canarchy_sandbox.root in cwd.parents
    assert list(cwd.iterdir()) == []
    from tests.helpers import run_cli

    assert run_cli("session", "save", "probe", "--json").code == 0
    assert (cwd / ".canarchy" / "sessions" / "probe.json").is_file()
    assert not (REPO / ".canarchy").exists()


# -- the sentinel --------------------------------------------------------------------

def test_sentinel_fails_a_run_that_writes_operator_state(tmp_path):
    """The last line: a write the access guard cannot see (a shell child, the containment off)
    still fails the run, listed; a write into the checkout is listed with the test that made it."""
    run = run_child(tmp_path, {"conftest.py": """
        pytest_plugins = ["canarchy.testing.isolation.plugin"]
        import subprocess
        import pytest
        @pytest.fixture(scope="session")
        def late_writer(canarchy_sandbox):
            yield
            target = canarchy_sandbox.real_home / ".canarchy" / "findings" / "written-at-teardown"
            subprocess.run(["sh", "-c", f"mkdir -p '{target}'"], check=True)
    """, "test_write.py": """
        from pathlib import Path
        def test_writes_checkout(late_writer, request):
            (Path(request.config.rootpath) / "stray.txt").write_text("x")
    """})
    assert run.returncode == 1, run.output
    assert "canarchy isolation sentinel" in run.output and "changed the operator's state" in run.output
    assert f"added: {run.home}/.canarchy/findings/written-at-teardown" in run.output, run.output
    assert "added: stray.txt (written by test_write.py::test_writes_checkout)" in run.output


def test_a_write_into_the_operator_home_is_refused_at_once_naming_the_fixture(tmp_path):
    run = run_child(tmp_path, {"conftest.py": """
        pytest_plugins = ["canarchy.testing.isolation.plugin"]
        import pytest
        @pytest.fixture(scope="session")
        def late_writer(canarchy_sandbox):
            yield
            (canarchy_sandbox.real_home / ".canarchy" / "findings" / "written-at-teardown").mkdir()
    """, "test_write.py": """
        def test_uses_it(late_writer):
            pass
    """})
    assert run.returncode == 1, run.output
    assert "session-scoped fixture 'late_writer'" in run.output and "tried to mkdir" in run.output, run.output
    assert not (run.home / ".canarchy" / "findings" / "written-at-teardown").exists()


def test_sentinel_blames_the_tests_not_an_installed_plugins_start_up_files(tmp_path):
    # An operator's pytest-benchmark makes .benchmarks/ in the working directory
    # from its pytest_configure (CI found this). A plugin doing the same at
    # start-up is the operator's tooling; a test writing there still fails the run.
    files = {"tool_plugin.py": """
        from pathlib import Path
        def pytest_configure(config):
            (Path.cwd() / ".tool-cache").mkdir(exist_ok=True)
    """, "test_write.py": """
        from pathlib import Path
        def test_quiet():
            pass
    """}
    run = run_child(tmp_path / "quiet", files, "-p", "tool_plugin")
    assert (tmp_path / "quiet" / "project" / ".tool-cache").is_dir(), "the plugin never ran"
    assert run.returncode == 0 and run.outcomes("test_quiet") == {"passed"}, run.output
    assert "canarchy isolation sentinel" not in run.output
    files["test_write.py"] = """
        from pathlib import Path
        def test_writes(request):
            (Path(request.config.rootpath) / "stray.txt").write_text("x")
    """
    run = run_child(tmp_path / "writes", files, "-p", "tool_plugin")
    assert run.returncode == 1, run.output
    assert "added: stray.txt" in run.output and ".tool-cache" not in run.output, run.output


# -- opt-outs -----------------------------------------------------------------------

def test_opt_out_markers(tmp_path):
    run = run_child(tmp_path, {"test_optout.py": """
        import os
        import pytest
        from pathlib import Path
        from canarchy.testing.isolation import guard
        operator_home = Path(os.environ["CHILD_OPERATOR_HOME"])
        @pytest.mark.integration
        def test_integration_sees_the_operator():
            assert Path.home() == operator_home
            assert os.environ["CANARCHY_DEFAULT_INTERFACE"] == "can9"
            assert guard.GUARD.enabled is False
        @pytest.mark.real_home
        def test_real_home_keeps_the_guard():
            assert Path.home() == operator_home
            assert guard.GUARD.enabled is True
        @pytest.mark.real_bus
        def test_real_bus_keeps_the_home_isolated():
            assert Path.home() != operator_home
            assert "CANARCHY_DEFAULT_INTERFACE" not in os.environ
            assert guard.GUARD.enabled is False
        @pytest.mark.uds
        def test_uds():
            pass
    """, "pytest.ini": "[pytest]\nmarkers =\n    uds: uds tests\n"},
        "-m", "uds or real_home or real_bus", env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    assert run.outcomes("test_integration_sees_the_operator") == set(), "integration ran under -m without it"
    for name in ("test_real_home_keeps_the_guard", "test_real_bus_keeps_the_home_isolated", "test_uds"):
        assert run.outcomes(name) == {"passed"}, run.output
    run = run_child(tmp_path / "selected", {"test_optout.py": """
        import os
        import pytest
        from pathlib import Path
        @pytest.mark.integration
        def test_integration_sees_the_operator():
            assert Path.home() == Path(os.environ["CHILD_OPERATOR_HOME"])
            assert os.environ["CANARCHY_DEFAULT_INTERFACE"] == "can9"
    """}, "-m", "integration", env={"CHILD_OPERATOR_HOME": str(tmp_path / "selected" / "operator-home")})
    assert run.outcomes("test_integration_sees_the_operator") == {"passed"}, run.output


# -- parallel runs ------------------------------------------------------------------

def test_parallel_workers_are_isolated(tmp_path):
    pytest.importorskip("xdist")
    source = """
        import os
        import pytest
        from pathlib import Path
        from canarchy import transport
        @pytest.mark.parametrize("n", range(4))
        def test_isolated(n, request):
            assert transport.default_can_interface() is None
            assert "canarchy_operator_env" not in request.config.workerinput  # handed over, then taken out
            assert Path.home() != Path(os.environ["CHILD_OPERATOR_HOME"])
            assert list(Path.home().iterdir()) == []
            (Path.home() / "mark").write_text(str(n))
    """
    env = {"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")}
    run = run_child(tmp_path, {"test_par.py": source}, "-p", "xdist", "-n", "2", env=env)
    assert run.returncode == 0, run.output
    assert sum(1 for name in run.results if name.startswith("test_isolated")) == 4


@pytest.mark.parametrize("workers", [(), ("-p", "xdist", "-n", "2")], ids=["serial", "xdist"])
def test_the_plugin_leaves_nothing_a_project_s_strict_warning_filter_fails_a_test_for(tmp_path, workers):
    """A project that turns every warning into an error (``filterwarnings = error``), in a directory that is no
    git work tree, as the lanes' copies are: nothing the plugin opens or starts (a git listing it gave up
    on, a file, a socket) is left for Python to warn about in one of the project's tests."""
    if workers:
        pytest.importorskip("xdist")
    files = {"pytest.ini": "[pytest]\nfilterwarnings =\n    error\n",
             "test_strict.py": "".join(f"def test_{n}(tmp_path):\n    (tmp_path / 'f').write_text('x')\n\n\n"
                                       for n in range(4))}
    run = run_child(tmp_path, files, *workers)
    assert run.returncode == 0, run.output
    assert {name: run.outcomes(name) for name in run.results} == {f"test_{n}": {"passed"} for n in range(4)}
    assert "Warning" not in run.output, run.output


def test_a_run_without_plugin_autoloading_names_the_installed_plugins_it_did_not_load(tmp_path):
    """An installed plugin a run with autoloading off does not name (``-p``) brings none of its tests: the header
    says which, for the lanes' verdicts to say too."""
    files = {"test_one.py": "def test_one():\n    pass\n",  # the dist-info: on sys.path (the working directory)
             "yamlcases-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: yamlcases\nVersion: 1.0\n",
             "yamlcases-1.0.dist-info/entry_points.txt": "[pytest11]\nyamlcases = yamlcases_plugin\n"}
    run = run_child(tmp_path, files, "-v")  # after run_child's -q: pytest's header is shown
    assert run.outcomes("test_one") == {"passed"}, run.output
    assert "pytest plugins installed but not loaded" in run.output and "yamlcases (-p yamlcases)" in run.output


FRESH = """
    import os
    from pathlib import Path
    seen = []
    def test_a_writes():
        seen.append((Path.home(), Path.cwd()))
        (Path.home() / ".canarchy").mkdir()
        Path("stray.json").write_text("{}")
    def test_b_is_clean():
        assert list(Path.home().iterdir()) == [] and list(Path.cwd().iterdir()) == []
        assert (Path.home(), Path.cwd()) != seen[0]
        seen.append((Path.home(), Path.cwd()))
        os.chmod(Path.home(), 0o755)
    def test_c_is_clean_and_private():
        assert list(Path.home().iterdir()) == []
        assert Path.home() != seen[1][0]
        assert os.stat(Path.home()).st_mode & 0o777 == 0o700
"""


def test_each_test_gets_an_empty_home_and_cwd_after_one_that_wrote(batch):
    for name in ("test_a_writes", "test_b_is_clean", "test_c_is_clean_and_private"):
        assert batch.outcomes(name) == {"passed"}, batch.output


# -- tests that kill the isolation mutants (fixtures/mutations/iso-*.toml) ----------

CAN_ENVIRONMENT = """
    import can
    import pytest
    def test_virtual_bus_keeps_its_defaults():
        with can.Bus(interface="virtual") as bus:
            assert (bus.channel_id, bus.receive_own_messages) == ("channel-0", False)
    def test_no_interface_is_inherited():
        with pytest.raises(can.CanInterfaceNotImplementedError):
            can.Bus(channel="canarchy-probe")
"""


def test_python_can_environment_does_not_reach_a_virtual_bus(batch):
    """REQ-TISO-12, behaviour and not only the variable listing: with the operator's CAN_CHANNEL,
    CAN_CONFIG and CAN_INTERFACE exported, an explicit virtual bus keeps python-can's defaults
    and a bus without an interface is not given the operator's."""
    for name in ("test_virtual_bus_keeps_its_defaults", "test_no_interface_is_inherited"):
        assert batch.outcomes(name) == {"passed"}, batch.output


CONSTANTS = """
    import importlib
    from pathlib import Path
    from canarchy.testing.isolation.sandbox import KNOWN_IMPORT_TIME_PATHS
    MODULES = {name: importlib.import_module(name) for name, _ in KNOWN_IMPORT_TIME_PATHS}
    def check():
        for name, attribute in KNOWN_IMPORT_TIME_PATHS:
            value = Path(getattr(MODULES[name], attribute))
            assert value.is_relative_to(Path.home()), f"{name}.{attribute} = {value}"
    def test_first():
        check()
    def test_second():
        (Path.home() / "used").write_text("")  # the next test gets a home of its own
        check()
    def test_third():
        check()
"""


def test_import_time_paths_bound_at_collection_follow_each_test(batch):
    """REQ-TISO-03: the import-time constants of modules imported at collection (in the session
    home) are re-pointed into each test's own home, whatever the import order."""
    for name in ("test_first", "test_second", "test_third"):
        assert batch.outcomes(name) == {"passed"}, batch.output


def test_each_test_has_a_home_of_its_own(canarchy_sandbox):
    """REQ-TISO-01: the per-test layer moves HOME into this test's own home, not the session's."""
    home = Path.home()
    assert home != canarchy_sandbox.session_home
    assert home.relative_to(canarchy_sandbox.root).parts[0] == "tests" and home.name == "home"
    assert Path(os.environ["XDG_CONFIG_HOME"]).is_relative_to(home)


def test_refusals_outside_tests_name_their_module_or_fixture(tmp_path):
    run = run_child(tmp_path, {"test_module_level.py": """
        import can
        try:
            can.Bus(channel="can0", interface="socketcan")
        except Exception:
            pass
        def test_never_runs():
            pass
    """, "test_fixture.py": """
        import can
        import pytest
        @pytest.fixture(scope="session")
        def session_bus():
            try:
                can.Bus(channel="can0", interface="socketcan")
            except Exception:
                pass
        def test_uses_it(session_bus):
            pass
    """}, "--continue-on-collection-errors")
    assert run.returncode != 0
    assert "ERROR collecting test_module_level.py" in run.output, run.output
    assert "<collection of test_module_level.py> tried to open a real CAN bus" in run.output
    assert ("session-scoped fixture 'session_bus', set up for test_fixture.py::test_uses_it "
            "tried to open a real CAN bus") in run.messages("test_uses_it"), run.output


RELAYS_THE_OPERATOR_S_VARIABLES = {
    "conftest.py": """
        import pytest
        pytest_plugins = ["canarchy.testing.isolation.plugin"]

        @pytest.hookimpl(trylast=True)
        def pytest_configure_node(node):  # after canarchy's: copy what it hands the worker where a test reads it
            handed = {key: value for key, value in node.workerinput.items() if key.startswith("canarchy_")}
            node.workerinput["relay"] = repr(handed)
            node.workerinput["relay_path"] = handed.get("canarchy_operator_env_file") or "/nonexistent"
            try:
                node.workerinput["relay"] += open(node.workerinput["relay_path"]).read()
            except BaseException as error:
                node.workerinput["relay"] += f" not read: {type(error).__name__}"
    """,
    "test_relay.py": """
        def test_finds_nothing_of_the_operator_in_what_its_worker_was_handed(request):
            relay = request.config.workerinput["relay"]
            assert "CANARCHY_TRANSPORT_BACKEND" not in relay and "CAN_" not in relay, relay
            assert "not read: OperatorStateRefused" in relay, relay

        def test_reads_the_file_itself(request):
            open(request.config.workerinput["relay_path"]).read()
    """,
}


def test_a_conftest_hook_finds_nothing_of_the_operator_in_what_a_worker_is_handed(tmp_path):
    """pytest-xdist hands a worker ``node.workerinput``, a dict every conftest's ``pytest_configure_node`` reads:
    the operator's environment sent there reached any test a hook copied it for. It goes by a file in a
    directory the guard refuses (a hook's read of it, in the controller: refused, named), which the worker
    removes as it reads it; a test that tries the path is refused too."""
    pytest.importorskip("xdist")
    run = run_child(tmp_path, RELAYS_THE_OPERATOR_S_VARIABLES, "-p", "xdist", "-n", "1")
    assert run.outcomes("test_finds_nothing_of_the_operator_in_what_its_worker_was_handed") == {"passed"}, run.output
    assert run.outcomes("test_reads_the_file_itself") & {"failed", "error"}, run.output
    assert "test_relay.py::test_reads_the_file_itself tried to open for reading" in run.messages(
        "test_reads_the_file_itself"), run.output
    assert "-handed" in run.output and run.returncode == 1, run.output  # the hook's attempt fails the run, named


def test_a_worker_s_conftest_that_reads_the_operator_s_state_is_named_as_the_worker_s(tmp_path):
    """A pytest-xdist worker imports the conftests again as it starts, under the guard it inherits, before any
    test: the refusal named "<unknown test (child process)>"; it names the worker and where it was."""
    pytest.importorskip("xdist")
    run = run_child(tmp_path, {"conftest.py": """
        import os
        pytest_plugins = ["canarchy.testing.isolation.plugin"]
        if os.environ.get("PYTEST_XDIST_WORKER"):
            try:
                open(os.path.join(os.environ["CHILD_OPERATOR_HOME"], ".canarchy", "config.toml")).read()
            except Exception:
                pass
    """, "test_a.py": "def test_a():\n    pass\n"}, "-p", "xdist", "-n", "1",
        env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    assert "<pytest-xdist worker gw0, outside any test (its conftests, as it starts)> tried to open for reading" in (
        run.output), run.output
    assert run.returncode == 1, run.output


def test_the_temporary_root_of_a_run_killed_before_its_cleanup_is_removed_by_the_next(tmp_path):
    """A run killed before its own cleanup (a lane's second Ctrl+C kills its pytest runs) left its temporary root,
    the operator's environment in it, for good. The next run removes each root whose maker is gone; one whose
    maker lives, or with no mark, stays."""
    from canarchy.testing.isolation import tempbase

    temp = tmp_path / "tmp"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = tempbase._process_identity(os.getpid()).split()
    roots = {"deadrun1": f"{dead.pid} 1 {here[2]}", "aliverun": " ".join(here), "othernsx": f"{dead.pid} 1 1",
             "unmarked": None}
    for name, mark in roots.items():  # as tempfile.mkdtemp names them: the prefix and eight characters
        (temp / f"canarchy-pytest-{name}" / "home").mkdir(parents=True)
        (temp / f"canarchy-pytest-{name}-handed").mkdir()  # the operator's environment for its workers
        if mark is not None:
            (temp / f"canarchy-pytest-{name}" / tempbase.RUN_MARK).write_text(mark)
    run = run_child(tmp_path, {"test_one.py": "def test_one():\n    pass\n"}, "-p", "xdist", "-n", "1",
                    env={"TMPDIR": str(temp)})
    assert run.returncode == 0, run.output
    left = sorted(p.name for p in temp.iterdir() if p.name.startswith("canarchy-pytest-"))
    assert left == [f"canarchy-pytest-{name}{end}" for name in ("aliverun", "othernsx", "unmarked")
                    for end in ("", "-handed")], left


def test_a_test_that_zeroes_pytest_s_count_of_failures_does_not_make_the_run_pass(tmp_path):
    """pytest's exit status counts ``session.testsfailed``: a test that set it back to 0 after an earlier test's
    refusal had the run exit 0 with "1 failed" printed. The plugin counts the failed reports itself."""
    run = run_child(tmp_path, {"test_count.py": """
        import os

        def test_1_refused():
            try:
                open(os.environ["CHILD_STATE"]).read()
            except OSError:
                pass

        def test_2_zeroes_the_count(request):
            request.session.testsfailed = 0
        """}, "-p", "no:randomly", env={"CHILD_STATE": str(tmp_path / "operator-home" / ".canarchy" / "config.toml")})
    assert run.outcomes("test_1_refused") & {"failed", "error"}, run.output
    assert run.returncode == 1 and "yet pytest counted no failure" in run.output, run.output


LEFT_HOOKS = """
import gc, os, sys, threading
STATE = os.environ["CHILD_STATE"]

def peek(*args):
    try:
        open(STATE).read()
    except OSError:
        pass
    return None

def test_a_leaves_a_collector_callback():
    gc.callbacks.append(lambda phase, info: peek())

def test_b_collects():
    gc.collect()

def innocent():
    return 1

def test_c_leaves_a_profile_function():
    sys.setprofile(lambda frame, event, arg: peek() if frame.f_code is innocent.__code__ else None)

def test_d_calls():
    innocent()

def test_e_switches_the_collector_off():
    gc.disable()

def test_f_finds_it_on():
    assert gc.isenabled()

def test_g_leaves_a_trace_function_for_new_threads():
    threading.settrace(lambda frame, event, arg: None)

def test_h_finds_none():
    assert threading.gettrace() is None
"""


def test_code_a_test_leaves_to_run_in_later_tests_fails_that_test_not_a_later_one(tmp_path):
    """A garbage-collector callback or a profile function a test leaves runs in every later test: its refused read
    was named after the test that happened to run (a test that only called gc.collect()), and the test that left
    it passed. The test that leaves such a hook fails, named; the hook is taken away, so later tests are clean."""
    run = run_child(tmp_path, {"test_hooks.py": LEFT_HOOKS}, "-p", "no:randomly",
                    env={"CHILD_STATE": str(tmp_path / "operator-home" / ".canarchy" / "config.toml")})
    for test, words in (("test_a_leaves_a_collector_callback", "garbage-collector callbacks changed"),
                        ("test_c_leaves_a_profile_function", "a profile function set (sys.setprofile)"),
                        ("test_e_switches_the_collector_off", "the garbage collector switched off"),
                        ("test_g_leaves_a_trace_function_for_new_threads", "threading.settrace")):
        assert run.outcomes(test) & {"failed", "error"} and words in run.messages(test), (test, run.output)
    for test in ("test_b_collects", "test_d_calls", "test_f_finds_it_on", "test_h_finds_none"):
        assert run.outcomes(test) == {"passed"}, (test, run.messages(test))
