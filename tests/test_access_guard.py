import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

# The access guard (canarchy.testing.isolation.access; docs/design/test-isolation.md, REQ-TISO-21).
#
# An audit hook can never be removed, so none is installed in this process: each
# scenario runs in a child Python that installs and configures the guard on a
# tmp_path "operator home" and prints what happened (GUARDED + the scenario + REPORT).
# Each test fails if the protection it covers is deleted: an operation left out of
# the events judged is allowed, a path judged on its text lets a symlink or '..'
# through, a record not kept lets a swallowed refusal pass.

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import types
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks import access as access_bench
from benchmarks import isolation, measure
from canarchy.testing.isolation import access, audithook, protection, tempbase
from tests.helpers import PYTEST

OWNER = "tests/test_scenario.py::test_operator_state"
GUARDED = """
import fcntl, json, os, shutil, socket, sqlite3, subprocess, sys, tempfile, glob, threading, types
from dataclasses import asdict
from pathlib import Path
from canarchy.testing.isolation import access, audithook, descriptors, tempbase

home, work = Path(sys.argv[1]), Path(sys.argv[2])
STATE, CHECKOUT = home / ".canarchy", work / "checkout"
access.GUARD.configure(access.Protection(
    refused=(str(STATE), str(home / ".canrc")), read_only=(str(home),), writable=(str(work),),
    watched=(str(CHECKOUT),), unwatched_names=("__pycache__", ".pytest_cache"),
))
access.GUARD.owner = {owner!r}
access.GUARD.report_dir = work / "reports"
audithook.install()
access.GUARD.enabled = True
outcomes = {{}}

def attempt(name, action):
    try:
        action()
    except access.OperatorStateRefused as error:
        outcomes[name] = "refused: " + str(error)
    except Exception as error:
        outcomes[name] = f"error: {{type(error).__name__}}: {{error}}"
    else:
        outcomes[name] = "allowed"

def own_descriptor():
    # a descriptor of a directory of the test's own, holding nothing judged: allowed
    os.makedirs(work / "own", exist_ok=True)
    return os.open(work / "own", os.O_RDONLY)

def forged_rmtree(top, target):
    # shutil.rmtree's own code with its helper replaced: the helper gets a descriptor of the top
    helper = lambda fd, *rest: os.remove(os.path.relpath(target, top), dir_fd=fd)
    forged = types.FunctionType(shutil.rmtree.__code__, dict(vars(shutil), _rmtree_safe_fd=helper), "rmtree",
                                shutil.rmtree.__defaults__)
    forged.__kwdefaults__ = shutil.rmtree.__kwdefaults__
    os.makedirs(top, exist_ok=True)
    forged(top)

def spawned(function, *args):
    import multiprocessing
    process = multiprocessing.get_context("spawn").Process(target=function, args=args)
    process.start()
    process.join()

def unix_socket_in(directory, name, how="bind"):
    # a relative address: CPython refuses an AF_UNIX path over 107 bytes before the audit event
    here = os.getcwd()
    os.chdir(directory)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM if how.startswith("send") else socket.SOCK_STREAM)
        if how == "sendto":
            sock.sendto(b"x", name)
        elif how == "sendmsg":
            sock.sendmsg([b"x"], [], 0, name)
        else:
            getattr(sock, how)(name)
    finally:
        os.chdir(here)
"""
REPORT = """
print("ACCESS-RESULT " + json.dumps({"outcomes": outcomes,
                                     "refusals": [asdict(r) for r in access.GUARD.take_refusals()],
                                     "watched": [asdict(r) for r in access.GUARD.take_watched()]}))
"""


def make_operator(base: Path) -> tuple[Path, Path]:
    """An operator home (canarchy state, ~/.canrc, other files) and a writable work tree beside it,
    with symlinks from the work tree into the state."""
    home, work = base / "home", base / "work"
    (home / ".canarchy" / "sub").mkdir(parents=True)
    (home / ".canarchy" / "config.toml").write_text("[transport]\ndefault_interface = 'socketcan'\n")
    (home / ".canarchy" / "victim.txt").write_text("what a test removes through a descriptor\n")
    (home / ".canrc").write_text("[default]\ninterface = socketcan\n")
    (home / "notes.txt").write_text("the operator's own notes\n")
    (home / "sub").mkdir()
    (home / "pkg" / "__pycache__").mkdir(parents=True)
    (work / "checkout").mkdir(parents=True)
    (work / "checkout" / "tracked.txt").write_text("tracked\n")
    (work / "reports").mkdir()
    (work / "plain.txt").write_text("plain\n")
    (work / "swapped.txt").write_text("a file another process replaces with a symlink\n")
    (work / "swap").mkdir()
    (work / "spawned").mkdir()
    (work / "spawned" / "x").write_text("in a directory a spawned process replaces with a symlink\n")
    (work / "ready-link").symlink_to(home / ".canarchy")
    (work / "swap" / "x").write_text("in a directory another process replaces with a symlink\n")
    (work / "link").symlink_to(home / ".canarchy")  # a directory symlink into the state
    (work / "rc").symlink_to(home / ".canrc")  # a file symlink onto the state
    (work / "rc-to-remove").symlink_to(home / ".canrc")
    (work / "linkdir").symlink_to(home / "sub")  # linkdir/.. is the home, not the work tree
    return home, work


def run_guarded(scenario: str, home: Path, work: Path, owner: str = OWNER,
                env: dict[str, str] | None = None) -> dict:
    """Run ``scenario`` (code calling ``attempt(name, action)``) in a guarded child; return its report."""
    source = GUARDED.format(owner=owner) + textwrap.dedent(scenario) + REPORT
    environment = {k: v for k, v in os.environ.items() if k != access.ENVIRONMENT_VARIABLE}
    environment.update(env or {})
    proc = subprocess.run([sys.executable, "-c", source, str(home), str(work)], capture_output=True,
                          text=True, timeout=180, env=environment)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ACCESS-RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("ACCESS-RESULT "):])


# -- every operation on the state is refused -------------------------------------------

