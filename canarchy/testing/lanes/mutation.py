"""Run a recorded mutation against its killer tests, on a copy of the tree (the mutation lanes).

Automates TEST-TISO-14 (harness.md §3, §5): reintroduce a fixed defect and
show that its regression tests still catch it under the hermetic suite.

A mutation is data, a TOML file (``fixtures/mutations/*.toml``, described in
``fixtures/mutations/README.md``)::

    name = "issue-530"            issue = 530         description = "..."
    file = "canarchy/cli.py"      # repo-relative; module derived ("canarchy.cli") unless `module` is given
    search = '''exact code'''     # must occur exactly once in `file`
    replace = '''mutant code'''   # non-empty, so the mutant can be recognised in the imported file
    killers = ["tests/test_x.py::test_a", ...]   # each must FAIL on the mutant
    controls = ["tests/test_x.py::test_c"]      # each must PASS on the mutant too
    needs_netns = false           # true: the mutant removes a guard (fails open); run only in a private namespace
    [kill]
    requires = "failure"          # a test-phase <failure> in the JUnit report
    excluded_exceptions = ["ImportError", "ModuleNotFoundError", "SyntaxError"]

or, for several search/replace pairs (applied in order, each exactly once;
``file`` defaults to the top-level one)::

    [[edits]]
    file = "canarchy/testing/isolation/plugin.py"
    search = '''...'''
    replace = '''...'''

Steps (:func:`run_mutations`); any step that cannot be completed means
*cannot decide* (exit 2), never "killed":

1. copy ``git ls-files -co --exclude-standard`` (tracked plus untracked,
   non-ignored files) into a fresh temporary directory, once for all the
   mutations of a run; the working tree is only read;
2. each ``search`` must occur exactly once in the copy's file; every pytest
   of the run executes inside a private network namespace where one is
   available (:func:`canarchy.testing.netns_support`), and a mutation
   that ``needs_netns`` cannot decide without one;
3. baseline: one pytest run of the killers and controls of every mutation,
   on the *unmutated* copy; each must pass (a mutation whose tests do not
   cannot decide);
4. for each mutation in turn: apply it, then prove the copy is what gets
   imported: the interpreter with ``PYTHONPATH=<copy>`` run from the copy
   imports each mutated module, whose ``__file__`` must be the copy's file and
   must hold the mutated text;
5. its killers and controls run on the mutant (``python -m pytest -p
   no:cacheprovider -c <copy>/pyproject.toml --junitxml=... <node ids>`` from
   the copy, ``PYTHONPATH=<copy>``, an allow-listed environment and an empty
   home); each killer must be *killed* - a ``<failure>`` in the test phase
   whose text names none of ``excluded_exceptions`` (an error at setup or
   collection, an import or syntax error is the mutant being broken, not the
   defect being caught) - and each control must pass. The original text is
   then written back; a copy the tests changed (a leak into the tree) is
   replaced by a fresh one before the next mutation.

The temporary directory is removed in ``finally`` and on SIGINT/SIGTERM
(the running pytest, started in its own session, is terminated first).

CLI::

    python -m canarchy.testing.lanes mutation run fixtures/mutations/issue-530.toml [--python PY] [--repo DIR] [--reports DIR]
    python -m canarchy.testing.lanes mutation run-all fixtures/mutations/ [same options]

``run-all`` prints each mutation's table, then the summary (mutation,
killers expected, killers that failed, verdict) and writes
``reports/mutations.md``. Exit codes: 0 every killer killed and every control
passed; 1 a killer survived (or failed for the wrong reason); 2 cannot decide;
130/143 interrupted.

Public surface: :func:`load_mutation`, :func:`run_mutation`,
:func:`run_mutations`, :func:`repo_files`, :func:`render`,
:func:`render_summary`, :class:`Mutation`, :class:`Edit`,
:class:`MutationResult`, :class:`CannotDecide`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Sequence

from canarchy.fileio import write_text_atomic
from canarchy.testing.lanes.env import build_env
from canarchy.testing.lanes.manifest import Entry, diff_manifests, manifest
from canarchy.testing.lanes.netns import netns_command, netns_support

EXIT_KILLED = 0
EXIT_SURVIVED = 1
EXIT_CANNOT_DECIDE = 2

DEFAULT_EXCLUDED = ("ImportError", "ModuleNotFoundError", "SyntaxError")
_KEYS = {
    "name", "issue", "description", "file", "module", "search", "replace", "edits", "needs_netns",
    "killers", "controls", "kill",
}
_REQUIRED = {"name", "issue", "description", "file", "search", "replace", "killers"}


class CannotDecide(Exception):
    """A step could not be completed, so nothing can be said about the killers."""


class _Interrupted(BaseException):
    """SIGINT/SIGTERM arrived; ``signum`` says which. Not an ``Exception``: nothing swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class Edit:
    """One search/replace of a mutation: ``search`` must occur exactly once in ``file``
    (in the text as left by the edits before it)."""

    file: str
    search: str
    replace: str


