"""The one table renderer of the lanes: aligned text for a terminal, Markdown for a CI page."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a ruler under the headers."""
    widths = [max([len(h), *(len(str(row[i])) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def cell(text: str) -> str:
    """``text`` made safe for one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table; cells are escaped with :func:`cell`."""
    out = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)
    return "\n".join(out)


def comparison_table(comparison, *, title: str = "parity", show=str) -> str:  # type: ignore[no-untyped-def]
    """A :class:`~canarchy.testing.lanes.results.Comparison` for a terminal: verdict, totals, differing tests
    (``show``: a test's key as displayed, its node id)."""
    from canarchy.testing.lanes.results import totals_text

    c = comparison
    lines = [f"{title}: {c.verdict.upper()}", f"  {c.label_a}: {totals_text(c.report_a)}",
             f"  {c.label_b}: {totals_text(c.report_b)}"]
    lines += [f"  cannot decide: {reason}" for reason in c.undecided]
    if c.differences:
        lines += ["", table(["test id", c.label_a, c.label_b],
                            [[show(r.id), r.outcome_a, r.outcome_b] for r in c.differences])]
    if c.allowed:
        lines += ["", "allowed to differ (allow-list):", table(
            ["test id", c.label_a, c.label_b, "reason"],
            [[show(r.id), r.outcome_a, r.outcome_b, r.allowed_reason or ""] for r in c.allowed])]
    lines += [f"  allow-list entry did not differ: {e.id} ({e.reason})" for e in c.stale_allowed]
    return "\n".join(lines)


def comparison_markdown(comparison, *, title: str = "Comparison") -> str:  # type: ignore[no-untyped-def]
    """The same for a CI page."""
    from canarchy.testing.lanes.results import totals_text

    c = comparison
    out = [f"# {title}: {c.verdict}", "", markdown_table(
        ["run", "report", "cases", "outcomes"],
        [[label, f"`{r.path}`" if r else "-", str(len(r.cases)) if r else "-", totals_text(r)]
         for label, r in ((c.label_a, c.report_a), (c.label_b, c.report_b))])]
    if c.undecided:
        out += ["", "## Cannot decide", "", *(f"- {cell(reason)}" for reason in c.undecided)]
    if c.differences:
        out += ["", f"## Differences ({len(c.differences)})", "", markdown_table(
            ["test id", c.label_a, c.label_b], [[f"`{r.id}`", r.outcome_a, r.outcome_b] for r in c.differences])]
    out += ["", f"## Allow-list ({len(c.allowed)} used, {len(c.stale_allowed)} not differing)", ""]
    if c.allowed or c.stale_allowed:
        out.append(markdown_table(["test id", c.label_a, c.label_b, "reason"],
                                  [[f"`{r.id}`", r.outcome_a, r.outcome_b, r.allowed_reason or ""] for r in c.allowed]
                                  + [[f"`{e.id}`", "(same)", "(same)", e.reason] for e in c.stale_allowed]))
    else:
        out.append("No entries.")
    return "\n".join(out) + "\n"