READS = {
    "open for reading": "open(STATE / 'config.toml').close()",
    "os.open O_RDONLY": "os.close(os.open(STATE / 'config.toml', os.O_RDONLY))",
    "bytes path": "open(os.fsencode(STATE / 'config.toml'), 'rb').close()",
    "PathLike read_text": "(STATE / 'config.toml').read_text()",
    "a refused file (~/.canrc)": "open(home / '.canrc').close()",
    # a file handed through the environment, which C code (glibc's TZ, readline's INPUTRC) or a child reads
    "a time zone file set for C code": "os.environ.__setitem__('TZ', f':{STATE}/config.toml')",
    "an init file handed to a child": "subprocess.run([sys.executable, '-c', 'pass'], "
                                      "env={**os.environ, 'INPUTRC': str(home / '.canrc')})",
    "listdir": "os.listdir(STATE)",
    "listdir of bytes": "os.listdir(os.fsencode(STATE))",
    "scandir": "list(os.scandir(STATE))",
    "iterdir": "list(STATE.iterdir())",
    "walk": "next(os.walk(STATE))",
    "fwalk": "next(os.fwalk(STATE))",
    "glob.glob": "glob.glob(str(STATE / '*'))",
    "glob root_dir": "glob.glob('*', root_dir=STATE)",
    "Path.glob": "list(STATE.glob('*'))",
    "Path.rglob": "list(STATE.rglob('*'))",
    "chdir": "os.chdir(STATE)",
    "getxattr": "os.getxattr(STATE / 'config.toml', 'user.x')",
    "listxattr": "os.listxattr(STATE / 'config.toml')",
    "copyfile from": "shutil.copyfile(STATE / 'config.toml', work / 'copied.toml')",
    "copy2 from": "shutil.copy2(STATE / 'config.toml', work / 'copied2.toml')",
    "copytree from": "shutil.copytree(STATE, work / 'copied-tree')",
    "hard link from": "os.link(STATE / 'config.toml', work / 'hard-link')",
    "sqlite3 read-only URI": "sqlite3.connect(f'file:{STATE}/cache.db?mode=ro', uri=True)",
    "subprocess cwd": "subprocess.run([sys.executable, '-c', 'pass'], cwd=STATE)",
    "archive a tree": "shutil.make_archive(str(work / 'state-archive'), 'zip', root_dir=STATE)",
    "unpack an archive from": "shutil.unpack_archive(STATE / 'backup.zip', work / 'unpacked', 'zip')",
    "os.open under a descriptor of another directory": "os.close(os.open(os.path.relpath(STATE / 'config.toml', "
                                                       "work / 'own'), os.O_RDONLY, dir_fd=own_descriptor()))",
}
WRITES = {
    "open for writing": "open(STATE / 'config.toml', 'w').close()",
    "open for appending": "open(STATE / 'config.toml', 'a').close()",
    "open exclusive": "open(STATE / 'new.toml', 'x').close()",
    "open r+": "open(STATE / 'config.toml', 'r+').close()",
    "os.open O_WRONLY|O_CREAT": "os.close(os.open(STATE / 'new', os.O_WRONLY | os.O_CREAT))",
    "write_text": "(STATE / 'config.toml').write_text('x')",
    "touch": "(STATE / 'touched').touch()",
    "mkdir": "os.mkdir(STATE / 'findings')",
    "makedirs": "os.makedirs(STATE / 'cache' / 'dbc')",
    "rmdir": "os.rmdir(STATE / 'sub')",
    "remove": "os.remove(STATE / 'config.toml')",
    "unlink": "(STATE / 'config.toml').unlink()",
    "rename from": "os.rename(STATE / 'config.toml', work / 'moved.toml')",
    "rename to": "os.rename(work / 'plain.txt', STATE / 'planted.toml')",
    "replace to": "os.replace(work / 'plain.txt', home / '.canrc')",
    "hard link to": "os.link(work / 'plain.txt', STATE / 'hard-link')",
    "symlink to": "os.symlink(work / 'plain.txt', STATE / 'symlink')",
    "truncate": "os.truncate(STATE / 'config.toml', 0)",
    "utime": "os.utime(STATE / 'config.toml')",
    "chmod": "os.chmod(STATE / 'config.toml', 0o600)",
    "chown": "os.chown(STATE / 'config.toml', -1, -1)",
    "shutil.chown": "shutil.chown(STATE / 'config.toml', group=os.getgid())",
    "setxattr": "os.setxattr(STATE / 'config.toml', 'user.x', b'1')",
    "removexattr": "os.removexattr(STATE / 'config.toml', 'user.x')",
    "copyfile to": "shutil.copyfile(work / 'plain.txt', STATE / 'copied.toml')",
    "copymode to": "shutil.copymode(work / 'plain.txt', STATE / 'config.toml')",
    "copytree to": "shutil.copytree(CHECKOUT, STATE / 'copied-tree')",
    "rmtree": "shutil.rmtree(STATE)",
    "move from": "shutil.move(STATE / 'config.toml', work / 'moved.toml')",
    "move to": "shutil.move(work / 'plain.txt', STATE / 'moved.toml')",
    "sqlite3.connect": "sqlite3.connect(STATE / 'cache.db')",
    "mkstemp": "tempfile.mkstemp(dir=STATE)",
    "mkdtemp": "tempfile.mkdtemp(dir=STATE)",
    "bind a Unix socket": "unix_socket_in(home, '.canarchy/sock')",
    # a connect or a send reaches the process listening there: the operator's daemon
    "connect to a Unix socket": "unix_socket_in(home, '.canarchy/daemon.sock', 'connect')",
    "connect_ex to a Unix socket": "unix_socket_in(home, '.canarchy/daemon.sock', 'connect_ex')",
    "connect to a Unix socket under the home (read-only)": "unix_socket_in(home, 'agent.sock', 'connect')",
    "connect to a Unix socket by a bytearray": "unix_socket_in(home, bytearray(b'agent.sock'), 'connect')",
    "sendto a Unix socket": "unix_socket_in(home, '.canarchy/daemon.sock', 'sendto')",
    "sendmsg to a Unix socket": "unix_socket_in(home, 'agent.sock', 'sendmsg')",
    # a directory handed to a child, or to C code, through a variable it writes in: SQLite's temporary files
    "SQLITE_TMPDIR handed to a child": "subprocess.run([sys.executable, '-c', 'pass'], "
                                       "env={**os.environ, 'SQLITE_TMPDIR': str(home)})",
    "TMPDIR handed to posix_spawn": "os.posix_spawn('/bin/true', ['true'], {'TMPDIR': str(STATE)})",
    "make an archive at": "shutil.make_archive(str(STATE / 'archive'), 'zip', root_dir=CHECKOUT)",
    "unpack into": "shutil.unpack_archive(work / 'checkout.zip', STATE, 'zip')",
    "write under the home (read-only)": "open(home / 'new.txt', 'w').close()",
    "mkdir under the home (read-only)": "os.mkdir(home / 'newdir')",
    "rename within the home (read-only)": "os.rename(home / 'notes.txt', work / 'notes.txt')",
    "rmtree of the home (state below)": "shutil.rmtree(home)",
    "rmtree of the home's parent": "shutil.rmtree(home.parent)",
    "remove under a descriptor of another directory": "os.remove(os.path.relpath(STATE / 'victim.txt', "
                                                      "work / 'own'), dir_fd=own_descriptor())",
    "chmod of a descriptor": "os.chmod(os.open(home / 'notes.txt', os.O_RDONLY), 0o600)",
    # FS_IOC_SETFLAGS (linux/fs.h) through a descriptor opened to read: immutable or append-only, as root
    "file flags set through a descriptor opened to read": "fcntl.ioctl(os.open(home / 'notes.txt', os.O_RDONLY), "
                                                          "0x40086602, bytes(8))",
    # a file opened for reading (allowed), opened again for writing by its number under /proc/self/fd
    "reopen for writing under a descriptor of /proc/self/fd": "os.open(str(os.open(home / 'notes.txt', os.O_RDONLY)), "
                                                              "os.O_WRONLY, dir_fd=os.open('/proc/self/fd', "
                                                              "os.O_RDONLY | os.O_DIRECTORY))",
    "rmtree's code with its helper replaced": "forged_rmtree(work / 'forged', STATE / 'victim.txt')",
    "hard link of a home file (written through the new name)": "os.link(home / 'notes.txt', work / 'notes-alias')",
}