@dataclass(frozen=True)
class Mutation:
    """One mutation definition (see the module docstring for the fields).

    ``search``/``replace`` are those of the first edit; ``edits`` holds all of
    them; ``modules`` maps each edited file to the module the import proof
    imports; ``needs_netns``: the mutant may fail open (a guard removed), so its
    tests run only inside a private network namespace.
    """

    name: str
    issue: str
    description: str
    file: str
    module: str
    search: str
    replace: str
    killers: tuple[str, ...]
    controls: tuple[str, ...]
    excluded_exceptions: tuple[str, ...] = DEFAULT_EXCLUDED
    source: str = ""
    edits: tuple[Edit, ...] = ()
    modules: tuple[tuple[str, str], ...] = ()
    needs_netns: bool = False

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self.killers + self.controls


@dataclass
class TestRow:
    """One test of the run: node id, ``killer``/``control``, outcome unmutated and on the mutant, verdict."""

    node_id: str
    role: str
    baseline: str = "-"
    mutant: str = "-"
    verdict: str = "-"


@dataclass
class MutationResult:
    """Outcome of :func:`run_mutation`. ``status``: ``killed``, ``survived`` or ``cannot decide``."""

    mutation: Mutation
    status: str
    reason: str
    rows: list[TestRow] = field(default_factory=list)
    imported_file: str | None = None
    durations: dict[str, float] = field(default_factory=dict)
    imported_files: list[str] = field(default_factory=list)

    @property
    def killed(self) -> list[TestRow]:
        return [r for r in self.rows if r.role == "killer" and r.verdict == "killed"]

    @property
    def exit_code(self) -> int:
        return {"killed": EXIT_KILLED, "survived": EXIT_SURVIVED}.get(self.status, EXIT_CANNOT_DECIDE)


