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
    [kill]
    requires = "failure"          # a test-phase <failure> in the JUnit report
    excluded_exceptions = ["ImportError", "ModuleNotFoundError", "SyntaxError"]

Steps (:func:`run_mutation`); any step that cannot be completed means
*cannot decide* (exit 2), never "killed":

1. copy ``git ls-files -co --exclude-standard`` (tracked plus untracked,
   non-ignored files) into a fresh temporary directory; the working tree is
   only read;
2. ``search`` must occur exactly once in the copy's ``file``;
3. baseline: killers and controls run on the *unmutated* copy and must all
   pass;
4. apply the mutation, then prove the copy is what gets imported: the copy's
   interpreter with ``PYTHONPATH=<copy>`` run from the copy imports the module,
   whose ``__file__`` must be the copy's file and must hold the mutated text;
5. killers and controls run on the mutant (``python -m pytest -p
   no:cacheprovider -c <copy>/pyproject.toml --junitxml=... <node ids>`` from
   the copy, ``PYTHONPATH=<copy>``, an allow-listed environment and an empty
   home); each killer must be *killed* - a ``<failure>`` in the test phase
   whose text names none of ``excluded_exceptions`` (an error at setup or
   collection, an import or syntax error is the mutant being broken, not the
   defect being caught) - and each control must pass.

The temporary directory is removed in ``finally`` and on SIGINT/SIGTERM
(the running pytest, started in its own session, is terminated first).

CLI::

    python -m canarchy.testing.mutation run fixtures/mutations/issue-530.toml [--python PY] [--repo DIR] [--reports DIR]
    python -m canarchy.testing.mutation run-all fixtures/mutations/ [same options]

Exit codes: 0 every killer killed and every control passed; 1 a killer
survived (or failed for the wrong reason); 2 cannot decide; 130/143
interrupted.

Public surface: :func:`load_mutation`, :func:`run_mutation`,
:func:`repo_files`, :class:`Mutation`, :class:`MutationResult`,
:class:`CannotDecide`.
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

from canarchy.testing import lanes

EXIT_KILLED = 0
EXIT_SURVIVED = 1
EXIT_CANNOT_DECIDE = 2

DEFAULT_EXCLUDED = ("ImportError", "ModuleNotFoundError", "SyntaxError")
_KEYS = {"name", "issue", "description", "file", "module", "search", "replace", "killers", "controls", "kill"}
_REQUIRED = {"name", "issue", "description", "file", "search", "replace", "killers"}


class CannotDecide(Exception):
    """A step could not be completed, so nothing can be said about the killers."""


