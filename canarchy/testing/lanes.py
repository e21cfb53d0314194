"""Shared logic of the nox lanes: environments, manifests, the private network namespace, verdicts.

The noxfile stays thin (style.md); what it needs lives here, stdlib-only at
import time so nox's own interpreter can load this file without the project's
dependencies (``junitparser`` is imported only by the verdict code, which runs
inside a lane's virtualenv).

Environment (harness.md §3, "a lane's environment is built explicitly")
    :func:`build_env` starts from nothing and copies only
    :data:`ALLOWED_VARIABLES` (and ``LC_*``) from the caller, then sets what
    the lane decides: ``HOME``/``USERPROFILE`` (a disposable directory),
    ``PYTHONHASHSEED``, ``PYTHONDONTWRITEBYTECODE=1`` (a run leaves no
    ``__pycache__`` in the checkout), ``PYTHONNOUSERSITE=1``. No ``CANARCHY_*``,
    ``CAN_*``, ``XDG_*`` or ``PYTHON*`` variable of the caller gets through
    unless a lane names it in ``passthrough``.

Manifests
    :func:`manifest` records every entry under a directory (relative POSIX
    path -> kind, size in bytes, SHA-256 of the content or the link target);
    :func:`diff_manifests` lists what was added, removed or changed.

Private network namespace (Linux, root)
    :func:`netns_support` probes ``unshare --net`` once;
    :func:`netns_command` wraps a command so that it runs in a fresh network
    namespace holding only ``lo`` (up) and a route for IPv4 multicast
    (``224.0.0.0/4 dev lo``). The namespace dies with the last process in it.
    Measured on Linux 6.x with python-can 4.6 ``udp_multicast``: the IPv6
    default group (``ff15:7079:…``) fails to join with ENODEV and, with an
    ``ff00::/8`` route on ``lo``, joins but delivers nothing; the IPv4 group
    :data:`NETNS_GROUP` (``239.74.163.2``, python-can's ``DEFAULT_GROUP_IPv4``)
    round-trips frames once the multicast route exists. ``udp_multicast`` also
    needs ``msgpack`` (python-can's ``multicast`` extra).

CLI (called by the noxfile inside a lane's virtualenv)::

    python -m canarchy.testing.lanes run --lane NAME [--bus none|private|operator] -- PYTEST_ARGS
    python -m canarchy.testing.lanes parity --operator-home DIR [--allowlist F] -- PYTEST_ARGS
    python -m canarchy.testing.lanes netns-check

``PYTEST_ARGS`` are pytest's arguments (without ``-m pytest``) and contain
exactly one ``--junitxml=PATH``. Exit codes: 0 passed / identical,
1 failed / different, 2 cannot decide.

Public surface: :func:`build_env`, :func:`manifest`, :func:`diff_manifests`,
:func:`tree_manifest`, :func:`choose_tests`, :func:`netns_support`, :func:`containment`, :func:`netns_command`,
:func:`netns_roundtrip`, :func:`run_pytest`, :func:`lane_verdict`,
:func:`run_parity`, :data:`HOSTILE_ENV`, :data:`OPERATOR_BUS_VARIABLES`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_CANNOT_DECIDE = 2

#: Variables a lane copies from the caller: what programs need to run and to
#: print, nothing that can change what a test decides.
ALLOWED_VARIABLES = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TERM",
    "NO_COLOR",
    "TZ",
    "TMPDIR",
    "TEMP",
    "TMP",
    # Windows: the C runtime and sockets need these.
    "SYSTEMROOT",
    "SYSTEMDRIVE",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
)
ALLOWED_PREFIXES = ("LC_",)

#: The variables through which an operator names a real bus for the integration lane.
OPERATOR_BUS_VARIABLES = ("CANARCHY_PYTHON_CAN_INTERFACE", "CANARCHY_DEFAULT_INTERFACE")

#: python-can ``udp_multicast``'s IPv4 default group: the channel of the bus the
#: integration lane provides inside the private namespace.
NETNS_GROUP = "239.74.163.2"

#: The shell the configured parity twin runs in: every variable canarchy or
#: python-can reads, set to values that would change an unisolated result.
#: Paths that point into the operator home use ``{home}``.
HOSTILE_ENV: dict[str, str] = {
    "CANARCHY_TRANSPORT_BACKEND": "python-can",
    "CANARCHY_PYTHON_CAN_INTERFACE": "udp_multicast",
    "CANARCHY_DEFAULT_INTERFACE": "can9",
    "CANARCHY_CAPTURE_LIMIT": "7",
    "CANARCHY_CAPTURE_TIMEOUT": "0.5",
    "CANARCHY_REQUIRE_ACTIVE_ACK": "1",
    "CANARCHY_MCP_NONINTERACTIVE_ACK": "1",
    "CANARCHY_J1939_DBC": "{home}/.canarchy/cache/dbc/providers/opendbc/files/"
    "3f1c2a9e5b7d4c6f8a0b1c2d3e4f5a6b7c8d9e0f/j1939_operator.dbc",
    "CANARCHY_J1939_SPN_OVERRIDES": "{home}/.canarchy/j1939_spns.json",
    "CANARCHY_J1587_PID_OVERRIDES": "{home}/.canarchy/j1587_pids.json",
    "CANARCHY_J2497_MID_OVERRIDES": "{home}/.canarchy/j2497_mids.json",
    "CAN_INTERFACE": "socketcan",
    "CAN_CHANNEL": "can0",
    "CAN_BITRATE": "500000",
    "CAN_CONFIG": '{"receive_own_messages": true}',
    "CAN_INTERFACE_X": "udp_multicast",
    "CAN_CHANNEL_X": "can1",
    "CAN_CONFIG_X": '{"fd": true}',
    "XDG_CONFIG_HOME": "{home}/.config",
    "XDG_CACHE_HOME": "{home}/.cache",
}

#: Entries a checkout manifest leaves out: git's own data, the lanes' outputs,
#: virtualenvs and byte code (all ignored by git).
CHECKOUT_EXCLUDES = frozenset({".git", ".nox", "reports", ".venv", "__pycache__", "build", "dist"})

_NOT_SHUT_DOWN = "was not properly shut down"


# --------------------------------------------------------------------------- environment


def build_env(
    *,
    home: str | os.PathLike[str],
    hashseed: int | str = 0,
    extra: Mapping[str, str] | None = None,
    passthrough: Iterable[str] = (),
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return a lane environment built from an allow-list, not from the caller's shell.

    ``source`` (default ``os.environ``) supplies only :data:`ALLOWED_VARIABLES`,
    ``LC_*`` and the names in ``passthrough`` (copied when set); ``home``
    becomes ``HOME`` and ``USERPROFILE``; ``extra`` is applied last and wins.

    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``: a lane's pytest loads the plugins the
    project names (``pytest_plugins`` in a conftest, ``-p``) and none of the
    ``pytest11`` entry points that happen to be installed in the interpreter
    (an operator's pytest-benchmark makes ``.benchmarks/`` in the checkout,
    pytest-randomly reorders tests), so a verdict does not depend on them.
    Children a test starts with its own environment decide for themselves.
    """
    source = os.environ if source is None else source
    env = {
        name: value
        for name, value in source.items()
        if name in ALLOWED_VARIABLES or name.startswith(ALLOWED_PREFIXES)
    }
    for name in passthrough:
        if name in source:
            env[name] = source[name]
    env["HOME"] = os.fspath(home)
    env["USERPROFILE"] = os.fspath(home)
    env["PYTHONHASHSEED"] = str(hashseed)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.update(extra or {})
    return env