@pytest.fixture(scope="module")
def refused_operations(tmp_path_factory):
    home, work = make_operator(tmp_path_factory.mktemp("operator"))
    scenario = "shutil.make_archive(str(work / 'checkout'), 'zip', root_dir=CHECKOUT)\n"
    scenario += "".join(f"attempt({name!r}, lambda: {code})\n" for name, code in {**READS, **WRITES}.items())
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    report = run_guarded(scenario, home, work)
    report["home unchanged"] = sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    report["config intact"] = (home / ".canarchy" / "config.toml").read_text().startswith("[transport]")
    return report


@pytest.mark.parametrize("operation", list(READS) + list(WRITES))
def test_each_operation_on_the_operators_state_is_refused(refused_operations, operation):
    outcome = refused_operations["outcomes"][operation]
    assert outcome.startswith("refused: "), outcome
    assert OWNER in outcome and "Ways to fix it" in outcome and "real_home" in outcome and "tmp_path" in outcome


def test_a_refusal_names_the_operation_the_path_and_the_owner(refused_operations):
    message = refused_operations["outcomes"]["open for writing"]
    assert f"{OWNER} tried to open for writing " in message
    assert "config.toml" in message and "the operator's own state" in message
    assert "tried to list " in refused_operations["outcomes"]["listdir"]
    assert "tried to rename to " in refused_operations["outcomes"]["rename to"]
    assert "a tree the run may only read: the operator's home" in refused_operations["outcomes"][
        "write under the home (read-only)"]


def test_refused_operations_changed_nothing_and_were_all_recorded(refused_operations):
    assert refused_operations["home unchanged"] and refused_operations["config intact"]
    recorded = {(r["operation"], r["owner"]) for r in refused_operations["refusals"]}
    assert len(refused_operations["refusals"]) == len(READS) + len(WRITES)
    assert {owner for _, owner in recorded} == {OWNER}


# -- the resolved path decides: symlinks, '..', relative paths ---------------------------

RESOLUTION = {
    "through a directory symlink": "open(work / 'link' / 'config.toml').close()",
    "onto a file symlink": "open(work / 'rc').close()",
    "list through a symlink": "os.listdir(work / 'link')",
    "'..' in the home": "open(home / 'sub' / '..' / '.canarchy' / 'config.toml').close()",
    "'..' after a symlink": "open(work / 'linkdir' / '..' / '.canarchy' / 'config.toml').close()",
    "bytes through a symlink": "open(os.fsencode(work / 'link' / 'config.toml'), 'rb').close()",
    "PathLike '..' after a symlink": "(work / 'linkdir' / '..' / '.canrc').read_text()",
    "a symlink made after the directory was judged": (
        "(open(work / 'plain.txt').close(), os.symlink(home / '.canrc', work / 'made-later'), "
        "open(work / 'made-later').close())"),
    "a relative path": "(os.chdir(work), open(os.path.join('link', 'config.toml')).close())",
    # judged once, then swapped by a process the hook does not see: nothing remembered of before counts
    "a directory another process made a symlink": (
        "(open(work / 'swap' / 'x').close(), subprocess.run(['sh', '-c', 'rm -r \"$1\" && ln -s \"$2\" \"$1\"', "
        "'sh', work / 'swap', home / '.canarchy'], check=True), open(work / 'swap' / 'config.toml').close())"),
    "a file another process made a symlink": (
        "(open(work / 'swapped.txt').close(), subprocess.run(['ln', '-sf', home / '.canrc', work / 'swapped.txt'], "
        "check=True), open(work / 'swapped.txt').close())"),
}


@pytest.fixture(scope="module")
def resolution(tmp_path_factory):
    home, work = make_operator(tmp_path_factory.mktemp("operator"))
    scenario = "".join(f"attempt({name!r}, lambda: {code})\n" for name, code in RESOLUTION.items())
    return run_guarded(scenario, home, work)


@pytest.mark.parametrize("route", list(RESOLUTION))
def test_a_route_round_the_path_text_is_refused(resolution, route):
    outcome = resolution["outcomes"][route]
    assert outcome.startswith("refused: "), outcome


def test_a_directory_a_spawned_process_made_a_symlink_is_resolved_afresh(tmp_path):
    """multiprocessing's spawn start raises none of CPython's process-start events; the guard's wrapper of
    ``_posixsubprocess.fork_exec`` does, so nothing it remembered of the directory counts (a guard of its own:
    in the shared one, an earlier route's process start has already stopped the remembering)."""
    home, work = make_operator(tmp_path)
    report = run_guarded("""
        attempt("swapped", lambda: (open(work / 'spawned' / 'x').close(), spawned(shutil.rmtree, work / 'spawned'),
                                    spawned(os.rename, work / 'ready-link', work / 'spawned'),
                                    open(work / 'spawned' / 'config.toml').close()))
    """, home, work)
    assert report["outcomes"]["swapped"].startswith("refused: "), report["outcomes"]
    assert os.path.islink(work / "spawned")  # the swap happened


def test_the_record_gives_the_path_as_given_and_as_resolved(resolution):
    record = next(r for r in resolution["refusals"] if r["path"].endswith(os.path.join("link", "config.toml"))
                  and os.path.isabs(r["path"]))
    assert record["resolved"].endswith(os.path.join(".canarchy", "config.toml"))
    assert os.sep + "link" + os.sep not in record["resolved"]
    assert record["zone"] == "refused" and record["tree"].endswith(".canarchy")


# -- what stays allowed ------------------------------------------------------------------

ALLOWED = {
    "read elsewhere": "open(os.__file__).close()",
    "list elsewhere": "os.listdir(os.path.dirname(os.__file__))",
    "read the rest of the home": "(home / 'notes.txt').read_text()",
    "list the home": "os.listdir(home)",
    "write to the work tree": "(work / 'out.txt').write_text('x')",
    "mkdir and rmtree in the work tree": "(os.makedirs(work / 'a' / 'b'), shutil.rmtree(work / 'a'))",
    # rmtree opens each directory below its top by name under a descriptor: not the working directory's
    "rmtree of a tree holding a name the working directory refuses": "(os.makedirs(work / 'c' / '.canarchy' / 's'), "
        "os.chdir(home), shutil.rmtree(work / 'c'), os.chdir(work))",
    "a temporary file": "tempfile.TemporaryFile().close()",
    "remove a symlink that points into the state": "os.remove(work / 'rc-to-remove')",
    "byte code in the work tree": "(os.makedirs(work / '__pycache__'), (work / '__pycache__' / 'm.pyc').touch())",
    "sqlite3 in memory": "sqlite3.connect(':memory:').close()",
    "write to the null device": "os.close(os.open(os.devnull, os.O_WRONLY))",
    "a child given a TMPDIR in the work tree and a PYTHONPATH in the home": (
        "subprocess.run([sys.executable, '-c', 'pass'], env={**os.environ, 'TMPDIR': str(work), "
        "'PYTHONPATH': f'{home}:{work}'}, check=True)"),
    # FIONREAD (asm-generic/ioctls.h): a read of a home file's descriptor
    "an ioctl that reads a home file": "fcntl.ioctl(os.open(home / 'notes.txt', os.O_RDONLY), 0x541B, bytes(4))",
}


def test_reads_elsewhere_and_writes_to_writable_trees_are_allowed(tmp_path):
    home, work = make_operator(tmp_path)
    scenario = "".join(f"attempt({name!r}, lambda: {code})\n" for name, code in ALLOWED.items())
    report = run_guarded(scenario, home, work)
    assert report["outcomes"] == dict.fromkeys(ALLOWED, "allowed")
    assert report["refusals"] == [] and report["watched"] == []
    assert (home / ".canrc").exists() and not (work / "rc-to-remove").exists()


