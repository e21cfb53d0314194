"""What the mutation lanes print and write: a mutation's verdict, killers and import proof for a terminal and
``reports/mutation-<name>.md``, and the one-row-per-mutation summary (``reports/mutations.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Sequence

from canarchy.testing.lanes.render import markdown_table, table
from canarchy.testing.lanes.results import short_id

if TYPE_CHECKING:
    from canarchy.testing.lanes.mutation import MutationResult


def render(result: MutationResult) -> str:
    """One mutation for a terminal: verdict, ``killed by k/n``, the table."""
    m = result.mutation
    lines = [f"mutation {m.name} (issue {m.issue}): {result.status.upper()}",
             f"killed by {len(result.killed)}/{len(m.killers)}: "
             f"{', '.join(short_id(r.node_id) for r in result.killed) or '-'}",
             f"reason: {result.reason}"]
    lines += [f"imported mutant: {f} (in the temporary copy, now removed)" for f in result.imported]
    if result.importers:
        lines.append(f"import proof: {len(result.importers)} Python process(es) of the run imported the copy, "
                     "none elsewhere" + (" among those that reported:" if result.unseen else ":"))
        lines += [f"  {importer}" for importer in result.importers]
    if result.unseen:
        lines.append(f"not seen by the import proof: {len(result.unseen)} process(es) of the run:")
        lines += [f"  {process}" for process in result.unseen]
    if result.rows:
        lines += ["", table(["test", "role", "unmutated", "mutant", "verdict"],
                            [[r.node_id, r.role, r.baseline, r.mutant, r.verdict] for r in result.rows])]
    return "\n".join(lines)


def _summary_rows(results: Sequence[MutationResult]) -> list[list[str]]:
    rows = []
    for r in results:
        killers = [row for row in r.rows if row.role == "killer"]
        missed = [short_id(row.node_id) for row in killers if row.verdict != "killed"]
        detail = (r.reason.splitlines()[0] if r.reason else "-") if r.status == "cannot decide" else (
            "not failed: " + ", ".join(missed) if missed else "-")
        rows.append([r.mutation.name, str(len(killers)), str(len(r.killed)), r.status.upper(), detail])
    return rows


def render_summary(results: Sequence[MutationResult], seconds: float | None = None) -> str:
    """Several mutations: one row each (killers expected, killers that failed, verdict)."""
    killed = sum(1 for r in results if r.status == "killed")
    head = f"mutations: {killed}/{len(results)} killed by every named killer"
    head += f" ({seconds:.0f} s)" if seconds else ""
    return "\n".join([head, "", table(["mutation", "killers expected", "killers that failed", "verdict", "details"],
                                      _summary_rows(results))])


def render_markdown(result: MutationResult) -> str:
    """``reports/mutation-<name>.md``."""
    m = result.mutation
    out = [f"# Mutation {m.name} (issue {m.issue}): {result.status}", "", m.description, "",
           f"- files: {', '.join(f'`{f}`' for f in m.files)}",
           f"- killed by {len(result.killed)}/{len(m.killers)}", f"- reason: {result.reason}",
           f"- processes that imported the copy: {len(result.importers)}",
           *(f"  - `{importer}`" for importer in result.importers),
           f"- processes the import proof could not see: {len(result.unseen)}",
           *(f"  - `{process}`" for process in result.unseen),
           "- durations (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result.durations.items()), "",
           markdown_table(["test", "role", "unmutated", "mutant", "verdict"],
                          [[f"`{r.node_id}`", r.role, r.baseline, r.mutant, r.verdict] for r in result.rows])]
    return "\n".join(out) + "\n"


def render_summary_markdown(results: Sequence[MutationResult], seconds: float | None = None) -> str:
    """``reports/mutations.md``: each mutation linked to its own report."""
    killed = sum(1 for r in results if r.status == "killed")
    out = [f"# Mutations: {'PASSED' if killed == len(results) else 'FAILED'} ({killed}/{len(results)} killed)", ""]
    if seconds is not None:
        out += [f"Wall time: {seconds:.0f} s.", ""]
    rows = [[f"[{row[0]}](mutation-{row[0]}.md)", r.mutation.issue, *row[1:]]
            for r, row in zip(results, _summary_rows(results), strict=True)]
    out.append(markdown_table(["mutation", "issue", "killers expected", "killers that failed", "verdict", "details"],
                              rows))
    return "\n".join(out) + "\n"
