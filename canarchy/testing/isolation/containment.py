"""Kernel-level containment of a test run (Linux, root or not).

:func:`enter` moves the calling process, once and while single-threaded, and every process it starts later,
into private user, mount and (optionally) network namespaces: covered paths become empty read-only views, only
``lo`` exists, and a nested namespace locks the view (``MNT_LOCKED``). Nothing raises for "not possible here":
the :class:`Report` says what is in force and why not; :func:`probe` asks a child process. Design:
``docs/design/test-isolation.md`` ("Layer 0: containment"). The system calls and their constants: :mod:`.kernel`.
Standard library only, on purpose: a fresh child Python loads this file by path (:func:`probe`; the tests'
ordinary user), and it then loads ``kernel.py``, ``tempbase.py`` and ``mountview.py`` beside it the same way.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

if __package__:  # imported as a module of the package
    from canarchy.testing.isolation import kernel, mountview
else:  # loaded by path (the module docstring): the modules it needs beside it, the same way
    import importlib.util

    def _beside(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # mountview.py takes kernel.py and tempbase.py as these modules
        spec.loader.exec_module(module)
        return module

    kernel = _beside("kernel")
    _beside("tempbase")
    mountview = _beside("mountview")

PROTECTIONS = ("user namespace", "mount view", "network", "lock")

HEADER = "canarchy isolation: containment"


@dataclass(frozen=True)
class Plan:
    """What :func:`enter` makes of the file system and the network.

    ``covered``: paths that become an empty read-only view where they exist
    (a directory: an empty read-only tmpfs; anything else: an empty read-only
    file; a symlink: what it resolves to) and cannot be created where they do
    not (their nearest existing parent becomes read-only). ``read_only``:
    trees bind-mounted onto themselves read-only, mounts below included.
    ``writable``: trees inside those that stay as they were. ``network``: a
    private network namespace holding only ``lo``, up. ``mounts``: False asks for
    no mount view at all (the network alone; the report's "mount view" is then
    not in force, "not asked for"). Paths are absolute. ``processes``: process ids, the
    calling process first, whose ``/proc/PID/environ`` and ``/proc/PID/mem``, and
    those of each of their threads now, become empty files (the environment each
    was started with, and the memory that holds it); after the first, their
    ``cmdline`` too (``env VAR=value pytest`` names variables there).
    ``sockets``: Unix-domain sockets bound in the file system by processes outside
    (:func:`~canarchy.testing.isolation.protection.unix_sockets`), each made an empty
    read-only file, so that nothing started in the run can reach the daemon behind it
    (a connect meets ``ECONNREFUSED``); the network namespace cuts abstract ones.
    """

    covered: tuple[Path, ...] = ()
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    network: bool = True
    processes: tuple[int, ...] = ()
    mounts: bool = True
    sockets: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        for name in ("covered", "read_only", "writable", "sockets"):
            paths = tuple(Path(p) for p in getattr(self, name))
            relative = [str(p) for p in paths if not p.is_absolute()]
            if relative:
                raise ValueError(f"Plan.{name} needs absolute paths, got {', '.join(relative)}")
            object.__setattr__(self, name, paths)


@dataclass(frozen=True)
class Protection:
    """One protection: ``in_force``, and ``detail`` (what it holds, or why not)."""

    name: str
    in_force: bool
    detail: str


@dataclass(frozen=True)
class Report:
    """What :func:`enter` (or :func:`probe`) found: one :class:`Protection`
    per name in :data:`PROTECTIONS` that was asked for; the paths it covered,
    made read-only and kept writable (strings, resolved); ``seconds`` spent."""

    protections: tuple[Protection, ...]
    covered: tuple[str, ...] = ()
    uncreatable: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def in_force(self) -> bool:
        """Whether every protection asked for is in force."""
        return all(p.in_force for p in self.protections)

    @property
    def reason(self) -> str:
        """Why not, for the first protection not in force ("" when all are)."""
        return next((f"{p.name}: {p.detail}" for p in self.protections if not p.in_force), "")

    def protection(self, name: str) -> Protection | None:
        """The protection called ``name``, None when it was not asked for."""
        return next((p for p in self.protections if p.name == name), None)

    def header_lines(self) -> list[str]:
        """The lines for pytest's header, each ``canarchy isolation: containment: ...``."""
        if not any(p.in_force for p in self.protections):
            return [f"{HEADER}: not in force ({self.reason})"]
        lines = [f"{HEADER}: in force" if self.in_force else f"{HEADER}: partly in force ({self.reason})"]
        return lines + [f"{HEADER}: {p.name}: {p.detail if p.in_force else 'NOT in force: ' + p.detail}"
                        for p in self.protections]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Report:
        data = json.loads(text)
        data["protections"] = tuple(Protection(**p) for p in data["protections"])
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


