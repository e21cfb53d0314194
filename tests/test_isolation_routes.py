"""Routes around the redirection, each refused or contained at the moment of access (REQ-TISO-21..27).

Each route is a test file of a child project run under the plugin as an operator
(a copy of a hostile operator home, ``CANARCHY_*``/``CAN_*`` exported); one child
pytest carries many routes, and each test here asserts on its own route's outcome
in that run's report. The operator home copy must stay byte-identical.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import contextlib
import ctypes
import ipaddress
import os
import shlex
import shutil
import signal
import socket
import stat
import sys
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from canarchy.testing.isolation import containment, protection
from canarchy.testing.isolation.loadable import PYTEST_CONFIGURATION, TOOL_START_UP
from canarchy.testing.isolation.refusal import OperatorStateRefused
from canarchy.testing.isolation.session import _RUN
from canarchy.testing.isolation.tree import content_differences
from tests.helpers import PYTEST, listeners_outside
from tests.isolation_child import REPO, make_operator_home, operator_environment, run_batch, run_child

EARLY = ("-p", "canarchy.testing.isolation.plugin")

HOME_ROUTES = """
import os, getpass, sqlite3, subprocess, sys
from pathlib import Path

def real_config(sandbox):
    return sandbox.real_home / ".canarchy" / "config.toml"

def test_deleted_home_falls_back_to_a_guarded_home():
    del os.environ["HOME"]
    open(Path.home() / ".canarchy" / "config.toml")  # the account database's home: refused

def test_deleted_home_cannot_write_there():
    del os.environ["HOME"]
    (Path.home() / ".canarchy" / "findings").mkdir()  # nested: nothing is made even where .canarchy is absent

def test_home_set_back_to_the_operator(canarchy_sandbox):
    os.environ["HOME"] = str(canarchy_sandbox.real_home)
    from canarchy import transport
    transport._load_user_config()

def test_an_empty_home_reaches_nothing_of_the_operator():
    os.environ["HOME"] = ""
    from canarchy import transport
    assert transport._load_user_config() == {}

def test_tilde_user(canarchy_sandbox):
    open(os.path.expanduser("~" + getpass.getuser() + "/.canarchy/config.toml"))

def test_a_symlink_out_of_the_test_home(canarchy_sandbox):
    (Path.home() / "out").symlink_to(canarchy_sandbox.real_home / ".canarchy")
    (Path.home() / "out" / "config.toml").read_text()

def test_a_dotdot_path(canarchy_sandbox):
    up = "/..".join("" for _ in Path.home().parts) + "/"  # from the test home up to /
    open(str(Path.home()) + up + str(real_config(canarchy_sandbox)).lstrip("/"))

def test_sqlite_in_the_operator_home(canarchy_sandbox):
    sqlite3.connect(canarchy_sandbox.real_home / ".canarchy" / "state.db")

def test_a_relative_path_from_a_removed_working_directory(canarchy_sandbox, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    os.chdir(gone)
    gone.rmdir()  # Linux still resolves .. from it, to its parent
    up = "../" * (len(gone.parts) - 1)
    open(up + str(real_config(canarchy_sandbox)).lstrip("/"))

def test_a_relative_path_from_a_removed_directory_descriptor(canarchy_sandbox, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    fd = os.open(gone, os.O_RDONLY | os.O_DIRECTORY)
    gone.rmdir()
    up = "../" * (len(gone.parts) - 1)
    os.open(up + str(real_config(canarchy_sandbox)).lstrip("/"), os.O_RDONLY, dir_fd=fd)

def test_a_caught_refusal(canarchy_sandbox):
    try:
        real_config(canarchy_sandbox).read_text()
    except Exception:
        pass

def test_a_chroot_into_the_operator_state(canarchy_sandbox):  # "/config.toml" is no path the guard refuses
    pid = os.fork()  # a forked child: the test's own process keeps its root whatever happens
    if pid == 0:
        try:
            os.chroot(canarchy_sandbox.real_home / ".canarchy")
            open("/config.toml").read()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

def test_a_child_python_reads_it(canarchy_sandbox):
    code = f"open({str(real_config(canarchy_sandbox))!r}).read()"
    subprocess.run([sys.executable, "-c", code], capture_output=True)

def test_a_child_python_given_a_pythonpath_of_its_own_reads_it(canarchy_sandbox, tmp_path):
    code = f"open({str(real_config(canarchy_sandbox))!r}).read()"  # os.environ with PYTHONPATH replaced:
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True)

def test_a_child_handed_a_guard_that_refuses_nothing(canarchy_sandbox):
    import json
    rules = json.loads(os.environ["PYTEST_CANARCHY_ACCESS"])
    rules.update(refused=[], read_only=[], watched=[])
    code = f"open({str(real_config(canarchy_sandbox))!r}).read()"
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTEST_CANARCHY_ACCESS=json.dumps(rules)))

def test_a_child_to_report_where_no_test_looks(tmp_path):
    os.environ["PYTEST_CANARCHY_GUARD_DIR"] = str(tmp_path)  # what every child started from now on inherits

def test_a_child_given_the_run_s_own_configuration_and_more(tmp_path):
    from unittest import mock
    with mock.patch.dict(os.environ, clear=True):  # every variable removed, then each put back as it was
        pass
    subprocess.run([sys.executable, "-c", "pass"], env=dict(os.environ, EXTRA="1"), check=True)
"""

PROCESS_ROUTES = """
import canarchy.testing.required  # a spawned worker imports it again with this module
import os, signal, subprocess, sys

def test_a_putenv():
    os.putenv("LEAK_C_LEVEL", "1")

def test_after_a_putenv_children_see_nothing():
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LEAK_C_LEVEL'))"],
                         capture_output=True, text=True).stdout
    assert out.strip() == "None"

def test_environ_replaced():
    os.environ = dict(os.environ)

def test_after_environ_replaced():
    assert type(os.environ).__name__ == "_Environ"

def test_python_can_config_files_extended(canarchy_sandbox):
    import can.util
    can.util.CONFIG_FILES.append(str(canarchy_sandbox.real_home / ".canrc"))

def test_after_the_config_files_were_extended(canarchy_sandbox):
    import can.util
    assert str(canarchy_sandbox.real_home / ".canrc") not in can.util.CONFIG_FILES

def test_a_signal_handler_left_installed():
    signal.signal(signal.SIGUSR1, lambda *args: None)

class _Equal:
    def __call__(self, *args):
        pass
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__

def test_a_handler_that_claims_equality_left_installed():
    signal.signal(signal.SIGUSR2, _Equal())

import operator
_REAL_IS = operator.is_
_HUP_AT_START = signal.getsignal(signal.SIGHUP)  # SIG_IGN under nohup

def test_a_handler_left_with_the_check_blinded():
    operator.is_ = lambda a, b: True  # what a check by `map(operator.is_, ...)` looks up at call time
    signal.signal(signal.SIGHUP, lambda *args: None)

def test_after_the_blinded_check():
    operator.is_ = _REAL_IS
    assert signal.getsignal(signal.SIGHUP) is _HUP_AT_START

def test_a_signal_mask_left_changed():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

def test_a_umask_left_changed():
    os.umask(0)

def test_a_chdir_is_put_back():
    os.chdir("/")

def test_after_a_chdir():
    from pathlib import Path
    assert Path.cwd() != Path("/") and list(Path.cwd().iterdir()) == []

def test_reads_the_environment_pytest_started_with():
    with open("/proc/self/environ", "rb") as handle:
        assert b"CANARCHY_" not in handle.read()

def test_reads_it_through_its_thread():
    with open("/proc/thread-self/environ", "rb") as handle:
        assert b"CANARCHY_" not in handle.read()

def test_reads_it_from_its_own_memory():
    fields = open("/proc/self/stat", "rb").read().rsplit(b")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5))
    with open("/proc/self/mem", "rb") as memory:
        memory.seek(start)
        assert b"CANARCHY_" not in memory.read(end - start)

def test_reads_the_environment_of_a_process_beside_pytest():
    open(f"/proc/{os.environ['CHILD_SIBLING_PID']}/environ", "rb").read()

def test_reads_the_environment_of_a_process_it_started():
    child = subprocess.Popen(["sleep", "30"])
    try:
        names = [entry.partition(b"=")[0] for entry in open(f"/proc/{child.pid}/environ", "rb").read().split(b"\\0")]
        assert not [name for name in names if name.startswith((b"CANARCHY_", b"CAN_"))]
    finally:
        child.kill()
        child.wait()

def test_a_child_python_reads_the_environment_its_parent_started_with():
    code = f"import sys; sys.exit(b'CANARCHY_' in open('/proc/{os.getpid()}/environ', 'rb').read())"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

def test_signals_a_process_beside_pytest():
    os.kill(int(os.environ["CHILD_SIBLING_PID"]), signal.SIGCONT)  # harmless, had it been sent

def test_takes_a_descriptor_to_signal_a_process_beside_pytest():
    signal.pidfd_send_signal(os.pidfd_open(int(os.environ["CHILD_SIBLING_PID"])), signal.SIGCONT)

def test_a_child_python_signals_a_process_beside_pytest():
    code = f"import os, signal; os.kill({os.environ['CHILD_SIBLING_PID']}, signal.SIGCONT)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

def test_renices_a_process_beside_pytest():
    sibling = int(os.environ["CHILD_SIBLING_PID"])
    os.setpriority(os.PRIO_PROCESS, sibling, os.getpriority(os.PRIO_PROCESS, sibling))  # its own level: harmless

def test_renices_every_process_of_the_user():
    os.setpriority(os.PRIO_USER, 0, os.getpriority(os.PRIO_USER, 0))

def test_sets_a_resource_limit_of_a_process_beside_pytest():
    import resource
    sibling = int(os.environ["CHILD_SIBLING_PID"])  # RLIMIT_CPU under the time it used would end it (SIGXCPU)
    resource.prlimit(sibling, resource.RLIMIT_CORE, resource.prlimit(sibling, resource.RLIMIT_CORE))

def test_moves_a_process_beside_pytest_to_other_cpus():
    sibling = int(os.environ["CHILD_SIBLING_PID"])
    os.sched_setaffinity(sibling, os.sched_getaffinity(sibling))

def test_a_child_python_renices_a_process_beside_pytest():
    sibling = os.environ["CHILD_SIBLING_PID"]
    code = f"import os; os.setpriority(os.PRIO_PROCESS, {sibling}, os.getpriority(os.PRIO_PROCESS, {sibling}))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

def _asynchronous_pipe(owner):
    import fcntl
    read, write = os.pipe()
    owner(read)
    fcntl.fcntl(read, fcntl.F_SETSIG if hasattr(fcntl, "F_SETSIG") else 10, signal.SIGCONT)  # harmless, if sent
    fcntl.fcntl(read, fcntl.F_SETFL, fcntl.fcntl(read, fcntl.F_GETFL) | os.O_ASYNC)
    os.write(write, b"x")  # ready: the kernel signals the owner
    os.close(read)
    os.close(write)

def test_makes_a_process_beside_pytest_the_owner_of_a_descriptor():
    import fcntl
    _asynchronous_pipe(lambda fd: fcntl.fcntl(fd, fcntl.F_SETOWN, int(os.environ["CHILD_SIBLING_PID"])))

def test_makes_a_process_beside_pytest_the_owner_of_a_socket():
    import fcntl, socket, struct
    mine, other = socket.socketpair()
    fcntl.ioctl(mine.fileno(), 0x8902, struct.pack("i", int(os.environ["CHILD_SIBLING_PID"])))  # SIOCSPGRP

def test_makes_pytest_s_process_group_the_owner_of_a_descriptor():
    import fcntl, struct
    _asynchronous_pipe(lambda fd: fcntl.fcntl(fd, 15, struct.pack("ii", 2, os.getpgrp())))  # F_SETOWN_EX, PGRP

def test_gives_a_descriptor_an_owner_the_guard_cannot_read():
    import fcntl
    fcntl.fcntl(os.pipe()[0], fcntl.F_SETOWN, type("Pid", (int,), {})(os.getpid()))

def test_changes_itself_and_its_children():
    import resource
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.setpriority(os.PRIO_PROCESS, child.pid, min(19, os.getpriority(os.PRIO_PROCESS, child.pid) + 1))
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0))
        resource.prlimit(child.pid, resource.RLIMIT_CORE, (0, 0))
        resource.prlimit(int(os.environ["CHILD_SIBLING_PID"]), resource.RLIMIT_CORE)  # asking changes nothing
        os.sched_setaffinity(child.pid, os.sched_getaffinity(0))
        os.sched_setaffinity(0, os.sched_getaffinity(0))
        os.sched_setparam(0, os.sched_getparam(0))
        import fcntl, struct, threading
        _asynchronous_pipe(lambda fd: fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid()))
        _asynchronous_pipe(lambda fd: fcntl.fcntl(fd, fcntl.F_SETOWN, child.pid))
        _asynchronous_pipe(lambda fd: fcntl.fcntl(fd, 15, struct.pack("ii", 0, threading.get_native_id())))
    finally:
        child.kill()
        child.wait()

def test_signals_itself_its_children_and_from_a_child_the_test_s_process():
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    os.killpg(child.pid, signal.SIGTERM)
    child.wait()
    os.kill(int(os.environ["CHILD_SIBLING_PID"]), 0)  # signal 0 sends nothing: it asks whether the pid exists
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        code = "import os, signal; os.kill(os.getppid(), signal.SIGUSR1)"  # the child's parent is in the run
        assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    finally:
        signal.signal(signal.SIGUSR1, previous)

def test_reads_the_command_line_of_the_process_that_started_pytest():
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:  # `env CAN_CHANNEL=can0 pytest` names it there
        assert b"CAN_" not in handle.read()

def _square(x):
    return x * x

def test_a_spawned_worker_imports_this_module():
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # the worker imports this module for _square
        assert pool.apply_async(_square, (3,)).get(timeout=30) == 9

def test_a_shell_reads_the_environment_pytest_started_with():
    import threading
    done = threading.Event()
    later = threading.Thread(target=done.wait)  # a thread started after the session began
    later.start()
    try:
        shown = subprocess.run(["sh", "-c", f"cat /proc/{os.getpid()}/environ "
                                f"/proc/{os.getpid()}/task/{later.native_id}/environ"], capture_output=True).stdout
    finally:
        done.set()
        later.join()
    # root reads the files (erased: zeros); another user is refused them, pytest being no longer dumpable
    assert (shown or os.geteuid() != 0) and b"CANARCHY_" not in shown

def _interpreters():
    import importlib
    for name in ("_interpreters", "_xxsubinterpreters"):  # 3.13 on; 3.11 and 3.12
        try:
            return importlib.import_module(name)
        except ImportError:
            pass

def _reads_the_operator_state(sandbox):
    return f"open({str(sandbox.real_home / '.canarchy' / 'config.toml')!r}).read()"

def test_starts_a_sub_interpreter(canarchy_sandbox):
    interpreters = _interpreters()
    interpreters.run_string(interpreters.create(), _reads_the_operator_state(canarchy_sandbox))

def test_starts_one_through_the_c_api_s_test_module(canarchy_sandbox):
    import _testcapi
    _testcapi.run_in_subinterp(_reads_the_operator_state(canarchy_sandbox))

def test_starts_one_with_the_function_a_wrapper_holds(canarchy_sandbox):
    create = _interpreters().create
    for cell in create.__closure__ or ():  # what the README calls digging into the plugin's own objects
        if callable(cell.cell_contents):
            create = cell.cell_contents
    create()

def test_renames_the_host():
    import socket
    socket.sethostname(socket.gethostname())

def test_makes_a_second_name_of_a_device(tmp_path):
    import stat
    os.mknod(tmp_path / "adapter", stat.S_IFCHR | 0o600, os.stat("/dev/null").st_rdev)  # a serial adapter's, say

def test_sets_the_clock():
    import time
    try:
        time.clock_settime(time.CLOCK_MONOTONIC, 0.0)  # a clock nobody can set (EINVAL): nothing to undo
    except OSError:
        pass
"""

TAMPER_ROUTES = """
import os
import can  # python-can imported (and its hooks installed) before any test
import can.interfaces.virtual
import pytest
from pathlib import Path
from canarchy.testing.isolation import access, audithook, pertest

def read_real_config(sandbox):
    (sandbox.real_home / ".canarchy" / "config.toml").read_text()

def test_switches_the_access_guard_off():
    access.GUARD.enabled = False