#: Options posargs may pass to a lane: they choose tests and nothing else.
SELECTION_OPTIONS = ("-k", "-m", "--deselect")


def choose_tests(
    posargs: Sequence[str],
    *,
    fixed_markexpr: str | None = None,
    default: str = "tests",
    root: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Check a lane's posargs and return pytest's test selection.

    Accepted: paths and node ids inside the checkout ``root`` (default: the
    working directory; a test file elsewhere would run without this
    project's conftest and so without its isolation), ``-k EXPR``, ``-m
    EXPR`` (not when the lane fixes ``-m`` itself, and never naming
    ``integration`` outside that lane), ``--deselect ID``, each with a
    separate or ``=`` value. Without a path the selection is ``default``.
    Raises ``ValueError`` naming the refused token, so posargs can never
    switch a safety flag off, move the JUnit report or leave the checkout.
    """
    base = Path(os.getcwd() if root is None else root).resolve()
    args, options, paths = list(posargs), [], []
    while args:
        token = args.pop(0)
        if token.startswith("@"):
            raise ValueError(f"{token!r}: pytest would read arguments from that file; give them on the command line")
        if not token.startswith("-"):
            target = (base / token.split("::", 1)[0]).resolve()
            if target != base and base not in target.parents:
                raise ValueError(f"posargs choose tests of this checkout ({base}); {token!r} is outside it")
            paths.append(token)
            continue
        option, has_value, value = token.partition("=")
        if option not in SELECTION_OPTIONS or (option == "-m" and fixed_markexpr is not None):
            raise ValueError(
                f"posargs only choose tests (paths, node ids, -k, -m, --deselect); {token!r} is not allowed in this lane"
            )
        if not has_value:
            if not args:
                raise ValueError(f"{token} needs a value")
            value = args.pop(0)
        if value.startswith("@"):
            raise ValueError(f"{value!r}: pytest would read arguments from that file; give them on the command line")
        if option == "-m" and "integration" in value:
            raise ValueError("integration tests run in their own lane: nox -s integration")
        if option == "-m" and ("real_bus" in value or "real_home" in value):
            raise ValueError("real_bus and real_home tests reach the operator's bus or home: no lane runs them; "
                             "run them by hand (python -m pytest -m real_bus)")
        options += [option, value]
    return [*options, *(paths or [default])]


# --------------------------------------------------------------------------- manifests


@dataclass(frozen=True)
class Entry:
    """One manifest entry: ``kind`` is ``file``, ``dir`` or ``link``; ``size`` in bytes;
    ``sha256`` of the content (files) or of the link target (links)."""

    kind: str
    size: int
    sha256: str


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(root: str | os.PathLike[str], *, exclude: Iterable[str] = ()) -> dict[str, Entry]:
    """Describe every file, directory and symlink under ``root``.

    Keys are POSIX paths relative to ``root``; symlinks are recorded, never
    followed. Names in ``exclude`` are skipped wherever they occur (with
    everything under them). Raises ``FileNotFoundError`` if ``root`` is missing.
    """
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"{base}: not a directory")
    skipped = frozenset(exclude)
    result: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in skipped)
        current = Path(dirpath)
        for name in list(dirnames):
            path = current / name
            rel = path.relative_to(base).as_posix()
            if path.is_symlink():
                dirnames.remove(name)  # os.walk does not follow it; record it as a link
                target = os.readlink(path)
                result[rel] = Entry("link", len(target), hashlib.sha256(target.encode()).hexdigest())
            else:
                result[rel] = Entry("dir", 0, "")
        for name in sorted(filenames):
            if name in skipped:
                continue
            path = current / name
            rel = path.relative_to(base).as_posix()
            if path.is_symlink():
                target = os.readlink(path)
                result[rel] = Entry("link", len(target), hashlib.sha256(target.encode()).hexdigest())
            elif path.is_file():
                result[rel] = Entry("file", path.stat().st_size, _sha256_file(path))
            else:  # socket, fifo: record that it exists
                result[rel] = Entry("other", 0, "")
    return result


def tree_manifest(root: str | os.PathLike[str]) -> dict[str, Entry]:
    """Manifest of a checkout, without :data:`CHECKOUT_EXCLUDES` and ``*.egg-info``."""
    entries = manifest(root, exclude=CHECKOUT_EXCLUDES)
    return {k: v for k, v in entries.items() if not any(part.endswith(".egg-info") for part in k.split("/"))}


def diff_manifests(before: Mapping[str, Entry], after: Mapping[str, Entry]) -> list[str]:
    """Differences as sorted lines: ``added: p``, ``removed: p``, ``changed: p (...)``; [] when equal."""
    lines: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if old is None:
            lines.append(f"added: {path}")
        elif new is None:
            lines.append(f"removed: {path}")
        elif old.kind != new.kind:
            lines.append(f"changed: {path} ({old.kind} -> {new.kind})")
        elif old.kind == "link":
            lines.append(f"changed: {path} (link target changed)")
        elif old.size != new.size:
            lines.append(f"changed: {path} ({old.size} -> {new.size} bytes)")
        else:
            lines.append(f"changed: {path} (same size, different content)")
    return lines


# --------------------------------------------------------------------------- network namespace


@dataclass(frozen=True)
class NetnsSupport:
    """Whether :func:`netns_command` can be used here; ``reason`` says why (not)."""

    available: bool
    reason: str
    unshare: str | None = None
    ip: str | None = None


_NETNS_CACHE: NetnsSupport | None = None
_SBIN_PATH = os.pathsep.join(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])


def _setup_script(ip: str) -> str:
    return f"{ip} link set lo up && {ip} route add 224.0.0.0/4 dev lo"


def netns_support(*, refresh: bool = False) -> NetnsSupport:
    """Probe once whether a private network namespace can be made (Linux, root, ``unshare``, ``ip``)."""
    global _NETNS_CACHE
    if _NETNS_CACHE is not None and not refresh:
        return _NETNS_CACHE
    _NETNS_CACHE = _probe_netns()
    return _NETNS_CACHE


def _probe_netns() -> NetnsSupport:
    if not sys.platform.startswith("linux"):
        return NetnsSupport(False, f"network namespaces are Linux-only (this is {sys.platform})")
    if os.geteuid() != 0:
        return NetnsSupport(False, "creating a network namespace needs root (run the lane as root, or use --operator-bus)")
    search = os.pathsep.join(filter(None, [os.environ.get("PATH"), _SBIN_PATH]))
    unshare, ip = shutil.which("unshare", path=search), shutil.which("ip", path=search)
    if unshare is None or ip is None:
        missing = " and ".join(n for n, p in (("unshare", unshare), ("ip", ip)) if p is None)
        return NetnsSupport(False, f"{missing} not found (util-linux / iproute2)")
    try:
        proc = subprocess.run(
            [unshare, "--net", "--", "sh", "-c", _setup_script(ip)],
            capture_output=True,
            text=True,
            timeout=10,
            env={"PATH": _SBIN_PATH},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return NetnsSupport(False, f"`unshare --net` could not run: {exc}")
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        return NetnsSupport(False, f"`unshare --net` failed: {detail[-1] if detail else proc.returncode}")
    return NetnsSupport(True, "private network namespace (loopback only, IPv4 multicast routed to lo)", unshare, ip)


def containment() -> tuple[bool, str]:
    """Whether a lane that runs a test suite runs it in a private network namespace, and a note saying so.

    Every lane that runs canarchy's suite does, where the machine allows it
    (:func:`netns_support`). The suite's self-tests start child pytests under
    a hostile operator shell that names ``socketcan``/``can0`` and
    ``udp_multicast``; the bus guard refuses them. The namespace is the
    second wall, for a guard regression or a child the guard cannot reach
    (``python -I``, ``env={}``): a fresh network namespace has no CAN
    interface and no route off the machine, only ``lo``.
    Returns ``(True, note)`` or ``(False, note with the reason)``.
    """
    support = netns_support()
    if support.available:
        return True, "network: a private namespace (loopback only): no CAN interface, no route off the machine"
    return False, f"network: the host's ({support.reason}); the bus guard is the only wall"


def netns_command(argv: Sequence[str], support: NetnsSupport | None = None) -> list[str]:
    """Wrap ``argv`` to run in a fresh network namespace holding only ``lo``.

    The wrapped command execs in place of the shell, so signals reach it and
    the namespace ends when it exits. Raises ``RuntimeError`` when
    :func:`netns_support` says it is unavailable.
    """
    support = support or netns_support()
    if not support.available or support.unshare is None or support.ip is None:
        raise RuntimeError(f"no private network namespace: {support.reason}")
    return [support.unshare, "--net", "--", "sh", "-c", _setup_script(support.ip) + ' && exec "$@"', "sh", *argv]


_ROUNDTRIP_CODE = """
import sys, can
group = sys.argv[1]
a = can.Bus(interface="udp_multicast", channel=group, ignore_config=True)
try:
    b = can.Bus(interface="udp_multicast", channel=group, ignore_config=True)
    try:
        sent = can.Message(arbitration_id=0x18FEF100, is_extended_id=True, data=bytes(range(8)))
        a.send(sent)
        got = b.recv(2.0)
        ok = got is not None and got.arbitration_id == sent.arbitration_id and bytes(got.data) == bytes(sent.data)
        print("round trip ok" if ok else f"round trip FAILED: received {got!r}")
        sys.exit(0 if ok else 1)
    finally:
        b.shutdown()
finally:
    a.shutdown()
"""


def netns_roundtrip(python: str, *, env: Mapping[str, str] | None = None, timeout: float = 30) -> tuple[bool, str]:
    """Prove the provided bus works: inside a private namespace, two python-can
    ``udp_multicast`` buses on :data:`NETNS_GROUP` in one process exchange one
    extended frame. Returns (ok, output). Needs ``msgpack`` in ``python``.
    """
    support = netns_support()
    if not support.available:
        return False, support.reason
    argv = netns_command([python, "-c", _ROUNDTRIP_CODE, NETNS_GROUP], support)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None)
    except subprocess.TimeoutExpired:
        return False, f"round trip timed out after {timeout} s"
    output = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0 and "round trip ok" in proc.stdout, output


# --------------------------------------------------------------------------- running pytest


# pytest processes started by run_pytest and still running (parity runs two from threads).
_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _stop_all() -> None:
    """Stop every pytest process still running (an interrupt reached only this thread)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _stop(proc)


@dataclass
class PytestRun:
    """One pytest process: exit code, its output, the parsed summary line, duration (s)."""

    returncode: int
    output: str
    summary: dict[str, int] | None
    duration: float
    junit: Path
    log: Path


def junit_path(pytest_args: Sequence[str]) -> Path:
    """The single ``--junitxml=PATH`` in ``pytest_args``; ``ValueError`` if absent or repeated."""
    found = [a.split("=", 1)[1] for a in pytest_args if a.startswith("--junitxml=")]
    if len(found) != 1 or any(a == "--junitxml" for a in pytest_args):
        raise ValueError("pytest arguments must contain exactly one --junitxml=PATH")
    return Path(found[0])


def with_junit(pytest_args: Sequence[str], path: Path) -> list[str]:
    """``pytest_args`` with its ``--junitxml=`` replaced by ``path``."""
    junit_path(pytest_args)
    return [f"--junitxml={path}" if a.startswith("--junitxml=") else a for a in pytest_args]


def run_pytest(
    python: str,
    pytest_args: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    netns: bool = False,
    echo: bool = True,
    cwd: str | os.PathLike[str] | None = None,
) -> PytestRun:
    """Run ``python -m pytest PYTEST_ARGS`` and keep its output in ``log``.

    ``echo`` also streams the output to our stdout (one lane at a time);
    ``netns`` runs it in a private network namespace. A stale JUnit file
    from an earlier run is removed first so it can never be read as this run's.
    """
    junit = junit_path(pytest_args)
    if cwd is not None and not junit.is_absolute():
        junit = Path(cwd) / junit
    junit.unlink(missing_ok=True)
    junit.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pytest", *pytest_args]
    if netns:
        argv = netns_command(argv)
    start = time.monotonic()
    chunks: list[str] = []
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                chunks.append(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            proc.wait()
        finally:
            _stop(proc)
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    from canarchy.testing.junit_compare import parse_summary

    output = "".join(chunks)
    return PytestRun(proc.returncode, output, parse_summary(output), time.monotonic() - start, junit, log)


@dataclass
class Verdict:
    """A lane's verdict: ``status`` PASSED / FAILED / CANNOT DECIDE / NOT PROVEN, a one-line
    ``detail``, ``failing`` test ids, Markdown ``markdown``; ``exit_code`` 0/1/2."""

    lane: str
    status: str
    detail: str
    failing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"PASSED": EXIT_PASSED, "NOT PROVEN": EXIT_PASSED, "FAILED": EXIT_FAILED}.get(
            self.status, EXIT_CANNOT_DECIDE
        )

    def line(self) -> str:
        return f"{self.lane}: {self.status} - {self.detail}"

    def markdown(self) -> str:
        out = [f"# {self.lane}: {self.status}", "", self.detail, ""]
        if self.notes:
            out.extend(f"- {n}" for n in self.notes)
            out.append("")
        if self.failing:
            out.append(f"## Failing ({len(self.failing)})")
            out.append("")
            out.extend(f"- `{t}`" for t in self.failing)
            out.append("")
        return "\n".join(out)


def _summary_text(summary: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {w}" for w, n in summary.items()) or "no tests ran"


def lane_verdict(lane: str, run: PytestRun, *, notes: Iterable[str] = ()) -> Verdict:
    """Judge one pytest run: cannot decide on a missing/unreadable/empty report, a
    missing summary line, or a report that disagrees with pytest's count; else
    FAILED on a non-zero exit; NOT PROVEN when every case skipped; else PASSED."""
    from canarchy.testing.junit_compare import CannotDecide, load_report, summary_total

    notes = list(notes)
    where = f"(JUnit: {run.junit}, log: {run.log}, {run.duration:.1f} s)"
    try:
        report = load_report(run.junit)
    except CannotDecide as exc:
        return Verdict(lane, "CANNOT DECIDE", f"{exc}; pytest exit code {run.returncode} {where}", notes=notes)
    if run.summary is None:
        return Verdict(lane, "CANNOT DECIDE", f"pytest printed no summary line; exit code {run.returncode} {where}", notes=notes)
    if not report.cases:
        return Verdict(lane, "CANNOT DECIDE", f"zero tests selected ({_summary_text(run.summary)}) {where}", notes=notes)
    if report.counted != summary_total(run.summary):
        return Verdict(
            lane,
            "CANNOT DECIDE",
            f"the report accounts for {report.counted} outcome(s), pytest printed "
            f"{summary_total(run.summary)} ({_summary_text(run.summary)}) {where}",
            notes=notes,
        )
    failing = sorted(k for k, c in report.cases.items() if c.is_failing)
    if run.returncode != 0 or failing:
        return Verdict(lane, "FAILED", f"{_summary_text(run.summary)}; exit code {run.returncode} {where}", failing, notes)
    if all(c.outcome == "skipped" for c in report.cases.values()):
        return Verdict(lane, "NOT PROVEN", f"every test skipped: {_summary_text(run.summary)} {where}", notes=notes)
    return Verdict(lane, "PASSED", f"{_summary_text(run.summary)} {where}", notes=notes)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class _Terminated(BaseException):
    """Raised by the SIGTERM handler so ``finally`` blocks clean up."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


def _raise_on_sigterm() -> None:
    """Turn SIGTERM into an exception so temporary homes are removed on the way out
    (SIGINT already arrives as KeyboardInterrupt)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


# --------------------------------------------------------------------------- lanes


PRIVATE_BUS_VARIABLE = "CANARCHY_TEST_PRIVATE_BUS"
ALLOW_TRANSMIT_VARIABLE = "CANARCHY_INTEGRATION_ALLOW_TRANSMIT"


def _integration_bus(env: dict[str, str], python: str, operator: bool) -> tuple[bool, list[str], str | None]:
    """Decide the integration lane's bus. Returns (use netns, notes, error).

    ``operator`` false (the default, and what ``nox`` runs): a private
    loopback-only namespace where the machine allows it, else no bus; an
    exported operator bus is *ignored* (its variables are removed) because
    the integration tests transmit. ``operator`` true (``nox -s integration
    -- --operator-bus``): the bus the operator exported, with transmitting
    tests allowed; an error if none is exported.
    """
    exported = {n: env[n] for n in OPERATOR_BUS_VARIABLES if env.get(n)}
    if operator:
        if not exported:
            return False, [], (f"--operator-bus needs {' and '.join(OPERATOR_BUS_VARIABLES)} exported "
                               "(the operator's bus type and channel)")
        shown = ", ".join(f"{n}={v}" for n, v in exported.items())
        env[ALLOW_TRANSMIT_VARIABLE] = "1"
        return False, [f"bus: the operator's ({shown}), on this machine's network, "
                       "chosen with --operator-bus: the integration tests transmit on it"], None
    notes = []
    for name in exported:
        del env[name]
    if exported:
        notes.append(f"ignored the exported operator bus ({', '.join(exported)}): the integration tests transmit; "
                     "run `nox -s integration -- --operator-bus` to use it")
    support = netns_support()
    if support.available:
        env["CANARCHY_PYTHON_CAN_INTERFACE"] = "udp_multicast"
        env["CANARCHY_DEFAULT_INTERFACE"] = NETNS_GROUP
        env[PRIVATE_BUS_VARIABLE] = "1"
        ok, output = netns_roundtrip(python, env=env)
        if not ok:
            return True, notes, f"the provided udp_multicast bus does not work in the namespace: {output}"
        return True, [
            *notes,
            f"bus: provided - python-can udp_multicast on {NETNS_GROUP} inside a private network namespace "
            "(loopback only; nothing leaves it)",
            "preflight: two buses exchanged a frame in the namespace (round trip ok)",
        ], None
    return False, [
        *notes,
        f"bus: none - {support.reason}; run `nox -s integration -- --operator-bus` with "
        f"{' and '.join(OPERATOR_BUS_VARIABLES)} exported to use a real bus. The bus tests skip with a reason."
    ], None


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: one pytest run with its verdict (unit and integration lanes)."""
    _raise_on_sigterm()
    env = dict(os.environ)
    junit = junit_path(args.pytest_args)
    log = junit.with_suffix(".log")
    notes: list[str] = []
    netns = False
    if args.bus in ("private", "operator"):
        netns, notes, error = _integration_bus(env, sys.executable, operator=args.bus == "operator")
        if error:
            verdict = Verdict(args.lane, "CANNOT DECIDE", error, notes=notes)
            print(verdict.line())
            _write_atomically(junit.with_suffix(".md"), verdict.markdown())
            return verdict.exit_code
    else:
        netns, note = containment()
        notes.append(note)
    for note in notes:
        print(f"{args.lane}: {note}")
    with tempfile.TemporaryDirectory(prefix=f"canarchy-{args.lane}-") as tmp:
        home, child_tmp = Path(tmp) / "home", Path(tmp) / "tmp"
        home.mkdir()
        child_tmp.mkdir()
        # A fresh home, and TMPDIR inside our directory: what the run leaves behind goes with it.
        env.update(HOME=str(home), USERPROFILE=str(home), TMPDIR=str(child_tmp))
        run = run_pytest(sys.executable, args.pytest_args, env=env, log=log, netns=netns)
    verdict = lane_verdict(args.lane, run, notes=notes)
    _write_atomically(junit.with_suffix(".md"), verdict.markdown())
    print(verdict.line())
    for test_id in verdict.failing[:30]:
        print(f"  failing: {test_id}")
    return verdict.exit_code


@dataclass
class ParityResult:
    """Everything the parity lane found; ``exit_code`` 0 identical, 1 different, 2 cannot decide."""

    comparison: object
    runs: dict[str, PytestRun]
    not_shut_down: dict[str, list[str]]
    home_changes: list[str]
    checkout_changes: list[str]
    hashseeds: dict[str, int]
    netns_note: str

    @property
    def exit_code(self) -> int:
        code = self.comparison.exit_code  # type: ignore[attr-defined]
        if code == EXIT_CANNOT_DECIDE:
            return code
        if code or any(self.not_shut_down.values()) or self.home_changes or self.checkout_changes:
            return EXIT_FAILED
        return EXIT_PASSED


def run_parity(
    python: str,
    pytest_args: Sequence[str],
    *,
    operator_home: Path,
    checkout: Path,
    allowlist: Path | None,
    source_env: Mapping[str, str],
    hashseeds: tuple[int, int] | None = None,
    use_netns: bool | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> ParityResult:
    """Run the suite twice at once - clean twin (empty home, clean shell) and
    configured twin (a copy of ``operator_home`` and :data:`HOSTILE_ENV`), each
    in its own private network namespace where available (:func:`containment`;
    ``use_netns`` False/True forces it); ``extra_env`` is set in both,
    e.g. a ``PYTHONPATH``) - then compare the reports,
    scan both logs for "was not properly shut down", and check that the home
    copy and the checkout are byte-for-byte unchanged.
    """
    from canarchy.testing import junit_compare

    base_junit = junit_path(pytest_args)
    seeds = hashseeds or tuple(random.sample(range(1, 2**31), 2))  # type: ignore[assignment]
    support = netns_support()
    netns = support.available if use_netns is None else use_netns
    netns_note = (
        "both twins ran in private network namespaces (loopback only)" if netns
        else f"no private network namespace ({support.reason})"
    )
    fixture_manifest = manifest(operator_home)
    checkout_before = tree_manifest(checkout)
    runs: dict[str, PytestRun] = {}
    with tempfile.TemporaryDirectory(prefix="canarchy-parity-") as tmp:
        clean_home = Path(tmp) / "clean-home"
        clean_home.mkdir()
        op_home = Path(tmp) / "operator-home"
        shutil.copytree(operator_home, op_home, symlinks=True)
        if diff_manifests(fixture_manifest, manifest(op_home)):
            raise RuntimeError("the operator home copy differs from the fixture before the run")
        tmpdirs = {name: Path(tmp) / f"{name}-tmp" for name in ("clean", "operator")}
        for d in tmpdirs.values():
            d.mkdir()
        hostile = {k: v.replace("{home}", str(op_home)) for k, v in HOSTILE_ENV.items()}
        twins = {
            "clean": (
                build_env(
                    home=clean_home, hashseed=seeds[0], source=source_env,
                    extra={**(extra_env or {}), "TMPDIR": str(tmpdirs["clean"])},
                ),
                netns,
            ),
            "operator": (
                build_env(
                    home=op_home, hashseed=seeds[1], source=source_env,
                    extra={**(extra_env or {}), **hostile, "TMPDIR": str(tmpdirs["operator"])},
                ),
                netns,
            ),
        }
        errors: dict[str, BaseException] = {}

        def _run(name: str) -> None:
            env, in_netns = twins[name]
            junit = base_junit.with_name(f"{base_junit.stem}-{name}{base_junit.suffix}")
            try:
                runs[name] = run_pytest(
                    python,
                    with_junit(pytest_args, junit),
                    env=env,
                    log=junit.with_suffix(".log"),
                    netns=in_netns,
                    echo=False,
                    cwd=checkout,
                )
            except BaseException as exc:  # reported below; a thread must not die silently
                errors[name] = exc

        threads = [threading.Thread(target=_run, args=(name,), name=f"parity-{name}") for name in twins]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            # On Ctrl+C or SIGTERM (raised here, in the main thread) stop both twins and wait for
            # their threads before the temporary homes are removed.
            _stop_all()
            for t in threads:
                if t.is_alive():
                    t.join()
        if errors:
            name, exc = next(iter(errors.items()))
            raise RuntimeError(f"the {name} twin could not be run: {exc}") from exc
        home_changes = diff_manifests(fixture_manifest, manifest(op_home))
    checkout_changes = diff_manifests(checkout_before, tree_manifest(checkout))
    comparison = junit_compare.compare(
        runs["clean"].junit,
        runs["operator"].junit,
        allowlist=junit_compare.load_allowlist(allowlist),
        expected_a=junit_compare.summary_total(runs["clean"].summary) if runs["clean"].summary is not None else None,
        expected_b=junit_compare.summary_total(runs["operator"].summary) if runs["operator"].summary is not None else None,
        label_a="without config",
        label_b="with config",
    )
    runs = {name: runs[name] for name in twins}  # clean first, whatever finished first
    for name, run in runs.items():
        if run.summary is None:
            comparison.undecided.append(f"{name} twin: pytest printed no summary line (exit code {run.returncode})")
        elif run.returncode not in (0, 1):
            # 2 interrupted (e.g. a collection error), 3 internal error, 4 usage error, 5 no tests:
            # there are no test results to compare, even if both twins agree.
            comparison.undecided.append(f"{name} twin: pytest exit code {run.returncode}, so its run has no test results")
    not_shut_down = {
        name: [line.strip() for line in run.output.splitlines() if _NOT_SHUT_DOWN in line] for name, run in runs.items()
    }
    return ParityResult(
        comparison, runs, not_shut_down, home_changes, checkout_changes, {"clean": seeds[0], "operator": seeds[1]}, netns_note
    )


def parity_markdown(result: ParityResult) -> str:
    """reports/parity.md: the comparison plus the log, home and checkout checks."""
    from canarchy.testing.junit_compare import render_markdown

    out = [render_markdown(result.comparison, title="Parity (TEST-TISO-16)")]  # type: ignore[arg-type]
    out.append("## Runs")
    out.append("")
    out.append("| twin | PYTHONHASHSEED | exit code | pytest summary | seconds | log |")
    out.append("|---|---|---|---|---|---|")
    for name, run in result.runs.items():
        summary = _summary_text(run.summary) if run.summary is not None else "(none)"
        out.append(f"| {name} | {result.hashseeds[name]} | {run.returncode} | {summary} | {run.duration:.1f} | `{run.log}` |")
    out.append("")
    out.append(f"Network: {result.netns_note}.")
    out.append("")
    out.append("## Checks")
    out.append("")
    for name, lines in result.not_shut_down.items():
        out.append(f"- `{_NOT_SHUT_DOWN}` in the {name} log: {len(lines)}")
        out.extend(f"  - {line}" for line in lines[:10])
    out.append(f"- operator home unchanged: {'yes' if not result.home_changes else 'NO'}")
    out.extend(f"  - {line}" for line in result.home_changes[:50])
    out.append(f"- checkout unchanged: {'yes' if not result.checkout_changes else 'NO'}")
    out.extend(f"  - {line}" for line in result.checkout_changes[:50])
    out.append("")
    return "\n".join(out)


def cmd_parity(args: argparse.Namespace) -> int:
    """``parity``: the TEST-TISO-16 lane."""
    from canarchy.testing.junit_compare import CannotDecide, render_table

    _raise_on_sigterm()
    base_junit = junit_path(args.pytest_args)
    try:
        result = run_parity(
            sys.executable,
            args.pytest_args,
            operator_home=Path(args.operator_home),
            checkout=Path(args.checkout).resolve(),
            allowlist=Path(args.allowlist) if args.allowlist else None,
            source_env=os.environ,
        )
    except (CannotDecide, RuntimeError, OSError) as exc:
        print(f"parity: CANNOT DECIDE - {exc}")
        return EXIT_CANNOT_DECIDE
    print(render_table(result.comparison))  # type: ignore[arg-type]
    for name, run in result.runs.items():
        summary = _summary_text(run.summary) if run.summary is not None else "(no summary line)"
        print(f"  {name} twin: {summary} in {run.duration:.1f} s, PYTHONHASHSEED={result.hashseeds[name]}, log {run.log}")
    print(f"  network: {result.netns_note}")
    for name, lines in result.not_shut_down.items():
        for line in lines:
            print(f"  {name} log: {line}")
    for line in result.home_changes:
        print(f"  operator home changed: {line}")
    for line in result.checkout_changes:
        print(f"  checkout changed: {line}")
    md = base_junit.with_suffix(".md")
    _write_atomically(md, parity_markdown(result))
    verdict = {EXIT_PASSED: "PASSED", EXIT_FAILED: "FAILED"}.get(result.exit_code, "CANNOT DECIDE")
    print(f"parity: {verdict} - results {result.comparison.verdict}; summary in {md}")  # type: ignore[attr-defined]
    return result.exit_code


def cmd_netns_check(args: argparse.Namespace) -> int:
    """``netns-check``: say whether the private namespace works and prove a frame round trip."""
    support = netns_support()
    print(f"private network namespace: {'available' if support.available else 'not available'} - {support.reason}")
    if not support.available:
        return EXIT_CANNOT_DECIDE
    ok, output = netns_roundtrip(sys.executable)
    print(f"udp_multicast on {NETNS_GROUP}: {output}")
    return EXIT_PASSED if ok else EXIT_FAILED


def _split_pytest_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    own, pytest_args = _split_pytest_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m canarchy.testing.lanes")
    sub = parser.add_subparsers(dest="action", required=True)
    p_run = sub.add_parser("run", help="run pytest once and print the lane's verdict")
    p_run.add_argument("--lane", required=True)
    p_run.add_argument("--bus", choices=("none", "private", "operator"), default="none",
                       help="private: a loopback-only namespace where possible, else none; "
                            "operator: the bus the operator exported (the tests transmit on it)")
    p_run.set_defaults(func=cmd_run)
    p_par = sub.add_parser("parity", help="run the clean and the configured twin and compare")
    p_par.add_argument("--operator-home", required=True)
    p_par.add_argument("--allowlist")
    p_par.add_argument("--checkout", default=".")
    p_par.set_defaults(func=cmd_parity)
    p_ns = sub.add_parser("netns-check", help="probe the private network namespace and the provided bus")
    p_ns.set_defaults(func=cmd_netns_check)
    args = parser.parse_args(own)
    args.pytest_args = pytest_args
    if args.action in ("run", "parity"):
        try:
            junit_path(pytest_args)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        return args.func(args)
    except _Terminated:
        print(f"{args.action}: terminated; the lane's temporary directories were removed", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"{args.action}: interrupted by SIGINT; the lane's temporary directories were removed", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