def _module_from_file(file: str) -> str:
    path = PurePosixPath(file)
    if path.suffix != ".py":
        raise CannotDecide(f"`file` = {file!r} is not a Python module; give `module` explicitly")
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _relative_file(p: Path, value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CannotDecide(f"{p}: {what} must be a non-empty string")
    file = PurePosixPath(value)
    if file.is_absolute() or ".." in file.parts:
        raise CannotDecide(f"{p}: {what} must be relative to the repository root, without '..'")
    return file.as_posix()


def _edit(p: Path, raw: object, default_file: str, where: str) -> Edit:
    if not isinstance(raw, dict) or set(raw) - {"file", "search", "replace"}:
        raise CannotDecide(f"{p}: {where} may hold `file`, `search` and `replace` only")
    for key in ("search", "replace"):
        if not isinstance(raw.get(key), str):
            raise CannotDecide(f"{p}: {where}: `{key}` must be a string")
        if not raw[key].strip():
            raise CannotDecide(
                f"{p}: {where}: `{key}` is empty"
                + (" (make the mutant recognisable, e.g. a marker comment)" if key == "replace" else "")
            )
    if raw["search"] == raw["replace"]:
        raise CannotDecide(f"{p}: {where}: `replace` equals `search`: that is no mutation")
    file = _relative_file(p, raw.get("file", default_file), f"{where}: `file`")
    return Edit(file, raw["search"], raw["replace"])


def load_mutation(path: str | os.PathLike[str]) -> Mutation:
    """Read and validate a mutation TOML file; raises :class:`CannotDecide` naming the problem."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CannotDecide(f"{p}: cannot read the mutation ({exc})") from None
    unknown = set(doc) - _KEYS
    required = _REQUIRED - ({"search", "replace"} if "edits" in doc else set())
    missing = required - set(doc)
    if unknown or missing:
        raise CannotDecide(f"{p}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    for key in ("name", "description", "file"):
        if not isinstance(doc[key], str):
            raise CannotDecide(f"{p}: `{key}` must be a string")
        if not doc[key].strip():
            raise CannotDecide(f"{p}: `{key}` is empty")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", doc["name"]):
        raise CannotDecide(f"{p}: `name` may hold letters, digits, '.', '_' and '-' only")
    file = _relative_file(p, doc["file"], "`file`")
    if "edits" in doc:
        if "search" in doc or "replace" in doc:
            raise CannotDecide(f"{p}: give either `search`/`replace` or [[edits]], not both")
        if not isinstance(doc["edits"], list) or not doc["edits"]:
            raise CannotDecide(f"{p}: `edits` must be a non-empty array of tables ([[edits]])")
        edits = tuple(_edit(p, raw, file, f"edit {i}") for i, raw in enumerate(doc["edits"], 1))
    else:
        edits = (_edit(p, {"search": doc["search"], "replace": doc["replace"]}, file, "the mutation"),)
    lists = {}
    for key in ("killers", "controls"):
        value = doc.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise CannotDecide(f"{p}: `{key}` must be a list of pytest node ids")
        lists[key] = tuple(v.strip() for v in value)
    if not lists["killers"]:
        raise CannotDecide(f"{p}: `killers` is empty: nothing could catch the mutant")
    overlap = set(lists["killers"]) & set(lists["controls"])
    if overlap or len(set(lists["killers"] + lists["controls"])) != len(lists["killers"] + lists["controls"]):
        raise CannotDecide(f"{p}: a node id is listed twice (killer and control, or repeated): {sorted(overlap)}")
    kill = doc.get("kill", {})
    if not isinstance(kill, dict) or set(kill) - {"requires", "excluded_exceptions"}:
        raise CannotDecide(f"{p}: [kill] may hold `requires` and `excluded_exceptions` only")
    if kill.get("requires", "failure") != "failure":
        raise CannotDecide(f"{p}: [kill].requires must be \"failure\" (a test-phase <failure>)")
    excluded = kill.get("excluded_exceptions", list(DEFAULT_EXCLUDED))
    if not isinstance(excluded, list) or not all(isinstance(e, str) and e.isidentifier() for e in excluded):
        raise CannotDecide(f"{p}: [kill].excluded_exceptions must be a list of exception names")
    module = doc.get("module") or _module_from_file(file)
    if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
        raise CannotDecide(f"{p}: `module` = {module!r} is not a dotted module name")
    needs_netns = doc.get("needs_netns", False)
    if not isinstance(needs_netns, bool):
        raise CannotDecide(f"{p}: `needs_netns` must be true or false")
    modules = {file: module}
    for edit in edits:
        modules.setdefault(edit.file, _module_from_file(edit.file))
    return Mutation(
        name=doc["name"],
        issue=str(doc["issue"]),
        description=doc["description"].strip(),
        file=file,
        module=module,
        search=edits[0].search,
        replace=edits[0].replace,
        killers=lists["killers"],
        controls=lists["controls"],
        excluded_exceptions=tuple(excluded),
        source=str(p),
        edits=edits,
        modules=tuple(modules.items()),
        needs_netns=needs_netns,
    )


def repo_files(repo: Path) -> list[str]:
    """Tracked plus untracked non-ignored files of a git work tree (``git ls-files -co --exclude-standard``)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"],
            capture_output=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise CannotDecide(f"{repo}: cannot list the files of the git work tree ({exc} {detail.decode(errors='replace').strip()})") from None
    return sorted({name for name in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if name})


def _copy_tree(repo: Path, files: Sequence[str], dest: Path) -> int:
    copied = 0
    for name in files:
        src = repo / name
        if not src.is_symlink() and not src.exists():
            continue  # tracked but deleted in the work tree: the copy mirrors the work tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        elif src.is_file():
            shutil.copy2(src, target)
        else:
            continue  # a submodule directory: not part of the copy
        copied += 1
    return copied


class _Runner:
    """Holds the running child process so an interrupt can stop it.

    ``netns``: run each command inside a private network namespace
    (:func:`canarchy.testing.netns_command`).
    """

    def __init__(self, timeout: float, netns: bool = False) -> None:
        self.timeout = timeout
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, argv: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path) -> int:
        command = netns_command(argv) if self.netns else list(argv)
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(
                command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: we stop all of it, and only it
            )
            try:
                return self.proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                raise CannotDecide(f"{' '.join(argv[:3])} ... timed out after {self.timeout:.0f} s (log: {log.name})") from None
            finally:
                self.stop()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _pytest_argv(python: str, copy: Path, junit: Path, node_ids: Sequence[str]) -> list[str]:
    return [
        python, "-m", "pytest",
        "-p", "no:cacheprovider",
        "-c", str(copy / "pyproject.toml"),
        "--strict-markers", "--strict-config",
        f"--junitxml={junit}",
        *node_ids,
    ]  # fmt: skip


