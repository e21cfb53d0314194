"""What the parity lane prints and writes: the terminal view of a
:class:`~canarchy.testing.lanes.parity_result.ParityResult` and ``reports/parity.md``."""

from __future__ import annotations

from canarchy.testing.lanes.parity_result import ParityResult
from canarchy.testing.lanes.render import markdown_table, table
from canarchy.testing.lanes.results import totals_text
from canarchy.testing.lanes.verdict import (BEYOND_ITS_TESTS, NOT_ISOLATED, isolated_run, plugins_not_loaded,
                                            sentinel_lines)

NOT_SHUT_DOWN = "was not properly shut down"  # python-can's log line for a bus a test left open

_KIND_TEXT = {"operator": "depends on the operator", "flaky": "flaky", "hash seed": "depends on the hash seed"}


def _verdict_text(result: ParityResult) -> str:
    """The comparison's verdict, or "identical but for N flaky ..." when only flaky or seed-dependent tests differ."""
    c = result.comparison
    apart = [t.name for t in result.twins.values() if t.uncollected and not t.problem]
    if apart:
        return f"different: the {apart[0]} twin alone could not collect {len(result.findings)} module(s)"
    if c.differences and not c.undecided and not result.of_kind("operator"):
        reported = [f"{len(result.of_kind(kind))} {kind}" for kind in ("flaky", "hash seed") if result.of_kind(kind)]
        return f"identical but for {' and '.join(reported)} test" + ("s" if len(result.findings) > 1 else "")
    return c.verdict


def _failing_in_both(result: ParityResult) -> list[str]:
    """A line for tests that fail in both twins: no difference, so no finding, but the suite itself fails."""
    c = result.comparison
    both = sorted(set(c.report_a.failing) & set(c.report_b.failing)) if c.report_a and c.report_b else []
    shown = ", ".join(result.show(key) for key in both[:5]) + (", ..." if len(both) > 5 else "")
    return [f"{len(both)} test(s) fail in both twins ({shown}): parity compares the twins, it does not pass the "
            "suite (nox -s unit judges that)"] if both else []


def _check_lines(result: ParityResult) -> list[str]:
    """The terminal lines of the checks: stale allow-list entries, writes, log lines, home and checkout changes."""
    lines = [f"  allow-list entry did not differ: {e.id} ({e.reason})" for e in result.comparison.stale_allowed]
    for name in result.runs_failed:
        for run in result.twins[name].failed_beyond:
            lines.append(f"  {name} twin: no test failed, {BEYOND_ITS_TESTS}: {run.log}")
            lines += [f"    sentinel: {line}" for line in sentinel_lines(run)]
    lines += [f"  refused by the isolation: {line}" for line in result.refusals]
    lines += [f"  written into its checkout (not a difference; what git ignores left out): {w}"
              for w in result.checkout_writes]
    lines += [f"  {name} log: {line}" for name, found in result.not_shut_down.items() for line in found]
    lines += [f"  operator home changed: {line}" for line in result.home_changes]
    lines += [f"  the checkout itself changed: {line}" for line in result.checkout_changes]
    lines += [f"  not exercised: the operator twin exports no {prefix}* variable, so a test that depends on one "
              "cannot differ ([tool.canarchy.lanes] operator_env)" for prefix in result.unexercised]
    lines += [f"  {line}" for line in _locale_lines(result)]
    return lines


def _locale_lines(result: ParityResult) -> list[str]:
    """A line for the operator twin's locale variables that name no locale of this machine's, if any."""
    if not result.unavailable_locales:
        return []
    return [f"the operator twin's {', '.join(result.unavailable_locales)}: no such locale on this machine, so a test "
            "that sets the locale from the environment (locale.setlocale(LC_ALL, \"\")) fails in that twin for that "
            "alone (install it, e.g. with locale-gen, for a finding that says more)"]


