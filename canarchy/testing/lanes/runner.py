"""The one way the lanes run a child process (pytest, mostly), and stop it.

Every child starts in a session (process group) of its own, so an interrupt
reaches only the lane, which then ends each group it started: SIGTERM, then
SIGKILL after a grace period, or at once when a further signal arrives.
:func:`interrupts` turns SIGINT/SIGTERM into :class:`Interrupted` in the main
thread for the length of a ``with`` block and restores the previous handlers
afterwards, so lane code run in-process leaves no handler behind.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator, Mapping, Sequence

from canarchy.testing.isolation import reaper, tempbase
from canarchy.testing.isolation.tree import OWN_OUTPUT_VARIABLE
from canarchy.testing.lanes.env import SAFETY_FLAGS
from canarchy.testing.lanes.project import PLUGIN, Project

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_CANNOT_DECIDE = 2

GRACE_SECONDS = 10.0

_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
# A further signal arrived: stop with SIGKILL, now. A list, not a threading.Event: the signal
# handlers that set it must take no lock (the main thread may hold it).
_HURRY: list[int] = []
_CLOSED = threading.Event()  # the lane is stopping: start no further child


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the lane (``signum``). Not an ``Exception``: nothing swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class RunTimeout(Exception):
    """A child ran longer than its timeout and was stopped."""


_PENDING: list[int] = []  # signals that arrived outside an `interrupts()` block of a lane process
#: A further signal within this many seconds of the first is the same interrupt, not a second one: a Ctrl+C
#: reaches the lane from the terminal and again from nox, which passes each signal it gets on (noxsessions).
SAME_INTERRUPT_SECONDS = 0.5
_PENDING_AT: list[float] = []  # when the first of _PENDING arrived (time.monotonic)


def _same_interrupt(first_at: list[float]) -> bool:
    """Whether a signal arriving now is the first one (``first_at``: when it came, or empty) again."""
    return bool(first_at) and time.monotonic() - first_at[0] < SAME_INTERRUPT_SECONDS


def _note_signal(signum: int, frame: object) -> None:
    """Outside an :func:`interrupts` block: note ``signum`` (the same interrupt again: nothing)."""
    if _same_interrupt(_PENDING_AT):
        return
    if not _PENDING_AT:
        _PENDING_AT.append(time.monotonic())
    _PENDING.append(signum)
    _HURRY.append(signum)


def own_signals() -> None:
    """For a lane run as a process: from now until it exits, SIGINT/SIGTERM outside an
    :func:`interrupts` block are only noted (the next block starts interrupted), so a
    signal that arrives while the lane reports or exits cannot cut that short. On Linux the
    lane also becomes its descendants' subreaper: a process a test detached (a new session,
    a double fork) is re-parented to the lane, not to init, so :func:`stop_all` finds it."""
    global _SUBREAPER
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _note_signal)
    _SUBREAPER = reaper.become_subreaper()
    pid_file = os.environ.get(LANE_PID_VARIABLE)
    if pid_file:  # started by nox: it passes the signals it gets on to this pid, and its end is a SIGTERM
        Path(pid_file).write_text(str(os.getpid()), encoding="ascii")
        if not reaper.signal_at_parent_death(signal.SIGTERM) and sys.platform.startswith("linux"):
            _note_signal(signal.SIGTERM, None)  # nox ended before the lane could ask: as if it had said so


#: The file nox names for the lane to write its pid in (noxsessions' ``lane``).
LANE_PID_VARIABLE = "CANARCHY_LANE_PID_FILE"


_SUBREAPER = False


def _stop_adopted() -> None:
    """End what the subreaper adopted (:func:`reaper.stop_children`, the children :func:`stop_all`
    holds aside); nothing when this process is no subreaper."""
    if not _SUBREAPER:
        return
    with _LIVE_LOCK:
        held = {p.pid for p in _LIVE}
    reaper.stop_children(exclude=held)


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """Within the block, the first SIGINT/SIGTERM raises :class:`Interrupted`; any later one (past
    :data:`SAME_INTERRUPT_SECONDS`) only makes :func:`stop_all` hurry (SIGKILL). Outside the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _PENDING:
        raise Interrupted(_PENDING[0])
    seen: list[float] = []  # when the first signal arrived (time.monotonic)

    def handler(signum: int, frame: object) -> None:
        if seen:
            if not _same_interrupt(seen):
                _HURRY.append(signum)
            return
        seen.append(time.monotonic())
        if _SHIELDS:
            _HELD.append(signum)  # raised when the shielded cleanup ends
            return
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        try:
            stop_all()
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            _HURRY.clear()
            _HELD.clear()