def _load(junit: Path, log: Path, phase: str):  # type: ignore[no-untyped-def]
    from canarchy.testing.lanes import results as junit_compare

    try:
        report = junit_compare.load_report(junit)
    except junit_compare.CannotDecide as exc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
        raise CannotDecide(f"{phase}: no usable JUnit report ({exc})\n{tail}") from None
    if not report.cases:
        raise CannotDecide(f"{phase}: zero tests selected")
    return report


def _outcomes(junit: Path, node_ids: Sequence[str], log: Path, phase: str) -> dict[str, object]:
    from canarchy.testing.lanes import results as junit_compare

    report = _load(junit, log, phase)
    found: dict[str, object] = {}
    missing = []
    for node_id in node_ids:
        case = report.cases.get(junit_compare.case_key(node_id))
        if case is None:
            missing.append(node_id)
        found[node_id] = case
    if missing:
        raise CannotDecide(f"{phase}: not run (no such test?): {', '.join(missing)}")
    return found


def _wrong_reason(case: object, excluded: Sequence[str]) -> str | None:
    text = case.failure_text  # type: ignore[attr-defined]
    for name in excluded:
        if re.search(rf"\b{re.escape(name)}\b", text):
            return name
    return None


def _install_handlers() -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: object) -> None:
        raise _Interrupted(signum)

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_handlers(previous: dict[int, object]) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)  # type: ignore[arg-type]


class _Workspace:
    """The temporary directory of a run: ``tree`` (the copy), ``home``, ``out``, ``tmp``.

    The copy is made once and reused by every mutation; each mutant is
    restored afterwards, and a copy a mutant's tests changed (a leak that
    wrote into the tree) is thrown away and made again.
    """

    def __init__(self, repo: Path, root: Path) -> None:
        self.repo, self.root = repo, root
        self.copy, self.home, self.out, self.tmp = root / "tree", root / "home", root / "out", root / "tmp"
        for d in (self.home, self.out, self.tmp):
            d.mkdir()
        self.files = repo_files(repo)
        self.pristine: dict[str, Entry] = {}

    def make_copy(self) -> None:
        if self.copy.exists():
            shutil.rmtree(self.copy)
        self.copy.mkdir()
        n = _copy_tree(self.repo, self.files, self.copy)
        if not (self.copy / "pyproject.toml").is_file():
            raise CannotDecide(f"{self.repo}: no pyproject.toml in the copied tree ({n} files)")
        self.pristine = manifest(self.copy, exclude=("__pycache__",))

    def changes(self) -> list[str]:
        """What differs in the copy from the pristine copy (a test wrote into the tree)."""
        return diff_manifests(self.pristine, manifest(self.copy, exclude=("__pycache__",)))

    def env(self) -> dict[str, str]:
        # TMPDIR inside our directory: whatever the tests leave behind goes with the copy.
        return build_env(home=self.home, hashseed=0, extra={"PYTHONPATH": str(self.copy), "TMPDIR": str(self.tmp)})


def _mutated_texts(mutation: Mutation, copy: Path) -> dict[str, tuple[str, str]]:
    """``{file: (original, mutated)}``; :class:`CannotDecide` unless each ``search`` occurs exactly once."""
    texts: dict[str, tuple[str, str]] = {}
    for index, edit in enumerate(mutation.edits, 1):
        if edit.file not in texts:
            try:
                original = (copy / edit.file).read_text(encoding="utf-8")
            except OSError as exc:
                raise CannotDecide(f"{edit.file}: cannot read it in the copy ({exc})") from None
            texts[edit.file] = (original, original)
        original, current = texts[edit.file]
        count = current.count(edit.search)
        if count != 1:
            which = "`search`" if len(mutation.edits) == 1 else f"edit {index}'s `search`"
            raise CannotDecide(
                f"{edit.file}: {which} occurs {count} times (exactly 1 required); "
                f"update {mutation.source or 'the mutation file'} to the current code"
            )
        texts[edit.file] = (original, current.replace(edit.search, edit.replace, 1))
    return texts