def test_byte_code_under_the_home_is_written_only_by_an_import(tmp_path):
    """A ``.pyc`` there runs at the next import of its module, outside any isolation: the import
    system may cache what it compiled; any other writer is refused."""
    home, work = make_operator(tmp_path)
    (home / "pkg" / "homemod.py").write_text("X = 1\n")
    report = run_guarded("""
        sys.path.insert(0, str(home / "pkg"))
        sys.dont_write_bytecode = False
        attempt("open", lambda: open(home / "pkg" / "__pycache__" / "m.cpython-311.pyc", "wb").close())
        attempt("import", lambda: __import__("homemod"))
    """, home, work)
    assert report["outcomes"]["open"].startswith("refused: ") and "byte code not written by the import system" \
        in report["outcomes"]["open"], report["outcomes"]
    assert report["outcomes"]["import"] == "allowed", report["outcomes"]
    assert [r["zone"] for r in report["refusals"]] == ["bytecode"]
    assert list((home / "pkg" / "__pycache__").glob("homemod.*.pyc"))


def test_a_disabled_guard_allows_everything(tmp_path):
    home, work = make_operator(tmp_path)
    report = run_guarded("""
        access.GUARD.enabled = False
        attempt("read", lambda: (STATE / "config.toml").read_text())
        attempt("write", lambda: (STATE / "written.toml").write_text("x"))
        attempt("home", lambda: (home / "new.txt").write_text("x"))
    """, home, work)
    assert report["outcomes"] == {"read": "allowed", "write": "allowed", "home": "allowed"}
    assert (home / ".canarchy" / "written.toml").exists() and report["refusals"] == []


# -- records --------------------------------------------------------------------------

def test_a_swallowed_refusal_is_still_recorded(tmp_path):
    home, work = make_operator(tmp_path)
    report = run_guarded("""
        def product_code():
            try:
                return (STATE / "config.toml").read_text()
            except Exception:  # product code that swallows everything
                return None
        attempt("swallowed", product_code)
    """, home, work)
    assert report["outcomes"] == {"swallowed": "allowed"}  # the caller saw nothing...
    [record] = report["refusals"]  # ...but the refusal stands
    assert record["owner"] == OWNER and record["operation"] == "open for reading"
    assert record["path"] == str(home / ".canarchy" / "config.toml")


def test_writes_into_a_watched_tree_are_recorded_not_refused(tmp_path):
    home, work = make_operator(tmp_path)
    report = run_guarded("""
        attempt("write", lambda: (CHECKOUT / "tracked.txt").write_text("changed"))
        attempt("mkdir", lambda: (CHECKOUT / "new").mkdir())
        attempt("read", lambda: (CHECKOUT / "tracked.txt").read_text())
        attempt("unwatched", lambda: (CHECKOUT / ".pytest_cache").mkdir())
    """, home, work, owner="tests/test_x.py::test_writes_the_checkout")
    assert set(report["outcomes"].values()) == {"allowed"}
    assert (work / "checkout" / "tracked.txt").read_text() == "changed"
    watched = [(r["operation"], Path(r["path"]).name, r["owner"]) for r in report["watched"]]
    assert watched == [("open for writing", "tracked.txt", "tests/test_x.py::test_writes_the_checkout"),
                       ("mkdir", "new", "tests/test_x.py::test_writes_the_checkout")]
    assert all(r["zone"] == "watched" and r["tree"] == str(work / "checkout") for r in report["watched"])
    assert report["refusals"] == []


def test_a_checkout_inside_the_home_is_watched_not_read_only(tmp_path):
    home, work = make_operator(tmp_path)
    (home / "src" / "canarchy").mkdir(parents=True)
    report = run_guarded("""
        import dataclasses
        access.GUARD.configure(dataclasses.replace(access.GUARD.protection, watched=(str(home / "src" / "canarchy"),)))
        attempt("in the checkout", lambda: (home / "src" / "canarchy" / "x.txt").write_text("x"))
        attempt("beside it", lambda: (home / "src" / "y.txt").write_text("y"))
        access.GUARD.configure(dataclasses.replace(access.GUARD.protection, watched=(str(home),)))
        attempt("the home itself watched", lambda: (home / "z.txt").write_text("z"))
        attempt("its state still refused", lambda: (STATE / "config.toml").read_text())
    """, home, work)
    outcomes = report["outcomes"]
    assert outcomes["in the checkout"] == "allowed" and outcomes["the home itself watched"] == "allowed"
    assert outcomes["beside it"].startswith("refused: ") and outcomes["its state still refused"].startswith("refused: ")
    assert [Path(r["path"]).name for r in report["watched"]] == ["x.txt", "z.txt"]


def test_a_relative_path_from_a_removed_working_directory_is_judged_or_refused(tmp_path):
    """Linux still resolves ``..`` from a removed working directory, to its parent, and ``os.getcwd`` fails
    there: the guard judges the path from the directory's name in ``/proc/self/cwd``, and where it cannot
    name it, refuses the access rather than let it through unjudged."""
    home, work = make_operator(tmp_path)
    report = run_guarded("""
        def from_removed(name):
            gone = work / name
            gone.mkdir()
            os.chdir(gone)
            gone.rmdir()
            return "../" * (len(gone.parts) - 1) + str(STATE / "config.toml").lstrip("/")
        def beside(name):
            return from_removed(name).replace(".canarchy/config.toml", "planted")
        attempt("named by /proc", lambda: open(from_removed("gone-1")).close())
        attempt("beside it, named by /proc", lambda: open(beside("gone-2"), "w").close())
        descriptors._CWD_LINK = str(work / "no-proc")  # a system where the directory cannot be named
        attempt("not named", lambda: open(beside("gone-3"), "w").close())
    """, home, work)
    read, write, unnamed = (report["outcomes"][k] for k in ("named by /proc", "beside it, named by /proc", "not named"))
    assert read.startswith("refused: ") and "the operator's own state" in read, read
    assert write.startswith("refused: ") and "may only read" in write, write
    assert unnamed.startswith("refused: ") and "cannot be named" in unnamed, unnamed


def test_writing_a_record_does_not_recurse(tmp_path):
    home, work = make_operator(tmp_path)
    report = run_guarded("""
        access.GUARD.report_dir = CHECKOUT  # every record written there is itself a write into a watched tree
        os.environ.update(access.GUARD.to_environment())
        audithook.activate_from_environment()  # as a child process: each record is written to report_dir
        attempt("watched write", lambda: (CHECKOUT / "tracked.txt").write_text("changed"))
        attempt("refused read", lambda: (STATE / "config.toml").read_text())
        outcomes["lines"] = len([line for line in (CHECKOUT / access.REPORT_FILE).read_text().splitlines() if line])
    """, home, work)
    assert report["outcomes"]["watched write"] == "allowed"
    assert report["outcomes"]["refused read"].startswith("refused: ")
    assert report["outcomes"]["lines"] == 2  # one record each, and nothing about writing them
    assert [r["path"] for r in report["watched"]] == [str(work / "checkout" / "tracked.txt")]


