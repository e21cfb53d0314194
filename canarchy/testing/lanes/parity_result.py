"""What the parity lane found: its twins (:class:`Twin`, each of one or more :class:`Shard` processes), the
tests whose outcome differed (:class:`Finding`) and the whole result with its verdict (:class:`ParityResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from canarchy.testing.lanes.results import Comparison, Report, node_id
from canarchy.testing.lanes.runner import EXIT_CANNOT_DECIDE, EXIT_FAILED, EXIT_PASSED, Run
from canarchy.testing.lanes.verdict import failed_beyond_its_tests


@dataclass
class Shard:
    """One pytest process of a twin: its own copy of the tree and environment, its run and report."""

    copy: Path
    env: dict[str, str]
    run: Run | None = None
    report: Report | None = None
    problem: str | None = None


@dataclass
class Twin:
    """One of the two runs: its configuration, its shards (one pytest process each, at once), and their
    reports as one."""

    name: str
    shards: list[Shard]
    hashseed: int
    flags: tuple[str, ...] = ()  # what each of its pytest runs starts with (:func:`~.runner.pytest_flags`)
    report: Report | None = None
    problem: str | None = None
    uncollected: dict[str, str] = field(default_factory=dict)  # case key -> its collection error, first line

    @property
    def copy(self) -> Path:
        return self.shards[0].copy

    @property
    def env(self) -> dict[str, str]:
        return self.shards[0].env

    @property
    def runs(self) -> list[Run]:
        return [s.run for s in self.shards if s.run is not None]

    @property
    def run(self) -> Run | None:
        """The first shard's run (the only one of a twin run in one process)."""
        return self.shards[0].run

    @property
    def failed_beyond(self) -> list[Run]:
        """Its shards' runs that pytest failed although none of their tests failed."""
        return [s.run for s in self.shards if failed_beyond_its_tests(s.run, s.report)]

    @property
    def summary(self) -> str:
        """"N s, exit code C" (the longest shard; each shard's exit code)."""
        if not self.runs:
            return "not run"
        codes = ", ".join(str(r.returncode) for r in self.runs)
        return f"{max(r.duration for r in self.runs):.1f} s, exit code {codes}"


@dataclass(frozen=True)
class Finding:
    """A test whose outcome differed, after the re-runs: ``kind`` is ``operator`` (depends on
    the operator), ``flaky`` (varies within a configuration) or ``hash seed`` (the clean
    configuration under the operator twin's hash seed gives the operator twin's result)."""

    id: str
    kind: str
    clean: tuple[str, ...]
    operator: tuple[str, ...]
    detail: str = ""


@dataclass
class ParityResult:
    """Everything the lane found. ``exit_code``: 0 identical, 1 different, 2 cannot decide."""

    comparison: Comparison
    twins: dict[str, Twin]
    findings: list[Finding] = field(default_factory=list)
    checkout_writes: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # "<twin> twin: <test>: <refusal>", alike in both or not
    home_changes: list[str] = field(default_factory=list)
    checkout_changes: list[str] = field(default_factory=list)
    not_shut_down: dict[str, list[str]] = field(default_factory=dict)
    strict: bool = False
    unexercised: list[str] = field(default_factory=list)  # scrub prefixes the operator twin exports nothing of
    unavailable_locales: list[str] = field(default_factory=list)  # the operator twin's LANG/LC_* this machine lacks
    root: Path | None = None  # the project's checkout: a finding's test is shown by its node id there

    def show(self, key: str) -> str:
        """A test's report key as displayed: its node id (:func:`~.results.node_id`)."""
        return node_id(key, self.root)

    @property
    def runs_failed(self) -> list[str]:
        """The twins whose pytest failed a run although none of its tests failed."""
        return [name for name, t in self.twins.items() if t.failed_beyond]

    def of_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    @property
    def exit_code(self) -> int:
        if self.comparison.undecided or any(t.problem for t in self.twins.values()):
            return EXIT_CANNOT_DECIDE
        failing = self.of_kind("operator") + (self.of_kind("flaky") + self.of_kind("hash seed") if self.strict else [])
        if failing or self.home_changes or self.checkout_changes or any(self.not_shut_down.values()) or \
                self.runs_failed or self.refusals:
            return EXIT_FAILED
        return EXIT_PASSED

    @property
    def status(self) -> str:
        return {EXIT_PASSED: "PASSED", EXIT_FAILED: "FAILED"}.get(self.exit_code, "CANNOT DECIDE")