def _import_proof(mutation: Mutation, python: str, work: _Workspace, texts: dict[str, tuple[str, str]]) -> list[str]:
    """Import every mutated module from the copy; each must be the copy's file holding the mutant."""
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)"
    modules = [module for _file, module in mutation.modules]
    probe = subprocess.run(
        [python, "-c", code, *modules], env=work.env(), cwd=work.copy, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    printed = probe.stdout.strip().splitlines()
    if probe.returncode != 0 or len(printed) < len(modules):
        raise CannotDecide(f"import proof: `import {', '.join(modules)}` failed in the copy: {probe.stderr.strip()[-500:]}")
    imported = printed[-len(modules):]
    for (file, module), where in zip(mutation.modules, imported):
        target = work.copy / file
        path = Path(where).resolve()
        if path != target.resolve():
            raise CannotDecide(
                f"import proof: {module} was imported from {where}, not from the copy's "
                f"{target} (an installed or cached copy would be tested instead of the mutant)"
            )
        if path.read_text(encoding="utf-8") != texts[file][1]:
            raise CannotDecide(f"import proof: {where} does not hold the mutated text")
    return imported


def _judge(result: MutationResult, mutant: dict[str, object]) -> None:
    mutation = result.mutation
    broken_controls = []
    for row in result.rows:
        case = mutant[row.node_id]
        row.mutant = case.outcome  # type: ignore[attr-defined]
        if row.role == "control":
            row.verdict = "passes (ok)" if row.mutant == "passed" else "BROKEN"
            if row.mutant != "passed":
                broken_controls.append(row.node_id)
        elif row.mutant.split("+")[0] == "failed":
            wrong = _wrong_reason(case, mutation.excluded_exceptions)
            row.verdict = f"not killed: failed with {wrong}" if wrong else "killed"
        elif row.mutant.startswith("error"):
            row.verdict = "not killed: error outside the test phase"
        else:
            row.verdict = "SURVIVED"
    if broken_controls:
        result.status, result.reason = "cannot decide", (
            "controls failed on the mutant, so it is broken beyond the defect: " + ", ".join(broken_controls)
        )
    elif len(result.killed) == len(mutation.killers):
        result.status, result.reason = "killed", "every killer failed on the mutant and every control passed"
    else:
        result.status, result.reason = "survived", "the mutant was not caught by every killer"


def run_mutation(
    mutation: Mutation,
    *,
    repo: Path,
    python: str = sys.executable,
    reports: Path | None = None,
    timeout: float = 900.0,
    echo: Callable[[str], None] = print,
    netns: bool | None = None,
) -> MutationResult:
    """Run the steps of the module docstring for one mutation; returns a :class:`MutationResult`.

    Never writes to ``repo`` (``reports`` may be inside it: only
    ``mutation-<name>.md`` and the JUnit files and logs are written there). On
    SIGINT/SIGTERM the child is stopped, the temporary copy removed, and
    :class:`_Interrupted` propagates.
    """
    return run_mutations([mutation], repo=repo, python=python, reports=reports, timeout=timeout, echo=echo, netns=netns)[0]


def run_mutations(
    mutations: Sequence[Mutation],
    *,
    repo: Path,
    python: str = sys.executable,
    reports: Path | None = None,
    timeout: float = 900.0,
    echo: Callable[[str], None] = print,
    netns: bool | None = None,
) -> list[MutationResult]:
    """Run several mutations on one copy of the tree, with one baseline run of all their tests.

    ``netns``: run every pytest inside a private network namespace; ``None``
    (default) does so wherever one is available, like every lane that runs
    the suite (:func:`canarchy.testing.containment`). A mutation that
    ``needs_netns`` when none is available cannot decide (its mutant could
    reach a real bus). Results are in the order given.
    """
    results = [
        MutationResult(m, "cannot decide", "", [TestRow(n, "killer") for n in m.killers] + [TestRow(n, "control") for n in m.controls])
        for m in mutations
    ]
    support = None
    if netns is None:
        support = netns_support()
        use_netns = support.available
    else:
        use_netns = netns
    runner = _Runner(timeout, netns=use_netns)
    previous = _install_handlers()
    tmp = Path(tempfile.mkdtemp(prefix="canarchy-mutant-" + (mutations[0].name if len(mutations) == 1 else "all") + "-"))
    try:
        try:
            work = _Workspace(repo, tmp)
            echo(f"mutations: working on a copy in {work.copy} (the working tree is only read)"
                 + ("; every run in a private network namespace" if use_netns else ""))
            started = time.monotonic()
            work.make_copy()
            copy_time = time.monotonic() - started
        except CannotDecide as exc:
            for result in results:
                result.reason = str(exc)
            return _finish(results, reports, tmp / "out")

        # Step 2: each search exactly once; a needed namespace exists.
        pending: list[tuple[MutationResult, dict[str, tuple[str, str]]]] = []
        for result in results:
            result.durations["copy"] = copy_time
            m = result.mutation
            if m.needs_netns and not use_netns:
                reason = support.reason if support is not None else "the caller turned namespaces off"
                result.reason = (
                    "needs a private network namespace (its mutant removes a guard, so its tests could reach a "
                    f"real bus) and none is available: {reason}"
                )
                continue
            try:
                pending.append((result, _mutated_texts(m, work.copy)))
            except CannotDecide as exc:
                result.reason = str(exc)
        if not pending:
            return _finish(results, reports, work.out)

        # Step 3: one baseline run, on the unmutated copy, of every test of every mutation.
        node_ids = list(dict.fromkeys(n for result, _ in pending for n in result.mutation.node_ids))
        started = time.monotonic()
        baseline_xml, baseline_log = work.out / "baseline.xml", work.out / "baseline.log"
        try:
            rc = runner.run(_pytest_argv(python, work.copy, baseline_xml, node_ids), env=work.env(), cwd=work.copy, log=baseline_log)
            report = _load(baseline_xml, baseline_log, "baseline (unmutated)")
        except CannotDecide as exc:
            for result, _ in pending:
                result.reason = str(exc)
            return _finish(results, reports, work.out)
        baseline_time = time.monotonic() - started
        from canarchy.testing.lanes.results import case_key

        ready = []
        any_listed_failing = False
        for result, texts in pending:
            result.durations["baseline"] = baseline_time
            missing, not_passing = [], []
            for row in result.rows:
                case = report.cases.get(case_key(row.node_id))
                if case is None:
                    missing.append(row.node_id)
                    continue
                row.baseline = case.outcome
                if row.baseline != "passed":
                    not_passing.append(f"{row.node_id} ({row.baseline})")
            any_listed_failing = any_listed_failing or bool(not_passing or missing)
            if missing:
                result.reason = f"baseline (unmutated): not run (no such test?): {', '.join(missing)}"
            elif not_passing:
                result.reason = "baseline: these must pass on the unmutated code first: " + ", ".join(not_passing)
            else:
                ready.append((result, texts))
        if rc != 0 and not any_listed_failing:
            # Every listed test passed, yet pytest failed: the run itself is broken (e.g. the sentinel).
            for result, _ in ready:
                result.reason = f"baseline: these must pass on the unmutated code first: pytest exit code {rc}"
            ready = []
        if work.changes():
            echo("mutations: the baseline run changed the copy; making a fresh one")
            work.make_copy()

        # Steps 4-5, one mutation at a time on the same copy.
        for result, texts in ready:
            m = result.mutation
            try:
                for file, (_original, mutated) in texts.items():
                    (work.copy / file).write_text(mutated, encoding="utf-8")
                imported = _import_proof(m, python, work, texts)
                result.imported_files = imported
                result.imported_file = imported[0]
                echo(f"mutation {m.name}: mutant applied; {', '.join(mod for _f, mod in m.modules)} imported from the copy")
                started = time.monotonic()
                xml, log = work.out / f"{m.name}-mutant.xml", work.out / f"{m.name}-mutant.log"
                runner.run(_pytest_argv(python, work.copy, xml, m.node_ids), env=work.env(), cwd=work.copy, log=log)
                mutant = _outcomes(xml, m.node_ids, log, "mutant")
                result.durations["mutant"] = time.monotonic() - started
                _judge(result, mutant)
            except CannotDecide as exc:
                result.status, result.reason = "cannot decide", str(exc)
            finally:
                for file, (original, _mutated) in texts.items():
                    (work.copy / file).write_text(original, encoding="utf-8")
                changes = work.changes()
                if changes:
                    echo(f"mutation {m.name}: its tests changed the copy ({'; '.join(changes[:5])}); making a fresh one")
                    work.make_copy()
            echo(f"mutation {m.name}: {result.status.upper()} ({len(result.killed)}/{len(m.killers)} killers failed)")
        return _finish(results, reports, work.out)
    finally:
        runner.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        _restore_handlers(previous)


def _finish(results: list[MutationResult], reports: Path | None, out: Path) -> list[MutationResult]:
    if reports is not None:
        for result in results:
            _write_reports(result, reports, out)
    return results


def _short(node_id: str) -> str:
    return node_id.rsplit("::", 1)[-1]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows]