def test_after_the_switch(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_empties_the_judged_events():
    audithook._EVENTS.clear()

def test_after_the_events(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_marks_its_thread_exempt():
    access.GUARD._local.busy = True

def test_reads_inside_an_exemption_of_its_own(canarchy_sandbox):
    with access.GUARD.exempt():  # the harness's own way: it covers the harness's code only
        open(canarchy_sandbox.real_home / ".canarchy" / "config.toml").read()  # raised in this very frame

def test_after_the_exemption(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_configures_an_empty_protection():
    access.GUARD.configure(access.Protection())

def test_after_the_protection(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_replaces_a_method():
    access.AccessGuard._judge = lambda self, *args: None

def test_after_the_method(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

import operator
_REAL_IS = operator.is_

def test_blinds_the_seal_then_replaces_a_method():
    operator.is_ = lambda a, b: True  # what a check by `map(operator.is_, ...)` looks up at call time
    access.AccessGuard._judge = lambda self, *args: None

def test_after_the_blinding(canarchy_sandbox):
    operator.is_ = _REAL_IS
    read_real_config(canarchy_sandbox)

def test_hides_a_method():
    access.GUARD._audit = lambda *args: None

def test_makes_every_bus_virtual():
    can.interfaces.virtual.VirtualBus = can.BusABC  # what the bus guard compares a class with

def test_after_every_bus_became_virtual():
    class Loopback(can.BusABC):  # opens nothing: a stand-in for a real interface's class
        def __init__(self, channel=None, **kwargs):
            self.channel_info = str(channel)
        def send(self, msg, timeout=None):
            pass
        def _recv_internal(self, timeout):
            return None, False
    Loopback(channel="x").shutdown()

def test_unwraps_a_driver_s_init():
    from can.interfaces.socketcand import SocketCanDaemonBus  # its __init__ is wrapped as it is defined
    SocketCanDaemonBus.__init__ = SocketCanDaemonBus.__init__.__wrapped__  # before the seal ever saw it

def test_after_the_unwrapping():
    from can.interfaces.socketcand import SocketCanDaemonBus
    SocketCanDaemonBus.__init__(object.__new__(SocketCanDaemonBus), channel="can0", host="127.0.0.1", port=9)

def test_gives_the_guard_a_quiet_class():
    access.GUARD.__class__ = type("Quiet", (access.AccessGuard,), {"_judge": lambda self, *args: None})

def test_after_the_class(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_replaces_the_guard_s_thread_state():
    access.GUARD._local.busy = True
    access.GUARD._local = __import__("threading").local()

def test_after_the_thread_state(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_blinds_the_path_resolution():
    class Blind(type(access.GUARD.paths)):
        def resolve(self, text, follow):
            return "/nonexistent"  # every file judged as if it were there
    access.GUARD.paths = Blind()

def test_after_the_blind_resolution(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_empties_the_zones():
    access.GUARD._zones.refused = frozenset()
    access.GUARD._zones.refused_prefixes = ()

def test_after_the_zones(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_after_the_hiding(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_plants_code_in_what_the_plugin_calls_at_teardown(request):
    from canarchy.testing.isolation.session import _RUN
    sandbox = request.config.stash[_RUN].sandbox  # dug out: the fixtures hand a test a read-only view
    def release(home, cwd):
        del sandbox.release_test_dirs  # once
        read_real_config(sandbox)
    sandbox.release_test_dirs = release

def test_replaces_the_environment_of_the_plugin_s_programs(request):
    from canarchy.testing.isolation.session import _RUN
    sandbox = request.config.stash[_RUN].sandbox
    sandbox.tool_env = {**sandbox.tool_env, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.excludesFile",
                        "GIT_CONFIG_VALUE_0": "/dev/null"}

def test_after_the_environment_of_the_programs(canarchy_sandbox):
    read_real_config(canarchy_sandbox)

def test_what_the_fixtures_hand_a_test(canarchy_sandbox, access_guard, bus_guard):
    from canarchy.testing.isolation.plugin import active_sandbox
    given = [getattr(o, n, None) for o in (canarchy_sandbox, active_sandbox()) for n in dir(o) if not n.startswith("_")]
    assert "CANARCHY_" not in repr(given) and "CAN_" not in repr(given)  # the operator's variables
    assert [n for n in (*dir(access_guard), *dir(bus_guard)) if not n.startswith("_")] == ["take_refusals"] * 2
    with pytest.raises(AttributeError):
        canarchy_sandbox.real_home = canarchy_sandbox.session_home

def test_opts_every_later_test_out():
    pertest._opts_out = lambda request, *markers: True

def test_after_the_opt_out(canarchy_sandbox):
    assert Path.home() != canarchy_sandbox.real_home
    assert not [k for k in os.environ if k.startswith(("CANARCHY_", "CAN_"))]

def test_marks_the_next_test_integration(request):
    items = request.session.items
    items[items.index(request.node) + 1].add_marker(pytest.mark.integration)

def test_marked_after_collection(canarchy_sandbox):
    assert Path.home() != canarchy_sandbox.real_home

def test_opens_a_descriptor_of_the_home(canarchy_sandbox):
    home = os.open(canarchy_sandbox.real_home, os.O_RDONLY)
    os.read(os.open(".canarchy/config.toml", os.O_RDONLY, dir_fd=home), 10)
"""

STALE_BUS = """
import can

BUS = can.Bus(interface="virtual", channel="stale-channel", ignore_config=True)
TASK = BUS.send_periodic(can.Message(arbitration_id=0x123, data=b"\\x01"), 0.01)

def test_a_first():
    pass

def test_b_later_on_the_same_channel():
    with can.Bus(interface="virtual", channel="stale-channel", ignore_config=True) as bus:
        assert bus.recv(0.3) is None
"""

IMPORT_TIME = {
    "leakpkg/__init__.py": "",
    "leakpkg/paths.py": """
        import functools
        from dataclasses import dataclass
        from pathlib import Path
        from typing import NamedTuple

        HOME = Path.home()
        CONFIG = {"cache": HOME / ".canarchy" / "cache", "nested": [("x", str(HOME / ".canarchy" / "n"))]}
        PAIR = (1, HOME / ".canarchy" / "pair")
        ROOTS = frozenset({HOME / ".canarchy" / "a"})

        class Settings:
            path = HOME / ".canarchy" / "class"

        @dataclass
        class Options:
            path: Path = HOME / ".canarchy" / "dataclass"

        class Where(NamedTuple):
            path: Path = HOME / ".canarchy" / "namedtuple"

        def where(path=HOME / ".canarchy" / "default"):
            return path

        OPEN = functools.partial(where, HOME / ".canarchy" / "partial")
    """,
    "test_import_time.py": """
        from pathlib import Path
        import leakpkg.paths as p

        def under(path):
            return Path(path).is_relative_to(Path.home())

        def test_every_kind_of_holder_follows_the_test_home():
            assert under(p.CONFIG["cache"]) and under(p.CONFIG["nested"][0][1])
            assert under(p.PAIR[1]) and all(under(r) for r in p.ROOTS)
            assert under(p.Settings.path) and under(p.Options().path) and under(p.Where().path)
            assert under(p.where()) and under(p.OPEN())
    """,
}

STUCK = {
    "stuckpkg/__init__.py": "",
    "stuckpkg/flags.py": """
        import os, pwd
        REAL = pwd.getpwuid(os.getuid()).pw_dir
        ARGS = "--config=" + REAL + "/.canarchy/config.toml"
    """,
    "test_stuck.py": """
        import stuckpkg.flags

        def test_one():
            pass
    """,
}

CONFTEST_TOP = {
    "conftest.py": """
        import os
        from pathlib import Path
        pytest_plugins = ["canarchy.testing.isolation.plugin"]
        (Path(os.environ["CHILD_OPERATOR_HOME"]) / ".canarchy" / "from-conftest").mkdir()
    """,
    "test_anything.py": "def test_anything():\n    pass\n",
}

CONTAINED = """
import ctypes, os, socket, stat, subprocess, sys

REAL = os.environ["CHILD_REAL_CONFIG"]

def test_the_kernel_s_settings_are_read_only_but_the_run_s_own_namespaces_are_not():
    # kernel.core_pattern names a program the kernel runs as root outside every namespace at the next crash;
    # `test -w` asks access(2), so nothing is written either way
    kernel = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger", "/sys/kernel",
              "/proc/irq/default_smp_affinity", "/proc/mtrr", "/dev/kmsg"]
    writable = [p for p in kernel if os.path.exists(p)
                and subprocess.run(["sh", "-c", f"test -w {p}"]).returncode == 0]
    assert writable == [], writable
    if os.geteuid() == 0:  # the run's network namespace's settings stay its own to change
        assert subprocess.run(["sh", "-c", "test -w /proc/sys/net/ipv4/ip_forward"]).returncode == 0

READ_MEMORY = '''
import ctypes, sys
class Span(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
libc.process_vm_readv.restype = ctypes.c_ssize_t
buffer = ctypes.create_string_buffer(64)
done = libc.process_vm_readv(int(sys.argv[1]), ctypes.byref(Span(ctypes.cast(buffer, ctypes.c_void_p), 64)), 1,
                             ctypes.byref(Span(int(sys.argv[2]), 64)), 1, 0)
sys.stdout.buffer.write(buffer.raw[:max(done, 0)])
'''

def test_pytest_s_memory_is_out_of_reach_of_what_a_test_starts():
    # pytest keeps the operator's environment in its memory, to give it back to the tests that opt out
    import threading
    held = ctypes.create_string_buffer(b"CANARCHY_HELD_IN_MEMORY=1")
    stop = threading.Event()
    later = threading.Thread(target=stop.wait)  # a thread started after the mount view: no cover of its own
    later.start()
    try:
        read = subprocess.run([sys.executable, "-I", "-c", READ_MEMORY, str(os.getpid()), str(ctypes.addressof(held))],
                              capture_output=True)
        assert b"CANARCHY_HELD" not in read.stdout, read
        through = subprocess.run(["sh", "-c", f"dd if=/proc/{os.getpid()}/task/{later.native_id}/mem bs=64 count=1 "
                                              f"iflag=skip_bytes skip={ctypes.addressof(held)}"], capture_output=True)
        assert b"CANARCHY_HELD" not in through.stdout, through.stderr
    finally:
        stop.set()
        later.join()

def test_the_operator_s_session_keyring_is_not_the_run_s():
    # a key in the session keyring of the process that started pytest (a login session's tickets, tokens)
    description, keyctl = os.environ["CHILD_KEY"], int(os.environ["CHILD_KEYCTL"] or 0)
    if keyctl:
        libc = ctypes.CDLL(None, use_errno=True)
        found = libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(10), ctypes.c_long(-3), b"user",  # KEYCTL_SEARCH @s
                             description.encode(), ctypes.c_long(0))
        assert found == -1, f"the key {description} was found in the run's session keyring"

def test_system_v_ipc_outside_is_out_of_reach():
    # a shared memory segment an operator's process made before pytest started, by its key
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.shmget(int(os.environ["CHILD_SHM_KEY"]), 0, 0) == -1 and ctypes.get_errno() == 2  # ENOENT

def test_a_daemon_outside_is_out_of_reach_through_its_socket():
    # a daemon started before pytest (an operator's tmux server, D-Bus, a container engine) listens on a
    # socket in the file system: its name is an empty file now, for this process and for a child it starts
    # (a Python connect to it is the guard's to refuse first: what the containment covers is seen by stat)
    path = os.environ["CHILD_HOST_SOCKET"]
    seen = os.stat(path)
    reached = "" if stat.S_ISREG(seen.st_mode) and seen.st_size == 0 else f"a socket here (mode {seen.st_mode:o})"
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})"
    if subprocess.run([sys.executable, "-I", "-c", connect], capture_output=True).returncode == 0:
        reached += " from an unguarded child"
    assert not reached, reached
    import shutil, tempfile
    where = tempfile.mkdtemp(dir="/tmp")  # the run's own sockets work (a short path: at most 107 bytes)
    try:
        own = os.path.join(where, "own.sock")
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind(own)
            server.listen()
            client.connect(own)
    finally:
        shutil.rmtree(where)

def test_the_checkout_s_git_directory_and_the_interpreter_cannot_be_planted_in(request):
    # A C-level open: the audit hook does not see it (and refuses a Python open under a home first).
    import errno, site
    libc = ctypes.CDLL(None, use_errno=True)
    targets = [request.config.rootpath / ".git" / "hooks" / "post-checkout",
               os.path.join(site.getsitepackages()[0], "zz_canarchy_probe.pth"),
               request.config.rootpath / ".venv" / "lib" / "python3.11" / "site-packages" / "zz_probe.pth"]
    for target in targets:
        fd = libc.open(os.fsencode(target), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        if fd >= 0:
            os.close(fd)
            os.unlink(target)
            raise AssertionError(f"{target} could be written")
        assert ctypes.get_errno() == errno.EROFS, (target, os.strerror(ctypes.get_errno()))

def test_a_shell_child_reads_nothing_and_cannot_write():
    read = subprocess.run(["sh", "-c", f"cat '{REAL}'"], capture_output=True, text=True)
    write = subprocess.run(["sh", "-c", f"echo x > '{REAL}.new'"], capture_output=True, text=True)
    assert read.stdout == "" and write.returncode != 0, (read, write)

def test_an_env_i_child_reads_nothing():
    read = subprocess.run(["env", "-i", "/bin/cat", REAL], capture_output=True, text=True)
    assert read.stdout == ""

def test_a_shell_finds_the_working_directory_s_python_can_ini_and_canarchy_sessions_empty(request):
    # in the working directory pytest was started in: python-can's can.ini (Windows), canarchy's sessions
    where = request.config.invocation_params.dir
    read = subprocess.run(["sh", "-c", f"cat can.ini .canarchy/sessions/lab.json; ls -A .canarchy"], cwd=where,
                          capture_output=True, text=True)
    assert "SECRET" not in read.stdout and "sessions" not in read.stdout, read

def test_a_c_level_open_reads_nothing():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(REAL.encode(), os.O_RDONLY)
    data = os.read(fd, 100) if fd >= 0 else b""
    assert data == b""

def test_a_shell_finds_pytest_s_memory_and_the_environment_above_it_empty():
    # pytest's memory holds the operator's environment (kept to be put back); so does each process above it
    from canarchy.testing.isolation.protection import this_and_above
    held = ctypes.create_string_buffer(b"CANARCHY_HELD_IN_MEMORY=1")
    memory = subprocess.run(["sh", "-c", f"dd if=/proc/{os.getpid()}/mem bs=64 count=1 iflag=skip_bytes "
                                         f"skip={ctypes.addressof(held)}"], capture_output=True)
    assert b"CANARCHY_HELD" not in memory.stdout, memory.stderr
    above = this_and_above()[1:]
    shown = {pid: subprocess.run(["sh", "-c", f"cat /proc/{pid}/environ /proc/{pid}/task/*/environ /proc/{pid}/mem "
                                              f"/proc/{pid}/cmdline /proc/{pid}/task/*/cmdline"],
                                 capture_output=True).stdout for pid in above}
    assert above and all(out == b"" for out in shown.values()), {pid: len(out) for pid, out in shown.items()}
    # nor a thread of one of them by its own /proc/TID, which /proc does not list
    thread = os.environ["CHILD_ANCESTOR_THREAD"]
    by_thread = subprocess.run(["sh", "-c", f"cat /proc/{thread}/cmdline /proc/{thread}/environ"],
                               capture_output=True)
    assert by_thread.stdout == b"" and os.path.exists(f"/proc/{thread}"), by_thread
    # and no thread one of them starts later shows its own: each one's task directory is empty
    threads = {pid: subprocess.run(["ls", f"/proc/{pid}/task"], capture_output=True).stdout for pid in above}
    assert all(out == b"" for out in threads.values()), threads
    # its own command line stays (what the operator typed for pytest, in sys.argv anyway)
    assert b"pytest" in open(f"/proc/{os.getpid()}/cmdline", "rb").read()
"""


BYTECODE = {
    "bcpkg/__init__.py": "",
    "bcpkg/planted.py": "X = 'source'\n",
    "bcpkg/compiled.py": "X = 'source'\n",
    "bcpkg/imported.py": "X = 'source'\n",
    "bcpkg/tampered.py": "X = 'source'\n",
    "bcpkg/childmod.py": "X = 'source'\n",
    "bcpkg/shellmod.py": "X = 'source'\n",
    "bcpkg/rewritten.py": "X = 'source'\n",
    "nsdir/nsmod.py": "X = 'source'\n",  # no __init__.py: a namespace package's module, or a PYTHONPATH entry's
    "test_bytecode.py": """
        import builtins, importlib.util, marshal, py_compile
        from canarchy.testing.isolation.loadable import PYTEST_CONFIGURATION, TOOL_START_UP
        from pathlib import Path

        def pyc(request, module):
            source = Path(request.config.rootpath) / "bcpkg" / f"{module}.py"
            return source, Path(importlib.util.cache_from_source(str(source)))

        def test_writes_byte_code_into_the_checkout(request):
            source, target = pyc(request, "planted")
            code = marshal.dumps(compile("X = 'planted'", str(source), "exec"))
            target.parent.mkdir(exist_ok=True)
            target.write_bytes(importlib.util.MAGIC_NUMBER + bytes(12) + code)

        def test_writes_a_sourceless_module_at_the_top(request):
            code = marshal.dumps(compile("X = 'planted'", "pprint.py", "exec"))
            (Path(request.config.rootpath) / "pprint.pyc").write_bytes(importlib.util.MAGIC_NUMBER + bytes(12) + code)

        def test_compiles_into_the_checkout(request):
            source, target = pyc(request, "compiled")
            py_compile.compile(str(source), cfile=str(target), doraise=True)

        def test_an_import_caches_its_byte_code(request):
            import bcpkg.imported
            assert bcpkg.imported.X == "source" and pyc(request, "imported")[1].is_file()

        def test_a_child_python_caches_what_a_replaced_loader_compiled(request):
            import subprocess, sys
            code = ("import importlib.machinery as m, sys\\n"
                    "sys.dont_write_bytecode = False\\n"
                    "real = m.SourceFileLoader.source_to_code\\n"
                    "m.SourceFileLoader.source_to_code = lambda self, data, path, **kw: real(\\n"
                    "    self, data + b'X = 1', path, **kw)\\n"
                    "sys.path.insert(0, sys.argv[1])\\n"
                    "import bcpkg.childmod\\n")
            subprocess.run([sys.executable, "-c", code, str(request.config.rootpath)], check=True)
            assert pyc(request, "childmod")[1].is_file()

        import pytest

        @pytest.mark.parametrize("name", PYTEST_CONFIGURATION)
        def test_writes_pytest_s_configuration(request, name):
            (Path(request.config.rootpath) / "nsdir" / name).write_text("[pytest]\\naddopts = -p bcpkg.planted\\n")

        @pytest.mark.parametrize("name", TOOL_START_UP)
        def test_writes_a_tool_s_start_up_file(request, name):
            target = Path(request.config.rootpath) / "nsdir" / name
            if name == ".vscode":
                target = target / "tasks.json"  # a task that runs when the folder is opened
            target.parent.mkdir(exist_ok=True)
            target.write_text("# planted\\n")

        def test_plants_a_pytest_plugin_for_the_next_run(request):
            metadata = Path(request.config.rootpath) / "planted.egg-info"  # git ignores *.egg-info/
            metadata.mkdir()
            (metadata / "entry_points.txt").write_text("[pytest11]\\nplanted = bcpkg.planted\\n")

        def test_a_shell_plants_a_pytest_plugin_for_the_next_run(request):
            import subprocess
            metadata = Path(request.config.rootpath) / "shell.egg-info"
            subprocess.run(["sh", "-c", f"mkdir {metadata} && echo '[pytest11]' > {metadata}/entry_points.txt "
                                        f"&& echo x > {metadata.parent}/pprint.pyc"], check=True)

        def test_an_import_caches_byte_code_the_next_test_rewrites(request):
            import bcpkg.rewritten
            assert pyc(request, "rewritten")[1].is_file()

        def test_a_shell_rewrites_cached_byte_code_in_place(request, tmp_path):
            import subprocess
            source, target = pyc(request, "rewritten")
            valid = target.read_bytes()
            forged = valid[:16] + marshal.dumps(compile("X = 'forged'", str(source), "exec"))
            assert len(forged) == len(valid)  # the same size, and below the same mtime: only the ctime moves
            (tmp_path / "forged.pyc").write_bytes(forged)
            subprocess.run(["sh", "-c", f"touch -r {target} {tmp_path}/when && cat {tmp_path}/forged.pyc > {target} "
                                        f"&& touch -r {tmp_path}/when {target}"], check=True)

        def test_a_shell_plants_code_the_next_import_of_a_package_runs(request, tmp_path):
            import importlib.machinery, subprocess
            source, target = pyc(request, "shellmod")
            seen = source.stat()  # the header of a valid cache: the next import loads it instead of compiling
            header = importlib.util.MAGIC_NUMBER + bytes(4) + (seen.st_mtime_ns // 10**9).to_bytes(4, "little") + \
                seen.st_size.to_bytes(4, "little")
            (tmp_path / "forged.pyc").write_bytes(header + marshal.dumps(compile("X = 'forged'", str(source), "exec")))
            extension = source.parent / ("shell_ext" + importlib.machinery.EXTENSION_SUFFIXES[0])
            subprocess.run(["sh", "-c", f"mkdir -p {target.parent} && cp {tmp_path}/forged.pyc {target} "
                                        f"&& echo x > {extension}"], check=True)

        def test_a_shell_plants_code_beside_a_module_outside_any_package(request, tmp_path):
            import subprocess
            source = Path(request.config.rootpath) / "nsdir" / "nsmod.py"
            target = Path(importlib.util.cache_from_source(str(source)))
            seen = source.stat()
            header = importlib.util.MAGIC_NUMBER + bytes(4) + (seen.st_mtime_ns // 10**9).to_bytes(4, "little") + \
                seen.st_size.to_bytes(4, "little")
            (tmp_path / "forged.pyc").write_bytes(header + marshal.dumps(compile("X = 'forged'", str(source), "exec")))
            subprocess.run(["sh", "-c", f"mkdir -p {target.parent} && cp {tmp_path}/forged.pyc {target}"], check=True)

        def test_plants_a_module_in_a_virtual_environment_of_the_checkout(request):
            site = Path(request.config.rootpath) / "tools-venv" / "lib" / "python3.11" / "site-packages"
            (site / "planted_module.py").write_text("X = 'planted'")  # the next `nox -R` imports it

        def test_a_shell_plants_a_path_file_in_a_virtual_environment_of_the_checkout(request):
            import subprocess
            for venv in ("tools-venv", ".hatch/dev"):  # at the top, and one level below a dot-directory
                site = Path(request.config.rootpath) / venv / "lib" / "python3.11" / "site-packages"
                subprocess.run(["sh", "-c", f"echo 'import os' > {site}/shell.pth"], check=True)

        def test_plants_a_script_in_a_nested_virtual_environment_of_the_checkout(request):
            (Path(request.config.rootpath) / ".hatch" / "dev" / "bin" / "activate").write_text("echo planted")

        def test_a_compile_replaced_and_put_back(request):
            real = builtins.compile
            builtins.compile = lambda source, filename, *args, **kwargs: real("X = 'planted'", filename, *args,
                                                                             **kwargs)
            try:
                import bcpkg.tampered
            finally:
                builtins.compile = real
            assert bcpkg.tampered.X == "planted" and pyc(request, "tampered")[1].is_file()
    """,
    "tests/conftest.py": "",  # an initial conftest: tests/, no package, is on sys.path from the session's start
    "tests/test_shell_hiding.py": """
        import subprocess
        from pathlib import Path

        def test_a_shell_hides_code_from_git_where_an_import_finds_it(request):
            root = Path(request.config.rootpath)  # each .gitignore hides itself too, and nothing git showed
            subprocess.run(["sh", "-c", "cd tests "
                                        "&& printf '.gitignore\\\\nmsgpack.py\\\\nns/\\\\nplanted/\\\\n' > .gitignore "
                                        "&& printf 'import os\\\\n' > msgpack.py && mkdir ns planted "
                                        "&& echo x > ns/m.py && touch planted/__init__.py "
                                        "&& cd ../nsdir && printf '.git*\\\\n' > .gitignore "
                                        "&& echo '* -diff' > .gitattributes"], cwd=root, check=True)
            hidden = ["tests/.gitignore", "tests/msgpack.py", "tests/ns", "tests/planted", "nsdir/.gitignore",
                      "nsdir/.gitattributes"]
            assert subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", *hidden], cwd=root,
                                  capture_output=True, text=True, check=True).stdout == ""
    """,
    "tools-venv/pyvenv.cfg": "home = /usr/bin\n",
    "tools-venv/lib/python3.11/site-packages/installed.py": "X = 'installed'\n",
    ".hatch/dev/pyvenv.cfg": "home = /usr/bin\n",
    ".hatch/dev/lib/python3.11/site-packages/installed.py": "X = 'installed'\n",
    "test_hiding.py": """
        import os, shutil
        from pathlib import Path

        def package(request):
            return Path(request.config.rootpath) / "bcpkg"

        def test_hides_a_package_behind_its_own_gitignore(request):
            shadow = package(request) / "shadow"
            shadow.mkdir()
            (shadow / ".gitignore").write_text("*\\n")

        def test_makes_a_repository_of_its_own_in_the_checkout(request):
            (package(request) / ".git").mkdir()

        def test_takes_a_descriptor_of_a_checkout_directory(request):
            fd = os.open(package(request), os.O_RDONLY)
            os.close(os.open("opened.py", os.O_WRONLY | os.O_CREAT, dir_fd=fd))

        def test_climbs_out_of_its_own_directory_by_descriptor(request, tmp_path):
            fd = os.open(tmp_path, os.O_RDONLY)  # its own: allowed; '..' under it reaches the checkout
            os.close(os.open(os.path.relpath(package(request) / ".gitignore", tmp_path), os.O_WRONLY | os.O_CREAT,
                             dir_fd=fd))

        def prepared(tmp_path, name, content):
            (tmp_path / "prepared" / "inner").mkdir(parents=True)
            (tmp_path / "prepared" / "decoy.txt").write_text("git shows this one")
            (tmp_path / "prepared" / "inner" / name).write_bytes(content)
            return tmp_path / "prepared"

        def test_moves_in_a_directory_holding_a_gitignore(request, tmp_path):
            os.rename(prepared(tmp_path, ".gitignore", b"*\\n"), package(request) / "moved-vc")

        def test_moves_in_a_directory_holding_an_ignored_module(request, tmp_path):
            os.rename(prepared(tmp_path, "imported.so", b"ELF"), package(request) / "moved")

        def test_walks_the_checkout_by_descriptor(request):
            for _top, _dirs, _files, fd in os.fwalk(package(request)):
                os.close(os.open("walked.py", os.O_WRONLY | os.O_CREAT, dir_fd=fd))

        def test_leaves_an_extension_module_where_git_ignores_it(request):
            (package(request) / "imported.so").write_bytes(b"ELF")  # ahead of imported.py at the next import

        def test_writes_an_ignored_file_and_removes_it(request):
            left = package(request) / "scratch.so"
            left.write_bytes(b"")
            left.unlink()

        def test_removes_an_ignored_report_and_a_built_wheel(request):
            os.remove(Path(request.config.rootpath) / "dist" / "built.whl")
            shutil.rmtree(Path(request.config.rootpath) / "reports")

        def test_removes_nothing_that_is_there(request):
            try:
                os.remove(Path(request.config.rootpath) / "dist" / "absent.whl")
            except FileNotFoundError:
                pass

        def test_writes_hypothesis_s_database_in_the_rootdir(request):
            database = Path(request.config.rootpath) / ".hypothesis" / "examples"
            database.mkdir(parents=True, exist_ok=True)
            (database / "entry").write_bytes(b"x")

        def test_writes_the_run_s_own_log(request):
            (Path(request.config.rootpath) / "own").mkdir()  # a directory at a top: the log's, so left out too
            (Path(request.config.rootpath) / "own" / "own.log").write_text("what the lane's runner writes")

        def test_walks_and_removes_a_tree_of_its_own(tmp_path):
            (tmp_path / "tree" / "a" / "b").mkdir(parents=True)
            (tmp_path / "tree" / "a" / "b" / "f").write_text("x")
            assert [top for top, *_ in os.fwalk(tmp_path / "tree")][-1].endswith("b")
            shutil.rmtree(tmp_path / "tree")
    """,
}


def _run(tmp_path_factory, name: str, files: dict[str, str], *args: str, env: dict | None = None):
    return run_batch(tmp_path_factory.mktemp(name), files, *args, env=env)


@pytest.fixture(scope="module")
def routes(tmp_path_factory):
    files = {"test_home_routes.py": HOME_ROUTES, "test_process_state.py": PROCESS_ROUTES,
             "test_tamper.py": TAMPER_ROUTES, **IMPORT_TIME}
    # a process beside the run's pytest, started with the operator's variables (a daemon, `pytest | tee`)
    sibling = subprocess.Popen(["sleep", "300"], env={**os.environ, "CANARCHY_SIBLING_SECRET": "bait"})
    try:
        return _run(tmp_path_factory, "routes", files, *EARLY, "-o", "canarchy_scan_packages=leakpkg",
                    env={"CHILD_SIBLING_PID": str(sibling.pid)})
    finally:
        sibling.kill()
        sibling.wait()


def assert_refused(run, module: str, test: str, operation: str) -> None:
    """The test failed, and the refusal names it, the operation and a path in the operator's state."""
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
    assert f"{module}::{test} tried to {operation}" in messages and ".canarchy" in messages, messages
    assert "Refused" in messages


HOME_ROUTE_CASES = [
    ("test_deleted_home_falls_back_to_a_guarded_home", "open for reading"),
    ("test_deleted_home_cannot_write_there", "mkdir"),
    ("test_home_set_back_to_the_operator", "open for reading"),
    ("test_tilde_user", "open for reading"),
    ("test_a_symlink_out_of_the_test_home", "open for reading"),
    ("test_a_dotdot_path", "open for reading"),
    ("test_sqlite_in_the_operator_home", "sqlite3.connect"),
    ("test_a_relative_path_from_a_removed_working_directory", "open for reading"),
    ("test_a_relative_path_from_a_removed_directory_descriptor", "open for reading"),
    ("test_a_chroot_into_the_operator_state", "chroot to"),
    ("test_a_child_python_given_a_pythonpath_of_its_own_reads_it", "open for reading"),
]


@pytest.mark.parametrize("test, operation", HOME_ROUTE_CASES,
                         ids=[c[0].removeprefix("test_") for c in HOME_ROUTE_CASES])
def test_every_home_route_is_refused_at_the_moment_of_access(routes, test, operation):
    run, _ = routes
    assert_refused(run, "test_home_routes.py", test, operation)


FORGED_CONFIGURATIONS = [("test_a_child_handed_a_guard_that_refuses_nothing", "PYTEST_CANARCHY_ACCESS"),
                         ("test_a_child_to_report_where_no_test_looks", "PYTEST_CANARCHY_GUARD_DIR")]


@pytest.mark.parametrize("test, variable", FORGED_CONFIGURATIONS)
def test_a_child_handed_another_configuration_of_the_isolation_is_refused_as_it_starts(routes, test, variable):
    """The rules a child's guard judges by and where it reports come from the run: a test that hands a child (or
    puts in its own environment, for every later child) other values is refused then, named; a child given the
    run's own values among others starts."""
    run, _ = routes
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
    assert f"test_home_routes.py::{test} tried to hand a child process another ${variable}:" in messages, messages
    assert "the isolation's own configuration" in messages and "Refused" in messages
    assert run.outcomes("test_a_child_given_the_run_s_own_configuration_and_more") == {"passed"}, run.output


START_UP_ENVIRONMENT_CASES = ["test_reads_the_environment_pytest_started_with", "test_reads_it_through_its_thread",
                              "test_reads_it_from_its_own_memory",
                              "test_a_child_python_reads_the_environment_its_parent_started_with",
                              "test_reads_the_command_line_of_the_process_that_started_pytest"]


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="no /proc/PID/environ on this system")
@pytest.mark.parametrize("test", START_UP_ENVIRONMENT_CASES)
def test_the_environment_pytest_was_started_with_is_refused(routes, test):
    """os.environ is scrubbed, but Linux keeps the operator's starting environment in /proc/PID/environ
    (the batch's pytest starts with CANARCHY_* variables): reading it is refused, in the test and in a child."""
    run, _ = routes
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
    assert f"test_process_state.py::{test} tried to open for reading '/proc/" in messages, messages
    assert "the environment the operator started this process or one above it with" in messages, messages
    assert "Refused" in messages


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="no /proc/PID/environ on this system")
def test_the_environment_of_a_process_outside_the_run_is_refused_and_its_own_children_s_is_not(routes):
    """A process beside pytest (a daemon the operator started, the other end of ``pytest | tee``) holds the
    operator's variables in ``/proc/PID/environ``: a read is refused at once, with or without the containment.
    What the run itself started holds the run's: a test reads its child's."""
    run, _ = routes
    test = "test_reads_the_environment_of_a_process_beside_pytest"
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
    assert f"test_process_state.py::{test} tried to open for reading '/proc/" in messages, messages
    assert "another process outside the run" in messages, messages
    assert run.outcomes("test_reads_the_environment_of_a_process_it_started") == {"passed"}, run.messages(
        "test_reads_the_environment_of_a_process_it_started")


def assert_process_refused(run, test: str, operation: str) -> None:
    """``test`` of the routes batch failed, and its refusal names it, the operation and a process outside
    the run."""
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
    assert f"test_process_state.py::{test} tried to {operation}" in messages, messages
    assert "a process outside the run" in messages, messages


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open on this system")
def test_a_signal_to_a_process_outside_the_run_is_refused_and_one_inside_it_is_not(routes):
    """A process beside pytest is the operator's: ``os.kill``, a descriptor to signal it through
    (``os.pidfd_open``, which CPython does not audit) and a child Python's ``os.kill`` are refused at once,
    naming the test, with or without the containment. A test signals itself, what it started, and from a child
    the test's own process; signal 0 (whether a pid exists) sends nothing."""
    run, _ = routes
    for test, operation in (("test_signals_a_process_beside_pytest", "send signal 18 with os.kill to 'pid "),
                            ("test_takes_a_descriptor_to_signal_a_process_beside_pytest",
                             "open a descriptor to signal 'pid "),
                            ("test_a_child_python_signals_a_process_beside_pytest",
                             "send signal 18 with os.kill to 'pid ")):
        assert_process_refused(run, test, operation)
        assert ": sleep 300" in run.messages(test), run.messages(test)
    test = "test_signals_itself_its_children_and_from_a_child_the_test_s_process"
    assert run.outcomes(test) == {"passed"}, run.messages(test)


OUTSIDE_THE_GUARD_CASES = [
    ("test_starts_a_sub_interpreter", "start a Python sub-interpreter with '_", "a Python sub-interpreter"),
    ("test_starts_one_through_the_c_api_s_test_module", "start a Python sub-interpreter with '_testcapi.",
     "a Python sub-interpreter"),
    ("test_starts_one_with_the_function_a_wrapper_holds", "start a Python sub-interpreter: 'cpython.",
     "a Python sub-interpreter"),
    ("test_renames_the_host", "change the host's name to", "the host itself"),
    ("test_sets_the_clock", "set the system clock", "the host itself"),
    ("test_makes_a_second_name_of_a_device", "make a device node at", "the host itself"),
]


@pytest.mark.parametrize("test, operation, what", OUTSIDE_THE_GUARD_CASES,
                         ids=[c[0].removeprefix("test_") for c in OUTSIDE_THE_GUARD_CASES])
def test_what_no_judged_path_names_is_refused_at_the_moment(routes, test, operation, what):
    """A sub-interpreter runs its code past every audit hook of pytest's interpreter (PEP 578: they are per
    interpreter): making one is refused, through the module that makes them, the C API's test module or the
    real function the wrapper holds (CPython's own event). The host's name and clock are shared with the
    operator and have no namespace of the run's: a change is refused, with or without the containment."""
    run, _ = routes
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
    assert f"test_process_state.py::{test} tried to {operation}" in messages, messages
    assert what in messages and "Refused" in messages, messages


UNIX_SOCKETS = """
import multiprocessing.managers, os, shutil, socket, tempfile

def _short_directory():
    return tempfile.mkdtemp(dir="/tmp")  # a socket's name holds at most 107 bytes: not under a long tmp_path

def _connect(address, kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_UNIX, kind) as client:
        client.connect(address)

def test_connects_to_an_abstract_socket_outside_the_run():
    _connect(os.environ["CHILD_ABSTRACT"].encode().replace(b"@", b"\\0", 1))

def test_connects_to_a_socket_file_outside_the_home():
    _connect(os.environ["CHILD_SOCKET_FILE"])

def test_connects_through_a_hard_link_to_a_socket_file_outside_the_home():
    where = _short_directory()
    try:
        os.link(os.environ["CHILD_SOCKET_FILE"], os.path.join(where, "l"))  # a name /proc/net/unix does not show
        _connect(os.path.join(where, "l"))
    finally:
        shutil.rmtree(where)

def test_moves_a_socket_file_outside_the_run_then_connects():
    where = _short_directory()
    moved = os.path.join(where, "moved")  # no name /proc/net/unix shows
    try:
        os.rename(os.environ["CHILD_SOCKET_FILE"], moved)
        _connect(moved)
    finally:
        if os.path.lexists(moved):
            os.rename(moved, os.environ["CHILD_SOCKET_FILE"])  # the daemon's name back, for the tests after it
        shutil.rmtree(where)

def test_sends_to_an_abstract_datagram_socket_outside_the_run():
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
        client.sendto(b"x", bytearray(os.environ["CHILD_DATAGRAM"].encode().replace(b"@", b"\\0", 1)))

def test_a_child_python_connects_to_an_abstract_socket_outside_the_run():
    import subprocess, sys
    address = os.environ["CHILD_ABSTRACT"].encode().replace(b"@", b"\\0", 1)
    code = f"import socket; socket.socket(socket.AF_UNIX).connect({address!r})"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)

def _one():
    return 1

def test_connects_to_its_own_sockets_and_its_children_s():
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(b"\\0canarchy-own-" + str(os.getpid()).encode())
        server.listen()
        _connect(server.getsockname())
    where = _short_directory()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
            server.bind(os.path.join(where, "own"))
            _connect(os.path.join(where, "own"), socket.SOCK_DGRAM)
        # a server process of the run's (forked: not dumpable, its descriptors unreadable), on a socket file
        with multiprocessing.managers.SyncManager(address=os.path.join(where, "m")) as manager:
            manager.dict()["x"] = 1
    finally:
        shutil.rmtree(where)
"""


@pytest.mark.skipif(not os.path.exists("/proc/net/unix"), reason="no /proc/net/unix on this system")
def test_a_unix_socket_a_process_outside_the_run_listens_on_is_refused(tmp_path_factory):
    """A daemon beside the run (the operator's tmux or screen server, an agent, a bus) listening on a Unix socket
    acts on what it is sent, outside every isolation: a connect or a send to it, in the abstract namespace or in
    the file system outside the home, from a test or its child Python, is refused at once, naming the test, the
    containment off (the guard alone). A test's own sockets, and those of a server process it starts, are not."""
    tag = f"canarchy-operator-{os.getpid()}"
    base = tmp_path_factory.mktemp("sockets")
    short = tempfile.mkdtemp(dir="/tmp")  # a socket's name holds at most 107 bytes
    daemon = f"""
listening, datagram, in_the_file_system = (socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX,
                                           socket.SOCK_DGRAM), socket.socket(socket.AF_UNIX))
listening.bind(b"\\0{tag}")
listening.listen()
datagram.bind(b"\\0{tag}-dgram")
in_the_file_system.bind({os.path.join(short, "daemon.sock")!r})
in_the_file_system.listen()
found = {{}}
"""
    try:
        with listeners_outside(daemon):
            run, changed = run_batch(base, {"test_unix_sockets.py": UNIX_SOCKETS}, "-o", "canarchy_containment=false",
                                     "-o", "canarchy_network_namespace=false",
                                     env={"CHILD_ABSTRACT": "@" + tag, "CHILD_DATAGRAM": f"@{tag}-dgram",
                                          "CHILD_SOCKET_FILE": os.path.join(short, "daemon.sock")})
    finally:
        shutil.rmtree(short)
    assert changed == []
    for test, operation in (("test_connects_to_an_abstract_socket_outside_the_run",
                             f"connect to the Unix socket '@{tag}'"),
                            ("test_connects_to_a_socket_file_outside_the_home", "connect to the Unix socket '/"),
                            ("test_connects_through_a_hard_link_to_a_socket_file_outside_the_home",
                             "connect to the Unix socket '/"),
                            ("test_moves_a_socket_file_outside_the_run_then_connects", "move the Unix socket '/"),
                            ("test_sends_to_an_abstract_datagram_socket_outside_the_run",
                             f"send to the Unix socket '@{tag}-dgram'"),
                            ("test_a_child_python_connects_to_an_abstract_socket_outside_the_run",
                             f"connect to the Unix socket '@{tag}'")):
        messages = run.messages(test)
        assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
        assert f"test_unix_sockets.py::{test} tried to {operation}" in messages, messages
        assert "a process outside the run" in messages, messages
        # the ways out a process needs: not the home's
        assert "@pytest.mark.integration" in messages and "real_home" not in messages, messages
    test = "test_connects_to_its_own_sockets_and_its_children_s"
    assert run.outcomes(test) == {"passed"}, run.messages(test)


LATE_SOCKET = """
import os, shutil, socket, tempfile, time

def test_connects_to_a_socket_bound_outside_the_run_after_it_started():
    with open(os.environ["CHILD_READY"], "w") as ready:  # the run's network namespace
        ready.write(str(os.stat("/proc/self/ns/net").st_ino))
    deadline = time.monotonic() + 30
    while not os.path.exists(os.environ["CHILD_SOCKET_FILE"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    socket.socket(socket.AF_UNIX).connect(os.environ["CHILD_SOCKET_FILE"])

def test_connects_to_its_own_socket_file():
    where = tempfile.mkdtemp(dir="/tmp")  # a short path: a socket's name holds at most 107 bytes
    try:
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind(os.path.join(where, "own.sock"))
            server.listen()
            client.connect(os.path.join(where, "own.sock"))
    finally:
        shutil.rmtree(where)
"""


def test_a_socket_file_bound_outside_the_run_after_it_started_is_refused_in_its_network_namespace(
        tmp_path_factory):
    """In the run's private network namespace ``/proc/net/unix`` shows the run's own sockets only, and the mount
    view covers the sockets bound when the run started: a daemon of the operator's that binds a socket file later
    (outside the run's namespaces) would be reached, from the test itself, unjudged. A socket file the run's
    namespace does not show is bound in another: refused at once, naming the test; the test's own still works."""
    short = tempfile.mkdtemp(dir="/tmp")  # a socket's name holds at most 107 bytes
    ready, path = os.path.join(short, "ready"), os.path.join(short, "late.sock")
    daemon = socket.socket(socket.AF_UNIX)

    def bind_once_the_run_started() -> None:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.02)
        daemon.bind(path)
        daemon.listen()

    binder = threading.Thread(target=bind_once_the_run_started, daemon=True)
    binder.start()
    try:
        run, changed = run_batch(tmp_path_factory.mktemp("late-socket"), {"test_late_socket.py": LATE_SOCKET},
                                 "-o", "canarchy_containment=true", "-o", "canarchy_network_namespace=true",
                                 env={"CHILD_READY": ready, "CHILD_SOCKET_FILE": path})
        private = Path(ready).read_text() != str(os.stat("/proc/self/ns/net").st_ino)
    finally:
        binder.join(5)
        daemon.close()
        shutil.rmtree(short)
    assert changed == []
    test = "test_connects_to_a_socket_bound_outside_the_run_after_it_started"
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, run.output
    assert f"test_late_socket.py::{test} tried to connect to the Unix socket '{path}'" in messages, messages
    assert ("outside the run's network namespace" if private else "a process outside the run") in messages, messages
    assert run.outcomes("test_connects_to_its_own_socket_file") == {"passed"}, run.output


PORTS = """
import contextlib, os, socket

SPELLINGS = ("0", "0x0", "0.0", b"0", bytearray(b"0.0.0.0"))

def test_connects_to_a_loopback_port_outside_the_run():
    socket.create_connection(("localhost", int(os.environ["CHILD_TCP_PORT"])), timeout=5).close()

def test_connects_to_a_port_outside_the_run_through_an_address_of_the_host():
    socket.create_connection((os.environ["CHILD_HOST_ADDRESS"], int(os.environ["CHILD_TCP_PORT"])), timeout=5).close()

def test_connects_to_a_port_outside_the_run_through_the_unspecified_address():
    socket.create_connection(("0.0.0.0", int(os.environ["CHILD_LOOPBACK_PORT"])), timeout=5).close()  # loopback

def test_sends_to_a_loopback_datagram_port_outside_the_run():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.sendto(b"x", ("127.0.0.1", int(os.environ["CHILD_UDP_PORT"])))

def test_connects_through_other_spellings_of_the_unspecified_address():
    for host in SPELLINGS:  # what inet_aton and getaddrinfo take; each refusal caught, to try the next
        with socket.socket() as client, contextlib.suppress(AssertionError):
            client.settimeout(5)
            client.connect_ex((host, int(os.environ["CHILD_LOOPBACK_PORT"])))

def test_sends_to_a_multicast_group_on_a_port_outside_the_run():  # python-can's udp_multicast bus
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)  # were it sent: this host only
        client.sendto(b"x", ("239.255.74.1", int(os.environ["CHILD_GROUP_PORT"])))

def test_sends_to_loopback_s_broadcast_address_on_a_port_outside_the_run():  # a loopback address: it stays on lo
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        client.sendto(b"x", ("127.255.255.255", int(os.environ["CHILD_GROUP_PORT"])))

def test_opens_a_netlink_socket():  # rtnetlink: a CAN interface up or down, its bitrate
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()

def test_opens_a_raw_ip_socket():  # its UDP header, port and all, is the test's: a daemon's port, unjudged
    socket.socket(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_UDP).close()

def test_sets_the_flags_of_a_network_interface():
    import fcntl, struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:  # SIOCSIFFLAGS, of no such interface
        fcntl.ioctl(client, 0x8914, struct.pack("16sH14x", b"canarchy-none0", 0))

def test_reads_the_flags_of_a_network_interface():
    import fcntl, struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:  # SIOCGIFFLAGS of loopback: a read
        fcntl.ioctl(client, 0x8913, struct.pack("16sH14x", b"lo", 0))

def test_a_child_python_connects_to_a_loopback_port_outside_the_run():
    import subprocess, sys
    code = f"import socket; socket.create_connection(('127.0.0.1', {os.environ['CHILD_TCP_PORT']})).close()"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)

def test_connects_to_its_own_ports():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server, \\
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        server.bind(("127.0.0.1", 0))
        client.sendto(b"x", server.getsockname())
"""


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="no /proc/net/tcp on this system")
def test_the_kernel_s_answer_and_the_tables_name_the_same_bound_sockets():
    """The guard asks the kernel for the sockets bound to ports (sock_diag), which answers with those alone; where
    it cannot, it reads proc(5)'s tables, which the kernel writes walking every socket of the host. Both name a
    listening TCP socket and a UDP socket of this test, by address, port and inode, alike."""
    from canarchy.testing.isolation import listeners

    with socket.socket() as listening, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as datagram:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        datagram.bind(("::", 0))
        for sock, kind in ((listening, socket.SOCK_STREAM), (datagram, socket.SOCK_DGRAM)):
            protocol, states, tables, state = listeners._KINDS[kind]
            asked = sorted(entry for family in (socket.AF_INET, socket.AF_INET6)
                           for entry in listeners._diag(family, protocol, states))
            read = sorted(entry for table in tables for entry in listeners._bound(table, state))
            host, port = sock.getsockname()[:2]
            own = (ipaddress.ip_address(host), port, str(os.fstat(sock.fileno()).st_ino))
            assert own in asked and asked == read, (own, asked, read)


#: A host's routing table as ``/proc/net/fib_trie`` shows it (its local table: Linux 6.x), with an interface on
#: 192.0.2.10/24: its own address and its broadcast address.
FIB_TRIE = """Local:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.0.2.0/24 2 0 2
        |-- 192.0.2.10
           /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
"""


def test_the_host_s_broadcast_addresses_reach_a_port_bound_on_every_address(tmp_path):
    """Linux hands a datagram sent to a broadcast address of the host (``/proc/net/fib_trie``'s ``/32 link
    BROADCAST``) to each socket bound to its port on every address: the guard counts those addresses as the
    host's own, so a send there to a daemon's port is judged as one to loopback is. Judged on a table of an
    interface the run's network namespace does not have (a broadcast off loopback would leave the machine)."""
    from canarchy.testing.isolation import listeners

    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    local = listeners._local_addresses(str(tmp_path / "fib_trie"))
    own, broadcast = ipaddress.ip_address("192.0.2.10"), ipaddress.ip_address("192.0.2.255")
    assert {own, broadcast, ipaddress.ip_address("255.255.255.255")} <= local, local
    assert listeners._reaches(broadcast, ipaddress.ip_address("0.0.0.0"), local)
    assert not listeners._reaches(broadcast, ipaddress.ip_address("127.0.0.1"), local)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="no /proc/net/tcp on this system")
def test_a_port_of_this_host_a_process_outside_the_run_is_bound_to_is_refused(tmp_path_factory):
    """A daemon beside the run listening on loopback or on every address of the host (a database, socketcand
    relaying the operator's CAN bus, a debugger's port, python-can's ``udp_multicast`` bus) acts on what it is
    sent: without the network namespace (the guard alone), a test's TCP connect or UDP send to its port, by name,
    by loopback, by an address of the host or to a multicast group, and a child Python's, is refused at once,
    naming the test. A test's own ports are not. Nor, in that run, may a test change the host's network
    interfaces (a netlink socket, an ioctl that sets an interface's flags) or open a raw IP socket (its
    packets carry their own ports); one that reads the interfaces may."""
    daemon = """
listening, on_loopback = socket.socket(), socket.socket()
datagram, group = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
group.bind(("0.0.0.0", 0))  # on every address: the groups' datagrams to its port too
listening.bind(("0.0.0.0", 0))
listening.listen()
on_loopback.bind(("127.0.0.1", 0))
on_loopback.listen()
datagram.bind(("127.0.0.1", 0))
found = {name: sock.getsockname()[1] for name, sock in (("TCP", listening), ("LOOPBACK", on_loopback),
                                                        ("UDP", datagram), ("GROUP", group))}
"""
    host = "127.0.0.1"  # in a network namespace holding only loopback: the host has no other address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, contextlib.suppress(OSError):
        probe.connect(("192.0.2.1", 9))  # no packet is sent: the address this host would send from
        host = probe.getsockname()[0]
    with listeners_outside(daemon) as ports:
        run, changed = run_batch(tmp_path_factory.mktemp("ports"), {"test_ports.py": PORTS},
                                 "-o", "canarchy_containment=false", "-o", "canarchy_network_namespace=false",
                                 env={"CHILD_HOST_ADDRESS": host, **{f"CHILD_{name}_PORT": str(port)
                                                                     for name, port in ports.items()}})
    assert changed == []
    for test, operation in (("test_connects_to_a_loopback_port_outside_the_run", "connect to the port '"),
                            ("test_connects_to_a_port_outside_the_run_through_an_address_of_the_host",
                             f"connect to the port '{host}:"),
                            ("test_connects_to_a_port_outside_the_run_through_the_unspecified_address",
                             "connect to the port '0.0.0.0:"),
                            ("test_sends_to_a_loopback_datagram_port_outside_the_run", "send to the port '127.0.0.1:"),
                            ("test_sends_to_a_multicast_group_on_a_port_outside_the_run",
                             "send to the port '239.255.74.1:"),
                            ("test_sends_to_loopback_s_broadcast_address_on_a_port_outside_the_run",
                             "send to the port '127.255.255.255:"),
                            ("test_connects_through_other_spellings_of_the_unspecified_address",
                             "connect to the port '0:"),
                            ("test_a_child_python_connects_to_a_loopback_port_outside_the_run",
                             "connect to the port '127.0.0.1:")):
        messages = run.messages(test)
        assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
        assert f"test_ports.py::{test} tried to {operation}" in messages, messages
        assert "a process outside the run" in messages, messages
    messages = run.messages("test_connects_through_other_spellings_of_the_unspecified_address")
    for shown in ("'0:", "'0x0:", "'0.0:", '"b\'0\':', '"bytearray(b\'0.0.0.0\'):'):  # each refused, repr'd
        assert f"connect to the port {shown}" in messages, (shown, messages)
    assert run.outcomes("test_connects_to_its_own_ports") == {"passed"}, run.messages("test_connects_to_its_own_ports")
    # the host's network interfaces, which the run shares without a network namespace of its own
    for test, operation in (("test_opens_a_netlink_socket", "open a netlink socket (protocol 0) to"),
                            ("test_opens_a_raw_ip_socket", "open a raw IP socket (its packets carry their own ports"),
                            ("test_sets_the_flags_of_a_network_interface",
                             "change a network interface (ioctl 0x8914)")):
        messages = run.messages(test)
        assert f"test_ports.py::{test} tried to {operation}" in messages, messages
        assert "the host's network interfaces (a CAN interface among them" in messages, messages
    assert run.outcomes("test_reads_the_flags_of_a_network_interface") == {"passed"}, run.output


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity on this system")
def test_a_change_to_a_process_outside_the_run_is_refused_and_one_inside_it_is_not(routes):
    """What ends, starves or slows a process as a signal would is judged as one: its resource limits
    (``resource.prlimit``: a CPU limit under the time it used sends it SIGXCPU), its nice level
    (``os.setpriority``; of every process of the user with ``PRIO_USER``), its CPUs (``os.sched_setaffinity``),
    which CPython does not audit, and a descriptor it is made the owner of (``F_SETOWN``, ``F_SETOWN_EX`` of a
    group, ``SIOCSPGRP``; an owner in an ``int`` subclass): the kernel signals the owner (SIGIO, or what
    ``F_SETSIG`` names: SIGKILL, SIGSTOP) each time the descriptor is ready. Refused at once for a process
    beside pytest (pytest's own group holds the operator's pipeline), naming the test, from a child Python too;
    a test changes itself, its threads and what it started, and asks a limit of anyone."""
    run, _ = routes
    for test, operation in (("test_renices_a_process_beside_pytest", "change the nice level of 'pid "),
                            ("test_renices_every_process_of_the_user", "change the nice level of 'user "),
                            ("test_sets_a_resource_limit_of_a_process_beside_pytest",
                             "set a resource limit of 'pid "),
                            ("test_moves_a_process_beside_pytest_to_other_cpus", "change the CPUs of 'pid "),
                            ("test_a_child_python_renices_a_process_beside_pytest",
                             "change the nice level of 'pid "),
                            ("test_makes_a_process_beside_pytest_the_owner_of_a_descriptor",
                             "make the owner of a descriptor (sent SIGIO, or the signal F_SETSIG names, when it is "
                             "ready) 'pid "),
                            ("test_makes_a_process_beside_pytest_the_owner_of_a_socket",
                             "make the owner of a descriptor (sent SIGIO, or the signal F_SETSIG names, when it is "
                             "ready) 'pid "),
                            ("test_makes_pytest_s_process_group_the_owner_of_a_descriptor",
                             "make the owner of a descriptor (sent SIGIO, or the signal F_SETSIG names, when it is "
                             "ready) 'process group "),
                            ("test_gives_a_descriptor_an_owner_the_guard_cannot_read",
                             "make the owner of a descriptor (sent SIGIO, or the signal F_SETSIG names, when it is "
                             "ready) 'descriptor ")):
        assert_process_refused(run, test, operation)
    assert run.outcomes("test_changes_itself_and_its_children") == {"passed"}, run.messages(
        "test_changes_itself_and_its_children")


def test_a_multiprocessing_worker_may_import_a_module_that_requires_the_isolation(routes):
    """A ``spawn`` worker imports the test's module, and with it ``canarchy.testing.required``: it runs
    under the test's guards, so the import passes (refused, the pool would restart workers for ever)."""
    run, _ = routes
    assert run.outcomes("test_a_spawned_worker_imports_this_module") == {"passed"}, run.output
    # multiprocessing's resource tracker lives until the interpreter exits: not left running by a test
    assert "resource_tracker" not in run.output, run.output


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="no /proc/PID/environ on this system")
def test_a_shell_finds_nothing_of_the_environment_pytest_was_started_with(routes):
    """A child that is not Python meets no guard: pytest erased its own start-up environment from
    its memory (what ``/proc/PID/environ`` shows, for every thread, even one started later)."""
    run, _ = routes
    assert run.outcomes("test_a_shell_reads_the_environment_pytest_started_with") == {"passed"}, run.output


def test_an_empty_home_variable_reaches_nothing_of_the_operator(routes):
    run, _ = routes
    assert run.outcomes("test_an_empty_home_reaches_nothing_of_the_operator") == {"passed"}, run.output


def test_a_caught_refusal_still_fails_its_test(routes):
    run, _ = routes
    messages = run.messages("test_a_caught_refusal")
    assert "the error may have been caught" in messages and "test_a_caught_refusal tried to open" in messages


def test_a_child_python_s_read_is_refused_naming_the_parent_test(routes):
    run, _ = routes
    messages = run.messages("test_a_child_python_reads_it")
    assert "test_home_routes.py::test_a_child_python_reads_it tried to open for reading" in messages
    assert "in child process" in messages


@pytest.mark.parametrize("test, words", [
    ("test_a_putenv", "changed LEAK_C_LEVEL with os.putenv"),
    ("test_environ_replaced", "replaced os.environ with another object"),
    ("test_python_can_config_files_extended", "can.util.CONFIG_FILES"),
    ("test_a_signal_handler_left_installed", "left a handler for SIGUSR1 installed"),
    ("test_a_umask_left_changed", "left the umask at 0000"),
    ("test_a_handler_that_claims_equality_left_installed", "left a handler for SIGUSR2 installed"),
    ("test_a_handler_left_with_the_check_blinded", "left a handler for SIGHUP installed"),
    ("test_a_signal_mask_left_changed", "left the signal mask changed (blocked now: SIGTERM"),
], ids=["putenv", "environ", "can-config", "signal", "umask", "signal-equal", "signal-blinded", "signal-mask"])
def test_process_state_left_changed_is_put_back_and_named(routes, test, words):
    run, _ = routes
    assert run.outcomes(test) == {"error"}, run.output  # the call passed; the teardown put it back, named
    assert f"test_process_state.py::{test}" in run.messages(test) and words in run.messages(test)


@pytest.mark.parametrize("test", ["test_after_a_putenv_children_see_nothing", "test_after_environ_replaced",
                                  "test_after_the_config_files_were_extended", "test_a_chdir_is_put_back",
                                  "test_after_a_chdir", "test_after_the_blinded_check"],
                         ids=["putenv", "environ", "can-config", "chdir", "cwd", "signal-blinded"])
def test_the_next_test_sees_the_state_put_back(routes, test):
    run, _ = routes
    assert run.outcomes(test) == {"passed"}, run.messages(test)


TAMPERING = [
    ("test_switches_the_access_guard_off", "access guard switched off", "test_after_the_switch"),
    ("test_empties_the_judged_events", "audithook._EVENTS changed", "test_after_the_events"),
    ("test_marks_its_thread_exempt", "told this thread was exempt", "test_after_the_exemption"),
    ("test_configures_an_empty_protection", "AccessGuard.protection replaced", "test_after_the_protection"),
    ("test_replaces_a_method", "access.AccessGuard._judge replaced", "test_after_the_method"),
    ("test_hides_a_method", "AccessGuard._audit added", "test_after_the_hiding"),
    ("test_gives_the_guard_a_quiet_class", "AccessGuard.__class__ replaced", "test_after_the_class"),
    ("test_replaces_the_guard_s_thread_state", "AccessGuard._local replaced", "test_after_the_thread_state"),
    ("test_empties_the_zones", "Zones.refused replaced", "test_after_the_zones"),
    ("test_blinds_the_path_resolution", "AccessGuard.paths replaced", "test_after_the_blind_resolution"),
    ("test_blinds_the_seal_then_replaces_a_method", "access.AccessGuard._judge replaced",
     "test_after_the_blinding"),
    ("test_replaces_the_environment_of_the_plugin_s_programs", "Sandbox.tool_env replaced",
     "test_after_the_environment_of_the_programs"),
]


@pytest.mark.parametrize("tamperer, words, victim", TAMPERING, ids=[t[0].removeprefix("test_") for t in TAMPERING])
def test_a_test_that_disables_the_guard_is_named_and_the_next_one_is_guarded(routes, tamperer, words, victim):
    run, _ = routes
    assert run.outcomes(tamperer) & {"failed", "error"}, run.output
    messages = run.messages(tamperer)
    assert f"test_tamper.py::{tamperer} changed the isolation's own code or state" in messages and words in messages
    assert_refused(run, "test_tamper.py", victim, "open for reading")


def test_a_test_that_calls_the_harness_s_exemption_is_still_judged(routes):
    """``GUARD.exempt()`` lets the harness's own code pass, frame by frame up to where it was called: a test
    that calls it and reads the operator's state inside is refused at that moment, named."""
    run, _ = routes
    assert_refused(run, "test_tamper.py", "test_reads_inside_an_exemption_of_its_own", "open for reading")


def test_the_fixtures_hand_a_test_neither_the_operator_s_variables_nor_the_guards(routes):
    """``canarchy_sandbox`` and ``active_sandbox()`` are read-only views without the operator's environment;
    ``access_guard``/``bus_guard`` only take the test's own refusals (not its records of checkout writes)."""
    run, _ = routes
    assert run.outcomes("test_what_the_fixtures_hand_a_test") == {"passed"}, run.messages(
        "test_what_the_fixtures_hand_a_test")


def test_a_test_that_makes_every_bus_virtual_is_named_and_the_next_bus_refused(routes):
    run, _ = routes
    assert "VirtualBus replaced" in run.messages("test_makes_every_bus_virtual"), run.output
    messages = run.messages("test_after_every_bus_became_virtual")
    assert run.outcomes("test_after_every_bus_became_virtual") & {"failed", "error"}, run.output
    assert "test_after_every_bus_became_virtual tried to open a real CAN bus" in messages, messages


def test_a_test_that_unwraps_a_driver_s_init_is_named_and_the_next_driver_refused(routes):
    """The wrapper was put on as the driver module was imported, in the same test that took it
    off: the seal keeps the hook python-can was given, not what it found at teardown."""
    run, _ = routes
    assert "SocketCanDaemonBus.__init__ replaced" in run.messages("test_unwraps_a_driver_s_init"), run.output
    messages = run.messages("test_after_the_unwrapping")
    assert "test_after_the_unwrapping tried to open a real CAN bus" in messages, run.output
    assert "interface='socketcand', channel='can0'" in messages, messages


def test_a_test_that_replaces_the_plugin_s_decisions_is_named_and_the_next_one_isolated(routes):
    run, _ = routes
    messages = run.messages("test_opts_every_later_test_out")
    assert "pertest._opts_out replaced" in messages, run.output
    assert run.outcomes("test_after_the_opt_out") == {"passed"}, run.messages("test_after_the_opt_out")


def test_code_a_test_plants_in_the_plugin_s_teardown_is_judged_too(routes):
    """The plugin's own teardown calls what a test can replace (here a method of the sandbox object,
    dug out of pytest's configuration): that call is judged like the test's code, so the read is refused
    at once."""
    run, _ = routes
    test = "test_plants_code_in_what_the_plugin_calls_at_teardown"
    messages = run.messages(test)
    assert "tried to open for reading" in messages and "config.toml" in messages, run.output
    assert run.outcomes(test) & {"failed", "error"}, run.output


def test_markers_added_after_collection_change_nothing_and_are_named(routes):
    run, _ = routes
    assert run.outcomes("test_marked_after_collection") == {"error"}, run.output
    assert "opt-out markers of test_tamper.py::test_marked_after_collection changed after collection" in \
        run.messages("test_marked_after_collection")


def test_a_hook_that_marks_tests_after_others_gets_no_opt_out(tmp_path):
    """A conftest's ``trylast`` hook marks a test before the plugin deselects it (its hook runs last of all);
    a hook wrapper that marks one after every hook changes nothing, and the test is named."""
    run = run_child(tmp_path, {"conftest.py": """
        import pytest
        pytest_plugins = ["canarchy.testing.isolation.plugin"]

        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(items):
            for item in items:
                if item.name == "test_marked_last":
                    item.add_marker("integration")

        class AfterEveryHook:
            @pytest.hookimpl(hookwrapper=True)
            def pytest_collection_modifyitems(self, items):
                yield
                for item in items:
                    if item.name == "test_marked_after_every_hook":
                        item.add_marker("real_home")

        def pytest_configure(config):
            config.pluginmanager.register(AfterEveryHook())
    """, "test_marked.py": """
        from pathlib import Path

        def test_marked_last():
            (Path.home() / "marked-last").write_text("ran with the operator's home")

        def test_marked_after_every_hook():
            (Path.home() / "marked-after").write_text("ran with the operator's home")
    """})
    assert "test_marked_last" not in run.results, run.output  # deselected: a plain run asks for no opt-out
    assert run.outcomes("test_marked_after_every_hook") == {"error"}, run.output
    assert "opt-out markers of test_marked.py::test_marked_after_every_hook changed after collection" in \
        run.messages("test_marked_after_every_hook")
    assert not list(run.home.glob("marked-*")), run.output


def test_a_descriptor_of_a_directory_holding_the_operator_s_state_is_refused(routes):
    run, _ = routes
    assert_refused(run, "test_tamper.py", "test_opens_a_descriptor_of_the_home", "open a descriptor of the directory")


def test_a_run_started_with_a_directory_or_operator_descriptor_open_is_refused(tmp_path_factory):
    """A descriptor pytest inherits is one its protections cannot see through: a directory's, one on the
    operator's state, or one open for writing on a file of the home (``4>>~/.bashrc``); with the containment,
    also one open to read a file of the home, standard input among them (``pytest < ~/.bashrc``): a shell
    child's ``>> /proc/self/fd/0`` reopens it on the mount it was opened on, not the read-only view. The run is
    refused; without the containment, that read-only one is not (the guard judges what Python reopens)."""
    home = make_operator_home(tmp_path_factory.mktemp("descriptor-home"))
    (home / ".bashrc").write_text("")
    contained = ("-o", "canarchy_containment=true")
    for path, expected, flags, options, stdin in (
            (home.parent, "is open on the directory", os.O_RDONLY, (), False),
            (home / ".canrc", "the operator's own state", os.O_RDONLY, (), False),
            (home / ".bashrc", "is open for writing on", os.O_WRONLY | os.O_APPEND, (), False),
            (home / ".bashrc", f"is open (to read) on {home / '.bashrc'}", os.O_RDONLY, contained, True),
            (home / ".bashrc", f"is open (to read) on {home / '.bashrc'}", os.O_RDONLY, contained, False),
            (home / ".bashrc", None, os.O_RDONLY, (), True)):
        fd = os.open(path, flags)
        try:
            run = run_child(tmp_path_factory.mktemp("descriptors"), {"test_one.py": "def test_one():\n    pass\n"},
                            *EARLY, *options, pass_fds=() if stdin else (fd,), stdin=fd if stdin else None,
                            env={"HOME": str(home), "USERPROFILE": str(home)})
        finally:
            os.close(fd)
        if expected is None:
            assert run.outcomes("test_one") == {"passed"}, run.output
            continue
        assert run.returncode == 4 and "test_one" not in run.results, run.output
        # standard input is named as the copy of it pytest's capture keeps
        assert "descriptor " + ("" if stdin else f"{fd} ") in run.output and expected in run.output, run.output


def test_a_run_started_with_a_socket_that_leaves_by_another_way_is_refused(tmp_path_factory):
    """An inherited socket is written to without any privilege and leaves by the namespace it was made in: one
    of a family the bus guard refuses to open (netlink here: an unprivileged user can make one) refuses any run;
    with a private network namespace, a UDP one does too, which a run without it may keep, as it may a Unix one
    (a journal's standard output is one)."""
    network = ("-o", "canarchy_network_namespace=true")
    for family, kind, options, expected in (
            (socket.AF_NETLINK, socket.SOCK_RAW, (), "is a netlink socket"),
            (socket.AF_INET, socket.SOCK_DGRAM, network, "is a socket of the host's network"),
            (socket.AF_INET, socket.SOCK_DGRAM, (), None),
            (socket.AF_UNIX, socket.SOCK_DGRAM, network, None)):
        with socket.socket(family, kind) as inherited:
            run = run_child(tmp_path_factory.mktemp("sockets"), {"test_one.py": "def test_one():\n    pass\n"},
                            *EARLY, *options, pass_fds=(inherited.fileno(),))
            fd = inherited.fileno()
        if expected is None:
            assert run.outcomes("test_one") == {"passed"}, run.output
            continue
        assert run.returncode == 4 and "test_one" not in run.results, run.output
        assert f"descriptor {fd} {expected}" in run.output, run.output


def test_a_tmpdir_in_the_operator_home_is_not_used(tmp_path_factory):
    """pytest's own ``TMPDIR`` there: the run's temporary files go elsewhere, and the home stays read-only (the
    guard's writable trees are the run's temporary directory, not the one ``TMPDIR`` named)."""
    base = tmp_path_factory.mktemp("tmpdir")
    home = base / "operator-home"
    files = {"test_tmp.py": "import os, tempfile\n\ndef test_tmp(tmp_path):\n"
                            "    home = os.environ['CHILD_HOME']\n"
                            "    assert not tempfile.gettempdir().startswith(home)\n"
                            "    assert not str(tmp_path).startswith(home)\n\n"
                            "def test_writes_where_tmpdir_pointed():\n"
                            "    open(os.path.join(os.environ['CHILD_HOME'], 'by-test.txt'), 'w').close()\n"}
    run = run_child(base, files, *EARLY, env={"TMPDIR": str(home), "CHILD_HOME": str(home)})
    assert run.outcomes("test_tmp") == {"passed"}, run.output
    messages = run.messages("test_writes_where_tmpdir_pointed")
    assert "test_writes_where_tmpdir_pointed tried to open for writing" in messages, run.output
    assert not (home / "by-test.txt").exists()


def test_a_tmpdir_in_the_checkout_is_no_writable_tree(tmp_path_factory):
    """A ``TMPDIR`` inside the checkout: a write there is judged as one into the checkout (a ``.gitignore``
    that would hide what is beside it, refused), and pytest's own capture files there, removed as soon as made,
    are no file left open in the checkout."""
    base = tmp_path_factory.mktemp("tmpdir-checkout")
    tmpdir = base / "project" / "tmpd"
    tmpdir.mkdir(parents=True)
    files = {"test_tmp.py": "import os\n\ndef test_nothing():\n    pass\n\n"
                            "def test_writes_a_gitignore_there():\n"
                            "    open(os.path.join(os.environ['CHILD_TMPDIR'], '.gitignore'), 'w').close()\n"}
    run = run_child(base, files, *EARLY, env={"TMPDIR": str(tmpdir), "CHILD_TMPDIR": str(tmpdir)})
    assert run.outcomes("test_nothing") == {"passed"} and "left open for writing" not in run.output, run.output
    messages = run.messages("test_writes_a_gitignore_there")
    assert "test_writes_a_gitignore_there tried to open for writing" in messages, run.output
    assert not (tmpdir / ".gitignore").exists()


def test_the_operator_s_home_as_the_rootdir_is_refused(tmp_path_factory):
    base = tmp_path_factory.mktemp("rootdir-home")
    home = make_operator_home(base)
    (home / "test_here.py").write_text("def test_here():\n    pass\n")
    proc = subprocess.run([*PYTEST, *EARLY, "--rootdir", str(home), "-c", os.devnull, str(home)],
                          cwd=home, env=operator_environment(home), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and "the rootdir is the operator's home" in proc.stdout + proc.stderr, proc.stdout


@pytest.mark.parametrize("how", ["option", "PYTEST_ADDOPTS"])
def test_a_base_temp_in_the_operator_s_home_is_refused_at_the_start(tmp_path, how):
    """pytest's ``--basetemp`` is where every ``tmp_path`` goes: one the operator's shell hands in
    (``PYTEST_ADDOPTS``) or a command line names in the home had each test write there, without the
    containment. The run is refused at its start, saying why; the home holds nothing new."""
    home = tmp_path / "operator-home"
    given = ["--basetemp", str(home / "pytest-base")] if how == "option" else []
    env = {"PYTEST_ADDOPTS": "--basetemp=~/pytest-base"} if how == "PYTEST_ADDOPTS" else {}
    run = run_child(tmp_path, {"test_tmp.py": "def test_writes(tmp_path):\n    (tmp_path / 'x').write_text('y')\n"},
                    *given, "-o", "canarchy_containment=false", env=env)
    assert run.returncode == 4 and "lies in the operator's home" in run.output, run.output
    assert not (home / "pytest-base").exists()


WITH_CACHE = tuple(arg for arg in PYTEST if arg not in ("-p", "no:cacheprovider"))  # pytest's cache plugin on


@pytest.mark.parametrize("how", ["cache_dir", "a link at the tools' cache", "a link at pytest's cache"])
def test_a_tree_pytest_or_the_tools_write_that_leads_into_the_operator_s_home_is_refused_at_the_start(tmp_path, how):
    """pytest's ``cache_dir``, and the tools' caches and pytest's cache in the checkout, are trees every test may
    write: one the operator names in the home, or a link there a test of an earlier run left, would have the
    run write into the home (without the containment). The run is refused at its start, saying why."""
    home, project = tmp_path / "operator-home", tmp_path / "project"
    project.mkdir()
    args = ["-o", f"cache_dir={home / '.config' / 'pc'}"] if how == "cache_dir" else []
    if how != "cache_dir":
        (project / (".hypothesis" if "tools" in how else ".pytest_cache")).symlink_to(home / ".config")
    run = run_child(tmp_path, {"test_cache.py": "def test_writes(request):\n    request.config.cache.set('k', 1)\n"},
                    *args, "-o", "canarchy_containment=false", program=WITH_CACHE)
    assert run.returncode == 4 and "lies in the operator's home" in run.output, run.output
    assert ("(a link to" in run.output) is (how != "cache_dir"), run.output
    assert not (home / ".config" / "v").exists() and not (home / ".config" / "pc").exists()


LINKED_TOPS = """
    import os, shutil
    CONFIG = os.environ["CHILD_HOME_CONFIG"]

    def test_links_the_tools_cache(request):
        os.symlink(CONFIG, os.path.join(request.config.rootpath, ".hypothesis"))

    def test_links_pytest_s_cache_in_place_of_it(request):
        cache = os.path.join(request.config.rootpath, ".pytest_cache")
        shutil.rmtree(cache, ignore_errors=True)
        os.symlink(CONFIG, cache)

    def test_moves_a_link_onto_the_tools_cache(request, tmp_path):
        os.symlink(CONFIG, tmp_path / "link")
        os.rename(tmp_path / "link", os.path.join(request.config.rootpath, ".hypothesis"))

    def test_links_its_own_temporary_directory(tmp_path):
        os.symlink(CONFIG, tmp_path / "inside")  # below the top: what is reached through it is judged there
"""


def test_a_link_a_test_makes_at_the_top_of_a_writable_tree_is_refused_naming_it(tmp_path):
    """The caches pytest and the tools write in the checkout are writable, and the next run resolves them as it
    starts: a test that makes one a link into the home (or moves a link onto it) is refused at that moment,
    named; a link below a writable tree's top is the test's own."""
    home = tmp_path / "operator-home"
    run = run_child(tmp_path, {"test_tops.py": LINKED_TOPS}, "-p", "no:randomly", program=WITH_CACHE,
                    env={"CHILD_HOME_CONFIG": str(home / ".config")})
    for test, operation in [("test_links_the_tools_cache", "symlink"),
                            ("test_links_pytest_s_cache_in_place_of_it", "symlink"),
                            ("test_moves_a_link_onto_the_tools_cache", "move a symlink onto")]:
        messages = run.messages(test)
        assert run.outcomes(test) & {"failed", "error"}, (test, run.output)
        assert f"test_tops.py::{test} tried to {operation}" in messages and "a link made there" in messages, messages
    assert run.outcomes("test_links_its_own_temporary_directory") == {"passed"}, run.output
    project = tmp_path / "project"
    assert not (project / ".hypothesis").is_symlink() and not (project / ".pytest_cache").is_symlink()


def test_a_link_a_shell_child_makes_at_the_tools_cache_fails_the_run(tmp_path):
    """A shell child's link is made where no audit hook sees it: the sentinel's last look keeps a link at the top
    of pytest's or the tools' own trees (their content it leaves out), so the run fails, naming the path."""
    home = tmp_path / "operator-home"
    run = run_child(tmp_path, {"test_shell_link.py": """
        import os, subprocess
        def test_links(request):
            subprocess.run(["ln", "-s", os.environ["CHILD_HOME_CONFIG"], ".hypothesis"], check=True,
                           cwd=request.config.rootpath)
        """}, env={"CHILD_HOME_CONFIG": str(home / ".config")})
    assert run.returncode != 0 and ".hypothesis" in run.output, run.output


def test_a_bus_opened_at_collection_fails_the_first_test_and_feeds_no_later_one(tmp_path_factory):
    run, _ = _run(tmp_path_factory, "stale-bus", {"test_stale_bus.py": STALE_BUS}, *EARLY)
    messages = run.messages("test_a_first")
    assert run.outcomes("test_a_first") == {"error"} and "opened by <collection of test_stale_bus.py>" in messages
    later = "test_b_later_on_the_same_channel"
    assert run.outcomes(later) == {"passed"}, run.messages(later)


def test_import_time_paths_in_every_kind_of_holder_follow_the_test_home(routes):
    run, _ = routes
    assert run.outcomes("test_every_kind_of_holder_follows_the_test_home") == {"passed"}, run.output


def test_the_operator_home_is_byte_identical_after_every_route(routes):
    _, changed = routes
    assert changed == []


def test_an_import_time_path_that_cannot_be_repointed_is_named(tmp_path_factory):
    run, changed = _run(tmp_path_factory, "stuck", STUCK, *EARLY, "-o", "canarchy_scan_packages=stuckpkg")
    messages = run.messages("test_one")
    assert run.outcomes("test_one") == {"error"}, run.output
    assert "stuckpkg.flags.ARGS" in messages and "cannot be re-pointed" in messages
    assert changed == []


def test_code_at_the_top_of_the_initial_conftest_is_refused_too(tmp_path_factory):
    """With -p the session layer starts before the initial conftests are imported."""
    base = tmp_path_factory.mktemp("conftest-top")
    pristine = make_operator_home(base / "pristine")
    run = run_child(base, CONFTEST_TOP, *EARLY, env={"CHILD_OPERATOR_HOME": str(base / "operator-home")})
    changed = content_differences(pristine, run.home)
    assert run.returncode != 0 and "<import of the initial conftest.py files> tried to mkdir" in run.output, run.output
    assert "test_anything" not in run.results
    assert changed == []


def _containment_or_skip() -> None:
    report = containment.probe()
    view = report.protection("mount view")
    if view is None or not view.in_force:
        pytest.skip(f"no containment on this machine: {report.reason}")


def _this_run_s_mount_view(request: pytest.FixtureRequest) -> containment.Report:
    """This pytest run's containment report; the test skips where its mount view is not in force."""
    report = request.config.stash[_RUN].containment
    view = report.protection("mount view") if report is not None else None
    if view is None or not view.in_force:
        pytest.skip("this run has no mount view (an xdist worker, or the containment is off or not possible)")
    return report


def test_a_can_adapter_s_device_node_is_unreachable_under_the_containment(request):
    """A serial or USB CAN adapter is reached through its device node, which no network namespace stops
    (python-can's slcan through pyserial; a shell's ``printf > /dev/ttyACM0``). Under this run's mount view
    each such node present at the start is an empty read-only file, for the test and a shell child alike.
    Nothing here opens one: were the cover missing, an open would reach the device."""
    report = _this_run_s_mount_view(request)
    devices = protection.can_adapter_devices()
    if not devices:
        pytest.skip("no serial or USB device node on this machine")
    assert set(devices) <= set(report.covered), report.covered
    kinds = {d: stat.S_IFMT(os.stat(d).st_mode) for d in devices}
    assert all(kind in (stat.S_IFREG, stat.S_IFDIR) for kind in kinds.values()), kinds
    shell = subprocess.run(["sh", "-c", 'for d in "$@"; do [ -c "$d" ] && echo "$d"; done; exit 0', "sh", *devices],
                           capture_output=True, text=True, timeout=30)
    assert shell.stdout == "", shell.stdout


def test_a_python_open_of_a_can_adapter_s_device_node_is_refused_at_the_moment(request, access_guard):
    """The access guard refuses a CAN adapter's device node before the open happens, naming the test: the
    protection for a run without the containment (an adopter's default). Run only where this run's mount
    view also covers the node, so that a guard that failed to refuse would meet the empty cover, never the
    device."""
    report = _this_run_s_mount_view(request)
    devices = [d for d in protection.can_adapter_devices() if d in report.covered]
    if not devices:
        pytest.skip("no CAN adapter's device node under this run's mount view")
    with pytest.raises(OperatorStateRefused) as refused:
        open(devices[0], "rb").close()
    [record] = access_guard.take_refusals()
    assert (record.resolved, record.zone) == (os.path.realpath(devices[0]), "refused")
    message = str(refused.value)
    assert request.node.nodeid in message and "a CAN adapter's device node" in message and "virtual" in message


def test_a_shell_an_env_i_child_and_a_c_level_open_find_the_operator_state_empty(tmp_path_factory):
    _containment_or_skip()
    base = tmp_path_factory.mktemp("contained")
    home = make_operator_home(base / "pristine")
    files = {"test_contained.py": CONTAINED, ".git/hooks/README": "", ".venv/pyvenv.cfg": "home = /usr/bin\n",
             ".venv/lib/python3.11/site-packages/README": "",
             "can.ini": "[default]\nchannel = INI-SECRET\n", ".canarchy/sessions/lab.json": '{"SECRET": 1}\n',
             "pyproject.toml": "[tool.pytest.ini_options]\ncanarchy_containment = true\n"}
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x43414E00 + os.getpid() % 256  # a System V shared memory segment of a process outside
    segment = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
    assert segment >= 0, os.strerror(ctypes.get_errno())
    import platform

    from canarchy.testing.isolation import kernel
    keyctl = kernel.KEYCTL.get(platform.machine(), 0)
    add_key = {250: 248, 288: 286, 219: 217}.get(keyctl)  # add_key(2) beside keyctl(2) in each table
    description = f"canarchy-operator-key-{os.getpid()}"
    operator_key = 0
    if add_key:  # in this run's own session keyring, which the child pytest starts with
        operator_key = libc.syscall(ctypes.c_long(add_key), b"user", description.encode(), b"OPERATOR-KEY",
                                    ctypes.c_size_t(12), ctypes.c_long(-3))
        assert operator_key > 0, os.strerror(ctypes.get_errno())
    # listening before the child pytest starts, as a daemon outside; in a short directory of its own: a Unix
    # socket's path holds at most 107 bytes, and a lane's temporary trees nest deep
    where = tempfile.mkdtemp(prefix="canarchy-daemon-", dir="/tmp")
    stop = threading.Event()
    ancestor_thread = threading.Thread(target=stop.wait, daemon=True)  # a thread of a process above the run
    ancestor_thread.start()
    try:
        daemon = socket.socket(socket.AF_UNIX)
        daemon.bind(os.path.join(where, "d.sock"))
        daemon.listen()
        daemon.setblocking(False)
        with daemon:
            run = run_child(base, files, *EARLY, env={"CHILD_REAL_CONFIG": str(base / "operator-home" / ".canarchy"
                                                                                / "config.toml"),
                                                      "CHILD_HOST_SOCKET": os.path.join(where, "d.sock"),
                                                      "CHILD_SHM_KEY": str(key), "CHILD_KEY": description,
                                                      "CHILD_KEYCTL": str(keyctl if add_key else ""),
                                                      "CHILD_ANCESTOR_THREAD": str(ancestor_thread.native_id)})
            with pytest.raises(BlockingIOError):
                daemon.accept()  # nothing reached it
    finally:
        stop.set()
        ancestor_thread.join()
        shutil.rmtree(where, ignore_errors=True)
    libc.shmctl(segment, 0, None)  # IPC_RMID
    if operator_key > 0:
        libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(9), ctypes.c_long(operator_key), ctypes.c_long(-3))  # UNLINK
    for test in ("test_a_daemon_outside_is_out_of_reach_through_its_socket",
                 "test_system_v_ipc_outside_is_out_of_reach", "test_the_operator_s_session_keyring_is_not_the_run_s",
                 "test_pytest_s_memory_is_out_of_reach_of_what_a_test_starts",
                 "test_the_kernel_s_settings_are_read_only_but_the_run_s_own_namespaces_are_not",
                 "test_a_shell_child_reads_nothing_and_cannot_write", "test_an_env_i_child_reads_nothing",
                 "test_a_c_level_open_reads_nothing",
                 "test_a_shell_finds_the_working_directory_s_python_can_ini_and_canarchy_sessions_empty",
                 "test_a_shell_finds_pytest_s_memory_and_the_environment_above_it_empty",
                 "test_the_checkout_s_git_directory_and_the_interpreter_cannot_be_planted_in"):
        assert run.outcomes(test) == {"passed"}, run.output
    assert content_differences(home, run.home) == []


MOUNTS_OVER_PROC = """
import os, subprocess

def test_hides_a_process_that_acts_later_under_a_mount_over_its_proc_entry():
    me, late = os.getpid(), os.environ["CHILD_LATE"]
    later = subprocess.Popen(["sh", "-c", f"while kill -0 {me} 2>/dev/null; do sleep 0.05; done; echo x > {late}"],
                             start_new_session=True, stdin=subprocess.DEVNULL)
    open(os.environ["CHILD_HIDDEN_PID"], "w").write(str(later.pid))
    subprocess.run(["mount", "-t", "tmpfs", "none", f"/proc/{later.pid}"], check=True)
    assert not os.path.exists(f"/proc/{later.pid}/stat")  # out of the process table's sight

def test_hides_pytest_s_own_proc_entry():
    subprocess.run(["mount", "-t", "tmpfs", "none", f"/proc/{os.getpid()}"], check=True)
"""


def test_a_mount_a_test_makes_over_proc_is_removed_and_named_and_what_it_hid_is_stopped(tmp_path_factory):
    """A test's shell child may mount in the run's mount view (new mounts on top of the locked ones): a tmpfs
    over /proc/PID hides that process from the last look, one over pytest's own entry hides every process.
    The last look detaches each mount made during the run, names it, and then finds and stops the process."""
    _containment_or_skip()
    if os.geteuid() != 0:
        pytest.skip("an ordinary user's processes lose the namespace's capabilities at exec: a shell cannot mount")
    base = tmp_path_factory.mktemp("mounts")
    files = {"test_mounts.py": MOUNTS_OVER_PROC,
             "pyproject.toml": "[tool.pytest.ini_options]\ncanarchy_containment = true\n"}
    run = run_child(base, files, *EARLY, "-p", "no:randomly",
                    env={"CHILD_LATE": str(base / "late"), "CHILD_HIDDEN_PID": str(base / "hidden.pid")})
    hidden = int((base / "hidden.pid").read_text())
    time.sleep(0.3)  # what the hidden process would do once pytest has gone, it would have done by now
    alive = os.path.exists(f"/proc/{hidden}")
    if alive:
        os.kill(hidden, 9)
    assert not alive and not (base / "late").exists(), run.output
    assert run.returncode == 1, run.output
    after = run.output[run.output.index("canarchy isolation sentinel, after the session"):]
    assert f"a mount made during the run, removed: tmpfs on /proc/{hidden}" in after, after
    assert "a mount made during the run, removed: " in after.replace(f"/proc/{hidden}", ""), after
    assert f"left running after the session, stopped now: pid {hidden}: sh -c" in after, after


OUT_OF_REACH = """
import os
from multiprocessing import shared_memory

def test_changes_the_operator_s_shared_memory():
    shared_memory.SharedMemory(name=os.environ["CHILD_SHM"]).buf[:7] = b"CHANGED"

def test_finds_the_serial_numbers_of_the_operator_s_keys():
    assert "keyring" not in open("/proc/keys").read()
"""


def test_the_operator_s_shared_memory_and_keys_are_out_of_reach(tmp_path):
    """What the operator has beside the files the run covers: POSIX shared memory (``/dev/shm``, which a new IPC
    namespace does not reach), the kernel's list of keys (serial numbers, with which C code reads their keyrings).
    Under the containment each is out of reach: a fresh ``/dev/shm``, ``/proc/keys`` empty."""
    _containment_or_skip()
    name = f"canarchy-operator-{os.getpid()}"
    segment = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(segment, b"OPERATOR")
        run = run_child(tmp_path, {"test_reach.py": OUT_OF_REACH}, "-o", "canarchy_containment=true",
                        env={"CHILD_SHM": name})
        assert os.pread(segment, 8, 0) == b"OPERATOR", run.output
        assert "FileNotFoundError" in run.messages("test_changes_the_operator_s_shared_memory"), run.output
        assert run.outcomes("test_finds_the_serial_numbers_of_the_operator_s_keys") == {"passed"}, run.output
    finally:
        os.close(segment)
        with contextlib.suppress(FileNotFoundError):  # multiprocessing's tracker in a run that reached it
            os.unlink(f"/dev/shm/{name}")


TYPES_INTO_THE_TERMINAL = """
import errno, os, subprocess, sys

TYPE = ("import fcntl, os, sys, termios\\n"
        "for path in ('/dev/tty', sys.argv[1]):\\n"
        "    try:\\n"
        "        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)\\n"
        "        for byte in b'echo TYPED-BY-A-TEST\\\\n':\\n"
        "            fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))\\n"
        "        print('typed through', path)\\n"
        "    except OSError as exc:\\n"
        "        print('refused', path, exc.errno)\\n")

def test_types_a_command_into_the_operator_s_shell():
    done = subprocess.run([sys.executable, "-I", "-c", TYPE, os.environ["CHILD_TTY"]], capture_output=True, text=True)
    assert "typed through" not in done.stdout, done.stdout

def test_a_child_that_is_not_python_has_no_controlling_terminal():  # no access guard in it, /dev/tty not covered
    done = subprocess.run(["sh", "-c", "cat /proc/self/stat; exec 3</dev/tty && echo 'opened /dev/tty'"],
                          capture_output=True, text=True)
    tty_nr = done.stdout.rpartition(")")[2].split()[4]  # proc(5): the 7th field, 0 for none
    assert tty_nr == "0" and "opened" not in done.stdout, (done.stdout, done.stderr)

def test_asks_for_the_terminal_as_getpass_does():  # none (ENXIO), not a refusal: /dev/tty is no one's here
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError as exc:
        assert exc.errno == errno.ENXIO, exc
    else:
        raise AssertionError("opened /dev/tty")
"""


def _on_a_terminal(base: Path, test_source: str, *args: str, leader: bool = False) -> tuple[int, str, list[int]]:
    """Run pytest on ``test_source`` (containment on) from a shell leading its session on a new pty, as a
    terminal window starts one (``leader``: the shell execs pytest, which then leads the session): ``(exit code,
    what the terminal showed, the pty's termios attributes and its description's status flags after the run)``."""
    import fcntl
    import pty
    import select
    import termios

    project = base / "project"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["canarchy.testing.isolation.plugin"]\n')
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\ncanarchy_containment = true\n")
    (project / "test_tty.py").write_text(test_source)
    master, slave = pty.openpty()
    env = {**operator_environment(make_operator_home(base), True), "CHILD_TTY": os.ttyname(slave)}

    def with_the_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    command = shlex.join([*PYTEST, "-q", "-p", "no:randomly", "--color=no", "--rootdir", str(project), *args])
    kept = os.dup(slave)  # pytest's standard streams share this description: its flags are the shell's
    try:  # the shell runs pytest as its child (not exec): pytest shares the shell's session and terminal
        proc = subprocess.Popen(["sh", "-c", f"exec {command}" if leader else f"{command}; code=$?; exit $code"],
                                cwd=project, env=env,
                                stdin=slave, stdout=slave, stderr=slave, preexec_fn=with_the_terminal)
        os.close(slave)
        output, deadline = b"", time.monotonic() + 120
        while time.monotonic() < deadline:  # this process holds the pty open too: no end of file to wait for
            if select.select([master], [], [], 0.2)[0]:
                output += os.read(master, 65536)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=1)
        settings = [termios.tcgetattr(kept)[3], fcntl.fcntl(kept, fcntl.F_GETFL)]
    finally:
        os.close(master)
        os.close(kept)
    return code, output.decode(errors="replace"), settings


def test_no_process_a_test_starts_can_type_into_the_operator_s_terminal(tmp_path_factory):
    """A process with pytest's controlling terminal may push keystrokes into it (TIOCSTI): the operator's shell
    would run them once pytest has exited. pytest gives the terminal up as it starts, so a process a test starts
    has none: a shell child cannot open ``/dev/tty`` (ENXIO), and no layer but that one stops a child that is not
    Python from typing through it (the access guard refuses the ioctl in a Python child; the containment covers
    the terminal's node, not ``/dev/tty``). The terminal's device, opened by path, is not its own (TIOCSTI then
    needs privileges the run's user namespace does not have)."""
    _containment_or_skip()
    code, text, _ = _on_a_terminal(tmp_path_factory.mktemp("tty"), TYPES_INTO_THE_TERMINAL)
    assert code == 0 and "3 passed" in text, text
    assert "TYPED-BY-A-TEST" not in text, text  # typed input would be echoed by the terminal


CHANGES_THE_TERMINAL = """
import fcntl, os, subprocess, termios

def pytest_s_terminal():  # pytest's own copy of a standard stream it captures
    return next(fd for fd in range(3, 256) if os.path.exists(f"/proc/self/fd/{fd}") and os.isatty(fd))

def test_types_through_pytest_s_descriptor():
    for byte in b"echo TYPED-" + b"THROUGH-PYTEST\\n":  # split: a traceback shows this line
        fcntl.ioctl(pytest_s_terminal(), termios.TIOCSTI, bytes([byte]))

def test_turns_the_echo_off():
    attributes = termios.tcgetattr(pytest_s_terminal())
    attributes[3] &= ~termios.ECHO
    termios.tcsetattr(pytest_s_terminal(), termios.TCSANOW, attributes)

def test_makes_the_terminal_non_blocking():
    fd = pytest_s_terminal()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

def test_opens_the_terminal_by_its_path():
    os.close(os.open(os.environ["CHILD_TTY"], os.O_RDWR | os.O_NOCTTY))

def test_a_shell_turns_the_echo_off():
    subprocess.run(["sh", "-c", 'stty -echo < "$CHILD_TTY"'])

def test_reads_its_settings():
    termios.tcgetattr(pytest_s_terminal())
"""


def test_a_change_to_the_operator_s_terminal_is_refused_and_the_terminal_left_as_it_was(tmp_path_factory):
    """A setting of the terminal pytest was started on stays after pytest exits (no echo, raw mode, a
    non-blocking description the shell shares), and what is typed into it the shell runs: a change through a
    descriptor pytest holds of it (termios, fcntl, ioctl) is refused at that moment, naming the test; its
    device node is refused by path, and under the containment covered, so a shell child finds no terminal."""
    import termios

    _containment_or_skip()
    code, text, (local_modes, flags) = _on_a_terminal(tmp_path_factory.mktemp("tty"), CHANGES_THE_TERMINAL)
    assert code == 1 and "4 failed, 2 passed" in text, text  # the shell's stty and the read pass
    for test, operation in (("types_through_pytest_s_descriptor", "(ioctl 0x5412)"),
                            ("turns_the_echo_off", "(tcsetattr)"), ("makes_the_terminal_non_blocking", "(fcntl 0x4)")):
        assert f"test_tty.py::test_{test} tried to change the terminal {operation} through" in text, text
    assert "test_tty.py::test_opens_the_terminal_by_its_path tried to open for writing '/dev/pts/" in text, text
    assert "the operator's terminal (/dev/pts/" in text, text
    assert local_modes & termios.ECHO and not flags & os.O_NONBLOCK, text
    assert "TYPED-THROUGH-PYTEST" not in text, text


def test_the_controlling_terminal_is_found_by_its_device_number_not_as_dev_tty(tmp_path):
    """``ttyname`` of an open ``/dev/tty`` answers ``/dev/tty``, which is no one terminal: refusing it would refuse
    a test that only asks for its own controlling terminal (``getpass``), which has none once pytest gave the
    operator's up. The node is found by ``tty_nr`` of ``/proc/self/stat`` (the kernel's encoding)."""
    import pty

    master, slave = pty.openpty()
    try:
        rdev = os.fstat(slave).st_rdev
        minor = os.minor(rdev)
        number = (minor & 0xFF) | (os.major(rdev) << 8) | ((minor & ~0xFF) << 12)
        stat_file = tmp_path / "stat"
        for tty_nr, expected in ((number, [os.ttyname(slave)]), (0, []), ("x", [])):
            stat_file.write_text(f"1 (a) b) S 0 1 1 {tty_nr} -1 4194304\n")  # a command name with ") "
            assert protection.controlling_terminal(str(stat_file)) == expected, tty_nr
        assert protection.controlling_terminal(str(tmp_path / "none")) == []
    finally:
        os.close(master)
        os.close(slave)


KEEPS_THE_TERMINAL = """
import fcntl, os, termios

def test_types_through_dev_tty():
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)  # opened: not refused, a read changes nothing
    for byte in b"echo TYPED-" + b"THROUGH-DEV-TTY\\n":  # split: a traceback shows this line
        fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))

def test_turns_the_echo_off_through_dev_tty():
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    attributes = termios.tcgetattr(fd)
    attributes[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, attributes)
"""


def test_a_pytest_that_leads_its_session_keeps_dev_tty_from_its_tests(tmp_path_factory):
    """pytest leading its session cannot give its terminal up (the header says so): ``/dev/tty`` then names the
    operator's terminal for pytest and every process a test starts, and a change through it is refused."""
    import termios

    _containment_or_skip()
    code, text, (local_modes, _) = _on_a_terminal(tmp_path_factory.mktemp("tty"), KEEPS_THE_TERMINAL, "-v",
                                                  leader=True)  # -q -v: the header, where the plugin says so
    assert code == 1 and "2 failed" in text, text
    assert "pytest leads its session (setsid), so the processes a test starts keep its terminal: a change to it " \
           "through /dev/tty is refused, but a program that is not Python can type into it there" in text, text
    for test, operation in (("types_through_dev_tty", "(ioctl 0x5412)"), ("turns_the_echo_off_through_dev_tty",
                                                                           "(tcsetattr)")):
        assert f"test_tty.py::test_{test} tried to change the terminal {operation} through" in text, text
    assert local_modes & termios.ECHO, text
    assert "TYPED-THROUGH-DEV-TTY" not in text, text


def test_a_module_without_the_required_import_is_a_collection_error(tmp_path_factory):
    files = {"test_with.py": "import canarchy.testing.required  # noqa: F401\n\ndef test_a():\n    pass\n",
             "test_without.py": "def test_b():\n    pass\n"}
    run, _ = _run(tmp_path_factory, "required", files, *EARLY, "-o", "canarchy_require_import=true")
    assert run.returncode == 2 and "test_b" not in run.results, run.output  # a collection error stops the run
    assert "test_without.py does not import canarchy.testing.required" in run.output


def test_a_stray_configuration_that_loses_the_plugin_s_settings_is_refused(tmp_path_factory):
    """A tests/pytest.ini shadows pyproject.toml's [tool.pytest.ini_options] for `pytest tests`."""
    files = {"pyproject.toml": '[tool.pytest.ini_options]\naddopts = ["-p", "canarchy.testing.isolation.plugin"]\n'
                               "canarchy_require_import = false\ncanarchy_test_cwd = \"rootdir\"\n",
             "tests/pytest.ini": "[pytest]\nxfail_strict = true\n",
             "tests/conftest.py": 'pytest_plugins = ["canarchy.testing.isolation.plugin"]\n',
             "tests/test_a.py": "def test_a():\n    pass\n"}
    run, _ = _run(tmp_path_factory, "stray", files, "tests")
    assert run.returncode == 4, run.output
    assert "tests/pytest.ini shadows the project's configuration in" in run.output
    assert "canarchy_test_cwd" in run.output and "addopts (-p canarchy.testing.isolation.plugin)" in run.output


@pytest.fixture(scope="module")
def bytecode(tmp_path_factory):
    """A run in which the import system writes byte code (as in an operator's plain ``pytest``), in a
    git checkout that ignores what a checkout usually ignores."""
    base = tmp_path_factory.mktemp("bytecode")
    (base / "project").mkdir()
    (base / "project" / ".gitignore").write_text("__pycache__/\n*.py[cod]\n*.egg-info/\n*.so\n.hypothesis/\n"
                                                 "/tools-venv/\n.hatch/\n/dist/\n/reports/\n")
    subprocess.run(["git", "init", "-q", str(base / "project")], check=True)
    for built in ("dist/built.whl", "reports/unit.xml"):  # what a build and a lane left, git ignores
        (base / "project" / built).parent.mkdir()
        (base / "project" / built).write_text("built before the run")
    log = base / "project" / "own" / "own.log"
    return run_batch(base, BYTECODE, *EARLY, env={"PYTHONDONTWRITEBYTECODE": "",
                                                 "PYTEST_CANARCHY_OWN_OUTPUT": str(log)})


@pytest.mark.parametrize("test, operation", [("test_writes_byte_code_into_the_checkout", "mkdir"),
                                             ("test_compiles_into_the_checkout", "mkdir"),
                                             ("test_writes_a_sourceless_module_at_the_top", "open for writing")])
def test_byte_code_written_into_the_checkout_is_refused_at_the_moment(bytecode, test, operation):
    """Byte code in a checkout's ``__pycache__`` (ignored by git) runs at the next import, outside any
    isolation: only the import system caching what it compiled may write it."""
    run, changed = bytecode
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, run.output
    assert f"test_bytecode.py::{test} tried to {operation}" in messages and "byte code not written by the import " \
        "system" in messages, messages
    cache = run.home.parent / "project" / "bcpkg" / "__pycache__"
    assert not list(cache.glob("planted.*")) and not list(cache.glob("compiled.*"))
    assert changed == []


def test_a_pytest_plugin_planted_in_an_ignored_directory_is_refused_at_the_moment(bytecode):
    """A distribution's metadata in the checkout (``*.egg-info``, ignored by git) is found on ``sys.path``
    by the next ``python -m pytest``, which loads its ``pytest11`` entry point before any isolation."""
    run, _ = bytecode
    test = "test_plants_a_pytest_plugin_for_the_next_run"
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, run.output
    assert f"test_bytecode.py::{test} tried to mkdir" in messages and "a later Python or pytest run loads" \
        in messages, messages
    assert not (run.home.parent / "project" / "planted.egg-info").exists()


@pytest.mark.parametrize("test, name, words", [
    *((f"test_writes_pytest_s_configuration[{n}]", n, "a later Python or pytest run loads")
      for n in PYTEST_CONFIGURATION),
    *((f"test_writes_a_tool_s_start_up_file[{n}]", n, "a tool of the project's runs from it") for n in TOOL_START_UP),
], ids=[*PYTEST_CONFIGURATION, *TOOL_START_UP])
def test_pytest_s_configuration_written_into_the_checkout_is_refused_at_the_moment(bytecode, test, name, words):
    """Every file name pytest takes its configuration from (pytest 9: ``_pytest.config.findpaths.locate_config``),
    in any directory of the checkout: the next ``pytest tests/`` there reads its ``addopts`` before any isolation;
    and what the project's tools run from it (uv's index, pyenv's interpreter, pdb's commands, nox's sessions, a
    build script, pre-commit's hooks, direnv's shell code, an editor's tasks) at the operator's next use."""
    run, _ = bytecode
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, run.output
    assert "tried to" in messages and words in messages, messages
    assert not (run.home.parent / "project" / "nsdir" / name).exists()


@pytest.mark.parametrize("test, path", [
    ("test_plants_a_module_in_a_virtual_environment_of_the_checkout", "planted_module.py"),
    ("test_plants_a_script_in_a_nested_virtual_environment_of_the_checkout", "activate"),
], ids=["checkout-venv", "nested-venv"])
def test_a_module_planted_where_a_later_python_loads_code_is_refused_at_the_moment(bytecode, test, path):
    """A virtual environment in the checkout (ignored by git; the next ``nox -R`` or ``.venv/bin/python``
    starts it) is read-only: what is planted there runs later, outside any isolation."""
    run, _ = bytecode
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, run.output
    assert f"{test} tried to open for writing" in messages and path in messages and \
        "where a later Python loads code from" in messages, messages
    project = run.home.parent / "project"
    assert not (project / "tools-venv" / "lib" / "python3.11" / "site-packages" / path).exists()
    assert not (project / ".hatch" / "dev" / "bin" / "activate").exists()


def test_a_path_file_a_shell_planted_in_a_virtual_environment_of_the_checkout_fails_the_run(bytecode):
    """No guard judges a shell; the sentinel looks at the top of each site-packages of the checkout's virtual
    environments, where a ``.pth`` file runs at every start of that environment's Python."""
    run, _ = bytecode
    assert "added: tools-venv/lib/python3.11/site-packages/shell.pth" in run.output, run.output
    assert "added: .hatch/dev/lib/python3.11/site-packages/shell.pth" in run.output, run.output
    assert "installed.py" not in run.output, run.output


def test_byte_code_a_child_python_cached_from_a_replaced_loader_is_removed_and_named(bytecode):
    """The child runs under the guard, so its import may cache byte code in the checkout; what it cached is
    checked in pytest's process, against the source compiled by the plugin's own compiler."""
    run, _ = bytecode
    test = "test_a_child_python_caches_what_a_replaced_loader_compiled"
    messages = run.messages(test)
    assert "error" in run.outcomes(test), run.output
    assert "childmod.cpython" in messages and "not the compilation of" in messages and "removed" in messages, messages
    assert not list((run.home.parent / "project" / "bcpkg" / "__pycache__").glob("childmod.*"))


def test_a_pytest_plugin_a_shell_planted_in_an_ignored_directory_fails_the_run(bytecode):
    """No guard judges a shell; the sentinel looks at what a later run loads unasked, ignored by git or not."""
    run, _ = bytecode
    assert run.returncode != 0 and "shell.egg-info/entry_points.txt" in run.output, run.output
    assert "added: pprint.pyc" in run.output, run.output  # git ignores *.py[cod]; the next import runs it
    # in a package: a cache with its source's header (loaded instead of the source) and an extension module
    assert "byte code at bcpkg/__pycache__/shellmod." in run.output and "added: bcpkg/shell_ext." in run.output, \
        run.output
    assert "bcpkg/__pycache__/imported." not in run.output, run.output  # the import system's own: no change
    # compared once when an import cached it, then rewritten in place with its size and mtime kept
    assert "byte code at bcpkg/__pycache__/rewritten." in run.output, run.output
    project = run.home.parent / "project"
    assert not list(project.glob("bcpkg/__pycache__/shellmod.*")) and not list(project.glob("bcpkg/__pycache__/rew*"))


def test_byte_code_a_shell_planted_beside_a_module_outside_any_package_is_removed_and_fails_the_run(bytecode):
    """A directory of code that is no regular package (a namespace package, a directory on a child Python's
    ``PYTHONPATH``) is imported from too: the byte code a shell forged there with its source's size and time,
    which the next import would run instead of the source, is found at the session's end and removed."""
    run, _ = bytecode
    assert run.returncode != 0, run.output
    assert "byte code at nsdir/__pycache__/nsmod." in run.output and "not the compilation of" in run.output, \
        run.output
    assert "removed (the next import of its module would have run it)" in run.output, run.output
    assert not list((run.home.parent / "project").glob("nsdir/__pycache__/nsmod.*"))


def test_what_a_shell_hides_from_git_where_an_import_finds_it_fails_the_run(bytecode):
    """No guard judges a shell: a module it plants at a top of ``sys.path`` that is no package (``tests/``, there
    for its conftest), a namespace package and a package beside it, hidden by a ``.gitignore``, and git's rules in
    a directory of its view: git shows none, the sentinel each (the next ``import msgpack`` would run the module)."""
    run, _ = bytecode
    assert run.outcomes("test_a_shell_hides_code_from_git_where_an_import_finds_it") == {"passed"}, run.output
    shown = run.output.splitlines()
    for line in ("added: tests/.gitignore", "added: tests/msgpack.py", "added: tests/ns", "added: tests/planted",
                 "added: tests/planted/__init__.py", "added: nsdir/.gitattributes", "added: nsdir/.gitignore"):
        assert f"  {line}" in shown, (line, run.output)


@pytest.mark.parametrize("test, operation, words, planted", [
    ("test_hides_a_package_behind_its_own_gitignore", "open for writing", "version control's own files",
     "shadow/.gitignore"),
    ("test_makes_a_repository_of_its_own_in_the_checkout", "mkdir", "version control's own files", ".git"),
    ("test_takes_a_descriptor_of_a_checkout_directory", "open a descriptor of the directory",
     "a descriptor of a directory where writes are judged", "opened.py"),
    ("test_walks_the_checkout_by_descriptor", "open a descriptor of the directory",
     "a descriptor of a directory where writes are judged", "walked.py"),
    ("test_climbs_out_of_its_own_directory_by_descriptor", "open for writing", "version control's own files",
     ".gitignore"),
    ("test_moves_in_a_directory_holding_a_gitignore", "rename to", "version control's own files",
     "moved-vc"),
], ids=["gitignore", "nested-git", "dir-fd", "fwalk", "dir-fd-climbing", "moved-in"])
def test_what_would_hide_a_write_from_git_or_the_guard_is_refused_at_the_moment(bytecode, test, operation, words,
                                                                                 planted):
    """A ``.gitignore`` or a ``.git`` of its own hides what a test plants from git and so from the sentinel (and
    a nested ``.git/config`` runs in the operator's next git); a directory descriptor hides it from the guard."""
    run, _ = bytecode
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, run.output
    assert f"test_hiding.py::{test} tried to {operation}" in messages and words in messages, messages
    assert not (run.home.parent / "project" / "bcpkg" / planted).exists()


def test_a_write_left_where_git_does_not_show_it_fails_its_test(bytecode):
    """An ignored ``imported.so`` runs ahead of ``imported.py`` at the next import; neither git nor the
    sentinel shows it. Written and removed, an ignored file is no leftover."""
    run, _ = bytecode
    test = "test_leaves_an_extension_module_where_git_ignores_it"
    assert "error" in run.outcomes(test), run.output  # its call passed; its teardown fails it
    assert f"test_hiding.py::{test} left in the checkout, where git does not show it" in run.messages(test)
    assert "bcpkg/imported.so" in run.messages(test), run.messages(test)
    test = "test_moves_in_a_directory_holding_an_ignored_module"  # beside a file git shows
    assert "error" in run.outcomes(test) and "bcpkg/moved/inner/imported.so" in run.messages(test), run.output
    for test in ("test_writes_an_ignored_file_and_removes_it", "test_walks_and_removes_a_tree_of_its_own",
                 "test_writes_hypothesis_s_database_in_the_rootdir"):  # a tool's cache, not a leftover
        assert run.outcomes(test) == {"passed"}, run.messages(test)


def test_what_a_test_removes_where_git_does_not_show_it_fails_its_test(bytecode):
    """A built wheel, a lane's report, ``.coverage``: git ignores them, so neither git nor the sentinel finds
    them gone. A test that removes one fails, naming it; removing what is not there removes nothing."""
    run, _ = bytecode
    test = "test_removes_an_ignored_report_and_a_built_wheel"
    messages = run.messages(test)
    assert "error" in run.outcomes(test), run.output  # its call passed; its teardown fails it
    assert f"test_hiding.py::{test} removed from the checkout what git does not show" in messages, messages
    assert "dist/built.whl" in messages and "reports" in messages, messages
    assert run.outcomes("test_removes_nothing_that_is_there") == {"passed"}, run.messages(test)


def test_the_run_s_own_outputs_are_left_out_of_the_sentinel_s_look(bytecode):
    """What whoever runs pytest names in PYTEST_CANARCHY_OWN_OUTPUT (a lane's log) is not the checkout's change."""
    run, _ = bytecode
    assert "the test run changed the checkout" in run.output, run.output  # the sentinel did look (pprint.pyc)
    assert "own.log" not in run.output and "  added: own" not in run.output, run.output  # nor its new directory


def test_an_import_still_caches_its_byte_code_in_the_checkout(bytecode):
    run, _ = bytecode
    assert run.outcomes("test_an_import_caches_its_byte_code") == {"passed"}, run.output


def test_byte_code_compiled_by_a_replaced_compiler_is_removed_and_named(bytecode):
    """Put back before the test ends, the replaced compiler leaves no trace in the seal; the cached
    byte code is compared with the source compiled by the plugin's own compiler instead."""
    run, _ = bytecode
    test = "test_a_compile_replaced_and_put_back"
    messages = run.messages(test)
    assert run.outcomes(test) & {"failed", "error"}, run.output
    assert "tampered.cpython" in messages and "not the compilation of" in messages and "removed" in messages, messages
    assert not list((run.home.parent / "project").glob("bcpkg/__pycache__/tampered.*"))


LATE_HANDLER = """
import importlib.machinery, logging, os

class WritesWhenClosed(logging.Handler):  # logging.shutdown closes it after every other atexit handler
    def emit(self, record):
        pass

    def close(self):
        open(os.path.join(os.environ["CHILD_ROOT"], "coverage.data"), "w").close()  # ignored, at the top: passes
        target = os.environ["CHILD_TARGET"].replace("EXTENSION", importlib.machinery.EXTENSION_SUFFIXES[0])
        open(os.path.join(os.environ["CHILD_ROOT"], target), "w").close()
        super().close()

def test_leaves_a_logging_handler():  # logging's atexit handler was registered before the plugin's start
    logging.getLogger("late").addHandler(WritesWhenClosed())
"""


@pytest.mark.parametrize("ini, args", [
    ("[pytest]\ncanarchy_network_namespace = true\n", ()),
    ("[pytest]\ncanarchy_containment = true\ncanarchy_network_namespace = true\n",
     ("-o", "canarchy_containment=false")),
], ids=["network-only-ini", "containment-off-by-o"])
def test_a_network_namespace_without_the_mount_view_leaves_the_sentinel_comparing(tmp_path, ini, args):
    """A private network without the containment's mount view: the header says the mount view is off, and a
    shell child's write of the operator's state (which only the mount view would have stopped) fails the run,
    listed by the sentinel."""
    files = {"test_shell.py": """
        import os, subprocess
        def test_a_shell_rewrites_the_operator_s_config():
            target = os.path.join(os.environ["CHILD_OPERATOR_HOME"], ".canarchy", "config.toml")
            subprocess.run(["sh", "-c", f"echo pwned > '{target}'"], check=False)
    """, "pytest.ini": ini}
    run = run_child(tmp_path, files, *args, "-v", "-p", "no:randomly",  # -v: the header
                    env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    assert (run.home / ".canarchy" / "config.toml").read_text() == "pwned\n", run.output  # nothing stopped it
    assert "containment: mount view: off (canarchy_containment is false)" in run.output, run.output
    assert "containment: partly in force (mount view: not asked for" in run.output, run.output
    assert run.returncode == 1, run.output
    assert "changed the operator's state" in run.output and "/.canarchy/config.toml" in run.output, run.output


def test_a_plugin_a_test_leaves_registered_fails_it_and_never_runs_its_hooks(tmp_path):
    """A test that registers a pytest plugin and leaves it registered had its hooks run after it: at the
    session's end a ``pytest_sessionfinish`` wrote into ``build/`` of the checkout (a directory no sentinel
    looks in), unnamed and unrefused. The test now fails, naming the plugin, which is unregistered there."""
    run = run_child(tmp_path, {"test_plugin.py": """
        import os

        class Late:
            def pytest_sessionfinish(self, session):
                os.makedirs(os.path.join(str(session.config.rootpath), "build", "lib"), exist_ok=True)
                open(os.path.join(str(session.config.rootpath), "build", "lib", "planted.py"), "w").close()

        def test_registers_a_plugin(request):
            request.config.pluginmanager.register(Late(), "late-writer")

        def test_registers_and_unregisters_one(request):
            plugin = Late()
            request.config.pluginmanager.register(plugin, "tidy")
            request.config.pluginmanager.unregister(plugin)

        def test_after(request):
            assert request.config.pluginmanager.get_plugin("late-writer") is None
    """}, "-p", "no:randomly")
    messages = run.messages("test_registers_a_plugin")
    assert "error" in run.outcomes("test_registers_a_plugin"), run.output
    assert "test_plugin.py::test_registers_a_plugin left pytest plugin(s) registered: late-writer" in messages
    assert run.outcomes("test_registers_and_unregisters_one") == run.outcomes("test_after") == {"passed"}, run.output
    assert not (tmp_path / "project" / "build").exists()


def test_a_directory_reached_through_a_link_whose_target_moves_is_resolved_again(tmp_path):
    """``/proc/self/cwd`` names the working directory, and a link to it does too: the guard remembered such a
    directory where it resolved first, so after a chdir into the operator's home the test read and wrote the
    operator's state, judged at the old place (no audit event says such a link moved: dup2 for /proc/self/fd)."""
    run = run_child(tmp_path, {"test_moving.py": """
        import os
        HOME = os.environ["CHILD_OPERATOR_HOME"]

        def test_warms_up():
            pass

        def test_through_the_working_directory_s_name(tmp_path):
            os.chdir(tmp_path)
            (tmp_path / ".canarchy").mkdir()
            open("/proc/self/cwd/.canarchy/here", "w").close()  # /proc/self/cwd/.canarchy: tmp_path's
            os.chdir(HOME)
            open("/proc/self/cwd/.canarchy/config.toml").close()

        def test_through_a_link_to_it(tmp_path):
            os.symlink("/proc/self/cwd", tmp_path / "cwd")
            os.chdir(tmp_path)
            (tmp_path / ".canarchy").mkdir()
            open(tmp_path / "cwd" / ".canarchy" / "here", "w").close()
            os.chdir(HOME)
            open(tmp_path / "cwd" / ".canarchy" / "config.toml", "a").close()
    """}, "-p", "no:randomly", "-o", "canarchy_containment=false",
        env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    assert run.outcomes("test_warms_up") == {"passed"}, run.output
    for name, what in (("test_through_the_working_directory_s_name", "tried to open for reading"),
                       ("test_through_a_link_to_it", "tried to open for writing")):
        assert "failed" in run.outcomes(name), run.output
        assert what in run.messages(name) and ".canarchy/config.toml" in run.messages(name), run.output
    assert run.returncode == 1, run.output


def test_pytest_started_under_another_name_is_the_program_too(tmp_path):
    """Debian's ``pytest-3``, a wrapper script: the plugin took pytest for the program by ``sys.argv[0]``'s name
    (``pytest``, ``py.test``, ``__main__.py``), so under another name it gave the operator's world back at the
    end of pytest's work, and a test's atexit handler read the operator's state and variables unrefused. Any
    program that starts pytest through its entry point (``console_main``; ``_console_main`` from pytest 9.1) is
    pytest's program."""
    launcher = tmp_path / "bin" / "pytest-3"
    launcher.parent.mkdir()
    launcher.write_text("import sys, _pytest.config as config\n"  # _console_main from pytest 9.1 on
                        "sys.exit((getattr(config, '_console_main', None) or config.console_main)())\n")
    home = run_child(tmp_path / "home", {"test_late.py": """
        import atexit, os
        from pathlib import Path

        def _reads():
            leaked = os.environ.get("CAN_CHANNEL", "") + (Path(os.environ["CHILD_OPERATOR_HOME"]) / ".canarchy"
                                                          / "config.toml").read_text()
            (Path(os.environ["CHILD_OPERATOR_HOME"]) / "leaked-at-exit").write_text(leaked)

        def test_registers_a_late_read():
            atexit.register(_reads)
    """}, "-o", "canarchy_containment=false", env={"CHILD_OPERATOR_HOME": str(tmp_path / "home" / "operator-home")},
        program=(sys.executable, str(launcher), "--disable-plugin-autoload", "-p", "no:cacheprovider"))
    assert home.outcomes("test_registers_a_late_read") == {"passed"}, home.output
    late = home.output[home.output.index("canarchy isolation sentinel, after the session (after its last look)"):]
    assert "an atexit handler test_late.py::test_registers_a_late_read registered> tried" in late, late
    assert home.returncode == 1 and not (tmp_path / "home" / "operator-home" / "leaked-at-exit").exists(), late


def test_what_runs_after_the_last_look_ends_the_process_at_once(tmp_path):
    """The sentinel's last look is at the end of pytest's work, not in an atexit handler (which a test can
    clear, and before which others run). After it the guard stays on, and the first access that would
    change what it saw ends the process with exit code 1, named: a read of the operator's state (caught or
    not), a write into the checkout git does not ignore, a process started, byte code cached; a write git
    ignores passes. (An ``os._exit`` with another status: the cut-short test.)"""
    home = run_child(tmp_path / "home", {"test_late.py": """
        import atexit, os
        from pathlib import Path

        def test_registers_a_late_write():
            target = Path(os.environ["CHILD_OPERATOR_HOME"]) / ".canarchy" / "written-at-exit"
            atexit.register(lambda: target.write_text("late"))

        def _swallowed():
            try:
                (Path(os.environ["CHILD_OPERATOR_HOME"]) / ".canarchy" / "config.toml").read_text()
            except Exception:
                pass

        def test_registers_a_hidden_read():  # registered last: runs first
            atexit.register(_swallowed)

        def test_registers_and_unregisters():
            atexit.register(_swallowed)
            atexit.unregister(_swallowed)  # both of its registrations go: the one above too
            atexit.register(_swallowed)
    """}, "-o", "canarchy_containment=false", env={"CHILD_OPERATOR_HOME": str(tmp_path / "home" / "operator-home")})
    assert home.outcomes("test_registers_a_hidden_read") == {"passed"}, home.output
    late = home.output[home.output.index("canarchy isolation sentinel, after the session (after its last look)"):]
    assert "<after the session: an atexit handler" in late and "tried to open for reading" in late, late
    assert "an atexit handler test_late.py::test_registers_and_unregisters registered> tried" in late, late
    assert "an atexit handler test_late.py::test_registers_a_hidden_read registered" not in late, late  # unregistered
    assert home.returncode == 1 and not (home.home / ".canarchy" / "written-at-exit").exists(), home.output

    project = tmp_path / "checkout" / "project"
    project.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".gitignore").write_text("*.data\n*.so\nbuild/\n")
    (project / "build" / "bin").mkdir(parents=True)  # ignored, like a virtualenv's
    checkout = run_child(tmp_path / "checkout", {"test_late.py": LATE_HANDLER}, env={"CHILD_ROOT": str(project),
                                                                                   "CHILD_TARGET": "LATE_NOTES.txt"})
    assert checkout.outcomes("test_leaves_a_logging_handler") == {"passed"}, checkout.output
    assert "canarchy isolation sentinel, after the session (after its last" in checkout.output, checkout.output
    late = checkout.output[checkout.output.index("canarchy isolation sentinel, after the session (after its last"):]
    assert "changed the checkout" in late and "LATE_NOTES.txt" in late and checkout.returncode == 1, late
    assert (project / "coverage.data").exists() and not (project / "LATE_NOTES.txt").exists(), checkout.output
    for target, shown in (("fileioEXTENSION", "fileio.cpython"), ("build/bin/activate", "build/bin/activate")):
        (project / "coverage.data").unlink()  # ignored, at the top, and not what an import runs: passes; these not
        shutil.rmtree(tmp_path / "checkout" / "operator-home")  # the next run's operator home, made anew
        ignored = run_child(tmp_path / "checkout", {"test_late.py": LATE_HANDLER},
                            env={"CHILD_ROOT": str(project), "CHILD_TARGET": target})
        late = ignored.output[ignored.output.index("canarchy isolation sentinel, after the session (after its last"):]
        assert "changed the checkout" in late and shown in late and ignored.returncode == 1, late
    assert not list(project.glob("fileio.*")) and not (project / "build" / "bin" / "activate").exists()

    shell = run_child(tmp_path / "shell", {"test_late.py": """
        import atexit, multiprocessing, os, subprocess

        def test_registers_a_shell_at_exit():  # the reaper ran at the last look: this one would outlive it
            atexit.register(subprocess.run, ["sh", "-c", f"echo late > {os.environ['CHILD_FILE']}"])

        def test_registers_a_spawned_process_at_exit():  # multiprocessing's spawn raises no event of CPython's
            process = multiprocessing.get_context("spawn").Process(target=os.getpid)
            atexit.register(lambda: (process.start(), process.join()))
    """}, env={"CHILD_FILE": str(tmp_path / "shell" / "project" / "LATE_FROM_A_SHELL")})
    late = shell.output[shell.output.index("canarchy isolation sentinel, after the session (after its last look)"):]
    assert "tried to start a process" in late and "multiprocessing" in late and shell.returncode == 1, late
    assert "LATE_FROM_A_SHELL" not in late  # registered first: runs last, and the process had ended before
    shell = run_child(tmp_path / "shell-only", {"test_late.py": """
        import atexit, os, subprocess

        def test_registers_a_shell_at_exit():
            atexit.register(subprocess.run, ["sh", "-c", f"echo late > {os.environ['CHILD_FILE']}"])
    """}, env={"CHILD_FILE": str(tmp_path / "shell-only" / "project" / "LATE_FROM_A_SHELL")})
    late = shell.output[shell.output.index("canarchy isolation sentinel, after the session (after its last look)"):]
    assert "tried to start a process" in late and "LATE_FROM_A_SHELL" in late and shell.returncode == 1, late
    assert not (tmp_path / "shell-only" / "project" / "LATE_FROM_A_SHELL").exists()

    imported = run_child(tmp_path / "import", {"latemod.py": "X = 1\n", "test_late.py": """
        import atexit, sys

        def _import_late():  # nothing would compare what it caches with its source any more
            sys.dont_write_bytecode = False
            import latemod

        def test_registers_an_import_at_exit():
            atexit.register(_import_late)
    """}, env={"PYTHONDONTWRITEBYTECODE": ""})
    late = imported.output[imported.output.index("canarchy isolation sentinel, after the session (after its last"):]
    assert "tried to cache byte code at" in late and "latemod." in late and imported.returncode == 1, late
    assert not list((tmp_path / "import" / "project").glob("__pycache__/latemod.*"))


def test_what_a_pytest_xdist_worker_does_at_exit_is_judged(tmp_path):
    """A worker's process ends after its pytest's work, as pytest's own does: the guards stay on, so a test's
    ``atexit`` handler that reads the operator's state there is refused (nothing of it is written out)."""
    run = run_child(tmp_path, {"test_exit.py": """
        import atexit, os

        def _late():
            with open(os.environ["CHILD_OPERATOR_CONFIG"]) as config, open(os.environ["CHILD_LEAK"], "w") as leak:
                leak.write(config.read())

        def test_registers_a_read_at_exit():
            atexit.register(_late)
    """}, "-p", "xdist", "-n", "1", "-o", "canarchy_containment=false",
        env={"CHILD_OPERATOR_CONFIG": str(tmp_path / "operator-home" / ".canarchy" / "config.toml"),
             "CHILD_LEAK": str(tmp_path / "leak.txt")})
    assert run.outcomes("test_registers_a_read_at_exit") == {"passed"}, run.output
    assert not (tmp_path / "leak.txt").exists(), run.output


def test_a_test_s_audit_hook_running_in_the_sentinel_s_work_is_judged(tmp_path):
    """A test's audit hook is called on whatever thread raises an event, the sentinel's too, while the guard
    lets the sentinel's own reads of the operator's state pass: the hook's own accesses are judged there (its
    read of ``~/.canarchy`` refused though it swallows the error), and a write it makes into the checkout
    during the last look ends the process, named."""
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    run = run_child(tmp_path, {"test_hook.py": """
        import os, sys

        LOOKS, READ = [], []

        def hook(event, args):
            if event == "subprocess.Popen" and "diff-files" in (args[1] or ()):
                LOOKS.append(event)  # the sentinel's look at the checkout: at the session's end, the last look
            elif event == "os.scandir" and isinstance(args[0], str) and args[0].endswith(".canarchy") and not READ:
                READ.append(args[0])  # the sentinel lists ~/.canarchy at the session's end
                try:
                    with open(os.path.join(args[0], "config.toml")) as config, open(os.environ["CHILD_LEAK"], "w") \\
                            as leak:
                        leak.write(config.read())
                except Exception:
                    pass
            elif event == "os.scandir" and len(LOOKS) >= 2 and not os.path.exists(os.environ["CHILD_PLANT"]):
                open(os.environ["CHILD_PLANT"], "w").close()

        def test_adds_an_audit_hook():
            sys.addaudithook(hook)
    """}, "-o", "canarchy_containment=false", env={"CHILD_LEAK": str(tmp_path / "leak.txt"),
                                                  "CHILD_PLANT": str(project / "PLANTED.txt")})
    assert run.outcomes("test_adds_an_audit_hook") == {"passed"}, run.output
    assert run.returncode == 1 and not (tmp_path / "leak.txt").exists(), run.output
    assert "tried to open for reading" in run.output and "config.toml" in run.output, run.output
    assert "canarchy isolation sentinel, after the session (after its last look)" in run.output, run.output
    late = run.output[run.output.index("canarchy isolation sentinel, after the session (after its last look)"):]
    assert "PLANTED.txt" in late and not (project / "PLANTED.txt").exists(), late


def test_the_plugin_s_own_code_a_test_s_callback_calls_during_the_guard_s_work_is_judged(tmp_path):
    """A garbage-collector callback of a test's runs on whatever thread collects, inside the guard's own judging
    too, where the harness's own code passes unjudged: the guard took the frame that raised an event for the
    whole chain, so the callback had the plugin's own file reader read the operator's state (and pytest's
    environment as it started) unrefused. Every frame up to where the thread became exempt must be the
    harness's."""
    run = run_child(tmp_path, {"test_gc.py": """
        import gc, os, sys
        from canarchy.testing.isolation import containment

        GOT = []

        def _judging():
            frame = sys._getframe(1)
            code = lambda frame: frame.f_code  # noqa: E731
            while frame is not None and not (code(frame).co_name == "hook" and "audithook" in code(frame).co_filename):
                frame = frame.f_back
            return frame is not None

        def _collecting(phase, info):
            if phase == "start" and not GOT and _judging():
                GOT.append(containment._read(os.path.join(os.environ["CHILD_OPERATOR_HOME"], ".canarchy",
                                                          "config.toml")))

        def test_reads_through_the_plugin_s_reader(tmp_path):
            gc.callbacks.append(_collecting)
            threshold = gc.get_threshold()
            gc.set_threshold(1, 1, 1)
            try:
                for number in range(200):  # each write is judged; a collection starts within one
                    (tmp_path / f"f{number}").write_text("x")
                    if GOT:
                        break
            finally:
                gc.set_threshold(*threshold)
                gc.callbacks.remove(_collecting)
            assert GOT and GOT[0] is None, GOT  # it ran, inside the judging, and read nothing
    """}, "-o", "canarchy_containment=false", env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home")})
    messages = run.messages("test_reads_through_the_plugin_s_reader")
    assert run.outcomes("test_reads_through_the_plugin_s_reader") & {"failed", "error"}, run.output
    assert "test_gc.py::test_reads_through_the_plugin_s_reader tried to open for reading" in messages, messages
    assert ".canarchy/config.toml" in messages and "Refused" in messages, messages


def test_a_standard_library_function_a_test_forged_runs_judged_in_the_harness_s_own_work(tmp_path):
    """The harness's own work passes the guard unjudged (the per-test look at a test's home, the sentinel's reads
    of the operator's state), but only the code of the plugin's own modules, known by identity. A test that puts,
    in the place of a standard-library function that work calls, code compiled under the standard library's file
    name has that code judged: its read of ``~/.canarchy`` at the test's teardown is refused, naming the test."""
    run = run_child(tmp_path, {"test_forge.py": """
        import os, sys

        SOURCE = (
            "def lstat(path, *args, **kwargs):\\n"
            "    if sys._getframe(1).f_code.co_name == 'release_test_dirs' and not DONE:\\n"
            "        DONE.append(path)\\n"
            "        try:\\n"
            "            open(os.environ['CHILD_OPERATOR_CONFIG']).close()\\n"
            "        except Exception:\\n"
            "            pass\\n"
            "    return REAL(path, *args, **kwargs)\\n")

        def test_forges_os_lstat():
            space = {"os": os, "sys": sys, "REAL": os.lstat, "DONE": []}
            exec(compile(SOURCE, os.__file__, "exec"), space)
            os.lstat = space["lstat"]

        def test_after_it():
            pass
    """}, "-o", "canarchy_containment=false",
        env={"CHILD_OPERATOR_CONFIG": str(tmp_path / "operator-home" / ".canarchy" / "config.toml")})
    test = "test_forge.py::test_forges_os_lstat"
    assert f"{test} tried to open for reading" in run.output and "config.toml" in run.output, run.output
    assert run.returncode == 1, run.output


def test_what_is_left_where_git_does_not_show_it_outside_a_test_s_body_fails_the_run(tmp_path):
    """A file written into the checkout where git ignores it, by code that is no test's body — a module at
    collection, a session fixture's teardown, a thread a test left running — fails the run, each named with
    its writer; one pytest's own session end writes there (a coverage data file) does not."""
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".gitignore").write_text(".venv/\n*.data\n")
    (project / ".venv" / "bin").mkdir(parents=True)
    run = run_child(tmp_path, {"conftest.py": """
        import os, pytest
        pytest_plugins = ["canarchy.testing.isolation.plugin"]
        ROOT = os.path.dirname(os.path.abspath(__file__))

        @pytest.fixture(scope="session")
        def session_resource():
            yield
            open(os.path.join(ROOT, ".venv", "bin", "by-a-fixture"), "w").close()

        def pytest_configure(config):  # a plugin setting up (pytest-benchmark's .benchmarks): tooling's
            open(os.path.join(ROOT, ".venv", "bin", "tooling-at-start-up"), "w").close()

        def pytest_sessionfinish(session):
            open(os.path.join(ROOT, "coverage.data"), "w").close()  # pytest's session end: tooling's
    """, "test_left.py": """
        import os, threading, time
        ROOT = os.path.dirname(os.path.abspath(__file__))
        open(os.path.join(ROOT, ".venv", "bin", "at-collection"), "w").close()

        def test_uses_the_resource(session_resource):
            pass

        def test_leaves_a_thread():
            def later():
                time.sleep(0.3)
                open(os.path.join(ROOT, ".venv", "bin", "by-a-thread"), "w").close()
            threading.Thread(target=later, daemon=True).start()

        def test_waits():  # until the thread has written (on a loaded machine, later than 0.3 s)
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(ROOT, ".venv", "bin", "by-a-thread")):
                assert time.monotonic() < deadline
                time.sleep(0.02)
    """}, "-p", "no:randomly")
    assert run.returncode == 1, run.output
    named = run.output[run.output.index("left in the checkout, where git does not show it"):]
    for name in ("at-collection", "by-a-fixture", "by-a-thread"):
        assert f".venv/bin/{name} (written by " in named, named
    assert "test_left.py::test_leaves_a_thread" in named and "coverage.data" not in named, named
    assert "tooling-at-start-up" not in named, named


def test_a_file_left_open_for_writing_writes_nothing_after_the_last_look(tmp_path):
    """A tracked module opened for appending and left with its data in the buffer (written at interpreter
    exit), and a descriptor a thread keeps to write through later: neither raises an audit event after the
    last look. The look names each, with the test that opened it, and the process ends before either writes."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "helper.py").write_text("X = 1\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "helper.py"], check=True)
    subprocess.run(["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit",
                    "-q", "-m", "start"], check=True)
    run = run_child(tmp_path, {"test_open.py": """
        import os, threading, time
        ROOT = os.path.dirname(os.path.abspath(__file__))
        KEPT = []

        def test_leaves_a_buffer_to_flush_at_exit():
            handle = open(os.path.join(ROOT, "helper.py"), "a")
            handle.write("import os; os.system('echo planted')\\n")  # in the buffer until the handle is gone
            KEPT.append(handle)

        def test_leaves_a_thread_with_a_descriptor():
            fd = os.open(os.path.join(ROOT, "notes.txt"), os.O_WRONLY | os.O_CREAT)
            os.close(os.open(os.path.join(ROOT, "notes.txt"), os.O_RDONLY))
            def later():
                time.sleep(2)
                os.write(fd, b"written after the run")
            threading.Thread(target=later, daemon=False).start()
    """})
    assert run.returncode == 1, run.output
    assert (project / "helper.py").read_text() == "X = 1\n", run.output
    assert (project / "notes.txt").read_bytes() == b"", run.output
    look = run.output[run.output.index("canarchy isolation sentinel, after the session"):]
    assert "left open for writing in the checkout" in look and "helper.py (opened by test_open.py::" in look, look
    assert "notes.txt (opened by test_open.py::test_leaves_a_thread_with_a_descriptor)" in look, look


def test_a_run_cut_short_by_its_own_process_fails_and_names_who_cut_it(tmp_path):
    """``os.exec*`` of pytest's own process is refused (caught or not); ``os._exit(0)`` in a test takes the
    sentinel's last look first, names the test and what it changed, and exits 1."""
    replaced = run_child(tmp_path / "exec", {"test_exec.py": """
        import os

        def test_replaces_pytest():
            try:
                os.execv("/bin/true", ["true"])
            except AssertionError:
                pass

        def test_after_it():
            import atexit
            atexit.register(os._exit, 0)  # after the sentinel's last look: pytest's exit status stands
    """})
    assert replaced.outcomes("test_replaces_pytest") == {"error"}, replaced.output
    assert "test_exec.py::test_replaces_pytest tried to replace the pytest process with '/bin/true'" in \
        replaced.messages("test_replaces_pytest")
    assert replaced.outcomes("test_after_it") == {"passed"}, replaced.output
    assert replaced.returncode == 1 and "tried to call 'os._exit(0)' after the sentinel's last look" in \
        replaced.output and "<after the session: an atexit handler" in replaced.output, replaced.output
    run = run_child(tmp_path / "exit", {"test_cut.py": """
        import os
        from pathlib import Path

        def test_b_writes_then_exits(request):
            (Path(request.config.rootpath) / "notes.txt").write_text("written, then the run ended with 0")
            os._exit(0)

        def test_c_never_runs():
            pass
    """})
    assert run.returncode == 1, run.output
    cut = run.output[run.output.index("canarchy isolation sentinel, the run was cut short"):]
    assert "os._exit(0) called by test_cut.py::test_b_writes_then_exits before the run had ended" in cut, cut
    assert "added: notes.txt (written by test_cut.py::test_b_writes_then_exits)" in cut, cut
    assert "test_c_never_runs" not in run.output


def test_the_last_look_stops_a_child_a_test_put_in_another_s_process_group_and_not_that_group(tmp_path):
    """A test starts a child in a process group of the operator's (``Popen(process_group=...)``, same
    session) and leaves it running: the last look ends the child by its pid, names it, and sends nothing to
    the group, whose other processes are not the run's."""
    outside = subprocess.Popen(["sleep", "300"], process_group=0)  # beside the run's pytest, a group of its own
    try:
        run = run_child(tmp_path, {"test_group.py": """
            import os, subprocess

            def test_leaves_a_child_in_the_operator_s_group():
                child = subprocess.Popen(["sleep", "61"], process_group=int(os.environ["CHILD_OUTSIDE_GROUP"]))
                open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
        """}, env={"CHILD_OUTSIDE_GROUP": str(outside.pid), "CHILD_PID_FILE": str(tmp_path / "child.pid")})
        time.sleep(0.2)
        assert outside.poll() is None, run.output  # the operator's process lives on
        child = int((tmp_path / "child.pid").read_text())
        after = run.output[run.output.index("canarchy isolation sentinel, after the session"):]
        assert run.returncode == 1 and f"stopped now: pid {child}: sleep 61" in after, run.output
        assert not os.path.exists(f"/proc/{child}") or reaper_state(child) == "Z", run.output
        assert "refused" not in after, after  # nothing of the harness's own tried to signal the group
    finally:
        outside.kill()
        outside.wait()


def test_a_sigterm_ends_the_run_as_ctrl_c_does(tmp_path):
    """``timeout``, a cancelled CI job: SIGTERM would end pytest at once, leaving the run's temporary tree and
    what its tests started behind. The first one stops the run as Ctrl+C does: the test interrupted, what it
    left running stopped and named, the tree removed."""
    from tests.helpers import WAITING_TEST, interrupt_once_started

    project, started, temp = tmp_path / "project", tmp_path / "started", tmp_path / "tmp"
    for directory in (project, started, temp):
        directory.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["canarchy.testing.isolation.plugin"]\n')
    leaves = ("def test_waits():\n    left = subprocess.Popen(['sleep', '61'], start_new_session=True)\n"
              f"    Path({str(tmp_path / 'left.pid')!r}).write_text(str(left.pid))\n")
    (project / "test_waits.py").write_text(
        "import subprocess\n" + WAITING_TEST.format(started=str(started)).replace("def test_waits():\n", leaves))
    env = {**operator_environment(make_operator_home(tmp_path), True), "TMPDIR": str(temp)}
    try:
        run = interrupt_once_started([*PYTEST, "-q", "-p", "no:randomly", "--rootdir", str(project)],
                                     started=started, runs=1, cwd=project, env=env, signum=signal.SIGTERM)
    finally:  # where the run did not stop it, it is this run's to stop
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((tmp_path / "left.pid").read_text()), signal.SIGKILL)
    output = run.out + run.err
    assert "KeyboardInterrupt: SIGTERM received" in output, output
    assert run.returncode == 2 and "the run fails (exit code 2)" in output, output  # pytest's: interrupted
    assert "sleep 61 (left running by test_waits.py::test_waits)" in output, output
    assert not list(temp.iterdir()), output  # the run's temporary tree


def reaper_state(pid: int) -> str | None:
    """``pid``'s state letter (``/proc/PID/stat``), None once it has gone."""
    from canarchy.testing.isolation.reaper import parent_and_state

    known = parent_and_state(pid)
    return None if known is None else known[1]


def test_the_sentinel_watches_the_home_state_the_guard_refuses_whatever_the_guarded_paths(tmp_path):
    """A project that names its own guarded paths (``~/.busprobe``) still has ``~/.canarchy``, ``~/.canrc``,
    ``~/can.conf`` and ``~/.can`` refused by the guard: the sentinel watches them too, so a shell child's write
    there fails the run (no containment here: nothing else stops a shell)."""
    run = run_child(tmp_path, {"test_shell.py": """
        import os, subprocess

        def test_a_shell_plants_a_file_in_the_operator_s_canarchy_state(canarchy_sandbox):
            state = canarchy_sandbox.real_home / ".canarchy"
            subprocess.run(["sh", "-c", f"mkdir -p '{state}' && echo x > '{state}/planted'"], check=True)
    """}, "-o", "canarchy_guarded_paths=~/.busprobe")
    assert run.returncode == 1 and "canarchy isolation sentinel" in run.output, run.output
    assert ".canarchy/planted" in run.output, run.output


def test_what_a_run_leaves_running_is_stopped_at_the_last_look_and_named(tmp_path):
    """Processes a test detached, dressed up or chained: the sentinel's last look stops each (pytest is
    their subreaper), names it, and the process exits 1."""
    run = run_child(tmp_path, {"test_late.py": """
        import atexit, os
        from pathlib import Path

        def test_detaches_a_process_that_writes_the_checkout_later():
            import subprocess
            late = os.path.join(os.path.abspath(os.environ["CHILD_ROOT"]), "LATE_WRITE")
            shell = subprocess.run(["sh", "-c", f"(sleep 60; echo late > {late}) >/dev/null 2>&1 & echo $!"],
                                   capture_output=True, text=True, check=True)  # the shell ends: an orphan
            Path(os.environ["CHILD_PID_FILE"]).write_text(shell.stdout.strip())

        CHAIN = ("import os, subprocess, sys, time\\n"
                 "if int(sys.argv[1]):\\n"
                 "    level = str(int(sys.argv[1]) - 1)\\n"
                 "    subprocess.run([sys.executable, '-I', '-c', sys.argv[2], level, sys.argv[2]])\\n"
                 "else:\\n"
                 "    open(os.environ['CHILD_CHAIN_FILE'], 'w').write(str(os.getpid()))\\n"
                 "    time.sleep(60)\\n")

        def test_dresses_a_process_as_multiprocessing_s_resource_tracker():
            import multiprocessing.resource_tracker, subprocess
            fake = subprocess.Popen(["sleep", "60"])  # a child of pytest, but not the tracker multiprocessing starts
            multiprocessing.resource_tracker._resource_tracker._pid = fake.pid
            Path(os.environ["CHILD_FAKE_FILE"]).write_text(str(fake.pid))

        LEADERLESS = ("import ctypes, os, sys, threading, time\\n"
                      "def later():\\n"
                      "    while os.path.exists('/proc/%d' % int(sys.argv[1])): time.sleep(0.05)\\n"
                      "    open(os.environ['CHILD_LEADERLESS_FILE'] + '.late', 'w').write('acted')\\n"
                      "    os._exit(0)\\n"
                      "threading.Thread(target=later).start()\\n"
                      "open(os.environ['CHILD_LEADERLESS_FILE'], 'w').write(str(os.getpid()))\\n"
                      "ctypes.CDLL(None).pthread_exit(None)\\n")

        def test_leaves_a_process_whose_main_thread_has_ended():
            # /proc/PID/stat says Z (the main thread's state) while its other thread runs on
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-I", "-c", LEADERLESS, str(os.getpid())], start_new_session=True)
            deadline = time.monotonic() + 60
            while not os.path.exists(os.environ["CHILD_LEADERLESS_FILE"]) and time.monotonic() < deadline:
                time.sleep(0.02)

        WALKER = ("# walker: a fresh pid all the time, each generation forks and exits\\n"
                  "import os, sys, time\\n"
                  "while os.path.exists('/proc/%d' % int(sys.argv[1])):\\n"
                  "    if os.fork(): os._exit(0)\\n"
                  "open(os.environ['CHILD_WALKER_FILE'], 'w').write('outlived the run')\\n")

        def test_leaves_a_process_that_keeps_forking():
            import subprocess, sys
            subprocess.Popen([sys.executable, "-I", "-c", WALKER, str(os.getpid())], start_new_session=True)

        def test_leaves_a_chain_of_processes_each_waiting_for_the_next():
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-I", "-c", CHAIN, "7", CHAIN])  # in pytest's process group
            deadline = time.monotonic() + 60
            while not os.path.exists(os.environ["CHILD_CHAIN_FILE"]) and time.monotonic() < deadline:
                time.sleep(0.05)
    """}, env={"CHILD_OPERATOR_HOME": str(tmp_path / "operator-home"), "CHILD_ROOT": str(tmp_path / "project"),
               "CHILD_PID_FILE": str(tmp_path / "detached.pid"), "CHILD_CHAIN_FILE": str(tmp_path / "chain.pid"),
               "CHILD_FAKE_FILE": str(tmp_path / "fake.pid"),
               "CHILD_LEADERLESS_FILE": str(tmp_path / "leaderless.pid"),
               "CHILD_WALKER_FILE": str(tmp_path / "walker.out")})
    detached, innermost = int((tmp_path / "detached.pid").read_text()), int((tmp_path / "chain.pid").read_text())
    leaderless = int((tmp_path / "leaderless.pid").read_text())
    fake = int((tmp_path / "fake.pid").read_text())
    time.sleep(0.3)  # what the leaderless one would do once pytest has gone, it would have done by now
    alive = [pid for pid in (detached, innermost, fake, leaderless) if os.path.exists(f"/proc/{pid}")]
    for pid in alive:
        os.kill(pid, 9)
    assert run.returncode == 1, run.output
    after = run.output[run.output.index("canarchy isolation sentinel, after the session"):]
    # the process a test detached was stopped with the run (pytest is its subreaper), named
    assert not alive and f"left running after the session, stopped now: pid {detached}: sh -c" in after, after
    assert f"pid {innermost}: " in after, after  # eight generations deep: each stopped one's child is adopted
    assert f"pid {leaderless}: " in after and not (tmp_path / "leaderless.pid.late").exists(), after
    # one that forks and exits all the time is at a new pid by the end of each look: stopped all the same (by
    # its process group, or frozen where a look finds it; one that ended as it was found is named by pid only)
    assert not (tmp_path / "walker.out").exists(), after
    # multiprocessing's state names it; its command line does not: stopped at the last look, not spared till exit
    assert f"left running after the session, stopped now: pid {fake}: sleep 60" in after, after
    # each named after the test at whose end it was running
    by = "(left running by test_late.py::"
    assert f"pid {detached}: sh -c" in after and f"{by}test_detaches_a_process_that_writes" in after, after
    assert f"pid {fake}: sleep 60 {by}test_dresses_a_process_as_multiprocessing_s_resource_tracker)" in after, after
    [chained] = [part for part in after.split("stopped now: ") if part.startswith(f"pid {innermost}: ")]
    assert f"{by}test_leaves_a_chain_of_processes_each_waiting_for_the_next)" in chained, after


def test_a_process_dressed_as_multiprocessing_s_own_helper_is_stopped_at_exit(tmp_path):
    """multiprocessing's resource tracker outlives the run; so does, until exit, a process started with its
    command line, holding the other end of a pipe, and put in multiprocessing's state with it. At exit the run
    closes its end of the helpers' pipes, as its exit would: the real tracker ends, this one does not and is
    stopped and named before it can act."""
    run = run_child(tmp_path, {"test_dressed.py": """
        import os, subprocess, sys
        import multiprocessing.resource_tracker as tracker

        LATER = ("from multiprocessing.resource_tracker import main;import os, time\\n"
                 "parent = os.getppid()\\n"
                 "while os.getppid() == parent: time.sleep(0.02)\\n"
                 "open(os.environ['CHILD_PLANT'], 'w').write('planted')\\n")

        def test_starts_a_tracker_that_acts_once_the_run_has_ended():
            read, write = os.pipe()  # it holds the other end of the pipe, as the real tracker does
            fake = subprocess.Popen([sys.executable, "-c", LATER], stdin=subprocess.DEVNULL, pass_fds=(read,))
            os.close(read)
            tracker._resource_tracker._pid, tracker._resource_tracker._fd = fake.pid, write
            open(os.environ["CHILD_FAKE_FILE"], "w").write(str(fake.pid))
    """}, env={"CHILD_PLANT": str(tmp_path / "project" / "pytest.py"), "CHILD_FAKE_FILE": str(tmp_path / "fake.pid")})
    fake = int((tmp_path / "fake.pid").read_text())
    time.sleep(0.5)  # what the fake would do once its parent has gone, it would have done by now
    alive = os.path.exists(f"/proc/{fake}")
    if alive:
        os.kill(fake, 9)
    assert not alive and not (tmp_path / "project" / "pytest.py").exists(), run.output
    assert run.returncode == 1, run.output
    at_exit = run.output[run.output.index("canarchy isolation sentinel, at exit"):]
    assert f"as if multiprocessing's helper, stopped now: pid {fake}: " in at_exit, at_exit
    assert "(left running by test_dressed.py::test_starts_a_tracker_that_acts_once_the_run_has_ended)" in at_exit


def test_code_collection_would_import_from_where_git_ignores_it_is_not_collected(tmp_path):
    """A conftest or test module where git ignores it (``htmlcov/``, a pattern) is code no sentinel sees
    change: a shell child could plant it for the next plain ``pytest``. Collection refuses it, naming it,
    before importing it (a collection error); an ignored directory holding no Python code is no error, and
    a run kept out of the rest collects as before."""
    marker = tmp_path / "imported.txt"
    imported = "import os\nopen(os.environ['CHILD_IMPORTED'], 'a').write(__file__ + '\\n')\n"
    files = {"htmlcov/conftest.py": imported, "htmlcov/index.html": "", "docs/_build/index.html": "",
             "htmlcov/test_planted.py": imported + "def test_planted():\n    pass\n",
             "mine_local_test.py": imported + "def test_local():\n    pass\n",
             "sub/conftest.py": imported, "sub/test_sub.py": "def test_sub():\n    pass\n",
             "pkg/__init__.py": imported, "pkg/test_in_package.py": "def test_in_package():\n    pass\n",
             "tests/gen/__init__.py": imported, "tests/gen/msg_pb2.py": imported,  # generated; never imported
             "tests/test_shown.py": "def test_shown():\n    pass\n"}

    def planted(name: str, *args: str):
        (tmp_path / name / "project").mkdir(parents=True)
        (tmp_path / name / "project" / ".gitignore").write_text(
            "htmlcov/\n_build/\n*_local_test.py\nsub/conftest.py\npkg/__init__.py\ntests/gen/\ntest-results/\n")
        subprocess.run(["git", "init", "-q", str(tmp_path / name / "project")], check=True)
        return run_child(tmp_path / name, files, *EARLY, *args, env={"CHILD_IMPORTED": str(marker)})

    run = planted("plain")
    assert run.returncode == 2 and "4 errors during collection" in run.output, run.output
    for rel in ("htmlcov/conftest.py", "mine_local_test.py", "sub/conftest.py", "pkg/__init__.py"):
        assert f"{rel} is code pytest would import from where git ignores it" in run.output, (rel, run.output)
    assert "tests/gen" not in run.output and not marker.exists(), marker.read_text()
    shown = planted("kept-out", "tests")
    assert shown.returncode == 0 and shown.outcomes("test_shown") == {"passed"}, shown.output
    assert not marker.exists(), marker.read_text()
    # a test*/ conftest at the top is imported before collection (an initial conftest): refused before that
    files["test-results/conftest.py"] = imported + "def pytest_configure(config):\n" \
        "    config.addinivalue_line('norecursedirs', 'test-results')\n"
    initial = planted("initial", "tests")
    assert initial.returncode == 4, initial.output
    assert "test-results/conftest.py is code pytest would import from where git ignores it" in initial.output
    assert not marker.exists(), marker.read_text()


def test_a_basetemp_inside_a_virtual_environment_of_the_checkout_stays_usable_under_the_containment(tmp_path):
    """tox's ``--basetemp={envtmpdir}`` lies inside the environment (``.tox/py311/tmp``), which is read-only
    under the containment; pytest removes and remakes its base temp, so that environment stays writable to
    other processes, the header says so, and ``tmp_path`` works."""
    _containment_or_skip()
    files = {"pyproject.toml": "[tool.pytest.ini_options]\ncanarchy_containment = true\n",
             ".tox/py311/pyvenv.cfg": "home = /usr/bin\n",
             "test_tmp.py": "def test_writes_tmp(tmp_path):\n    (tmp_path / 'f').write_text('x')\n"}
    run = run_child(tmp_path, files, *EARLY, "-v", "--basetemp=.tox/py311/tmp")  # -v: the header
    assert run.returncode == 0 and run.outcomes("test_writes_tmp") == {"passed"}, run.output
    assert "containment: in force" in run.output, run.output
    assert ".tox/py311 stays writable to other processes: --basetemp is inside it" in run.output, run.output


def test_the_programs_the_plugin_starts_carry_none_of_the_scrubbed_variables(tmp_path):
    """The plugin's own git (the sentinel's looks, a test's write into the checkout) keeps the operator's home
    and configuration, not their ``CANARCHY_*``/``CAN_*`` values: a process a test starts could read them from
    its ``/proc/PID/environ``. A ``git`` on PATH notes the environment it is started with."""
    real_git = shutil.which("git")
    if real_git is None:
        pytest.skip("no git")
    project, seen, wrapper = tmp_path / "project", tmp_path / "git-env.txt", tmp_path / "bin" / "git"
    project.mkdir()
    (project / "README.md").write_text("tracked\n")
    for argv in (["init", "-q"], ["add", "README.md"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t"]):
        subprocess.run(["git", "-C", str(project), *argv], check=True, capture_output=True)
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nenv >> "$CHILD_GIT_SEEN"\nexec {shlex.quote(real_git)} "$@"\n')
    wrapper.chmod(0o755)
    test = "import os\n\ndef test_opens_a_tracked_file_to_append():\n    open('README.md', 'a').close()\n"
    run = run_child(tmp_path, {"test_touch.py": test, "README.md": "tracked\n"},
                    env={"PATH": f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}", "CHILD_GIT_SEEN": str(seen)})
    assert run.outcomes("test_opens_a_tracked_file_to_append") == {"passed"}, run.output
    lines = seen.read_text().splitlines()
    assert any(line.startswith("HOME=") for line in lines), lines  # git ran, with the operator's home
    assert [line for line in lines if line.startswith(("CANARCHY_", "CAN_"))] == []


OPERATOR_CODE_TREES = """
import os, subprocess, sys

def _plant(path):
    subprocess.run(["sh", "-c", f"mkdir -p {os.path.dirname(path)} && echo 'import os' > {path}"])  # no guard
    return os.path.exists(path)

def test_plants_byte_code_in_the_operator_s_cache_prefix():
    assert sys.pycache_prefix and not _plant(os.path.join(sys.pycache_prefix, "pkg", "mod.cpython-311.pyc"))

def test_plants_a_sitecustomize_in_a_directory_of_the_operator_s_pythonpath():
    assert not _plant(os.path.join(os.environ["CHILD_PYTHONPATH_DIR"], "sitecustomize.py"))

def test_plants_a_program_in_a_directory_of_the_operator_s_path():
    assert not _plant(os.path.join(os.environ["CHILD_PATH_DIR"], "git"))

def test_the_system_s_code_trees_are_read_only_even_to_root():
    # `test -w` asks access(2): nothing is written either way
    trees = ["/usr/local/bin", "/usr/lib", "/opt", "/etc", "/var/spool", "/var/lib/dpkg/info", "/run/systemd", "/bin",
             "/lib"]
    assert [t for t in trees if os.path.isdir(t) and subprocess.run(["test", "-w", t]).returncode == 0] == []
"""


def test_the_interpreter_s_libraries_are_read_only_to_a_test_without_the_containment(tmp_path):
    """A ``.pth`` file in the running interpreter's site-packages runs in every later Python, before any
    isolation (the next pytest's too, with the operator's variables): refused at the moment, the containment
    off; a module the import system caches there is its own byte code, and passes."""
    import site

    target = Path(site.getsitepackages()[0]) / "canarchy-test-planted.pth"
    try:
        run = run_child(tmp_path, {"test_plant.py": f"""
            import json, sysconfig
            from pathlib import Path

            def test_plants_a_path_file_in_the_interpreter_s_site_packages():
                Path({str(target)!r}).write_text("# harmless: refused before it is written\\n")

            def test_imports_a_module_of_the_standard_library():
                import json.tool  # byte code the import system may cache beside it
        """}, *EARLY, "-o", "canarchy_containment=false", "-o", "canarchy_network_namespace=false")
        planted = target.exists()
    finally:
        if target.exists():  # the guard refuses this test's own remove too: a shell's
            subprocess.run(["rm", "-f", str(target)], check=True)
    messages = run.messages("test_plants_a_path_file_in_the_interpreter_s_site_packages")
    assert not planted and "tried to open for writing" in messages and "a .pth file" in messages, run.output
    assert run.outcomes("test_imports_a_module_of_the_standard_library") == {"passed"}, run.output


def test_the_code_trees_the_operator_s_environment_names_are_read_only(tmp_path):
    """``PYTHONPYCACHEPREFIX``, the directories of ``PYTHONPATH`` and ``PATH``, and the system's code trees,
    outside the checkout: byte code planted in the cache prefix runs in place of its source in the operator's
    next Python, before any isolation, a ``sitecustomize`` on their path at its start, a ``git`` on their PATH
    at their next ``git``. Under the containment all are read-only (to a shell child too)."""
    _containment_or_skip()
    # outside this run's temporary tree, which the child's temporary trees are in (those stay writable)
    where = Path(tempfile.mkdtemp(prefix="canarchy-operator-code-", dir="/tmp"))
    try:
        prefix, path_dir, bin_dir = where / "pycache", where / "pythonpath", where / "bin"
        for made in (prefix, path_dir, bin_dir):
            made.mkdir()
        run = run_child(tmp_path, {"test_plant.py": OPERATOR_CODE_TREES,
                                   "pyproject.toml": "[tool.pytest.ini_options]\ncanarchy_containment = true\n"},
                        *EARLY, env={"PYTHONPYCACHEPREFIX": str(prefix), "CHILD_PYTHONPATH_DIR": str(path_dir),
                                     "PYTHONPATH": os.pathsep.join([str(REPO), str(path_dir)]),
                                     "CHILD_PATH_DIR": str(bin_dir),
                                     "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]])})
        for test in ("test_plants_byte_code_in_the_operator_s_cache_prefix",
                     "test_plants_a_sitecustomize_in_a_directory_of_the_operator_s_pythonpath",
                     "test_plants_a_program_in_a_directory_of_the_operator_s_path",
                     "test_the_system_s_code_trees_are_read_only_even_to_root"):
            assert run.outcomes(test) == {"passed"}, run.output
        assert list(path_dir.iterdir()) == list(bin_dir.iterdir()) == [] and not (prefix / "pkg").exists()
    finally:
        shutil.rmtree(where, ignore_errors=True)