def test_a_thread_is_judged_while_another_thread_is_being_judged(tmp_path):
    home, work = make_operator(tmp_path)
    report = run_guarded("""
        inside, go = threading.Event(), threading.Event()
        class SlowPath:  # its __fspath__ runs inside the hook, in the middle of a judgement
            def __fspath__(self):
                inside.set()
                go.wait(30)
                return str(work / "plain.txt")
        copier = threading.Thread(target=shutil.copyfile, args=(SlowPath(), work / "copy.txt"))
        copier.start()
        inside.wait(30)
        attempt("read while another thread is judged", lambda: (STATE / "config.toml").read_text())
        go.set()
        copier.join()
        outcomes["copied"] = (work / "copy.txt").read_text()
    """, home, work)
    assert report["outcomes"]["read while another thread is judged"].startswith("refused: ")
    assert report["outcomes"]["copied"] == "plain\n"


# -- child processes ---------------------------------------------------------------------

GRANDCHILD = """
import sys
from pathlib import Path
from canarchy.testing.isolation import audithook, tempbase
assert audithook.activate_from_environment()
try:
    Path(sys.argv[1], ".canarchy", "config.toml").read_text()
except Exception:  # swallowed: the parent must learn of it all the same
    pass
open(Path(sys.argv[2], "checkout", "tracked.txt"), "a").close()
"""


def test_a_grandchild_given_the_environment_refuses_and_reports_to_its_parent(tmp_path):
    home, work = make_operator(tmp_path)
    report = run_guarded(f"""
        env = {{**os.environ, **access.GUARD.to_environment(),
               "PYTEST_CURRENT_TEST": "tests/test_p.py::test_parent (call)"}}
        done = subprocess.run([sys.executable, "-c", {GRANDCHILD!r}, str(home), str(work)], env=env,
                              capture_output=True, text=True)
        outcomes["grandchild"] = f"{{done.returncode}} {{done.stderr}}"
        outcomes["child pid"] = os.getpid()
        refusals, watched = access.GUARD.take()
        outcomes["taken"] = [[asdict(r) for r in refusals], [asdict(r) for r in watched]]
        access.GUARD.report_dir = Path(str(access.GUARD.report_dir))  # the same directory, set again
        outcomes["taken again"] = access.GUARD.take()
    """, home, work)
    assert report["outcomes"]["grandchild"] == "0 "
    [[refusal], [watched]] = report["outcomes"]["taken"]
    assert refusal["owner"] == "tests/test_p.py::test_parent" and refusal["operation"] == "open for reading"
    assert refusal["pid"] != report["outcomes"]["child pid"]  # the grandchild's, read from report_dir
    assert refusal["path"] == str(home / ".canarchy" / "config.toml")
    assert watched["owner"] == "tests/test_p.py::test_parent" and watched["operation"] == "open for writing"
    records = [line for line in (work / "reports" / access.REPORT_FILE).read_text().splitlines() if line]
    assert len(records) == 2  # one line a record (each starts a line of its own)
    assert report["outcomes"]["taken again"] == [[], []]  # taken, so forgotten


def test_a_record_from_a_child_names_the_child_process():
    from canarchy.testing.isolation.refusal import Access

    record = Access(OWNER, "open for reading", "/h/.canrc", "/h/.canrc", "refused", "/h/.canrc", os.getpid() + 1)
    assert f"(in child process {os.getpid() + 1})" in record.message()
    assert "child process" not in Access(**{**asdict(record), "pid": os.getpid()}).message()



@pytest.mark.parametrize(("tree", "zone", "label", "fix"), [
    ("/dev/pts/3", "refused", "the operator's terminal", "pty.openpty()"),
    ("/dev/tty2", "refused", "the operator's terminal", "pty.openpty()"),
    ("/dev/console", "refused", "the operator's terminal", "pty.openpty()"),
    ("the operator's terminal", "terminal", "the terminal pytest was started on", "stdin=subprocess.DEVNULL"),
    ("/dev/ttyS0", "refused", "a CAN adapter's device node", "interface=\"virtual\""),
    ("/dev/ttyUSB0", "refused", "a CAN adapter's device node", "interface=\"virtual\""),
    ("/h/.canrc", "refused", "the operator's own state", "tmp_path"),
    ("a process outside the run", "process", "a process outside the run", "@pytest.mark.integration"),
    ("the root directory", "root", "the process's root directory", "instead of changing the process's root"),
])
def test_a_refusal_names_what_it_protects_and_the_fixes_that_fit(tree, zone, label, fix):
    """A terminal's node or a change to it is told apart from a serial CAN adapter's by name, and each gets the
    ways to fix it that fit (a console is no adapter; an adapter's are the bus's; a process's or the root's are
    not the home's)."""
    from canarchy.testing.isolation.refusal import Access

    text = Access(OWNER, "open for writing", tree, tree, zone, tree, os.getpid()).message()
    assert label in text and fix in text, text
    assert ("pty.openpty()" in text) == (fix in ("pty.openpty()", "stdin=subprocess.DEVNULL")), text
    assert ("real_home" in text) == (fix == "tmp_path"), text  # the home's way out, for the home only

def test_the_environment_carries_the_configuration(tmp_path):
    guard = access.AccessGuard()  # a guard of its own: configuring it installs nothing
    protection = guard.configure(access.Protection(refused=(str(tmp_path / "s"),), read_only=(str(tmp_path),),
                                                   watched=(str(tmp_path / "c"),), unwatched_names=(".git",)))
    guard.report_dir = tmp_path / "r"
    [(name, value)] = guard.to_environment().items()
    assert name == access.ENVIRONMENT_VARIABLE
    document = json.loads(value)
    assert document["refused"] == list(protection.refused) and document["report_dir"] == str(tmp_path / "r")
    assert document["unwatched_names"] == [".git"]
    assert audithook.activate_from_environment({}) is False
    with pytest.raises(ValueError, match=access.ENVIRONMENT_VARIABLE):
        audithook.activate_from_environment({access.ENVIRONMENT_VARIABLE: "{not json"})


# -- the default protection ---------------------------------------------------------------

def test_default_protection_covers_both_homes(tmp_path, monkeypatch):
    shell_home, account_home = tmp_path / "shell-home", tmp_path / "account-home"
    shell_home.mkdir()
    account_home.mkdir()
    monkeypatch.setitem(sys.modules, "can.util", types.SimpleNamespace(CONFIG_FILES=[]))
    operator = protection.default_protection({"HOME": str(shell_home), "APPDATA": str(tmp_path / "roaming")},
                                             str(account_home), cwd=str(tmp_path / "cwd"))
    for home in (shell_home, account_home):
        for name in (".canarchy", ".canrc", "can.conf", ".can"):
            assert str(home / name) in operator.refused
        assert str(home / "AppData" / "Roaming" / "can.ini") in operator.refused
    assert "/etc/can.conf" in operator.refused
    assert str(tmp_path / "roaming" / "can.ini") in operator.refused
    assert str(tmp_path / "cwd" / "can.ini") in operator.refused
    assert str(tmp_path / "cwd" / ".canarchy") in operator.refused  # canarchy's sessions in the working directory
    assert operator.read_only == (os.path.realpath(shell_home), os.path.realpath(account_home), *_KERNEL)
    assert operator.writable == (tempfile.gettempdir(), *protection.NAMESPACE_SETTINGS, protection.OWN_PROC)


