"""Claims as a person reads them: the terminal's table and the page's Claims section, evidence apart from the rest."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from harness.claims.sequential import MIN_SEEDS

#: The kinds of claim, in the order the terminal and the page show them, each with its heading.
KIND_HEADINGS = {"evidence": "Evidence", "design": "Design checks: values the implementation fixes, not evidence",
                 "cluster": "Needs a cluster: measured here, not judged"}


def _seeds(row: Any) -> str:
    """The pairs judged: '3', '3 (1 censored)', or '6 (3 seeds)' where a seed pairs runs of several workloads."""
    censored_pairs = int(getattr(row, "censored_pairs", 0) or 0)
    seeds = getattr(row, "seeds", row.pairs)
    extra = [f"{seeds} seeds"] if seeds == seeds and int(seeds) != int(row.pairs) else []
    extra += [f"{censored_pairs} censored"] if censored_pairs else []
    return f"{row.pairs}" + (f" ({', '.join(extra)})" if extra else "")


def number(value: float) -> str:
    """A claim's estimate or bound: 4 significant digits, '–' for none, '∞' for a time that never comes."""
    if math.isnan(value):
        return "–"
    return ("-∞" if value < 0 else "∞") if math.isinf(value) else f"{value:.4g}"


def _counts(claims: pd.DataFrame) -> str:
    counts = claims["verdict"].value_counts()
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in ("PASS", "FAIL", "INCONCLUSIVE"))


def claims_text(claims: pd.DataFrame) -> str:
    """claims (rows x CLAIM_COLUMNS) -> a fixed-width table for the terminal: verdict, id, estimate [interval],
    relation, paired seeds and the statement, with notes on the next line; evidence first, then design checks and
    claims that need a cluster, each under its heading, and the counts of each."""
    kinds = claims["kind"] if "kind" in claims else pd.Series("evidence", index=claims.index)
    cells = [(row.verdict, row.id, f"{number(row.estimate)} [{number(row.ci_low)}, {number(row.ci_high)}]",
              f"{row.relation} {row.value:g}", f"n={_seeds(row)}", row.statement, row.note)
             for row in claims.itertuples()]
    widths = [max((len(c[i]) for c in cells), default=0) for i in range(5)]
    lines = []
    for kind, heading in KIND_HEADINGS.items():
        mine = [cell for cell, k in zip(cells, kinds, strict=True) if k == kind]
        if not mine:
            continue
        if kind != "evidence" or set(kinds) != {"evidence"}:
            lines.append(f"{heading}:")
        for cell in mine:
            lines.append("  ".join(f"{cell[i]:<{widths[i]}}" for i in range(5)) + "  " + cell[5])
            if cell[6]:
                lines.append(" " * (widths[0] + 2) + "note: " + cell[6])
    lines.append(_counts(claims[kinds == "evidence"]))
    if (kinds == "design").any():
        lines.append("design checks: " + _counts(claims[kinds == "design"]))
    if (kinds == "cluster").any():
        lines.append(f"needs a cluster: {int((kinds == 'cluster').sum())} (not judged here)")
    return "\n".join(lines)


def claims_html(claims: pd.DataFrame, source: Path) -> str:
    """The report's Claims section: one row per claim with its verdict, estimate and interval; design checks and
    claims that need a cluster in tables of their own, after the evidence."""
    import html

    e = html.escape

    def table(rows: pd.DataFrame) -> str:
        body = "\n".join(
            f'<tr><td>{e(row.id)}</td><td class="{e(row.verdict)}">{e(row.verdict)}</td>'
            f"<td>{number(row.estimate)} [{number(row.ci_low)}, {number(row.ci_high)}]"
            f"<br><small>{e(str(getattr(row, 'interval', '')))}</small></td>"
            f"<td>{e(row.relation)} {row.value:g}</td><td>{e(_seeds(row))}</td><td>{e(row.setting)}</td>"
            f"<td style=\"text-align:left\">{e(row.statement)}<br><small>{e(row.source)}"
            f"{'; ' + e(row.note) if row.note else ''}</small></td></tr>"
            for row in rows.itertuples())
        return ("<table><tr><th>id</th><th>verdict</th><th>estimate [interval]</th><th>claim</th><th>seeds</th>"
                f"<th>setting</th><th>statement</th></tr>\n{body}\n</table>\n")

    kinds = claims["kind"] if "kind" in claims else pd.Series("evidence", index=claims.index)
    parts = [f"<h2>Claims</h2>\n<p>From <code>{e(str(source))}</code>: each claim over seeds paired by workload, "
             "network and seed. The estimate is the geometric mean of the per-seed ratios (or the mean "
             "difference), its interval a paired Student-t interval on the log ratios (or differences), 95% unless "
             "the claim file looks at its seeds several times (then each look's level is under the interval: "
             "Bonferroni over the looks). PASS: the whole interval satisfies the claim; FAIL: the whole interval "
             "violates it; INCONCLUSIVE: otherwise, with fewer than "
             f"{MIN_SEEDS} paired seeds, or for a time measured on noisy runs. A missed target is a censored time "
             "(known only to exceed the run's train time): a claim with censored pairs is PASS only if it holds with "
             "every censored time against it, FAIL only if it fails with every one for it, and its interval is that "
             "of the bound that decided it. A diverged run never reaches the target: its time is ∞.</p>\n"]
    for kind, heading in KIND_HEADINGS.items():
        rows = claims[kinds == kind]
        if rows.empty:
            continue
        if kind != "evidence":
            parts.append(f'<h3 id="claims-{kind}">{e(heading)}</h3>\n')
        parts.append(table(rows))
    return "".join(parts)