def render(result: MutationResult) -> str:
    """The terminal view: the ``killed by k/n`` line, the verdict and a table."""
    m = result.mutation
    killed = result.killed
    lines = [
        f"mutation {m.name} (issue {m.issue}): {result.status.upper()}",
        f"killed by {len(killed)}/{len(m.killers)}: {', '.join(_short(r.node_id) for r in killed) or '-'}",
        f"reason: {result.reason}",
    ]
    for imported in result.imported_files or ([result.imported_file] if result.imported_file else []):
        lines.append(f"imported mutant: {imported} (in the temporary copy, now removed)")
    table = [[r.node_id, r.role, r.baseline, r.mutant, r.verdict] for r in result.rows]
    lines += ["", *_table(["test", "role", "unmutated", "mutant", "verdict"], table)]
    return "\n".join(lines)


def render_markdown(result: MutationResult) -> str:
    """Markdown summary for ``reports/mutation-<name>.md``."""
    m = result.mutation
    files = ", ".join(f"`{f}` (module `{mod}`)" for f, mod in m.modules) or f"`{m.file}` (module `{m.module}`)"
    out = [
        f"# Mutation {m.name} (issue {m.issue}): {result.status}",
        "",
        m.description,
        "",
        f"- files: {files}",
        f"- killed by {len(result.killed)}/{len(m.killers)}",
        f"- reason: {_md(result.reason)}",
        "- durations (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result.durations.items()),
        "",
        "| test | role | unmutated | mutant | verdict |",
        "|---|---|---|---|---|",
    ]
    out += [f"| `{r.node_id}` | {r.role} | {r.baseline} | {r.mutant} | {r.verdict} |" for r in result.rows]
    out.append("")
    return "\n".join(out)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _summary_rows(results: Sequence[MutationResult]) -> list[list[str]]:
    rows = []
    for r in results:
        killers = [row for row in r.rows if row.role == "killer"]
        not_failed = [_short(row.node_id) for row in killers if row.verdict != "killed"]
        if r.status == "cannot decide":
            detail = r.reason.splitlines()[0] if r.reason else "-"
        else:
            detail = ("not failed: " + ", ".join(not_failed)) if not_failed else "-"
        rows.append([r.mutation.name, str(len(killers)), str(len(r.killed)), r.status.upper(), detail])
    return rows