# -- namespaces ----------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _why_no_user_namespace(exc: OSError) -> str:
    """A sentence for a failed ``unshare(CLONE_NEWUSER ...)``."""
    limit = _read("/proc/sys/user/max_user_namespaces")
    if limit == "0":
        return "the kernel allows no user namespaces (/proc/sys/user/max_user_namespaces = 0)"
    if exc.errno == errno.EPERM:
        if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
            return ("AppArmor refuses unprivileged user namespaces "
                    "(kernel.apparmor_restrict_unprivileged_userns = 1)")
        if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
            return "the kernel refuses unprivileged user namespaces (kernel.unprivileged_userns_clone = 0)"
        return "unshare(CLONE_NEWUSER) refused (EPERM: a seccomp filter, a chroot, or a security module)"
    if exc.errno == errno.EINVAL:
        threads = _threads()
        if threads > 1:
            return f"the process already runs {threads} threads (unshare(CLONE_NEWUSER) needs one)"
        return "unshare(CLONE_NEWUSER) refused (EINVAL: a kernel without user namespaces?)"
    if exc.errno == errno.ENOSPC:
        return f"the user namespace limit is reached (/proc/sys/user/max_user_namespaces = {limit})"
    if exc.errno == errno.EUSERS:
        return "user namespaces are nested too deep (32 levels)"
    return f"unshare(CLONE_NEWUSER): {exc.strerror or exc}"


def _mount_points() -> list[str]:
    """Mount points of this mount namespace. Raises OSError when ``/proc/self/mountinfo`` cannot be read."""
    table = mount_table(None)
    if table is None:
        raise OSError(errno.ENOENT, "no /proc/self/mountinfo")
    return [point for point, _kind in table.values()]


def mount_table(proc_device: int | None) -> dict[str, tuple[str, str]] | None:
    """This mount namespace's mounts (``/proc/self/mountinfo``, proc(5)): mount ID -> (mount point, file system
    type); the kernel writes space, tab, newline and backslash in a mount point as octal escapes. None when the
    file cannot be read, or is not procfs's (``proc_device``: the ``st_dev`` of ``/proc`` when the run began), as
    when ``/proc`` or this process's entry in it has been mounted over."""
    try:
        with open("/proc/self/mountinfo", "rb") as handle:
            if proc_device is not None and os.fstat(handle.fileno()).st_dev != proc_device:
                return None
            lines = handle.read().splitlines()
    except OSError:
        return None
    table = {}
    for line in lines:
        head, _, tail = line.partition(b" - ")
        fields = head.split(b" ")
        if len(fields) >= 5:
            point = os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4]))
            table[os.fsdecode(fields[0])] = (point, os.fsdecode((tail.split() or [b"?"])[0]))
    return table or None


def _private_sysfs() -> None:
    """A fresh sysfs (read-only) on ``/sys``, so its network entries
    (``/sys/class/net``, ``/sys/devices/.../net``) are this network namespace's;
    the mounts that were below ``/sys`` (cgroups, ...) are put back on it."""
    clones = []
    try:
        for path in mountview.outermost(p for p in _mount_points() if p.startswith("/sys/")):
            clones.append((path, kernel._open_tree(path)))
        # read-only from the start: a new sysfs may not be less restricted than the one
        # already visible (the kernel's mount_too_revealing), which is this one when nested
        fresh = kernel._new_fs("sysfs", kernel.MOUNT_ATTR_RDONLY)
        try:
            kernel._move_mount(fresh, "/sys")
        finally:
            os.close(fresh)
        for path, tree in clones:
            try:
                kernel._move_mount(tree, path)
            except OSError:  # a mount point the fresh sysfs lacks: that mount stays out of sight
                pass
    finally:
        for _, tree in clones:
            os.close(tree)


# -- entering ------------------------------------------------------------------------

def _not_possible(plan: Plan, reason: str, started: float) -> Report:
    names = [n for n in PROTECTIONS if n != "network" or plan.network]
    return Report(tuple(Protection(n, False, reason) for n in names), seconds=time.perf_counter() - started)