_SHIELDS: list[bool] = []  # shielded blocks the main thread is in
_HELD: list[int] = []  # a first signal that arrived in one


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Cleanup that must finish (removing a temporary tree): within an :func:`interrupts` block, a
    first SIGINT/SIGTERM that arrives here is held and raised as :class:`Interrupted` when the
    block ends (unless an exception is already on its way). Outside the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _SHIELDS.append(True)
    try:
        yield
    finally:
        _SHIELDS.pop()
        if not _SHIELDS and _HELD and sys.exc_info()[0] is None:
            signum = _HELD.pop()
            raise Interrupted(signum)


@contextlib.contextmanager
def temporary_files_outside(project_root: str | os.PathLike[str]) -> Iterator[str]:
    """Point ``TMPDIR`` (and :mod:`tempfile`) at a directory in neither the project nor
    the operator's home for the duration (nox's session directory is inside the
    project); yields the directory. Restores both afterwards."""
    base, note = tempbase.outside_project(project_root)
    if not note:
        yield base
        return
    print(f"lanes: {note}", file=sys.stderr)
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = base
    tempfile.tempdir = None
    try:
        yield base
    finally:
        if saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved
        tempfile.tempdir = None


def _stop(proc: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """End ``proc``'s process group: SIGTERM, then SIGKILL after ``grace`` s (or a further signal)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        except PermissionError:  # pragma: no cover - a group we cannot signal: the child alone
            proc.send_signal(sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 30.0)
        while proc.poll() is None and time.monotonic() < deadline and not (_HURRY and sig == signal.SIGTERM):
            time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever the group still holds (a grandchild)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def stop_all() -> None:
    """Stop every child still running (children of every thread), then what the subreaper adopted."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _stop(proc)
    _stop_adopted()


@dataclass
class Run:
    """One finished child: its argv, exit code, log file, seconds."""

    argv: list[str]
    returncode: int
    log: Path
    duration: float
    junit: Path | None = None
    extra: dict = field(default_factory=dict)

    @property
    def output(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


#: What a log keeps of a run's output: its first and its last this many bytes (a test that prints
#: hundreds of megabytes fills no disk; pytest's summary, at the end, stays).
LOG_KEEPS = 16 * 2**20


class _BoundedLog:
    """Writes the first and the last :data:`LOG_KEEPS` bytes of what it is given to ``fh`` (the last ones
    at :meth:`close`, after a line saying how much was left out); memory: at most the last ones."""

    def __init__(self, fh, keeps: int | None = None) -> None:
        self.fh, self.keeps, self.head = fh, keeps or LOG_KEEPS, 0
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_bytes = self.dropped = 0

    def write(self, chunk: bytes) -> None:
        if self.head < self.keeps:
            kept = chunk[:self.keeps - self.head]
            self.fh.write(kept)
            self.head += len(kept)
            chunk = chunk[len(kept):]
        if chunk:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes > self.keeps:
                excess = self.tail_bytes - self.keeps
                first = self.tail.popleft()
                if len(first) > excess:
                    self.tail.appendleft(first[excess:])
                cut = min(excess, len(first))
                self.tail_bytes -= cut
                self.dropped += cut

    def close(self) -> None:
        if self.dropped:
            self.fh.write(f"\n[canarchy lanes: {self.dropped} bytes of the run's output left out here: the log "
                          f"keeps its first and its last {self.keeps // 2**20} MiB]\n".encode())
        self.fh.writelines(self.tail)
        self.tail.clear()


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | os.PathLike[str] | None, log: Path,
        echo: bool = False, timeout: float | None = None) -> Run:
    """Run ``argv`` to completion with its output in ``log`` (its first and last :data:`LOG_KEEPS` bytes)
    and, when ``echo``, all of it on our stdout.

    Raises :class:`RunTimeout` after ``timeout`` seconds (the child is stopped first).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "wb") as fh:
        kept = _BoundedLog(fh)
        with _LIVE_LOCK:  # checked and registered under the lock that stop_all lists under
            if _CLOSED.is_set():
                raise RunTimeout(f"{' '.join(map(str, argv[:4]))} ... not started: the lane is stopping")
            proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            _LIVE.add(proc)
        try:
            reader = threading.Thread(target=_copy_output, args=(proc, kept, echo), daemon=True)
            reader.start()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise RunTimeout(f"{' '.join(map(str, argv[:4]))} ... ran over {timeout:.0f} s (log: {log})") from None
        finally:
            _stop(proc)
            with _LIVE_LOCK:
                _LIVE.discard(proc)
            reader.join(READER_GRACE_S)  # the output a stopped run wrote last; a pipe held open elsewhere: not
            if not reader.is_alive():  # (a read in progress holds the pipe's lock: one still reading keeps it)
                proc.stdout.close()  # type: ignore[union-attr]
    return Run(list(argv), proc.returncode, log, time.monotonic() - started)


READER_GRACE_S = 10.0


def _copy_output(proc: subprocess.Popen, kept: _BoundedLog, echo: bool) -> None:
    """Copy the run's output into its log (and our stdout when ``echo``) until the pipe ends; then the log's
    last part. A log closed meanwhile (the run given up on) ends it."""
    assert proc.stdout is not None
    try:
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            kept.write(chunk)
            if echo:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        kept.close()
    except (OSError, ValueError):
        pass


def junit_path(pytest_args: Sequence[str]) -> Path:
    """The single ``--junitxml=PATH`` in ``pytest_args``; ``ValueError`` if absent or repeated."""
    found = [a.split("=", 1)[1] for a in pytest_args if a.startswith("--junitxml=")]
    if len(found) != 1 or any(a == "--junitxml" for a in pytest_args):
        raise ValueError("pytest arguments must contain exactly one --junitxml=PATH")
    return Path(found[0])


def pytest_flags(project: Project) -> list[str]:
    """What every lane's pytest starts with: :data:`~canarchy.testing.lanes.env.SAFETY_FLAGS`, and ``-p`` the
    isolation plugin for a project whose configuration loads it (:attr:`Project.uses_plugin`; a second ``-p``
    of a loaded plugin is a no-op). A stray pytest.ini, pytest.toml, tox.ini or setup.cfg that shadows that
    configuration then cannot run a test unisolated: the plugin names it and refuses the run first. Then
    ``-p xdist -n 0``: a run is serial whatever ``-n`` the project's addopts give (a lane that wants workers
    gives its own ``-n`` later, :func:`xdist_options`), and such an ``-n`` is no unrecognized argument."""
    return [*SAFETY_FLAGS, *(["-p", PLUGIN] if project.uses_plugin else []), *xdist_options(0)]


def run_pytest(pytest_args: Sequence[str], *, env: Mapping[str, str], cwd: str | os.PathLike[str] | None = None,
               log: Path | None = None, python: str = sys.executable, echo: bool = False,
               timeout: float | None = None, prefix: Sequence[str] = ()) -> Run:
    """``python -m pytest PYTEST_ARGS`` (exactly one ``--junitxml=PATH``, relative to ``cwd``).

    A stale report from an earlier run is removed first, so it can never be
    read as this run's; ``log`` defaults to the report's path with ``.log``;
    ``prefix`` wraps the command (e.g. :func:`~canarchy.testing.lanes.netns.netns_command`'s).
    pytest's cache (its ``cache`` fixture, ``--lf``) lives in an empty temporary directory of the
    run's own, unless PYTEST_ARGS disable it: nothing of an earlier run, nothing in the checkout.
    """
    junit = junit_path(pytest_args)
    if cwd is not None and not junit.is_absolute():
        junit = Path(cwd) / junit
    junit.unlink(missing_ok=True)
    junit.parent.mkdir(parents=True, exist_ok=True)
    log = log or junit.with_suffix(".log")
    env = {**env, OWN_OUTPUT_VARIABLE: os.pathsep.join(str(p.resolve()) for p in (junit, log))}
    with tempfile.TemporaryDirectory(prefix="canarchy-pytest-cache-") as cache:
        cached = [] if "no:cacheprovider" in pytest_args else ["-o", f"cache_dir={cache}"]
        result = run([*prefix, python, "-m", "pytest", *cached, *pytest_args], env=env, cwd=cwd, log=log,
                     echo=echo, timeout=timeout)
    result.junit = junit
    return result


def split_pytest_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(lane options, pytest arguments)``: what comes before and after the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def cores() -> int:
    """The cores this process may run on (at least 1)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def workers(requested: int | None = None) -> int:
    """pytest-xdist workers for a lane's run: ``requested`` (0: none, the tests run in the pytest
    process), else two per core: suites like these wait more than they compute (docs/benchmarks.md §2)."""
    if requested is not None:
        return max(requested, 0)
    return 2 * cores()


def xdist_options(count: int) -> list[str]:
    """pytest's arguments for ``count`` pytest-xdist workers (0: the tests run in the pytest process)."""
    return ["-p", "xdist", "-n", str(count)]


def stopping() -> bool:
    """True once an interrupt reached :func:`concurrently`: a job should only clean up, not start over."""
    return _CLOSED.is_set()


def concurrently(jobs: Sequence, workers: int = 2) -> list:  # type: ignore[type-arg]
    """Call each of ``jobs`` (no-argument callables), ``workers`` at a time; their results in order.

    An exception in a job is re-raised here after all have ended; an interrupt
    (which reaches only the main thread) stops every child first, queued jobs
    never start, and a running job can start no further child (:func:`run`
    raises :class:`RunTimeout`). Returns or raises only when every job has ended.
    """
    results: list = [None] * len(jobs)
    errors: list[BaseException] = []
    queue = list(enumerate(jobs))
    lock = threading.Lock()
    cancelled = threading.Event()
    # Each worker's own "ended" event, not Thread.join(): on CPython 3.11 a join cut short by a
    # signal handler's exception marks the still-running thread as stopped (bpo-45274's fix), and
    # every later join returns at once while the job is still working in its copy.
    ended = [threading.Event() for _ in range(max(1, min(workers, len(jobs))))]

    def worker(done: threading.Event) -> None:
        try:
            while not cancelled.is_set():
                with lock:
                    if not queue:
                        return
                    index, job = queue.pop(0)
                try:
                    results[index] = job()
                except BaseException as exc:
                    errors.append(exc)
        finally:
            done.set()

    threads = [threading.Thread(target=worker, args=(done,), daemon=True) for done in ended]
    try:
        for thread in threads:
            thread.start()
        for done in ended:
            done.wait()
    except BaseException:
        with _LIVE_LOCK:
            _CLOSED.set()
        raise
    finally:
        cancelled.set()
        stop_all()
        for thread, done in zip(threads, ended, strict=True):
            if thread.ident is not None:
                done.wait()  # in a lane a further signal only hurries stop_all: nothing raises here
        _CLOSED.clear()
    if errors:
        raise errors[0]
    return results