def render_summary(results: Sequence[MutationResult], seconds: float | None = None) -> str:
    """The ``run-all`` table: mutation, killers expected, killers that failed, verdict (and why not killed)."""
    killed = sum(1 for r in results if r.status == "killed")
    head = f"mutations: {killed}/{len(results)} killed by every named killer"
    if seconds is not None:
        head += f" ({seconds:.0f} s)"
    lines = [head, ""]
    lines += _table(["mutation", "killers expected", "killers that failed", "verdict", "details"], _summary_rows(results))
    return "\n".join(lines)


def render_summary_markdown(results: Sequence[MutationResult], seconds: float | None = None) -> str:
    """``reports/mutations.md``: the summary table, each mutation linked to its own report."""
    killed = sum(1 for r in results if r.status == "killed")
    status = "PASSED" if killed == len(results) else "FAILED"
    out = [f"# Mutations: {status} ({killed}/{len(results)} killed)", ""]
    if seconds is not None:
        out += [f"Wall time: {seconds:.0f} s.", ""]
    out += ["| mutation | issue | killers expected | killers that failed | verdict | details |", "|---|---|---|---|---|---|"]
    for r, row in zip(results, _summary_rows(results)):
        out.append(f"| [{row[0]}](mutation-{row[0]}.md) | {r.mutation.issue} | {row[1]} | {row[2]} | {row[3]} | {_md(row[4])} |")
    out.append("")
    return "\n".join(out)