class _Interrupted(BaseException):
    """SIGINT/SIGTERM arrived; ``signum`` says which. Not an ``Exception``: nothing swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class Mutation:
    """One mutation definition (see the module docstring for the fields)."""

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


def load_mutation(path: str | os.PathLike[str]) -> Mutation:
    """Read and validate a mutation TOML file; raises :class:`CannotDecide` naming the problem."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CannotDecide(f"{p}: cannot read the mutation ({exc})") from None
    unknown = set(doc) - _KEYS
    missing = _REQUIRED - set(doc)
    if unknown or missing:
        raise CannotDecide(f"{p}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    for key in ("name", "description", "file", "search", "replace"):
        if not isinstance(doc[key], str):
            raise CannotDecide(f"{p}: `{key}` must be a string")
    for key in ("name", "description", "file", "search", "replace"):
        if not doc[key].strip():
            raise CannotDecide(
                f"{p}: `{key}` is empty"
                + (" (make the mutant recognisable, e.g. a marker comment)" if key == "replace" else "")
            )
    if not re.fullmatch(r"[A-Za-z0-9._-]+", doc["name"]):
        raise CannotDecide(f"{p}: `name` may hold letters, digits, '.', '_' and '-' only")
    file = PurePosixPath(doc["file"])
    if file.is_absolute() or ".." in file.parts:
        raise CannotDecide(f"{p}: `file` must be relative to the repository root, without '..'")
    if doc["search"] == doc["replace"]:
        raise CannotDecide(f"{p}: `replace` equals `search`: that is no mutation")
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
    module = doc.get("module") or _module_from_file(doc["file"])
    if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
        raise CannotDecide(f"{p}: `module` = {module!r} is not a dotted module name")
    return Mutation(
        name=doc["name"],
        issue=str(doc["issue"]),
        description=doc["description"].strip(),
        file=file.as_posix(),
        module=module,
        search=doc["search"],
        replace=doc["replace"],
        killers=lists["killers"],
        controls=lists["controls"],
        excluded_exceptions=tuple(excluded),
        source=str(p),
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
    """Holds the running child process so an interrupt can stop it."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, argv: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path) -> int:
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(
                list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
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


def _outcomes(junit: Path, node_ids: Sequence[str], log: Path, phase: str) -> dict[str, object]:
    from canarchy.testing import junit_compare

    try:
        report = junit_compare.load_report(junit)
    except junit_compare.CannotDecide as exc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
        raise CannotDecide(f"{phase}: no usable JUnit report ({exc})\n{tail}") from None
    if not report.cases:
        raise CannotDecide(f"{phase}: zero tests selected")
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


def run_mutation(
    mutation: Mutation,
    *,
    repo: Path,
    python: str = sys.executable,
    reports: Path | None = None,
    timeout: float = 900.0,
    echo: Callable[[str], None] = print,
) -> MutationResult:
    """Run the steps of the module docstring; returns a :class:`MutationResult`.

    Never writes to ``repo`` (``reports`` may be inside it: only
    ``mutation-<name>.md`` and the two JUnit files are written there). On
    SIGINT/SIGTERM the child is stopped, the temporary copy removed, and
    :class:`_Interrupted` propagates.
    """
    rows = [TestRow(n, "killer") for n in mutation.killers] + [TestRow(n, "control") for n in mutation.controls]
    result = MutationResult(mutation, "cannot decide", "", rows)
    node_ids = [r.node_id for r in rows]
    runner = _Runner(timeout)
    previous = _install_handlers()
    tmp = Path(tempfile.mkdtemp(prefix=f"canarchy-mutant-{mutation.name}-"))
    try:
        copy, home, out, child_tmp = tmp / "tree", tmp / "home", tmp / "out", tmp / "tmp"
        for d in (copy, home, out, child_tmp):
            d.mkdir()
        echo(f"mutation {mutation.name}: working on a copy in {copy} (the working tree is only read)")
        started = time.monotonic()
        n = _copy_tree(repo, repo_files(repo), copy)
        if not (copy / "pyproject.toml").is_file():
            raise CannotDecide(f"{repo}: no pyproject.toml in the copied tree ({n} files)")
        target = copy / mutation.file
        try:
            original = target.read_text(encoding="utf-8")
        except OSError as exc:
            raise CannotDecide(f"{mutation.file}: cannot read it in the copy ({exc})") from None
        count = original.count(mutation.search)
        if count != 1:
            raise CannotDecide(
                f"{mutation.file}: `search` occurs {count} times (exactly 1 required); "
                f"update {mutation.source or 'the mutation file'} to the current code"
            )
        # TMPDIR inside our directory: whatever the tests leave behind goes with the copy.
        env = lanes.build_env(home=home, hashseed=0, extra={"PYTHONPATH": str(copy), "TMPDIR": str(child_tmp)})
        result.durations["copy"] = time.monotonic() - started

        # Step 3: baseline on the unmutated copy.
        started = time.monotonic()
        rc = runner.run(_pytest_argv(python, copy, out / "baseline.xml", node_ids), env=env, cwd=copy, log=out / "baseline.log")
        baseline = _outcomes(out / "baseline.xml", node_ids, out / "baseline.log", "baseline (unmutated)")
        result.durations["baseline"] = time.monotonic() - started
        not_passing = []
        for row in rows:
            row.baseline = baseline[row.node_id].outcome  # type: ignore[attr-defined]
            if row.baseline != "passed":
                not_passing.append(f"{row.node_id} ({row.baseline})")
        if not_passing or rc != 0:
            raise CannotDecide(
                "baseline: these must pass on the unmutated code first: " + (", ".join(not_passing) or f"pytest exit code {rc}")
            )

        # Step 4: mutate and prove the copy is what gets imported.
        mutated = original.replace(mutation.search, mutation.replace, 1)
        target.write_text(mutated, encoding="utf-8")
        probe = subprocess.run(
            [python, "-c", f"import {mutation.module} as m; print(m.__file__)"],
            env=env, cwd=copy, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        imported = probe.stdout.strip().splitlines()[-1] if probe.stdout.strip() else ""
        if probe.returncode != 0 or not imported:
            raise CannotDecide(f"import proof: `import {mutation.module}` failed in the copy: {probe.stderr.strip()[-500:]}")
        result.imported_file = imported
        imported_path = Path(imported).resolve()
        if imported_path != target.resolve():
            raise CannotDecide(
                f"import proof: {mutation.module} was imported from {imported}, not from the copy's "
                f"{target} (an installed or cached copy would be tested instead of the mutant)"
            )
        if imported_path.read_text(encoding="utf-8") != mutated:
            raise CannotDecide(f"import proof: {imported} does not hold the mutated text")
        echo(f"mutation {mutation.name}: mutant applied; {mutation.module} imports from {imported}")

        # Step 5: the killers and controls on the mutant.
        started = time.monotonic()
        runner.run(_pytest_argv(python, copy, out / "mutant.xml", node_ids), env=env, cwd=copy, log=out / "mutant.log")
        mutant = _outcomes(out / "mutant.xml", node_ids, out / "mutant.log", "mutant")
        result.durations["mutant"] = time.monotonic() - started
        broken_controls = []
        for row in rows:
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
        if reports is not None:
            _write_reports(result, reports, out)
        return result
    except CannotDecide as exc:
        result.status, result.reason = "cannot decide", str(exc)
        if reports is not None:
            _write_reports(result, reports, tmp / "out")
        return result
    finally:
        runner.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        _restore_handlers(previous)


def _short(node_id: str) -> str:
    return node_id.rsplit("::", 1)[-1]


def render(result: MutationResult) -> str:
    """The terminal view: the ``killed by k/n`` line, the verdict and a table."""
    m = result.mutation
    killed = result.killed
    lines = [
        f"mutation {m.name} (issue {m.issue}): {result.status.upper()}",
        f"killed by {len(killed)}/{len(m.killers)}: {', '.join(_short(r.node_id) for r in killed) or '-'}",
        f"reason: {result.reason}",
    ]
    if result.imported_file:
        lines.append(f"imported mutant: {result.imported_file} (in the temporary copy, now removed)")
    headers = ["test", "role", "unmutated", "mutant", "verdict"]
    table = [[r.node_id, r.role, r.baseline, r.mutant, r.verdict] for r in result.rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines += ["", fmt(headers), fmt(["-" * w for w in widths])] + [fmt(row) for row in table]
    return "\n".join(lines)


def render_markdown(result: MutationResult) -> str:
    """Markdown summary for ``reports/mutation-<name>.md``."""
    m = result.mutation
    out = [
        f"# Mutation {m.name} (issue {m.issue}): {result.status}",
        "",
        m.description,
        "",
        f"- file: `{m.file}` (module `{m.module}`)",
        f"- killed by {len(result.killed)}/{len(m.killers)}",
        f"- reason: {result.reason}",
        "- durations (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result.durations.items()),
        "",
        "| test | role | unmutated | mutant | verdict |",
        "|---|---|---|---|---|",
    ]
    out += [f"| `{r.node_id}` | {r.role} | {r.baseline} | {r.mutant} | {r.verdict} |" for r in result.rows]
    out.append("")
    return "\n".join(out)


def _write_reports(result: MutationResult, reports: Path, out: Path) -> None:
    reports.mkdir(parents=True, exist_ok=True)
    name = result.mutation.name
    for phase in ("baseline", "mutant"):
        for ext in ("xml", "log"):
            src = out / f"{phase}.{ext}"
            if src.exists():
                shutil.copyfile(src, reports / f"mutation-{name}-{phase}.{ext}")
    dest = reports / f"mutation-{name}.md"
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(render_markdown(result), encoding="utf-8")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


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


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m canarchy.testing.mutation")
    sub = parser.add_subparsers(dest="action", required=True)
    for action, target_help in (("run", "a mutation TOML file"), ("run-all", "a directory of mutation TOML files")):
        p = sub.add_parser(action)
        p.add_argument("target", type=Path, help=target_help)
        p.add_argument("--python", default=sys.executable, help="interpreter that runs pytest (default: this one)")
        p.add_argument("--repo", help="git work tree to copy (default: the one around the current directory)")
        p.add_argument("--reports", help="directory for mutation-<name>.md and the JUnit reports")
        p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per pytest run")
    args = parser.parse_args(argv)
    try:
        if args.action == "run":
            return _run_one(args.target, args)
        paths = sorted(args.target.glob("*.toml"))
        if not paths:
            print(f"run-all: CANNOT DECIDE - no *.toml mutation in {args.target}")
            return EXIT_CANNOT_DECIDE
        codes = {}
        for path in paths:
            codes[path.name] = _run_one(path, args)
            print()
        for name, code in codes.items():
            print(f"  {name}: {['killed', 'SURVIVED', 'CANNOT DECIDE'][code] if code in (0, 1, 2) else code}")
        return max(codes.values()) if all(c in (0, 1, 2) for c in codes.values()) else EXIT_CANNOT_DECIDE
    except _Interrupted as exc:
        name = "SIGINT" if exc.signum == signal.SIGINT else "SIGTERM"
        print(f"mutation: interrupted by {name}; the temporary copy was removed, the working tree was never written")
        return 128 + exc.signum


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
