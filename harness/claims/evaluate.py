"""Judging claims on a suite's summary: paired bootstrap intervals of a ratio or difference, and their verdicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.claims.model import Claim, ClaimFile
from harness.report import hygiene, stats
from harness.report.network import method_label
from harness.suite.files import FileError

#: Fewer paired seeds than this make a claim INCONCLUSIVE, whatever the interval says.
MIN_SEEDS = 3
#: Run states whose numbers a claim uses: a diverged run is an outcome of the method; failed or preempted runs
#: are not (the infrastructure stopped them).
USED_STATES = ("completed", "diverged")
#: claims.csv's columns, in order: the contract's six first.
CLAIM_COLUMNS = ("id", "statement", "estimate", "ci_low", "ci_high", "verdict", "metric", "relation", "value",
                 "method", "baseline", "pairs", "noisy_runs", "setting", "source", "note")


def matching_rows(table: pd.DataFrame, name: str) -> pd.Series:
    """summary (runs x columns), a claim's method or baseline -> a boolean mask of the runs it names.

    `name` is, in this order: a label without its ' @ <network>' part (so it names the same method at every network,
    as `dtbench report --baseline` does), a full label, or a method name that every run of it shares one label
    without network. Raises ValueError (one line) when nothing matches or a method name is ambiguous.
    """
    networks = table["network"].fillna("").astype(str)
    labels = pd.Series([method_label(str(label), net) for label, net in zip(table["label"], networks, strict=True)],
                       index=table.index)
    for mask in (labels == name, table["label"].astype(str) == name):
        if mask.any():
            return mask
    by_method = table["method"].astype(str) == name
    if by_method.any():
        found = list(pd.unique(labels[by_method]))
        if len(found) > 1:
            raise ValueError(f"method {name!r} has several labels here ({', '.join(found)}): name one of them")
        return by_method
    known = ", ".join(pd.unique(labels))
    raise ValueError(f"no run has the label or method {name!r} (labels: {known})")


def paired_values(table: pd.DataFrame, method: pd.Series, baseline: pd.Series, metric: str) -> pd.DataFrame:
    """The metric of the method's and the baseline's runs, paired by (workload, network, seed): columns key, method,
    baseline, noisy (either side noisy). Only runs in USED_STATES; a missed target is +inf; pairs with another
    missing value are left out."""
    def side(mask: pd.Series) -> pd.DataFrame:
        rows = table[mask & table["state"].isin(USED_STATES)]
        values = pd.to_numeric(rows[metric], errors="coerce").astype(float)
        if metric == "time_to_target_s":
            values = values.where(values.notna(), math.inf)
        keys = list(zip(rows["workload"].astype(str), rows["network"].fillna("").astype(str), rows["seed"],
                        strict=True))
        noisy = rows["noisy"].astype("boolean").fillna(False).astype(bool) if "noisy" in rows else False
        return pd.DataFrame({"key": keys, "value": values.to_numpy(), "noisy": np.asarray(noisy)})

    ours, theirs = side(method), side(baseline)
    pairs = ours.merge(theirs, on="key", suffixes=("_method", "_baseline"))
    pairs = pairs[pairs["value_method"].notna() & pairs["value_baseline"].notna()]
    return pd.DataFrame({"key": pairs["key"], "method": pairs["value_method"], "baseline": pairs["value_baseline"],
                         "noisy": pairs["noisy_method"] | pairs["noisy_baseline"]})


def verdict(relation: str, value: float, low: float, high: float) -> str:
    """PASS when the whole interval [low, high] satisfies the relation to `value`, FAIL when the whole interval
    violates it, INCONCLUSIVE otherwise (and when the interval is unknown)."""
    if math.isnan(low) or math.isnan(high):
        return "INCONCLUSIVE"
    holds = (lambda x: x <= value) if relation.endswith("_le") else (lambda x: x >= value)
    if holds(low) and holds(high):
        return "PASS"
    if not holds(low) and not holds(high):
        return "FAIL"
    return "INCONCLUSIVE"


def judge(table: pd.DataFrame, claim: Claim, method: pd.Series, baseline: pd.Series) -> dict[str, Any]:
    """One claim on the runs `method` and `baseline` (masks of `table`) -> its claims.csv row."""
    pairs = paired_values(table, method, baseline, claim.metric)
    kind = "ratio" if claim.relation.startswith("ratio") else "diff"
    estimate, low, high = stats.paired_bootstrap(pairs["method"].to_numpy(), pairs["baseline"].to_numpy(), kind)
    result = verdict(claim.relation, claim.value, low, high)
    notes = [claim.note] if claim.note else []
    noisy = int(pairs["noisy"].sum())
    if len(pairs) < MIN_SEEDS:
        result = "INCONCLUSIVE"
        notes.append(f"only {len(pairs)} paired seed(s): {MIN_SEEDS} needed")
    elif noisy and claim.metric in hygiene.TIME_COLUMNS and result != "INCONCLUSIVE":
        notes.append(f"would be {result}, but {noisy} of the {len(pairs)} pairs include a noisy run (starved of "
                     "CPU): a time is not judged on them")
        result = "INCONCLUSIVE"
    return {"id": claim.id, "statement": claim.statement, "estimate": estimate, "ci_low": low, "ci_high": high,
            "verdict": result, "metric": claim.metric, "relation": claim.relation, "value": claim.value,
            "method": claim.method, "baseline": claim.baseline, "pairs": len(pairs), "noisy_runs": noisy,
            "setting": claim.setting, "source": claim.source, "note": "; ".join(notes)}


def evaluate_claims(table: pd.DataFrame, claims: ClaimFile, path: str | Path = "claims") -> pd.DataFrame:
    """summary (runs x columns), a loaded claim file -> claims (one row per claim x CLAIM_COLUMNS).

    Raises FileError (one line naming the file and the field) when a claim names no run, or the file is meant for
    another suite. The estimate is mean(method)/mean(baseline) or mean(method - baseline) over the paired seeds,
    with the 95% paired percentile bootstrap interval (stats.paired_bootstrap).
    """
    suites = set(table["suite"].dropna().astype(str))
    if claims.suite is not None and suites and claims.suite not in suites:
        raise FileError(f"{path}: suite: the claims are about suite {claims.suite!r}, the results are of "
                        f"{', '.join(sorted(suites))}")
    rows = []
    for i, claim in enumerate(claims.claim):
        masks = []
        for field in ("method", "baseline"):
            try:
                masks.append(matching_rows(table, getattr(claim, field)))
            except ValueError as exc:
                raise FileError(f"{path}: claim[{i}].{field}: {exc}") from None
        rows.append(judge(table, claim, *masks))
    return pd.DataFrame(rows, columns=list(CLAIM_COLUMNS))


def claims_text(claims: pd.DataFrame) -> str:
    """claims (rows x CLAIM_COLUMNS) -> a fixed-width table for the terminal: verdict, id, estimate [interval],
    relation, paired seeds and the statement, with notes on the next line."""
    def number(value: float) -> str:
        return "nan" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.4g}")

    cells = [(row.verdict, row.id, f"{number(row.estimate)} [{number(row.ci_low)}, {number(row.ci_high)}]",
              f"{row.relation} {row.value:g}", f"n={row.pairs}", row.statement, row.note)
             for row in claims.itertuples()]
    widths = [max((len(c[i]) for c in cells), default=0) for i in range(5)]
    lines = []
    for cell in cells:
        lines.append("  ".join(f"{cell[i]:<{widths[i]}}" for i in range(5)) + "  " + cell[5])
        if cell[6]:
            lines.append(" " * (widths[0] + 2) + "note: " + cell[6])
    counts = claims["verdict"].value_counts()
    lines.append(", ".join(f"{counts.get(v, 0)} {v}" for v in ("PASS", "FAIL", "INCONCLUSIVE")))
    return "\n".join(lines)


def claims_html(claims: pd.DataFrame, source: Path) -> str:
    """The report's Claims section: one row per claim with its verdict, estimate and interval."""
    import html

    e = html.escape

    def number(value: float) -> str:
        return "–" if math.isnan(value) else ("∞" if math.isinf(value) else f"{value:.4g}")

    rows = "\n".join(
        f'<tr><td>{e(row.id)}</td><td class="{e(row.verdict)}">{e(row.verdict)}</td>'
        f"<td>{number(row.estimate)} [{number(row.ci_low)}, {number(row.ci_high)}]</td>"
        f"<td>{e(row.relation)} {row.value:g}</td><td>{row.pairs}</td><td>{e(row.setting)}</td>"
        f"<td style=\"text-align:left\">{e(row.statement)}<br><small>{e(row.source)}"
        f"{'; ' + e(row.note) if row.note else ''}</small></td></tr>"
        for row in claims.itertuples())
    return (f"<h2>Claims</h2>\n<p>From <code>{e(str(source))}</code>: each claim over seeds paired by workload, "
            "network and seed, with the 95% paired bootstrap interval of the ratio or difference. PASS: the whole "
            "interval satisfies the claim; FAIL: the whole interval violates it; INCONCLUSIVE: otherwise, with "
            f"fewer than {MIN_SEEDS} paired seeds, or for a time measured on noisy runs.</p>\n"
            "<table><tr><th>id</th><th>verdict</th><th>estimate [95% CI]</th><th>claim</th><th>seeds</th>"
            f"<th>setting</th><th>statement</th></tr>\n{rows}\n</table>\n")