def enter(plan: Plan) -> Report:
    """Move this process (and every process it starts afterwards) into the
    containment ``plan`` describes; see the module docstring. Call it once,
    while the process runs a single thread. Never raises for what the machine
    does not allow: the :class:`Report` says what is in force and why not.
    Raises ``TypeError`` for something that is not a :class:`Plan`.
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"enter() needs a Plan, got {type(plan).__name__}")
    started = time.perf_counter()
    if not sys.platform.startswith("linux"):
        return _not_possible(plan, f"Linux-only (this is {sys.platform})", started)
    if platform.machine() not in kernel._GENERIC_TABLE:
        return _not_possible(plan, f"no system call numbers known for {platform.machine()}", started)
    threads = _threads()
    uid, gid = os.geteuid(), os.getegid()
    # unshare(CLONE_NEWUSER) needs a single thread; a native library (an OpenBLAS
    # pool, say) may have started one already. Root can still enter mount and
    # network namespaces (they apply to this thread and what it starts), unlocked.
    many = threads > 1
    if many and uid != 0:
        return _not_possible(plan, f"the process already runs {threads} threads "
                                   "(unshare(CLONE_NEWUSER) needs one)", started)
    try:
        cwd = os.getcwd()
    except OSError:  # a working directory removed already: nothing to re-resolve
        cwd = None
    try:
        # IPC: System V shared memory, semaphores and message queues (and POSIX message queues) of the
        # operator's processes are out of reach, and none the run makes outlives it (POSIX shared memory:
        # _private_shared_memory)
        kernel.unshare((0 if many else kernel.CLONE_NEWUSER) | kernel.CLONE_NEWNS | kernel.CLONE_NEWIPC
                       | (kernel.CLONE_NEWNET if plan.network else 0))
    except OSError as exc:
        return _not_possible(plan, _why_no_user_namespace(exc), started)
    results = {"user namespace": _user_namespace(many, threads, uid, gid)}
    view = mountview.View.of(plan)
    results["mount view"] = _mount_view(plan, view, cwd)
    if plan.network:
        results["network"] = _set_up_network()
    if many:
        results["lock"] = (False, f"not possible with {threads} threads (a nested user namespace needs one): "
                                  "a process with capabilities can unmount the covers")
    else:
        _lock(results, uid, gid, plan.network)
    return Report(
        tuple(Protection(name, *results[name]) for name in PROTECTIONS if name in results),
        covered=tuple(view.covers), uncreatable=tuple(view.uncreatable),
        read_only=tuple(view.read_only), writable=tuple(view.writable),
        seconds=time.perf_counter() - started,
    )


def _user_namespace(many: bool, threads: int, uid: int, gid: int) -> tuple[bool, str]:
    """The user namespace's result: this uid and gid mapped to themselves, unless the process entered as
    root with ``threads`` running (none made)."""
    if many:
        return False, (f"the process already runs {threads} threads: mount and network namespaces entered as "
                       "root, without one (threads started before stay outside)")
    try:
        kernel._map_ids(uid, gid)
    except OSError as exc:
        return False, f"ids not mapped ({exc.strerror}): the process runs as the overflow uid"
    return True, f"uid {uid} and gid {gid} mapped to themselves; every other id shows as the overflow id"


def _mount_view(plan: Plan, view: mountview.View, cwd: str | None) -> tuple[bool, str]:
    """Make every mount private, apply ``view`` when the plan asks for it, resolve ``cwd`` again through
    the new mounts; the mount view's result."""
    try:
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)  # before any mount: nothing propagates out
        if plan.mounts:
            view.apply()
            _private_shared_memory(view)
    except OSError as exc:
        view.problems.insert(0, str(exc))
    try:
        if cwd is not None:
            os.chdir(cwd)  # it was resolved below the new mounts: resolve it again, through them
    except OSError as exc:
        view.problems.append(f"working directory {cwd}: {exc.strerror}")
    if not plan.mounts:
        return False, "not asked for: every path stays as it is"
    return not view.problems, "; ".join(view.problems + [view.detail()])