def test_default_protection_resolves_and_merges_homes(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via-link").symlink_to(real)
    operator = protection.default_protection({"HOME": str(tmp_path / "via-link"), "USERPROFILE": str(real)},
                                             str(real))
    assert operator.read_only == (str(real), *_KERNEL)
    assert [p for p in operator.refused if p.endswith(".canarchy")] == [str(real / ".canarchy"),
                                                                         os.path.join(os.getcwd(), ".canarchy")]
    # a home at the root is not read-only; the kernel's settings are
    assert protection.default_protection({"HOME": "/"}, None).read_only == _KERNEL


#: What the access guard keeps read-only of the kernel's: /proc whole (each process's files), /sys, /dev/kmsg.
_KERNEL = ("/proc", "/sys", "/dev/kmsg")


def test_the_kernel_s_settings_are_every_entry_at_the_top_of_proc_that_is_no_process_s(tmp_path):
    proc = tmp_path / "proc"
    for name in ("1", "42", "irq", "bus", "sys"):
        (proc / name).mkdir(parents=True)
    (proc / "self").symlink_to("42")
    (proc / "net").symlink_to("self/net")
    (proc / "mtrr").write_text("")
    (proc / "mtrr").chmod(0o644)
    (proc / "cpuinfo").write_text("")
    (proc / "cpuinfo").chmod(0o444)
    assert protection.kernel_settings(str(proc)) == (*protection.KERNEL_SETTINGS, *(
        f"{proc}/{name}" for name in ("bus", "irq", "mtrr", "sys")))
    assert protection.kernel_settings(str(tmp_path / "none")) == protection.KERNEL_SETTINGS


def test_the_kernel_s_settings_are_refused_to_a_write_but_the_run_s_own_namespaces_are_not(access_guard):
    # a root run's write of kernel.core_pattern names a program the kernel runs outside every namespace
    with pytest.raises(access.OperatorStateRefused) as refused, open("/proc/sys/kernel/core_pattern", "w"):
        pass
    assert "/proc/sys" in str(refused.value)
    access_guard.take_refusals()
    zones = access.GUARD._zones
    assert zones.verdict("/proc/sys/net/ipv4/ip_forward", True, False) is None  # the run's network namespace's
    assert zones.verdict("/proc/sysrq-trigger", True, False) is not None and \
        zones.verdict("/sys/kernel/uevent_helper", True, False) is not None
    # any process's own settings (the shell that started pytest: its OOM score, core dump filter, nice level)
    # and the rest of /proc, but for this process's
    assert all(zones.verdict(path, True, False) is not None for path in (
        f"/proc/{os.getppid()}/oom_score_adj", "/proc/1/coredump_filter", "/proc/irq/default_smp_affinity"))
    assert zones.verdict(f"/proc/{os.getpid()}/oom_score_adj", True, False) is None


def test_default_protection_follows_python_cans_config_files(tmp_path, monkeypatch):
    import can.util

    home = tmp_path / "home"
    home.mkdir()
    refused = protection.default_protection({"HOME": str(home)}, None).refused
    for name in can.util.CONFIG_FILES:  # the installed python-can's own list
        path = str(home) + name[1:] if name.startswith("~") else name
        assert path in refused or os.path.join(os.getcwd(), name) in refused, name
    monkeypatch.setitem(sys.modules, "can.util", types.SimpleNamespace(CONFIG_FILES=["~/.can-next", "/opt/can.conf"]))
    refused = protection.default_protection({"HOME": str(home)}, None).refused
    assert str(home / ".can-next") in refused and "/opt/can.conf" in refused


def test_the_account_database_home_is_the_real_one():
    pwd = pytest.importorskip("pwd")
    assert tempbase.account_database_home() == pwd.getpwuid(os.getuid()).pw_dir


# -- the benchmark measures a live guard ----------------------------------------------------

@pytest.mark.parametrize("variant,refused", [("canarchy", True), ("unguarded", False)])
def test_the_benchmarks_variants_run_with_and_without_the_guard(tmp_path, variant, refused):
    home = tmp_path / "operator"
    (home / ".canarchy").mkdir(parents=True)
    (home / ".canarchy" / "config.toml").write_text("x")
    suite = isolation.write_suite(tmp_path / "suites", variant, tests=2, modules=1, conftests=access_bench.CONFTESTS)
    (suite / "test_reads_state.py").write_text(
        f"def test_reads_state():\n    open({str(home / '.canarchy' / 'config.toml')!r}).close()\n")
    env = measure.child_env(home, extra={"BENCH_TIMING_FILE": str(tmp_path / "timing.json")})
    env.pop(access.ENVIRONMENT_VARIABLE, None)
    proc = subprocess.run([*PYTEST, "-q"], cwd=suite, env=env,
                          capture_output=True, text=True, timeout=300)
    if refused:
        assert "1 failed" in proc.stdout and "2 passed" in proc.stdout, proc.stdout + proc.stderr
        assert "test_reads_state.py::test_reads_state tried to open for reading" in proc.stdout
    else:
        assert "3 passed" in proc.stdout, proc.stdout + proc.stderr


def test_the_benchmarks_per_call_figures_come_from_a_configured_guard():
    figures = access_bench.run_per_call(calls=200)
    assert set(figures["without"]) == set(figures["with"]) == set(access_bench.CASES)
    assert figures["refusals"] == 0 and all(v > 0 for v in figures["with"].values()) and figures["take"] > 0
    result = access_bench.AccessResult(
        suite=isolation.IsolationResult(tests=1000, rounds=1, runs={
            "bare": isolation.VariantRuns([1.0], [1.0], [2.0], [2.0]),
            "unguarded": isolation.VariantRuns([1.2], [1.2], [2.0], [2.0]),
            "canarchy": isolation.VariantRuns([1.23], [1.24], [2.0], [2.0]),
            "hook": isolation.VariantRuns([1.25], [1.25], [2.0], [2.0])}),
        per_call=[figures], events={"open": 1.0, "judged": 6.0, "other": 50.0})
    assert result.per_test_ms("loop_cpu") == pytest.approx(0.04)
    assert result.per_test_ms("loop_cpu", "hook", "canarchy") == pytest.approx(0.01)
    call, judging = figures["with"]["other_event"] - figures["without"]["other_event"], figures["judging"]
    assert set(judging) == set(access_bench.JUDGED_CASES) and all(v > 0 for v in judging.values())
    assert result.modelled_ms() == pytest.approx((1 * (call + judging["judged_open"])
                                                  + 6 * (call + judging["judged_listdir"])
                                                  + 50 * call + figures["take"]) / 1000)
    assert "<= 0.05 ms: met" in "\n".join(access_bench.report_lines(result))


def test_the_benchmark_counts_the_events_of_a_test():
    events = access_bench.count_events(tests=3)
    assert events["judged"] >= 1 and events["other"] >= 1  # the plugin lists and changes directories per test


def test_a_writable_tree_in_the_checkout_s_version_control_is_no_exception(tmp_path):
    """``-o cache_dir=.git`` (or a ``--basetemp`` there) would make ``.git/config`` writable; a cache directory
    elsewhere in the checkout stays writable, its own ``.gitignore`` included."""
    root = tmp_path / "checkout"
    zones = protection.Zones(protection.Protection(
        watched=(str(root),), writable=(str(root / ".git"), str(root / ".git" / "bt"), str(root / ".cache"))))
    assert zones.verdict(str(root / ".git" / "config"), True, False) == ("version control", str(root))
    assert zones.verdict(str(root / ".git" / "bt" / "x"), True, False) == ("version control", str(root))
    assert zones.verdict(str(root / ".cache" / ".gitignore"), True, False) is None
    assert zones.verdict(str(root / "notes.txt"), True, False) == ("watched", str(root))


C_OPENERS = """
import readline
con = sqlite3.connect(":memory:")
con.execute("CREATE TABLE t(x)")
attempt("attach", lambda: con.execute(f"ATTACH '{STATE / 'captures.db'}' AS a"))
attempt("vacuum into", lambda: con.execute(f"VACUUM INTO '{home / 'copy.db'}'"))
attempt("attach in the work tree", lambda: con.execute(f"ATTACH '{work / 'own.db'}' AS b"))
attempt("attach by a bound parameter", lambda: con.execute("ATTACH ? AS p", (str(STATE / 'bound.db'),)))
attempt("attach by an expression", lambda: con.execute(f"ATTACH '{home}/' || 'made.db' AS e"))
attempt("a temporary store under the home", lambda: con.execute(f"PRAGMA temp_store_directory = '{home}'"))
attempt("a temporary store in the work tree", lambda: con.execute(f"PRAGMA temp_store_directory = '{work}'"))
def read_only(uri):  # a database under the home, which the run may read: SQLite may still make files beside it
    return sqlite3.connect(f"file:{home}/{uri}", uri=True).execute("SELECT * FROM t").fetchall()
attempt("read-only, a WAL database", lambda: read_only("wal.db?mode=ro"))
attempt("read-only, dot-file locks", lambda: read_only("notes.db?mode=ro&vfs=unix-dotfile"))
attempt("read-only and immutable", lambda: read_only("wal.db?mode=ro&immutable=1"))
attempt("immutable last, not first", lambda: read_only("wal.db?mode=ro&imm%75table=0&immutable=1"))
attempt("read-only, a rollback-journal database", lambda: read_only("notes.db?mode=ro"))  # SQLite makes nothing
attempt("parameters after a fragment", lambda: sqlite3.connect(f"file:{home}/frag.db#?mode=ro&immutable=1", uri=True))
attempt("a file name cut by an encoded NUL", lambda: sqlite3.connect(
    f"file:{home}/nul.db%00/../../../../..{work}/elsewhere.db", uri=True))
attempt("read history", lambda: readline.read_history_file(str(STATE / 'config.toml')))
attempt("append history", lambda: readline.append_history_file(1, str(home / 'notes.txt')))
attempt("read an init file", lambda: readline.read_init_file(str(home / '.canrc')))
# readline reads what an init file or a bound line $includes (in any case, after blanks), nested
(work / "inner.inputrc").write_text(f"set bell-style none\\n  $INCLUDE {home / '.canrc'}\\n")
(work / "outer.inputrc").write_text(f"# mine\\n$include {work / 'inner.inputrc'}\\n")
(work / "plain.inputrc").write_text(f"$include {work / 'plain.txt'}\\n")
attempt("an init file including one that includes the state",
        lambda: readline.read_init_file(str(work / "outer.inputrc")))
attempt("a bound line including the state", lambda: readline.parse_and_bind(f"\\t$include {STATE / 'config.toml'}"))
attempt("an init file including one in the work tree", lambda: readline.read_init_file(str(work / 'plain.inputrc')))
attempt("a keyword the wrapper does not take", lambda: readline.read_history_file(str(home / '.canrc'), _name="x"))
import _sqlite3
attempt("attach through _sqlite3", lambda: _sqlite3.connect(":memory:").execute(f"ATTACH '{home / 'c.db'}' AS a"))
attempt("a bare connection", lambda: sqlite3.Connection(":memory:"))
def spawn_opening(path, flags):  # the child opens path on its descriptor 3 before it runs
    pid = os.posix_spawn("/bin/true", ["true"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 3, str(path), flags, 0o644)])
    os.waitpid(pid, 0)
attempt("a spawned child's open of a home file", lambda: spawn_opening(home / '.canrc', os.O_RDONLY))
attempt("a spawned child's new file in the state", lambda: spawn_opening(STATE / 'spawned', os.O_WRONLY | os.O_CREAT))
attempt("a spawned child's open in the work tree",
        lambda: spawn_opening(work / 'spawned.out', os.O_WRONLY | os.O_CREAT))
import importlib.util
def second_instance(name):  # a fresh module object of the same extension: its C functions as first made
    return second_instance_as(name, None)
def second_instance_as(name, origin):  # the C loader finds PyInit_<last part of the name>
    spec = importlib.util.find_spec(name) if origin is None else importlib.util.spec_from_file_location(name, origin)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
attempt("a second readline", lambda: second_instance("readline").read_history_file(str(home / '.canrc')))
attempt("a second _sqlite3", lambda: second_instance("_sqlite3").connect(":memory:").execute(
    f"ATTACH '{home / 'd.db'}' AS a"))
attempt("a second readline by another name", lambda: second_instance_as("anything.readline", readline.__file__)
        .read_history_file(str(home / '.canrc')))
attempt("a second _imp's readline", lambda: second_instance("_imp").create_dynamic(
    importlib.util.find_spec("readline")).read_history_file(str(home / '.canrc')))
attempt("a FIFO in the state", lambda: os.mkfifo(STATE / 'fifo'))
attempt("a node under the home", lambda: os.mknod(home / 'node'))
attempt("a FIFO by keyword under a descriptor", lambda: os.mkfifo(
    os.path.relpath(home / 'fifo', work / 'own'), mode=0o600, dir_fd=own_descriptor()))
attempt("a FIFO in the work tree", lambda: os.mkfifo(work / 'fifo', 0o600))
import ctypes
attempt("a library in the state", lambda: ctypes.CDLL(str(STATE / 'plugin.so')))
attempt("a library by its name", lambda: ctypes.CDLL("libc.so.6"))
attempt("an extension module in the state", lambda: importlib.util.module_from_spec(
    importlib.util.spec_from_file_location("plugin", STATE / 'plugin.so')))
try:
    import tkinter
except ImportError:  # Python built without Tcl/Tk: nothing to open files with
    outcomes["a Tcl interpreter"] = "refused: no tkinter"
else:
    attempt("a Tcl interpreter", lambda: tkinter.Tcl().eval(f"set f [open {home / '.canrc'}]; read $f"))
"""


def test_c_code_that_opens_paths_without_an_audit_event_is_judged(tmp_path):
    """SQLite's ATTACH and VACUUM INTO (from a ``:memory:`` connection) and readline's history and init files
    open paths in C with no audit event of CPython's: the guard raises one first, so each is refused (SQLite
    reports it as "not authorized") and recorded, and nothing is read or written; also through a second
    instance of their modules (``importlib.util.module_from_spec``), which is the wrapped one. So are the
    paths ``os.posix_spawn``'s file actions have the child open, a FIFO or node ``os.mkfifo``/``os.mknod``
    make, and a library ``ctypes`` or an extension module's spec has the dynamic loader open."""
    home, work = make_operator(tmp_path)
    for name, journal in (("wal.db", "wal"), ("notes.db", "delete")):
        with contextlib.closing(sqlite3.connect(home / name)) as con:
            con.executescript(f"PRAGMA journal_mode={journal}; CREATE TABLE t(x);")
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    report = run_guarded(C_OPENERS, home, work)
    outcomes = report["outcomes"]
    # a pragma that points SQLite's own files elsewhere; a read-only connection that may still write beside the file
    for name in ("a temporary store under the home", "read-only, a WAL database", "read-only, dot-file locks",
                 "immutable last, not first", "parameters after a fragment", "a file name cut by an encoded NUL"):
        assert outcomes[name].startswith(("error: DatabaseError", "refused: ")), (name, outcomes[name])
    assert outcomes["a temporary store in the work tree"] == outcomes["read-only and immutable"] == outcomes[
        "read-only, a rollback-journal database"] == "allowed", outcomes
    assert outcomes["attach"].startswith("error: DatabaseError") and outcomes["vacuum into"].startswith(
        "error: DatabaseError"), outcomes
    assert outcomes["attach in the work tree"] == "allowed", outcomes
    # the file is not named when SQLite asks: the guard cannot judge it, so it is refused whatever it is
    assert outcomes["attach by a bound parameter"].startswith("error: DatabaseError"), outcomes
    assert outcomes["attach by an expression"].startswith("error: DatabaseError"), outcomes
    assert outcomes["a spawned child's open in the work tree"] == "allowed", outcomes
    assert outcomes["an init file including one in the work tree"] == "allowed", outcomes
    for name in ("read history", "append history", "read an init file", "a bare connection", "a Tcl interpreter",
                 "an init file including one that includes the state", "a bound line including the state",
                 "a spawned child's open of a home file", "a spawned child's new file in the state",
                 "a second readline", "a second readline by another name", "a second _imp's readline",
                 "a FIFO in the state", "a node under the home", "a FIFO by keyword under a descriptor",
                 "a library in the state", "an extension module in the state"):
        assert outcomes[name].startswith("refused: "), outcomes
    assert outcomes["a FIFO in the work tree"] == outcomes["a library by its name"] == "allowed", outcomes
    assert outcomes["a keyword the wrapper does not take"].startswith("error: TypeError"), outcomes
    assert outcomes["attach through _sqlite3"].startswith("error: DatabaseError"), outcomes
    assert outcomes["a second _sqlite3"].startswith("error: DatabaseError"), outcomes
    recorded = [(r["operation"], r["path"]) for r in report["refusals"]]
    assert ("attach the database", str(home / ".canarchy" / "captures.db")) in recorded, recorded
    assert ("attach the database", str(home / "copy.db")) in recorded, recorded
    assert any(op == "attach a database SQLite names only as it runs" for op, _ in recorded), recorded
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before


def test_judging_a_read_only_sqlite_uri_opens_no_fifo_or_device(tmp_path):
    """Whether a database opened ``mode=ro`` is in WAL mode comes from its header, read from a regular file
    only: the guard's own look at a FIFO would wait for a writer forever, at a device node act on the device."""
    fifo = tmp_path / "db"
    os.mkfifo(fifo)
    code = ("from canarchy.testing.isolation.events import SPECIAL\n"
            f"print(list(SPECIAL['sqlite3.connect'](('file:{fifo}?mode=ro',))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == f"[('{fifo}', None, 'sqlite3.connect', 0)]", done


CHANGING_ARGUMENTS = """
import readline
class Changing:  # a path that names the work tree when first asked, then the operator's home
    def __init__(self, first, then):
        self.first, self.then, self.asked = first, then, 0
    def __fspath__(self):
        self.asked += 1
        return str(self.first if self.asked == 1 else self.then)
class Flags(int):  # O_WRONLY | O_CREAT, in a class of its own
    pass
class Pid:  # this process when first asked, then its parent (outside the scenario)
    asked = 0
    def __index__(self):
        Pid.asked += 1
        return os.getpid() if Pid.asked == 1 else os.getppid()
def spawn_opening(path, flags):
    pid = os.posix_spawn("/bin/true", ["true"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 3, path, flags, 0o644)])
    os.waitpid(pid, 0)
attempt("a FIFO", lambda: os.mkfifo(Changing(work / 'fifo', home / 'fifo')))
attempt("a node", lambda: os.mknod(Changing(work / 'node', home / 'node')))
attempt("a history file", lambda: readline.write_history_file(Changing(work / 'history', home / 'history')))
attempt("a spawned child's open", lambda: spawn_opening(Changing(work / 'spawned.out', home / 'spawned.out'),
                                                        os.O_WRONLY | os.O_CREAT))
attempt("a spawned child's open with flags of a subclass", lambda: spawn_opening(
    home / 'created', Flags(os.O_WRONLY | os.O_CREAT)))
attempt("a descriptor to signal an int subclass", lambda: os.pidfd_open(type("P", (int,), {})(os.getppid())))
attempt("a descriptor to signal an __index__", lambda: os.pidfd_open(Pid()))
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open") or not hasattr(os, "mkfifo"), reason="no pidfd_open or mkfifo")
def test_a_wrapper_judges_the_very_argument_it_passes_on(tmp_path):
    """The wrappers of C functions with no audit event convert an argument once and pass the converted value on:
    a path object asked again (``__fspath__``), a pid (``__index__``), flags of an int subclass, a file action
    could name another file, process or mode to C than to the guard. Each here names the work tree or this
    process first, the operator's home or a process outside after: what is made is made where it was judged
    (the work tree), the int subclass and the changing pid are judged by their value (refused), and the flags
    as the write they are."""
    home, work = make_operator(tmp_path)
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    outcomes = run_guarded(CHANGING_ARGUMENTS, home, work)["outcomes"]
    for name in ("a FIFO", "a node", "a history file", "a spawned child's open"):
        assert outcomes[name] == "allowed", outcomes
    for name in ("a spawned child's open with flags of a subclass", "a descriptor to signal an int subclass"):
        assert outcomes[name].startswith("refused: "), outcomes
    assert outcomes["a descriptor to signal an __index__"] == "allowed", outcomes  # its own pid, as judged
    assert {"fifo", "node", "history", "spawned.out"} <= {p.name for p in work.iterdir()}
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc")
def test_a_signal_to_a_process_group_or_to_every_process_is_judged_by_each_process_it_reaches():
    """A group reaches each of its processes: one outside the run (here the group's leader, a shell above the
    judging process) is named; a group of the run's own passes. ``os.kill(-1)`` reaches every process."""
    code = textwrap.dedent("""
        import os, subprocess
        from canarchy.testing.isolation.protection import signalled_outside
        def said(event, target):
            return str(signalled_outside(event, target, os.getpid())).partition(":")[0]  # "pid N", or "None"
        print(said("os.killpg", 0))
        print(said("os.kill", -os.getpgrp()))
        print(said("os.kill", -1))
        child = subprocess.Popen(["sleep", "30"], start_new_session=True)
        print(said("os.killpg", child.pid))
        print(said("os.kill", child.pid))
        child.kill()
    """)
    shell = subprocess.Popen(["sh", "-c", '"$0" -c "$1"; exit $?', sys.executable, code], start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = shell.communicate()
    assert shell.returncode == 0, (out, err)
    assert out.splitlines() == [f"pid {shell.pid}", f"pid {shell.pid}",
                                "every process the user may signal (pid -1)", "None", "None"], (out, err)