def render(result: ParityResult) -> str:
    """The terminal view: the verdict line, the twins, each finding and check."""
    c = result.comparison
    lines = [f"parity: {result.status} - results {_verdict_text(result)}"
             + (f" ({len(c.report_a.cases)} tests)" if c.report_a and c.report_a.cases else "")]
    lines += [f"  {line}" for line in _failing_in_both(result)]
    for twin in result.twins.values():
        shards = f", {len(twin.shards)} shards" if len(twin.shards) > 1 else ""
        lines.append(f"  {twin.name} twin: {totals_text(twin.report)} ({twin.summary}{shards}, "
                     f"PYTHONHASHSEED={twin.hashseed})")
    if not all(isolated_run(t.report) for t in result.twins.values()):
        lines.append(f"  {NOT_ISOLATED}")
    lines += [f"  {note}" for note in [plugins_not_loaded(t.report for t in result.twins.values())] if note]
    lines += [f"  cannot decide: {reason}" for reason in c.undecided]
    if result.findings:
        rows = [[result.show(f.id), _KIND_TEXT[f.kind], " ".join(f.clean), " ".join(f.operator), f.detail]
                for f in result.findings]
        lines += ["", table(["test", "finding", "clean", "operator", "why"], rows)]
    if c.allowed:
        lines += ["", "allowed to differ (allow-list):",
                  table(["test", "clean", "operator", "reason"],
                        [[result.show(r.id), r.outcome_a, r.outcome_b, r.allowed_reason or ""] for r in c.allowed])]
    lines += _check_lines(result)
    if not result.strict and (result.of_kind("flaky") or result.of_kind("hash seed")):
        lines.append("  (flaky and hash-seed dependent tests are reported, not failed: `nox -s parity -- --strict` "
                     "fails them)")
    return "\n".join(lines)


def render_markdown(result: ParityResult) -> str:
    """``reports/parity.md``."""
    out = [f"# Parity: {result.status}", "", markdown_table(
        ["twin", "PYTHONHASHSEED", "exit code", "outcomes", "seconds", "log"],
        [[t.name if len(t.shards) == 1 else f"{t.name} {i + 1}/{len(t.shards)}", str(t.hashseed),
          str(r.returncode), totals_text(t.report if len(t.shards) == 1 else s.report), f"{r.duration:.1f}",
          f"`{r.log}`"] for t in result.twins.values() for i, s in enumerate(t.shards) if (r := s.run)])]
    if result.comparison.undecided:
        out += ["", "## Cannot decide", "", *(f"- {r}" for r in result.comparison.undecided)]
    if result.findings:
        out += ["", f"## Differences ({len(result.findings)})", "", markdown_table(
            ["test", "finding", "clean", "operator", "why"],
            [[f"`{result.show(f.id)}`", _KIND_TEXT[f.kind], " ".join(f.clean), " ".join(f.operator), f.detail]
             for f in result.findings])]
    return "\n".join([*out, "", "## Checks", "", *_check_markdown(result)]) + "\n"


def _check_markdown(result: ParityResult) -> list[str]:
    """The lines of ``parity.md``'s checks: runs failed beyond their tests, refusals, home and checkout changes,
    writes into the copies, locales, tests failing in both twins, python-can's shutdown warnings."""
    return [*(f"- {name} twin: no test failed, {BEYOND_ITS_TESTS}: `{run.log}`"
              for name in result.runs_failed for run in result.twins[name].failed_beyond),
            *(f"- refused by the isolation: {line}" for line in result.refusals[:50]),
            f"- operator home unchanged: {'yes' if not result.home_changes else 'NO'}",
            *(f"  - {line}" for line in result.home_changes[:50]),
            f"- checkout unchanged: {'yes' if not result.checkout_changes else 'NO'}",
            *(f"  - {line}" for line in result.checkout_changes[:50]),
            f"- writes into a copy of the checkout (reported, not differences): {len(result.checkout_writes)}",
            *(f"  - {line}" for line in result.checkout_writes[:50]),
            *(f"- {line}" for line in _locale_lines(result)),
            *(f"- {line}" for line in _failing_in_both(result)),
            *(f"- `{NOT_SHUT_DOWN}` in the {name} log: {len(lines)}" for name, lines in result.not_shut_down.items())]