def _private_shared_memory(view: mountview.View) -> None:
    """A fresh, empty tmpfs on ``/dev/shm``: POSIX shared memory and named semaphores live there
    (shm_open(3), sem_open(3)), which ``CLONE_NEWIPC`` does not reach; the operator's are out of sight,
    and none the run makes outlives it."""
    if not os.path.isdir("/dev/shm"):
        return
    try:
        fresh = kernel._new_fs("tmpfs")
        try:
            kernel._move_mount(fresh, "/dev/shm")
        finally:
            os.close(fresh)
    except OSError as exc:
        view.problems.append(f"/dev/shm stays the host's ({exc.strerror})")
        return
    view.fresh.append("/dev/shm")


def _set_up_network() -> tuple[bool, str]:
    """``lo`` up and a sysfs of this network namespace; the network protection's result."""
    notes = []
    try:
        kernel._bring_loopback_up()
    except OSError as exc:
        notes.append(f"lo is down ({exc.strerror}): nothing reaches a network")
    try:
        _private_sysfs()
    except OSError as exc:
        notes.append(f"/sys/class/net still lists the host's interfaces ({exc.strerror})")
    return True, ("a private namespace, loopback only: no CAN interface, no route off the machine"
                  + "".join(f"; {n}" for n in notes))


def _lock(results: dict, uid: int, gid: int, network: bool) -> None:
    """A nested user and mount namespace: copying the view into it locks every mount (MNT_LOCKED)."""
    try:
        kernel.unshare(kernel.CLONE_NEWUSER | kernel.CLONE_NEWNS)
    except OSError as exc:
        results["lock"] = (False, f"nested user namespace refused ({exc.strerror}): "
                                  "a process with capabilities can unmount the covers")
        return
    results["lock"] = (True, "mounts locked (no unmount, no remount read-write); "
                             + ("network namespace owned by an outer user namespace (no new interface or route)"
                                if network else "host network kept"))
    try:
        kernel._map_ids(uid, gid)
    except OSError as exc:
        results["user namespace"] = (False, f"nested ids not mapped ({exc.strerror}): "
                                            "the process runs as the overflow uid")


_PROBED: dict[bool, Report] = {}
_PROBE_CODE = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('containment', sys.argv[1]);"
               "m = sys.modules['containment'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
               "print(m._probe_here(sys.argv[2], sys.argv[3] == '1').to_json())")


def probe(network: bool = True, *, python: str | None = None, timeout: float = 30) -> Report:
    """What :func:`enter` achieves here, asked of a fresh child process
    (``python``, default this interpreter; ``-I -S``) that enters a plan on a
    temporary directory and checks that its covers are empty and read-only and
    its writable tree writable. This process is not changed. Cached per
    ``network`` for the default interpreter."""
    if python is None and network in _PROBED:
        return _PROBED[network]
    root = tempfile.mkdtemp(prefix="canarchy-containment-probe-")
    try:
        for name in ("state", "writable"):
            os.mkdir(os.path.join(root, name))
        with open(os.path.join(root, "state", "config.toml"), "w", encoding="ascii") as handle:
            handle.write("x = 1\n")
        with open(os.path.join(root, "state.conf"), "w", encoding="ascii") as handle:
            handle.write("x = 1\n")
        argv = [python or sys.executable, "-I", "-S", "-c", _PROBE_CODE, __file__, root, "1" if network else "0"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env={"PATH": os.environ.get("PATH", os.defpath)})  # nothing of the operator's
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            raise ValueError(last)
        report = Report.from_json(lines[-1])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as exc:
        report = _not_possible(Plan(network=network), f"the probe process failed ({exc})", time.perf_counter())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if python is None:
        _PROBED[network] = report
    return report


def _probe_here(root: str, network: bool) -> Report:
    """:func:`probe`'s child: enter a plan on ``root``, then check it."""
    plan = Plan(covered=[f"{root}/state", f"{root}/state.conf", f"{root}/absent"], read_only=[root],
                writable=[f"{root}/writable"], network=network)
    report = enter(plan)
    view = report.protection("mount view")
    if view is None or not view.in_force:
        return report
    failed = []
    with open(f"{root}/state.conf", "rb") as conf:
        covered_content = conf.read()
    if os.listdir(f"{root}/state") or covered_content:
        failed.append("a covered path is not empty")
    for path, should in ((f"{root}/absent", False), (f"{root}/writable/new", True)):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            failed += [] if should else [f"{path} could be created"]
        except OSError as exc:
            failed += [f"{path}: {exc.strerror}"] if should else []
    if not failed:
        return report
    broken = Protection("mount view", False, "the view does not hold: " + "; ".join(failed))
    return replace(report, protections=tuple(broken if p.name == "mount view" else p for p in report.protections))