def _write_reports(result: MutationResult, reports: Path, out: Path) -> None:
    reports.mkdir(parents=True, exist_ok=True)
    name = result.mutation.name
    for phase, stem in (("baseline", "baseline"), ("mutant", f"{name}-mutant")):
        for ext in ("xml", "log"):
            src = out / f"{stem}.{ext}"
            dest = reports / f"mutation-{name}-{phase}.{ext}"
            if src.exists():
                shutil.copyfile(src, dest)
            else:
                dest.unlink(missing_ok=True)  # never leave an older run's file next to this run's report
    write_text_atomic(reports / f"mutation-{name}.md", render_markdown(result))


def _repo_root(given: str | None) -> Path:
    if given:
        return Path(given).resolve()
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CannotDecide(f"not inside a git work tree; pass --repo ({exc})") from None
    return Path(top.stdout.strip())


def _run_one(path: Path, args: argparse.Namespace) -> int:
    try:
        mutation = load_mutation(path)
        result = run_mutation(
            mutation,
            repo=_repo_root(args.repo),
            python=args.python,
            reports=Path(args.reports) if args.reports else None,
            timeout=args.timeout,
        )
    except CannotDecide as exc:
        print(f"mutation {path.name}: CANNOT DECIDE - {exc}")
        return EXIT_CANNOT_DECIDE
    print(render(result))
    return result.exit_code


def _broken_definition(path: Path, reason: str) -> MutationResult:
    stub = Mutation(path.stem, "-", "", "-", "-", "-", "-", (), (), source=str(path))
    return MutationResult(stub, "cannot decide", f"{path.name}: {reason}")


def _run_all(folder: Path, args: argparse.Namespace) -> int:
    paths = sorted(folder.glob("*.toml"))
    if not paths:
        print(f"run-all: CANNOT DECIDE - no *.toml mutation in {folder}")
        return EXIT_CANNOT_DECIDE
    started = time.monotonic()
    loaded: list[Mutation] = []
    broken: dict[Path, MutationResult] = {}
    names: dict[str, Path] = {}
    for path in paths:
        try:
            m = load_mutation(path)
        except CannotDecide as exc:
            broken[path] = _broken_definition(path, str(exc))
            continue
        if m.name in names:
            broken[path] = _broken_definition(path, f"`name` {m.name!r} is also used by {names[m.name].name}")
            continue
        names[m.name] = path
        loaded.append(m)
    reports = Path(args.reports) if args.reports else None
    ran = iter(
        run_mutations(loaded, repo=_repo_root(args.repo), python=args.python, reports=reports, timeout=args.timeout)
        if loaded else []
    )
    results = [broken[p] if p in broken else next(ran) for p in paths]
    seconds = time.monotonic() - started
    for result in results:
        if result.rows:
            print(render(result))
            print()
    print(render_summary(results, seconds))
    if reports is not None:
        reports.mkdir(parents=True, exist_ok=True)
        write_text_atomic(reports / "mutations.md", render_summary_markdown(results, seconds))
    codes = [r.exit_code for r in results]
    return max(codes)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m canarchy.testing.lanes mutation")
    sub = parser.add_subparsers(dest="action", required=True)
    for action, target_help in (("run", "a mutation TOML file"), ("run-all", "a directory of mutation TOML files")):
        p = sub.add_parser(action)
        p.add_argument("target", type=Path, help=target_help)
        p.add_argument("--python", default=sys.executable, help="interpreter that runs pytest (default: this one)")
        p.add_argument("--repo", help="git work tree to copy (default: the one around the current directory)")
        p.add_argument("--reports", help="directory for mutation-<name>.md, mutations.md and the JUnit reports")
        p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per pytest run")
    args = parser.parse_args(argv)
    try:
        if args.action == "run":
            return _run_one(args.target, args)
        try:
            return _run_all(args.target, args)
        except CannotDecide as exc:
            print(f"run-all: CANNOT DECIDE - {exc}")
            return EXIT_CANNOT_DECIDE
    except _Interrupted as exc:
        name = "SIGINT" if exc.signum == signal.SIGINT else "SIGTERM"
        print(f"mutation: interrupted by {name}; the temporary copy was removed, the working tree was never written")
        return 128 + exc.signum


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
